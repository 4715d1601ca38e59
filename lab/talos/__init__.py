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
    network = getattr(world, 'network', None)
    if network is not None and getattr(world, 'pve', None) is not None:
        _agent_in_maintenance(world, fleet, network)
    return fleet


def _agent_in_maintenance(world, fleet, network):
    """Fault talos-agent-maintenance: the VM's QEMU guest agent runs only once Talos runs its installed config.

    Whether Talos runs the qemu-guest-agent extension in maintenance mode is reported both ways upstream:
    siderolabs/talos issue 11651 (Talos 1.10.6: "qemu-guest-agent is not running in maintenance mode", closed) and
    siderolabs/extensions issue 367 (Talos 1.6.7: PVE showed the addresses in maintenance mode). The extension's
    service (siderolabs/extensions guest-agents/qemu-guest-agent/qemu-guest-agent.yaml) depends on machined's socket
    and the virtio port only. The lab runs the agent by default; this fault is the other report.
    """
    def configured(vm):
        node = fleet.nodes.get(fleet.vm_key(vm))
        return node is not None and node.phase == 'running'

    network.guest_configured = configured

    class Follow(object):
        @staticmethod
        def on_talos_mode(node):
            vm = world.pve.vm(node.key) if isinstance(node.key, int) else None
            if vm is not None:
                network.guest_changed(vm)

    fleet.add_listener(Follow())

    def apply(target):
        vmid = int(target)
        network.agent_needs_config.add(vmid)
        vm = world.pve.vm(vmid)
        if vm is not None:
            network.guest_changed(vm)
        return {'vmid': vmid}

    def clear(target):
        network.agent_needs_config.discard(int(target))
        vm = world.pve.vm(int(target))
        if vm is not None:
            network.guest_changed(vm)

    world.faults.register('talos-agent-maintenance', 'the QEMU guest agent of VMID runs only once Talos runs its '
                          'installed config: in maintenance mode PVE answers "QEMU guest agent is not running" '
                          '(siderolabs/talos issue 11651); the VM need not exist yet', 'vmid', apply=apply, clear=clear)
