"""talos_bootstrap against lab Talos control planes over the real protocol (grpclib, mTLS on port 50000).

What the lab's nodes answer here imitates siderolabs/talos v1.13.9 (docs/lab-talos.md): EtcdMemberList blocks until
the caller's deadline while no etcd member runs, UNKNOWN with no control-plane endpoint known; etcd Failed once the
join timeout ran out; Bootstrap refused only by the node's own etcd data, so a second bootstrap on an empty control
plane splits etcd. Checked: the module bootstraps a fresh cluster once (it waited until its timeout before), a cluster
whose etcd sits Failed after the join timeout too, and it never calls Bootstrap a second time.
"""
import time

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.modules import talos_bootstrap
from ansible_collections.proxtalos.cluster.tests.helpers import run_module
from lab.talos import testing
from talos_lab_nodes import configure


@pytest.fixture()
def lab():
    harness = testing.FleetHarness()
    yield harness
    harness.close()


def run(capsys, **options):
    return run_module(talos_bootstrap, capsys, **options)[0]


def control_planes(lab, secrets, count):
    return [configure(lab, 'cp-%d' % index, secrets) for index in range(1, count + 1)]


def admin(node, secrets, timeout=5):
    return client.TalosClient(node.address, credentials=client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab')),
                              timeout=timeout)


def bootstrap_requests(lab):
    return [entry['node'] for entry in lab.fleet.requests if entry['method'].endswith('/Bootstrap') and entry['code'] == 'OK']


def etcd_state(node):
    return node.service('etcd').state if node.service('etcd') is not None else None


def test_member_list_before_bootstrap_waits_for_the_deadline_or_knows_no_endpoint(lab):
    secrets = testing.ClusterSecrets(os_key_type='ecdsa')
    node, = control_planes(lab, secrets, 1)
    with admin(node, secrets, timeout=1) as talos:
        started = time.monotonic()
        with pytest.raises(talos_errors.TalosTransientError) as waited:
            talos.etcd_member_list()
        assert waited.value.code == 'DEADLINE_EXCEEDED' and time.monotonic() - started >= 0.9
    lab.fault('talos-no-etcd-endpoints', 'cp-1')
    with admin(node, secrets) as talos:
        with pytest.raises(talos_errors.TalosApiError) as unknown:
            talos.etcd_member_list()
    assert unknown.value.code == 'UNKNOWN' and unknown.value.talos_message == 'no controlplane endpoints discovered yet'


def test_a_fresh_cluster_is_bootstrapped_once(lab, capsys):
    secrets = testing.ClusterSecrets(os_key_type='ecdsa')
    nodes = control_planes(lab, secrets, 3)
    options = dict(nodes=[node.address for node in nodes], talosconfig_content=secrets.talosconfig('lab'),
                   wait_timeout=30, wait_sleep=0.05, api_timeout=10)
    result = run(capsys, **options)
    assert 'failed' not in result, result.get('msg')
    assert result['outcome'] == 'bootstrapped' and result['changed'] is True and result['quorum'] is True
    assert result['bootstrap_node'] == '%s:50000' % nodes[0].address
    assert result['decision'].startswith('no control plane runs etcd')
    assert len(result['members']) == 3
    again = run(capsys, **options)
    assert again['outcome'] == 'already_bootstrapped' and again['changed'] is False
    assert again['decision'].startswith('etcd found: ')
    assert bootstrap_requests(lab) == ['cp-1']


def test_etcd_failed_after_the_join_timeout_is_bootstrapped_and_a_second_bootstrap_would_split(lab, capsys):
    secrets = testing.ClusterSecrets(os_key_type='ecdsa')
    nodes = control_planes(lab, secrets, 2)
    for node in nodes:
        lab.fault('talos-etcd-join-timeout', node.name)
    lab.wait(lambda: all(etcd_state(node) == 'Failed' for node in nodes), what='etcd Failed on both control planes')
    assert nodes[0].service('etcd').last_message.startswith('Failed to run pre stage: ')

    result = run(capsys, nodes=[nodes[0].address, nodes[1].address], talosconfig_content=secrets.talosconfig('lab'),
                 wait_for_quorum=False, wait_timeout=30, wait_sleep=0.05, api_timeout=10)
    assert 'failed' not in result, result.get('msg')
    assert result['outcome'] == 'bootstrapped' and 'etcd Failed before it ever ran' in result['decision']
    lab.wait(lambda: etcd_state(nodes[0]) == 'Running', what='etcd running on cp-1')
    # cp-2's etcd stays Failed (nothing restarts it): its data directory is empty, so Talos accepts a Bootstrap
    # there too and a second etcd cluster forms - what the module must never do.
    assert etcd_state(nodes[1]) == 'Failed'
    with admin(nodes[1], secrets) as talos:
        talos.bootstrap()
    lab.wait(lambda: etcd_state(nodes[1]) == 'Running', what='a second etcd on cp-2')
    with admin(nodes[0], secrets) as first, admin(nodes[1], secrets) as second:
        assert [member['hostname'] for member in first.etcd_member_list()] == [nodes[0].hostname]
        assert [member['hostname'] for member in second.etcd_member_list()] == [nodes[1].hostname]
        with pytest.raises(talos_errors.TalosApiError) as refused:
            first.bootstrap()
    assert refused.value.already_exists
    assert bootstrap_requests(lab) == ['cp-1', 'cp-2']


def test_a_joining_control_plane_is_a_learner_without_a_name_until_promoted(capsys):
    # audit finding 13: MemberAddAsLearner, the name empty until the member starts, MemberPromote later
    # (services/etcd.go:286-325, 604-647); realistic timing at a small scale so the steps can be seen
    lab = testing.FleetHarness(profile='realistic', scale=0.05)
    try:
        secrets = testing.ClusterSecrets(os_key_type='ecdsa')
        nodes = control_planes(lab, secrets, 2)
        with admin(nodes[0], secrets) as talos:
            talos.bootstrap()
        cluster = lab.fleet.etcd_cluster(nodes[0].cluster_id)

        def learner():
            member = cluster.member_for(nodes[1].key)
            return member is not None and member.is_learner
        lab.wait(learner, what='cp-2 added as a learner')
        member = cluster.member_for(nodes[1].key)
        assert member.hostname == '' and etcd_state(nodes[1]) != 'Running'
        result = run(capsys, nodes=[node.address for node in nodes], talosconfig_content=secrets.talosconfig('lab'),
                     wait_timeout=60, wait_sleep=0.05, api_timeout=10)
        assert 'failed' not in result, result.get('msg')
        assert result['outcome'] == 'already_bootstrapped' and result['quorum'] is True
        assert sorted(m['hostname'] for m in result['members']) == sorted(node.hostname for node in nodes)
        assert not any(m['is_learner'] for m in result['members'])
        kinds = [record['kind'] for record in lab.call(lab.timing.query, target='cp-2')]
        assert kinds.index('etcd_join') < kinds.index('etcd_promote')
    finally:
        lab.close()
