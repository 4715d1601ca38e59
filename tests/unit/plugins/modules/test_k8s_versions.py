"""k8s_versions: the versions read from Nodes and kube-system pods, the upgrade path rule, the per-node wait check."""

from ansible_collections.proxtalos.cluster.plugins.modules import k8s_versions as mod


class FakeKube:
    def __init__(self, nodes, pods):
        self.nodes = nodes
        self.pods = pods

    def list(self, api_version, kind, namespace=None, label_selector=None, field_selector=None):
        del api_version, label_selector, field_selector
        return self.nodes if kind == 'Node' else [p for p in self.pods if p['metadata']['namespace'] == namespace]


def node(name, kubelet, ready=True):
    return {'metadata': {'name': name}, 'status': {'nodeInfo': {'kubeletVersion': kubelet},
                                                   'conditions': [{'type': 'Ready', 'status': 'True' if ready else 'False'}]}}


def pod(component, on, image, ready=True, namespace='kube-system'):
    return {'metadata': {'name': '%s-%s' % (component, on), 'namespace': namespace, 'labels': {'k8s-app': component}},
            'spec': {'nodeName': on, 'containers': [{'name': component, 'image': image}]},
            'status': {'conditions': [{'type': 'Ready', 'status': 'True' if ready else 'False'}]}}


def test_image_version_reads_the_tag():
    assert mod.image_version('registry.k8s.io/kube-apiserver:v1.36.3') == 'v1.36.3'
    assert mod.image_version('localhost:5000/kube-apiserver') == ''
    assert mod.image_version('mirror:5000/kube-apiserver:1.36.3@sha256:abc') == 'v1.36.3'


def test_the_lowest_version_counts_kubelets_and_components():
    kube = FakeKube([node('cp-1', 'v1.35.4'), node('w-1', 'v1.34.3')],
                    [pod('kube-apiserver', 'cp-1', 'registry.k8s.io/kube-apiserver:v1.35.4'),
                     pod('coredns', 'cp-1', 'registry.k8s.io/coredns/coredns:v1.12.1'),
                     pod('kube-apiserver', 'cp-1', 'x:v1.20.0', namespace='default')])
    seen = mod.observe(kube)
    assert seen['cp-1']['components'] == {'kube-apiserver': {'version': 'v1.35.4', 'pod': 'kube-apiserver-cp-1',
                                                             'ready': True, 'deleting': False}}
    assert mod.lowest_version(seen) == (1, 34, 3)


def test_the_path_refuses_a_downgrade_and_a_skipped_minor_naming_both_versions():
    assert mod.path_problem((1, 35, 4), (1, 36, 3)) is None
    assert mod.path_problem((1, 35, 4), (1, 35, 9)) is None
    assert mod.path_problem((1, 35, 4), (1, 35, 2)) == (
        'kubernetes_version 1.35.2 is older than 1.35.4, the lowest version the cluster runs: a downgrade is refused')
    assert mod.path_problem((1, 34, 3), (1, 36, 3)) == (
        'kubernetes_version 1.36.3 skips a minor from 1.34.3, the lowest version the cluster runs: upgrade one minor at '
        'a time (1.35 first)')
    assert 'skips a minor' in mod.path_problem((1, 36, 3), (2, 0, 0))


def test_a_node_is_done_once_its_kubelet_and_components_run_the_target_and_are_ready():
    nodes = mod.observe(FakeKube([node('cp-1', 'v1.36.3', ready=False)],
                                 [pod('kube-apiserver', 'cp-1', 'registry.k8s.io/kube-apiserver:v1.36.3'),
                                  pod('kube-scheduler', 'cp-1', 'registry.k8s.io/kube-scheduler:v1.35.4')]))
    assert mod.node_problem(nodes, 'cp-1', 'v1.36.3', False, ['kube-apiserver']) is None
    assert mod.node_problem(nodes, 'cp-1', 'v1.36.3', True, ['kube-scheduler', 'kube-controller-manager']) == (
        'kubelet on v1.36.3, the Node not Ready; kube-scheduler-cp-1 runs v1.35.4; no kube-controller-manager pod')
    assert mod.node_problem(nodes, 'cp-9', 'v1.36.3', True, []) == 'Node cp-9 does not exist'
