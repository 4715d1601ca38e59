"""talos_secrets: generated once, written 0600 before use, never regenerated, import, vault; no secret in output."""
import os
import stat

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _vault
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import secrets, talosyaml
from ansible_collections.proxtalos.cluster.plugins.modules import talos_secrets

from ansible_collections.proxtalos.cluster.tests.helpers import assert_no_secret, run_module

HERE = os.path.dirname(os.path.abspath(__file__))
TALOSCTL_BUNDLE = os.path.join(HERE, '..', 'module_utils', '_talos', 'fixtures', 'talosctl-secrets.txt')


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / 'inventory' / 'secrets' / 'talos-secrets.yaml')


def read(path):
    with open(path, 'rb') as handle:
        return handle.read()


def test_generates_once_0600_and_never_again(capsys, path):
    result, out = run_module(talos_secrets, capsys, path=path)
    assert result['changed'] is True and result['outcome'] == 'generated'
    assert mode(path) == 0o600 and mode(os.path.dirname(path)) == 0o700
    content = read(path)
    bundle = secrets.parse_bundle(content.decode())
    assert result['os_ca_key_type'] == 'ed25519'
    assert sorted(result['ca_sha256']) == ['etcd', 'k8s', 'k8saggregator', 'os']
    assert_no_secret(out, bundle.secret_values())

    again, out = run_module(talos_secrets, capsys, path=path)
    assert again['changed'] is False and again['outcome'] == 'kept'
    assert again['ca_sha256'] == result['ca_sha256']
    assert read(path) == content
    assert_no_secret(out, bundle.secret_values())


def test_check_mode_writes_nothing(capsys, path):
    result, _out = run_module(talos_secrets, capsys, path=path, _ansible_check_mode=True, _ansible_diff=True)
    assert result['changed'] is True and result['outcome'] == 'generated'
    assert result['ca_sha256'] == {}
    assert result['diff']['before'] == {} and result['diff']['after']['path'] == 'present'
    assert not os.path.exists(os.path.dirname(path))


def test_corrupt_bundle_fails_naming_the_field_and_is_kept(capsys, path, tmp_path):
    run_module(talos_secrets, capsys, path=path, os_key_type='ecdsa')
    data = talosyaml.load(read(path).decode(), 'test')
    data['certs']['os']['key'] = 'bm90IGEga2V5'      # base64 of "not a key"
    broken = talosyaml.dump(data).encode()
    with open(path, 'wb') as handle:
        handle.write(broken)
    result, out = run_module(talos_secrets, capsys, path=path)
    assert result['failed'] is True
    assert result['field'] == 'certs.os.key' and 'never replaced' in result['msg']
    assert read(path) == broken
    del data['trustdinfo']
    with open(path, 'wb') as handle:
        handle.write(talosyaml.dump(data).encode())
    result, out = run_module(talos_secrets, capsys, path=path)
    assert result['failed'] is True and result['field'] == 'trustdinfo'


def test_import_talosctl_bundle_then_keep(capsys, path):
    result, out = run_module(talos_secrets, capsys, path=path, import_src=TALOSCTL_BUNDLE)
    assert result['changed'] is True and result['outcome'] == 'imported'
    with open(TALOSCTL_BUNDLE) as handle:
        original = secrets.parse_bundle(handle.read())
    assert secrets.parse_bundle(read(path).decode()).to_yaml() == original.to_yaml()
    assert_no_secret(out, original.secret_values())
    # The same import again is fine; another bundle is refused and the file is untouched.
    again, _out = run_module(talos_secrets, capsys, path=path, import_src=TALOSCTL_BUNDLE)
    assert again['changed'] is False and again['outcome'] == 'kept'
    other = secrets.generate_bundle(os_key_type='ecdsa').to_yaml()
    refused, out = run_module(talos_secrets, capsys, path=path, import_content=other)
    assert refused['failed'] is True and refused['field'] == 'import_content'
    assert 'never' in refused['msg']
    assert secrets.parse_bundle(read(path).decode()).to_yaml() == original.to_yaml()


def test_malformed_import_names_the_field(capsys, path):
    data = talosyaml.load(secrets.generate_bundle(os_key_type='ecdsa').to_yaml(), 'test')
    data['secrets']['bootstraptoken'] = 'short'
    result, out = run_module(talos_secrets, capsys, path=path, import_content=data)
    assert result['failed'] is True
    assert result['field'] == 'import_content: secrets.bootstraptoken'
    assert 'short' not in out
    assert not os.path.exists(path)


def test_vault_encrypted_at_rest_and_plain_file_encrypted_in_place(capsys, path, tmp_path):
    password_file = tmp_path / 'vault-pass'
    password_file.write_text('correct horse battery staple\n')
    result, out = run_module(talos_secrets, capsys, path=path, vault_password_file=str(password_file), os_key_type='ecdsa')
    assert result['changed'] is True and result['encrypted'] is True
    envelope = read(path)
    assert _vault.is_encrypted(envelope)
    bundle = secrets.parse_bundle(_vault.decrypt(envelope, 'correct horse battery staple').decode())
    assert 'correct horse battery staple' not in out
    again, _out = run_module(talos_secrets, capsys, path=path, vault_password_file=str(password_file))
    assert again['changed'] is False and again['outcome'] == 'kept' and again['encrypted'] is True
    no_password, _out = run_module(talos_secrets, capsys, path=path)
    assert no_password['failed'] is True and no_password['field'] == 'path' and 'vault' in no_password['msg']
    wrong, _out = run_module(talos_secrets, capsys, path=path, vault_password='wrong')
    assert wrong['failed'] is True and 'does not open' in wrong['msg']

    plain = str(tmp_path / 'plain.yaml')
    run_module(talos_secrets, capsys, path=plain, os_key_type='ecdsa')
    before = secrets.parse_bundle(read(plain).decode())
    encrypted, out = run_module(talos_secrets, capsys, path=plain, vault_password='s3cret-pass', _ansible_diff=True)
    assert encrypted['changed'] is True and encrypted['outcome'] == 'encrypted'
    assert encrypted['diff']['before']['encrypted'] is False and encrypted['diff']['after']['encrypted'] is True
    after = secrets.parse_bundle(_vault.decrypt(read(plain), 's3cret-pass').decode())
    assert after.to_yaml() == before.to_yaml()
    assert_no_secret(out, bundle.secret_values() + after.secret_values() + ['s3cret-pass'])


def test_loose_mode_is_fixed(capsys, path):
    run_module(talos_secrets, capsys, path=path, os_key_type='ecdsa')
    os.chmod(path, 0o644)
    result, _out = run_module(talos_secrets, capsys, path=path, _ansible_check_mode=True)
    assert result['changed'] is True and result['mode_fixed'] is True and mode(path) == 0o644
    result, _out = run_module(talos_secrets, capsys, path=path)
    assert result['changed'] is True and mode(path) == 0o600
