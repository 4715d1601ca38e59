"""What every benchmark shares: the Benchmark and Metric records, discovery, labs, playbook runs, results."""

import datetime
import importlib
import json
import os
import pkgutil
import platform
import subprocess
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, 'bench', 'results')


class Metric(object):
    """One measured value: name, value, unit, and optionally the goal and whether it was met."""

    def __init__(self, name, value, unit='', goal=None, met=None, detail=None):
        self.name = name
        self.value = value
        self.unit = unit
        self.goal = goal
        self.met = met
        self.detail = detail or {}

    def as_dict(self):
        return {'name': self.name, 'value': self.value, 'unit': self.unit, 'goal': self.goal, 'met': self.met,
                'detail': self.detail}


class Benchmark(object):
    """A benchmark: run(options) -> [Metric]. options is the argparse namespace of `python -m bench`."""

    def __init__(self, name, title, description, run):
        self.name = name
        self.title = title
        self.description = description
        self.run = run


def discover():
    """Every BENCHMARK in the bench package, by name, in module order."""
    found = {}
    package_dir = os.path.dirname(os.path.abspath(__file__))
    for info in sorted(pkgutil.iter_modules([package_dir]), key=lambda m: m.name):
        if info.name in ('common', '__main__'):
            continue
        module = importlib.import_module('bench.' + info.name)
        benchmark = getattr(module, 'BENCHMARK', None)
        if isinstance(benchmark, Benchmark):
            found[benchmark.name] = benchmark
    return found


class Stopwatch(object):
    """Wall time of a block, on the monotonic clock."""

    def __enter__(self):
        self.start = time.monotonic()
        self.seconds = None
        return self

    def __exit__(self, *exc):
        self.seconds = time.monotonic() - self.start
        return False


# The lab's PVE storage holds 100 GiB a node and a VM's disk is 10 GiB (Talos' minimum, which preflight checks):
# a larger lab spreads its VMs over more PVE nodes, as a cluster of that size would be.
VMS_PER_PVE_NODE = 8


def pve_nodes_for(vms):
    """PVE node names for a lab of `vms` VMs: pve1 up to 8 VMs, then one more node for every 8."""
    return ['pve%d' % number for number in range(1, max(1, -(-vms // VMS_PER_PVE_NODE)) + 1)]


# The world the labs run (`python -m bench --kubernetes ... --flux ...`): None leaves the choice to the lab, which takes
# $PROXTALOS_LAB_KUBERNETES and $PROXTALOS_LAB_FLUX, else its default (lab/world.py).
WORLD_CHOICE = {'kubernetes': None, 'flux': None}


def choose_world(kubernetes=None, flux=None):
    """Make every lab bench starts run this Kubernetes and Flux ('lab' or 'upstream'; None: the lab's own choice)."""
    WORLD_CHOICE.update(kubernetes=kubernetes, flux=flux)


def expected_world():
    """{'kubernetes': ..., 'flux': ...} the labs will run: the choice of choose_world, else the lab's, resolved by the
    lab's own rules (lab/world.py: its option, else the environment variable, else its default)."""
    from lab.world import flux_world, kubernetes_world  # pylint: disable=import-outside-toplevel
    kubernetes = kubernetes_world(WORLD_CHOICE['kubernetes'])
    return {'kubernetes': kubernetes, 'flux': flux_world(WORLD_CHOICE['flux'], kubernetes)}


def lab_world(lab):
    """{'kubernetes': ..., 'flux': ...} a running lab runs, from the extensions its state.json lists."""
    extensions = lab.state.get('extensions') or []
    return {'kubernetes': 'upstream' if 'lab.k8s_upstream' in extensions else 'lab',
            'flux': 'upstream' if 'lab.flux_upstream' in extensions else 'lab'}


def world_tag(world):
    """A world as one word for file names and labels: 'lab' for the hand-written world, else e.g.
    'kubernetes-upstream-flux-upstream'."""
    if world['kubernetes'] == 'lab' and world['flux'] == 'lab':
        return 'lab'
    return 'kubernetes-%s-flux-%s' % (world['kubernetes'], world['flux'])


def start_lab(control_planes, workers, time_scale, profile='realistic', seed=1):
    """A lab of its own (free net, temporary run dir, the world of choose_world) for one measurement; stop it
    with .stop()."""
    from lab.testing import start_lab as start  # pylint: disable=import-outside-toplevel
    run_dir = tempfile.mkdtemp(prefix='bench-lab-')
    extra_args = ['--pve-nodes', ','.join(pve_nodes_for(control_planes + workers))]
    for name in ('kubernetes', 'flux'):
        if WORLD_CHOICE[name]:
            extra_args += ['--%s' % name, WORLD_CHOICE[name]]
    lab = start(run_dir, control_planes=control_planes, workers=workers, time_scale=time_scale, profile=profile,
                seed=seed, extra_args=extra_args)
    print('   lab in %s: pid %s, world %s' % (run_dir, lab.pid, world_tag(lab_world(lab))), flush=True)
    try:
        render_cilium_manifest(lab)
    except BaseException:
        lab.stop()
        raise
    return lab


def _playbook_env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'),
                PATH=os.pathsep.join([os.path.join(ROOT, '.venv', 'bin'), os.path.join(ROOT, '.tools', 'bin'),
                                      os.environ.get('PATH', '')]))


def render_cilium_manifest(lab):
    """A lab on upstream Kubernetes names its inline Cilium manifest in its run dir (lab_cilium_manifest, the upstream
    chart's `helm template` output) and leaves writing it to the user, once, with the repository's render-cilium.yml
    (the cni role's render_manifest entry point, docs/stages/cni.md); the hand-written world ships its manifest. Done
    here before any measurement (it is not part of a bootstrap's time); RuntimeError with the output's tail when it
    fails."""
    import yaml  # pylint: disable=import-outside-toplevel
    with open(lab.inventory, encoding='utf-8') as handle:
        document = yaml.safe_load(handle) or {}
    manifest = ((document.get('cluster') or {}).get('vars') or {}).get('lab_cilium_manifest')
    if not manifest or os.path.exists(manifest):
        return
    done = subprocess.run([PLAYBOOK, os.path.join(ROOT, 'render-cilium.yml'), '-i', lab.inventory_dir], cwd=ROOT,
                          env=_playbook_env(), capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0 or not os.path.exists(manifest):
        output = (done.stdout + done.stderr)[-3000:]
        raise RuntimeError('rendering the Cilium manifest %s failed (%d): %s' % (manifest, done.returncode, output))


def machine():
    """What the numbers were measured on."""
    return {'python': platform.python_version(), 'cpus': os.cpu_count(), 'platform': platform.platform()}


def results_path(world, when):
    """bench/results/<date>.json for the hand-written world, bench/results/<date>-<world tag>.json for another one
    (the results of different worlds never replace each other)."""
    tag = world_tag(world)
    return os.path.join(RESULTS, '%s%s.json' % (when.strftime('%Y-%m-%d'), '' if tag == 'lab' else '-' + tag))


def write_results(entries, world, when=None):
    """Merge this run's entries (measured on world) into results_path(world, date) (same benchmark names are
    replaced)."""
    when = when or datetime.datetime.now(datetime.timezone.utc)
    os.makedirs(RESULTS, exist_ok=True)
    path = results_path(world, when)
    document = {'date': when.strftime('%Y-%m-%d'), 'machine': machine(), 'world': world, 'benchmarks': {}}
    if os.path.exists(path):
        with open(path, encoding='utf-8') as handle:
            document = json.load(handle)
    document['machine'] = machine()
    document['world'] = world
    document['benchmarks'].update(entries)
    tmp = path + '.tmp'
    with open(tmp, 'w', encoding='utf-8') as handle:
        json.dump(document, handle, indent=2, sort_keys=True)
        handle.write('\n')
    os.replace(tmp, path)
    return path


def markdown(entries):
    """The results as a Markdown table."""
    lines = ['| benchmark | metric | value | goal | met |', '|---|---|---|---|---|']
    for name, entry in entries.items():
        for metric in entry['metrics']:
            value = metric['value']
            if value is None:
                shown = 'failed' if metric['detail'].get('error') else '-'
            else:
                shown = ('%.2f' % value if isinstance(value, float) else str(value)) + (
                    ' %s' % metric['unit'] if metric['unit'] else '')
            met = '' if metric['met'] is None else ('yes' if metric['met'] else 'no')
            lines.append('| %s | %s | %s | %s | %s |' % (name, metric['name'], shown, metric['goal'] or '', met))
    return '\n'.join(lines)


# ------------------------------------------------------------------------------------- playbook runs

PLAYBOOK = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
MEMORY_SAMPLE_SECONDS = 0.5
PLAYBOOK_TIMEOUT = 3 * 3600


def load_average():
    """The 1, 5 and 15 minute load averages now (the machine is shared: every result notes them)."""
    return [round(x, 2) for x in os.getloadavg()]


def _proc_status(pid):
    """{'VmRSS': kB, 'VmHWM': kB, 'PPid': int} of a process, or None when it is gone."""
    try:
        with open('/proc/%d/status' % pid, encoding='ascii', errors='replace') as handle:
            text = handle.read()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        key, _sep, rest = line.partition(':')
        if key in ('VmRSS', 'VmHWM'):
            values[key] = int(rest.split()[0])
        elif key == 'PPid':
            values[key] = int(rest.strip())
    return values


def _pss_kb(pid):
    try:
        with open('/proc/%d/smaps_rollup' % pid, encoding='ascii', errors='replace') as handle:
            for line in handle:
                if line.startswith('Pss:'):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(root):
    """root and every process below it (from /proc/*/stat parent ids)."""
    children = {}
    for name in os.listdir('/proc'):
        if not name.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % name, encoding='ascii', errors='replace') as handle:
                fields = handle.read().rsplit(')', 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


class MemorySampler(object):
    """Samples a process tree while it runs: peak RSS of its main process (VmHWM) and the peak of the tree's
    summed PSS (shared pages counted once, so forked workers are not counted twice)."""

    def __init__(self, pid, interval=MEMORY_SAMPLE_SECONDS):
        self.pid = pid
        self.interval = interval
        self.main_peak_kb = 0
        self.tree_peak_pss_kb = 0
        self.tree_peak_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name='memory-sampler', daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()

    def sample(self):
        status = _proc_status(self.pid)
        if status is None:
            return
        self.main_peak_kb = max(self.main_peak_kb, status.get('VmHWM', 0))
        total, processes = self.measure_tree(_descendants(self.pid))
        self.tree_peak_pss_kb = max(self.tree_peak_pss_kb, total)
        self.tree_peak_processes = max(self.tree_peak_processes, processes)

    def measure_tree(self, tree):
        """(summed PSS in kB, processes counted) of one sample of the tree's pids."""
        return sum(_pss_kb(pid) for pid in tree), len(tree)

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)


def _process_name(pid):
    """What a process is, for the per-name memory rows: its program's file name (python: `python -m MODULE`)."""
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as handle:
            argv = handle.read().decode('utf-8', 'replace').split('\0')
    except OSError:
        return None
    if not argv or not argv[0]:
        return None
    name = os.path.basename(argv[0])
    if name.startswith('python') and '-m' in argv[1:-1]:
        name = 'python -m %s' % argv[argv.index('-m', 1) + 1]
    return name


class TreeMemorySampler(MemorySampler):
    """A MemorySampler that also keeps, per process name, the peak of the summed PSS of the tree's processes of that
    name and how many there were at most (each name's peak may come from another sample than the tree's peak, so
    these peaks can add up to more than it)."""

    def __init__(self, pid, interval=MEMORY_SAMPLE_SECONDS):
        super().__init__(pid, interval)
        self.by_name = {}

    def measure_tree(self, tree):
        total, names = 0, {}
        for pid in tree:
            pss = _pss_kb(pid)
            name = _process_name(pid)
            if name is None:
                if not pss:
                    continue   # gone since the tree was listed, or a zombie: no memory, no command line
                name = '(no command line)'   # ended between the two reads: its memory when read still counts
            total += pss
            kb, count = names.get(name, (0, 0))
            names[name] = (kb + pss, count + 1)
        for name, (kb, count) in names.items():
            peak_kb, peak_count = self.by_name.get(name, (0, 0))
            self.by_name[name] = (max(peak_kb, kb), max(peak_count, count))
        return total, sum(count for _kb, count in names.values())

    def biggest(self, count=None):
        """[{'name', 'peak_pss_kb', 'processes'}] by peak, biggest first (the first count of them)."""
        rows = [{'name': name, 'peak_pss_kb': kb, 'processes': processes}
                for name, (kb, processes) in self.by_name.items()]
        rows.sort(key=lambda row: row['peak_pss_kb'], reverse=True)
        return rows[:count] if count else rows


def lab_peak_rss_kb(lab):
    """The lab process's peak RSS since it started (VmHWM), in kB; None when it is not running."""
    status = _proc_status(int(lab.pid))
    return status.get('VmHWM') if status else None


class PlaybookRun(object):
    """One ansible-playbook run: wall seconds, exit code, the run report (report.json), changed count,
    memory of the ansible-playbook process tree, load before and after."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    @property
    def changed(self):
        return sum(h.get('changed', 0) for h in (self.report or {}).get('hosts', {}).values())

    def summary(self):
        return {'wall': round(self.wall, 2), 'returncode': self.returncode, 'changed': self.changed,
                'forks': self.forks, 'hosts': len((self.report or {}).get('hosts', {})),
                'ansible_main_peak_rss_kb': self.main_peak_kb, 'ansible_tree_peak_pss_kb': self.tree_peak_pss_kb,
                'ansible_tree_peak_processes': self.tree_peak_processes,
                'load_before': self.load_before, 'load_after': self.load_after,
                'stages': [{'name': s['name'], 'duration': s['duration']} for s in (self.report or {}).get('stages', [])]}


def run_site(lab, artifacts_dir, forks=None, extra_args=(), tags=None, check=True, timeout=PLAYBOOK_TIMEOUT):
    """ansible-playbook site.yml against a lab; returns a PlaybookRun. Raises RuntimeError when it fails and
    check is set (the output tail says why), or when it runs longer than timeout seconds (it is stopped)."""
    # profile_tasks adds every task's time to the end of the log (for profiling; it costs next to nothing).
    env = dict(_playbook_env(), ANSIBLE_CALLBACKS_ENABLED='proxtalos.cluster.timeline,ansible.posix.profile_tasks',
               PROFILE_TASKS_TASK_OUTPUT_LIMIT='all')
    command = [PLAYBOOK, 'site.yml', '-i', lab.inventory_dir, '-e', 'proxtalos_artifacts_dir=%s' % artifacts_dir]
    if forks:
        command += ['--forks', str(forks)]
    if tags:
        command += ['--tags', tags]
    command += list(extra_args)
    os.makedirs(artifacts_dir, exist_ok=True)
    log_path = os.path.join(artifacts_dir, 'ansible-playbook.log')
    load_before = load_average()
    with open(log_path, 'w', encoding='utf-8') as log:
        with Stopwatch() as watch:
            process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)  # pylint: disable=consider-using-with
            sampler = MemorySampler(process.pid).start()
            try:
                returncode = process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise RuntimeError('ansible-playbook ran longer than %d s and was stopped; log %s' % (timeout, log_path))
            finally:
                sampler.stop()
    report_path = os.path.join(artifacts_dir, 'report.json')
    report = None
    if os.path.exists(report_path):
        with open(report_path, encoding='utf-8') as handle:
            report = json.load(handle)
    run = PlaybookRun(command=command, wall=watch.seconds, returncode=returncode, report=report, log=log_path,
                      forks=forks, main_peak_kb=sampler.main_peak_kb, tree_peak_pss_kb=sampler.tree_peak_pss_kb,
                      tree_peak_processes=sampler.tree_peak_processes, load_before=load_before,
                      load_after=load_average())
    if check and returncode != 0:
        with open(log_path, encoding='utf-8') as handle:
            tail = handle.read()[-4000:]
        raise RuntimeError('ansible-playbook failed (%d), log %s:\n%s' % (returncode, log_path, tail))
    return run


def lab_clock_offset(lab):
    """Wall-clock time (epoch seconds) of the lab's time 0: the median of (wall - lab_time) over its request log,
    so delay records (lab seconds) can be put beside the run report (wall clock)."""
    differences = []
    with open(os.path.join(lab.run_dir, 'requests.log'), encoding='utf-8') as handle:
        for number, line in enumerate(handle):
            if number >= 500:
                break
            entry = json.loads(line)
            if 'lab_time' in entry and 'time' in entry:
                wall = datetime.datetime.fromisoformat(entry['time']).timestamp()
                differences.append(wall - entry['lab_time'])
    if not differences:
        raise RuntimeError('the lab in %s logged no request: cannot align its clock' % lab.run_dir)
    differences.sort()
    return differences[len(differences) // 2]


def inventory_hosts(lab):
    """{'controlplane': [...], 'worker': [...]} from the lab's hosts.yml."""
    import yaml  # pylint: disable=import-outside-toplevel
    with open(lab.inventory, encoding='utf-8') as handle:
        document = yaml.safe_load(handle)
    groups = {}

    def walk(name, group):
        group = group or {}
        if name in ('controlplane', 'worker'):
            groups[name] = list((group.get('hosts') or {}).keys())
        for child, sub in (group.get('children') or {}).items():
            walk(child, sub)
    for name, group in (document or {}).items():
        walk(name, group)
    return groups


def inventory_var(lab, host, name, default=None):
    """One variable of a host as the inventory defines it (untemplated), through ansible-inventory."""
    command = [os.path.join(ROOT, '.venv', 'bin', 'ansible-inventory'), '-i', lab.inventory_dir, '--host', host]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'))
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError('ansible-inventory failed: %s' % done.stderr[-2000:])
    return json.loads(done.stdout).get(name, default)


# ------------------------------------------------------------------------- a whole bootstrap, measured

class Bootstrap(object):
    """site.yml from nothing on a fresh lab: the PlaybookRun, the critical path of the lab's delays, the delay
    records, the lab's clock beside the run report's (report seconds = lab seconds + shift), the world the lab ran,
    the lab process's peak RSS and its process tree's memory (TreeMemorySampler: on upstream Kubernetes the lab's
    children etcd, kube-apiserver, ... are in it)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    @property
    def ratio(self):
        return self.run.wall / self.critical.length if self.critical.length else None

    def summary(self):
        out = self.run.summary()
        out.update(time_scale=self.time_scale, control_planes=self.control_planes, workers=self.workers,
                   critical_path_seconds=round(self.critical.length, 3),
                   critical_path=[(s.kind, s.target, round(s.weight, 3)) for s in self.critical.chain],
                   critical_path_with_stage_contract_seconds=round(self.contract.length, 3),
                   flux_handoff_before_apps=self.handoff_before_apps,
                   unmodelled_delays=self.critical.unmodelled, unmatched_pods=self.critical.unmatched,
                   lab_peak_rss_kb=self.lab_peak_kb, lab_tree_peak_pss_kb=self.lab_memory.tree_peak_pss_kb,
                   lab_tree_peak_processes=self.lab_memory.tree_peak_processes,
                   lab_processes_by_name=self.lab_memory.biggest(), world=self.world,
                   world_latencies=self.world_latencies, artifacts=self.artifacts,
                   stage_breakdown=stage_breakdown(self.run.report, self.critical.chain, self.shift))
        return out


def _overlap(start, end, intervals):
    """Seconds of [start, end] covered by the union of intervals [(a, b)]."""
    covered, cursor = 0.0, start
    for a, b in sorted(intervals):
        a, b = max(a, cursor), min(b, end)
        if b > a:
            covered += b - a
            cursor = b
    return covered


def stage_breakdown(report, chain, shift):
    """Per stage of the run report: its duration, task count, the seconds in it during which a delay of the
    critical path was running (the world's waiting) and the rest (what the collection spent); then the time
    between stages and before the first one. Report seconds; shift = report seconds - lab seconds."""
    waits = [(s.record['start'] + shift, s.record['start'] + (s.record.get('duration') or 0.0) + shift) for s in chain]
    rows, previous_end = [], 0.0
    for stage in (report or {}).get('stages', []):
        start, end = stage['start'], stage['end']
        gap = max(0.0, start - previous_end)
        waiting = _overlap(start, end, waits)
        rows.append({'stage': stage['name'], 'tasks': stage.get('tasks'), 'seconds': round(end - start, 2),
                     'critical_waiting': round(waiting, 2), 'collection': round(end - start - waiting, 2),
                     'gap_before': round(gap, 2)})
        previous_end = max(previous_end, end)
    return rows


_BOOTSTRAPS = {}


def flux_handed_over_before_apps(report):
    """Whether the run handed Flux the GitOps repository before the apps stage (flux_handoff): the flux stage's row of
    the run report starts before the apps stage's (the report lists a stage from its first task that ran)."""
    starts = dict((stage['name'], stage['start']) for stage in report.get('stages') or () if stage.get('status') != 'skipped')
    return 'flux' in starts and 'apps' in starts and starts['flux'] < starts['apps']


def bootstrap(control_planes, workers, time_scale, forks=None, seed=1):
    """Run (once per `python -m bench`: later calls with the same arguments get the same result) a whole
    site.yml against a fresh lab of that size and measure it. See Bootstrap."""
    from bench import critical_path  # pylint: disable=import-outside-toplevel
    key = (control_planes, workers, float(time_scale), forks, seed)
    if key in _BOOTSTRAPS:
        return _BOOTSTRAPS[key]
    print('   bootstrap %d control planes + %d workers, time scale %s, forks %s: starting the lab'
          % (control_planes, workers, time_scale, forks or 'from ansible.cfg'), flush=True)
    lab = start_lab(control_planes, workers, time_scale, seed=seed)
    lab_memory = TreeMemorySampler(int(lab.pid)).start()
    try:
        artifacts = tempfile.mkdtemp(prefix='bench-artifacts-')
        try:
            run = run_site(lab, artifacts, forks=forks)
        finally:
            lab_memory.stop()
        lab_peak = lab_peak_rss_kb(lab)
        world = lab_world(lab)
        delays = lab.delays()
        hosts = inventory_hosts(lab)
        releases = inventory_var(lab, hosts['controlplane'][0], 'bootstrap_apps_releases', []) or []
        objects = critical_path.read_objects(os.path.join(artifacts, 'kubeconfig'))
        facts = critical_path.facts_from_objects(hosts, lab.vms(), objects['pods'], objects['replicasets'],
                                                 objects['workloads'], objects['kustomizations'], releases)
        path = critical_path.compute(delays, facts)
        world_latencies = critical_path.world_latencies(objects, delays)
        handoff_before_apps = flux_handed_over_before_apps(run.report)
        contract_path = critical_path.compute(delays, facts, stage_contract=True, handoff_before_apps=handoff_before_apps)
        started = datetime.datetime.fromisoformat(run.report['started'].replace('Z', '+00:00')).timestamp()
        shift = lab_clock_offset(lab) - started
    finally:
        lab.stop()
    measured = Bootstrap(run=run, critical=path, contract=contract_path, handoff_before_apps=handoff_before_apps,
                         delays=delays, shift=shift, lab_peak_kb=lab_peak, lab_memory=lab_memory, world=world,
                         world_latencies=world_latencies, facts=facts,
                         time_scale=float(time_scale), control_planes=control_planes, workers=workers, forks=forks,
                         artifacts=artifacts)
    # Everything needed to look at the run again (python -m bench.timeline ARTIFACTS) without running it again.
    with open(os.path.join(artifacts, 'bench-bootstrap.json'), 'w', encoding='utf-8') as handle:
        json.dump({'summary': measured.summary(), 'shift': shift, 'delays': delays, 'facts': facts.as_dict(),
                   'critical_path': path.as_dict(), 'critical_path_with_stage_contract': contract_path.as_dict()},
                  handle, indent=1, default=str)
    print('   bootstrap %d+%d: %.1f s wall, critical path %.1f s, ratio %.2f (load %s -> %s); lab tree peak %.0f MiB '
          '(%d processes at most)' % (control_planes, workers, run.wall, path.length, measured.ratio or 0, run.load_before,
                                      run.load_after, lab_memory.tree_peak_pss_kb / 1024.0, lab_memory.tree_peak_processes),
          flush=True)
    _BOOTSTRAPS[key] = measured
    return measured


def option(options, name, default):
    """An option of `python -m bench` if it was given, else the benchmark's default."""
    value = getattr(options, name, None)
    return default if value is None else value
