# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Before/after diffs with secret paths hidden. PRIVATE to the collection."""

from __future__ import annotations

import copy
import hashlib
import hmac
import os

HIDDEN = '<hidden>'


# The key of this process's fingerprints: a fingerprint shows that a secret changed within one diff (both sides
# are fingerprinted by the same process) and cannot be looked up in a dictionary of likely passwords, as a plain
# hash of a weak one could.
_FINGERPRINT_KEY = os.urandom(32)


def fingerprint(value):
    """A short keyed hash of a secret value: shows that it changed, not what it is."""
    text = value if isinstance(value, str) else repr(value)
    return 'hmac:' + hmac.new(_FINGERPRINT_KEY, text.encode('utf-8'), hashlib.sha256).hexdigest()[:12]


def hide(data, paths, show_fingerprint=False):
    """Deep copy of data with each dotted path replaced by a placeholder.

    A path segment '*' matches every key of a dict or item of a list. With show_fingerprint,
    the placeholder carries a short hash so a diff still shows that the secret changed.
    """
    data = copy.deepcopy(data)
    for path in paths:
        _hide_path(data, path.split('.'), show_fingerprint)
    return data


def _hide_path(node, parts, show_fingerprint):
    if not parts:
        return
    head, rest = parts[0], parts[1:]
    if isinstance(node, dict):
        keys = list(node) if head == '*' else ([head] if head in node else [])
    elif isinstance(node, list):
        if head == '*':
            keys = list(range(len(node)))
        elif head.isdigit() and int(head) < len(node):
            keys = [int(head)]
        else:
            keys = []
    else:
        return
    for key in keys:
        if rest:
            _hide_path(node[key], rest, show_fingerprint)
        elif node[key] not in (None, ''):
            node[key] = '%s %s' % (HIDDEN, fingerprint(node[key])) if show_fingerprint else HIDDEN


def make_diff(before, after, hidden_paths=(), before_header=None, after_header=None):
    """An Ansible diff dict from two objects, with secret paths hidden on both sides."""
    diff = {'before': hide(before, hidden_paths, True) if before is not None else {},
            'after': hide(after, hidden_paths, True) if after is not None else {}}
    if before_header:
        diff['before_header'] = before_header
    if after_header:
        diff['after_header'] = after_header
    return diff
