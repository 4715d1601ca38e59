"""Cloud-init changes on a running VM (audit finding 2): PVE writes them into the config at once, the guest sees them
at the next start. proxmox_vm reports them pending with reboot_required, check mode predicts it, a drift left by an
earlier run is seen, and with restart_on_change the VM is restarted around the change so that no restart is lost."""
import os

import pytest

from ansible_collections.proxtalos.cluster.tests.integration.pve_playbook import PLAYBOOK_BIN, run_playbook

pytestmark = [pytest.mark.lab,
              pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')]

TASK = 'Cloud-init values of lab-cp-3'


def playbook(tmp_path, **options):
    lines = ['- name: Change lab-cp-3', '  hosts: lab-cp-3', '  gather_facts: false', '  tasks:',
             '    - name: %s' % TASK, '      proxtalos.cluster.proxmox_vm:']
    for key in ('api_host', 'api_port', 'api_user', 'api_token_id', 'api_token_secret'):
        lines.append('        %s: "{{ pve_%s }}"' % (key, key))
    lines += ['        ca_path: "{{ pve_ca_path }}"', '        vms:', '          - name: "{{ inventory_hostname }}"',
              '            vmid: "{{ vm_id }}"', '            node: "{{ vm_pve_node }}"', '            state: started']
    lines += ['            %s: %s' % (key, value) for key, value in options.items()]
    path = tmp_path / ('change-%d.yml' % len(list(tmp_path.iterdir())))
    path.write_text('\n'.join(lines) + '\n')
    return str(path)


def result_of(run):
    """lab-cp-3's VM's part of the task's result."""
    assert run.rc == 0 and run.failed == 0, run.describe()
    found = run.results(TASK)
    assert len(found) == 1, run.describe()
    return found[0][2]['vms']['lab-cp-3']


def agent_addresses(lab, vmid):
    data = lab.proxmox().nodes('pve1').qemu(vmid).agent('network-get-interfaces').get()['result']
    return [a['ip-address'] for i in data if i['name'] == 'eth0' for a in i['ip-addresses']]


def test_a_new_address_on_a_running_vm_is_pending_until_a_restart(clean_lab, tmp_path):
    converged = run_playbook(clean_lab.inventory_dir, '--tags', 'vms')
    assert converged.rc == 0, converged.describe()
    net = clean_lab.net
    new = 'ip=%s.33/24,gw=%s.1' % (net, net)
    change = playbook(tmp_path, ipconfig0=new)

    check = result_of(run_playbook(clean_lab.inventory_dir, '--check', playbook=change))
    assert check['changed'] is True and check['reboot_required'] is True

    done = run_playbook(clean_lab.inventory_dir, playbook=change)
    result = result_of(done)
    # the old code: changed, pending [], reboot_required false (PVE applies it to the config, not to [PENDING])
    assert result['changed'] is True and result['pending'] == ['ipconfig0'] and result['reboot_required'] is True
    assert 'ipconfig0 pending until the VM restarts' in done.stderr + str(done.document)
    assert agent_addresses(clean_lab, 1013) == [net + '.13']      # the guest still has the old one

    # a nameserver change left by an earlier run is seen by the next one (GET .../cloudinit), and so is the address:
    # PVE does not list a changed ipconfig0 there, the guest's agent still reports the old address
    result_of(run_playbook(clean_lab.inventory_dir, playbook=playbook(tmp_path, ipconfig0=new, nameserver='9.9.9.9')))
    again = result_of(run_playbook(clean_lab.inventory_dir, playbook=playbook(tmp_path, ipconfig0=new, nameserver='9.9.9.9')))
    assert again['changed'] is False and sorted(again['pending']) == ['ipconfig0', 'nameserver']
    assert again['reboot_required'] is True

    # restart_on_change restarts it: the drift is applied, the guest has the new address, and nothing is left
    restart = result_of(run_playbook(clean_lab.inventory_dir, playbook=playbook(
        tmp_path, ipconfig0=new, nameserver='9.9.9.9', restart_on_change='true')))
    assert restart['actions'] == ['reboot'] and restart['reboot_required'] is False and restart['pending'] == []
    assert agent_addresses(clean_lab, 1013) == [net + '.33']


def test_with_restart_on_change_a_run_that_dies_before_the_start_leaves_the_restart_to_the_next_run(clean_lab, tmp_path):
    converged = run_playbook(clean_lab.inventory_dir, '--tags', 'vms')
    assert converged.rc == 0, converged.describe()
    net = clean_lab.net
    change = playbook(tmp_path, ipconfig0='ip=%s.34/24,gw=%s.1' % (net, net), restart_on_change='true')
    clean_lab.fault('pve-task-error', 'start', vmid='1013', times=1)
    failed = run_playbook(clean_lab.inventory_dir, playbook=change)
    assert failed.rc != 0 and 'start failed' in str(failed.failures()), failed.describe()
    # the change is in, the VM is off: the next run owes it the start, and the start brings the new address
    result = result_of(run_playbook(clean_lab.inventory_dir, playbook=change))
    assert result['actions'] == ['start'] and result['reboot_required'] is False
    assert agent_addresses(clean_lab, 1013) == [net + '.34']
    assert result_of(run_playbook(clean_lab.inventory_dir, playbook=change))['changed'] is False


# ------------------------------------------------------------------------------- HA-managed VMs (audit finding 3)

def ha_playbook(tmp_path, state):
    lines = ['- name: %s lab-w-3' % state, '  hosts: lab-w-3', '  gather_facts: false', '  tasks:',
             '    - name: HA VM %s' % state, '      proxtalos.cluster.proxmox_vm:']
    for key in ('api_host', 'api_port', 'api_user', 'api_token_id', 'api_token_secret'):
        lines.append('        %s: "{{ pve_%s }}"' % (key, key))
    lines += ['        ca_path: "{{ pve_ca_path }}"', '        vms:',
              '          - {name: "{{ inventory_hostname }}", vmid: "{{ vm_id }}", node: "{{ vm_pve_node }}", state: %s}' % state,
              '        wait_timeout: 30']
    path = tmp_path / ('ha-%s.yml' % state)
    path.write_text('\n'.join(lines) + '\n')
    return str(path)


def test_an_ha_managed_vm_is_stopped_started_and_deleted_by_its_observed_power_state(clean_lab, tmp_path):
    # PVE answers an HA-managed VM's stop and start with hastop/hastart tasks that end before the HA stack acts;
    # the old code sent DELETE when the hastop task ended and PVE answered "VM 1023 is running - destroy failed".
    converged = run_playbook(clean_lab.inventory_dir, '--tags', 'vms')
    assert converged.rc == 0, converged.describe()
    clean_lab.fault('pve-ha-managed', '1023', delay=1.5)
    since = clean_lab.last_seq('requests')
    stopped = run_playbook(clean_lab.inventory_dir, playbook=ha_playbook(tmp_path, 'stopped'))
    assert stopped.rc == 0, stopped.describe()
    assert clean_lab.proxmox().nodes('pve1').qemu(1023).status.current.get()['status'] == 'stopped'
    started = run_playbook(clean_lab.inventory_dir, playbook=ha_playbook(tmp_path, 'started'))
    assert started.rc == 0, started.describe()
    assert clean_lab.proxmox().nodes('pve1').qemu(1023).status.current.get()['status'] == 'running'
    gone = run_playbook(clean_lab.inventory_dir, playbook=ha_playbook(tmp_path, 'absent'))
    assert gone.rc == 0, gone.describe()
    assert [r['name'] for r in clean_lab.proxmox().cluster.resources.get(type='vm') if r['vmid'] == 1023] == []
    # one request each: no repeated HA requests while the HA stack was acting
    posts = [r['path'].rsplit('/', 1)[-1] for r in clean_lab.requests(since=since, source='pve')
             if r['method'] in ('POST', 'DELETE') and '/1023' in r['path']]
    assert posts == ['shutdown', 'start', 'stop', '1023'], posts


# ------------------------------------------------------------------------------- nameservers (audit finding 6)

def test_an_empty_nameserver_list_removes_the_nameserver_so_that_pve_uses_its_own(clean_lab):
    # The old role sent no nameserver for an empty list, so one set earlier stayed on the VM for good; PVE takes an
    # unset nameserver as "the PVE node's resolvers", which the role's documentation now says.
    first = run_playbook(clean_lab.inventory_dir, '--tags', 'vms', '--limit', 'lab-cp-1',
                         extra_vars={'proxmox_vms_nameservers': ['9.9.9.9']})
    assert first.rc == 0, first.describe()
    qemu = clean_lab.proxmox().nodes('pve1').qemu(1011)
    assert qemu.config.get()['nameserver'] == '9.9.9.9'
    second = run_playbook(clean_lab.inventory_dir, '--tags', 'vms', '--limit', 'lab-cp-1')
    assert second.rc == 0, second.describe()
    assert 'nameserver' not in qemu.config.get()
    result = second.results('Create or update the VM')[0][2]['vms']['lab-cp-1']
    assert result['actions'] == ['update nameserver'] and result['pending'] == ['nameserver']


def test_a_bigger_disk_is_grown_on_the_running_vm_and_a_rerun_is_unchanged(clean_lab):
    # The lab used to answer resize with a task that changed nothing, so the grow path looped to its deadline there.
    assert run_playbook(clean_lab.inventory_dir, '--tags', 'vms', '--limit', 'lab-w-2').rc == 0
    grown = run_playbook(clean_lab.inventory_dir, '--tags', 'vms', '--limit', 'lab-w-2', extra_vars={'vm_disk_gb': 14})
    assert grown.rc == 0, grown.describe()
    result = grown.results('Create or update the VM')[0][2]['vms']['lab-w-2']
    assert result['actions'] == ['resize scsi0 to 14G'] and result['reboot_required'] is False
    assert clean_lab.proxmox().nodes('pve1').qemu(1022).config.get()['scsi0'].endswith('size=14G')
    again = run_playbook(clean_lab.inventory_dir, '--tags', 'vms', '--limit', 'lab-w-2', extra_vars={'vm_disk_gb': 14})
    assert again.rc == 0 and again.results('Create or update the VM')[0][2]['vms']['lab-w-2']['changed'] is False
