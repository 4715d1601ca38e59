# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The last step of `talosctl upgrade-k8s`, the sync of Talos' bootstrap manifests, for the objects whose rendering
follows the machine config's images (docs/operations/upgrade_kubernetes.md, "The bootstrap manifests").

Upstream (siderolabs/talos v1.13.9): upgrade-k8s ends with PerformManifestsSync (pkg/cluster/kubernetes/
talos_managed.go:163-165, 464-481): the `Manifests` resources of a control plane read over the COSI State API
(:483-498, go-kubernetes v0.2.38 kubernetes/manifests/get.go:18-39), applied by go-kubernetes' ssa Manager with field
manager `talos` and the inventory kube-system/talos-bootstrap-manifests-inventory (talos_managed.go:524-528;
pkg/machinery/constants/constants.go:1128-1135), which applies through fluxcd/pkg ssa v0.73.0 with ForceOwnership,
a dry run first (ssa/manager_apply.go:360-374); dry-run mode only diffs (talos_managed.go:537-553).

Here, without COSI: the objects are the ones Talos' templates render from the config's images, the kube-proxy
DaemonSet (cluster.proxy.image; controllers/k8s/control_plane.go:346-347, k8stemplates/kube-proxy.go:20-60) and the
CoreDNS Deployment (cluster.coreDNS.image; control_plane.go:349-350, k8stemplates/coredns.go:291-292). The applied
configuration of each is what field manager `talos` owns in the live object (its managedFields entry), with the
container's image the config names: applying it as `talos` leaves every other field and every other manager's fields
as they are. Dry run (dryRun=All) first; changed when the dry run's answer differs from the live object.
"""

from __future__ import annotations

import copy
import json

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client

FIELD_MANAGER = 'talos'
INVENTORY_ANNOTATION = 'config.k8s.io/owning-inventory'
INVENTORY_NAME = 'talos-bootstrap-manifests-inventory'
APPLY_CONTENT_TYPE = 'application/apply-patch+yaml'
# The metadata the API server sets and a dry run moves (or may move) without a change of the object.
_SERVER_METADATA = ('managedFields', 'resourceVersion', 'generation', 'creationTimestamp', 'uid', 'selfLink')


class Target(object):
    """One bootstrap object and the image the config gives its container."""

    def __init__(self, api_version, kind, namespace, name, container, image, setting):
        self.api_version = api_version
        self.kind = kind
        self.namespace = namespace
        self.name = name
        self.container = container
        self.image = image
        self.setting = setting

    @property
    def label(self):
        return '%s %s/%s' % (self.kind, self.namespace, self.name)


def _cluster(documents):
    for document in documents or ():
        if isinstance(document, dict) and document.get('version') == 'v1alpha1' and 'kind' not in document:
            return document.get('cluster') or {}
    for document in documents or ():
        if isinstance(document, dict) and isinstance(document.get('cluster'), dict):
            return document['cluster']
    return {}


def targets(documents):
    """The bootstrap objects a control plane's machine config renders with its own images: [Target]. A disabled
    part (cluster.proxy.disabled, cluster.coreDNS.disabled) renders nothing; a part without an image in the config
    (Talos' default then, which follows the Talos release) is not synced."""
    cluster = _cluster(documents)
    if not cluster:
        raise _errors.ValidationError('config_path', 'has no v1alpha1 cluster section: not a control plane config')
    out = []
    proxy = cluster.get('proxy') or {}
    if not proxy.get('disabled') and proxy.get('image'):
        out.append(Target('apps/v1', 'DaemonSet', 'kube-system', 'kube-proxy', 'kube-proxy', proxy['image'],
                          'cluster.proxy.image'))
    coredns = cluster.get('coreDNS') or {}
    if not coredns.get('disabled') and coredns.get('image'):
        out.append(Target('apps/v1', 'Deployment', 'kube-system', 'coredns', 'coredns', coredns['image'],
                          'cluster.coreDNS.image'))
    return out


# --- the fields a manager owns (metadata.managedFields, FieldsV1) ---------------------------------------------------

def _keyed_item(items, key_text):
    try:
        keys = json.loads(key_text)
    except ValueError:
        return None
    for item in items or ():
        if isinstance(item, dict) and all(item.get(k) == v for k, v in keys.items()):
            return item
    return None


def extract(value, fields):
    """The part of `value` (the live object, or a part of it) that the FieldsV1 set `fields` names, as an applied
    configuration: maps by `f:<name>`, list items by `k:<keys>` (associative lists), `v:<value>` (sets) and
    `i:<index>`. A field the set names but the value lacks is left out."""
    if isinstance(value, dict):
        out = {}
        for key, sub in fields.items():
            if not key.startswith('f:'):
                continue
            name = key[2:]
            if name not in value:
                continue
            out[name] = extract(value[name], sub) if sub else copy.deepcopy(value[name])
        return out
    if isinstance(value, list):
        out = []
        for key, sub in fields.items():
            if key.startswith('k:'):
                item = _keyed_item(value, key[2:])
                if item is not None:
                    part = extract(item, sub) if sub else copy.deepcopy(item)
                    # the keys of an associative list item are always part of what is applied
                    for name, wanted in json.loads(key[2:]).items():
                        part.setdefault(name, wanted)
                    out.append(part)
            elif key.startswith('v:'):
                try:
                    out.append(json.loads(key[2:]))
                except ValueError:
                    continue
            elif key.startswith('i:'):
                index = int(key[2:])
                if index < len(value):
                    out.append(extract(value[index], sub) if sub else copy.deepcopy(value[index]))
        return out
    return copy.deepcopy(value)


def owned_fields(obj, manager=FIELD_MANAGER):
    """The FieldsV1 set `manager` owns through Apply on the main resource, or None when it owns none."""
    for entry in (obj.get('metadata') or {}).get('managedFields') or ():
        if entry.get('manager') == manager and entry.get('operation') == 'Apply' and not entry.get('subresource'):
            return entry.get('fieldsV1') or {}
    return None


def applied_configuration(live, target):
    """What `talos` applies: its own fields of the live object with the target's container image (and the inventory
    annotation Talos' manifest controller puts on what it creates, manifest_apply.go:353-368)."""
    fields = owned_fields(live)
    if fields is None:
        raise _errors.ApiError('%s: field manager %s owns none of its fields, so Talos\' manifest controller did not '
                               'create it; not synced' % (target.label, FIELD_MANAGER), object=target.label)
    body = extract(live, fields)
    body['apiVersion'] = target.api_version
    body['kind'] = target.kind
    metadata = body.setdefault('metadata', {})
    metadata['name'] = target.name
    metadata['namespace'] = target.namespace
    metadata.setdefault('annotations', {})[INVENTORY_ANNOTATION] = INVENTORY_NAME
    containers = (((body.get('spec') or {}).get('template') or {}).get('spec') or {}).get('containers')
    container = _keyed_item(containers, json.dumps({'name': target.container}))
    if container is None:
        raise _errors.ApiError('%s: field manager %s owns no container %s; not synced'
                               % (target.label, FIELD_MANAGER, target.container), object=target.label)
    container['image'] = target.image
    return body


def comparable(obj):
    """The object without status and the metadata the server moves by itself."""
    out = dict((k, v) for k, v in obj.items() if k != 'status')
    out['metadata'] = dict((k, v) for k, v in (obj.get('metadata') or {}).items() if k not in _SERVER_METADATA)
    return out


def container_image(obj, container):
    containers = (((obj.get('spec') or {}).get('template') or {}).get('spec') or {}).get('containers')
    found = _keyed_item(containers, json.dumps({'name': container}))
    return (found or {}).get('image', '')


def _apply(kube, target, body, dry_run):
    plural = kube.resource(target.api_version, target.kind)
    if plural is None:
        raise k8s_client.NotServed(target.api_version, target.kind)
    path = '%s/%s' % (k8s_client.api_path(target.api_version, plural[0], target.namespace), target.name)
    query = {'fieldManager': FIELD_MANAGER, 'force': 'true'}
    if dry_run:
        query['dryRun'] = 'All'
    try:
        return kube.send_json('PATCH', path, body, query=query, content_type=APPLY_CONTENT_TYPE)
    except _errors.ApiError as exc:
        raise exc.__class__('%s: the API refused the %sapply: %s' % (target.label, 'dry-run ' if dry_run else '', exc),
                            service=exc.service, status=exc.status, object=target.label)


def sync(kube, wanted, check_mode=False):
    """Apply each Target; returns [{'kind', 'namespace', 'name', 'setting', 'action', 'image', 'image_before'}] with
    action missing, unchanged or configured. A missing object is reported, not created: Talos'
    manifest controller creates what is missing (manifest_apply.go:335-346)."""
    results = []
    for target in wanted:
        entry = {'kind': target.kind, 'namespace': target.namespace, 'name': target.name, 'setting': target.setting,
                 'image': target.image, 'image_before': '', 'action': 'missing'}
        results.append(entry)
        live = kube.get(target.api_version, target.kind, target.name, namespace=target.namespace)
        if live is None:
            continue
        entry['image_before'] = container_image(live, target.container)
        body = applied_configuration(live, target)
        predicted = _apply(kube, target, body, dry_run=True)
        if comparable(predicted) == comparable(live):
            entry['action'] = 'unchanged'
            continue
        entry['action'] = 'configured'
        if not check_mode:
            _apply(kube, target, body, dry_run=False)
    return results
