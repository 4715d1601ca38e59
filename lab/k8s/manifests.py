"""What Talos' manifest controller applies once the API is up, and what Cilium registers.

- Talos bootstrap manifests: CoreDNS (Deployment `coredns`, 2 replicas, `k8s-app=kube-dns`,
  Service `kube-dns` 10.96.0.10) unless `cluster.coreDNS.disabled`, kube-proxy (DaemonSet
  `kube-proxy`, hostNetwork) unless `cluster.proxy.disabled`, and every
  `cluster.inlineManifests[].contents` document, all with server-side apply as field manager
  `talos`. Documents whose kind is not served yet (a custom resource before its CRD) are kept
  and applied again when the served kinds change. `extraManifests` (URLs) cannot be fetched in
  the lab and are reported in the log.
- The images follow the config as Talos renders them (siderolabs/talos v1.13.9
  internal/app/machined/pkg/controllers/k8s/control_plane.go:346-350: ProxyImage from
  cluster.proxy.image, CoreDNSImage from cluster.coreDNS.image, into k8stemplates/kube-proxy.go:59 and
  coredns.go:292); a config without them gets Talos' defaults (pkg/machinery/config/types/v1alpha1/
  v1alpha1_proxyconfig.go:25: registry.k8s.io/kube-proxy:v<the release's default Kubernetes>, which
  `talosctl gen config` replaces with the config's Kubernetes version, config/generate/init.go:157).
- Talos creates what is missing and never updates (manifest_apply.go:335-346): an object that exists is
  left as it is, so a new config's images reach an existing kube-proxy or CoreDNS only through the sync
  that ends `talosctl upgrade-k8s` (pkg/cluster/kubernetes/talos_managed.go:163-165). What it creates
  carries the annotation config.k8s.io/owning-inventory: talos-bootstrap-manifests-inventory
  (manifest_apply.go:353-368).
- Cilium: once an agent is Ready the CRD `ciliumnodes.cilium.io` exists and each node with a
  Ready agent has its CiliumNode (the agent creates it in the real thing).
"""

import copy
import logging

import yaml

from .errors import ApiError
from .resources import CRD_KEY

LOG = logging.getLogger('lab.k8s')
MANAGER = 'talos'
INVENTORY_ANNOTATION = 'config.k8s.io/owning-inventory'
INVENTORY_NAME = 'talos-bootstrap-manifests-inventory'
# the defaults of a config without the images: v1alpha1_proxyconfig.go:25 (DefaultKubernetesVersion 1.36.3,
# pkg/machinery/constants/constants.go:366), and the CoreDNS image the lab has always shown
DEFAULT_PROXY_IMAGE = 'registry.k8s.io/kube-proxy:v1.36.3'
DEFAULT_COREDNS_IMAGE = 'registry.k8s.io/coredns/coredns:v1.12.1'

COREDNS = [
    {'apiVersion': 'v1', 'kind': 'ServiceAccount', 'metadata': {'name': 'coredns', 'namespace': 'kube-system'}},
    {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'coredns', 'namespace': 'kube-system'},
     'data': {'Corefile': '.:53 {\n    errors\n    health\n    ready\n    kubernetes cluster.local in-addr.arpa ip6.arpa\n'
                          '    forward . /etc/resolv.conf\n    cache 30\n    loop\n    reload\n}\n'}},
    {'apiVersion': 'apps/v1', 'kind': 'Deployment',
     'metadata': {'name': 'coredns', 'namespace': 'kube-system', 'labels': {'k8s-app': 'kube-dns', 'kubernetes.io/name': 'CoreDNS'}},
     'spec': {'replicas': 2, 'selector': {'matchLabels': {'k8s-app': 'kube-dns'}},
              'strategy': {'type': 'RollingUpdate', 'rollingUpdate': {'maxUnavailable': 1}},
              'template': {'metadata': {'labels': {'k8s-app': 'kube-dns'}},
                           'spec': {'serviceAccountName': 'coredns', 'priorityClassName': 'system-cluster-critical',
                                    'tolerations': [{'key': 'node-role.kubernetes.io/control-plane', 'operator': 'Exists',
                                                     'effect': 'NoSchedule'}],
                                    'containers': [{'name': 'coredns', 'image': 'registry.k8s.io/coredns/coredns:v1.12.1',
                                                    'args': ['-conf', '/etc/coredns/Corefile'],
                                                    'ports': [{'name': 'dns', 'containerPort': 53, 'protocol': 'UDP'},
                                                              {'name': 'dns-tcp', 'containerPort': 53, 'protocol': 'TCP'}]}]}}}},
    {'apiVersion': 'v1', 'kind': 'Service',
     'metadata': {'name': 'kube-dns', 'namespace': 'kube-system', 'labels': {'k8s-app': 'kube-dns'}},
     'spec': {'clusterIP': '10.96.0.10', 'selector': {'k8s-app': 'kube-dns'},
              'ports': [{'name': 'dns', 'port': 53, 'protocol': 'UDP'}, {'name': 'dns-tcp', 'port': 53, 'protocol': 'TCP'}]}},
]
KUBE_PROXY = [
    {'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
     'metadata': {'name': 'kube-proxy', 'namespace': 'kube-system', 'labels': {'k8s-app': 'kube-proxy', 'tier': 'node'}},
     'spec': {'selector': {'matchLabels': {'k8s-app': 'kube-proxy'}},
              'template': {'metadata': {'labels': {'k8s-app': 'kube-proxy', 'tier': 'node'}},
                           'spec': {'hostNetwork': True, 'priorityClassName': 'system-node-critical',
                                    'tolerations': [{'operator': 'Exists'}],
                                    'containers': [{'name': 'kube-proxy', 'image': DEFAULT_PROXY_IMAGE}]}}}},
]
CILIUM_NODE_CRD = {
    'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
    'metadata': {'name': 'ciliumnodes.cilium.io', 'labels': {'io.cilium.k8s.crd.schema.version': '1.31.0'}},
    'spec': {'group': 'cilium.io', 'scope': 'Cluster',
             'names': {'kind': 'CiliumNode', 'listKind': 'CiliumNodeList', 'plural': 'ciliumnodes', 'singular': 'ciliumnode',
                       'shortNames': ['cn', 'ciliumn'], 'categories': ['cilium']},
             'versions': [{'name': 'v2', 'served': True, 'storage': True,
                           'additionalPrinterColumns': [{'name': 'CiliumInternalIP', 'type': 'string',
                                                         'jsonPath': '.spec.addresses[?(@.type=="CiliumInternalIP")].ip'},
                                                        {'name': 'InternalIP', 'type': 'string',
                                                         'jsonPath': '.spec.addresses[?(@.type=="InternalIP")].ip'}],
                           'schema': {'openAPIV3Schema': {'type': 'object', 'required': ['metadata', 'spec'], 'properties': {
                               'spec': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True},
                               'status': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}}}}}]}}


def _with_image(documents, kind, container, image):
    out = copy.deepcopy(documents)
    for doc in out:
        if doc['kind'] == kind:
            for entry in doc['spec']['template']['spec']['containers']:
                if entry['name'] == container:
                    entry['image'] = image
    return out


def manifests_by_id(config):
    """The Manifest resources Talos' ManifestController renders from a control plane's config, as [(id, documents)]:
    kube-proxy as `10-kube-proxy`, CoreDNS as `11-core-dns`, each inline manifest as `99-<name>` (siderolabs/talos
    v1.13.9 internal/app/machined/pkg/controllers/k8s/manifest.go:148-255, control_plane.go:392-437). Lab difference:
    the bootstrap token Secret and the RBAC manifests (`00-`..`05-`) are not rendered by this world."""
    cluster = config.cluster
    out = []
    proxy = cluster.get('proxy') or {}
    if not proxy.get('disabled'):
        out.append(('10-kube-proxy', _with_image(KUBE_PROXY, 'DaemonSet', 'kube-proxy', proxy.get('image') or DEFAULT_PROXY_IMAGE)))
    coredns = cluster.get('coreDNS') or {}
    if not coredns.get('disabled'):
        out.append(('11-core-dns', _with_image(COREDNS, 'Deployment', 'coredns', coredns.get('image') or DEFAULT_COREDNS_IMAGE)))
    for manifest in cluster.get('inlineManifests') or ():
        try:
            documents = [doc for doc in yaml.safe_load_all(manifest.get('contents') or '') if isinstance(doc, dict)]
        except yaml.YAMLError as exc:
            LOG.warning('inline manifest %s is not YAML: %s', manifest.get('name'), exc)
            documents = []
        out.append(('99-%s' % manifest.get('name'), documents))
    return out


def talos_documents(config):
    """The documents Talos' manifest controller applies for this machine config: those of its Manifest resources, in
    their id order (manifests_by_id)."""
    documents = [doc for _id, docs in manifests_by_id(config) for doc in docs]
    for url in config.cluster.get('extraManifests') or ():
        LOG.warning('extra manifest %s: the lab cannot fetch URLs; not applied', url)
    return documents


class ManifestApplier:
    """Server-side applies Talos' documents; documents of kinds not served yet wait for their CRD."""

    def __init__(self, store):
        self.store = store
        self.waiting = []
        self._generation = None

    def apply(self, documents):
        self.waiting = []
        self._generation = self.store.registry.generation
        for doc in documents:
            self._apply_one(doc)
        return len(self.waiting)

    def retry(self):
        """Apply the waiting documents again if the served kinds changed."""
        if self.waiting and self.store.registry.generation != self._generation:
            pending, self.waiting = self.waiting, []
            self._generation = self.store.registry.generation
            for doc in pending:
                self._apply_one(doc)

    def _apply_one(self, doc):
        api_version, kind = doc.get('apiVersion', ''), doc.get('kind', '')
        name = (doc.get('metadata') or {}).get('name')
        rtype = self.store.registry.find_kind(api_version, kind)
        if rtype is None or not name:
            self.waiting.append(doc)
            return
        namespace = (doc.get('metadata') or {}).get('namespace') or ('default' if rtype.namespaced else '')
        if self.store.peek(rtype.key, namespace, name) is not None:
            return  # Talos creates what is missing, never updates (manifest_apply.go:335-346)
        doc = copy.deepcopy(doc)
        doc.setdefault('metadata', {}).setdefault('annotations', {})[INVENTORY_ANNOTATION] = INVENTORY_NAME
        try:
            self.store.patch(rtype, namespace, name, 'apply', doc, MANAGER, force=True, validation='Warn')
        except ApiError as exc:
            if exc.code == 404 and 'namespaces' in exc.message:
                self.waiting.append(doc)
            else:
                LOG.warning('talos manifest %s %s/%s rejected: %s', kind, namespace, name, exc.message)


def ensure_cilium_nodes(store, nodes):
    """CRD ciliumnodes.cilium.io and a CiliumNode for every node name in `nodes` (name -> InternalIP)."""
    crd_type = store.registry.by_key(CRD_KEY)
    if store.peek(CRD_KEY, '', CILIUM_NODE_CRD['metadata']['name']) is None:
        store.create(crd_type, None, CILIUM_NODE_CRD, 'cilium-operator-generic')
    rtype = store.registry.get('cilium.io', 'v2', 'ciliumnodes')
    if rtype is None:
        return
    for name, address in nodes.items():
        if store.peek(rtype.key, '', name) is None:
            store.create(rtype, None, {'apiVersion': 'cilium.io/v2', 'kind': 'CiliumNode',
                                       'metadata': {'name': name, 'labels': {'kubernetes.io/hostname': name}},
                                       'spec': {'addresses': [{'type': 'InternalIP', 'ip': address}]}}, 'cilium-agent')
