"""proxmox_vm: the pure plan (no I/O), then the module as Ansible runs it on one VM (a one-element vms list) against
an in-process fakepve."""
import json

import pytest


from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors, _proxmox_vm
from ansible_collections.proxtalos.cluster.plugins.modules import proxmox_vm
from ansible_collections.proxtalos.cluster.tests.helpers import run_main

TOKEN_SECRET = 'c0ffee00-5ec2-e7a1-b0b0-123456789abc'


def params(**overrides):
    """One VM's params as the module hands them to the engine (_proxmox_vm.item_params): every top-level option and
    every option of a `vms` item, defaults filled in."""
    values = dict((name, spec.get('default')) for name, spec in proxmox_vm.argument_spec().items() if name != 'vms')
    values.update((name, spec.get('default')) for name, spec in proxmox_vm.vm_options().items() if name != 'vm_name')
    values.update(api_host='pve', api_user='root@pam', api_token_id='t', api_token_secret='s',
                  vmid=101, node='pve1', name='cp-1', state='present', cores=2, memory=2048, cpu='x86-64-v2-AES',
                  bridge='vmbr0', disk_storage='local-lvm', disk_size=10, scsihw='virtio-scsi-single',
                  cdrom='local:iso/talos.iso', boot='order=scsi0;ide2;net0', agent=True, serial=True,
                  onboot=True, tags=['talos', 'lab'])
    values.update(overrides)
    return values


def pve_config(**overrides):
    """A config as PVE returns it for a VM made from params(): PVE's own spellings of the same values."""
    config = {'name': 'cp-1', 'cores': 2, 'memory': '2048', 'cpu': 'x86-64-v2-AES',
              'net0': 'virtio=BC:24:11:AA:BB:CC,bridge=vmbr0', 'scsi0': 'local-lvm:vm-101-disk-0,size=10G',
              'scsihw': 'virtio-scsi-single', 'ide2': 'local:iso/talos.iso,media=cdrom,size=1M',
              'boot': 'order=scsi0;ide2;net0', 'agent': '1', 'serial0': 'socket', 'onboot': 1, 'tags': 'Lab;talos',
              'meta': 'creation-qemu=10.0.2', 'smbios1': 'uuid=0', 'vmgenid': '1'}
    config.update(overrides)
    return dict((k, v) for k, v in config.items() if v is not None)


def kinds(actions):
    return [a.kind for a in actions]


# ---------------------------------------------------------------------------------------- plan


def test_a_missing_vm_is_created_with_every_managed_key():
    changed, actions, diff = _proxmox_vm.plan(params(state='started'), None, None)
    assert changed and kinds(actions) == ['create', 'start']
    assert actions[0].data['values'] == {
        'vmid': 101, 'name': 'cp-1', 'cores': 2, 'memory': 2048, 'cpu': 'x86-64-v2-AES', 'net0': 'virtio,bridge=vmbr0',
        'scsi0': 'local-lvm:10', 'scsihw': 'virtio-scsi-single', 'ide2': 'local:iso/talos.iso,media=cdrom',
        'boot': 'order=scsi0;ide2;net0', 'agent': 'enabled=1', 'serial0': 'socket', 'onboot': 1, 'tags': 'lab;talos'}
    assert diff['before'] == {}
    assert diff['after']['status'] == 'running' and diff['after']['scsi0'] == {'storage': 'local-lvm', 'size': '10G'}


def test_a_vm_that_matches_is_not_changed_whatever_the_spelling():
    changed, actions, diff = _proxmox_vm.plan(params(), pve_config(), 'stopped')
    assert not changed and actions == []
    assert diff['before'] == diff['after']


def test_agent_given_as_enabled_equals_and_memory_as_current_are_the_same():
    config = pve_config(agent='enabled=1,fstrim_cloned_disks=1', memory='current=2048', onboot='1')
    assert _proxmox_vm.plan(params(), config, 'running')[1] == []


def test_cores_and_memory_drift_is_one_update_with_a_diff():
    changed, actions, diff = _proxmox_vm.plan(params(), pve_config(cores=4, memory='4096'), 'stopped')
    assert changed and kinds(actions) == ['update']
    assert actions[0].data == {'values': {'cores': 2, 'memory': 2048}, 'delete': []}
    assert (diff['before']['cores'], diff['after']['cores']) == (4, 2)
    assert (diff['before']['memory'], diff['after']['memory']) == (4096, 2048)
    assert actions[0].describe() == 'update cores, memory'


def test_drift_waiting_in_the_pending_config_is_found():
    changed, actions, diff = _proxmox_vm.plan(params(), pve_config(), 'running', {'cores': 8})
    assert changed and actions[0].data['values'] == {'cores': 2}
    assert diff['before']['cores'] == 8


def test_a_pending_value_equal_to_the_wanted_one_is_no_change():
    assert _proxmox_vm.plan(params(cores=4), pve_config(), 'running', {'cores': 4})[1] == []


def test_the_nic_keeps_its_generated_mac_when_the_bridge_changes():
    changed, actions, diff = _proxmox_vm.plan(params(bridge='vmbr1'), pve_config(), 'stopped')
    assert changed and actions[0].data['values'] == {'net0': 'virtio=BC:24:11:AA:BB:CC,bridge=vmbr1'}
    assert diff['before']['net0'] == {'model': 'virtio', 'bridge': 'vmbr0'}
    assert diff['after']['net0'] == {'model': 'virtio', 'bridge': 'vmbr1'}


def test_a_managed_mac_is_compared_and_unmanaged_nic_parts_are_left_alone():
    config = pve_config(net0='virtio=BC:24:11:AA:BB:CC,bridge=vmbr0,firewall=1')
    assert _proxmox_vm.plan(params(), config, 'stopped')[1] == []
    actions = _proxmox_vm.plan(params(macaddr='bc:24:11:00:00:01'), config, 'stopped')[1]
    assert actions[0].data['values'] == {'net0': 'virtio=BC:24:11:00:00:01,bridge=vmbr0'}


def test_the_disk_grows_but_never_shrinks_or_moves():
    actions = _proxmox_vm.plan(params(disk_size=20), pve_config(), 'running')[1]
    assert kinds(actions) == ['resize'] and actions[0].data == {'disk': 'scsi0', 'size': '20G'}
    with pytest.raises(_errors.ValidationError) as caught:
        _proxmox_vm.plan(params(disk_size=5), pve_config(), 'running')
    assert caught.value.field == 'disk_size' and 'cannot shrink' in str(caught.value)
    with pytest.raises(_errors.ValidationError) as caught:
        _proxmox_vm.plan(params(disk_storage='ceph-vm'), pve_config(), 'running')
    assert caught.value.field == 'disk_storage'


def test_a_missing_disk_is_added():
    actions = _proxmox_vm.plan(params(), pve_config(scsi0=None), 'stopped')[1]
    assert actions[0].data['values'] == {'scsi0': 'local-lvm:10'}


def test_tags_are_a_set_and_an_empty_list_or_string_removes():
    assert _proxmox_vm.plan(params(tags=['LAB', 'talos', 'talos']), pve_config(), 'stopped')[1] == []
    actions = _proxmox_vm.plan(params(tags=[], serial=False, description=''),
                               pve_config(description='old notes\n'), 'stopped')[1]
    assert actions[0].data == {'values': {}, 'delete': ['description', 'serial0', 'tags']}


def test_unset_options_are_not_managed():
    actions = _proxmox_vm.plan(params(cores=None, memory=None, tags=None), pve_config(cores=16, tags='other'),
                               'stopped')[1]
    assert actions == []


def test_cloud_init_drive_and_ipconfig():
    wanted = params(cloudinit_storage='local-lvm', ipconfig0='ip=10.0.0.11/24,gw=10.0.0.1', nameserver='1.1.1.1')
    actions = _proxmox_vm.plan(wanted, pve_config(), 'stopped')[1]
    assert actions[0].data['values'] == {'ide0': 'local-lvm:cloudinit', 'ipconfig0': 'ip=10.0.0.11/24,gw=10.0.0.1',
                                         'nameserver': '1.1.1.1'}
    there = pve_config(ide0='local-lvm:vm-101-cloudinit,media=cdrom', ipconfig0='gw=10.0.0.1,ip=10.0.0.11/24',
                       nameserver='1.1.1.1')
    assert _proxmox_vm.plan(wanted, there, 'stopped')[1] == []


def test_power_states():
    assert kinds(_proxmox_vm.plan(params(state='started'), pve_config(), 'stopped')[1]) == ['start']
    assert kinds(_proxmox_vm.plan(params(state='stopped'), pve_config(), 'running')[1]) == ['shutdown']
    assert _proxmox_vm.plan(params(state='started'), pve_config(), 'running')[1] == []
    assert kinds(_proxmox_vm.plan(params(state='started', cores=4), pve_config(), 'stopped')[1]) == ['update', 'start']


def test_absent_stops_then_deletes_and_is_a_no_op_when_gone():
    changed, actions, diff = _proxmox_vm.plan(params(state='absent'), pve_config(), 'running')
    assert changed and kinds(actions) == ['stop', 'delete'] and diff['after'] == {}
    assert _proxmox_vm.plan(params(state='absent'), None, None)[:2] == (False, [])


def test_absent_refuses_to_delete_a_vm_of_that_id_with_another_name():
    for config, named in ((pve_config(name='db-1'), "named 'db-1'"), (pve_config(name=None), 'unnamed')):
        with pytest.raises(_errors.ValidationError) as caught:
            _proxmox_vm.plan(params(state='absent'), config, 'running')
        assert caught.value.field == 'vmid'
        assert "VM 101 on node pve1 is %s, not 'cp-1': refusing to delete another VM" % named in str(caught.value)
    # without a name there is nothing to compare: the id alone decides
    assert kinds(_proxmox_vm.plan(params(state='absent', name=None), pve_config(name='db-1'), 'stopped')[1]) == ['delete']


def test_reset_always_acts_and_starts_a_stopped_vm():
    assert kinds(_proxmox_vm.plan(params(state='reset'), pve_config(), 'running')[1]) == ['reset']
    assert kinds(_proxmox_vm.plan(params(state='reset'), pve_config(cores=64), 'stopped')[1]) == ['start']
    with pytest.raises(_errors.ValidationError) as caught:
        _proxmox_vm.plan(params(state='reset'), None, None)
    assert caught.value.field == 'vmid'


def test_restart_on_change_reboots_for_changes_pve_cannot_apply_live():
    wanted = params(cores=4, restart_on_change=True)
    assert kinds(_proxmox_vm.plan(wanted, pve_config(), 'running')[1]) == ['update', 'reboot']
    assert kinds(_proxmox_vm.plan(params(tags=['x'], restart_on_change=True), pve_config(), 'running')[1]) == ['update']
    # A change left pending earlier is applied too.
    assert kinds(_proxmox_vm.plan(params(restart_on_change=True), pve_config(), 'running', {'cores': 2, 'sockets': 2})[1]) == [
        'reboot']


def test_reboot_required_is_predicted_for_cold_changes_on_a_running_vm():
    actions = _proxmox_vm.plan(params(cores=4), pve_config(), 'running')[1]
    assert _proxmox_vm.predict_reboot_required(params(cores=4), actions, pve_config(), {}, 'running')
    actions = _proxmox_vm.plan(params(tags=['x']), pve_config(), 'running')[1]
    assert not _proxmox_vm.predict_reboot_required(params(tags=['x']), actions, pve_config(), {}, 'running')
    assert not _proxmox_vm.predict_reboot_required(params(cores=4), actions, pve_config(), {}, 'stopped')


CI_THERE = dict(ide0='local-lvm:vm-101-cloudinit,media=cdrom', ipconfig0='ip=10.0.0.11/24,gw=10.0.0.1')


def test_a_cloud_init_change_on_a_running_vm_is_owed_a_restart():
    # PVE writes ipconfig0 into a running VM's config at once (fast-plug); the guest sees it at the next start.
    wanted = params(cloudinit_storage='local-lvm', ipconfig0='ip=10.0.0.21/24,gw=10.0.0.1')
    actions = _proxmox_vm.plan(wanted, pve_config(**CI_THERE), 'running')[1]
    assert kinds(actions) == ['update']
    assert _proxmox_vm.predict_reboot_required(wanted, actions, pve_config(**CI_THERE), {}, 'running')


def test_restart_on_change_shuts_down_before_a_cloud_init_change_and_starts_after():
    # A run that ends after the change leaves a stopped VM: the next run starts it (the old code rebooted after the
    # update, and a run ending between the two left a running VM whose ipconfig0 change PVE lists nowhere).
    wanted = params(cloudinit_storage='local-lvm', ipconfig0='ip=10.0.0.21/24,gw=10.0.0.1', restart_on_change=True)
    assert kinds(_proxmox_vm.plan(wanted, pve_config(**CI_THERE), 'running')[1]) == ['shutdown', 'update', 'start']
    changed = dict(ide0=CI_THERE['ide0'], ipconfig0='ip=10.0.0.21/24,gw=10.0.0.1')
    assert kinds(_proxmox_vm.plan(dict(wanted, state='started'), pve_config(**changed), 'stopped')[1]) == ['start']


def test_cloud_init_drift_left_by_an_earlier_run_is_reported_and_restarted():
    wanted = params(cloudinit_storage='local-lvm', ipconfig0='ip=10.0.0.11/24,gw=10.0.0.1', nameserver='9.9.9.9')
    there = pve_config(nameserver='9.9.9.9', **CI_THERE)
    changed, actions, _diff = _proxmox_vm.plan(wanted, there, 'running', {}, ['nameserver'])
    assert not changed and actions == []
    assert _proxmox_vm.predict_reboot_required(wanted, actions, there, {}, 'running', ['nameserver'])
    assert kinds(_proxmox_vm.plan(dict(wanted, restart_on_change=True), there, 'running', {}, ['nameserver'])[1]) == [
        'reboot']


@pytest.mark.parametrize('items, drift', [
    ([{'key': 'nameserver', 'value': '1.1.1.1'}], []),
    ([{'key': 'nameserver', 'value': '1.1.1.1', 'pending': '9.9.9.9'}, {'key': 'searchdomain', 'pending': 'x'},
      {'key': 'sshkeys', 'delete': 1}], ['nameserver', 'searchdomain', 'sshkeys']),
])
def test_the_cloud_init_drift_is_read_from_the_cloudinit_endpoint(items, drift):
    class Client(object):
        def get(self, path, what, subject=None):
            assert path == 'nodes/pve1/qemu/101/cloudinit'
            return items
    assert _proxmox_vm.read_cloudinit_drift(Client(), 'pve1', 101) == drift


@pytest.mark.parametrize('overrides, field', [
    (dict(vmid=99), 'vmid'), (dict(name='cp_1'), 'name'), (dict(cores=0), 'cores'), (dict(memory=8), 'memory'),
    (dict(tags=['a b']), 'tags'), (dict(macaddr='zz'), 'macaddr'), (dict(macaddr='01:24:11:00:00:01'), 'macaddr'), (dict(vlan_tag=5000), 'vlan_tag'),
    (dict(net_model='rtl9000'), 'net_model'), (dict(disk_size=None), 'disk_size'),
    (dict(ipconfig0='ip=10.0.0.1/24,gateway=10.0.0.254'), 'ipconfig0'),
])
def test_bad_options_name_the_field(overrides, field):
    with pytest.raises(_errors.ValidationError) as caught:
        _proxmox_vm.validate(params(**overrides))
    assert caught.value.field == field


# ------------------------------------------------------------------------- the module, fakepve


@pytest.fixture
def pve(fakepve):
    fakepve.apitokens['root@pam!proxtalos'] = TOKEN_SECRET
    fakepve.store_file('local', 'talos.iso', 1024 ** 2)
    return fakepve


# The options that stay at the top level, shared by every VM of `vms`; the others are the VM's own.
SHARED = ('api_host', 'api_port', 'api_user', 'api_token_id', 'api_token_secret', 'ca_path', 'wait_timeout',
          'wait_sleep')


def module_args(pve, cafile, **overrides):
    """The options of one VM (cp-1) and the connection, flat; run_module puts the VM's own into a `vms` item."""
    args = dict(api_host=pve.host, api_port=pve.port, api_user='root@pam', api_token_id='proxtalos',
                api_token_secret=TOKEN_SECRET, ca_path=cafile, vmid=101, node='pve1', name='cp-1', state='started',
                cores=2, memory=2048, bridge='vmbr0', disk_storage='local-lvm', disk_size=10,
                cdrom='local:iso/talos.iso', agent=True, tags=['talos'], wait_timeout=20, wait_sleep=0.1)
    args.update(overrides)
    return args


def run_module(args, capsys, check_mode=False, diff=False):
    """Run proxmox_vm on the one VM of `args` (a one-element vms list). Returns (code, view, out): the VM's own part
    of the result (vms or failed_vms) with the run's keys (changed, failed, msg, workers...) beside it."""
    shared = dict((key, value) for key, value in args.items() if key in SHARED)
    item = dict((key, value) for key, value in args.items() if key not in SHARED)
    code, result, out = run_main(proxmox_vm, dict(shared, vms=[item]), capsys, check_mode, diff)
    view = dict((key, value) for key, value in result.items() if key not in ('vms', 'failed_vms', 'diff', 'retries'))
    view.update(result.get('vms', {}).get(item['name'], {}))
    view.update(result.get('failed_vms', {}).get(item['name'], {}))
    if 'msg' in result:
        view['msg'] = result['msg']
    return code, view, out


def writes(pve):
    return [r for r in pve.requests if r[0] != 'GET']


def test_check_mode_predicts_a_creation_and_writes_nothing(pve, fakepve_cafile, capsys):
    code, result, out = run_module(module_args(pve, fakepve_cafile), capsys, check_mode=True, diff=True)
    assert code == 0 and result['changed'] is True
    assert result['actions'] == ['create', 'start'] and result['status'] == 'absent'
    assert result['diff']['after']['cores'] == 2
    assert writes(pve) == [] and pve.vm(101) is None
    assert TOKEN_SECRET not in out


def test_create_start_then_rerun_is_unchanged(pve, fakepve_cafile, capsys):
    code, result, out = run_module(module_args(pve, fakepve_cafile), capsys)
    assert code == 0 and result['changed'] is True and result['actions'] == ['create', 'start']
    assert result['status'] == 'running' and len(result['upids']) == 2
    assert int(pve.vm(101).config['cores']) == 2 and pve.vm(101).status == 'running'
    assert TOKEN_SECRET not in out
    before = len(writes(pve))
    code, result, _out = run_module(module_args(pve, fakepve_cafile), capsys)
    assert code == 0 and result['changed'] is False and result['actions'] == []
    assert len(writes(pve)) == before


def test_drift_on_a_running_vm_is_fixed_and_reported_as_applied(pve, fakepve_cafile, capsys):
    run_module(module_args(pve, fakepve_cafile), capsys)
    pve.vm(101).pending['memory'] = 8192  # changed behind Ansible's back, waiting for the next start
    code, result, _out = run_module(module_args(pve, fakepve_cafile), capsys, diff=True)
    assert code == 0 and result['changed'] is True and result['actions'] == ['update memory']
    assert (result['diff']['before']['memory'], result['diff']['after']['memory']) == (8192, 2048)
    assert result['reboot_required'] is False
    code, result, _out = run_module(module_args(pve, fakepve_cafile), capsys)
    assert result['changed'] is False


def test_a_change_on_a_running_vm_is_pending_until_restart_on_change(pve, fakepve_cafile, capsys):
    run_module(module_args(pve, fakepve_cafile), capsys)
    code, result, _out = run_module(module_args(pve, fakepve_cafile, cores=4), capsys)
    assert code == 0 and result['changed'] and result['reboot_required'] is True and result['pending'] == ['cores']
    assert 'cores pending until the VM restarts' in json.dumps(result.get('warnings'))
    code, result, _out = run_module(module_args(pve, fakepve_cafile, cores=4, restart_on_change=True), capsys)
    assert code == 0 and result['changed'] and result['actions'] == ['reboot']
    assert result['reboot_required'] is False and int(pve.vm(101).config['cores']) == 4


def test_a_task_error_fails_naming_vm_node_operation_and_pve_message(pve, fakepve_cafile, capsys):
    args = module_args(pve, fakepve_cafile, cdrom='local:iso/missing.iso')
    code, result, _out = run_module(args, capsys)
    assert code == 1 and result['failed']
    assert result['msg'].startswith('1 of 1 VMs failed: cp-1 (VM 101 on PVE node pve1): VM 101 (cp-1) on node pve1: '
                                    'create failed on PVE node pve1: TASK ERROR:'), result['msg']
    assert 'local:iso/missing.iso does not exist' in result['msg']
    assert result['operation'] == 'create' and result['task_log']


def test_transient_5xx_answers_are_retried(pve, fakepve_cafile, capsys):
    pve.fail('GET', '/cluster/resources', 503, 'Service Unavailable', times=2)
    code, result, _out = run_module(module_args(pve, fakepve_cafile), capsys)
    assert code == 0 and result['changed'] and result['status'] == 'running'
    assert [r['error'] for r in result['retries']][:2] == [
        'TransientApiError: VM 101 (cp-1) on node pve1: list VMs failed: Proxmox VE API answered 503 Service '
        'Unavailable'] * 2


def test_a_held_config_lock_fails_at_the_deadline_with_the_cause(pve, fakepve_cafile, capsys):
    run_module(module_args(pve, fakepve_cafile, state='present'), capsys)
    pve.vm(101).lock_holder = 'scenario'
    code, result, _out = run_module(module_args(pve, fakepve_cafile, cores=4, wait_timeout=1), capsys)
    assert code == 1
    assert result['msg'].startswith('1 of 1 VMs failed: cp-1 (VM 101 on PVE node pve1): VM 101 (cp-1) on node pve1: '
                                    'gave up after'), result['msg']
    assert 'got timeout' in result['msg']


def test_reset_acts_every_time(pve, fakepve_cafile, capsys):
    run_module(module_args(pve, fakepve_cafile), capsys)
    started = pve.vm(101).started_at
    for _attempt in range(2):
        code, result, _out = run_module(dict(module_args(pve, fakepve_cafile), state='reset'), capsys)
        assert code == 0 and result['changed'] and result['actions'] == ['reset']
    assert pve.vm(101).started_at >= started
    assert sum(1 for t in pve.tasklog if t['type'] == 'qmreset') == 2


def test_absent_deletes_and_then_is_unchanged(pve, fakepve_cafile, capsys):
    run_module(module_args(pve, fakepve_cafile), capsys)
    code, result, _out = run_module(module_args(pve, fakepve_cafile, state='absent'), capsys)
    assert code == 0 and result['changed'] and result['actions'] == ['stop', 'delete'] and pve.vm(101) is None
    code, result, _out = run_module(module_args(pve, fakepve_cafile, state='absent'), capsys)
    assert code == 0 and not result['changed']


def test_a_vm_on_another_node_is_an_error(pve, fakepve_cafile, capsys):
    pve.add_vm(101, 'cp-1', node='pve2')
    code, result, _out = run_module(module_args(pve, fakepve_cafile), capsys)
    assert code == 1 and result['field'] == 'node' and "on PVE node 'pve2'" in result['msg']
