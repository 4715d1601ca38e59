# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The last step of `talosctl upgrade-k8s`: the sync of Talos' bootstrap manifests to the cluster
(docs/operations/upgrade_kubernetes.md, "The bootstrap manifests").

Upstream (siderolabs/talos v1.13.9): upgrade-k8s ends with PerformManifestsSync (pkg/cluster/kubernetes/
talos_managed.go:163-165, 464-481). It reads the `Manifests.kubernetes.talos.dev` resources of namespace
`controlplane` from a control plane over the COSI State API (:483-498; go-kubernetes v0.2.38
kubernetes/manifests/get.go:18-39: every resource's items, in the order listed) and hands them to go-kubernetes' ssa
Manager with field manager `talos` and the inventory kube-system/talos-bootstrap-manifests-inventory
(talos_managed.go:524-528; pkg/machinery/constants/constants.go:1128-1135). That Manager annotates every object with
config.k8s.io/owning-inventory (go-kubernetes kubernetes/ssa/apply.go:278-297) and applies them through fluxcd/pkg ssa
v0.73.0 in stages, the cluster definitions (CRDs, Namespaces, ClusterRoles) first, then the class definitions (kinds
ending in Class), then the rest (ssa/manager_apply.go:286-352, ssa/utils/is.go:28-68), each with a dry run first and
ForceOwnership (manager_apply.go:112-160, 360-374). Dry-run mode only diffs (talos_managed.go:537-553).

Here: the same objects, order, field manager, annotation and forced server-side apply; a dry run (dryRun=All) of each
decides whether it changes (its answer against the live object), so check mode predicts and a second run reports no
change. Not done: the inventory ConfigMap is not written and nothing is pruned (go-kubernetes kubernetes/ssa/
apply.go:184-243); an object whose immutable fields changed is not deleted and created again (Force, an option
upgrade-k8s leaves off by default).
"""

from __future__ import annotations

import copy

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client

FIELD_MANAGER = 'talos'
INVENTORY_ANNOTATION = 'config.k8s.io/owning-inventory'
INVENTORY_NAME = 'talos-bootstrap-manifests-inventory'
MANIFEST_NAMESPACE = 'controlplane'
MANIFEST_TYPE = 'Manifests.kubernetes.talos.dev'
APPLY_CONTENT_TYPE = 'application/apply-patch+yaml'
# The metadata the API server sets and a dry run moves (or may move) without a change of the object.
_SERVER_METADATA = ('managedFields', 'resourceVersion', 'generation', 'creationTimestamp', 'uid', 'selfLink')


def objects_from_resources(resources, load_yaml):
    """The objects of the Manifest resources (each {'id', 'yaml_spec'}), by resource id then in each one's order.
    load_yaml: text -> data. A spec that is not a list of mappings is an error naming the resource."""
    objects = []
    for resource in sorted(resources, key=lambda r: r['id']):
        items = load_yaml(resource.get('yaml_spec') or '') or []
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise _errors.ApiError('Manifest %s: its spec is not a list of Kubernetes objects' % resource['id'],
                                   manifest=resource['id'])
        objects.extend(items)
    return objects


def _stage(obj):
    api_version, kind = obj.get('apiVersion', ''), obj.get('kind', '')
    if (kind.lower() == 'customresourcedefinition' and api_version.startswith('apiextensions.k8s.io/')) \
            or (kind.lower() == 'namespace' and api_version == 'v1') \
            or (kind.lower() == 'clusterrole' and api_version.startswith('rbac.authorization.k8s.io/')):
        return 0
    if kind.endswith('Class'):
        return 1
    return 2


def staged(objects):
    """The objects in fluxcd ssa's ApplyAllStaged order: cluster definitions, class definitions, the rest."""
    return sorted(objects, key=_stage)  # stable: each stage keeps the manifests' order


def label(obj):
    meta = obj.get('metadata') or {}
    where = '%s/%s' % (meta['namespace'], meta.get('name', '')) if meta.get('namespace') else meta.get('name', '')
    return '%s %s' % (obj.get('kind', '?'), where)


def comparable(obj):
    """The object without status and the metadata the server moves by itself."""
    out = dict((k, v) for k, v in obj.items() if k != 'status')
    out['metadata'] = dict((k, v) for k, v in (obj.get('metadata') or {}).items() if k not in _SERVER_METADATA)
    return out


def prepared(obj, namespaced):
    """The object to apply: the inventory annotation set; a namespaced object without a namespace in `default`, a
    cluster-scoped one without a namespace. An annotation of another inventory is refused (ssa/apply.go:286-290)."""
    body = copy.deepcopy(obj)
    meta = body.setdefault('metadata', {})
    if namespaced:
        meta.setdefault('namespace', 'default')
    else:
        meta.pop('namespace', None)
    annotations = meta.setdefault('annotations', {}) or {}
    meta['annotations'] = annotations
    if annotations.get(INVENTORY_ANNOTATION, INVENTORY_NAME) != INVENTORY_NAME:
        raise _errors.ApiError('%s already has an inventory annotation (%s: %s)'
                               % (label(body), INVENTORY_ANNOTATION, annotations[INVENTORY_ANNOTATION]), object=label(body))
    annotations[INVENTORY_ANNOTATION] = INVENTORY_NAME
    return body


def _apply(kube, path, body, dry_run):
    query = {'fieldManager': FIELD_MANAGER, 'force': 'true'}
    if dry_run:
        query['dryRun'] = 'All'
    try:
        return kube.send_json('PATCH', path, body, query=query, content_type=APPLY_CONTENT_TYPE)
    except _errors.ApiError as exc:
        raise exc.__class__('%s: the API refused the %sapply: %s' % (label(body), 'dry-run ' if dry_run else '', exc),
                            service=exc.service, status=exc.status, object=label(body))


def sync_one(kube, obj, check_mode=False):
    """Apply one object; {'kind', 'namespace', 'name', 'action'} with action created, configured or unchanged."""
    api_version, kind = obj.get('apiVersion', ''), obj.get('kind', '')
    name = (obj.get('metadata') or {}).get('name')
    if not api_version or not kind or not name:
        raise _errors.ApiError('%s: a bootstrap manifest object without apiVersion, kind or metadata.name' % label(obj),
                               object=label(obj))
    found = kube.resource(api_version, kind)
    if found is None:
        raise _errors.ApiError('%s: the API does not serve kind %s in %s' % (label(obj), kind, api_version),
                               object=label(obj))
    plural, namespaced = found
    body = prepared(obj, namespaced)
    namespace = body['metadata'].get('namespace')
    path = '%s/%s' % (k8s_client.api_path(api_version, plural, namespace), name)
    live = kube.get(api_version, kind, name, namespace=namespace)
    predicted = _apply(kube, path, body, dry_run=True)
    entry = {'kind': kind, 'namespace': namespace or '', 'name': name}
    if live is not None and comparable(predicted) == comparable(live):
        entry['action'] = 'unchanged'
        return entry
    entry['action'] = 'created' if live is None else 'configured'
    if not check_mode:
        _apply(kube, path, body, dry_run=False)
    return entry


def sync(kube, objects, check_mode=False, done=None):
    """Apply every object in staged order; the entries of sync_one, appended to `done` (a new list when None) as each
    object is handled, so a caller keeps those of the objects before a refusal. The first refusal raises, naming its
    object."""
    done = [] if done is None else done
    for obj in staged(objects):
        done.append(sync_one(kube, obj, check_mode=check_mode))
    return done
