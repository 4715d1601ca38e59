"""Day-two RPCs of the Talos client against the lab's nodes: EtcdSnapshot, EtcdRemoveMemberByID, EtcdLeaveCluster,
Reset and Upgrade (docs/lab-talos.md names the upstream lines each lab answer imitates).

One three-control-plane cluster per module (instant timing); the tests run in file order and each leaves the
cluster as the next one expects it, said in its docstring.
"""
import io

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client, errors
from ansible_collections.proxtalos.cluster.tests.helpers import wait_until
from lab.talos import etcd as lab_etcd
from lab.talos import testing
from talos_lab_nodes import configure


@pytest.fixture(scope='module')
def lab():
    harness = testing.FleetHarness()
    yield harness
    harness.close()


@pytest.fixture(scope='module')
def secrets():
    return testing.ClusterSecrets()


@pytest.fixture(scope='module')
def credentials(secrets):
    return client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab'))


def talos(node, credentials, timeout=5):
    return client.TalosClient(node.address, credentials=credentials, timeout=timeout)


def members(node, credentials):
    with talos(node, credentials) as api:
        return api.etcd_member_list()


def etcd_state(node, credentials):
    with talos(node, credentials) as api:
        item = dict((s['id'], s) for s in api.service_list())['etcd']
    return item['state'], item['healthy']


@pytest.fixture(scope='module')
def cluster(lab, secrets, credentials):
    """Three control planes with a promoted, running etcd each, and one worker."""
    nodes = [configure(lab, 'd2-cp-%d' % index, secrets) for index in (1, 2, 3)]
    with talos(nodes[0], credentials) as api:
        api.bootstrap()

    def all_voting_and_running():
        listed = members(nodes[0], credentials)
        states = [etcd_state(node, credentials) for node in nodes]
        return (len(listed) == 3 and not any(m['is_learner'] for m in listed)
                and all(state == ('Running', True) for state in states)), (listed, states)
    wait_until(all_voting_and_running, 'three running voting etcd members')
    worker = configure(lab, 'd2-w-1', secrets, machine_type='worker')
    return {'cps': nodes, 'worker': worker}


def test_etcd_snapshot_streams_the_nodes_etcd(lab, cluster, credentials, secrets):
    first = cluster['cps'][0]
    target = io.BytesIO()
    with talos(first, credentials) as api:
        written = api.etcd_snapshot(target)
    data = target.getvalue()
    assert written['size'] == len(data) > 1024   # more than one 1024-byte chunk (pkg/chunker/stream/stream.go:51)
    document = lab_etcd.read_snapshot(data)
    assert document['cluster_id'] == first.cluster_id
    assert sorted(m['hostname'] for m in document['members']) == sorted(n.hostname for n in cluster['cps'])
    with pytest.raises(ValueError):
        lab_etcd.read_snapshot(data[:-1] + bytes([data[-1] ^ 1]))

    reader = client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab', organizations=('os:reader',)))
    with talos(first, reader) as api:
        with pytest.raises(errors.TalosApiError) as info:
            api.etcd_snapshot(io.BytesIO())   # machined's rules: admin, operator, etcd:backup
        assert info.value.code == 'PERMISSION_DENIED'
    backup = client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab', organizations=('os:etcd:backup',)))
    with talos(first, backup) as api:
        assert api.etcd_snapshot(io.BytesIO())['size'] == len(data)
    with talos(cluster['worker'], credentials) as api:
        with pytest.raises(errors.TalosApiError) as info:
            api.etcd_snapshot(io.BytesIO())
        assert info.value.unimplemented
        assert info.value.talos_message == 'etcd snapshot is only available on control plane nodes'


def test_remove_member_by_id_refusals(cluster, credentials):
    """Leaves the three members in place."""
    first = cluster['cps'][0]
    with talos(first, credentials) as api:
        with pytest.raises(errors.TalosApiError) as info:
            api.etcd_remove_member_by_id(0x1234)
        assert info.value.code == 'NOT_FOUND'
        assert info.value.talos_message == 'failed to remove member %d: etcdserver: member not found' % 0x1234
    with talos(cluster['worker'], credentials) as api:
        with pytest.raises(errors.TalosApiError) as info:
            api.etcd_remove_member_by_id(0x1234)
        assert info.value.talos_message == 'etcd remove member is only available on control plane nodes'
    assert len(members(first, credentials)) == 3


def test_upgrade_checks(lab, cluster, credentials):
    """Refusals only: nothing is upgraded."""
    first = cluster['cps'][0]
    with talos(first, credentials) as api:
        with pytest.raises(errors.TalosApiError) as info:
            api.upgrade('ghcr.io/siderolabs/installer:latest')
        assert info.value.code == 'UNKNOWN'
        assert info.value.talos_message.startswith('error validating installer image "ghcr.io/siderolabs/installer:latest"')
    lab.fault('talos-etcd-unhealthy', cluster['cps'][2].name)
    try:
        with talos(first, credentials) as api:
            with pytest.raises(errors.TalosApiError) as info:
                api.upgrade('ghcr.io/siderolabs/installer:v1.13.9')
            # Client.ValidateForUpgrade (internal/pkg/etcd/etcd.go:95-121)
            assert info.value.talos_message.startswith('error validating etcd for upgrade: etcd member ')
            assert 'is not healthy; all members must be healthy to perform an upgrade' in info.value.talos_message
    finally:
        lab.clear('talos-etcd-unhealthy', cluster['cps'][2].name)
    wait_until(lambda: (etcd_state(cluster['cps'][2], credentials) == ('Running', True), 'etcd'), 'etcd healthy again')


def test_upgrade_reboots_into_the_new_version(lab, cluster, credentials):
    """A worker is upgraded to v1.13.10 (the lab serves any vX.Y.Z installer tag); the cluster is unchanged."""
    worker = cluster['worker']
    boots = worker.boot_count
    with talos(worker, credentials) as api:
        answer = api.upgrade('factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.13.10')
    assert answer['ack'] == 'Upgrade request received' and answer['actor_id']
    lab.wait(lambda: worker.boot_count == boots + 1 and worker.mode == 'configured', what='the worker back after its upgrade')

    def version():
        try:
            with talos(worker, credentials, timeout=2) as api:
                return True, api.version()['tag']
        except (errors.TalosTransientError, errors.TalosTlsError) as exc:
            return False, str(exc)
    assert wait_until(version, 'Version over mTLS after the upgrade') == 'v1.13.10'


def test_leave_cluster_then_graceful_reset(lab, cluster, credentials):
    """The third control plane leaves etcd and is reset into maintenance mode; two members stay."""
    first, dummy_second, third = cluster['cps']
    with talos(third, credentials) as api:
        assert api.etcd_leave_cluster() == {}
    assert sorted(m['hostname'] for m in members(first, credentials)) == sorted(n.hostname for n in cluster['cps'][:2])
    assert etcd_state(third, credentials) == ('Finished', False) and not third.disk.etcd_data
    with talos(third, credentials) as api:
        assert api.reset(graceful=True, reboot=True)['actor_id']   # nothing left to leave: the sequence goes on
    lab.wait(lambda: third.mode == 'maintenance', what='%s in maintenance mode after its reset' % third.name)
    assert third.disk.config is None and not third.disk.installed


def test_removal_that_would_lose_quorum_is_refused(lab, cluster, credentials):
    """Two members; the second one's etcd is down. Removing the first (the running one) is refused by etcd."""
    first, second = cluster['cps'][:2]
    lab.stop(second.name)
    ids = dict((m['hostname'], m['id']) for m in members(first, credentials))
    with talos(first, credentials) as api:
        with pytest.raises(errors.TalosApiError) as info:
            api.etcd_remove_member_by_id(ids[first.hostname])
    # etcd's mayRemoveMember (server.go:1640-1652): one of two members up, the removal would break quorum
    assert info.value.code == 'UNKNOWN'
    assert info.value.talos_message == 'failed to remove member: failed to remove member %d: etcdserver: unhealthy cluster' % (
        ids[first.hostname])
    # a member whose node is down may go (:1636)
    with talos(first, credentials) as api:
        assert api.etcd_remove_member_by_id(ids[second.hostname]) == {}
    assert [m['hostname'] for m in members(first, credentials)] == [first.hostname]


def test_graceful_reset_of_the_last_member_stops_at_the_leave_phase(lab, cluster, credentials):
    """The only member: Reset is acknowledged, its sequence stops at leave (etcd refuses), the node keeps running."""
    first = cluster['cps'][0]
    with talos(first, credentials) as api:
        assert api.reset(graceful=True, reboot=True)['actor_id']
    lab.wait(lambda: first.last_sequence_error is not None, what='the reset sequence of %s stopping' % first.name)
    assert first.last_sequence_error.endswith('etcdserver: re-configuration failed due to not enough started members')
    assert first.mode == 'configured' and first.disk.etcd_data
    assert etcd_state(first, credentials) == ('Running', True)


def test_reset_argument_checks(cluster, credentials):
    first = cluster['cps'][0]
    with talos(first, credentials) as api:
        with pytest.raises(errors.TalosApiError) as info:
            api.reset(wipe_mode='user-disks', system_partitions={'STATE': True})
        assert info.value.code == 'UNKNOWN' and info.value.talos_message == (
            "reset failed: invalid input, wipe mode USER_DISKS doesn't support SystemPartitionsToWipe parameter")
        with pytest.raises(errors.TalosApiError) as info:
            api.reset(wipe_mode='system-disk', user_disks=['/dev/sdb'])
        assert info.value.talos_message == (
            "reset failed: invalid input, wipe mode SYSTEM_DISK doesn't support UserDisksToWipe parameter")
        for device, text in (('/dev/sdz', "device /dev/sdz wasn't found"), ('/dev/sr0', 'device /dev/sr0 is readonly'),
                             ('/dev/sda', 'device /dev/sda is the system disk')):
            with pytest.raises(errors.TalosApiError) as info:
                api.reset(wipe_mode='user-disks', user_disks=[device])
            assert info.value.talos_message == 'reset user disk failed: %s' % text
