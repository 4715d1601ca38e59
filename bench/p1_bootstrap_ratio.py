"""P1: the whole site.yml at 6 nodes (3 control planes, 3 workers), wall time against the critical path.

A fresh lab (profile realistic, seeded, every delay times the time scale) and one `ansible-playbook site.yml`
from nothing to the end of the gitops stage. The lab records every delay it imposed; bench.critical_path
computes the longest chain of them that gate one another (VM boot -> Talos install and reboot -> etcd ->
kubelet -> the CNI agent -> pods -> Flux reconciles in dependsOn order ...), the time an orchestrator without
any overhead would have needed. Reported: the wall time, the critical path, their ratio (goal <= 1.10) and the
difference (what the collection added, in seconds; at another time scale the ratio changes, this much less).
Also the critical path under the collection's stage order (the bootstrap releases only after a Ready Cilium agent on
every node; Flux's repository after the releases, or, when flux_handoff handed it over before them as the run did,
before the cni stage's gates; bench.critical_path stage_contract): what is left between it and the wall time is the
collection's own time.
"""

from bench.common import Benchmark, Metric, bootstrap, option

DEFAULT_TIME_SCALE = 0.5
CONTROL_PLANES, WORKERS = 3, 3
GOAL = 1.10

# The stage order the stage-order critical path follows (bench/critical_path.py), by when Flux got the repository.
CONTRACT_TEXT = {
    True: 'a Ready agent on every node and the flux stage\'s gates before the releases; Flux handed the repository before '
          'the cni gates and the releases',
    False: 'a Ready agent on every node before the releases, the releases before the first fetch; Flux handed the '
           'repository after the releases',
}


def metrics_of(measured, label, goal):
    """Wall, critical path, ratio and added seconds of one measured bootstrap."""
    run, path = measured.run, measured.critical
    detail = measured.summary()
    ratio = measured.ratio
    return [
        Metric('%s: site.yml wall time' % label, round(run.wall, 2), 's'),
        Metric('%s: critical path of the lab\'s delays' % label, round(path.length, 2), 's',
               detail={'chain': path.summary()}),
        Metric('%s: ratio wall / critical path' % label, round(ratio, 3) if ratio else None, '',
               goal='<= %.2f' % goal, met=ratio is not None and ratio <= goal, detail=detail),
        Metric('%s: added by the collection (wall - critical path)' % label, round(run.wall - path.length, 2), 's'),
        Metric('%s: critical path under the stage order (%s)' % (label, CONTRACT_TEXT[bool(measured.handoff_before_apps)]),
               round(measured.contract.length, 2), 's', detail={'chain': measured.contract.summary()}),
    ]


def run(options):
    time_scale = option(options, 'time_scale', DEFAULT_TIME_SCALE)
    measured = bootstrap(CONTROL_PLANES, WORKERS, time_scale)
    return metrics_of(measured, '6 nodes', GOAL)


BENCHMARK = Benchmark('p1_bootstrap_ratio', 'P1 - full site.yml at 6 nodes: wall time / critical path',
                      __doc__.strip(), run)
