"""k8s_gate as Ansible runs it: arguments in, JSON out. The API is mocked at the client factory seam
(build_client / KubeClient) and waits run on a fake clock."""
import json

import pytest
import yaml

from ansible.module_utils.testing import patch_module_args

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import gates
from ansible_collections.proxtalos.cluster.plugins.modules import k8s_gate
from ansible_collections.proxtalos.cluster.tests.unit.plugins.module_utils._k8s.fake_kube import (
    FakeClock, FakeKube, fixture)

TOKEN = 'bootstrap-token-4f1e0c2a9d7b6e53'


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    real_run = gates.run

    def run_on_fake_clock(*args, **kwargs):
        kwargs.update(clock=fake.clock, sleep=fake.sleep)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(gates, 'run', run_on_fake_clock)
    return fake


@pytest.fixture
def kube(clock, monkeypatch):
    fake = FakeKube(clock)
    fake.add(*[fixture('nodes.yaml', n) for n in ('cp-1', 'w-1', 'w-2')])
    fake.add(*[fixture('pods.yaml', n) for n in ('cilium-4xk2p', 'cilium-9bqzt', 'cilium-x7k2m')])
    fake.built_with = []

    def build_client(params, module=None, warn=None):
        fake.built_with.append(dict(params))
        return fake

    monkeypatch.setattr(k8s_client, 'build_client', build_client)
    return fake


def run_module_output(args, capsys):
    """(exit code, raw stdout) of one module run."""
    with patch_module_args(args):
        with pytest.raises(SystemExit) as caught:
            k8s_gate.main()
    return caught.value.code, capsys.readouterr().out


def run_module(args, capsys):
    """(exit code, result dict) of one module run."""
    code, out = run_module_output(args, capsys)
    return code, json.loads(out)


def heal_w2(kube):
    node = kube.find('Node', 'w-2')
    node['spec']['taints'] = []
    node['status']['conditions'] = [{'type': 'Ready', 'status': 'True', 'reason': 'KubeletReady'}]


def test_passes_after_waiting_and_reports_what_it_saw(kube, clock, capsys):
    kube.at(3, heal_w2)
    rc, result = run_module({'gate': 'nodes', 'kubeconfig': '/dev/null', 'expected_count': 3, 'wait_sleep': 1}, capsys)
    assert rc == 0
    assert result['changed'] is False and result['passed'] is True
    assert result['summary'] == 'nodes Ready 3/3'
    assert result['attempts'] == 4 and result['elapsed'] == pytest.approx(3)
    assert [item['name'] for item in result['details']] == ['cp-1', 'w-1', 'w-2']
    assert [entry['summary'] for entry in result['progress']] == ['nodes Ready 2/3: w-2 NetworkPluginNotReady',
                                                                  'nodes Ready 3/3']
    assert result['api_requests'] == 4
    assert kube.built_with[0]['kubeconfig'] == '/dev/null' and kube.built_with[0]['validate_certs'] is True


def test_timeout_fails_with_the_diagnosis(kube, clock, capsys):
    rc, result = run_module({'gate': 'nodes', 'kubeconfig': '/dev/null', 'wait_timeout': 10, 'wait_sleep': 2}, capsys)
    assert rc == 1 and result['failed'] is True and result['changed'] is False and result['passed'] is False
    assert result['msg'].startswith('nodes not reached after 10.0s (6 probes): nodes Ready 2/3: w-2 NetworkPluginNotReady\n')
    assert 'pods not Ready there: kube-system/cilium-x7k2m on w-2: CrashLoopBackOff' in result['msg']
    assert result['diagnosis'][0].startswith('- w-2: Ready=False KubeletNotReady')
    assert result['attempts'] == 6 and result['details'][2]['reason'] == 'NetworkPluginNotReady'


def test_check_mode_probes_once(kube, clock, capsys):
    rc, result = run_module({'gate': 'nodes', 'kubeconfig': '/dev/null', 'wait_timeout': 300,
                             '_ansible_check_mode': True}, capsys)
    assert rc == 1 and result['attempts'] == 1 and clock.sleeps == []
    kube.at(0, heal_w2)
    heal_w2(kube)
    rc, result = run_module({'gate': 'nodes', 'kubeconfig': '/dev/null', '_ansible_check_mode': True}, capsys)
    assert rc == 0 and result['changed'] is False


def test_wait_false_probes_once(kube, clock, capsys):
    rc, result = run_module({'gate': 'nodes', 'kubeconfig': '/dev/null', 'wait': False}, capsys)
    assert rc == 1 and result['attempts'] == 1


def test_daemonset_gate_via_the_module(kube, clock, capsys):
    kube.add(fixture('workloads.yaml', 'cilium'))
    rc, result = run_module({'gate': 'workload', 'kind': 'DaemonSet', 'namespace': 'kube-system', 'name': 'cilium',
                             'kubeconfig': '/dev/null', 'wait_timeout': 4}, capsys)
    assert rc == 1
    assert result['target'] == 'DaemonSet kube-system/cilium'
    assert '- w-2: cilium-x7k2m CrashLoopBackOff' in result['msg']
    assert result['problems'] == ['status numberReady 2 < desiredNumberScheduled 3']


@pytest.mark.parametrize('args, text', [
    ({'gate': 'workload', 'kind': 'DaemonSet'}, 'gate is workload but all of the following are missing: name, namespace'),
    ({'gate': 'workload', 'kind': 'Job', 'name': 'a', 'namespace': 'b'}, "kind: gate=workload takes one of"),
    ({'gate': 'nodes', 'name': 'x'}, 'name: does not apply to gate=nodes'),
    ({'gate': 'nodes', 'kubeconfig': '/a', 'kubeconfig_content': 'clusters: []'}, 'parameters are mutually exclusive: kubeconfig|kubeconfig_content'),
])
def test_bad_input_names_the_field(kube, capsys, args, text):
    rc, result = run_module(args, capsys)
    assert rc == 1 and text in result['msg']


def test_api_errors_fail_cleanly(kube, clock, capsys):
    kube.fail_next = [_errors.ApiError('Kubernetes API answered 403 for /api/v1/nodes: forbidden', service='Kubernetes API',
                                       status=403)]
    rc, result = run_module({'gate': 'nodes', 'kubeconfig': '/dev/null'}, capsys)
    assert rc == 1 and result['msg'] == 'Kubernetes API answered 403 for /api/v1/nodes: forbidden'
    assert result['status'] == 403 and result['changed'] is False


def test_progress_file(kube, clock, capsys, tmp_path):
    kube.at(2, heal_w2)
    path = tmp_path / 'progress.jsonl'
    rc = run_module({'gate': 'nodes', 'kubeconfig': '/dev/null', 'progress_file': str(path), 'wait_sleep': 1}, capsys)[0]
    assert rc == 0
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e['event'], e['summary']) for e in events] == [
        ('start', 'waiting for k8s_gate nodes'),
        ('progress', 'nodes Ready 2/3: w-2 NetworkPluginNotReady'),
        ('end', 'nodes Ready 3/3')]


def test_kubeconfig_secrets_never_reach_the_output(clock, capsys, monkeypatch):
    """The real factory registers the token; even an API that echoes it cannot leak it."""
    fake = FakeKube(clock)
    node = fixture('nodes.yaml', 'w-2')
    node['status']['conditions'][-1]['message'] = 'kubelet rejected token %s' % TOKEN
    node['status']['conditions'][-1]['reason'] = 'Unauthorized'
    fake.add(node)
    monkeypatch.setattr(k8s_client, 'KubeClient', lambda configuration, timeout: fake)
    kubeconfig = {'apiVersion': 'v1', 'current-context': 'c',
                  'clusters': [{'name': 'lab', 'cluster': {'server': 'https://127.0.0.1:6443'}}],
                  'users': [{'name': 'admin', 'user': {'token': TOKEN}}],
                  'contexts': [{'name': 'c', 'context': {'cluster': 'lab', 'user': 'admin'}}]}
    rc, out = run_module_output({'gate': 'nodes', 'kubeconfig_content': yaml.safe_dump(kubeconfig), 'wait': False}, capsys)
    result = json.loads(out)
    assert rc == 1
    assert TOKEN not in out
    assert 'kubelet rejected token ********' in result['msg']


def test_validate_certs_false_warns(clock, capsys, monkeypatch):
    fake = FakeKube(clock)
    fake.add(fixture('nodes.yaml', 'cp-1'))
    monkeypatch.setattr(k8s_client, 'KubeClient', lambda configuration, timeout: fake)
    # Where a warning ends up depends on whether controller code was imported in this process
    # (ansible.module_utils.common.warnings), so record the module's warn() calls directly.
    warned = []
    monkeypatch.setattr(k8s_gate.AnsibleModule, 'warn', lambda self, text: warned.append(text))
    kubeconfig = {'current-context': 'c', 'clusters': [{'name': 'lab', 'cluster': {'server': 'https://127.0.0.1:6443'}}],
                  'users': [{'name': 'admin', 'user': {'token': TOKEN}}],
                  'contexts': [{'name': 'c', 'context': {'cluster': 'lab', 'user': 'admin'}}]}
    rc, result = run_module({'gate': 'nodes', 'kubeconfig_content': kubeconfig, 'validate_certs': False}, capsys)
    assert rc == 0 and result['passed']
    assert warned == ['validate_certs=false: the certificate of the Kubernetes API at https://127.0.0.1:6443 is not verified']
