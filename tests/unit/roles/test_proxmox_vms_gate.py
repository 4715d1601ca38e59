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
        return yaml.safe_load(handle)[0]['block']


def task(prefix):
    return [t for t in role_tasks() if t['name'].startswith(prefix)][0]


def host(vmid, **facts):
    return dict(vm_id=vmid, vm_pve_node='pve1', **facts)


def gate(hostvars, check_mode=False):
    """(the `vms` option, whether the task runs) for these hosts, the first host's view as with run_once."""
    spec = task('Gate - the VM runs')
    expr = spec['vars']['_proxmox_vms_gate_vms']
    variables = dict(hostvars=hostvars, ansible_play_hosts=list(hostvars), ansible_check_mode=check_mode,
                     _proxmox_vms_gate_vms=trust_as_template(expr))
    templar = Templar(loader=DataLoader(), variables=variables)
    assert spec['proxtalos.cluster.proxmox_vm_info']['vms'] == '{{ _proxmox_vms_gate_vms }}'
    assert spec.get('run_once') is True
    runs = all(templar.evaluate_conditional(trust_as_template(c)) for c in spec['when'])
    return templar.template(trust_as_template(expr)), runs


def test_each_host_states_its_own_power_state_vm_and_deadline_before_the_vm_task_and_the_gate():
    """Role defaults are not in hostvars: a per-host set_fact carries each host's values (default, inventory...)."""
    names = [t['name'] for t in role_tasks()]
    fact = task("This host's VM and power state")
    facts = fact['ansible.builtin.set_fact']
    assert facts['proxmox_vms_host_state'] == '{{ proxmox_vms_state }}'
    assert facts['proxmox_vms_host_timeout'] == '{{ proxmox_vms_timeout }}'
    vm = facts['proxmox_vms_host_vm']
    assert vm['name'] == '{{ inventory_hostname }}' and vm['state'] == '{{ proxmox_vms_state }}'
    assert vm['vmid'] == '{{ vm_id }}' and vm['node'] == '{{ vm_pve_node }}'
    assert vm['restart_on_change'] == '{{ proxmox_vms_restart_on_change }}'
    assert 'when' not in fact and 'run_once' not in fact
    vm_task = task('Create or update the VM')
    assert names.index(fact['name']) < names.index(vm_task['name']) < names.index(task('Gate - the VM runs')['name'])
    with open(os.path.join(ROLE, 'defaults', 'main.yml')) as handle:
        assert yaml.safe_load(handle)['proxmox_vms_state'] == 'started'


def test_the_vm_task_runs_once_with_every_hosts_own_vm_and_the_longest_deadline():
    spec = task('Create or update the VM')
    assert spec.get('run_once') is True and spec['register'] == 'proxmox_vms_vms'
    hostvars = {'cp-1': host(1011, proxmox_vms_host_vm={'name': 'cp-1', 'vmid': 1011, 'state': 'stopped'},
                             proxmox_vms_host_timeout='60'),
                'w-1': host(1021, proxmox_vms_host_vm={'name': 'w-1', 'vmid': 1021, 'state': 'started'},
                            proxmox_vms_host_timeout=900),
                'w-2': host(1022, proxmox_vms_host_vm={'name': 'w-2', 'vmid': 1022, 'state': 'absent'},
                            proxmox_vms_host_timeout=600)}
    templar = Templar(loader=DataLoader(), variables=dict(hostvars=hostvars, ansible_play_hosts=list(hostvars)))
    options = spec['proxtalos.cluster.proxmox_vm']
    assert sorted(options) == ['vms', 'wait_timeout']
    assert templar.template(trust_as_template(options['vms'])) == [
        {'name': 'cp-1', 'vmid': 1011, 'state': 'stopped'}, {'name': 'w-1', 'vmid': 1021, 'state': 'started'},
        {'name': 'w-2', 'vmid': 1022, 'state': 'absent'}]
    assert templar.template(trust_as_template(options['wait_timeout'])) == 900
    # Each host keeps its own part as proxmox_vms_vm.
    fact = task("This host's VM as the VM task left it")
    assert fact['ansible.builtin.set_fact'] == {'proxmox_vms_vm': '{{ proxmox_vms_vms.vms[inventory_hostname] }}'}


def test_only_hosts_whose_own_state_is_started_are_gated_whatever_the_first_hosts_state():
    hostvars = {'cp-1': host(1011, proxmox_vms_host_state='stopped'),
                'w-1': host(1021, proxmox_vms_host_state='started', node_ip='10.0.0.21'),
                'w-2': host(1022, proxmox_vms_host_state='present'),
                'w-3': host(1023, proxmox_vms_host_state='started')}
    vms, runs = gate(hostvars)
    assert runs is True
    assert vms == [{'name': 'w-1', 'vmid': 1021, 'node': 'pve1', 'expected_address': '10.0.0.21'},
                   {'name': 'w-3', 'vmid': 1023, 'node': 'pve1', 'expected_address': None}]


def test_without_the_fact_a_host_falls_back_to_its_inventory_state_then_started():
    vms, runs = gate({'a': host(1, proxmox_vms_state='stopped'), 'b': host(2)})
    assert runs is True and [vm['name'] for vm in vms] == ['b']


@pytest.mark.parametrize('hostvars, check_mode', [
    ({'a': host(1, proxmox_vms_host_state='stopped'), 'b': host(2, proxmox_vms_host_state='present')}, False),
    ({'a': host(1, proxmox_vms_host_state='started')}, True),
])
def test_the_gate_is_skipped_when_no_host_is_started_and_in_check_mode(hostvars, check_mode):
    _vms, runs = gate(hostvars, check_mode)
    assert runs is False
