"""P6: peak memory of the lab and of ansible-playbook during a whole site.yml, at 6 and 96 nodes.

Taken from the P1 and P2 bootstraps (run once for all). The lab: the peak of its process tree's summed PSS, sampled
every 0.5 s while site.yml runs (on upstream Kubernetes the lab starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok and Flux's controllers as its children; the hand-written world is one process), the biggest of
its processes by name, and the lab process's own peak RSS (VmHWM, read before it stops). ansible-playbook: its main
process peak RSS (VmHWM), and the peak of its whole process tree (forked workers and the module processes they run) as
summed PSS, sampled the same way: PSS counts pages shared by forks once, so a tree's sum is the memory it really
holds. Goal: the lab's tree <= 2 GiB at 96 nodes.
"""

from bench.common import Benchmark, Metric, bootstrap, option
from bench.p1_bootstrap_ratio import CONTROL_PLANES, DEFAULT_TIME_SCALE, WORKERS
from bench.p2_scaling import DEFAULT_WORKERS

GOAL_LAB_MIB = 2048
MIB = 1024.0


def _mib(kb):
    return round(kb / MIB, 1) if kb else None


def run(options):
    time_scale = option(options, 'time_scale', DEFAULT_TIME_SCALE)
    largest = max(option(options, 'p2_workers', DEFAULT_WORKERS))
    metrics = []
    for workers, forks in ((WORKERS, None), (largest, CONTROL_PLANES + largest)):
        label = '%d nodes' % (CONTROL_PLANES + workers)
        try:
            measured = bootstrap(CONTROL_PLANES, workers, time_scale, forks=forks)
        except RuntimeError as exc:
            metrics.append(Metric('%s: lab process tree peak' % label, None, 'MiB', detail={'error': str(exc)[-4000:]}))
            continue
        run_ = measured.run
        memory = measured.lab_memory
        lab = _mib(memory.tree_peak_pss_kb)
        is_largest = workers == largest
        biggest = [{'name': row['name'], 'peak_pss_mib': _mib(row['peak_pss_kb']), 'processes': row['processes']}
                   for row in memory.biggest()]
        metrics += [
            Metric('%s: lab process tree peak (summed PSS, %d processes at most)' % (label, memory.tree_peak_processes),
                   lab, 'MiB', goal='<= 2 GiB' if is_largest else None,
                   met=(lab is not None and lab <= GOAL_LAB_MIB) if is_largest else None,
                   detail={'world': measured.world, 'processes_by_name': biggest}),
            Metric('%s: lab processes, biggest by name (peak summed PSS each)' % label,
                   ', '.join('%s %s MiB' % (row['name'], row['peak_pss_mib']) for row in biggest[:6]), ''),
            Metric('%s: lab main process peak RSS' % label, _mib(measured.lab_peak_kb), 'MiB'),
            Metric('%s: ansible-playbook main process peak RSS' % label, _mib(run_.main_peak_kb), 'MiB'),
            Metric('%s: ansible-playbook process tree peak (summed PSS, %d processes at most)'
                   % (label, run_.tree_peak_processes), _mib(run_.tree_peak_pss_kb), 'MiB',
                   detail={'forks': forks, 'time_scale': time_scale}),
        ]
    return metrics


BENCHMARK = Benchmark('p6_memory', 'P6 - peak memory of the lab and of ansible-playbook at 6 and 96 nodes',
                      __doc__.strip(), run)
