# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: timeline
type: aggregate
short_description: Run report per cluster - stage timeline, gates, remediation, Flux graph, cluster facts
version_added: 0.1.0
description:
  - Records each stage of the run (a task's stage is the innermost of its tags that names a stage, as
    C(playbooks/site.yml) tags one play or block per stage), each gate's outcome and observation, and each
    remediation step, recognised by the conventions of the collection's C(docs/report.md).
  - Each stage has parts, its sub-stages in the order they started, each with its own span and status - a task's
    sub-stage is its tag that is no stage tag and is C(<stage>_<rest>) for a stage tag among its tags, as the plays of
    C(playbooks/site.yml) have (C(bootstrap_etcd), C(bootstrap_gates)) - so a stage whose plays ran apart shows
    when each ran.
  - At the end of the run it writes, per cluster (the C(cluster_name) of the hosts), C(report.json) (schema
    C(docs/report.schema.json)), C(report.html) (a self-contained page with an inline SVG Gantt chart of stages and
    gates, the gate table, the remediation log, the Flux dependency graph from C(proxtalos.cluster.flux_graph) and the
    cluster facts) and C(timeline.md) (the bootstrap timeline table - stage, start offset, status), and prints a
    summary with the paths. The summary, C(timeline.md) and the Gantt chart show a stage's parts under it when it has
    more than one.
  - Files are written with mode 0600. Task arguments are never recorded; a C(no_log) task contributes only its
    name and status. Known secrets are masked in everything written - with ansible-core's C(mask_secrets) where the
    core has it (2.22 and later), and in any case the values of vault-encrypted variables and of variables named
    like secrets (C(*_secret), C(*_password), C(*_token), C(*_private_key)).
requirements:
  - Enable it with C(callbacks_enabled = proxtalos.cluster.timeline) in C(ansible.cfg).
options:
  output_dir:
    description:
      - Directory under which each cluster's report goes, as C(<output_dir>/<cluster_name>/).
      - When not set, a cluster's report goes to its hosts' C(proxtalos_artifacts_dir) variable if defined, else
        to C(artifacts/<cluster_name>/) in the folder of its hosts' inventory (C(inventory_dir)), as the collection's
        roles place their artifacts; a cluster whose hosts have neither goes to C(artifacts/<cluster_name>/) in the
        current folder.
    type: path
    env:
      - name: PROXTALOS_REPORT_DIR
    ini:
      - section: callback_timeline
        key: output_dir
  stages:
    description:
      - The stage tags. The report lists the stages in the order they started; this order breaks ties.
    type: list
    elements: str
    default: [preflight, vms, secrets, apply, bootstrap, kubeconfig, flux_install, sealed_secrets, cni, remediate, flux, apps, gitops,
              report]
    env:
      - name: PROXTALOS_REPORT_STAGES
    ini:
      - section: callback_timeline
        key: stages
  summary:
    description:
      - Print the run summary (timeline, failed gates, remediation, report paths) at the end of the run.
      - Under a JSON stdout callback (such as C(ansible.posix.json)) the summary goes to stderr, so stdout stays one
        JSON document.
    type: bool
    default: true
    env:
      - name: PROXTALOS_REPORT_SUMMARY
    ini:
      - section: callback_timeline
        key: summary
  live_progress:
    description:
      - >-
        Show what a waiting task sees while it waits, one line each time its summary changes, for example
        C([lab-cp-1] Gate - ALL nodes Ready: nodes Ready 4/6: lab-w-2 NetworkPluginNotReady) followed by the seconds
        since the task started.
      - The collection's waiting modules (every wait of C(module_utils/_wait.py), as in k8s_gate, flux_gate, talos_info,
        talos_bootstrap, proxmox_vm_info, proxmox_vm) append their progress to the JSON-lines file named by
        E(PROXTALOS_PROGRESS_FILE); the plugin gives each task of the collection a file of its own in a private
        temporary folder (mode 0700, removed at the end of the run) and follows it from a thread.
      - Only under a terminal stdout callback; under a JSON one (such as C(ansible.posix.json)) nothing is added,
        so stdout stays one JSON document. When E(PROXTALOS_PROGRESS_FILE) is already set in the environment the
        plugin leaves it (and the modules' progress) to whoever set it.
    type: bool
    default: true
    env:
      - name: PROXTALOS_LIVE_PROGRESS
    ini:
      - section: callback_timeline
        key: live_progress
  progress_interval:
    description:
      - At most one progress line per task in this many seconds; a newer summary that comes sooner is shown when
        the time has passed (unless the wait ended). A wait that does not change repeats its line about every 30
        seconds.
    type: float
    default: 5.0
    env:
      - name: PROXTALOS_PROGRESS_INTERVAL
    ini:
      - section: callback_timeline
        key: progress_interval
"""

import atexit
import importlib
import json
import os
import re
import time

from ansible import constants as C
from ansible.plugins.callback import CallbackBase
from ansible.template import Templar

from ansible_collections.proxtalos.cluster.plugins.module_utils import _atomic_file
from ansible_collections.proxtalos.cluster.plugins.plugin_utils import _progress, _report_html, _timeline

try:
    from ansible.module_utils.secrets import mask_secrets  # ansible-core 2.22+
except ImportError:
    mask_secrets = None

try:
    from ansible.parsing.vault import VaultHelper
except ImportError:  # older cores: vaulted values are AnsibleVaultEncryptedUnicode
    VaultHelper = None

try:
    from ansible import context
except ImportError:
    context = None

try:
    from ansible.utils.collection_loader import AnsibleCollectionRef
except ImportError:
    AnsibleCollectionRef = None

SECRET_NAME = re.compile(r'(^|_)(secret|password|passwd|token|private_key|key_content)$')


def _is_vaulted(value):
    if VaultHelper is not None:
        try:
            return VaultHelper.get_ciphertext(value, with_tags=False) is not None
        except Exception:  # pylint: disable=broad-except
            return False
    return type(value).__name__ == 'AnsibleVaultEncryptedUnicode'


def _task_key(host_name, task):
    """The key of a host's running task: the host and the task's place in its file (Task.get_path, public).

    ansible-core runs one task at a time on a host: the linear strategy waits for every host's result of a task before
    the next (ansible-core 2.21 lib/ansible/plugins/strategy/linear.py, _wait_on_pending_results), the free strategy
    blocks a host until its result is processed (strategy/free.py `_blocked_hosts[host_name] = True`,
    strategy/__init__.py `del self._blocked_hosts[...]` on the result). The task of v2_runner_on_start and the result's
    task are different objects (the result's is a copy, strategy/__init__.py _convert_wire_task_result_to_host_task_result)
    with the same place; the place also tells a start that had no result from the next task of that host."""
    return host_name, task.get_path()


PLAYBOOK_EXTENSIONS = ('.yml', '.yaml')


def _playbook_file_name(argument):
    """The base name of the file ansible-playbook runs for one of its playbook arguments (context.CLIARGS['args']).

    A path gives its base name. A collection's playbook (namespace.collection.name, as in
    `ansible-playbook proxtalos.cluster.site`) gives the base name of the file ansible-core runs for it: playbooks/
    (and the name's subfolders) in the collection's folder, the name as it is, else with .yml, else .yaml (ansible-core
    2.21 lib/ansible/utils/collection_loader/_collection_finder.py, _get_collection_playbook_path), the collection's
    folder being its Python package's (the package ansible-core imports for it). A name that no collection has is a
    path, as for ansible-core."""
    reference = AnsibleCollectionRef.try_parse_fqcr(argument, 'playbook') if AnsibleCollectionRef is not None else None
    if reference is not None:
        try:
            package = importlib.import_module(reference.n_python_collection_package_name)
            folders = list(package.__path__)
        except (ImportError, AttributeError, OSError):
            folders = []
        for folder in folders[:1]:
            base = os.path.join(folder, 'playbooks', *(reference.subdirs.split('.') if reference.subdirs else []))
            names = [reference.resource]
            if not reference.resource.endswith(PLAYBOOK_EXTENSIONS):
                names += [reference.resource + extension for extension in PLAYBOOK_EXTENSIONS]
            for name in names:
                if os.path.exists(os.path.join(base, name)):
                    return name
    return os.path.basename(argument) or None


def _stdout_is_json():
    """Whether the stdout callback writes JSON (ansible.posix.json, ansible.posix.jsonl...): stdout is then a document."""
    return 'json' in str(getattr(C, 'DEFAULT_STDOUT_CALLBACK', '') or '')


class _HostView(object):
    """A host's variables, templated on access with themselves as the context, as hostvars[host] templates them: one
    public Templar over the variables already read, with the run's loader."""

    def __init__(self, variables, loader=None):
        self._vars = variables
        self._templar = Templar(loader=loader, variables=variables)

    def __contains__(self, name):
        return name in self._vars

    def __getitem__(self, name):
        return self._templar.template(self._vars[name])

    def get(self, name, default=None):
        return self[name] if name in self._vars else default


def _host_variables(hostvars, host, loader=None):
    """(the host's merged variables, untemplated; a view that templates them) from one read, or (None, None).

    hostvars[host] would merge the host's variables again on every access: the view is built over the read already
    made (hostvars.raw_get), templating through a Templar of the host's own with the run's loader
    (Playbook.get_loader); hostvars[host] when that cannot be made."""
    try:
        raw = hostvars.raw_get(host)
        if not isinstance(raw, dict):
            return None, None
    except Exception:  # pylint: disable=broad-except
        return None, None
    try:
        view = _HostView(raw, loader)
    except Exception:  # pylint: disable=broad-except
        try:
            view = hostvars[host]
        except Exception:  # pylint: disable=broad-except
            view = None
    return raw, view


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = 'aggregate'
    CALLBACK_NAME = 'proxtalos.cluster.timeline'
    CALLBACK_NEEDS_ENABLED = True
    # ansible-core 2.22: results reach this plugin unmasked, and it masks what it writes (mask_secrets).
    ANSIBLE_SUPPORTS_MASKING = True

    def __init__(self, display=None, options=None):
        super().__init__(display=display, options=options)
        self.masker = _timeline.Masker(extra=mask_secrets)
        self.recorder = None
        self.play = None
        self.starts = {}
        self.artifacts_dirs = {}
        self.inventory_dirs = {}
        self.scanned_hosts = set()
        self.follower = None
        self.loader = None
        self.playbooks_started = 0

    # -- live progress of waiting tasks -----------------------------------------------------------

    def _start_progress(self):
        if self.follower is not None or not self.get_option('live_progress') or _stdout_is_json():
            return
        if os.environ.get(_progress.PROGRESS_FILE_ENV):
            self._display.vv('proxtalos.cluster.timeline: PROXTALOS_PROGRESS_FILE is set already, no live progress')
            return
        try:
            self.follower = _progress.Follower(self._show_progress, min_interval=float(self.get_option('progress_interval')),
                                               mask=self.masker.text)
        except (OSError, IOError, ValueError) as exc:
            self._display.warning('proxtalos.cluster.timeline: no live progress: %s' % exc)
            return
        self.follower.start()
        atexit.register(self._stop_progress)   # a run that ends without stats (interrupted) cleans up too

    def _show_progress(self, text):
        self._display.display(text, color=C.COLOR_VERBOSE)

    def _stop_progress(self):
        follower, self.follower = self.follower, None
        if follower is None:
            return
        follower.stop()
        os.environ.pop(_progress.PROGRESS_FILE_ENV, None)

    def _follow_task(self, host, task):
        """Before Ansible forks the task's worker: point the collection's modules at a file of this task's own."""
        action = str(getattr(task, 'resolved_action', None) or task.action or '')
        if not action.startswith('proxtalos.cluster.'):
            os.environ.pop(_progress.PROGRESS_FILE_ENV, None)
            return
        path = self.follower.new_path()
        self.follower.watch(_task_key(host.get_name(), task), host.get_name(), self.masker.text(task.get_name()), path)
        os.environ[_progress.PROGRESS_FILE_ENV] = path

    # -- run and play ---------------------------------------------------------------------------

    def v2_playbook_on_start(self, playbook):
        self.recorder = _timeline.Recorder(time.time(), stages=self.get_option('stages'))
        get_loader = getattr(playbook, 'get_loader', None)
        self.loader = get_loader() if callable(get_loader) else None
        # ansible.context.CLIARGS: the command line as ansible-core's own default callback reads it; the
        # module's one public name (its __all__). docs/adr/0001-modules-in-the-worker-process.md says why it stays.
        cliargs = context.CLIARGS if context is not None else None
        if cliargs:
            self.recorder.check_mode = bool(cliargs.get('check'))
        if playbook is not None:
            # ansible-playbook starts its playbook arguments in their order, one v2_playbook_on_start each
            # (lib/ansible/executor/playbook_executor.py, run(): `for playbook in self._playbooks`, the CLI's args)
            arguments = cliargs.get('args') if cliargs else None
            number, self.playbooks_started = self.playbooks_started, self.playbooks_started + 1
            if isinstance(arguments, (list, tuple)) and number < len(arguments):
                self.recorder.playbook = _playbook_file_name(str(arguments[number]))
        self._start_progress()

    def v2_playbook_on_play_start(self, play):
        if self.recorder is None:
            self.v2_playbook_on_start(None)
        self.play = play
        self._read_inventory(play)

    def _hostvars(self, play):
        manager = play.get_variable_manager() if play is not None else None
        if manager is None:
            return None, {}
        play_vars = manager.get_vars(play=play)
        return play_vars.get('hostvars'), play_vars.get('groups') or {}

    def _read_inventory(self, play, final=False):
        """Cluster of every host, cluster values, node descriptions; secrets to mask."""
        try:
            hostvars, groups = self._hostvars(play)
        except Exception as exc:  # pylint: disable=broad-except
            self._display.warning('proxtalos.cluster.timeline: cannot read the inventory variables: %s' % exc)
            return
        if hostvars is None:
            return
        for host in list(hostvars):
            scan = host not in self.scanned_hosts
            if not scan and not final and host in self.recorder.host_cluster:
                continue   # a host's cluster and artifacts folder do not change between plays: read once
            # One read of the host's variables (Ansible merges every source for it: the costly part at many hosts),
            # then a templating view over that same read for the values below.
            raw, view = _host_variables(hostvars, host, self.loader)
            if scan:
                self._register_secrets(raw, view)
                self.scanned_hosts.add(host)
            values = self._read_vars(view, _timeline.CLUSTER_VARS + _timeline.NODE_VARS + ('proxtalos_artifacts_dir', 'inventory_dir'))
            if values.get('cluster_name') is None:
                continue
            cluster = str(values['cluster_name'])
            self.recorder.set_cluster(host, cluster)
            if values.get('proxtalos_artifacts_dir'):
                self.artifacts_dirs.setdefault(cluster, str(values['proxtalos_artifacts_dir']))
            if values.get('inventory_dir'):
                self.inventory_dirs.setdefault(cluster, str(values['inventory_dir']))
            if not final:
                continue
            self.recorder.set_cluster_values(cluster, self.masker.tree(
                dict((key, values.get(key)) for key in _timeline.CLUSTER_VARS)))
            role = [name for name in ('controlplane', 'worker') if host in groups.get(name, [])]
            node = dict((key, values.get(key)) for key in _timeline.NODE_VARS)
            node['role'] = ','.join(role) or None
            self.recorder.set_node(cluster, host, self.masker.tree(node))

    @staticmethod
    def _read_vars(host_values, names):
        values = {}
        if host_values is None:
            return values
        for name in names:
            try:
                value = host_values.get(name)
            except Exception:  # pylint: disable=broad-except
                value = None   # a value that does not template is not reported
            if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                values[name] = value if isinstance(value, (int, float)) else str(value)
        return values

    def _register_secrets(self, raw, host_values):
        if raw is None:
            return
        for name, value in list(raw.items()):
            try:
                if _is_vaulted(value):
                    self.masker.register(str(value))
                elif SECRET_NAME.search(str(name)) and isinstance(value, str):
                    # a template (a vault variable, a file lookup) is masked by what it gives
                    self.masker.register(str(host_values.get(name)) if '{{' in value else value)
            except Exception:  # pylint: disable=broad-except
                continue   # a value this run cannot decrypt or template is not in use

    # -- tasks ----------------------------------------------------------------------------------

    def v2_runner_on_start(self, host, task):
        self.starts[_task_key(host.get_name(), task)] = time.time()
        if self.follower is not None:
            self._follow_task(host, task)

    def _record(self, result, status):
        task = result.task
        host = result.host.get_name()
        key = _task_key(host, task)
        if self.follower is not None:
            self.follower.unwatch(key)
        if self.recorder is None:
            return
        end = time.time()
        start = self.starts.pop(key, end)
        raw = result.result if isinstance(result.result, dict) else {}
        no_log = bool(task.no_log) or bool(raw.get('_ansible_no_log')) or 'censored' in raw
        self.recorder.task_result(
            host=host,
            task_name=self.masker.text(task.get_name()),
            task_tags=list(task.tags or []),
            play_name=self.masker.text(self.play.get_name()) if self.play is not None else None,
            action=getattr(task, 'resolved_action', None) or task.action,
            start=start, end=end, status=status,
            result={} if no_log else self.masker.tree(self._public(raw)),
            no_log=no_log)

    @staticmethod
    def _public(raw):
        """The result without Ansible's internal keys and without the module's echo of its arguments."""
        return dict((key, value) for key, value in raw.items()
                    if not key.startswith('_ansible') and key not in ('invocation', 'ansible_facts', 'diff'))

    def v2_runner_on_ok(self, result):
        self._record(result, 'changed' if result.result.get('changed') else 'ok')

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, 'ignored' if ignore_errors else 'failed')

    def v2_runner_on_skipped(self, result):
        self._record(result, 'skipped')

    def v2_runner_on_unreachable(self, result):
        self._record(result, 'unreachable')

    # -- the end --------------------------------------------------------------------------------

    def v2_playbook_on_stats(self, stats):
        self._stop_progress()
        if self.recorder is None:
            return
        self.recorder.finished = time.time()
        if self.play is not None:
            self._read_inventory(self.play, final=True)
        for host in sorted(stats.processed.keys()):
            self.recorder.host_stats(host, stats.summarize(host))
        if not self.recorder.clusters():
            self._display.vv('proxtalos.cluster.timeline: no host has a cluster_name, no run report written')
        for cluster in self.recorder.clusters():
            report = self.recorder.build(cluster)
            try:
                paths = self._write(cluster, report)
            except (OSError, IOError) as exc:
                self._display.warning('proxtalos.cluster.timeline: cannot write the report of cluster %s: %s' % (cluster, exc))
                continue
            if self.get_option('summary'):
                colour = C.COLOR_OK if report['status'] == 'ok' else C.COLOR_ERROR
                lines = _timeline.terminal_summary(report, paths)
                # under a JSON stdout callback, stdout is one document: the summary goes to stderr
                stderr = _stdout_is_json()
                if not stderr:
                    self._display.banner('RUN REPORT [%s]' % cluster)
                self._display.display(lines[0], color=colour, stderr=stderr)
                for line in lines[1:]:
                    self._display.display(line, stderr=stderr)

    def _directory(self, cluster):
        safe = re.sub(r'[^A-Za-z0-9_.-]', '_', cluster) or 'cluster'
        root = self.get_option('output_dir')
        if root:
            return os.path.join(root, safe)
        if cluster in self.artifacts_dirs:
            return self.artifacts_dirs[cluster]
        # as the roles do: artifacts/<cluster_name> in the inventory's folder
        base = self.inventory_dirs.get(cluster) or os.getcwd()
        return os.path.join(base, 'artifacts', safe)

    def _write(self, cluster, report):
        directory = os.path.abspath(self._directory(cluster))
        os.makedirs(directory, mode=0o700, exist_ok=True)
        report = self.masker.tree(report)
        files = (
            ('report.json', json.dumps(report, indent=2, sort_keys=True) + '\n'),
            ('report.html', _report_html.render(report)),
            ('timeline.md', _timeline.timeline_markdown(report)),
        )
        written = []
        for name, text in files:
            path = os.path.join(directory, name)
            _write_private(path, self.masker.text(text))
            written.append(path)
        return [path for path in written if path.endswith(('.html', '.json'))]


def _write_private(path, text):
    """Write text to path with mode 0600, replacing the file in one rename (_atomic_file.write_atomically)."""
    _atomic_file.write_atomically(path, text, 0o600)
