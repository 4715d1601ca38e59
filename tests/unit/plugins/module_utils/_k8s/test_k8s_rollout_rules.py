"""Workload rules as kubectl rollout status and kstatus judge them, and why pods that never came are missing.

Upstream read (k8s.io/kubectl v0.36.3 pkg/polymorphichelpers/rollout_status.go; sigs.k8s.io/cli-utils
pkg/kstatus/status/core.go at 5895ad6c; k8s.io/kubernetes v1.36.3 pkg/controller):
- DaemonSet done: generation <= observedGeneration, updatedNumberScheduled >= desiredNumberScheduled and
  numberAvailable >= desiredNumberScheduled (rollout_status.go:107-114; core.go:335-343). numberAvailable lags
  numberReady by minReadySeconds (the DaemonSet controller's status update counts a pod available only after it).
- OnDelete: the DaemonSet controller does not replace pods (daemon_controller.go:976-980); kubectl refuses to judge
  (rollout_status.go:104-106).
- Deployment: Progressing reason ProgressDeadlineExceeded for the observed generation is an error for kubectl
  (rollout_status.go:75-79) and Failed for kstatus (core.go:184-190).
- A refused pod create: ReplicaFailure=True FailedCreate on the ReplicaSet (replicaset/replica_set_utils.go:124-133),
  copied to the Deployment (deployment/progress.go:99-104); Warning event FailedCreate "Error creating: <err>" on a
  DaemonSet (controller_utils.go:600). The PodSecurity refusal text is pod-security-admission v0.36.3
  admission/admission.go:480-484 ("violates PodSecurity %q: %s") inside the API's Forbidden error.
"""

import copy

from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import gates
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import predicates
from ansible_collections.proxtalos.cluster.tests.helpers import FakeClock

from fake_kube import FakeKube  # pylint: disable=import-error

PSA = ('Error creating: pods "cilium-" is forbidden: violates PodSecurity "baseline:latest": host namespaces '
       '(hostNetwork=true), hostPath volumes (volumes "bpf-maps", "cilium-run")')
LABELS = {'k8s-app': 'cilium'}


def node(name):
    return {'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': name, 'labels': {'kubernetes.io/hostname': name}},
            'spec': {}, 'status': {'conditions': [{'type': 'Ready', 'status': 'True', 'reason': 'KubeletReady'}]}}


def pod(name, node_name, template_hash='new'):
    return {'apiVersion': 'v1', 'kind': 'Pod',
            'metadata': {'name': name, 'namespace': 'kube-system', 'labels': dict(LABELS, **{'controller-revision-hash': template_hash}),
                         'ownerReferences': [{'kind': 'DaemonSet', 'name': 'cilium', 'uid': 'ds-uid', 'controller': True}]},
            'spec': {'nodeName': node_name, 'containers': [{'name': 'cilium-agent'}]},
            'status': {'phase': 'Running', 'conditions': [{'type': 'Ready', 'status': 'True'}],
                       'containerStatuses': [{'name': 'cilium-agent', 'ready': True, 'state': {'running': {}}}]}}


def daemonset(desired=3, updated=3, ready=3, available=3, generation=2, observed=2, strategy='RollingUpdate', min_ready=0):
    """The DaemonSet status fields the controller writes (k8s.io/api v0.36.3 apps/v1 types.go DaemonSetStatus)."""
    return {'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
            'metadata': {'name': 'cilium', 'namespace': 'kube-system', 'uid': 'ds-uid', 'generation': generation},
            'spec': {'selector': {'matchLabels': LABELS}, 'minReadySeconds': min_ready,
                     'updateStrategy': {'type': strategy} if strategy == 'OnDelete' else {'type': strategy, 'rollingUpdate': {'maxUnavailable': 1}},
                     'template': {'metadata': {'labels': LABELS}, 'spec': {'hostNetwork': True, 'tolerations': [{'operator': 'Exists'}]}}},
            'status': {'observedGeneration': observed, 'desiredNumberScheduled': desired, 'currentNumberScheduled': desired,
                       'updatedNumberScheduled': updated, 'numberReady': ready, 'numberAvailable': available,
                       'numberUnavailable': desired - available, 'numberMisscheduled': 0}}


NODES = [node('cp-1'), node('w-1'), node('w-2')]
PODS = [pod('cilium-a', 'cp-1'), pod('cilium-b', 'w-1'), pod('cilium-c', 'w-2')]


def test_daemonset_pods_ready_but_not_yet_available_is_not_done():
    # minReadySeconds 30: every pod Ready, one not Ready for 30 s yet
    verdict = predicates.daemonset_ready(daemonset(available=2, min_ready=30), NODES, PODS)
    assert not verdict.ok
    assert verdict.problems == ['status numberAvailable 2 < desiredNumberScheduled 3']
    assert predicates.daemonset_ready(daemonset(min_ready=30), NODES, PODS).ok


def test_a_rolling_update_not_done_is_not_done_even_with_every_old_pod_ready():
    verdict = predicates.daemonset_ready(daemonset(updated=1), NODES, PODS)
    assert not verdict.ok and verdict.problems == ['rolling out: 1 of 3 pods updated']
    lag = predicates.daemonset_ready(daemonset(generation=3, observed=2), NODES, PODS)
    assert not lag.ok and lag.problems[0].startswith('rollout not started: observedGeneration 2 < generation 3')


def test_on_delete_does_not_wait_for_pods_nobody_replaces():
    verdict = predicates.daemonset_ready(daemonset(updated=1, strategy='OnDelete'), NODES, PODS)
    assert verdict.ok, verdict.summary
    assert ('updateStrategy OnDelete: 1 of 3 pods run the current template; the others are replaced only when deleted'
            in verdict.notes)
    # OnDelete still needs the pods there and available
    assert not predicates.daemonset_ready(daemonset(updated=1, available=2, strategy='OnDelete'), NODES, PODS).ok


def deployment(progressing=None, replica_failure=None, generation=4, observed=4):
    """A Deployment as the deployment controller writes its status (k8s.io/api v0.36.3 apps/v1 DeploymentStatus)."""
    conditions = [{'type': 'Available', 'status': 'False', 'reason': 'MinimumReplicasUnavailable',
                   'message': 'Deployment does not have minimum availability.'}]
    if progressing:
        conditions.append(progressing)
    if replica_failure:
        conditions.append(replica_failure)
    return {'apiVersion': 'apps/v1', 'kind': 'Deployment',
            'metadata': {'name': 'web', 'namespace': 'apps', 'generation': generation},
            'spec': {'replicas': 2, 'progressDeadlineSeconds': 600, 'selector': {'matchLabels': {'app': 'web'}},
                     'template': {'metadata': {'labels': {'app': 'web'}}, 'spec': {}}},
            'status': {'observedGeneration': observed, 'replicas': 2, 'updatedReplicas': 2, 'readyReplicas': 0,
                       'availableReplicas': 0, 'unavailableReplicas': 2, 'conditions': conditions}}


DEADLINE = {'type': 'Progressing', 'status': 'False', 'reason': 'ProgressDeadlineExceeded',
            'message': 'ReplicaSet "web-5d4f8b7c9" has timed out progressing.'}


def test_progress_deadline_exceeded_fails_at_once():
    verdict = predicates.deployment_available(deployment(progressing=DEADLINE))
    assert not verdict.ok and verdict.failed
    assert 'ProgressDeadlineExceeded: ReplicaSet "web-5d4f8b7c9" has timed out progressing.' in verdict.problems


def test_progress_deadline_of_an_older_generation_is_not_final():
    # kubectl looks at the condition only once the controller observed the spec (rollout_status.go:75)
    verdict = predicates.deployment_available(deployment(progressing=DEADLINE, generation=5, observed=4))
    assert not verdict.ok and not verdict.failed


def test_the_gate_stops_on_progress_deadline_instead_of_waiting_its_timeout():
    clock = FakeClock()
    kube = FakeKube(clock)
    kube.add(deployment(progressing=DEADLINE))
    gate = gates.build_gate({'gate': 'workload', 'kind': 'Deployment', 'namespace': 'apps', 'name': 'web'})
    outcome = gates.run(gate, kube, 300, 2, clock=clock.clock, sleep=clock.sleep)
    assert not outcome.passed and outcome.result.elapsed < 1
    assert 'failed (will not recover without a change)' in gates.explain(outcome, kube)


def test_a_deployment_whose_pods_are_refused_says_why():
    failure = {'type': 'ReplicaFailure', 'status': 'True', 'reason': 'FailedCreate',
               'message': PSA.replace('Error creating: ', '').replace('cilium-', 'web-5d4f8b7c9-')}
    verdict = predicates.deployment_available(deployment(replica_failure=failure))
    assert not verdict.ok
    assert verdict.problems[0].startswith('ReplicaFailure FailedCreate: pods "web-5d4f8b7c9-" is forbidden: violates PodSecurity')
    assert 'violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true)' in verdict.summary


def test_a_daemonset_whose_pods_are_refused_says_why_in_its_diagnosis():
    kube = FakeKube()
    kube.add(daemonset(updated=0, ready=0, available=0), *copy.deepcopy(NODES))
    kube.add({'apiVersion': 'v1', 'kind': 'Event', 'metadata': {'name': 'cilium.17a', 'namespace': 'kube-system'},
              'involvedObject': {'kind': 'DaemonSet', 'namespace': 'kube-system', 'name': 'cilium', 'uid': 'ds-uid', 'apiVersion': 'apps/v1'},
              'type': 'Warning', 'reason': 'FailedCreate', 'message': PSA, 'count': 14,
              'firstTimestamp': '2026-11-27T16:00:00Z', 'lastTimestamp': '2026-11-27T16:09:00Z',
              'source': {'component': 'daemonset-controller'}},
             {'apiVersion': 'v1', 'kind': 'Event', 'metadata': {'name': 'cilium.17b', 'namespace': 'kube-system'},
              'involvedObject': {'kind': 'DaemonSet', 'namespace': 'kube-system', 'name': 'cilium'},
              'type': 'Normal', 'reason': 'SuccessfulCreate', 'message': 'Created pod: cilium-zz', 'count': 1,
              'lastTimestamp': '2026-11-27T15:00:00Z'})
    gate = gates.build_gate({'gate': 'workload', 'kind': 'DaemonSet', 'namespace': 'kube-system', 'name': 'cilium'})
    verdict = gate.observe(kube)
    assert not verdict.ok
    lines = gate.diagnose(kube, verdict)
    assert 'event FailedCreate (14 times, last at 2026-11-27T16:09:00Z): %s' % PSA in lines
    assert not any('SuccessfulCreate' in line for line in lines)
    assert 'cp-1: no pod scheduled' in lines
