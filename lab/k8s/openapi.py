"""/openapi/v2 and /openapi/v3 documents for the served resources.

Definitions are the real ones (schema.definitions()); custom resources get their CRD's schema.
Paths carry what clients read from them: x-kubernetes-group-version-kind and
x-kubernetes-action on each operation, and the query parameters (dryRun, fieldManager,
fieldValidation, force) kubectl's query-parameter verifier looks for on PATCH.
"""

import hashlib
import json

from . import schema
from .patch import clone

_META = 'io.k8s.apimachinery.pkg.apis.meta.v1.'


def _param(name, kind='string', description=''):
    return {'name': name, 'in': 'query', 'type': kind, 'uniqueItems': True, 'description': description or name}


_WRITE_PARAMS = [
    _param('dryRun', description='When present, indicates that modifications should not be persisted.'),
    _param('fieldManager', description='fieldManager is a name associated with the actor or entity that is making these changes.'),
    _param('fieldValidation', description='fieldValidation instructs the server on how to handle objects in the request containing '
           'unknown or duplicate fields. Valid values are: Ignore, Warn, Strict.'),
]
_LIST_PARAMS = [_param(n) for n in ('labelSelector', 'fieldSelector', 'resourceVersion', 'resourceVersionMatch', 'continue')] + [
    _param('limit', 'integer'), _param('timeoutSeconds', 'integer'), _param('watch', 'boolean'), _param('allowWatchBookmarks', 'boolean'),
    _param('sendInitialEvents', 'boolean')]


def _gvk(rtype, kind=None):
    return {'group': rtype.group, 'version': rtype.version, 'kind': kind or rtype.kind}


def definition_name(rtype):
    """The definition a resource's objects are described by (CRDs: reverse-DNS group + kind)."""
    if rtype.definition:
        return rtype.definition
    return '%s.%s.%s' % ('.'.join(reversed(rtype.group.split('.'))), rtype.version, rtype.kind)


def _op(rtype, action, verb, ref, params, kind=None):
    camel = ''.join(p[:1].upper() + p[1:] for p in rtype.group.replace('.k8s.io', '').split('.')) if rtype.group else 'Core'
    op = {
        'operationId': '%s%s%s%s' % (verb, camel, rtype.version.capitalize(), rtype.kind),
        'x-kubernetes-action': action,
        'x-kubernetes-group-version-kind': _gvk(rtype, kind),
        'parameters': list(params),
        'consumes': ['*/*'] if action != 'patch' else ['application/json-patch+json', 'application/merge-patch+json',
                                                       'application/strategic-merge-patch+json', 'application/apply-patch+yaml'],
        'produces': ['application/json', 'application/yaml'],
        'responses': {'200': {'description': 'OK', 'schema': {'$ref': schema.REF_PREFIX + ref}}, '401': {'description': 'Unauthorized'}},
        'tags': [rtype.group or 'core_v1'],
    }
    return op


def _paths(rtype):
    prefix = '/api/%s' % rtype.version if not rtype.group else '/apis/%s/%s' % (rtype.group, rtype.version)
    collection = '%s/namespaces/{namespace}/%s' % (prefix, rtype.plural) if rtype.namespaced else '%s/%s' % (prefix, rtype.plural)
    item = collection + '/{name}'
    ref = definition_name(rtype)
    list_ref = ref + 'List' if rtype.definition else _META + 'List'
    status_ref = _META + 'Status'
    path_params = [{'name': 'name', 'in': 'path', 'required': True, 'type': 'string', 'uniqueItems': True}]
    if rtype.namespaced:
        path_params.append({'name': 'namespace', 'in': 'path', 'required': True, 'type': 'string', 'uniqueItems': True})
    paths = {
        collection: {
            'get': _op(rtype, 'list', 'list', list_ref, _LIST_PARAMS),
            'post': _op(rtype, 'post', 'create', ref, _WRITE_PARAMS),
            'delete': _op(rtype, 'deletecollection', 'deleteCollection', status_ref, _LIST_PARAMS + _WRITE_PARAMS[:1]),
            'parameters': path_params[1:],
        },
        item: {
            'get': _op(rtype, 'get', 'read', ref, []),
            'put': _op(rtype, 'put', 'replace', ref, _WRITE_PARAMS),
            'patch': _op(rtype, 'patch', 'patch', ref, _WRITE_PARAMS + [_param('force', 'boolean')]),
            'delete': _op(rtype, 'delete', 'delete', status_ref, _WRITE_PARAMS[:1]),
            'parameters': path_params,
        },
    }
    for sub in rtype.subresources:
        if sub not in ('status', 'scale'):
            continue
        sub_ref = ref if sub == 'status' else 'io.k8s.api.autoscaling.v1.Scale'
        kind = None if sub == 'status' else 'Scale'
        paths['%s/%s' % (item, sub)] = {
            'get': _op(rtype, 'get', 'read', sub_ref, [], kind),
            'put': _op(rtype, 'put', 'replace', sub_ref, _WRITE_PARAMS, kind),
            'patch': _op(rtype, 'patch', 'patch', sub_ref, _WRITE_PARAMS + [_param('force', 'boolean')], kind),
            'parameters': path_params,
        }
    return paths


def _crd_definition(rtype):
    node = clone(rtype.crd_schema)
    node.setdefault('type', 'object')
    props = node.setdefault('properties', {})
    props['apiVersion'] = {'type': 'string', 'description': 'APIVersion defines the versioned schema of this representation of an object.'}
    props['kind'] = {'type': 'string', 'description': 'Kind is a string value representing the REST resource this object represents.'}
    props['metadata'] = {'$ref': schema.REF_PREFIX + _META + 'ObjectMeta'}
    node['x-kubernetes-group-version-kind'] = [_gvk(rtype)]
    return node


class OpenAPI:
    """Builds and caches the documents; rebuilt when the registry's served set changes."""

    def __init__(self, registry, version_info):
        self.registry = registry
        self.version_info = version_info
        self._v2 = None
        self._v3 = {}
        self._generation = None

    def _fresh(self):
        if self._generation != self.registry.generation:
            self._v2 = None
            self._v3 = {}
            self._generation = self.registry.generation

    def v2(self):
        """The whole OpenAPI v2 (swagger) document, as JSON bytes."""
        self._fresh()
        if self._v2 is None:
            defs = dict(schema.definitions())
            paths = {}
            for rtype in self.registry.all():
                paths.update(_paths(rtype))
                if rtype.custom:
                    defs[definition_name(rtype)] = _crd_definition(rtype)
            doc = {'swagger': '2.0', 'info': {'title': 'Kubernetes', 'version': self.version_info['gitVersion']},
                   'paths': dict(sorted(paths.items())), 'definitions': defs,
                   'securityDefinitions': {'BearerToken': {'type': 'apiKey', 'name': 'authorization', 'in': 'header'}},
                   'security': [{'BearerToken': []}]}
            self._v2 = json.dumps(doc, separators=(',', ':')).encode()
        return self._v2

    def _group_versions(self):
        out = {}
        for rtype in self.registry.all():
            key = 'api/%s' % rtype.version if not rtype.group else 'apis/%s/%s' % (rtype.group, rtype.version)
            out.setdefault(key, []).append(rtype)
        return out

    def v3_doc(self, gv_path):
        """(bytes, hash) of one group-version's OpenAPI v3 document, or None."""
        self._fresh()
        if gv_path in self._v3:
            return self._v3[gv_path]
        rtypes = self._group_versions().get(gv_path)
        if not rtypes:
            return None
        defs = schema.definitions()
        paths = {}
        local = {}
        for rtype in rtypes:
            for path, item in _paths(rtype).items():
                paths[path] = _to_v3_path(item)
            if rtype.custom:
                local[definition_name(rtype)] = _crd_definition(rtype)
        wanted = []
        schema.collect_refs(list(paths.values()), wanted)
        schema.collect_refs(list(local.values()), wanted)
        names = schema.refs_closure(wanted, defs)
        schemas = {name: defs[name] for name in sorted(names)}
        schemas.update(local)
        doc = {'openapi': '3.0.0', 'info': {'title': 'Kubernetes', 'version': self.version_info['gitVersion']},
               'paths': dict(sorted(paths.items())), 'components': {'schemas': _v3_refs(schemas)}}
        data = json.dumps(doc, separators=(',', ':')).encode()
        digest = hashlib.sha512(data).hexdigest().upper()[:128]
        self._v3[gv_path] = (data, digest)
        return self._v3[gv_path]

    def v3_index(self):
        paths = {}
        for gv_path in sorted(self._group_versions()):
            digest = self.v3_doc(gv_path)[1]
            paths[gv_path] = {'serverRelativeURL': '/openapi/v3/%s?hash=%s' % (gv_path, digest)}
        return {'paths': paths}


def _to_v3_path(item):
    out = {}
    for method, op in item.items():
        if method == 'parameters':
            out['parameters'] = [_v3_param(p) for p in op]
            continue
        new = {k: v for k, v in op.items() if k not in ('consumes', 'produces', 'parameters', 'responses')}
        new['parameters'] = [_v3_param(p) for p in op['parameters']]
        ref = op['responses']['200']['schema']['$ref'].replace(schema.REF_PREFIX, '#/components/schemas/')
        new['responses'] = {'200': {'description': 'OK', 'content': {'application/json': {'schema': {'$ref': ref}}}},
                            '401': {'description': 'Unauthorized'}}
        if method in ('post', 'put', 'patch'):
            types = op['consumes'] if method == 'patch' else ['*/*']
            new['requestBody'] = {'content': {t: {'schema': {'$ref': ref}} for t in types}, 'required': True}
        out[method] = new
    return out


def _v3_param(param):
    out = {k: v for k, v in param.items() if k not in ('type', 'uniqueItems')}
    out['schema'] = {'type': param.get('type', 'string'), 'uniqueItems': True}
    return out


def _v3_refs(node):
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == '$ref' and isinstance(value, str):
                out[key] = value.replace(schema.REF_PREFIX, '#/components/schemas/')
            else:
                out[key] = _v3_refs(value)
        return out
    if isinstance(node, list):
        return [_v3_refs(item) for item in node]
    return node
