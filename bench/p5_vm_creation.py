"""P5: wall time of the vms stage creating 12 VMs against 1 VM, on a lab at a realistic time scale.

Each size gets a fresh lab (profile realistic, seeded): `ansible-playbook site.yml --tags vms` runs on
it once, from nothing to every VM running and gated. Reported, for 1 and 12 VMs and as a ratio (goal <= 1.5:
VMs are created in parallel, every VM by one run_once task of the proxmox_vm module, concurrently):
- VM creation: from the start of the image task to the end of the address gate, from the JSON callback's
  task times - what creating the VMs takes;
- the whole `--tags vms` run's wall time, which also holds the Talos API gate and the argument checks of
  every role in site.yml (role argument validation is tagged `always`), whose cost grows with the hosts.
The lab's longest simulated delay (a VM booting, 20 s at time scale 1) bounds what parallelism can save.
"""

import datetime
import json
import os
import subprocess

from bench.common import ROOT, Benchmark, Metric, Stopwatch, start_lab

DEFAULT_TIME_SCALE = 1.0
SIZES = (('1 VM', 1, 0), ('12 VMs', 3, 9))
GOAL = 1.5
PROXMOX_TASKS = ('Make sure the Talos image', 'Create or update the VM', 'Gate - the VM runs')


def _stamp(text):
    return datetime.datetime.fromisoformat(text.replace('Z', '+00:00'))


def proxmox_span(document):
    """Seconds from the start of the first Proxmox task of the stage to the end of the last one."""
    starts, ends = [], []
    for play in document.get('plays', []):
        for task in play.get('tasks', []):
            if any(part in task['task']['name'] for part in PROXMOX_TASKS):
                duration = task['task'].get('duration') or {}
                if duration.get('start') and duration.get('end'):
                    starts.append(_stamp(duration['start']))
                    ends.append(_stamp(duration['end']))
    return (max(ends) - min(starts)).total_seconds() if starts else None


def measure(label, control_planes, workers, time_scale):
    lab = start_lab(control_planes, workers, time_scale)
    try:
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'),
                   ANSIBLE_STDOUT_CALLBACK='ansible.posix.json')
        command = [os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook'), 'site.yml', '-i', lab.inventory_dir,
                   '--tags', 'vms']
        with Stopwatch() as watch:
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError('%s: ansible-playbook failed (%d):\n%s\n%s'
                               % (label, done.returncode, done.stdout[-3000:], done.stderr[-3000:]))
        # The JSON document comes first; the run report callback prints after it.
        document = json.JSONDecoder().raw_decode(done.stdout.lstrip())[0]
        running = [vm for vm in lab.vms() if vm['status'] == 'running']
        if len(running) != control_planes + workers:
            raise RuntimeError('%s: %d of %d VMs running after the stage'
                               % (label, len(running), control_planes + workers))
        boots = [d['duration'] for d in lab.delays(kind='vm_boot') if d['duration'] is not None]
        return {'wall': watch.seconds, 'proxmox': proxmox_span(document), 'vms': len(running),
                'longest_boot': max(boots) if boots else 0.0}
    finally:
        lab.stop()


def run(options):
    time_scale = options.time_scale if options.time_scale is not None else DEFAULT_TIME_SCALE
    measured = {}
    for label, control_planes, workers in SIZES:
        measured[label] = measure(label, control_planes, workers, time_scale)
        print('   %-7s stage %.1f s, proxmox part %.1f s (longest VM boot %.1f s)' % (
            label, measured[label]['wall'], measured[label]['proxmox'] or 0, measured[label]['longest_boot']),
            flush=True)
    one, many = measured['1 VM'], measured['12 VMs']
    detail = {'time_scale': time_scale, 'profile': 'realistic', 'runs': measured}
    metrics = []
    if one['proxmox'] and many['proxmox']:
        ratio = many['proxmox'] / one['proxmox']
        metrics += [
            Metric('VM creation (image, create/start, address gate), 1 VM', round(one['proxmox'], 2), 's'),
            Metric('VM creation (image, create/start, address gate), 12 VMs', round(many['proxmox'], 2), 's'),
            Metric('VM creation ratio 12 VMs / 1 VM', round(ratio, 3), '', goal='<= %.1f' % GOAL, met=ratio <= GOAL,
                   detail=detail),
        ]
    ratio = many['wall'] / one['wall']
    metrics += [
        Metric('whole `--tags vms` run (with the Talos API gate and every role\'s argument check), 1 VM',
               round(one['wall'], 2), 's'),
        Metric('whole `--tags vms` run, 12 VMs', round(many['wall'], 2), 's'),
        Metric('whole run ratio 12 VMs / 1 VM', round(ratio, 3), '', goal='<= %.1f' % GOAL, met=ratio <= GOAL,
               detail=detail),
    ]
    return metrics


BENCHMARK = Benchmark('p5_vm_creation', 'P5 - create 12 VMs vs 1 VM (vms stage wall time)', __doc__.strip(), run)
