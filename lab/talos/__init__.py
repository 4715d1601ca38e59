"""The lab's Talos nodes: one simulated Talos apid per running VM, on <VM address>:50000.

`install(world)` is called by the lab's World at start (lab/world.py): it creates the
TalosFleet, registers it for VM power events, its faults, delay kinds, `lab status` section
and request log, and stops every node when the lab stops. The fleet is `world.talos` for the
other simulations (the Kubernetes side listens to it for etcd and kubelet events).

Modules: fleet (the nodes of a lab, faults, status), node (one node's life cycle and RPC
behaviour), apid (the grpclib server and authorization), machineconfig (strict config decoding
and validation), etcd, services, pki (the node's own certificates), testing (test helpers).
"""


def install(world):
    """Plug the Talos simulation into the World; returns the TalosFleet."""
    from lab.talos.fleet import TalosFleet  # pylint: disable=import-outside-toplevel

    def log(entry):
        world.log_request('talos', 'POST', entry['method'], entry['code'], node=entry['node'], address=entry['address'],
                          roles=entry['roles'])

    fleet = TalosFleet(world.timing, faults=world.faults, seed=world.timing.seed, request_sink=log,
                       endpoints=(world.add_endpoint, world.remove_endpoint))
    # what a VM boots from: the lab's PVE knows the URL each downloaded file came from (lab.talos.versions)
    fleet.media_source = lambda volid: getattr(getattr(world, 'pve', None), 'file_sources', {}).get(volid)
    world.add_listener(fleet)
    world.add_status_section('talos', fleet.status)
    world.talos = fleet
    return fleet
