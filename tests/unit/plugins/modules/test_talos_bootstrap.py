"""talos_bootstrap: ask first, bootstrap the first control plane once, AlreadyExists is done, quorum wait."""
import pytest

from ansible_collections.proxtalos.cluster.plugins.modules import talos_bootstrap

from ansible_collections.proxtalos.cluster.tests.helpers import run_module
from talos_module_helpers import FakeCluster, FakeNode, make_talosconfig

ADDRESSES = ['10.5.0.11', '10.5.0.12', '10.5.0.13']


@pytest.fixture(scope='module')
def talosconfig():
    return make_talosconfig(ADDRESSES)


def members():
    return [{'id': 16 + index, 'hostname': 'cp-%d' % index, 'peer_urls': ['https://%s:2380' % address],
             'client_urls': ['https://%s:2379' % address], 'is_learner': False}
            for index, address in enumerate(ADDRESSES, 1)]


def form_etcd(nodes, count=None):
    """etcd runs on the first `count` control planes (all by default), each listing that many members."""
    count = len(nodes) if count is None else count
    for node in nodes[:count]:
        node.etcd_running = True
        node.members = members()[:count]


def then_form_etcd(monkeypatch, nodes, count=None):
    """The first node's Bootstrap answers as FakeNode does, and etcd forms right after it."""
    original = FakeNode.bootstrap.__get__(nodes[0])

    def bootstrap():
        try:
            return original()
        finally:
            form_etcd(nodes, count)
    monkeypatch.setattr(nodes[0], 'bootstrap', bootstrap)


def cluster(monkeypatch):
    nodes = [FakeNode(address) for address in ADDRESSES]
    FakeCluster(*nodes).install(monkeypatch)
    return nodes


def bootstrap_calls(nodes):
    return [(node.host, call) for node in nodes for call in node.calls if call[0] == 'bootstrap-call']


def args(talosconfig, **extra):
    values = dict(nodes=ADDRESSES, talosconfig_content=talosconfig[0], wait_timeout=2, wait_sleep=0.01)
    values.update(extra)
    return values


def test_bootstraps_the_first_control_plane_once_and_waits_for_quorum(capsys, monkeypatch, talosconfig):
    nodes = cluster(monkeypatch)
    then_form_etcd(monkeypatch, nodes)
    checked, _out = run_module(talos_bootstrap, capsys, _ansible_check_mode=True, **args(talosconfig))
    assert checked['changed'] is True and checked['outcome'] == 'would_bootstrap' and bootstrap_calls(nodes) == []
    result, out = run_module(talos_bootstrap, capsys, **args(talosconfig))
    assert result['changed'] is True and result['outcome'] == 'bootstrapped'
    assert result['bootstrap_node'] == '10.5.0.11:50000' and result['quorum'] is True
    assert [member['hostname'] for member in result['members']] == ['cp-1', 'cp-2', 'cp-3']
    assert bootstrap_calls(nodes) == [('10.5.0.11', ('bootstrap-call', True))]
    assert talosconfig[1].decode().splitlines()[1] not in out

    again, _out = run_module(talos_bootstrap, capsys, **args(talosconfig))
    assert again['changed'] is False and again['outcome'] == 'already_bootstrapped' and again['bootstrap_node'] == ''
    assert len(bootstrap_calls(nodes)) == 1


def test_a_member_on_another_control_plane_means_done(capsys, monkeypatch, talosconfig):
    nodes = cluster(monkeypatch)
    nodes[2].etcd_running = True
    nodes[2].members = members()[2:]
    result, _out = run_module(talos_bootstrap, capsys, **args(talosconfig, wait=False))
    assert result['changed'] is False and result['outcome'] == 'already_bootstrapped'
    assert bootstrap_calls(nodes) == []
    assert any('10.5.0.13: etcd Running, 1 etcd members' == line for line in result['details'])


def test_already_exists_is_reported_ok(capsys, monkeypatch, talosconfig):
    nodes = cluster(monkeypatch)
    nodes[0].bootstrap_answer = 'already_exists'   # etcd forming: no member yet, but the data directory is not empty
    then_form_etcd(monkeypatch, nodes)
    result, _out = run_module(talos_bootstrap, capsys, **args(talosconfig))
    assert result['changed'] is False and result['outcome'] == 'already_exists' and result['quorum'] is True
    assert any('AlreadyExists' in line for line in result['details'])


def test_an_unreachable_control_plane_stops_the_bootstrap(capsys, monkeypatch, talosconfig):
    nodes = cluster(monkeypatch)
    nodes[1].unreachable = True
    result, _out = run_module(talos_bootstrap, capsys, **args(talosconfig, wait_timeout=0.2))
    assert result['failed'] is True and '10.5.0.12:50000' in result['msg']
    assert bootstrap_calls(nodes) == []


def test_quorum_timeout_names_what_is_missing(capsys, monkeypatch, talosconfig):
    nodes = cluster(monkeypatch)
    then_form_etcd(monkeypatch, nodes, count=2)
    result, _out = run_module(talos_bootstrap, capsys, **args(talosconfig, wait_timeout=0.3))
    assert result['failed'] is True and result['outcome'] == 'bootstrapped'
    assert 'etcd quorum not reached' in result['msg']
    assert '10.5.0.13: etcd is Preparing' in result['msg'] and 'expected 3' in result['msg']


def test_without_waiting_for_quorum_then_the_quorum_gate(capsys, monkeypatch, talosconfig):
    # site.yml: bootstrap the first control plane and go on (the API answers with one member); the quorum is the gate
    # of a later play, the same module waiting, which calls nothing on the bootstrapped cluster
    nodes = cluster(monkeypatch)
    then_form_etcd(monkeypatch, nodes, count=1)
    started, _out = run_module(talos_bootstrap, capsys, **args(talosconfig, wait_for_quorum=False, wait_timeout=0.3))
    assert started['changed'] is True and started['outcome'] == 'bootstrapped' and started['quorum'] is False
    assert started['members'] == []
    waiting, _out = run_module(talos_bootstrap, capsys, **args(talosconfig, wait_timeout=0.3))
    assert waiting['failed'] is True and waiting['outcome'] == 'already_bootstrapped'
    assert 'etcd quorum not reached' in waiting['msg'] and 'expected 3' in waiting['msg']
    form_etcd(nodes)
    gate, _out = run_module(talos_bootstrap, capsys, **args(talosconfig))
    assert gate['changed'] is False and gate['outcome'] == 'already_bootstrapped' and gate['quorum'] is True
    assert len(bootstrap_calls(nodes)) == 1


# What Talos records when etcd's PreFunc gives up joining after EtcdJoinTimeout (30 min): service_runner.go:279 wraps
# the error as "failed to run pre stage: ...", system.go:195-200 capitalises it (siderolabs/talos v1.13.9).
JOIN_TIMED_OUT = [('Waiting', 'Waiting for service "cri" to be "up", time sync, network, etcd spec'),
                  ('Preparing', 'Running pre state'),
                  ('Failed', 'Failed to run pre stage: failed to build initial etcd cluster: failed to build cluster '
                             'arguments: 1 error(s) occurred:\n\ttimeout')]


def test_a_fresh_cluster_whose_member_lists_end_at_the_deadline_is_bootstrapped(capsys, monkeypatch, talosconfig):
    # finding 1: before bootstrap EtcdMemberList ends DEADLINE_EXCEEDED (FakeNode), or UNKNOWN when the node knows no
    # control-plane endpoint (internal/pkg/etcd/endpoints.go:36-38); neither is an error nor a reason to wait
    nodes = cluster(monkeypatch)
    nodes[1].member_list_error = (2, 'no controlplane endpoints discovered yet')
    original = FakeNode.bootstrap.__get__(nodes[0])

    def bootstrap():
        original()
        nodes[1].member_list_error = None
        form_etcd(nodes)
    monkeypatch.setattr(nodes[0], 'bootstrap', bootstrap)
    result, _out = run_module(talos_bootstrap, capsys, **args(talosconfig))
    assert result.get('failed') is not True, result['msg']
    assert result['outcome'] == 'bootstrapped' and result['changed'] is True and result['quorum'] is True
    assert result['decision'].startswith('no control plane runs etcd')
    assert '10.5.0.11: etcd Preparing, no member list (DEADLINE_EXCEEDED)' in result['details']
    assert '10.5.0.12: etcd Preparing, no member list (UNKNOWN no controlplane endpoints discovered yet)' in result['details']
    assert bootstrap_calls(nodes) == [('10.5.0.11', ('bootstrap-call', True))]


def test_etcd_failed_after_the_join_timeout_is_still_bootstrapped(capsys, monkeypatch, talosconfig):
    # finding 2: a control plane never bootstrapped shows etcd Failed once its join timeout ran out; Bootstrap works
    # then (BootstrapEtcd stops and reloads the service, services/etcd.go:682-717)
    nodes = cluster(monkeypatch)
    for node in nodes:
        node.etcd_events = list(JOIN_TIMED_OUT)
    original = FakeNode.bootstrap.__get__(nodes[0])

    def bootstrap():
        original()
        for node in nodes:
            node.etcd_events = None
        form_etcd(nodes)
    monkeypatch.setattr(nodes[0], 'bootstrap', bootstrap)
    result, _out = run_module(talos_bootstrap, capsys, **args(talosconfig))
    assert result.get('failed') is not True, result['msg']
    assert result['outcome'] == 'bootstrapped' and result['quorum'] is True
    assert 'etcd Failed before it ever ran (Failed to run pre stage' in result['decision']
    assert len(bootstrap_calls(nodes)) == 1


def test_etcd_that_ran_this_boot_or_is_being_bootstrapped_means_done(capsys, monkeypatch, talosconfig):
    nodes = cluster(monkeypatch)
    nodes[1].etcd_events = [('Preparing', 'Running pre state'), ('Running', 'Started task etcd (PID 2467) for container etcd'),
                            ('Failed', 'Task etcd exited with 1')]
    result, _out = run_module(talos_bootstrap, capsys, **args(talosconfig, wait=False))
    assert result['outcome'] == 'already_bootstrapped' and result['changed'] is False
    assert result['decision'] == 'etcd found: 10.5.0.12 runs etcd (Failed)'
    # BootstrapEtcd marks the waiting etcd Finished "Bootstrap requested" (services/etcd.go:691) before restarting it
    nodes[1].etcd_events = [('Preparing', 'Running pre state'), ('Finished', 'Bootstrap requested')]
    result, _out = run_module(talos_bootstrap, capsys, **args(talosconfig, wait=False))
    assert result['outcome'] == 'already_bootstrapped' and 'a bootstrap is under way there' in result['decision']
    assert bootstrap_calls(nodes) == []


def test_an_etcd_failed_for_another_reason_is_not_guessed_at(capsys, monkeypatch, talosconfig):
    nodes = cluster(monkeypatch)
    nodes[2].etcd_events = [('Preparing', 'Running pre state'), ('Failed', 'Failed to run post stage: boom')]
    result, _out = run_module(talos_bootstrap, capsys, **args(talosconfig))
    assert result['failed'] is True and bootstrap_calls(nodes) == []
    assert 'cannot tell whether etcd was bootstrapped' in result['msg'] and '10.5.0.13: etcd Failed' in result['msg']


def test_inputs(capsys, monkeypatch, talosconfig):
    cluster(monkeypatch)
    result, _out = run_module(talos_bootstrap, capsys, **args(talosconfig, nodes=['10.5.0.11', '10.5.0.11']))
    assert result['failed'] is True and result['field'] == 'nodes'
    values = args(talosconfig)
    del values['talosconfig_content']
    result, _out = run_module(talos_bootstrap, capsys, **values)
    assert result['failed'] is True and result['field'] == 'talosconfig'
