"""P6: peak memory of the lab and of ansible-playbook during a whole site.yml, at 6 and 96 nodes.

Taken from the P1 and P2 bootstraps (run once for all): the lab process's peak RSS (VmHWM of the one lab
process, read before it stops); ansible-playbook's main process peak RSS (VmHWM), and the peak of the whole
ansible-playbook process tree (forked workers and the module processes they run) as summed PSS, sampled every
0.5 s: PSS counts pages shared by forks once, so the tree sum is the memory the run really holds. Goal: the lab
<= 2 GiB at 96 nodes.
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
            metrics.append(Metric('%s: lab peak RSS' % label, None, 'MiB', detail={'error': str(exc)[-4000:]}))
            continue
        run_ = measured.run
        lab = _mib(measured.lab_peak_kb)
        is_largest = workers == largest
        metrics += [
            Metric('%s: lab peak RSS' % label, lab, 'MiB', goal='<= 2 GiB' if is_largest else None,
                   met=(lab is not None and lab <= GOAL_LAB_MIB) if is_largest else None),
            Metric('%s: ansible-playbook main process peak RSS' % label, _mib(run_.main_peak_kb), 'MiB'),
            Metric('%s: ansible-playbook process tree peak (summed PSS, %d processes at most)'
                   % (label, run_.tree_peak_processes), _mib(run_.tree_peak_pss_kb), 'MiB',
                   detail={'forks': forks, 'time_scale': time_scale}),
        ]
    return metrics


BENCHMARK = Benchmark('p6_memory', 'P6 - peak memory of the lab and of ansible-playbook at 6 and 96 nodes',
                      __doc__.strip(), run)
