"""Real Kubernetes OpenAPI definitions for the lab API, and a validator over them.

The definitions come from the `kubernetes-validate` package, which ships the swagger
definitions of each Kubernetes release converted to JSON Schema (nullable types, int-or-string
as oneOf) with every `x-kubernetes-*` extension kept (group-version-kind, patch merge keys,
list types). `definitions()` turns them back into OpenAPI v2 form (`#/definitions/...` refs,
plain types, `format: int-or-string`), which is what the API serves at /openapi/v2 and /v3 and
what the validator, the strategic merge patch and server-side apply read.

The validator does what the real API server's decoding and validation do to a written object:
unknown fields are dropped (and reported, for fieldValidation Strict/Warn), values of the wrong
type, missing required fields and values outside an enum are errors with the field path.
"""

import base64
import binascii
import functools
import json
import os

KUBERNETES_VERSION = 'v1.33.0'
REF_PREFIX = '#/definitions/'


def _schema_file(version):
    try:
        import kubernetes_validate  # pylint: disable=import-outside-toplevel
    except ImportError as exc:  # pragma: no cover - a dev requirement
        raise RuntimeError('the lab Kubernetes API needs the kubernetes-validate package (requirements-dev.txt)') from exc
    base = os.path.join(os.path.dirname(kubernetes_validate.__file__), 'kubernetes-json-schema')
    return os.path.join(base, '%s-local' % version, '_definitions.json')


def _convert(node):
    """One JSON Schema node from kubernetes-validate back to its OpenAPI v2 form."""
    if isinstance(node, list):
        return [_convert(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == '$ref':
            out[key] = REF_PREFIX + value.rsplit('/', 1)[-1]
        elif key == 'type' and isinstance(value, list):
            types = [t for t in value if t != 'null']
            out[key] = types[0] if len(types) == 1 else types
        elif key == 'oneOf' and isinstance(value, list):
            kinds = sorted(t for item in value for t in (item.get('type') or []) if t != 'null')
            if kinds == ['integer', 'string']:
                out.update({'type': 'string', 'format': 'int-or-string'})
            elif kinds == ['number', 'string']:
                out.update({'type': 'string'})
            else:
                out[key] = _convert(value)
        elif key == 'properties' and isinstance(value, dict):
            out[key] = {name: _convert(sub) for name, sub in value.items()}
        elif key in ('items', 'additionalProperties') and isinstance(value, dict):
            out[key] = _convert(value)
        else:
            out[key] = value
    return out


@functools.lru_cache(maxsize=None)
def definitions(version=KUBERNETES_VERSION):
    """All definitions of one Kubernetes release, in OpenAPI v2 form (cached; treat as read-only)."""
    with open(_schema_file(version), encoding='utf-8') as handle:
        raw = json.load(handle)['$defs']
    defs = {name: _convert(node) for name, node in raw.items()}
    # kubernetes-validate types Quantity as string-or-number; the API publishes a string.
    if 'io.k8s.apimachinery.pkg.api.resource.Quantity' in defs:
        defs['io.k8s.apimachinery.pkg.api.resource.Quantity'].setdefault('type', 'string')
    return defs


@functools.lru_cache(maxsize=None)
def definitions_by_gvk(version=KUBERNETES_VERSION):
    """(group, version, kind) -> definition name."""
    index = {}
    for name, node in definitions(version).items():
        for gvk in node.get('x-kubernetes-group-version-kind') or ():
            index[(gvk.get('group', ''), gvk['version'], gvk['kind'])] = name
    return index


def resolve(node, defs):
    """Follow $ref (and a single allOf[$ref] wrapper) to the schema node it names."""
    while isinstance(node, dict):
        if '$ref' in node:
            node = defs.get(node['$ref'][len(REF_PREFIX):], {})
        elif len(node.get('allOf') or ()) == 1 and not node.get('properties'):
            node = node['allOf'][0]
        else:
            break
    return node if isinstance(node, dict) else {}


def refs_closure(names, defs):
    """Every definition name reachable from `names` through $ref."""
    seen = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name in seen or name not in defs:
            continue
        seen.add(name)
        collect_refs(defs[name], stack)
    return seen


def collect_refs(node, out):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == '$ref' and isinstance(value, str):
                out.append(value[len(REF_PREFIX):] if value.startswith(REF_PREFIX) else value.rsplit('/', 1)[-1])
            else:
                collect_refs(value, out)
    elif isinstance(node, list):
        for value in node:
            collect_refs(value, out)


def list_meta(schema):
    """How a list field merges: ('map', keys) | ('set', None) | ('atomic', None).

    Reads x-kubernetes-list-type/-list-map-keys first, then the strategic-merge
    x-kubernetes-patch-strategy/-patch-merge-key of older fields.
    """
    list_type = schema.get('x-kubernetes-list-type')
    if list_type == 'map' and schema.get('x-kubernetes-list-map-keys'):
        return 'map', tuple(schema['x-kubernetes-list-map-keys'])
    strategy = schema.get('x-kubernetes-patch-strategy', '')
    if 'merge' in strategy.split(','):
        if schema.get('x-kubernetes-patch-merge-key'):
            return 'map', (schema['x-kubernetes-patch-merge-key'],)
        return 'set', None
    if list_type == 'set':
        return 'set', None
    return 'atomic', None


class Problem:
    """One validation finding: a StatusCause-like (reason, field, message)."""

    __slots__ = ('reason', 'field', 'message')

    def __init__(self, reason, field, message):
        self.reason = reason
        self.field = field
        self.message = message

    def __repr__(self):
        return 'Problem(%r, %r, %r)' % (self.reason, self.field, self.message)


class Validator:
    """Validate and prune one object against a schema (a built-in definition or a CRD's)."""

    def __init__(self, defs, structural=False):
        self.defs = defs
        self.quantity = defs.get('io.k8s.apimachinery.pkg.api.resource.Quantity')
        # structural: a CRD openAPIV3Schema (x-kubernetes-preserve-unknown-fields, anyOf...)
        self.structural = structural

    def check(self, obj, schema):
        """Return (pruned_obj, errors, unknown_fields). The input is not modified."""
        errors, unknown = [], []
        pruned = self._walk(obj, schema, '', errors, unknown)
        return pruned, errors, unknown

    def _walk(self, value, schema, path, errors, unknown):  # pylint: disable=too-many-return-statements,too-many-branches
        schema = resolve(schema, self.defs)
        if value is None or not schema:
            return value
        if self.structural and schema.get('x-kubernetes-int-or-string'):
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                errors.append(Problem('FieldValueTypeInvalid', path, 'Invalid value: %s: must be an integer or a string' % _short(value)))
            return value
        kind = schema.get('type')
        if isinstance(kind, list):
            kind = kind[0] if kind else None
        fmt = schema.get('format')
        if kind == 'object' or (kind is None and ('properties' in schema or isinstance(schema.get('additionalProperties'), dict))):
            if not isinstance(value, dict):
                errors.append(Problem('FieldValueTypeInvalid', path, 'Invalid value: %s: %s in body must be of type object: "%s"'
                                      % (_short(value), path or '<root>', _json_type(value))))
                return value
            return self._walk_object(value, schema, path, errors, unknown)
        if kind == 'array':
            if not isinstance(value, list):
                errors.append(Problem('FieldValueTypeInvalid', path, 'Invalid value: %s: %s in body must be of type array: "%s"'
                                      % (_short(value), path, _json_type(value))))
                return value
            items = schema.get('items')
            if not isinstance(items, dict):
                return value
            return [self._walk(item, items, '%s[%d]' % (path, index), errors, unknown) for index, item in enumerate(value)]
        if kind == 'string':
            ok = isinstance(value, str) or (fmt == 'int-or-string' and isinstance(value, int) and not isinstance(value, bool))
            if not ok and isinstance(value, (int, float)) and not isinstance(value, bool) and schema is self.quantity:
                # resource.Quantity also decodes from a JSON number, and is always written back as a string
                return str(int(value)) if float(value).is_integer() else '%dm' % round(value * 1000)
            if not ok:
                errors.append(Problem('FieldValueTypeInvalid', path, 'Invalid value: %s: %s in body must be of type string: "%s"'
                                      % (_short(value), path, _json_type(value))))
                return value
            if fmt == 'byte' and isinstance(value, str):
                try:
                    base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError):
                    errors.append(Problem('FieldValueInvalid', path, 'Invalid value: %s: illegal base64 data' % _short(value)))
        elif kind == 'integer':
            if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
                errors.append(Problem('FieldValueTypeInvalid', path, 'Invalid value: %s: %s in body must be of type integer: "%s"'
                                      % (_short(value), path, _json_type(value))))
                return value
        elif kind == 'number':
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                errors.append(Problem('FieldValueTypeInvalid', path, 'Invalid value: %s: %s in body must be of type number: "%s"'
                                      % (_short(value), path, _json_type(value))))
                return value
        elif kind == 'boolean':
            if not isinstance(value, bool):
                errors.append(Problem('FieldValueTypeInvalid', path, 'Invalid value: %s: %s in body must be of type boolean: "%s"'
                                      % (_short(value), path, _json_type(value))))
                return value
        enum = schema.get('enum')
        if enum and value not in enum and not (value == '' and '' not in enum and not self.structural):
            errors.append(Problem('FieldValueNotSupported', path, 'Unsupported value: %s: supported values: %s'
                                  % (json.dumps(value), ', '.join(json.dumps(v) for v in enum))))
        return value

    def _walk_object(self, value, schema, path, errors, unknown):
        props = schema.get('properties')
        extra = schema.get('additionalProperties')
        preserve = schema.get('x-kubernetes-preserve-unknown-fields') or (not self.structural and not props and extra is None)
        out = {}
        for key, sub in value.items():
            sub_path = '%s.%s' % (path, key) if path else key
            if props and key in props:
                out[key] = self._walk(sub, props[key], sub_path, errors, unknown)
            elif isinstance(extra, dict):
                out[key] = self._walk(sub, extra, sub_path, errors, unknown)
            elif extra is True or preserve:
                out[key] = sub
            elif key in ('apiVersion', 'kind') and not path:
                out[key] = sub
            else:
                unknown.append(sub_path)
        if self.structural and props:
            for name, prop in props.items():
                if name not in out and isinstance(prop, dict) and 'default' in prop:
                    out[name] = json.loads(json.dumps(prop['default']))
        for name in schema.get('required') or ():
            if out.get(name) is None and not (name in ('apiVersion', 'kind', 'metadata') and not path):
                sub_path = '%s.%s' % (path, name) if path else name
                errors.append(Problem('FieldValueRequired', sub_path, 'Required value'))
        return out


def _json_type(value):
    if isinstance(value, bool):
        return 'boolean'
    if isinstance(value, (int, float)):
        return 'number'
    if isinstance(value, str):
        return 'string'
    if isinstance(value, list):
        return 'array'
    if isinstance(value, dict):
        return 'object'
    return 'null'


def _short(value):
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + '...'
