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


# A YAML line of a config as Talos prints it, behind a diff's one-character mark when it has one:
# (mark, indentation, list dash, key, value).
_LINE_RE = re.compile(r'^(?P<mark>[-+ ]?)(?P<indent>\s*)(?P<dash>-\s+)?(?P<key>[A-Za-z0-9_.-]+):(?:\s+(?P<value>.*))?$')
# A value that looks like key material: 32 characters and more of base64 (hex included), and nothing else.
_BLOB_RE = re.compile(r'^(?P<lead>\s*(?:-\s+)?(?:[A-Za-z0-9_.-]+:\s+)?)(?P<blob>[A-Za-z0-9+/]{32,}={0,2})\s*$')


def _width(line):
    return len(line) - len(line.lstrip(' '))


def node_text(text):
    """A text that a node sent (a dry run's diff, mode details, an error) with secret values masked.

    Line by line, as the text is not a whole config: a value under a key that holds a secret in any
    document kind (config.SECRET_KEYS: token, key, password, passphrase, privateKey ...; `tls.key` counts
    as `key`) is replaced by its fingerprint, and so is every line of a block scalar under such a key (an inline manifest's
    contents) while its indentation lasts, and any value that is nothing but 32 or more base64 characters
    (key material, and certificates too), wherever it stands: a hunk of a diff does not show where in the
    config its lines are. Hides more than Talos's own paths (a `key` that is not secret, say), never less.
    Its limit: inside an inline manifest, a hunk that does not show the `contents:` line shows a short value
    under a key that names no secret.
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
    return '\n'.join(masked)


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
