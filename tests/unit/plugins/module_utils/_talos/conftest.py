"""Shared fixtures for the Talos PKI, secrets, config and talosconfig tests.

Bundles are generated once per session (an RSA 4096 key takes about a second). The JSON
schemas are the data files Talos publishes, kept in lab/talos/schemas/; reading them does not
need a running lab.
"""
import gzip
import json
import os

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import secrets

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, '..', '..', '..', '..', '..'))
SCHEMA_DIR = os.path.join(ROOT, 'lab', 'talos', 'schemas')
SCHEMA_FILES = {'1.12': 'talos-config-v1.12.11.schema.json.gz', '1.13': 'talos-config-v1.13.9.schema.json.gz'}


def fixture_path(name):
    return os.path.join(HERE, 'fixtures', name)


@pytest.fixture(scope='session')
def bundle():
    """A bundle like talosctl's: Ed25519 OS CA."""
    return secrets.generate_bundle()


@pytest.fixture(scope='session')
def ecdsa_bundle():
    """A bundle whose OS CA is ECDSA P-256."""
    return secrets.generate_bundle(os_key_type='ecdsa')


@pytest.fixture(scope='session')
def talosctl_bundle_text():
    with open(fixture_path('talosctl-secrets.txt')) as handle:
        return handle.read()


@pytest.fixture(scope='session')
def schemas():
    out = {}
    for contract, name in SCHEMA_FILES.items():
        with gzip.open(os.path.join(SCHEMA_DIR, name), 'rt', encoding='utf-8') as handle:
            out[contract] = json.load(handle)
    return out
