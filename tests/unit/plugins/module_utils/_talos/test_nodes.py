"""_talos/nodes.py: the nodes option checked, a failing node named once, a NodesRun over _fanout.run_each."""
import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _fanout, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import nodes, session


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


def test_failure_line_names_host_and_address_once():
    node_session = session.NodeSession('10.5.0.21', label='w-1')
    assert node_session.display == 'w-1 (10.5.0.21:50000)'
    error = ProxtalosError('talos node w-1 (10.5.0.21:50000): gave up after 3s waiting for the Talos API')
    assert nodes.failure_line('w-1', node_session, error) == 'w-1 (10.5.0.21:50000): gave up after 3s waiting for the Talos API'
    plain = ProxtalosError('talos node 10.5.0.21:50000: ServiceList failed: PermissionDenied')
    assert nodes.failure_line('w-1', node_session, plain) == 'w-1 (10.5.0.21:50000): ServiceList failed: PermissionDenied'
    other = ProxtalosError('talosconfig: is required')
    assert nodes.failure_line('w-1', node_session, other) == 'w-1 (10.5.0.21:50000): talosconfig: is required'


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


def test_nodes_run_names_a_node_not_started_before_the_deadline(monkeypatch):
    monkeypatch.setattr(nodes, 'MAX_NODES_AT_ONCE', 1)
    clock = {'now': 0.0}
    deadline = _wait.Deadline(10, clock=lambda: clock['now'])
    targets = [{'name': 'cp-1', 'address': '10.5.0.11'}, {'name': 'w-1', 'address': '10.5.0.21'}]
    run = nodes.NodesRun(targets, lambda item: session.NodeSession(item['address'], label=item['name']),
                         lambda: {'changed': False}, deadline)

    def work(item, node_session, result, sink):
        clock['now'] = 11.0      # cp-1's work outlives the deadline: w-1's turn comes after it
        return 'ok'

    outcomes = run.run(work)
    assert [(item['name'], value) for item, value, _error, _span in outcomes] == [('cp-1', 'ok'), ('w-1', None)]
    error = outcomes[1][2]
    assert isinstance(error, _fanout.NotStarted) and error.item == 'w-1'
    assert nodes.failure_line('w-1', run.sessions['w-1'], error) == (
        'w-1 (10.5.0.21:50000): not started: the deadline of 10 s passed while it waited for a free worker')
    assert run.results['w-1']['elapsed'] == 11.0 and run.progress.pending == {}
