"""talos_info against lab Talos nodes over the real protocol (grpclib, TLS/mTLS on port 50000).

The lab's nodes run in this process (lab.talos.testing.FleetHarness, instant timing); talos_info reaches every node
in one module run, each node on a thread of its own. Checked: nodes in maintenance mode and configured ones answer
the API gate in one run; a services gate with a node that does not answer, one whose kubelet waits (its own
healthy_services) and one still in maintenance mode fails naming exactly those three by inventory name and address,
each with its own reason, while the healthy node is reported as passing.
"""

import pytest

from ansible_collections.proxtalos.cluster.plugins.modules import talos_info
from ansible_collections.proxtalos.cluster.tests.helpers import run_module
from lab.talos import testing
from talos_lab_nodes import configure

RUNNING_SERVICES = ['apid', 'containerd']   # what runs on a configured node before any etcd bootstrap


@pytest.fixture(scope='module')
def lab():
    harness = testing.FleetHarness()
    yield harness
    harness.close()


@pytest.fixture(scope='module')
def secrets():
    return testing.ClusterSecrets(os_key_type='ecdsa')


def run(capsys, **options):
    return run_module(talos_info, capsys, **options)[0]


@pytest.fixture(scope='module')
def fleet(lab, secrets):
    nodes = dict((name, configure(lab, name, secrets)) for name in ('w-1', 'w-2', 'w-3'))
    nodes['w-4'] = lab.start('w-4')
    lab.wait(lambda: nodes['w-4'].mode == 'maintenance', what='w-4 in maintenance mode')
    return nodes


def items(fleet, names):
    return [{'name': name, 'address': fleet[name].address} for name in names]


def test_the_api_gate_passes_on_configured_and_maintenance_nodes_in_one_run(lab, fleet, secrets, capsys):
    result = run(capsys, nodes=items(fleet, ['w-1', 'w-2', 'w-3', 'w-4']), gather=[], gate_name='the Talos API answers',
                 talosconfig_content=secrets.talosconfig('lab'), wait_timeout=20, wait_sleep=0.05)
    assert 'failed' not in result, result.get('msg')
    assert dict((name, node['mode']) for name, node in result['nodes'].items()) == {
        'w-1': 'configured', 'w-2': 'configured', 'w-3': 'configured', 'w-4': 'maintenance'}
    assert [(gate['host'], gate['ok'], gate['target']) for gate in result['gates']] == [
        (name, True, '%s:50000' % fleet[name].address) for name in ('w-1', 'w-2', 'w-3', 'w-4')]


def test_the_services_gate_names_exactly_the_failing_nodes_with_their_reasons(lab, fleet, secrets, capsys):
    ready = run(capsys, nodes=items(fleet, ['w-1', 'w-2', 'w-3']), gather=['services', 'version'],
                healthy_services=RUNNING_SERVICES, gate_name='services', talosconfig_content=secrets.talosconfig('lab'),
                wait_timeout=20, wait_sleep=0.05)
    assert 'failed' not in ready, ready.get('msg')
    assert sorted(ready['report_facts_by_host']) == ['w-1', 'w-2', 'w-3']
    assert all(facts['talos_version'] == 'v1.13.9' and facts['talos_mode'] == 'configured'
               for facts in ready['report_facts_by_host'].values())

    # w-2 stops answering; w-3 must run its kubelet (which waits for the CRI on a control plane that etcd was never
    # bootstrapped on); w-4 is still in maintenance mode. w-1 is fine.
    nodes = items(fleet, ['w-1', 'w-2', 'w-3', 'w-4'])
    nodes[2]['healthy_services'] = ['apid', 'kubelet']
    lab.fault('talos-unreachable', 'w-2')
    try:
        result = run(capsys, nodes=nodes, gather=['services'], healthy_services=RUNNING_SERVICES, gate_name='services',
                     talosconfig_content=secrets.talosconfig('lab'), api_timeout=0.5, wait_timeout=2, wait_sleep=0.1)
    finally:
        lab.clear('talos-unreachable', 'w-2')
    address = dict((name, '%s:50000' % node.address) for name, node in fleet.items())
    assert result['failed'] is True and sorted(result['failed_nodes']) == ['w-2', 'w-3', 'w-4']
    message = result['msg']
    assert message.startswith('talos_info: 3 of 4 nodes failed: w-2 (%s): ' % address['w-2'])
    assert 'w-2 (%s): gave up after 2s waiting for the Talos API answering on port 50000' % address['w-2'] in message
    assert 'w-3 (%s): services not Running and healthy within 2s: kubelet is Waiting (last event: Waiting: ' \
        'Waiting for service "cri" to be "up"' % address['w-3'] in message
    assert 'w-4 (%s): services not Running and healthy within 2s: the node is in maintenance mode' % address['w-4'] in message
    assert 'w-1' not in message and address['w-1'] not in message
    assert [(gate['host'], gate['ok']) for gate in result['gates']] == [
        ('w-1', True), ('w-2', False), ('w-3', False), ('w-4', False)]
    assert list(result['report_facts_by_host']) == ['w-1']
    assert result['nodes']['w-3']['failing_services'][0]['service'] == 'kubelet'
    assert result['nodes']['w-4']['mode'] == 'maintenance'
