"""The shared wait/retry helper, on a fake clock; its one progress recorder (timeline and file)."""
import json
import os
import stat

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors, _wait
from ansible_collections.proxtalos.cluster.tests.helpers import FakeClock


def probe_sequence(values):
    values = list(values)

    def probe():
        value = values.pop(0)
        if isinstance(value, Exception):
            raise value
        return value
    return probe


def test_done_on_first_probe_does_not_sleep():
    fake = FakeClock()
    result = _wait.wait_for(probe_sequence([(True, 'ready')]), timeout=10, interval=1,
                            clock=fake.clock, sleep=fake.sleep)
    assert result.ok and result.observation == 'ready' and result.attempts == 1
    assert fake.sleeps == []


def test_polls_until_done_and_reports_elapsed():
    fake = FakeClock()
    result = _wait.wait_for(probe_sequence([(False, 'a'), (False, 'b'), (True, 'c')]), timeout=10,
                            interval=2, clock=fake.clock, sleep=fake.sleep)
    assert result.ok and result.observation == 'c'
    assert result.attempts == 3
    assert fake.sleeps == [2, 2]
    assert result.elapsed == pytest.approx(4)


def test_timeout_keeps_last_observation_and_never_oversleeps():
    fake = FakeClock()
    result = _wait.wait_for(lambda: (False, 'nodes Ready 4/6'), timeout=5, interval=2,
                            clock=fake.clock, sleep=fake.sleep)
    assert not result.ok
    assert result.observation == 'nodes Ready 4/6'
    assert fake.sleeps == [2, 2, 1]  # the last sleep is cut to the deadline
    assert result.elapsed == pytest.approx(5)


def test_zero_timeout_probes_exactly_once():
    fake = FakeClock()
    calls = []
    result = _wait.wait_for(lambda: calls.append(1) or (False, 'no'), timeout=0, interval=1,
                            clock=fake.clock, sleep=fake.sleep)
    assert not result.ok and calls == [1] and fake.sleeps == []


def test_transient_errors_are_not_yet_and_others_propagate():
    fake = FakeClock()
    result = _wait.wait_for(probe_sequence([ConnectionRefusedError('refused'), (True, 'up')]),
                            timeout=10, interval=1, transient=(ConnectionError,),
                            clock=fake.clock, sleep=fake.sleep)
    assert result.ok and result.attempts == 2
    with pytest.raises(KeyError):
        _wait.wait_for(probe_sequence([KeyError('boom')]), timeout=10, interval=1,
                       transient=(ConnectionError,), clock=fake.clock, sleep=fake.sleep)


def test_transient_error_text_is_the_observation_on_timeout():
    fake = FakeClock()
    result = _wait.wait_for(probe_sequence([ConnectionRefusedError('port 50000 refused')] * 3),
                            timeout=2, interval=1, transient=(ConnectionError,),
                            clock=fake.clock, sleep=fake.sleep)
    assert not result.ok
    assert result.observation == 'ConnectionRefusedError: port 50000 refused'


def test_backoff_grows_to_the_cap():
    fake = FakeClock()
    _wait.wait_for(lambda: (False, None), timeout=30, interval=1, backoff=2, max_interval=5,
                   clock=fake.clock, sleep=fake.sleep)
    assert fake.sleeps[:5] == [1, 2, 4, 5, 5]


def test_progress_notes_each_probe_not_done():
    fake = FakeClock()
    seen = []
    recorder = _wait.Progress(note=lambda obs, elapsed, attempts: seen.append((obs, attempts)))
    _wait.wait_for(probe_sequence([(False, 'x'), (False, 'y'), (True, 'z')]), timeout=10, interval=1,
                   clock=fake.clock, sleep=fake.sleep, progress=recorder)
    assert seen == [('x', 1), ('y', 2)]
    assert [entry['summary'] for entry in recorder.timeline] == ['x', 'y', 'z']


def test_retry_notes_each_retried_error():
    fake = FakeClock()
    calls = iter([TimeoutError('lock'), 'done'])
    seen = []

    def call():
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value
    assert _wait.retry(call, timeout=60, interval=1, transient=(TimeoutError,), clock=fake.clock, sleep=fake.sleep,
                       progress=_wait.Progress(note=lambda obs, elapsed, attempts: seen.append((obs, attempts)))) == 'done'
    assert seen == [('TimeoutError: lock', 1)]


def test_retry_returns_value_after_transient_failures():
    fake = FakeClock()
    calls = iter([TimeoutError('lock'), TimeoutError('lock'), 'done'])

    def call():
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value
    assert _wait.retry(call, timeout=60, interval=1, transient=(TimeoutError,),
                       clock=fake.clock, sleep=fake.sleep) == 'done'
    assert fake.sleeps == [1, 2]


def test_retry_raises_the_last_transient_error_at_the_deadline():
    fake = FakeClock()

    def call():
        raise TimeoutError('got timeout at %.0f' % fake.now)
    with pytest.raises(TimeoutError) as info:
        _wait.retry(call, timeout=3, interval=1, transient=(TimeoutError,), clock=fake.clock, sleep=fake.sleep)
    assert str(info.value) == 'got timeout at 103'


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        _wait.wait_for(lambda: (True, None), timeout=-1)
    with pytest.raises(ValueError):
        _wait.wait_for(lambda: (True, None), timeout=1, interval=0)


class RecordingProgress(object):
    def __init__(self):
        self.calls = []

    def update(self, observation, elapsed, attempts):
        self.calls.append(('update', observation, attempts))

    def end(self, observation, elapsed, attempts, ok):
        self.calls.append(('end', observation, attempts, ok))


def test_progress_sees_each_probe_that_is_not_done_then_the_end():
    fake = FakeClock()
    progress = RecordingProgress()
    result = _wait.wait_for(probe_sequence([(False, 'a'), ValueError('refused'), (True, 'c')]), timeout=10, interval=1,
                            transient=(ValueError,), clock=fake.clock, sleep=fake.sleep, progress=progress)
    assert result.ok
    assert progress.calls == [('update', 'a', 1), ('update', 'ValueError: refused', 2), ('end', 'c', 3, True)]


def test_progress_hears_nothing_from_a_wait_done_at_once_and_the_end_of_a_timeout():
    fake = FakeClock()
    progress = RecordingProgress()
    _wait.wait_for(probe_sequence([(True, 'ready')]), timeout=10, clock=fake.clock, sleep=fake.sleep, progress=progress)
    assert progress.calls == []
    result = _wait.wait_for(lambda: (False, 'still'), timeout=2, interval=1, clock=fake.clock, sleep=fake.sleep,
                            progress=progress)
    assert not result.ok and progress.calls[-1] == ('end', 'still', 3, False)


def test_default_progress_is_the_file_of_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(_wait.PROGRESS_FILE_ENV, raising=False)
    fake = FakeClock()
    _wait.wait_for(probe_sequence([(False, 'a'), (True, 'b')]), timeout=10, clock=fake.clock, sleep=fake.sleep)
    assert list(tmp_path.iterdir()) == []            # no variable, no file, same result as ever
    path = tmp_path / 'progress.jsonl'
    monkeypatch.setenv(_wait.PROGRESS_FILE_ENV, str(path))
    result = _wait.wait_for(probe_sequence([(False, 'a\n  b'), (False, 'a b'), (True, 'done')]), timeout=10,
                            clock=fake.clock, sleep=fake.sleep)
    assert result.ok and result.attempts == 3
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    # one line per change (the text is made one line), then the end
    assert [(line['event'], line['attempt'], line['summary']) for line in lines] == [
        ('progress', 1, 'a b'), ('end', 3, 'done')]
    assert lines[-1]['ok'] is True and lines[0]['label'] is None
    assert stat.S_IMODE(os.stat(str(path)).st_mode) == 0o600


def test_progress_file_heartbeat_and_a_file_that_cannot_be_written(tmp_path, monkeypatch):
    now = [0.0]
    progress = _wait.Progress(str(tmp_path / 'p.jsonl'), heartbeat=30.0, clock=lambda: now[0])
    assert progress.update('Ready 2/3', 0.0, 1)
    now[0] = 29.0
    assert not progress.update('Ready 2/3', 29.0, 10)
    now[0] = 31.0
    assert progress.update('Ready 2/3', 31.0, 11)      # heartbeat: the wait is alive
    assert progress.update('Ready 3/3', 31.5, 12)
    gone = _wait.Progress(str(tmp_path / 'no-such-folder' / 'p.jsonl'))
    assert not gone.update('x', 0.0, 1) and gone.broken
    monkeypatch.setenv(_wait.PROGRESS_FILE_ENV, str(tmp_path / 'no-such-folder' / 'p.jsonl'))
    fake = FakeClock()
    result = _wait.wait_for(probe_sequence([(False, 'a'), (True, 'b')]), timeout=10, clock=fake.clock, sleep=fake.sleep)
    assert result.ok and result.attempts == 2          # progress is best effort: the wait is unchanged


# --- the recorder's timeline (a module result's `progress`) and an announced wait's file lines ---------------------

class Verdict(object):
    """An observation with a one-line summary, as a gate's verdict is."""

    def __init__(self, summary):
        self.summary = summary


class Clock(object):
    def __init__(self):
        self.now = 50.0

    def __call__(self):
        return self.now


def test_timeline_keeps_changes_only_and_the_final_entry():
    timeline = _wait.Progress(label='k8s_gate nodes', announce=True, clock=Clock())
    timeline.update(Verdict('nodes Ready 4/6: w-2 NetworkPluginNotReady'), 0.0, 1)
    timeline.update(Verdict('nodes Ready 4/6: w-2 NetworkPluginNotReady'), 2.0, 2)
    timeline.update('TransientApiError: refused', 4.0, 3)
    timeline.update(Verdict('nodes Ready 5/6: w-3 NetworkPluginNotReady'), 6.0, 4)
    timeline.end(Verdict('nodes Ready 6/6'), 8.0, 5, True)     # the wait's end: the owner ends an announced wait
    assert len(timeline.timeline) == 3
    timeline.finish(Verdict('nodes Ready 6/6'), 8.0, 5, True)
    assert timeline.timeline == [
        {'elapsed': 0.0, 'attempt': 1, 'summary': 'nodes Ready 4/6: w-2 NetworkPluginNotReady'},
        {'elapsed': 4.0, 'attempt': 3, 'summary': 'TransientApiError: refused'},
        {'elapsed': 6.0, 'attempt': 4, 'summary': 'nodes Ready 5/6: w-3 NetworkPluginNotReady'},
        {'elapsed': 8.0, 'attempt': 5, 'summary': 'nodes Ready 6/6'},
    ]
    assert (timeline.elapsed, timeline.attempts) == (8.0, 5)


def test_timeout_does_not_duplicate_the_last_entry():
    timeline = _wait.Progress(label='x', clock=Clock())
    timeline.update(Verdict('a'), 0.0, 1)
    timeline.finish(Verdict('a'), 0.0, 1, False)
    assert len(timeline.timeline) == 1


def test_timeline_is_capped_keeping_the_first_entry():
    timeline = _wait.Progress(label='x', max_entries=3, clock=Clock())
    for attempt in range(1, 7):
        timeline.update(Verdict('state %d' % attempt), attempt, attempt)
    assert [entry['summary'] for entry in timeline.timeline] == ['state 1', 'state 5', 'state 6']
    assert timeline.dropped == 3


def test_an_announced_wait_writes_start_progress_heartbeat_and_its_owners_end(tmp_path):
    clock = Clock()
    path = tmp_path / 'progress.jsonl'
    timeline = _wait.Progress(str(path), label='k8s_gate DaemonSet kube-system/cilium', announce=True, heartbeat=30.0,
                              clock=clock, wall_clock=lambda: 1764064800.0)
    timeline.update(Verdict('Ready on 2/3'), 0.0, 1)
    clock.now += 10
    timeline.update(Verdict('Ready on 2/3'), 10.0, 6)   # no change, no heartbeat due: nothing written
    clock.now += 25
    timeline.update(Verdict('Ready on 2/3'), 35.0, 18)  # still no change, 35 s since the last line: heartbeat
    timeline.end(Verdict('Ready on 3/3'), 36.0, 19, True)      # wait_for's end: not written, the owner ends it
    timeline.finish(Verdict('Ready on 3/3'), 36.0, 19, False)  # the gate's verdict (a gate failed for good)
    timeline.finish(Verdict('Ready on 3/3'), 36.0, 19, False)  # once
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line['event'], line['attempt'], line['summary']) for line in lines] == [
        ('start', 0, 'waiting for k8s_gate DaemonSet kube-system/cilium'),
        ('progress', 1, 'Ready on 2/3'),
        ('progress', 18, 'Ready on 2/3'),
        ('end', 19, 'Ready on 3/3'),
    ]
    assert lines[-1]['ok'] is False
    assert lines[0]['time'] == '2025-11-25T10:00:00+00:00'
    assert all(line['label'] == 'k8s_gate DaemonSet kube-system/cilium' for line in lines)
    assert stat.S_IMODE(os.stat(str(path)).st_mode) == 0o600


def test_a_step_names_itself_in_the_file_but_not_in_the_timeline(tmp_path):
    path = tmp_path / 'progress.jsonl'
    timeline = _wait.Progress(str(path), label='k8s_gate API (x)', step='API', announce=True, clock=Clock())
    timeline.update(Verdict('not ready'), 1.0, 1)
    timeline.finish(Verdict('ready'), 2.0, 2, True)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line['summary'] for line in lines] == ['waiting for k8s_gate API (x)', 'API: not ready', 'API: ready']
    assert [entry['summary'] for entry in timeline.timeline] == ['not ready', 'ready']


def test_an_announced_progress_file_in_a_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(_errors.ValidationError) as caught:
        _wait.Progress(str(tmp_path / 'nope' / 'progress.jsonl'), label='x', announce=True)
    assert caught.value.field == 'progress_file'
