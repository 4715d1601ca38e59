"""The Ansible Vault envelope, checked against the real ansible-vault command."""
import os
import subprocess
import sys

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _vault

ANSIBLE_VAULT = os.path.join(os.path.dirname(sys.executable), 'ansible-vault')


@pytest.fixture
def password_file(tmp_path):
    path = tmp_path / 'vault-pass'
    path.write_text('s3cret vault password\n')
    return str(path)


def ansible_vault(*args):
    """Run the real ansible-vault (a separate process, so its controller code stays out of this one)."""
    return subprocess.run([ANSIBLE_VAULT] + list(args), check=True, capture_output=True)


def test_ansible_vault_opens_our_envelopes(tmp_path, password_file):
    plaintext = b'-----BEGIN RSA PRIVATE KEY-----\nnot really a key\n' * 40
    for vault_id in (None, 'lab'):
        path = tmp_path / ('ours-%s' % vault_id)
        path.write_bytes(_vault.encrypt(plaintext, 's3cret vault password', vault_id))
        header = path.read_bytes().splitlines()[0]
        assert header == (b'$ANSIBLE_VAULT;1.2;AES256;lab' if vault_id else b'$ANSIBLE_VAULT;1.1;AES256')
        assert ansible_vault('view', '--vault-password-file', password_file, str(path)).stdout == plaintext


def test_we_open_ansible_vault_files(tmp_path, password_file):
    path = tmp_path / 'theirs'
    path.write_bytes(b'written by ansible-vault\n')
    ansible_vault('encrypt', '--vault-password-file', password_file, str(path))
    assert _vault.is_encrypted(path.read_bytes())
    assert _vault.decrypt(path.read_bytes(), 's3cret vault password') == b'written by ansible-vault\n'


def test_round_trip_and_failures():
    envelope = _vault.encrypt(b'data', 'pw')
    assert _vault.decrypt(envelope, 'pw') == b'data'
    assert _vault.encrypt(b'data', 'pw') != envelope             # fresh salt each time
    with pytest.raises(_vault.VaultError, match='does not open'):
        _vault.decrypt(envelope, 'other')
    damaged = envelope.replace(envelope.splitlines()[1][:10], b'zz' * 5)
    with pytest.raises(_vault.VaultError, match='damaged'):
        _vault.decrypt(damaged, 'pw')
    with pytest.raises(_vault.VaultError, match='not an Ansible Vault'):
        _vault.decrypt(b'plain text', 'pw')
    with pytest.raises(_vault.VaultError, match='unsupported'):
        _vault.decrypt(b'$ANSIBLE_VAULT;1.0;AES\n00\n', 'pw')
    with pytest.raises(_vault.VaultError, match='empty'):
        _vault.encrypt(b'data', '')
    assert not _vault.is_encrypted(b'-----BEGIN RSA PRIVATE KEY-----')


def test_password_files(tmp_path):
    plain = tmp_path / 'plain'
    plain.write_text('  from file \n')
    assert _vault.read_password_file(str(plain)) == 'from file'
    script = tmp_path / 'script'
    script.write_text('#!/bin/sh\necho from-script\n')
    script.chmod(0o700)

    def run_command(argv):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        return done.returncode, done.stdout, done.stderr

    assert _vault.read_password_file(str(script), run_command) == 'from-script'
    failing = tmp_path / 'failing'
    failing.write_text('#!/bin/sh\necho nope >&2\nexit 3\n')
    failing.chmod(0o700)
    with pytest.raises(_vault.VaultError, match='exited with 3: nope'):
        _vault.read_password_file(str(failing), run_command)
    empty = tmp_path / 'empty'
    empty.write_text('\n')
    with pytest.raises(_vault.VaultError, match='is empty'):
        _vault.read_password_file(str(empty))
    with pytest.raises(_vault.VaultError, match='does not exist'):
        _vault.read_password_file(str(tmp_path / 'missing'))
