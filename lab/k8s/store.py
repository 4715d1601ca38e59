"""The object store behind the lab API: one global resourceVersion, watch history, and the
create/update/patch/apply/delete semantics of the real API server's registry.

Objects are plain dicts and are never modified once stored: every write stores a new dict, so
readers (handlers, watchers, controllers) may keep references without copying.
"""

import collections
import datetime
import logging
import uuid

import yaml

from . import defaults, patch as patch_mod, schema, ssa
from .errors import ApiError, already_exists, conflict, invalid, not_found
from .patch import clone
from .resources import CRD_KEY

LOG = logging.getLogger('lab.k8s')
Event = collections.namedtuple('Event', 'type key obj old rv')

PATCH_TYPES = {
    'application/json-patch+json': 'json',
    'application/merge-patch+json': 'merge',
    'application/strategic-merge-patch+json': 'strategic',
    'application/apply-patch+yaml': 'apply',
    'application/apply-patch+cbor': 'apply-cbor',
}

_NO_GENERATION = {('', 'pods'), ('', 'nodes'), ('', 'services'), ('', 'namespaces'), ('', 'persistentvolumeclaims'),
                  ('', 'persistentvolumes'), ('', 'endpoints'), ('', 'configmaps'), ('', 'secrets'), ('', 'serviceaccounts'),
                  ('', 'events'), ('coordination.k8s.io', 'leases')}


_SPEC_REQUIRED = {('apps', 'deployments'), ('apps', 'daemonsets'), ('apps', 'statefulsets'), ('apps', 'replicasets'), ('batch', 'jobs'),
                  ('', 'pods')}


def timestamp():
    return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


def _spec_part(obj):
    return {k: v for k, v in obj.items() if k not in ('metadata', 'status')}


class Store:  # pylint: disable=too-many-public-methods
    """Objects by (group, plural) and (namespace, name), with watch history and listeners."""

    def __init__(self, registry, history=50000):
        self.registry = registry
        self.defs = schema.definitions()
        self.builtin_validator = schema.Validator(self.defs)
        self.rv = 1
        self._objects = collections.defaultdict(dict)
        self._history = collections.deque(maxlen=history)
        self._subscribers = []
        self._pending = collections.deque()
        self._emitting = False
        self.allocator = defaults.Allocator()

    # --- reading ----------------------------------------------------------------------------

    def peek(self, key, namespace, name):
        return self._objects[key].get((namespace or '', name))

    def get(self, rtype, namespace, name):
        obj = self.peek(rtype.key, namespace, name)
        if obj is None:
            raise not_found(rtype, name)
        return obj

    def items(self, key, namespace=None):
        objects = self._objects[key]
        if namespace is None:
            return list(objects.values())
        return [obj for (ns, dummy), obj in objects.items() if ns == namespace]

    def count(self, key):
        return len(self._objects[key])

    # --- events -----------------------------------------------------------------------------

    def subscribe(self, callback):
        """callback(Event) runs synchronously after every stored change."""
        self._subscribers.append(callback)

    def unsubscribe(self, callback):
        if callback in self._subscribers:
            self._subscribers.remove(callback)

    def events_since(self, rv):
        """Events after rv, or None when rv is older than the kept history (410 Gone)."""
        if rv >= self.rv:
            return []
        if not self._history or self._history[0].rv > rv + 1:
            return None
        return [event for event in self._history if event.rv > rv]

    def _emit(self, event_type, key, obj, old):
        """Deliver an event to every subscriber, in resourceVersion order even when a subscriber writes."""
        event = Event(event_type, key, obj, old, self.rv)
        self._history.append(event)
        self._pending.append(event)
        if self._emitting:
            return
        self._emitting = True
        try:
            while self._pending:
                current = self._pending.popleft()
                for callback in list(self._subscribers):
                    try:
                        callback(current)
                    except Exception:  # pylint: disable=broad-except
                        LOG.exception('store subscriber %r failed on %s %s', callback, current.type, current.key)
        finally:
            self._emitting = False

    def _store(self, key, obj, old, event_type=None):
        self.rv += 1
        obj['metadata']['resourceVersion'] = str(self.rv)
        ident = (obj['metadata'].get('namespace', ''), obj['metadata']['name'])
        self._objects[key][ident] = obj
        self._emit(event_type or ('MODIFIED' if old is not None else 'ADDED'), key, obj, old)
        return obj

    def _drop(self, key, obj):
        ident = (obj['metadata'].get('namespace', ''), obj['metadata']['name'])
        self._objects[key].pop(ident, None)
        self.rv += 1
        gone = dict(obj)
        gone['metadata'] = dict(obj['metadata'], resourceVersion=str(self.rv))
        self._emit('DELETED', key, gone, obj)
        return gone

    # --- validation -------------------------------------------------------------------------

    def _validate(self, rtype, obj, validation, warnings):
        """Prune unknown fields, check types; raises 400/422; returns the pruned object."""
        if rtype.custom:
            validator = schema.Validator(self.defs, structural=True)
            meta, meta_errors, meta_unknown = self.builtin_validator.check(
                obj.get('metadata') or {}, {'$ref': schema.REF_PREFIX + 'io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta'})
            body = {k: v for k, v in obj.items() if k != 'metadata'}
            root = dict(rtype.crd_schema)
            props = dict(root.get('properties') or {})
            props.setdefault('apiVersion', {'type': 'string'})
            props.setdefault('kind', {'type': 'string'})
            root['properties'] = props
            pruned, errors, unknown = validator.check(body, root)
            pruned['metadata'] = meta
            errors = [_prefix(p, 'metadata') for p in meta_errors] + errors
            unknown = ['metadata.' + u for u in meta_unknown] + unknown
        else:
            pruned, errors, unknown = self.builtin_validator.check(obj, {'$ref': schema.REF_PREFIX + rtype.definition})
        name = (obj.get('metadata') or {}).get('name', '')
        if errors:
            raise invalid(rtype, name, errors)
        if unknown:
            if validation == 'Strict':
                fields = ', '.join('unknown field "%s"' % u for u in unknown)
                raise ApiError(400, 'BadRequest', '%s in version "%s" cannot be handled as a %s: strict decoding error: %s'
                               % (rtype.kind, rtype.api_version, rtype.kind, fields))
            if validation == 'Warn':
                warnings.extend('unknown field "%s"' % u for u in unknown)
        return pruned

    def _schema_for(self, rtype):
        if rtype.custom:
            root = dict(rtype.crd_schema)
            props = dict(root.get('properties') or {})
            props['metadata'] = {'$ref': schema.REF_PREFIX + 'io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta'}
            root['properties'] = props
            return root
        return {'$ref': schema.REF_PREFIX + rtype.definition}

    def _check_type(self, rtype, obj):
        if not isinstance(obj, dict):
            raise ApiError(400, 'BadRequest', 'the body of the request was in an unknown format')
        api_version, kind = obj.get('apiVersion'), obj.get('kind')
        if api_version and api_version != rtype.api_version:
            if not (rtype.custom and api_version.rpartition('/')[0] == rtype.group):
                raise ApiError(400, 'BadRequest', 'the API version in the data (%s) does not match the expected API version (%s)'
                               % (api_version, rtype.api_version))
        if kind and kind != rtype.kind:
            raise ApiError(400, 'BadRequest', 'the kind in the data (%s) does not match the expected kind (%s)' % (kind, rtype.kind))
        obj['apiVersion'], obj['kind'] = rtype.api_version, rtype.kind

    def _check_namespace(self, rtype, namespace, obj):
        meta = obj.setdefault('metadata', {})
        if not isinstance(meta, dict):
            raise ApiError(400, 'BadRequest', 'metadata must be an object')
        if rtype.namespaced:
            if meta.get('namespace') and meta['namespace'] != namespace:
                raise ApiError(400, 'BadRequest', 'the namespace of the provided object does not match the namespace sent on the request')
            meta['namespace'] = namespace
            if self.peek(('', 'namespaces'), '', namespace) is None:
                raise ApiError(404, 'NotFound', 'namespaces "%s" not found' % namespace,
                               {'name': namespace, 'kind': 'namespaces'})
        else:
            meta.pop('namespace', None)

    # --- writes from clients ------------------------------------------------------------------

    def create(self, rtype, namespace, body, manager, dry_run=False, validation='Warn'):  # pylint: disable=too-many-arguments
        warnings = []
        obj = clone(body)
        self._check_type(rtype, obj)
        self._check_namespace(rtype, namespace, obj)
        meta = obj['metadata']
        if not meta.get('name') and meta.get('generateName'):
            meta['name'] = meta['generateName'] + uuid.uuid4().hex[:5]
        obj = self._validate(rtype, obj, validation, warnings)
        meta = obj['metadata']
        problems = defaults.check_name(rtype, meta.get('name', ''))
        if problems:
            raise invalid(rtype, meta.get('name', ''), problems)
        if self.peek(rtype.key, namespace if rtype.namespaced else '', meta['name']) is not None:
            raise already_exists(rtype, meta['name'])
        for field in ('resourceVersion', 'deletionTimestamp', 'deletionGracePeriodSeconds', 'managedFields', 'selfLink'):
            meta.pop(field, None)
        meta['uid'] = str(uuid.uuid4())
        meta['creationTimestamp'] = timestamp()
        if rtype.has('status'):
            obj.pop('status', None)
        self._finish(rtype, obj, None)
        if manager:
            ssa.record_update(None, obj, manager, rtype.api_version, self._schema_for(rtype), self.defs)
        if dry_run:
            meta.pop('resourceVersion', None)
            return obj, warnings
        return self._commit(rtype, obj, None), warnings

    def _finish(self, rtype, obj, old):
        """Strategy defaults and checks, generation, CRD names; raises 422."""
        if rtype.key in _SPEC_REQUIRED:
            obj.setdefault('spec', {})
        problems = defaults.prepare(rtype, obj, old, self.allocator)
        if rtype.key == CRD_KEY:
            problems += self._check_crd(obj)
        if problems:
            raise invalid(rtype, obj['metadata']['name'], problems)
        if rtype.key not in _NO_GENERATION:
            if old is None:
                obj['metadata']['generation'] = 1
            else:
                generation = old['metadata'].get('generation', 1)
                if _spec_part(old) != _spec_part(obj):
                    generation += 1
                obj['metadata']['generation'] = generation

    def _commit(self, rtype, obj, old):
        if rtype.key == CRD_KEY:
            self._accept_crd(obj)
        stored = self._store(rtype.key, obj, old)
        if rtype.key == CRD_KEY:
            self.registry.set_crd(stored)
        return stored

    def update(self, rtype, namespace, name, body, manager, subresource='', dry_run=False, validation='Warn'):  # pylint: disable=too-many-arguments
        warnings = []
        obj = clone(body)
        self._check_type(rtype, obj)
        self._check_namespace(rtype, namespace, obj)
        if obj['metadata'].get('name') and obj['metadata']['name'] != name:
            raise ApiError(400, 'BadRequest', 'the name of the object (%s) does not match the name on the URL (%s)'
                           % (obj['metadata']['name'], name))
        obj['metadata']['name'] = name
        old = self.get(rtype, namespace if rtype.namespaced else '', name)
        wanted_rv = obj['metadata'].get('resourceVersion')
        if wanted_rv and wanted_rv != old['metadata']['resourceVersion']:
            raise conflict(rtype, name, 'the object has been modified; please apply your changes to the latest version and try again')
        obj = self._validate(rtype, obj, validation, warnings)
        return self._write(rtype, old, obj, manager or '', subresource, dry_run, warnings)

    def _write(self, rtype, old, obj, manager, subresource, dry_run, warnings):  # pylint: disable=too-many-arguments
        """Common tail of update/patch/apply: subresource rules, system metadata, finalizers.

        manager None: obj already carries its managedFields (server-side apply)."""
        if subresource == 'status':
            new = dict(old)
            new['status'] = obj.get('status')
            if new['status'] is None:
                new.pop('status')
            new['metadata'] = dict(old['metadata'])
            if manager is None and 'managedFields' in obj['metadata']:
                new['metadata']['managedFields'] = obj['metadata']['managedFields']
            obj = new
        else:
            if rtype.has('status'):
                if 'status' in old:
                    obj['status'] = old['status']
                else:
                    obj.pop('status', None)
            meta = obj['metadata']
            for field in ('uid', 'creationTimestamp', 'deletionTimestamp', 'deletionGracePeriodSeconds', 'generation'):
                if field in old['metadata']:
                    meta[field] = old['metadata'][field]
                else:
                    meta.pop(field, None)
            if manager is not None:
                meta.pop('managedFields', None)
                if 'managedFields' in old['metadata']:
                    meta['managedFields'] = old['metadata']['managedFields']
            self._finish(rtype, obj, old)
        if manager:
            ssa.record_update(old, obj, manager, rtype.api_version, self._schema_for(rtype), self.defs, subresource)
        obj['metadata']['resourceVersion'] = old['metadata']['resourceVersion']
        if obj == old:
            return old, warnings
        if dry_run:
            return obj, warnings
        if old['metadata'].get('deletionTimestamp') and not obj['metadata'].get('finalizers'):
            self._finalize(rtype, old)
            return self._drop(rtype.key, obj), warnings
        return self._commit(rtype, obj, old), warnings

    def patch(self, rtype, namespace, name, patch_type, body, manager, force=False, subresource='',  # pylint: disable=too-many-arguments,too-many-locals
              dry_run=False, validation='Warn'):
        warnings = []
        ns = namespace if rtype.namespaced else ''
        if patch_type == 'apply':
            return self._apply(rtype, ns, name, body, manager, force, subresource, dry_run, validation)
        if patch_type == 'apply-cbor':
            raise ApiError(415, 'UnsupportedMediaType', 'the body of the request was in an unknown format - accepted media types include: '
                           'application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml')
        old = self.get(rtype, ns, name)
        try:
            doc = yaml.safe_load(body) if isinstance(body, (str, bytes)) else body
        except yaml.YAMLError as exc:
            raise ApiError(400, 'BadRequest', 'error decoding patch: %s' % exc) from exc
        if patch_type == 'json':
            obj = patch_mod.json_patch(old, doc)
        elif patch_type == 'merge':
            obj = patch_mod.merge_patch(old, doc)
        elif patch_type == 'strategic':
            if rtype.custom:
                raise ApiError(415, 'UnsupportedMediaType', 'the body of the request was in an unknown format - accepted media types '
                               'include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml')
            obj = patch_mod.strategic_merge_patch(old, doc, self._schema_for(rtype), self.defs)
        else:
            raise ApiError(415, 'UnsupportedMediaType', 'unsupported patch type')
        obj = clone(obj)
        if not isinstance(obj, dict):
            raise ApiError(422, 'Invalid', 'the patch did not produce an object')
        wanted_rv = (obj.get('metadata') or {}).get('resourceVersion')
        if wanted_rv and wanted_rv != old['metadata']['resourceVersion']:
            raise conflict(rtype, name, 'the object has been modified; please apply your changes to the latest version and try again')
        self._check_type(rtype, obj)
        self._check_namespace(rtype, ns, obj)
        if obj['metadata'].get('name') != name:
            raise ApiError(400, 'BadRequest', 'the name of the object (%s) does not match the name on the URL (%s)'
                           % (obj['metadata'].get('name'), name))
        obj = self._validate(rtype, obj, validation, warnings)
        return self._write(rtype, old, obj, manager or '', subresource, dry_run, warnings)

    def _apply(self, rtype, ns, name, body, manager, force, subresource, dry_run, validation):  # pylint: disable=too-many-arguments
        warnings = []
        if not manager:
            raise ApiError(422, 'Invalid', 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
                           {'group': 'meta.k8s.io', 'kind': 'PatchOptions', 'causes': [
                               {'reason': 'FieldValueRequired', 'message': 'Required value: is required for apply patch',
                                'field': 'fieldManager'}]})
        try:
            applied = yaml.safe_load(body) if isinstance(body, (str, bytes)) else clone(body)
        except yaml.YAMLError as exc:
            raise ApiError(400, 'BadRequest', 'error decoding YAML: %s' % exc) from exc
        if not isinstance(applied, dict):
            raise ApiError(400, 'BadRequest', 'the body of the request was in an unknown format')
        if not applied.get('apiVersion') or not applied.get('kind'):
            raise ApiError(400, 'BadRequest', 'invalid object type: %s, Kind=%s' % (applied.get('apiVersion', ''), applied.get('kind', '')))
        self._check_type(rtype, applied)
        meta = applied.setdefault('metadata', {})
        if meta.get('name') and meta['name'] != name:
            raise ApiError(400, 'BadRequest', 'the name of the object (%s) does not match the name on the URL (%s)' % (meta['name'], name))
        meta['name'] = name
        if rtype.namespaced and meta.get('namespace') and meta['namespace'] != ns:
            raise ApiError(400, 'BadRequest', 'the namespace of the provided object does not match the namespace sent on the request')
        applied = self._validate(rtype, applied, validation, warnings)
        applied['metadata'].pop('managedFields', None)
        old = self.peek(rtype.key, ns, name)
        if old is None:
            if subresource:
                raise not_found(rtype, name)
            created, warnings2 = self.create(rtype, ns, applied, None, dry_run=True, validation='Ignore')
            merged = ssa.apply(None, applied, manager, force, rtype.api_version, self._schema_for(rtype), self.defs)
            # an applied config that sets no field beyond the name records no manager (as write_managers does on an
            # update); an empty list here would differ from what the next, no-op, apply stores
            if merged['metadata'].get('managedFields'):
                created['metadata']['managedFields'] = merged['metadata']['managedFields']
            else:
                created['metadata'].pop('managedFields', None)
            if dry_run:
                return created, warnings + warnings2
            return self._commit(rtype, created, None), warnings + warnings2
        wanted_rv = applied['metadata'].get('resourceVersion')
        if wanted_rv and wanted_rv != old['metadata']['resourceVersion']:
            raise conflict(rtype, name, 'the object has been modified; please apply your changes to the latest version and try again')
        merged = ssa.apply(old, applied, manager, force, rtype.api_version, self._schema_for(rtype), self.defs, subresource)
        merged = self._validate(rtype, merged, 'Ignore', [])
        return self._write(rtype, old, merged, None, subresource, dry_run, warnings)

    def scale(self, rtype, namespace, name, body=None, dry_run=False):
        """GET (body None) or PUT of the autoscaling/v1 Scale of a workload."""
        old = self.get(rtype, namespace, name)
        if body is not None:
            replicas = ((body or {}).get('spec') or {}).get('replicas')
            if not isinstance(replicas, int) or replicas < 0:
                raise invalid(rtype, name, [schema.Problem('FieldValueInvalid', 'spec.replicas',
                                                           'Invalid value: %r: must be greater than or equal to 0' % (replicas,))])
            obj = dict(old, spec=dict(old['spec'], replicas=replicas), metadata=dict(old['metadata']))
            if obj['spec'] != old['spec']:
                obj['metadata']['generation'] = old['metadata'].get('generation', 1) + 1
                if not dry_run:
                    old = self._commit(rtype, obj, old)
                else:
                    old = obj
        selector = (old['spec'].get('selector') or {}).get('matchLabels') or {}
        return {'kind': 'Scale', 'apiVersion': 'autoscaling/v1',
                'metadata': {k: old['metadata'][k] for k in ('name', 'namespace', 'uid', 'resourceVersion', 'creationTimestamp')
                             if k in old['metadata']},
                'spec': {'replicas': old['spec'].get('replicas', 0)},
                'status': {'replicas': (old.get('status') or {}).get('replicas', 0),
                           'selector': ','.join('%s=%s' % kv for kv in sorted(selector.items()))}}

    # --- delete ----------------------------------------------------------------------------

    def delete(self, rtype, namespace, name, propagation=None, dry_run=False, preconditions=None):  # pylint: disable=too-many-arguments
        ns = namespace if rtype.namespaced else ''
        old = self.get(rtype, ns, name)
        if rtype.key == ('', 'namespaces') and name in ('default', 'kube-system', 'kube-public'):
            raise ApiError(403, 'Forbidden', 'namespaces "%s" is forbidden: this namespace may not be deleted' % name,
                           {'name': name, 'kind': 'namespaces'})
        preconditions = preconditions or {}
        if preconditions.get('uid') and preconditions['uid'] != old['metadata'].get('uid'):
            raise conflict(rtype, name, 'Precondition failed: UID in precondition: %s, UID in object meta: %s'
                           % (preconditions['uid'], old['metadata'].get('uid')))
        if preconditions.get('resourceVersion') and preconditions['resourceVersion'] != old['metadata']['resourceVersion']:
            raise conflict(rtype, name, 'Precondition failed: ResourceVersion in precondition: %s, ResourceVersion in object meta: %s'
                           % (preconditions['resourceVersion'], old['metadata']['resourceVersion']))
        if dry_run:
            return old
        if old['metadata'].get('finalizers') and rtype.key != ('', 'namespaces'):
            if old['metadata'].get('deletionTimestamp'):
                return old
            marked = dict(old, metadata=dict(old['metadata'], deletionTimestamp=timestamp(), deletionGracePeriodSeconds=0))
            return self._store(rtype.key, marked, old)
        self._finalize(rtype, old, propagation)
        return self._drop(rtype.key, old)

    def _finalize(self, rtype, obj, propagation=None):
        """What goes with an object: a namespace's contents, dependents (garbage collection), a CRD's objects."""
        if rtype.key == ('', 'namespaces'):
            name = obj['metadata']['name']
            for key in list(self._objects):
                if key == ('', 'namespaces'):
                    continue
                for item in [o for (ns, dummy), o in self._objects[key].items() if ns == name]:
                    self._drop(key, item)
        elif rtype.key == CRD_KEY:
            spec = obj.get('spec') or {}
            key = (spec.get('group'), (spec.get('names') or {}).get('plural'))
            for item in list(self._objects.get(key, {}).values()):
                self._drop(key, item)
            self.registry.remove_crd(obj['metadata']['name'])
        if propagation != 'Orphan':
            self.collect_dependents(obj['metadata'].get('uid'))

    def collect_dependents(self, uid):
        """Delete every object whose ownerReferences name uid (the garbage collector)."""
        if not uid:
            return
        for key in list(self._objects):
            for item in list(self._objects[key].values()):
                refs = item['metadata'].get('ownerReferences') or ()
                if any(ref.get('uid') == uid for ref in refs):
                    if self.peek(key, item['metadata'].get('namespace', ''), item['metadata']['name']) is item:
                        self._drop(key, item)
                        self.collect_dependents(item['metadata'].get('uid'))

    # --- CRDs -------------------------------------------------------------------------------

    def _check_crd(self, crd):
        from .schema import Problem  # pylint: disable=import-outside-toplevel
        spec = crd.get('spec') or {}
        names = spec.get('names') or {}
        problems = []
        if not spec.get('group'):
            problems.append(Problem('FieldValueRequired', 'spec.group', 'Required value'))
        if not names.get('plural'):
            problems.append(Problem('FieldValueRequired', 'spec.names.plural', 'Required value'))
        if not names.get('kind'):
            problems.append(Problem('FieldValueRequired', 'spec.names.kind', 'Required value'))
        expected = '%s.%s' % (names.get('plural'), spec.get('group'))
        if names.get('plural') and spec.get('group') and crd['metadata']['name'] != expected:
            problems.append(Problem('FieldValueInvalid', 'metadata.name', 'Invalid value: "%s": must be spec.names.plural+"."+spec.group'
                                    % crd['metadata']['name']))
        versions = spec.get('versions') or []
        if not versions:
            problems.append(Problem('FieldValueInvalid', 'spec.versions', 'Invalid value: []: must have exactly one version marked as storage '
                                    'version'))
        elif sum(1 for v in versions if v.get('storage')) != 1:
            problems.append(Problem('FieldValueInvalid', 'spec.versions', 'Invalid value: %s: must have exactly one version marked as '
                                    'storage version' % [v.get('name') for v in versions]))
        if spec.get('scope') not in ('Namespaced', 'Cluster'):
            problems.append(Problem('FieldValueNotSupported', 'spec.scope', 'Unsupported value: "%s": supported values: "Cluster", '
                                    '"Namespaced"' % spec.get('scope', '')))
        return problems

    def _accept_crd(self, crd):
        """CRD status as the apiextensions controllers write it: names accepted, Established."""
        spec = crd.get('spec') or {}
        names = dict(spec.get('names') or {})
        names.setdefault('singular', names.get('kind', '').lower())
        names.setdefault('listKind', names.get('kind', '') + 'List')
        reason = self.registry.crd_conflict(crd)
        now = timestamp()
        old_status = crd.get('status') or {}
        stored = list(old_status.get('storedVersions') or [])
        for version in spec.get('versions') or ():
            if version.get('storage') and version.get('name') not in stored:
                stored.append(version['name'])
        conditions = [
            {'type': 'NamesAccepted', 'status': 'False' if reason else 'True', 'reason': 'NameConflict' if reason else 'NoConflicts',
             'message': reason or 'no conflicts found', 'lastTransitionTime': now},
            {'type': 'Established', 'status': 'False' if reason else 'True', 'reason': 'NotAccepted' if reason else 'InitialNamesAccepted',
             'message': 'not all names are accepted' if reason else 'the initial names have been accepted', 'lastTransitionTime': now},
        ]
        for condition in conditions:
            previous = next((c for c in old_status.get('conditions') or () if c.get('type') == condition['type']), None)
            if previous and previous.get('status') == condition['status']:
                condition['lastTransitionTime'] = previous.get('lastTransitionTime', now)
        crd['status'] = {'acceptedNames': names if not reason else {}, 'conditions': conditions, 'storedVersions': stored}

    # --- writes from the lab's controllers (no validation, no managedFields) ---------------------

    def internal_create(self, rtype, obj):
        meta = obj['metadata']
        if self.peek(rtype.key, meta.get('namespace', ''), meta['name']) is not None:
            raise already_exists(rtype, meta['name'])
        meta.setdefault('uid', str(uuid.uuid4()))
        meta.setdefault('creationTimestamp', timestamp())
        obj.setdefault('apiVersion', rtype.api_version)
        obj.setdefault('kind', rtype.kind)
        if rtype.key not in _NO_GENERATION:
            meta.setdefault('generation', 1)
        return self._commit(rtype, obj, None)

    def internal_replace(self, rtype, obj, old):
        """Store obj (a new dict) over old, unless nothing changed; returns what is stored."""
        if obj == old:
            return old
        return self._commit(rtype, obj, old)

    def internal_delete(self, rtype, obj):
        if self.peek(rtype.key, obj['metadata'].get('namespace', ''), obj['metadata']['name']) is obj:
            self._finalize(rtype, obj)
            return self._drop(rtype.key, obj)
        return None


def _prefix(problem, prefix):
    return schema.Problem(problem.reason, '%s.%s' % (prefix, problem.field) if problem.field else prefix, problem.message)
