"""The Kubernetes simulation plugged into the lab's World (lab/world.py).

`install(world)` (called by the World at start) creates `LabKubernetes`, which

- listens to the Talos fleet (`world.talos`): when etcd is bootstrapped on a cluster it starts
  that cluster's API server, with a serving certificate from the cluster CA in the machine
  config, on the control-plane endpoint host and the bootstrapping node's address, port 6443;
  control planes whose kubelet runs later are added as API addresses; when kubelet runs on a
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

from ..kubelet_hooks import KubeletVmHooks
from ..talos.node import TALOS_VERSION
from .cluster import KubeCluster
from .manifests import ManifestApplier, talos_documents

LOG = logging.getLogger('lab.k8s')
# What containerd reports when the registry does not have the image (a tag that was never pushed, a typo).
DEFAULT_PULL_ERROR = ('failed to pull and unpack image "{image}": failed to resolve reference "{image}": '
                      '{image}: not found')
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
        endpoint = urllib.parse.urlparse(config.endpoint).hostname if config.endpoint else None
        self.endpoints[cluster_id] = endpoint if endpoint and _is_ip(endpoint) else None
        self.control_planes.setdefault(cluster_id, {})[node.key] = node.address
        await self._serve(cluster_id)
        self._apply_manifests(cluster_id, config)

    async def _serve(self, cluster_id):
        """Serve the API on the endpoint and every control plane that is up (start it if it was down)."""
        cluster = self.clusters[cluster_id]
        hosts = [self.endpoints.get(cluster_id)] + sorted(self.control_planes.get(cluster_id, {}).values())
        hosts = [h for i, h in enumerate(hosts) if h and h not in hosts[:i]]
        await cluster.start_api(hosts, API_PORT)
        for host in hosts:
            self.world.add_endpoint('k8s-api-%s' % host, host, API_PORT, 'https')
        for waiting in self.waiting.pop(cluster_id, []):
            await self.on_kubelet_running(waiting)

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
        cluster.kubelet_started(name, node.address, control_plane=control_plane, labels=machine.get('nodeLabels') or {}, taints=taints,
                                disk_gb=max(1, int(getattr(node, 'disk_size', 32 * 1024 ** 3) // 1024 ** 3)),
                                os_image='Talos (%s)' % TALOS_VERSION)
        if control_plane and node.address:
            self.control_planes.setdefault(node.cluster_id, {})[node.key] = node.address
            await self._serve(node.cluster_id)
            self._apply_manifests(node.cluster_id, config)

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
            if address != self.endpoints.get(cluster_id):
                self.world.remove_endpoint('k8s-api-%s' % address)
            await cluster.remove_api_host(address)
            if not self.control_planes[cluster_id]:
                await cluster.stop_api()
                self.world.remove_endpoint('k8s-api-%s' % self.endpoints.get(cluster_id))
                LOG.info('cluster %s: every control plane is down; the API is down', cluster_id)

    async def on_lab_reset(self):
        await self.close()
        self.clusters = {}
        self.nodes = {}
        self.waiting = {}
        self.appliers = {}
        self.endpoints = {}
        self.control_planes = {}

    async def on_lab_stop(self):
        await self.close()

    async def close(self):
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
                                    'crds': store.count(('apiextensions.k8s.io', 'customresourcedefinitions'))}
        return out


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
    else:
        LOG.warning('no Talos simulation in this lab: the Kubernetes API starts only through LabKubernetes directly')
    world.add_listener(k8s)
    k8s.register_faults(world.faults)
    world.add_status_section('k8s', k8s.status)
    world.add_shutdown_hook(k8s.close)
    world.k8s = k8s
    return k8s
