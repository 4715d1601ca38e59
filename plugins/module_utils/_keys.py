# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Private keys parsed once per process. PRIVATE to the collection.

Parsing is pure and key objects are immutable, but parsing an RSA key checks its numbers (primes, CRT values) at
length: a quarter to half a second of CPU for 4096 bits. A module run may need the same key several times (the
Talos bundle's service account key: bundle check, cert/key pairs, rendering), and the items of a loop run in one
worker (docs/development.md). _talos/pki and _sealed parse their keys here and check what the key must be for them.
"""

from __future__ import annotations

try:
    from cryptography.hazmat.primitives import serialization
except ImportError:  # reported by the callers' require_cryptography()
    serialization = None

# (PEM bytes, whether the RSA numbers were checked) -> key object
_PARSED = {}


def parse_private_key(pem, check_consistency=True):
    """cryptography's key object for an unencrypted PEM private key, the same object for a PEM parsed before.

    check_consistency=False skips OpenSSL's check of an RSA key's numbers; only for a key that its keeper checked in
    full earlier in the same run. A key parsed with the check serves either kind of caller; one parsed without it
    only callers that skip it too. Raises what cryptography raises (ValueError, TypeError, UnsupportedAlgorithm);
    nothing is kept for a PEM that does not load.
    """
    for checked in (True, check_consistency):
        if (pem, checked) in _PARSED:
            return _PARSED[(pem, checked)]
    key = serialization.load_pem_private_key(pem, password=None, unsafe_skip_rsa_key_validation=not check_consistency)
    _PARSED[(pem, check_consistency)] = key
    return key
