"""Apply modes try and staged in the lab, as Talos handles them, driven by talos_apply and the Talos client.

The lab's nodes run in this process (lab.talos.testing.FleetHarness, instant timing); talos_apply reaches them
over the real protocol (grpclib, mTLS with a talosconfig of the cluster's secrets). Talos' rules checked here
(its ApplyConfiguration handler and runtime): a try config runs without being persisted and is set back after the
try timeout; any ApplyConfiguration in another mode, dry runs included, cancels that revert; a reboot boots the
persisted config; a staged config runs only after a reboot; a change that needs a reboot is refused in try mode.
"""

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client, errors
from ansible_collections.proxtalos.cluster.plugins.modules import talos_apply
from ansible_collections.proxtalos.cluster.tests.helpers import apply_one_node, run_module
from lab.talos import testing
from talos_lab_nodes import ENDPOINT, configure

# A change CanApplyImmediate does not let apply live (v1alpha1_runtime.go:149-204): it needs a reboot.
UDEV_RULE = 'SUBSYSTEM=="drm", KERNEL=="renderD*", GROUP="44", MODE="0660"'


@pytest.fixture(scope='module')
def lab():
    harness = testing.FleetHarness()
    yield harness
    harness.close()


@pytest.fixture
def secrets():
    return testing.ClusterSecrets(os_key_type='ecdsa')


def with_sans(secrets, *sans):
    return testing.render_config(secrets, 'controlplane', ENDPOINT, extra_machine={'certSANs': list(sans)}).decode()


def apply(capsys, node, secrets, config, **options):
    values = dict(talosconfig_content=secrets.talosconfig('lab'), wait_timeout=20, wait_sleep=0.05)
    values.update(options)
    return apply_one_node(talos_apply, capsys, node.address, config, **values)[0]


def status(lab, node):
    return lab.call(node.status)


def test_try_applies_live_then_talos_reverts_it_after_the_timeout(lab, secrets, capsys):
    node = configure(lab, 'cp-try', secrets)
    tried = with_sans(secrets, 'try.example')
    result = apply(capsys, node, secrets, tried, mode='try', try_timeout=1.5)
    assert result['changed'] is True and result['applied_mode'] == 'try' and result['verified'] is True, result
    assert "will be automatically reverted back in 1.5s" in result['summary']
    # The verification's dry runs were in try mode: the revert is still pending, the tried config runs unpersisted.
    seen = status(lab, node)
    assert seen['try_revert_pending'] is True and seen['running_config_persisted'] is False
    assert node.disk.config.cert_sans == ['try.example'] and node.boot_count == 2

    lab.wait(lambda: node.disk.config.cert_sans == [], timeout=15, what='the try config reverted')
    seen = status(lab, node)
    assert seen['try_revert_pending'] is False and seen['running_config_persisted'] is True and node.boot_count == 2
    # Reverted, the node no longer runs it: a re-run applies it again.
    again = apply(capsys, node, secrets, tried, mode='try', try_timeout=1.5, _ansible_check_mode=True)
    assert again['changed'] is True


def test_another_mode_cancels_the_revert_and_a_reboot_boots_the_persisted_config(lab, secrets, capsys):
    node = configure(lab, 'cp-try-cancel', secrets)
    tried = with_sans(secrets, 'kept-until-reboot.example')
    with client.TalosClient(node.address, credentials=client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab')),
                            timeout=5) as talos:
        reply = talos.apply_configuration(tried, mode='try', try_timeout=600)
        assert reply['mode'] == 'try' and reply['mode_details'].endswith('automatically reverted back in 10m0s')
        assert status(lab, node)['try_revert_pending'] is True
        # A dry run in auto mode (what `talosctl apply --dry-run` sends) cancels the revert, as in Talos.
        assert talos.apply_configuration(tried, mode='auto', dry_run=True)['mode_details'].endswith('No changes.')
        assert status(lab, node)['try_revert_pending'] is False
        assert node.disk.config.cert_sans == ['kept-until-reboot.example']
        talos.reboot()
    lab.wait(lambda: node.boot_count == 3 and node.mode == 'configured', what='reboot')
    # The tried config was never persisted: the node boots the config from before.
    assert node.disk.config.cert_sans == [] and status(lab, node)['running_config_persisted'] is True


def test_try_refuses_a_change_that_needs_a_reboot(lab, secrets, capsys):
    node = configure(lab, 'cp-try-refused', secrets)
    # machine.udev is not among what CanApplyImmediate lets apply live (v1alpha1_runtime.go:149-204)
    udev = testing.render_config(secrets, 'controlplane', ENDPOINT, extra_machine={'udev': {'rules': [UDEV_RULE]}})
    result = apply(capsys, node, secrets, udev.decode(), mode='try', try_timeout=5)
    assert result['failed'] is True and 'INVALID_ARGUMENT' in result['msg']
    assert "this config change can't be applied in immediate mode" in result['msg']
    assert 'udev' not in node.disk.config.machine and status(lab, node)['try_revert_pending'] is False


def test_staged_takes_effect_only_after_a_reboot(lab, secrets, capsys):
    node = configure(lab, 'cp-staged', secrets)
    staged = with_sans(secrets, 'staged.example')
    result = apply(capsys, node, secrets, staged, mode='staged')
    assert result['changed'] is True and result['applied_mode'] == 'staged'
    assert result['verified'] is False and result['rebooted'] is False
    assert status(lab, node)['staged_config'] is True and node.disk.config.cert_sans == []
    # Still running the old config: a re-run stages it again.
    again = apply(capsys, node, secrets, staged, mode='staged')
    assert again['changed'] is True and node.disk.config.cert_sans == [] and node.boot_count == 2

    credentials = client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab'))
    with client.TalosClient(node.address, credentials=credentials, timeout=5) as talos:
        talos.reboot()
    lab.wait(lambda: node.boot_count == 3 and node.mode == 'configured', what='reboot')
    assert node.disk.config.cert_sans == ['staged.example'] and status(lab, node)['staged_config'] is False
    done = apply(capsys, node, secrets, staged, mode='staged')
    assert done['changed'] is False and done['verified'] is True


def test_a_request_without_try_mode_still_refused_in_no_reboot_mode(lab, secrets):
    node = configure(lab, 'cp-no-reboot', secrets)
    udev = testing.render_config(secrets, 'controlplane', ENDPOINT, extra_machine={'udev': {'rules': [UDEV_RULE]}})
    credentials = client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab'))
    with client.TalosClient(node.address, credentials=credentials, timeout=5) as talos:
        with pytest.raises(errors.TalosApiError) as info:
            talos.apply_configuration(udev, mode='no-reboot')
    assert info.value.invalid_argument and "can't be applied in immediate mode" in info.value.talos_message


# ---------------------------------------------------------------------------------------------------------
# The multi-node form (option nodes) over the real protocol: every node in one run, at the same time.

def apply_nodes(capsys, targets, secrets, tmp_path, **options):
    """talos_apply with nodes=[...]; targets: (inventory name, lab node, config text)."""
    items = []
    for name, node, config in targets:
        path = tmp_path / ('%s.yaml' % name)
        path.write_text(config)
        items.append({'name': name, 'address': node.address, 'config_path': str(path)})
    values = dict(nodes=items, talosconfig_content=secrets.talosconfig('lab'), wait_timeout=20, wait_sleep=0.05)
    values.update(options)
    return run_module(talos_apply, capsys, **values)[0]


def test_every_node_in_one_run_maintenance_and_configured_then_a_rerun_changes_nothing(lab, secrets, capsys, tmp_path):
    fresh = [lab.start('w-many-%d' % index) for index in range(2)]
    lab.wait(lambda: all(node.mode == 'maintenance' for node in fresh), what='the new nodes in maintenance mode')
    configured = configure(lab, 'cp-many', secrets)
    worker = testing.render_config(secrets, 'worker', ENDPOINT).decode()
    targets = [('w-1', fresh[0], worker), ('w-2', fresh[1], worker), ('cp-1', configured, with_sans(secrets, 'many.example'))]
    result = apply_nodes(capsys, targets, secrets, tmp_path)
    assert 'failed' not in result, result.get('msg')
    assert result['changed'] is True and result['failed_nodes'] == {}
    for name in ('w-1', 'w-2'):
        assert result['nodes'][name]['node_mode'] == 'maintenance' and result['nodes'][name]['rebooted'] is True
        assert result['nodes'][name]['verified'] is True and result['nodes'][name]['changed'] is True
    assert result['nodes']['cp-1']['applied_mode'] == 'no_reboot' and result['nodes']['cp-1']['verified'] is True
    assert [node.mode for node in fresh] == ['configured', 'configured'] and configured.disk.config.cert_sans == ['many.example']
    assert [(gate['host'], gate['ok']) for gate in result['gates']] == [('w-1', True), ('w-2', True), ('cp-1', True)]

    again = apply_nodes(capsys, targets, secrets, tmp_path)
    assert again['changed'] is False and all(node['changed'] is False for node in again['nodes'].values())
    assert [node.boot_count for node in fresh] == [2, 2]


def test_a_node_that_rejects_its_config_is_named_alone_and_the_others_are_applied(lab, secrets, capsys, tmp_path):
    fresh = [lab.start('w-reject-%d' % index) for index in range(3)]
    lab.wait(lambda: all(node.mode == 'maintenance' for node in fresh), what='the new nodes in maintenance mode')
    lab.fault('talos-apply-reject', fresh[1].name)
    try:
        # control-plane configs: a worker's apid gets its certificate from a control plane's trustd, and there is none
        config = testing.render_config(secrets, 'controlplane', ENDPOINT).decode()
        result = apply_nodes(capsys, [('w-%d' % index, node, config) for index, node in enumerate(fresh)], secrets, tmp_path)
    finally:
        lab.clear('talos-apply-reject', fresh[1].name)
    assert result['failed'] is True and list(result['failed_nodes']) == ['w-1'], result['msg']
    assert result['msg'].startswith('talos_apply: 1 of 3 nodes failed: w-1 (%s:50000): ' % fresh[1].address)
    assert 'INVALID_ARGUMENT' in result['msg'] and 'configuration validation failed' in result['msg']
    assert [node.mode for node in fresh] == ['configured', 'maintenance', 'configured']
    assert result['nodes']['w-0']['verified'] is True and result['nodes']['w-2']['verified'] is True
