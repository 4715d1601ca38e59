"""talos_bootstrap: ask first, bootstrap the first control plane once, AlreadyExists is done, quorum wait."""
import pytest

from ansible_collections.proxtalos.cluster.plugins.modules import talos_bootstrap

from talos_module_helpers import FakeCluster, FakeNode, make_talosconfig, run_module

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


def test_inputs(capsys, monkeypatch, talosconfig):
    cluster(monkeypatch)
    result, _out = run_module(talos_bootstrap, capsys, **args(talosconfig, nodes=['10.5.0.11', '10.5.0.11']))
    assert result['failed'] is True and result['field'] == 'nodes'
    values = args(talosconfig)
    del values['talosconfig_content']
    result, _out = run_module(talos_bootstrap, capsys, **values)
    assert result['failed'] is True and result['field'] == 'talosconfig'
