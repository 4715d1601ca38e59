"""talos_node_diagnosis: the classification of a service from ServiceList answers, and the module against
the lab's simulated Talos nodes (lab.talos.testing.FleetHarness: real grpclib servers, mutual TLS, the
talos-kubelet-volume fault)."""
import copy

import pytest
import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client
from ansible_collections.proxtalos.cluster.plugins.modules import talos_node_diagnosis as module
from lab.talos import testing

from talos_module_helpers import assert_no_secret, run_module

ENDPOINT = 'https://127.0.0.10:6443'
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

class FakeSession(object):
    """Answers ServiceList from a script: a list of service lists or exceptions, one per call (the last repeats)."""

    name = NODE

    def __init__(self, answers):
        self.answers = list(answers)
        self.calls = 0

    def call(self, method):
        assert method == 'service_list'
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if isinstance(answer, Exception):
            raise answer
        return copy.deepcopy(answer)


class FakeClock(object):
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def params(**overrides):
    base = dict(node='10.5.0.21', port=50000, api_timeout=5.0, service='kubelet', wait_for='running', events=5,
                wait=True, wait_timeout=30.0, wait_sleep=5.0, talosconfig=None, talosconfig_content=None, context=None)
    base.update(overrides)
    return base


def run_with(monkeypatch, answers, **overrides):
    fake = FakeSession(answers)
    monkeypatch.setattr(module.session, 'NodeSession', lambda *args, **kwargs: _Named(fake))
    clock = FakeClock()
    result, failure = module.run(params(**overrides), credentials=object(), clock=clock, sleep=clock.sleep)
    return result, failure, fake


class _Named(object):
    """A NodeSession stand-in around a FakeSession."""

    def __init__(self, fake):
        self.fake = fake
        self.name = fake.name

    def require_credentials(self, why):
        del why

    def call(self, method):
        return self.fake.call(method)


def test_waiting_follows_a_reboot_until_kubelet_runs_and_records_each_change(monkeypatch):
    from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors
    down = errors.TalosTransientError('connection refused', node=NODE)
    answers = [[service('kubelet', STUCK)], down, down, [service('kubelet', BOOTING)], [service('kubelet', RUNNING, healthy=True)]]
    result, failure, fake = run_with(monkeypatch, answers)
    assert failure is None
    assert result['classification'] == 'running' and result['attempts'] == 5 and fake.calls == 5
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
    assert failure is None and fake.calls == 1 and result['classification'] == 'waiting_on_volume'


def test_a_negative_event_count_names_the_option(monkeypatch):
    with pytest.raises(module.ValidationError) as caught:
        run_with(monkeypatch, [[]], events=-1)
    assert str(caught.value) == 'events: must be zero or more, got -1'


# ------------------------------------------------------------------------------ against the lab's Talos nodes

@pytest.fixture(scope='module')
def fleet():
    harness = testing.FleetHarness()
    secrets = testing.ClusterSecrets()
    control_plane = harness.start('cp-1')
    harness.wait(lambda: control_plane.mode == 'maintenance', what='cp-1 in maintenance mode')
    with client.TalosClient(control_plane.address, insecure=True, timeout=5) as talos:
        talos.apply_configuration(testing.render_config(secrets, 'controlplane', ENDPOINT))
    harness.wait(lambda: control_plane.mode == 'configured', what='cp-1 configured')
    harness.secrets = secrets
    harness.talosconfig = secrets.talosconfig('lab')
    yield harness
    harness.close()


def configure_worker(fleet, name, stuck):
    node = fleet.start(name)
    fleet.wait(lambda: node.mode == 'maintenance', what='%s in maintenance mode' % name)
    if stuck:
        fleet.fault('talos-kubelet-volume', name, p=0.0)
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        talos.apply_configuration(testing.render_config(fleet.secrets, 'worker', ENDPOINT))
    fleet.wait(lambda: node.mode == 'configured' and node.service('kubelet') is not None
               and node.service('kubelet').state in ('Waiting', 'Running'), what='%s configured' % name)
    return node


def module_args(fleet, node, **extra):
    args = dict(node=node.address, talosconfig_content=yaml.safe_dump(fleet.talosconfig), wait_timeout=20, wait_sleep=0.05)
    args.update(extra)
    return args


def test_the_module_names_the_volume_a_stuck_kubelet_waits_for_and_hides_the_client_key(fleet, capsys):
    node = configure_worker(fleet, 'w-stuck', stuck=True)
    fleet.wait(lambda: node.service('kubelet').state == 'Waiting' and 'volume' in node.service('kubelet').last_message,
               what='kubelet waiting for its volume')
    result, out = run_module(module, capsys, **module_args(fleet, node))
    assert result.get('failed') is not True and result['changed'] is False
    assert result['classification'] == 'waiting_on_volume' and result['volume'] == '/var/lib/kubelet'
    assert result['node'] == '%s:50000' % node.address
    assert 'Waiting for volume "/var/lib/kubelet" to be mounted' in result['evidence']
    key = fleet.talosconfig['contexts']['lab']['key']
    assert_no_secret(out, [key])

    failed, dummy = run_module(module, capsys, **module_args(fleet, node, wait_for='running', wait_timeout=0.3))
    assert failed['failed'] is True and failed['classification'] == 'waiting_on_volume'
    assert failed['msg'].startswith('talos node %s:50000: kubelet did not run within 0s; last seen: kubelet is Waiting: '
                                    'Waiting for volume "/var/lib/kubelet" to be mounted' % node.address)


def test_after_the_fault_clears_the_wait_ends_with_kubelet_running(fleet, capsys):
    node = configure_worker(fleet, 'w-heal', stuck=True)
    fleet.clear('talos-kubelet-volume', 'w-heal')
    result, dummy = run_module(module, capsys, **module_args(fleet, node, wait_for='running'))
    assert result.get('failed') is not True
    assert result['classification'] == 'running' and result['running'] is True


def test_a_healthy_worker_is_running_at_once_and_a_powered_off_one_is_unreachable(fleet, capsys):
    node = configure_worker(fleet, 'w-ok', stuck=False)
    result, dummy = run_module(module, capsys, **module_args(fleet, node, wait_for='running'))
    assert result['classification'] == 'running'
    fleet.stop('w-ok')
    gone, dummy = run_module(module, capsys, **module_args(fleet, node, api_timeout=1.0))
    assert gone.get('failed') is not True and gone['classification'] == 'unreachable' and gone['attempts'] == 1
    assert gone['evidence'].startswith('talos node %s:50000: does not answer' % node.address)


def test_a_node_in_maintenance_mode_is_reported_as_such(fleet, capsys):
    node = fleet.start('w-new')
    fleet.wait(lambda: node.mode == 'maintenance', what='w-new in maintenance mode')
    result, dummy = run_module(module, capsys, **module_args(fleet, node))
    assert result['classification'] == 'maintenance'
    assert 'answers only in maintenance mode' in result['evidence']


def test_without_a_talosconfig_the_module_says_it_is_required(fleet, capsys):
    result, dummy = run_module(module, capsys, node='127.0.0.1')
    assert result['failed'] is True and result['msg'].startswith('talosconfig: is required')
