"""k8s_gate as Ansible runs it: arguments in, JSON out. The API is mocked at the client factory seam
(build_client / KubeClient) and waits run on a fake clock."""
import json

import pytest
import yaml


from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import gates
from ansible_collections.proxtalos.cluster.plugins.modules import k8s_gate
from ansible_collections.proxtalos.cluster.tests.helpers import FakeClock, run_main
from ansible_collections.proxtalos.cluster.tests.unit.plugins.module_utils._k8s.fake_kube import FakeKube, fixture

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
    code, dummy, out = run_main(k8s_gate, args, capsys)
    return code, out


def run_module(args, capsys):
    """(exit code, result dict) of one module run."""
    code, result, dummy = run_main(k8s_gate, args, capsys)
    return code, result


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
    assert result['problems'] == ['status numberAvailable 2 < desiredNumberScheduled 3']


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


# --- several gates in one run (option `gates`) ---------------------------------------------------------------

API = {'title': 'API ready', 'gate': 'api'}
REGISTERED = {'title': 'ALL nodes registered', 'gate': 'nodes', 'node_state': 'registered', 'expected_count': 3}
READY = {'title': 'ALL nodes Ready', 'gate': 'nodes', 'expected_count': 3}
AGENTS = {'title': 'Cilium agents', 'gate': 'pods', 'namespace': 'kube-system', 'label_selectors': ['k8s-app=cilium'],
          'every_node': True}


def gates_args(*items, **top):
    args = {'kubeconfig': '/dev/null', 'wait_sleep': 1, 'gates': [dict(item) if isinstance(item, dict) else item for item in items]}
    args.update(top)
    return args


def test_gates_run_in_order_on_one_client(kube, clock, capsys):
    kube.at(3, heal_w2)
    rc, result = run_module(gates_args(API, REGISTERED, READY), capsys)
    assert rc == 0, result['msg']
    assert result['changed'] is False and result['passed'] is True
    assert [step['title'] for step in result['results']] == ['API ready', 'ALL nodes registered', 'ALL nodes Ready']
    assert [step['gate'] for step in result['results']] == ['api', 'nodes', 'nodes']
    assert [step['summary'] for step in result['results']] == ['API /readyz ok', 'nodes registered 3/3', 'nodes Ready 3/3']
    # the first two pass at once; the third waits until w-2 heals at 3 s
    assert [step['attempts'] for step in result['results']] == [1, 1, 4]
    assert result['results'][2]['elapsed'] == pytest.approx(3)
    assert result['results'][2]['progress'][0]['summary'] == 'nodes Ready 2/3: w-2 NetworkPluginNotReady'
    assert [call[:2] for call in kube.calls[:3]] == [('readyz', False), ('list', 'Node'), ('list', 'Node')]
    assert len(kube.built_with) == 1 and result['api_requests'] == kube.requests == 6
    assert [step['api_requests'] for step in result['results']] == [1, 1, 4]
    # each gate's wall-clock span, in order and not overlapping (the fake clock does not move the wall clock)
    spans = [(gate.pop('started_at'), gate.pop('ended_at')) for gate in result['gates']]
    assert all(isinstance(value, float) for span in spans for value in span)
    assert all(start <= end for start, end in spans) and all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert result['gates'] == [
        {'name': 'API ready', 'ok': True, 'observation': 'API /readyz ok', 'elapsed': 0.0, 'attempts': 1,
         'target': 'API /readyz', 'diagnosis': []},
        {'name': 'ALL nodes registered', 'ok': True, 'observation': 'nodes registered 3/3', 'elapsed': 0.0, 'attempts': 1,
         'target': 'nodes', 'diagnosis': []},
        {'name': 'ALL nodes Ready', 'ok': True, 'observation': 'nodes Ready 3/3', 'elapsed': 3.0, 'attempts': 4,
         'target': 'nodes', 'diagnosis': []}]
    assert result['not_run'] == []
    # what the nodes gates saw of each node, for the run report (the last gate's word: Ready)
    assert result['report_facts_by_host']['w-2']['kubernetes_ready'] is True
    assert 'kubernetes_reason' not in result['report_facts_by_host']['w-2']
    for single_form_key in ('gate', 'summary', 'details', 'progress'):
        assert single_form_key not in result


def test_a_failing_middle_gate_stops_the_rest_and_names_itself(kube, clock, capsys):
    kube.add(fixture('workloads.yaml', 'cilium'))
    ready = dict(READY, wait_timeout=4)
    rc, result = run_module(gates_args(API, ready, AGENTS), capsys)
    assert rc == 1 and result['failed'] is True and result['changed'] is False and result['passed'] is False
    lines = result['msg'].splitlines()
    assert lines[0] == ("gate 'ALL nodes Ready' (step 2 of 3) failed: nodes not reached after 4.0s (5 probes): "
                        "nodes Ready 2/3: w-2 NetworkPluginNotReady")
    assert 'pods not Ready there: kube-system/cilium-x7k2m on w-2: CrashLoopBackOff' in result['msg']
    assert lines[-2:] == ['passed before it: API ready', 'not run: Cilium agents']
    assert result['failed_gate'] == 'ALL nodes Ready' and result['not_run'] == ['Cilium agents']
    assert [step['title'] for step in result['results']] == ['API ready', 'ALL nodes Ready']
    assert [gate['ok'] for gate in result['gates']] == [True, False]
    assert result['gates'][1]['diagnosis'] == result['diagnosis'] == result['results'][1]['diagnosis']
    assert result['diagnosis'][0].startswith('- w-2: Ready=False KubeletNotReady')
    # the agents gate never read its pods
    assert not [call for call in kube.calls if call[:2] == ('list', 'Pod') and call[3] == 'k8s-app=cilium']
    assert result['report_facts_by_host']['w-2'] == {'kubernetes_ready': False, 'kubernetes_reason': 'NetworkPluginNotReady'}


def test_each_gate_has_its_own_deadline(kube, clock, capsys):
    # the module's wait_timeout (6) for an item without one, the item's own (2) otherwise; each from its own start
    kube.at(100, heal_w2)
    rc, result = run_module(gates_args(REGISTERED, READY, wait_timeout=6), capsys)
    assert rc == 1 and result['results'][1]['elapsed'] == pytest.approx(6) and result['results'][1]['attempts'] == 7
    kube.requests = 0
    rc, result = run_module(gates_args(dict(REGISTERED), dict(READY, wait_timeout=2), wait_timeout=6), capsys)
    assert rc == 1 and result['results'][1]['elapsed'] == pytest.approx(2) and result['results'][1]['attempts'] == 3
    assert 'not reached after 2.0s (3 probes)' in result['msg']


def test_an_items_own_deadline_counts_also_when_the_modules_is_zero(kube, clock, capsys):
    kube.at(100, heal_w2)
    rc, result = run_module(gates_args(API, dict(READY, wait_timeout=3), wait_timeout=0), capsys)
    assert rc == 1 and [step['attempts'] for step in result['results']] == [1, 4]
    assert result['results'][1]['elapsed'] == pytest.approx(3)


def test_a_later_gate_gets_its_whole_deadline_after_an_earlier_one_waited(kube, clock, capsys):
    kube.at(3, heal_w2)
    slow_first = dict(READY, wait_timeout=4)
    then_agents = dict(AGENTS, wait_timeout=2)
    kube.add(fixture('workloads.yaml', 'cilium'))
    rc, result = run_module(gates_args(slow_first, then_agents), capsys)
    # the agents gate (w-2's agent crash-loops) still probes for its own 2 s after the first used 3 s
    assert rc == 1 and result['results'][0]['passed'] is True and result['results'][0]['elapsed'] == pytest.approx(3)
    assert result['results'][1]['elapsed'] == pytest.approx(2) and result['results'][1]['attempts'] == 3
    assert result['msg'].startswith("gate 'Cilium agents' (step 2 of 2) failed: ")
    assert result['not_run'] == []


def test_check_mode_and_wait_false_probe_each_gate_once(kube, clock, capsys):
    for top in ({'_ansible_check_mode': True}, {'wait': False}):
        rc, result = run_module(gates_args(API, dict(READY, wait_timeout=60), **top), capsys)
        assert rc == 1 and [step['attempts'] for step in result['results']] == [1, 1] and clock.sleeps == []
    heal_w2(kube)
    rc, result = run_module(gates_args(API, READY, _ansible_check_mode=True), capsys)
    assert rc == 0 and result['changed'] is False and result['passed'] is True


def test_an_api_error_fails_the_gate_it_happened_in(kube, clock, capsys):
    heal_w2(kube)
    original = kube.list

    def forbidden_nodes(api_version, kind, **kwargs):
        if kind == 'Node':
            raise _errors.ApiError('Kubernetes API answered 403 for /api/v1/nodes: forbidden', service='Kubernetes API', status=403)
        return original(api_version, kind, **kwargs)

    kube.list = forbidden_nodes
    rc, result = run_module(gates_args(API, READY, AGENTS), capsys)
    assert rc == 1
    assert result['msg'].splitlines()[0] == ("gate 'ALL nodes Ready' (step 2 of 3) failed: "
                                             "Kubernetes API answered 403 for /api/v1/nodes: forbidden")
    assert result['not_run'] == ['Cilium agents'] and result['results'][1]['summary'].endswith('forbidden')
    assert result['results'][1]['attempts'] == 1 and clock.sleeps == []


@pytest.mark.parametrize('items, top, text', [
    ([API, {'gate': 'nodes'}], {}, 'gates[1]: missing required arguments: title'),
    ([API, {'title': 'Operator', 'gate': 'workload', 'kind': 'Deployment'}], {},
     'gates[1] (Operator): gate is workload but all of the following are missing: name, namespace'),
    ([dict(API, name='kube-apiserver')], {}, 'gates[0] (API ready).name: does not apply to gate=api'),
    ([dict(READY, expected_count=-1)], {}, 'gates[0] (ALL nodes Ready).expected_count: must be zero or more'),
    ([dict(READY, node_state='gone')], {}, 'gates[0] (ALL nodes Ready): value of node_state must be one of: ready, registered'),
    ([dict(API, wait_timout=5)], {}, 'gates[0] (API ready): unsupported option wait_timout'),
    ([dict(AGENTS, expected_count='three')], {}, "gates[0] (Cilium agents): argument 'expected_count' is of type"),
    ([API, dict(API)], {}, 'gates[1] (API ready).title: the same title as gates[0]'),
    ([dict(API, title='  ')], {}, 'gates[0].title: must not be empty'),
    (['api'], {}, "Elements value for option 'gates' is of type str and we were unable to convert to dict"),
    ([], {}, 'gates: give at least one gate'),
    ([API], {'kind': 'Deployment'}, 'kind: with gates, set it in the gate item it belongs to'),
    ([API], {'gate': 'api'}, 'parameters are mutually exclusive: gate|gates'),
])
def test_bad_gate_items_name_the_item_and_the_field(kube, clock, capsys, items, top, text):
    rc, result = run_module(dict(gates_args(*items), **top), capsys)
    assert rc == 1 and text in result['msg'], result['msg']
    assert kube.requests == 0   # nothing ran


def test_gate_or_gates_is_required(kube, capsys):
    rc, result = run_module({'kubeconfig': '/dev/null'}, capsys)
    assert rc == 1 and 'one of the following is required: gate, gates' in result['msg']


def test_progress_lines_name_the_gate_being_waited_on(kube, clock, capsys, tmp_path):
    kube.at(2, heal_w2)
    path = tmp_path / 'progress.jsonl'
    rc = run_module(gates_args(API, READY, progress_file=str(path)), capsys)[0]
    assert rc == 0
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e['event'], e['summary']) for e in events] == [
        ('start', 'waiting for k8s_gate API ready (API /readyz)'),
        ('end', 'API ready: API /readyz ok'),
        ('start', 'waiting for k8s_gate ALL nodes Ready (nodes)'),
        ('progress', 'ALL nodes Ready: nodes Ready 2/3: w-2 NetworkPluginNotReady'),
        ('end', 'ALL nodes Ready: nodes Ready 3/3')]
