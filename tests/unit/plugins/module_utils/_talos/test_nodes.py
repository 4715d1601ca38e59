"""_talos/nodes.py: the nodes option checked, work run on every node at once, one progress line for many nodes."""
import threading

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import nodes, session


class RecordingSink(object):
    def __init__(self):
        self.lines = []

    def update(self, observation, elapsed, attempts):
        self.lines.append(('progress', observation, attempts))

    def end(self, observation, elapsed, attempts, ok):
        self.lines.append(('end', observation, ok))


@pytest.mark.parametrize('items, field, reason', [
    ([], 'nodes', 'is empty'),
    ([{'name': 'w-1', 'address': '10.5.0.21'}, {'name': 'w-1', 'address': '10.5.0.22'}], 'nodes[1].name', 'listed twice'),
    ([{'name': 'w-1', 'address': ''}], 'nodes[0].address', 'address of node w-1'),
    ([{'name': '', 'address': '10.5.0.21'}], 'nodes[0].name', 'inventory host'),
])
def test_check_targets_names_the_field(items, field, reason):
    with pytest.raises(ValidationError) as refused:
        nodes.check_targets(items)
    assert refused.value.field == field and reason in refused.value.reason


def test_run_each_runs_every_item_at_once_and_keeps_their_order():
    barrier = threading.Barrier(3, timeout=5)   # breaks if the three are not inside work() together

    def work(item):
        barrier.wait()
        if item == 'b':
            raise ProxtalosError('b failed', node='b')
        return item.upper()
    outcomes = nodes.run_each(['a', 'b', 'c'], work)
    assert [(item, value, str(error) if error else None) for item, value, error in outcomes] == [
        ('a', 'A', None), ('b', None, 'b failed'), ('c', 'C', None)]


def test_run_each_raises_a_bug_again_after_every_thread_ended():
    ended = []

    def work(item):
        if item == 1:
            raise KeyError('a bug')
        ended.append(item)
        return item
    with pytest.raises(KeyError):
        nodes.run_each([0, 1, 2], work)
    assert sorted(ended) == [0, 2]


def test_failure_line_names_host_and_address_once():
    node_session = session.NodeSession('10.5.0.21', label='w-1')
    assert node_session.display == 'w-1 (10.5.0.21:50000)'
    error = ProxtalosError('talos node w-1 (10.5.0.21:50000): gave up after 3s waiting for the Talos API')
    assert nodes.failure_line('w-1', node_session, error) == 'w-1 (10.5.0.21:50000): gave up after 3s waiting for the Talos API'
    plain = ProxtalosError('talos node 10.5.0.21:50000: ServiceList failed: PermissionDenied')
    assert nodes.failure_line('w-1', node_session, plain) == 'w-1 (10.5.0.21:50000): ServiceList failed: PermissionDenied'
    other = ProxtalosError('talosconfig: is required')
    assert nodes.failure_line('w-1', node_session, other) == 'w-1 (10.5.0.21:50000): talosconfig: is required'


def test_progress_names_the_nodes_still_waited_for():
    sink = RecordingSink()
    progress = nodes.NodesProgress(['cp-1', 'w-1', 'w-2'], sink=sink)
    progress.done('cp-1')
    assert sink.lines == []   # nothing to say while no node was seen not ready
    progress.sink_for('w-2').update('kubelet is Waiting', 0.1, 1)
    progress.sink_for('w-2').end('kubelet is Running', 0.2, 2, True)   # one wait of w-2 ended; w-2 is not done yet
    progress.done('w-1')
    progress.done('w-2')
    progress.finish(True, 'all 3 nodes passed')
    assert sink.lines == [
        ('progress', 'waiting for 2 of 3 nodes: w-1, w-2 (kubelet is Waiting)', 1),
        ('progress', 'waiting for 1 of 3 nodes: w-2 (kubelet is Waiting)', 2),
        ('end', 'all 3 nodes passed', True)]


def test_progress_without_a_sink_writes_nothing_and_a_quick_run_no_end_line(monkeypatch):
    monkeypatch.delenv('PROXTALOS_PROGRESS_FILE', raising=False)
    quiet = nodes.NodesProgress(['w-1'])
    quiet.sink_for('w-1').update('not yet', 0.1, 1)
    quiet.finish(False, 'failed')
    sink = RecordingSink()
    quick = nodes.NodesProgress(['w-1'], sink=sink)
    quick.done('w-1')
    quick.finish(True, 'all 1 nodes passed')
    assert sink.lines == []


def test_progress_clips_a_long_observation():
    sink = RecordingSink()
    progress = nodes.NodesProgress(['w-1'], sink=sink)
    progress.note('w-1', 'x' * 500)
    assert len(sink.lines[0][1]) < 220 and sink.lines[0][1].endswith('...)')


def test_nodes_run_keeps_each_nodes_session_result_elapsed_span_and_progress():
    targets = [{'name': 'cp-1', 'address': '10.5.0.11'}, {'name': 'w-1', 'address': '10.5.0.21'},
               {'name': 'w-2', 'address': '10.5.0.22'}]
    run = nodes.NodesRun(targets, lambda item: 'session of %s' % item['address'], lambda: {'changed': False},
                         _wait.Deadline(30))
    seen = {}

    def work(item, node_session, result, sink):
        seen[item['name']] = (node_session, sink.name)
        assert item['name'] in run.progress.pending   # still waited for while its work runs
        if item['name'] == 'w-1':
            raise ProxtalosError('talos node w-1: no answer', node='10.5.0.21:50000')
        result['changed'] = True
        return item['name'].upper()

    outcomes = run.run(work)
    assert [(item['name'], value, str(error) if error else None) for item, value, error, _span in outcomes] == [
        ('cp-1', 'CP-1', None), ('w-1', None, 'talos node w-1: no answer'), ('w-2', 'W-2', None)]
    assert seen == {'cp-1': ('session of 10.5.0.11', 'cp-1'), 'w-1': ('session of 10.5.0.21', 'w-1'),
                    'w-2': ('session of 10.5.0.22', 'w-2')}
    assert run.progress.pending == {}
    for item, _value, _error, (started_at, ended_at) in outcomes:
        assert started_at <= ended_at and run.results[item['name']]['elapsed'] >= 0
    assert [run.results[name]['changed'] for name in ('cp-1', 'w-1', 'w-2')] == [True, False, True]
    # the summary follows the targets' order, whatever the order of the failures given
    assert run.failure_summary({'w-2': 'w-2 (b): late', 'cp-1': 'cp-1 (a): down'}) == \
        '2 of 3 nodes failed: cp-1 (a): down; w-2 (b): late'
