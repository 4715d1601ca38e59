"""Gate predicates on real-looking objects (fixtures/*.yaml), good and bad states."""
import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import predicates


# --- nodes -----------------------------------------------------------------------------------

def test_ready_node_has_no_reason(k8s_objects):
    assert predicates.node_ready(k8s_objects.node('cp-1')) == (True, None)


@pytest.mark.parametrize('name, reason', [
    ('w-2', 'NetworkPluginNotReady'),           # registered, no CNI (kubelet's message)
    ('w-3', 'NodeStatusUnknown'),               # kubelet stopped posting
    ('w-5', 'no Ready condition yet (kubelet has not reported)'),
])
def test_not_ready_node_names_the_reason(k8s_objects, name, reason):
    assert predicates.node_ready(k8s_objects.node(name)) == (False, reason)


def test_nodes_summary_counts_and_names_each_not_ready_node(k8s_objects):
    nodes = [k8s_objects.node(n) for n in ('cp-1', 'w-1', 'w-2', 'w-3')]
    verdict = predicates.nodes_ready(nodes)
    assert not verdict.ok
    assert verdict.summary == 'nodes Ready 2/4: w-2 NetworkPluginNotReady; w-3 NodeStatusUnknown'
    by_name = dict((item['name'], item) for item in verdict.items)
    assert by_name['cp-1']['roles'] == ['control-plane']
    assert by_name['w-2']['ok'] is False and by_name['w-1']['ok'] is True


def test_node_items_carry_what_the_kubelet_reports_of_its_versions(k8s_objects):
    verdict = predicates.nodes_ready([k8s_objects.node('cp-1')], names=['cp-1', 'w-9'])
    by_name = dict((item['name'], item) for item in verdict.items)
    assert by_name['cp-1']['kubelet_version'] == 'v1.33.4'
    assert by_name['cp-1']['os_image'] == 'Talos (v1.13.9)'
    assert by_name['cp-1']['container_runtime'] == 'containerd://2.1.4'
    assert 'kernel_version' not in by_name['cp-1']  # not in this node's nodeInfo: not invented
    assert 'kubelet_version' not in by_name['w-9']  # not registered


def test_all_ready_nodes_pass(k8s_objects):
    verdict = predicates.nodes_ready([k8s_objects.node('cp-1'), k8s_objects.node('w-1')], expected_count=2)
    assert verdict.ok and verdict.summary == 'nodes Ready 2/2'


def test_missing_named_nodes_are_named_and_counted(k8s_objects):
    verdict = predicates.nodes_ready([k8s_objects.node('cp-1')], names=['cp-1', 'w-1', 'w-2'])
    assert not verdict.ok
    assert verdict.summary == 'nodes Ready 1/3: w-1 not registered; w-2 not registered'


def test_expected_count_short_and_extra(k8s_objects):
    short = predicates.nodes_ready([k8s_objects.node('cp-1')], expected_count=3)
    assert not short.ok and '1 of 3 expected nodes registered' in short.summary
    extra = predicates.nodes_ready([k8s_objects.node('cp-1'), k8s_objects.node('w-1')], expected_count=1,
                                   names=['cp-1'])
    assert not extra.ok and '2 nodes registered, expected 1 (not in names: w-1)' in extra.summary


def test_registered_only_accepts_not_ready_nodes(k8s_objects):
    nodes = [k8s_objects.node('w-2'), k8s_objects.node('w-3')]
    verdict = predicates.nodes_ready(nodes, expected_count=2, registered_only=True)
    assert verdict.ok and verdict.summary == 'nodes registered 2/2'
    assert [item['ready'] for item in verdict.items] == [False, False]


def test_no_nodes_at_all_is_not_a_pass():
    verdict = predicates.nodes_ready([])
    assert not verdict.ok and 'no node registered yet' in verdict.summary


def test_pressure_conditions_are_reported(k8s_objects):
    verdict = predicates.nodes_ready([k8s_objects.node('w-4')])
    assert verdict.ok  # Ready, even if under pressure
    assert verdict.items[0]['conditions_true'] == ['DiskPressure']


# --- DaemonSet ---------------------------------------------------------------------------------

def _cilium_world(k8s_objects):
    nodes = [k8s_objects.node(n) for n in ('cp-1', 'w-1', 'w-2')]
    pods = [k8s_objects.pod(n) for n in ('cilium-4xk2p', 'cilium-9bqzt', 'cilium-x7k2m', 'cilium-old-r2d2x')]
    return k8s_objects.workload('cilium'), nodes, pods


def test_daemonset_names_the_node_without_a_ready_pod_and_why(k8s_objects):
    daemonset, nodes, pods = _cilium_world(k8s_objects)
    verdict = predicates.daemonset_ready(daemonset, nodes, pods)
    assert not verdict.ok
    assert verdict.summary.startswith('DaemonSet kube-system/cilium Ready on 2/3 eligible nodes: '
                                      'w-2 cilium-x7k2m CrashLoopBackOff (container cilium-agent, 7 restarts, '
                                      'last exit code 1 Error)')
    failing = verdict.failing()
    assert [item['name'] for item in failing] == ['w-2']
    assert failing[0]['node_reason'] == 'NetworkPluginNotReady'
    assert 'status numberAvailable 2 < desiredNumberScheduled 3' in verdict.problems


def test_daemonset_passes_when_every_eligible_node_has_a_ready_pod(k8s_objects):
    daemonset, nodes, pods = _cilium_world(k8s_objects)
    crashing = [p for p in pods if p['metadata']['name'] == 'cilium-x7k2m'][0]
    crashing['status']['conditions'] = [{'type': 'Ready', 'status': 'True'}]
    crashing['status']['containerStatuses'][0].update(ready=True, state={'running': {}})
    daemonset['status'].update(numberReady=3, numberAvailable=3, numberUnavailable=0)
    verdict = predicates.daemonset_ready(daemonset, nodes, pods)
    assert verdict.ok, verdict.summary
    assert verdict.summary == 'DaemonSet kube-system/cilium Ready on 3/3 eligible nodes'


def test_daemonset_node_with_no_pod_says_so(k8s_objects):
    daemonset, nodes, pods = _cilium_world(k8s_objects)
    pods = [p for p in pods if p['spec']['nodeName'] != 'w-2']
    verdict = predicates.daemonset_ready(daemonset, nodes, pods)
    assert 'w-2 no pod scheduled' in verdict.summary


def test_daemonset_terminating_pod_does_not_count_as_ready(k8s_objects):
    daemonset, nodes, pods = _cilium_world(k8s_objects)
    pods = [p for p in pods if p['metadata']['name'] != 'cilium-9bqzt']  # w-1 keeps only the terminating one
    verdict = predicates.daemonset_ready(daemonset, nodes, pods)
    w1 = [item for item in verdict.items if item['name'] == 'w-1'][0]
    assert not w1['ok'] and w1['reason'] == 'Terminating'


def test_daemonset_pods_of_another_owner_do_not_count(k8s_objects):
    daemonset, nodes, pods = _cilium_world(k8s_objects)
    daemonset['metadata']['uid'] = 'a-new-daemonset-with-the-same-name'
    verdict = predicates.daemonset_ready(daemonset, nodes, pods)
    assert [item['reason'] for item in verdict.items] == ['no pod scheduled'] * 3


def test_daemonset_without_tolerations_skips_control_plane_and_not_ready_nodes(k8s_objects):
    daemonset = k8s_objects.workload('proxmox-csi-plugin-node')
    nodes = [k8s_objects.node(n) for n in ('cp-1', 'w-1', 'w-2')]
    pod = k8s_objects.pod('proxmox-csi-plugin-node-qq7vx')
    pod['metadata']['ownerReferences'] = [{'kind': 'DaemonSet', 'uid': daemonset['metadata']['uid']}]
    verdict = predicates.daemonset_ready(daemonset, nodes, [pod])
    assert [item['name'] for item in verdict.items] == ['w-1']
    assert verdict.items[0]['reason'].startswith('Init:CrashLoopBackOff (init container wait-for-config, 3 restarts')
    assert any(note.startswith('not eligible: cp-1 (untolerated taint node-role.kubernetes.io/control-plane:NoSchedule)')
               for note in verdict.notes)
    assert any('w-2 (untolerated taint node.kubernetes.io/not-ready:NoSchedule)' in note for note in verdict.notes)
    assert 'rollout not started: observedGeneration 2 < generation 3 (controller has not seen the latest spec)' in verdict.problems
    assert 'rolling out: 0 of 1 pods updated' in verdict.problems


def test_daemonset_with_no_eligible_node_is_not_a_pass(k8s_objects):
    daemonset = k8s_objects.workload('proxmox-csi-plugin-node')
    daemonset['status'].update(observedGeneration=3, desiredNumberScheduled=0, updatedNumberScheduled=0)
    verdict = predicates.daemonset_ready(daemonset, [k8s_objects.node('cp-1')], [])
    assert not verdict.ok and 'no eligible node' in verdict.problems


def test_missing_daemonset_is_named():
    verdict = predicates.daemonset_ready(None, [], [], what='kube-system/cilium')
    assert not verdict.ok and verdict.summary == 'DaemonSet kube-system/cilium not found'


# --- Deployment / StatefulSet ------------------------------------------------------------------

def _operator_world(k8s_objects, node_names=('cp-1',)):
    deployment = k8s_objects.workload('cilium-operator')
    pods = [k8s_objects.pod('cilium-operator-6d8f9b7c4-zt5lp'), k8s_objects.pod('cilium-operator-6d8f9b7c4-mwq9r')]
    return deployment, [k8s_objects.node(n) for n in node_names], pods


def test_deployment_short_of_replicas_names_the_pending_pod_and_scheduler_message(k8s_objects):
    deployment, nodes, pods = _operator_world(k8s_objects)
    verdict = predicates.deployment_available(deployment, nodes, pods)
    assert not verdict.ok
    assert verdict.summary.startswith('Deployment kube-system/cilium-operator available 1/2: ')
    assert "cilium-operator-6d8f9b7c4-zt5lp Pending Unschedulable: 0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules" in verdict.summary


def test_deployment_accepts_what_can_be_scheduled_now(k8s_objects):
    deployment, nodes, pods = _operator_world(k8s_objects)
    verdict = predicates.deployment_available(deployment, nodes, pods, accept_unschedulable=True)
    assert verdict.ok, verdict.summary
    assert verdict.summary.startswith('Deployment kube-system/cilium-operator available 1/2 (1 required: '
                                      '1 of 2 replicas can be scheduled on 1 eligible node(s)')
    assert 'required pod anti-affinity on kubernetes.io/hostname allows 1' in verdict.summary
    assert verdict.replicas == {'desired': 2, 'available': 1, 'updated': 2, 'required': 1, 'schedulable': 1}


def test_deployment_accept_mode_still_wants_both_when_two_nodes_are_eligible(k8s_objects):
    deployment, nodes, pods = _operator_world(k8s_objects, ('cp-1', 'w-1'))
    verdict = predicates.deployment_available(deployment, nodes, pods, accept_unschedulable=True)
    assert not verdict.ok
    assert verdict.summary.startswith('Deployment kube-system/cilium-operator available 1/2:')
    assert verdict.replicas['schedulable'] == 2 and verdict.replicas['required'] == 2


def test_replica_counts_without_accept_mode_leave_schedulable_unknown(k8s_objects):
    deployment, nodes, pods = _operator_world(k8s_objects)
    verdict = predicates.deployment_available(deployment, nodes, pods)
    assert verdict.replicas == {'desired': 2, 'available': 1, 'updated': 2, 'required': 2, 'schedulable': None}


def test_deployment_accept_mode_with_no_eligible_node_fails_with_reasons(k8s_objects):
    deployment, unused_nodes, pods = _operator_world(k8s_objects)
    deployment['spec']['template']['spec']['nodeSelector'] = {'kubernetes.io/os': 'windows'}
    verdict = predicates.deployment_available(deployment, [k8s_objects.node('cp-1')], pods, accept_unschedulable=True)
    assert not verdict.ok
    assert ('no replica can be scheduled now: no node is eligible; not eligible: cp-1 '
            '(node selector kubernetes.io/os=windows does not match)') in verdict.problems


def test_healthy_deployment_passes(k8s_objects):
    verdict = predicates.deployment_available(k8s_objects.workload('coredns'), pods=[])
    assert verdict.ok and verdict.summary == 'Deployment kube-system/coredns available 2/2'


def test_deployment_progress_deadline_and_image_pull_are_reported(k8s_objects):
    deployment = k8s_objects.workload('flux-operator')
    pod = k8s_objects.pod('coredns-5d78c9869d-kq8wz')
    pod['metadata']['labels'] = {'app.kubernetes.io/name': 'flux-operator'}
    verdict = predicates.deployment_available(deployment, pods=[pod])
    assert not verdict.ok
    assert 'ProgressDeadlineExceeded: ReplicaSet "flux-operator-7d9c" has timed out progressing.' in verdict.problems
    assert 'ImagePullBackOff (container coredns): Back-off pulling image' in verdict.summary


def test_deployment_generation_lag_and_old_replicas(k8s_objects):
    deployment = k8s_objects.workload('coredns')
    deployment['metadata']['generation'] = 3
    deployment['status'].update(replicas=3, updatedReplicas=1)
    verdict = predicates.deployment_available(deployment, pods=[])
    assert not verdict.ok
    assert verdict.problems[0].startswith('rollout not started: observedGeneration 2 < generation 3')
    assert '2 old replica(s) pending termination' in verdict.problems
    assert '1 of 2 replicas updated' in verdict.problems


def test_statefulset_available_and_rolling(k8s_objects):
    statefulset = k8s_objects.workload('vault')
    assert predicates.statefulset_available(statefulset, pods=[]).ok
    statefulset['status'].update(updateRevision='vault-6a8b', updatedReplicas=1, readyReplicas=3)
    verdict = predicates.statefulset_available(statefulset, pods=[])
    assert not verdict.ok
    assert 'rolling out: currentRevision vault-5f7c8d9b6, updateRevision vault-6a8b' in verdict.problems


def test_statefulset_without_available_replicas_field_uses_ready(k8s_objects):
    statefulset = k8s_objects.workload('vault')
    del statefulset['status']['availableReplicas']
    statefulset['status']['readyReplicas'] = 2
    verdict = predicates.statefulset_available(statefulset, pods=[])
    assert not verdict.ok and verdict.summary.startswith('StatefulSet vault/vault available 2/3')


# --- pods -----------------------------------------------------------------------------------------

def test_pods_ready_lists_each_problem_and_skips_completed_and_terminating(k8s_objects):
    pods = [k8s_objects.pod(n) for n in ('cilium-4xk2p', 'sealed-secrets-controller-7f8b9c6d5-abcde',
                                         'helm-install-cilium-8sd7f', 'cilium-old-r2d2x')]
    verdict = predicates.pods_ready(pods)
    assert not verdict.ok
    assert verdict.summary == ('pods Ready 1/2: sealed-secrets-controller-7f8b9c6d5-abcde not Ready '
                               '(container controller running, readiness probe not passing)')
    assert len(verdict.notes) == 2 and 'Succeeded' in verdict.notes[0] + verdict.notes[1]


def test_pods_on_every_node_names_the_uncovered_node(k8s_objects):
    pods = [k8s_objects.pod(n) for n in ('cilium-4xk2p', 'cilium-9bqzt', 'cilium-x7k2m')]
    nodes = [k8s_objects.node(n) for n in ('cp-1', 'w-1', 'w-2', 'w-4')]
    verdict = predicates.pods_ready(pods, nodes, every_node=True, what='pods k8s-app=cilium')
    assert not verdict.ok
    node_items = [item for item in verdict.items if item.get('kind') == 'node']
    assert [(item['name'], item['reason']) for item in node_items] == [
        ('w-2', 'cilium-x7k2m CrashLoopBackOff (container cilium-agent, 7 restarts, last exit code 1 Error)'),
        ('w-4', 'no pod')]
    assert verdict.summary.startswith('pods k8s-app=cilium Ready 2/3, on nodes 2/4: ')


def test_pods_min_count(k8s_objects):
    verdict = predicates.pods_ready([k8s_objects.pod('cilium-4xk2p')], min_count=2)
    assert not verdict.ok and '1 pod(s) found, at least 2 expected' in verdict.summary
    assert predicates.pods_ready([k8s_objects.pod('cilium-4xk2p')]).ok


# --- CRDs ----------------------------------------------------------------------------------------

def test_crds_established_missing_installing_and_name_conflict(k8s_objects):
    crds = [k8s_objects.crd(n) for n in ('kustomizations.kustomize.toolkit.fluxcd.io',
                                         'gitrepositories.source.toolkit.fluxcd.io', 'ciliumnodes.cilium.io')]
    verdict = predicates.crds_established(crds, ['kustomizations.kustomize.toolkit.fluxcd.io',
                                                 'gitrepositories.source.toolkit.fluxcd.io',
                                                 'ciliumnodes.cilium.io', 'helmreleases.helm.toolkit.fluxcd.io'])
    assert not verdict.ok
    reasons = dict((item['name'], item['reason']) for item in verdict.items)
    assert reasons['kustomizations.kustomize.toolkit.fluxcd.io'] is None
    assert reasons['gitrepositories.source.toolkit.fluxcd.io'].startswith('Established=False Installing')
    assert reasons['ciliumnodes.cilium.io'] == 'NamesAccepted=False ShortNamesConflict: "cn" is already in use'
    assert reasons['helmreleases.helm.toolkit.fluxcd.io'] == 'not found'
    assert verdict.summary.startswith('CRDs Established 1/4: ')


def test_crds_by_selector_all_established(k8s_objects):
    verdict = predicates.crds_established([k8s_objects.crd('kustomizations.kustomize.toolkit.fluxcd.io')])
    assert verdict.ok and verdict.summary == 'CRDs Established 1/1'
    assert not predicates.crds_established([]).ok


# --- conditions (Flux) -----------------------------------------------------------------------------

def test_ready_kustomization_for_current_generation(k8s_objects):
    item = predicates.condition_met(k8s_objects.flux('flux-system'))
    assert item['ok'] and item['message'].startswith('ReconciliationSucceeded: Applied revision')


@pytest.mark.parametrize('name, reason', [
    # the condition's own observedGeneration (2) is current, so its reason is the news
    ('apps', "Ready=False DependencyNotReady: dependency 'flux-system/infra-configs' is not ready"),
    ('infra-configs', 'not reconciled yet: condition Ready observedGeneration 2 != generation 3'),
    ('csi', "Stalled BuildFailed: kustomize build failed: accumulating resources: 'kubernetes/apps/csi/app' not found"),
    ('sealed-secrets', 'Reconciling ProgressingWithRetry: Detecting drift for revision refs/heads/main@sha1:4f7a2c1e9b'),
    ('new-app', 'no Ready condition yet (waiting to be reconciled)'),
])
def test_kustomization_not_ready_reasons(k8s_objects, name, reason):
    item = predicates.condition_met(k8s_objects.flux(name))
    assert not item['ok'] and item['reason'] == reason
    assert item['stalled'] == (name == 'csi')


def test_without_condition_generation_status_generation_must_be_current(k8s_objects):
    obj = k8s_objects.flux('apps')
    del obj['status']['conditions'][0]['observedGeneration']
    item = predicates.condition_met(obj)
    assert item['reason'] == 'not reconciled yet: observedGeneration 1 < generation 2 (controller has not seen the latest spec)'


def test_helmrelease_without_condition_generation_uses_status_generation(k8s_objects):
    release = k8s_objects.flux('cert-manager')
    assert predicates.condition_met(release)['ok']
    release['metadata']['generation'] = 6
    assert not predicates.condition_met(release)['ok']


def test_condition_other_type_and_status(k8s_objects):
    release = k8s_objects.flux('cert-manager')
    assert predicates.condition_met(release, 'Released', 'True')['ok']
    assert not predicates.condition_met(release, 'Released', 'False')['ok']


def test_conditions_verdict_marks_stalled_as_failed(k8s_objects):
    objs = [k8s_objects.flux(n) for n in ('flux-system', 'csi')]
    verdict = predicates.conditions_met(objs, what='Kustomization')
    assert not verdict.ok and verdict.failed
    assert verdict.summary.startswith('Kustomization Ready=True 1/2: flux-system/csi Stalled BuildFailed')
    assert not predicates.conditions_met([], what='Kustomization').ok


def test_terminating_object_is_not_ready(k8s_objects):
    obj = k8s_objects.flux('flux-system')
    obj['metadata']['deletionTimestamp'] = '2026-11-25T12:00:00Z'
    assert predicates.condition_met(obj)['reason'] == 'being deleted'


# --- API ---------------------------------------------------------------------------------------------

def test_api_ready():
    assert predicates.api_ready(200, 'ok').ok
    verdict = predicates.api_ready(500, '[+]ping ok\n[-]etcd failed: reason withheld\n[+]log ok\nreadyz check failed')
    assert not verdict.ok
    assert verdict.summary == 'API /readyz answered 500, failing checks: etcd failed: reason withheld'
    assert predicates.api_ready(503, 'Service Unavailable').summary == 'API /readyz answered 503: Service Unavailable'


def test_a_suspended_flux_object_fails_at_once_named_suspended():
    # a GitRepository suspended before source-controller ever reconciled it: spec.suspend is the Flux API's switch
    # (source-controller api/v1.6.0 api/v1/gitrepository_types.go:140, Suspend), and the controller leaves status empty
    repo = {'apiVersion': 'source.toolkit.fluxcd.io/v1', 'kind': 'GitRepository',
            'metadata': {'name': 'flux-system', 'namespace': 'flux-system', 'generation': 1},
            'spec': {'url': 'https://git.example/r', 'interval': '1m', 'suspend': True}, 'status': {}}
    verdict = predicates.conditions_met([repo], what='GitRepository')
    assert not verdict.ok and verdict.failed
    assert verdict.items[0]['suspended']
    assert verdict.summary.startswith('GitRepository Ready=True 0/1: flux-system/flux-system suspended (spec.suspend: true)')
    repo['spec']['suspend'] = False
    assert not predicates.conditions_met([repo]).failed


def test_a_reconcile_request_not_handled_yet_is_not_ready():
    # what `flux reconcile source git` does: the reconcile.fluxcd.io/requestedAt annotation (fluxcd/pkg apis/meta
    # v1.12.0 annotations.go:23); source-controller v1.6.2 copies it to status.lastHandledReconcileAt when it is done
    # (internal/reconcile/summarize/processor.go:42-46). Until then the Ready=True seen is the previous fetch's.
    repo = {'apiVersion': 'source.toolkit.fluxcd.io/v1', 'kind': 'GitRepository',
            'metadata': {'name': 'flux-system', 'namespace': 'flux-system', 'generation': 1,
                         'annotations': {'reconcile.fluxcd.io/requestedAt': '2026-11-27T16:40:00.000000001Z'}},
            'spec': {'url': 'https://git.example/r', 'interval': '1m'},
            'status': {'observedGeneration': 1, 'lastHandledReconcileAt': '2026-11-27T09:00:00Z',
                       'conditions': [{'type': 'Ready', 'status': 'True', 'reason': 'Succeeded', 'observedGeneration': 1,
                                       'message': "stored artifact for revision 'main@sha1:1111111111111111111111111111111111111111'"}]}}
    item = predicates.condition_met(repo)
    assert not item['ok'] and item['reason'] == ('reconcile requested at 2026-11-27T16:40:00.000000001Z not handled yet '
                                                 '(lastHandledReconcileAt 2026-11-27T09:00:00Z)')
    repo['status']['lastHandledReconcileAt'] = '2026-11-27T16:40:00.000000001Z'
    assert predicates.condition_met(repo)['ok']
