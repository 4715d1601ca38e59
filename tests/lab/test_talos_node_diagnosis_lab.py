"""talos_node_diagnosis against the lab's simulated Talos nodes (lab.talos.testing.FleetHarness: real grpclib
servers, mutual TLS, the talos-kubelet-volume fault)."""
import pytest
import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client
from ansible_collections.proxtalos.cluster.plugins.modules import talos_node_diagnosis as module
from ansible_collections.proxtalos.cluster.tests.helpers import assert_no_secret, run_module
from lab.talos import testing
from talos_lab_nodes import ENDPOINT


@pytest.fixture(scope='module')
def fleet():
    harness = testing.FleetHarness()
    secrets = testing.ClusterSecrets()
    control_plane = harness.start('cp-1')
    harness.wait(lambda: control_plane.mode == 'maintenance', what='cp-1 in maintenance mode')
    with client.TalosClient(control_plane.address, insecure=True, timeout=5) as talos:
        talos.apply_configuration(testing.render_config(secrets, 'controlplane', ENDPOINT))
    harness.wait(lambda: control_plane.mode == 'configured', what='cp-1 configured')
    harness.secrets = secrets
    harness.talosconfig = secrets.talosconfig('lab')
    yield harness
    harness.close()


def configure_worker(fleet, name, stuck):
    node = fleet.start(name)
    fleet.wait(lambda: node.mode == 'maintenance', what='%s in maintenance mode' % name)
    if stuck:
        fleet.fault('talos-kubelet-volume', name, p=0.0)
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        talos.apply_configuration(testing.render_config(fleet.secrets, 'worker', ENDPOINT))
    fleet.wait(lambda: node.mode == 'configured' and node.service('kubelet') is not None
               and node.service('kubelet').state in ('Waiting', 'Running'), what='%s configured' % name)
    return node


def module_args(fleet, node, **extra):
    args = dict(node=node.address, talosconfig_content=yaml.safe_dump(fleet.talosconfig), wait_timeout=20, wait_sleep=0.05)
    args.update(extra)
    return args


def test_the_module_names_the_volume_a_stuck_kubelet_waits_for_and_hides_the_client_key(fleet, capsys):
    node = configure_worker(fleet, 'w-stuck', stuck=True)
    fleet.wait(lambda: node.service('kubelet').state == 'Waiting' and 'volume' in node.service('kubelet').last_message,
               what='kubelet waiting for its volume')
    result, out = run_module(module, capsys, **module_args(fleet, node))
    assert result.get('failed') is not True and result['changed'] is False
    assert result['classification'] == 'waiting_on_volume' and result['volume'] == '/var/lib/kubelet'
    assert result['node'] == '%s:50000' % node.address
    assert 'Waiting for volume "/var/lib/kubelet" to be mounted' in result['evidence']
    key = fleet.talosconfig['contexts']['lab']['key']
    assert_no_secret(out, [key])

    failed, dummy = run_module(module, capsys, **module_args(fleet, node, wait_for='running', wait_timeout=0.3))
    assert failed['failed'] is True and failed['classification'] == 'waiting_on_volume'
    assert failed['msg'].startswith('talos node %s:50000: kubelet did not run within 0s; last seen: kubelet is Waiting: '
                                    'Waiting for volume "/var/lib/kubelet" to be mounted' % node.address)


def test_after_the_fault_clears_the_wait_ends_with_kubelet_running(fleet, capsys):
    node = configure_worker(fleet, 'w-heal', stuck=True)
    fleet.clear('talos-kubelet-volume', 'w-heal')
    result, dummy = run_module(module, capsys, **module_args(fleet, node, wait_for='running'))
    assert result.get('failed') is not True
    assert result['classification'] == 'running' and result['running'] is True


def test_a_healthy_worker_is_running_at_once_and_a_powered_off_one_is_unreachable(fleet, capsys):
    node = configure_worker(fleet, 'w-ok', stuck=False)
    result, dummy = run_module(module, capsys, **module_args(fleet, node, wait_for='running'))
    assert result['classification'] == 'running'
    fleet.stop('w-ok')
    gone, dummy = run_module(module, capsys, **module_args(fleet, node, api_timeout=1.0))
    assert gone.get('failed') is not True and gone['classification'] == 'unreachable' and gone['attempts'] == 1
    assert gone['evidence'].startswith('talos node %s:50000: does not answer' % node.address)


def test_a_node_in_maintenance_mode_is_reported_as_such(fleet, capsys):
    node = fleet.start('w-new')
    fleet.wait(lambda: node.mode == 'maintenance', what='w-new in maintenance mode')
    result, dummy = run_module(module, capsys, **module_args(fleet, node))
    assert result['classification'] == 'maintenance'
    assert 'answers only in maintenance mode' in result['evidence']


def test_the_multi_node_form_diagnoses_every_worker_in_one_run_and_does_not_fail_for_a_stuck_one(fleet, capsys):
    stuck = configure_worker(fleet, 'm-stuck', stuck=True)
    fleet.wait(lambda: 'volume' in stuck.service('kubelet').last_message, what='kubelet waiting for its volume')
    healthy = configure_worker(fleet, 'm-ok', stuck=False)
    gone = configure_worker(fleet, 'm-off', stuck=False)
    fleet.stop('m-off')
    nodes = [{'name': 'lab-w-1', 'address': stuck.address}, {'name': 'lab-w-2', 'address': healthy.address},
             {'name': 'lab-w-3', 'address': gone.address}]
    args = module_args(fleet, stuck, wait_for='running', wait_timeout=0.3, api_timeout=1.0)
    del args['node']
    result, out = run_module(module, capsys, nodes=nodes, **args)
    assert result.get('failed') is not True, result.get('msg')
    assert dict((name, found['classification']) for name, found in result['nodes'].items()) == {
        'lab-w-1': 'waiting_on_volume', 'lab-w-2': 'running', 'lab-w-3': 'unreachable'}
    assert result['nodes']['lab-w-1']['volume'] == '/var/lib/kubelet'
    assert result['nodes']['lab-w-2']['attempts'] == 1, 'a running kubelet is not read again'
    assert result['nodes_remediable'] == ['lab-w-1'] and result['nodes_not_running'] == ['lab-w-1', 'lab-w-3']
    assert 'lab-w-3 (%s:50000): kubelet did not run within 0s; last seen: does not answer' % gone.address in result['summary']
    assert_no_secret(out, [fleet.talosconfig['contexts']['lab']['key']])
    fleet.clear('talos-kubelet-volume', 'm-stuck')
    args['wait_timeout'] = 20
    healed, dummy = run_module(module, capsys, nodes=nodes[:2], **args)
    assert healed.get('failed') is not True and healed['nodes_running'] == ['lab-w-1', 'lab-w-2']
