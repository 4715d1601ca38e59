"""sealed_secret: offline sealing into the GitOps repository, idempotent with the private key."""
import base64
import os
import stat

import pytest
import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils import _sealed, _vault
from ansible_collections.proxtalos.cluster.plugins.modules import sealed_secret
from ansible_collections.proxtalos.cluster.tests.helpers import run_module


def run(capsys, **args):
    return run_module(sealed_secret, capsys, **args)


@pytest.fixture(scope='module')
def pair():
    return _sealed.generate_keypair(key_size=2048)


@pytest.fixture
def files(tmp_path, pair):
    key_path = tmp_path / 'sealed.key'
    cert_path = tmp_path / 'sealed.crt'
    key_path.write_bytes(pair[0])
    cert_path.write_bytes(pair[1])
    return {'certificate_path': str(cert_path), 'private_key_path': str(key_path),
            'dest': str(tmp_path / 'repo' / 'apps' / 'csi' / 'secret.sealed.yaml')}


CSI_CONFIG = 'clusters:\n- url: https://pve.example:8006/api2/json\n  token_id: kubernetes-csi@pve!csi\n  token_secret: 0b5e-secret\n'


def args(files, **extra):
    base = dict(name='proxmox-csi-plugin', namespace='csi-proxmox', string_data={'config.yaml': CSI_CONFIG}, **files)
    base.update(extra)
    return base


def read_dest(files):
    with open(files['dest']) as handle:
        return yaml.safe_load(handle)


def test_seal_write_and_rerun_unchanged(capsys, files, pair):
    result, out = run(capsys, **args(files))
    assert result['changed'] is True
    assert '0b5e-secret' not in out
    written = read_dest(files)
    assert written == result['sealed_secret']
    assert stat.S_IMODE(os.stat(files['dest']).st_mode) == 0o644
    key = _sealed.load_private_key(pair[0])
    assert _sealed.unseal(written, [key]) == {'config.yaml': CSI_CONFIG.encode()}
    with open(files['dest']) as handle:
        text = handle.read()

    again, _out = run(capsys, **args(files))
    assert again['changed'] is False and again['reason'] == 'up to date'
    with open(files['dest']) as handle:
        assert handle.read() == text                 # not re-sealed

    changed, _out = run(capsys, **args(files, string_data={'config.yaml': CSI_CONFIG.replace('0b5e', 'ffff')}))
    assert changed['changed'] is True and changed['reason'] == 'the value of config.yaml differs'
    scoped, _out = run(capsys, **args(files, scope='namespace-wide'))
    assert scoped['changed'] is True
    assert read_dest(files)['metadata']['annotations'] == {'sealedsecrets.bitnami.com/namespace-wide': 'true'}


def test_check_mode_writes_nothing(capsys, files):
    result, _out = run(capsys, _ansible_check_mode=True, **args(files))
    assert result['changed'] is True and result['sealed_secret']['kind'] == 'SealedSecret'
    assert not os.path.exists(files['dest'])


def test_without_private_key_it_reseals_and_says_why(capsys, files):
    no_key = dict(files)
    del no_key['private_key_path']
    run(capsys, **args(no_key))
    result, _out = run(capsys, **args(no_key))
    assert result['changed'] is True and 'cannot tell' in result['reason']


def test_vault_encrypted_private_key(capsys, files, pair):
    with open(files['private_key_path'], 'wb') as handle:
        handle.write(_vault.encrypt(pair[0], 'pw'))
    run(capsys, vault_password='pw', **args(files))
    result, _out = run(capsys, vault_password='pw', **args(files))
    assert result['changed'] is False
    failed, _out = run(capsys, **args(files))
    assert failed['failed'] is True and failed['field'] == 'private_key_path'


def test_without_dest_only_returns(capsys, files, pair):
    no_dest = dict(files)
    del no_dest['dest']
    result, _out = run(capsys, data={'identity': base64.b64encode(b'ssh key').decode()}, **args(no_dest, string_data=None))
    assert result['changed'] is False
    assert _sealed.unseal(result['sealed_secret'], [_sealed.load_private_key(pair[0])]) == {'identity': b'ssh key'}


def test_mismatched_key_and_bad_input_fail_clearly(capsys, files):
    other = _sealed.generate_keypair(key_size=2048)
    run(capsys, **args(files))
    with open(files['private_key_path'], 'wb') as handle:
        handle.write(other[0])
    result, out = run(capsys, **args(files))
    assert result['failed'] is True and result['field'] == 'private_key_path'
    assert other[0].decode().splitlines()[1] not in out
    result, _out = run(capsys, **args(files, namespace=None))
    assert result['failed'] is True and result['field'] == 'secret.metadata.namespace'
    result, _out = run(capsys, **args(files, string_data=None))
    assert result['failed'] is True and result['field'] == 'data'


def test_diff_shows_keys_not_values(capsys, files):
    result, out = run(capsys, _ansible_diff=True, **args(files))
    assert result['diff']['after']['spec']['encryptedData'] == {'config.yaml': '<sealed>'}
    assert '0b5e-secret' not in out
