# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sealed-secrets keypair and offline sealing, as kubeseal does it. PRIVATE to the collection.

Keypair: an RSA key (4096 bits by default, PKCS#1 PEM as the controller writes it) and a
long-lived self-signed certificate for it. The controller loads any RSA key from a
kubernetes.io/tls Secret labelled `sealedsecrets.bitnami.com/sealed-secrets-key=active`; a key
it cannot parse makes it crash at start, so everything is validated here first.

Sealing (kubeseal's HybridEncrypt), for each Secret item separately:
  session key = 32 random bytes
  rsa part    = RSA-OAEP(SHA-256, MGF1 SHA-256, label by scope) of the session key
  aes part    = AES-256-GCM(session key, nonce 12 zero bytes, no AAD) of the value; ct || tag
  payload     = uint16 big-endian len(rsa part) || rsa part || aes part; standard base64
Label by scope: strict "namespace/name", namespace-wide "namespace", cluster-wide "" (empty).
The scope is carried by the annotations sealedsecrets.bitnami.com/namespace-wide and
sealedsecrets.bitnami.com/cluster-wide (cluster-wide wins) on the SealedSecret's metadata and
on spec.template.metadata. The controller takes the label from the SealedSecret's own metadata.

Nothing here returns or logs key material on its own: callers decide what leaves the process.
"""

from __future__ import annotations

import base64
import binascii
import copy
import datetime
import hashlib
import os
import re
import struct

from ansible_collections.proxtalos.cluster.plugins.module_utils._crypto import (
    parse_private_key, pem_label, public_key_der, require_cryptography)
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError

try:
    from cryptography import x509
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.x509.oid import NameOID
except ImportError:  # pragma: no cover - reported by _crypto.require_cryptography()
    pass

KEY_LABEL = 'sealedsecrets.bitnami.com/sealed-secrets-key'
NAMESPACE_WIDE_ANNOTATION = 'sealedsecrets.bitnami.com/namespace-wide'
CLUSTER_WIDE_ANNOTATION = 'sealedsecrets.bitnami.com/cluster-wide'
SCOPES = ('strict', 'namespace-wide', 'cluster-wide')
SEALED_API_VERSION = 'bitnami.com/v1alpha1'
SEALED_KIND = 'SealedSecret'

DEFAULT_KEY_SIZE = 4096
MIN_KEY_SIZE = 2048
DEFAULT_VALIDITY_DAYS = 3650
DEFAULT_COMMON_NAME = 'sealed-secret'
SESSION_KEY_BYTES = 32
GCM_NONCE = b'\x00' * 12
GCM_TAG_BYTES = 16
# The controller's default --key-renew-period: with renewal on, a key older than this is
# replaced at once by a fresh one, which then becomes the sealing key.
RENEW_PERIOD_DAYS = 30

# Annotations kubeseal strips from the template: they hold a clear-text copy of the Secret.
LAST_APPLIED_ANNOTATIONS = ('kubectl.kubernetes.io/last-applied-configuration',
                            'kubecfg.ksonnet.io/last-applied-configuration')
# Server-set metadata kubeseal clears (ObjectMeta fields that make no sense in a template).
SERVER_METADATA = ('ownerReferences', 'selfLink', 'uid', 'resourceVersion', 'generation',
                   'creationTimestamp', 'deletionTimestamp', 'deletionGracePeriodSeconds', 'managedFields')

_KEY_BLOCKS = ('RSA PRIVATE KEY', 'PRIVATE KEY')
_DNS_SUBDOMAIN = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')
_DNS_LABEL = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')
_SECRET_KEY = re.compile(r'^[-._a-zA-Z0-9]+$')


class SealingError(ProxtalosError):
    """Sealing or unsealing failed for a reason that is not the caller's input."""


def _utcnow():
    return datetime.datetime.now(datetime.timezone.utc)


def to_bytes(data):
    return data.encode('utf-8') if isinstance(data, str) else bytes(data)


# --- keypair ----------------------------------------------------------------------------------

def generate_keypair(key_size=DEFAULT_KEY_SIZE, common_name=DEFAULT_COMMON_NAME, validity_days=DEFAULT_VALIDITY_DAYS, now=None):
    """A new RSA key and a self-signed certificate for it (certificate_for), both as PEM bytes."""
    require_cryptography()
    if key_size < MIN_KEY_SIZE:
        raise ValidationError('key_size', 'must be at least %d bits, got %d' % (MIN_KEY_SIZE, key_size))
    if validity_days < 1:
        raise ValidationError('validity_days', 'must be at least 1 day, got %d' % validity_days)
    key = rsa.generate_private_key(public_exponent=65537, key_size=key_size)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
    return key_pem, certificate_for(key_pem, common_name, validity_days, now)


def certificate_for(key_pem, common_name=DEFAULT_COMMON_NAME, validity_days=DEFAULT_VALIDITY_DAYS, now=None):
    """A self-signed certificate (PEM bytes) for an RSA key given as PEM.

    Like the controller's own keys: random serial, CA basic constraint, NotBefore now. The controller uses KeyUsage
    EncipherOnly, which X.509 tooling only allows together with KeyAgreement; this certificate says keyEncipherment
    (what the key is used for) and keyCertSign (it is its own issuer). Neither the controller nor kubeseal checks
    key usage.
    """
    require_cryptography()
    if validity_days < 1:
        raise ValidationError('validity_days', 'must be at least 1 day, got %d' % validity_days)
    now = now or _utcnow()
    key = load_private_key(key_pem)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]) if common_name else x509.Name([])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=validity_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=True,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM)


def load_private_key(key_pem, field='private key', check_consistency=True):
    """The RSA private key in key_pem, checked the way the controller will read it. A PEM parsed before in this
    process gives the same key object again (one parsed with the check serves either kind of caller).

    check_consistency=False skips OpenSSL's check of the key's numbers (primes, CRT values): a quarter to half a
    second for a 4096-bit key. Only for a key that sealed_key checked in full earlier in the same run; the PEM
    block, the key type and size are still checked.
    """
    require_cryptography()
    key_pem = to_bytes(key_pem)
    label = pem_label(key_pem)
    if label is None:
        raise ValidationError(field, 'not PEM: no "-----BEGIN ...-----" line with its "-----END ...-----" line found')
    if label == 'ENCRYPTED PRIVATE KEY' or b'Proc-Type: 4,ENCRYPTED' in key_pem:
        raise ValidationError(field, 'the key is passphrase-protected; the sealed-secrets controller needs an unencrypted key')
    if label not in _KEY_BLOCKS:
        raise ValidationError(field, 'PEM block is "%s"; the controller reads only "RSA PRIVATE KEY" (PKCS#1) or '
                                     '"PRIVATE KEY" (PKCS#8) blocks' % label)
    try:
        key = parse_private_key(key_pem, check_consistency)
    except (ValueError, TypeError) as exc:
        raise ValidationError(field, 'cannot be parsed as a private key: %s' % exc) from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ValidationError(field, 'is a %s key; sealed-secrets needs an RSA key' % type(key).__name__.replace('_', ''))
    if key.key_size < MIN_KEY_SIZE:
        raise ValidationError(field, 'RSA key of %d bits is too small; use at least %d (4096 is the controller default)'
                              % (key.key_size, MIN_KEY_SIZE))
    return key


def load_certificate(cert_pem, field='certificate'):
    """The first certificate in cert_pem (the only one the controller and kubeseal use) and warnings."""
    require_cryptography()
    cert_pem = to_bytes(cert_pem)
    label = pem_label(cert_pem)
    if label is None:
        raise ValidationError(field, 'not PEM: no "-----BEGIN CERTIFICATE-----" line with its "-----END CERTIFICATE-----" '
                                     'line found')
    if label != 'CERTIFICATE':
        raise ValidationError(field, 'first PEM block is "%s", expected "CERTIFICATE"' % label)
    warnings = []
    try:
        certificates = x509.load_pem_x509_certificates(cert_pem)
    except ValueError as exc:
        raise ValidationError(field, 'cannot be parsed as an X.509 certificate: %s' % exc) from None
    if len(certificates) > 1:
        warnings.append('%s: holds %d certificates; the controller and kubeseal use only the first' % (field, len(certificates)))
    certificate = certificates[0]
    if not isinstance(certificate.public_key(), rsa.RSAPublicKey):
        raise ValidationError(field, 'its public key is not RSA; sealed-secrets needs an RSA certificate')
    return certificate, warnings


def fingerprints(certificate):
    """Fingerprints that identify the keypair without revealing it."""
    public_der = public_key_der(certificate.public_key())
    return {
        'certificate_sha256': certificate.fingerprint(hashes.SHA256()).hex(),
        'public_key_sha256': hashlib.sha256(public_der).hexdigest(),
    }


def check_validity(certificate, now=None, field='certificate'):
    """Raise when kubeseal would refuse the certificate; return warnings for what will bite later."""
    now = now or _utcnow()
    not_before = certificate.not_valid_before_utc
    not_after = certificate.not_valid_after_utc
    if not_after <= now:
        raise ValidationError(field, 'expired on %s; kubeseal refuses to seal with an expired certificate'
                              % not_after.isoformat())
    warnings = []
    if not_before > now:
        warnings.append('%s: not valid before %s (clock skew?)' % (field, not_before.isoformat()))
    if (now - not_before).days >= RENEW_PERIOD_DAYS:
        warnings.append('%s: NotBefore is %d days ago; with the controller\'s default key renewal (30 days) it would '
                        'generate a new sealing key at once: install the controller with keyrenewperiod "0"'
                        % (field, (now - not_before).days))
    if (not_after - now).days < 90:
        warnings.append('%s: expires on %s, in less than 90 days' % (field, not_after.isoformat()))
    return warnings


def describe_keypair(key_pem, cert_pem, now=None, key_field='private key', cert_field='certificate', check_consistency=True):
    """Validate a keypair as the controller and kubeseal need it; return facts and warnings.

    Raises ValidationError naming the field and the reason. The returned dict holds no key material.
    check_consistency: as for load_private_key.
    """
    key = load_private_key(key_pem, key_field, check_consistency)
    certificate, warnings = load_certificate(cert_pem, cert_field)
    if certificate.public_key().public_numbers() != key.public_key().public_numbers():
        raise ValidationError(cert_field, 'its public key does not match %s' % key_field)
    warnings.extend(check_validity(certificate, now, cert_field))
    if key.key_size != DEFAULT_KEY_SIZE:
        warnings.append('%s: RSA key of %d bits; the controller generates %d-bit keys' % (key_field, key.key_size, DEFAULT_KEY_SIZE))
    info = {
        'key_size': key.key_size,
        'subject': certificate.subject.rfc4514_string(),
        'serial_number': '%x' % certificate.serial_number,
        'not_before': certificate.not_valid_before_utc.isoformat(),
        'not_after': certificate.not_valid_after_utc.isoformat(),
    }
    info.update(fingerprints(certificate))
    return info, warnings


# --- hybrid encryption ---------------------------------------------------------------------------

def encryption_label(scope, namespace, name):
    """The OAEP label that binds a sealed value to its scope."""
    if scope == 'cluster-wide':
        return b''
    if scope == 'namespace-wide':
        return to_bytes(namespace or '')
    if scope == 'strict':
        return to_bytes('%s/%s' % (namespace or '', name or ''))
    raise ValidationError('scope', 'must be one of %s, got %r' % (', '.join(SCOPES), scope))


def _oaep(label):
    return padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=label or None)


def hybrid_encrypt(public_key, plaintext, label):
    """kubeseal's HybridEncrypt: the payload bytes (not yet base64)."""
    session_key = os.urandom(SESSION_KEY_BYTES)
    rsa_part = public_key.encrypt(session_key, _oaep(label))
    aes_part = AESGCM(session_key).encrypt(GCM_NONCE, to_bytes(plaintext), None)
    return struct.pack('>H', len(rsa_part)) + rsa_part + aes_part


def hybrid_decrypt(private_key, payload, label):
    """The controller's HybridDecrypt for one key; raises SealingError when it does not open."""
    if len(payload) < 2:
        raise SealingError('payload too short for its length prefix')
    rsa_length = struct.unpack('>H', payload[:2])[0]
    if len(payload) < 2 + rsa_length + GCM_TAG_BYTES:
        raise SealingError('payload too short: prefix says %d RSA bytes, payload has %d bytes' % (rsa_length, len(payload)))
    rsa_part = payload[2:2 + rsa_length]
    aes_part = payload[2 + rsa_length:]
    try:
        session_key = private_key.decrypt(rsa_part, _oaep(label))
    except ValueError:
        raise SealingError('the session key does not open with this private key and label %r '
                           '(wrong key, or sealed for another scope, namespace or name)' % label.decode('utf-8', 'replace')) from None
    try:
        return AESGCM(session_key).decrypt(GCM_NONCE, aes_part, None)
    except (InvalidTag, ValueError):
        raise SealingError('the value fails AES-GCM authentication (corrupted ciphertext)') from None


# --- the SealedSecret object ------------------------------------------------------------------

def scope_of(metadata):
    """The scope its annotations give an object (cluster-wide wins, then namespace-wide, else strict)."""
    annotations = (metadata or {}).get('annotations') or {}
    if annotations.get(CLUSTER_WIDE_ANNOTATION) == 'true':
        return 'cluster-wide'
    if annotations.get(NAMESPACE_WIDE_ANNOTATION) == 'true':
        return 'namespace-wide'
    return 'strict'


def with_scope_annotations(annotations, scope):
    """A copy of annotations that says exactly `scope` (strict = neither scope annotation)."""
    result = dict(annotations or {})
    result.pop(NAMESPACE_WIDE_ANNOTATION, None)
    result.pop(CLUSTER_WIDE_ANNOTATION, None)
    if scope == 'namespace-wide':
        result[NAMESPACE_WIDE_ANNOTATION] = 'true'
    elif scope == 'cluster-wide':
        result[CLUSTER_WIDE_ANNOTATION] = 'true'
    return result


def _secret_items(secret):
    """The plaintext bytes of each item: data (base64-decoded) first, then stringData over it."""
    items = {}
    data = secret.get('data') or {}
    string_data = secret.get('stringData') or {}
    for section, values in (('data', data), ('stringData', string_data)):
        if not isinstance(values, dict):
            raise ValidationError('secret.%s' % section, 'must be a mapping of key to value, got %s' % type(values).__name__)
        for key, value in values.items():
            field = 'secret.%s.%s' % (section, key)
            if not isinstance(key, str) or not _SECRET_KEY.match(key) or len(key) > 253:
                raise ValidationError(field, 'a Secret key must consist of alphanumerics, "-", "_" or "." (at most 253)')
            if value is None:
                value = ''
            if not isinstance(value, (str, bytes)):
                raise ValidationError(field, 'must be a string, got %s' % type(value).__name__)
            if section == 'data':
                try:
                    items[key] = base64.b64decode(to_bytes(value), validate=True)
                except (binascii.Error, ValueError):
                    raise ValidationError(field, 'is not valid base64 (use stringData for plain text)') from None
            else:
                items[key] = to_bytes(value)
    return items


def _check_secret(secret, scope):
    if not isinstance(secret, dict):
        raise ValidationError('secret', 'must be a mapping (a Secret manifest), got %s' % type(secret).__name__)
    if secret.get('kind', 'Secret') != 'Secret':
        raise ValidationError('secret.kind', 'must be "Secret", got %r' % secret.get('kind'))
    if secret.get('apiVersion', 'v1') != 'v1':
        raise ValidationError('secret.apiVersion', 'must be "v1", got %r' % secret.get('apiVersion'))
    metadata = secret.get('metadata') or {}
    if not isinstance(metadata, dict):
        raise ValidationError('secret.metadata', 'must be a mapping')
    name = metadata.get('name')
    namespace = metadata.get('namespace')
    if not name or not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise ValidationError('secret.metadata.name', 'must be a DNS subdomain name (lower case, digits, "-", "."), got %r' % (name,))
    if namespace is not None and (not isinstance(namespace, str) or len(namespace) > 63 or not _DNS_LABEL.match(namespace)):
        raise ValidationError('secret.metadata.namespace', 'must be a DNS label (lower case, digits, "-"), got %r' % (namespace,))
    if scope != 'cluster-wide' and not namespace:
        raise ValidationError('secret.metadata.namespace', 'is required for the %s scope (only cluster-wide secrets may omit it)' % scope)
    for field in ('labels', 'annotations'):
        value = metadata.get(field)
        if value is not None and (not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())):
            raise ValidationError('secret.metadata.%s' % field, 'must be a mapping of strings')
    return metadata, name, namespace


def template_metadata(metadata, scope):
    """spec.template.metadata as kubeseal writes it: the Secret's metadata, cleaned, with the scope."""
    result = copy.deepcopy(metadata)
    for field in SERVER_METADATA:
        result.pop(field, None)
    annotations = with_scope_annotations(result.get('annotations'), scope)
    for key in LAST_APPLIED_ANNOTATIONS:
        annotations.pop(key, None)
    if annotations:
        result['annotations'] = annotations
    else:
        result.pop('annotations', None)
    if not result.get('labels'):
        result.pop('labels', None)
    return result


def sealed_layout(secret, scope=None):
    """Everything of the SealedSecret except the encrypted values, plus the items to seal.

    Returns (sealed_secret_without_values, scope, items). scope=None takes the scope from the
    Secret's annotations (as kubeseal does without --scope); an explicit scope replaces them.
    """
    if scope is not None and scope not in SCOPES:
        raise ValidationError('scope', 'must be one of %s, got %r' % (', '.join(SCOPES), scope))
    if scope is None:
        scope = scope_of((secret or {}).get('metadata') if isinstance(secret, dict) else None)
    metadata, name, namespace = _check_secret(secret, scope)
    items = _secret_items(secret)
    top = {'name': name}
    if namespace:
        top['namespace'] = namespace
    annotations = with_scope_annotations({}, scope)
    if annotations:
        top['annotations'] = annotations
    template = {'metadata': template_metadata(metadata, scope), 'type': secret.get('type') or 'Opaque'}
    if secret.get('immutable') is not None:
        template['immutable'] = bool(secret['immutable'])
    sealed = {
        'apiVersion': SEALED_API_VERSION,
        'kind': SEALED_KIND,
        'metadata': top,
        'spec': {'encryptedData': {}, 'template': template},
    }
    return sealed, scope, items


def seal(secret, cert_pem, scope=None, now=None):
    """A SealedSecret (dict) for a Secret manifest, sealed with the certificate's public key."""
    certificate, _warnings = load_certificate(cert_pem, 'certificate')
    check_validity(certificate, now, 'certificate')
    sealed, scope, items = sealed_layout(secret, scope)
    metadata = sealed['metadata']
    label = encryption_label(scope, metadata.get('namespace'), metadata['name'])
    public_key = certificate.public_key()
    for key in sorted(items):
        payload = hybrid_encrypt(public_key, items[key], label)
        sealed['spec']['encryptedData'][key] = base64.b64encode(payload).decode('ascii')
    return sealed


def unseal(sealed, private_keys):
    """The plaintext bytes of each item of a SealedSecret, as the controller would open them.

    The label comes from the SealedSecret's own metadata (name, namespace, scope annotations).
    Each value may open with any of private_keys (the controller tries every active key).
    """
    if not isinstance(sealed, dict) or sealed.get('kind') != SEALED_KIND:
        raise ValidationError('sealed_secret', 'must be a %s object' % SEALED_KIND)
    metadata = sealed.get('metadata') or {}
    scope = scope_of(metadata)
    label = encryption_label(scope, metadata.get('namespace'), metadata.get('name'))
    encrypted = (sealed.get('spec') or {}).get('encryptedData') or {}
    result = {}
    for key, value in encrypted.items():
        try:
            payload = base64.b64decode(to_bytes(value), validate=True)
        except (binascii.Error, ValueError):
            raise SealingError('encryptedData.%s is not valid base64' % key) from None
        errors = []
        for private_key in private_keys:
            try:
                result[key] = hybrid_decrypt(private_key, payload, label)
                break
            except SealingError as exc:
                errors.append(str(exc))
        else:
            raise SealingError('encryptedData.%s does not open: %s' % (key, '; '.join(errors) or 'no private key given'))
    return result


def _without_null_timestamps(sealed):
    """A copy without the `creationTimestamp: null` kubeseal writes (Go zero values), so its output compares."""
    sealed = copy.deepcopy(sealed)
    for metadata in (sealed.get('metadata'), ((sealed.get('spec') or {}).get('template') or {}).get('metadata')):
        if isinstance(metadata, dict) and 'creationTimestamp' in metadata and metadata['creationTimestamp'] is None:
            del metadata['creationTimestamp']
    return sealed


def same_sealed_content(existing, secret, scope, private_key):
    """Whether an existing SealedSecret already seals exactly this Secret for this key and scope.

    Sealing is randomised, so a fresh seal never equals the old one byte for byte; the old one
    is current when everything but the encrypted values is what sealing would write now and
    every value opens with the private key to the same plaintext. Returns (same, reason).
    """
    expected, _scope, items = sealed_layout(secret, scope)
    if not isinstance(existing, dict):
        return False, 'the existing document is not a mapping'
    existing = _without_null_timestamps(existing)
    for field in ('apiVersion', 'kind', 'metadata'):
        if existing.get(field) != expected[field]:
            return False, '%s differs' % field
    existing_spec = existing.get('spec') or {}
    if existing_spec.get('template') != expected['spec']['template']:
        return False, 'spec.template differs'
    encrypted = existing_spec.get('encryptedData') or {}
    if sorted(encrypted) != sorted(items):
        return False, 'the set of keys differs'
    try:
        opened = unseal(existing, [private_key])
    except SealingError as exc:
        return False, str(exc)
    for key, value in items.items():
        if opened.get(key) != value:
            return False, 'the value of %s differs' % key
    return True, 'up to date'
