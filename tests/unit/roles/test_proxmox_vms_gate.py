"""roles/proxmox_vms: the address gate's VM list and condition, rendered by Ansible's own templating from the task file.

The gate runs once (run_once) for the play: its `when` is evaluated on the first host only, so it must list only the
hosts whose own proxmox_vms_state is started, and be skipped when there is none.
"""
import os

import pytest
import yaml

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROLE = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'roles', 'proxmox_vms')


def role_tasks():
    with open(os.path.join(ROLE, 'tasks', 'main.yml')) as handle:
        return [entry for entry in yaml.safe_load(handle) if 'block' in entry][0]['block']


def task(prefix):
    return [t for t in role_tasks() if t['name'].startswith(prefix)][0]


def host(vmid, **facts):
    return dict(vm_id=vmid, vm_pve_node='pve1', **facts)


def gate(hostvars, check_mode=False, play_state=None):
    """(the `vms` option, whether the task runs) for these hosts, the first host's view as with run_once."""
    spec = task('Gate - the VM runs')
    expr = spec['vars']['_proxmox_vms_gate_vms']
    variables = first_host_variables(hostvars, **({'proxmox_vms_state': play_state} if play_state else {}))
    variables.update(ansible_check_mode=check_mode, _proxmox_vms_gate_vms=trust_as_template(expr))
    templar = Templar(loader=DataLoader(), variables=variables)
    assert spec['proxtalos.cluster.proxmox_vm_info']['vms'] == '{{ _proxmox_vms_gate_vms }}'
    assert spec.get('run_once') is True
    runs = all(templar.evaluate_conditional(trust_as_template(c)) for c in spec['when'])
    return templar.template(trust_as_template(expr)), runs


def role_defaults():
    with open(os.path.join(ROLE, 'defaults', 'main.yml')) as handle:
        return yaml.safe_load(handle)


def test_the_roles_own_copy_of_the_defaults_is_the_defaults():
    with open(os.path.join(ROLE, 'vars', 'main.yml')) as handle:
        role_vars_file = yaml.safe_load(handle)
    copy, seen = role_vars_file['__proxmox_vms_defaults'], role_vars_file['__proxmox_vms_seen']
    defaults = role_defaults()
    assert copy == dict((name, defaults[name]) for name in copy)
    assert sorted(seen) == sorted(copy) and all(seen[name] == '{{ %s }}' % name for name in seen)
    # every option a VM is built from
    assert set(copy) >= set(name for name in defaults if name not in (
        'proxmox_vms_address_timeout', 'proxmox_vms_talos_api_fallback', 'proxmox_vms_image_timeout', 'proxmox_vms_wait_sleep'))


def role_vars():
    with open(os.path.join(ROLE, 'vars', 'main.yml')) as handle:
        return dict((name, trusted(value)) for name, value in yaml.safe_load(handle).items())


def trusted(value):
    """A vars file's value with its templates trusted, as Ansible trusts a role's own files."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return dict((key, trusted(item)) for key, item in value.items())
    return value


def first_host_variables(hostvars, **play):
    """What a run_once task on the first host sees, in Ansible's order: the role defaults, the first host's own
    (inventory) values, the play's vars, the role's vars/main.yml."""
    first = list(hostvars)[0]
    variables = dict(role_defaults(), hostvars=hostvars, ansible_play_hosts=list(hostvars), inventory_hostname=first,
                     role_path=os.path.abspath(ROLE))
    variables.update(hostvars[first])
    variables.update(play)
    variables.update(role_vars())
    return variables


def vm_task_options(hostvars, groups=None, **play):
    """The VM task's options as its one run (run_once) renders them: every host's VM from hostvars, with the role's
    defaults (and play values) as the play sees them."""
    spec = task('Create or update the VM')
    variables = first_host_variables(hostvars, **play)
    variables.update(groups=groups or {'controlplane': [list(hostvars)[0]]}, cluster_name='lab',
                     talos_image_storage='local', talos_image_file='talos.iso',
                     _proxmox_vms_play_vms=trust_as_template(spec['vars']['_proxmox_vms_play_vms']))
    templar = Templar(loader=DataLoader(), variables=variables)
    options = spec['proxtalos.cluster.proxmox_vm']
    return dict((key, templar.template(trust_as_template(value))) for key, value in options.items())


def vm_host(vmid, **hostvars):
    return dict(vm_id=vmid, vm_pve_node='pve1', vm_bridge='vmbr0', vm_storage='local-lvm', **hostvars)


def test_the_vm_task_runs_once_with_every_hosts_own_vm_and_no_task_on_every_host():
    """Role defaults are not in hostvars: the one run builds each host's VM from its hostvars (host and group vars,
    facts, extra vars), else the role's own value - no task runs on every host before it."""
    names = [t['name'] for t in role_tasks()]
    spec = task('Create or update the VM')
    assert spec.get('run_once') is True and spec['register'] == 'proxmox_vms_vms'
    assert sorted(spec['proxtalos.cluster.proxmox_vm']) == ['vms', 'wait_timeout']
    per_host = [t['name'] for t in role_tasks() if not t.get('run_once')]
    assert per_host == [], per_host
    assert names.index(spec['name']) < names.index(task('Gate - the VM runs')['name'])
    assert role_defaults()['proxmox_vms_state'] == 'started'
    options = vm_task_options({'cp-1': vm_host(1011), 'w-1': vm_host(1021)})
    cp1, w1 = options['vms']
    assert cp1 == {'name': 'cp-1', 'vm_name': 'cp-1', 'vmid': 1011, 'node': 'pve1', 'state': 'started', 'cores': 2,
                   'sockets': 1, 'memory': 4096, 'cpu': 'x86-64-v2-AES', 'bridge': 'vmbr0', 'disk_storage': 'local-lvm',
                   'disk_size': 20, 'scsihw': 'virtio-scsi-single', 'cdrom': 'local:iso/talos.iso',
                   'boot': 'order=scsi0;ide2;net0', 'agent': True, 'serial': True, 'ostype': 'l26', 'onboot': True,
                   'tags': ['talos', 'lab', 'controlplane'],
                   'description': 'Talos node cp-1 of cluster lab, managed by proxtalos.cluster', 'restart_on_change': False}
    assert w1['tags'] == ['talos', 'lab', 'worker'] and w1['vmid'] == 1021
    assert options['wait_timeout'] == 600


def test_a_hosts_own_values_win_over_the_role_and_the_longest_deadline_is_taken():
    hostvars = {'cp-1': vm_host(1011, proxmox_vms_state='stopped', proxmox_vms_timeout='60', vm_cores=8,
                                proxmox_vms_memory_mb=1024, vm_name='first', vm_vlan=20, vm_macaddr='BC:24:11:00:00:01'),
                'w-1': vm_host(1021, proxmox_vms_timeout=900, proxmox_vms_cores=4, proxmox_vms_tags=['edge'],
                               node_ip='10.0.0.21', node_prefix=24, node_gateway='10.0.0.1'),
                'w-2': vm_host(1022, vm_memory_mb=2048, proxmox_vms_memory_mb=1024, node_ip='10.0.0.22', node_prefix=24,
                               vm_cloudinit_storage='ci', proxmox_vms_nameservers=['1.1.1.1', '9.9.9.9'])}
    # The first host sets its own state, which must not reach the others: they get the role default.
    options = vm_task_options(hostvars)
    cp1, w1, w2 = options['vms']
    assert (cp1['state'], cp1['cores'], cp1['memory'], cp1['vm_name']) == ('stopped', 8, 1024, 'first')
    assert w1['state'] == 'started' and w2['state'] == 'started' and w2['cores'] == 2
    assert cp1['vlan_tag'] == 20 and cp1['macaddr'] == 'BC:24:11:00:00:01'
    assert 'ipconfig0' not in cp1 and 'cloudinit_storage' not in cp1 and 'nameserver' not in cp1
    assert (w1['cores'], w1['tags']) == (4, ['edge', 'lab', 'worker'])
    assert 'vlan_tag' not in w1 and 'macaddr' not in w1
    assert (w1['cloudinit_storage'], w1['ipconfig0']) == ('local-lvm', 'ip=10.0.0.21/24,gw=10.0.0.1')
    # an empty list is an empty nameserver: a value set earlier is removed (PVE then uses the node's resolvers)
    assert w1['nameserver'] == ''
    assert (w2['memory'], w2['cloudinit_storage'], w2['ipconfig0'], w2['nameserver']) == (
        2048, 'ci', 'ip=10.0.0.22/24', '1.1.1.1 9.9.9.9')
    assert options['wait_timeout'] == 900
    # A play var wins over every host's inventory value, the first host's included (Ansible's precedence).
    cp1, w1, w2 = vm_task_options(hostvars, proxmox_vms_state='present', proxmox_vms_cores=6)['vms']
    assert (cp1['state'], w1['state'], w2['state']) == ('present', 'present', 'present')
    assert (cp1['cores'], w1['cores'], w2['cores']) == (8, 6, 6)   # vm_cores (cp-1) is the host's own VM size
    # A first host without its own value: a play var counts for every host, a host's own inventory value wins over
    # the role default.
    del hostvars['cp-1']['proxmox_vms_state']
    cp1, w1, w2 = vm_task_options(hostvars, proxmox_vms_state='present')['vms']
    assert (cp1['state'], w1['state'], w2['state']) == ('present', 'present', 'present')
    hostvars['w-2']['proxmox_vms_state'] = 'stopped'
    cp1, w1, w2 = vm_task_options(hostvars)['vms']
    assert (cp1['state'], w1['state'], w2['state']) == ('started', 'started', 'stopped')


def test_only_hosts_whose_own_state_is_started_are_gated_whatever_the_first_hosts_state():
    hostvars = {'cp-1': host(1011, proxmox_vms_state='stopped'),
                'w-1': host(1021, proxmox_vms_state='started', node_ip='10.0.0.21'),
                'w-2': host(1022, proxmox_vms_state='present'),
                'w-3': host(1023)}
    vms, runs = gate(hostvars)
    assert runs is True
    assert vms == [{'name': 'w-1', 'vmid': 1021, 'node': 'pve1', 'expected_address': '10.0.0.21'},
                   {'name': 'w-3', 'vmid': 1023, 'node': 'pve1', 'expected_address': None}]


def test_a_host_without_its_own_state_takes_the_plays():
    vms, runs = gate({'a': host(1, proxmox_vms_state='stopped'), 'b': host(2)})
    assert runs is True and [vm['name'] for vm in vms] == ['b']
    vms, runs = gate({'a': host(1), 'b': host(2)}, play_state='stopped')
    assert runs is False and vms == []


@pytest.mark.parametrize('hostvars, check_mode', [
    ({'a': host(1, proxmox_vms_state='stopped'), 'b': host(2, proxmox_vms_state='present')}, False),
    ({'a': host(1, proxmox_vms_state='started')}, True),
])
def test_the_gate_is_skipped_when_no_host_is_started_and_in_check_mode(hostvars, check_mode):
    _vms, runs = gate(hostvars, check_mode)
    assert runs is False
