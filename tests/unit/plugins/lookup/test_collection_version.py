"""collection_version: the version in the MANIFEST.json of the copy Python imports, '' for a collection that is not
installed, an error naming a term that is not a collection name (the preflight's helm 4 check reads
kubernetes.core's with it)."""

import importlib.util
import json
import os

import pytest
from ansible.errors import AnsibleLookupError
from ansible.module_utils.compat.version import LooseVersion

from ansible_collections.proxtalos.cluster.plugins.lookup import collection_version


def test_the_version_is_the_manifest_of_the_imported_copy():
    folder = list(importlib.util.find_spec('ansible_collections.kubernetes.core').submodule_search_locations)[0]
    with open(os.path.join(folder, 'MANIFEST.json'), encoding='utf-8') as handle:
        expected = json.load(handle)['collection_info']['version']
    assert collection_version.collection_version('kubernetes.core') == expected
    assert LooseVersion(expected) >= LooseVersion('6.0.0'), expected


def test_a_collection_that_is_not_installed_has_no_version():
    assert collection_version.collection_version('nosuch.collection') == ''


def test_a_term_that_is_not_a_collection_name_is_refused():
    lookup = collection_version.LookupModule()
    with pytest.raises(AnsibleLookupError, match="'kubernetes' is not a collection name"):
        lookup.run(['kubernetes'])
    assert lookup.run(['nosuch.collection']) == ['']
