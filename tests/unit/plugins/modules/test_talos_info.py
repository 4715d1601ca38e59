"""talos_info: mode, services, etcd; the services gate names the failing service and its last event."""
import pytest
import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.modules import talos_info

from ansible_collections.proxtalos.cluster.tests.helpers import run_module
from talos_module_helpers import FakeCluster, FakeNode, make_talosconfig

CP_SERVICES = ['etcd', 'apid', 'trustd', 'kubelet', 'containerd']


@pytest.fixture(scope='module')
def talosconfig():
    return make_talosconfig()


def probe(capsys, address, **args):
    """One node (a one-element nodes list, named n-1): the module result and that node's own result."""
    result, out = run_module(talos_info, capsys, nodes=[{'name': 'n-1', 'address': address}], **args)
    return result, result.get('nodes', {}).get('n-1'), out


def test_maintenance_node_without_credentials(capsys, monkeypatch):
    FakeCluster(FakeNode('10.5.0.21', mode='maintenance')).install(monkeypatch)
    result, node_result, _out = probe(capsys, '10.5.0.21', gather=['version', 'services'])
    assert result['changed'] is False and node_result['mode'] == 'maintenance' and node_result['stage'] == 'maintenance'
    assert node_result['version']['tag'] == 'v1.13.9'
    assert [s['service'] for s in node_result['services']] == ['machined', 'apid', 'containerd']


def test_maintenance_node_of_talos_1_12_without_service_list(capsys, monkeypatch):
    # audit finding 8: v1.12's maintenance server implements only ApplyConfiguration, Generate*, Version, Upgrade,
    # Reset and Meta* (siderolabs/talos v1.12.11 internal/app/maintenance/server.go): ServiceList is Unimplemented
    node = FakeNode('10.5.0.21', mode='maintenance')

    def unimplemented(*dummy):
        raise talos_errors.from_status(node.name, '/machine.MachineService/ServiceList', 12, 'unknown method ServiceList')
    node.service_list = unimplemented
    FakeCluster(node).install(monkeypatch)
    result, node_result, _out = probe(capsys, '10.5.0.21', gather=['version', 'services'])
    assert result.get('failed') is not True, result.get('msg')
    assert node_result['mode'] == 'maintenance' and node_result['stage'] == 'maintenance' and node_result['services'] == []


def test_configured_node_without_credentials_gives_the_mode_only(capsys, monkeypatch):
    FakeCluster(FakeNode('10.5.0.21')).install(monkeypatch)
    result, node_result, _out = probe(capsys, '10.5.0.21')
    assert node_result['mode'] == 'configured' and node_result['services'] == [] and node_result['version'] == {}


def test_gate_passes_and_reads_etcd(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.11')
    node.etcd_running = True
    node.members = [{'id': 255, 'hostname': 'cp-1', 'peer_urls': ['https://10.5.0.11:2380'], 'client_urls': [],
                     'is_learner': False}]
    FakeCluster(node).install(monkeypatch)
    result, node_result, out = probe(capsys, '10.5.0.11', talosconfig_content=talosconfig[0],
                                     healthy_services=CP_SERVICES, wait_timeout=1, wait_sleep=0.01)
    assert node_result['failing_services'] == [] and node_result['stage'] == 'running'
    assert node_result['etcd'] == {'members': [{'id': 'ff', 'hostname': 'cp-1', 'peer_urls': ['https://10.5.0.11:2380'],
                                                'client_urls': [], 'is_learner': False}], 'error': None}
    assert talosconfig[1].decode().splitlines()[1] not in out


def test_gate_fails_naming_service_state_and_last_event(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.21', control_plane=False)
    node.kubelet_waiting = True
    FakeCluster(node).install(monkeypatch)
    result, node_result, _out = probe(capsys, '10.5.0.21', talosconfig_content=talosconfig[0],
                                      healthy_services=['apid', 'kubelet', 'containerd'], wait_timeout=0.2, wait_sleep=0.01,
                                      gate_name='services')
    assert result['failed'] is True and node_result['node'] == '10.5.0.21:50000'
    assert 'n-1 (10.5.0.21:50000)' in result['msg'] and result['failed_nodes']['n-1'].startswith('n-1 (10.5.0.21:50000)')
    assert 'kubelet is Waiting' in result['msg'] and '/var/lib/kubelet' in result['msg']
    assert node_result['failing_services'][0]['service'] == 'kubelet'
    assert node_result['failing_services'][0]['last_event'].startswith('Waiting: Waiting for volume')
    assert result['gates'][0]['ok'] is False and result['gates'][0]['attempts'] > 1


def test_gate_names_a_missing_service(capsys, monkeypatch, talosconfig):
    FakeCluster(FakeNode('10.5.0.21', control_plane=False)).install(monkeypatch)
    result, node_result, _out = probe(capsys, '10.5.0.21', talosconfig_content=talosconfig[0],
                                      healthy_services=['trustd'], wait=False)
    assert result['failed'] is True and 'trustd is missing' in result['msg']


def test_unreachable_node(capsys, monkeypatch):
    node = FakeNode('10.5.0.21')
    node.unreachable = True
    FakeCluster(node).install(monkeypatch)
    result, node_result, _out = probe(capsys, '10.5.0.21', wait_timeout=0.1, wait_sleep=0.01)
    assert result['failed'] is True and '10.5.0.21:50000' in result['msg'] and 'port 50000' in result['msg']


def test_report_facts_say_what_was_read_in_plain_values(capsys, monkeypatch, talosconfig):
    node = FakeNode('10.5.0.11')
    node.etcd_running = True
    node.members = [{'id': 255, 'hostname': 'cp-1', 'peer_urls': [], 'client_urls': [], 'is_learner': False}]
    FakeCluster(node).install(monkeypatch)
    result, node_result, _out = probe(capsys, '10.5.0.11', talosconfig_content=talosconfig[0], _ansible_check_mode=True)
    facts = node_result['report_facts']
    assert result['changed'] is False and result['report_facts_by_host'] == {'n-1': facts}
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
    result, node_result, _out = probe(capsys, '10.5.0.21', talosconfig_content=talosconfig[0], gather=['services'])
    facts = node_result['report_facts']
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


# ---------------------------------------------------------------------------------------------------------
# The multi-node form (option nodes): every node probed at once in one run.

import json  # noqa: E402
import threading  # noqa: E402

W_SERVICES = ['apid', 'kubelet', 'containerd']


def cluster_of(*specs):
    """FakeNodes named by inventory host: specs are (name, address, control_plane)."""
    nodes = []
    for name, address, control_plane in specs:
        node = FakeNode(address, control_plane=control_plane)
        node.etcd_running = control_plane
        node.inventory_name = name
        nodes.append(node)
    return nodes


def node_items(nodes, **per_node):
    return [dict({'name': node.inventory_name, 'address': node.host}, **per_node) for node in nodes]


def test_every_node_passes_one_result_per_node_with_gates_and_report_facts(capsys, monkeypatch, talosconfig):
    nodes = cluster_of(('cp-1', '10.5.0.11', True), ('w-1', '10.5.0.21', False), ('w-2', '10.5.0.22', False))
    FakeCluster(*nodes).install(monkeypatch)
    items = [dict(node_items(nodes[:1])[0], healthy_services=CP_SERVICES)] + node_items(nodes[1:])
    result, out = run_module(talos_info, capsys, nodes=items, talosconfig_content=talosconfig[0], gather=['services', 'version'],
                             healthy_services=W_SERVICES, gate_name='Talos services Running and healthy',
                             wait_timeout=1, wait_sleep=0.01)
    assert result['changed'] is False and 'failed' not in result and result['failed_nodes'] == {}
    assert sorted(result['nodes']) == ['cp-1', 'w-1', 'w-2']
    assert result['nodes']['w-2']['node'] == '10.5.0.22:50000' and result['nodes']['w-2']['stage'] == 'running'
    assert result['nodes']['cp-1']['version']['tag'] == 'v1.13.9'
    # each node checked its own services: the control plane etcd and trustd, the workers not
    assert [call for call in nodes[0].calls if call[0] == 'service_list'] and 'etcd Running' in \
        result['report_facts_by_host']['cp-1']['talos_services']
    assert [(gate['host'], gate['ok'], gate['target']) for gate in result['gates']] == [
        ('cp-1', True, '10.5.0.11:50000'), ('w-1', True, '10.5.0.21:50000'), ('w-2', True, '10.5.0.22:50000')]
    assert result['gates'][0]['observation'] == 'all of %s Running and healthy' % ', '.join(CP_SERVICES)
    assert all(gate['name'] == 'Talos services Running and healthy' and gate['attempts'] >= 2 for gate in result['gates'])
    assert sorted(result['report_facts_by_host']) == ['cp-1', 'w-1', 'w-2']
    assert result['report_facts_by_host']['w-1'] == result['nodes']['w-1']['report_facts']
    assert 'etcd_members' not in result['report_facts_by_host']['cp-1']   # etcd not gathered
    assert 'single' not in out and talosconfig[1].decode().splitlines()[1] not in out


def test_one_failing_node_among_passing_ones_is_named_alone(capsys, monkeypatch, talosconfig):
    nodes = cluster_of(('cp-1', '10.5.0.11', True), ('w-1', '10.5.0.21', False), ('w-2', '10.5.0.22', False),
                       ('w-3', '10.5.0.23', False))
    nodes[2].kubelet_waiting = True
    FakeCluster(*nodes).install(monkeypatch)
    result, _out = run_module(talos_info, capsys, nodes=node_items(nodes), talosconfig_content=talosconfig[0],
                              gather=['services'], healthy_services=W_SERVICES, gate_name='services',
                              wait_timeout=0.3, wait_sleep=0.01)
    assert result['failed'] is True
    assert result['msg'].startswith('talos_info: 1 of 4 nodes failed: w-2 (10.5.0.22:50000): services not Running and '
                                    'healthy within 0.3s: kubelet is Waiting')
    assert '/var/lib/kubelet' in result['msg']
    for other in ('cp-1', 'w-1', 'w-3', '10.5.0.11', '10.5.0.21', '10.5.0.23'):
        assert other not in result['msg']
    assert list(result['failed_nodes']) == ['w-2'] and 'kubelet is Waiting' in result['failed_nodes']['w-2']
    # the passing nodes are still reported: their results, gates and report facts
    assert sorted(result['report_facts_by_host']) == ['cp-1', 'w-1', 'w-3']
    assert [(gate['host'], gate['ok']) for gate in result['gates']] == [
        ('cp-1', True), ('w-1', True), ('w-2', False), ('w-3', True)]
    failing = result['gates'][2]
    assert failing['target'] == '10.5.0.22:50000' and failing['attempts'] > 1
    assert failing['diagnosis'][0].startswith('kubelet is Waiting (last event: Waiting: Waiting for volume')
    assert result['nodes']['w-2']['failing_services'][0]['service'] == 'kubelet'
    assert result['nodes']['w-2']['report_facts'] == {} and result['nodes']['w-2']['mode'] == 'configured'


def test_every_failing_node_is_named_with_its_own_reason(capsys, monkeypatch, talosconfig):
    nodes = cluster_of(('cp-1', '10.5.0.11', True), ('w-1', '10.5.0.21', False), ('w-2', '10.5.0.22', False))
    nodes[0].unreachable = True
    nodes[2].kubelet_waiting = True
    FakeCluster(*nodes).install(monkeypatch)
    result, _out = run_module(talos_info, capsys, nodes=node_items(nodes), talosconfig_content=talosconfig[0],
                              gather=[], healthy_services=W_SERVICES, gate_name='services', wait_timeout=0.2, wait_sleep=0.01)
    assert result['failed'] is True and result['msg'].startswith('talos_info: 2 of 3 nodes failed: ')
    assert 'cp-1 (10.5.0.11:50000): gave up after 0.2s waiting for the Talos API answering on port 50000' in result['msg']
    assert 'w-2 (10.5.0.22:50000): services not Running and healthy' in result['msg']
    assert result['msg'].index('cp-1 (') < result['msg'].index('w-2 (')   # in the order of the nodes option
    assert 'w-1' not in result['msg'] and sorted(result['failed_nodes']) == ['cp-1', 'w-2']
    assert [gate['ok'] for gate in result['gates']] == [False, True, False]
    assert result['nodes']['cp-1']['mode'] == '' and result['nodes']['cp-1']['node'] == '10.5.0.11:50000'


class BlockingNode(FakeNode):
    """A node whose service list answers only once `release` is set (or after `patience` seconds)."""

    def __init__(self, host, release, patience=5.0, **kwargs):
        super().__init__(host, **kwargs)
        self.release = release
        self.patience = patience
        self.released = None

    def service_list(self):
        self.released = self.release.wait(self.patience)
        return super().service_list()


def test_a_slow_node_does_not_delay_the_others_probes(capsys, monkeypatch, talosconfig):
    others_read = threading.Event()
    read = []
    lock = threading.Lock()

    class CountedNode(FakeNode):
        def version(self):
            with lock:
                read.append(self.host)
                if len(read) == 3:
                    others_read.set()
            return super().version()

    slow = BlockingNode('10.5.0.11', others_read)   # first in the list: a run one node after another would wait here
    slow.inventory_name = 'cp-1'
    fast = []
    for index in range(3):
        node = CountedNode('10.5.0.2%d' % (index + 1), control_plane=False)
        node.inventory_name = 'w-%d' % (index + 1)
        fast.append(node)
    FakeCluster(slow, *fast).install(monkeypatch)
    result, _out = run_module(talos_info, capsys, nodes=node_items([slow] + fast), talosconfig_content=talosconfig[0],
                              gather=['services', 'version'], gate_name='read', wait_timeout=30, wait_sleep=0.01)
    assert 'failed' not in result, result['msg']
    # the slow node's service list was answered only after the three others had read their versions (their last read)
    assert slow.released is True
    assert sorted(read) == ['10.5.0.21', '10.5.0.22', '10.5.0.23']
    assert result['nodes']['cp-1']['elapsed'] >= max(result['nodes'][name]['elapsed'] for name in ('w-1', 'w-2', 'w-3'))
    # each node's gate spans its own check: one start for all, the slow node's end after every other node's
    gates = dict((gate['host'], gate) for gate in result['gates'])
    assert len(set(gate['started_at'] for gate in gates.values())) == 1
    assert all(gate['started_at'] <= gate['ended_at'] <= gates['cp-1']['ended_at'] for gate in gates.values())


def test_the_nodes_wait_at_the_same_time(capsys, monkeypatch):
    """Every node is inside its mode probe at once: the barrier breaks (an error) if they came one by one."""
    barrier = threading.Barrier(4, timeout=5)

    class BarrierNode(FakeNode):
        def probe_mode(self):
            barrier.wait()
            return super().probe_mode()

    nodes = [BarrierNode('10.5.0.%d' % (21 + index), control_plane=False) for index in range(4)]
    for index, node in enumerate(nodes):
        node.inventory_name = 'w-%d' % index
    FakeCluster(*nodes).install(monkeypatch)
    result, _out = run_module(talos_info, capsys, nodes=node_items(nodes), gather=[], gate_name='api', wait_timeout=10,
                              wait_sleep=0.01)
    assert 'failed' not in result and [gate['observation'] for gate in result['gates']] == ['answers (configured)'] * 4


def test_progress_names_the_nodes_still_not_ready(capsys, monkeypatch, talosconfig, tmp_path):
    progress_file = tmp_path / 'progress.jsonl'
    monkeypatch.setenv('PROXTALOS_PROGRESS_FILE', str(progress_file))

    class LateKubelet(FakeNode):
        """kubelet waits for its volume for the first `late` service lists."""
        late = 3

        def service_list(self):
            self.kubelet_waiting = self.late > 0
            self.late -= 1
            return super().service_list()

    late = LateKubelet('10.5.0.22', control_plane=False)
    late.inventory_name = 'w-2'
    ready = cluster_of(('w-1', '10.5.0.21', False))
    FakeCluster(ready[0], late).install(monkeypatch)
    result, _out = run_module(talos_info, capsys, nodes=node_items([ready[0], late]), talosconfig_content=talosconfig[0],
                              gather=[], healthy_services=W_SERVICES, wait_timeout=5, wait_sleep=0.01)
    assert 'failed' not in result
    lines = [json.loads(line) for line in progress_file.read_text().splitlines()]
    progress = [line['summary'] for line in lines if line['event'] == 'progress']
    assert progress and all(summary.startswith('waiting for 1 of 2 nodes: w-2 (kubelet is Waiting') for summary in progress)
    assert all('w-1' not in summary for summary in progress)
    assert lines[-1]['event'] == 'end' and lines[-1]['ok'] is True and lines[-1]['summary'] == 'all 2 nodes passed'


def test_without_gate_name_there_are_no_gates_and_check_mode_reads(capsys, monkeypatch, talosconfig):
    nodes = cluster_of(('cp-1', '10.5.0.11', True), ('w-1', '10.5.0.21', False))
    nodes[0].members = [{'id': 255, 'hostname': 'cp-1', 'peer_urls': [], 'client_urls': [], 'is_learner': False}]
    FakeCluster(*nodes).install(monkeypatch)
    items = [dict(node_items(nodes[:1])[0], gather=['version', 'services', 'etcd'])] + node_items(nodes[1:])
    result, _out = run_module(talos_info, capsys, nodes=items, talosconfig_content=talosconfig[0], gather=['version', 'services'],
                              _ansible_check_mode=True)
    assert result['changed'] is False and result['gates'] == []
    assert result['report_facts_by_host']['cp-1']['etcd_members'] == 1
    assert 'etcd_members' not in result['report_facts_by_host']['w-1']
    assert [call for call in nodes[1].calls if call[0] == 'etcd_member_list'] == []


@pytest.mark.parametrize('args, message', [
    ({'node': '10.5.0.21', 'nodes': [{'name': 'w-1', 'address': '10.5.0.21'}]}, 'Unsupported parameters'),
    ({}, 'missing required arguments: nodes'),
    ({'nodes': []}, 'nodes: is empty'),
    ({'nodes': [{'name': 'w-1', 'address': '10.5.0.21'}, {'name': 'w-1', 'address': '10.5.0.22'}]},
     'nodes[1].name: node w-1 is listed twice'),
    ({'nodes': [{'name': 'w-1'}]}, 'missing required arguments: address found in nodes'),
    ({'nodes': [{'name': 'w-1', 'address': '10.5.0.21', 'gather': ['disks']}]}, 'gather'),
])
def test_bad_nodes_are_refused_naming_the_field(capsys, monkeypatch, args, message):
    FakeCluster(FakeNode('10.5.0.21')).install(monkeypatch)
    result, _out = run_module(talos_info, capsys, **args)
    assert result['failed'] is True and message in result['msg'], result['msg']


PROBED_ONLY = ('nodes', 'gates', 'report_facts_by_host', 'failed_nodes')


@pytest.mark.parametrize('args', [
    {'nodes': [{'name': 'w-1', 'address': '10.5.0.21'}, {'name': 'w-1', 'address': '10.5.0.22'}]},
    {'nodes': [{'name': 'w-1', 'address': '10.5.0.21'}], 'talosconfig_content': 'context: [not a talosconfig'},
], ids=['bad-nodes-list', 'talosconfig-does-not-load'])
def test_a_run_that_fails_before_probing_returns_no_node_results_as_documented(capsys, monkeypatch, args):
    FakeCluster(FakeNode('10.5.0.21')).install(monkeypatch)
    result, _out = run_module(talos_info, capsys, gather=['services'], **args)
    assert result['failed'] is True, result
    assert [key for key in PROBED_ONLY if key in result] == []
    # The RETURN documentation says so (it once claimed them for every run with nodes).
    documented = yaml.safe_load(talos_info.RETURN)
    for key in PROBED_ONLY:
        assert documented[key]['returned'] == 'once the nodes are probed', key
    assert 'before any node is probed' in ' '.join(documented['failed_nodes']['description'])
