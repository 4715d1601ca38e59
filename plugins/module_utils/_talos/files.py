# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The files the Talos modules keep: private (0600), written atomically, maybe vault-encrypted. PRIVATE.

- write_private(path, data): write through a temporary file in the same folder, mode 0600 from
  the first byte, then rename; a missing parent folder is made 0700 (_atomic_file.py).
- read_maybe_vaulted(path, password, field): the plaintext of a file that may be an Ansible
  Vault envelope (_vault.py); errors name the field and never quote the content.
- vault_password(params, run_command): the password from vault_password or vault_password_file.
- Artifacts(password, read_passwords): the files a module renders and rewrites (machine configs, talosconfig,
  kubeconfig) - vault envelopes with `password` when one is given, else clear; the file on disk is read through
  the vault (`password`, then `read_passwords`) to compare plaintexts, so a second run writes nothing.
"""

from __future__ import annotations

import os
import stat

from ansible_collections.proxtalos.cluster.plugins.module_utils import _atomic_file, _vault
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError

FILE_MODE = 0o600
DIR_MODE = 0o700


def file_mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def read_bytes(path):
    with open(path, 'rb') as handle:
        return handle.read()


def write_private(path, data):
    """Write bytes (or text) to path atomically with mode 0600 (_atomic_file.write_atomically)."""
    _atomic_file.write_atomically(path, data, FILE_MODE, DIR_MODE)


def vault_password(params, run_command=None):
    """The vault password of the options vault_password / vault_password_file, or None."""
    if params.get('vault_password'):
        return params['vault_password']
    if params.get('vault_password_file'):
        try:
            return _vault.read_password_file(params['vault_password_file'], run_command)
        except _vault.VaultError as exc:
            raise ValidationError('vault_password_file', str(exc))
    return None


def decode_maybe_vaulted(data, password, field):
    """(plaintext bytes, was_encrypted) of file content that may be a vault envelope."""
    if not _vault.is_encrypted(data):
        return data, False
    if password is None:
        raise ValidationError(field, 'is vault-encrypted; give vault_password or vault_password_file to open it')
    try:
        return _vault.decrypt(data, password), True
    except _vault.VaultError as exc:
        raise ValidationError(field, str(exc))


def read_maybe_vaulted(path, password, field):
    """(plaintext bytes, was_encrypted) of a file; ValidationError naming field if it cannot be read."""
    try:
        data = read_bytes(path)
    except (IOError, OSError) as exc:
        raise ValidationError(field, 'cannot read %s: %s' % (path, exc.strerror or exc))
    return decode_maybe_vaulted(data, password, field)


def encrypt_if(data, password, vault_id=None):
    """data as written: vault-encrypted when a password is given."""
    if isinstance(data, str):
        data = data.encode('utf-8')
    if password is None:
        return data
    return _vault.encrypt(data, password, vault_id)


class Artifacts(object):
    """How a module keeps the files it renders: vault-encrypted with `password`, or in clear without one.

    read(path) -> (text or None, encrypted): the file's plaintext (None when it is missing, not text, or a vault
    envelope none of the passwords opens - then it is rewritten). needs_write(): the content differs, the file is
    not 0600, or it is encrypted where it should be clear (or the other way round). encode(text): the bytes written.
    """

    def __init__(self, password=None, read_passwords=()):
        self.password = password or None
        self.read_passwords = [item for item in [self.password] + list(read_passwords) if item]

    def read(self, path):
        if not os.path.exists(path):
            return None, False
        data = read_bytes(path)
        encrypted = _vault.is_encrypted(data)
        if encrypted:
            for password in self.read_passwords:
                try:
                    data = _vault.decrypt(data, password)
                    break
                except _vault.VaultError:
                    continue
            else:
                return None, True
        try:
            return data.decode('utf-8'), encrypted
        except UnicodeDecodeError:
            return None, encrypted

    def needs_write(self, path, before, encrypted, text):
        if before is None or before != text:
            return True
        return encrypted != bool(self.password) or file_mode(path) != FILE_MODE

    def encode(self, text):
        return encrypt_if(text, self.password)
