"""The timeline callback on public interfaces only (issue 21): a host's running task is found again by its place
(Task.get_path) in the result's copy of the task, and the playbook's name comes from ansible-playbook's command line
(ansible.context.CLIARGS['args']), a collection's playbook named by the file ansible-core runs for it."""
import os

import pytest

from ansible import constants as C
from ansible.utils.context_objects import CLIArgs
from ansible_collections.proxtalos.cluster.plugins.callback import timeline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


class Host(object):
    def __init__(self, name):
        self.name = name

    def get_name(self):
        return self.name


class Task(object):
    """A task as a callback sees it; the result carries a copy (another object, the same place)."""

    def __init__(self, path, name):
        self.path = path
        self.name = name
        self.action = self.resolved_action = 'ansible.builtin.debug'
        self.no_log = False
        self.tags = ['vms']

    def get_name(self):
        return self.name

    def get_path(self):
        return self.path

    def copy(self):
        return Task(self.path, self.name)


class Result(object):
    def __init__(self, host, task):
        self.host = host
        self.task = task
        self.result = {'changed': False}


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

    def banner(self, text):
        self.lines.append(text)


class Playbook(object):
    def get_loader(self):
        return None


def callback(monkeypatch, cliargs=None):
    monkeypatch.setattr(C, 'DEFAULT_STDOUT_CALLBACK', 'ansible.builtin.default', raising=False)
    monkeypatch.setattr(timeline.context, 'CLIARGS', CLIArgs(cliargs or {}))
    plugin = timeline.CallbackModule(display=Display())
    values = {'stages': list(timeline._timeline.DEFAULT_STAGES), 'summary': False, 'output_dir': None,
              'live_progress': False, 'progress_interval': 0.0}
    monkeypatch.setattr(plugin, 'get_option', values.__getitem__)
    return plugin


def test_the_result_of_a_copy_of_the_task_ends_the_start_of_that_task(monkeypatch):
    plugin = callback(monkeypatch)
    plugin.v2_playbook_on_start(Playbook())
    plugin.recorder.set_cluster('cp-1', 'alpha')
    clock = iter([100.0, 200.0, 103.5])
    monkeypatch.setattr(timeline.time, 'time', lambda: next(clock))
    task = Task('/site/playbooks/site.yml:30', 'Create the VMs')
    plugin.v2_runner_on_start(Host('cp-1'), task)                      # 100.0
    other = Task('/site/playbooks/site.yml:44', 'Start the VMs')
    plugin.v2_runner_on_start(Host('w-1'), other)                      # 200.0, another host
    plugin.v2_runner_on_ok(Result(Host('cp-1'), task.copy()))          # 103.5
    [event] = plugin.recorder.events
    assert (event.host, event.task, event.start, event.end) == ('cp-1', 'Create the VMs', 100.0, 103.5)
    assert plugin.starts == {('w-1', '/site/playbooks/site.yml:44'): 200.0}


def test_a_result_of_another_task_on_the_host_does_not_take_its_start(monkeypatch):
    plugin = callback(monkeypatch)
    plugin.v2_playbook_on_start(Playbook())
    plugin.recorder.set_cluster('cp-1', 'alpha')
    clock = iter([100.0, 107.0])
    monkeypatch.setattr(timeline.time, 'time', lambda: next(clock))
    plugin.v2_runner_on_start(Host('cp-1'), Task('/site/playbooks/site.yml:30', 'Create the VMs'))
    plugin.v2_runner_on_ok(Result(Host('cp-1'), Task('/site/playbooks/site.yml:12', 'A result with no start')))
    [event] = plugin.recorder.events
    assert (event.start, event.end) == (107.0, 107.0)
    assert list(plugin.starts) == [('cp-1', '/site/playbooks/site.yml:30')]


def test_the_playbook_names_in_the_order_of_the_command_line(monkeypatch, tmp_path):
    arguments = ['site.yml', str(tmp_path / 'sub' / 'other.yaml'), 'proxtalos.cluster.site',
                 'proxtalos.cluster.upgrade_talos.yml', 'proxtalos.cluster.no_such_playbook', 'no.such.collection']
    plugin = callback(monkeypatch, {'args': arguments, 'check': True})
    names = []
    for _argument in arguments:
        plugin.v2_playbook_on_start(Playbook())
        names.append(plugin.recorder.playbook)
        assert plugin.recorder.check_mode is True
    # the collection's playbooks: the files ansible-core runs (playbooks/site.yml, playbooks/upgrade_talos.yml);
    # a name no collection has is a path, as for ansible-core
    assert os.path.isfile(os.path.join(ROOT, 'playbooks', 'site.yml'))
    assert names == ['site.yml', 'other.yaml', 'site.yml', 'upgrade_talos.yml', 'proxtalos.cluster.no_such_playbook',
                     'no.such.collection']
    plugin.v2_playbook_on_start(Playbook())                             # more starts than arguments: not known
    assert plugin.recorder.playbook is None


@pytest.mark.parametrize('cliargs', [{}, {'args': 'all'}])
def test_no_playbook_name_without_the_playbook_command_line(monkeypatch, cliargs):
    # {}: no command line parsed (CLIARGS empty); 'all': the ansible command's host pattern, not a list of playbooks
    plugin = callback(monkeypatch, cliargs)
    plugin.v2_playbook_on_start(Playbook())
    assert plugin.recorder.playbook is None and plugin.recorder.check_mode is False


def test_the_play_start_without_a_playbook_start_names_no_playbook(monkeypatch):
    plugin = callback(monkeypatch, {'args': ['site.yml']})
    plugin.v2_playbook_on_start(None)
    assert plugin.recorder.playbook is None and plugin.playbooks_started == 0
