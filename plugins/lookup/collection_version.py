# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: collection_version
short_description: The version of an installed collection, the copy this run loads
version_added: 0.1.0
description:
  - For each collection name (C(namespace.name)), returns the version of the copy that Ansible loads in this run
    (the first of the configured collection paths that has it, then the Python packages), read from the
    C(MANIFEST.json) that C(ansible-galaxy collection install) and the C(ansible) package write, else from the
    C(galaxy.yml) of a source checkout. An empty string when the collection is not installed or carries no version.
  - The preflight stage uses it to tell a C(kubernetes.core) too old for the helm on the controller before any
    chart is installed.
options:
  _terms:
    description: Collection names, such as V(kubernetes.core).
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Refuse helm 4 with a kubernetes.core older than 6.4.0
  ansible.builtin.assert:
    that: lookup('proxtalos.cluster.collection_version', 'kubernetes.core') is version('6.4.0', '>=')
"""

RETURN = r"""
_raw:
  description: One version string per name, in order; empty when unknown.
  type: list
  elements: str
"""

import importlib
import importlib.resources
import json
import re

import yaml

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

NAME = re.compile(r'^[a-z0-9_]+\.[a-z0-9_]+$')


def collection_version(name):
    """The version of collection `name` as this process would import it; '' when not installed or unversioned."""
    try:
        package = importlib.import_module('ansible_collections.%s' % name)
    except ImportError:
        return ''
    root = importlib.resources.files(package)
    manifest = root.joinpath('MANIFEST.json')
    if manifest.is_file():
        info = json.loads(manifest.read_text(encoding='utf-8')).get('collection_info') or {}
        return str(info.get('version') or '')
    galaxy = root.joinpath('galaxy.yml')
    if galaxy.is_file():
        return str((yaml.safe_load(galaxy.read_text(encoding='utf-8')) or {}).get('version') or '')
    return ''


class LookupModule(LookupBase):
    """proxtalos.cluster.collection_version"""

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        versions = []
        for term in terms:
            if not isinstance(term, str) or not NAME.match(term):
                raise AnsibleLookupError('collection_version: %r is not a collection name (namespace.name)' % (term,))
            versions.append(collection_version(term))
        return versions
