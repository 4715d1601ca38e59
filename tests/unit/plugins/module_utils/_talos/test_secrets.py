"""Secrets bundle: talosctl shape, key types, import of a talosctl bundle, validation, bytes."""
import base64
import copy
import re

import pytest
from cryptography import x509

from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import pki, secrets, talosyaml

TOKEN = re.compile(r'^[0-9a-z]{6}\.[0-9a-z]{16}$')


def test_shape_and_key_order_match_talosctl(bundle):
    data = talosyaml.load(bundle.to_yaml(), 'bundle')
    assert list(data) == ['cluster', 'secrets', 'trustdinfo', 'certs']
    assert list(data['cluster']) == ['id', 'secret']
    assert list(data['secrets']) == ['bootstraptoken', 'secretboxencryptionsecret']
    assert list(data['trustdinfo']) == ['token']
    assert list(data['certs']) == ['etcd', 'k8s', 'k8saggregator', 'k8sserviceaccount', 'os']
    assert list(data['certs']['k8sserviceaccount']) == ['key']
    for name in ('etcd', 'k8s', 'k8saggregator', 'os'):
        assert list(data['certs'][name]) == ['crt', 'key']


def test_values_have_talosctl_formats(bundle):
    data = bundle.to_dict()
    cluster_id = data['cluster']['id']
    assert len(base64.urlsafe_b64decode(cluster_id)) == 32 and cluster_id.endswith('=')
    assert len(base64.b64decode(data['cluster']['secret'], validate=True)) == 32
    assert len(base64.b64decode(data['secrets']['secretboxencryptionsecret'], validate=True)) == 32
    assert TOKEN.match(data['secrets']['bootstraptoken'])
    assert TOKEN.match(data['trustdinfo']['token'])
    assert data['secrets']['bootstraptoken'] != data['trustdinfo']['token']


@pytest.mark.parametrize('name, label, key_type, subject', [
    ('os', 'ED25519 PRIVATE KEY', 'ed25519', 'O=talos'),
    ('k8s', 'EC PRIVATE KEY', 'ecdsa-secp256r1', 'O=kubernetes'),
    ('etcd', 'EC PRIVATE KEY', 'ecdsa-secp256r1', 'O=etcd'),
    ('k8saggregator', 'EC PRIVATE KEY', 'ecdsa-secp256r1', 'CN=front-proxy'),
])
def test_cas_have_talos_key_types_labels_and_subjects(bundle, name, label, key_type, subject):
    data = bundle.to_dict()['certs'][name]
    crt = base64.b64decode(data['crt'])
    key = base64.b64decode(data['key'])
    assert pki.pem_label(key) == label
    cert = x509.load_pem_x509_certificate(crt)
    summary = pki.describe_certificate(cert)
    assert summary['key_type'] == key_type
    assert summary['subject'] == subject and summary['is_ca']
    assert summary['ext_key_usage'] == ['serverAuth', 'clientAuth']
    assert pki.key_matches_certificate(crt, key)


def test_service_account_key(bundle):
    key = base64.b64decode(bundle.to_dict()['certs']['k8sserviceaccount']['key'])
    assert pki.pem_label(key) == 'RSA PRIVATE KEY'
    assert pki.describe_key(pki.load_private_key(key)) == 'rsa-4096'


def test_ecdsa_os_ca_option(ecdsa_bundle):
    assert ecdsa_bundle.os_key_type() == 'ecdsa'
    assert pki.pem_label(ecdsa_bundle.certs['os']['key']) == 'EC PRIVATE KEY'
    ecdsa_bundle.validate()


def test_bundles_are_unique(bundle, ecdsa_bundle):
    assert bundle.cluster_id != ecdsa_bundle.cluster_id
    assert bundle.certs['k8s']['key'] != ecdsa_bundle.certs['k8s']['key']


def test_serialization_is_deterministic(bundle):
    text = bundle.to_yaml()
    assert text == bundle.to_yaml()
    again = secrets.parse_bundle(text)
    assert again.to_yaml() == text
    assert secrets.parse_bundle(again.to_yaml()).to_yaml() == text


def test_generated_bundle_validates(bundle):
    bundle.validate()
    assert bundle.os_key_type() == 'ed25519'


def test_import_talosctl_bundle(talosctl_bundle_text):
    imported = secrets.parse_bundle(talosctl_bundle_text)
    original = talosyaml.load(talosctl_bundle_text, 'fixture')
    # Same content, nothing lost or re-encoded.
    assert imported.to_dict() == original
    assert imported.os_key_type() == 'ed25519'
    assert imported.bootstrap_token == original['secrets']['bootstraptoken']
    assert pki.pem_label(imported.certs['os']['key']) == 'ED25519 PRIVATE KEY'
    # Our serialization of it is stable from then on.
    text = imported.to_yaml()
    assert secrets.parse_bundle(text).to_yaml() == text


def test_imported_bundle_issues_admin_certificates(talosctl_bundle_text):
    imported = secrets.parse_bundle(talosctl_bundle_text)
    ca_crt, ca_key = imported.ca('os')
    crt, key = pki.new_client_certificate(ca_crt, ca_key)
    assert pki.client_certificate_problems(crt, key, ca_crt) == []


def test_aescbc_bundle_is_accepted(bundle):
    data = bundle.to_dict()
    del data['secrets']['secretboxencryptionsecret']
    data['secrets']['aescbcencryptionsecret'] = base64.b64encode(b'k' * 32).decode()
    parsed = secrets.validate_bundle_dict(data)
    assert parsed.aescbc_secret and parsed.secretbox_secret is None
    assert list(parsed.to_dict()['secrets']) == ['bootstraptoken', 'aescbcencryptionsecret']


def test_tokens_use_the_whole_alphabet_evenly():
    counts = dict((c, 0) for c in secrets.TOKEN_ALPHABET)
    for dummy in range(400):
        token = secrets.generate_token()
        assert TOKEN.match(token)
        for char in token.replace('.', ''):
            counts[char] += 1
    # 8800 draws over 36 characters: about 244 each; modulo bias or a missing character
    # would show far outside this band.
    assert min(counts.values()) > 150 and max(counts.values()) < 350


def _mutated(bundle, mutate):
    data = copy.deepcopy(bundle.to_dict())
    mutate(data)
    return data


def _b64(pem):
    return base64.b64encode(pem).decode()


def _cases():
    dummy, other_etcd_key = pki.new_etcd_ca()
    leaf_crt, leaf_key = pki.new_client_certificate(*pki.new_talos_ca())
    return [
        ('cluster.id: missing', lambda d: d['cluster'].pop('id')),
        ('cluster.secret: missing', lambda d: d['cluster'].update(secret='')),
        ('cluster: missing', lambda d: d.pop('cluster')),
        ('secrets.bootstraptoken: missing', lambda d: d['secrets'].pop('bootstraptoken')),
        ('secrets.bootstraptoken: must match', lambda d: d['secrets'].update(bootstraptoken='ABCDEF.0123456789abcdef')),
        ('secrets: one of secretboxencryptionsecret and aescbcencryptionsecret is required',
         lambda d: d['secrets'].pop('secretboxencryptionsecret')),
        ('secrets: only one of', lambda d: d['secrets'].update(aescbcencryptionsecret=d['secrets']['secretboxencryptionsecret'])),
        ('secrets.secretboxencryptionsecret: must decode to 32 bytes',
         lambda d: d['secrets'].update(secretboxencryptionsecret=base64.b64encode(b'short').decode())),
        ('secrets.secretboxencryptionsecret: not valid base64',
         lambda d: d['secrets'].update(secretboxencryptionsecret='***')),
        ('trustdinfo.token: missing', lambda d: d['trustdinfo'].update(token=None)),
        ('trustdinfo: must be a mapping', lambda d: d.update(trustdinfo='x')),
        ('certs.os: missing', lambda d: d['certs'].pop('os')),
        ('certs.os.key: missing', lambda d: d['certs']['os'].pop('key')),
        ('certs.os.key: not a PEM private key', lambda d: d['certs']['os'].update(key=d['certs']['os']['crt'])),
        ('certs.os.key: not valid base64', lambda d: d['certs']['os'].update(key='%%%')),
        ('certs.k8s.crt: not a PEM certificate', lambda d: d['certs']['k8s'].update(crt=d['certs']['k8s']['key'])),
        ('certs.etcd.key: does not belong to the certificate',
         lambda d: d['certs']['etcd'].update(key=_b64(other_etcd_key))),
        ('certs.k8saggregator.crt: not a CA certificate',
         lambda d: d['certs']['k8saggregator'].update(crt=_b64(leaf_crt), key=_b64(leaf_key))),
        ('certs.k8sserviceaccount.key: not a usable private key (the RSA PRIVATE KEY block does not load',
         lambda d: d['certs']['k8sserviceaccount'].update(key=_b64(b'-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n'))),
        ('certs.k8sserviceaccount.crt: unknown key', lambda d: d['certs']['k8sserviceaccount'].update(crt='x')),
        ('certs.extra: unknown key', lambda d: d['certs'].update(extra={})),
        ('secrets.secretboxencryptionsecrets: unknown key', lambda d: d['secrets'].update(secretboxencryptionsecrets='x')),
    ]


@pytest.mark.parametrize('expected, mutate', _cases(), ids=lambda value: value if isinstance(value, str) else '')
def test_malformed_bundle_names_the_field(bundle, expected, mutate):
    data = _mutated(bundle, mutate)
    with pytest.raises(ValidationError) as err:
        secrets.validate_bundle_dict(data)
    message = str(err.value)
    assert message.startswith(expected)
    # No secret of the bundle is quoted in the message.
    for value in bundle.secret_values():
        assert value not in message
    for line in bundle.certs['os']['key'].decode().splitlines()[1:-1]:
        assert line not in message


def test_non_mapping_and_bad_yaml(bundle):
    with pytest.raises(ValidationError) as err:
        secrets.parse_bundle('- a\n- b\n')
    assert str(err.value) == 'bundle: must be a mapping, got list'
    text = bundle.to_yaml().replace('cluster:\n', 'cluster: [\n', 1)
    with pytest.raises(ValidationError) as err:
        secrets.parse_bundle(text)
    assert err.value.field == 'secrets_bundle' and 'not valid YAML' in str(err.value)
    for value in bundle.secret_values():
        assert value not in str(err.value)


def test_repr_hides_secrets(bundle):
    text = repr(bundle)
    for value in bundle.secret_values():
        assert value not in text
    assert bundle.cluster_id not in text


def test_secret_values_cover_every_secret(bundle):
    values = bundle.secret_values()
    for value in (bundle.cluster_secret, bundle.bootstrap_token, bundle.trustd_token, bundle.secretbox_secret):
        assert value in values
    for name in secrets.CERT_NAMES:
        assert pki.b64encode_pem(bundle.certs[name]['key']) in values
