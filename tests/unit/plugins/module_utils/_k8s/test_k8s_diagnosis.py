"""Human text for nodes and pods that are not Ready."""
import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import diagnosis


@pytest.mark.parametrize('name, reason', [
    ('cilium-4xk2p', None),
    ('cilium-x7k2m', 'CrashLoopBackOff (container cilium-agent, 7 restarts, last exit code 1 Error)'),
    ('coredns-5d78c9869d-kq8wz', 'ImagePullBackOff (container coredns): Back-off pulling image '
                                 '"registry.k8s.io/coredns/coredns:v1.12.9": ErrImagePull: failed to pull and unpack image'),
    ('cilium-operator-6d8f9b7c4-zt5lp', "Pending Unschedulable: 0/1 nodes are available: 1 node(s) didn't match pod "
                                        "anti-affinity rules. preemption: 0/1 nodes are available: 1 No preemption "
                                        "victims found for incoming pod."),
    ('sealed-secrets-controller-7f8b9c6d5-abcde', 'not Ready (container controller running, readiness probe not passing)'),
    ('proxmox-csi-plugin-node-qq7vx', 'Init:CrashLoopBackOff (init container wait-for-config, 3 restarts, '
                                      'last exit code 2 Error)'),
    ('helm-install-cilium-8sd7f', 'Succeeded'),
    ('cilium-old-r2d2x', 'Terminating'),
])
def test_pod_reason(k8s_objects, name, reason):
    assert diagnosis.pod_reason(k8s_objects.pod(name)) == reason


def test_pod_line_names_namespace_pod_and_node(k8s_objects):
    assert diagnosis.pod_line(k8s_objects.pod('cilium-x7k2m')) == (
        'kube-system/cilium-x7k2m on w-2: CrashLoopBackOff (container cilium-agent, 7 restarts, last exit code 1 Error)')


def test_pending_pod_without_status():
    pod = {'metadata': {'name': 'p', 'namespace': 'n'}, 'spec': {}, 'status': {'phase': 'Pending'}}
    assert diagnosis.pod_reason(pod) == 'Pending (not scheduled yet)'
    pod['spec']['nodeName'] = 'w-1'
    assert diagnosis.pod_reason(pod) == 'Pending (ContainerCreating)'


def test_oom_killed_container_is_named():
    pod = {'metadata': {'name': 'p'}, 'spec': {'nodeName': 'w-1'}, 'status': {
        'phase': 'Running', 'conditions': [{'type': 'Ready', 'status': 'False'}],
        'containerStatuses': [{'name': 'app', 'ready': False, 'restartCount': 2,
                               'state': {'terminated': {'reason': 'OOMKilled', 'exitCode': 137}}}]}}
    assert diagnosis.pod_reason(pod) == 'Terminated OOMKilled (container app, exit code 137)'


def test_node_detail_carries_the_kubelet_message(k8s_objects):
    text = diagnosis.node_detail(k8s_objects.node('w-2'))
    assert text == ('Ready=False KubeletNotReady: container runtime network not ready: NetworkReady=false '
                    'reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized')
    assert diagnosis.node_detail(k8s_objects.node('w-4')) == 'conditions True: DiskPressure; cordoned (spec.unschedulable)'
    assert diagnosis.node_detail(k8s_objects.node('cp-1')) == 'Ready'


def test_limit_list():
    assert diagnosis.limit_list(['a', 'b']) == 'a; b'
    assert diagnosis.limit_list([str(i) for i in range(8)], 3) == '0; 1; 2; and 5 more'


def test_clip_collapses_whitespace_and_cuts():
    assert diagnosis.clip('a\n  b') == 'a b'
    assert diagnosis.clip('x' * 50, 10) == 'xxxxxxx...'
