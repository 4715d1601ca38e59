"""The shared wait/retry helper, on a fake clock; its progress sink."""
import json
import os
import stat

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait
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


def test_progress_is_reported_for_each_probe_not_done():
    fake = FakeClock()
    seen = []
    _wait.wait_for(probe_sequence([(False, 'x'), (False, 'y'), (True, 'z')]), timeout=10, interval=1,
                   on_progress=lambda obs, elapsed, attempts: seen.append((obs, attempts)),
                   clock=fake.clock, sleep=fake.sleep)
    assert seen == [('x', 1), ('y', 2)]


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


class RecordingSink(object):
    def __init__(self):
        self.calls = []

    def update(self, observation, elapsed, attempts):
        self.calls.append(('update', observation, attempts))

    def end(self, observation, elapsed, attempts, ok):
        self.calls.append(('end', observation, attempts, ok))


def test_sink_sees_each_probe_that_is_not_done_then_the_end():
    fake = FakeClock()
    sink = RecordingSink()
    result = _wait.wait_for(probe_sequence([(False, 'a'), ValueError('refused'), (True, 'c')]), timeout=10, interval=1,
                            transient=(ValueError,), clock=fake.clock, sleep=fake.sleep, sink=sink)
    assert result.ok
    assert sink.calls == [('update', 'a', 1), ('update', 'ValueError: refused', 2), ('end', 'c', 3, True)]


def test_sink_hears_nothing_from_a_wait_done_at_once_and_the_end_of_a_timeout():
    fake = FakeClock()
    sink = RecordingSink()
    _wait.wait_for(probe_sequence([(True, 'ready')]), timeout=10, clock=fake.clock, sleep=fake.sleep, sink=sink)
    assert sink.calls == []
    result = _wait.wait_for(lambda: (False, 'still'), timeout=2, interval=1, clock=fake.clock, sleep=fake.sleep, sink=sink)
    assert not result.ok and sink.calls[-1] == ('end', 'still', 3, False)


def test_default_sink_is_the_file_of_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setattr(_wait, '_PROGRESS_FILES', {})
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
    progress = _wait.ProgressFile(str(tmp_path / 'p.jsonl'), heartbeat=30.0, clock=lambda: now[0])
    assert progress.update('Ready 2/3', 0.0, 1)
    now[0] = 29.0
    assert not progress.update('Ready 2/3', 29.0, 10)
    now[0] = 31.0
    assert progress.update('Ready 2/3', 31.0, 11)      # heartbeat: the wait is alive
    assert progress.update('Ready 3/3', 31.5, 12)
    gone = _wait.ProgressFile(str(tmp_path / 'no-such-folder' / 'p.jsonl'))
    assert not gone.update('x', 0.0, 1) and gone.broken
    monkeypatch.setattr(_wait, '_PROGRESS_FILES', {})
    monkeypatch.setenv(_wait.PROGRESS_FILE_ENV, str(tmp_path / 'no-such-folder' / 'p.jsonl'))
    fake = FakeClock()
    result = _wait.wait_for(probe_sequence([(False, 'a'), (True, 'b')]), timeout=10, clock=fake.clock, sleep=fake.sleep)
    assert result.ok and result.attempts == 2          # progress is best effort: the wait is unchanged
