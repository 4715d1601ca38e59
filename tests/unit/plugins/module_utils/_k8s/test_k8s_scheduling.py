"""Where pods may run: taints/tolerations, selectors, affinity, schedulable replica counting."""
import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import objects
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import scheduling


@pytest.mark.parametrize('toleration, taint, expected', [
    ({'operator': 'Exists'}, {'key': 'anything', 'effect': 'NoSchedule'}, True),
    ({'key': 'a', 'operator': 'Exists'}, {'key': 'a', 'value': 'x', 'effect': 'NoExecute'}, True),
    ({'key': 'a', 'value': 'x'}, {'key': 'a', 'value': 'x', 'effect': 'NoSchedule'}, True),
    ({'key': 'a', 'value': 'y'}, {'key': 'a', 'value': 'x', 'effect': 'NoSchedule'}, False),
    ({'key': 'a', 'operator': 'Exists', 'effect': 'NoExecute'}, {'key': 'a', 'effect': 'NoSchedule'}, False),
    ({'key': 'b', 'operator': 'Exists'}, {'key': 'a', 'effect': 'NoSchedule'}, False),
    ({'operator': 'Equal'}, {'key': 'a', 'effect': 'NoSchedule'}, False),  # empty key needs Exists
])
def test_tolerates(toleration, taint, expected):
    assert scheduling.tolerates(toleration, taint) is expected


def test_not_ready_taint_is_implied_from_the_ready_condition(k8s_objects):
    node = k8s_objects.node('w-5')  # no status yet, no taints
    assert [(t['key'], t['effect']) for t in scheduling.node_taints(node)] == [('node.kubernetes.io/not-ready', 'NoSchedule')]
    unknown = k8s_objects.node('w-3')  # already tainted unreachable: nothing added twice
    keys = [(t['key'], t['effect']) for t in scheduling.node_taints(unknown)]
    assert keys.count(('node.kubernetes.io/unreachable', 'NoSchedule')) == 1


def test_cordoned_node_blocks_normal_pods_but_not_daemon_pods(k8s_objects):
    node = k8s_objects.node('w-4')
    node['spec']['taints'] = []  # only spec.unschedulable left
    assert scheduling.node_fit({}, node) == 'untolerated taint node.kubernetes.io/unschedulable:NoSchedule'
    assert scheduling.node_fit({}, node, daemonset=True) is None


def test_daemon_pods_tolerate_pressure_but_not_the_not_ready_noschedule_taint(k8s_objects):
    assert scheduling.node_fit({}, k8s_objects.node('w-4'), daemonset=True) is None  # disk-pressure
    assert 'not-ready:NoSchedule' in scheduling.node_fit({}, k8s_objects.node('w-2'), daemonset=True)


def test_host_network_daemon_pods_tolerate_network_unavailable(k8s_objects):
    node = k8s_objects.node('w-1')
    node['spec']['taints'] = [{'key': 'node.kubernetes.io/network-unavailable', 'effect': 'NoSchedule'}]
    assert scheduling.node_fit({}, node, daemonset=True) is not None
    assert scheduling.node_fit({'hostNetwork': True}, node, daemonset=True) is None


def test_required_node_affinity(k8s_objects):
    spec = {'affinity': {'nodeAffinity': {'requiredDuringSchedulingIgnoredDuringExecution': {'nodeSelectorTerms': [
        {'matchExpressions': [{'key': 'storage', 'operator': 'In', 'values': ['true']}]},
        {'matchFields': [{'key': 'metadata.name', 'operator': 'In', 'values': ['w-1']}]},
    ]}}}}
    assert scheduling.node_fit(spec, k8s_objects.node('w-1')) is None          # second term by name
    assert scheduling.node_fit(spec, k8s_objects.node('cp-1')) == 'required node affinity does not match'


@pytest.mark.parametrize('expression, expected', [
    ({'key': 'storage', 'operator': 'Exists'}, True),
    ({'key': 'storage', 'operator': 'DoesNotExist'}, False),
    ({'key': 'storage', 'operator': 'NotIn', 'values': ['false']}, True),
    ({'key': 'disks', 'operator': 'Gt', 'values': ['2']}, True),
    ({'key': 'disks', 'operator': 'Lt', 'values': ['2']}, False),
    ({'key': 'storage', 'operator': 'Gt', 'values': ['2']}, False),  # not an integer
])
def test_selector_expressions(expression, expected):
    assert objects.selector_matches({'matchExpressions': [expression]}, {'storage': 'true', 'disks': '4'}) is expected


def test_empty_selector_matches_all_and_missing_matches_none():
    assert objects.selector_matches({}, {'a': 'b'})
    assert not objects.selector_matches(None, {'a': 'b'})


def test_schedulable_replicas_anti_affinity_per_hostname(k8s_objects):
    template = k8s_objects.workload('cilium-operator')['spec']['template']
    nodes = [k8s_objects.node(n) for n in ('cp-1', 'w-1', 'w-2')]
    count, text = scheduling.schedulable_replicas(template, 2, nodes)
    assert count == 2  # tolerates everything, one per node, three nodes
    count, text = scheduling.schedulable_replicas(template, 2, nodes[:1])
    assert count == 1
    assert text == ('1 of 2 replicas can be scheduled on 1 eligible node(s) '
                    '(required pod anti-affinity on kubernetes.io/hostname allows 1)')


def test_schedulable_replicas_without_anti_affinity_is_limited_by_eligibility_only(k8s_objects):
    template = k8s_objects.workload('coredns')['spec']['template']
    nodes = [k8s_objects.node(n) for n in ('cp-1', 'w-2')]
    count, text = scheduling.schedulable_replicas(template, 2, nodes)
    assert count == 2 and 'not eligible: w-2 (untolerated taint node.kubernetes.io/not-ready:NoSchedule' in text
    count, text = scheduling.schedulable_replicas(template, 2, nodes[1:])
    assert count == 0 and text.startswith('no node is eligible')


def test_anti_affinity_on_a_zone_label(k8s_objects):
    template = k8s_objects.workload('cilium-operator')['spec']['template']
    term = template['spec']['affinity']['podAntiAffinity']['requiredDuringSchedulingIgnoredDuringExecution'][0]
    term['topologyKey'] = 'topology.kubernetes.io/zone'
    nodes = [k8s_objects.node(n) for n in ('cp-1', 'w-1')]
    for node in nodes:
        node['metadata']['labels']['topology.kubernetes.io/zone'] = 'pve1'
    assert scheduling.schedulable_replicas(template, 2, nodes)[0] == 1
    del nodes[1]['metadata']['labels']['topology.kubernetes.io/zone']  # unlabelled node: no limit
    assert scheduling.schedulable_replicas(template, 2, nodes)[0] == 2
