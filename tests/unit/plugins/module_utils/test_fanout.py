"""_fanout.py: work on many items at once - bounded, per-item deadline, outcomes by item in order, one progress line."""
import asyncio
import json
import threading

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _fanout, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError


class RecordingSink(object):
    def __init__(self):
        self.lines = []

    def update(self, observation, elapsed, attempts):
        self.lines.append(('progress', observation, attempts))

    def end(self, observation, elapsed, attempts, ok):
        self.lines.append(('end', observation, ok))


class FakeClock(object):
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class InFlight(object):
    """Counts the works running now and the most at once, as the works themselves see it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0

    def enter(self):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self):
        with self.lock:
            self.now -= 1


def test_no_more_items_than_max_workers_run_at_once():
    seen = InFlight()
    pairs = threading.Barrier(2, timeout=5)   # breaks unless two works are inside together

    def work(item):
        seen.enter()
        try:
            pairs.wait()
            return item * 10
        finally:
            seen.leave()

    fanout = _fanout.run_each([1, 2, 3, 4], work, max_workers=2)
    assert [outcome.value for outcome in fanout] == [10, 20, 30, 40]
    assert seen.most == 2 and fanout.most_at_once == 2


def test_outcomes_keep_the_items_order_and_each_items_error():
    everyone_in = threading.Barrier(3, timeout=5)
    c_ended = threading.Event()

    def work(item):
        everyone_in.wait()
        if item == 'a':
            assert c_ended.wait(5), 'c never ended'   # a ends last, c first: the outcomes still follow the items
        if item == 'b':
            raise ProxtalosError('b failed', node='b')
        if item == 'c':
            c_ended.set()
        return item.upper()

    fanout = _fanout.run_each(['a', 'b', 'c'], work, max_workers=3)
    assert [(outcome.item, outcome.value, str(outcome.error) if outcome.error else None) for outcome in fanout] == [
        ('a', 'A', None), ('b', None, 'b failed'), ('c', 'C', None)]
    assert [outcome.item for outcome in fanout.failed] == ['b']
    assert fanout.outcomes[1].error.details == {'node': 'b'}
    for outcome in fanout:
        assert outcome.started_at <= outcome.ended_at


def test_a_bug_is_raised_again_after_every_item_ended():
    ended = []

    def work(item):
        if item == 1:
            raise KeyError('a bug')
        ended.append(item)
        return item

    with pytest.raises(KeyError):
        _fanout.run_each([0, 1, 2], work, max_workers=3)
    assert sorted(ended) == [0, 2]


def test_an_item_whose_turn_comes_after_the_deadline_is_not_started_and_named():
    clock = FakeClock()
    deadline = _wait.Deadline(10, clock)
    started = []

    def work(item):
        started.append(item['name'])
        clock.now += 11          # the first item's work outlives the deadline
        return 'done'

    items = [{'name': 'w-1'}, {'name': 'w-2'}, {'name': 'w-3'}]
    fanout = _fanout.run_each(items, work, deadline, max_workers=1, name=lambda item: item['name'])
    assert started == ['w-1']
    assert fanout.outcomes[0].value == 'done' and fanout.outcomes[0].error is None
    for outcome, name in zip(fanout.outcomes[1:], ('w-2', 'w-3')):
        assert isinstance(outcome.error, _fanout.NotStarted)
        assert outcome.error.item == name and outcome.error.details == {'item': name}
        assert str(outcome.error) == 'not started: the deadline of 10 s passed while it waited for a free worker'
        assert outcome.started_at is None


def test_the_first_items_start_even_after_a_deadline_of_zero():
    # timeout 0 means "probe once": the items that do not wait for a worker still run
    fanout = _fanout.run_each(['a', 'b'], lambda item: item, _wait.Deadline(0), max_workers=2)
    assert [(outcome.value, outcome.error) for outcome in fanout] == [('a', None), ('b', None)]


def test_max_workers_below_one_is_refused():
    with pytest.raises(ValueError, match='max_workers'):
        _fanout.run_each(['a'], lambda item: item, max_workers=0)


def test_no_items_no_outcomes():
    fanout = _fanout.run_each([], lambda item: item)
    assert fanout.outcomes == [] and fanout.most_at_once == 0


def test_coroutine_work_runs_on_one_loop_bounded_and_in_order():
    seen = InFlight()
    threads = set()

    async def work(item):
        threads.add(threading.current_thread().name)
        seen.enter()
        try:
            await asyncio.sleep(0)    # hand the loop to the other items, as a network read does
            await asyncio.sleep(0)
        finally:
            seen.leave()
        if item == 'b':
            raise ProxtalosError('b failed')
        return item.upper()

    fanout = _fanout.run_each(['a', 'b', 'c', 'd'], work, max_workers=2)
    assert [(outcome.value, str(outcome.error) if outcome.error else None) for outcome in fanout] == [
        ('A', None), (None, 'b failed'), ('C', None), ('D', None)]
    assert seen.most == 2 and fanout.most_at_once == 2
    assert threads == {threading.current_thread().name}   # no thread of its own


def test_coroutine_work_not_started_after_the_deadline():
    clock = FakeClock()
    deadline = _wait.Deadline(5, clock)

    async def work(item):
        clock.now += 6
        return item

    fanout = _fanout.run_each(['a', 'b'], work, deadline, max_workers=1)
    assert fanout.outcomes[0].value == 'a'
    assert isinstance(fanout.outcomes[1].error, _fanout.NotStarted) and fanout.outcomes[1].error.item == 'b'


def test_the_progress_line_names_the_items_still_waited_for():
    sink = RecordingSink()
    line = _fanout.ItemsLine(['cp-1', 'w-1', 'w-2'], recorder=sink)
    line.done('cp-1')
    assert sink.lines == []   # nothing to say while no item was seen not ready
    line.sink_for('w-2').update('kubelet is Waiting', 0.1, 1)
    line.sink_for('w-2').end('kubelet is Running', 0.2, 2, True)   # one wait of w-2 ended; w-2 is not done yet
    line.done('w-1')
    line.done('w-2')
    line.finish(True, 'all 3 nodes passed')
    assert sink.lines == [
        ('progress', 'waiting for 2 of 3 nodes: w-1, w-2 (kubelet is Waiting)', 1),
        ('progress', 'waiting for 1 of 3 nodes: w-2 (kubelet is Waiting)', 2),
        ('end', 'all 3 nodes passed', True)]


def test_run_each_takes_each_item_off_the_progress_line_when_its_work_ends():
    sink = RecordingSink()
    line = _fanout.ItemsLine(['w-1', 'w-2'], recorder=sink, noun='VMs')
    w1_noted = threading.Event()
    w2_ended = threading.Event()

    def work(name):
        if name == 'w-1':
            line.sink_for('w-1').update('booting', 0.1, 1)
            w1_noted.set()
            assert w2_ended.wait(5), 'w-2 never ended'
            line.sink_for('w-1').update('booted', 0.2, 2)
            return name
        assert w1_noted.wait(5), 'w-1 never reported'
        line.sink_for('w-2').update('down', 0.1, 1)
        w2_ended.set()
        return name

    _fanout.run_each(['w-1', 'w-2'], work, max_workers=2, progress=line)
    line.finish(True, 'all 2 VMs ready')
    assert sink.lines == [
        ('progress', 'waiting for 2 of 2 VMs: w-1 (booting), w-2', 1),
        ('progress', 'waiting for 2 of 2 VMs: w-1 (booting), w-2 (down)', 2),
        ('progress', 'waiting for 1 of 2 VMs: w-1 (booting)', 3),
        ('progress', 'waiting for 1 of 2 VMs: w-1 (booted)', 4),
        ('end', 'all 2 VMs ready', True)]
    assert line.pending == {}


def test_a_progress_line_without_a_sink_writes_nothing_and_a_quick_run_no_end_line(monkeypatch):
    monkeypatch.delenv('PROXTALOS_PROGRESS_FILE', raising=False)
    quiet = _fanout.ItemsLine(['w-1'])
    assert quiet.recorder.path is None
    quiet.sink_for('w-1').update('not yet', 0.1, 1)
    quiet.finish(False, 'failed')
    sink = RecordingSink()
    quick = _fanout.ItemsLine(['w-1'], recorder=sink)
    quick.done('w-1')
    quick.finish(True, 'all 1 nodes passed')
    assert sink.lines == []


def test_the_progress_line_clips_a_long_observation():
    sink = RecordingSink()
    line = _fanout.ItemsLine(['w-1'], recorder=sink)
    line.note('w-1', 'x' * 500)
    assert len(sink.lines[0][1]) < 220 and sink.lines[0][1].endswith('...)')


def test_the_progress_line_goes_to_the_progress_file(tmp_path, monkeypatch):
    path = tmp_path / 'progress.jsonl'
    monkeypatch.setenv('PROXTALOS_PROGRESS_FILE', str(path))
    line = _fanout.ItemsLine(['w-1'])
    line.sink_for('w-1').update('kubelet is Waiting', 0.1, 1)
    line.done('w-1')
    line.finish(True, 'all 1 nodes passed')
    written = [json.loads(text) for text in path.read_text().splitlines()]
    assert [(entry['event'], entry['summary']) for entry in written] == [
        ('progress', 'waiting for 1 of 1 nodes: w-1 (kubelet is Waiting)'), ('end', 'all 1 nodes passed')]
    assert oct(path.stat().st_mode & 0o777) == '0o600'
