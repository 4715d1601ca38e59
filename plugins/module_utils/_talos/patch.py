# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Talos machine-config patches: strategic merge and RFC 6902 JSON patches. PRIVATE.

A machine config is handled as a list of documents (dicts): the legacy v1alpha1 document
(no apiVersion/kind; `version: v1alpha1`) and typed documents (`apiVersion` + `kind`, plus
`name` for named kinds).

Strategic merge, with Talos's rules (talos.dev "Configuration Patches" and
pkg/machinery/config/merge):

- maps merge key by key, deeply; a patch value replaces a scalar, except that an empty
  string or a zero number does not (Go zero values are "not set"; `false` does replace);
  a null value is "not set" and changes nothing;
- the `extraArgs` maps of kubelet, apiServer, controllerManager, scheduler, proxy and etcd take
  each key of the patch whole: a patch value (list or string) replaces that key's value
  (v1alpha1_types.go `Args.Merge`, v1.13);
- lists are appended to, except:
  - `cluster.network.podSubnets`, `cluster.network.serviceSubnets` and
    `cluster.apiServer.auditPolicy` are replaced;
  - `machine.network.interfaces` items merge with the item of the same `interface` or
    `deviceSelector`; their `vlans` items merge by `vlanId`;
  - `cluster.apiServer.admissionControl` items merge by `name`;
  - `configFiles` of an ExtensionServiceConfig document merge by `mountPath`;
  - `rules` of an ImageVerificationConfig document merge by `image` (a rule with the same image
    pattern is replaced whole);
  - `ingress` and `portSelector.ports` of a NetworkRuleConfig document are replaced;
- `$patch: delete` as the value of a key removes that key (not inside a list item: Talos refuses
  "cannot delete an inner key"); as a list item it removes the first item whose field named by
  the item's first other key has that value (Talos's decoder selects by that one key:value); as
  a whole typed document it removes that document (the v1alpha1 document cannot be removed).
  Deleting something absent is an error;
- a patch may hold several documents: a v1alpha1 one merges into the v1alpha1 document, a
  typed one merges into the document with the same apiVersion, kind and name, or is
  appended when there is none.

JSON patches (RFC 6902: add, remove, replace, move, copy, test; JSON pointers with ~0/~1
escapes) apply to the v1alpha1 document only. Note: talosctl itself refuses JSON patches on a
multi-document config; here they are applied to the v1alpha1 document, which is what their
paths (/machine/..., /cluster/...) address. A JSON patch is atomic: on error nothing changes.

Patches come in three levels applied in order: cluster, group (controlplane/worker), host.
Every error is a ValidationError naming the patch (`patches.<level>[<index>]`) and the path;
messages never quote patch or config values.
"""

from __future__ import annotations

import copy
import re

from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import talosyaml

LEVELS = ('cluster', 'group', 'host')
PATCH_DIRECTIVE = '$patch'
JSON_OPS = ('add', 'remove', 'replace', 'move', 'copy', 'test')

# Paths (keys, '*' for any list index) whose lists/maps a patch replaces instead of merging.
V1ALPHA1_REPLACE = frozenset([
    ('cluster', 'network', 'podSubnets'),
    ('cluster', 'network', 'serviceSubnets'),
    ('cluster', 'apiServer', 'auditPolicy'),
])
# Lists whose items merge with the item that has the same value in one of these keys.
V1ALPHA1_MERGE_KEYS = {
    ('machine', 'network', 'interfaces'): ('interface', 'deviceSelector'),
    ('machine', 'network', 'interfaces', '*', 'vlans'): ('vlanId',),
    ('cluster', 'apiServer', 'admissionControl'): ('name',),
}
TYPED_MERGE_KEYS = {
    'ExtensionServiceConfig': {('configFiles',): ('mountPath',)},
}
# ImageVerificationRules.Merge replaces the rule with the same image pattern, appends the others
# (siderolabs/talos v1.13.9 pkg/machinery/config/types/security/image_verification.go:69-92).
TYPED_REPLACE_ITEMS = {
    'ImageVerificationConfig': {('rules',): 'image'},
}
# Fields tagged merge:"replace" (pkg/machinery/config/types/network/rule_config.go:65, 84).
TYPED_REPLACE = {
    'NetworkRuleConfig': frozenset([('ingress',), ('portSelector', 'ports')]),
}
# The Args maps (v1alpha1_types.go:715, 1202, 1337, 1382, 1404, 1481): Args.Merge copies the patch's keys over
# (maps.Copy, :74-91), so a key's list or string is replaced, not appended to.
V1ALPHA1_ARGS = frozenset([
    ('machine', 'kubelet', 'extraArgs'),
    ('cluster', 'apiServer', 'extraArgs'),
    ('cluster', 'controllerManager', 'extraArgs'),
    ('cluster', 'scheduler', 'extraArgs'),
    ('cluster', 'proxy', 'extraArgs'),
    ('cluster', 'etcd', 'extraArgs'),
])

_INDEX_RE = re.compile(r'^(?:0|[1-9][0-9]*)$')


class Patch(object):
    """A parsed patch: kind 'strategic' (documents) or 'json6902' (operations)."""

    def __init__(self, field, kind, documents=None, operations=None):
        self.field = field
        self.kind = kind
        self.documents = documents or []
        self.operations = operations or []

    def __repr__(self):
        return 'Patch(%s, %s)' % (self.field, self.kind)


# --- document helpers ---------------------------------------------------------------------------

def is_v1alpha1(document):
    """True for the legacy v1alpha1 document (a mapping without `kind`)."""
    return isinstance(document, dict) and 'kind' not in document


def document_identity(document):
    """(apiVersion, kind, name) of a typed document; ('v1alpha1',) for the legacy one."""
    if is_v1alpha1(document):
        return ('v1alpha1',)
    return (document.get('apiVersion'), document.get('kind'), document.get('name'))


def describe_document(document):
    """'v1alpha1', 'HostnameConfig' or 'LinkConfig(ens18)' for messages."""
    if is_v1alpha1(document):
        return 'v1alpha1'
    name = document.get('name')
    return '%s(%s)' % (document.get('kind'), name) if name is not None else str(document.get('kind'))


def _render_path(prefix, path):
    text = prefix or ''
    for part in path:
        if isinstance(part, int):
            text += '[%d]' % part
        else:
            text += ('.' if text else '') + str(part)
    return text or '<document>'


def _rule_path(path):
    return tuple('*' if isinstance(part, int) else part for part in path)


def _is_zero(value):
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return value == 0
    return value == ''


def _json_equal(left, right):
    """Equality as JSON sees it: booleans are not numbers, 1 == 1.0, dict order ignored."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, (int, float)) and isinstance(right, (int, float)):
        return left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return set(left) == set(right) and all(_json_equal(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(_json_equal(a, b) for a, b in zip(left, right))
    return type(left) is type(right) and left == right


# --- parsing ------------------------------------------------------------------------------------

def _check_strategic_documents(documents, field):
    seen = set()
    for index, document in enumerate(documents):
        where = 'document %d' % index
        if not isinstance(document, dict):
            raise ValidationError(field, '%s: a strategic merge patch document must be a mapping, got %s'
                                  % (where, type(document).__name__))
        if 'kind' in document:
            if not isinstance(document.get('kind'), str) or not isinstance(document.get('apiVersion'), str):
                raise ValidationError(field, '%s: a typed document needs apiVersion and kind (text)' % where)
        else:
            if 'apiVersion' in document:
                raise ValidationError(field, '%s: apiVersion without kind' % where)
            if 'version' in document and document['version'] != 'v1alpha1':
                raise ValidationError(field, '%s: version must be v1alpha1' % where)
            if document.get(PATCH_DIRECTIVE) is not None:
                raise ValidationError(field, '%s: the v1alpha1 document cannot be deleted' % where)
        identity = document_identity(document)
        if identity in seen:
            raise ValidationError(field, '%s: %s appears twice in one patch' % (where, describe_document(document)))
        seen.add(identity)


def _check_operations(operations, field):
    for index, operation in enumerate(operations):
        where = 'operation %d' % index
        if not isinstance(operation, dict):
            raise ValidationError(field, '%s: must be a mapping with op and path' % where)
        if operation.get('op') not in JSON_OPS:
            raise ValidationError(field, '%s: op must be one of %s' % (where, ', '.join(JSON_OPS)))
        if not isinstance(operation.get('path'), str):
            raise ValidationError(field, '%s: path must be a JSON pointer (text)' % where)
        if operation['op'] in ('add', 'replace', 'test') and 'value' not in operation:
            raise ValidationError(field, '%s (%s %s): value is required' % (where, operation['op'], operation['path']))
        if operation['op'] in ('move', 'copy') and not isinstance(operation.get('from'), str):
            raise ValidationError(field, '%s (%s %s): from must be a JSON pointer (text)'
                                  % (where, operation['op'], operation['path']))


def _is_operation_list(value):
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) and 'op' in item for item in value)


def parse_patch(value, field):
    """A Patch from one user-given patch value.

    value: a mapping (one strategic-merge document), a list of RFC 6902 operations, a list
    of mappings without `op` (strategic-merge documents), or YAML/JSON text holding either
    (several `---` documents make a multi-document strategic patch). field: how errors name
    the patch, e.g. 'patches.cluster[0]'.
    """
    if isinstance(value, (str, bytes)):
        documents = talosyaml.load_all(value, field)
        if not documents:
            raise ValidationError(field, 'empty patch')
        if len(documents) == 1 and isinstance(documents[0], list):
            value = documents[0]
        else:
            value = documents
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ValidationError(field, 'a patch must be a mapping, a list or YAML text, got %s'
                              % ('an empty list' if isinstance(value, list) else type(value).__name__))
    if any(isinstance(item, dict) and 'op' in item for item in value):
        if not _is_operation_list(value):
            raise ValidationError(field, 'mixes RFC 6902 operations with other items')
        operations = copy.deepcopy(value)
        _check_operations(operations, field)
        return Patch(field, 'json6902', operations=operations)
    documents = copy.deepcopy(value)
    _check_strategic_documents(documents, field)
    return Patch(field, 'strategic', documents=documents)


def parse_patch_levels(cluster=None, group=None, host=None):
    """Parsed patches of the three levels in application order (cluster, group, host).

    Each argument is None or a list of patch values (see parse_patch); errors name
    `patches.<level>[<index>]`.
    """
    parsed = []
    for level, values in zip(LEVELS, (cluster, group, host)):
        if values is None:
            continue
        if not isinstance(values, (list, tuple)):
            raise ValidationError('patches.%s' % level, 'must be a list of patches, got %s' % type(values).__name__)
        for index, value in enumerate(values):
            parsed.append(parse_patch(value, 'patches.%s[%d]' % (level, index)))
    return parsed


# --- strategic merge ---------------------------------------------------------------------------

class _Merger(object):
    """Strategic merge of one patch document into one config document (in place)."""

    def __init__(self, field, prefix, replace_paths, merge_keys, args_paths=frozenset(), replace_items=None):
        self.field = field
        self.prefix = prefix
        self.replace_paths = replace_paths
        self.merge_keys = merge_keys
        self.args_paths = args_paths
        self.replace_items = replace_items or {}

    def fail(self, path, reason):
        raise ValidationError(self.field, 'at %s: %s' % (_render_path(self.prefix, path), reason))

    # Deletes run first, on the target; they return the patch without its directives.
    def apply_deletes(self, target, patch, path):
        if isinstance(patch, dict):
            cleaned = {}
            for key, value in patch.items():
                if key == PATCH_DIRECTIVE:
                    self.fail(path, '$patch is only allowed inside a mapping value, a list item or a typed document')
                if isinstance(value, dict) and PATCH_DIRECTIVE in value:
                    if any(isinstance(part, int) for part in path):
                        # decoder/delete.go:147-149, 207-213
                        self.fail(path + [key], 'cannot delete an inner key of a list item (Talos refuses it)')
                    self._delete_key(target, key, value, path + [key])
                    continue
                if isinstance(value, (dict, list)):
                    child = target.get(key) if isinstance(target, dict) else None
                    cleaned[key] = self.apply_deletes(child, value, path + [key])
                else:
                    cleaned[key] = value
            return cleaned
        if isinstance(patch, list):
            cleaned = []
            keys = self.merge_keys.get(_rule_path(path))
            for index, item in enumerate(patch):
                if isinstance(item, dict) and PATCH_DIRECTIVE in item:
                    self._delete_items(target, item, path + [index])
                    continue
                if isinstance(item, dict) and keys and isinstance(target, list):
                    match = self._find_keyed(target, item, keys)
                    child = target[match] if match is not None else None
                    cleaned.append(self.apply_deletes(child, item, path + [match if match is not None else index]))
                else:
                    cleaned.append(item)
            return cleaned
        return patch

    def _delete_key(self, target, key, directive, path):
        if directive.get(PATCH_DIRECTIVE) != 'delete':
            self.fail(path, 'unknown $patch directive (only "delete" is supported)')
        if len(directive) != 1:
            self.fail(path, '"$patch: delete" on a key takes no other fields')
        if not isinstance(target, dict) or key not in target:
            self.fail(path, 'nothing to delete')
        del target[key]

    def _delete_items(self, target, item, path):
        if item.get(PATCH_DIRECTIVE) != 'delete':
            self.fail(path, 'unknown $patch directive (only "delete" is supported)')
        # Talos's decoder selects by the first key:value of the item besides $patch and deletes the first item whose
        # field of that name has that value (decoder/delete.go:56-74, selector.go:222-285).
        selector = [(k, v) for k, v in item.items() if k != PATCH_DIRECTIVE][:1]
        if not selector:
            self.fail(path, '"$patch: delete" in a list item needs the fields that select the items to delete')
        if not isinstance(target, list):
            self.fail(path[:-1], 'nothing to delete')
        key, value = selector[0]
        for index, entry in enumerate(target):
            if isinstance(entry, dict) and key in entry and _json_equal(entry[key], value):
                del target[index]
                return
        self.fail(path, 'no list item matches the delete selector')

    @staticmethod
    def _find_keyed(target, item, keys):
        for key in keys:
            if item.get(key) is None:
                continue
            for index, existing in enumerate(target):
                if isinstance(existing, dict) and key in existing and _json_equal(existing[key], item[key]):
                    return index
        return None

    def merge(self, left, right, path):
        """Merged value of right (patch) into left (config)."""
        if right is None:
            return left
        if left is None:
            return copy.deepcopy(right)
        rule = _rule_path(path)
        if rule in self.replace_paths:
            return copy.deepcopy(right)
        if rule in self.args_paths and isinstance(left, dict) and isinstance(right, dict):
            left.update(copy.deepcopy(right))
            return left
        if rule in self.replace_items and isinstance(left, list) and isinstance(right, list):
            key = self.replace_items[rule]
            for item in right:
                match = next((index for index, existing in enumerate(left) if isinstance(existing, dict)
                              and isinstance(item, dict) and existing.get(key) == item.get(key)), None)
                if match is None:
                    left.append(copy.deepcopy(item))
                else:
                    left[match] = copy.deepcopy(item)
            return left
        if isinstance(left, dict) or isinstance(right, dict):
            if not (isinstance(left, dict) and isinstance(right, dict)):
                self.fail(path, 'cannot merge a %s into a %s' % (_kind(right), _kind(left)))
            for key, value in right.items():
                if value is None:
                    continue
                if key in left and left[key] is not None:
                    left[key] = self.merge(left[key], value, path + [key])
                else:
                    left[key] = copy.deepcopy(value)
            return left
        if isinstance(left, list) or isinstance(right, list):
            if not (isinstance(left, list) and isinstance(right, list)):
                self.fail(path, 'cannot merge a %s into a %s' % (_kind(right), _kind(left)))
            keys = self.merge_keys.get(rule)
            if not keys:
                return left + copy.deepcopy(right)
            for index, item in enumerate(right):
                match = self._find_keyed(left, item, keys) if isinstance(item, dict) else None
                if match is None:
                    left.append(copy.deepcopy(item))
                else:
                    left[match] = self.merge(left[match], item, path + [match])
            return left
        if _is_zero(right):
            return left
        return copy.deepcopy(right)


def _kind(value):
    if isinstance(value, dict):
        return 'mapping'
    if isinstance(value, list):
        return 'list'
    return 'scalar'


def _merger_for(document, field):
    if is_v1alpha1(document):
        return _Merger(field, '', V1ALPHA1_REPLACE, V1ALPHA1_MERGE_KEYS, args_paths=V1ALPHA1_ARGS)
    kind = document.get('kind')
    return _Merger(field, describe_document(document), TYPED_REPLACE.get(kind, frozenset()), TYPED_MERGE_KEYS.get(kind, {}),
                   replace_items=TYPED_REPLACE_ITEMS.get(kind))


def _apply_strategic(documents, patch):
    for patch_document in patch.documents:
        identity = document_identity(patch_document)
        index = next((i for i, doc in enumerate(documents) if document_identity(doc) == identity), None)
        if PATCH_DIRECTIVE in patch_document:
            if patch_document[PATCH_DIRECTIVE] != 'delete':
                raise ValidationError(patch.field, '%s: unknown $patch directive (only "delete" is supported)'
                                      % describe_document(patch_document))
            if index is None:
                raise ValidationError(patch.field, '%s: nothing to delete, the config has no such document'
                                      % describe_document(patch_document))
            del documents[index]
            continue
        if index is None:
            if is_v1alpha1(patch_document):
                raise ValidationError(patch.field, 'the config has no v1alpha1 document to merge into')
            merger = _merger_for(patch_document, patch.field)
            documents.append(merger.apply_deletes(None, patch_document, []))
            continue
        target = documents[index]
        merger = _merger_for(target, patch.field)
        cleaned = merger.apply_deletes(target, patch_document, [])
        documents[index] = merger.merge(target, cleaned, [])
    return documents


# --- RFC 6902 -----------------------------------------------------------------------------------

class _JsonPatchError(Exception):
    pass


def _parse_pointer(pointer):
    if pointer == '':
        return []
    if not pointer.startswith('/'):
        raise _JsonPatchError('JSON pointer must be empty or start with "/"')
    parts = []
    for token in pointer[1:].split('/'):
        if re.search(r'~(?![01])', token):
            raise _JsonPatchError('invalid "~" escape in JSON pointer (use ~0 or ~1)')
        parts.append(token.replace('~1', '/').replace('~0', '~'))
    return parts


def _list_index(container, token, allow_end):
    if token == '-' and allow_end:
        return len(container)
    if not _INDEX_RE.match(token):
        raise _JsonPatchError('"%s" is not a list index' % token)
    index = int(token)
    if index > len(container) or (index == len(container) and not allow_end):
        raise _JsonPatchError('list index %d out of range (length %d)' % (index, len(container)))
    return index


def _walk(document, parts):
    node = document
    for token in parts:
        if isinstance(node, dict):
            if token not in node:
                raise _JsonPatchError('path not found')
            node = node[token]
        elif isinstance(node, list):
            node = node[_list_index(node, token, False)]
        else:
            raise _JsonPatchError('path not found (a scalar has no children)')
    return node


def _get(document, parts):
    return _walk(document, parts)


def _add(document, parts, value):
    if not parts:
        return value
    parent = _walk(document, parts[:-1])
    token = parts[-1]
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_list_index(parent, token, True), value)
    else:
        raise _JsonPatchError('parent is not a mapping or list')
    return document


def _remove(document, parts):
    if not parts:
        raise _JsonPatchError('cannot remove the whole document')
    parent = _walk(document, parts[:-1])
    token = parts[-1]
    if isinstance(parent, dict):
        if token not in parent:
            raise _JsonPatchError('path not found')
        return parent.pop(token)
    if isinstance(parent, list):
        return parent.pop(_list_index(parent, token, False))
    raise _JsonPatchError('path not found (a scalar has no children)')


def _apply_operation(document, operation):
    op = operation['op']
    parts = _parse_pointer(operation['path'])
    if op == 'add':
        return _add(document, parts, copy.deepcopy(operation['value']))
    if op == 'remove':
        _remove(document, parts)
        return document
    if op == 'replace':
        if not parts:
            return copy.deepcopy(operation['value'])
        _get(document, parts)
        _remove(document, parts)
        return _add(document, parts, copy.deepcopy(operation['value']))
    if op == 'test':
        if not _json_equal(_get(document, parts), operation['value']):
            raise _JsonPatchError('test failed: the value differs')
        return document
    source = _parse_pointer(operation['from'])
    if op == 'move':
        if parts[:len(source)] == source and len(parts) > len(source):
            raise _JsonPatchError('cannot move a value into one of its own children')
        if parts == source:
            _get(document, source)
            return document
        value = _remove(document, source)
        return _add(document, parts, value)
    # copy
    return _add(document, parts, copy.deepcopy(_get(document, source)))


def apply_json_patch(document, operations, field):
    """A new document: the RFC 6902 operations applied in order to a copy of document.

    Atomic: on error the input is untouched and ValidationError names `field`, the
    operation index, op and path.
    """
    result = copy.deepcopy(document)
    for index, operation in enumerate(operations):
        try:
            result = _apply_operation(result, operation)
        except _JsonPatchError as exc:
            raise ValidationError(field, 'operation %d (%s %s): %s' % (index, operation['op'], operation['path'], exc))
    if not isinstance(result, dict):
        raise ValidationError(field, 'the v1alpha1 document must stay a mapping')
    return result


# --- applying -----------------------------------------------------------------------------------

def apply_patch(documents, patch):
    """A new document list with one Patch applied; the input list is not changed."""
    documents = copy.deepcopy(list(documents))
    if patch.kind == 'json6902':
        index = next((i for i, doc in enumerate(documents) if is_v1alpha1(doc)), None)
        if index is None:
            raise ValidationError(patch.field, 'the config has no v1alpha1 document for a JSON patch')
        documents[index] = apply_json_patch(documents[index], patch.operations, patch.field)
        return documents
    return _apply_strategic(documents, patch)


def apply_patches(documents, patches):
    """A new document list with each Patch of `patches` applied in order."""
    for patch in patches:
        documents = apply_patch(documents, patch)
    return documents
