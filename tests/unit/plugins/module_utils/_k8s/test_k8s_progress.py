"""Progress: the timeline in the result and the JSON-lines file a callback can follow."""
import json
import os
import stat

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import predicates
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import progress
from ansible_collections.proxtalos.cluster.tests.helpers import FakeClock


def verdict(summary, ok=False):
    return predicates.Verdict(ok, summary)


def test_timeline_keeps_changes_only_and_the_final_entry():
    clock = FakeClock(start=50.0)
    timeline = progress.Progress('k8s_gate nodes', clock=clock)
    timeline.record(verdict('nodes Ready 4/6: w-2 NetworkPluginNotReady'), 0.0, 1)
    timeline.record(verdict('nodes Ready 4/6: w-2 NetworkPluginNotReady'), 2.0, 2)
    timeline.record('TransientApiError: refused', 4.0, 3)
    timeline.record(verdict('nodes Ready 5/6: w-3 NetworkPluginNotReady'), 6.0, 4)
    timeline.finish(verdict('nodes Ready 6/6', True), 8.0, 5, True)
    assert timeline.timeline == [
        {'elapsed': 0.0, 'attempt': 1, 'summary': 'nodes Ready 4/6: w-2 NetworkPluginNotReady'},
        {'elapsed': 4.0, 'attempt': 3, 'summary': 'TransientApiError: refused'},
        {'elapsed': 6.0, 'attempt': 4, 'summary': 'nodes Ready 5/6: w-3 NetworkPluginNotReady'},
        {'elapsed': 8.0, 'attempt': 5, 'summary': 'nodes Ready 6/6'},
    ]


def test_timeout_does_not_duplicate_the_last_entry():
    timeline = progress.Progress('x', clock=FakeClock(start=50.0))
    timeline.record(verdict('a'), 0.0, 1)
    timeline.finish(verdict('a'), 0.0, 1, False)
    assert len(timeline.timeline) == 1


def test_timeline_is_capped_keeping_the_first_entry():
    timeline = progress.Progress('x', max_entries=3, clock=FakeClock(start=50.0))
    for attempt in range(1, 7):
        timeline.record(verdict('state %d' % attempt), attempt, attempt)
    assert [entry['summary'] for entry in timeline.timeline] == ['state 1', 'state 5', 'state 6']
    assert timeline.dropped == 3


def test_progress_file_lines_with_heartbeat(tmp_path):
    clock = FakeClock(start=50.0)
    path = tmp_path / 'progress.jsonl'
    timeline = progress.Progress('k8s_gate DaemonSet kube-system/cilium', str(path), heartbeat=30.0, clock=clock,
                                 wall_clock=lambda: 1764064800.0)
    timeline.record(verdict('Ready on 2/3'), 0.0, 1)
    clock.now += 10
    timeline.record(verdict('Ready on 2/3'), 10.0, 6)   # no change, no heartbeat due: nothing written
    clock.now += 25
    timeline.record(verdict('Ready on 2/3'), 35.0, 18)  # still no change, 35 s since the last line: heartbeat
    timeline.finish(verdict('Ready on 3/3', True), 36.0, 19, True)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line['event'], line['attempt'], line['summary']) for line in lines] == [
        ('start', 0, 'waiting for k8s_gate DaemonSet kube-system/cilium'),
        ('progress', 1, 'Ready on 2/3'),
        ('progress', 18, 'Ready on 2/3'),
        ('end', 19, 'Ready on 3/3'),
    ]
    assert lines[-1]['ok'] is True
    assert lines[0]['time'] == '2025-11-25T10:00:00+00:00'
    assert all(line['label'] == 'k8s_gate DaemonSet kube-system/cilium' for line in lines)
    assert stat.S_IMODE(os.stat(str(path)).st_mode) == 0o600


def test_progress_file_in_a_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(_errors.ValidationError) as caught:
        progress.Progress('x', str(tmp_path / 'nope' / 'progress.jsonl'))
    assert caught.value.field == 'progress_file'
