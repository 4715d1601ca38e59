"""One simulated Kubernetes cluster: store, API server(s) and controllers.

What the rest of the lab calls:

    cluster = KubeCluster(ca_cert_pem, ca_key_pem, timing=..., state_dir=..., request_log=...)
    await cluster.start_api(['127.0.10.10', '127.0.10.11'], port=6443)  # once etcd is bootstrapped
    await cluster.add_api_host('127.0.10.12')                               # a control plane joined
    await cluster.remove_api_host('127.0.10.12')                            # ... went down (last one: API down)
    cluster.kubelet_started(name, ip, control_plane=True, labels=..., taints=...)   # register/refresh the Node
    cluster.kubelet_stopped(name)                                           # node powered off: NotReady (Unknown)
    cluster.fault_crashloop('kube-system/cilium', 'node-1'); cluster.fault_pending('kube-system/cilium-operator')
    cluster.fault_api_flap(period=2.0); cluster.clear_faults()
    await cluster.stop()
"""

from .controllers import Controllers
from .resources import Registry
from .server import ApiServer, Flapping
from .store import Store

SYSTEM_NAMESPACES = ('default', 'kube-system', 'kube-public', 'kube-node-lease')
SYSTEM_PRIORITY_CLASSES = (('system-node-critical', 2000001000, 'Used for system critical pods that must not be moved from their current node.'),
                           ('system-cluster-critical', 2000000000, 'Used for system critical pods that must run in the cluster, but can be '
                            'moved to another node if necessary.'))


class KubeCluster:
    """The Kubernetes side of one lab cluster."""

    def __init__(self, ca_cert_pem, ca_key_pem, timing=None, state_dir=None, request_log=None, clock=None):  # pylint: disable=too-many-arguments
        self.ca_cert_pem = ca_cert_pem
        self.ca_key_pem = ca_key_pem
        self.state_dir = state_dir
        self.request_log = request_log
        self.registry = Registry()
        self.store = Store(self.registry)
        self._seed()
        self.controllers = Controllers(self.store, timing=timing, clock=clock,
                                       ca_pem=ca_cert_pem if isinstance(ca_cert_pem, str) else ca_cert_pem.decode())
        self.server = None
        self._flap = None
        self.service_proxies = {}

    def _seed(self):
        ns_type = self.registry.get('', 'v1', 'namespaces')
        for name in SYSTEM_NAMESPACES:
            self.store.create(ns_type, None, {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': name}}, 'kube-apiserver')
        pc_type = self.registry.get('scheduling.k8s.io', 'v1', 'priorityclasses')
        for name, value, description in SYSTEM_PRIORITY_CLASSES:
            self.store.create(pc_type, None, {'metadata': {'name': name}, 'value': value, 'description': description,
                                              'preemptionPolicy': 'PreemptLowerPriority'}, 'kube-apiserver')
        svc_type = self.registry.get('', 'v1', 'services')
        self.store.create(svc_type, 'default', {'metadata': {'name': 'kubernetes', 'labels': {'component': 'apiserver',
                                                                                              'provider': 'kubernetes'}},
                                                'spec': {'ports': [{'name': 'https', 'port': 443, 'targetPort': 6443}]}}, 'kube-apiserver')

    # --- API endpoints ------------------------------------------------------------------------

    async def start_api(self, hosts, port=6443):
        """Start serving on every host:port (idempotent); returns the ApiServer."""
        if self.server is None:
            self.server = ApiServer(self.store, self.ca_cert_pem, self.ca_key_pem, hosts, port, self.state_dir, self.request_log)
            self.server.service_proxies = self.service_proxies
            await self.server.start()
            if self._flap:
                self.server.flapping = Flapping(*self._flap)
            if not self.controllers.running:
                self.controllers.start()
        else:
            for host in hosts:
                await self.server.add_host(host)
        return self.server

    def register_service_proxy(self, namespace, service, handler):
        """Answer the API's service proxy (…/services/[scheme:]NAME[:port]/proxy/PATH) for one Service, as its pods would.

        handler(method, path, query, body) -> (status, content_type, body bytes); None removes it.
        """
        if handler is None:
            self.service_proxies.pop((namespace, service), None)
        else:
            self.service_proxies[(namespace, service)] = handler
        if self.server is not None:
            self.server.service_proxies = self.service_proxies

    async def add_api_host(self, host):
        if self.server is not None:
            await self.server.add_host(host)

    async def remove_api_host(self, host):
        """A control plane went down: its address stops answering; with no address left the API is down."""
        if self.server is not None:
            await self.server.remove_host(host)
            if not self.server.hosts:
                await self.stop_api()

    async def stop_api(self):
        """The API goes away (every control plane is down); objects and controllers stay, as etcd's data does."""
        if self.server is not None:
            await self.server.stop()
            self.server = None

    @property
    def api_running(self):
        return self.server is not None and self.server.running

    async def stop(self):
        self.controllers.stop()
        if self.server is not None:
            await self.server.stop()
            self.server = None

    # --- nodes --------------------------------------------------------------------------------

    def kubelet_started(self, name, ip, control_plane=False, labels=None, taints=None, kubelet_version='v1.33.1', **info):  # pylint: disable=too-many-arguments
        return self.controllers.nodes.kubelet_started(name, ip, control_plane, labels, taints, kubelet_version, **info)

    def kubelet_stopped(self, name):
        return self.controllers.nodes.kubelet_stopped(name)

    # --- faults -------------------------------------------------------------------------------

    def fault_crashloop(self, workload, node):
        """k8s-crashloop NAMESPACE/DAEMONSET NODE."""
        namespace, dummy, name = workload.partition('/')
        self.controllers.faults.crashloop[(namespace, name, node)] = True
        self.controllers.kick()

    def fault_pending(self, workload):
        """k8s-pending NAMESPACE/DEPLOYMENT."""
        namespace, dummy, name = workload.partition('/')
        self.controllers.faults.pending.add((namespace, name))
        self.controllers.kick()

    def fault_image_pull(self, workload, message):
        """k8s-image-pull NAMESPACE/WORKLOAD: its new pods wait in ImagePullBackOff with this registry error."""
        namespace, dummy, name = workload.partition('/')
        self.controllers.faults.image_pull[(namespace, name)] = message
        self.controllers.kick()

    def fault_api_flap(self, period=2.0, mode='503'):
        """k8s-api-flap: the API answers 503 (or drops connections) for half of every period."""
        if self.server is not None:
            self.server.flapping = Flapping(period, mode)
        self._flap = (period, mode)

    def clear_faults(self, name=None):
        if name in (None, 'k8s-crashloop'):
            self.controllers.faults.crashloop.clear()
        if name in (None, 'k8s-pending'):
            self.controllers.faults.pending.clear()
        if name in (None, 'k8s-image-pull'):
            self.controllers.faults.image_pull.clear()
        if name in (None, 'k8s-api-flap'):
            self._flap = None
            if self.server is not None:
                self.server.flapping = None
        self.controllers.kick()
