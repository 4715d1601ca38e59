"""talos_info: mode, services, etcd; the services gate names the failing service and its last event."""
import pytest

from ansible_collections.proxtalos.cluster.plugins.modules import talos_info

from talos_module_helpers import FakeCluster, FakeNode, make_talosconfig, run_module

CP_SERVICES = ['etcd', 'apid', 'trustd', 'kubelet', 'containerd']


@pytest.fixture(scope='module')
def talosconfig():
    return make_talosconfig()


def test_maintenance_node_without_credentials(capsys, monkeypatch):
    FakeCluster(FakeNode('10.5.0.21', mode='maintenance')).install(monkeypatch)
    result, _out = run_module(talos_info, capsys, node='10.5.0.21', gather=['version', 'services'])
    assert result['changed'] is False and result['mode'] == 'maintenance' and result['stage'] == 'maintenance'
    assert result['version']['tag'] == 'v1.13.9'
    assert [s['service'] for s in result['services']] == ['machined', 'apid', 'containerd']


def test_configured_node_without_credentials_gives_the_mode_only(capsys, monkeypatch):
    FakeCluster(FakeNode('10.5.0.21')).install(monkeypatch)
    result, _out = run_module(talos_info, capsys, node='10.5.0.21')
    assert result['mode'] == 'configured' and result['services'] == [] and result['version'] == {}


def test_gate_passes_and_reads_etcd(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.11')
    node.etcd_running = True
    node.members = [{'id': 255, 'hostname': 'cp-1', 'peer_urls': ['https://10.5.0.11:2380'], 'client_urls': [],
                     'is_learner': False}]
    FakeCluster(node).install(monkeypatch)
    result, out = run_module(talos_info, capsys, node='10.5.0.11', talosconfig_content=talosconfig[0],
                             healthy_services=CP_SERVICES, wait_timeout=1, wait_sleep=0.01)
    assert result['failing_services'] == [] and result['stage'] == 'running'
    assert result['etcd'] == {'members': [{'id': 'ff', 'hostname': 'cp-1', 'peer_urls': ['https://10.5.0.11:2380'],
                                           'client_urls': [], 'is_learner': False}], 'error': None}
    assert talosconfig[1].decode().splitlines()[1] not in out


def test_gate_fails_naming_service_state_and_last_event(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.21', control_plane=False)
    node.kubelet_waiting = True
    FakeCluster(node).install(monkeypatch)
    result, _out = run_module(talos_info, capsys, node='10.5.0.21', talosconfig_content=talosconfig[0],
                              healthy_services=['apid', 'kubelet', 'containerd'], wait_timeout=0.2, wait_sleep=0.01)
    assert result['failed'] is True and result['node'] == '10.5.0.21:50000'
    assert 'kubelet is Waiting' in result['msg'] and '/var/lib/kubelet' in result['msg']
    assert result['failing_services'][0]['service'] == 'kubelet'
    assert result['failing_services'][0]['last_event'].startswith('Waiting: Waiting for volume')
    assert result['attempts'] > 1


def test_gate_names_a_missing_service(capsys, monkeypatch, talosconfig):
    FakeCluster(FakeNode('10.5.0.21', control_plane=False)).install(monkeypatch)
    result, _out = run_module(talos_info, capsys, node='10.5.0.21', talosconfig_content=talosconfig[0],
                              healthy_services=['trustd'], wait=False)
    assert result['failed'] is True and 'trustd is missing' in result['msg']


def test_unreachable_node(capsys, monkeypatch):
    node = FakeNode('10.5.0.21')
    node.unreachable = True
    FakeCluster(node).install(monkeypatch)
    result, _out = run_module(talos_info, capsys, node='10.5.0.21', wait_timeout=0.1, wait_sleep=0.01)
    assert result['failed'] is True and '10.5.0.21:50000' in result['msg'] and 'port 50000' in result['msg']


def test_report_facts_say_what_was_read_in_plain_values(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.11')
    node.etcd_running = True
    node.members = [{'id': 255, 'hostname': 'cp-1', 'peer_urls': [], 'client_urls': [], 'is_learner': False}]
    FakeCluster(node).install(monkeypatch)
    result, _out = run_module(talos_info, capsys, node='10.5.0.11', talosconfig_content=talosconfig[0], _ansible_check_mode=True)
    facts = result['report_facts']
    assert result['changed'] is False
    assert (facts['talos_mode'], facts['talos_stage'], facts['talos_version']) == ('configured', 'running', 'v1.13.9')
    services = dict(item.rsplit(' ', 1) for item in facts['talos_services'].split(', '))
    assert services['kubelet'] == 'Running' and services['etcd'] == 'Running'
    assert list(services) == sorted(services)
    assert facts['talos_services_unhealthy'] == '' and facts['etcd_members'] == 1
    assert all(isinstance(value, (str, int)) for value in facts.values())


def test_report_facts_name_an_unhealthy_service_and_leave_out_what_was_not_read(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.21', control_plane=False)
    node.kubelet_waiting = True
    FakeCluster(node).install(monkeypatch)
    result, _out = run_module(talos_info, capsys, node='10.5.0.21', talosconfig_content=talosconfig[0], gather=['services'])
    facts = result['report_facts']
    assert 'talos_version' not in facts and 'etcd_members' not in facts
    assert 'kubelet Waiting' in facts['talos_services'] and facts['talos_services_unhealthy'] == 'kubelet'
    assert facts['talos_stage'] == 'booting'


def test_report_facts_do_not_call_a_service_without_health_check_unhealthy():
    services = [
        {'id': 'udevd', 'state': 'Running', 'health': {'unknown': True, 'healthy': False}},
        {'id': 'apid', 'state': 'Running', 'health': {'unknown': False, 'healthy': True}},
        {'id': 'etcd', 'state': 'Running', 'health': {'unknown': False, 'healthy': False}},
        {'id': 'kubelet', 'state': 'Preparing', 'health': {'unknown': True}},
    ]
    result = {'mode': 'configured', 'stage': 'booting', 'version': {}, 'etcd': {'members': [{'id': 'ff'}], 'error': 'no leader'}}
    facts = talos_info.report_facts(result, services)
    assert facts == {'talos_mode': 'configured', 'talos_stage': 'booting',
                     'talos_services': 'apid Running, etcd Running unhealthy, kubelet Preparing, udevd Running',
                     'talos_services_unhealthy': 'etcd, kubelet'}
