"""The workload faults of the upstream world (lab/k8s_upstream/policies.py, kubelet.py ImagePulls): k8s-image-pull and
k8s-pending made with kube-apiserver's MutatingAdmissionPolicy, kwok's pod-ready stage, the lab's kubelet stand-in and
the real kube-scheduler; and k8s-api-flap on the lab's forwards (lab/k8s_upstream/lab.py). Select with `-m upstream`."""

import asyncio
import socket
import ssl
import types

import kubernetes
import pytest
import urllib3
from lab.k8s_upstream import ControlPlane, ControlPlaneError, kubelet, policies
from lab.k8s_upstream import lab as upstream_lab
from lab.kubelet_hooks import DEFAULT_PULL_ERROR
from lab.testing import Lab, free_net

pytestmark = pytest.mark.upstream

WAIT = 60.0
PULL_ERROR = 'failed to pull and unpack image "{image}": failed to resolve reference "{image}": {image}: not found'


@pytest.fixture(scope='module')
def cp(tmp_path_factory):
    plane = ControlPlane(str(tmp_path_factory.mktemp('controlplane')))
    plane.start()
    plane.register_node('worker-1', addresses=['127.0.0.21'])
    yield plane
    plane.stop()


def _default_service_account(cp, namespace):
    def made():
        found = cp.api('GET', '/api/v1/namespaces/%s/serviceaccounts' % namespace)['items']
        return any(sa['metadata']['name'] == 'default' for sa in found), [sa['metadata']['name'] for sa in found]
    Lab.wait_until(made, WAIT, what='ServiceAccount %s/default' % namespace)


def _deployment(cp, namespace, name, image):
    cp.api('POST', '/apis/apps/v1/namespaces/%s/deployments' % namespace, {
        'apiVersion': 'apps/v1', 'kind': 'Deployment', 'metadata': {'name': name, 'namespace': namespace},
        'spec': {'replicas': 1, 'selector': {'matchLabels': {'app': name}},
                 'template': {'metadata': {'labels': {'app': name}},
                              'spec': {'containers': [{'name': 'web', 'image': image}]}}}}, expect=(201,))


def _pods(cp, namespace, app):
    return [p for p in cp.api('GET', '/api/v1/namespaces/%s/pods?labelSelector=app%%3D%s' % (namespace, app))['items']
            if not p['metadata'].get('deletionTimestamp')]


def _conditions(pod):
    return {c['type']: c for c in (pod.get('status') or {}).get('conditions') or ()}


def _rolled_out(cp, namespace, name, image):
    def probe():
        status = cp.api('GET', '/apis/apps/v1/namespaces/%s/deployments/%s' % (namespace, name)).get('status') or {}
        pods = _pods(cp, namespace, name)
        ok = (status.get('updatedReplicas') == 1 and status.get('availableReplicas') == 1 and len(pods) == 1
              and pods[0]['spec']['containers'][0]['image'] == image
              and _conditions(pods[0]).get('Ready', {}).get('status') == 'True')
        return ok, (status, [(p['metadata']['name'], p['spec']['containers'][0]['image'], p['status'].get('phase')) for p in pods])
    return Lab.wait_until(probe, WAIT, what='Deployment %s/%s rolled out with %s' % (namespace, name, image))


def test_new_pods_of_a_faulted_deployment_wait_in_image_pull_back_off_and_running_ones_keep_running(cp):
    _default_service_account(cp, 'default')
    _deployment(cp, 'default', 'web', 'nginx:1.27')
    _rolled_out(cp, 'default', 'web', 'nginx:1.27')
    running = _pods(cp, 'default', 'web')[0]['metadata']['name']

    cp.image_pull('default/web', PULL_ERROR)
    # the Deployment moves to an image the registry does not have: the real Deployment controller makes a new pod
    cp.api('PATCH', '/apis/apps/v1/namespaces/default/deployments/web',
           {'spec': {'template': {'spec': {'containers': [{'name': 'web', 'image': 'nginx:9.99'}]}}}},
           content_type='application/strategic-merge-patch+json')
    image_error = PULL_ERROR.replace('{image}', 'nginx:9.99')

    def backing_off():
        pods = [p for p in _pods(cp, 'default', 'web') if p['metadata']['name'] != running]
        waiting = [((s.get('state') or {}).get('waiting') or {}) for p in pods for s in p['status'].get('containerStatuses') or ()]
        return bool(waiting) and waiting[0].get('reason') == 'ImagePullBackOff', pods
    new = Lab.wait_until(backing_off, WAIT, what='the new pod in ImagePullBackOff')[0]
    status = new['status']['containerStatuses'][0]
    assert status['state']['waiting']['message'] == 'Back-off pulling image "nginx:9.99": ErrImagePull: ' + image_error
    assert status['ready'] is False and status['image'] == 'nginx:9.99'
    assert new['status']['phase'] == 'Pending'
    conditions = _conditions(new)
    # placed by kube-scheduler, not Ready: kwok's pod-ready stage left it to the kubelet stand-in
    assert conditions['PodScheduled']['status'] == 'True' and conditions['Ready']['status'] == 'False'
    assert conditions['Ready']['reason'] == 'ContainersNotReady'
    assert new['metadata']['labels'][policies.IMAGE_PULL_LABEL] == 'true'
    # the pod that ran before the fault keeps running, and the rollout waits (the Deployment's own status)
    old = cp.api('GET', '/api/v1/namespaces/default/pods/' + running)
    assert _conditions(old)['Ready']['status'] == 'True'
    deployment = cp.api('GET', '/apis/apps/v1/namespaces/default/deployments/web')
    assert deployment['status'].get('availableReplicas') == 1 and deployment['status'].get('updatedReplicas') == 1
    assert deployment['status'].get('readyReplicas') == 1   # the old pod's

    cp.clear_image_pull('default/web')
    _rolled_out(cp, 'default', 'web', 'nginx:9.99')
    # no policy left behind
    names = [p['metadata']['name'] for p in cp.api('GET', policies.API + 'mutatingadmissionpolicies')['items']]
    assert policies.policy_name('image-pull', 'default', 'web') not in names


def test_the_first_failure_is_err_image_pull_with_the_registry_error():
    """ImagePulls writes ErrImagePull first, ImagePullBackOff on the next event (image_manager.go:412, then :338-347)."""
    patches = []
    plane = types.SimpleNamespace(api=lambda method, path, body=None, **kw: patches.append(body))
    pulls = kubelet.ImagePulls(plane)
    pod = {'metadata': {'name': 'p', 'namespace': 'ns'}, 'spec': {'containers': [{'name': 'c', 'image': 'x:1'}]},
           'status': {'phase': 'Pending'}}
    pulls._pull_fails(pod, 'no {image}')  # pylint: disable=protected-access
    waiting = patches[-1]['status']['containerStatuses'][0]['state']['waiting']
    assert waiting == {'reason': 'ErrImagePull', 'message': 'no x:1'}
    pod['status'] = patches[-1]['status']
    pulls._pull_fails(pod, 'no {image}')  # pylint: disable=protected-access
    waiting = patches[-1]['status']['containerStatuses'][0]['state']['waiting']
    assert waiting == {'reason': 'ImagePullBackOff', 'message': 'Back-off pulling image "x:1": ErrImagePull: no x:1'}
    count = len(patches)
    pod['status'] = patches[-1]['status']
    pulls._pull_fails(pod, 'no {image}')  # pylint: disable=protected-access
    assert len(patches) == count   # reported already


def test_the_pods_workload_is_found_through_its_owner():
    def pod(kind, name, template_hash=None):
        labels = {'pod-template-hash': template_hash} if template_hash else {}
        return {'metadata': {'namespace': 'ns', 'labels': labels, 'ownerReferences': [{'kind': kind, 'name': name}]}}
    assert kubelet.workload_of(pod('ReplicaSet', 'web-5d4f8c', '5d4f8c')) == 'ns/web'
    assert kubelet.workload_of(pod('ReplicaSet', 'web-5d4f8c')) is None
    assert kubelet.workload_of(pod('DaemonSet', 'kube-proxy')) == 'ns/kube-proxy'
    assert kubelet.workload_of(pod('StatefulSet', 'db')) == 'ns/db'
    assert kubelet.workload_of(pod('Job', 'once')) is None


def test_a_pending_fault_leaves_new_pods_to_the_schedulers_insufficient_cpu_without_editing_the_deployment(cp):
    _default_service_account(cp, 'default')
    cp.pending('default/api')
    _deployment(cp, 'default', 'api', 'ghcr.io/example/api:1.0')

    def unschedulable():
        pods = _pods(cp, 'default', 'api')
        scheduled = _conditions(pods[0]).get('PodScheduled', {}) if pods else {}
        return scheduled.get('reason') == 'Unschedulable', (pods and pods[0]['status'], scheduled)
    pod_status, scheduled = Lab.wait_until(unschedulable, WAIT, what='the api pod Unschedulable')
    # kube-scheduler's own message (noderesources fit.go:702 `Insufficient cpu`; framework's FitError)
    assert scheduled['status'] == 'False'
    assert scheduled['message'].startswith('0/1 nodes are available: 1 Insufficient cpu.'), scheduled['message']
    assert pod_status['phase'] == 'Pending'
    deployment = cp.api('GET', '/apis/apps/v1/namespaces/default/deployments/api')
    assert 'resources' not in deployment['spec']['template']['spec']   # the user's object is as they wrote it
    assert deployment['spec']['template']['spec']['containers'][0].get('resources', {}) == {}

    cp.clear_pending('default/api')
    _rolled_out(cp, 'default', 'api', 'ghcr.io/example/api:1.0')
    assert 'resources' not in _pods(cp, 'default', 'api')[0]['spec']


def test_a_workload_fault_names_a_bad_target(cp):
    with pytest.raises(ControlPlaneError, match="NAMESPACE/NAME of a Deployment, DaemonSet or StatefulSet, got 'web'"):
        cp.image_pull('web')
    with pytest.raises(ControlPlaneError, match="NAMESPACE/NAME of a Deployment or StatefulSet, got 'a/b/c'"):
        cp.pending('a/b/c')


def _connect(address, port):
    """'open', or the error a client meets."""
    try:
        with socket.create_connection((address, port), timeout=2):
            return 'open'
    except OSError as exc:
        return type(exc).__name__


def test_the_api_flap_refuses_connections_in_the_down_half(tmp_path):
    """k8s-api-flap on the forwards: the listener goes away for the second half of each period (connection refused),
    and comes back; a mode or a period the fault does not know is refused, naming it."""
    from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
    net = free_net()
    address = '%s.10' % net
    endpoints = []
    world = types.SimpleNamespace(add_endpoint=lambda *a: endpoints.append(a[0]), remove_endpoint=endpoints.remove,
                                  run_dir=str(tmp_path))

    async def scenario():
        backend = await asyncio.start_server(lambda r, w: w.close(), '127.0.0.1', 0)
        port = backend.sockets[0].getsockname()[1]
        k8s = upstream_lab.LabUpstreamKubernetes(world)
        k8s.planes['c'] = types.SimpleNamespace(api_host='127.0.0.1', ports={'kube-apiserver': port})
        k8s.control_planes['c'] = {'cp-1': address}
        await k8s._follow('c')  # pylint: disable=protected-access
        seen = [_connect(address, upstream_lab.API_PORT)]
        with pytest.raises(FaultError, match="mode must be refuse or 503, got 'drop'"):
            await k8s.fault_flap(period=1.0, mode='drop')
        with pytest.raises(FaultError, match='period must be more than 0'):
            await k8s.fault_flap(period=0)
        await k8s.fault_flap(period=2.0)
        loop = asyncio.get_running_loop()
        # wait (a deadline) for the down half, then for the up half again: the forward gone, then back
        for down in (True, False):
            deadline = loop.time() + 5
            while (not k8s.forwards['c']) != down and loop.time() < deadline:
                await asyncio.sleep(0.02)
            assert k8s.api_down == down
            seen.append(await loop.run_in_executor(None, _connect, address, upstream_lab.API_PORT))
            seen.append(sorted(endpoints))
        await k8s.clear_flap()
        assert k8s.flap_task is None and not k8s.api_down
        seen.append(_connect(address, upstream_lab.API_PORT))
        del k8s.planes['c']
        await k8s.close()
        backend.close()
        return seen
    seen = asyncio.run(scenario())
    name = 'k8s-api-%s' % address
    assert seen == ['open', 'ConnectionRefusedError', [], 'open', [name], 'open']


def _api_client(cp, address):
    """The upstream Python Kubernetes client as the admin user, to ADDRESS:6443, checking the name kube-apiserver's
    certificate holds (127.0.0.1) whatever address it is reached at."""
    configuration = kubernetes.client.Configuration()
    configuration.host = 'https://%s:%d' % (address, upstream_lab.API_PORT)
    configuration.ssl_ca_cert = cp.pki_file('ca.crt')
    configuration.cert_file = cp.pki_file('admin.crt')
    configuration.key_file = cp.pki_file('admin.key')
    configuration.tls_server_name = '127.0.0.1'
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))


def _list_namespaces(api):
    """(HTTP status, what came back: the namespace names, or the body of the error answer)."""
    try:
        return 200, sorted(n.metadata.name for n in api.list_namespace(_request_timeout=10).items)
    except kubernetes.client.ApiException as exc:
        return exc.status, exc.body


def _anonymous_readyz(cp, address):
    """The HTTP status of GET /readyz without a client certificate."""
    pool = urllib3.HTTPSConnectionPool(address, upstream_lab.API_PORT, ca_certs=cp.pki_file('ca.crt'),
                                       server_hostname='127.0.0.1', retries=False, timeout=10)
    return pool.request('GET', '/readyz').status


def _presented_certificate(address):
    """The DER certificate the TLS server at ADDRESS:6443 presents."""
    return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate((address, upstream_lab.API_PORT), timeout=5))


def test_the_api_flap_with_mode_503_answers_as_a_load_balancer_without_backend(cp, tmp_path):
    """k8s-api-flap mode=503 before the real kube-apiserver: in the down half the address completes TLS with
    kube-apiserver's own certificate and answers every request (two on one kept-alive connection) with HAProxy's 503;
    in the up half the same client lists the namespaces; each 503 the admin user got is in the request log as source
    k8s (one without a client certificate is not); cleared in a down half, the API answers at once and no front is left."""
    address = '%s.10' % free_net()
    endpoints, logged = [], []
    world = types.SimpleNamespace(add_endpoint=lambda *a: endpoints.append(a[0]), remove_endpoint=endpoints.remove,
                                  run_dir=str(tmp_path),
                                  log_request=lambda *a, **extra: logged.append(a + (extra,)))
    with open(cp.pki_file('apiserver.crt'), encoding='utf-8') as handle:
        apiserver_certificate = ssl.PEM_cert_to_DER_cert(handle.read())
    api = _api_client(cp, address)

    async def wait_for_half(k8s, down):
        """Wait (10 s deadline) until the flap is in that half and the address has the front (down) or the forward."""
        def listening():
            return k8s.api_down, sorted(k8s.fronts.get('c', {})), sorted(k8s.forwards.get('c', {}))
        wanted = (down, [address] if down else [], [] if down else [address])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while listening() != wanted and loop.time() < deadline:
            await asyncio.sleep(0.02)
        assert listening() == wanted, 'in 10 s (down, fronts, forwards) did not become %s: %s' % (wanted, listening())

    async def scenario():
        loop = asyncio.get_running_loop()
        k8s = upstream_lab.LabUpstreamKubernetes(world)
        k8s.planes['c'] = cp
        k8s.control_planes['c'] = {'cp-1': address}
        await k8s._follow('c')  # pylint: disable=protected-access
        seen = {'before': await loop.run_in_executor(None, _list_namespaces, api)}
        message = await k8s.fault_flap(period=4.0, mode='503')
        assert message == 'the API answers 503 (a load balancer with no backend) for the second half of every 4.00 s'
        await wait_for_half(k8s, True)
        seen['down'] = [await loop.run_in_executor(None, _list_namespaces, api) for _attempt in range(2)]
        seen['down certificate'] = await loop.run_in_executor(None, _presented_certificate, address)
        seen['down anonymous'] = await loop.run_in_executor(None, _anonymous_readyz, cp, address)
        seen['down endpoints'] = sorted(endpoints)
        await wait_for_half(k8s, False)
        seen['up'] = await loop.run_in_executor(None, _list_namespaces, api)
        seen['up certificate'] = await loop.run_in_executor(None, _presented_certificate, address)
        await wait_for_half(k8s, True)
        await k8s.clear_flap()
        assert k8s.flap_task is None and not k8s.api_down and not k8s.fronts['c'] and sorted(k8s.forwards['c']) == [address]
        seen['cleared'] = await loop.run_in_executor(None, _list_namespaces, api)
        seen['cleared endpoints'] = sorted(endpoints)
        del k8s.planes['c']
        await k8s.close()
        return seen
    seen = asyncio.run(scenario())
    namespaces = seen['before']
    assert namespaces[0] == 200 and 'kube-system' in namespaces[1]
    haproxy_503 = ('<html><body><h1>503 Service Unavailable</h1>\nNo server is available to handle this request.\n'
                   '</body></html>\n')
    assert seen['down'] == [(503, haproxy_503)] * 2 and seen['down anonymous'] == 503
    assert seen['down certificate'] == apiserver_certificate == seen['up certificate']
    assert seen['up'] == namespaces and seen['cleared'] == namespaces
    name = 'k8s-api-%s' % address
    assert seen['down endpoints'] == [name] and seen['cleared endpoints'] == [name]
    # the admin user's answers of the down half, in the request log (the anonymous one not, as the audit policy does);
    # the ones kube-apiserver gave are in its audit log (drain_audit)
    assert logged == [('k8s', 'GET', '/api/v1/namespaces', 503, {'user': 'admin'})] * 2


def test_the_upstream_world_registers_the_kubernetes_faults_under_lab_k8s_names_and_checks_targets():
    """The fault matrix and the tests name a fault the same way on either world."""
    from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
    registered = {}

    class Registry:  # pylint: disable=too-few-public-methods
        @staticmethod
        def register(name, _description, target_kind, _apply, _clear, params=()):
            registered[name] = (target_kind, [(p.name, p.default) for p in params])

    k8s = upstream_lab.LabUpstreamKubernetes(types.SimpleNamespace())
    k8s.register_faults(Registry())
    assert registered == {
        'k8s-crashloop': ('node', [('workload', 'kube-system/cilium')]),
        'k8s-pending': ('namespace/deployment', []),
        'k8s-api-flap': (None, [('period', 4.0), ('mode', 'refuse')]),
        'k8s-image-pull': ('namespace/workload', [('message', DEFAULT_PULL_ERROR)]),
    }

    async def scenario():
        with pytest.raises(FaultError, match="fault k8s-image-pull: target: workload must be NAMESPACE/NAME .* got 'web'"):
            await k8s.fault_image_pull('web')
        with pytest.raises(FaultError, match="fault k8s-pending: target: workload must be NAMESPACE/NAME .* got ''"):
            await k8s.fault_pending('')
        with pytest.raises(FaultError, match="mode must be refuse or 503, got 'drop'"):
            await k8s.fault_flap(mode='drop')
        # no control plane yet: kept for the ones that start (on_etcd_bootstrapped applies them)
        await k8s.fault_image_pull('kube-system/kube-proxy', message='gone')
        await k8s.fault_pending('kube-system/cilium-operator')
        assert k8s.image_pull == {'kube-system/kube-proxy': 'gone'} and k8s.pending == {'kube-system/cilium-operator'}
        await k8s.clear_image_pull('kube-system/kube-proxy')
        await k8s.clear_pending('kube-system/cilium-operator')
        assert not k8s.image_pull and not k8s.pending
    asyncio.run(scenario())
