"""talos_apply from maintenance mode against a lab node that behaves as Talos v1.13 does (audit finding 3).

On v1.13 apid keeps running through a maintenance apply and answers over mTLS with the new config, on the same boot,
before the node installs and reboots (lab/talos/node.py _install_and_reboot cites the upstream lines). The lab runs
with the realistic profile at a small time scale so that window lasts long enough to be seen. Checked: talos_apply
reports `rebooted` and `verified` only once the node was seen on the boot after the install (it returned inside the
window before, with the node not yet installed).
"""

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client
from ansible_collections.proxtalos.cluster.plugins.modules import talos_apply
from ansible_collections.proxtalos.cluster.tests.helpers import apply_one_node
from lab.talos import testing
from talos_lab_nodes import ENDPOINT

SCALE = 0.05    # talos_install: 20 s -> 1 s with apid on mTLS; talos_install_reboot: 60 s -> 3 s with the port closed


@pytest.fixture()
def lab():
    harness = testing.FleetHarness(profile='realistic', scale=SCALE)
    yield harness
    harness.close()


def test_the_install_window_on_mtls_is_not_taken_for_the_installed_node(lab, capsys):
    secrets = testing.ClusterSecrets(os_key_type='ecdsa')
    node = lab.start('cp-1')
    lab.wait(lambda: node.mode == 'maintenance', what='cp-1 in maintenance mode')
    result = apply_one_node(talos_apply, capsys, node.address, testing.render_config(secrets, 'controlplane', ENDPOINT),
                            talosconfig_content=secrets.talosconfig('lab'), wait_timeout=60, wait_sleep=0.05, api_timeout=5)[0]
    seen = (node.phase, node.boot_count, node.disk.installed)
    assert 'failed' not in result, result.get('msg')
    assert result['changed'] is True and result['rebooted'] is True and result['verified'] is True
    assert seen == ('running', 2, True)

    # the window itself, as a client sees it: mTLS with the applied config, the maintenance boot's services
    second = lab.start('cp-2')
    lab.wait(lambda: second.mode == 'maintenance', what='cp-2 in maintenance mode')
    with client.TalosClient(second.address, insecure=True, timeout=5) as talos:
        before = [service['id'] for service in talos.service_list()]
        talos.apply_configuration(testing.render_config(secrets, 'controlplane', ENDPOINT))
    lab.wait(lambda: second.phase == 'installing' and second.api_up, what='cp-2 installing with apid up')
    credentials = client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab'))
    with client.TalosClient(second.address, credentials=credentials, timeout=5) as talos:
        assert [service['id'] for service in talos.service_list()] == before
        assert talos.apply_configuration(testing.render_config(secrets, 'controlplane', ENDPOINT),
                                         dry_run=True)['mode_details'].endswith('No changes.')
    assert second.boot_count == 1 and not second.disk.installed
    lab.wait(lambda: second.mode == 'configured', timeout=30, what='cp-2 configured after the install reboot')
    assert second.boot_count == 2


def test_maintenance_takes_every_mode_as_v1_13_does(capsys):
    # audit finding 14: v1alpha1_server.go:236-267 - REBOOT becomes NO_REBOOT, STAGED only persists (the node stays in
    # maintenance mode: acquire.go:735-741), TRY sets the active config and the node installs
    lab = testing.FleetHarness()
    try:
        secrets = testing.ClusterSecrets(os_key_type='ecdsa')
        config = testing.render_config(secrets, 'controlplane', ENDPOINT)
        replies = {}
        for name, mode in (('m-reboot', 'reboot'), ('m-staged', 'staged'), ('m-try', 'try')):
            node = lab.start(name)
            lab.wait(lambda node=node: node.mode == 'maintenance', what='%s in maintenance mode' % name)
            with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
                replies[name] = talos.apply_configuration(config, mode=mode)
        assert replies['m-reboot']['mode'] == 'no-reboot'
        assert replies['m-staged']['mode'] == 'staged'
        assert replies['m-staged']['mode_details'] == 'Staged configuration to be applied after the next reboot'
        assert replies['m-try']['mode'] == 'try' and 'automatically reverted back in 1m0s' in replies['m-try']['mode_details']
        for name in ('m-reboot', 'm-try'):
            node = lab.fleet.node(name)
            lab.wait(lambda node=node: node.mode == 'configured', what='%s configured' % name)
        staged = lab.fleet.node('m-staged')
        assert staged.mode == 'maintenance' and not staged.disk.installed
    finally:
        lab.close()
