"""The manifests Talos's control plane applies to its cluster, applied to the upstream kube-apiserver as Talos applies them.

What: tools/talos-manifests renders them with Talos's own templates from the machine config (CoreDNS unless
cluster.coreDNS.disabled, kube-proxy unless cluster.proxy.disabled, the bootstrap token Secret and RBAC, the in-cluster
kubeconfig, cluster.inlineManifests such as the inline Cilium install); see tools/talos-manifests/main.go for the
Talos v1.13.9 lines each part follows. URL manifests (cluster.extraManifests, cluster.network.cni.urls) are listed
there but not fetched: the lab has no network.

How, after github.com/siderolabs/talos@v1.13.9 internal/app/machined/pkg/controllers/k8s/manifest_apply.go
(ManifestApplyController.apply, lines 227-392):
- the manifests in id order, their objects flattened, then a stable sort: Namespaces first (by name), then
  CustomResourceDefinitions (by name), the rest in their order (240-274);
- a kind the API does not serve (a custom resource before its CRD is established) is an error for that object and the
  others go on (281-297); a namespaced object without a namespace goes to `default` (301-306), a cluster-scoped one
  loses its namespace (327);
- an object already in the inventory, or one that exists (GET answers), is left as it is: Talos creates what is
  missing and never updates (335-346);
- otherwise a server-side apply with field manager `talos` (constants.KubernetesFieldManagerName,
  pkg/machinery@v1.13.9 constants/constants.go:1135), not forced, with the annotation
  config.k8s.io/owning-inventory: talos-bootstrap-manifests-inventory (353-372); a 400, 405 or 422 answer is an error
  for that object and the others go on, any other failure ends the pass (373-384);
- a pass that ended with errors is run again: the controller returns the error and the controller runtime restarts it
  with an exponential backoff (cosi-project/runtime@v1.14.1 pkg/controller/runtime/internal/rruntime/rruntime.go:80-85:
  cenkalti/backoff/v4's defaults, 500 ms initial, x1.5, at most 60 s, no limit on the retries).

Lab difference: the inventory (which objects Talos applied) is kept in the lab's memory, per cluster, not in the
ConfigMap kube-system/talos-bootstrap-manifests-inventory Talos writes (its format is go-kubernetes' ssa package,
which the module proxy here does not serve at the version Talos pins).
"""

import json
import logging
import subprocess
import threading
import urllib.parse

from lab import upstream

from .controlplane import ControlPlaneError

LOG = logging.getLogger('lab.k8s_upstream.manifests')
RENDERER = 'talos-manifests'
FIELD_MANAGER = 'talos'
INVENTORY_ANNOTATION = 'config.k8s.io/owning-inventory'
INVENTORY_NAME = 'talos-bootstrap-manifests-inventory'
# cenkalti/backoff/v4 exponential.go:79-82 (DefaultInitialInterval, DefaultMultiplier, DefaultMaxInterval)
RETRY_INITIAL, RETRY_MULTIPLIER, RETRY_MAX = 0.5, 1.5, 60.0


class ManifestError(Exception):
    """The manifests could not be rendered (the renderer's message names the field)."""


def render(config_text):
    """{'manifests': [{'id', 'objects'}...] sorted by id, 'urls': [{'id', 'url'}...]} for a machine config's text."""
    data = config_text.encode() if isinstance(config_text, str) else config_text
    done = subprocess.run([upstream.binary(RENDERER)], input=data, capture_output=True, check=False)
    try:
        answer = json.loads(done.stdout)
    except ValueError as exc:
        raise ManifestError('talos-manifests gave no JSON (exit %d): %s' % (done.returncode, done.stderr.decode('utf-8', 'replace')[-500:])) from exc
    if done.returncode != 0 or 'error' in answer:
        raise ManifestError('talos-manifests: %s' % answer.get('error', 'exit code %d' % done.returncode))
    return answer


def apply_order(manifests):
    """The objects of the manifests in the order Talos applies them (manifest_apply.go:240-274)."""
    objects = [obj for manifest in sorted(manifests, key=lambda m: m['id']) for obj in manifest['objects']]

    def rank(obj):
        api_version, kind = obj.get('apiVersion', ''), obj.get('kind', '')
        name = (obj.get('metadata') or {}).get('name', '')
        if kind == 'Namespace' and api_version == 'v1':
            return (0, name)
        if kind == 'CustomResourceDefinition' and api_version.split('/')[0] == 'apiextensions.k8s.io':
            return (1, name)
        return (2, '')
    return sorted(objects, key=rank)  # sorted() is stable, as sort.SliceStable


class _NoMatch(Exception):
    pass


class ManifestApplier:
    """One cluster's Talos manifest apply: pass() once, run() until a pass has no errors."""

    def __init__(self, plane):
        self.plane = plane
        self.inventory = set()   # (group, kind, namespace, name) of the objects Talos applied or found
        self._resources = {}     # group/version -> {kind: (plural, namespaced)} for one pass
        self._lock = threading.Lock()  # one pass at a time, as Talos's etcd mutex (manifest_apply.go:200)

    def _mapping(self, api_version, kind):
        if api_version not in self._resources:
            path = '/api/v1' if api_version == 'v1' else '/apis/' + api_version
            try:
                listing = self.plane.api('GET', path)
            except ControlPlaneError as exc:
                if ' HTTP 404 ' in str(exc):
                    listing = {'resources': []}
                else:
                    raise
            self._resources[api_version] = {r['kind']: (r['name'], r['namespaced'])
                                            for r in listing.get('resources', []) if '/' not in r['name']}
        found = self._resources[api_version].get(kind)
        if found is None:
            raise _NoMatch('no matches for kind "%s" in version "%s"' % (kind, api_version))
        return found

    def apply_pass(self, objects):
        """One pass over the objects; the errors of the objects that failed (empty: all applied or present)."""
        with self._lock:
            return self._pass(objects)

    def _pass(self, objects):
        self._resources = {}  # a new discovery cache per pass (manifest_apply.go:192-193)
        errors = []
        for original in objects:
            obj = json.loads(json.dumps(original))
            api_version, kind = obj.get('apiVersion', ''), obj.get('kind', '')
            meta = obj.setdefault('metadata', {})
            name = meta.get('name', '')
            label = '%s/%s/%s' % (api_version, kind, name)
            try:
                plural, namespaced = self._mapping(api_version, kind)
            except _NoMatch as exc:
                errors.append('error creating mapping for object %s: %s' % (label, exc))
                continue
            prefix = '/api/v1' if api_version == 'v1' else '/apis/' + api_version
            if namespaced:
                meta['namespace'] = meta.get('namespace') or 'default'
                path = '%s/namespaces/%s/%s/%s' % (prefix, meta['namespace'], plural, urllib.parse.quote(name, safe=''))
            else:
                meta.pop('namespace', None)
                path = '%s/%s/%s' % (prefix, plural, urllib.parse.quote(name, safe=''))
            key = (api_version.split('/')[0] if '/' in api_version else '', kind, meta.get('namespace', ''), name)
            if key in self.inventory:
                continue
            try:
                self.plane.api('GET', path)
                self.inventory.add(key)  # exists: Talos takes it into its inventory and leaves it as it is
                continue
            except ControlPlaneError as exc:
                if ' HTTP 404 ' not in str(exc):
                    raise
            annotations = meta['annotations'] = meta.get('annotations') or {}  # `annotations: null` in a document too
            if annotations.get(INVENTORY_ANNOTATION, INVENTORY_NAME) != INVENTORY_NAME:
                errors.append('unexpected foreign inventory annotation on %s' % label)
                continue
            annotations[INVENTORY_ANNOTATION] = INVENTORY_NAME
            try:
                self.plane.api('PATCH', path + '?fieldManager=' + FIELD_MANAGER, obj, content_type='application/apply-patch+yaml')
            except ControlPlaneError as exc:
                if any(' HTTP %d ' % code in str(exc) for code in (400, 405, 422)):
                    errors.append('error creating %s: %s' % (label, exc))
                    continue
                raise
            LOG.info('created %s', label)
            self.inventory.add(key)
        return errors
