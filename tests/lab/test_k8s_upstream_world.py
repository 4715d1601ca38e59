"""The upstream control plane inside the World (opt-in extension lab.k8s_upstream): no API before etcd is bootstrapped,
then kube-apiserver on the control-plane endpoint trusts the kubeconfig the Talos Kubeconfig RPC returns, kubelets
register kwok Nodes with Talos's labels and taints, and `lab status` names each process with its health."""

import json
import os

import pytest
from proxmoxer import ProxmoxAPI


from lab.cli import render_status
from lab.k8s_upstream.lab import node_taints
from lab.talos.node import TALOS_VERSION
from lab.testing import free_net, world_in_thread
# tests/lab is on sys.path under pytest (rootdir-less test modules): the same cluster bring-up as the lab.k8s tests
from test_k8s_world import (_api_server_image_to_v1_36_4, _cluster_up, _ok, _static_pod_images,
                            _worker_kubelet_to_v1_36_4, wait_until)  # pylint: disable=import-error

pytestmark = pytest.mark.upstream
kubernetes = pytest.importorskip('kubernetes')
from kubernetes import client as kube_client  # noqa: E402  pylint: disable=wrong-import-position


def test_cluster_bootstrap_starts_the_upstream_control_plane_and_kubelets_register_kwok_nodes(tmp_path):
    with world_in_thread(tmp_path / 'run', free_net(), extensions=('lab.talos', 'lab.k8s_upstream'), profile='instant') as running:
        world = running.world
        api = ProxmoxAPI(world.net.pve_host, user='proxtalos@pve', token_name='proxtalos', token_value=world.token_secret,
                         verify_ssl=world.ca_path)
        core, _cp_vm, cp_address, worker_address = _cluster_up(running, api, tmp_path)
        version = kube_client.VersionApi(core.api_client).get_code()
        assert version.git_version == 'v1.36.3'
        cp = core.read_node('cp-1')
        assert cp.metadata.labels['node-role.kubernetes.io/control-plane'] == ''
        # (kube-controller-manager's node lifecycle controller may also hold node.kubernetes.io/not-ready until kwok reports Ready)
        assert ('node-role.kubernetes.io/control-plane', 'NoSchedule') in [(t.key, t.effect) for t in cp.spec.taints]
        assert not [t for t in core.read_node('worker-1').spec.taints or () if t.key == 'node-role.kubernetes.io/control-plane']
        worker = core.read_node('worker-1')
        assert [a.address for a in worker.status.addresses if a.type == 'InternalIP'] == [worker_address]
        assert worker.status.node_info.os_image == 'Talos (%s)' % TALOS_VERSION
        assert worker.status.node_info.kubelet_version == 'v1.36.3'
        # the lab's request log has the API requests of the cluster's admin (the kubeconfig above), from kube-apiserver's
        # audit log, as source k8s; the lab's own requests (its kubelet stand-in) and the controllers' are not in it
        logged = running.call(world.control({'op': 'requests', 'source': 'k8s'}))
        assert ('GET', '/api/v1/nodes/worker-1', 200, 'admin') in [(e['method'], e['path'], e['status'], e['user']) for e in logged]
        assert {e['user'] for e in logged} == {'admin'}, logged
        with open(world.paths.requests, encoding='utf-8') as handle:
            assert '"/api/v1/nodes/worker-1"' in handle.read()
        # no CNI yet: NotReady as kubelet reports it, and Talos's manifests applied as Talos applies them
        wait_until(lambda: ([c.reason for c in core.read_node('worker-1').status.conditions or () if c.type == 'Ready'] == ['KubeletNotReady'],
                            core.read_node('worker-1').status.conditions), 'worker-1 NotReady for its network')
        apps = kube_client.AppsV1Api(core.api_client)
        coredns = wait_until(lambda: _found(apps.read_namespaced_deployment, 'coredns', 'kube-system'), 'CoreDNS applied by Talos')
        assert coredns.metadata.managed_fields[0].manager == 'talos'
        status = running.call(world.status())['k8s_upstream']
        cluster = next(iter(status.values()))
        # the API answers on the endpoint (the control plane holds it as its VIP) and on the control plane's own address
        assert cluster['api'] == sorted(['%s:6443' % world.net.endpoint_host, '%s:6443' % cp_address])
        assert [(p['name'], p['healthy']) for p in cluster['processes']] == [
            ('etcd', True), ('kube-apiserver', True), ('kube-controller-manager', True), ('kube-scheduler', True), ('kwok', True)]
        pids = [p['pid'] for p in cluster['processes']]
        # `python -m lab status` shows each process on a row of its own: name, pid, running, healthy, what its endpoint said
        rows = [line.split() for line in render_status(json.loads(json.dumps(running.call(world.status()), default=str))).splitlines()]
        for process in cluster['processes']:
            assert [process['name'], str(process['pid']), 'True', 'True', 'HTTP', '200'] in [row[:6] for row in rows], rows
        # the kubelet fault of the upstream world, under lab/k8s's name (its effect: tests/lab/test_k8s_upstream_talos.py)
        assert running.call(world.faults.apply('k8s-crashloop', 'worker-1')) is not None
        assert world.k8s_upstream.crashloop == {'worker-1': 'kube-system/cilium'}
        running.call(world.faults.clear('k8s-crashloop', 'worker-1'))
        # the worker's VM stops: its kubelet with it - kwok lets the Node go (kube-controller-manager then marks it
        # Unknown when its Lease runs out: tests/lab/test_k8s_upstream.py shows that part on a shorter clock)
        _ok(api, api.nodes('pve1').qemu(402).status.stop.post())
        wait_until(lambda: ('kwok.x-k8s.io/node' not in (core.read_node('worker-1').metadata.labels or {}),
                            core.read_node('worker-1').metadata.labels), 'kwok letting worker-1 go')
        assert 'kwok.x-k8s.io/node' in core.read_node('cp-1').metadata.labels
    # the lab stopped: nothing of the control plane is left running
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _found(read, *args):
    try:
        return True, read(*args)
    except kube_client.ApiException as exc:
        if exc.status != 404:
            raise
        return False, 'HTTP 404'


class _Config:  # pylint: disable=too-few-public-methods
    def __init__(self, control_plane, machine=None, cluster=None):
        self.control_plane = control_plane
        self.machine = machine or {}
        self.cluster = cluster or {}


def test_node_taints_follow_talos():
    assert node_taints(_Config(True)) == [{'key': 'node-role.kubernetes.io/control-plane', 'effect': 'NoSchedule'}]
    assert node_taints(_Config(True, cluster={'allowSchedulingOnControlPlanes': True})) == []
    taints = node_taints(_Config(False, machine={'nodeTaints': {'dedicated': 'db:NoExecute', 'gpu': 'NoSchedule'}}))
    assert taints == [{'key': 'dedicated', 'value': 'db', 'effect': 'NoExecute'}, {'key': 'gpu', 'effect': 'NoSchedule'}]


def test_a_config_applied_live_moves_the_kubelet_version_and_the_mirror_pods(tmp_path):
    """As on lab/k8s (tests/lab/test_k8s_world.py): the Node reports the version of machine.kubelet.image, and the new
    one once Talos has restarted kubelet for a config applied without a reboot; a control plane's kube-apiserver,
    kube-controller-manager and kube-scheduler are mirror pods owned by its Node with the images of its config,
    replaced (a new uid) when the config names another image. The API server itself stays the v1.36.3 binary."""
    with world_in_thread(tmp_path / 'run', free_net(), extensions=('lab.talos', 'lab.k8s_upstream'), profile='instant') as running:
        world = running.world
        api = ProxmoxAPI(world.net.pve_host, user='proxtalos@pve', token_name='proxtalos', token_value=world.token_secret,
                         verify_ssl=world.ca_path)
        kept = {}
        core, _cp_vm, cp_address, worker_address = _cluster_up(running, api, tmp_path, keep=kept)
        assert core.read_node('worker-1').status.node_info.kubelet_version == 'v1.36.3'
        old = dict((c, 'registry.k8s.io/%s:v1.36.3' % c) for c in ('kube-apiserver', 'kube-controller-manager', 'kube-scheduler'))
        wait_until(lambda: (_static_pod_images(core, 'cp-1') == old, _static_pod_images(core, 'cp-1')), 'the mirror pods of cp-1')
        mirror = core.read_namespaced_pod('kube-apiserver-cp-1', 'kube-system')
        assert 'kubernetes.io/config.mirror' in mirror.metadata.annotations and mirror.spec.host_network
        assert [(r.kind, r.name, r.uid) for r in mirror.metadata.owner_references] == [('Node', 'cp-1', core.read_node('cp-1').metadata.uid)]
        assert not _static_pod_images(core, 'worker-1')

        credentials = _worker_kubelet_to_v1_36_4(running, core, kept, worker_address)
        # kwok runs the Node again after the restart
        wait_until(lambda: ('kwok.x-k8s.io/node' in (core.read_node('worker-1').metadata.labels or {}),
                            core.read_node('worker-1').metadata.labels), 'kwok taking worker-1 back')

        _api_server_image_to_v1_36_4(running, core, kept, cp_address, credentials, old)
        assert core.read_namespaced_pod('kube-apiserver-cp-1', 'kube-system').metadata.uid != mirror.metadata.uid
        assert core.read_node('cp-1').status.node_info.kubelet_version == 'v1.36.3'
        # the gap: the process serving the API is the one binary the lab builds
        assert kube_client.VersionApi(core.api_client).get_code().git_version == 'v1.36.3'
