"""The Talos simulation's delays come from the lab's timing profile, scaled, and are recorded."""
import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client
from lab.talos import testing

SCALE = 0.002  # realistic profile, 500 times faster: talos_install_reboot 60 s -> 0.12 s


@pytest.fixture(scope='module')
def lab():
    harness = testing.FleetHarness(profile='realistic', scale=SCALE)
    yield harness
    harness.close()


def test_install_reboot_and_bootstrap_take_their_profile_delays(lab):
    secrets = testing.ClusterSecrets()
    node = lab.start('t-cp')
    lab.wait(lambda: node.mode == 'maintenance', what='maintenance')
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        talos.apply_configuration(testing.render_config(secrets, 'controlplane', 'https://127.0.0.10:6443'))
    # v1.13: apid answers over mTLS while the node installs (talos_install), then the port closes for the reboot
    # (talos_install_reboot); the node is configured on its next boot
    credentials = client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab'))
    lab.wait(lambda: node.mode == 'configured' and node.boot_count == 2, what='configured after the install reboot')
    with client.TalosClient(node.address, credentials=credentials, timeout=5) as talos:
        talos.bootstrap()
    lab.wait(lambda: node.service('kubelet') is not None and node.service('kubelet').is_healthy, what='kubelet healthy')

    records = lab.call(lab.timing.query, target='t-cp')
    kinds = [record['kind'] for record in records]
    for kind in ('vm_boot', 'talos_install', 'talos_install_reboot', 'etcd_bootstrap', 'kubelet_start'):
        assert kind in kinds, kinds
    install = next(record for record in records if record['kind'] == 'talos_install_reboot')
    assert install['outcome'] == 'done'
    assert install['nominal'] == 60.0 and install['planned'] == pytest.approx(60.0 * SCALE)
    assert install['duration'] >= install['planned'] * 0.9
    assert kinds.index('talos_install') < kinds.index('talos_install_reboot') < kinds.index('etcd_bootstrap') < kinds.index('kubelet_start')
