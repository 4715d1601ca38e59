"""talos_node_diagnosis: the classification of a service from ServiceList answers, and the module over a fake
network (the module against the lab's Talos nodes is tests/lab/test_talos_node_diagnosis_lab.py)."""
import asyncio
import copy
import json

import pytest

from ansible_collections.proxtalos.cluster.plugins.modules import talos_node_diagnosis as module
from ansible_collections.proxtalos.cluster.tests.helpers import FakeClock, run_module

NODE = '10.5.0.21:50000'


def service(service_id, events, healthy=None, health_message=''):
    last = events[-1][0] if events else 'Unknown'
    item = {'id': service_id, 'state': last,
            'health': {'unknown': healthy is None, 'healthy': bool(healthy), 'last_message': health_message},
            'events': [{'state': state, 'msg': msg, 'ts': '2026-11-25T21:14:%02dZ' % index}
                       for index, (state, msg) in enumerate(events)]}
    item['healthy'] = last == 'Running' and bool(healthy)
    return item


BOOTING = [('Waiting', 'Waiting for service "cri" to be "up", time sync, network')]
STUCK = BOOTING + [('Waiting', 'Waiting for volume "/var/lib/kubelet" to be mounted')]
RUNNING = BOOTING + [('Preparing', 'Running pre state'), ('Preparing', 'Creating service runner'),
                     ('Running', 'Started task kubelet (PID 2601) for container kubelet')]


# ------------------------------------------------------------------------------ classify (pure)

def test_a_kubelet_waiting_for_its_volume_is_the_remediable_class_with_the_volume_and_its_event():
    found = module.classify([service('apid', [('Running', 'Started')], True), service('kubelet', STUCK)], 'kubelet', NODE)
    assert found['classification'] == 'waiting_on_volume'
    assert found['remediable'] is True and found['running'] is False
    assert found['volume'] == '/var/lib/kubelet'
    assert found['state'] == 'Waiting'
    assert found['last_event'] == {'state': 'Waiting', 'msg': 'Waiting for volume "/var/lib/kubelet" to be mounted',
                                   'ts': '2026-11-25T21:14:01Z'}
    assert found['evidence'] == ('talos node 10.5.0.21:50000: kubelet is Waiting: Waiting for volume "/var/lib/kubelet" '
                                 'to be mounted (since 2026-11-25T21:14:01Z)')


@pytest.mark.parametrize('message, volume', [
    ('Waiting for volume "EPHEMERAL" to be mounted', 'EPHEMERAL'),
    ('waiting for volumes /var/lib/kubelet, /var/log', '/var/lib/kubelet'),
])
def test_the_volume_is_read_from_the_wordings_talos_uses(message, volume):
    found = module.classify([service('kubelet', [('Waiting', message)])], 'kubelet', NODE)
    assert (found['classification'], found['volume']) == ('waiting_on_volume', volume)


def test_running_and_healthy_is_running():
    found = module.classify([service('kubelet', RUNNING, healthy=True)], 'kubelet', NODE)
    assert (found['classification'], found['running'], found['remediable']) == ('running', True, False)
    assert found['evidence'].endswith('kubelet is Running and healthy')


def test_waiting_for_something_else_is_not_remediable():
    found = module.classify([service('kubelet', BOOTING)], 'kubelet', NODE)
    assert found['classification'] == 'not_running' and found['remediable'] is False
    assert 'kubelet is Waiting: Waiting for service "cri" to be "up"' in found['evidence']


def test_running_but_failing_its_health_check_says_so():
    found = module.classify([service('kubelet', RUNNING, healthy=False, health_message='connection refused')], 'kubelet', NODE)
    assert found['classification'] == 'not_running'
    assert 'kubelet is Running but not healthy (connection refused): Started task kubelet' in found['evidence']


def test_a_service_the_node_does_not_list_is_missing_and_the_listed_ones_are_named():
    found = module.classify([service('apid', [('Running', 'x')], True), service('etcd', [('Running', 'x')], True)],
                            'kubelet', NODE)
    assert found['classification'] == 'missing'
    assert found['evidence'] == 'talos node 10.5.0.21:50000: kubelet is not among its services (apid, etcd)'


def test_only_the_newest_events_are_kept():
    found = module.classify([service('kubelet', RUNNING, healthy=True)], 'kubelet', NODE, keep_events=2)
    assert [event['msg'] for event in found['events']] == ['Creating service runner',
                                                           'Started task kubelet (PID 2601) for container kubelet']
    assert module.classify([service('kubelet', RUNNING, healthy=True)], 'kubelet', NODE, keep_events=0)['events'] == []


# ------------------------------------------------------------------------------ run() with a fake node

class FakeNodes(object):
    """Answers ServiceList per node address from a script: a list of service lists or exceptions, one per read (the
    last repeats). Stands in for read_service_list, the module's one network seam."""

    def __init__(self, answers_by_address):
        self.answers = dict((address, list(answers)) for address, answers in answers_by_address.items())
        self.calls = dict((address, 0) for address in answers_by_address)
        self.in_flight = 0
        self.most_in_flight = 0

    async def read_service_list(self, node_session):
        address = node_session.host
        answers = self.answers[address]
        answer = answers[min(self.calls[address], len(answers) - 1)]
        self.calls[address] += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)   # hand the loop to the other reads of the round, as a network read does
        finally:
            self.in_flight -= 1
        if isinstance(answer, Exception):
            raise answer
        return copy.deepcopy(answer)


def params(**overrides):
    base = dict(node='10.5.0.21', nodes=None, port=50000, api_timeout=5.0, service='kubelet', wait_for='running', events=5,
                wait=True, wait_timeout=30.0, wait_sleep=5.0, talosconfig=None, talosconfig_content=None, context=None)
    base.update(overrides)
    return base


def run_with(monkeypatch, answers, check_mode=False, **overrides):
    """run() over a fake network: answers is the script of 10.5.0.21, or {address: script} for several nodes."""
    fake = FakeNodes(answers if isinstance(answers, dict) else {'10.5.0.21': answers})
    monkeypatch.setattr(module, 'read_service_list', fake.read_service_list)
    clock = FakeClock()
    result, failure = module.diagnosis(params(**overrides), credentials=object(), check_mode=check_mode, clock=clock, sleep=clock.sleep)
    fake.calls_of_one = fake.calls.get('10.5.0.21')
    return result, failure, fake


def test_waiting_follows_a_reboot_until_kubelet_runs_and_records_each_change(monkeypatch):
    from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors
    down = errors.TalosTransientError('connection refused', node=NODE)
    answers = [[service('kubelet', STUCK)], down, down, [service('kubelet', BOOTING)], [service('kubelet', RUNNING, healthy=True)]]
    result, failure, fake = run_with(monkeypatch, answers)
    assert failure is None
    assert result['classification'] == 'running' and result['attempts'] == 5 and fake.calls_of_one == 5
    assert [entry['classification'] for entry in result['timeline']] == ['waiting_on_volume', 'unreachable', 'not_running', 'running']
    assert result['timeline'][1]['evidence'].startswith('talos node 10.5.0.21:50000: does not answer: ')
    assert result['elapsed'] == 20.0 and result['changed'] is False


def test_a_timeout_fails_with_the_last_evidence_and_keeps_the_classification(monkeypatch):
    result, failure, dummy = run_with(monkeypatch, [[service('kubelet', STUCK)]], wait_timeout=12.0)
    assert failure == ('talos node 10.5.0.21:50000: kubelet did not run within 12s; last seen: kubelet is Waiting: '
                       'Waiting for volume "/var/lib/kubelet" to be mounted (since 2026-11-25T21:14:01Z)')
    assert result['classification'] == 'waiting_on_volume' and result['remediable'] is True
    assert result['attempts'] == 4 and result['elapsed'] == 12.0
    assert len(result['timeline']) == 1


def test_wait_for_none_reads_once_and_never_fails(monkeypatch):
    result, failure, fake = run_with(monkeypatch, [[service('kubelet', STUCK)]], wait_for='none', wait_timeout=300.0)
    assert failure is None and fake.calls_of_one == 1 and result['classification'] == 'waiting_on_volume'


def test_a_negative_event_count_names_the_option(monkeypatch):
    with pytest.raises(module.ValidationError) as caught:
        run_with(monkeypatch, [[]], events=-1)
    assert str(caught.value) == 'events: must be zero or more, got -1'


# ------------------------------------------------------------------------------ the multi-node form (nodes)

W1, W2, W3 = '10.5.0.21', '10.5.0.22', '10.5.0.23'
WORKERS = [{'name': 'w-1', 'address': W1}, {'name': 'w-2', 'address': W2}, {'name': 'w-3', 'address': W3}]


def multi(monkeypatch, answers, **overrides):
    overrides.setdefault('nodes', WORKERS)
    return run_with(monkeypatch, answers, node=None, **overrides)


def test_every_node_is_diagnosed_by_its_inventory_name_and_a_stuck_one_is_no_failure_of_the_module(monkeypatch):
    from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors
    down = errors.TalosTransientError('connection refused', node=W2 + ':50000')
    answers = {W1: [[service('kubelet', RUNNING, healthy=True)]],
               W2: [[service('kubelet', STUCK)], down, [service('kubelet', RUNNING, healthy=True)]],
               W3: [[service('kubelet', STUCK)]]}
    result, failure, fake = multi(monkeypatch, answers, wait_timeout=12.0)
    assert failure is None and result['changed'] is False
    assert sorted(result['nodes']) == ['w-1', 'w-2', 'w-3']
    first, second, third = (result['nodes'][name] for name in ('w-1', 'w-2', 'w-3'))
    # a running node is read once and left alone; the others are read each round until they run or time runs out
    assert fake.calls == {W1: 1, W2: 3, W3: 4}
    assert (first['classification'], first['attempts'], first['elapsed']) == ('running', 1, 0.0)
    assert (second['classification'], second['running'], second['attempts'], second['elapsed']) == ('running', True, 3, 10.0)
    assert [entry['classification'] for entry in second['timeline']] == ['waiting_on_volume', 'unreachable', 'running']
    assert (third['classification'], third['remediable'], third['volume']) == ('waiting_on_volume', True, '/var/lib/kubelet')
    assert (third['attempts'], third['elapsed']) == (4, 12.0)
    # each node's part has the single form's keys, plus its inventory name
    assert third['name'] == 'w-3' and third['node'] == W3 + ':50000' and third['service'] == 'kubelet'
    assert third['evidence'] == ('talos node 10.5.0.23:50000: kubelet is Waiting: Waiting for volume "/var/lib/kubelet" '
                                 'to be mounted (since 2026-11-25T21:14:01Z)')
    assert (result['nodes_running'], result['nodes_not_running'], result['nodes_remediable']) == (['w-1', 'w-2'], ['w-3'], ['w-3'])
    assert result['summary'] == ('kubelet running on 2 of 3 nodes; w-3 (10.5.0.23:50000): kubelet did not run within 12s; '
                                 'last seen: kubelet is Waiting: Waiting for volume "/var/lib/kubelet" to be mounted '
                                 '(since 2026-11-25T21:14:01Z)')
    assert (result['attempts'], result['elapsed']) == (4, 12.0)


def test_a_round_reads_every_pending_node_at_the_same_time(monkeypatch):
    answers = {W1: [[service('kubelet', STUCK)]], W2: [[service('kubelet', STUCK)]], W3: [[service('kubelet', BOOTING)]]}
    result, failure, fake = multi(monkeypatch, answers, wait_timeout=0.0)
    assert failure is None and fake.calls == {W1: 1, W2: 1, W3: 1}
    assert fake.most_in_flight == 3, 'the three reads of the round were not in flight together'
    assert result['nodes_not_running'] == ['w-1', 'w-2', 'w-3'] and result['nodes_remediable'] == ['w-1', 'w-2']


def test_wait_for_none_and_check_mode_read_each_node_once(monkeypatch):
    answers = {W1: [[service('kubelet', STUCK)], [service('kubelet', RUNNING, healthy=True)]],
               W2: [[service('kubelet', RUNNING, healthy=True)]], W3: [[service('kubelet', RUNNING, healthy=True)]]}
    result, failure, fake = multi(monkeypatch, answers, wait_for='none', wait_timeout=300.0)
    assert failure is None and fake.calls == {W1: 1, W2: 1, W3: 1}
    assert result['summary'].startswith('kubelet running on 2 of 3 nodes; w-1 (10.5.0.21:50000): kubelet is Waiting: '
                                        'Waiting for volume')
    checked, failure, fake = multi(monkeypatch, answers, check_mode=True, wait_timeout=300.0)
    assert failure is None and fake.calls == {W1: 1, W2: 1, W3: 1} and checked['nodes_remediable'] == ['w-1']


def test_a_node_that_cannot_be_diagnosed_fails_the_module_naming_it_and_the_others_are_still_reported(monkeypatch):
    from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors
    refused = errors.TalosTlsError(W2 + ':50000', 'client_certificate_rejected', method='/machine.MachineService/ServiceList')
    answers = {W1: [[service('kubelet', STUCK)]], W2: [refused], W3: [[service('kubelet', RUNNING, healthy=True)]]}
    result, failure, fake = multi(monkeypatch, answers, wait_timeout=30.0)
    assert failure == 'cannot diagnose kubelet on w-2 (10.5.0.22:50000): w-2: %s' % refused
    assert fake.calls == {W1: 1, W2: 1, W3: 1}, 'the wait ends at once: the module fails whatever the others do'
    assert result['nodes']['w-2']['error'] == str(refused) and 'classification' not in result['nodes']['w-2']
    assert result['nodes']['w-1']['classification'] == 'waiting_on_volume' and result['nodes']['w-3']['running'] is True
    # the stuck node did not time out: the summary gives its evidence, not "did not run within"
    assert 'did not run within' not in result['summary'] and 'w-1 (10.5.0.21:50000): kubelet is Waiting: ' in result['summary']


def test_a_single_node_that_cannot_be_diagnosed_raises_its_error_as_before(monkeypatch):
    from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors
    refused = errors.TalosTlsError(W1 + ':50000', 'client_certificate_rejected')
    with pytest.raises(errors.TalosTlsError) as caught:
        run_with(monkeypatch, [refused])
    assert caught.value is refused


@pytest.mark.parametrize('nodes, field, reason', [
    ([], 'nodes', 'must list at least one node'),
    ([{'name': 'w-1', 'address': W1}, {'name': 'w-1', 'address': W2}], 'nodes[1].name', 'w-1 is listed twice (also nodes[0])'),
    ([{'name': 'w-1', 'address': ''}], 'nodes[0].address', 'the address of w-1 is required'),
    ([{'name': '', 'address': W1}], 'nodes[0].name', 'the inventory host name is required'),
])
def test_bad_node_lists_name_the_field_and_why(monkeypatch, nodes, field, reason):
    with pytest.raises(module.ValidationError) as caught:
        multi(monkeypatch, {W1: [[]]}, nodes=nodes)
    assert str(caught.value) == '%s: %s' % (field, reason)


def test_node_and_nodes_together_are_refused(monkeypatch):
    with pytest.raises(module.ValidationError) as caught:
        run_with(monkeypatch, {W1: [[]]}, nodes=WORKERS)
    assert str(caught.value) == 'nodes: cannot be combined with node (one node, or the list)'


def test_the_module_refuses_node_with_nodes_and_an_entry_without_address(capsys):
    both, dummy = run_module(module, capsys, node=W1, nodes=WORKERS)
    assert both['failed'] is True and 'mutually exclusive' in both['msg'] and 'node|nodes' in both['msg']
    partial, dummy = run_module(module, capsys, nodes=[{'name': 'w-1'}])
    assert partial['failed'] is True and 'address' in partial['msg'] and 'nodes' in partial['msg']
    neither, dummy = run_module(module, capsys)
    assert neither['failed'] is True and 'one of the following is required: node, nodes' in neither['msg']


def test_the_live_progress_of_a_multi_node_wait_names_the_nodes_still_waiting(monkeypatch, tmp_path):
    progress = tmp_path / 'progress.jsonl'
    monkeypatch.setenv('PROXTALOS_PROGRESS_FILE', str(progress))
    answers = {W1: [[service('kubelet', RUNNING, healthy=True)]],
               W2: [[service('kubelet', STUCK)], [service('kubelet', RUNNING, healthy=True)]],
               W3: [[service('kubelet', RUNNING, healthy=True)]]}
    result, failure, dummy = multi(monkeypatch, answers)
    assert failure is None and result['nodes_running'] == ['w-1', 'w-2', 'w-3']
    lines = [json.loads(line) for line in progress.read_text().splitlines()]
    assert [line['event'] for line in lines] == ['progress', 'end']
    assert lines[0]['summary'] == ('kubelet running on 2 of 3 nodes; not yet: w-2 (10.5.0.22:50000): kubelet is Waiting: '
                                   'Waiting for volume "/var/lib/kubelet" to be mounted (since 2026-11-25T21:14:01Z)')
    assert lines[1]['ok'] is True and lines[1]['summary'] == 'kubelet running on 3 of 3 nodes'


def test_without_a_talosconfig_the_module_says_it_is_required(capsys):
    result, dummy = run_module(module, capsys, node='127.0.0.1')
    assert result['failed'] is True and result['msg'].startswith('talosconfig: is required')
