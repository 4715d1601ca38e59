"""proxmox_vm_info: reading a VM and the address gate, against an in-process fakepve."""

import pytest


from ansible_collections.proxtalos.cluster.plugins.modules import proxmox_vm_info
from ansible_collections.proxtalos.cluster.tests.helpers import run_main

SECRET = 'feedface-5ec2-e7a1-b0b0-info'
ETH0 = [{'name': 'lo', 'ip-addresses': [{'ip-address': '127.0.0.1', 'ip-address-type': 'ipv4', 'prefix': 8}]},
        {'name': 'eth0', 'ip-addresses': [{'ip-address': '10.20.0.11', 'ip-address-type': 'ipv4', 'prefix': 24}]}]


@pytest.fixture
def pve(fakepve):
    fakepve.apitokens['root@pam!proxtalos'] = SECRET
    vm = fakepve.add_vm(101, 'cp-1', config={'agent': 'enabled=1', 'cipassword': 'hunter2', 'cores': 2})
    vm.status = vm.qmpstatus = 'running'
    return fakepve


def args(pve, cafile, vmid=101, expected_address=None, **overrides):
    """The module's arguments for one VM (a one-element vms list, named cp-1)."""
    vm = dict(name='cp-1', vmid=vmid, node='pve1')
    if expected_address:
        vm['expected_address'] = expected_address
    values = dict(api_host=pve.host, api_port=pve.port, api_user='root@pam', api_token_id='proxtalos',
                  api_token_secret=SECRET, ca_path=cafile, vms=[vm], wait_timeout=1, wait_sleep=0.1)
    values.update(overrides)
    return values


def run(values, capsys):
    code, result, out = run_main(proxmox_vm_info, values, capsys, check_mode=True)
    assert SECRET not in out and 'hunter2' not in out
    return code, result


def test_read_once_reports_state_config_and_agent(pve, fakepve_cafile, capsys):
    pve.vm(101).agent = {'interfaces': ETH0}
    code, result = run(args(pve, fakepve_cafile), capsys)
    vm = result['vms']['cp-1']
    assert code == 0 and result['changed'] is False and vm['exists'] is True
    assert vm['status'] == 'running' and vm['config']['cipassword'] == '<hidden>'
    assert vm['address'] == '10.20.0.11' and vm['attempts'] == 1


def test_a_missing_vm_is_reported_not_failed_when_only_reading(pve, fakepve_cafile, capsys):
    code, result = run(args(pve, fakepve_cafile, vmid=999), capsys)
    assert code == 0 and result['vms']['cp-1']['exists'] is False and result['vms']['cp-1']['status'] == 'absent'


def test_the_address_gate_passes_when_the_agent_reports_the_expected_address(pve, fakepve_cafile, capsys):
    pve.vm(101).agent = {'interfaces': ETH0}
    code, result = run(args(pve, fakepve_cafile, wait_for='address', expected_address='10.20.0.11'), capsys)
    assert code == 0 and result['vms']['cp-1']['address'] == '10.20.0.11'


def test_the_gate_fails_with_what_it_saw_and_the_agent_hint(pve, fakepve_cafile, capsys):
    code, result = run(args(pve, fakepve_cafile, wait_for='address'), capsys)
    assert code == 1
    assert result['msg'].startswith('1 of 1 VMs did not pass: cp-1: VM 101 (cp-1) on node pve1: not running with its '
                                    'guest agent reporting an IPv4')
    assert 'QEMU guest agent is not running' in result['msg'] and 'qemu-guest-agent' in result['msg']
    assert result['failed_vms']['cp-1']['attempts'] > 1 and result['failed_vms']['cp-1']['status'] == 'running'


def test_a_wrong_address_does_not_pass_the_gate(pve, fakepve_cafile, capsys):
    pve.vm(101).agent = {'interfaces': ETH0}
    code, result = run(args(pve, fakepve_cafile, wait_for='address', expected_address='10.20.0.99'), capsys)
    assert code == 1 and 'reporting 10.20.0.99' in result['msg'] and 'reports 10.20.0.11' in result['msg']


def test_running_gate_on_a_stopped_vm_times_out(pve, fakepve_cafile, capsys):
    pve.vm(101).status = 'stopped'
    code, result = run(args(pve, fakepve_cafile, wait_for='running'), capsys)
    assert code == 1 and 'last seen: VM is stopped' in result['msg']


def test_waiting_for_a_missing_vm_fails_at_once(pve, fakepve_cafile, capsys):
    code, result = run(args(pve, fakepve_cafile, vmid=999, wait_for='running', wait_timeout=30), capsys)
    assert code == 1 and 'cp-1 (VM 999 on PVE node pve1): vms: VM 999 does not exist' in result['msg']
    assert result['elapsed'] < 10


# ------------------------------------------------------------------------------- several VMs in one run

def eth0(address):
    return [{'name': 'eth0', 'ip-addresses': [{'ip-address': address, 'ip-address-type': 'ipv4', 'prefix': 24}]}]


@pytest.fixture
def three(pve):
    """VMs 101 (cp-1), 102 (w-1), 103 (w-2) running; the agents of 101 and 103 report addresses, 102's does not run."""
    pve.vm(101).agent = {'interfaces': ETH0}
    for vmid, name in ((102, 'w-1'), (103, 'w-2')):
        vm = pve.add_vm(vmid, name, config={'agent': 'enabled=1'})
        vm.status = vm.qmpstatus = 'running'
    pve.vm(103).agent = {'interfaces': eth0('10.20.0.103')}
    return pve


def many(pve, cafile, vms, **overrides):
    return args(pve, cafile, vms=vms, **overrides)


VMS = [dict(name='lab-cp-1', vmid=101, node='pve1', expected_address='10.20.0.11'),
       dict(name='lab-w-1', vmid=102, node='pve1'),
       dict(name='lab-w-2', vmid=103, node='pve1')]


def test_several_vms_one_failing_among_passing_ones_names_only_it(three, fakepve_cafile, capsys):
    code, result = run(many(three, fakepve_cafile, VMS, wait_for='address'), capsys)
    assert code == 1
    assert result['msg'].startswith('1 of 3 VMs did not pass: lab-w-1: VM 102 (w-1) on node pve1: not running with its '
                                    'guest agent reporting an IPv4 address after 1 s (last seen: VM is running; guest '
                                    'agent: QEMU guest agent is not running)')
    assert 'qemu-guest-agent' in result['msg'] and 'lab-cp-1' not in result['msg'] and 'lab-w-2' not in result['msg']
    # The VMs that passed are in the result, each with the one-VM form's keys; the one that failed apart.
    assert sorted(result['vms']) == ['lab-cp-1', 'lab-w-2']
    assert result['vms']['lab-cp-1']['address'] == '10.20.0.11' and result['vms']['lab-w-2']['address'] == '10.20.0.103'
    assert result['vms']['lab-cp-1']['config']['cipassword'] == '<hidden>' and result['vms']['lab-cp-1']['attempts'] == 1
    assert list(result['failed_vms']) == ['lab-w-1'] and result['failed_vms']['lab-w-1']['status'] == 'running'
    assert result['failed_vms']['lab-w-1']['attempts'] > 1
    gates = dict((g['host'], g) for g in result['gates'])
    assert (gates['lab-cp-1']['ok'], gates['lab-w-1']['ok'], gates['lab-w-2']['ok']) == (True, False, True)
    assert gates['lab-w-1']['name'] == 'the VM runs and its guest agent reports its address'
    assert gates['lab-w-1']['observation'].startswith('lab-w-1: VM 102 (w-1) on node pve1: not running')
    assert gates['lab-cp-1']['observation'] == 'VM is running; its guest agent reports 10.20.0.11'


def test_several_vms_that_all_pass_give_each_vms_part_and_a_gate_each(three, fakepve_cafile, capsys):
    three.vm(102).agent = {'interfaces': eth0('10.20.0.102')}
    code, result = run(many(three, fakepve_cafile, VMS, wait_for='address'), capsys)
    assert code == 0 and result['changed'] is False and result['attempts'] == 1 and result['workers'] >= 1
    assert dict((name, vm['address']) for name, vm in result['vms'].items()) == {
        'lab-cp-1': '10.20.0.11', 'lab-w-1': '10.20.0.102', 'lab-w-2': '10.20.0.103'}
    assert [(g['host'], g['ok'], g['target']) for g in result['gates']] == [
        ('lab-cp-1', True, 'VM 101 on PVE node pve1'), ('lab-w-1', True, 'VM 102 on PVE node pve1'),
        ('lab-w-2', True, 'VM 103 on PVE node pve1')]
    assert 'failed_vms' not in result


def test_several_vms_read_once_report_a_missing_vm_and_give_no_gates(three, fakepve_cafile, capsys):
    vms = VMS[1:] + [dict(name='lab-w-9', vmid=109, node='pve1')]
    code, result = run(many(three, fakepve_cafile, vms), capsys)
    assert code == 0 and 'gates' not in result
    assert result['vms']['lab-w-9']['exists'] is False and result['vms']['lab-w-9']['status'] == 'absent'
    assert result['vms']['lab-w-1']['agent_error'] == 'QEMU guest agent is not running'
    assert result['vms']['lab-w-2']['address'] == '10.20.0.103'


def test_several_vms_waiting_for_a_missing_one_fails_at_once_naming_it(three, fakepve_cafile, capsys):
    vms = VMS[2:] + [dict(name='lab-w-9', vmid=109, node='pve1')]
    code, result = run(many(three, fakepve_cafile, vms, wait_for='running', wait_timeout=30), capsys)
    assert code == 1 and result['elapsed'] < 10
    assert result['msg'] == ('1 of 2 VMs did not pass: lab-w-9 (VM 109 on PVE node pve1): vms: VM 109 does not exist '
                             'on node pve1')
    assert list(result['vms']) == ['lab-w-2']


@pytest.mark.parametrize('extra, message', [
    (dict(vmid=101), 'Unsupported parameters for (basic.py) module: vmid.'),
    (dict(node='pve1'), 'Unsupported parameters for (basic.py) module: node.'),
    (dict(expected_address='10.0.0.1'), 'Unsupported parameters for (basic.py) module: expected_address.'),
])
def test_the_removed_one_vm_options_are_refused(three, fakepve_cafile, capsys, extra, message):
    code, result = run(dict(many(three, fakepve_cafile, VMS), **extra), capsys)
    assert code == 1 and message in result['msg']


def test_a_name_listed_twice_is_refused_naming_the_field(three, fakepve_cafile, capsys):
    code, result = run(many(three, fakepve_cafile, [VMS[0], dict(VMS[1], name='lab-cp-1')]), capsys)
    assert code == 1 and result['msg'] == "vms: item 1: name 'lab-cp-1' is listed twice" and result['field'] == 'vms'


def test_without_vms_is_refused(pve, fakepve_cafile, capsys):
    values = args(pve, fakepve_cafile)
    del values['vms']
    code, result = run(values, capsys)
    assert code == 1 and 'missing required arguments: vms' in result['msg']


# ------------------------------------------------------------------------------- the agent privilege (audit finding 1)

def grant_role_without(pve, user, missing):
    """The guide's PVE 9 /vms role for user, less the privilege `missing`."""
    privileges = ['VM.Audit', 'VM.PowerMgmt', 'VM.GuestAgent.Audit']
    pve.grant(user, '/vms', *[p for p in privileges if p != missing])


def test_a_refused_agent_read_fails_at_once_naming_the_call_and_the_privilege(pve, fakepve_cafile, capsys):
    # PVE 9 answers 403 without VM.GuestAgent.Audit; it used to be an "agent not up yet" for the whole wait.
    pve.vm(101).agent = {'interfaces': ETH0}
    pve.apitokens['ops@pve!proxtalos'] = SECRET
    grant_role_without(pve, 'ops@pve', 'VM.GuestAgent.Audit')
    code, result = run(args(pve, fakepve_cafile, api_user='ops@pve', wait_for='address', wait_timeout=30), capsys)
    assert code == 1 and result['elapsed'] < 10 and 'permission denied' in result['msg']
    assert 'GET /nodes/pve1/qemu/101/agent/network-get-interfaces' in result['msg']
    # PVE's refusal names the privileges it asked for (PVE 9's pair), so only those are named
    assert 'VM.GuestAgent.Audit (or VM.GuestAgent.Unrestricted) on /vms/101 to ' in result['msg']
    assert 'VM.Monitor' not in result['msg'].split('[GET', 1)[1]
    assert 'extension' not in result['msg']


def test_several_vms_a_refused_agent_read_fails_each_at_once(three, fakepve_cafile, capsys):
    three.apitokens['ops@pve!proxtalos'] = SECRET
    grant_role_without(three, 'ops@pve', 'VM.GuestAgent.Audit')
    code, result = run(many(three, fakepve_cafile, VMS, api_user='ops@pve', wait_for='address', wait_timeout=30), capsys)
    assert code == 1 and result['elapsed'] < 10
    assert 'VM.GuestAgent.Audit' in result['msg'] and 'permission denied' in result['msg']


def test_the_role_with_the_agent_privilege_passes_the_gate(pve, fakepve_cafile, capsys):
    pve.vm(101).agent = {'interfaces': ETH0}
    pve.apitokens['ops@pve!proxtalos'] = SECRET
    grant_role_without(pve, 'ops@pve', None)
    code, result = run(args(pve, fakepve_cafile, api_user='ops@pve', wait_for='address'), capsys)
    assert code == 0 and result['vms']['cp-1']['address'] == '10.20.0.11'
