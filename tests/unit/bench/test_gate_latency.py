"""bench.p4_gate_latency: which lab delay a gate waited for, and the latency statistics; bench CLI selection."""

import pytest

from bench import p4_gate_latency as p4
from bench.__main__ import select
from bench.common import Benchmark


def gate(stage, host, start, end, target=None, name='a gate'):
    return {'stage': stage, 'host': host, 'start': start, 'end': end, 'target': target, 'name': name, 'ok': True}


ENDS = [(5.0, 'vm_boot', 'cp-1'), (7.0, 'vm_boot', 'w-1'), (30.0, 'pod_ready', 'pod/kube-system/cilium-a'),
        (31.0, 'pod_ready', 'pod/podinfo/web-1'), (32.0, 'flux_git_fetch', 'GitRepository/flux-system/flux-system')]


def test_a_per_node_gate_waits_only_for_its_own_node():
    assert p4.condition_moment(gate('vms', 'cp-1', 1.0, 9.0), ENDS) == (5.0, 'vm_boot', 'cp-1')
    assert p4.condition_moment(gate('vms', 'w-1', 1.0, 9.0), ENDS) == (7.0, 'vm_boot', 'w-1')
    assert p4.condition_moment(gate('vms', 'w-2', 1.0, 9.0), ENDS) is None


def test_a_gate_of_a_multi_node_run_is_per_node_by_its_target():
    # one module run checked every node: each node's gate names the node's VM or Talos endpoint as its target
    assert p4.condition_moment(gate('vms', 'w-1', 1.0, 9.0, target='VM 1021 on PVE node pve1'), ENDS) == (7.0, 'vm_boot', 'w-1')
    assert p4.condition_moment(gate('vms', 'w-2', 1.0, 9.0, target='VM 1022 on PVE node pve1'), ENDS) is None
    assert p4.condition_moment(gate('vms', 'w-2', 1.0, 9.0, target='10.5.0.22:50000'), ENDS) is None
    assert p4.condition_moment(gate('vms', 'cp-1', 1.0, 9.0, target='[fd00::11]:50000'), ENDS) == (5.0, 'vm_boot', 'cp-1')
    # a gate about the cluster (run once, on cp-1) waits for every node's delays
    assert p4.condition_moment(gate('cni', 'cp-1', 1.0, 40.0, target='nodes'), ENDS) is not None


def test_only_delays_ending_inside_the_gate_and_of_its_stage_count():
    assert p4.condition_moment(gate('vms', 'cp-1', 6.0, 9.0), ENDS) is None          # the boot ended before
    assert p4.condition_moment(gate('cni', 'cp-1', 1.0, 40.0, target='nodes'), ENDS)[2] == 'pod/podinfo/web-1'
    assert p4.condition_moment(gate('flux', 'cp-1', 1.0, 40.0, target='GitRepository flux-system/flux-system'),
                               ENDS)[1] == 'flux_git_fetch'


def test_a_gate_naming_a_namespace_waits_only_for_pods_there():
    pods_gate = gate('cni', 'cp-1', 1.0, 40.0, target='pods k8s-app=cilium in namespace kube-system')
    assert p4.condition_moment(pods_gate, ENDS)[2] == 'pod/kube-system/cilium-a'
    deployment_gate = gate('gitops', 'cp-1', 1.0, 40.0, target='Deployment podinfo/web')
    assert p4.condition_moment(deployment_gate, ENDS)[2] == 'pod/podinfo/web-1'


def test_a_gate_naming_a_flux_object_waits_only_for_it():
    source_gate = gate('flux', 'cp-1', 1.0, 40.0, target='GitRepository flux-system/flux-system')
    assert p4.condition_moment(source_gate, ENDS)[1:] == ('flux_git_fetch', 'GitRepository/flux-system/flux-system')
    other = gate('flux', 'cp-1', 1.0, 40.0, target='GitRepository flux-system/other')
    assert p4.condition_moment(other, ENDS) is None


def test_percentile_by_nearest_rank():
    values = [float(v) for v in range(1, 21)]
    assert p4.percentile(values, 0.95) == 19.0
    assert p4.percentile(values, 0.5) == 10.0
    assert p4.percentile([3.0], 0.95) == 3.0
    assert p4.percentile([], 0.5) is None


class _Measured(object):
    def __init__(self, delays, gates, shift):
        self.delays = delays
        self.shift = shift
        self.run = type('Run', (), {'report': {'gates': gates}})()


def test_latencies_align_the_lab_clock_and_split_waiting_from_immediate_gates():
    delays = [{'seq': 1, 'kind': 'vm_boot', 'target': 'cp-1', 'start': 100.0, 'planned': 5.0, 'duration': 5.0, 'outcome': 'done'}]
    gates = [gate('vms', 'cp-1', 1.0, 6.5), gate('kubeconfig', 'cp-1', 10.0, 11.0, target='API /readyz')]
    waited, immediate = p4.latencies(_Measured(delays, gates, shift=-100.0))   # lab 105 s = report 5 s
    assert [(g['stage'], round(latency, 3)) for g, latency, _m in waited] == [('vms', 1.5)]
    assert [g['stage'] for g in immediate] == ['kubeconfig']


def test_cli_selects_by_short_or_full_name_in_module_order():
    benchmarks = {'p1_a': Benchmark('p1_a', 'A', '', None), 'p3_b': Benchmark('p3_b', 'B', '', None),
                  'p4_c': Benchmark('p4_c', 'C', '', None)}
    chosen, unknown = select(benchmarks, [], 'P4,p1')
    assert [b.name for b in chosen] == ['p1_a', 'p4_c'] and unknown == []
    chosen, unknown = select(benchmarks, ['p3_b'], 'P9')
    assert [b.name for b in chosen] == ['p3_b'] and unknown == ['P9']
    assert len(select(benchmarks, [], None)[0]) == 3


@pytest.mark.parametrize('text', ['', 'x', '0', '3,-1'])
def test_cli_rejects_bad_worker_counts(text):
    from bench.__main__ import main
    with pytest.raises(SystemExit):
        main(['--p2-workers', text, '--list'])
