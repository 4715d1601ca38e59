"""The upstream control plane in the lab's World, opt-in: `python -m lab up --extensions talos,k8s_upstream`.

Not the default yet (the default `lab.k8s` stays until the integration tests, Molecule and the Flux simulation run on
this one): with it, a lab cluster's Kubernetes is etcd + kube-apiserver + kube-controller-manager + kube-scheduler
(lab/k8s_upstream/controlplane.py) and each node's kubelet is a kwok-managed Node.

- etcd bootstrapped on a cluster (the Talos fleet's on_etcd_bootstrapped): its control plane starts, with the cluster
  CA of the machine config (so the kubeconfig the Talos Kubeconfig RPC returns is trusted as is), the admission
  configuration of `cluster.apiServer.admissionControl`, the pod and service subnets of `cluster.network`;
  kube-apiserver listens on the control-plane endpoint host, port 6443. (Only there: kube-apiserver binds one
  address, and the lab's nets share the port; the node addresses are in its certificate.)
- a kubelet runs (on_kubelet_running): its Node registers with the Talos hostname, the node address, and the labels
  and taints Talos gives it; a kubelet that stops (Talos reboot, reset, shutdown; VM stop, reset, delete) is let go by
  kwok, so kube-controller-manager's node lifecycle controller marks its Node Unknown when its Lease runs out.
- `lab status` shows, per cluster, each process with its pid and health; the lab stopping stops them.
Not yet: faults, the manifests Talos applies (CoreDNS, kube-proxy, inline
manifests), the Flux simulation (which works on lab/k8s's store).
"""

import asyncio
import logging
import os
import urllib.parse

from ..kubelet_hooks import KubeletVmHooks
from .controlplane import DEFAULT_POD_SUBNET, DEFAULT_SERVICE_SUBNET, ControlPlane, ControlPlaneError, _is_ip

LOG = logging.getLogger('lab.k8s_upstream')
API_PORT = 6443
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
                             ca=(_text(ca_crt), _text(ca_key)), api_host=endpoint, api_port=API_PORT,
                             api_sans=[node.address] + list(config.cert_sans or []))
        try:
            await self._blocking(plane.start)
        except ControlPlaneError as exc:
            LOG.error('cluster %s: the upstream control plane did not start: %s', cluster_id, exc)
            return
        self.planes[cluster_id] = plane
        self.world.add_endpoint('k8s-api-%s' % endpoint, endpoint, API_PORT, 'https')
        for waiting in self.waiting.pop(cluster_id, []):
            await self.on_kubelet_running(waiting)
        for listener in self.plane_listeners:
            await listener(cluster_id, plane)

    async def on_kubelet_running(self, node):
        plane = self.planes.get(node.cluster_id)
        if plane is None:
            self.waiting.setdefault(node.cluster_id, []).append(node)
            return
        name = node.hostname
        config = node.config
        # a Node registered before (the kubelet ran earlier) is taken back by kwok: the kubelet runs again
        await self._blocking(plane.register_node, name, labels=node_labels(config), taints=node_taints(config),
                             addresses=[node.address] if node.address else [],
                             node_info={'osImage': 'Talos (%s)' % node.running_version})
        self.nodes[node.key] = (node.cluster_id, name)

    async def _kubelet_gone(self, key):
        """A node's kubelet stopped (Talos reboot, reset or shutdown; VM stop, reset or delete): kwok lets its Node go,
        and kube-controller-manager marks it Unknown when its Lease runs out, as with a real kubelet."""
        for waiting in self.waiting.values():
            waiting[:] = [n for n in waiting if n.key != key]
        known = self.nodes.pop(key, None)
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

    async def close(self):
        for cluster_id, plane in list(self.planes.items()):
            await self._blocking(plane.stop)
            self.world.remove_endpoint('k8s-api-%s' % plane.api_host)
            del self.planes[cluster_id]
        self.nodes.clear()
        self.waiting.clear()

    async def on_lab_reset(self):
        await self.close()

    async def status(self):
        out = {}
        for cluster_id, plane in self.planes.items():
            out[str(cluster_id)] = {'api': plane.api_url, 'kubeconfig': plane.kubeconfig,
                                    'processes': await self._blocking(plane.status)}
        return out


def install(world):
    """Plug the upstream control plane into the World; returns LabUpstreamKubernetes (also world.k8s_upstream)."""
    k8s = world.k8s_upstream = LabUpstreamKubernetes(world)
    if getattr(world, 'talos', None) is None:
        LOG.warning('no Talos simulation in this lab: no cluster will be bootstrapped, so no control plane starts')
    for source in (getattr(world, 'talos', None), world):
        if source is not None:
            source.add_listener(k8s)
    world.add_status_section('k8s_upstream', k8s.status)
    world.add_shutdown_hook(k8s.close)
    return k8s
