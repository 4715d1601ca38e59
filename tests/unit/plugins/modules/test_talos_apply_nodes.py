"""talos_apply's multi-node form (option nodes): every node applied and verified at once in one run, against fake nodes."""
import json
import threading

import pytest

from ansible_collections.proxtalos.cluster.plugins.modules import talos_apply

from ansible_collections.proxtalos.cluster.tests.helpers import assert_no_secret, run_module
from talos_module_helpers import FakeCluster, FakeNode, make_talosconfig
from test_talos_apply import CHANGED, CONFIG, SECRET, TOKEN


@pytest.fixture(scope='module')
def talosconfig():
    return make_talosconfig()


def cluster_of(tmp_path, *specs):
    """FakeNodes named by inventory host, each with its config file; specs are (name, address, mode, running, wanted):
    the node's mode, the config it runs (None in maintenance mode) and the config of its file."""
    nodes = []
    for name, address, mode, running, wanted in specs:
        node = FakeNode(address, mode=mode, config=running.encode() if running else None, control_plane=False)
        node.inventory_name = name
        node.config_path = str(tmp_path / ('%s.yaml' % name))
        with open(node.config_path, 'w', encoding='utf-8') as handle:
            handle.write(wanted)
        nodes.append(node)
    return nodes


def node_items(nodes):
    return [{'name': node.inventory_name, 'address': node.host, 'config_path': node.config_path} for node in nodes]


def args(talosconfig, nodes, **extra):
    values = dict(nodes=node_items(nodes), talosconfig_content=talosconfig[0], wait_timeout=5, wait_sleep=0.01)
    values.update(extra)
    return values


def real_applies(node):
    return [call for call in node.calls if call[0] == 'apply-for-real']


def test_every_node_is_applied_and_verified_then_a_rerun_changes_nothing(capsys, monkeypatch, talosconfig, tmp_path):
    nodes = cluster_of(tmp_path, ('w-1', '10.5.0.21', 'maintenance', None, CONFIG), ('w-2', '10.5.0.22', 'maintenance', None, CONFIG),
                       ('w-3', '10.5.0.23', 'configured', CONFIG, CONFIG))
    FakeCluster(*nodes).install(monkeypatch)
    result, out = run_module(talos_apply, capsys, **args(talosconfig, nodes))
    assert 'failed' not in result, result.get('msg')
    assert result['changed'] is True and sorted(result['nodes']) == ['w-1', 'w-2', 'w-3']
    for name in ('w-1', 'w-2'):
        node_result = result['nodes'][name]
        assert node_result['changed'] is True and node_result['node_mode'] == 'maintenance', node_result
        assert node_result['rebooted'] is True and node_result['verified'] is True and node_result['applied_mode'] == 'auto'
    assert result['nodes']['w-3']['changed'] is False and result['nodes']['w-3']['verified'] is True
    assert result['nodes']['w-1']['node'] == '10.5.0.21:50000'
    assert [real_applies(node) for node in nodes] == [[('apply-for-real', 'auto')], [('apply-for-real', 'auto')], []]
    # one gate per node, under its inventory name, in the order of the nodes option
    assert [(gate['host'], gate['ok'], gate['target']) for gate in result['gates']] == [
        ('w-1', True, '10.5.0.21:50000'), ('w-2', True, '10.5.0.22:50000'), ('w-3', True, '10.5.0.23:50000')]
    assert all(gate['name'] == talos_apply.GATE_NAME and gate['started_at'] <= gate['ended_at'] for gate in result['gates'])
    assert result['gates'][0]['observation'] == 'answers over mTLS and runs the applied config'
    assert result['failed_nodes'] == {} and 'diff' not in result
    assert_no_secret(out, [TOKEN, SECRET, talosconfig[1]])

    again, _out = run_module(talos_apply, capsys, **args(talosconfig, nodes))
    assert again['changed'] is False and all(node_result['changed'] is False for node_result in again['nodes'].values())
    assert [len(real_applies(node)) for node in nodes] == [1, 1, 0]
    assert [gate['ok'] for gate in again['gates']] == [True, True, True]


def test_changed_is_each_nodes_own(capsys, monkeypatch, talosconfig, tmp_path):
    nodes = cluster_of(tmp_path, ('w-1', '10.5.0.21', 'configured', CONFIG, CONFIG), ('w-2', '10.5.0.22', 'configured', CONFIG, CHANGED),
                       ('w-3', '10.5.0.23', 'configured', CONFIG, CONFIG))
    FakeCluster(*nodes).install(monkeypatch)
    result, _out = run_module(talos_apply, capsys, **args(talosconfig, nodes))
    assert result['changed'] is True
    assert dict((name, node_result['changed']) for name, node_result in result['nodes'].items()) == {
        'w-1': False, 'w-2': True, 'w-3': False}
    assert result['nodes']['w-2']['applied_mode'] == 'no_reboot' and result['nodes']['w-2']['verified'] is True
    assert [len(real_applies(node)) for node in nodes] == [0, 1, 0]


def test_one_failing_node_among_passing_ones_is_named_alone(capsys, monkeypatch, talosconfig, tmp_path):
    nodes = cluster_of(tmp_path, ('cp-1', '10.5.0.11', 'maintenance', None, CONFIG), ('w-1', '10.5.0.21', 'maintenance', None, CONFIG),
                       ('w-2', '10.5.0.22', 'maintenance', None, CONFIG))
    nodes[1].reject = 'error decoding document /v1alpha1/ (line 1): unknown keys found during decoding:\nmachine:\n    bogusKey: 1\n'
    FakeCluster(*nodes).install(monkeypatch)
    result, out = run_module(talos_apply, capsys, **args(talosconfig, nodes))
    assert result['failed'] is True
    assert result['msg'].startswith('talos_apply: 1 of 3 nodes failed: w-1 (10.5.0.21:50000): ')
    assert 'bogusKey' in result['msg'] and 'cp-1' not in result['msg'] and 'w-2' not in result['msg']
    assert list(result['failed_nodes']) == ['w-1']
    # the others were applied and verified all the same, and their results are there
    assert real_applies(nodes[1]) == [] and [len(real_applies(node)) for node in (nodes[0], nodes[2])] == [1, 1]
    assert result['changed'] is True and result['nodes']['w-1']['changed'] is False
    assert all(result['nodes'][name]['verified'] is True for name in ('cp-1', 'w-2'))
    assert result['nodes']['w-1']['node_mode'] == 'maintenance'   # what was seen before it failed
    assert [(gate['host'], gate['ok']) for gate in result['gates']] == [('cp-1', True), ('w-1', False), ('w-2', True)]
    assert 'bogusKey' in result['gates'][1]['observation']
    assert_no_secret(out, [TOKEN, SECRET])


def test_every_failing_node_is_named_with_what_was_seen(capsys, monkeypatch, talosconfig, tmp_path):
    nodes = cluster_of(tmp_path, ('w-1', '10.5.0.21', 'maintenance', None, CONFIG), ('w-2', '10.5.0.22', 'maintenance', None, CONFIG),
                       ('w-3', '10.5.0.23', 'maintenance', None, CONFIG))
    nodes[0].unreachable = True
    nodes[2].hang_on_reboot = True
    FakeCluster(*nodes).install(monkeypatch)
    result, _out = run_module(talos_apply, capsys, **args(talosconfig, nodes, wait_timeout=0.5))
    assert result['failed'] is True and sorted(result['failed_nodes']) == ['w-1', 'w-3']
    assert result['msg'].startswith('talos_apply: 2 of 3 nodes failed: w-1 (10.5.0.21:50000): gave up after 0.5s waiting for the Talos API')
    assert 'connection refused' in result['failed_nodes']['w-1']
    assert result['failed_nodes']['w-3'].startswith('w-3 (10.5.0.23:50000): gave up after 0.5s waiting for the node back over mTLS')
    # w-3 took its config (changed) but never came back; w-1 was never reached
    assert result['nodes']['w-3']['changed'] is True and result['nodes']['w-3']['verified'] is False
    assert result['nodes']['w-1']['changed'] is False and result['nodes']['w-1']['node_mode'] == ''
    assert result['nodes']['w-2']['verified'] is True and result['changed'] is True
    gates = dict((gate['host'], gate) for gate in result['gates'])
    assert gates['w-1']['ok'] is False and gates['w-1']['attempts'] > 1 and gates['w-2']['ok'] is True


def test_check_mode_predicts_each_node_and_applies_nothing(capsys, monkeypatch, talosconfig, tmp_path):
    nodes = cluster_of(tmp_path, ('w-1', '10.5.0.21', 'maintenance', None, CONFIG), ('w-2', '10.5.0.22', 'configured', CONFIG, CHANGED),
                       ('w-3', '10.5.0.23', 'configured', CONFIG, CONFIG))
    FakeCluster(*nodes).install(monkeypatch)
    result, out = run_module(talos_apply, capsys, _ansible_check_mode=True, _ansible_diff=True, **args(talosconfig, nodes))
    assert 'failed' not in result, result.get('msg')
    assert result['changed'] is True
    assert dict((name, node_result['changed']) for name, node_result in result['nodes'].items()) == {
        'w-1': True, 'w-2': True, 'w-3': False}
    assert result['nodes']['w-2']['applied_mode'] == 'no_reboot' and result['nodes']['w-1']['applied_mode'] == 'auto'
    assert [real_applies(node) for node in nodes] == [[], [], []]
    assert [node.mode for node in nodes] == ['maintenance', 'configured', 'configured'] and nodes[1].config == CONFIG.encode()
    # only the node seen running its config is a gate (nothing was applied, so nothing else was verified)
    assert [(gate['host'], gate['ok']) for gate in result['gates']] == [('w-3', True)]
    # a diff for each node with a change, headed by its name and address; secrets hidden
    assert len(result['diff']) == 2
    assert result['diff'][0]['before_header'] == 'w-1 (10.5.0.21:50000) (maintenance mode: no config)'
    assert result['diff'][0]['after_header'] == nodes[0].config_path and result['diff'][0]['after'].count('<hidden>') == 2
    assert result['diff'][1]['prepared'].startswith('--- w-2 (10.5.0.22:50000) (running config)\n+++ %s\n' % nodes[1].config_path)
    assert '+  network:' in result['diff'][1]['prepared']
    assert all('diff' not in node_result for node_result in result['nodes'].values())
    assert_no_secret(out, [TOKEN, SECRET, talosconfig[1]])


def test_the_nodes_are_applied_at_the_same_time(capsys, monkeypatch, talosconfig, tmp_path):
    """Every node is inside its real apply at once: the barrier breaks (an error) if they came one by one."""
    barrier = threading.Barrier(4, timeout=5)

    class BarrierNode(FakeNode):
        def apply_configuration(self, data, mode='auto', dry_run=False, try_timeout=None):
            if not dry_run:
                barrier.wait()
            return super().apply_configuration(data, mode=mode, dry_run=dry_run, try_timeout=try_timeout)

    nodes = []
    for index in range(4):
        node = BarrierNode('10.5.0.%d' % (21 + index), mode='maintenance', control_plane=False)
        node.inventory_name = 'w-%d' % index
        node.config_path = str(tmp_path / ('w-%d.yaml' % index))
        with open(node.config_path, 'w', encoding='utf-8') as handle:
            handle.write(CONFIG)
        nodes.append(node)
    FakeCluster(*nodes).install(monkeypatch)
    result, _out = run_module(talos_apply, capsys, **args(talosconfig, nodes, wait_timeout=10))
    assert 'failed' not in result, result.get('msg')
    assert [len(real_applies(node)) for node in nodes] == [1, 1, 1, 1] and not barrier.broken


def test_progress_names_the_nodes_still_waiting(capsys, monkeypatch, talosconfig, tmp_path):
    progress_file = tmp_path / 'progress.jsonl'
    monkeypatch.setenv('PROXTALOS_PROGRESS_FILE', str(progress_file))
    nodes = cluster_of(tmp_path, ('w-1', '10.5.0.21', 'maintenance', None, CONFIG), ('w-2', '10.5.0.22', 'maintenance', None, CONFIG))
    nodes[0].down_calls = 1
    nodes[1].down_calls = 30    # w-2 stays down after its install reboot for 30 probes
    FakeCluster(*nodes).install(monkeypatch)
    result, _out = run_module(talos_apply, capsys, **args(talosconfig, nodes, wait_sleep=0.02))
    assert 'failed' not in result, result.get('msg')
    lines = [json.loads(line) for line in progress_file.read_text().splitlines()]
    progress = [line['summary'] for line in lines if line['event'] == 'progress']
    assert any(summary.startswith('waiting for 1 of 2 nodes: w-2 (') and 'connection refused' in summary for summary in progress), progress
    assert all(summary.startswith('waiting for') for summary in progress)
    assert lines[-1]['event'] == 'end' and lines[-1]['ok'] is True and lines[-1]['summary'] == 'all 2 nodes run their config'


@pytest.mark.parametrize('extra, message', [
    ({'node': '10.5.0.21'}, 'Unsupported parameters for (basic.py) module: node.'),
    ({'config_path': '/tmp/x.yaml'}, 'Unsupported parameters for (basic.py) module: config_path.'),
    ({'nodes': []}, 'nodes: is empty'),
    ({'nodes': [{'name': 'w-1', 'address': '10.5.0.21', 'config_path': 'A'}, {'name': 'w-1', 'address': '10.5.0.22', 'config_path': 'A'}]},
     'nodes[1].name: node w-1 is listed twice'),
    ({'nodes': [{'name': 'w-1', 'address': '10.5.0.21'}]}, 'missing required arguments: config_path found in nodes'),
    ({'nodes': [{'name': 'w-1', 'address': '10.5.0.21', 'config_path': '/nonexistent/w-1.yaml'}]},
     'nodes[w-1].config_path: cannot read /nonexistent/w-1.yaml'),
])
def test_bad_nodes_are_refused_naming_the_field_before_anything_is_applied(capsys, monkeypatch, talosconfig, tmp_path, extra, message):
    nodes = cluster_of(tmp_path, ('w-1', '10.5.0.21', 'maintenance', None, CONFIG))
    FakeCluster(*nodes).install(monkeypatch)
    values = args(talosconfig, nodes)
    values.update(extra)
    result, _out = run_module(talos_apply, capsys, **values)
    assert result['failed'] is True and message in result['msg'], result['msg']
    assert 'nodes' not in result or not isinstance(result.get('nodes'), dict)
    assert nodes[0].calls == []


def test_a_configured_node_without_talosconfig_fails_alone(capsys, monkeypatch, talosconfig, tmp_path):
    nodes = cluster_of(tmp_path, ('w-1', '10.5.0.21', 'maintenance', None, CONFIG), ('w-2', '10.5.0.22', 'configured', CONFIG, CONFIG))
    FakeCluster(*nodes).install(monkeypatch)
    values = args(talosconfig, nodes)
    del values['talosconfig_content']
    values['talosconfig'] = str(tmp_path / 'talosconfig')
    # check mode: the maintenance node needs none; the configured one is named with the missing file
    result, _out = run_module(talos_apply, capsys, _ansible_check_mode=True, **values)
    assert result['failed'] is True and list(result['failed_nodes']) == ['w-2']
    assert 'w-2 (10.5.0.22:50000): talosconfig: is required (there is no file at %s yet)' % values['talosconfig'] in result['msg']
    assert result['nodes']['w-1']['changed'] is True and [real_applies(node) for node in nodes] == [[], []]
