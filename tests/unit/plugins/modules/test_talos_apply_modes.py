"""talos_apply with mode try, staged and reboot: what is sent to the node, and what changed/diff/wait result.

The fake node (talos_module_helpers.FakeNode) keeps Talos' rules for these modes (facts 1.3 and Talos'
ApplyConfiguration handler): a staged config waits for the next boot, a tried one runs unpersisted until the try
timeout passes (revert_try) or a reboot, and any request in another mode cancels a pending revert.
"""
import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import api
from ansible_collections.proxtalos.cluster.plugins.modules import talos_apply

from ansible_collections.proxtalos.cluster.tests.helpers import apply_one_node
from talos_module_helpers import FakeCluster, FakeNode, make_talosconfig
from test_talos_apply import CHANGED, CONFIG, SECRET, TOKEN

MODE = api.machine.ApplyConfigurationRequest.Mode


@pytest.fixture(scope='module')
def talosconfig():
    return make_talosconfig()


def args(talosconfig, config=CHANGED, **extra):
    values = dict(address='10.5.0.21', config=config, talosconfig_content=talosconfig[0], wait_timeout=5, wait_sleep=0.01)
    values.update(extra)
    return values


def configured_node(**options):
    return FakeNode('10.5.0.21', config=CONFIG.encode(), control_plane=False, **options)


def real_applies(node):
    return [entry for entry in node.applies if not entry['dry_run']]


# ---------------------------------------------------------------------------------------------- on the wire

@pytest.mark.parametrize('mode, enum_name, enum_number', [
    ('try', 'TRY', 4), ('staged', 'STAGED', 3), ('reboot', 'REBOOT', 0), ('auto', 'AUTO', 1), ('no_reboot', 'NO_REBOOT', 2)])
def test_the_request_carries_the_mode_number_and_the_try_timeout_only_with_try(capsys, monkeypatch, talosconfig, mode,
                                                                               enum_name, enum_number):
    node = configured_node()
    FakeCluster(node).install(monkeypatch, wire=True)
    extra = {'try_timeout': 30} if mode == 'try' else {}
    result, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, mode=mode, **extra))
    assert result['changed'] is True, result
    assert MODE.Name(enum_number) == enum_name
    dry_run, applied = node.wire[0], node.wire[1]
    # The dry run that decides `changed` and the apply are both sent in the chosen mode.
    assert dry_run.dry_run is True and dry_run.mode == enum_number and dry_run.data == CHANGED.encode()
    assert applied.dry_run is False and applied.mode == enum_number and applied.data == CHANGED.encode()
    for request in node.wire[:2]:
        if mode == 'try':
            assert request.HasField('try_mode_timeout') and request.try_mode_timeout.ToTimedelta().total_seconds() == 30
        else:
            assert not request.HasField('try_mode_timeout')
    verifying = node.wire[2:]
    if mode == 'staged':
        assert verifying == []  # a staged config is not waited for
    else:
        # After the apply, dry runs check the node runs the config: in try mode for a try (another mode would
        # cancel Talos' revert), else auto.
        assert verifying and all(request.dry_run for request in verifying)
        assert set(request.mode for request in verifying) == {MODE.Value('TRY') if mode == 'try' else MODE.Value('AUTO')}


# ---------------------------------------------------------------------------------------------- try

def test_try_applies_live_verifies_without_cancelling_the_revert(capsys, monkeypatch, talosconfig):
    node = configured_node()
    FakeCluster(node).install(monkeypatch)
    checked, _out = apply_one_node(talos_apply, capsys, _ansible_check_mode=True, _ansible_diff=True,
                                   **args(talosconfig, mode='try', try_timeout=30))
    assert checked['changed'] is True and checked['applied_mode'] == 'try' and real_applies(node) == []
    assert '+  network:' in checked['diff'][0]['prepared']

    result, out = apply_one_node(talos_apply, capsys, _ansible_diff=True, **args(talosconfig, mode='try', try_timeout=30))
    assert result['changed'] is True and result['applied_mode'] == 'try'
    assert result['verified'] is True and result['rebooted'] is False and node.boot == 1
    assert "applied in 'try' mode and will be automatically reverted back in 30s" in result['summary']
    assert real_applies(node) == [{'mode': 'try', 'dry_run': False, 'try_timeout': 30.0}]
    # The verification did not cancel the revert: the node still runs the tried config, unpersisted.
    assert node.try_pending and node.config == CHANGED.encode() and node.persisted == CONFIG.encode()
    assert ('try-revert-cancelled', 'auto') not in node.calls
    assert TOKEN not in out and SECRET not in out

    # Within the try window a re-run finds the node running the config: nothing to do, revert still pending.
    again, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, mode='try', try_timeout=30))
    assert again['changed'] is False and again['verified'] is True and node.try_pending

    # Talos reverts after the timeout: the next run applies it again.
    node.revert_try()
    assert node.config == CONFIG.encode()
    after, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, mode='try', try_timeout=30))
    assert after['changed'] is True and len(real_applies(node)) == 2 and node.try_pending


def test_a_reboot_during_the_try_window_boots_the_persisted_config(capsys, monkeypatch, talosconfig):
    node = configured_node()
    FakeCluster(node).install(monkeypatch)
    apply_one_node(talos_apply, capsys, **args(talosconfig, mode='try'))
    assert node.try_pending and real_applies(node)[0]['try_timeout'] is None  # Talos' default (60 s) applies
    node.reboot()
    for _call in range(node.down_calls):
        with pytest.raises(Exception):
            node._reach('Version', True)  # pylint: disable=protected-access
    assert node.boot == 2 and node.config == CONFIG.encode() and not node.try_pending
    result, _out = apply_one_node(talos_apply, capsys, _ansible_check_mode=True, **args(talosconfig, mode='try'))
    assert result['changed'] is True


def test_another_mode_within_the_try_window_cancels_the_revert_and_sees_no_change(capsys, monkeypatch, talosconfig):
    # Documented caveat: Talos' dry run compares with the running (tried) config and cancels the revert, so
    # talos_apply with mode=auto in the try window reports no change and the config stays unpersisted.
    node = configured_node()
    FakeCluster(node).install(monkeypatch)
    apply_one_node(talos_apply, capsys, **args(talosconfig, mode='try', try_timeout=30))
    result, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, mode='auto'))
    assert result['changed'] is False and ('try-revert-cancelled', 'auto') in node.calls
    assert node.config == CHANGED.encode() and node.persisted == CONFIG.encode() and len(real_applies(node)) == 1


def test_try_refuses_a_change_that_needs_a_reboot_before_applying(capsys, monkeypatch, talosconfig):
    node = configured_node(reboot_on_change=True)
    FakeCluster(node).install(monkeypatch)
    result, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, mode='try', try_timeout=30))
    assert result['failed'] is True and 'INVALID_ARGUMENT' in result['msg']
    assert "can't be applied in immediate mode" in result['msg'] and '10.5.0.21' in result['msg']
    assert real_applies(node) == [] and node.config == CONFIG.encode()


# ---------------------------------------------------------------------------------------------- staged

def test_staged_is_stored_not_waited_for_and_reported_again_until_the_reboot(capsys, monkeypatch, talosconfig):
    node = configured_node()
    FakeCluster(node).install(monkeypatch)
    checked, _out = apply_one_node(talos_apply, capsys, _ansible_check_mode=True, _ansible_diff=True,
                                   **args(talosconfig, mode='staged'))
    assert checked['changed'] is True and checked['applied_mode'] == 'staged' and node.staged is None
    assert 'Staged configuration to be applied after the next reboot' in checked['summary']
    assert '+  network:' in checked['diff'][0]['prepared']

    before = len(node.calls)
    result, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, mode='staged'))
    assert result['changed'] is True and result['applied_mode'] == 'staged'
    assert result['verified'] is False and result['rebooted'] is False
    assert node.staged == CHANGED.encode() and node.config == CONFIG.encode() and node.boot == 1
    # No wait: after the apply the module made no further call (no service list, no verifying dry run).
    assert [name for name, _secure in node.calls[before:]][-1] == 'apply-for-real'

    # Until the node reboots it runs the old config: a re-run reports the change again and stages it again.
    again, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, mode='staged'))
    assert again['changed'] is True and len(real_applies(node)) == 2

    node.reboot()
    for _call in range(node.down_calls):
        with pytest.raises(Exception):
            node._reach('Version', True)  # pylint: disable=protected-access
    assert node.boot == 2 and node.config == CHANGED.encode() and node.staged is None
    after, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, mode='staged'))
    assert after['changed'] is False and after['verified'] is True and len(real_applies(node)) == 2


# ---------------------------------------------------------------------------------------------- reboot

def test_reboot_mode_reboots_even_for_a_live_change_and_waits_for_the_new_boot(capsys, monkeypatch, talosconfig):
    # The change could be applied live (auto would not reboot); mode=reboot reboots anyway. The node keeps
    # answering from its old boot for a few calls after the apply: only a new boot counts.
    node = configured_node(down_calls=3, linger_calls=4)
    FakeCluster(node).install(monkeypatch)
    checked, _out = apply_one_node(talos_apply, capsys, _ansible_check_mode=True, **args(talosconfig, mode='reboot'))
    assert checked['changed'] is True and checked['applied_mode'] == 'reboot' and node.boot == 1

    result, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, mode='reboot'))
    assert result['changed'] is True and result['applied_mode'] == 'reboot'
    assert result['rebooted'] is True and result['verified'] is True and node.boot == 2
    assert real_applies(node) == [{'mode': 'reboot', 'dry_run': False, 'try_timeout': None}]
    assert result['summary'] == 'Applied configuration with a reboot'

    again, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, mode='reboot'))
    assert again['changed'] is False and again['rebooted'] is False and node.boot == 2


def test_reboot_mode_that_does_not_come_back_fails_naming_the_node(capsys, monkeypatch, talosconfig):
    node = configured_node()
    node.hang_on_reboot = True
    FakeCluster(node).install(monkeypatch)
    result, _out = apply_one_node(talos_apply, capsys, **args(talosconfig, mode='reboot', wait_timeout=0.3))
    assert result['failed'] is True and result['node'] == '10.5.0.21:50000'
    assert 'waiting for the node back over mTLS with the applied config' in result['msg']
    assert real_applies(node) == [{'mode': 'reboot', 'dry_run': False, 'try_timeout': None}]
