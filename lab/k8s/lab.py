"""The Kubernetes simulation plugged into the lab's World (lab/world.py).

`install(world)` (called by the World at start) creates `LabKubernetes`, which

- listens to the Talos fleet (`world.talos`): when etcd is bootstrapped on a cluster it starts
  that cluster's API server, with a serving certificate from the cluster CA in the machine
  config, on the bootstrapping node's address, port 6443; control planes whose kubelet runs later
  are added as API addresses; the control-plane endpoint host answers only while a control plane
  whose API is up holds it as its Talos layer-2 VIP (lab/talos/vip.py: its config names the VIP on
  a link, its etcd is healthy, it leads the election; a config without the VIP leaves the endpoint
  unanswered, as on real hardware), or when it is a control plane's own address; when kubelet runs on a
  node its Node registers (control-plane role and taint, machine.nodeLabels/nodeTaints);
  a node shut down or a VM powered off / reset / deleted stops its kubelet (Node NotReady);
- registers the Kubernetes faults, the `k8s` status section, the delay kinds it uses and the
  request log source `k8s`.

Faults:
    k8s-crashloop NODE [workload=kube-system/cilium]  the DaemonSet's pod on NODE crash-loops (CrashLoopBackOff)
    k8s-pending NAMESPACE/DEPLOYMENT                 the Deployment's pods stay Pending (scheduler: Insufficient cpu)
    k8s-api-flap [period=4.0] [mode=503]             the API answers 503 (mode=refuse: drops connections) half of each period
    k8s-image-pull NAMESPACE/WORKLOAD [message=...]  new pods of the Deployment/DaemonSet/StatefulSet cannot pull their image
                                                     (ImagePullBackOff); pods that run already keep running
"""

import asyncio
import logging
import os
import urllib.parse

from ..kubelet_hooks import DEFAULT_PULL_ERROR, KubeletVmHooks
from ..talos import machineconfig
from ..talos.static_pods import STATIC_PODS, mirror_pod
from ..talos import vip as talos_vip
from .cluster import KubeCluster
from .manifests import ManifestApplier, manifests_by_id, talos_documents

LOG = logging.getLogger('lab.k8s')
API_PORT = 6443
DELAY_KINDS = {
    'crashloop_restart': (10.0, 'a crash-looping container restarting again (CrashLoopBackOff)'),
}


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


class LabKubernetes(KubeletVmHooks):
    """Every Kubernetes cluster of the lab, keyed by Talos cluster id."""

    def __init__(self, world):
        self.world = world
        self.clusters = {}
        self.nodes = {}            # talos node key -> (cluster id, node name)
        self.waiting = {}          # cluster id -> [talos nodes whose kubelet runs before the API]
        self.appliers = {}         # cluster id -> ManifestApplier (Talos' manifest controller)
        self.endpoints = {}        # cluster id -> control-plane endpoint host
        self.control_planes = {}   # cluster id -> {talos node key: address} of control planes that are up
        self.elections = {}        # cluster id -> the talos_vip.Election of its endpoint host
        self.vip_operators = {}    # cluster id -> the task that moves the endpoint with the election (_vip_operator)
        self.crashloop = {}        # node -> workload
        self.pending = set()
        self.image_pull = {}       # (namespace, workload) -> the registry's error
        self.flap = None
        for kind, (realistic, description) in DELAY_KINDS.items():
            if kind not in world.timing.kinds:
                world.timing.register(kind, realistic, description)

    # --- logging -------------------------------------------------------------------------------

    def _log(self, entry):
        self.world.log_request('k8s', entry['method'], entry['path'], entry['status'], user=entry.get('user'), ms=entry.get('ms'))

    # --- Talos fleet listener -----------------------------------------------------------------

    async def on_etcd_bootstrapped(self, cluster_id, node):
        config = node.config
        ca_crt, ca_key = config.k8s_ca
        if not ca_crt or not ca_key:
            LOG.warning('cluster %s: no Kubernetes CA in the machine config; no API server', cluster_id)
            return
        cluster = self.clusters.get(cluster_id)
        if cluster is None:
            cluster = KubeCluster(_text(ca_crt), _text(ca_key), timing=self.world.timing,
                                  state_dir=os.path.join(self.world.run_dir, 'k8s', str(cluster_id)[:12] or 'cluster'),
                                  request_log=self._log)
            self.clusters[cluster_id] = cluster
            self._apply_faults(cluster)
            if getattr(self.world, 'talos', None) is not None:
                self.vip_operators[cluster_id] = asyncio.ensure_future(self._vip_operator(cluster_id))
        endpoint = urllib.parse.urlparse(config.endpoint).hostname if config.endpoint else None
        self.endpoints[cluster_id] = endpoint if endpoint and _is_ip(endpoint) else None
        self.control_planes.setdefault(cluster_id, {})[node.key] = node.address
        await self._serve(cluster_id)
        self._apply_manifests(cluster_id, config)

    def _vip_host(self, cluster_id, gone=None):
        """The endpoint host if a control plane whose API is up holds it as its VIP now, else None.

        The election runs again on every event of the cluster's control planes (lab/talos/vip.py);
        gone: the key of a node going down (its services may still show Running at that moment).
        """
        endpoint = self.endpoints.get(cluster_id)
        if not endpoint:
            return None
        election = self.elections.get(cluster_id)
        if election is None or election.address != endpoint:
            election = self.elections[cluster_id] = talos_vip.Election(endpoint)
        talos = getattr(self.world, 'talos', None)
        nodes = dict(talos.nodes) if talos is not None else {}
        candidates = dict((key, key != gone and election.campaigning(key, node) and endpoint in talos_vip.layer2_vips(node.config))
                          for key, node in nodes.items() if node.cluster_id == cluster_id)
        leader = election.update(candidates)
        # the VIP is on the leader's link whether its kube-apiserver runs or not; the API answers there only when it does
        return endpoint if leader is not None and leader in self.control_planes.get(cluster_id, {}) else None

    async def _serve(self, cluster_id):
        """Serve the API on every control plane that is up and on the VIP if one holds it (start it if it was down)."""
        cluster = self.clusters[cluster_id]
        hosts = [self._vip_host(cluster_id)] + sorted(self.control_planes.get(cluster_id, {}).values())
        hosts = [h for i, h in enumerate(hosts) if h and h not in hosts[:i]]
        await cluster.start_api(hosts, API_PORT)
        for host in hosts:
            self.world.add_endpoint('k8s-api-%s' % host, host, API_PORT, 'https')
        for waiting in self.waiting.pop(cluster_id, []):
            await self.on_kubelet_running(waiting)

    def _vip_change(self, cluster_id, gone=None):
        """'add' or 'remove' when the endpoint's serving does not match the VIP's election, else None."""
        cluster = self.clusters.get(cluster_id)
        endpoint = self.endpoints.get(cluster_id)
        if cluster is None or not endpoint or endpoint in self.control_planes.get(cluster_id, {}).values():
            return None
        held = self._vip_host(cluster_id, gone=gone)
        served = cluster.server is not None and endpoint in cluster.server.hosts
        if held and not served and cluster.api_running:
            return 'add'
        if not held and served:
            return 'remove'
        return None

    async def _vip_operator(self, cluster_id):
        """Talos' VIP operator, for the cluster's endpoint: the election runs again whenever the simulation changes
        (a config applied with or without the VIP, etcd's health, a node up or down), as Talos' controllers react to
        their resources (operator_vip_config.go:73-176, operator/vip.go:191-310), and the endpoint follows it."""
        talos = self.world.talos
        while True:
            await talos.wait_for(lambda: self._vip_change(cluster_id) is not None)
            await self._follow_vip(cluster_id)

    async def _follow_vip(self, cluster_id, gone=None):
        """The endpoint answers where the VIP's leader is, or nowhere."""
        change = self._vip_change(cluster_id, gone=gone)
        cluster = self.clusters.get(cluster_id)
        endpoint = self.endpoints.get(cluster_id)
        if change == 'add':
            await cluster.add_api_host(endpoint)
            self.world.add_endpoint('k8s-api-%s' % endpoint, endpoint, API_PORT, 'https')
        elif change == 'remove':
            self.world.remove_endpoint('k8s-api-%s' % endpoint)
            await cluster.remove_api_host(endpoint)
            LOG.info('cluster %s: no control plane holds the VIP %s; the endpoint does not answer', cluster_id, endpoint)

    async def on_kubelet_running(self, node):
        cluster = self.clusters.get(node.cluster_id)
        if cluster is not None and not cluster.api_running and node.config.control_plane and node.address:
            # a control plane of a bootstrapped cluster is back (etcd has its data): the API comes back with it
            self.control_planes.setdefault(node.cluster_id, {})[node.key] = node.address
            await self._serve(node.cluster_id)
        if cluster is None or not cluster.api_running:
            self.waiting.setdefault(node.cluster_id, []).append(node)
            return
        config = node.config
        machine = config.machine
        control_plane = config.control_plane
        taints = [{'key': k, 'value': v.split(':', 1)[0], 'effect': v.split(':', 1)[1] if ':' in v else 'NoSchedule'}
                  for k, v in (machine.get('nodeTaints') or {}).items()]
        if control_plane and not config.cluster.get('allowSchedulingOnControlPlanes'):
            taints.insert(0, {'key': 'node-role.kubernetes.io/control-plane', 'effect': 'NoSchedule'})
        if (config.cluster.get('externalCloudProvider') or {}).get('enabled'):
            taints.append({'key': 'node.cloudprovider.kubernetes.io/uninitialized', 'value': 'true', 'effect': 'NoSchedule'})
        name = node.hostname
        self.nodes[node.key] = (node.cluster_id, name)
        # the kubelet reports the OS image of the Talos it runs on, as the Talos API does (Version)
        # status.nodeInfo.kubeletVersion: the version of the kubelet image the node runs (machine.kubelet.image)
        cluster.kubelet_started(name, node.address, control_plane=control_plane, labels=machine.get('nodeLabels') or {}, taints=taints,
                                kubelet_version=machineconfig.image_version(config.kubelet_image),
                                disk_gb=max(1, int(getattr(node, 'disk_size', 32 * 1024 ** 3) // 1024 ** 3)),
                                os_image='Talos (%s)' % node.running_version)
        self._static_pods(node)
        if control_plane and node.address:
            self.control_planes.setdefault(node.cluster_id, {})[node.key] = node.address
            await self._serve(node.cluster_id)
            self._apply_manifests(node.cluster_id, config)

    def on_config_live(self, node):
        """A config now runs on the node without a reboot: its static pods follow their images."""
        self._static_pods(node)

    def _static_pods(self, node):
        """The mirror pods of a control plane's static pods, as its kubelet posts them while it runs.

        siderolabs/talos v1.13.9 internal/app/machined/pkg/controllers/k8s/control_plane_static_pod.go renders
        kube-apiserver (:344-485), kube-controller-manager (:569-670) and kube-scheduler (:749-865) as static pods in
        kube-system with labels tier=control-plane and k8s-app=<component>, the image of the component's config
        (cluster.<component>.image) and hostNetwork; the kubelet posts a mirror pod `<pod>-<node>` for each
        (annotation kubernetes.io/config.mirror). A new image is a new static pod: the kubelet replaces the mirror
        pod (a new uid), which turns Ready as any pod does here. The lab keeps the pods' other fields out.
        """
        cluster = self.clusters.get(node.cluster_id)
        config = node.config
        if cluster is None or not cluster.api_running or config is None or not config.control_plane:
            return
        name = node.hostname
        if name not in cluster.controllers.nodes.running:
            return
        rtype = cluster.controllers.rtype('', 'pods')
        for component in STATIC_PODS:
            image = config.component_image(component)
            pod_name = '%s-%s' % (component, name)
            old = cluster.store.peek(('', 'pods'), 'kube-system', pod_name)
            if old is not None and [c.get('image') for c in old['spec'].get('containers') or ()] == [image]:
                continue
            if old is not None:
                cluster.store.internal_delete(rtype, old)
            pod = mirror_pod(component, name, image, node.address)
            pod['status']['phase'] = 'Pending'
            cluster.store.internal_create(rtype, pod)
        cluster.controllers.kick()

    def _apply_manifests(self, cluster_id, config):
        """Talos' manifest controller on a control plane: CoreDNS, kube-proxy, inline manifests."""
        cluster = self.clusters[cluster_id]
        if cluster_id not in self.appliers:
            applier = self.appliers[cluster_id] = ManifestApplier(cluster.store)

            def on_event(event):
                # after the write that served a new kind has been delivered to every watcher
                if event.key == ('apiextensions.k8s.io', 'customresourcedefinitions') and applier.waiting:
                    asyncio.get_running_loop().call_soon(applier.retry)
            cluster.store.subscribe(on_event)
        waiting = self.appliers[cluster_id].apply(talos_documents(config))
        if waiting:
            LOG.info('cluster %s: %d Talos manifest document(s) wait for their kind to be served', cluster_id, waiting)

    async def on_node_shutdown(self, node):
        await self._kubelet_gone(node.key)

    def on_kubelet_restarting(self, node):
        """kubelet alone restarts (a new kubelet image): the Node stops posting status until kubelet runs again; the
        static pods it started (kube-apiserver...) keep running, so the API keeps its addresses."""
        known = self.nodes.get(node.key)
        cluster = self.clusters.get(known[0]) if known is not None else None
        if cluster is not None:
            cluster.kubelet_stopped(known[1])

    async def on_kubelet_stopped(self, node):
        """A Talos reboot, reset or shutdown took kubelet down: the Node goes NotReady until kubelet runs again."""
        await self._kubelet_gone(node.key)

    # --- World VM listener ----------------------------------------------------------------------

    async def _kubelet_gone(self, key):
        """A node went down: its Node goes NotReady; a control plane also takes its API address with it."""
        for waiting in self.waiting.values():
            waiting[:] = [n for n in waiting if n.key != key]
        known = self.nodes.get(key)
        cluster_id = known[0] if known is not None else next((c for c, cps in self.control_planes.items() if key in cps), None)
        cluster = self.clusters.get(cluster_id)
        if cluster is None:
            return
        if known is not None:
            cluster.kubelet_stopped(known[1])
        address = self.control_planes.get(cluster_id, {}).pop(key, None)
        if address is not None:
            self.world.remove_endpoint('k8s-api-%s' % address)
            await cluster.remove_api_host(address)
            if not self.control_planes[cluster_id]:
                await cluster.stop_api()
                self.world.remove_endpoint('k8s-api-%s' % self.endpoints.get(cluster_id))
                LOG.info('cluster %s: every control plane is down; the API is down', cluster_id)
        await self._follow_vip(cluster_id, gone=key)

    async def on_lab_reset(self):
        await self.close()
        self.clusters = {}
        self.nodes = {}
        self.waiting = {}
        self.appliers = {}
        self.endpoints = {}
        self.control_planes = {}
        self.elections = {}

    async def on_lab_stop(self):
        await self.close()

    async def close(self):
        for task in self.vip_operators.values():
            task.cancel()
        self.vip_operators = {}
        for cluster in self.clusters.values():
            await cluster.stop()
        for name in [n for n in list(getattr(self.world, '_endpoints', {})) if n.startswith('k8s-api-')]:
            self.world.remove_endpoint(name)

    # --- faults ---------------------------------------------------------------------------------

    def _apply_faults(self, cluster):
        cluster.controllers.faults.crashloop.clear()
        for node, workload in self.crashloop.items():
            namespace, dummy, name = workload.partition('/')
            cluster.controllers.faults.crashloop[(namespace, name, node)] = True
        cluster.controllers.faults.pending.clear()
        cluster.controllers.faults.pending.update(self.pending)
        cluster.controllers.faults.image_pull.clear()
        cluster.controllers.faults.image_pull.update(self.image_pull)
        if self.flap:
            cluster.fault_api_flap(*self.flap)
        else:
            cluster.clear_faults('k8s-api-flap')
        cluster.controllers.kick()

    def _all(self):
        for cluster in self.clusters.values():
            self._apply_faults(cluster)

    def fault_crashloop(self, target, workload='kube-system/cilium'):
        from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
        if '/' not in workload:
            raise FaultError('fault k8s-crashloop: workload must be NAMESPACE/DAEMONSET, got %r' % workload)
        self.crashloop[target] = workload
        self._all()
        return 'the %s pod on %s crash-loops' % (workload, target)

    def clear_crashloop(self, target):
        self.crashloop.pop(target, None)
        self._all()

    def fault_pending(self, target):
        from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
        namespace, dummy, name = (target or '').partition('/')
        if not namespace or not name:
            raise FaultError('fault k8s-pending: target must be NAMESPACE/DEPLOYMENT, got %r' % target)
        self.pending.add((namespace, name))
        self._all()
        return 'pods of deployment %s stay Pending' % target

    def clear_pending(self, target):
        namespace, dummy, name = (target or '').partition('/')
        self.pending.discard((namespace, name))
        self._all()

    def fault_image_pull(self, target, message=DEFAULT_PULL_ERROR):
        from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
        namespace, dummy, name = (target or '').partition('/')
        if not namespace or not name or '/' in name:
            raise FaultError('fault k8s-image-pull: target must be NAMESPACE/WORKLOAD (a Deployment, DaemonSet or StatefulSet), '
                             'got %r' % target)
        self.image_pull[(namespace, name)] = message
        self._all()
        return 'new pods of %s cannot pull their image (ImagePullBackOff)' % target

    def clear_image_pull(self, target):
        namespace, dummy, name = (target or '').partition('/')
        self.image_pull.pop((namespace, name), None)
        self._all()

    def fault_flap(self, target=None, period=4.0, mode='503'):
        from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
        del target
        if period <= 0:
            raise FaultError('fault k8s-api-flap: period must be more than 0 seconds, got %r' % period)
        if mode not in ('503', 'refuse'):
            raise FaultError('fault k8s-api-flap: mode must be 503 or refuse, got %r' % mode)
        self.flap = (period, mode)
        self._all()
        return 'the API is down for the second half of every %.2f s (%s)' % (period, mode)

    def clear_flap(self, target=None):
        del target
        self.flap = None
        self._all()

    def register_faults(self, registry):
        from lab.faults import Param  # pylint: disable=import-outside-toplevel
        registry.register('k8s-crashloop', 'a DaemonSet pod (default: the Cilium agent) crash-loops on one node: CrashLoopBackOff, '
                          'restarts counting, not Ready', 'node', self.fault_crashloop, self.clear_crashloop,
                          params=[Param('workload', str, 'kube-system/cilium', 'NAMESPACE/DAEMONSET whose pod crash-loops')])
        registry.register('k8s-pending', 'a Deployment\'s pods stay Pending (PodScheduled=False, Unschedulable: Insufficient cpu)',
                          'namespace/deployment', self.fault_pending, self.clear_pending)
        registry.register('k8s-api-flap', 'the Kubernetes API server flaps: down for the second half of every period',
                          None, self.fault_flap, self.clear_flap,
                          params=[Param('period', float, 4.0, 'real seconds of one up+down cycle'),
                                  Param('mode', str, '503', '503: answer 503 ServiceUnavailable; refuse: drop the connection')])
        registry.register('k8s-image-pull', 'new pods of a Deployment, DaemonSet or StatefulSet cannot pull their image: containers '
                          'wait in ImagePullBackOff (\'Back-off pulling image "IMAGE": ErrImagePull: ...\'); running pods keep running',
                          'namespace/workload', self.fault_image_pull, self.clear_image_pull,
                          params=[Param('message', str, DEFAULT_PULL_ERROR, 'the registry error after "ErrImagePull: " '
                                        '({image} is the container\'s image)')])

    # --- status ---------------------------------------------------------------------------------

    def status(self):
        out = {}
        for cluster_id, cluster in self.clusters.items():
            store = cluster.store
            nodes = []
            for node in store.items(('', 'nodes')):
                ready = next((c for c in node['status'].get('conditions') or () if c.get('type') == 'Ready'), {})
                nodes.append({'name': node['metadata']['name'], 'ready': ready.get('status'), 'reason': ready.get('reason')})
            workloads = []
            for key, kind in ((('apps', 'deployments'), 'Deployment'), (('apps', 'daemonsets'), 'DaemonSet'),
                              (('apps', 'statefulsets'), 'StatefulSet')):
                for obj in store.items(key):
                    status = obj.get('status') or {}
                    desired = status.get('desiredNumberScheduled', (obj.get('spec') or {}).get('replicas', 0))
                    ready = status.get('numberReady', status.get('readyReplicas', 0))
                    workloads.append({'kind': kind, 'namespace': obj['metadata']['namespace'], 'name': obj['metadata']['name'],
                                      'ready': '%d/%d' % (ready or 0, desired or 0)})
            out[str(cluster_id)] = {'api': ['%s:%d' % (h, API_PORT) for h in (cluster.server.hosts if cluster.server else [])],
                                    'resourceVersion': store.rv, 'nodes': sorted(nodes, key=lambda n: n['name']),
                                    'workloads': workloads, 'pods': store.count(('', 'pods')),
                                    'crds': store.count(('apiextensions.k8s.io', 'customresourcedefinitions')),
                                    'vip': self._vip_status(cluster_id)}
        return out

    def _vip_status(self, cluster_id):
        """The endpoint's VIP election: its address and the control plane that holds it (None: nobody)."""
        election = self.elections.get(cluster_id)
        if election is None:
            return None
        return election.status(getattr(getattr(self.world, 'talos', None), 'nodes', {}))


def _is_ip(host):
    import ipaddress  # pylint: disable=import-outside-toplevel
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def install(world):
    """Plug the Kubernetes simulation into the World; returns LabKubernetes (also world.k8s)."""
    k8s = LabKubernetes(world)
    talos = getattr(world, 'talos', None)
    if talos is not None:
        talos.add_listener(k8s)
        talos.manifests = manifests_by_id   # the ManifestController's resources, read over apid's COSI State
    else:
        LOG.warning('no Talos simulation in this lab: the Kubernetes API starts only through LabKubernetes directly')
    world.add_listener(k8s)
    k8s.register_faults(world.faults)
    world.add_status_section('k8s', k8s.status)
    world.add_shutdown_hook(k8s.close)
    world.k8s = k8s
    return k8s
