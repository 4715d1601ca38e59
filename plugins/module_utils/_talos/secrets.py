# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Talos secrets bundle, in the exact shape of `talosctl gen secrets`. PRIVATE.

File layout (YAML keys are talosctl's, facts/talos-api.md 5.1):

    cluster:    {id: <base64url+padding of 32 bytes>, secret: <base64 of 32 bytes>}
    secrets:    {bootstraptoken: <[0-9a-z]{6}.[0-9a-z]{16}>,
                 secretboxencryptionsecret: <base64 of 32 bytes>}   # or aescbcencryptionsecret
    trustdinfo: {token: <[0-9a-z]{6}.[0-9a-z]{16}>}
    certs:      {etcd, k8s, k8saggregator, os: {crt: <base64 PEM>, key: <base64 PEM>},
                 k8sserviceaccount: {key: <base64 PEM>}}

A bundle written here loads in talosctl (`--with-secrets`), and one written by talosctl loads
here. `SecretsBundle.to_yaml()` is deterministic: the same bundle always gives the same bytes,
and parse -> to_yaml -> parse -> to_yaml is stable, so a module detects "unchanged" by
comparing bytes.

Validation follows talosctl's Bundle.Validate, plus what Talos needs to use the values:
every error is a ValidationError naming the field (`certs.os.key: not a PEM private key`,
`secrets.bootstraptoken: missing`) and never quotes a secret.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets as _secrets

from ansible_collections.proxtalos.cluster.plugins.module_utils._crypto import require_cryptography
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import pki, talosyaml

TOKEN_ALPHABET = '0123456789abcdefghijklmnopqrstuvwxyz'
TOKEN_RE = re.compile(r'^[0-9a-z]{6}\.[0-9a-z]{16}$')
CA_NAMES = ('etcd', 'k8s', 'k8saggregator', 'os')
CERT_NAMES = ('etcd', 'k8s', 'k8saggregator', 'k8sserviceaccount', 'os')

_TOP_KEYS = ('cluster', 'secrets', 'trustdinfo', 'certs')
_SECTION_KEYS = {
    'cluster': ('id', 'secret'),
    'secrets': ('bootstraptoken', 'aescbcencryptionsecret', 'secretboxencryptionsecret'),
    'trustdinfo': ('token',),
}
# Secret values a module must register with no_log (dotted paths into to_dict()).
SECRET_PATHS = ('cluster.secret', 'secrets.bootstraptoken', 'secrets.secretboxencryptionsecret',
                'secrets.aescbcencryptionsecret', 'trustdinfo.token', 'certs.*.key')


def generate_token(first=6, second=16):
    """A kubeadm-style token `[0-9a-z]{first}.[0-9a-z]{second}` from the OS CSPRNG.

    Characters are drawn by rejection sampling over random bytes (values >= 252 are
    discarded) so each of the 36 characters is equally likely.
    """
    def part(length):
        out = []
        limit = 256 - (256 % len(TOKEN_ALPHABET))
        while len(out) < length:
            for byte in _secrets.token_bytes(length * 2):
                if byte < limit:
                    out.append(TOKEN_ALPHABET[byte % len(TOKEN_ALPHABET)])
                    if len(out) == length:
                        break
        return ''.join(out)
    return '%s.%s' % (part(first), part(second))


def generate_cluster_id():
    """cluster.id: URL-safe base64 (with padding) of 32 random bytes."""
    return base64.urlsafe_b64encode(_secrets.token_bytes(32)).decode('ascii')


def generate_secret32():
    """Standard base64 of 32 random bytes (cluster.secret, secretbox key)."""
    return base64.b64encode(_secrets.token_bytes(32)).decode('ascii')


class SecretsBundle(object):
    """One cluster's secrets. PEM values are bytes; everything else is text.

    Attributes: cluster_id, cluster_secret, bootstrap_token, secretbox_secret (or
    aescbc_secret for bundles of Talos <= 1.2), trustd_token, and certs: a dict
    name -> {'crt': PEM bytes, 'key': PEM bytes} for etcd, k8s, k8saggregator and os, and
    {'key': PEM bytes} for k8sserviceaccount.
    """

    def __init__(self, cluster_id, cluster_secret, bootstrap_token, trustd_token, certs,
                 secretbox_secret=None, aescbc_secret=None):
        self.cluster_id = cluster_id
        self.cluster_secret = cluster_secret
        self.bootstrap_token = bootstrap_token
        self.secretbox_secret = secretbox_secret
        self.aescbc_secret = aescbc_secret
        self.trustd_token = trustd_token
        self.certs = certs

    def __repr__(self):
        # Never show secrets in a repr (tracebacks, debuggers).
        return 'SecretsBundle(cluster_id=<hidden>, os_ca_key_type=%s)' % (self.os_key_type(),)

    def os_key_type(self):
        """Key type of the OS CA ('ed25519' or 'ecdsa'), or None if it cannot be read."""
        try:
            return pki.key_type_of(pki.load_private_key(self.certs['os']['key'], 'certs.os.key'))
        except (KeyError, ValidationError, TypeError):
            return None

    def ca(self, name):
        """(crt_pem, key_pem) of CA `name` (etcd, k8s, k8saggregator, os)."""
        if name not in CA_NAMES:
            raise KeyError(name)
        return self.certs[name]['crt'], self.certs[name]['key']

    def to_dict(self):
        """The talosctl-shaped dict: PEM values as standard base64 text, keys in talosctl order."""
        secrets_section = {'bootstraptoken': self.bootstrap_token}
        if self.aescbc_secret:
            secrets_section['aescbcencryptionsecret'] = self.aescbc_secret
        if self.secretbox_secret:
            secrets_section['secretboxencryptionsecret'] = self.secretbox_secret
        certs = {}
        for name in CERT_NAMES:
            entry = self.certs[name]
            if name == 'k8sserviceaccount':
                certs[name] = {'key': pki.b64encode_pem(entry['key'])}
            else:
                certs[name] = {'crt': pki.b64encode_pem(entry['crt']), 'key': pki.b64encode_pem(entry['key'])}
        return {
            'cluster': {'id': self.cluster_id, 'secret': self.cluster_secret},
            'secrets': secrets_section,
            'trustdinfo': {'token': self.trustd_token},
            'certs': certs,
        }

    def to_yaml(self):
        """Deterministic YAML text of the bundle (what goes into secrets.yaml, mode 0600)."""
        return talosyaml.dump(self.to_dict())

    def secret_values(self):
        """Every secret string in the bundle, plain and base64 forms (for no_log registration)."""
        values = [self.cluster_secret, self.bootstrap_token, self.secretbox_secret, self.aescbc_secret,
                  self.trustd_token]
        for name in CERT_NAMES:
            key = self.certs[name]['key']
            values.extend([key.decode('ascii', 'replace'), pki.b64encode_pem(key)])
        return [value for value in values if value]

    def validate(self):
        """Raise ValidationError (naming the field) unless the bundle is usable by Talos."""
        validate_bundle_dict(self.to_dict())


def generate_bundle(os_key_type='ed25519', now=None):
    """A new bundle like `talosctl gen secrets` for Talos >= 1.7 (secretbox, RSA service key).

    os_key_type: 'ed25519' (talosctl's choice) or 'ecdsa' (P-256, for grpcio clients).
    now: aware datetime for the CAs' NotBefore (default: the current time).
    """
    require_cryptography()
    certs = {}
    for name, make in (('etcd', pki.new_etcd_ca), ('k8s', pki.new_kubernetes_ca),
                       ('k8saggregator', pki.new_aggregator_ca)):
        crt, key = make(now=now)
        certs[name] = {'crt': crt, 'key': key}
    certs['k8sserviceaccount'] = {'key': pki.new_service_account_key()}
    crt, key = pki.new_talos_ca(os_key_type, now=now)
    certs['os'] = {'crt': crt, 'key': key}
    return SecretsBundle(cluster_id=generate_cluster_id(), cluster_secret=generate_secret32(),
                         bootstrap_token=generate_token(), trustd_token=generate_token(),
                         secretbox_secret=generate_secret32(), certs=certs)


def _mapping(value, field, required=True):
    if value is None:
        if required:
            raise ValidationError(field, 'missing')
        return None
    if not isinstance(value, dict):
        raise ValidationError(field, 'must be a mapping, got %s' % type(value).__name__)
    return value


def _reject_unknown(section, allowed, field):
    for key in section:
        if key not in allowed:
            where = '%s.%s' % (field, key) if field else str(key)
            raise ValidationError(where, 'unknown key (expected one of %s)' % ', '.join(allowed))


def _text(section, key, field):
    value = section.get(key)
    if value is None or value == '':
        raise ValidationError(field, 'missing')
    if not isinstance(value, str):
        raise ValidationError(field, 'must be text, got %s' % type(value).__name__)
    return value


def _check_b64_key(value, field, sizes):
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError(field, 'not valid base64')
    if len(raw) not in sizes:
        raise ValidationError(field, 'must decode to %s bytes, got %d' % (' or '.join(str(s) for s in sizes), len(raw)))


def validate_bundle_dict(data, check_key_consistency=True):
    """Check a talosctl-shaped bundle dict; return a SecretsBundle (PEM as bytes).

    Rules (talosctl Bundle.Validate plus what Talos needs): cluster.id/secret,
    secrets.bootstraptoken (kubeadm format), trustdinfo.token required; exactly one of
    secretboxencryptionsecret (32 bytes) / aescbcencryptionsecret (16, 24 or 32 bytes);
    certs etcd/k8s/k8saggregator/os: certificate and key parse, belong together, and the
    certificate is a CA; certs.k8sserviceaccount.key parses. Unknown keys are errors.
    """
    data = _mapping(data, 'bundle')
    _reject_unknown(data, _TOP_KEYS, '')
    cluster = _mapping(data.get('cluster'), 'cluster')
    _reject_unknown(cluster, _SECTION_KEYS['cluster'], 'cluster')
    cluster_id = _text(cluster, 'id', 'cluster.id')
    cluster_secret = _text(cluster, 'secret', 'cluster.secret')

    secrets_section = _mapping(data.get('secrets'), 'secrets')
    _reject_unknown(secrets_section, _SECTION_KEYS['secrets'], 'secrets')
    bootstrap_token = _text(secrets_section, 'bootstraptoken', 'secrets.bootstraptoken')
    if not TOKEN_RE.match(bootstrap_token):
        raise ValidationError('secrets.bootstraptoken', 'must match [0-9a-z]{6}.[0-9a-z]{16} (kubeadm token format)')
    secretbox = secrets_section.get('secretboxencryptionsecret') or None
    aescbc = secrets_section.get('aescbcencryptionsecret') or None
    if secretbox and aescbc:
        raise ValidationError('secrets', 'only one of secretboxencryptionsecret and aescbcencryptionsecret is allowed')
    if not secretbox and not aescbc:
        raise ValidationError('secrets', 'one of secretboxencryptionsecret and aescbcencryptionsecret is required')
    if secretbox:
        secretbox = _text(secrets_section, 'secretboxencryptionsecret', 'secrets.secretboxencryptionsecret')
        _check_b64_key(secretbox, 'secrets.secretboxencryptionsecret', (32,))
    else:
        aescbc = _text(secrets_section, 'aescbcencryptionsecret', 'secrets.aescbcencryptionsecret')
        _check_b64_key(aescbc, 'secrets.aescbcencryptionsecret', (16, 24, 32))

    trustd = _mapping(data.get('trustdinfo'), 'trustdinfo')
    _reject_unknown(trustd, _SECTION_KEYS['trustdinfo'], 'trustdinfo')
    trustd_token = _text(trustd, 'token', 'trustdinfo.token')

    certs_section = _mapping(data.get('certs'), 'certs')
    _reject_unknown(certs_section, CERT_NAMES, 'certs')
    certs = {}
    for name in CERT_NAMES:
        field = 'certs.' + name
        entry = _mapping(certs_section.get(name), field)
        if name == 'k8sserviceaccount':
            _reject_unknown(entry, ('key',), field)
            key_pem = pki.b64decode_pem(entry.get('key'), field + '.key')
            pki.load_private_key(key_pem, field + '.key', check_key_consistency)
            certs[name] = {'key': key_pem}
            continue
        _reject_unknown(entry, ('crt', 'key'), field)
        crt_pem = pki.b64decode_pem(entry.get('crt'), field + '.crt')
        key_pem = pki.b64decode_pem(entry.get('key'), field + '.key')
        cert, dummy = pki.check_key_pair(crt_pem, key_pem, field)
        if not pki.is_ca(cert):
            raise ValidationError(field + '.crt', 'not a CA certificate (BasicConstraints CA is not set)')
        certs[name] = {'crt': crt_pem, 'key': key_pem}

    return SecretsBundle(cluster_id=cluster_id, cluster_secret=cluster_secret, bootstrap_token=bootstrap_token,
                         trustd_token=trustd_token, certs=certs, secretbox_secret=secretbox, aescbc_secret=aescbc)


def parse_bundle(text, field='secrets_bundle', check_key_consistency=True):
    """SecretsBundle from bundle YAML text (ours or talosctl's); ValidationError if invalid.

    YAML syntax errors name `field`; content errors name the bundle field. check_key_consistency=False: the RSA
    service account key's numbers are not checked (pki.load_private_key).
    """
    require_cryptography()
    return validate_bundle_dict(talosyaml.load(text, field), check_key_consistency)
