"""Server-side apply and metadata.managedFields, as structured-merge-diff does it (simplified).

A field set is a set of paths; a path is a tuple of elements in the FieldsV1 vocabulary:
`f:<name>` (a map key), `k:<json of the item's key fields>` (an item of a keyed list) and
`v:<json value>` (an item of a set). Leaves are scalars, atomic lists and atomic maps.

- Apply (PATCH application/apply-patch+yaml): the applied configuration's fields are merged
  into the live object. A field another manager owns with a different value is a conflict
  (409, one cause per field, as kubectl prints them) unless force is set, which moves the
  ownership. Fields the same manager applied before and no longer applies are removed when
  nobody else owns them.
- Other writes (create, update, patch) give their manager the fields whose values they set or
  changed, and take those fields away from other managers.
"""

import datetime
import json

from . import schema as schema_mod
from .errors import ApiError
from .patch import clone

IGNORED_METADATA = {'name', 'namespace', 'uid', 'resourceVersion', 'generation', 'creationTimestamp', 'managedFields', 'selfLink',
                    'deletionTimestamp', 'deletionGracePeriodSeconds'}


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


def _child(schema, key, defs):
    node = schema_mod.resolve(schema, defs)
    props = node.get('properties') or {}
    if key in props:
        return props[key]
    extra = node.get('additionalProperties')
    return extra if isinstance(extra, dict) else {}


def _items(schema, defs):
    node = schema_mod.resolve(schema, defs)
    items = node.get('items')
    return items if isinstance(items, dict) else {}


# Values the server defaults for list-map key fields before merging (ports: protocol TCP).
KEY_DEFAULTS = {'protocol': 'TCP'}


def _item_key(item, keys):
    values = {}
    for key in keys:
        value = item.get(key, KEY_DEFAULTS.get(key))
        if value is not None:
            values[key] = value
    return 'k:' + json.dumps(values, sort_keys=True, separators=(',', ':'))


def fieldset(obj, schema, defs, section):
    """The paths set in obj. section: 'main' (everything but status) or 'status' (status only)."""
    out = set()
    for key, value in obj.items():
        if key in ('apiVersion', 'kind'):
            continue
        if section == 'status' and key != 'status':
            continue
        if section == 'main' and key == 'status':
            continue
        if key == 'metadata' and isinstance(value, dict):
            meta_schema = _child(schema, 'metadata', defs)
            for mkey, mvalue in value.items():
                if mkey not in IGNORED_METADATA and mvalue is not None:
                    _fields(mvalue, _child(meta_schema, mkey, defs), ('f:metadata', 'f:' + mkey), out, defs)
            continue
        if value is not None:
            _fields(value, _child(schema, key, defs), ('f:' + key,), out, defs)
    return out


def _fields(value, schema, prefix, out, defs):
    node = schema_mod.resolve(schema, defs)
    if isinstance(value, dict):
        if not value or node.get('x-kubernetes-map-type') == 'atomic':
            out.add(prefix)
            return
        for key, sub in value.items():
            if sub is not None:
                _fields(sub, _child(node, key, defs), prefix + ('f:' + key,), out, defs)
        return
    if isinstance(value, list):
        mode, keys = schema_mod.list_meta(node)
        if mode == 'map' and value and all(isinstance(i, dict) and all(k in i for k in keys[:1]) for i in value):
            items = _items(node, defs)
            for item in value:
                item_path = prefix + (_item_key(item, keys),)
                out.add(item_path)
                for key, sub in item.items():
                    if sub is not None:
                        _fields(sub, _child(items, key, defs), item_path + ('f:' + key,), out, defs)
            return
        if mode == 'set' and value and all(not isinstance(i, (dict, list)) for i in value):
            for item in value:
                out.add(prefix + ('v:' + json.dumps(item, separators=(',', ':')),))
            return
    out.add(prefix)


def to_fields_v1(paths):
    """Path set -> FieldsV1 trie ({'f:spec': {'f:replicas': {}}, 'k:{..}': {'.': {}, ...}})."""
    root = {}
    for path in sorted(paths):
        node = root
        for element in path:
            node = node.setdefault(element, {})
        if path and path[-1][:2] in ('k:', 'v:') and node is not None:
            node.setdefault('.', {})
    _drop_redundant_dots(root)
    return root


def _drop_redundant_dots(node):
    for key, sub in node.items():
        if isinstance(sub, dict):
            _drop_redundant_dots(sub)
            if key.startswith('v:') and list(sub) == ['.']:
                sub.clear()


def from_fields_v1(trie, prefix=()):
    """FieldsV1 trie -> path set."""
    out = set()
    if not isinstance(trie, dict):
        return out
    for key, sub in trie.items():
        if key == '.':
            out.add(prefix)
            continue
        path = prefix + (key,)
        if not sub:
            out.add(path)
        else:
            out |= from_fields_v1(sub, path)
    return out


def _lookup(obj, path):
    """(present, value) of one path in obj."""
    value = obj
    for element in path:
        kind, text = element[:2], element[2:]
        if kind == 'f:':
            if not isinstance(value, dict) or text not in value:
                return False, None
            value = value[text]
        elif kind == 'k:':
            if not isinstance(value, list):
                return False, None
            want = json.loads(text)
            value = next((i for i in value if isinstance(i, dict) and all(i.get(k, KEY_DEFAULTS.get(k)) == v for k, v in want.items())),
                         _MISSING)
            if value is _MISSING:
                return False, None
        elif kind == 'v:':
            if not isinstance(value, list):
                return False, None
            want = json.loads(text)
            return want in value, want
        else:
            return False, None
    return True, value


_MISSING = object()


def _remove(obj, path):
    """Remove one path from obj in place (obj must be a private copy)."""
    parents = []
    value = obj
    for element in path[:-1]:
        present, value = _lookup(value, (element,))
        if not present:
            return
        parents.append(value)
    last = path[-1]
    kind, text = last[:2], last[2:]
    if kind == 'f:' and isinstance(value, dict):
        value.pop(text, None)
    elif kind == 'k:' and isinstance(value, list):
        want = json.loads(text)
        value[:] = [i for i in value if not (isinstance(i, dict) and all(i.get(k, KEY_DEFAULTS.get(k)) == v for k, v in want.items()))]
    elif kind == 'v:' and isinstance(value, list):
        want = json.loads(text)
        value[:] = [i for i in value if i != want]


def merge(live, applied, schema, defs):
    """Merge an applied configuration into the live object (neither is modified)."""
    node = schema_mod.resolve(schema, defs)
    if isinstance(live, dict) and isinstance(applied, dict) and node.get('x-kubernetes-map-type') != 'atomic':
        out = dict(live)
        for key, value in applied.items():
            if value is None:
                continue
            out[key] = merge(live.get(key), value, _child(node, key, defs), defs)
        return out
    if isinstance(live, list) and isinstance(applied, list):
        mode, keys = schema_mod.list_meta(node)
        if mode == 'map' and all(isinstance(i, dict) for i in live + applied):
            items = _items(node, defs)
            out = list(live)
            for item in applied:
                key = _item_key(item, keys)
                index = next((n for n, cur in enumerate(out) if _item_key(cur, keys) == key), None)
                if index is None:
                    out.append(clone(item))
                else:
                    out[index] = merge(out[index], item, items, defs)
            return out
        if mode == 'set':
            out = list(live)
            for item in applied:
                if item not in out:
                    out.append(clone(item))
            return out
    return clone(applied)


def read_managers(obj):
    """metadata.managedFields -> list of [entry-without-fields, path set]."""
    out = []
    for entry in (obj.get('metadata') or {}).get('managedFields') or ():
        fields = from_fields_v1(entry.get('fieldsV1') or {})
        out.append([{k: v for k, v in entry.items() if k != 'fieldsV1'}, fields])
    return out


def write_managers(obj, managers):
    entries = []
    for entry, fields in managers:
        if not fields:
            continue
        record = dict(entry)
        record['fieldsType'] = 'FieldsV1'
        record['fieldsV1'] = to_fields_v1(fields)
        entries.append(record)
    obj.setdefault('metadata', {})
    if entries:
        obj['metadata']['managedFields'] = entries
    else:
        obj['metadata'].pop('managedFields', None)


def _entry(managers, manager, operation, api_version, subresource):
    for item in managers:
        entry = item[0]
        if entry.get('manager') == manager and entry.get('operation') == operation and entry.get('subresource', '') == (subresource or ''):
            return item
    entry = {'manager': manager, 'operation': operation, 'apiVersion': api_version, 'time': now()}
    if subresource:
        entry['subresource'] = subresource
    item = [entry, set()]
    managers.append(item)
    return item


def _path_text(path):
    parts = []
    for element in path:
        kind, text = element[:2], element[2:]
        if kind == 'f:':
            parts.append('.' + text)
        elif kind == 'k:':
            want = json.loads(text)
            parts.append('[%s]' % ','.join('%s=%s' % (k, json.dumps(v)) for k, v in sorted(want.items())))
        else:
            parts.append('[=%s]' % text)
    return ''.join(parts)


def apply(live, applied, manager, force, api_version, schema, defs, subresource=''):  # pylint: disable=too-many-arguments,too-many-locals
    """Server-side apply: returns the new object (with managedFields); raises 409 on conflicts."""
    section = 'status' if subresource == 'status' else 'main'
    new_set = fieldset(applied, schema, defs, section)
    managers = read_managers(live) if live else []
    base = clone(live) if live else {}
    mine = _entry(managers, manager, 'Apply', api_version, subresource)
    conflicts = []
    for item in managers:
        if item is mine:
            continue
        for path in item[1] & new_set:
            if path[-1][:2] in ('k:', 'v:'):
                continue
            live_value = _lookup(base, path)[1]
            want = _lookup(applied, path)[1]
            if live_value != want:
                conflicts.append((item[0], path))
    if conflicts and not force:
        causes = [{'type': 'FieldManagerConflict', 'message': 'conflict with "%s"%s' % (
            entry.get('manager'), ' using %s' % entry.get('apiVersion') if entry.get('apiVersion') else ''), 'field': _path_text(path)}
            for entry, path in sorted(conflicts, key=lambda c: (c[0].get('manager', ''), c[1]))]
        lines = ['%s: %s' % (c['message'], c['field']) for c in causes]
        message = 'Apply failed with %d conflict%s: %s' % (len(causes), '' if len(causes) == 1 else 's',
                                                           lines[0] if len(lines) == 1 else '\n' + '\n'.join(lines))
        raise ApiError(409, 'Conflict', message, {'causes': causes})
    for entry, path in conflicts:
        for item in managers:
            if item[0] is entry:
                item[1].discard(path)
    merged = merge(base, {k: v for k, v in applied.items() if k != 'status'} if section == 'main'
                   else {'status': applied.get('status') or {}}, schema, defs)
    if section == 'main':
        merged['metadata'] = merge(base.get('metadata') or {}, {k: v for k, v in (applied.get('metadata') or {}).items()
                                                                if k not in IGNORED_METADATA}, _child(schema, 'metadata', defs), defs)
    previous = mine[1]
    others = set()
    for item in managers:
        if item is not mine:
            others |= item[1]
    for path in sorted(previous - new_set, key=len, reverse=True):
        if path not in others and not any(o[:len(path)] == path for o in others):
            _remove(merged, path)
    content_changed = _without_managed(merged) != _without_managed(base)
    if content_changed or previous != new_set or 'time' not in mine[0]:
        mine[0]['time'] = now()
        mine[0]['apiVersion'] = api_version
    mine[1] = new_set
    write_managers(merged, [m for m in managers if m[1]])
    return merged


def _without_managed(obj):
    meta = {k: v for k, v in (obj.get('metadata') or {}).items() if k != 'managedFields'}
    return dict(obj, metadata=meta)


def record_update(old, new, manager, api_version, schema, defs, subresource=''):
    """Managed fields after a non-apply write of new over old (new is modified in place)."""
    section = 'status' if subresource == 'status' else 'main'
    new_set = fieldset(new, schema, defs, section)
    managers = read_managers(old) if old else []
    changed = set()
    for path in new_set:
        present, value = _lookup(old, path) if old else (False, None)
        new_value = _lookup(new, path)[1]
        if not present or value != new_value:
            changed.add(path)
    old_set = fieldset(old, schema, defs, section) if old else set()
    removed = old_set - new_set
    for item in managers:
        item[1] -= changed
        item[1] -= removed
    if changed:
        mine = _entry(managers, manager, 'Update', api_version, subresource)
        mine[0]['time'] = now()
        mine[0]['apiVersion'] = api_version
        mine[1] |= changed
    write_managers(new, [m for m in managers if m[1]])
    return new
