"""P3: a no-op re-run of the whole site.yml at 6 nodes (time scale 0): seconds and changed count.

A fresh lab at time scale 0 (every simulated delay instant: what is left is the collection's own time). The
first `ansible-playbook site.yml` builds the cluster; the second one, measured, finds everything in place and
must report changed=0 while still running every gate (the re-run checks the cluster, it does not skip it).
Goals: <= 20 s and changed = 0. The detail has the stage times and the tasks that reported a change, if any.
"""

import os
import tempfile

from bench.common import Benchmark, Metric, run_site, start_lab

CONTROL_PLANES, WORKERS = 3, 3
GOAL_SECONDS = 20.0


def changed_tasks(log_path):
    """Names of the tasks that reported `changed` in a default-callback log."""
    names, task = [], None
    with open(log_path, encoding='utf-8', errors='replace') as handle:
        for line in handle:
            if line.startswith('TASK ['):
                task = line[len('TASK ['):].rsplit(']', 1)[0]
            elif line.startswith('changed:') and task and task not in names:
                names.append(task)
    return names


def run(options):
    del options   # always time scale 0: the point is the collection's own time
    lab = start_lab(CONTROL_PLANES, WORKERS, 0.0)
    try:
        artifacts = tempfile.mkdtemp(prefix='bench-artifacts-')
        first = run_site(lab, artifacts)
        print('   first run (builds the cluster): %.1f s, changed %d' % (first.wall, first.changed), flush=True)
        os.rename(first.log, first.log + '.first')
        second = run_site(lab, artifacts)
    finally:
        lab.stop()
    changed = second.changed
    print('   no-op re-run: %.1f s, changed %d (load %s -> %s)'
          % (second.wall, changed, second.load_before, second.load_after), flush=True)
    detail = second.summary()
    detail['changed_tasks'] = changed_tasks(second.log)
    detail['first_run'] = first.summary()
    return [
        Metric('no-op re-run at 6 nodes, time scale 0: wall time', round(second.wall, 2), 's',
               goal='<= %.0f s' % GOAL_SECONDS, met=second.wall <= GOAL_SECONDS, detail=detail),
        Metric('no-op re-run: changed tasks', changed, '', goal='0', met=changed == 0,
               detail={'changed_tasks': detail['changed_tasks']}),
    ]


BENCHMARK = Benchmark('p3_noop_rerun', 'P3 - no-op re-run of site.yml at 6 nodes: seconds and changed count',
                      __doc__.strip(), run)
