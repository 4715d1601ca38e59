"""Lab Talos nodes for the lab-level module tests: a node started and configured through the real client."""

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client
from lab.talos import testing

ENDPOINT = 'https://127.0.0.10:6443'


def configure(lab, name, secrets, machine_type='controlplane'):
    """Start `name` on the FleetHarness `lab`, apply a rendered config in maintenance mode, wait until configured."""
    node = lab.start(name)
    lab.wait(lambda: node.mode == 'maintenance', what='%s in maintenance mode' % name)
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        talos.apply_configuration(testing.render_config(secrets, machine_type, ENDPOINT))
    lab.wait(lambda: node.mode == 'configured', what='%s configured' % name)
    return node
