"""Sealing test vectors both ways between the collection's _sealed module and kubeseal's own code
(tools/kubeseal-vectors: sealed-secrets v0.40.0 pkg/kubeseal Seal and UnsealSealedSecret, built by
scripts/upstream_binaries.py). Neither side judges itself: what kubeseal seals is opened by the collection's unseal and
passes its same_sealed_content check (the layout the collection writes is kubeseal's), and what the collection seals is
opened by kubeseal. Select with `-m upstream`."""

import base64
import json
import subprocess

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _sealed
from lab import upstream

pytestmark = pytest.mark.upstream

SCOPES = ('strict', 'namespace-wide', 'cluster-wide')
SECRET = {'apiVersion': 'v1', 'kind': 'Secret', 'type': 'Opaque',
          'metadata': {'name': 'db', 'namespace': 'apps', 'labels': {'app': 'db'}},
          'data': {'blob': 'AAECAwT/'}, 'stringData': {'password': 'pässwörd', 'user': 'app'}}
PLAIN = {'blob': b'\x00\x01\x02\x03\x04\xff', 'password': 'pässwörd'.encode(), 'user': b'app'}


@pytest.fixture(scope='module')
def keys(tmp_path_factory):
    """(key pem, cert pem, key file, cert file) made by the collection's generate_keypair (2048 bits: faster)."""
    key_pem, cert_pem = _sealed.generate_keypair(key_size=2048)
    base = tmp_path_factory.mktemp('keys')
    (base / 'key.pem').write_bytes(key_pem)
    (base / 'cert.pem').write_bytes(cert_pem)
    return key_pem, cert_pem, str(base / 'key.pem'), str(base / 'cert.pem')


def _kubeseal(*args, stdin):
    done = subprocess.run([upstream.binary('kubeseal-vectors')] + list(args), input=json.dumps(stdin), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize('scope', SCOPES)
def test_what_kubeseal_seals_the_collection_opens_and_finds_current(keys, scope):
    key_pem, dummy, dummy, cert_file = keys
    sealed = _kubeseal('seal', '--cert', cert_file, '--scope', scope, stdin=SECRET)
    assert sealed['kind'] == 'SealedSecret' and sorted(sealed['spec']['encryptedData']) == sorted(PLAIN)
    private_key = _sealed.load_private_key(key_pem)
    assert _sealed.unseal(sealed, [private_key]) == PLAIN
    same, reason = _sealed.same_sealed_content(sealed, SECRET, scope, private_key)
    assert same, reason


def test_a_strict_secret_kubeseal_sealed_does_not_open_under_another_name(keys):
    key_pem, dummy, dummy, cert_file = keys
    sealed = _kubeseal('seal', '--cert', cert_file, '--scope', 'strict', stdin=SECRET)
    sealed['metadata']['name'] = 'other'
    with pytest.raises(_sealed.SealingError):
        _sealed.unseal(sealed, [_sealed.load_private_key(key_pem)])


@pytest.mark.parametrize('scope', SCOPES)
def test_what_the_collection_seals_kubeseal_opens(keys, scope):
    dummy, cert_pem, key_file, dummy = keys
    sealed = _sealed.seal(SECRET, cert_pem, scope=scope)
    secret = _kubeseal('unseal', '--key', key_file, stdin=sealed)
    assert secret['kind'] == 'Secret' and secret['metadata']['name'] == 'db' and secret['metadata']['namespace'] == 'apps'
    assert secret['metadata']['labels'] == {'app': 'db'}
    assert {k: base64.b64decode(v) for k, v in secret['data'].items()} == PLAIN
