"""Lab Talos nodes for the lab-level client and module tests: a node started, and configured through the real client."""

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client
from lab.talos import testing

ENDPOINT = 'https://127.0.0.10:6443'


def start_maintenance(lab, name):
    """Start `name` on the FleetHarness `lab` and wait until it answers in maintenance mode."""
    node = lab.start(name)
    lab.wait(lambda: node.mode == 'maintenance', what='%s in maintenance mode' % name)
    return node


def configure(lab, name, secrets, machine_type='controlplane', **render):
    """Start `name`, apply a config rendered with `render` (testing.render_config's options) in maintenance mode,
    wait until configured."""
    node = start_maintenance(lab, name)
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        talos.apply_configuration(testing.render_config(secrets, machine_type, ENDPOINT, **render))
    lab.wait(lambda: node.mode == 'configured', what='%s configured' % name)
    return node
