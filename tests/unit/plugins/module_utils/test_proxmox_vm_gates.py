"""_proxmox_vm_info.probe_vms: several VMs in one run - concurrency, its bound, one deadline, who failed and why.

The probes here are stand-ins for VmProbe (make_probe is the seam); the module's tests run the real probe
against fakepve.
"""
import json
import threading

import pytest
from proxmoxer.core import ResourceException

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors, _proxmox, _proxmox_vm_info, _wait
from ansible_collections.proxtalos.cluster.tests.helpers import FakeClock


class FakeClient(object):
    """What probe_vms asks of the client directly: the VM list, once a round."""

    def __init__(self):
        self.lists = 0

    def get(self, path, what, subject=None, **params):
        assert path == 'cluster/resources' and params == {'type': 'vm'}
        self.lists += 1
        return []


def reading(vmid, status='running', addresses=(), agent_error=None, exists=True):
    return dict(exists=exists, vmid=vmid, node='pve1', name='vm-%s' % vmid, status=status if exists else 'absent',
                lock=None, agent_addresses=[{'interface': 'eth0', 'address': a, 'prefix': 24} for a in addresses],
                agent_error=agent_error, address=addresses[0] if addresses else None)


class ScriptedProbe(object):
    """Returns its readings in turn (the last one again when they run out); an exception in the list is raised."""

    def __init__(self, readings):
        self.readings = list(readings)
        self.calls = 0

    def read(self, with_agent, resources=None, retry=True):
        assert with_agent and resources == [] and retry is False
        item = self.readings[min(self.calls, len(self.readings) - 1)]
        self.calls += 1
        if isinstance(item, Exception):
            raise item
        return item


def vms(count):
    return [dict(name='node-%d' % i, vmid=1000 + i, node='pve1', expected_address=None) for i in range(count)]


def params(wait_for='address', timeout=10, sleep=1.0):
    return dict(wait_for=wait_for, wait=True, wait_timeout=timeout, wait_sleep=sleep)


def test_every_vm_is_probed_at_the_same_time():
    """Each probe waits at a barrier for all the others: probed one after another, the barrier would break."""
    barrier = threading.Barrier(6, timeout=20)

    class MeetingProbe(object):
        def __init__(self, vm):
            self.vm = vm

        def read(self, with_agent, resources=None, retry=True):
            barrier.wait()
            return reading(self.vm['vmid'], addresses=('10.0.0.%d' % (self.vm['vmid'] - 1000),))

    outcome = _proxmox_vm_info.probe_vms(FakeClient(), vms(6), params(), make_probe=lambda client, vm: MeetingProbe(vm))
    assert outcome.failed == [] and outcome.workers == 6 and not barrier.broken
    assert [w.seen['address'] for w in outcome.watches] == ['10.0.0.%d' % i for i in range(6)]


def test_no_more_than_max_workers_probes_run_at_once():
    """20 VMs, a pool of 16: the first 16 probes wait until 16 are in; the most ever in at once is 16."""
    state = {'entered': 0, 'inside': 0, 'most': 0}
    condition = threading.Condition()

    class CountingProbe(object):
        def __init__(self, vm):
            self.vm = vm

        def read(self, with_agent, resources=None, retry=True):
            with condition:
                state['entered'] += 1
                state['inside'] += 1
                state['most'] = max(state['most'], state['inside'])
                condition.notify_all()
                assert condition.wait_for(lambda: state['entered'] >= 16, timeout=20), 'fewer than 16 probes ran at once'
                state['inside'] -= 1
            return reading(self.vm['vmid'], status='running')

    outcome = _proxmox_vm_info.probe_vms(FakeClient(), vms(20), params('running'), max_workers=16,
                                         make_probe=lambda client, vm: CountingProbe(vm))
    assert outcome.failed == [] and state == {'entered': 20, 'inside': 0, 'most': 16} and outcome.workers == 16


def test_one_deadline_a_vm_that_passed_is_not_probed_again_and_only_the_failing_vm_is_named():
    clock = FakeClock()
    probes = {
        1000: ScriptedProbe([reading(1000, addresses=('10.0.0.10',))]),
        1001: ScriptedProbe([reading(1001, status='stopped'), reading(1001, agent_error='QEMU guest agent is not running'),
                             reading(1001, addresses=('10.0.0.11',))]),
        1002: ScriptedProbe([reading(1002, agent_error='QEMU guest agent is not running')]),
    }
    client = FakeClient()
    outcome = _proxmox_vm_info.probe_vms(client, vms(3), params(timeout=5), clock=clock, sleep=clock.sleep,
                                         make_probe=lambda _client, vm: probes[vm['vmid']])
    # One deadline for all: 5 s at 1 s a round is 6 rounds, the first at 0 s.
    assert outcome.wait_result.ok is False and outcome.wait_result.attempts == 6 and client.lists == 6
    assert [probe.calls for probe in (probes[1000], probes[1001], probes[1002])] == [1, 3, 6]
    assert [w.name for w in outcome.failed] == ['node-2']
    ok, result, message = _proxmox_vm_info.vms_result(outcome, 'address')
    assert ok is False and sorted(result['vms']) == ['node-0', 'node-1'] and list(result['failed_vms']) == ['node-2']
    assert result['vms']['node-1']['address'] == '10.0.0.11' and result['vms']['node-1']['elapsed'] == 2.0
    assert message.startswith('1 of 3 VMs did not pass: node-2: VM 1002 (vm-1002) on node pve1: not running with its '
                              'guest agent reporting an IPv4 address after 5 s (last seen: VM is running; guest agent: '
                              'QEMU guest agent is not running). Talos runs the QEMU guest agent only')
    assert 'node-0' not in message and 'node-1' not in message
    gates = dict((g['host'], g) for g in result['gates'])
    assert [gates[h]['ok'] for h in ('node-0', 'node-1', 'node-2')] == [True, True, False]
    assert set(g['name'] for g in gates.values()) == {'the VM runs and its guest agent reports its address'}
    assert gates['node-2']['observation'] == message[len('1 of 3 VMs did not pass: '):]
    assert gates['node-1']['attempts'] == 3 and gates['node-2']['target'] == 'VM 1002 on PVE node pve1'
    # each gate's own span on the wall clock: from the first round to when that VM passed (or the deadline)
    assert all(g['started_at'] == round(outcome.started_at, 3) for g in gates.values())
    assert [round(gates[h]['ended_at'] - gates[h]['started_at'], 1) for h in ('node-0', 'node-1', 'node-2')] == [0.0, 2.0, 5.0]


def test_a_permanent_error_ends_only_that_vms_wait_and_transient_errors_are_not_yet():
    clock = FakeClock()
    transient = _errors.TransientApiError('VM 1001: read status failed: Proxmox VE API answered 503 busy')
    probes = {
        1000: ScriptedProbe([transient, reading(1000, status='running')]),
        1001: ScriptedProbe([_errors.ValidationError('node', "VM 1001 (x) is on PVE node 'pve2', not 'pve1'")]),
    }
    outcome = _proxmox_vm_info.probe_vms(FakeClient(), vms(2), params('running'), clock=clock, sleep=clock.sleep,
                                         make_probe=lambda _client, vm: probes[vm['vmid']])
    assert outcome.wait_result.attempts == 2 and probes[1001].calls == 1
    ok, result, message = _proxmox_vm_info.vms_result(outcome, 'running')
    assert ok is False and list(result['vms']) == ['node-0']
    assert message == ("1 of 2 VMs did not pass: node-1 (VM 1001 on PVE node pve1): node: VM 1001 (x) is on PVE node "
                       "'pve2', not 'pve1'")
    assert [g['name'] for g in result['gates']] == ['the VM runs', 'the VM runs']


def test_progress_names_the_vms_still_waiting(monkeypatch):
    clock = FakeClock()
    probes = {1000: ScriptedProbe([reading(1000, status='running')]),
              1001: ScriptedProbe([reading(1001, status='stopped'), reading(1001, status='running')])}
    lines = []

    class Sink(object):
        def update(self, observation, elapsed, attempts):
            lines.append(observation)

        def end(self, observation, elapsed, attempts, ok):
            lines.append(('end', ok))

    monkeypatch.setattr(_wait.Progress, 'from_environment', classmethod(lambda cls, **options: Sink()))
    outcome = _proxmox_vm_info.probe_vms(FakeClient(), vms(2), params('running'), clock=clock, sleep=clock.sleep,
                                         make_probe=lambda _client, vm: probes[vm['vmid']])
    assert outcome.failed == []
    assert lines == ['VMs not running yet 1/2: node-1 (VM 1001 on PVE node pve1): VM is stopped', ('end', True)]


class ScriptedPve(object):
    """A ProxmoxAPI stand-in for the real VmProbe and PveClient: (method, path) -> answers in turn, the last repeats."""

    def __init__(self, script):
        self.script = dict((key, list(answers)) for key, answers in script.items())
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, path):
        api = self

        class Resource(object):
            def get(self, **params):
                with api.lock:
                    api.calls.append(path)
                    answers = api.script[('get', path)]
                    answer = answers.pop(0) if len(answers) > 1 else answers[0]
                if isinstance(answer, Exception):
                    raise answer
                return answer
        return Resource()


def test_a_vm_whose_pve_reads_keep_failing_holds_up_no_round_and_pool_threads_write_no_progress(monkeypatch, tmp_path):
    """VM 1001 answers 503 to every status read; 1000 and 1002 run from round 2 and pass then.

    Before: the probe of 1001 retried its read until the module's deadline inside round 1, so round 2 never came
    (1000 and 1002 failed as 'stopped'), and that pool thread wrote its retries to the live-progress file.
    """
    clock = FakeClock()
    progress = tmp_path / 'progress.jsonl'
    monkeypatch.setenv(_wait.PROGRESS_FILE_ENV, str(progress))
    listing = [dict(vmid=vmid, name='vm-%s' % vmid, node='pve1', type='qemu') for vmid in (1000, 1001, 1002)]
    script = {('get', 'cluster/resources'): [listing]}
    for vmid in (1000, 1001, 1002):
        script[('get', 'nodes/pve1/qemu/%s/pending' % vmid)] = [[{'key': 'name', 'value': 'vm-%s' % vmid}]]
        script[('get', 'nodes/pve1/qemu/%s/status/current' % vmid)] = [{'status': 'stopped'}, {'status': 'running'}]
        script[('get', 'nodes/pve1/qemu/%s/agent/network-get-interfaces' % vmid)] = [{'result': []}]
    script[('get', 'nodes/pve1/qemu/1001/status/current')] = [ResourceException(503, 'Service Unavailable', 'busy')]
    api = ScriptedPve(script)
    client = _proxmox.PveClient(lambda: api, _wait.Deadline(10, clock=clock), interval=1.0, clock=clock,
                                sleep=clock.sleep)
    outcome = _proxmox_vm_info.probe_vms(client, vms(3), params('running', timeout=10), clock=clock, sleep=clock.sleep)
    assert [w.name for w in outcome.failed] == ['node-1']
    assert [(w.name, w.elapsed, w.attempts) for w in outcome.watches if w.passed] == [('node-0', 1.0, 2), ('node-2', 1.0, 2)]
    # one read of 1001's status a round (11 rounds in 10 s at 1 s), none retried inside a round
    assert api.calls.count('nodes/pve1/qemu/1001/status/current') == outcome.wait_result.attempts == 11
    assert client.retried == []
    ok, _result, message = _proxmox_vm_info.vms_result(outcome, 'running')
    assert ok is False and message == ('1 of 3 VMs did not pass: node-1: VM 1001 on node pve1: not running after 10 s '
                                       '(last seen: TransientApiError: VM 1001 on node pve1: read status failed: '
                                       'Proxmox VE API answered 503 busy)')
    # the progress file has the main thread's round summaries only
    lines = [json.loads(line) for line in progress.read_text().splitlines()]
    assert [line['event'] for line in lines] == ['progress', 'progress', 'end'], lines
    assert all(line['summary'].startswith('VMs not running yet ') for line in lines), lines
    assert lines[1]['summary'].startswith('VMs not running yet 1/3: node-1 (VM 1001 on PVE node pve1): TransientApiError')


def test_only_the_round_summary_reaches_the_progress_file_when_a_read_fails_once(monkeypatch, tmp_path):
    """Before: the pool thread retried the 503 itself and wrote that retry to the shared, unlocked progress file."""
    clock = FakeClock()
    progress = tmp_path / 'progress.jsonl'
    monkeypatch.setenv(_wait.PROGRESS_FILE_ENV, str(progress))
    api = ScriptedPve({
        ('get', 'cluster/resources'): [[dict(vmid=1000, name='vm-1000', node='pve1', type='qemu')]],
        ('get', 'nodes/pve1/qemu/1000/pending'): [[]],
        ('get', 'nodes/pve1/qemu/1000/status/current'): [ResourceException(503, 'Service Unavailable', 'busy'),
                                                         {'status': 'running'}],
        ('get', 'nodes/pve1/qemu/1000/agent/network-get-interfaces'): [{'result': []}],
    })
    client = _proxmox.PveClient(lambda: api, _wait.Deadline(10, clock=clock), interval=1.0, clock=clock,
                                sleep=clock.sleep)
    outcome = _proxmox_vm_info.probe_vms(client, vms(1), params('running'), clock=clock, sleep=clock.sleep)
    lines = [json.loads(line) for line in progress.read_text().splitlines()]
    assert [(line['event'], line['summary'].split(':')[0]) for line in lines] == [
        ('progress', 'VMs not running yet 1/1'), ('end', 'VMs not running yet 0/1')], lines
    assert outcome.failed == [] and outcome.wait_result.attempts == 2


def test_reading_without_waiting_reads_again_only_a_vm_whose_read_met_a_transient_error():
    """wait_for=none: probes do not retry, so a 503 is ridden out by rounds - for that VM only, up to 30 s."""
    clock = FakeClock()
    transient = _errors.TransientApiError('VM 1001: read status failed: Proxmox VE API answered 503 busy')
    probes = {1000: ScriptedProbe([reading(1000, status='stopped')]),
              1001: ScriptedProbe([transient, transient, reading(1001, status='stopped')]),
              1002: ScriptedProbe([_errors.TransientApiError('VM 1002: read config failed: Proxmox VE API not reachable')])}
    outcome = _proxmox_vm_info.probe_vms(FakeClient(), vms(3), params('none', sleep=2.0), clock=clock, sleep=clock.sleep,
                                         make_probe=lambda _client, vm: probes[vm['vmid']])
    assert [probe.calls for probe in (probes[1000], probes[1001], probes[1002])] == [1, 3, 16]
    assert outcome.wait_result.elapsed == _proxmox_vm_info.READ_RETRY_SECONDS == 30.0
    ok, result, message = _proxmox_vm_info.vms_result(outcome, 'none')
    assert ok is False and sorted(result['vms']) == ['node-0', 'node-1'] and result['vms']['node-1']['status'] == 'stopped'
    assert message == ('1 of 3 VMs did not pass: node-2 (VM 1002 on PVE node pve1): could not be read (TransientApiError: '
                       'VM 1002: read config failed: Proxmox VE API not reachable)')


@pytest.mark.parametrize('bad, message', [
    ([], 'vms: the list is empty'),
    ([dict(name='a', vmid=1, node=None, expected_address=None), dict(name='a', vmid=2, node=None, expected_address=None)],
     "vms: item 1: name 'a' is listed twice"),
    ([dict(name='a', vmid=1, node=None, expected_address=None), dict(name='b', vmid=1, node=None, expected_address=None)],
     'vms: item 1 (b): VM id 1 is listed twice'),
])
def test_the_list_is_checked(bad, message):
    with pytest.raises(_errors.ValidationError) as caught:
        _proxmox_vm_info.check_vms(bad)
    assert str(caught.value).startswith(message)


# ---------------------------------------------------------------- the Talos API standing in for the agent

class AgentlessClient(object):
    """A PVE client whose VM 811 runs on pve1 with the agent answering like PVE does when it does not run."""

    def __init__(self):
        self.agent_reads = 0

    def get(self, path, what, subject=None, **params):
        assert path == 'cluster/resources' and params == {'type': 'vm'}, path
        return [{'vmid': 811, 'node': 'pve1', 'name': 'cp-1', 'type': 'qemu'}]

    def request(self, method, path, what, subject=None, retry=True, **params):
        if path.endswith('/status/current'):
            return {'status': 'running'}
        if path.endswith('/agent/network-get-interfaces'):
            self.agent_reads += 1
            raise _errors.ApiError('QEMU guest agent is not running', pve_message='QEMU guest agent is not running')
        if path.endswith('/pending'):
            return []
        if path.endswith('/config'):
            return {'name': 'cp-1'}
        raise AssertionError(path)


def _tls_server(tmp_path, answer_tls=True):
    """A listener on 127.0.0.1 (an Ed25519 self-signed certificate, as Talos' maintenance apid has); answer_tls=False
    accepts connections and never answers (the Talos API port held by something that is not apid)."""
    import datetime
    import socket
    import ssl
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from cryptography.x509.oid import NameOID
    key = ed25519.Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'maintenance')])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1)).sign(key, None))
    (tmp_path / 'c.pem').write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / 'k.pem').write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(tmp_path / 'c.pem'), str(tmp_path / 'k.pem'))
    listener = socket.create_server(('127.0.0.1', 0))
    stop = threading.Event()

    def serve():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, dummy = listener.accept()
            except OSError:
                continue
            if answer_tls:
                try:
                    with context.wrap_socket(conn, server_side=True):
                        pass
                except (OSError, ssl.SSLError):
                    pass
            else:
                stop.wait(5)
                conn.close()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def close():
        stop.set()
        thread.join(5)
        listener.close()
    return listener.getsockname()[1], close


def _closed_port():
    import socket
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


def test_without_the_agent_a_static_vm_passes_when_its_talos_api_answers_at_the_inventory_address(tmp_path):
    port, close = _tls_server(tmp_path)
    try:
        client = AgentlessClient()
        vm = {'name': 'cp-1', 'vmid': 811, 'node': 'pve1', 'expected_address': '127.0.0.1'}
        outcome = _proxmox_vm_info.probe_vms(client, [vm], dict(params(timeout=5), talos_api_port=port))
        ok, result, message = _proxmox_vm_info.vms_result(outcome, 'address')
        assert ok, message
        assert result['vms']['cp-1']['address'] == '127.0.0.1'
        assert result['vms']['cp-1']['address_source'] == 'talos_api'
        assert result['vms']['cp-1']['agent_error'] == 'QEMU guest agent is not running'
        assert 'the Talos API answers at its inventory address 127.0.0.1' in result['gates'][0]['observation']
        assert client.agent_reads == 1
    finally:
        close()


def test_without_the_option_or_without_an_answer_the_gate_waits_for_the_agent(tmp_path, monkeypatch):
    monkeypatch.setattr(_proxmox_vm_info, 'TALOS_API_PROBE_TIMEOUT', 0.3)
    port, close = _tls_server(tmp_path, answer_tls=False)
    try:
        vm = {'name': 'cp-1', 'vmid': 811, 'node': 'pve1', 'expected_address': '127.0.0.1'}
        for options in ({}, {'talos_api_port': _closed_port()}, {'talos_api_port': port}):
            clock = FakeClock()
            outcome = _proxmox_vm_info.probe_vms(AgentlessClient(), [vm], dict(params(timeout=3), **options),
                                                 clock=clock, sleep=clock.sleep)
            ok, result, message = _proxmox_vm_info.vms_result(outcome, 'address')
            assert not ok, options
            assert 'QEMU guest agent is not running' in message and _proxmox_vm_info.AGENT_HINT in message, message
            assert result['vms'] == {}
    finally:
        close()


def test_a_vm_without_an_expected_address_never_falls_back(tmp_path):
    port, close = _tls_server(tmp_path)
    try:
        clock = FakeClock()
        vm = {'name': 'w-1', 'vmid': 811, 'node': 'pve1'}
        outcome = _proxmox_vm_info.probe_vms(AgentlessClient(), [vm], dict(params(timeout=3), talos_api_port=port),
                                             clock=clock, sleep=clock.sleep)
        assert not _proxmox_vm_info.vms_result(outcome, 'address')[0]
    finally:
        close()
