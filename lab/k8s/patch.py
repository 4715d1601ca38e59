"""JSON patch (RFC 6902), JSON merge patch (RFC 7386) and strategic merge patch.

Strategic merge patch follows the schema's patch strategies: lists with a merge key
(containers by name, env by name, ports by containerPort, ...) merge item by item, lists with
strategy `merge` and no key are unions, other lists are replaced; the directives `$patch`
(replace/delete/merge), `$retainKeys`, `$deleteFromPrimitiveList/<field>` and
`$setElementOrder/<field>` are honoured.
"""

from . import schema as schema_mod
from .errors import ApiError


def clone(value):
    """A deep copy of JSON-like data (much faster than copy.deepcopy)."""
    if isinstance(value, dict):
        return {key: clone(item) for key, item in value.items()}
    if isinstance(value, list):
        return [clone(item) for item in value]
    return value


# --- JSON patch --------------------------------------------------------------------------------

def _pointer(path):
    if path == '':
        return []
    if not path.startswith('/'):
        raise ApiError(422, 'Invalid', 'the JSON pointer %r does not start with "/"' % path)
    return [part.replace('~1', '/').replace('~0', '~') for part in path[1:].split('/')]


def _container(doc, parts, path):
    target = doc
    for part in parts[:-1]:
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise ApiError(422, 'Invalid', 'the server rejected our request due to an error in our request: '
                           'doc is missing path: "%s": missing value' % path)
    return target


def json_patch(doc, operations):
    """Apply an RFC 6902 operation list to a copy of doc."""
    if not isinstance(operations, list):
        raise ApiError(400, 'BadRequest', 'json patch must be a list of operations')
    doc = clone(doc)
    for op in operations:
        if not isinstance(op, dict) or 'op' not in op:
            raise ApiError(400, 'BadRequest', 'invalid json patch operation: %r' % (op,))
        kind, path = op['op'], op.get('path', '')
        if kind in ('move', 'copy'):
            value = _get(doc, op.get('from', ''))
            if kind == 'move':
                doc = _remove(doc, op.get('from', ''))
            doc = _add(doc, path, clone(value))
        elif kind == 'add':
            doc = _add(doc, path, clone(op.get('value')))
        elif kind == 'remove':
            doc = _remove(doc, path)
        elif kind == 'replace':
            _get(doc, path)
            doc = _remove(doc, path) if path else doc
            doc = _add(doc, path, clone(op.get('value')))
        elif kind == 'test':
            if _get(doc, path) != op.get('value'):
                raise ApiError(422, 'Invalid', 'testing value %s failed' % path)
        else:
            raise ApiError(400, 'BadRequest', 'unexpected json patch operation %r' % kind)
    return doc


def _get(doc, path):
    parts = _pointer(path)
    target = _container(doc, parts, path) if parts else None
    if not parts:
        return doc
    last = parts[-1]
    if isinstance(target, dict) and last in target:
        return target[last]
    if isinstance(target, list) and last.isdigit() and int(last) < len(target):
        return target[int(last)]
    raise ApiError(422, 'Invalid', 'the server rejected our request due to an error in our request: '
                   'doc is missing path: "%s": missing value' % path)


def _add(doc, path, value):
    parts = _pointer(path)
    if not parts:
        return value
    target = _container(doc, parts, path)
    last = parts[-1]
    if isinstance(target, dict):
        target[last] = value
    elif isinstance(target, list):
        if last == '-':
            target.append(value)
        elif last.isdigit() and int(last) <= len(target):
            target.insert(int(last), value)
        else:
            raise ApiError(422, 'Invalid', 'add operation does not apply: index %s out of bounds for %s' % (last, path))
    else:
        raise ApiError(422, 'Invalid', 'doc is missing path: "%s"' % path)
    return doc


def _remove(doc, path):
    parts = _pointer(path)
    _get(doc, path)
    target = _container(doc, parts, path)
    last = parts[-1]
    if isinstance(target, dict):
        del target[last]
    else:
        del target[int(last)]
    return doc


# --- JSON merge patch --------------------------------------------------------------------------

def merge_patch(doc, patch):
    """RFC 7386: objects merge, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return clone(patch)
    out = dict(doc) if isinstance(doc, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# --- strategic merge patch ---------------------------------------------------------------------

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


def strategic_merge_patch(doc, patch, schema, defs):
    """Apply a strategic merge patch to doc (not modified) following schema's patch strategies."""
    if not isinstance(patch, dict):
        raise ApiError(400, 'BadRequest', 'strategic merge patch must be a JSON object')
    return _smp_map(doc if isinstance(doc, dict) else {}, patch, schema, defs)


def _smp_map(doc, patch, schema, defs):  # pylint: disable=too-many-branches
    directive = patch.get('$patch')
    if directive == 'replace':
        return {k: clone(v) for k, v in patch.items() if k != '$patch'}
    if directive == 'delete':
        return None
    out = dict(doc)
    orders = {}
    for key, value in patch.items():
        if key in ('$patch', '$retainKeys'):
            continue
        if key.startswith('$setElementOrder/'):
            orders[key.split('/', 1)[1]] = value
            continue
        if key.startswith('$deleteFromPrimitiveList/'):
            field = key.split('/', 1)[1]
            drop = set(map(_hashable, value or ()))
            out[field] = [item for item in out.get(field) or () if _hashable(item) not in drop]
            continue
        if key.startswith('$'):
            raise ApiError(400, 'BadRequest', 'unknown strategic merge patch directive %s' % key)
        child = _child(schema, key, defs)
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            node = schema_mod.resolve(child, defs)
            if node.get('x-kubernetes-map-type') == 'atomic' or 'replace' in node.get('x-kubernetes-patch-strategy', ''):
                out[key] = {k: clone(v) for k, v in value.items() if k != '$patch'}
            else:
                merged = _smp_map(out.get(key) if isinstance(out.get(key), dict) else {}, value, child, defs)
                if merged is None:
                    out.pop(key, None)
                else:
                    out[key] = merged
        elif isinstance(value, list):
            out[key] = _smp_list(out.get(key) if isinstance(out.get(key), list) else [], value, child, defs)
        else:
            out[key] = value
    if '$retainKeys' in patch:
        keep = set(patch['$retainKeys'] or ())
        out = {k: v for k, v in out.items() if k in keep}
    for field, order in orders.items():
        if isinstance(out.get(field), list):
            out[field] = _reorder(out[field], order, _child(schema, field, defs), defs)
    return out


def _smp_list(doc, patch, schema, defs):
    node = schema_mod.resolve(schema, defs)
    mode, keys = schema_mod.list_meta(node)
    strategy = node.get('x-kubernetes-patch-strategy', '')
    if 'merge' not in strategy.split(','):
        mode = 'atomic'
    if any(isinstance(item, dict) and item.get('$patch') == 'replace' for item in patch):
        return [clone({k: v for k, v in item.items() if k != '$patch'}) for item in patch
                if not (isinstance(item, dict) and item.get('$patch') == 'replace' and len(item) == 1)]
    if mode == 'set':
        out = list(doc)
        seen = set(map(_hashable, out))
        for item in patch:
            if _hashable(item) not in seen:
                out.append(clone(item))
                seen.add(_hashable(item))
        return out
    if mode != 'map':
        return clone(patch)
    key = keys[0]
    out = list(doc)
    items_schema = _items(node, defs)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise ApiError(400, 'BadRequest', 'map: %r does not contain declared merge key: %s' % (item, key))
        index = next((i for i, cur in enumerate(out) if isinstance(cur, dict) and cur.get(key) == item[key]), None)
        if item.get('$patch') == 'delete':
            if index is not None:
                del out[index]
            continue
        if index is None:
            out.append(clone({k: v for k, v in item.items() if k != '$patch'}))
        else:
            out[index] = _smp_map(out[index], item, items_schema, defs)
    return out


def _reorder(items, order, schema, defs):
    node = schema_mod.resolve(schema, defs)
    mode, keys = schema_mod.list_meta(node)
    if mode == 'map':
        rank = {_hashable(o.get(keys[0])): i for i, o in enumerate(order) if isinstance(o, dict)}
        return sorted(items, key=lambda it: rank.get(_hashable(it.get(keys[0]) if isinstance(it, dict) else None), len(rank)))
    rank = {_hashable(o): i for i, o in enumerate(order)}
    return sorted(items, key=lambda it: rank.get(_hashable(it), len(rank)))


def _hashable(value):
    if isinstance(value, (dict, list)):
        import json  # pylint: disable=import-outside-toplevel
        return json.dumps(value, sort_keys=True)
    return value
