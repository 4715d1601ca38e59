"""talos_config: per-node machine configs and a talosctl talosconfig; stable re-runs; diffs without secrets."""
import os
import stat

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import config, secrets, talosconfig, talosyaml
from ansible_collections.proxtalos.cluster.plugins.modules import talos_config

from talos_module_helpers import assert_no_secret, run_module

CLUSTER = {'name': 'demo', 'endpoint': 'https://10.5.0.10:6443'}


@pytest.fixture(scope='module')
def bundle():
    return secrets.generate_bundle()


@pytest.fixture
def secrets_path(tmp_path, bundle):
    path = tmp_path / 'secrets' / 'talos-secrets.yaml'
    path.parent.mkdir()
    path.write_text(bundle.to_yaml())
    os.chmod(str(path), 0o600)
    return str(path)


def node_args(secrets_path, dest, **extra):
    args = dict(secrets_path=secrets_path, cluster=CLUSTER, machine_type='controlplane', dest=dest,
                node={'hostname': 'cp-1', 'ip': '10.5.0.11', 'prefix': 24, 'gateway': '10.5.0.1'})
    args.update(extra)
    return args


def test_renders_once_then_unchanged(capsys, secrets_path, tmp_path, bundle):
    dest = str(tmp_path / 'artifacts' / 'cp-1.yaml')
    result, out = run_module(talos_config, capsys, **node_args(secrets_path, dest))
    assert result['changed'] is True and result['config_changed'] is True
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o600
    with open(dest) as handle:
        text = handle.read()
    documents = config.validate_machine_config(text, '1.13')
    assert documents[0]['machine']['type'] == 'controlplane'
    assert result['contract'] == '1.13'
    assert_no_secret(out, bundle.secret_values())

    again, _out = run_module(talos_config, capsys, **node_args(secrets_path, dest))
    assert again['changed'] is False and again['config_sha256'] == result['config_sha256']


def test_check_mode_writes_nothing(capsys, secrets_path, tmp_path):
    dest = str(tmp_path / 'artifacts' / 'cp-1.yaml')
    result, _out = run_module(talos_config, capsys, _ansible_check_mode=True, **node_args(secrets_path, dest))
    assert result['changed'] is True
    assert not os.path.exists(dest)


def test_diff_shows_a_host_patch_change_and_hides_secrets(capsys, secrets_path, tmp_path, bundle):
    dest = str(tmp_path / 'cp-1.yaml')
    run_module(talos_config, capsys, **node_args(secrets_path, dest))
    patched = node_args(secrets_path, dest, patches={'host': [{'machine': {'nodeLabels': {'zone': 'b'}}}]})
    result, out = run_module(talos_config, capsys, _ansible_diff=True, _ansible_check_mode=True, **patched)
    assert result['changed'] is True
    diff = result['diff']
    assert 'zone' not in diff['before'] and "zone: b" in diff['after']
    assert '<hidden> sha256:' in diff['after']
    assert_no_secret(out, bundle.secret_values())
    # Only the patch differs between the two sides.
    changed = set(diff['after'].splitlines()) - set(diff['before'].splitlines())
    assert changed == {'    zone: b'}


def test_worker_config(capsys, secrets_path, tmp_path):
    dest = str(tmp_path / 'w-1.yaml')
    result, _out = run_module(talos_config, capsys, secrets_path=secrets_path, cluster=CLUSTER, machine_type='worker',
                              dest=dest)
    assert result['changed'] is True
    with open(dest) as handle:
        documents = config.validate_machine_config(handle.read(), '1.13')
    assert documents[0]['machine']['ca']['key'] == '' and 'etcd' not in documents[0]['cluster']


def test_bad_inputs_name_the_field(capsys, secrets_path, tmp_path):
    dest = str(tmp_path / 'cp.yaml')
    result, _out = run_module(talos_config, capsys, **node_args(secrets_path, dest, cluster=dict(CLUSTER, pod_subnet='x')))
    assert result['failed'] is True and result['field'] == 'cluster.pod_subnet'
    result, _out = run_module(talos_config, capsys, **node_args(
        secrets_path, dest, patches={'host': [[{'op': 'replace', 'path': '/machine/nope', 'value': 1}]]}))
    assert result['failed'] is True and result['field'] == 'patches.host[0]'
    without_type = node_args(secrets_path, dest)
    del without_type['machine_type']
    result, _out = run_module(talos_config, capsys, **without_type)
    assert result['failed'] is True and result['field'] == 'machine_type'
    result, _out = run_module(talos_config, capsys, **node_args(str(tmp_path / 'missing.yaml'), dest))
    assert result['failed'] is True and result['field'] == 'secrets_path'
    assert not os.path.exists(dest)


def test_talosconfig_usable_and_stable(capsys, secrets_path, tmp_path, bundle):
    dest = str(tmp_path / 'talosconfig')
    args = dict(secrets_path=secrets_path, cluster=CLUSTER, talosconfig_dest=dest,
                talosconfig_endpoints=['10.5.0.11', '10.5.0.12'])
    result, out = run_module(talos_config, capsys, **args)
    assert result['changed'] is True and result['client_certificate_reused'] is False
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o600
    with open(dest) as handle:
        text = handle.read()
    parsed = talosconfig.parse_talosconfig(text)
    assert parsed.context == 'demo' and parsed.endpoints == ['10.5.0.11', '10.5.0.12']
    assert parsed.ca_pem == bundle.ca('os')[0]
    assert parsed.key_pem_talos.decode() not in out
    assert talosyaml.load(text, 't')['contexts']['demo']['key'] not in out

    again, _out = run_module(talos_config, capsys, **args)
    assert again['changed'] is False and again['client_certificate_reused'] is True
    fewer = dict(args)
    fewer['talosconfig_endpoints'] = ['10.5.0.11']
    moved, _out = run_module(talos_config, capsys, _ansible_diff=True, **fewer)
    assert moved['changed'] is True and moved['client_certificate_reused'] is True
    assert '10.5.0.12' in moved['diff']['before'] and '10.5.0.12' not in moved['diff']['after']
    assert parsed.key_pem_talos.decode() not in moved['diff']['after']


def test_check_mode_before_the_bundle_exists_predicts_the_writes(capsys, tmp_path):
    dest = str(tmp_path / 'cp.yaml')
    result, _out = run_module(talos_config, capsys, _ansible_check_mode=True,
                              **node_args(str(tmp_path / 'secrets' / 'not-yet.yaml'), dest))
    assert result['changed'] is True and result['config_changed'] is True and not os.path.exists(dest)
    assert 'does not exist yet' in str(result['warnings'])
    result, _out = run_module(talos_config, capsys, **node_args(str(tmp_path / 'secrets' / 'not-yet.yaml'), dest))
    assert result['failed'] is True and result['field'] == 'secrets_path'
