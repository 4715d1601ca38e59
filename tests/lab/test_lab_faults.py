"""Each PVE fault as a client sees it through proxmoxer, and gone once cleared (or expired)."""
import pytest
import requests
from proxmoxer import ResourceException
from proxmoxer.tools import Tasks

from lab.control import ControlError

pytestmark = pytest.mark.lab


def finished(api, upid):
    return Tasks.blocking_status(api, upid, timeout=30, polling_interval=0.01)


def ok(api, upid):
    status = finished(api, upid)
    assert status['exitstatus'] == 'OK', status
    return status


def create_vm(api, vmid, **config):
    config.setdefault('name', 'vm-%d' % vmid)
    config.setdefault('net0', 'virtio,bridge=vmbr0')
    return finished(api, api.nodes('pve1').qemu.post(vmid=vmid, **config))


def active(lab):
    return [(f['name'], f['target']) for f in lab.status()['lab']['faults']]


def test_task_error_ends_the_task_in_error_and_clears(clean_lab):
    api = clean_lab.proxmox()
    create_vm(api, 1011)
    qemu = api.nodes('pve1').qemu(1011)
    clean_lab.fault('pve-task-error', 'start')
    status = finished(api, qemu.status.start.post())
    assert status['exitstatus'] == 'start failed: QEMU exited with code 1'
    log = [line['t'] for line in api.nodes('pve1').tasks(status['upid']).log.get()]
    assert log[-1] == 'TASK ERROR: start failed: QEMU exited with code 1'
    assert qemu.status.current.get()['status'] == 'stopped'
    clean_lab.clear('pve-task-error')
    ok(api, qemu.status.start.post())
    assert qemu.status.current.get()['status'] == 'running'


def test_task_error_for_one_vm_a_number_of_times_with_a_message(clean_lab):
    api = clean_lab.proxmox()
    clean_lab.fault('pve-task-error', 'create', vmid=1012, times=1, message='unable to create VM 1012 - disk full')
    ok(api, api.nodes('pve1').qemu.post(vmid=1011, name='other'))
    failed = create_vm(api, 1012)
    assert failed['exitstatus'] == 'unable to create VM 1012 - disk full'
    # A failed create leaves nothing behind, and the fault is used up.
    assert [vm['vmid'] for vm in api.nodes('pve1').qemu.get()] == [1011]
    assert active(clean_lab) == []
    assert create_vm(api, 1012)['exitstatus'] == 'OK'


def test_task_error_on_download_url(clean_lab):
    api = clean_lab.proxmox()
    clean_lab.fault('pve-task-error', 'download-url')
    status = finished(api, api.nodes('pve1').storage('local')('download-url').post(
        url='https://factory.talos.dev/image/talos.iso', filename='talos.iso', content='iso'))
    assert status['exitstatus'].startswith('download failed')
    assert api.nodes('pve1').storage('local').content.get() == []


def test_config_lock_blocks_config_changes_until_cleared(clean_lab):
    api = clean_lab.proxmox()
    create_vm(api, 1011)
    config = api.nodes('pve1').qemu(1011).config
    clean_lab.fault('pve-config-lock', '1011')
    with pytest.raises(ResourceException) as raised:
        config.put(memory=4096)
    assert raised.value.status_code == 500
    assert "can't lock file '/var/lock/qemu-server/lock-1011.conf' - got timeout" in str(raised.value)
    started = finished(api, api.nodes('pve1').qemu(1011).status.start.post())
    assert 'got timeout' in started['exitstatus']
    clean_lab.clear('pve-config-lock', '1011')
    config.put(memory=4096)
    assert config.get()['memory'] == '4096'


def test_config_lock_with_secs_releases_by_itself(clean_lab):
    api = clean_lab.proxmox()
    create_vm(api, 1011)
    clean_lab.fault('pve-config-lock', '1011', secs=0.3)

    def lock_released():
        try:
            api.nodes('pve1').qemu(1011).config.put(cores=2)
        except ResourceException as exc:
            return False, str(exc)
        return True, 'config written'
    clean_lab.wait_until(lock_released, timeout=10, what='the config lock release')
    assert active(clean_lab) == []


def test_flaky_network_drops_requests_repeatably_and_clears(clean_lab):
    api = clean_lab.proxmox(timeout=10)

    def pattern():
        outcome = []
        for attempt in range(12):
            try:
                api.version.get()
                outcome.append('ok')
            except requests.exceptions.ConnectionError:
                outcome.append('dropped')
        return outcome
    clean_lab.fault('pve-flaky-network', drop_rate=0.5, seed=3)
    first = pattern()
    clean_lab.fault('pve-flaky-network', drop_rate=0.5, seed=3)
    assert pattern() == first
    assert 'ok' in first and 'dropped' in first
    clean_lab.clear('pve-flaky-network')
    assert pattern() == ['ok'] * 12
    statuses = [r['status'] for r in clean_lab.requests(source='pve')]
    assert 'dropped' in statuses


def test_5xx_for_n_calls_then_recovers(clean_lab):
    api = clean_lab.proxmox()
    clean_lab.fault('pve-5xx', times=2, status=503)
    for attempt in (1, 2):
        with pytest.raises(ResourceException) as raised:
            api.nodes.get()
        assert raised.value.status_code == 503, attempt
    assert [n['node'] for n in api.nodes.get()] == ['pve1']
    assert active(clean_lab) == []


def test_5xx_only_on_a_path_and_method(clean_lab):
    api = clean_lab.proxmox()
    create_vm(api, 1011)
    clean_lab.fault('pve-5xx', times=0, status=500, message='proxy loop', path='/status/current', method='GET')
    with pytest.raises(ResourceException) as raised:
        api.nodes('pve1').qemu(1011).status.current.get()
    assert raised.value.status_code == 500 and 'proxy loop' in str(raised.value)
    assert api.nodes('pve1').qemu(1011).config.get()['name'] == 'vm-1011'
    assert active(clean_lab) == [('pve-5xx', None)]   # times=0: until cleared
    clean_lab.clear()
    assert api.nodes('pve1').qemu(1011).status.current.get()['status'] == 'stopped'


def test_node_offline_answers_595_until_cleared(clean_lab):
    api = clean_lab.proxmox()
    clean_lab.fault('pve-node-offline')
    with pytest.raises(ResourceException) as raised:
        api.nodes('pve1').qemu.get()
    assert raised.value.status_code == 595
    assert [n['status'] for n in api.nodes.get()] == ['offline']
    clean_lab.clear('pve-node-offline')
    assert api.nodes('pve1').qemu.get() == []


def agent_addresses(qemu):
    """eth0's addresses the guest agent reports, or PVE's error text."""
    try:
        result = qemu.agent('network-get-interfaces').get()['result']
    except ResourceException as exc:
        return str(exc)
    return [a['ip-address'] for i in result if i['name'] == 'eth0' for a in i['ip-addresses']]


def test_agent_down_hides_the_address_across_reboots_until_cleared(clean_lab):
    api = clean_lab.proxmox()
    qemu = api.nodes('pve1').qemu(1021)
    create_vm(api, 1021, agent=1, start=1)
    assert agent_addresses(qemu) == [clean_lab.net + '.100']
    clean_lab.fault('pve-agent-down', '1021')
    assert 'QEMU guest agent is not running' in agent_addresses(qemu)
    assert [(vm['vmid'], vm['status'], vm['agent']) for vm in clean_lab.vms()] == [(1021, 'running', 'down')]
    ok(api, qemu.status.reboot.post())
    assert 'QEMU guest agent is not running' in agent_addresses(qemu)
    assert active(clean_lab) == [('pve-agent-down', '1021')]
    clean_lab.clear('pve-agent-down', '1021')
    assert agent_addresses(qemu) == [clean_lab.net + '.100']
    assert clean_lab.vms()[0]['agent'] == 'running'


def test_storage_full_fails_disk_allocations_and_reports_the_space_until_cleared(clean_lab):
    api = clean_lab.proxmox()
    gib = 1024 ** 3
    ok(api, api.nodes('pve1').qemu.post(vmid=1011, name='before', scsi0='local-lvm:4'))
    clean_lab.fault('pve-storage-full', 'local-lvm', free=1)
    storage = api.nodes('pve1').storage('local-lvm').status.get()
    assert storage['avail'] == gib and storage['used'] >= 4 * gib
    failed = create_vm(api, 1012, scsi0='local-lvm:2')
    assert failed['exitstatus'] == "unable to create VM 1012 - unable to write to storage 'local-lvm': No space left on device"
    assert [vm['vmid'] for vm in api.nodes('pve1').qemu.get()] == [1011]
    ok(api, api.nodes('pve1').qemu.post(vmid=1013, name='fits', scsi0='local-lvm:1'))   # 1 GiB still fits
    clean_lab.clear('pve-storage-full', 'local-lvm')
    assert active(clean_lab) == []
    assert api.nodes('pve1').storage('local-lvm').status.get()['avail'] > 8 * gib
    assert create_vm(api, 1012, scsi0='local-lvm:2')['exitstatus'] == 'OK'


@pytest.mark.parametrize('name, target, params, message', [
    ('pve-nothing', None, {}, "unknown fault 'pve-nothing'"),
    ('pve-config-lock', None, {}, 'needs a target: pve-config-lock VMID'),
    ('pve-config-lock', '4242', {}, 'no VM 4242 in the lab'),
    ('pve-5xx', None, {'status': '404'}, 'status must be 500-599'),
    ('pve-5xx', None, {'times': 'two'}, "parameter times must be an integer, got 'two'"),
    ('pve-flaky-network', None, {'drop_rate': '2'}, 'drop_rate must be between 0 and 1'),
    ('pve-node-offline', 'pve9', {}, "no PVE node 'pve9'"),
    ('pve-task-error', 'start', {'vmid': '1', 'colour': 'red'}, 'has no parameter colour'),
    ('pve-agent-down', '4242', {}, 'no VM 4242 in the lab'),
    ('pve-storage-full', 'ceph', {}, "no storage 'ceph' in the lab"),
    ('pve-storage-full', 'local-lvm', {'free': '-1'}, 'free must be 0 or more GiB'),
])
def test_bad_fault_requests_are_refused_with_the_reason(clean_lab, name, target, params, message):
    with pytest.raises(ControlError, match=message):
        clean_lab.fault(name, target, **params)
    assert active(clean_lab) == []
