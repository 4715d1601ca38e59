# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Talos PKI: the CAs of a secrets bundle and the talosconfig admin certificate. PRIVATE.

What `talosctl gen secrets` makes (facts/talos-api.md part 4):

| CA | key | PEM label of the key | subject |
|----|-----|----------------------|---------|
| os (Talos API) | Ed25519 | `ED25519 PRIVATE KEY` (PKCS#8 body) | O=talos |
| k8s | ECDSA P-256 | `EC PRIVATE KEY` (SEC1) | O=kubernetes |
| etcd | ECDSA P-256 | `EC PRIVATE KEY` (SEC1) | O=etcd |
| k8saggregator | ECDSA P-256 | `EC PRIVATE KEY` (SEC1) | CN=front-proxy |
| k8sserviceaccount | RSA 4096, key only | `RSA PRIVATE KEY` (PKCS#1) | - |

Every CA is self-signed, IsCA, KeyUsage certSign+digitalSignature, EKU serverAuth+clientAuth,
random serial and SubjectKeyId, valid 87600 h. The admin client certificate is O=os:admin (one
O per role), no CN, KeyUsage digitalSignature, EKU clientAuth only (apid rejects any other EKU
set), valid one year, with a key of the OS CA's type, signed by the OS CA.

Python's PEM loaders reject the `ED25519 PRIVATE KEY` label; `load_private_key` relabels it to
`PRIVATE KEY` first, and `pem_for_python` gives a key PEM that `ssl`/grpclib accept.

All PEM values are bytes. Nothing here prints or touches files.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import os
import secrets as _secrets

from ansible_collections.proxtalos.cluster.plugins.module_utils._crypto import (
    as_bytes, parse_private_key, pem_label, public_key_der, require_cryptography)
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError

try:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:  # pragma: no cover - reported by _crypto.require_cryptography()
    pass


TALOS_ED25519_LABEL = 'ED25519 PRIVATE KEY'
CA_VALIDITY = datetime.timedelta(hours=87600)
ADMIN_CERT_VALIDITY = datetime.timedelta(hours=8760)
ADMIN_ROLE = 'os:admin'
OS_CA_KEY_TYPES = ('ed25519', 'ecdsa')
KNOWN_ROLES = ('os:admin', 'os:operator', 'os:reader', 'os:etcd:backup', 'os:image:verifier',
               'os:meta:writer', 'os:impersonator')


def utcnow():
    """The current time, timezone-aware UTC, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


# --- keys -------------------------------------------------------------------------------------

def generate_private_key(key_type):
    """A new private key: 'ed25519', 'ecdsa' (P-256) or 'rsa' (4096 bits)."""
    require_cryptography()
    if key_type == 'ed25519':
        return ed25519.Ed25519PrivateKey.generate()
    if key_type == 'ecdsa':
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == 'rsa':
        return rsa.generate_private_key(public_exponent=65537, key_size=4096)
    raise ValueError('unknown key type %r (expected ed25519, ecdsa or rsa)' % (key_type,))


def key_type_of(key):
    """'ed25519', 'ecdsa' or 'rsa' for a private or public key object."""
    if isinstance(key, (ed25519.Ed25519PrivateKey, ed25519.Ed25519PublicKey)):
        return 'ed25519'
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        return 'ecdsa'
    if isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)):
        return 'rsa'
    return type(key).__name__


def describe_key(key):
    """Short description of a key: 'ed25519', 'ecdsa-secp256r1', 'rsa-4096'."""
    kind = key_type_of(key)
    if kind == 'ecdsa':
        return 'ecdsa-%s' % key.curve.name
    if kind == 'rsa':
        return 'rsa-%d' % key.key_size
    return kind


def private_key_to_pem(key):
    """PEM bytes of a private key with the labels Talos writes.

    Ed25519: `ED25519 PRIVATE KEY` around a PKCS#8 body; ECDSA: `EC PRIVATE KEY` (SEC1);
    RSA: `RSA PRIVATE KEY` (PKCS#1).
    """
    require_cryptography()
    if key_type_of(key) == 'ed25519':
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        return pem.replace(b'-----BEGIN PRIVATE KEY-----', b'-----BEGIN %s-----' % TALOS_ED25519_LABEL.encode()) \
                  .replace(b'-----END PRIVATE KEY-----', b'-----END %s-----' % TALOS_ED25519_LABEL.encode())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def pem_for_python(key_pem):
    """The key PEM with a Talos `ED25519 PRIVATE KEY` label changed to `PRIVATE KEY`.

    The body is already PKCS#8, so only the label changes; `ssl.SSLContext.load_cert_chain`
    and cryptography accept the result. Other labels are returned unchanged. Takes and
    returns bytes (str input is accepted).
    """
    data = as_bytes(key_pem)
    label = TALOS_ED25519_LABEL.encode()
    return data.replace(b'-----BEGIN ' + label + b'-----', b'-----BEGIN PRIVATE KEY-----') \
               .replace(b'-----END ' + label + b'-----', b'-----END PRIVATE KEY-----')


def load_private_key(key_pem, field='key', check_consistency=True):
    """Private key object from PEM (any of the labels Talos accepts).

    Accepts `ED25519 PRIVATE KEY`, `PRIVATE KEY`, `EC PRIVATE KEY` and `RSA PRIVATE KEY`.
    Raises ValidationError naming `field` (never quoting the key) when it is not one.
    A PEM parsed before in this process gives the same key object again.
    check_consistency=False skips OpenSSL's check of an RSA key's numbers (a quarter of a second for the 4096-bit
    service account key); only for a bundle that talos_secrets checked in full earlier in the same run.
    """
    require_cryptography()
    try:
        data = as_bytes(key_pem)
    except TypeError:
        raise ValidationError(field, 'not a PEM private key')
    label = pem_label(data)
    if label not in (TALOS_ED25519_LABEL, 'PRIVATE KEY', 'EC PRIVATE KEY', 'RSA PRIVATE KEY'):
        raise ValidationError(field, 'not a PEM private key')
    try:
        return parse_private_key(pem_for_python(data), check_consistency)
    except TypeError:
        raise ValidationError(field, 'is an encrypted private key; Talos needs it unencrypted')
    except (ValueError, UnsupportedAlgorithm) as exc:
        # cryptography's reason names no key material ('Invalid private key' for RSA numbers that do not hold)
        raise ValidationError(field, 'not a usable private key (the %s block does not load: %s)' % (label, exc))


def _load_pem_certificates(crt_pem, field, loader, what):
    """loader(PEM bytes) after checking that the text starts with a CERTIFICATE block; ValidationError naming `field`."""
    try:
        data = as_bytes(crt_pem)
    except TypeError:
        raise ValidationError(field, 'not a PEM certificate')
    if pem_label(data) != 'CERTIFICATE':
        raise ValidationError(field, 'not a PEM certificate')
    try:
        return loader(data)
    except ValueError:
        raise ValidationError(field, 'not a PEM certificate %s does not decode)' % what)


def load_certificate(crt_pem, field='crt'):
    """x509.Certificate from PEM; ValidationError naming `field` when it is not one."""
    require_cryptography()
    return _load_pem_certificates(crt_pem, field, x509.load_pem_x509_certificate, '(CERTIFICATE block')


def load_certificates(bundle_pem, field='crt'):
    """[x509.Certificate] of every CERTIFICATE block of a PEM bundle, in order; ValidationError naming `field`."""
    require_cryptography()
    return _load_pem_certificates(bundle_pem, field, x509.load_pem_x509_certificates, 'bundle (a CERTIFICATE block')


def certificate_to_pem(cert):
    """PEM bytes of a certificate."""
    return cert.public_bytes(serialization.Encoding.PEM)


def key_matches_certificate(crt_pem, key_pem):
    """True when the private key (PEM) belongs to the certificate (PEM).

    Raises ValidationError ('crt'/'key') when either does not parse.
    """
    cert = load_certificate(crt_pem, 'crt')
    key = load_private_key(key_pem, 'key')
    return public_key_der(cert.public_key()) == public_key_der(key.public_key())


def check_key_pair(crt_pem, key_pem, field):
    """Raise ValidationError unless crt and key parse and belong together.

    Errors name `<field>.crt` or `<field>.key`. Returns (certificate, private key).
    """
    cert = load_certificate(crt_pem, field + '.crt')
    key = load_private_key(key_pem, field + '.key')
    if public_key_der(cert.public_key()) != public_key_der(key.public_key()):
        raise ValidationError(field + '.key', 'does not belong to the certificate in %s.crt' % field)
    return cert, key


# --- certificate properties ------------------------------------------------------------------

def _extension(cert, ext_class):
    try:
        return cert.extensions.get_extension_for_class(ext_class).value
    except x509.ExtensionNotFound:
        return None


def is_ca(cert):
    """True when BasicConstraints says CA."""
    constraints = _extension(cert, x509.BasicConstraints)
    return bool(constraints is not None and constraints.ca)


def ext_key_usages(cert):
    """Dotted names of the certificate's EKUs: ['serverAuth', 'clientAuth'] etc."""
    usages = _extension(cert, x509.ExtendedKeyUsage)
    if usages is None:
        return []
    names = {ExtendedKeyUsageOID.SERVER_AUTH: 'serverAuth', ExtendedKeyUsageOID.CLIENT_AUTH: 'clientAuth'}
    return [names.get(oid, oid.dotted_string) for oid in usages]


def organizations(cert):
    """Subject Organization values (for Talos client certificates: the roles)."""
    return [attr.value for attr in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]


def not_valid_after(cert):
    """Expiry as an aware UTC datetime."""
    return cert.not_valid_after_utc


def not_valid_before(cert):
    """Start of validity as an aware UTC datetime."""
    return cert.not_valid_before_utc


def is_signed_by(cert, ca_cert):
    """True when cert's issuer is ca_cert's subject and ca_cert's key verifies its signature.

    A signature of another algorithm than the CA key's (an Ed25519-signed certificate
    checked against an ECDSA CA of the same name) is "not signed by", not an error.
    """
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def describe_certificate(cert):
    """A JSON-friendly summary (no secrets) of a certificate object, for module results."""
    return {
        'subject': cert.subject.rfc4514_string(),
        'issuer': cert.issuer.rfc4514_string(),
        'serial': '%x' % cert.serial_number,
        'not_before': not_valid_before(cert).strftime('%Y-%m-%dT%H:%M:%SZ'),
        'not_after': not_valid_after(cert).strftime('%Y-%m-%dT%H:%M:%SZ'),
        'key_type': describe_key(cert.public_key()),
        'is_ca': is_ca(cert),
        'ext_key_usage': ext_key_usages(cert),
    }


# --- issuing ---------------------------------------------------------------------------------

def _random_serial():
    serial = 0
    while serial == 0:
        serial = _secrets.randbits(128)
    return serial


def _signature_hash(signing_key):
    return None if key_type_of(signing_key) == 'ed25519' else hashes.SHA256()


def _name(organizations_=(), common_name=None):
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations_]
    if common_name:
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def new_ca(key_type, organization=None, common_name=None, now=None, validity=CA_VALIDITY):
    """A self-signed CA the way Talos makes them. Returns (crt_pem, key_pem) bytes.

    key_type: 'ed25519' or 'ecdsa'; organization / common_name: the subject; now: aware
    datetime for NotBefore (default: the current time); validity: timedelta.
    """
    require_cryptography()
    now = now or utcnow()
    key = generate_private_key(key_type)
    subject = _name([organization] if organization else [], common_name)
    builder = (x509.CertificateBuilder()
               .subject_name(subject)
               .issuer_name(subject)
               .public_key(key.public_key())
               .serial_number(_random_serial())
               .not_valid_before(now)
               .not_valid_after(now + validity)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, key_cert_sign=True, crl_sign=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                     ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(x509.SubjectKeyIdentifier(os.urandom(20)), critical=False))
    cert = builder.sign(key, _signature_hash(key))
    return certificate_to_pem(cert), private_key_to_pem(key)


def new_talos_ca(key_type='ed25519', now=None):
    """The OS (Talos API) CA: O=talos, Ed25519 like talosctl, or ECDSA P-256 if asked."""
    if key_type not in OS_CA_KEY_TYPES:
        raise ValidationError('os_ca_key_type', 'must be one of %s, got %r' % (', '.join(OS_CA_KEY_TYPES), key_type))
    return new_ca(key_type, organization='talos', now=now)


def new_kubernetes_ca(now=None):
    """The Kubernetes CA: ECDSA P-256, O=kubernetes."""
    return new_ca('ecdsa', organization='kubernetes', now=now)


def new_etcd_ca(now=None):
    """The etcd CA: ECDSA P-256, O=etcd."""
    return new_ca('ecdsa', organization='etcd', now=now)


def new_aggregator_ca(now=None):
    """The front-proxy (aggregator) CA: ECDSA P-256, CN=front-proxy."""
    return new_ca('ecdsa', common_name='front-proxy', now=now)


def new_service_account_key():
    """The service-account signing key: RSA 4096, PEM `RSA PRIVATE KEY` (key only)."""
    return private_key_to_pem(generate_private_key('rsa'))


def new_client_certificate(ca_crt_pem, ca_key_pem, roles=(ADMIN_ROLE,), now=None, validity=ADMIN_CERT_VALIDITY):
    """A Talos API client certificate signed by the OS CA. Returns (crt_pem, key_pem) bytes.

    Subject: one O per role, no CN. KeyUsage digitalSignature, EKU clientAuth only. The key
    has the CA's type (Ed25519 under an Ed25519 CA, ECDSA P-256 under an ECDSA one).
    """
    require_cryptography()
    if not roles:
        raise ValidationError('roles', 'at least one role is required')
    for role in roles:
        if role not in KNOWN_ROLES:
            raise ValidationError('roles', 'unknown Talos role %r (known: %s)' % (role, ', '.join(KNOWN_ROLES)))
    ca_cert, ca_key = check_key_pair(ca_crt_pem, ca_key_pem, 'certs.os')
    now = now or utcnow()
    ca_kind = key_type_of(ca_key)
    key = generate_private_key('ed25519' if ca_kind == 'ed25519' else 'ecdsa')
    builder = (x509.CertificateBuilder()
               .subject_name(_name(list(roles)))
               .issuer_name(ca_cert.subject)
               .public_key(key.public_key())
               .serial_number(_random_serial())
               .not_valid_before(now)
               .not_valid_after(now + validity)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, key_cert_sign=False, crl_sign=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
    ca_ski = _extension(ca_cert, x509.SubjectKeyIdentifier)
    if ca_ski is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
    cert = builder.sign(ca_key, _signature_hash(ca_key))
    return certificate_to_pem(cert), private_key_to_pem(key)


def client_certificate_problems(crt_pem, key_pem, ca_crt_pem, roles=(ADMIN_ROLE,), now=None, min_remaining=None):
    """Why a Talos client certificate cannot be (re)used; an empty list means it can.

    Checks: crt/key parse and match; signed by the OS CA; Organization == roles; EKU exactly
    clientAuth; currently valid, with at least `min_remaining` (timedelta) left.
    """
    problems = []
    try:
        cert, dummy = check_key_pair(crt_pem, key_pem, 'client')
        ca_cert = load_certificate(ca_crt_pem, 'ca')
    except ValidationError as exc:
        return [str(exc)]
    if not is_signed_by(cert, ca_cert):
        problems.append('not signed by the current OS CA')
    if sorted(organizations(cert)) != sorted(roles):
        problems.append('roles %s instead of %s' % (organizations(cert), list(roles)))
    if ext_key_usages(cert) != ['clientAuth']:
        problems.append('extended key usage %s instead of [clientAuth]' % ext_key_usages(cert))
    now = now or utcnow()
    if not_valid_before(cert) > now:
        problems.append('not valid before %s' % not_valid_before(cert).isoformat())
    remaining = not_valid_after(cert) - now
    if remaining <= datetime.timedelta(0):
        problems.append('expired at %s' % not_valid_after(cert).isoformat())
    elif min_remaining is not None and remaining < min_remaining:
        problems.append('expires at %s, less than %s from now' % (not_valid_after(cert).isoformat(), min_remaining))
    return problems


# --- base64 as Talos stores PEM in YAML ------------------------------------------------------

def b64encode_pem(pem):
    """Standard base64 (with padding) of PEM bytes, as text."""
    return base64.b64encode(as_bytes(pem)).decode('ascii')


def b64decode_pem(value, field):
    """PEM bytes from standard base64 text; ValidationError naming `field` otherwise."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(field, 'missing' if value in (None, '') else 'must be base64 text')
    try:
        return base64.b64decode(''.join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError(field, 'not valid base64')
