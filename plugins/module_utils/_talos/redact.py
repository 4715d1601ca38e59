# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Machine configs and talosconfigs with their secrets hidden, and the secret values to mask. PRIVATE.

The secret paths are per document kind (config.SECRET_PATHS: what Talos's own Redact methods hide, plus
inline manifests) and talosconfig.SECRET_PATHS; a hidden value is shown as `<hidden> hmac:<12 hex>`
(_diff.hide), so a diff still shows that a secret changed without showing it.

Talos does not redact what it sends back: a dry run's config diff, an apply's mode details and the
refusal of a no-reboot apply carry the old and the new value of a changed secret in clear. node_text()
masks such a text line by line, since the collection cannot read it as a config.
"""

from __future__ import annotations

import re

from ansible_collections.proxtalos.cluster.plugins.module_utils._diff import HIDDEN, hide
from ansible_collections.proxtalos.cluster.plugins.module_utils._diff import fingerprint
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import config as talos_config
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import talosyaml
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import talosconfig as talos_talosconfig


def _values_at(node, parts):
    if not parts:
        return [node] if isinstance(node, str) and node else []
    head, rest = parts[0], parts[1:]
    if head == '*' and isinstance(node, (list, dict)):
        return [value for item in (node.values() if isinstance(node, dict) else node) for value in _values_at(item, rest)]
    if isinstance(node, dict) and head in node:
        return _values_at(node[head], rest)
    return []


def config_secret_values(documents):
    """Every secret value of a machine config (documents as parsed, of any kind), for _secrets.register."""
    values = []
    for document in documents:
        for path in talos_config.secret_paths_of(document):
            values.extend(_values_at(document, path.split('.')))
    return values


def config_documents_text(documents):
    """YAML text of the documents with each document's secrets hidden."""
    return talosyaml.dump_all([hide(document, talos_config.secret_paths_of(document), show_fingerprint=True)
                               for document in documents])


def _patch_secret_values(patch_item, found):
    if isinstance(patch_item, str):
        try:
            documents = talosyaml.load_all(patch_item, 'patch')
        except (ValidationError, ValueError, TypeError):
            return  # the render reports the patch; its text is not shown
        for document in documents:
            _patch_secret_values(document, found)
    elif isinstance(patch_item, dict):  # a typed document, or a strategic-merge patch of the v1alpha1 document
        found.extend(config_secret_values([patch_item]))
    elif isinstance(patch_item, list):  # RFC 6902 operations on the v1alpha1 document: the secret paths under each
        for operation in patch_item:
            if not (isinstance(operation, dict) and isinstance(operation.get('path'), str)):
                continue
            prefix = ['*' if part.isdigit() or part == '-' else part.replace('~1', '/').replace('~0', '~')
                      for part in operation['path'].strip('/').split('/')]
            for path in talos_config.SECRET_PATHS['v1alpha1']:
                parts = path.split('.')
                if len(parts) >= len(prefix) and all(want in ('*', got) for want, got in zip(parts, prefix)):
                    found.extend(_values_at(operation.get('value'), parts[len(prefix):]))


def patch_secret_values(patch_groups):
    """The secret values that config patches set (patch_groups: a list of the patches options' dicts, level ->
    list of patches), to register before rendering, so that an error of any node leaves none in the output."""
    found = []
    for group in patch_groups:
        for patches in (group or {}).values():
            for patch_item in patches if isinstance(patches, list) else [patches]:
                _patch_secret_values(patch_item, found)
    return found


# A YAML line of a config as Talos prints it, behind a diff's one-character mark when it has one:
# (mark, indentation, list dash, key, value).
_LINE_RE = re.compile(r'^(?P<mark>[-+ ]?)(?P<indent>\s*)(?P<dash>-\s+)?(?P<key>[A-Za-z0-9_.-]+):(?:\s+(?P<value>.*))?$')
# A value that looks like key material: 32 characters and more of base64 (with a digit, not a path), and nothing else.
_BLOB_RE = re.compile(r'^(?P<lead>\s*(?:-\s+)?(?:[A-Za-z0-9_.-]+:\s+)?)(?P<blob>(?=[^/])(?=[^ ]*[0-9])[A-Za-z0-9+/]{32,}={0,2})\s*$')
# The armour lines of a PEM private key, and a line of base64 (the body of such a key, however short).
_PEM_KEY_MARK_RE = re.compile(r'-----(?P<edge>BEGIN|END) [A-Z0-9 ]*PRIVATE KEY-----')
_BASE64_LINE_RE = re.compile(r'^\s*[A-Za-z0-9+/]+={0,2}\s*$')


def _width(line):
    return len(line) - len(line.lstrip(' '))


def node_text(text):
    """A text that a node sent (a dry run's diff, mode details, an error) with secret values masked.

    Line by line, as the text is not a whole config: a value under a key that holds a secret in any
    document kind (config.SECRET_KEYS: token, key, password, passphrase, privateKey ...; `tls.key` counts
    as `key`) is replaced by its fingerprint, and so is every line of a block scalar under such a key (an inline manifest's
    contents) while its indentation lasts, and any value that is nothing but 32 or more base64 characters
    with a digit (key material, and certificates too; not a path), wherever it stands: a hunk of a diff does not show where in the
    config its lines are. Hides more than Talos's own paths (a `key` that is not secret, say), never less.
    The lines of a PEM private key's body next to its BEGIN or END line are masked wherever they stand. Its
    limit: inside an inline manifest, a hunk that does not show the `contents:` line shows a short value under
    a key that names no secret.
    """
    if not text:
        return text
    masked = []
    block_width = None  # indentation of the key whose block scalar is being masked
    for line in text.split('\n'):
        mark = line[:1] if line[:1] in '+- ' and not line.startswith(('---', '+++')) else ''
        body = line[len(mark):]
        if block_width is not None:
            if body.strip() and _width(body) <= block_width:
                block_width = None
            else:
                masked.append(mark + ' ' * _width(body) + HIDDEN if body.strip() else line)
                continue
        match = _LINE_RE.match(line) if mark or not line.startswith(('---', '+++', '@@')) else None
        if match and match.group('key').rsplit('.', 1)[-1] in talos_config.SECRET_KEYS and (match.group('value') or '').strip():
            value = match.group('value').strip()
            prefix = line[:match.start('value')]
            if value[:1] in '|>':
                block_width = _width(body) + (len(match.group('dash')) if match.group('dash') else 0)
                masked.append(prefix + value)
            else:
                masked.append(prefix + '%s %s' % (HIDDEN, fingerprint(value)))
            continue
        blob = _BLOB_RE.match(body)
        masked.append(mark + blob.group('lead') + '%s %s' % (HIDDEN, fingerprint(blob.group('blob'))) if blob else line)
    return '\n'.join(_mask_pem_key_bodies(masked))


def _mask_pem_key_bodies(lines):
    """Every base64 line next to a PEM private key's BEGIN or END line (outward from it), masked: a hunk can
    start inside a key whose `key: |` line it does not show, and the key's last line is short."""
    def body(line):
        return line[1:] if line[:1] in '+- ' else line
    lines = list(lines)
    for index, line in enumerate(lines):
        mark = _PEM_KEY_MARK_RE.search(line)
        if not mark:
            continue
        step = 1 if mark.group('edge') == 'BEGIN' else -1
        other = index + step
        while 0 <= other < len(lines) and _BASE64_LINE_RE.match(body(lines[other])):
            text = body(lines[other])
            lines[other] = lines[other][:len(lines[other]) - len(text)] + ' ' * _width(text) + HIDDEN
            other += step
    return lines


def config_text(text):
    """A machine config text with its secrets hidden; '' for None; a placeholder when it does not parse."""
    if text is None:
        return ''
    try:
        documents = talos_config.parse_machine_config(text)
    except ValidationError:
        return '<not a readable machine config: %d bytes>\n' % len(text)
    return config_documents_text(documents)


def talosconfig_text(text):
    """A talosconfig text with its client keys hidden; '' for None."""
    if text is None:
        return ''
    try:
        data = talosyaml.load(text, 'talosconfig')
    except ValidationError:
        return '<not a readable talosconfig: %d bytes>\n' % len(text)
    return talosyaml.dump(hide(data, talos_talosconfig.SECRET_PATHS, show_fingerprint=True))
