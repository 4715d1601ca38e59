# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Machine configs and talosconfigs with their secrets hidden, and the secret values to mask. PRIVATE.

The secret paths are talospki's (config.CONFIG_SECRET_PATHS, talosconfig.SECRET_PATHS); a hidden
value is shown as `<hidden> sha256:<12 hex>` (_diff.hide), so a diff still shows that a secret
changed without showing it.
"""

from __future__ import annotations

from ansible_collections.proxtalos.cluster.plugins.module_utils._diff import hide
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import config as talos_config
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import patch, talosyaml
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
    """Every secret value of a machine config (documents as parsed), for _secrets.register."""
    values = []
    for document in documents:
        if patch.is_v1alpha1(document):
            for path in talos_config.CONFIG_SECRET_PATHS:
                values.extend(_values_at(document, path.split('.')))
    return values


def config_documents_text(documents):
    """YAML text of the documents with the v1alpha1 document's secrets hidden."""
    shown = [hide(document, talos_config.CONFIG_SECRET_PATHS, show_fingerprint=True) if patch.is_v1alpha1(document)
             else document for document in documents]
    return talosyaml.dump_all(shown)


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
