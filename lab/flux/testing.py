"""A Flux-ready lab cluster on a thread, for tests of the Flux simulation (no World, no Talos).

    with FluxLab() as flux:                      # cp-1 + w-1..w-3 registered, a Cilium agent on each (Ready)
        flux.install_components()                # Flux's pinned upstream manifests, as the flux role applies them
        flux.sync(path='./clusters/lab')         # credentials Secret, GitRepository + Kustomization flux-system
                                                 # (and the CSI config Secret the tree's CSI controller mounts)
        flux.wait_ready()                        # every GitRepository/Kustomization Ready
        flux.kustomization('proxmox-csi')        # the stored object (a dict)

The Git server serves lab/gitops as `https://git.lab.internal/proxtalos/lab-gitops.git` with
user flux / password `GIT_PASSWORD`; flux.git.add_repo() adds more repositories.
"""

import base64
import os

import yaml

from lab import artifacts
from ansible_collections.proxtalos.cluster.tests.helpers import wait_until
from lab.k8s.testing import ClusterThread

from .lab import LAB_REPO_DIR, LAB_REPO_PATH, attach
from .controllers import CLUSTER_SCOPED_KINDS, DEFAULT_COMPONENTS, flatten
from .gitserver import GitServer

GIT_PASSWORD = 'lab-git-password'
CSI_CONFIG = 'clusters:\n- url: https://127.0.0.2:8006/api2/json\n  token_id: kubernetes-csi@pve!csi\n  token_secret: lab\n  region: lab\n'
NODES = (('cp-1', '127.0.0.1', True), ('w-1', '127.0.0.2', False), ('w-2', '127.0.0.3', False), ('w-3', '127.0.0.4', False))
CILIUM = {'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
          'metadata': {'name': 'cilium', 'namespace': 'kube-system', 'labels': {'k8s-app': 'cilium'}},
          'spec': {'selector': {'matchLabels': {'k8s-app': 'cilium'}}, 'template': {
              'metadata': {'labels': {'k8s-app': 'cilium'}},
              'spec': {'hostNetwork': True, 'tolerations': [{'operator': 'Exists'}],
                       'containers': [{'name': 'cilium-agent', 'image': 'quay.io/cilium/cilium:v1.18.2'}]}}}}
KEY_LABEL = 'sealedsecrets.bitnami.com/sealed-secrets-key'


class FluxLab(object):
    """A KubeCluster with nodes, a CNI, the lab Git server and the Flux controllers attached."""

    def __init__(self, nodes=NODES, require_controllers=True, timing=None):
        self.api = ClusterThread(timing=timing)
        self.nodes = nodes
        self.require_controllers = require_controllers
        self.git = GitServer({LAB_REPO_PATH: LAB_REPO_DIR}, credentials=('flux', GIT_PASSWORD))
        self.flux = None
        self.url = self.git.url_for(LAB_REPO_PATH)

    def __enter__(self):
        self.api.start()
        for name, address, control_plane in self.nodes:
            self.api.call(self.api.cluster.kubelet_started, name, address, control_plane=control_plane)
        self.apply(CILIUM)
        self.flux = self.api.call(attach, self.api.cluster, self.git, None, self.require_controllers)
        return self

    def __exit__(self, *exc):
        if self.flux is not None:
            self.api.call(self.flux.stop)
        self.api.stop()

    @property
    def kubeconfig(self):
        return self.api.kubeconfig

    @property
    def store(self):
        return self.api.cluster.store

    # --- writing like a client --------------------------------------------------------------

    def apply(self, doc, manager='test'):
        """Server-side apply of one object (on the lab loop); returns the stored object."""
        def run():
            rtype = self.store.registry.find_kind(doc['apiVersion'], doc['kind'])
            if rtype is None:
                raise AssertionError('no kind %s %s served' % (doc['apiVersion'], doc['kind']))
            namespace = doc['metadata'].get('namespace', '') if rtype.namespaced else ''
            return self.store.patch(rtype, namespace, doc['metadata']['name'], 'apply', doc, manager, force=True)[0]
        return self.api.call(run)

    def apply_file(self, path):
        """Apply every object of a YAML file (documents, or the items of a v1 List)."""
        with open(path, encoding='utf-8') as handle:
            return [self.apply(doc) for doc in flatten(yaml.safe_load_all(handle))]

    def delete(self, api_version, kind, namespace, name):
        def run():
            rtype = self.store.registry.find_kind(api_version, kind)
            return self.store.delete(rtype, namespace, name)
        return self.api.call(run)

    def get(self, api_version, kind, namespace, name):
        def run():
            rtype = self.store.registry.find_kind(api_version, kind)
            if rtype is None:
                return None
            return self.store.peek(rtype.key, namespace if rtype.namespaced else '', name)
        return self.api.call(run)

    def items(self, api_version, kind, namespace=None):
        def run():
            rtype = self.store.registry.find_kind(api_version, kind)
            return list(self.store.items(rtype.key, namespace)) if rtype is not None else []
        return self.api.call(run)

    # --- Flux ---------------------------------------------------------------------------------

    def apply_upstream(self, set_name, components=DEFAULT_COMPONENTS, namespace='flux-system'):
        """Apply a pinned upstream artifact set (roles/flux/vars/artifacts.yml) from the lab's artifact cache as the flux
        role does: in order, a component's file only when it is wanted, objects without a namespace in namespace, and
        a Deployment's placeholder image set as the set's image says (flux-operator's kustomization)."""
        pinned = artifacts.pins()[set_name]
        out = []
        for entry in pinned['files']:
            if entry.get('component') and entry['component'] not in components:
                continue
            with open(artifacts.cached_path(entry), encoding='utf-8') as handle:
                docs = [doc for doc in flatten(yaml.safe_load_all(handle)) if doc]
            for doc in docs:
                if doc['kind'] not in CLUSTER_SCOPED_KINDS:
                    doc['metadata'].setdefault('namespace', namespace)
                if pinned.get('image_name') and doc['kind'] == 'Deployment':
                    for container in doc['spec']['template']['spec']['containers']:
                        if container['image'].split(':')[0] == pinned['image_name']:
                            container['image'] = pinned['image']
                out.append(self.apply(doc))
        return out

    def install_components(self, components=DEFAULT_COMPONENTS):
        """Flux's distribution manifests (the manifest method's pinned files)."""
        return self.apply_upstream('flux', components)

    def install_operator(self):
        """flux-operator's manifests (the operator method's pinned files)."""
        return self.apply_upstream('flux_operator')

    def put_key(self, key_pem, cert_pem, name='sealed-secrets-key', label='active'):
        """The sealed-secrets key Secret, as the sealed_secrets stage writes it."""
        return self.apply({'apiVersion': 'v1', 'kind': 'Secret', 'type': 'kubernetes.io/tls',
                           'metadata': {'name': name, 'namespace': 'kube-system', 'labels': {KEY_LABEL: label}},
                           'data': {'tls.key': base64.b64encode(key_pem).decode(), 'tls.crt': base64.b64encode(cert_pem).decode()}})

    def csi_secret(self, config=CSI_CONFIG):
        """The proxmox-csi-plugin config Secret (and its namespace), as the sealed-secrets controller makes it from the
        SealedSecret the collection commits: the lab tree's CSI controller mounts it and is not Ready without it."""
        self.apply({'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'csi-proxmox', 'labels': {
            'pod-security.kubernetes.io/enforce': 'privileged'}}})
        return self.apply({'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {'name': 'proxmox-csi-plugin', 'namespace': 'csi-proxmox'},
                           'data': {'config.yaml': base64.b64encode(config.encode()).decode()}})

    def sync(self, path='./clusters/lab', url=None, branch='main', password=GIT_PASSWORD, name='flux-system',  # pylint: disable=too-many-arguments
             csi_secret=True):
        """What the flux role writes: the credentials Secret, the GitRepository and the root Kustomization
        (csi_secret: and what the sealed CSI config becomes, see csi_secret())."""
        if csi_secret:
            self.csi_secret()
        self.apply({'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {'name': name, 'namespace': 'flux-system'},
                    'data': {'username': base64.b64encode(b'flux').decode(), 'password': base64.b64encode(password.encode()).decode()}})
        self.apply({'apiVersion': 'source.toolkit.fluxcd.io/v1', 'kind': 'GitRepository', 'metadata': {'name': name, 'namespace': 'flux-system'},
                    'spec': {'interval': '1m', 'url': url or self.url, 'ref': {'branch': branch}, 'secretRef': {'name': name}}})
        return self.apply({'apiVersion': 'kustomize.toolkit.fluxcd.io/v1', 'kind': 'Kustomization',
                           'metadata': {'name': name, 'namespace': 'flux-system'},
                           'spec': {'interval': '10m', 'path': path, 'prune': True, 'sourceRef': {'kind': 'GitRepository', 'name': name}}})

    def kustomization(self, name, namespace='flux-system'):
        return self.get('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', namespace, name)

    def git_repository(self, name='flux-system', namespace='flux-system'):
        return self.get('source.toolkit.fluxcd.io/v1', 'GitRepository', namespace, name)

    def status(self):
        return self.api.call(self.flux.flux.status)

    def wait_ready(self, count=8, timeout=30.0):
        """Every Flux object Ready (and at least count of them)."""
        def probe():
            rows = self.status()
            return len(rows) >= count and all(r['ready'] == 'True' for r in rows), [
                (r['kind'], r['name'], r['ready'], r['reason'], (r['message'] or '')[:160]) for r in rows]
        return wait_until(probe, 'every Flux object Ready', timeout=timeout, interval=0.05)

    def wait_condition(self, name, reason, timeout=30.0, namespace='flux-system', kind='Kustomization'):
        """Until the object's Ready condition has this reason; returns the condition."""
        def probe():
            obj = self.kustomization(name, namespace) if kind == 'Kustomization' else self.git_repository(name, namespace)
            ready = next((c for c in ((obj or {}).get('status') or {}).get('conditions') or () if c['type'] == 'Ready'), None)
            return ready is not None and ready.get('reason') == reason, ready
        return wait_until(probe, '%s %s Ready reason %s' % (kind, name, reason), timeout=timeout, interval=0.05)

    def reconcile(self, name, namespace='flux-system', kind='Kustomization'):
        """What `flux reconcile` does: set the reconcile.fluxcd.io/requestedAt annotation."""
        import datetime  # pylint: disable=import-outside-toplevel
        api = 'kustomize.toolkit.fluxcd.io/v1' if kind == 'Kustomization' else 'source.toolkit.fluxcd.io/v1'
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat()
        meta = {'name': name, 'namespace': namespace, 'annotations': {'reconcile.fluxcd.io/requestedAt': stamp}}
        return self.apply({'apiVersion': api, 'kind': kind, 'metadata': meta}, manager='flux-client-side-apply')

    def call(self, function, *args, **kwargs):
        return self.api.call(function, *args, **kwargs)


def copy_repo(target, source=LAB_REPO_DIR):
    """A copy of the lab GitOps repository to change in a test; returns its path."""
    import shutil  # pylint: disable=import-outside-toplevel
    shutil.copytree(source, str(target), symlinks=False)
    return os.path.abspath(str(target))
