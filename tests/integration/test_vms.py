"""The vms stage (and preflight before it) through ansible-playbook site.yml against the lab.

Each test starts from a clean lab (no VMs, no faults, empty storages; time scale 0) with 3 control
planes and 3 workers planned, and reads what happened from the JSON callback and from the lab's PVE.
"""
import os
import threading
import time

import pytest

from ansible_collections.proxtalos.cluster.tests.integration.pve_playbook import PLAYBOOK_BIN, run_playbook

pytestmark = [pytest.mark.lab,
              pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')]

# The stages of this issue; the vms tag also holds the Talos API gate, which follows the address gate.
STAGES = ('--tags', 'preflight,vms')
CONTROL_PLANES = ('lab-cp-1', 'lab-cp-2', 'lab-cp-3')
WORKERS = ('lab-w-1', 'lab-w-2', 'lab-w-3')
VM_TASK = 'Create or update the VM'
# Fault tests fail fast: deadlines of a few seconds instead of minutes.
SHORT = {'proxmox_vms_timeout': 4, 'proxmox_vms_address_timeout': 4, 'proxmox_vms_image_timeout': 4,
         'proxmox_vms_wait_sleep': 1, 'preflight_pve_timeout': 4}


def writes(lab, since):
    """PVE requests that change something (POST, PUT, DELETE) after request seq `since`."""
    return [r for r in lab.requests(since=since, source='pve') if r['method'] != 'GET']


def vm_rows(lab):
    return dict((row['name'], row) for row in lab.vms())


def vm_task(run):
    """(host it was reported on, result) of the VM task: one run_once module run for every VM of the play."""
    found = [(host, result) for _name, host, result in run.results(VM_TASK)]
    assert len(found) == 1, 'the VM task ran %d times: %s' % (len(found), run.describe())
    return found[0]


def vm_results(run):
    """host -> its VM's part of the VM task's result (`vms`, or `failed_vms` for a VM that failed)."""
    result = vm_task(run)[1]
    return dict(result.get('vms') or {}, **(result.get('failed_vms') or {}))


def converge(lab, *args, **kwargs):
    run = run_playbook(lab.inventory_dir, *args, **kwargs)
    assert run.rc == 0 and run.failed == 0, run.describe()
    return run


def test_check_mode_on_a_fresh_lab_predicts_every_creation_and_creates_nothing(clean_lab):
    since = clean_lab.last_seq('requests')
    run = run_playbook(clean_lab.inventory_dir, '--check', '--diff', *STAGES)
    assert run.rc == 0, run.describe()
    reported_on, task = vm_task(run)
    assert reported_on == 'lab-cp-1' and task['changed'] is True
    predicted = vm_results(run)
    assert sorted(predicted) == sorted(CONTROL_PLANES + WORKERS)
    for host, result in predicted.items():
        assert result['changed'] is True and result['actions'] == ['create', 'start'], (host, result)
        assert result['diff']['before'] == {} and result['diff']['after']['status'] == 'running'
    # The task's diff shows every VM under its inventory name.
    assert sorted(task['diff']['after']) == sorted(CONTROL_PLANES + WORKERS)
    image = run.results('Talos image')[0][2]['results'][0]
    assert image['changed'] is True and image['present'] is False
    assert clean_lab.vms() == [] and writes(clean_lab, since) == []


def test_three_plus_three_created_started_and_gated_then_a_rerun_is_unchanged(clean_lab):
    run = converge(clean_lab, *STAGES)
    # Every task of these stages runs once for every node (run_once): the recap has a line for the first host only,
    # each node's part is in the tasks' results.
    assert set(run.stats) == {'lab-cp-1'}, run.stats
    # One module run made every VM (reported on the first host); each VM's part says what was done to it.
    made = vm_results(run)
    assert sorted(made) == sorted(CONTROL_PLANES + WORKERS)
    assert all(made[host]['changed'] and made[host]['actions'] == ['create', 'start'] for host in made), made
    assert vm_task(run)[1]['workers'] >= 2
    rows = vm_rows(clean_lab)
    assert sorted(rows) == sorted(CONTROL_PLANES + WORKERS)
    assert all(row['status'] == 'running' and row['agent'] == 'running' for row in rows.values())
    for index, host in enumerate(CONTROL_PLANES, 1):
        assert rows[host]['address'] == '%s.%d' % (clean_lab.net, 10 + index)
        assert rows[host]['address_source'] == 'static'
    # The gate read each address in one module run (run_once, reported on the first host); workers got theirs by
    # DHCP and it became node_ip for later stages. The report has one gate per host.
    gate_runs = run.results('Gate - the VM runs')
    assert [host for _n, host, _r in gate_runs] == ['lab-cp-1'], run.describe()
    gate = gate_runs[0][2]
    gated = dict((host, result['address']) for host, result in gate['vms'].items())
    assert gated == dict((host, rows[host]['address']) for host in rows)
    assert sorted((g['host'], g['ok'], g['name']) for g in gate['gates']) == [
        (host, True, 'the VM runs and its guest agent reports its address') for host in sorted(rows)]
    # The gate had every address: discovery had no VM left to read.
    assert all(result.get('skipped') for _n, _h, result in run.results("Read the VM's address"))
    # One task (run_once, a loop over the nodes) gave each node without a static address the gate's as node_ip.
    grouping = run.results('Nodes the stages after vms run on')
    assert len(grouping) == 1, grouping
    discovered = dict((item['item']['name'], item['add_host']['host_vars']['node_ip'])
                      for item in grouping[0][2]['results'] if 'node_ip' in item['add_host']['host_vars'])
    assert all(item['add_host']['groups'] == ['proxtalos_nodes'] for item in grouping[0][2]['results'])
    assert discovered == dict((host, rows[host]['address']) for host in WORKERS)
    assert all(rows[host]['address_source'] == 'dhcp' for host in WORKERS)

    config = clean_lab.proxmox().nodes('pve1').qemu(1011).config.get()
    assert config['ide2'].startswith('local:iso/talos-v1.13.9-ce4c9805-nocloud-amd64.iso,media=cdrom')
    assert config['ipconfig0'] == 'ip=%s.11/24,gw=%s.1' % (clean_lab.net, clean_lab.net)
    assert config['boot'] == 'order=scsi0;ide2;net0' and 'size=10G' in config['scsi0']

    since = clean_lab.last_seq('requests')
    again = converge(clean_lab, *STAGES)
    assert again.changed == 0, again.describe()
    assert not any(result['changed'] for result in vm_results(again).values())
    assert writes(clean_lab, since) == []


def test_the_gate_lists_only_hosts_whose_own_state_is_started_whatever_the_first_hosts_state(clean_lab):
    """The gate is one run_once task: the first host's proxmox_vms_state must neither skip nor widen it for the others."""
    host_vars = os.path.join(clean_lab.inventory_dir, 'host_vars')
    os.makedirs(host_vars, exist_ok=True)
    written = []
    try:
        for host, state in (('lab-w-1', 'present'), ('lab-w-3', 'stopped')):
            written.append(os.path.join(host_vars, '%s.yml' % host))
            with open(written[-1], 'w', encoding='utf-8') as handle:
                handle.write('---\nproxmox_vms_state: %s\n' % state)
        run = converge(clean_lab, '--tags', 'vms', '--limit', ','.join(WORKERS),
                       extra_vars={'proxmox_vms_address_timeout': 20})
    finally:
        for path in written:
            os.remove(path)
    rows = vm_rows(clean_lab)
    assert dict((h, rows[h]['status']) for h in WORKERS) == {'lab-w-1': 'stopped', 'lab-w-2': 'running',
                                                             'lab-w-3': 'stopped'}
    # The VM task is one run_once task too: each host's own proxmox_vms_state reached its VM.
    made = vm_results(run)
    assert dict((h, made[h]['status']) for h in WORKERS) == {'lab-w-1': 'stopped', 'lab-w-2': 'running',
                                                             'lab-w-3': 'stopped'}
    assert made['lab-w-1']['actions'] == ['create'] and made['lab-w-3']['actions'] == ['create']
    gate_runs = run.results('Gate - the VM runs')
    assert [host for _n, host, _r in gate_runs] == ['lab-w-1'], run.describe()
    gate = gate_runs[0][2]
    assert not gate.get('skipped'), run.describe()
    assert list(gate['vms']) == ['lab-w-2'] and [g['host'] for g in gate['gates']] == ['lab-w-2']
    assert gate['vms']['lab-w-2']['address'] == rows['lab-w-2']['address']
    # the hosts that were not gated are read by discovery: their VMs exist, stopped, without an address
    discovered = run.results("Read the VM's address")[0][2]
    assert sorted(discovered['vms']) == ['lab-w-1', 'lab-w-3'], run.describe()
    assert all(vm['exists'] and vm['status'] == 'stopped' and vm['address'] is None for vm in discovered['vms'].values())


def test_drift_in_cores_and_memory_is_detected_diffed_and_fixed(clean_lab):
    converge(clean_lab, '--tags', 'vms')
    pve = clean_lab.proxmox()
    pve.nodes('pve1').qemu(1012).config.put(cores=6)                  # running: PVE keeps it pending
    pve.nodes('pve1').qemu(1022).status.stop.post()
    pve.nodes('pve1').qemu(1022).config.put(memory=6144)              # stopped: changed at once

    check = run_playbook(clean_lab.inventory_dir, '--tags', 'vms', '--check', '--diff')
    # One task (run_once) predicts both changes; each VM's part says whether it would change.
    assert check.rc == 0 and check.changed == 1, check.describe()
    assert sorted(host for host, result in vm_results(check).items() if result['changed']) == ['lab-cp-2', 'lab-w-2']
    assert sorted(vm_task(check)[1]['diff']['after']) == ['lab-cp-2', 'lab-w-2']
    assert pve.nodes('pve1').qemu(1022).status.current.get()['status'] == 'stopped'

    run = converge(clean_lab, '--tags', 'vms', '--diff')
    results = vm_results(run)
    changed = sorted(host for host, result in results.items() if result['changed'])
    assert changed == ['lab-cp-2', 'lab-w-2']
    cp2, w2 = results['lab-cp-2'], results['lab-w-2']
    assert cp2['actions'] == ['update cores']
    assert (cp2['diff']['before']['cores'], cp2['diff']['after']['cores']) == (6, 2)
    assert w2['actions'] == ['update memory', 'start']
    assert (w2['diff']['before']['memory'], w2['diff']['after']['memory']) == (6144, 2048)
    assert (w2['diff']['before']['status'], w2['diff']['after']['status']) == ('stopped', 'running')

    pending = dict((item['key'], item) for item in pve.nodes('pve1').qemu(1012).pending.get())
    assert int(pending['cores'].get('pending', pending['cores']['value'])) == 2
    assert int(pve.nodes('pve1').qemu(1022).config.get()['memory']) == 2048
    assert converge(clean_lab, '--tags', 'vms').changed == 0


def test_an_inventory_change_on_running_vms_is_applied_with_restart_on_change(clean_lab):
    converge(clean_lab, '--tags', 'vms')
    run = converge(clean_lab, '--tags', 'vms', '--limit', 'lab-w-1',
                   extra_vars={'vm_memory_mb': 3072, 'proxmox_vms_restart_on_change': True})
    result = vm_results(run)['lab-w-1']
    assert result['actions'] == ['update memory', 'reboot'] and result['reboot_required'] is False
    assert int(clean_lab.proxmox().nodes('pve1').qemu(1021).config.get()['memory']) == 3072
    assert [e['event'] for e in clean_lab.events() if e['name'] == 'lab-w-1'][-2:] == ['stopped', 'started']


def test_transient_5xx_answers_are_retried_and_the_run_completes(clean_lab):
    clean_lab.fault('pve-5xx', times=4, status=503)
    run = converge(clean_lab, *STAGES)
    retried = [r for _n, _h, result in run.results() for r in result.get('retries') or []]
    assert any('503' in r['error'] for r in retried), run.describe()
    assert len(clean_lab.vms()) == 6


def test_a_flaky_network_is_ridden_out(clean_lab):
    clean_lab.fault('pve-flaky-network', drop_rate=0.15, seed=7)
    run = converge(clean_lab, '--tags', 'vms')
    assert len(clean_lab.vms()) == 6 and all(row['status'] == 'running' for row in clean_lab.vms())
    retried = [r for _n, _h, result in run.results() for r in result.get('retries') or []]
    assert retried, 'the fault dropped no request that the modules saw; raise drop_rate'


def release_after_config_writes(lab, since, vmid, count, timeout=300, interval=0.2):
    """A thread that clears the config lock once `count` config writes to VM `vmid` reached PVE after `since`."""
    path = '/qemu/%s/config' % vmid
    seen = []

    def watch():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen[:] = [r for r in writes(lab, since) if r['path'].endswith(path)]
            if len(seen) >= count:
                break
            time.sleep(interval)
        lab.clear('pve-config-lock')

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, seen


def test_a_config_lock_that_is_released_is_waited_out(clean_lab):
    converge(clean_lab, '--tags', 'vms')
    # Held until the VM task has met it and tried again (two config writes), then released: however slow the machine,
    # the run meets the lock and must wait it out.
    since = clean_lab.last_seq('requests')
    clean_lab.fault('pve-config-lock', '1013')
    releaser, seen = release_after_config_writes(clean_lab, since, 1013, count=2)
    run = converge(clean_lab, '--tags', 'vms', '--limit', 'lab-cp-3', extra_vars={'vm_cores': 3})
    releaser.join(timeout=30)
    assert len(seen) >= 2, 'the run met the lock and tried again: %s' % seen
    result = vm_results(run)['lab-cp-3']
    assert result['changed'] and result['actions'] == ['update cores']
    assert any('got timeout' in r['error'] for r in result['retries'])


def test_a_config_lock_that_stays_fails_naming_the_vm_and_the_cause(clean_lab):
    converge(clean_lab, '--tags', 'vms')
    clean_lab.fault('pve-config-lock', '1013')
    run = run_playbook(clean_lab.inventory_dir, '--tags', 'vms', '--limit', 'lab-cp-3',
                       extra_vars=dict(SHORT, vm_cores=3))
    assert run.rc != 0
    message = run.failures()['lab-cp-3']
    assert message.startswith('1 of 1 VMs failed: lab-cp-3 (VM 1013 on PVE node pve1): VM 1013 (lab-cp-3) on node '
                              'pve1: gave up after')
    assert "can't lock file '/var/lock/qemu-server/lock-1013.conf' - got timeout" in message


def test_a_task_error_fails_naming_vm_node_operation_and_pve_message(clean_lab):
    clean_lab.fault('pve-task-error', 'start', vmid='1011')
    run = run_playbook(clean_lab.inventory_dir, '--tags', 'vms', extra_vars=SHORT)
    assert run.rc != 0
    # One run_once task: its failure is reported on the first host and names only the VM that failed.
    assert run.failures() == {'lab-cp-1': (
        '1 of 6 VMs failed: lab-cp-1 (VM 1011 on PVE node pve1): VM 1011 (lab-cp-1) on node pve1: start failed on PVE '
        'node pve1: TASK ERROR: start failed: QEMU exited with code 1')}, run.describe()
    task = vm_task(run)[1]
    failed = task['failed_vms']['lab-cp-1']
    assert list(task['failed_vms']) == ['lab-cp-1']
    assert failed['operation'] == 'start' and failed['task_log'][-1].startswith('TASK ERROR')
    assert failed['actions'] == ['create'] and failed['changed'] is True
    # The other VMs were made and started in the same run; their results are there.
    assert sorted(task['vms']) == sorted(set(CONTROL_PLANES + WORKERS) - {'lab-cp-1'})
    assert all(vm['status'] == 'running' for vm in task['vms'].values())
    # any_errors_fatal: the stage stops for every host; nothing after the VM task ran.
    assert run.results('Gate - the VM runs') == []


def test_a_failed_create_names_the_vm_and_pve_reason(clean_lab):
    clean_lab.fault('pve-task-error', 'create', vmid='1022', times=1)
    run = run_playbook(clean_lab.inventory_dir, '--tags', 'vms', extra_vars=SHORT)
    assert run.rc != 0
    # Reported on the first host (run_once); the message names the VM that failed, and only it.
    message = run.failures()['lab-cp-1']
    assert message.startswith('1 of 6 VMs failed: lab-w-2 (VM 1022 on PVE node pve1): VM 1022 (lab-w-2) on node pve1: '
                              'create failed on PVE node pve1: TASK ERROR: unable to create VM 1022')
    assert not any(host in message for host in set(CONTROL_PLANES + WORKERS) - {'lab-w-2'}), message
    assert list(vm_task(run)[1]['failed_vms']) == ['lab-w-2']
    assert 'insufficient free space' in message
    assert 'lab-w-2' not in vm_rows(clean_lab)


def test_an_offline_pve_node_fails_with_the_vms_waiting_on_it_and_the_cause(clean_lab):
    clean_lab.fault('pve-node-offline', 'pve1')
    run = run_playbook(clean_lab.inventory_dir, '--tags', 'vms', extra_vars=SHORT)
    assert run.rc != 0
    # The image task runs once for every VM of the PVE node (reported on the first host): it names them all.
    assert list(run.failures()) == ['lab-cp-1'], run.describe()
    message = run.failures()['lab-cp-1']
    assert message.startswith('local:iso/talos-v1.13.9-ce4c9805-nocloud-amd64.iso on node pve1: list iso content failed')
    assert '595' in message and 'No route to host' in message
    assert message.endswith('; needed on pve1 by lab-cp-1 (VM 1011), lab-cp-2 (VM 1012), lab-cp-3 (VM 1013), '
                            'lab-w-1 (VM 1021), lab-w-2 (VM 1022), lab-w-3 (VM 1023)'), message
    assert run.results(VM_TASK) == [] and clean_lab.vms() == []


def test_the_image_failure_names_only_the_vms_of_the_play(clean_lab):
    clean_lab.fault('pve-node-offline', 'pve1')
    run = run_playbook(clean_lab.inventory_dir, '--tags', 'vms', '--limit', 'lab-w-2,lab-cp-1', extra_vars=SHORT)
    assert run.rc != 0
    assert run.failures()['lab-cp-1'].endswith('; needed on pve1 by lab-cp-1 (VM 1011), lab-w-2 (VM 1022)')


def test_preflight_reports_an_offline_node_before_anything_is_created(clean_lab):
    clean_lab.fault('pve-node-offline', 'pve1')
    since = clean_lab.last_seq('requests')
    run = run_playbook(clean_lab.inventory_dir, *STAGES, extra_vars=SHORT)
    assert run.rc != 0
    message = list(run.failures().values())[0]
    assert "- lab-cp-1: vm_pve_node: PVE node 'pve1' is offline" in message
    assert writes(clean_lab, since) == [] and clean_lab.vms() == []


def test_the_hard_reset_primitive_resets_a_running_vm_every_time_it_is_asked(clean_lab, tmp_path):
    converge(clean_lab, '--tags', 'vms')
    playbook = tmp_path / 'reset.yml'
    playbook.write_text('\n'.join([
        '- name: Hard reset lab-w-3',
        '  hosts: lab-w-3',
        '  gather_facts: false',
        '  tasks:',
        '    - name: Reset through PVE',
        '      proxtalos.cluster.proxmox_vm:',
        '        api_host: "{{ pve_api_host }}"',
        '        api_port: "{{ pve_api_port }}"',
        '        api_user: "{{ pve_api_user }}"',
        '        api_token_id: "{{ pve_api_token_id }}"',
        '        api_token_secret: "{{ pve_api_token_secret }}"',
        '        ca_path: "{{ pve_ca_path }}"',
        '        vms:',
        '          - {name: "{{ inventory_hostname }}", vmid: "{{ vm_id }}", node: "{{ vm_pve_node }}", state: reset}',
        '']))
    since = clean_lab.last_seq('events')
    for _attempt in range(2):
        run = converge(clean_lab, playbook=str(playbook))
        assert run.changed == 1 and run.results('Reset through PVE')[0][2]['vms']['lab-w-3']['actions'] == ['reset']
    resets = [e for e in clean_lab.events(since=since) if e['event'] == 'reset']
    assert [e['name'] for e in resets] == ['lab-w-3', 'lab-w-3']


def test_on_pve_8_the_guest_agent_is_read_with_vm_monitor(lab_factory):
    # The lab answering as PVE 8 (`--pve-major 8`): its token holds PVE 8's documented role, where VM.Monitor is the
    # guest agent's privilege (qemu-server 8.3.13 Agent.pm; PVE 8 has no VM.GuestAgent.*). The collection reads the
    # version, checks and names PVE 8's privilege.
    lab = lab_factory(control_planes=1, workers=1, extra_args=('--pve-major', '8'))
    assert lab.proxmox().version.get()['release'] == '8.4'
    run = converge(lab, *STAGES, extra_vars=SHORT)
    gate = run.results('Gate - the VM runs')[0][2]
    assert sorted(gate['vms']) == ['lab-cp-1', 'lab-w-1'] and gate['vms']['lab-w-1']['address']

    lab.fault('pve-privilege-revoked', 'VM.Monitor')
    lab.proxmox(root=True).nodes('pve1').qemu(1021).status.reboot.post()
    run = run_playbook(lab.inventory_dir, '--tags', 'vms', extra_vars=dict(SHORT, proxmox_vms_address_timeout=120))
    assert run.rc != 0, run.describe()
    message = '\n'.join(str(m) for m in run.failures().values())
    assert 'VM.Monitor on /vms/10' in message and 'GuestAgent' not in message, message
