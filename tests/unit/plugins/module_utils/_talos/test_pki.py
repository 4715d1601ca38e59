"""Talos PKI: CA and admin certificate properties, PEM labels, key loading and matching."""
import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ansible_collections.proxtalos.cluster.plugins.module_utils import _crypto
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import pki
from ansible_collections.proxtalos.cluster.tests.unit.broken_keys import flipped_exponent_pem

NOW = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)


def ca_checks(crt_pem, key_pem, key_class, label, subject):
    cert = x509.load_pem_x509_certificate(crt_pem)
    assert pki.pem_label(key_pem) == label
    assert isinstance(pki.load_private_key(key_pem), key_class)
    assert pki.key_matches_certificate(crt_pem, key_pem)
    assert cert.subject.rfc4514_string() == subject
    assert cert.issuer == cert.subject
    assert pki.is_signed_by(cert, cert)
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.key_cert_sign and usage.value.digital_signature
    assert not usage.value.key_encipherment and not usage.value.crl_sign
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    assert len(cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest) == 20
    assert cert.not_valid_before_utc == NOW
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(hours=87600)
    assert 0 < cert.serial_number < 2 ** 128
    return cert


def test_os_ca_is_ed25519_with_talos_label():
    crt, key = pki.new_talos_ca(now=NOW)
    ca_checks(crt, key, ed25519.Ed25519PrivateKey, 'ED25519 PRIVATE KEY', 'O=talos')
    body = key.decode().splitlines()
    assert body[0] == '-----BEGIN ED25519 PRIVATE KEY-----'
    assert body[-1] == '-----END ED25519 PRIVATE KEY-----'


def test_os_ca_may_be_ecdsa():
    crt, key = pki.new_talos_ca('ecdsa', now=NOW)
    cert = ca_checks(crt, key, ec.EllipticCurvePrivateKey, 'EC PRIVATE KEY', 'O=talos')
    assert cert.public_key().curve.name == 'secp256r1'


def test_os_ca_rejects_other_key_types():
    with pytest.raises(ValidationError) as err:
        pki.new_talos_ca('rsa', now=NOW)
    assert err.value.field == 'os_ca_key_type'


@pytest.mark.parametrize('make, subject', [
    (pki.new_kubernetes_ca, 'O=kubernetes'),
    (pki.new_etcd_ca, 'O=etcd'),
    (pki.new_aggregator_ca, 'CN=front-proxy'),
])
def test_ecdsa_cas(make, subject):
    crt, key = make(now=NOW)
    cert = ca_checks(crt, key, ec.EllipticCurvePrivateKey, 'EC PRIVATE KEY', subject)
    assert cert.public_key().curve.name == 'secp256r1'
    assert cert.signature_hash_algorithm.name == 'sha256'


def test_service_account_key_is_rsa_4096_pkcs1():
    key_pem = pki.new_service_account_key()
    assert pki.pem_label(key_pem) == 'RSA PRIVATE KEY'
    key = pki.load_private_key(key_pem)
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 4096


def test_serials_and_key_ids_are_random():
    first = x509.load_pem_x509_certificate(pki.new_etcd_ca(now=NOW)[0])
    second = x509.load_pem_x509_certificate(pki.new_etcd_ca(now=NOW)[0])
    assert first.serial_number != second.serial_number
    ski = x509.SubjectKeyIdentifier
    assert first.extensions.get_extension_for_class(ski).value != second.extensions.get_extension_for_class(ski).value


@pytest.mark.parametrize('os_key_type, key_class, label', [
    ('ed25519', ed25519.Ed25519PrivateKey, 'ED25519 PRIVATE KEY'),
    ('ecdsa', ec.EllipticCurvePrivateKey, 'EC PRIVATE KEY'),
])
def test_admin_certificate(os_key_type, key_class, label):
    ca_crt, ca_key = pki.new_talos_ca(os_key_type, now=NOW)
    crt, key = pki.new_client_certificate(ca_crt, ca_key, now=NOW)
    cert = x509.load_pem_x509_certificate(crt)
    ca_cert = x509.load_pem_x509_certificate(ca_crt)
    assert pki.pem_label(key) == label
    assert isinstance(pki.load_private_key(key), key_class)
    assert pki.key_matches_certificate(crt, key)
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ['os:admin']
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME) == []
    assert cert.issuer == ca_cert.subject
    assert pki.is_signed_by(cert, ca_cert)
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and not usage.key_cert_sign and not usage.key_encipherment
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(hours=8760)
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    assert pki.client_certificate_problems(crt, key, ca_crt, now=NOW) == []


def test_client_certificate_roles_are_organizations():
    ca_crt, ca_key = pki.new_talos_ca(now=NOW)
    crt, dummy = pki.new_client_certificate(ca_crt, ca_key, roles=('os:reader', 'os:etcd:backup'), now=NOW)
    assert pki.organizations(x509.load_pem_x509_certificate(crt)) == ['os:reader', 'os:etcd:backup']
    with pytest.raises(ValidationError) as err:
        pki.new_client_certificate(ca_crt, ca_key, roles=('os:root',), now=NOW)
    assert err.value.field == 'roles'


def test_client_certificate_problems_name_each_reason():
    ca_crt, ca_key = pki.new_talos_ca(now=NOW)
    other_crt, other_key = pki.new_talos_ca(now=NOW)
    crt, key = pki.new_client_certificate(ca_crt, ca_key, now=NOW)
    assert pki.client_certificate_problems(crt, key, other_crt, now=NOW) == ['not signed by the current OS CA']
    later = NOW + datetime.timedelta(days=400)
    assert pki.client_certificate_problems(crt, key, ca_crt, now=later)[0].startswith('expired at')
    soon = NOW + datetime.timedelta(days=350)
    problems = pki.client_certificate_problems(crt, key, ca_crt, now=soon, min_remaining=datetime.timedelta(days=30))
    assert len(problems) == 1 and 'less than 30 days' in problems[0]
    reader_crt, reader_key = pki.new_client_certificate(ca_crt, ca_key, roles=('os:reader',), now=NOW)
    assert 'roles' in pki.client_certificate_problems(reader_crt, reader_key, ca_crt, now=NOW)[0]
    # A CA certificate has serverAuth too: not usable as a Talos client certificate.
    assert any('extended key usage' in p for p in pki.client_certificate_problems(ca_crt, ca_key, ca_crt, now=NOW))
    assert pki.client_certificate_problems(crt, other_key, ca_crt, now=NOW) == [
        'client.key: does not belong to the certificate in client.crt']


def test_talos_label_is_relabelled_for_python():
    crt, key = pki.new_talos_ca(now=NOW)
    from cryptography.hazmat.primitives import serialization
    with pytest.raises(ValueError):
        serialization.load_pem_private_key(key, password=None)
    python_pem = pki.pem_for_python(key)
    assert python_pem.startswith(b'-----BEGIN PRIVATE KEY-----')
    assert python_pem.rstrip().endswith(b'-----END PRIVATE KEY-----')
    loaded = serialization.load_pem_private_key(python_pem, password=None)
    assert isinstance(loaded, ed25519.Ed25519PrivateKey)
    # str input works too, and other labels are left alone.
    assert pki.pem_for_python(key.decode()) == python_pem
    ec_key = pki.new_etcd_ca(now=NOW)[1]
    assert pki.pem_for_python(ec_key) == ec_key


def test_python_ssl_accepts_relabelled_client_key(tmp_path):
    import ssl
    ca_crt, ca_key = pki.new_talos_ca(now=None)
    crt, key = pki.new_client_certificate(ca_crt, ca_key)
    (tmp_path / 'c.pem').write_bytes(crt)
    (tmp_path / 'k.pem').write_bytes(pki.pem_for_python(key))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_cert_chain(str(tmp_path / 'c.pem'), str(tmp_path / 'k.pem'))


def test_key_loading_accepts_every_talos_label():
    crt, key = pki.new_talos_ca(now=NOW)
    assert isinstance(pki.load_private_key(pki.pem_for_python(key)), ed25519.Ed25519PrivateKey)
    assert isinstance(pki.load_private_key(key), ed25519.Ed25519PrivateKey)
    assert isinstance(pki.load_private_key(pki.new_etcd_ca(now=NOW)[1]), ec.EllipticCurvePrivateKey)


@pytest.mark.parametrize('value, reason', [
    (b'', 'not a PEM private key'),
    (b'hello', 'not a PEM private key'),
    (b'-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n', 'not a PEM private key'),
    (b'-----BEGIN EC PRIVATE KEY-----\nbm90IGEga2V5\n-----END EC PRIVATE KEY-----\n', 'the EC PRIVATE KEY block does not load'),
    (None, 'not a PEM private key'),
])
def test_bad_keys_name_the_field(value, reason):
    with pytest.raises(ValidationError) as err:
        pki.load_private_key(value, 'certs.os.key')
    assert err.value.field == 'certs.os.key'
    assert reason in str(err.value)


def test_bad_certificate_names_the_field():
    with pytest.raises(ValidationError) as err:
        pki.load_certificate(pki.new_etcd_ca(now=NOW)[1], 'certs.etcd.crt')
    assert str(err.value) == 'certs.etcd.crt: not a PEM certificate'


def test_key_pair_mismatch_is_detected():
    crt, dummy = pki.new_etcd_ca(now=NOW)
    dummy, other_key = pki.new_etcd_ca(now=NOW)
    assert not pki.key_matches_certificate(crt, other_key)
    with pytest.raises(ValidationError) as err:
        pki.check_key_pair(crt, other_key, 'certs.etcd')
    assert err.value.field == 'certs.etcd.key'
    # Same algorithm family but different type of key: also a mismatch, not a crash.
    assert not pki.key_matches_certificate(crt, pki.new_talos_ca(now=NOW)[1])


def test_signature_check_rejects_foreign_signer():
    ca_crt, ca_key = pki.new_talos_ca(now=NOW)
    other_crt, other_key = pki.new_talos_ca(now=NOW)
    crt, dummy = pki.new_client_certificate(other_crt, other_key, now=NOW)
    # Same subject (O=talos) but a different key: the signature does not verify.
    assert not pki.is_signed_by(x509.load_pem_x509_certificate(crt), x509.load_pem_x509_certificate(ca_crt))


def test_describe_certificate_has_no_secrets():
    crt, key = pki.new_talos_ca(now=NOW)
    summary = pki.describe_certificate(x509.load_pem_x509_certificate(crt))
    assert summary['subject'] == 'O=talos' and summary['is_ca'] is True
    assert summary['key_type'] == 'ed25519'
    assert summary['ext_key_usage'] == ['serverAuth', 'clientAuth']
    assert summary['not_after'] == '2039-12-31T03:04:05Z'
    body = key.decode().splitlines()[1]
    assert body not in repr(summary)


def test_base64_helpers():
    pem = pki.new_etcd_ca(now=NOW)[0]
    assert pki.b64decode_pem(pki.b64encode_pem(pem), 'x') == pem
    with pytest.raises(ValidationError) as err:
        pki.b64decode_pem('not base64!', 'certs.k8s.crt')
    assert str(err.value) == 'certs.k8s.crt: not valid base64'
    with pytest.raises(ValidationError) as err:
        pki.b64decode_pem(None, 'certs.k8s.crt')
    assert str(err.value) == 'certs.k8s.crt: missing'


def test_signature_check_across_key_types_is_false_not_an_error():
    ed_crt, ed_key = pki.new_talos_ca('ed25519', now=NOW)
    ec_crt, dummy = pki.new_talos_ca('ecdsa', now=NOW)
    leaf, dummy = pki.new_client_certificate(ed_crt, ed_key, now=NOW)
    # Both CAs are O=talos; only the Ed25519 one signed the leaf.
    assert not pki.is_signed_by(x509.load_pem_x509_certificate(leaf), x509.load_pem_x509_certificate(ec_crt))
    assert pki.is_signed_by(x509.load_pem_x509_certificate(leaf), x509.load_pem_x509_certificate(ed_crt))


def rsa_key_with_broken_numbers(bits=2048):
    """PEM of an RSA key whose private exponent has one bit flipped: n and e (the public key) are right, the key parses
    when its numbers are not checked, and OpenSSL's check refuses it."""
    from cryptography.hazmat.primitives import serialization  # pylint: disable=import-outside-toplevel
    return flipped_exponent_pem(rsa.generate_private_key(public_exponent=65537, key_size=bits),
                                serialization.PrivateFormat.TraditionalOpenSSL)


def test_an_rsa_key_with_broken_numbers_is_refused_unless_the_check_is_skipped(monkeypatch):
    monkeypatch.setattr(_crypto, '_PARSED', {})
    pem = rsa_key_with_broken_numbers()
    with pytest.raises(ValidationError) as err:
        pki.load_private_key(pem, 'certs.k8sserviceaccount.key')
    assert err.value.field == 'certs.k8sserviceaccount.key'
    assert 'the RSA PRIVATE KEY block does not load: Invalid private key' in str(err.value)
    assert pki.load_private_key(pem, 'certs.k8sserviceaccount.key', check_consistency=False).key_size == 2048
