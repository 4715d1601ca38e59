"""P4: gate latency - from the moment a gate's condition became true in the lab to the end of the gate task.

Measured on the P1 bootstrap (6 nodes, same time scale; run once for both). The run report lists every gate
with its task's start and end; the lab records when each delay ended. The two clocks are aligned through the
lab's request log (each request carries the wall clock and the lab clock).

A gate waited for the world when a delay it depends on ended while the gate task ran. Which delays a gate
depends on: the kinds its stage waits for (below), and
- a per-node gate (VM address, Talos API, Talos services, the apply's node check: its host is the node, its target
  none, the node's VM - `VM 1021 on PVE node pve1` - or its Talos endpoint - `10.5.0.21:50000`) only its own
  node's delays (vm_boot, talos_install_reboot, etcd_join, kubelet_start ... whose target is the gate's host);
- a gate whose target names a namespace (`pods ... in namespace X`, `Deployment X/name`) only the readiness of
  pods in X; one that names a Flux object (`GitRepository ns/name`) only that object's fetch or reconcile.
Its condition became true when the last of those delays ended; the latency is the gate task's end minus that
moment: the poll interval, the module's own time and Ansible's result handling. Gates during which no such
delay ended found their condition already true (they are counted and their task time is reported apart).
Goal: median <= 1 s.
"""

import re
import statistics

from bench.common import Benchmark, Metric, bootstrap, option
from bench.critical_path import NODE_KINDS, select_steps
from bench.p1_bootstrap_ratio import CONTROL_PLANES, DEFAULT_TIME_SCALE, WORKERS

GOAL = 1.0
STAGE_KINDS = {
    'vms': ('vm_boot',),
    'apply': ('talos_install_reboot', 'talos_apid_cert'),
    'bootstrap': ('etcd_bootstrap', 'etcd_join', 'kubelet_start'),
    'kubeconfig': ('etcd_bootstrap',),
    'cni': ('kubelet_start', 'pod_ready'),
    'remediate': ('kubelet_start', 'vm_boot', 'talos_reboot'),
    'apps': ('pod_ready',),
    'sealed_secrets': ('pod_ready',),
    'flux': ('pod_ready', 'flux_git_fetch', 'flux_reconcile'),
    'gitops': ('pod_ready', 'flux_git_fetch', 'flux_reconcile'),
    'report': (),   # read-only listing of what is there: waits for no lab delay
}
NAMESPACE_PATTERNS = (re.compile(r'\bin namespace ([a-z0-9-]+)'),
                      re.compile(r'\b(?:Deployment|DaemonSet|StatefulSet) ([a-z0-9-]+)/[a-z0-9.-]+'))
FLUX_OBJECT = re.compile(r'\b(GitRepository|Kustomization|FluxInstance) ([a-z0-9-]+/[a-z0-9.-]+)')
NODE_TARGET = re.compile(r'^(?:VM \d+ on PVE node \S+|\[?[0-9A-Fa-f.:]+\]?:\d+)$')


def per_node(gate):
    """Whether the gate is about its host alone (see the module docstring)."""
    target = gate.get('target')
    return target is None or bool(NODE_TARGET.match(target))


def percentile(values, fraction):
    """The value at `fraction` (0..1) of the sorted values, by nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, int(round(fraction * len(ordered) + 0.4999)))
    return ordered[min(rank, len(ordered)) - 1]


def gate_namespace(gate):
    text = '%s %s' % (gate.get('target') or '', gate.get('name') or '')
    for pattern in NAMESPACE_PATTERNS:
        match = pattern.search(text)
        if match:
            return match.group(1)
    return None


def condition_moment(gate, ends):
    """(report seconds, kind, target) of the last delay the gate depended on that ended while it ran, or None.

    ends: [(end in report seconds, kind, target)] of the counted delays.
    """
    kinds = STAGE_KINDS.get(gate.get('stage'))
    namespace = gate_namespace(gate)
    flux_object = FLUX_OBJECT.search(gate.get('target') or '')
    found = None
    for end, kind, target in ends:
        if not gate['start'] <= end <= gate['end']:
            continue
        if flux_object and target != '%s/%s' % flux_object.groups():
            continue
        if kinds is not None and kind not in kinds:
            continue
        if kind in NODE_KINDS and per_node(gate) and target != gate.get('host'):
            continue
        if namespace and not (kind == 'pod_ready' and target.startswith('pod/%s/' % namespace)):
            continue
        if found is None or end > found[0]:
            found = (end, kind, target)
    return found


def latencies(measured):
    """[(gate, latency seconds, (moment, kind, target))] for the gates that waited, and the gates that did not."""
    steps, _unmodelled = select_steps(measured.delays)
    ends = [(s.record['start'] + s.record['duration'] + measured.shift, s.kind, s.target) for s in steps.values()
            if s.record.get('duration') is not None]
    waited, immediate = [], []
    for gate in measured.run.report.get('gates', []):
        if not gate.get('ok') or gate.get('start') is None or gate.get('end') is None:
            continue
        moment = condition_moment(gate, ends)
        if moment is None:
            immediate.append(gate)
        else:
            waited.append((gate, gate['end'] - moment[0], moment))
    return waited, immediate


def run(options):
    time_scale = option(options, 'time_scale', DEFAULT_TIME_SCALE)
    measured = bootstrap(CONTROL_PLANES, WORKERS, time_scale)
    waited, immediate = latencies(measured)
    values = [latency for _gate, latency, _moment in waited]
    rows = [{'stage': g['stage'], 'gate': g['name'], 'host': g['host'], 'latency': round(latency, 3),
             'waited_for': '%s %s' % (moment[1], moment[2]), 'module_elapsed': g.get('elapsed'),
             'task_seconds': round(g['end'] - g['start'], 3)} for g, latency, moment in waited]
    immediate_times = [g['end'] - g['start'] for g in immediate]
    median = statistics.median(values) if values else None
    detail = {'time_scale': time_scale, 'gates': rows, 'load': [measured.run.load_before, measured.run.load_after]}
    print('   %d gates waited for the lab (median latency %s s), %d found their condition true at once'
          % (len(values), '%.2f' % median if median is not None else '-', len(immediate)), flush=True)
    return [
        Metric('gate latency, median (%d gates that waited)' % len(values), round(median, 3) if median is not None else None,
               's', goal='<= %.1f s' % GOAL, met=median is not None and median <= GOAL, detail=detail),
        Metric('gate latency, p95', round(percentile(values, 0.95), 3) if values else None, 's'),
        Metric('gate task time when the condition was already true, median (%d gates)' % len(immediate_times),
               round(statistics.median(immediate_times), 3) if immediate_times else None, 's'),
    ]


BENCHMARK = Benchmark('p4_gate_latency', 'P4 - gate latency (condition true in the lab -> gate task done)',
                      __doc__.strip(), run)
