"""P2: the whole site.yml at 24 and 96 nodes (3 control planes, the rest workers), wall time / critical path.

As P1 (bench/p1_bootstrap_ratio.py), on larger labs. Forks: one per host (`--forks <hosts>`), because the
per-host tasks that wait (the Talos apply returns when the node is back from its install reboot; the address
and Talos API gates) would otherwise run in batches of `forks` hosts and repeat their waits once per batch;
the waits are I/O, not CPU. `--p2-workers 21,93` picks the worker counts (default: 24 and 96 nodes).
Goal: ratio <= 1.20.
"""

from bench.common import Benchmark, Metric, bootstrap, option
from bench.p1_bootstrap_ratio import CONTROL_PLANES, DEFAULT_TIME_SCALE, metrics_of

DEFAULT_WORKERS = (21, 93)
GOAL = 1.20


def run(options):
    time_scale = option(options, 'time_scale', DEFAULT_TIME_SCALE)
    metrics = []
    for workers in option(options, 'p2_workers', DEFAULT_WORKERS):
        nodes = CONTROL_PLANES + workers
        label = '%d nodes' % nodes
        try:
            measured = bootstrap(CONTROL_PLANES, workers, time_scale, forks=nodes)
        except RuntimeError as exc:
            print('   %s: failed: %s' % (label, str(exc)[-1500:]), flush=True)
            metrics.append(Metric('%s: ratio wall / critical path' % label, None, '', goal='<= %.2f' % GOAL, met=False,
                                  detail={'error': str(exc)[-4000:]}))
            continue
        metrics += metrics_of(measured, label, GOAL)
    return metrics


BENCHMARK = Benchmark('p2_scaling', 'P2 - full site.yml at 24 and 96 nodes: wall time / critical path',
                      __doc__.strip(), run)
