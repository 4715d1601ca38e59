"""talos_reboot: back means a new boot over mTLS; a hang is reported after the deadline; check mode never reboots."""
import pytest

from ansible_collections.proxtalos.cluster.plugins.modules import talos_reboot

from ansible_collections.proxtalos.cluster.tests.helpers import run_module
from talos_module_helpers import FakeCluster, FakeNode, make_talosconfig


@pytest.fixture(scope='module')
def talosconfig():
    return make_talosconfig()


def reboots(node):
    return [call for call in node.calls if call[0] == 'reboot-call']


def args(talosconfig, **extra):
    values = dict(node='10.5.0.21', talosconfig_content=talosconfig[0], wait_timeout=2, wait_sleep=0.01)
    values.update(extra)
    return values


def test_reboot_waits_for_a_new_boot(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.21', control_plane=False, linger_calls=3, down_calls=3)
    FakeCluster(node).install(monkeypatch)
    result, _out = run_module(talos_reboot, capsys, mode='powercycle', healthy_services=['kubelet'], **args(talosconfig))
    assert result['changed'] is True and reboots(node) == [('reboot-call', 'powercycle')]
    assert node.boot == 2 and result['boot_before'] != result['boot_after'] and result['actor_id'] == 'a-1'


def test_check_mode_does_not_reboot(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.21', control_plane=False)
    FakeCluster(node).install(monkeypatch)
    result, _out = run_module(talos_reboot, capsys, _ansible_check_mode=True, **args(talosconfig))
    assert result['changed'] is True and reboots(node) == []


def test_a_hanging_reboot_is_reported_not_waited_on(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.21', control_plane=False)
    node.hang_on_reboot = True
    FakeCluster(node).install(monkeypatch)
    result, _out = run_module(talos_reboot, capsys, **args(talosconfig, wait_timeout=0.3))
    assert result['failed'] is True and result['changed'] is True
    assert 'gave up after 0.3s waiting for the node back after the reboot' in result['msg']
    assert 'connection refused' in result['last_observation'] and result['node'] == '10.5.0.21:50000'


def test_back_needs_the_services(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.21', control_plane=False)
    node.kubelet_waiting = True
    FakeCluster(node).install(monkeypatch)
    result, _out = run_module(talos_reboot, capsys, healthy_services=['kubelet'], **args(talosconfig, wait_timeout=0.3))
    assert result['failed'] is True and 'back, but kubelet is Waiting' in result['msg']
