"""Gates end to end over a fake API and a fake clock: waiting, progress, diagnosis, fail-fast."""
import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import gates
from ansible_collections.proxtalos.cluster.tests.helpers import FakeClock
from ansible_collections.proxtalos.cluster.tests.unit.plugins.module_utils._k8s.fake_kube import FakeKube, fixture, transient


def params(**overrides):
    base = dict(gate='nodes', kind=None, api_version=None, name=None, namespace=None, names=None,
                label_selectors=[], node_label_selectors=[], expected_count=None, node_state='ready',
                every_node=False, accept_unschedulable_replicas=False, condition_type='Ready',
                condition_status='True')
    base.update(overrides)
    return base


def cluster(clock, node_names=('cp-1', 'w-1', 'w-2'), pod_names=('cilium-4xk2p', 'cilium-9bqzt', 'cilium-x7k2m')):
    kube = FakeKube(clock)
    kube.add(*[fixture('nodes.yaml', n) for n in node_names])
    kube.add(*[fixture('pods.yaml', n) for n in pod_names])
    return kube


def make_ready(kube, node_name=None, pod_name=None):
    if node_name:
        node = kube.find('Node', node_name)
        node['spec']['taints'] = []
        node['status']['conditions'] = [{'type': 'Ready', 'status': 'True', 'reason': 'KubeletReady'}]
    if pod_name:
        pod = kube.find('Pod', pod_name)
        pod['status']['conditions'] = [{'type': 'Ready', 'status': 'True'}]
        pod['status']['containerStatuses'][0].update(ready=True, state={'running': {}})


def run(gate_params, kube, clock, timeout=30, interval=2):
    gate = gates.build_gate(gate_params)
    timeline = _wait.Progress(label='test', announce=True, clock=clock.clock)
    outcome = gates.run(gate, kube, timeout, interval, clock=clock.clock, sleep=clock.sleep, progress=timeline)
    timeline.finish(outcome.result.observation, outcome.result.elapsed, outcome.result.attempts, outcome.passed)
    outcome.timeline = timeline.timeline
    return outcome


# --- building gates: bad input names the option ----------------------------------------------

@pytest.mark.parametrize('overrides, field, text', [
    (dict(gate='nodes', every_node=True), 'every_node', 'does not apply to gate=nodes'),
    (dict(gate='api', namespace='x'), 'namespace', 'does not apply to gate=api (it reads: no options)'),
    (dict(gate='workload', kind='Job', name='a', namespace='b'), 'kind', "gate=workload takes one of DaemonSet, Deployment, StatefulSet, got 'Job'"),
    (dict(gate='workload', kind='DaemonSet', name='a', namespace='b', accept_unschedulable_replicas=True),
     'accept_unschedulable_replicas', 'applies to Deployment and StatefulSet'),
    (dict(gate='crds'), 'names', 'gate=crds needs names or label_selectors'),
    (dict(gate='pods', node_label_selectors=['a=b']), 'node_label_selectors', 'only used with every_node=true'),
    (dict(gate='condition', api_version='v1', kind='ConfigMap', name='a', label_selectors=['x=y']),
     'label_selectors', 'by name or by label_selectors, not both'),
    (dict(gate='nodes', expected_count=-1), 'expected_count', 'must be zero or more'),
    (dict(gate='bogus'), 'gate', 'must be one of'),
])
def test_bad_options_name_the_field(overrides, field, text):
    with pytest.raises(_errors.ValidationError) as caught:
        gates.build_gate(params(**overrides))
    assert caught.value.field == field
    assert text in str(caught.value)


# --- nodes -------------------------------------------------------------------------------------

def test_nodes_gate_waits_until_the_node_turns_ready_and_keeps_a_timeline():
    clock = FakeClock()
    kube = cluster(clock).at(5, lambda k: make_ready(k, 'w-2'))
    outcome = run(params(gate='nodes', expected_count=3), kube, clock)
    assert outcome.passed
    assert outcome.result.attempts == 4 and clock.sleeps == [2, 2, 2]
    assert [entry['summary'] for entry in outcome.timeline] == [
        'nodes Ready 2/3: w-2 NetworkPluginNotReady', 'nodes Ready 3/3']
    assert outcome.timeline[-1]['attempt'] == 4
    assert kube.deadline is not None and kube.deadline.timeout == 30


def test_nodes_gate_timeout_names_node_reason_and_failing_pod_there():
    clock = FakeClock()
    kube = cluster(clock)
    outcome = run(params(gate='nodes'), kube, clock, timeout=10)
    assert not outcome.passed
    assert outcome.result.elapsed == pytest.approx(10)
    text = gates.explain(outcome, kube)
    lines = text.splitlines()
    assert lines[0] == 'nodes not reached after 10.0s (6 probes): nodes Ready 2/3: w-2 NetworkPluginNotReady'
    assert lines[1] == (
        '- w-2: Ready=False KubeletNotReady: container runtime network not ready: NetworkReady=false '
        'reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized; '
        'pods not Ready there: kube-system/cilium-x7k2m on w-2: CrashLoopBackOff (container cilium-agent, '
        '7 restarts, last exit code 1 Error)')


def test_nodes_gate_without_any_cni_pod_suggests_the_cni():
    clock = FakeClock()
    kube = cluster(clock, pod_names=())
    outcome = run(params(gate='nodes'), kube, clock, timeout=0)
    assert outcome.result.attempts == 1
    assert 'no pod on it reports a problem: is a CNI agent (Cilium) scheduled on this node?' in gates.explain(outcome, kube)


def test_nodes_gate_missing_node_is_named():
    clock = FakeClock()
    kube = cluster(clock, node_names=('cp-1',))
    outcome = run(params(gate='nodes', names=['cp-1', 'w-9']), kube, clock, timeout=0)
    assert '- w-9: not registered (no Node object; is kubelet running on it?)' in gates.explain(outcome, kube)


def test_registered_state_passes_before_the_cni():
    clock = FakeClock()
    outcome = run(params(gate='nodes', node_state='registered', expected_count=3), cluster(clock), clock)
    assert outcome.passed and outcome.result.attempts == 1


def test_api_flapping_is_not_yet_and_shows_in_progress():
    clock = FakeClock()
    kube = cluster(clock, node_names=('cp-1', 'w-1'))
    kube.fail_next = [transient('connection refused'), transient('connection reset by peer')]
    outcome = run(params(gate='nodes'), kube, clock)
    assert outcome.passed and outcome.result.attempts == 3
    assert outcome.timeline[0]['summary'].startswith('TransientApiError: Kubernetes API at https://127.0.0.1:6443 unreachable')


def test_timeout_on_an_api_error_keeps_the_last_answer():
    clock = FakeClock()
    kube = cluster(clock)
    kube.at(3, lambda k: k.fail_next.extend([transient()] * 50))  # the API goes away mid-wait
    outcome = run(params(gate='nodes'), kube, clock, timeout=8)
    assert not outcome.passed
    headline = outcome.headline()
    assert headline.startswith('TransientApiError: Kubernetes API at https://127.0.0.1:6443 unreachable')
    assert headline.endswith('(last answer: nodes Ready 2/3: w-2 NetworkPluginNotReady)')
    # the diagnosis cannot read the API either, and says so instead of failing
    assert gates.explain(outcome, kube).splitlines()[-1].startswith('- (could not read more detail: ')


def test_non_transient_api_errors_end_the_wait():
    clock = FakeClock()
    kube = cluster(clock)
    kube.fail_next = [_errors.ApiError('Kubernetes API answered 403 for /api/v1/nodes: forbidden')]
    with pytest.raises(_errors.ApiError):
        run(params(gate='nodes'), kube, clock)


# --- workloads -----------------------------------------------------------------------------------

def test_daemonset_gate_timeout_names_node_pod_and_reason():
    clock = FakeClock()
    kube = cluster(clock).add(fixture('workloads.yaml', 'cilium'))
    outcome = run(params(gate='workload', kind='DaemonSet', namespace='kube-system', name='cilium'), kube, clock, timeout=6)
    assert not outcome.passed
    text = gates.explain(outcome, kube)
    assert text.startswith('DaemonSet kube-system/cilium not reached after 6.0s (4 probes): '
                           'DaemonSet kube-system/cilium Ready on 2/3 eligible nodes: w-2 cilium-x7k2m CrashLoopBackOff')
    assert ('- w-2: cilium-x7k2m CrashLoopBackOff (container cilium-agent, 7 restarts, last exit code 1 Error) '
            '(node not Ready: NetworkPluginNotReady)') in text.splitlines()


def test_daemonset_gate_passes_once_the_agent_recovers():
    clock = FakeClock()
    kube = cluster(clock).add(fixture('workloads.yaml', 'cilium'))

    def recover(k):
        make_ready(k, pod_name='cilium-x7k2m')
        k.find('DaemonSet', 'cilium')['status'].update(numberReady=3, numberAvailable=3, numberUnavailable=0)

    kube.at(3, recover)
    outcome = run(params(gate='workload', kind='DaemonSet', namespace='kube-system', name='cilium'), kube, clock)
    assert outcome.passed and outcome.result.attempts == 3
    assert outcome.timeline[-1]['summary'] == 'DaemonSet kube-system/cilium Ready on 3/3 eligible nodes'


def test_missing_workload_keeps_waiting_then_is_named():
    clock = FakeClock()
    kube = cluster(clock)
    outcome = run(params(gate='workload', kind='Deployment', namespace='kube-system', name='cilium-operator'),
                  kube, clock, timeout=2)
    assert outcome.result.attempts == 2
    assert outcome.headline() == 'Deployment kube-system/cilium-operator not found'


def test_deployment_gate_accepting_unschedulable_replicas():
    clock = FakeClock()
    kube = cluster(clock, node_names=('cp-1',), pod_names=('cilium-operator-6d8f9b7c4-zt5lp', 'cilium-operator-6d8f9b7c4-mwq9r'))
    kube.add(fixture('workloads.yaml', 'cilium-operator'))
    strict = params(gate='workload', kind='Deployment', namespace='kube-system', name='cilium-operator')
    outcome = run(strict, kube, clock, timeout=0)
    assert not outcome.passed
    assert "- cilium-operator-6d8f9b7c4-zt5lp on (no node): Pending Unschedulable: 0/1 nodes are available" in gates.explain(outcome, kube)
    outcome = run(dict(strict, accept_unschedulable_replicas=True), kube, clock, timeout=0)
    assert outcome.passed
    assert outcome.verdict.notes == ['1 of 2 replicas can be scheduled on 1 eligible node(s) '
                                     '(required pod anti-affinity on kubernetes.io/hostname allows 1)']


def test_deployment_gate_timeout_names_the_not_ready_node_of_a_waiting_pod():
    # a pod bound before its node lost its network (a reboot; the scheduler places none on a NotReady node): the line
    # names the node and why
    clock = FakeClock()
    kube = cluster(clock, pod_names=('coredns-5d78c9869d-kq8wz',)).add(fixture('workloads.yaml', 'coredns'))
    deployment = kube.find('Deployment', 'coredns')
    deployment['spec']['replicas'] = 1
    deployment['status'].update(replicas=1, updatedReplicas=1, readyReplicas=0, availableReplicas=0)
    pod = kube.find('Pod', 'coredns-5d78c9869d-kq8wz')
    pod['spec']['nodeName'] = 'w-2'
    pod['status'] = {'phase': 'Pending', 'conditions': [{'type': 'PodScheduled', 'status': 'True'}]}
    outcome = run(params(gate='workload', kind='Deployment', namespace='kube-system', name='coredns'), kube, clock, timeout=0)
    assert not outcome.passed
    lines = gates.explain(outcome, kube).splitlines()
    assert '- coredns-5d78c9869d-kq8wz on w-2: Pending (ContainerCreating) (node not Ready: NetworkPluginNotReady)' in lines, lines
    # on a Ready node the line has no node reason
    pod['spec']['nodeName'] = 'w-1'
    outcome = run(params(gate='workload', kind='Deployment', namespace='kube-system', name='coredns'), kube, clock, timeout=0)
    assert '- coredns-5d78c9869d-kq8wz on w-1: Pending (ContainerCreating)' in gates.explain(outcome, kube).splitlines()


NOT_READY_UNSCHEDULABLE = ('0/3 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, '
                           '2 node(s) had untolerated taint {node.kubernetes.io/not-ready: }. preemption: 0/3 nodes are '
                           'available: 3 Preemption is not helpful for scheduling.')


def unschedulable_flux_controller(kube):
    """source-controller's Deployment, its one pod unplaced: no node without the not-ready taint will take it."""
    deployment = fixture('workloads.yaml', 'coredns')
    deployment['metadata'].update(name='source-controller', namespace='flux-system', labels={'app': 'source-controller'})
    deployment['spec'].update(replicas=1, selector={'matchLabels': {'app': 'source-controller'}})
    deployment['spec']['template']['metadata']['labels'] = {'app': 'source-controller'}
    deployment['status'].update(replicas=1, updatedReplicas=1, readyReplicas=0, availableReplicas=0)
    pod = fixture('pods.yaml', 'coredns-5d78c9869d-kq8wz')
    pod['metadata'].update(name='source-controller-5f7c9d8b6-x2k4q', namespace='flux-system', labels={'app': 'source-controller'})
    del pod['spec']['nodeName']
    unschedulable = {'type': 'PodScheduled', 'status': 'False', 'reason': 'Unschedulable', 'message': NOT_READY_UNSCHEDULABLE}
    pod['status'] = {'phase': 'Pending', 'conditions': [unschedulable]}
    kube.add(deployment, pod)


def test_a_pod_waiting_for_a_ready_node_names_each_not_ready_node_its_reason_and_its_pods():
    # Flux's controllers before any worker has its network: the gate names the nodes, why they are not Ready and the
    # Cilium agent's state there, as the cni stage's nodes gate would
    clock = FakeClock()
    kube = cluster(clock)
    unschedulable_flux_controller(kube)
    outcome = run(params(gate='workload', kind='Deployment', namespace='flux-system', name='source-controller'), kube, clock, timeout=0)
    assert not outcome.passed
    lines = gates.explain(outcome, kube).splitlines()
    assert lines[1].startswith('- source-controller-5f7c9d8b6-x2k4q on (no node): Pending Unschedulable: 0/3 nodes are available'), lines
    node_lines = [line for line in lines if line.startswith('- node ')]
    assert len(node_lines) == 1 and node_lines[0].startswith('- node w-2: Ready=False KubeletNotReady'), lines
    assert 'NetworkPluginNotReady' in node_lines[0], node_lines
    assert 'pods not Ready there: kube-system/cilium-x7k2m on w-2: CrashLoopBackOff' in node_lines[0], node_lines
    # unplaced for another reason (anti-affinity): no node lines
    kube.find('Pod', 'source-controller-5f7c9d8b6-x2k4q')['status']['conditions'][0]['message'] = '0/3 nodes are available: 3 Insufficient cpu.'
    outcome = run(params(gate='workload', kind='Deployment', namespace='flux-system', name='source-controller'), kube, clock, timeout=0)
    assert not [line for line in gates.explain(outcome, kube).splitlines() if line.startswith('- node ')]


def test_a_pod_waiting_for_a_ready_node_lists_a_few_not_ready_nodes_in_full_and_names_the_rest():
    clock = FakeClock()
    kube = cluster(clock, node_names=('cp-1',), pod_names=())
    for number in range(1, gates.MAX_NODE_LINES + 4):
        node = fixture('nodes.yaml', 'w-2')
        node['metadata']['name'] = 'w-%02d' % number
        kube.add(node)
    unschedulable_flux_controller(kube)
    outcome = run(params(gate='workload', kind='Deployment', namespace='flux-system', name='source-controller'), kube, clock, timeout=0)
    lines = gates.explain(outcome, kube).splitlines()
    assert len([line for line in lines if line.startswith('- node w-')]) == gates.MAX_NODE_LINES, lines
    assert lines[-1] == '- 3 more nodes not Ready: w-09; w-10; w-11', lines


def test_pods_gate_timeout_names_the_not_ready_node_of_a_pod():
    clock = FakeClock()
    kube = cluster(clock)
    gate_params = params(gate='pods', namespace='kube-system', label_selectors=['k8s-app=cilium'])
    outcome = run(gate_params, kube, clock, timeout=0)
    lines = gates.explain(outcome, kube).splitlines()
    assert [line for line in lines if line.startswith('- cilium-x7k2m')] == [
        '- cilium-x7k2m on w-2: CrashLoopBackOff (container cilium-agent, 7 restarts, last exit code 1 Error) '
        '(node not Ready: NetworkPluginNotReady)'], lines


# --- pods, CRDs -----------------------------------------------------------------------------------

def test_pods_gate_every_node():
    clock = FakeClock()
    kube = cluster(clock)
    gate_params = params(gate='pods', namespace='kube-system', label_selectors=['k8s-app=cilium'], every_node=True)
    outcome = run(gate_params, kube, clock, timeout=0)
    assert not outcome.passed
    assert outcome.headline().startswith('pods k8s-app=cilium Ready 2/3, on nodes 2/3: cilium-x7k2m CrashLoopBackOff')
    make_ready(kube, pod_name='cilium-x7k2m')
    outcome = run(gate_params, kube, clock, timeout=0)
    assert outcome.passed


def test_crds_gate_by_names():
    clock = FakeClock()
    kube = FakeKube(clock).add(fixture('crds.yaml', 'kustomizations.kustomize.toolkit.fluxcd.io'))
    names = ['kustomizations.kustomize.toolkit.fluxcd.io', 'gitrepositories.source.toolkit.fluxcd.io']
    kube.at(4, lambda k: k.add(fixture('crds.yaml', 'gitrepositories.source.toolkit.fluxcd.io')))
    kube.at(8, lambda k: k.find('CustomResourceDefinition', names[1])['status']['conditions'][1].update(status='True'))
    outcome = run(params(gate='crds', names=names), kube, clock)
    assert outcome.passed
    assert [entry['summary'] for entry in outcome.timeline] == [
        'CRDs Established 1/2: gitrepositories.source.toolkit.fluxcd.io not found',
        'CRDs Established 1/2: gitrepositories.source.toolkit.fluxcd.io Established=False Installing: '
        'the initial names have been accepted',
        'CRDs Established 2/2']


# --- conditions -----------------------------------------------------------------------------------

FLUX_KS = dict(gate='condition', api_version='kustomize.toolkit.fluxcd.io/v1', kind='Kustomization')


def test_condition_gate_waits_for_the_crd_then_the_object():
    clock = FakeClock()
    kube = FakeKube(clock)

    def install(k):
        k.serve('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', 'kustomizations')
        k.add(fixture('flux.yaml', 'flux-system'))

    kube.at(4, install)
    outcome = run(params(name='flux-system', namespace='flux-system', **FLUX_KS), kube, clock)
    assert outcome.passed and outcome.result.attempts == 3
    assert outcome.timeline[0]['summary'] == ('Kubernetes API does not serve kind Kustomization in '
                                              'kustomize.toolkit.fluxcd.io/v1 (yet) (CRD not installed?)')
    assert outcome.verdict.items[0]['name'] == 'flux-system/flux-system'


def test_condition_gate_stalled_fails_at_once():
    clock = FakeClock()
    kube = FakeKube(clock)
    kube.serve('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', 'kustomizations')
    kube.add(fixture('flux.yaml', 'flux-system'), fixture('flux.yaml', 'csi'))
    outcome = run(params(namespace='flux-system', **FLUX_KS), kube, clock, timeout=300)
    assert not outcome.passed and outcome.result.attempts == 1
    text = gates.explain(outcome, kube)
    assert text.startswith('Kustomization (all) in namespace flux-system failed (will not recover without a change)')
    assert ("- flux-system/csi: Stalled BuildFailed: kustomize build failed: accumulating resources: "
            "'kubernetes/apps/csi/app' not found (generation 1, observedGeneration 1)") in text


def test_condition_gate_dependency_not_ready_is_named_on_timeout():
    clock = FakeClock()
    kube = FakeKube(clock)
    kube.serve('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', 'kustomizations')
    kube.add(fixture('flux.yaml', 'apps'))
    outcome = run(params(name='apps', namespace='flux-system', **FLUX_KS), kube, clock, timeout=4)
    assert ("- flux-system/apps: Ready=False DependencyNotReady: dependency 'flux-system/infra-configs' is not ready "
            "(generation 2, observedGeneration 1)") in gates.explain(outcome, kube)


def test_condition_gate_namespaced_kind_needs_a_namespace():
    clock = FakeClock()
    kube = FakeKube(clock)
    kube.serve('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', 'kustomizations')
    with pytest.raises(_errors.ValidationError) as caught:
        run(params(name='apps', **FLUX_KS), kube, clock)
    assert caught.value.field == 'namespace'


def test_condition_gate_missing_object():
    clock = FakeClock()
    kube = FakeKube(clock)
    kube.serve('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', 'kustomizations')
    outcome = run(params(name='apps', namespace='flux-system', **FLUX_KS), kube, clock, timeout=0)
    assert outcome.headline() == 'Kustomization flux-system/apps not found'


FLUX_INSTANCE = dict(gate='condition', api_version='fluxcd.controlplane.io/v1', kind='FluxInstance')


def flux_instance(sync=None):
    """A FluxInstance as flux-operator v0.59.0 leaves it while it waits for what it applied to be Ready: Ready Unknown
    Progressing, Reconciling True, both conditions of the current generation (fluxcd/pkg/runtime conditions/setter.go
    sets observedGeneration on each); its status has no observedGeneration field."""
    obj = {'apiVersion': 'fluxcd.controlplane.io/v1', 'kind': 'FluxInstance',
           'metadata': {'name': 'flux', 'namespace': 'flux-system', 'generation': 1},
           'spec': {'distribution': {'version': '2.x'}},
           'status': {'conditions': [
               {'type': 'Ready', 'status': 'Unknown', 'reason': 'Progressing', 'message': 'Reconciliation in progress',
                'observedGeneration': 1},
               {'type': 'Reconciling', 'status': 'True', 'reason': 'Progressing', 'message': 'Reconciliation in progress',
                'observedGeneration': 1}]}}
    if sync is not None:
        obj['spec']['sync'] = sync
    return obj


def flux_object(api_version, kind, name, ready):
    return {'apiVersion': api_version, 'kind': kind, 'metadata': {'name': name, 'namespace': 'flux-system', 'generation': 1},
            'status': {'observedGeneration': 1, 'conditions': [dict(type='Ready', **ready)]}}


def test_flux_instance_gate_timeout_names_its_sync_objects_that_are_not_ready():
    clock = FakeClock()
    kube = FakeKube(clock)
    kube.serve('fluxcd.controlplane.io/v1', 'FluxInstance', 'fluxinstances')
    kube.serve('source.toolkit.fluxcd.io/v1', 'GitRepository', 'gitrepositories')
    kube.serve('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', 'kustomizations')
    kube.add(flux_instance({'kind': 'GitRepository', 'url': 'ssh://git@git.example.invalid/gitops.git', 'ref': 'refs/heads/main',
                            'path': './clusters/infra'}),
             flux_object('source.toolkit.fluxcd.io/v1', 'GitRepository', 'flux-system',
                         {'status': 'False', 'reason': 'GitOperationFailed',
                          'message': 'failed to checkout and determine revision: no such host'}),
             flux_object('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', 'flux-system',
                         {'status': 'True', 'reason': 'ReconciliationSucceeded', 'message': 'Applied revision: main@sha1:1'}))
    outcome = run(params(name='flux', namespace='flux-system', **FLUX_INSTANCE), kube, clock, timeout=4)
    assert not outcome.passed
    lines = gates.explain(outcome, kube).splitlines()
    assert lines[1:] == [
        '- flux-system/flux: Ready=Unknown Progressing: Reconciliation in progress (generation 1, observedGeneration None)',
        '- sync GitRepository flux-system/flux-system: Ready=False GitOperationFailed: failed to checkout and determine '
        'revision: no such host'], lines


def test_flux_instance_gate_names_a_sync_object_not_created_yet_under_spec_sync_name():
    clock = FakeClock()
    kube = FakeKube(clock)
    kube.serve('fluxcd.controlplane.io/v1', 'FluxInstance', 'fluxinstances')
    kube.serve('source.toolkit.fluxcd.io/v1', 'GitRepository', 'gitrepositories')
    kube.add(flux_instance({'kind': 'GitRepository', 'url': 'https://git.example.invalid/gitops.git', 'ref': 'refs/heads/main',
                            'path': './', 'name': 'gitops'}))
    outcome = run(params(name='flux', namespace='flux-system', **FLUX_INSTANCE), kube, clock, timeout=0)
    lines = gates.explain(outcome, kube).splitlines()
    assert lines[2:] == ['- sync GitRepository flux-system/gitops: not created yet',
                         '- sync Kustomization flux-system/gitops: its kind is not served (Flux CRDs not installed yet)'], lines


def test_flux_instance_gate_without_sync_adds_nothing():
    clock = FakeClock()
    kube = FakeKube(clock)
    kube.serve('fluxcd.controlplane.io/v1', 'FluxInstance', 'fluxinstances')
    kube.add(flux_instance())
    outcome = run(params(name='flux', namespace='flux-system', **FLUX_INSTANCE), kube, clock, timeout=0)
    assert len(gates.explain(outcome, kube).splitlines()) == 2


# --- API -------------------------------------------------------------------------------------------

def test_api_gate_until_ready():
    clock = FakeClock()
    kube = FakeKube(clock)
    kube.readyz_answers = [(500, '[-]etcd failed: reason withheld\nreadyz check failed'), (200, 'ok')]
    outcome = run(params(gate='api'), kube, clock)
    assert outcome.passed and outcome.result.attempts == 2
    assert outcome.timeline[0]['summary'] == 'API /readyz answered 500, failing checks: etcd failed: reason withheld'


def test_api_gate_timeout_reads_the_verbose_checks():
    clock = FakeClock()
    kube = FakeKube(clock)
    kube.readyz_answers = [(500, 'readyz check failed')]
    kube.verbose_readyz = (500, '[+]ping ok\n[-]etcd failed: reason withheld\n[-]informer-sync failed\nreadyz check failed')
    outcome = run(params(gate='api'), kube, clock, timeout=2)
    assert gates.explain(outcome, kube).splitlines()[-1] == (
        '- /readyz?verbose answered 500; failing: [-]etcd failed: reason withheld, [-]informer-sync failed')
