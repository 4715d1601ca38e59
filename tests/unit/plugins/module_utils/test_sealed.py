"""The sealed-secrets keypair, PEM validation and kubeseal-compatible sealing."""
import base64
import datetime
import os
import struct

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.x509.oid import NameOID

from ansible_collections.proxtalos.cluster.plugins.module_utils import _crypto
from ansible_collections.proxtalos.cluster.plugins.module_utils import _sealed
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError
from ansible_collections.proxtalos.cluster.tests.unit.broken_keys import flipped_exponent_pem

FIXTURES = os.path.join(os.path.dirname(__file__), 'fixtures', 'sealed')


@pytest.fixture(scope='module')
def keypair():
    """One RSA-4096 keypair as the module generates it (key PEM, cert PEM)."""
    return _sealed.generate_keypair()


@pytest.fixture(scope='module')
def private_key(keypair):
    return serialization.load_pem_private_key(keypair[0], password=None)


def independent_unseal(sealed, private_key_obj):
    """Open a SealedSecret straight from the documented format, without the code under test.

    Label: strict "namespace/name", namespace-wide "namespace", cluster-wide "" (from the
    SealedSecret's own metadata annotations). Payload: uint16 BE length of the RSA part, the
    RSA-OAEP(SHA-256) session key, then AES-256-GCM with a zero 12-byte nonce (ct || tag).
    """
    metadata = sealed['metadata']
    annotations = metadata.get('annotations') or {}
    if annotations.get('sealedsecrets.bitnami.com/cluster-wide') == 'true':
        label = b''
    elif annotations.get('sealedsecrets.bitnami.com/namespace-wide') == 'true':
        label = metadata['namespace'].encode()
    else:
        label = ('%s/%s' % (metadata['namespace'], metadata['name'])).encode()
    opened = {}
    for key, value in sealed['spec']['encryptedData'].items():
        payload = base64.b64decode(value)
        (rsa_length,) = struct.unpack('>H', payload[:2])
        session_key = private_key_obj.decrypt(
            payload[2:2 + rsa_length],
            padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=label or None))
        opened[key] = AESGCM(session_key).decrypt(b'\x00' * 12, payload[2 + rsa_length:], None)
    return opened


def secret(name='app-credentials', namespace='apps', **extra):
    manifest = {'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {'name': name, 'namespace': namespace},
                'type': 'Opaque', 'stringData': {'password': 's3cr3t-value', 'user': 'admin'}}
    manifest.update(extra)
    return manifest


# --- keypair -------------------------------------------------------------------------------

def test_generated_keypair_is_what_the_controller_loads(keypair):
    key_pem, cert_pem = keypair
    assert key_pem.startswith(b'-----BEGIN RSA PRIVATE KEY-----')  # PKCS#1, as the controller writes
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 4096
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert cert.issuer == cert.subject
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == 'sealed-secret'
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime == datetime.timedelta(days=3650)
    cert.verify_directly_issued_by(cert)


def test_describe_keypair_reports_fingerprints_and_no_key_material(keypair):
    info, warnings = _sealed.describe_keypair(*keypair)
    assert warnings == []
    assert info['key_size'] == 4096
    cert = x509.load_pem_x509_certificate(keypair[1])
    assert info['certificate_sha256'] == cert.fingerprint(hashes.SHA256()).hex()
    flat = repr(info)
    assert 'PRIVATE' not in flat and keypair[0].decode().splitlines()[1] not in flat


def test_generate_rejects_small_keys():
    with pytest.raises(ValidationError) as error:
        _sealed.generate_keypair(key_size=1024)
    assert error.value.field == 'key_size'


def _cert_for(key, days=365, not_before=None):
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'test')])
    start = not_before or datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(start).not_valid_after(start + datetime.timedelta(days=days))
            .sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))


def _pem(key, fmt=serialization.PrivateFormat.TraditionalOpenSSL, encryption=None):
    return key.private_bytes(serialization.Encoding.PEM, fmt, encryption or serialization.NoEncryption())


@pytest.fixture(scope='module')
def small_rsa():
    return rsa.generate_private_key(65537, 2048)


def test_pkcs8_rsa_key_is_accepted(small_rsa):
    info, warnings = _sealed.describe_keypair(_pem(small_rsa, serialization.PrivateFormat.PKCS8), _cert_for(small_rsa))
    assert info['key_size'] == 2048
    assert any('2048 bits' in warning for warning in warnings)


def test_bad_pems_are_rejected_with_the_reason(keypair, small_rsa):
    ec_key = ec.generate_private_key(ec.SECP256R1())
    expired_start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=40)
    cases = [
        (b'not a pem at all', keypair[1], 'private key', 'not PEM'),
        (_pem(ec_key), keypair[1], 'private key', 'EC PRIVATE KEY'),
        (_pem(ec_key, serialization.PrivateFormat.PKCS8), keypair[1], 'private key', 'needs an RSA key'),
        (_pem(small_rsa, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b'pw')), keypair[1],
         'private key', 'passphrase-protected'),
        (b'-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n', keypair[1], 'private key', 'cannot be parsed'),
        (keypair[0], b'garbage', 'certificate', 'not PEM'),
        (keypair[0], b'-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n', 'certificate', 'cannot be parsed'),
        (keypair[0], _cert_for(small_rsa), 'certificate', 'does not match'),
        (_pem(small_rsa), _cert_for(small_rsa, days=10, not_before=expired_start), 'certificate', 'expired'),
        (_pem(ec_key), _cert_for(ec_key), 'private key', 'EC PRIVATE KEY'),
    ]
    for key_pem, cert_pem, field, reason in cases:
        with pytest.raises(ValidationError) as error:
            _sealed.describe_keypair(key_pem, cert_pem)
        assert error.value.field == field, (field, reason, str(error.value))
        assert reason in str(error.value)


def test_certificate_with_ec_key_is_rejected():
    ec_key = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(ValidationError) as error:
        _sealed.load_certificate(_cert_for(ec_key))
    assert 'not RSA' in str(error.value)


def test_old_not_before_warns_about_key_renewal(small_rsa):
    start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=45)
    _info, warnings = _sealed.describe_keypair(_pem(small_rsa), _cert_for(small_rsa, days=3650, not_before=start))
    assert any('keyrenewperiod' in warning for warning in warnings)


# --- sealing -------------------------------------------------------------------------------

@pytest.mark.parametrize('scope, annotation', [
    ('strict', None),
    ('namespace-wide', 'sealedsecrets.bitnami.com/namespace-wide'),
    ('cluster-wide', 'sealedsecrets.bitnami.com/cluster-wide'),
])
def test_round_trip_per_scope(keypair, private_key, scope, annotation):
    sealed = _sealed.seal(secret(), keypair[1], scope)
    expected = {'password': b's3cr3t-value', 'user': b'admin'}
    assert _sealed.unseal(sealed, [private_key]) == expected
    assert independent_unseal(sealed, private_key) == expected
    top = sealed['metadata'].get('annotations') or {}
    template = sealed['spec']['template']['metadata'].get('annotations') or {}
    if annotation:
        assert top == {annotation: 'true'} and template == {annotation: 'true'}
    else:
        assert top == {} and template == {}


def test_payload_layout_matches_hybrid_encrypt(keypair):
    sealed = _sealed.seal(secret(stringData={'k': 'twelve bytes'}), keypair[1])
    payload = base64.b64decode(sealed['spec']['encryptedData']['k'])
    assert payload[:2] == b'\x02\x00'                      # 512-byte RSA part for RSA-4096
    assert len(payload) == 2 + 512 + len(b'twelve bytes') + 16
    other = _sealed.seal(secret(stringData={'k': 'twelve bytes'}), keypair[1])
    assert other['spec']['encryptedData']['k'] != sealed['spec']['encryptedData']['k']  # fresh session key


def test_scope_binds_name_and_namespace(keypair, private_key):
    def moved(sealed, name=None, namespace=None):
        copy = yaml.safe_load(yaml.safe_dump(sealed))
        copy['metadata']['name'] = name or copy['metadata']['name']
        copy['metadata']['namespace'] = namespace or copy['metadata']['namespace']
        return copy

    strict = _sealed.seal(secret(), keypair[1], 'strict')
    with pytest.raises(_sealed.SealingError, match='does not open'):
        _sealed.unseal(moved(strict, name='renamed'), [private_key])
    namespace_wide = _sealed.seal(secret(), keypair[1], 'namespace-wide')
    assert _sealed.unseal(moved(namespace_wide, name='renamed'), [private_key])['user'] == b'admin'
    with pytest.raises(_sealed.SealingError):
        _sealed.unseal(moved(namespace_wide, namespace='elsewhere'), [private_key])
    cluster_wide = _sealed.seal(secret(), keypair[1], 'cluster-wide')
    assert _sealed.unseal(moved(cluster_wide, name='x', namespace='y'), [private_key])['user'] == b'admin'


def test_unseal_tries_every_key(keypair, private_key, small_rsa):
    sealed = _sealed.seal(secret(), keypair[1])
    assert _sealed.unseal(sealed, [small_rsa, private_key])['user'] == b'admin'
    with pytest.raises(_sealed.SealingError):
        _sealed.unseal(sealed, [small_rsa])


def test_scope_from_annotations_when_not_given(keypair, private_key):
    annotated = secret()
    annotated['metadata']['annotations'] = {'sealedsecrets.bitnami.com/namespace-wide': 'true', 'team': 'a'}
    sealed = _sealed.seal(annotated, keypair[1])
    assert sealed['metadata']['annotations'] == {'sealedsecrets.bitnami.com/namespace-wide': 'true'}
    assert independent_unseal(sealed, private_key)['user'] == b'admin'
    explicit = _sealed.seal(annotated, keypair[1], 'strict')       # an explicit scope replaces the annotation
    assert 'annotations' not in explicit['metadata']
    assert explicit['spec']['template']['metadata']['annotations'] == {'team': 'a'}


def test_template_is_the_cleaned_secret_metadata(keypair):
    manifest = secret(immutable=True, type='kubernetes.io/basic-auth')
    manifest['metadata'].update({
        'labels': {'app': 'web'},
        'annotations': {'kubectl.kubernetes.io/last-applied-configuration': '{"stringData": {"password": "s3cr3t-value"}}',
                        'note': 'kept'},
        'uid': '1234', 'resourceVersion': '7', 'creationTimestamp': '2024-01-01T00:00:00Z',
        'ownerReferences': [{'kind': 'X', 'name': 'y'}],
    })
    sealed = _sealed.seal(manifest, keypair[1])
    assert sealed['spec']['template'] == {
        'metadata': {'name': 'app-credentials', 'namespace': 'apps', 'labels': {'app': 'web'}, 'annotations': {'note': 'kept'}},
        'type': 'kubernetes.io/basic-auth',
        'immutable': True,
    }
    assert 's3cr3t-value' not in yaml.safe_dump(sealed)
    assert sealed['apiVersion'] == 'bitnami.com/v1alpha1' and sealed['kind'] == 'SealedSecret'


def test_data_is_base64_decoded_and_string_data_wins(keypair, private_key):
    manifest = secret(data={'user': base64.b64encode(b'from-data').decode(), 'bin': base64.b64encode(b'\x00\xff').decode()},
                      stringData={'user': 'from-stringData'})
    opened = independent_unseal(_sealed.seal(manifest, keypair[1]), private_key)
    assert opened == {'user': b'from-stringData', 'bin': b'\x00\xff'}


@pytest.mark.parametrize('manifest, field', [
    (secret(namespace=None), 'secret.metadata.namespace'),
    (secret(name='Not_A_Name'), 'secret.metadata.name'),
    (secret(data={'key': 'not base64!'}), 'secret.data.key'),
    (secret(stringData={'bad key': 'x'}), 'secret.stringData.bad key'),
    (secret(kind='ConfigMap'), 'secret.kind'),
    (secret(stringData={'n': 5}), 'secret.stringData.n'),
])
def test_bad_secret_input_names_the_field(keypair, manifest, field):
    with pytest.raises(ValidationError) as error:
        _sealed.seal(manifest, keypair[1])
    assert error.value.field == field


def test_cluster_wide_needs_no_namespace(keypair, private_key):
    sealed = _sealed.seal(secret(namespace=None), keypair[1], 'cluster-wide')
    assert 'namespace' not in sealed['metadata']
    assert _sealed.unseal(sealed, [private_key])['user'] == b'admin'


def test_expired_certificate_is_refused_for_sealing(small_rsa):
    start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=10)
    with pytest.raises(ValidationError, match='expired'):
        _sealed.seal(secret(), _cert_for(small_rsa, days=5, not_before=start))


def test_same_sealed_content(keypair, private_key, small_rsa):
    sealed = _sealed.seal(secret(), keypair[1])
    assert _sealed.same_sealed_content(sealed, secret(), 'strict', private_key) == (True, 'up to date')
    changed_value = secret(stringData={'password': 'other', 'user': 'admin'})
    assert _sealed.same_sealed_content(sealed, changed_value, 'strict', private_key) == (False, 'the value of password differs')
    assert _sealed.same_sealed_content(sealed, secret(), 'namespace-wide', private_key)[1] == 'metadata differs'
    assert _sealed.same_sealed_content(sealed, secret(stringData={'user': 'admin'}), 'strict', private_key)[1] == 'the set of keys differs'
    same, reason = _sealed.same_sealed_content(sealed, secret(), 'strict', small_rsa)
    assert not same and 'does not open' in reason


# --- real kubeseal output --------------------------------------------------------------------

@pytest.fixture(scope='module')
def kubeseal_vector():
    with open(os.path.join(FIXTURES, 'kubeseal-0.14.1-vector.yaml')) as handle:
        vector = yaml.safe_load(handle)
    data = vector['key_secret']['data']
    return vector, base64.b64decode(data['tls.key']), base64.b64decode(data['tls.crt'])


def test_unseals_a_sealed_secret_made_by_kubeseal(kubeseal_vector):
    vector, key_pem, cert_pem = kubeseal_vector
    info, _warnings = _sealed.describe_keypair(key_pem, cert_pem)   # the controller's own key passes our checks
    assert info['key_size'] == 4096
    key = _sealed.load_private_key(key_pem)
    assert _sealed.unseal(vector['sealed_secret'], [key]) == {'token': b'sealed-secrets-example'}


def test_kubeseal_output_counts_as_up_to_date(kubeseal_vector):
    vector, key_pem, _cert_pem = kubeseal_vector
    manifest = {'metadata': {'name': 'credentials', 'namespace': 'foo'}, 'stringData': {'token': 'sealed-secrets-example'}}
    key = _sealed.load_private_key(key_pem)
    assert _sealed.same_sealed_content(vector['sealed_secret'], manifest, 'strict', key) == (True, 'up to date')


def test_our_seal_opens_with_the_kubeseal_key_like_kubeseal_output(kubeseal_vector):
    vector, key_pem, cert_pem = kubeseal_vector
    ours = _sealed.seal({'metadata': {'name': 'credentials', 'namespace': 'foo'}, 'stringData': {'token': 'sealed-secrets-example'}},
                        cert_pem)
    theirs = vector['sealed_secret']
    assert len(base64.b64decode(ours['spec']['encryptedData']['token'])) == len(base64.b64decode(theirs['spec']['encryptedData']['token']))
    assert independent_unseal(ours, _sealed.load_private_key(key_pem)) == {'token': b'sealed-secrets-example'}


def test_the_rsa_consistency_check_is_skipped_only_when_asked(keypair, monkeypatch):
    """sealed_key checks the kept key's RSA numbers in full; the modules that read it after it may skip that check
    (a quarter of a second for 4096 bits), and still get the block, type and size checks."""
    key_pem, cert_pem = keypair
    skipped = []
    real = serialization.load_pem_private_key

    def recording(data, password=None, unsafe_skip_rsa_key_validation=False):
        skipped.append(unsafe_skip_rsa_key_validation)
        return real(data, password=password, unsafe_skip_rsa_key_validation=unsafe_skip_rsa_key_validation)
    monkeypatch.setattr(_sealed.serialization, 'load_pem_private_key', recording)
    monkeypatch.setattr(_crypto, '_PARSED', {})
    quick, _warnings = _sealed.describe_keypair(key_pem, cert_pem, check_consistency=False)
    full, _warnings = _sealed.describe_keypair(key_pem, cert_pem)
    assert skipped == [True, False] and quick == full
    # parsed once per process: a checked key serves both kinds of caller, an unchecked one only its own kind
    again, _warnings = _sealed.describe_keypair(key_pem, cert_pem, check_consistency=False)
    assert _sealed.load_private_key(key_pem) is _sealed.load_private_key(key_pem, check_consistency=False)
    assert skipped == [True, False] and again == full
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with pytest.raises(ValidationError) as caught:
        _sealed.load_private_key(small, 'private_key_path', check_consistency=False)
    assert caught.value.field == 'private_key_path' and 'too small' in str(caught.value)


def test_a_key_with_broken_rsa_numbers_is_refused_by_the_full_check(keypair, monkeypatch):
    """What sealed_key (the keeper) relies on: one bit of the private exponent flipped, n and e intact (it still
    matches its certificate) - refused with the check, loaded without it."""
    key_pem, cert_pem = keypair
    monkeypatch.setattr(_crypto, '_PARSED', {})
    broken_pem = flipped_exponent_pem(serialization.load_pem_private_key(key_pem, password=None))
    with pytest.raises(ValidationError) as caught:
        _sealed.describe_keypair(broken_pem, cert_pem, key_field='private_key_path')
    assert caught.value.field == 'private_key_path' and 'cannot be parsed as a private key' in str(caught.value)
    info, _warnings = _sealed.describe_keypair(broken_pem, cert_pem, check_consistency=False)
    assert info['public_key_sha256'] == _sealed.describe_keypair(key_pem, cert_pem)[0]['public_key_sha256']
