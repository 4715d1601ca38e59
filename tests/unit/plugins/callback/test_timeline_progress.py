"""The timeline callback's live progress plumbing: which tasks get a progress file, when it is off, cleanup."""
import json
import os
import threading

import pytest

from ansible import constants as C
from ansible_collections.proxtalos.cluster.plugins.callback import timeline
from ansible_collections.proxtalos.cluster.plugins.plugin_utils import _progress

VAR = _progress.PROGRESS_FILE_ENV
# a task's place (Task.get_path): the key of a host's running task
GATE = '/site/roles/cni/tasks/main.yml:40'
SHOW = '/site/roles/cni/tasks/main.yml:52'


class Host(object):
    def __init__(self, name):
        self.name = name

    def get_name(self):
        return self.name


class Task(object):
    def __init__(self, path, name, action):
        self.path = path
        self.name = name
        self.action = action
        self.resolved_action = action
        self.no_log = False
        self.tags = []

    def get_name(self):
        return self.name

    def get_path(self):
        return self.path


class Display(object):
    verbosity = 0

    def __init__(self):
        self.lines = []

    def display(self, text, color=None, stderr=False):
        self.lines.append(text)

    def warning(self, text):
        self.lines.append('WARNING ' + text)

    def vv(self, text):
        self.lines.append(text)


def callback(monkeypatch, stdout='ansible.builtin.default', **options):
    monkeypatch.setattr(C, 'DEFAULT_STDOUT_CALLBACK', stdout, raising=False)
    monkeypatch.delenv(VAR, raising=False)
    plugin = timeline.CallbackModule(display=Display())
    # the option defaults of the plugin's DOCUMENTATION (the plugin is not loaded through Ansible's loader here)
    values = {'stages': list(timeline._timeline.DEFAULT_STAGES), 'summary': True, 'output_dir': None,
              'live_progress': True, 'progress_interval': 0.0}
    values.update(options)
    monkeypatch.setattr(plugin, 'get_option', values.__getitem__)
    return plugin


def test_collection_tasks_get_a_file_of_their_own_others_none(monkeypatch):
    plugin = callback(monkeypatch)
    plugin.v2_playbook_on_start(None)
    try:
        assert plugin.follower is not None and plugin.follower.running
        plugin.v2_runner_on_start(Host('cp-1'), Task(GATE, 'cni : Gate - ALL nodes Ready', 'proxtalos.cluster.k8s_gate'))
        first = os.environ[VAR]
        plugin.v2_runner_on_start(Host('w-1'), Task(GATE, 'cni : Gate - ALL nodes Ready', 'proxtalos.cluster.k8s_gate'))
        second = os.environ[VAR]
        assert first != second and os.path.dirname(first) == plugin.follower.directory
        plugin.v2_runner_on_start(Host('cp-1'), Task(SHOW, 'Show', 'ansible.builtin.debug'))
        assert VAR not in os.environ                 # a module of no collection gets no stale path
        assert plugin.follower.watching() == [('cp-1', GATE), ('w-1', GATE)]
        # the module of cp-1 writes a line; the follower shows it with the task's short name
        with open(first, 'w') as stream:
            stream.write(json.dumps({'event': 'progress', 'summary': 'nodes Ready 4/6', 'time': None}) + '\n')
        assert plugin.follower.poll() == ['  [cp-1] Gate - ALL nodes Ready: nodes Ready 4/6 (0 s)']
    finally:
        directory = plugin.follower.directory
        plugin._stop_progress()
    assert not os.path.exists(directory) and VAR not in os.environ
    assert not any(thread.name == 'proxtalos-progress' for thread in threading.enumerate())


@pytest.mark.parametrize('stdout, options, preset', [
    ('ansible.posix.json', {}, None),
    ('ansible.posix.jsonl', {}, None),
    ('ansible.builtin.default', {'live_progress': False}, None),
    ('ansible.builtin.default', {}, '/tmp/mine.jsonl'),
])
def test_no_live_progress_under_json_when_off_or_when_the_variable_is_taken(monkeypatch, stdout, options, preset):
    plugin = callback(monkeypatch, stdout=stdout, **options)
    if preset:
        monkeypatch.setenv(VAR, preset)
    plugin.v2_playbook_on_start(None)
    plugin.v2_runner_on_start(Host('cp-1'), Task(GATE, 'Gate - x', 'proxtalos.cluster.k8s_gate'))
    assert plugin.follower is None
    assert os.environ.get(VAR) == preset         # left as it was


def test_a_finished_task_is_no_longer_followed_and_its_file_removed(monkeypatch):
    plugin = callback(monkeypatch)
    plugin.v2_playbook_on_start(None)
    try:
        task = Task(GATE, 'Gate - x', 'proxtalos.cluster.talos_info')
        plugin.v2_runner_on_start(Host('cp-1'), task)
        path = os.environ[VAR]
        with open(path, 'w') as stream:
            stream.write('{}\n')

        class Result(object):
            def __init__(self):
                self.task = task
                self.host = Host('cp-1')
                self.result = {'changed': False}
        plugin.v2_runner_on_ok(Result())
        assert plugin.follower.watching() == [] and not os.path.exists(path)
    finally:
        plugin._stop_progress()
