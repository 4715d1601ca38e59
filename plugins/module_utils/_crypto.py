# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""PEM text, private keys and certificates: what _talos/pki and _sealed share. PRIVATE to the collection.

- The cryptography dependency, checked in one place: HAS_CRYPTOGRAPHY, CRYPTOGRAPHY_IMPORT_ERROR (modules report
  them through missing_required_lib) and require_cryptography() (helpers call it first).
- PEM text: as_bytes, pem_blocks (label and base64 body of each BEGIN/END block), pem_label (of the first one).
- parse_private_key: a PEM private key parsed once per process. Parsing is pure and key objects are immutable, but
  parsing an RSA key checks its numbers (primes, CRT values) at length: a quarter to half a second of CPU for 4096
  bits. A module run may need the same key several times (the Talos bundle's service account key: bundle check,
  cert/key pairs, rendering), and the items of a loop run in one worker (docs/development.md).
- public_key_der: the DER SubjectPublicKeyInfo of a public key, to tell whether a certificate and a key belong
  together.

What a reader accepts and how it words a refusal stays with the reader: Talos takes Ed25519, ECDSA and RSA keys
under Talos's PEM labels (_talos/pki.load_private_key), the sealed-secrets controller takes RSA keys of 2048 bits
or more (_sealed.load_private_key). Nothing here prints a key or touches files.
"""

from __future__ import annotations

import re

from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError

try:
    from cryptography.hazmat.primitives import serialization
except ImportError as exc:  # pragma: no cover - reported by the modules through missing_required_lib
    HAS_CRYPTOGRAPHY = False
    CRYPTOGRAPHY_IMPORT_ERROR = exc
    serialization = None
else:
    HAS_CRYPTOGRAPHY = True
    CRYPTOGRAPHY_IMPORT_ERROR = None

# A block is a BEGIN line, the body, and the END line of the same label.
_PEM_BLOCK_RE = re.compile(r'-----BEGIN ([A-Z0-9 ]+)-----\r?\n(.*?)\r?\n?-----END \1-----', re.DOTALL)

# (PEM bytes, whether the RSA numbers were checked) -> key object
_PARSED = {}


def require_cryptography():
    """Raise ProxtalosError saying how to install cryptography when the library is missing."""
    if not HAS_CRYPTOGRAPHY:
        raise ProxtalosError('the Python library "cryptography" is required (pip install cryptography): %s'
                             % CRYPTOGRAPHY_IMPORT_ERROR)


def as_bytes(value):
    """PEM text as bytes: bytes unchanged, str encoded as UTF-8; TypeError for anything else."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode('utf-8')
    raise TypeError('expected bytes or str, got %s' % type(value).__name__)


def pem_blocks(pem):
    """The (label, base64 body) pairs of every complete PEM block in pem (bytes or str), in order."""
    text = as_bytes(pem).decode('ascii', 'replace')
    return [(match.group(1), match.group(2)) for match in _PEM_BLOCK_RE.finditer(text)]


def pem_label(pem):
    """Label of the first PEM block (e.g. 'EC PRIVATE KEY'), or None when there is none."""
    blocks = pem_blocks(pem)
    return blocks[0][0] if blocks else None


def parse_private_key(pem, check_consistency=True):
    """cryptography's key object for an unencrypted PEM private key (bytes), the same object for a PEM parsed before.

    check_consistency=False skips OpenSSL's check of an RSA key's numbers; only for a key that its keeper checked in
    full earlier in the same run. A key parsed with the check serves either kind of caller; one parsed without it
    only callers that skip it too. Raises what cryptography raises (ValueError, TypeError, UnsupportedAlgorithm);
    nothing is kept for a PEM that does not load.
    """
    require_cryptography()
    for checked in (True, check_consistency):
        if (pem, checked) in _PARSED:
            return _PARSED[(pem, checked)]
    key = serialization.load_pem_private_key(pem, password=None, unsafe_skip_rsa_key_validation=not check_consistency)
    _PARSED[(pem, check_consistency)] = key
    return key


def public_key_der(public_key):
    """DER SubjectPublicKeyInfo of a public key: equal for a certificate's and its private key's public keys."""
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
