"""The upstream control plane (lab/k8s_upstream): etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
kwok, the pinned builds from `make setup`. One control plane serves the whole module (it starts in seconds once the
binaries are cached). Select with `-m upstream`."""

import json
import os
import signal
import subprocess
import sys

import pytest
import requests
from lab import upstream
from lab import pki
from lab.k8s_upstream import ControlPlane, ControlPlaneError
from lab.k8s_upstream.controlplane import admission_configuration
from lab.testing import Lab, free_net

pytestmark = pytest.mark.upstream

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KUBECTL = os.path.join(ROOT, '.tools', 'bin', 'kubectl')
WAIT = 60.0


@pytest.fixture(scope='module')
def cp(tmp_path_factory):
    # a short node lease and node monitor (a time scale): a stopped kubelet shows in seconds, not in 50
    plane = ControlPlane(str(tmp_path_factory.mktemp('controlplane')), node_lease_seconds=6, node_monitor=('1s', '8s'))
    plane.start()
    yield plane
    plane.stop()
    assert all(not proc.running for proc in plane.processes.values())


def _kubectl(cp, *args):
    return subprocess.run([KUBECTL, '--kubeconfig', cp.kubeconfig] + list(args), capture_output=True, text=True, timeout=60,
                          check=False)


def _default_service_account(cp, namespace):
    """Wait for kube-controller-manager's ServiceAccount controller: a pod created before it is refused."""
    def made():
        found = cp.api('GET', '/api/v1/namespaces/%s/serviceaccounts' % namespace)['items']
        return any(sa['metadata']['name'] == 'default' for sa in found), [sa['metadata']['name'] for sa in found]
    Lab.wait_until(made, WAIT, what='ServiceAccount %s/default' % namespace)


def _namespace(cp, name, labels=None):
    cp.api('POST', '/api/v1/namespaces', {'apiVersion': 'v1', 'kind': 'Namespace',
                                          'metadata': {'name': name, 'labels': labels or {}}}, expect=(201,))
    _default_service_account(cp, name)


PRIVILEGED_POD = {
    'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'priv'},
    'spec': {'containers': [{'name': 'agent', 'image': 'registry.k8s.io/pause:3.10',
                             'securityContext': {'privileged': True}}]},
}


def test_control_plane_is_up_and_answers_kubectl_and_the_python_client(cp):
    status = {entry['name']: entry for entry in cp.status()}
    assert list(status) == ['etcd', 'kube-apiserver', 'kube-controller-manager', 'kube-scheduler', 'kwok']
    assert all(entry['running'] and entry['healthy'] for entry in status.values()), status
    assert status['kube-apiserver']['health'] == 'HTTP 200 ok'

    version = _kubectl(cp, 'version', '-o', 'json')
    assert version.returncode == 0, version.stderr
    assert json.loads(version.stdout)['serverVersion']['gitVersion'] == 'v1.36.3'

    from kubernetes import client, config  # pylint: disable=import-outside-toplevel
    api = client.CoreV1Api(config.new_client_from_config(config_file=cp.kubeconfig))
    names = {ns.metadata.name for ns in api.list_namespace().items}
    assert {'default', 'kube-system', 'kube-public', 'kube-node-lease'} <= names
    # the kubeconfig is a secret: 0600
    assert os.stat(cp.kubeconfig).st_mode & 0o777 == 0o600


def test_the_audit_log_gives_the_admin_users_requests_and_no_one_elses(cp):
    """What the lab's request log shows of the upstream API (source k8s): the requests of the admin kubeconfig's user,
    with method, path and status, not those of the controllers or of the lab's own client."""
    cp.audit_requests()   # what came before this test
    _namespace(cp, 'audited')   # as the lab's own user
    made = _kubectl(cp, 'create', 'deployment', 'web', '--image=registry.k8s.io/pause:3.10', '-n', 'audited')
    assert made.returncode == 0, made.stderr
    assert _kubectl(cp, 'create', 'configmap', 'one', '-n', 'audited').returncode == 0
    assert _kubectl(cp, 'delete', 'configmap', 'one', '-n', 'audited').returncode == 0
    missing = _kubectl(cp, 'get', 'configmap', 'two', '-n', 'audited')
    assert missing.returncode != 0
    # kube-controller-manager's deployment controller makes the ReplicaSet (its own request, not the admin's)
    Lab.wait_until(lambda: (bool(cp.api('GET', '/apis/apps/v1/namespaces/audited/replicasets')['items']), 'none yet'), WAIT,
                   what='the ReplicaSet of deployment web')

    def seen():
        entries = cp.audit_requests()
        seen.entries += entries
        pairs = [(e['method'], e['path'].split('?')[0], e['status']) for e in seen.entries]
        return ('GET', '/api/v1/namespaces/audited/configmaps/two', 404) in pairs, pairs
    seen.entries = []
    Lab.wait_until(seen, WAIT, what='the admin requests in the audit log')
    pairs = [(e['method'], e['path'].split('?')[0], e['status']) for e in seen.entries]
    assert ('POST', '/apis/apps/v1/namespaces/audited/deployments', 201) in pairs, pairs
    assert ('POST', '/api/v1/namespaces/audited/configmaps', 201) in pairs, pairs
    assert ('DELETE', '/api/v1/namespaces/audited/configmaps/one', 200) in pairs, pairs
    assert {e['user'] for e in seen.entries} == {'admin'}, seen.entries
    assert not [p for p in pairs if p[1] == '/api/v1/namespaces' or 'replicasets' in p[1]], pairs
    assert cp.audit_requests() == []


def test_pod_security_baseline_rejects_a_privileged_pod_outside_kube_system(cp):
    _namespace(cp, 'apps-unlabelled')
    with pytest.raises(ControlPlaneError) as rejected:
        cp.api('POST', '/api/v1/namespaces/apps-unlabelled/pods', PRIVILEGED_POD, expect=(201,))
    # the message of k8s.io/pod-security-admission (admission.go, policy/check_privileged.go)
    assert 'HTTP 403' in str(rejected.value)
    assert ('pods \\"priv\\" is forbidden: violates PodSecurity \\"baseline:latest\\": privileged '
            '(container \\"agent\\" must not set securityContext.privileged=true)') in str(rejected.value)
    # kube-system is exempt, as Talos configures it
    _default_service_account(cp, 'kube-system')
    created = cp.api('POST', '/api/v1/namespaces/kube-system/pods', PRIVILEGED_POD, expect=(201,))
    assert created['metadata']['name'] == 'priv'
    # a namespace labelled privileged admits it
    _namespace(cp, 'apps-privileged', {'pod-security.kubernetes.io/enforce': 'privileged'})
    cp.api('POST', '/api/v1/namespaces/apps-privileged/pods', PRIVILEGED_POD, expect=(201,))


def test_a_deployment_of_privileged_pods_reports_the_admission_rejection_as_replica_failure(cp):
    """What a bootstrap release in a namespace without Pod Security labels meets on Talos: the ReplicaSet controller's
    pod creations are refused, and the rejection surfaces as ReplicaFailure / FailedCreate with the admission message."""
    _namespace(cp, 'release-unlabelled')
    deployment = {
        'apiVersion': 'apps/v1', 'kind': 'Deployment', 'metadata': {'name': 'agent', 'namespace': 'release-unlabelled'},
        'spec': {'replicas': 1, 'selector': {'matchLabels': {'app': 'agent'}},
                 'template': {'metadata': {'labels': {'app': 'agent'}}, 'spec': PRIVILEGED_POD['spec']}},
    }
    cp.api('POST', '/apis/apps/v1/namespaces/release-unlabelled/deployments', deployment, expect=(201,))

    def failure():
        found = cp.api('GET', '/apis/apps/v1/namespaces/release-unlabelled/deployments/agent').get('status', {})
        by_type = {c['type']: c for c in found.get('conditions', [])}
        return by_type.get('ReplicaFailure', {}).get('status') == 'True', by_type

    conditions = Lab.wait_until(failure, WAIT, what='Deployment agent ReplicaFailure')
    assert conditions['ReplicaFailure']['reason'] == 'FailedCreate'
    assert 'violates PodSecurity "baseline:latest": privileged (container "agent" must not set securityContext.privileged=true)' \
        in conditions['ReplicaFailure']['message']
    assert cp.api('GET', '/api/v1/namespaces/release-unlabelled/pods')['items'] == []


def test_daemonset_pods_are_made_by_the_controller_placed_by_the_scheduler_and_made_ready_by_kwok(cp):
    cp.register_node('cp-1', labels={'node-role.kubernetes.io/control-plane': ''},
                     taints=[{'key': 'node-role.kubernetes.io/control-plane', 'effect': 'NoSchedule'}],
                     addresses=['127.0.0.11'], pod_cidr='10.244.7.0/24', node_info={'osImage': 'Talos (v1.13.9)'})
    cp.register_node('worker-1', addresses=['127.0.0.21'])
    daemonset = {
        'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'metadata': {'name': 'agent', 'namespace': 'kube-system'},
        'spec': {'selector': {'matchLabels': {'app': 'agent'}},
                 'template': {'metadata': {'labels': {'app': 'agent'}},
                              'spec': {'containers': [{'name': 'agent', 'image': 'registry.k8s.io/pause:3.10'}]}}},
    }
    cp.api('POST', '/apis/apps/v1/namespaces/kube-system/daemonsets', daemonset, expect=(201,))

    def available():
        status = cp.api('GET', '/apis/apps/v1/namespaces/kube-system/daemonsets/agent').get('status', {})
        return status.get('numberAvailable') == 1 and status.get('observedGeneration') == 1, status

    status = Lab.wait_until(available, WAIT, what='DaemonSet agent available on one node')
    # the real controller skips the tainted control plane: one desired, on the worker
    assert status['desiredNumberScheduled'] == 1 and status['currentNumberScheduled'] == 1
    assert status['numberReady'] == 1 and status['updatedNumberScheduled'] == 1 and status['numberMisscheduled'] == 0
    pods = cp.api('GET', '/api/v1/namespaces/kube-system/pods?labelSelector=app%3Dagent')['items']
    assert [pod['spec']['nodeName'] for pod in pods] == ['worker-1']
    pod = pods[0]
    # created by the DaemonSet controller (owner, its node-affinity and the daemon tolerations it adds)
    assert pod['metadata']['ownerReferences'][0]['kind'] == 'DaemonSet'
    tolerations = {(t['key'], t.get('effect')) for t in pod['spec']['tolerations']}
    assert ('node.kubernetes.io/not-ready', 'NoExecute') in tolerations
    # bound by kube-scheduler, made Ready by kwok
    conditions = {c['type']: c['status'] for c in pod['status']['conditions']}
    assert conditions.get('PodScheduled') == 'True' and conditions.get('Ready') == 'True'

    nodes = {n['metadata']['name']: n for n in cp.api('GET', '/api/v1/nodes')['items']}
    assert nodes['cp-1']['spec']['podCIDR'] == '10.244.7.0/24'

    def cidr_allocated():
        node = cp.api('GET', '/api/v1/nodes/worker-1')
        ready = {c['type']: c['status'] for c in node['status'].get('conditions', [])}.get('Ready')
        return bool(node['spec'].get('podCIDR')) and ready == 'True', (node['spec'].get('podCIDR'), ready)

    # kube-controller-manager's node IPAM gives the other node a range of the pod subnet; kwok reports it Ready
    cidr, _ready = Lab.wait_until(cidr_allocated, WAIT, what='worker-1 podCIDR and Ready')
    assert cidr.startswith('10.244.') and cidr != '10.244.7.0/24'
    addresses = {(a['type'], a['address']) for a in nodes['cp-1']['status']['addresses']}
    assert ('InternalIP', '127.0.0.11') in addresses
    info = nodes['cp-1']['status']['nodeInfo']
    assert info['kubeletVersion'] == 'v1.36.3' and info['osImage'] == 'Talos (v1.13.9)'


CSI_DRIVER = 'csi.proxmox.sinextra.dev'


def _csi_node_pod(name, node):
    return {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': name, 'namespace': 'kube-system'},
            'spec': {'nodeName': node, 'containers': [
                {'name': 'plugin', 'image': 'ghcr.io/sergelogvinov/proxmox-csi-node:v0.13.0'},
                {'name': 'registrar', 'image': 'registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.13.0',
                 'args': ['--v=5', '--csi-address=unix:///csi/csi.sock',
                          '--kubelet-registration-path=/var/lib/kubelet/plugins/%s/csi.sock' % CSI_DRIVER]}]}}


def _create_csi_node_pod(cp, name, node):
    _default_service_account(cp, 'kube-system')
    cp.api('POST', '/api/v1/namespaces/kube-system/pods', _csi_node_pod(name, node), expect=(201,))


def _csinode(cp, name):
    """(CSINode or None, what was seen)."""
    try:
        found = cp.api('GET', '/apis/storage.k8s.io/v1/csinodes/' + name)
    except ControlPlaneError as exc:
        return None, str(exc)[:120]
    return found, (found['metadata'].get('ownerReferences'), found['spec'].get('drivers'))


def _csinode_with(cp, name, node_uid, drivers):
    """Wait for CSINode name owned by the Node of node_uid and listing drivers (names); returns it."""
    def probe():
        found, seen = _csinode(cp, name)
        if found is None:
            return False, seen
        owners = [(r['kind'], r['name'], r['uid']) for r in found['metadata'].get('ownerReferences') or ()]
        listed = [d['name'] for d in found['spec'].get('drivers') or ()]
        ok = owners == [('Node', name, node_uid)] and listed == drivers
        return ok, found if ok else seen
    return Lab.wait_until(probe, WAIT, what='CSINode %s owned by Node uid %s with drivers %s' % (name, node_uid, drivers))


def test_a_csi_node_plugin_registers_its_driver_in_the_nodes_csinode_as_kubelet_does(cp):
    """lab/k8s_upstream/kubelet.py CsiRegistrations: the kubelet's start creates its node's CSINode (owned by the
    Node, no drivers); a Ready pod whose registrar names the driver's socket puts the driver in it; the pod gone, the
    driver is dropped."""
    cp.register_node('worker-csi', addresses=['127.0.0.41'])
    uid = cp.api('GET', '/api/v1/nodes/worker-csi')['metadata']['uid']
    _csinode_with(cp, 'worker-csi', uid, [])
    _create_csi_node_pod(cp, 'csi-node', 'worker-csi')
    csinode = _csinode_with(cp, 'worker-csi', uid, [CSI_DRIVER])
    # topologyKeys is written back as null (no omitempty: k8s.io/api v0.36.3 storage/v1/types.go:645)
    assert csinode['spec']['drivers'] == [{'name': CSI_DRIVER, 'nodeID': 'worker-csi', 'topologyKeys': None}]
    assert csinode['metadata']['ownerReferences'][0]['apiVersion'] == 'v1'
    cp.api('DELETE', '/api/v1/namespaces/kube-system/pods/csi-node?gracePeriodSeconds=0', expect=(200, 202))
    _csinode_with(cp, 'worker-csi', uid, [])


def test_a_deleted_node_loses_its_csinode_to_the_garbage_collector_and_a_new_one_registers_again(cp):
    """A Node deleted: kube-controller-manager's garbage collector deletes the CSINode it owns (the lab writes nothing
    for a node whose kubelet is gone). The node registered again (a new Node, a new uid: the rebuilt node's kubelet
    starts) and its node plugin's pod Ready: a CSINode owned by the new Node, with the driver again."""
    cp.register_node('worker-gc', addresses=['127.0.0.42'])
    first = cp.api('GET', '/api/v1/nodes/worker-gc')['metadata']['uid']
    _create_csi_node_pod(cp, 'csi-node-gc', 'worker-gc')
    _csinode_with(cp, 'worker-gc', first, [CSI_DRIVER])

    cp.api('DELETE', '/api/v1/nodes/worker-gc', expect=(200,))
    # the pod bound to the gone Node, as the pod garbage collector deletes it (after its quarantine) or a drain did
    cp.api('DELETE', '/api/v1/namespaces/kube-system/pods/csi-node-gc?gracePeriodSeconds=0', expect=(200, 202))
    Lab.wait_until(lambda: (_csinode(cp, 'worker-gc')[0] is None, _csinode(cp, 'worker-gc')[1]), WAIT,
                   what='CSINode worker-gc deleted by the garbage collector')

    cp.register_node('worker-gc', addresses=['127.0.0.42'])
    second = cp.api('GET', '/api/v1/nodes/worker-gc')['metadata']['uid']
    assert second != first
    _csinode_with(cp, 'worker-gc', second, [])
    _create_csi_node_pod(cp, 'csi-node-gc-2', 'worker-gc')
    csinode = _csinode_with(cp, 'worker-gc', second, [CSI_DRIVER])
    assert csinode['spec']['drivers'][0]['nodeID'] == 'worker-gc'


def test_a_csinode_of_an_earlier_node_is_replaced_when_the_new_node_registers(cp):
    """The new Node registered while the CSINode of the deleted one is still there (the garbage collector not yet
    come to it, here: it was written with an owner uid no Node has): the kubelet deletes it and creates its own
    (nodeinfomanager.go ensureNodeOwnsCSINode), and the driver registers in that one."""
    cp.api('POST', '/apis/storage.k8s.io/v1/csinodes', {
        'apiVersion': 'storage.k8s.io/v1', 'kind': 'CSINode',
        'metadata': {'name': 'worker-stale', 'ownerReferences': [
            {'apiVersion': 'v1', 'kind': 'Node', 'name': 'worker-stale', 'uid': '00000000-0000-0000-0000-000000000001'}]},
        'spec': {'drivers': [{'name': CSI_DRIVER, 'nodeID': 'worker-stale'}]}}, expect=(201,))
    cp.register_node('worker-stale', addresses=['127.0.0.43'])
    uid = cp.api('GET', '/api/v1/nodes/worker-stale')['metadata']['uid']
    _create_csi_node_pod(cp, 'csi-node-stale', 'worker-stale')
    _csinode_with(cp, 'worker-stale', uid, [CSI_DRIVER])


def _ready(cp, name):
    node = cp.api('GET', '/api/v1/nodes/' + name)
    ready = next((c for c in node['status'].get('conditions', []) if c['type'] == 'Ready'), {})
    return ready.get('status'), ready.get('reason'), sorted(t['key'] for t in node['spec'].get('taints') or ())


def test_a_stopped_kubelet_makes_its_node_unknown_through_the_node_lifecycle_controller(cp):
    cp.register_node('worker-stop', addresses=['127.0.0.31'])
    Lab.wait_until(lambda: (_ready(cp, 'worker-stop')[0] == 'True', _ready(cp, 'worker-stop')), WAIT, what='worker-stop Ready')
    cp.stop_kubelet('worker-stop')
    seen = Lab.wait_until(lambda: (_ready(cp, 'worker-stop')[0] == 'Unknown' and 'node.kubernetes.io/unreachable' in _ready(cp, 'worker-stop')[2],
                                   _ready(cp, 'worker-stop')), WAIT, what='worker-stop Ready=Unknown')
    # what kube-controller-manager writes when a kubelet stops posting (NodeStatusUnknown), not something the lab wrote
    assert seen[1] == 'NodeStatusUnknown'
    # the kubelet comes back: registering again is the same as starting it
    cp.register_node('worker-stop', addresses=['127.0.0.31'])
    Lab.wait_until(lambda: (_ready(cp, 'worker-stop')[0] == 'True' and 'node.kubernetes.io/unreachable' not in _ready(cp, 'worker-stop')[2],
                            _ready(cp, 'worker-stop')), WAIT, what='worker-stop Ready again')


def test_a_killed_api_server_refuses_connections_until_started_again_and_its_clients_carry_on(cp):
    """ControlPlane.stop_process/start_process: kube-apiserver killed, the others running; the lab does not start it again
    on its own (its stop is the lab's); started again with the same command, it serves the same objects, and
    kube-controller-manager and kube-scheduler are up again (restarted by the lab, as by kubelet, if the outage outlasted
    their leader election's renew deadline)."""
    cp.register_node('worker-restart', addresses=['127.0.0.51'])
    uid = cp.api('GET', '/api/v1/nodes/worker-restart')['metadata']['uid']
    cp.stop_process('kube-apiserver', kill=True)
    try:
        status = {entry['name']: entry for entry in cp.status()}
        assert not status['kube-apiserver']['running'] and 'not running' in status['kube-apiserver']['health']
        assert status['kube-apiserver']['restarts'] == 0 and status['kube-apiserver']['last_exit'] is None, status
        with pytest.raises(requests.ConnectionError):
            cp.api('GET', '/api/v1/nodes/worker-restart')
        with pytest.raises(ControlPlaneError, match='kube-apiserver is not running'):
            cp.stop_process('kube-apiserver')
    finally:
        cp.start_process('kube-apiserver')
    with pytest.raises(ControlPlaneError, match='kube-apiserver is running'):
        cp.start_process('kube-apiserver')
    assert cp.api('GET', '/api/v1/nodes/worker-restart')['metadata']['uid'] == uid  # etcd kept it
    # kube-controller-manager and kube-scheduler exit if the outage outlasted their renew deadline (a loaded machine);
    # then the lab restarts them, as kubelet does: every process comes back running and healthy
    wait_all_healthy(cp)
    # the controllers act again: kube-controller-manager's node IPAM gives a node registered now its range
    cp.register_node('worker-after', addresses=['127.0.0.52'])
    Lab.wait_until(lambda: (bool(cp.api('GET', '/api/v1/nodes/worker-after')['spec'].get('podCIDR')), None), WAIT,
                   what='worker-after podCIDR from kube-controller-manager')


def wait_all_healthy(cp):
    """Every process running and healthy, waited for with a deadline; on timeout the error shows the last status."""
    def probe():
        status = cp.status()
        return all(entry['running'] and entry['healthy'] for entry in status), status
    return Lab.wait_until(probe, WAIT, what='every control-plane process running and healthy')


def test_a_killed_controller_manager_is_restarted_as_kubelet_restarts_a_static_pod(cp):
    """kube-controller-manager SIGKILLed (a crash, not the lab's stop): the lab starts it again, as kubelet restarts a
    static pod's container - at once the first time (kubelet's back-off starts after the first restart) - and status
    counts the restart with the exit code; the controllers act again."""
    before = {entry['name']: entry for entry in cp.status()}
    assert before['kube-controller-manager']['restarts'] == 0, before
    old_pid = before['kube-controller-manager']['pid']
    os.kill(old_pid, signal.SIGKILL)

    def restarted():
        entry = {e['name']: e for e in cp.status()}['kube-controller-manager']
        return entry['restarts'] == 1 and entry['pid'] != old_pid and entry['running'] and entry['healthy'], entry
    entry = Lab.wait_until(restarted, WAIT, what='kube-controller-manager restarted once and healthy')
    assert entry['last_exit'] == -signal.SIGKILL, entry
    wait_all_healthy(cp)
    cp.register_node('worker-after-kcm', addresses=['127.0.0.53'])
    Lab.wait_until(lambda: (bool(cp.api('GET', '/api/v1/nodes/worker-after-kcm')['spec'].get('podCIDR')), None), WAIT,
                   what='worker-after-kcm podCIDR from the restarted kube-controller-manager')


def test_admission_configuration_is_talos_shape_and_names_bad_input():
    rendered = admission_configuration([{'name': 'PodSecurity', 'configuration': {'kind': 'PodSecurityConfiguration'}}])
    assert rendered == {'apiVersion': 'apiserver.config.k8s.io/v1', 'kind': 'AdmissionConfiguration',
                        'plugins': [{'name': 'PodSecurity', 'configuration': {'kind': 'PodSecurityConfiguration'}}]}
    with pytest.raises(ControlPlaneError, match=r'admission_control\[0\]\.configuration'):
        admission_configuration([{'name': 'PodSecurity', 'configuration': 'enforce: baseline'}])
    with pytest.raises(ControlPlaneError, match=r'admission_control\[1\]\.name'):
        admission_configuration([{'name': 'A', 'configuration': {}}, {'configuration': {}}])


def test_missing_binary_says_to_run_make_setup(tmp_path, monkeypatch):
    monkeypatch.setenv('PROXTALOS_CACHE', str(tmp_path / 'empty-cache'))
    with pytest.raises(upstream.MissingBinary, match='run `make setup`'):
        upstream.binary('kube-apiserver')
    with pytest.raises(upstream.MissingBinary, match='no upstream/no-such-thing.json declares it'):
        upstream.binary('no-such-thing')


def test_declaration_errors_name_the_file_and_field(tmp_path):
    bad = tmp_path / 'thing.json'
    bad.write_text(json.dumps({'name': 'thing', 'version': '1', 'go_module': {'module': 'x', 'version': 'v1'}}))
    with pytest.raises(upstream.UpstreamError, match='thing.json: field go_module.package must be a non-empty string'):
        upstream.components(tmp_path)
    bad.write_text(json.dumps({'name': 'other', 'version': '1', 'go_source': 'tools/x'}))
    with pytest.raises(upstream.UpstreamError, match="field name is 'other' but the file is named thing.json"):
        upstream.components(tmp_path)
    bad.write_text(json.dumps({'name': 'thing', 'version': '1'}))
    with pytest.raises(upstream.UpstreamError, match='exactly one of the fields go_module, go_source'):
        upstream.components(tmp_path)
    bad.write_text(json.dumps({'name': 'thing', 'version': '1', 'go_source': 'tools/x',
                               'download': {'url': 'https://example.invalid/x', 'sha256': 'abc'}}))
    with pytest.raises(upstream.UpstreamError, match='field download.sha256 must be 64 lower-case hex digits'):
        upstream.components(tmp_path)


def test_every_declaration_in_the_repository_is_valid():
    found = upstream.components()
    assert {'etcd', 'kube-apiserver', 'kube-controller-manager', 'kube-scheduler', 'kwok'} <= set(found)
    # the three Kubernetes binaries are one build: same module, version, replaces and flags
    kube = [dict(found[name]['go_module'], package=None) for name in ('kube-apiserver', 'kube-controller-manager', 'kube-scheduler')]
    assert kube[0] == kube[1] == kube[2]


def test_go_source_key_changes_with_the_source(tmp_path):
    source = tmp_path / 'tools' / 'thing'
    source.mkdir(parents=True)
    (source / 'main.go').write_text('package main\n')
    spec = {'name': 'thing', 'version': '1.0', 'go_source': 'tools/thing'}
    first = upstream.binary_path(spec, tmp_path)
    assert first.parent.name == '1.0-' + upstream.source_hash('tools/thing', tmp_path)
    (source / 'main.go').write_text('package main\n\nfunc main() {}\n')
    assert upstream.binary_path(spec, tmp_path) != first


def test_api_server_on_a_lab_endpoint_with_its_addresses_in_the_certificate(tmp_path):
    """The shape a lab cluster needs: kube-apiserver on <net>.10:6443 (the control-plane endpoint), the serving
    certificate also valid for a node address, the kubeconfig pointing at the endpoint; the cluster CA is given."""
    net = free_net()
    ca = pki.make_ca('kubernetes')
    plane = ControlPlane(str(tmp_path), kwok=False, ca=ca, api_host=net + '.10', api_port=6443, api_sans=[net + '.11', 'lab.example'])
    with plane:
        assert plane.api_url == 'https://%s.10:6443' % net
        with open(plane.kubeconfig, encoding='utf-8') as handle:
            assert 'server: https://%s.10:6443' % net in handle.read()
        version = _kubectl(plane, 'version', '-o', 'json')
        assert version.returncode == 0, version.stderr
        # the same certificate on a node address and a name (the CA verifies it for each)
        checked = _kubectl(plane, '--server', 'https://%s.10:6443' % net, '--tls-server-name', net + '.11', 'get', '--raw', '/readyz')
        assert checked.stdout == 'ok', checked.stderr
        named = _kubectl(plane, '--tls-server-name', 'lab.example', 'get', '--raw', '/readyz')
        assert named.stdout == 'ok', named.stderr
        wrong = _kubectl(plane, '--tls-server-name', 'other.example', 'get', '--raw', '/readyz')
        assert wrong.returncode != 0 and 'certificate' in wrong.stderr
        with open(os.path.join(str(tmp_path), 'pki', 'ca.crt'), encoding='utf-8') as handle:
            assert handle.read() == ca[0]
    assert not any(proc.running for proc in plane.processes.values())


@pytest.mark.slow
def test_a_start_stops_what_a_killed_owner_left_running(tmp_path):
    """The owner of a control plane SIGKILLed (no stop()): the next start in the same directory ends its processes."""
    script = ('import sys; from lab.k8s_upstream import ControlPlane; plane = ControlPlane(sys.argv[1], kwok=False).start(); '
              'print(plane.ports["kube-apiserver"], flush=True); sys.stdin.read()')
    owner = subprocess.Popen([sys.executable, '-c', script, str(tmp_path)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert owner.stdout.readline().strip().isdigit()  # the line comes once every process is healthy
        with open(tmp_path / 'pids.json', encoding='utf-8') as handle:
            orphans = json.load(handle)
        owner.kill()
        owner.wait(timeout=30)
        assert all(os.path.exists('/proc/%d' % pid) for pid in orphans.values())  # they outlived their owner
        with ControlPlane(str(tmp_path), kwok=False) as plane:
            assert all(entry['healthy'] for entry in plane.status())
            assert not any(os.path.exists('/proc/%d' % pid) for pid in orphans.values())
    finally:
        owner.kill()
        owner.wait(timeout=30)
