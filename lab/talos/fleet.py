"""The lab's Talos nodes: one TalosNode per VM, driven by the World's power events.

TalosFleet is a World listener (`world.add_listener(fleet)`); the World calls

    await fleet.on_vm_started(vm, address)   the VM powered on with this address: boot Talos
    await fleet.on_vm_stopped(vm)            power cut: the node's process state is gone
    await fleet.on_vm_reset(vm, address)     PVE hard reset: power cut, then boot again
    await fleet.on_vm_deleted(vm)            the node and its disk are gone

It can also be driven directly (tests): `await fleet.start_node(key, name, address)` etc.

It keeps what is shared between nodes: the etcd cluster of each cluster id, the trustd lookup
that gives workers their apid certificate, one asyncio.Condition every wait in the simulation
uses (no polling), the request log, and the Talos faults:

    talos-unreachable NODE                 port 50000 accepts TCP but never answers
    talos-apply-reject NODE [message=...]  the next ApplyConfiguration answers InvalidArgument
    talos-reboot-hang NODE                 a reboot never completes (port stays closed) until a VM reset
    talos-kubelet-volume NODE [p=0.5]      kubelet waits for /var/lib/kubelet; a Talos reboot clears it
                                           with probability p (seeded), a PVE hard reset always
    talos-etcd-join-timeout NODE           the control plane's 30-minute etcd join timeout has run out: etcd
                                           waiting to join (never bootstrapped) goes Failed
    talos-no-etcd-endpoints NODE           the node knows no control-plane endpoint: EtcdMemberList answers
                                           UNKNOWN "no controlplane endpoints discovered yet"

Listeners added with `add_listener(obj)` get (if they define them) `on_etcd_bootstrapped(cluster_id, node)`,
`on_kubelet_running(node)`, `on_kubelet_stopped(node)` (the node went down by a Talos reboot,
reset, shutdown or the install reboot; VM power events come from the World itself) and
`on_node_shutdown(node)`; the Kubernetes simulation uses them.
"""

import asyncio
import inspect
import logging
import random
import re
import time

from lab.talos import versions
from lab.talos.apid import ApidServer, BlackholeServer
from lab.talos.etcd import EtcdCluster
from lab.talos.node import TalosNode

LOG = logging.getLogger('lab.talos')

TALOS_PORT = 50000

# Delay kinds the Talos simulation adds to the lab's timing (realistic seconds, description).
# vm_boot, talos_install_reboot, talos_reboot and etcd_bootstrap are the lab core's own kinds.
DELAY_KINDS = {
    'talos_install': (20.0, 'a Talos node installing to disk after its first config, answering over mTLS meanwhile (v1.13)'),
    'talos_apid_cert': (2.0, 'a Talos worker getting its apid certificate from trustd on a control plane'),
    'etcd_join': ((10.0, 20.0), 'a Talos control plane joining the bootstrapped etcd cluster'),
    'etcd_promote': (15.0, 'a joined etcd learner catching up until Talos promotes it (MemberPromote retried every 15 s)'),
    'etcd_start': (8.0, 'etcd starting again on a control plane that has etcd data'),
    'kubelet_start': ((5.0, 15.0), 'kubelet becoming Running and healthy on a Talos node'),
    'talos_reset': (30.0, 'a Talos node wiping its disk after a Reset call'),
    'talos_shutdown': (5.0, 'a Talos node shutting down after a Shutdown call'),
    'talos_upgrade': (40.0, 'a Talos node running the installer of an Upgrade call before its reboot'),
}
DEFAULT_REJECT_MESSAGE = ('1 error occurred:\n\t* configuration validation failed: the node rejected the config '
                          '(lab fault talos-apply-reject)\n\n')
# What Talos' etcd health check reports when the local member does not answer in time (ValidateQuorum).
DEFAULT_ETCD_UNHEALTHY_MESSAGE = 'context deadline exceeded'
MAX_REQUESTS = 10000
# constants.EtcdJoinTimeout (siderolabs/talos v1.13.9 pkg/machinery/constants/constants.go:926), simulated seconds.
ETCD_JOIN_TIMEOUT = 30 * 60.0


class TalosFleet(object):
    """Every simulated Talos node of a lab."""

    def __init__(self, timing, faults=None, seed=None, port=TALOS_PORT, request_sink=None, endpoints=None):
        self.timing = timing
        self.endpoints = endpoints   # (add(name, host, port, kind), remove(name)) of the World, or None
        self.port = port
        self.random = random.Random(seed)
        self.nodes = {}
        self.clusters = {}
        self.requests = []
        self.request_sink = request_sink
        self.media_source = None    # volid -> the URL the file was downloaded from (the World sets it), or None
        # Talos' ManifestController (controllers/k8s/manifest.go), which renders the bootstrap manifests from a control
        # plane's config: the Kubernetes world sets it, MachineConfig -> [(manifest id, [objects])] (apid's COSI State)
        self.manifests = None
        self.listeners = []
        self._condition = None
        self._unreachable = set()
        self._apply_reject = {}
        self._reboot_hang = set()
        self._kubelet_volume = {}
        self._etcd_unhealthy = {}   # node key -> the health message of its etcd (fault talos-etcd-unhealthy)
        self._etcd_join_timed_out = set()   # node keys whose etcd join timeout ran out (fault or scaled time)
        self._no_etcd_endpoints = set()     # node keys that know no control-plane endpoint (fault)
        self.splits = {}                    # (cluster id, node key) -> EtcdCluster a second Bootstrap formed
        self._expire = None
        register = getattr(timing, 'register', None)
        kinds = getattr(timing, 'kinds', {})
        if register is not None:
            for kind, (realistic, description) in DELAY_KINDS.items():
                if kind not in kinds:
                    register(kind, realistic, description)
        if faults is not None:
            self.register_faults(faults)

    # ------------------------------------------------------------------ world listener

    @staticmethod
    def vm_key(vm):
        return getattr(vm, 'vmid', None) or getattr(vm, 'name', None) or vm

    @staticmethod
    def _disk_size(vm):
        config = getattr(vm, 'config', None) or {}
        for bus in ('scsi0', 'virtio0', 'sata0', 'ide0'):
            match = re.search(r'size=(\d+)([GMT])', str(config.get(bus, '')))
            if match:
                return int(match.group(1)) * {'M': 1024 ** 2, 'G': 1024 ** 3, 'T': 1024 ** 4}[match.group(2)]
        return 32 * 1024 ** 3

    def _media_version(self, vm):
        """The Talos version of the ISO in the VM's CD drive, when the lab knows where that file came from."""
        config = getattr(vm, 'config', None) or {}
        for key in sorted(config):
            value = str(config[key])
            if re.match(r'^(ide|sata|scsi)\d+$', key) and 'media=cdrom' in value and self.media_source is not None:
                found = versions.from_image_url(self.media_source(value.split(',', 1)[0]))
                if found:
                    return found
        return None

    async def on_vm_started(self, vm, address):
        if not address:
            LOG.warning('VM %s started without an address: no Talos API', getattr(vm, 'name', vm))
            return
        await self.start_node(self.vm_key(vm), getattr(vm, 'name', str(self.vm_key(vm))), address, self._disk_size(vm),
                              media_version=self._media_version(vm))

    async def on_vm_stopped(self, vm):
        await self.stop_node(self.vm_key(vm))

    async def on_vm_reset(self, vm, address):
        node = self.nodes.get(self.vm_key(vm))
        if node is not None:
            self._kubelet_volume_cleared(node, 'PVE hard reset')
        await self.stop_node(self.vm_key(vm))
        await self.on_vm_started(vm, address)

    async def on_vm_deleted(self, vm):
        await self.delete_node(self.vm_key(vm))

    async def on_lab_reset(self):
        """The World was reset (every VM deleted): forget every node, cluster and fault."""
        for key in list(self.nodes):
            await self.delete_node(key)
        self.clusters = {}
        self._unreachable.clear()
        self._apply_reject.clear()
        self._reboot_hang.clear()
        self._kubelet_volume.clear()
        self._etcd_unhealthy.clear()
        self._etcd_join_timed_out.clear()
        self._no_etcd_endpoints.clear()
        self.splits = {}

    async def on_lab_stop(self):
        await self.close()

    # ------------------------------------------------------------------ direct control

    async def start_node(self, key, name, address, disk_size=32 * 1024 ** 3, media_version=None):
        """Power a node on (creating it the first time); it boots after the vm_boot delay, from its disk when Talos is
        installed there, else from the ISO (media_version: its Talos version, None for the lab's default)."""
        node = self.nodes.get(key)
        if node is None:
            node = TalosNode(self, key, name, address, disk_size)
            self.nodes[key] = node
        node.name = name
        node.disk_size = disk_size
        node.media_version = media_version
        await node.power_on(address)
        return node

    async def stop_node(self, key):
        node = self.nodes.get(key)
        if node is not None:
            await node.power_off()

    async def delete_node(self, key):
        """The VM is gone: power off and forget the node with its disk.

        An etcd member of a deleted control plane stays in its cluster (as in the field, until
        someone removes it); a cluster with no node left that holds etcd data is forgotten.
        """
        node = self.nodes.pop(key, None)
        if node is None:
            return
        await node.power_off()
        cluster_id = node.cluster_id
        if cluster_id and not any(other.cluster_id == cluster_id and other.disk.etcd_data for other in self.nodes.values()):
            self.clusters.pop(cluster_id, None)
        self.changed()

    async def close(self):
        for node in list(self.nodes.values()):
            await node.power_off()

    def node(self, target):
        """A node by VM id, VM name, address or hostname; None if there is none."""
        target = str(target)
        for node in self.nodes.values():
            if target in (str(node.key), node.name, node.address):
                return node
        for node in self.nodes.values():
            if node.powered and node.hostname == target:
                return node
        return None

    # ------------------------------------------------------------------ shared state

    def etcd_cluster(self, cluster_id):
        cluster = self.clusters.get(cluster_id)
        if cluster is None:
            cluster = EtcdCluster(cluster_id, rng=random.Random(self.random.getrandbits(64)))
            self.clusters[cluster_id] = cluster
        return cluster

    def split_cluster(self, cluster_id, node_key):
        """The etcd cluster a second Bootstrap formed on `node_key` (created on first use)."""
        key = (cluster_id, node_key)
        cluster = self.splits.get(key)
        if cluster is None:
            cluster = EtcdCluster(cluster_id, rng=random.Random(self.random.getrandbits(64)))
            self.splits[key] = cluster
        return cluster

    def forget_split(self, cluster_id, node_key):
        self.splits.pop((cluster_id, node_key), None)

    def cluster_nodes(self, cluster_id):
        return [node for node in self.nodes.values() if node.cluster_id == cluster_id]

    def find_cert_issuer(self, ca_crt, token):
        """A control plane that signs apid certificates for the OS CA `ca_crt` to a worker with `token` (trustd), or None."""
        if not ca_crt:
            return None
        return next((node for node in self.nodes.values() if node.issues_worker_certs_for(ca_crt, token)), None)

    def apid_server(self, node):
        return ApidServer(node, self)

    def api_listening(self, node, listening):
        """A node's port 50000 opened or closed: shown in `lab status` as an endpoint of the lab."""
        if self.endpoints is None:
            return
        add, remove = self.endpoints
        name = 'talos:%s' % node.name
        if listening:
            add(name, node.address, self.port, 'grpc')
        else:
            remove(name)

    @staticmethod
    def blackhole_server(node):
        return BlackholeServer()

    # ------------------------------------------------------------------ time and conditions

    async def delay(self, kind, subject):
        if kind is None:
            return
        await self.timing.sleep(kind, subject)

    def _cond(self):
        if self._condition is None:
            self._condition = asyncio.Condition()
        return self._condition

    def changed(self):
        """Something in the simulation changed: wake every wait_for to look again."""
        condition = self._cond()

        async def wake():
            async with condition:
                condition.notify_all()
        asyncio.ensure_future(wake())

    async def wait_for(self, predicate):
        """Block until predicate() is true; it is re-checked whenever the simulation changes."""
        condition = self._cond()
        async with condition:
            await condition.wait_for(predicate)

    # ------------------------------------------------------------------ listeners and log

    def add_listener(self, listener):
        self.listeners.append(listener)

    def notify(self, hook, *args):
        for listener in self.listeners:
            function = getattr(listener, hook, None)
            if function is None:
                continue
            result = function(*args)
            if inspect.isawaitable(result):
                asyncio.ensure_future(result)

    def record_request(self, node, path, code, roles):
        entry = {'time': time.time(), 'service': 'talos', 'node': node.name, 'address': node.address, 'method': path,
                 'code': code, 'roles': roles}
        self.requests.append(entry)
        del self.requests[:-MAX_REQUESTS]
        if self.request_sink is not None:
            self.request_sink(entry)

    # ------------------------------------------------------------------ faults

    def register_faults(self, registry):
        from lab.faults import Param  # pylint: disable=import-outside-toplevel
        registry.register('talos-unreachable', 'the Talos node stops answering on port 50000 (TCP accepted, no TLS '
                          'answer: clients run into their deadline)', 'node', apply=self.fault_unreachable,
                          clear=self.clear_unreachable)
        registry.register('talos-apply-reject', 'the next ApplyConfiguration on the node answers InvalidArgument',
                          'node', apply=self.fault_apply_reject, clear=self.clear_apply_reject,
                          params=[Param('message', str, None, 'the error message (default: a validation error)')])
        registry.register('talos-reboot-hang', 'a reboot of the node never completes: its port stays closed until '
                          'the VM is reset', 'node', apply=self.fault_reboot_hang, clear=self.clear_reboot_hang)
        registry.register('talos-kubelet-volume', 'kubelet on the node waits forever for /var/lib/kubelet to be '
                          'mounted; a Talos reboot clears it with probability p, a PVE hard reset always',
                          'node', apply=self.fault_kubelet_volume, clear=self.clear_kubelet_volume,
                          params=[Param('p', float, 0.5, 'probability that a Talos reboot clears the fault')])
        registry.register('talos-etcd-join-timeout', 'the control plane\'s etcd join timeout (EtcdJoinTimeout, 30 '
                          'minutes) has run out: an etcd that waits to join or to be bootstrapped goes Failed "Failed '
                          'to run pre stage: ..." and stays so until a Bootstrap call or a reboot', 'node',
                          apply=self.fault_etcd_join_timeout, clear=self.clear_etcd_join_timeout)
        registry.register('talos-no-etcd-endpoints', 'the node knows no control-plane endpoint (the cluster endpoint '
                          'does not resolve, discovery found nobody): EtcdMemberList answers UNKNOWN "no '
                          'controlplane endpoints discovered yet"', 'node', apply=self.fault_no_etcd_endpoints,
                          clear=self.clear_no_etcd_endpoints)
        registry.register('talos-etcd-unhealthy', 'etcd on the control plane runs but fails its health check (a slow '
                          'disk or a peer it cannot reach): ServiceList shows etcd Running, unhealthy, with MESSAGE; '
                          'it stays so across reboots until cleared; a node with no config yet is armed, for when it '
                          'becomes a control plane', 'node', apply=self.fault_etcd_unhealthy,
                          clear=self.clear_etcd_unhealthy,
                          params=[Param('message', str, DEFAULT_ETCD_UNHEALTHY_MESSAGE, 'the health check message')])
        self.expire_faults_with(registry)

    def _target(self, target):
        node = self.node(target)
        if node is None:
            from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
            known = ', '.join(sorted(n.name for n in self.nodes.values())) or 'none'
            raise FaultError('no Talos node %r (known nodes: %s)' % (target, known))
        return node

    async def fault_unreachable(self, target):
        node = self._target(target)
        self._unreachable.add(node.key)
        await node.restart_api()
        return 'node %s (%s) no longer answers on port %d' % (node.name, node.address, self.port)

    async def clear_unreachable(self, target):
        node = self.node(target)
        if node is not None and node.key in self._unreachable:
            self._unreachable.discard(node.key)
            await node.restart_api()

    def is_unreachable(self, node):
        return node.key in self._unreachable

    def fault_apply_reject(self, target, message=None):
        node = self._target(target)
        self._apply_reject[node.key] = message or DEFAULT_REJECT_MESSAGE
        return 'the next apply on %s is rejected' % node.name

    def clear_apply_reject(self, target):
        node = self.node(target)
        if node is not None:
            self._apply_reject.pop(node.key, None)

    def take_apply_reject(self, node):
        message = self._apply_reject.pop(node.key, None)
        if message is not None and self._expire is not None:
            self._expire('talos-apply-reject', node)
        return message

    def fault_reboot_hang(self, target):
        node = self._target(target)
        self._reboot_hang.add(node.key)
        return 'reboots of %s hang' % node.name

    def clear_reboot_hang(self, target):
        """Later reboots complete again; a node already hung stays down until its VM is reset."""
        node = self.node(target)
        if node is not None:
            self._reboot_hang.discard(node.key)

    def reboot_hangs(self, node):
        return node.key in self._reboot_hang

    async def fault_kubelet_volume(self, target, p=0.5):
        if not 0.0 <= p <= 1.0:
            from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
            raise FaultError('fault talos-kubelet-volume: p must be between 0 and 1, got %r' % (p,))
        node = self._target(target)
        self._kubelet_volume[node.key] = p
        kubelet = node.service('kubelet')
        if kubelet is not None and kubelet.state == 'Running':
            # A mounted volume does not go away: the fault shows from kubelet's next start (a reboot).
            return 'kubelet on %s runs now; it will wait for /var/lib/kubelet from its next start' % node.name
        node.kubelet_volume_stuck = True
        return 'kubelet on %s waits for /var/lib/kubelet' % node.name

    async def clear_kubelet_volume(self, target):
        node = self.node(target)
        if node is not None:
            self._kubelet_volume.pop(node.key, None)
            await node.clear_kubelet_volume()

    def fault_etcd_unhealthy(self, target, message=DEFAULT_ETCD_UNHEALTHY_MESSAGE):
        node = self._target(target)
        if node.machine_type is not None and not node.control_plane:
            from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
            raise FaultError('fault talos-etcd-unhealthy: %s is configured as a %s, which runs no etcd'
                             % (node.name, node.machine_type))
        self._etcd_unhealthy[node.key] = message
        if node.machine_type is None:
            # no config yet (maintenance, or not booted): armed for when it becomes a control plane; a test that kills
            # a run in the middle of the apply stage cannot know which nodes took their config before the kill
            return 'etcd on %s will be unhealthy if it is configured as a control plane: %s' % (node.name, message)
        etcd = node.service('etcd')
        if etcd is not None and etcd.state == 'Running':
            etcd.set_health(False, message)
            self.changed()
            return 'etcd on %s is unhealthy: %s' % (node.name, message)
        return 'etcd on %s will be unhealthy once it runs: %s' % (node.name, message)

    def clear_etcd_unhealthy(self, target):
        node = self.node(target)
        if node is None or self._etcd_unhealthy.pop(node.key, None) is None:
            return
        etcd = node.service('etcd')
        if etcd is not None and etcd.state == 'Running':
            etcd.set_health(True)
            self.changed()

    def etcd_health_message(self, node):
        """None when the node's etcd passes its health check, else the health message (fault talos-etcd-unhealthy)."""
        return self._etcd_unhealthy.get(node.key)

    def fault_etcd_join_timeout(self, target):
        node = self._target(target)
        self.mark_etcd_join_timed_out(node)
        return 'the etcd join timeout of %s has run out' % node.name

    def clear_etcd_join_timeout(self, target):
        """Only a later boot starts the join again with a fresh timeout; an etcd already Failed stays Failed."""
        node = self.node(target)
        if node is not None:
            self._etcd_join_timed_out.discard(node.key)

    def mark_etcd_join_timed_out(self, node):
        self._etcd_join_timed_out.add(node.key)
        self.changed()

    def etcd_join_timed_out(self, node):
        return node.key in self._etcd_join_timed_out

    def etcd_join_timeout_seconds(self):
        """EtcdJoinTimeout (30 min) in real seconds: only the realistic profile with a time scale has one."""
        scale = getattr(self.timing, 'scale', 0.0)
        if getattr(self.timing, 'profile', 'instant') != 'realistic' or not scale:
            return None
        return ETCD_JOIN_TIMEOUT * scale

    def fault_no_etcd_endpoints(self, target):
        node = self._target(target)
        self._no_etcd_endpoints.add(node.key)
        return '%s knows no control-plane endpoint' % node.name

    def clear_no_etcd_endpoints(self, target):
        node = self.node(target)
        if node is not None:
            self._no_etcd_endpoints.discard(node.key)

    def etcd_endpoints_unknown(self, node):
        return node.key in self._no_etcd_endpoints

    def kubelet_volume_fault(self, node):
        return self._kubelet_volume.get(node.key)

    def talos_rebooted(self, node):
        """A Talos reboot (not a PVE reset): clears the kubelet volume fault with its probability."""
        p = self._kubelet_volume.get(node.key)
        if p is not None and self.random.random() < p:
            self._kubelet_volume_cleared(node, 'Talos reboot')

    def _kubelet_volume_cleared(self, node, why):
        if self._kubelet_volume.pop(node.key, None) is not None:
            LOG.info('talos node %s: kubelet volume fault cleared by %s', node.name, why)
            node.kubelet_volume_stuck = False
            if self._expire is not None:
                self._expire('talos-kubelet-volume', node)

    def expire_faults_with(self, registry):
        """Let faults that end by themselves (an apply rejected once, a cleared volume) leave the registry."""
        def expire(name, node):
            for target in (node.name, str(node.key), node.address):
                if registry.expire(name, target) is not None:
                    return
        self._expire = expire

    # ------------------------------------------------------------------ status

    def status(self):
        """`lab status` section: per node address, mode, type, services, etcd membership; per cluster etcd."""
        nodes = [node.status() for node in sorted(self.nodes.values(), key=lambda n: (n.address or '', n.name))]
        clusters = {}
        for cluster_id, cluster in self.clusters.items():
            clusters[cluster_id] = {'bootstrapped': cluster.bootstrapped,
                                    'leader': '%x' % cluster.leader if cluster.leader else None,
                                    'members': [member.as_dict() for member in cluster.members]}
        for (cluster_id, node_key), cluster in self.splits.items():
            clusters.setdefault(cluster_id, {}).setdefault('splits', []).append(
                {'node': str(node_key), 'members': [member.as_dict() for member in cluster.members]})
        return {'nodes': nodes, 'etcd': clusters}
