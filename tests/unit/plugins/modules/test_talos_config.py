"""talos_config: every node's machine config (the list nodes) and a talosctl talosconfig; stable re-runs; diffs without
secrets."""
import os
import stat

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _crypto
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import config, pki, secrets, talosconfig, talosyaml
from ansible_collections.proxtalos.cluster.plugins.modules import talos_config
from ansible_collections.proxtalos.cluster.tests.unit.broken_keys import flipped_exponent_pem

from ansible_collections.proxtalos.cluster.tests.helpers import assert_no_secret, run_module

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


def node_args(secrets_path, dest, cluster=None, **item_values):
    """One node (cp-1), a one-element nodes list; item_values: the item's own keys (patches, machine_type...)."""
    item = dict(name='cp-1', machine_type='controlplane', dest=dest,
                node={'hostname': 'cp-1', 'ip': '10.5.0.11', 'prefix': 24, 'gateway': '10.5.0.1'})
    item.update(item_values)
    return dict(secrets_path=secrets_path, cluster=cluster or CLUSTER, nodes=[item])


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
    assert again['changed'] is False and again['nodes']['cp-1']['config_sha256'] == result['nodes']['cp-1']['config_sha256']
    assert len(result['nodes']['cp-1']['config_sha256']) == 64


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
    assert result['changed'] is True and len(result['diff']) == 1
    diff = result['diff'][0]
    assert diff['after_header'] == 'cp-1: %s (this render)' % dest
    assert 'zone' not in diff['before'] and "zone: b" in diff['after']
    assert '<hidden> hmac:' in diff['after']
    assert_no_secret(out, bundle.secret_values())
    # Only the patch differs between the two sides.
    changed = set(diff['after'].splitlines()) - set(diff['before'].splitlines())
    assert changed == {'    zone: b'}


def test_worker_config(capsys, secrets_path, tmp_path):
    dest = str(tmp_path / 'w-1.yaml')
    result, _out = run_module(talos_config, capsys, secrets_path=secrets_path, cluster=CLUSTER,
                              nodes=[dict(name='w-1', machine_type='worker', dest=dest)])
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
    assert result['failed'] is True and result['field'] == 'nodes[cp-1].patches.host[0]'
    without_type = node_args(secrets_path, dest)
    del without_type['nodes'][0]['machine_type']
    result, _out = run_module(talos_config, capsys, **without_type)
    assert result['failed'] is True and result['field'] == 'nodes[cp-1].machine_type'
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
    assert [diff['after_header'] for diff in moved['diff']] == [dest]
    assert '10.5.0.12' in moved['diff'][0]['before'] and '10.5.0.12' not in moved['diff'][0]['after']
    assert parsed.key_pem_talos.decode() not in moved['diff'][0]['after']
    assert moved['nodes'] == {} and moved['config_changed'] is False


def test_check_mode_before_the_bundle_exists_predicts_the_writes(capsys, tmp_path):
    dest = str(tmp_path / 'cp.yaml')
    result, _out = run_module(talos_config, capsys, _ansible_check_mode=True,
                              **node_args(str(tmp_path / 'secrets' / 'not-yet.yaml'), dest))
    assert result['changed'] is True and result['config_changed'] is True and not os.path.exists(dest)
    assert 'does not exist yet' in str(result['warnings'])
    result, _out = run_module(talos_config, capsys, **node_args(str(tmp_path / 'secrets' / 'not-yet.yaml'), dest))
    assert result['failed'] is True and result['field'] == 'secrets_path'


@pytest.mark.parametrize('option, value', [
    ('dest', 'cp-1.yaml'), ('machine_type', 'controlplane'), ('node', {'hostname': 'cp-1'}), ('patches', {}),
])
def test_a_per_node_option_beside_nodes_is_refused_naming_it(capsys, secrets_path, tmp_path, option, value):
    """The single form is gone: its options at the top level are unsupported parameters, named in the message."""
    args = node_args(secrets_path, str(tmp_path / 'cp-1.yaml'))
    args[option] = value
    result, _out = run_module(talos_config, capsys, **args)
    assert result['failed'] is True
    assert result['msg'].startswith('Unsupported parameters for (') and 'module: %s.' % option in result['msg'], result
    assert not os.path.exists(str(tmp_path / 'cp-1.yaml'))


# --- several nodes ----------------------------------------------------------------------------------------------

def node_items(tmp_path, **host_patches):
    """Three nodes: a control plane with a static address and two workers; host_patches: {name: [patch, ...]}."""
    items = [dict(name='cp-1', machine_type='controlplane', dest=str(tmp_path / 'artifacts' / 'cp-1.yaml'),
                  node={'hostname': 'cp-1', 'ip': '10.5.0.11', 'prefix': 24, 'gateway': '10.5.0.1'}),
             dict(name='w-1', machine_type='worker', dest=str(tmp_path / 'artifacts' / 'w-1.yaml'),
                  node={'hostname': 'w-1'}, patches={'group': [{'machine': {'nodeLabels': {'role': 'worker'}}}]}),
             dict(name='w-2', machine_type='worker', dest=str(tmp_path / 'artifacts' / 'w-2.yaml'),
                  node={'hostname': 'w-2'}, kubernetes_version='1.33.4')]
    for item in items:
        if item['name'] in host_patches:
            item.setdefault('patches', {})['host'] = host_patches[item['name']]
    return items


def multi_args(secrets_path, tmp_path, items=None, **extra):
    args = dict(secrets_path=secrets_path, cluster=CLUSTER, nodes=items if items is not None else node_items(tmp_path),
                talosconfig_dest=str(tmp_path / 'artifacts' / 'talosconfig'), talosconfig_endpoints=['10.5.0.11'])
    args.update(extra)
    return args


def read(path):
    with open(path, encoding='utf-8') as handle:
        return handle.read()


def test_multi_node_renders_what_each_node_alone_renders_then_is_unchanged(capsys, secrets_path, tmp_path, bundle):
    result, out = run_module(talos_config, capsys, **multi_args(secrets_path, tmp_path))
    assert result['changed'] is True and result['config_changed'] is True and result['talosconfig_changed'] is True
    assert sorted(result['nodes']) == ['cp-1', 'w-1', 'w-2']
    assert_no_secret(out, bundle.secret_values())
    for item in node_items(tmp_path):
        node_result = result['nodes'][item['name']]
        assert node_result['dest'] == item['dest'] and node_result['config_changed'] is True
        assert node_result['contract'] == '1.13'
        assert stat.S_IMODE(os.stat(item['dest']).st_mode) == 0o600
        # The same bytes a run over this node alone (a one-element list) writes.
        single_dest = str(tmp_path / 'single' / ('%s.yaml' % item['name']))
        single, _out = run_module(talos_config, capsys, secrets_path=secrets_path, cluster=CLUSTER,
                                  nodes=[dict(item, dest=single_dest)])
        assert read(single_dest) == read(item['dest'])
        assert single['nodes'][item['name']]['config_sha256'] == node_result['config_sha256']
    documents = config.validate_machine_config(read(str(tmp_path / 'artifacts' / 'w-2.yaml')), '1.13')
    assert documents[0]['machine']['kubelet']['image'].endswith(':v1.33.4')
    documents = config.validate_machine_config(read(str(tmp_path / 'artifacts' / 'w-1.yaml')), '1.13')
    assert documents[0]['machine']['nodeLabels'] == {'role': 'worker'}
    assert talosconfig.parse_talosconfig(read(str(tmp_path / 'artifacts' / 'talosconfig'))).endpoints == ['10.5.0.11']

    before = dict((name, read(str(tmp_path / 'artifacts' / name))) for name in ('cp-1.yaml', 'w-1.yaml', 'w-2.yaml'))
    again, _out = run_module(talos_config, capsys, _ansible_diff=True, **multi_args(secrets_path, tmp_path))
    assert again['changed'] is False and again['config_changed'] is False and again['talosconfig_changed'] is False
    assert all(node['config_changed'] is False for node in again['nodes'].values())
    assert again['diff'] == []
    assert dict((name, read(str(tmp_path / 'artifacts' / name))) for name in before) == before


def test_multi_node_reads_the_bundle_and_parses_its_keys_once(capsys, secrets_path, tmp_path, monkeypatch):
    reads = []
    real_read_bundle = talos_config.read_bundle
    monkeypatch.setattr(talos_config, 'read_bundle', lambda *args: reads.append(args) or real_read_bundle(*args))
    parsed = []
    real_load = pki.serialization.load_pem_private_key
    monkeypatch.setattr(_crypto, '_PARSED', {})
    monkeypatch.setattr(pki.serialization, 'load_pem_private_key',
                        lambda pem, **kwargs: parsed.append(pem) or real_load(pem, **kwargs))
    result, _out = run_module(talos_config, capsys, **multi_args(secrets_path, tmp_path))
    assert result['changed'] is True and len(result['nodes']) == 3
    assert len(reads) == 1
    # Every key is parsed at most once, however many nodes (the RSA service account key among them).
    assert parsed and len(parsed) == len(set(parsed))


def test_multi_node_a_bad_patch_names_that_node_and_writes_nothing(capsys, secrets_path, tmp_path):
    bad = [[{'op': 'replace', 'path': '/machine/nope', 'value': 1}]]
    result, out = run_module(talos_config, capsys, **multi_args(secrets_path, tmp_path, node_items(tmp_path, **{'w-1': bad})))
    assert result['failed'] is True
    assert result['field'] == 'nodes[w-1].patches.host[0]' and result['node'] == 'w-1'
    assert result['msg'].startswith('nodes[w-1].patches.host[0]: ') and '/machine/nope' in result['msg']
    assert 'cp-1' not in result['msg'] and 'w-2' not in result['msg']
    assert not os.path.exists(str(tmp_path / 'artifacts'))


def test_multi_node_every_failing_node_is_named(capsys, secrets_path, tmp_path):
    bad = [[{'op': 'replace', 'path': '/machine/nope', 'value': 1}]]
    items = node_items(tmp_path, **{'w-1': bad})
    items[2]['node'] = {'hostname': 'w-2', 'install_disk': 'sdb'}
    result, _out = run_module(talos_config, capsys, **multi_args(secrets_path, tmp_path, items))
    assert result['failed'] is True and result['msg'].startswith('2 nodes cannot be rendered: ')
    assert result['field'] == 'nodes[w-1].patches.host[0]'
    assert sorted(result['failed_nodes']) == ['w-1', 'w-2']
    assert result['failed_nodes']['w-2'].startswith('nodes[w-2].node.install_disk: must be a device path')
    assert not os.path.exists(str(tmp_path / 'artifacts'))


def test_multi_node_each_node_renders_with_its_own_cluster_values(capsys, secrets_path, tmp_path, bundle):
    # A host-level value (one node's NIC) and a group-level one (a schematic for some workers) must reach that node
    # only; a node without its own values keeps the module's cluster option.
    schematic = 'a' * 64
    items = node_items(tmp_path)
    items[0]['cluster'] = dict(CLUSTER, network_link='enp6s18')
    items[1]['cluster'] = dict(CLUSTER, installer_schematic=schematic)
    result, out = run_module(talos_config, capsys, **multi_args(secrets_path, tmp_path, items))
    assert result['changed'] is True and sorted(result['nodes']) == ['cp-1', 'w-1', 'w-2'], result
    assert_no_secret(out, bundle.secret_values())
    for item in items:
        # The same bytes a run over this node alone writes with that node's own cluster values as the module's.
        single_dest = str(tmp_path / 'single' / ('%s.yaml' % item['name']))
        alone = dict((key, value) for key, value in item.items() if key != 'cluster')
        run_module(talos_config, capsys, secrets_path=secrets_path, cluster=item.get('cluster', CLUSTER),
                   nodes=[dict(alone, dest=single_dest)])
        assert read(single_dest) == read(item['dest']), item['name']
    cp1, w1, w2 = (read(str(tmp_path / 'artifacts' / name)) for name in ('cp-1.yaml', 'w-1.yaml', 'w-2.yaml'))
    assert 'enp6s18' in cp1 and 'enp6s18' not in w1 + w2
    assert 'factory.talos.dev/installer/%s:' % schematic in w1 and schematic not in cp1 + w2


def test_multi_node_a_nodes_own_cluster_values_are_checked_and_name_the_node(capsys, secrets_path, tmp_path, monkeypatch):
    items = node_items(tmp_path)
    items[1]['cluster'] = dict(CLUSTER, pod_subnet='x')
    result, _out = run_module(talos_config, capsys, **multi_args(secrets_path, tmp_path, items))
    assert result['failed'] is True and result['field'] == 'nodes[w-1].cluster.pod_subnet' and result['node'] == 'w-1'
    assert not os.path.exists(str(tmp_path / 'artifacts'))
    # Two nodes sharing one bad value: checked once, both named.
    items[2]['cluster'] = dict(CLUSTER, pod_subnet='x')
    checks = []
    real = config.normalize_cluster
    monkeypatch.setattr(config, 'normalize_cluster', lambda *args, **kwargs: checks.append(args) or real(*args, **kwargs))
    result, _out = run_module(talos_config, capsys, **multi_args(secrets_path, tmp_path, items))
    assert result['failed'] is True and sorted(result['failed_nodes']) == ['w-1', 'w-2']
    assert len([args for args in checks if args[0].get('pod_subnet') == 'x']) == 1
    # A node's own values are of the same cluster: another name or endpoint fails naming the node.
    items = node_items(tmp_path)
    items[2]['cluster'] = dict(CLUSTER, endpoint='https://10.9.9.9:6443')
    result, _out = run_module(talos_config, capsys, **multi_args(secrets_path, tmp_path, items))
    assert result['failed'] is True and result['field'] == 'nodes[w-2].cluster.endpoint', result
    items[2]['cluster'] = ['not', 'a', 'mapping']
    result, _out = run_module(talos_config, capsys, **multi_args(secrets_path, tmp_path, items))
    assert result['failed'] is True and result['field'] == 'nodes[w-2].cluster' and 'must be a mapping' in result['msg']
    assert not os.path.exists(str(tmp_path / 'artifacts'))


def test_multi_node_check_mode_writes_nothing_and_diffs_each_node_without_secrets(capsys, secrets_path, tmp_path, bundle):
    result, out = run_module(talos_config, capsys, _ansible_check_mode=True, _ansible_diff=True,
                             **multi_args(secrets_path, tmp_path))
    assert result['changed'] is True and all(node['config_changed'] for node in result['nodes'].values())
    assert not os.path.exists(str(tmp_path / 'artifacts'))
    assert [diff['after_header'] for diff in result['diff']] == [
        'cp-1: %s (this render)' % (tmp_path / 'artifacts' / 'cp-1.yaml'),
        'w-1: %s (this render)' % (tmp_path / 'artifacts' / 'w-1.yaml'),
        'w-2: %s (this render)' % (tmp_path / 'artifacts' / 'w-2.yaml'),
        str(tmp_path / 'artifacts' / 'talosconfig')]
    assert_no_secret(out, bundle.secret_values())

    # After a real run, a host patch of one node: check mode predicts exactly that node, diff shows the patch.
    run_module(talos_config, capsys, **multi_args(secrets_path, tmp_path))
    patched = multi_args(secrets_path, tmp_path, node_items(tmp_path, **{'w-2': [{'machine': {'nodeLabels': {'zone': 'b'}}}]}))
    before = read(str(tmp_path / 'artifacts' / 'w-2.yaml'))
    result, out = run_module(talos_config, capsys, _ansible_check_mode=True, _ansible_diff=True, **patched)
    assert result['changed'] is True
    assert [name for name, node in result['nodes'].items() if node['config_changed']] == ['w-2']
    assert len(result['diff']) == 1 and result['diff'][0]['before_header'].startswith('w-2: ')
    changed = set(result['diff'][0]['after'].splitlines()) - set(result['diff'][0]['before'].splitlines())
    assert changed == {'  nodeLabels:', '    zone: b'}  # a worker has no node labels of its own
    assert read(str(tmp_path / 'artifacts' / 'w-2.yaml')) == before
    assert_no_secret(out, bundle.secret_values())


def test_multi_node_mode_drift_is_rewritten(capsys, secrets_path, tmp_path):
    run_module(talos_config, capsys, **multi_args(secrets_path, tmp_path))
    os.chmod(str(tmp_path / 'artifacts' / 'w-1.yaml'), 0o644)
    result, _out = run_module(talos_config, capsys, **multi_args(secrets_path, tmp_path))
    assert result['changed'] is True
    assert [name for name, node in result['nodes'].items() if node['config_changed']] == ['w-1']
    assert stat.S_IMODE(os.stat(str(tmp_path / 'artifacts' / 'w-1.yaml')).st_mode) == 0o600


@pytest.mark.parametrize('change, field, reason', [
    (lambda items: items[1].pop('machine_type'), 'nodes[w-1].machine_type', 'is required'),
    (lambda items: items[1].update(machine_type='master'), 'nodes[w-1].machine_type', 'must be controlplane or worker'),
    (lambda items: items[2].pop('dest'), 'nodes[w-2].dest', 'is required'),
    (lambda items: items[2].update(dest=items[0]['dest']), 'nodes[w-2].dest', 'is also the dest of nodes[cp-1]'),
    (lambda items: items[2].update(name='w-1'), 'nodes[w-1].name', 'two items have this name'),
    (lambda items: items[0].pop('name'), 'nodes[0].name', 'is required'),
    (lambda items: items[1].update(host_patches=[]), 'nodes[w-1].host_patches', 'unknown key'),
    (lambda items: items[1].update(node='w-1'), 'nodes[w-1].node', 'must be a mapping'),
    (lambda items: items[1].update(requires_install='yes'), 'nodes[w-1].requires_install', 'must be true or false'),
    (lambda items: items[1].update(node={'hostname': 'W_1'}), 'nodes[w-1].node.hostname', 'must be lower-case'),
    (lambda items: items[0].update(talos_version='v1.9.0'), 'nodes[cp-1].talos_version', ''),
    (lambda items: items.clear(), 'nodes', 'is empty'),
])
def test_multi_node_bad_items_name_the_node_and_the_key(capsys, secrets_path, tmp_path, change, field, reason):
    items = node_items(tmp_path)
    change(items)
    result, _out = run_module(talos_config, capsys, **multi_args(secrets_path, tmp_path, items))
    assert result['failed'] is True and result['field'] == field and reason in result['msg'], result
    assert not os.path.exists(str(tmp_path / 'artifacts'))


def test_without_nodes_or_a_talosconfig_there_is_nothing_to_do_and_the_message_says_which(capsys, secrets_path):
    result, _out = run_module(talos_config, capsys, secrets_path=secrets_path, cluster=CLUSTER)
    assert result['failed'] is True and result['msg'] == 'one of the following is required: nodes, talosconfig_dest'


def test_multi_node_check_mode_before_the_bundle_exists_predicts_every_node(capsys, tmp_path):
    missing = str(tmp_path / 'secrets' / 'not-yet.yaml')
    result, _out = run_module(talos_config, capsys, _ansible_check_mode=True, **multi_args(missing, tmp_path))
    assert result['changed'] is True and result['talosconfig_changed'] is True
    assert all(node['config_changed'] for node in result['nodes'].values()) and len(result['nodes']) == 3
    assert 'does not exist yet' in str(result['warnings'])
    assert not os.path.exists(str(tmp_path / 'artifacts'))


def test_multi_node_dest_is_expanded_like_a_path_option(capsys, secrets_path, tmp_path, monkeypatch):
    monkeypatch.setenv('CONFIGS_DIR', str(tmp_path / 'from-env'))
    items = node_items(tmp_path)[:1]
    items[0]['dest'] = '$CONFIGS_DIR/cp-1.yaml'
    result, _out = run_module(talos_config, capsys, **multi_args(secrets_path, tmp_path, items))
    assert result['nodes']['cp-1']['dest'] == str(tmp_path / 'from-env' / 'cp-1.yaml')
    assert os.path.exists(str(tmp_path / 'from-env' / 'cp-1.yaml'))


def test_the_service_account_keys_numbers_are_checked_unless_the_keeper_checked_them(capsys, bundle, tmp_path, monkeypatch):
    """A bundle whose RSA service account key has one bit of its private exponent flipped (its PEM still parses):
    refused by default, naming the key; check_key_consistency=false (the talos_machines role passes it only right
    after talos_secrets checked the same file in the same run) renders."""
    from cryptography.hazmat.primitives import serialization  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(_crypto, '_PARSED', {})
    data = bundle.to_dict()
    data['certs']['k8sserviceaccount']['key'] = pki.b64encode_pem(flipped_exponent_pem(
        pki.load_private_key(bundle.certs['k8sserviceaccount']['key']), serialization.PrivateFormat.TraditionalOpenSSL))
    path = tmp_path / 'broken-secrets.yaml'
    path.write_text(talosyaml.dump(data))
    result, _out = run_module(talos_config, capsys, **multi_args(str(path), tmp_path))
    assert result['failed'] is True and result['field'] == 'certs.k8sserviceaccount.key', result
    assert 'Invalid private key' in result['msg']
    assert not os.path.exists(str(tmp_path / 'artifacts' / 'talosconfig'))
    result, _out = run_module(talos_config, capsys, **multi_args(str(path), tmp_path, check_key_consistency=False))
    assert result.get('failed') is not True and result['changed'] is True, result


def test_a_patchs_secret_is_masked_when_another_node_fails_to_render(capsys, tmp_path):
    """The values a patch sets are registered before any node is rendered: a failure of another node (the result's
    invocation shows the module's arguments, patches included) does not print them."""
    from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import secrets as talos_secrets  # pylint: disable=import-outside-toplevel
    bundle_path = tmp_path / 'secrets.yaml'
    bundle_path.write_text(talos_secrets.generate_bundle().to_yaml())
    os.chmod(str(bundle_path), 0o600)
    auth = {'apiVersion': 'v1alpha1', 'kind': 'RegistryAuthConfig', 'name': 'registry.example.internal',
            'username': 'puller', 'password': 'patched-password-42'}
    items = [dict(name='cp-1', machine_type='controlplane', dest=str(tmp_path / 'cp-1.yaml'),
                  node={'hostname': 'cp-1', 'ip': '10.5.0.11', 'prefix': 24, 'gateway': '10.5.0.1'}, patches={'host': [auth]}),
             dict(name='w-1', machine_type='worker', dest=str(tmp_path / 'w-1.yaml'), node={'hostname': 'w-1'},
                  patches={'host': [[{'op': 'replace', 'path': '/machine/nope', 'value': 1}]]})]
    # ansible-core 2.21 adds the invocation to a result only when asked (_ansible_inject_invocation, an argument that
    # 2.19 and 2.20 refuse as unsupported); those add it to every result
    from ansible.module_utils.common import parameters  # pylint: disable=import-outside-toplevel
    ask = {'_ansible_inject_invocation': True} if 'inject_invocation' in parameters.PASS_VARS else {}
    result, out = run_module(talos_config, capsys, secrets_path=str(bundle_path), nodes=items,
                             cluster={'name': 'demo', 'endpoint': 'https://10.5.0.10:6443'}, **ask)
    assert result['failed'] and 'w-1' in result['msg'] and 'invocation' in result
    assert 'patched-password-42' not in out


def test_with_artifacts_vault_password_every_file_is_a_vault_envelope_and_a_rerun_is_unchanged(capsys, secrets_path, tmp_path, bundle):
    """artifacts_vault_password: the machine configs (a control plane's holds the CA keys) and the talosconfig are
    vault envelopes with it, nothing of them in clear; a re-run and a check-mode run compare plaintexts (unchanged);
    without the option the same content is rewritten in clear, and check mode predicts that."""
    from ansible.parsing.vault import VaultLib, VaultSecret
    vault = VaultLib([('default', VaultSecret(b'typed'))])
    artifacts = tmp_path / 'artifacts'
    args = dict(secrets_path=secrets_path, cluster=CLUSTER, talosconfig_dest=str(artifacts / 'talosconfig'),
                talosconfig_endpoints=['10.5.0.11'], artifacts_vault_password='typed',
                nodes=[{'name': 'cp-1', 'machine_type': 'controlplane', 'dest': str(artifacts / 'cp-1.yaml'),
                        'node': {'hostname': 'cp-1'}}])
    result, out = run_module(talos_config, capsys, **args)
    assert result['changed'] is True and 'typed' not in out
    written = dict((name, (artifacts / name).read_bytes()) for name in ('cp-1.yaml', 'talosconfig'))
    for name, data in written.items():
        assert data.startswith(b'$ANSIBLE_VAULT;1.1;AES256'), name
        assert stat.S_IMODE(os.stat(str(artifacts / name)).st_mode) == 0o600
    plain = vault.decrypt(written['cp-1.yaml']).decode()
    assert 'LS0tLS1CRUdJTi' in plain   # the CA keys, base64 PEM, are in the config - and only inside the envelope
    config.validate_machine_config(plain, '1.13')
    assert talosconfig.parse_talosconfig(vault.decrypt(written['talosconfig']).decode()).context == 'demo'

    again, _out = run_module(talos_config, capsys, **args)
    checked, _out = run_module(talos_config, capsys, _ansible_check_mode=True, **args)
    assert again['changed'] is False and checked['changed'] is False
    assert again['client_certificate_reused'] is True
    assert dict((name, (artifacts / name).read_bytes()) for name in written) == written

    # as the roles run it with proxtalos_artifacts_in_clear: the bundle's password (the same typed one) opens the files
    clear = dict(args, vault_password='typed')
    del clear['artifacts_vault_password']
    predicted, _out = run_module(talos_config, capsys, _ansible_check_mode=True, **clear)
    assert predicted['changed'] is True
    assert dict((name, (artifacts / name).read_bytes()) for name in written) == written
    rewritten, _out = run_module(talos_config, capsys, **clear)
    assert rewritten['changed'] is True and rewritten['client_certificate_reused'] is True
    assert (artifacts / 'cp-1.yaml').read_text() == plain
    back, _out = run_module(talos_config, capsys, **args)
    assert back['changed'] is True and (artifacts / 'cp-1.yaml').read_bytes().startswith(b'$ANSIBLE_VAULT;')
