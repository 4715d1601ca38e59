# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible Vault (format 1.1/1.2, AES256) for files a module keeps at rest. PRIVATE to the collection.

Modules cannot reach the vault secrets of the controller process, so a module that keeps a
secret file encrypted takes the vault password (or a vault password file) as an option and
reads/writes the standard vault envelope itself. The files are the ones `ansible-vault view`
opens and the `file` lookup decrypts, so later tasks read them as usual.

Format (as ansible-core writes it): header "$ANSIBLE_VAULT;1.1;AES256" (1.2 adds ";<vault id>"),
then, hex-encoded and wrapped at 80 columns, the lines hex(salt), hex(HMAC-SHA256), hex(ciphertext)
joined by newlines. Keys: PBKDF2-HMAC-SHA256(password, salt 32 bytes, 10000 rounds) gives
80 bytes = AES key (32) || HMAC key (32) || CTR counter block (16). Plaintext is PKCS#7-padded
to the AES block, encrypted with AES-256-CTR; the HMAC covers the ciphertext.
"""

from __future__ import annotations

import binascii
import hmac
import os

from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError

try:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives import padding as symmetric_padding
    from cryptography.hazmat.primitives import hmac as crypto_hmac
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC
except ImportError:  # pragma: no cover - callers check _crypto.HAS_CRYPTOGRAPHY first
    pass

HEADER = b'$ANSIBLE_VAULT'
SALT_BYTES = 32
ITERATIONS = 10000
LINE_WIDTH = 80


class VaultError(ProxtalosError):
    """A vault file cannot be opened (wrong password, damaged, unknown format)."""


def is_encrypted(data):
    """Whether data (bytes or str) is an Ansible Vault envelope."""
    if isinstance(data, str):
        data = data.encode('utf-8', 'replace')
    return data.lstrip().startswith(HEADER + b';')


def _keys(password, salt):
    derived = PBKDF2HMAC(algorithm=hashes.SHA256(), length=32 + 32 + 16, salt=salt, iterations=ITERATIONS).derive(password)
    return derived[:32], derived[32:64], derived[64:]


def _password_bytes(password):
    if password is None or password == '' or password == b'':
        raise VaultError('the vault password is empty')
    return password.encode('utf-8') if isinstance(password, str) else bytes(password)


def encrypt(plaintext, password, vault_id=None, salt=None):
    """The vault envelope (bytes, ending in a newline) for plaintext bytes."""
    password = _password_bytes(password)
    salt = salt or os.urandom(SALT_BYTES)
    aes_key, hmac_key, counter = _keys(password, salt)
    padder = symmetric_padding.PKCS7(algorithms.AES.block_size).padder()
    padded = padder.update(plaintext) + padder.finalize()
    encryptor = Cipher(algorithms.AES(aes_key), modes.CTR(counter)).encryptor()
    ciphertext = encryptor.update(padded) + encryptor.finalize()
    mac = crypto_hmac.HMAC(hmac_key, hashes.SHA256())
    mac.update(ciphertext)
    body = b'\n'.join([binascii.hexlify(salt), binascii.hexlify(mac.finalize()), binascii.hexlify(ciphertext)])
    hexed = binascii.hexlify(body)
    header = HEADER + (b';1.2;AES256;' + vault_id.encode('utf-8') if vault_id else b';1.1;AES256')
    lines = [header] + [hexed[i:i + LINE_WIDTH] for i in range(0, len(hexed), LINE_WIDTH)]
    return b'\n'.join(lines) + b'\n'


def decrypt(envelope, password):
    """The plaintext bytes of a vault envelope; VaultError says why it does not open."""
    password = _password_bytes(password)
    if isinstance(envelope, str):
        envelope = envelope.encode('utf-8')
    lines = envelope.strip().splitlines()
    if not lines or not lines[0].startswith(HEADER + b';'):
        raise VaultError('not an Ansible Vault file (no "$ANSIBLE_VAULT;" header)')
    fields = lines[0].strip().split(b';')
    if len(fields) < 3 or fields[1] not in (b'1.1', b'1.2') or fields[2].strip() != b'AES256':
        raise VaultError('unsupported vault format %r (only 1.1/1.2 AES256)' % lines[0].decode('utf-8', 'replace'))
    try:
        body = binascii.unhexlify(b''.join(line.strip() for line in lines[1:]))
        salt_hex, mac_hex, ciphertext_hex = body.split(b'\n', 2)
        salt = binascii.unhexlify(salt_hex)
        expected_mac = binascii.unhexlify(mac_hex)
        ciphertext = binascii.unhexlify(ciphertext_hex)
    except (binascii.Error, ValueError):
        raise VaultError('the vault body is damaged (not the hex layout ansible-vault writes)') from None
    aes_key, hmac_key, counter = _keys(password, salt)
    mac = crypto_hmac.HMAC(hmac_key, hashes.SHA256())
    mac.update(ciphertext)
    if not hmac.compare_digest(mac.finalize(), expected_mac):
        raise VaultError('the vault password does not open this file (HMAC mismatch)')
    decryptor = Cipher(algorithms.AES(aes_key), modes.CTR(counter)).decryptor()
    padded = decryptor.update(ciphertext) + decryptor.finalize()
    unpadder = symmetric_padding.PKCS7(algorithms.AES.block_size).unpadder()
    try:
        return unpadder.update(padded) + unpadder.finalize()
    except ValueError:
        raise VaultError('the decrypted vault content has bad padding (damaged file)') from None


def read_password_file(path, run_command=None):
    """The vault password in a password file, as ansible reads it.

    A plain file: its content with surrounding white space stripped. An executable file is a
    script: its standard output, stripped (run_command(argv) -> (rc, stdout, stderr), e.g.
    AnsibleModule.run_command). The password is never put in an error message.
    """
    if not os.path.isfile(path):
        raise VaultError('vault password file %s does not exist' % path)
    if os.access(path, os.X_OK):
        if run_command is None:
            raise VaultError('vault password file %s is a script, and no way to run it was given' % path)
        rc, stdout, stderr = run_command([path])
        if rc != 0:
            raise VaultError('vault password script %s exited with %d: %s' % (path, rc, (stderr or '').strip()[:200]))
        password = stdout.strip() if isinstance(stdout, str) else stdout.decode('utf-8').strip()
    else:
        with open(path, 'rb') as handle:
            password = handle.read().strip().decode('utf-8')
    if not password:
        raise VaultError('vault password file %s is empty' % path)
    return password
