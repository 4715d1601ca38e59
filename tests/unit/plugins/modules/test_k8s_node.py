"""k8s_node's drain against a fake API: a Ready Node's evicted pods are waited for; a Node that is not Ready gets its
evictions asked and not waited for (its kubelet cannot finish them; PodGC removes them once the Node is deleted)."""

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors, _wait
from ansible_collections.proxtalos.cluster.plugins.modules import k8s_node


class FakeKube(object):
    """Just what drain() calls; evicted pods go away only when `kubelet_finishes` (a Ready Node's kubelet)."""

    def __init__(self, ready, kubelet_finishes):
        self.node = {'metadata': {'name': 'w-1'}, 'spec': {},
                     'status': {'conditions': [{'type': 'Ready', 'status': 'True' if ready else 'Unknown'}]}}
        self.pods = {'default/web-1': self._pod('web-1'), 'default/web-2': self._pod('web-2')}
        self.kubelet_finishes = kubelet_finishes
        self.evictions = []

    @staticmethod
    def _pod(name):
        return {'metadata': {'name': name, 'namespace': 'default', 'uid': 'uid-' + name},
                'spec': {'nodeName': 'w-1'}, 'status': {'phase': 'Running'}}

    def get(self, api_version, kind, name):
        return self.node if kind == 'Node' and name == 'w-1' else None

    def list(self, api_version, kind, field_selector=None):
        return list(self.pods.values())

    def send_json(self, method, path, body=None, content_type=None):
        if path.endswith('/w-1') and method == 'PATCH':
            self.node['spec'].update(body['spec'])

    def request(self, path, method='GET', body=None):
        name = path.split('/')[-2]
        self.evictions.append(name)
        if self.kubelet_finishes:
            self.pods.pop('default/' + name, None)
        return 201, b'{}'

    def get_json(self, path):
        return self.pods.get('default/' + path.split('/')[-1])


class FakeModule(object):
    check_mode = False

    def __init__(self):
        self.warnings = []

    def warn(self, text):
        self.warnings.append(text)


def run_drain(kube, timeout=0.3):
    module, result = FakeModule(), {'cordoned': False, 'evicted': [], 'left_terminating': []}
    k8s_node.drain(module, kube, 'w-1', result, _wait.Deadline(timeout), 0.05)
    return module, result


def test_a_ready_nodes_pods_are_evicted_and_waited_for():
    kube = FakeKube(ready=True, kubelet_finishes=True)
    module, result = run_drain(kube)
    assert result['cordoned'] and kube.node['spec']['unschedulable'] is True
    assert result['evicted'] == ['default/web-1', 'default/web-2'] and result['left_terminating'] == []
    assert module.warnings == []


def test_a_ready_node_whose_pods_do_not_go_fails_naming_them():
    kube = FakeKube(ready=True, kubelet_finishes=False)
    with pytest.raises(_errors.WaitTimeout, match=r'Node w-1: gave up .* 2 pod\(s\) not gone yet: default/web-1, default/web-2'):
        run_drain(kube)


def test_a_node_that_is_not_ready_gets_its_evictions_without_a_wait():
    kube = FakeKube(ready=False, kubelet_finishes=False)
    module, result = run_drain(kube, timeout=30)
    assert sorted(kube.evictions) == ['web-1', 'web-2']
    assert result['left_terminating'] == ['default/web-1', 'default/web-2']
    (warning,) = module.warnings
    assert warning.startswith('Node w-1 is not Ready') and 'PodGC' in warning


def test_node_ready_reads_the_ready_condition():
    assert k8s_node.node_ready({'status': {'conditions': [{'type': 'Ready', 'status': 'True'}]}})
    assert not k8s_node.node_ready({'status': {'conditions': [{'type': 'Ready', 'status': 'False'}]}})
    assert not k8s_node.node_ready({'status': {}})
