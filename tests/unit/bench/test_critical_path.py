"""bench.critical_path: the critical path of the lab's delay records under the documented rules."""

import pytest

from bench.critical_path import Facts, compute, facts_from_objects, select_steps, world_latencies

SEQ = iter(range(1, 100000))


def rec(kind, target, planned, start=0.0, duration=None, outcome='done'):
    """A delay record as the lab writes it (start and duration are the lab's; planned is what counts)."""
    return {'seq': next(SEQ), 'kind': kind, 'target': target, 'start': start, 'nominal': planned,
            'planned': planned, 'duration': planned if duration is None else duration, 'outcome': outcome}


def facts(**extra):
    base = dict(control_planes=['cp-1', 'cp-2'], workers=['w-1'], vmids={'cp-1': 11, 'cp-2': 12, 'w-1': 21})
    base.update(extra)
    return Facts(**base)


def node_records(node, boot=20.0, install=60.0, start=0.0):
    return [rec('vm_boot', node, boot, start), rec('talos_install_reboot', node, install, start + 100)]


def test_one_node_chain_is_the_sum_of_its_planned_delays():
    records = node_records('cp-1') + [rec('etcd_bootstrap', 'cp-1', 20.0, 300), rec('kubelet_start', 'cp-1', 10.0, 400)]
    path = compute(records, facts())
    assert path.length == pytest.approx(110.0)
    assert [(s.kind, s.target) for s in path.chain] == [
        ('vm_boot', 'cp-1'), ('talos_install_reboot', 'cp-1'), ('etcd_bootstrap', 'cp-1'), ('kubelet_start', 'cp-1')]


def test_gaps_between_records_do_not_count():
    """The orchestrator started the install 500 s after the boot ended: that is overhead, not critical path."""
    slow = node_records('cp-1', start=0.0)
    slow[1]['start'] = 520.0
    assert compute(slow, facts()).length == pytest.approx(80.0)


def test_the_longest_node_chain_wins():
    records = node_records('cp-1', boot=20.0) + node_records('w-1', boot=35.0)
    path = compute(records, facts())
    assert path.length == pytest.approx(95.0)
    assert path.chain[0].target == 'w-1'


def test_worker_certificate_waits_for_the_first_control_plane_only():
    records = (node_records('cp-1', install=60.0) + node_records('cp-2', install=90.0) + node_records('w-1', install=10.0)
               + [rec('talos_apid_cert', 'w-1', 2.0), rec('kubelet_start', 'w-1', 5.0)])
    path = compute(records, facts())
    cert = path.steps[('talos_apid_cert', 'w-1')]
    assert cert.start == pytest.approx(80.0)       # cp-1 up at 20 + 60, not cp-2 at 110
    assert path.length == pytest.approx(110.0)      # cp-2's install is the longest chain
    assert path.steps[('kubelet_start', 'w-1')].finish == pytest.approx(87.0)


def test_join_waits_for_the_bootstrap():
    records = (node_records('cp-1') + node_records('cp-2', install=10.0)
               + [rec('etcd_bootstrap', 'cp-1', 20.0), rec('etcd_join', 'cp-2', 15.0), rec('kubelet_start', 'cp-2', 5.0)])
    path = compute(records, facts())
    assert path.steps[('etcd_join', 'cp-2')].start == pytest.approx(100.0)
    assert [s.kind for s in path.chain][-3:] == ['etcd_bootstrap', 'etcd_join', 'kubelet_start']
    assert path.length == pytest.approx(120.0)


def test_only_the_first_done_record_of_a_kind_and_target_counts():
    records = [rec('vm_boot', 'cp-1', 20.0, 0.0), rec('vm_boot', 'cp-1', 500.0, 50.0),
               rec('vm_boot', 'w-1', 30.0, 0.0, outcome='cancelled'), rec('talos_reboot', 'cp-1', 30.0, 80.0),
               rec('crashloop_restart', 'x', 10.0, 90.0)]
    steps, unmodelled = select_steps(records)
    assert list(steps) == [('vm_boot', 'cp-1')]
    assert unmodelled == {'talos_reboot': 1, 'crashloop_restart': 1}
    assert compute(records, facts()).length == pytest.approx(20.0)


def test_pve_tasks_weigh_their_measured_duration_and_come_first():
    records = [rec('pve_task', 'download:local', 0.0, duration=4.0), rec('pve_task', 'qmcreate:11', 0.0, duration=1.0),
               rec('pve_task', 'qmstart:11', 0.0, duration=0.5)] + node_records('cp-1')
    path = compute(records, facts())
    assert path.length == pytest.approx(85.5)
    assert [s.target for s in path.chain][:3] == ['download:local', 'qmcreate:11', 'qmstart:11']


def _cluster_records():
    return (node_records('cp-1') + node_records('w-1', install=50.0)
            + [rec('etcd_bootstrap', 'cp-1', 20.0), rec('kubelet_start', 'cp-1', 5.0), rec('talos_apid_cert', 'w-1', 2.0),
               rec('kubelet_start', 'w-1', 5.0)])


def test_a_pod_waits_for_its_node_network_unless_it_uses_the_host_network():
    pods = {'kube-system/cilium-a': {'node': 'w-1', 'host_network': True, 'labels': {'k8s-app': 'cilium'}, 'workload': 'DaemonSet/kube-system/cilium'},
            'app/web-1': {'node': 'w-1', 'host_network': False, 'labels': {}, 'workload': 'Deployment/app/web'},
            'app/agent-1': {'node': 'w-1', 'host_network': True, 'labels': {}, 'workload': 'DaemonSet/app/agent'}}
    records = _cluster_records() + [rec('pod_ready', 'pod/kube-system/cilium-a', 12.0), rec('pod_ready', 'pod/app/web-1', 7.0),
                                    rec('pod_ready', 'pod/app/agent-1', 3.0)]
    path = compute(records, facts(pods=pods))
    # API at 20 + 60 + 20 = 100; w-1 kubelet at 20 + 50 + 2 + 5 = 77; cilium 100 -> 112; web 112 -> 119
    assert path.steps[('pod_ready', 'pod/kube-system/cilium-a')].finish == pytest.approx(112.0)
    assert path.steps[('pod_ready', 'pod/app/agent-1')].finish == pytest.approx(103.0)
    assert path.length == pytest.approx(119.0)
    assert [s.target for s in path.chain][-2:] == ['pod/kube-system/cilium-a', 'pod/app/web-1']


def test_a_pod_that_no_longer_exists_is_left_out():
    records = _cluster_records() + [rec('pod_ready', 'pod/app/gone-1', 500.0)]
    path = compute(records, facts())
    assert path.unmatched == ['pod/app/gone-1']
    assert path.length == pytest.approx(105.0)


def test_flux_reconciles_follow_source_creator_and_depends_on_with_health():
    workloads = {'Deployment/flux-system/source-controller': {'labels': {}},
                 'Deployment/flux-system/kustomize-controller': {'labels': {}},
                 'Deployment/infra/ccm': {'labels': {'kustomize.toolkit.fluxcd.io/name': 'infra',
                                                     'kustomize.toolkit.fluxcd.io/namespace': 'flux-system'}},
                 'Deployment/apps/web': {'labels': {'kustomize.toolkit.fluxcd.io/name': 'apps',
                                                    'kustomize.toolkit.fluxcd.io/namespace': 'flux-system'}}}
    host = {'node': 'cp-1', 'host_network': True, 'labels': {}}
    pods = {'flux-system/source-1': dict(host, workload='Deployment/flux-system/source-controller'),
            'flux-system/kustomize-1': dict(host, workload='Deployment/flux-system/kustomize-controller'),
            'infra/ccm-1': dict(host, workload='Deployment/infra/ccm'),
            'apps/web-1': dict(host, workload='Deployment/apps/web')}
    child = {'kustomize.toolkit.fluxcd.io/name': 'flux-system', 'kustomize.toolkit.fluxcd.io/namespace': 'flux-system'}
    kustomizations = {'flux-system/flux-system': {'depends_on': [], 'source': 'flux-system/flux-system', 'labels': {}},
                      'flux-system/infra': {'depends_on': [], 'source': 'flux-system/flux-system', 'labels': child},
                      'flux-system/apps': {'depends_on': ['flux-system/infra'], 'source': 'flux-system/flux-system',
                                           'labels': child}}
    records = (node_records('cp-1') + [rec('etcd_bootstrap', 'cp-1', 20.0), rec('kubelet_start', 'cp-1', 5.0)] + [
        rec('pod_ready', 'pod/flux-system/source-1', 10.0), rec('pod_ready', 'pod/flux-system/kustomize-1', 30.0),
        rec('flux_git_fetch', 'GitRepository/flux-system/flux-system', 3.0),
        rec('flux_git_fetch', 'GitRepository/flux-system/flux-system', 3.0),   # the next interval: a refresh
        rec('flux_reconcile', 'Kustomization/flux-system/flux-system', 1.0),
        rec('flux_reconcile', 'Kustomization/flux-system/infra', 2.0), rec('pod_ready', 'pod/infra/ccm-1', 20.0),
        rec('flux_reconcile', 'Kustomization/flux-system/apps', 2.0), rec('pod_ready', 'pod/apps/web-1', 10.0)])
    path = compute(records, facts(workloads=workloads, pods=pods, kustomizations=kustomizations))
    # API 100 (kubelet 105); kustomize-controller 105 -> 135; root 136; infra 138; ccm 158; apps 160; web 170
    assert path.steps[('flux_reconcile', 'Kustomization/flux-system/flux-system')].finish == pytest.approx(136.0)
    assert path.steps[('flux_reconcile', 'Kustomization/flux-system/apps')].start == pytest.approx(158.0)
    assert path.length == pytest.approx(170.0)
    assert [s.target for s in path.chain][-5:] == [
        'Kustomization/flux-system/flux-system', 'Kustomization/flux-system/infra', 'pod/infra/ccm-1',
        'Kustomization/flux-system/apps', 'pod/apps/web-1']


def test_bootstrap_releases_follow_their_needs():
    workloads = {'Deployment/ops/operator': {'labels': {}, 'annotations': {'meta.helm.sh/release-name': 'operator',
                                                                           'meta.helm.sh/release-namespace': 'ops'}},
                 'Deployment/demo/web': {'labels': {}, 'annotations': {}}}
    host = {'node': 'cp-1', 'host_network': True, 'labels': {}}
    pods = {'ops/operator-1': dict(host, workload='Deployment/ops/operator'), 'demo/web-1': dict(host, workload='Deployment/demo/web')}
    releases = {'ops/operator': {'needs': []}, 'demo/web': {'needs': ['ops/operator']}}
    records = (node_records('cp-1') + [rec('etcd_bootstrap', 'cp-1', 20.0), rec('kubelet_start', 'cp-1', 5.0),
                                       rec('pod_ready', 'pod/ops/operator-1', 15.0), rec('pod_ready', 'pod/demo/web-1', 10.0)])
    path = compute(records, facts(workloads=workloads, pods=pods, releases=releases))
    assert path.steps[('pod_ready', 'pod/demo/web-1')].start == pytest.approx(120.0)
    assert path.length == pytest.approx(130.0)


FETCH = ('flux_git_fetch', 'GitRepository/flux-system/flux-system')
SOURCE = ('pod_ready', 'pod/flux-system/source-1')
OPERATOR = ('pod_ready', 'pod/ops/operator-1')


def starts(path, *keys):
    """The start of each step, then the critical path's length."""
    return [path.steps[key].start for key in keys] + [path.length]


def test_stage_contract_puts_the_bootstrap_releases_before_the_first_fetch():
    workloads = {'Deployment/ops/operator': {'labels': {}, 'annotations': {}},
                 'Deployment/flux-system/source-controller': {'labels': {}}}
    host = {'node': 'cp-1', 'host_network': True, 'labels': {}}
    pods = {'ops/operator-1': dict(host, workload='Deployment/ops/operator'),
            'flux-system/source-1': dict(host, workload='Deployment/flux-system/source-controller')}
    records = (node_records('cp-1') + [rec('etcd_bootstrap', 'cp-1', 20.0), rec('kubelet_start', 'cp-1', 5.0),
                                       rec('pod_ready', 'pod/ops/operator-1', 30.0), rec('pod_ready', 'pod/flux-system/source-1', 10.0),
                                       rec('flux_git_fetch', 'GitRepository/flux-system/flux-system', 2.0)])
    known = facts(workloads=workloads, pods=pods, releases={'ops/operator': {'needs': []}})
    assert compute(records, known).steps[('flux_git_fetch', 'GitRepository/flux-system/flux-system')].finish == pytest.approx(117.0)
    # The controllers start right away (site.yml applies them after the kubeconfig stage); the sync waits for the
    # releases when Flux is handed the repository after them (flux_handoff after_apps) ...
    late = compute(records, known, stage_contract=True)
    assert starts(late, SOURCE, FETCH, OPERATOR) == pytest.approx([105.0, 135.0, 105.0, 137.0])
    # ... and not when it is handed the repository before them: then the releases wait for the flux stage's gates (the
    # controllers' pods and the first fetch)
    early = compute(records, known, stage_contract=True, handoff_before_apps=True)
    assert starts(early, SOURCE, FETCH, OPERATOR) == pytest.approx([105.0, 115.0, 117.0, 147.0])


def test_stage_contract_starts_release_pods_and_the_first_fetch_after_the_agent_on_every_node():
    workloads = {'Deployment/ops/operator': {'labels': {}, 'annotations': {}},
                 'Deployment/flux-system/source-controller': {'labels': {}},
                 'DaemonSet/kube-system/cilium': {'labels': {}}}
    agent = {'host_network': True, 'labels': {'k8s-app': 'cilium'}, 'workload': 'DaemonSet/kube-system/cilium'}
    pods = {'kube-system/cilium-1': dict(agent, node='cp-1'), 'kube-system/cilium-2': dict(agent, node='cp-2'),
            'ops/operator-1': {'node': 'cp-1', 'host_network': False, 'labels': {}, 'workload': 'Deployment/ops/operator'},
            'flux-system/source-1': {'node': 'cp-1', 'host_network': False, 'labels': {},
                                     'workload': 'Deployment/flux-system/source-controller'}}
    records = (node_records('cp-1') + node_records('cp-2') +
               [rec('etcd_bootstrap', 'cp-1', 20.0), rec('kubelet_start', 'cp-1', 5.0), rec('kubelet_start', 'cp-2', 5.0),
                rec('pod_ready', 'pod/kube-system/cilium-1', 10.0), rec('pod_ready', 'pod/kube-system/cilium-2', 40.0),
                rec('pod_ready', 'pod/ops/operator-1', 10.0), rec('pod_ready', 'pod/flux-system/source-1', 10.0),
                rec('flux_git_fetch', 'GitRepository/flux-system/flux-system', 2.0)])
    known = facts(workloads=workloads, pods=pods, releases={'ops/operator': {'needs': []}})
    # cp-1's agent is Ready at 115 (cp-2's at 140): the network of cp-1 is all its pods need
    free = compute(records, known)
    assert free.steps[('pod_ready', 'pod/ops/operator-1')].start == pytest.approx(115.0)
    assert free.steps[('pod_ready', 'pod/flux-system/source-1')].start == pytest.approx(115.0)
    assert free.steps[('flux_git_fetch', 'GitRepository/flux-system/flux-system')].start == pytest.approx(125.0)
    # the stage order: the releases are written, and Flux gets the repository, after the cni stage's gate (the agent on
    # every node Ready); Flux's controllers are applied before it and start with their node's network
    late = compute(records, known, stage_contract=True)
    assert starts(late, SOURCE, FETCH, OPERATOR) == pytest.approx([115.0, 150.0, 140.0, 152.0])
    # handed over before the releases: site.yml's flux play runs before the cni gates, so the fetch waits for the
    # source controller (cp-1's network), not for cp-2's agent, and the releases for the last agent and the flux
    # stage's gates
    early = compute(records, known, stage_contract=True, handoff_before_apps=True)
    assert starts(early, SOURCE, FETCH, OPERATOR) == pytest.approx([115.0, 125.0, 140.0, 150.0])
    # ... but after the kubelet of every node (the services gate, the cni stage's kubelet check): cp-2's kubelet late
    slow_kubelet = [rec('kubelet_start', 'cp-2', 130.0) if r['kind'] == 'kubelet_start' and r['target'] == 'cp-2' else r
                    for r in records]
    kubelet_end = compute(slow_kubelet, known).steps[('kubelet_start', 'cp-2')].finish
    assert kubelet_end > 125.0
    late_kubelet = compute(slow_kubelet, known, stage_contract=True, handoff_before_apps=True)
    assert late_kubelet.steps[FETCH].start == pytest.approx(kubelet_end)
    assert compute(slow_kubelet, known).steps[FETCH].start == pytest.approx(125.0)


def test_a_release_in_kube_system_is_told_by_its_helm_annotation_only():
    # A bootstrap release in kube-system (spegel, as inventories/apps has it) next to Talos's own workloads there: the
    # agents and CoreDNS are not its pods, so the stage order does not put them after the agents (no cycle either).
    workloads = {'DaemonSet/kube-system/spegel': {'labels': {}, 'annotations': {'meta.helm.sh/release-name': 'spegel'}},
                 'Deployment/kube-system/coredns': {'labels': {}, 'annotations': {}},
                 'DaemonSet/kube-system/cilium': {'labels': {}, 'annotations': {}}}
    agent = {'host_network': True, 'labels': {'k8s-app': 'cilium'}, 'workload': 'DaemonSet/kube-system/cilium'}
    pods = {'kube-system/cilium-1': dict(agent, node='cp-1'), 'kube-system/cilium-2': dict(agent, node='cp-2'),
            'kube-system/coredns-1': {'node': 'cp-1', 'host_network': False, 'labels': {}, 'workload': 'Deployment/kube-system/coredns'},
            'kube-system/spegel-1': {'node': 'cp-1', 'host_network': False, 'labels': {}, 'workload': 'DaemonSet/kube-system/spegel'}}
    records = (node_records('cp-1') + node_records('cp-2') +
               [rec('etcd_bootstrap', 'cp-1', 20.0), rec('kubelet_start', 'cp-1', 5.0), rec('kubelet_start', 'cp-2', 5.0),
                rec('pod_ready', 'pod/kube-system/cilium-1', 10.0), rec('pod_ready', 'pod/kube-system/cilium-2', 40.0),
                rec('pod_ready', 'pod/kube-system/coredns-1', 10.0), rec('pod_ready', 'pod/kube-system/spegel-1', 10.0)])
    known = facts(workloads=workloads, pods=pods, releases={'kube-system/spegel': {'needs': []}})
    contract = compute(records, known, stage_contract=True)
    assert contract.steps[('pod_ready', 'pod/kube-system/coredns-1')].start == pytest.approx(115.0)
    assert contract.steps[('pod_ready', 'pod/kube-system/cilium-2')].start == pytest.approx(100.0)
    assert contract.steps[('pod_ready', 'pod/kube-system/spegel-1')].start == pytest.approx(140.0)


def test_no_delays_no_critical_path():
    path = compute([], facts())
    assert path.length == 0.0
    assert path.chain == []


def test_facts_from_objects_maps_pods_to_workloads_through_replicasets():
    pods = [{'metadata': {'namespace': 'app', 'name': 'web-abc-1', 'labels': {'a': 'b'},
                          'ownerReferences': [{'kind': 'ReplicaSet', 'name': 'web-abc'}]},
             'spec': {'nodeName': 'w-1'}},
            {'metadata': {'namespace': 'kube-system', 'name': 'cilium-x', 'ownerReferences': [{'kind': 'DaemonSet', 'name': 'cilium'}]},
             'spec': {'nodeName': 'cp-1', 'hostNetwork': True}}]
    replicasets = [{'metadata': {'namespace': 'app', 'name': 'web-abc', 'ownerReferences': [{'kind': 'Deployment', 'name': 'web'}]}}]
    workloads = [{'kind': 'Deployment', 'metadata': {'namespace': 'app', 'name': 'web', 'labels': {'x': 'y'}}}]
    kustomizations = [{'metadata': {'namespace': 'flux-system', 'name': 'apps', 'labels': {}},
                       'spec': {'dependsOn': [{'name': 'infra'}], 'sourceRef': {'kind': 'GitRepository', 'name': 'flux-system'}}}]
    found = facts_from_objects({'controlplane': ['cp-1'], 'worker': ['w-1']}, [{'vmid': 11, 'name': 'cp-1'}], pods,
                               replicasets, workloads, kustomizations, [{'name': 'web', 'namespace': 'app', 'needs': ['ops/op']}])
    assert found.pods['app/web-abc-1'] == {'node': 'w-1', 'host_network': False, 'labels': {'a': 'b'}, 'workload': 'Deployment/app/web'}
    assert found.pods['kube-system/cilium-x']['workload'] == 'DaemonSet/kube-system/cilium'
    assert found.kustomizations['flux-system/apps'] == {
        'depends_on': ['flux-system/infra'], 'source': 'flux-system/flux-system', 'labels': {}}
    assert found.releases == {'app/web': {'needs': ['ops/op']}}
    assert found.vmids == {'cp-1': 11}
    assert found.control_planes == ['cp-1'] and found.workers == ['w-1']


def _object(namespace, name, created, ready=None):
    conditions = [{'type': 'Ready', 'status': 'True', 'lastTransitionTime': ready}] if ready else [
        {'type': 'Ready', 'status': 'False', 'lastTransitionTime': created}]
    return {'metadata': {'namespace': namespace, 'name': name, 'creationTimestamp': created},
            'status': {'conditions': conditions}}


def test_the_worlds_own_latencies_are_named_for_the_objects_without_a_delay_record():
    objects = {'pods': [_object('kube-system', 'cilium-a', '2026-11-28T12:00:00Z', '2026-11-28T12:00:03Z'),
                        _object('flux-system', 'source-controller-x', '2026-11-28T12:00:00Z', '2026-11-28T12:00:10Z'),
                        _object('apps', 'podinfo-y', '2026-11-28T12:01:00Z'),                          # not Ready: left out
                        _object('apps', 'recorded-z', '2026-11-28T12:01:00Z', '2026-11-28T12:01:30Z')],  # the lab's delay
               'kustomizations': [_object('flux-system', 'apps', '2026-11-28T12:00:20Z', '2026-11-28T12:00:27Z')]}
    records = [rec('pod_ready', 'pod/apps/recorded-z', 20.0), rec('vm_boot', 'cp-1', 20.0), rec('vm_boot', 'cp-2', 20.0)]
    found = world_latencies(objects, records)
    assert found['recorded_delay_kinds'] == {'pod_ready': 1, 'vm_boot': 2}
    assert found['pods_created_to_ready_without_a_delay_record'] == {
        'count': 2, 'median': 10.0, 'max': 10.0,
        'slowest': [['flux-system/source-controller-x', 10.0], ['kube-system/cilium-a', 3.0]]}
    assert found['kustomizations_created_to_ready_without_a_delay_record'] == {
        'count': 1, 'median': 7.0, 'max': 7.0, 'slowest': [['flux-system/apps', 7.0]]}
    recorded = world_latencies(objects, records + [rec('flux_reconcile', 'Kustomization/flux-system/apps', 2.0)])
    assert recorded['kustomizations_created_to_ready_without_a_delay_record'] == {'count': 0}
