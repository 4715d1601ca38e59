"""What the reliability suites share (test_fault_matrix, test_interrupted_runs, test_secrets_hygiene).

A `Workspace` is a lab plus the folders a run of site.yml uses: an inventory folder (the lab's hosts.yml, links to
inventories/lab/group_vars and files, and the secrets/ the run creates), an artifacts folder
(proxtalos_artifacts_dir) and a logs folder that keeps the stdout and stderr of every run, so the secrets hygiene
test can scan all of them afterwards.

Runs use the ansible.posix.jsonl stdout callback: one JSON line per event, written as it happens (PYTHONUNBUFFERED:
ansible-playbook never flushes its stdout itself; a file would get the lines when a worker is forked or the buffer is
full), so a run that is killed still leaves a readable record of what it did up to the kill. `PlaybookRun` reads those lines back: task
results by stage (the play a task ran in, mapped to its tag in playbooks/site.yml), changed results, failure
messages, the PLAY RECAP.
"""

import functools
import hashlib
import json
import os
import signal
import subprocess
import time

import yaml

from ansible_collections.proxtalos.cluster.tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK_BIN = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
SITE = os.path.join(ROOT, 'site.yml')
SITE_PLAYS = os.path.join(ROOT, 'playbooks', 'site.yml')
TOOLS_BIN = os.path.join(ROOT, '.tools', 'bin')
VENV_BIN = os.path.dirname(PLAYBOOK_BIN)
RUN_TIMEOUT = 900


def site_plays():
    """[(play name, stage tag)] of playbooks/site.yml in order; the stage of a play is its first tag."""
    with open(SITE_PLAYS, encoding='utf-8') as handle:
        plays = yaml.safe_load(handle)
    return [(play['name'], (play.get('tags') or ['untagged'])[0]) for play in plays]


def stages():
    """The stage tags of site.yml in run order (each once; `always` is not a stage)."""
    order = []
    for _name, tag in site_plays():
        if tag != 'always' and tag not in order:
            order.append(tag)
    return order


def sha256(path):
    with open(path, 'rb') as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def file_mode(path):
    return os.stat(path).st_mode & 0o777


class PlaybookRun(object):
    """One ansible-playbook run (finished or killed), read from its jsonl stdout."""

    def __init__(self, command, stdout_path, stderr_path, rc, elapsed, killed=False):
        self.command = command
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self.rc = rc
        self.elapsed = elapsed
        self.killed = killed
        self._events = None

    @property
    def stdout(self):
        with open(self.stdout_path, encoding='utf-8', errors='replace') as handle:
            return handle.read()

    @property
    def stderr(self):
        with open(self.stderr_path, encoding='utf-8', errors='replace') as handle:
            return handle.read()

    @property
    def events(self):
        """Every complete JSON line of stdout (a line cut by a kill is left out)."""
        if self._events is None:
            self._events = parse_events(self.stdout)
        return self._events

    def results(self, stage=None, task=None):
        """[(stage, task name, host, result, event)] of every task result, optionally of one stage / task name part."""
        return [r for r in task_results(self.events)
                if (stage is None or r[0] == stage) and (task is None or task in r[1])]

    def changed(self, stage=None):
        """[(stage, task name, host)] of the results that reported changed."""
        return [(s, t, h) for s, t, h, result, _e in self.results(stage) if result.get('changed')]

    def failures(self):
        """[(stage, task name, host, message)] of failed results (failed loop items give their own messages)."""
        out = []
        for stage_tag, name, host, result, event in self.results():
            if event not in ('v2_runner_on_failed', 'v2_runner_on_unreachable') or result.get('ignore_errors'):
                continue
            # failed loop items carry their own msg (the callback drops their `failed` flag; ok items have no msg)
            items = [str(item.get('msg')) for item in result.get('results') or [] if item.get('msg')]
            out.append((stage_tag, name, host, '\n'.join(items) if items else str(result.get('msg', ''))))
        return out

    @property
    def stats(self):
        for event in reversed(self.events):
            if event.get('_event') == 'v2_playbook_on_stats':
                return event.get('stats') or {}
        return {}

    @property
    def ok(self):
        return self.rc == 0 and not self.killed and all(
            host.get('failures', 0) == 0 and host.get('unreachable', 0) == 0 for host in self.stats.values())

    def stages_run(self):
        """Stage tags whose plays started, in order."""
        seen = []
        for event in self.events:
            if event.get('_event') == 'v2_playbook_on_play_start':
                tag = play_stage(event['play']['name'])
                if tag not in seen:
                    seen.append(tag)
        return seen

    def explain(self):
        failures = ['%s / %s / %s: %s' % f for f in self.failures()]
        return 'rc=%s killed=%s elapsed=%.1fs\nfailures:\n  %s\nstderr tail: %s\nstdout: %s' % (
            self.rc, self.killed, self.elapsed, '\n  '.join(failures) or '-', self.stderr[-1500:], self.stdout_path)


_PLAY_STAGES = None


def other_plays():
    """[(play name, first play-level tag)] of the other playbooks under playbooks/ (remove_node, etcd_backup...)."""
    plays = []
    folder = os.path.dirname(SITE_PLAYS)
    for name in sorted(os.listdir(folder)):
        if name.endswith('.yml') and os.path.join(folder, name) != SITE_PLAYS:
            with open(os.path.join(folder, name), encoding='utf-8') as handle:
                plays += [(play['name'], (play.get('tags') or [name[:-len('.yml')]])[0]) for play in yaml.safe_load(handle)]
    return plays


def play_stage(play_name):
    global _PLAY_STAGES  # pylint: disable=global-statement
    if _PLAY_STAGES is None:
        _PLAY_STAGES = dict(other_plays())
        _PLAY_STAGES.update(site_plays())
    return _PLAY_STAGES.get(play_name, play_name)


def parse_events(text):
    events = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith('{'):
            continue
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def task_results(events):
    """[(stage, task name, host, result, event)] from jsonl events."""
    out = []
    stage = None
    for event in events:
        kind = event.get('_event', '')
        if kind == 'v2_playbook_on_play_start':
            stage = play_stage(event['play']['name'])
        elif kind.startswith('v2_runner_on_') and kind not in ('v2_runner_on_start',) and 'hosts' in event:
            for host, result in event['hosts'].items():
                out.append((stage, event['task']['name'], host, result, kind))
    return out


def _children():
    """{parent pid: [child pids]} of every process, from /proc."""
    tree = {}
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % entry, encoding='ascii', errors='replace') as handle:
                fields = handle.read().rsplit(')', 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def _signal(pid, signum):
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def freeze_tree(root):
    """SIGSTOP root and all its descendants, until a pass finds no new one; returns every pid stopped."""
    stopped = []
    pending = [root]
    while pending:
        for pid in pending:
            _signal(pid, signal.SIGSTOP)
            stopped.append(pid)
        tree = _children()
        found = []
        for pid in stopped:
            found += [child for child in tree.get(pid, []) if child not in stopped and child not in found]
        pending = found
    return stopped


class RunningPlaybook(object):
    """ansible-playbook started in a session of its own, so a kill takes its worker processes with it."""

    def __init__(self, command, env, stdout_path, stderr_path):
        self.command = command
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self.started = time.monotonic()
        self.killed = False
        with open(stdout_path, 'w', encoding='utf-8') as out, open(stderr_path, 'w', encoding='utf-8') as err:
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err,  # pylint: disable=consider-using-with
                                            start_new_session=True)

    def events(self):
        with open(self.stdout_path, encoding='utf-8', errors='replace') as handle:
            return parse_events(handle.read())

    def running(self):
        return self.process.poll() is None

    def kill(self):
        """SIGKILL to ansible-playbook and every process under it, all at once, as when the controller goes away.

        ansible-core puts each worker in a process group (or session) of its own, so a signal to ansible-playbook's
        group would leave the workers finishing their modules. Instead the whole tree is frozen first (SIGSTOP,
        repeated until no new process shows up), then killed: no module gets to finish what it was doing.
        """
        if self.running():
            frozen = freeze_tree(self.process.pid)
            for pid in frozen:
                _signal(pid, signal.SIGKILL)
            self.killed = True
        self.process.wait(30)

    def wait(self, timeout=RUN_TIMEOUT):
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError('ansible-playbook did not end within %d s: %s' % (timeout, ' '.join(self.command))) from None
        return self.result()

    def result(self):
        return PlaybookRun(self.command, self.stdout_path, self.stderr_path, self.process.returncode,
                           time.monotonic() - self.started, killed=self.killed)


class Workspace(object):
    """A lab and the inventory, artifacts and logs folders of the runs against it."""

    def __init__(self, lab, folder):
        self.lab = lab
        self.folder = folder
        self.inventory = os.path.join(folder, 'inventory')
        self.artifacts = os.path.join(folder, 'artifacts')
        self.logs = os.path.join(folder, 'logs')
        for path in (self.inventory, self.logs):
            os.makedirs(path, exist_ok=True)
        with open(lab.inventory, encoding='utf-8') as source:
            text = source.read()
        with open(os.path.join(self.inventory, 'hosts.yml'), 'w', encoding='utf-8') as target:
            target.write(text)
        self.hosts = yaml.safe_load(text)
        for name in ('group_vars', 'files'):
            link = os.path.join(self.inventory, name)
            if not os.path.lexists(link):
                os.symlink(os.path.join(ROOT, 'inventories', 'lab', name), link)
        self.count = 0

    # ------------------------------------------------------------------ files a run keeps

    @property
    def secrets_dir(self):
        return os.path.join(self.inventory, 'secrets')

    @property
    def bundle(self):
        return os.path.join(self.secrets_dir, 'talos-secrets.yaml')

    @property
    def sealed_key(self):
        return os.path.join(self.secrets_dir, 'sealed-secrets.key')

    @property
    def ansible_tmp(self):
        """Where modules would be written for execution (ANSIBLE_REMOTE_TMP) without pipelining."""
        return os.path.join(self.folder, 'ansible-tmp')

    @property
    def kubeconfig(self):
        return os.path.join(self.artifacts, 'kubeconfig')

    @property
    def talosconfig(self):
        return os.path.join(self.artifacts, 'talosconfig')

    def kept_files(self):
        """sha256 of every file that must never be regenerated once written, for those that exist."""
        paths = (self.bundle, self.sealed_key, os.path.join(self.secrets_dir, 'sealed-secrets.crt'), self.talosconfig,
                 self.kubeconfig)
        return dict((os.path.basename(p), sha256(p)) for p in paths if os.path.exists(p))

    # ------------------------------------------------------------------ runs

    def command(self, args, playbook=SITE, extra_vars=None, verbosity=0):
        command = [PLAYBOOK_BIN, playbook, '-i', self.inventory, '-e', 'proxtalos_artifacts_dir=%s' % self.artifacts]
        if extra_vars:
            command += ['-e', json.dumps(extra_vars)]
        if verbosity:
            command.append('-' + 'v' * verbosity)
        return command + list(args)

    def environment(self, callback='ansible.posix.jsonl', extra=None):
        env = dict(os.environ, **(extra or {}))
        # a temp folder of this workspace's own: what a killed run leaves there can be looked at
        env.update(ANSIBLE_REMOTE_TMP=self.ansible_tmp, ANSIBLE_LOCAL_TEMP=os.path.join(self.folder, 'ansible-local-tmp'))
        # each event is in the stdout file when it happens (the kill points of test_interrupted_runs watch it)
        env.update(PYTHONUNBUFFERED='1')
        env.update(ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1', ANSIBLE_FORCE_COLOR='0',
                   ANSIBLE_LOCALHOST_WARNING='false', ANSIBLE_INVENTORY_UNPARSED_WARNING='false',
                   PATH=os.pathsep.join([VENV_BIN, TOOLS_BIN, os.environ.get('PATH', '')]))
        if callback:
            env['ANSIBLE_STDOUT_CALLBACK'] = callback
        return env

    def _log_paths(self, label):
        self.count += 1
        stem = os.path.join(self.logs, '%03d-%s' % (self.count, label.replace('/', '_').replace(' ', '_')))
        return stem + '.out', stem + '.err'

    def start(self, *args, label='run', extra_vars=None, verbosity=0, callback='ansible.posix.jsonl', playbook=SITE, env=None):
        stdout_path, stderr_path = self._log_paths(label)
        return RunningPlaybook(self.command(args, playbook, extra_vars, verbosity), self.environment(callback, env),
                               stdout_path, stderr_path)

    def run(self, *args, timeout=RUN_TIMEOUT, **kwargs):
        """Run site.yml (or playbook=) to its end; returns the PlaybookRun."""
        return self.start(*args, **kwargs).wait(timeout)

    def playbook(self, playbook, timeout=RUN_TIMEOUT):
        """Run playbook to its end (logged under its file name); returns the PlaybookRun."""
        return self.run(label=os.path.splitext(os.path.basename(playbook))[0], playbook=playbook, timeout=timeout)

    def render_cilium_manifest(self):
        """A lab on upstream Kubernetes: its inline Cilium manifest written once, as k8s_stages_lab's StageCluster
        does (nothing to do on a lab/k8s lab, or when the file is there)."""
        from k8s_stages_lab import render_cilium_manifest  # pylint: disable=import-outside-toplevel,import-error
        render_cilium_manifest(self)

    def k8s(self):
        from kubernetes import config  # pylint: disable=import-outside-toplevel
        return config.new_client_from_config(config_file=self.kubeconfig)


# tests/helpers.py's wait_until(probe, what, timeout=...), polling a whole lab from every 0.05 s growing by 1.5 up to 1 s
wait_until = functools.partial(helpers.wait_until, interval=0.05, backoff=1.5)
