"""talos_apply against a fake node: maintenance -> configured, dry run decides changed, check mode, waits, secrets."""
import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.modules import talos_apply

from ansible_collections.proxtalos.cluster.tests.helpers import apply_one_node, assert_no_secret, run_module
from talos_module_helpers import FakeCluster, FakeNode, make_talosconfig

TOKEN = 'abcdef.0123456789abcdef'
SECRET = 'c2VjcmV0LXZhbHVlLW9mLXRoZS1jbHVzdGVyLTAxMjM='
CONFIG = """version: v1alpha1
machine:
  type: worker
  token: %s
  ca:
    crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t
    key: ""
cluster:
  secret: %s
  controlPlane:
    endpoint: https://10.5.0.10:6443
""" % (TOKEN, SECRET)
CHANGED = CONFIG + "  network:\n    dnsDomain: cluster.local\n"


@pytest.fixture(scope='module')
def talosconfig():
    return make_talosconfig()


def args(talosconfig, config=CONFIG, **extra):
    values = dict(address='10.5.0.21', config=config, talosconfig_content=talosconfig[0], wait_timeout=5, wait_sleep=0.01)
    values.update(extra)
    return values


def real_applies(node):
    return [call for call in node.calls if call[0] == 'apply-for-real']


def test_maintenance_node_is_configured_insecurely_then_verified_over_mtls(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.21', mode='maintenance', control_plane=False)
    FakeCluster(node).install(monkeypatch)
    result, out = apply_one_node(talos_apply, capsys, _ansible_diff=True, **args(talosconfig))
    assert result['changed'] is True and result['node_mode'] == 'maintenance'
    assert result['rebooted'] is True and result['verified'] is True
    assert real_applies(node) == [('apply-for-real', 'auto')]
    # The config went over the insecure channel; the verification over mTLS after the node's new boot.
    assert ('apply_configuration', False) in node.calls
    assert ('apply_configuration', True) in node.calls and node.mode == 'configured' and node.boot == 2
    assert result['diff'][0]['after'].count('<hidden>') == 2
    assert_no_secret(out, [TOKEN, SECRET, talosconfig[1]])

    again, out = apply_one_node(talos_apply, capsys, **args(talosconfig))
    assert again['changed'] is False and again['node_mode'] == 'configured' and again['verified'] is True
    assert len(real_applies(node)) == 1


def test_maintenance_boot_is_read_before_the_apply_and_v1_12_answers_unimplemented(capsys, monkeypatch, talosconfig):
    # v1.13: the boot the node has in maintenance mode is read (ServiceList as os:reader) before the apply
    node = FakeNode('10.5.0.21', mode='maintenance', control_plane=False)
    FakeCluster(node).install(monkeypatch)
    result, _out = apply_one_node(talos_apply, capsys, **args(talosconfig))
    assert result['rebooted'] is True and result['verified'] is True
    assert node.calls.index(('service_list', False)) < node.calls.index(('apply-for-real', 'auto'))
    # v1.12's maintenance server answers Unimplemented (internal/app/maintenance/server.go@v1.12.11): no boot to
    # compare, and its apid answers over mTLS only after the install reboot
    node = FakeNode('10.5.0.21', mode='maintenance', control_plane=False)
    original = node.service_list

    def service_list():
        if node.mode == 'maintenance':
            raise talos_errors.from_status(node.name, '/machine.MachineService/ServiceList', 12, 'unknown method')
        return original()
    node.service_list = service_list
    FakeCluster(node).install(monkeypatch)
    result, _out = apply_one_node(talos_apply, capsys, **args(talosconfig))
    assert result.get('failed') is not True, result.get('msg')
    assert result['rebooted'] is True and result['verified'] is True and node.boot == 2


def test_a_change_is_found_by_the_dry_run_and_applied(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.21', config=CONFIG.encode(), control_plane=False)
    FakeCluster(node).install(monkeypatch)
    checked, out = apply_one_node(talos_apply, capsys, _ansible_check_mode=True, _ansible_diff=True, **args(talosconfig, CHANGED))
    assert checked['changed'] is True and checked['applied_mode'] == 'no_reboot'
    assert real_applies(node) == []
    assert '+  network:' in checked['diff'][0]['prepared']
    assert '--- n-1 (10.5.0.21:50000) (running config)' in checked['diff'][0]['prepared']
    result, out = apply_one_node(talos_apply, capsys, _ansible_diff=True, **args(talosconfig, CHANGED))
    assert result['changed'] is True and result['rebooted'] is False and result['verified'] is True
    assert real_applies(node) == [('apply-for-real', 'auto')]
    assert_no_secret(out, [TOKEN, SECRET])
    again, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, CHANGED))
    assert again['changed'] is False


def test_a_reboot_counts_only_with_a_new_boot(capsys, monkeypatch, talosconfig):
    # After the apply the node still answers from its old boot (and its dry run already says "No changes.")
    # for a few calls before it goes down: that must not count as back.
    node = FakeNode('10.5.0.21', config=CONFIG.encode(), control_plane=False, reboot_on_change=True, down_calls=3,
                    linger_calls=4)
    FakeCluster(node).install(monkeypatch)
    result, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, CHANGED))
    assert result['changed'] is True and result['applied_mode'] == 'reboot' and result['rebooted'] is True
    assert node.boot == 2


def test_mode_no_reboot_is_sent(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.21', config=CONFIG.encode(), control_plane=False)
    FakeCluster(node).install(monkeypatch)
    result, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, CHANGED, mode='no_reboot'))
    assert result['changed'] is True and real_applies(node) == [('apply-for-real', 'no-reboot')]


def test_configured_node_needs_a_talosconfig(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.21', config=CONFIG.encode(), control_plane=False)
    FakeCluster(node).install(monkeypatch)
    values = args(talosconfig)
    del values['talosconfig_content']
    result, _out = apply_one_node(talos_apply, capsys, **values)
    assert result['failed'] is True and 'talosconfig: is required' in result['msg']
    assert result['failed_nodes']['n-1'].startswith('n-1 (10.5.0.21:50000): talosconfig: is required')


def test_rejected_config_fails_with_talos_message_before_applying(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.21', mode='maintenance', control_plane=False)
    node.reject = 'error decoding document /v1alpha1/ (line 1): unknown keys found during decoding:\nmachine:\n    bogusKey: 1\n'
    FakeCluster(node).install(monkeypatch)
    result, out = apply_one_node(talos_apply, capsys, **args(talosconfig))
    assert result['failed'] is True and 'bogusKey' in result['msg'] and 'INVALID_ARGUMENT' in result['msg']
    assert real_applies(node) == []
    assert_no_secret(out, [TOKEN, SECRET])


def test_unreachable_node_fails_naming_it_after_the_deadline(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.21', mode='maintenance', control_plane=False)
    node.unreachable = True
    FakeCluster(node).install(monkeypatch)
    result, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, wait_timeout=0.2))
    assert result['failed'] is True and result['node'] == '10.5.0.21:50000'
    assert 'gave up after 0.2s waiting for the Talos API' in result['msg'] and 'connection refused' in result['msg']
    assert result['gates'][0]['ok'] is False and result['gates'][0]['attempts'] > 1


def test_a_node_that_does_not_come_back_is_reported(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.21', mode='maintenance', control_plane=False)
    node.hang_on_reboot = True
    FakeCluster(node).install(monkeypatch)
    result, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, wait_timeout=0.3))
    assert result['failed'] is True and real_applies(node)
    assert 'waiting for the node back over mTLS with the applied config' in result['msg']
    assert 'connection refused' in result['msg']


def test_bad_options_name_the_field(capsys, monkeypatch, talosconfig):
    FakeCluster(FakeNode('10.5.0.21')).install(monkeypatch)
    result, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, try_timeout=5))
    assert result['failed'] is True and result['field'] == 'try_timeout'
    result, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, config='machine: [unclosed'))
    assert result['failed'] is True and result['field'] == 'nodes[n-1].config_path'
    result, _out = run_module(talos_apply, capsys, nodes=[{'name': 'n-1', 'address': '10.5.0.21', 'config_path': '/nonexistent/x.yaml'}],
                              talosconfig_content=talosconfig[0])
    assert result['failed'] is True and result['field'] == 'nodes[n-1].config_path' and '/nonexistent/x.yaml' in result['msg']
    # The options of the single-node form are gone: one node is a one-element nodes list.
    one_node = [{'name': 'n-1', 'address': '10.5.0.21', 'config_path': '/x.yaml'}]
    for removed in ({'node': '10.5.0.21'}, {'config': CONFIG}, {'config_path': '/x.yaml'}):
        result, _out = run_module(talos_apply, capsys, nodes=one_node, talosconfig_content=talosconfig[0], **removed)
        assert result['failed'] is True and 'Unsupported parameters' in result['msg'] and list(removed)[0] in result['msg']
    result, _out = run_module(talos_apply, capsys, talosconfig_content=talosconfig[0])
    assert result['failed'] is True and 'missing required arguments: nodes' in result['msg']


def test_maintenance_check_mode_needs_no_talosconfig_file_yet(capsys, monkeypatch, talosconfig, tmp_path):
    node = FakeNode('10.5.0.21', mode='maintenance', control_plane=False)
    FakeCluster(node).install(monkeypatch)
    values = args(talosconfig)
    del values['talosconfig_content']
    values['talosconfig'] = str(tmp_path / 'talosconfig')
    result, _out = apply_one_node(talos_apply, capsys, _ansible_check_mode=True, **values)
    assert result['changed'] is True and result['node_mode'] == 'maintenance' and real_applies(node) == []
    # For real, the wait after the apply needs mTLS: the missing file is named.
    result, _out = apply_one_node(talos_apply, capsys, **values)
    assert result['failed'] is True and 'talosconfig: is required' in result['msg'] and str(tmp_path / 'talosconfig') in result['msg']
    assert real_applies(node) == []
