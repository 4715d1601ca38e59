"""The live progress follower of the timeline callback, fed by the files _wait.Progress writes."""
import json
import os
import stat
import subprocess
import sys
import threading

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait
from ansible_collections.proxtalos.cluster.plugins.plugin_utils import _progress
from ansible_collections.proxtalos.cluster.tests.helpers import FakeClock

TASK_START = 1764064800.0   # wall clock when the task started


class Writer(object):
    """Writes progress lines as a module's wait does, with a wall clock relative to the task start."""

    def __init__(self, path):
        self.wall = TASK_START
        self.file = _wait.Progress(path, heartbeat=30.0, clock=lambda: self.wall, wall_clock=lambda: self.wall)

    def progress(self, summary, after, attempt=1):
        self.wall = TASK_START + after
        assert self.file.update(summary, after, attempt)

    def end(self, summary, after, ok=True):
        self.wall = TASK_START + after
        self.file.finish(summary, after, 9, ok)


@pytest.fixture
def follower(tmp_path):
    clock = FakeClock()
    shown = []
    os.mkdir(str(tmp_path / 'progress'))
    follower = _progress.Follower(shown.append, min_interval=5.0, directory=str(tmp_path / 'progress'), clock=clock,
                                  wall_clock=lambda: TASK_START)
    follower.shown = shown
    follower.fake_clock = clock
    yield follower
    follower.stop()


def watch(follower, host='lab-cp-1', task='proxtalos.cluster.cni : Gate - ALL nodes Ready'):
    path = follower.new_path()
    follower.watch((host, 'uuid-1'), host, task, path, started=TASK_START)
    return path


def test_a_change_is_shown_at_once_with_host_task_and_seconds_since_the_task_started(follower):
    writer = Writer(watch(follower))
    assert follower.poll() == []                     # the module wrote nothing yet: no file, no line
    writer.progress('nodes Ready 4/6: lab-w-2 NetworkPluginNotReady', 12.2)
    assert follower.poll() == ['  [lab-cp-1] Gate - ALL nodes Ready: nodes Ready 4/6: lab-w-2 NetworkPluginNotReady (12 s)']
    assert follower.poll() == []                     # nothing new


def test_changes_within_the_interval_are_held_and_the_newest_shown_when_due(follower):
    writer = Writer(watch(follower))
    writer.progress('nodes Ready 4/6', 1)
    assert len(follower.poll()) == 1
    follower.fake_clock.now += 1
    writer.progress('nodes Ready 5/6', 2)
    writer.progress('nodes Ready 6/6 (one NotReady again)', 3)
    assert follower.poll() == []                     # 1 s after the last line: held
    follower.fake_clock.now += 4
    assert follower.poll() == ['  [lab-cp-1] Gate - ALL nodes Ready: nodes Ready 6/6 (one NotReady again) (3 s)']
    follower.fake_clock.now += 10
    assert follower.poll() == []                     # shown once


def test_an_ended_wait_shows_no_held_line(follower):
    writer = Writer(watch(follower))
    writer.progress('agents Ready 2/3', 1)
    follower.poll()
    follower.fake_clock.now += 1
    writer.progress('agents Ready 3/3 pending operator', 2)
    writer.end('agents Ready 3/3', 2.5)
    follower.fake_clock.now += 10
    assert follower.poll() == []


def test_a_later_wait_of_the_same_task_is_shown_again(follower):
    writer = Writer(watch(follower))
    writer.progress('talos API: connection refused', 1)
    writer.end('answers (configured)', 2)
    assert follower.poll() == []                     # ended before it was read: nothing stale
    writer.progress('kubelet Waiting: volume', 3)
    assert follower.poll() == ['  [lab-cp-1] Gate - ALL nodes Ready: kubelet Waiting: volume (3 s)']


def test_a_line_is_read_only_once_it_is_complete(follower):
    path = watch(follower)
    line = json.dumps({'event': 'progress', 'summary': 'half', 'time': '2025-11-25T10:00:04+00:00'}) + '\n'
    with open(path, 'w') as stream:
        stream.write(line[:10])
    assert follower.poll() == []
    with open(path, 'a') as stream:
        stream.write(line[10:] + 'not json\n')
    assert follower.poll() == ['  [lab-cp-1] Gate - ALL nodes Ready: half (4 s)']


def test_summaries_are_masked(tmp_path):
    shown = []
    os.mkdir(str(tmp_path / 'p'))
    follower = _progress.Follower(shown.append, directory=str(tmp_path / 'p'),
                                  mask=lambda text: text.replace('s3cr3t-value', '$REDACTED$'))
    try:
        path = follower.new_path()
        follower.watch('k', 'h', 'Gate - x', path, started=TASK_START)
        Writer(path).progress('token s3cr3t-value refused', 1)
        assert follower.poll() == ['  [h] Gate - x: token $REDACTED$ refused (1 s)']
    finally:
        follower.stop()


def test_unwatch_removes_the_file_and_stops_the_lines(follower):
    path = watch(follower)
    writer = Writer(path)
    writer.progress('a', 1)
    assert os.path.exists(path) and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    follower.unwatch(('lab-cp-1', 'uuid-1'))
    assert not os.path.exists(path)
    assert follower.poll() == [] and follower.watching() == []
    follower.unwatch(('lab-cp-1', 'uuid-1'))         # twice, or a task that never wrote: no error


def test_the_thread_shows_lines_as_they_come_and_stop_leaves_nothing(tmp_path):
    shown = []
    follower = _progress.Follower(shown.append, min_interval=0.0, poll_interval=0.01)
    directory = follower.directory
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    follower.start()
    assert follower.running
    path = follower.new_path()
    follower.watch('k', 'lab-w-1', 'Gate - kubelet', path, started=TASK_START)
    Writer(path).progress('kubelet Waiting', 2)
    seen = _wait.wait_for(lambda: (bool(shown), list(shown)), timeout=10, interval=0.01, progress=None)
    assert seen.ok, seen
    assert shown == ['  [lab-w-1] Gate - kubelet: kubelet Waiting (2 s)']
    follower.stop()
    assert not follower.running
    assert not any(thread.name == 'proxtalos-progress' for thread in threading.enumerate())
    assert not os.path.exists(directory)


def test_a_module_wait_with_the_environment_variable_reaches_the_follower(follower, monkeypatch):
    path = watch(follower, host='lab-w-2', task='Gate - Talos services')
    monkeypatch.setenv(_progress.PROGRESS_FILE_ENV, path)
    states = iter([(False, 'kubelet Waiting'), (False, 'kubelet Waiting'), (False, 'kubelet Starting'), (True, 'ok')])
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds
    result = _wait.wait_for(lambda: next(states), timeout=60, interval=1, clock=lambda: now[0], sleep=sleep)
    assert result.ok
    with open(path) as stream:
        events = [(line['event'], line['summary']) for line in map(json.loads, stream)]
    assert events == [('progress', 'kubelet Waiting'), ('progress', 'kubelet Starting'), ('end', 'ok')]
    assert follower.poll() == []                     # the wait ended before the follower looked: nothing stale


def test_role_prefix_is_stripped_only_from_a_role_name():
    assert _progress.short_task_name('proxtalos.cluster.cni : Gate - x') == 'Gate - x'
    assert _progress.short_task_name('Gate - a : b') == 'Gate - a : b'
    assert _progress.short_task_name(None) == ''


def test_folders_of_killed_runs_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()
    stale = tmp_path / ('proxtalos-progress-%d-abc' % dead.pid)
    live = tmp_path / ('proxtalos-progress-%d-def' % os.getpid())
    other = tmp_path / 'proxtalos-progress-notapid'
    for folder in (stale, live, other):
        folder.mkdir()
        (folder / 'task-1.jsonl').write_text('{}\n')
    assert _progress.remove_stale_folders(str(tmp_path)) == [str(stale)]
    assert sorted(os.listdir(str(tmp_path))) == sorted([live.name, other.name])
