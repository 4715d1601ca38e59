"""proxmox_vm with `vms`: every VM of the list planned and acted on in one module run, against an in-process fakepve."""
import threading

import pytest


from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors, _proxmox_vm
from ansible_collections.proxtalos.cluster.plugins.modules import proxmox_vm
from ansible_collections.proxtalos.cluster.tests.helpers import run_main

TOKEN_SECRET = 'c0ffee00-5ec2-e7a1-b0b0-0000many0000'
NAMES = ('cp-1', 'w-1', 'w-2')
VMIDS = {'cp-1': 101, 'w-1': 102, 'w-2': 103}


@pytest.fixture
def pve(fakepve):
    fakepve.apitokens['root@pam!proxtalos'] = TOKEN_SECRET
    fakepve.store_file('local', 'talos.iso', 1024 ** 2)
    return fakepve


def item(name, **overrides):
    values = dict(name=name, vmid=VMIDS[name], node='pve1', state='started', cores=2, memory=2048, bridge='vmbr0',
                  disk_storage='local-lvm', disk_size=10, cdrom='local:iso/talos.iso', agent=True, tags=['talos'])
    values.update(overrides)
    return values


def module_args(pve, cafile, vms=None, **overrides):
    args = dict(api_host=pve.host, api_port=pve.port, api_user='root@pam', api_token_id='proxtalos',
                api_token_secret=TOKEN_SECRET, ca_path=cafile, wait_timeout=20, wait_sleep=0.1,
                vms=vms if vms is not None else [item(name) for name in NAMES])
    args.update(overrides)
    return args


def run_module(args, capsys, check_mode=False, diff=False):
    code, result, out = run_main(proxmox_vm, args, capsys, check_mode, diff)
    assert TOKEN_SECRET not in out
    return code, result


def writes(pve):
    return [r for r in pve.requests if r[0] != 'GET']


def test_check_mode_predicts_each_vm_truthfully_and_writes_nothing(pve, fakepve_cafile, capsys):
    run_module(module_args(pve, fakepve_cafile, vms=[item('cp-1')]), capsys)   # cp-1 exists and matches
    before = len(writes(pve))
    vms = [item('cp-1'), item('w-1'), item('w-2', state='stopped')]
    code, result = run_module(module_args(pve, fakepve_cafile, vms=vms), capsys, check_mode=True, diff=True)
    assert code == 0 and result['changed'] is True
    assert sorted(result['vms']) == sorted(NAMES)
    assert result['vms']['cp-1']['changed'] is False and result['vms']['cp-1']['actions'] == []
    assert result['vms']['w-1']['changed'] is True and result['vms']['w-1']['actions'] == ['create', 'start']
    assert result['vms']['w-2']['actions'] == ['create'] and result['vms']['w-2']['status'] == 'absent'
    # The diff shows the changed VMs only, each under its inventory name.
    assert sorted(result['diff']['after']) == ['w-1', 'w-2']
    assert result['diff']['after']['w-1']['status'] == 'running' and result['diff']['before'] == {'w-1': {}, 'w-2': {}}
    assert result['vms']['w-1']['diff']['after']['cores'] == 2
    assert len(writes(pve)) == before and pve.vm(102) is None and pve.vm(103) is None


def test_every_vm_is_created_and_started_then_a_rerun_is_unchanged(pve, fakepve_cafile, capsys):
    code, result = run_module(module_args(pve, fakepve_cafile), capsys)
    assert code == 0 and result['changed'] is True, result
    for name in NAMES:
        vm = result['vms'][name]
        assert vm['changed'] and vm['actions'] == ['create', 'start'] and vm['status'] == 'running'
        assert vm['vmid'] == VMIDS[name] and vm['node'] == 'pve1' and len(vm['upids']) == 2
        assert pve.vm(VMIDS[name]).status == 'running' and pve.vm(VMIDS[name]).config['name'] == name
    assert 'diff' not in result and 'failed_vms' not in result
    assert 1 <= result['workers'] <= len(NAMES)
    before = len(writes(pve))
    code, result = run_module(module_args(pve, fakepve_cafile), capsys)
    assert code == 0 and result['changed'] is False
    assert all(not vm['changed'] and vm['actions'] == [] for vm in result['vms'].values())
    assert len(writes(pve)) == before


def test_changed_is_per_vm(pve, fakepve_cafile, capsys):
    run_module(module_args(pve, fakepve_cafile), capsys)
    vms = [item('cp-1'), item('w-1', cores=3), item('w-2')]
    code, result = run_module(module_args(pve, fakepve_cafile, vms=vms), capsys, diff=True)
    assert code == 0 and result['changed'] is True
    assert [name for name in NAMES if result['vms'][name]['changed']] == ['w-1']
    assert result['vms']['w-1']['actions'] == ['update cores']
    assert result['diff'] == {'before': {'w-1': result['vms']['w-1']['diff']['before']},
                              'after': {'w-1': result['vms']['w-1']['diff']['after']}}
    assert (result['diff']['before']['w-1']['cores'], result['diff']['after']['w-1']['cores']) == (2, 3)


def test_one_vm_failing_among_passing_ones_names_only_it(pve, fakepve_cafile, capsys):
    vms = [item('cp-1'), item('w-1', cdrom='local:iso/missing.iso'), item('w-2')]
    code, result = run_module(module_args(pve, fakepve_cafile, vms=vms), capsys)
    assert code == 1 and result['failed']
    assert result['msg'].startswith('1 of 3 VMs failed: w-1 (VM 102 on PVE node pve1): VM 102 (w-1) on node pve1: '
                                    'create failed on PVE node pve1: TASK ERROR:'), result['msg']
    assert 'local:iso/missing.iso does not exist' in result['msg']
    assert 'cp-1' not in result['msg'] and 'w-2' not in result['msg']
    assert list(result['failed_vms']) == ['w-1']
    failed = result['failed_vms']['w-1']
    assert failed['vmid'] == 102 and failed['node'] == 'pve1' and failed['operation'] == 'create' and failed['task_log']
    assert failed['changed'] is False and failed['actions'] == []
    # The others were created and started; their results are there, and the run as a whole changed something.
    assert sorted(result['vms']) == ['cp-1', 'w-2'] and result['changed'] is True
    assert pve.vm(101).status == 'running' and pve.vm(103).status == 'running' and pve.vm(102) is None


def test_a_vm_that_fails_after_a_change_reports_what_was_done(pve, fakepve_cafile, capsys):
    pve.fail('POST', '/qemu/102/status/start', 500, 'start failed: QEMU exited with code 1')
    code, result = run_module(module_args(pve, fakepve_cafile), capsys)
    assert code == 1 and list(result['failed_vms']) == ['w-1']
    failed = result['failed_vms']['w-1']
    assert failed['changed'] is True and failed['actions'] == ['create'] and len(failed['upids']) == 1
    assert 'QEMU exited with code 1' in result['msg'] and result['msg'].startswith('1 of 3 VMs failed: w-1 (VM 102')


def test_vm_name_sets_the_pve_name_and_name_stays_the_key(pve, fakepve_cafile, capsys):
    code, result = run_module(module_args(pve, fakepve_cafile, vms=[item('cp-1', vm_name='talos-cp-1')]), capsys)
    assert code == 0 and list(result['vms']) == ['cp-1'] and pve.vm(101).config['name'] == 'talos-cp-1'


@pytest.mark.parametrize('vms, text', [
    ([item('cp-1'), item('w-1', cores=0)], "vms: item 1 (w-1): cores: must be at least 1, got 0"),
    ([item('cp-1', vm_name='cp_1')], "vms: item 0 (cp-1): name: 'cp_1' is not a valid DNS name"),
    ([item('cp-1'), item('cp-1', vmid=109)], "vms: item 1: name 'cp-1' is listed twice"),
    ([item('cp-1'), item('w-1', vmid=101)], 'vms: item 1 (w-1): VM id 101 is listed twice'),
    ([], 'vms: the list is empty'),
])
def test_bad_items_fail_naming_the_item_and_the_field_before_anything_is_done(pve, fakepve_cafile, capsys, vms, text):
    code, result = run_module(module_args(pve, fakepve_cafile, vms=vms), capsys)
    assert code == 1 and result['field'] == 'vms' and result['msg'].startswith(text), result['msg']
    assert writes(pve) == []


@pytest.mark.parametrize('option, value', [('vmid', 101), ('node', 'pve1'), ('cores', 2), ('state', 'reset')])
def test_a_per_vm_option_at_the_top_level_is_refused_naming_it(pve, fakepve_cafile, capsys, option, value):
    """The one-VM form is gone: its options beside vms are unsupported parameters, named in the message."""
    code, result = run_module(module_args(pve, fakepve_cafile, **{option: value}), capsys)
    assert code == 1 and result['msg'].startswith('Unsupported parameters for (') and (
        'module: %s.' % option in result['msg']), result['msg']
    # The whole old form (no vms): Ansible names the first error, the option to use.
    args = module_args(pve, fakepve_cafile, **{option: value})
    del args['vms']
    code, result = run_module(args, capsys)
    assert code == 1 and result['msg'] == 'missing required arguments: vms', result['msg']
    assert writes(pve) == []


def test_each_item_needs_its_vmid_and_node(pve, fakepve_cafile, capsys):
    for key in ('vmid', 'node'):
        bad = item('w-1')
        del bad[key]
        code, result = run_module(module_args(pve, fakepve_cafile, vms=[item('cp-1'), bad]), capsys)
        assert code == 1 and result['msg'] == 'missing required arguments: %s found in vms' % key, result['msg']
    assert writes(pve) == []


def test_run_vms_works_on_the_vms_at_the_same_time(monkeypatch):
    """Each VM's run() starts before any other ends: a barrier that every job must reach proves the overlap."""
    barrier = threading.Barrier(3, timeout=5)

    class Client(object):
        retried = []

    def fake_run(params, client, deadline, check_mode, warn, runner=None):  # pylint: disable=unused-argument
        barrier.wait()
        if params['vmid'] == 102:
            raise _errors.TaskFailed('VM 102 (w-1) on node pve1: start failed on PVE node pve1: TASK ERROR: boom',
                                     operation='start')
        return dict(changed=False, vmid=params['vmid'], node=params['node'], actions=[], upids=[],
                    diff={'before': {}, 'after': {}})

    monkeypatch.setattr(_proxmox_vm, 'run', fake_run)
    items = [(name, dict(vmid=VMIDS[name], node='pve1', name=name, wait_timeout=5, wait_sleep=1, wait=True))
             for name in NAMES]
    outcome = _proxmox_vm.run_vms(items, Client, deadline=None, check_mode=False, warn=None)
    assert outcome.workers == 3
    ok, result, message = _proxmox_vm.vms_result(outcome, with_diff=False)
    assert not ok and message == ('1 of 3 VMs failed: w-1 (VM 102 on PVE node pve1): VM 102 (w-1) on node pve1: start '
                                  'failed on PVE node pve1: TASK ERROR: boom')
    assert sorted(result['vms']) == ['cp-1', 'w-2'] and result['failed_vms']['w-1']['operation'] == 'start'
    assert result['changed'] is False


def test_transient_errors_are_retried_and_listed_under_the_vm_they_hit(pve, fakepve_cafile, capsys):
    pve.fail('GET', '/qemu/103/status/current', 503, 'Service Unavailable', times=2)
    code, result = run_module(module_args(pve, fakepve_cafile), capsys)
    assert code == 0 and all(vm['status'] == 'running' for vm in result['vms'].values())
    hit = [r for r in result['retries'] if '503' in r['error']]
    assert hit and all(r['vm'] == 'w-2' for r in hit), result['retries']
    assert result['vms']['w-2']['retries'] and not result['vms']['cp-1']['retries']
