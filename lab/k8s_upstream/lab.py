"""The upstream control plane in the lab's World: the Kubernetes of `python -m lab up` by default (`--kubernetes
upstream`; the extension lab.k8s_upstream). With it, a lab cluster's Kubernetes is etcd + kube-apiserver +
kube-controller-manager + kube-scheduler (lab/k8s_upstream/controlplane.py) and each node's kubelet is a kwok-managed
Node.

- etcd bootstrapped on a cluster (the Talos fleet's on_etcd_bootstrapped): its control plane starts, with the cluster
  CA of the machine config (so the kubeconfig the Talos Kubeconfig RPC returns is trusted as is), the admission
  configuration of `cluster.apiServer.admissionControl`, the pod and service subnets of `cluster.network`;
  kube-apiserver listens on a private address of its own (127.0.0.1, a free port), and answers, port 6443, where a
  Talos control plane's kube-apiserver would (lab/k8s_upstream/forward.py: a TCP forward per address): on each control
  plane that is up (its own address), and on the control-plane endpoint only while a control plane holds it as its
  Talos layer-2 VIP (lab/talos/vip.py: its config names the VIP on a link, its etcd is healthy, it leads the
  election). A cluster whose configs carry no VIP has no API on its endpoint, as on real hardware; when the holder
  goes down the next control plane in the election takes the address over. Its certificate names the endpoint, the
  control planes' addresses and `machine.certSANs`.
- a kubelet runs (on_kubelet_running): its Node registers with the Talos hostname, the node address, and the labels
  and taints Talos gives it; a kubelet that stops (Talos reboot, reset, shutdown; VM stop, reset, delete) is let go by
  kwok, so kube-controller-manager's node lifecycle controller marks its Node Unknown when its Lease runs out.
- the Node reports its config's kubelet version (machine.kubelet.image), and the new one after Talos restarts kubelet
  for a config that names another image (on_kubelet_restarting); a control plane's kube-apiserver,
  kube-controller-manager and kube-scheduler are mirror pods with the images of its config (mirror_pod). The processes
  serving the API stay the lab's one build (v1.36.3) whatever the configs name.
- a Node is NotReady as its kubelet reports it (NetworkPluginNotReady) until a Ready pod labelled k8s-app=cilium runs
  on it, then Ready (lab/k8s_upstream/kubelet.py).
- `lab status` shows, per cluster, each process with its pid and health; the lab stopping stops them.
- the manifests Talos applies (lab/k8s_upstream/manifests.py): rendered by Talos's own templates from the config of the
  control plane whose etcd was bootstrapped, and again from a control plane's config when its kubelet runs (Talos's
  manifest controllers run on every control plane); applied as Talos's ManifestApplyController applies them, retried
  with its backoff until a pass has no errors (a custom resource waits for its CRD).
- fault k8s-crashloop (node; workload NAMESPACE/DAEMONSET): that pod crash-loops as kubelet reports it
  (lab/k8s_upstream/kubelet.py CrashLoops).
- faults k8s-image-pull (NAMESPACE/WORKLOAD) and k8s-pending (NAMESPACE/DEPLOYMENT): a MutatingAdmissionPolicy in the
  cluster changes the workload's new pods (lab/k8s_upstream/policies.py): kwok leaves an image-pull pod Pending and the
  kubelet stand-in reports ErrImagePull, then ImagePullBackOff (kubelet.py ImagePulls); a pending pod asks for more cpu
  than any Node has and the real kube-scheduler leaves it Unschedulable, `Insufficient cpu`.
- fault k8s-api-flap: every forward closes for the second half of each period; mode refuse (the default here):
  connections to the API are refused, as when kube-apiserver restarts; mode 503: an HTTP-mode load balancer with no
  healthy backend answers there instead, over TLS with kube-apiserver's certificate (lab/k8s_upstream/unavailable.py).
Not yet: the kubelet volume fault, the Flux simulation (which works on lab/k8s's store).
"""

import asyncio
import logging
import os
import urllib.parse

from ..kubelet_hooks import DEFAULT_PULL_ERROR, KubeletVmHooks
from ..talos import machineconfig
from ..talos.static_pods import STATIC_PODS, mirror_pod
from ..talos import vip as talos_vip
from . import manifests as talos_manifests
from . import policies
from .controlplane import ADMIN_USER, DEFAULT_POD_SUBNET, DEFAULT_SERVICE_SUBNET, ControlPlane, ControlPlaneError, _is_ip
from .forward import AddressForward
from .unavailable import UnavailableFront

LOG = logging.getLogger('lab.k8s_upstream')
API_PORT = 6443
AUDIT_POLL_SECONDS = 0.1   # how often requests.log gets the API requests of kube-apiserver's audit log
CONTROL_PLANE_TAINT = 'node-role.kubernetes.io/control-plane'


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def node_labels(config):
    """machine.nodeLabels, plus the control-plane role label on control planes.

    Talos v1.13.9 internal/app/machined/pkg/controllers/k8s/node_label_spec.go:80-85.
    """
    labels = dict(config.machine.get('nodeLabels') or {})
    if config.control_plane:
        labels[CONTROL_PLANE_TAINT] = ''
    return labels


def node_taints(config):
    """The control-plane taint (unless cluster.allowSchedulingOnControlPlanes), then machine.nodeTaints.

    Talos v1.13.9 internal/app/machined/pkg/controllers/k8s/node_taint_spec.go:72-90: a nodeTaints value is
    `value:effect`, or only `effect` when it has no colon.
    """
    taints = []
    if config.control_plane and not config.cluster.get('allowSchedulingOnControlPlanes'):
        taints.append({'key': CONTROL_PLANE_TAINT, 'effect': 'NoSchedule'})
    for key, text in (config.machine.get('nodeTaints') or {}).items():
        value, colon, effect = str(text).partition(':')
        taint = {'key': key, 'effect': effect if colon else value}
        if colon and value:
            taint['value'] = value
        taints.append(taint)
    return taints


class LabUpstreamKubernetes(KubeletVmHooks):
    """Every cluster's upstream control plane, keyed by Talos cluster id."""

    def __init__(self, world):
        self.world = world
        self.planes = {}     # cluster id -> ControlPlane (started)
        self.waiting = {}    # cluster id -> [talos nodes whose kubelet ran before the API]
        self.nodes = {}      # talos node key -> (cluster id, Node name) of the kubelets that run
        self.plane_listeners = []  # async fn(cluster_id, plane) after a control plane started (lab.flux_upstream)
        self.appliers = {}   # cluster id -> ManifestApplier (its inventory lives as long as the control plane)
        self.crashloop = {}  # node name -> NAMESPACE/DAEMONSET of the fault k8s-crashloop (applied to planes that start later too)
        self.image_pull = {}  # NAMESPACE/WORKLOAD -> registry error of the fault k8s-image-pull (planes that start later too)
        self.pending = set()  # NAMESPACE/DEPLOYMENT of the fault k8s-pending (planes that start later too)
        self.flap_task = None  # _flap_loop while the fault is on
        self.api_down = False  # True in the down half of a flap period: kube-apiserver answers nowhere
        self.flap_mode = 'refuse'  # what the addresses do in the down half: refuse, or 503 (an UnavailableFront answers)
        self.fronts = {}     # cluster id -> {address: UnavailableFront} in the down half of a flap with mode 503
        self.applying = {}   # cluster id -> (config text, the asyncio task applying Talos's manifests from it)
        self.restarting = {}  # talos node key -> the task stopping its kubelet for a restart (on_kubelet_restarting)
        self.audit_task = None  # follow_audit, from the first control plane's start
        self.endpoints = {}  # cluster id -> the control-plane endpoint host (an address)
        self.control_planes = {}  # cluster id -> {talos node key: address} of the control planes that are up
        self.elections = {}  # cluster id -> the talos_vip.Election of its endpoint
        self.forwards = {}   # cluster id -> {address: AddressForward} where the API answers now
        self.vip_operators = {}  # cluster id -> the task that follows the election (_vip_operator)
        self.following = {}  # cluster id -> the asyncio.Lock of its forwards

    def add_plane_listener(self, listener):
        """listener(cluster_id, plane), a coroutine function, is awaited after each control plane has started."""
        self.plane_listeners.append(listener)

    async def _blocking(self, function, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(None, lambda: function(*args, **kwargs))

    async def on_etcd_bootstrapped(self, cluster_id, node):
        if cluster_id in self.planes:
            return
        config = node.config
        ca_crt, ca_key = config.k8s_ca
        if not ca_crt or not ca_key:
            LOG.warning('cluster %s: no Kubernetes CA in the machine config; no API server', cluster_id)
            return
        endpoint = urllib.parse.urlparse(config.endpoint).hostname if config.endpoint else None
        if not endpoint or not _is_ip(endpoint):
            LOG.warning('cluster %s: the control-plane endpoint %r is not an address of the lab; no API server', cluster_id, endpoint)
            return
        network = config.cluster.get('network') or {}
        api_server = config.cluster.get('apiServer') or {}
        plane = ControlPlane(os.path.join(self.world.run_dir, 'k8s-upstream', str(cluster_id)[:12] or 'cluster'),
                             # as Talos renders it: the config's list, none when it has none (not our default)
                             admission_control=api_server.get('admissionControl') or [],
                             pod_subnet=(network.get('podSubnets') or [DEFAULT_POD_SUBNET])[0],
                             service_subnet=(network.get('serviceSubnets') or [DEFAULT_SERVICE_SUBNET])[0],
                             ca=(_text(ca_crt), _text(ca_key)),
                             api_sans=[endpoint] + self._control_plane_addresses(cluster_id, node) + list(config.cert_sans or []),
                             # a Talos node's kubelet reports NotReady until its CNI agent runs (lab/k8s_upstream/kubelet.py)
                             nodes_wait_for_cni=True)
        try:
            await self._blocking(plane.start)
        except ControlPlaneError as exc:
            LOG.error('cluster %s: the upstream control plane did not start: %s', cluster_id, exc)
            return
        self.planes[cluster_id] = plane
        if self.audit_task is None:
            self.audit_task = asyncio.get_running_loop().create_task(self.follow_audit())
        self.endpoints[cluster_id] = endpoint
        self.control_planes.setdefault(cluster_id, {})[node.key] = node.address
        await self._follow(cluster_id)
        if getattr(self.world, 'talos', None) is not None:
            self.vip_operators[cluster_id] = asyncio.ensure_future(self._vip_operator(cluster_id))
        for target, workload in self.crashloop.items():
            plane.crash_loop(target, workload)
        try:
            for workload, message in self.image_pull.items():
                await self._blocking(plane.image_pull, workload, message)
            for workload in self.pending:
                await self._blocking(plane.pending, workload)
        except ControlPlaneError as exc:
            LOG.error('cluster %s: a workload fault was not applied: %s', cluster_id, exc)
        self.appliers[cluster_id] = talos_manifests.ManifestApplier(plane)
        self._apply_manifests(cluster_id, config)
        for waiting in self.waiting.pop(cluster_id, []):
            await self.on_kubelet_running(waiting)
        for listener in self.plane_listeners:
            await listener(cluster_id, plane)

    def _control_plane_addresses(self, cluster_id, bootstrapped):
        """The addresses of the cluster's control planes the fleet knows (the bootstrapped one first)."""
        talos = getattr(self.world, 'talos', None)
        nodes = sorted(talos.nodes.values(), key=lambda n: n.address or '') if talos is not None else []
        found = [bootstrapped.address] + [n.address for n in nodes if n.cluster_id == cluster_id and n.config is not None
                                          and n.config.control_plane and n.address]
        return [a for i, a in enumerate(found) if a and a not in found[:i]]

    # --- where the API answers: each control plane that is up, and the VIP's holder ----------------------------------

    def _vip_held(self, cluster_id, gone=None):
        """True if a control plane whose kube-apiserver runs holds the endpoint as its layer-2 VIP now.

        The election runs again on every call (lab/talos/vip.py: who may campaign, operator/vip.go:154-189; the FIFO
        queue of campaigns, :226-264; a campaign ends with etcd or the node, :281-310; only the leader has the address,
        :96-124). gone: the key of a node going down (its services may still show Running at that moment).
        """
        endpoint = self.endpoints.get(cluster_id)
        talos = getattr(self.world, 'talos', None)
        if not endpoint or talos is None:
            return False
        election = self.elections.get(cluster_id)
        if election is None:
            election = self.elections[cluster_id] = talos_vip.Election(endpoint)
        candidates = dict((key, key != gone and election.campaigning(key, node) and endpoint in talos_vip.layer2_vips(node.config))
                          for key, node in list(talos.nodes.items()) if node.cluster_id == cluster_id)
        leader = election.update(candidates)
        # the address is on the leader's link whether its kube-apiserver runs or not; it answers there only when it does
        return leader is not None and leader in self.control_planes.get(cluster_id, {})

    def _answering(self, cluster_id, gone=None):
        """The addresses where the cluster's kube-apiserver should answer now."""
        if self.api_down:
            return set()
        return self._api_addresses(cluster_id, gone=gone)

    def _api_addresses(self, cluster_id, gone=None):
        """The addresses of the cluster's API: where kube-apiserver answers unless the API flaps."""
        if cluster_id not in self.planes:
            return set()
        wanted = set(a for key, a in self.control_planes.get(cluster_id, {}).items() if key != gone and a)
        if self._vip_held(cluster_id, gone=gone):
            wanted.add(self.endpoints[cluster_id])
        return wanted

    def _unavailable(self, cluster_id, gone=None):
        """The addresses where a load balancer without backend answers 503 now (k8s-api-flap mode 503, down half)."""
        if self.api_down and self.flap_mode == '503':
            return self._api_addresses(cluster_id, gone=gone)
        return set()

    async def _follow(self, cluster_id, gone=None):
        """Open and close the forwards so the API answers where _answering says."""
        async with self.following.setdefault(cluster_id, asyncio.Lock()):   # one change of the forwards at a time
            await self._follow_now(cluster_id, gone)

    async def _follow_now(self, cluster_id, gone):
        plane = self.planes.get(cluster_id)
        forwards = self.forwards.setdefault(cluster_id, {})
        fronts = self.fronts.setdefault(cluster_id, {})
        wanted = self._answering(cluster_id, gone=gone)
        unavailable = self._unavailable(cluster_id, gone=gone)
        for address in sorted(set(forwards) - wanted):
            await forwards.pop(address).close()
            self.world.remove_endpoint('k8s-api-%s' % address)
            if address == self.endpoints.get(cluster_id) and not unavailable:
                LOG.info('cluster %s: no control plane holds the VIP %s; the endpoint does not answer', cluster_id, address)
        for address in sorted(set(fronts) - unavailable):
            await fronts.pop(address).close()
            self.world.remove_endpoint('k8s-api-%s' % address)
        for address in sorted(unavailable - set(fronts)):
            await self._listen(cluster_id, fronts, address, 'the unavailable API', UnavailableFront(
                address, API_PORT, plane.pki_file('apiserver.crt'), plane.pki_file('apiserver.key'),
                plane.pki_file('ca.crt'), self._unavailable_answered))
        for address in sorted(wanted - set(forwards)):
            await self._listen(cluster_id, forwards, address, 'kube-apiserver',
                               AddressForward(address, API_PORT, plane.api_host, plane.ports['kube-apiserver']))

    async def _listen(self, cluster_id, listeners, address, what, listener):
        """Start listener (a forward or a front) on address:API_PORT, keep it in listeners and name its endpoint; a port
        that cannot be bound is logged and left for the next follow."""
        try:
            await listener.start()
        except OSError as exc:
            LOG.error('cluster %s: cannot listen on %s:%d for %s: %s', cluster_id, address, API_PORT, what, exc)
            return
        listeners[address] = listener
        self.world.add_endpoint('k8s-api-%s' % address, address, API_PORT, 'https')

    async def _vip_operator(self, cluster_id):
        """Talos' VIP operator for the cluster's endpoint: the election runs again whenever the simulation changes (a
        config applied with or without the VIP, etcd's health, a node up or down), as Talos' controllers react to their
        resources (operator_vip_config.go:73-176, operator/vip.go:191-310), and the forwards follow it."""
        talos = self.world.talos
        while True:
            await talos.wait_for(lambda: (self._answering(cluster_id), self._unavailable(cluster_id)) !=
                                 (set(self.forwards.get(cluster_id, {})), set(self.fronts.get(cluster_id, {}))))
            await self._follow(cluster_id)

    def _apply_manifests(self, cluster_id, config):
        """Start (or restart, for another config) the cluster's Talos manifest apply in the background. The same config
        again changes no Manifest resource, so Talos's controllers do not run again for it."""
        text = config.text()
        previous = self.applying.get(cluster_id)
        if previous is not None:
            if previous[0] == text:
                return
            previous[1].cancel()
        self.applying[cluster_id] = (text, asyncio.get_running_loop().create_task(self._apply_until_done(cluster_id, text)))

    async def _apply_until_done(self, cluster_id, config_text):
        """Render, then apply passes until one has no errors, waiting between them as the controller runtime's
        restart backoff does (lab/k8s_upstream/manifests.py cites it); the last errors are in the lab's log."""
        applier = self.appliers[cluster_id]
        try:
            rendered = await self._blocking(talos_manifests.render, config_text)
        except talos_manifests.ManifestError as exc:
            LOG.error('cluster %s: Talos manifests not rendered: %s', cluster_id, exc)
            return
        for url in rendered['urls']:
            LOG.warning('cluster %s: manifest %s is a URL the lab cannot fetch; not applied', cluster_id, url['url'])
        objects = talos_manifests.apply_order(rendered['manifests'])
        interval = talos_manifests.RETRY_INITIAL
        while True:
            try:
                errors = await self._blocking(applier.apply_pass, objects)
            except ControlPlaneError as exc:
                errors = [str(exc)]
            if not errors:
                LOG.info('cluster %s: Talos manifests applied', cluster_id)
                return
            LOG.info('cluster %s: Talos manifest apply failed, again in %.1f s: %s', cluster_id, interval, '; '.join(errors))
            await asyncio.sleep(interval)  # the imitated controller's restart backoff, not a wait on a condition
            interval = min(interval * talos_manifests.RETRY_MULTIPLIER, talos_manifests.RETRY_MAX)

    async def on_kubelet_running(self, node):
        plane = self.planes.get(node.cluster_id)
        if plane is None:
            self.waiting.setdefault(node.cluster_id, []).append(node)
            return
        stopping = self.restarting.pop(node.key, None)
        if stopping is not None:
            await stopping  # the stop of the kubelet's previous run lands before this run registers
        name = node.hostname
        config = node.config
        # a Node registered before (the kubelet ran earlier) is taken back by kwok: the kubelet runs again
        # status.nodeInfo.kubeletVersion: the version of the kubelet the node runs, its machine config's
        # machine.kubelet.image (Talos v1.13.9 controllers/k8s/kubelet_spec.go:221; kubelet's setters.go:361 VersionInfo)
        await self._blocking(plane.register_node, name, labels=node_labels(config), taints=node_taints(config),
                             addresses=[node.address] if node.address else [],
                             node_info={'osImage': 'Talos (%s)' % node.running_version,
                                        'kubeletVersion': machineconfig.image_version(config.kubelet_image)})
        self.nodes[node.key] = (node.cluster_id, name)
        if config.control_plane:
            if node.address:
                self.control_planes.setdefault(node.cluster_id, {})[node.key] = node.address
                await self._follow(node.cluster_id)
            await self._static_pods(node)
            self._apply_manifests(node.cluster_id, config)

    async def on_config_live(self, node):
        """A config now runs on the node without a reboot (lab/talos/node.py _live_change): its static pods follow the
        images of its cluster section, while its kubelet runs."""
        if node.key in self.nodes and node.config is not None and node.config.control_plane:
            await self._static_pods(node)

    def on_kubelet_restarting(self, node):
        """kubelet alone restarts (a new machine.kubelet.image): Talos's KubeletServiceController stops the kubelet
        service and starts it again on a change of its spec (v1.13.9 controllers/k8s/kubelet_service.go:188-197 Stop,
        :215 Start). kwok lets the Node go until on_kubelet_running registers it again with the new version; the
        static pods keep running. The stop runs as a task, which on_kubelet_running waits for before it registers."""
        if node.key in self.nodes:
            self.restarting[node.key] = asyncio.get_running_loop().create_task(self._kubelet_gone(node.key, restart=True))

    async def _static_pods(self, node):
        """The mirror pods of a control plane's static pods (mirror_pod), as its running kubelet keeps them: one whose
        image differs from the config's is deleted (grace 0, the old uid as precondition) and posted anew
        (k8s.io/kubernetes@v1.36.3 pkg/kubelet/kubelet.go:3472-3503 tryReconcileMirrorPods, mirror_client.go:116-136)."""
        plane = self.planes.get(node.cluster_id)
        config = node.config
        if plane is None or config is None or not config.control_plane:
            return
        name = node.hostname
        for component in STATIC_PODS:
            image = config.component_image(component)
            wanted = mirror_pod(component, name, image, node.address)
            path = '/api/v1/namespaces/kube-system/pods/' + wanted['metadata']['name']
            try:
                old = await self._blocking(plane.api, 'GET', path, expect=(200, 404))
                if old.get('kind') == 'Pod':
                    if [c.get('image') for c in old['spec'].get('containers') or ()] == [image] \
                            and not old['metadata'].get('deletionTimestamp'):
                        continue
                    await self._blocking(plane.api, 'DELETE', path, {'gracePeriodSeconds': 0,
                                                                     'preconditions': {'uid': old['metadata']['uid']}},
                                         expect=(200, 404, 409))
                owner = await self._blocking(plane.api, 'GET', '/api/v1/nodes/' + name)
                wanted['metadata']['ownerReferences'] = [{'apiVersion': 'v1', 'kind': 'Node', 'name': name,
                                                          'uid': owner['metadata']['uid'], 'controller': True}]
                await self._blocking(plane.api, 'POST', '/api/v1/namespaces/kube-system/pods', wanted, expect=(201,))
                LOG.info('node %s: mirror pod %s posted (%s)', name, wanted['metadata']['name'], image)
            except ControlPlaneError as exc:
                LOG.warning('node %s: mirror pod %s not posted: %s', name, wanted['metadata']['name'], exc)

    async def _kubelet_gone(self, key, restart=False):
        """A node's kubelet stopped (Talos reboot, reset or shutdown; VM stop, reset or delete): kwok lets its Node go,
        and kube-controller-manager marks it Unknown when its Lease runs out, as with a real kubelet. restart=True: the
        kubelet service alone restarts; the node's etcd, its static pods (kube-apiserver) and so where the API answers
        and who holds the VIP stay as they are (the VIP follows etcd: Talos v1.13.9 operator/vip.go:154-189)."""
        for waiting in self.waiting.values():
            waiting[:] = [n for n in waiting if n.key != key]
        known = self.nodes.pop(key, None)
        for cluster_id, control_planes in self.control_planes.items():
            if not restart and control_planes.pop(key, None) is not None:
                await self._follow(cluster_id, gone=key)
        plane = self.planes.get(known[0]) if known else None
        if plane is not None:
            try:
                await self._blocking(plane.stop_kubelet, known[1])
            except ControlPlaneError as exc:
                LOG.warning('node %s: kubelet stop not passed on: %s', known[1], exc)

    async def on_kubelet_stopped(self, node):
        await self._kubelet_gone(node.key)

    async def on_node_shutdown(self, node):
        await self._kubelet_gone(node.key)

    # --- faults (the names and targets lab/k8s registers, so the fault matrix can name either world) ------------------

    def fault_crashloop(self, target, workload='kube-system/cilium'):
        from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
        if '/' not in workload:
            raise FaultError('fault k8s-crashloop: workload must be NAMESPACE/DAEMONSET, got %r' % workload)
        self.crashloop[target] = workload
        for plane in self.planes.values():
            try:
                plane.crash_loop(target, workload)
            except ControlPlaneError as exc:
                raise FaultError('fault k8s-crashloop: %s' % exc) from None
        return 'the %s pod on %s crash-loops' % (workload, target)

    def clear_crashloop(self, target):
        self.crashloop.pop(target, None)
        for plane in self.planes.values():
            plane.clear_crash_loop(target)

    async def _each_plane(self, fault, method, *args):
        from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
        for plane in list(self.planes.values()):
            try:
                await self._blocking(getattr(plane, method), *args)
            except ControlPlaneError as exc:
                raise FaultError('fault %s: %s' % (fault, exc)) from None

    async def fault_image_pull(self, target, message=DEFAULT_PULL_ERROR):
        """New pods of the workload cannot pull their image: a MutatingAdmissionPolicy marks them, kwok leaves them
        Pending and the kubelet stand-in reports ErrImagePull, then ImagePullBackOff (lab/k8s_upstream/kubelet.py
        ImagePulls, policies.py)."""
        from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
        try:
            policies.parse_workload(target, 'Deployment, DaemonSet or StatefulSet')
        except ValueError as exc:
            raise FaultError('fault k8s-image-pull: target: %s' % exc) from None
        self.image_pull[target] = message
        await self._each_plane('k8s-image-pull', 'image_pull', target, message)
        return 'new pods of %s cannot pull their image (ImagePullBackOff)' % target

    async def clear_image_pull(self, target):
        self.image_pull.pop(target, None)
        await self._each_plane('k8s-image-pull', 'clear_image_pull', target)

    async def fault_pending(self, target):
        """New pods of the Deployment ask for more cpu than any Node has (a MutatingAdmissionPolicy): the real
        kube-scheduler leaves them Pending, Unschedulable, `Insufficient cpu` (policies.py)."""
        from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
        try:
            policies.parse_workload(target, 'Deployment or StatefulSet')
        except ValueError as exc:
            raise FaultError('fault k8s-pending: target: %s' % exc) from None
        self.pending.add(target)
        await self._each_plane('k8s-pending', 'pending', target)
        return 'new pods of %s stay Pending (Insufficient cpu)' % target

    async def clear_pending(self, target):
        self.pending.discard(target)
        await self._each_plane('k8s-pending', 'clear_pending', target)

    async def fault_flap(self, target=None, period=4.0, mode='refuse'):
        """The API flaps: for the second half of every period kube-apiserver answers on no address (the forwards close,
        their open connections are cut). mode refuse: connections are refused, as when kube-apiserver restarts; mode 503:
        each address is a load balancer with no healthy backend, which completes TLS with kube-apiserver's certificate
        and answers every request 503 (unavailable.py)."""
        from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
        del target
        if period <= 0:
            raise FaultError('fault k8s-api-flap: period must be more than 0 seconds, got %r' % period)
        if mode not in ('refuse', '503'):
            raise FaultError('fault k8s-api-flap: mode must be refuse or 503, got %r' % mode)
        await self.clear_flap()
        self.flap_mode = mode
        self.flap_task = asyncio.get_running_loop().create_task(self._flap_loop(period))
        if mode == '503':
            return 'the API answers 503 (a load balancer with no backend) for the second half of every %.2f s' % period
        return 'the API refuses connections for the second half of every %.2f s' % period

    def _unavailable_answered(self, method, target, user):
        """An UnavailableFront answered 503: the admin user's requests into the request log as source k8s, as
        kube-apiserver's own answers to them are (drain_audit, controlplane.py AUDIT_POLICY), so that a test sees the
        answers its requests got; the lab's own clients (LAB_USER) stay out, as they do there."""
        if user == ADMIN_USER:
            self.world.log_request('k8s', method, target, 503, user=user)

    async def _flap_loop(self, period):
        while True:
            await asyncio.sleep(period / 2)  # the fault's own clock: up for the first half of the period
            # each switch runs to its end even when the fault is cleared during it (clear_flap then switches back)
            await asyncio.shield(self._set_api_down(True))
            await asyncio.sleep(period / 2)
            await asyncio.shield(self._set_api_down(False))

    async def _set_api_down(self, down):
        self.api_down = down
        for cluster_id in list(self.planes):
            await self._follow(cluster_id)

    async def clear_flap(self, target=None):
        del target
        task, self.flap_task = self.flap_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if task is not None or self.api_down:
            # every address back to its forward, after a switch the cancel may have caught half done (_follow holds
            # the lock, so this one runs after it)
            await self._set_api_down(False)
        self.flap_mode = 'refuse'

    def register_faults(self, registry):
        from lab.faults import Param  # pylint: disable=import-outside-toplevel
        registry.register('k8s-crashloop', 'a DaemonSet pod (default: the Cilium agent) crash-loops on one node: CrashLoopBackOff '
                          'as kubelet reports it, not Ready', 'node', self.fault_crashloop, self.clear_crashloop,
                          params=[Param('workload', str, 'kube-system/cilium', 'NAMESPACE/DAEMONSET whose pod crash-loops')])
        registry.register('k8s-pending', 'a Deployment\'s new pods stay Pending: an admission policy makes them ask for more cpu '
                          'than any Node has, and kube-scheduler says PodScheduled=False, Unschedulable, Insufficient cpu; '
                          'cleared, the Pending ones are deleted so the controller makes them anew', 'namespace/deployment',
                          self.fault_pending, self.clear_pending)
        registry.register('k8s-api-flap', 'the Kubernetes API flaps: for the second half of every period kube-apiserver '
                          'answers on no address (connections refused; mode=503: a load balancer with no healthy backend '
                          'answers 503 over TLS)', None, self.fault_flap, self.clear_flap,
                          params=[Param('period', float, 4.0, 'real seconds of one up+down cycle'),
                                  Param('mode', str, 'refuse', 'refuse: connections refused; 503: HTTP 503 Service '
                                        'Unavailable from a load balancer with no backend')])
        registry.register('k8s-image-pull', 'new pods of a Deployment, DaemonSet or StatefulSet cannot pull their image: Pending, '
                          'containers waiting ErrImagePull then ImagePullBackOff (\'Back-off pulling image "IMAGE": '
                          'ErrImagePull: ...\'), as kubelet reports it; running pods keep running; cleared, the waiting pods run',
                          'namespace/workload', self.fault_image_pull, self.clear_image_pull,
                          params=[Param('message', str, DEFAULT_PULL_ERROR, 'the registry error after "ErrImagePull: " '
                                        '({image} is the container\'s image)')])

    def drain_audit(self):
        """Every control plane's audit log into the lab's request log, as source k8s (what lab/k8s logs of each request
        it serves: method, path, status, user): the requests of the cluster's admin user (controlplane.py AUDIT_POLICY)."""
        for plane in list(self.planes.values()):
            for entry in plane.audit_requests():
                self.world.log_request('k8s', entry['method'], entry['path'], entry['status'], user=entry['user'],
                                       verb=entry['verb'])

    async def follow_audit(self, interval=AUDIT_POLL_SECONDS):
        """drain_audit every interval, so that requests.log has the API requests too (a query drains first anyway)."""
        while True:
            self.drain_audit()
            await asyncio.sleep(interval)

    async def close(self):
        await self.clear_flap()
        if self.audit_task is not None:
            self.audit_task.cancel()
            self.audit_task = None
        self.drain_audit()
        for _text, task in self.applying.values():
            task.cancel()
        self.applying.clear()
        self.appliers.clear()
        for task in self.vip_operators.values():
            task.cancel()
        self.vip_operators.clear()
        for forwards in self.forwards.values():
            for address, forward in forwards.items():
                await forward.close()
                self.world.remove_endpoint('k8s-api-%s' % address)
        self.forwards.clear()
        for fronts in self.fronts.values():
            for address, front in fronts.items():
                await front.close()
                self.world.remove_endpoint('k8s-api-%s' % address)
        self.fronts.clear()
        for cluster_id, plane in list(self.planes.items()):
            await self._blocking(plane.stop)
            del self.planes[cluster_id]
        self.nodes.clear()
        self.waiting.clear()
        self.endpoints.clear()
        self.control_planes.clear()
        self.elections.clear()

    async def on_lab_reset(self):
        await self.close()

    async def status(self):
        out = {}
        for cluster_id, plane in self.planes.items():
            out[str(cluster_id)] = {'api': ['%s:%d' % (a, API_PORT) for a in sorted(self.forwards.get(cluster_id, {}))],
                                    'kube-apiserver': plane.api_url, 'kubeconfig': plane.kubeconfig,
                                    'vip': self._vip_status(cluster_id), 'processes': await self._blocking(plane.status)}
        return out

    def _vip_status(self, cluster_id):
        """The endpoint's VIP election: its address and the control plane that holds it (None: nobody)."""
        election = self.elections.get(cluster_id)
        if election is None:
            return None
        return election.status(getattr(getattr(self.world, 'talos', None), 'nodes', {}))


def install(world):
    """Plug the upstream control plane into the World; returns LabUpstreamKubernetes (also world.k8s_upstream)."""
    k8s = world.k8s_upstream = LabUpstreamKubernetes(world)
    if getattr(world, 'talos', None) is None:
        LOG.warning('no Talos simulation in this lab: no cluster will be bootstrapped, so no control plane starts')
    if getattr(world, 'talos', None) is not None:
        # the ManifestController's resources, read over apid's COSI State: Talos's own templates (tools/talos-manifests)
        world.talos.manifests = lambda config: [(m['id'], m['objects']) for m in talos_manifests.render(config.text())['manifests']]
    for source in (getattr(world, 'talos', None), world):
        if source is not None:
            source.add_listener(k8s)
    k8s.register_faults(world.faults)
    world.requests.add_source(k8s.drain_audit)
    world.add_status_section('k8s_upstream', k8s.status)
    world.add_shutdown_hook(k8s.close)
    return k8s
