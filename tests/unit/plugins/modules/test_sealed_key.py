"""sealed_key: generate once, import, validate, vault at rest; the key never in the output."""
import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ansible_collections.proxtalos.cluster.plugins.module_utils import _sealed, _vault
from ansible_collections.proxtalos.cluster.plugins.modules import sealed_key
from ansible_collections.proxtalos.cluster.tests.helpers import run_module


def run(capsys, **args):
    """Run the module; return (result dict, raw stdout)."""
    return run_module(sealed_key, capsys, **args)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def paths(tmp_path):
    return {'private_key_path': str(tmp_path / 'secrets' / 'sealed.key'), 'certificate_path': str(tmp_path / 'secrets' / 'sealed.crt')}


@pytest.fixture(scope='module')
def foreign_pair():
    """A user's existing keypair to import (2048 bits keeps the test fast)."""
    return _sealed.generate_keypair(key_size=2048, common_name='old-cluster')


def key_body(key_pem):
    return key_pem.decode().splitlines()[1]


def test_generates_once_with_0600_files_and_no_key_in_output(capsys, paths):
    result, out = run(capsys, **paths)
    assert result['changed'] is True and result['outcome'] == 'generated'
    assert result['key_size'] == 4096
    assert mode(paths['private_key_path']) == 0o600 and mode(paths['certificate_path']) == 0o600
    assert mode(os.path.dirname(paths['private_key_path'])) == 0o700
    with open(paths['private_key_path'], 'rb') as handle:
        key_pem = handle.read()
    assert key_body(key_pem) not in out and 'PRIVATE KEY' not in out
    assert 'private_key' not in result
    info, _warnings = _sealed.describe_keypair(key_pem, result['certificate'].encode())
    assert info['certificate_sha256'] == result['certificate_sha256']

    again, out = run(capsys, **paths)
    assert again['changed'] is False and again['outcome'] == 'kept'
    assert again['certificate_sha256'] == result['certificate_sha256']
    with open(paths['private_key_path'], 'rb') as handle:
        assert handle.read() == key_pem      # never regenerated


def test_check_mode_predicts_and_writes_nothing(capsys, paths):
    result, _out = run(capsys, _ansible_check_mode=True, key_size=2048, **paths)
    assert result['changed'] is True and result['outcome'] == 'generated'
    assert not os.path.exists(paths['private_key_path']) and not os.path.exists(os.path.dirname(paths['private_key_path']))


def test_a_key_without_its_certificate_is_kept_and_the_certificate_made_again(capsys, paths):
    """A run stopped between the two writes (the key is written first) leaves only the key: the next run keeps it."""
    first, _out = run(capsys, key_size=2048, **paths)
    with open(paths['private_key_path'], 'rb') as handle:
        key_pem = handle.read()
    os.unlink(paths['certificate_path'])
    check, _out = run(capsys, _ansible_check_mode=True, key_size=2048, **paths)
    assert check['changed'] is True and check['outcome'] == 'completed' and not os.path.exists(paths['certificate_path'])
    result, out = run(capsys, key_size=2048, **paths)
    assert result['changed'] is True and result['outcome'] == 'completed'
    assert result['public_key_sha256'] == first['public_key_sha256'] and key_body(key_pem) not in out
    with open(paths['private_key_path'], 'rb') as handle:
        assert handle.read() == key_pem      # never regenerated
    assert mode(paths['certificate_path']) == 0o600
    again, _out = run(capsys, key_size=2048, **paths)
    assert again['changed'] is False and again['outcome'] == 'kept'


def test_a_certificate_without_its_key_is_refused(capsys, paths):
    run(capsys, key_size=2048, **paths)
    os.unlink(paths['private_key_path'])
    result, _out = run(capsys, key_size=2048, **paths)
    assert result['failed'] is True
    assert result['field'] == 'private_key_path' and 'refusing to generate' in result['msg']


def test_import_then_keep(capsys, paths, foreign_pair, tmp_path):
    key_src = tmp_path / 'old.key'
    key_src.write_bytes(foreign_pair[0])
    result, out = run(capsys, import_private_key_src=str(key_src), import_certificate=foreign_pair[1].decode(), **paths)
    assert result['changed'] is True and result['outcome'] == 'imported'
    assert key_body(foreign_pair[0]) not in out
    with open(paths['private_key_path'], 'rb') as handle:
        assert handle.read() == foreign_pair[0]
    assert mode(paths['private_key_path']) == 0o600
    again, _out = run(capsys, import_private_key=foreign_pair[0].decode(), import_certificate=foreign_pair[1].decode(), **paths)
    assert again['changed'] is False and again['outcome'] == 'kept'


def test_a_different_import_never_replaces_the_kept_key(capsys, paths, foreign_pair):
    run(capsys, key_size=2048, **paths)
    result, out = run(capsys, import_private_key=foreign_pair[0].decode(), import_certificate=foreign_pair[1].decode(), **paths)
    assert result['failed'] is True and result['field'] == 'import_private_key'
    assert 'never replaced' in result['msg']
    assert key_body(foreign_pair[0]) not in out


def test_bad_import_is_rejected_with_the_reason(capsys, paths, foreign_pair):
    ec_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption())
    result, out = run(capsys, import_private_key=ec_pem.decode(), import_certificate=foreign_pair[1].decode(), **paths)
    assert result['failed'] is True and result['field'] == 'import_private_key'
    assert 'EC PRIVATE KEY' in result['msg']
    assert not os.path.exists(paths['private_key_path'])
    assert key_body(ec_pem) not in out


def test_a_bad_kept_key_fails_instead_of_reaching_the_controller(capsys, paths, foreign_pair):
    run(capsys, key_size=2048, **paths)
    with open(paths['certificate_path'], 'wb') as handle:
        handle.write(foreign_pair[1])           # certificate of another key
    result, _out = run(capsys, **paths)
    assert result['failed'] is True and result['field'] == 'certificate_path'
    assert 'does not match' in result['msg']


def test_wrong_modes_are_fixed_and_reported(capsys, paths):
    run(capsys, key_size=2048, **paths)
    os.chmod(paths['private_key_path'], 0o644)
    check, _out = run(capsys, _ansible_check_mode=True, **paths)
    assert check['changed'] is True and mode(paths['private_key_path']) == 0o644
    result, _out = run(capsys, **paths)
    assert result['changed'] is True and mode(paths['private_key_path']) == 0o600
    assert run(capsys, **paths)[0]['changed'] is False


def test_vault_at_rest(capsys, paths):
    result, out = run(capsys, key_size=2048, vault_password='correct horse', **paths)
    assert result['private_key_encrypted'] is True
    with open(paths['private_key_path'], 'rb') as handle:
        envelope = handle.read()
    assert envelope.startswith(b'$ANSIBLE_VAULT;1.1;AES256\n')
    plain = _vault.decrypt(envelope, 'correct horse')   # test_vault checks that ansible-vault opens these
    assert plain.startswith(b'-----BEGIN RSA PRIVATE KEY-----')
    assert key_body(plain) not in out and 'correct horse' not in out
    with open(paths['certificate_path'], 'rb') as handle:
        assert handle.read().startswith(b'-----BEGIN CERTIFICATE-----')   # public, stays plain

    again, _out = run(capsys, vault_password='correct horse', **paths)
    assert again['changed'] is False and again['certificate_sha256'] == result['certificate_sha256']
    no_password, _out = run(capsys, **paths)
    assert no_password['failed'] is True and 'vault-encrypted' in no_password['msg']
    wrong, out = run(capsys, vault_password='wrong', **paths)
    assert wrong['failed'] is True and 'does not open' in wrong['msg']


def test_plain_key_is_encrypted_in_place_when_a_vault_password_appears(capsys, paths, tmp_path):
    first, _out = run(capsys, key_size=2048, **paths)
    with open(paths['private_key_path'], 'rb') as handle:
        plain = handle.read()
    password_file = tmp_path / 'vault-pass'
    password_file.write_text('from-a-file\n')
    check, _out = run(capsys, _ansible_check_mode=True, vault_password_file=str(password_file), **paths)
    assert check['changed'] is True and check['outcome'] == 'encrypted'
    with open(paths['private_key_path'], 'rb') as handle:
        assert handle.read() == plain
    result, _out = run(capsys, vault_password_file=str(password_file), **paths)
    assert result['changed'] is True and result['outcome'] == 'encrypted'
    assert result['certificate_sha256'] == first['certificate_sha256']
    with open(paths['private_key_path'], 'rb') as handle:
        assert _vault.decrypt(handle.read(), 'from-a-file') == plain
    assert run(capsys, vault_password_file=str(password_file), **paths)[0]['changed'] is False


def test_vault_password_script(capsys, paths, tmp_path):
    script = tmp_path / 'vault-pass.sh'
    script.write_text('#!/bin/sh\necho scripted-secret\n')
    script.chmod(0o700)
    result, out = run(capsys, key_size=2048, vault_password_file=str(script), **paths)
    assert result['changed'] is True and 'scripted-secret' not in out
    with open(paths['private_key_path'], 'rb') as handle:
        assert _vault.decrypt(handle.read(), 'scripted-secret').startswith(b'-----BEGIN')


def test_return_content_is_explicit(capsys, paths):
    result, _out = run(capsys, key_size=2048, return_content=True, **paths)
    with open(paths['private_key_path'], 'rb') as handle:
        assert result['private_key'] == handle.read().decode()


def test_diff_hides_the_key(capsys, paths):
    result, out = run(capsys, _ansible_diff=True, key_size=2048, **paths)
    assert result['diff']['before'] == {}
    assert result['diff']['after']['private_key_encrypted'] is False
    with open(paths['private_key_path'], 'rb') as handle:
        assert key_body(handle.read()) not in out


def test_bad_parameters_name_the_field(capsys, paths):
    result, _out = run(capsys, key_size=1024, **paths)
    assert result['failed'] is True and result['field'] == 'key_size'
    result, _out = run(capsys, import_private_key='x', **paths)
    assert result['failed'] is True and result['field'] == 'import_certificate'
