"""proxmox_vm_info: reading a VM and the address gate, against an in-process fakepve."""
import json

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.proxtalos.cluster.plugins.modules import proxmox_vm_info

SECRET = 'feedface-5ec2-e7a1-b0b0-info'
ETH0 = [{'name': 'lo', 'ip-addresses': [{'ip-address': '127.0.0.1', 'ip-address-type': 'ipv4', 'prefix': 8}]},
        {'name': 'eth0', 'ip-addresses': [{'ip-address': '10.20.0.11', 'ip-address-type': 'ipv4', 'prefix': 24}]}]


@pytest.fixture
def pve(fakepve):
    fakepve.apitokens['root@pam!proxtalos'] = SECRET
    vm = fakepve.add_vm(101, 'cp-1', config={'agent': 'enabled=1', 'cipassword': 'hunter2', 'cores': 2})
    vm.status = vm.qmpstatus = 'running'
    return fakepve


def args(pve, cafile, **overrides):
    values = dict(api_host=pve.host, api_port=pve.port, api_user='root@pam', api_token_id='proxtalos',
                  api_token_secret=SECRET, ca_path=cafile, vmid=101, node='pve1', wait_timeout=1, wait_sleep=0.1)
    values.update(overrides)
    return values


def run(values, capsys):
    with patch_module_args(dict(values, _ansible_check_mode=True)):
        with pytest.raises(SystemExit) as caught:
            proxmox_vm_info.main()
    out = capsys.readouterr().out
    assert SECRET not in out and 'hunter2' not in out
    return caught.value.code, json.loads(out)


def test_read_once_reports_state_config_and_agent(pve, fakepve_cafile, capsys):
    pve.vm(101).agent = {'interfaces': ETH0}
    code, result = run(args(pve, fakepve_cafile), capsys)
    assert code == 0 and result['changed'] is False and result['exists'] is True
    assert result['status'] == 'running' and result['config']['cipassword'] == '<hidden>'
    assert result['address'] == '10.20.0.11' and result['attempts'] == 1


def test_a_missing_vm_is_reported_not_failed_when_only_reading(pve, fakepve_cafile, capsys):
    code, result = run(args(pve, fakepve_cafile, vmid=999), capsys)
    assert code == 0 and result['exists'] is False and result['status'] == 'absent'


def test_the_address_gate_passes_when_the_agent_reports_the_expected_address(pve, fakepve_cafile, capsys):
    pve.vm(101).agent = {'interfaces': ETH0}
    code, result = run(args(pve, fakepve_cafile, wait_for='address', expected_address='10.20.0.11'), capsys)
    assert code == 0 and result['address'] == '10.20.0.11'


def test_the_gate_fails_with_what_it_saw_and_the_agent_hint(pve, fakepve_cafile, capsys):
    code, result = run(args(pve, fakepve_cafile, wait_for='address'), capsys)
    assert code == 1
    assert result['msg'].startswith('VM 101 (cp-1) on node pve1: not running with its guest agent reporting an IPv4')
    assert 'QEMU guest agent is not running' in result['msg'] and 'qemu-guest-agent' in result['msg']
    assert result['attempts'] > 1 and result['vm']['status'] == 'running'


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
    assert code == 1 and result['field'] == 'vmid' and result['elapsed'] < 10
