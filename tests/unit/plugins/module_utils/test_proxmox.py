"""_proxmox: parsing, error mapping, retries and UPID waits, on a scripted API and a fake clock."""
import pytest
import requests
from proxmoxer.core import ResourceException

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors, _proxmox, _wait
from ansible_collections.proxtalos.cluster.tests.helpers import FakeClock

UPID = 'UPID:pve1:00001234:00005678:6B000000:qmstart:101:root@pam!proxtalos:'


class FakeResource(object):
    def __init__(self, api, path):
        self.api = api
        self.path = path

    def _call(self, method, params):
        self.api.calls.append((method, self.path, params))
        answers = self.api.script.get((method, self.path))
        if not answers:
            raise AssertionError('unexpected %s %s' % (method, self.path))
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer(params) if callable(answer) else answer

    def get(self, **params):
        return self._call('get', params)

    def post(self, **params):
        return self._call('post', params)

    def put(self, **params):
        return self._call('put', params)

    def delete(self, **params):
        return self._call('delete', params)


class FakeApi(object):
    """api(path).get(...) answers from a script: (method, path) -> [answers]; the last one repeats."""

    def __init__(self, script):
        self.script = dict((k, list(v)) for k, v in script.items())
        self.calls = []

    def __call__(self, path):
        return FakeResource(self, path)


def pve_error(status, message, errors=None):
    return ResourceException(status, 'Error', message, errors=errors)


def make_client(script, timeout=60.0, clock=None):
    clock = clock or FakeClock(start=1000.0)
    api = FakeApi(script)
    deadline = _wait.Deadline(timeout, clock=clock.clock)
    client = _proxmox.PveClient(lambda: api, deadline, interval=1.0, clock=clock.clock, sleep=clock.sleep)
    return client, api, clock


# ---------------------------------------------------------------------------------- parsing


def test_parse_props_puts_the_first_bare_item_under_first_key():
    assert _proxmox.parse_props('local-lvm:vm-101-disk-0,size=32G,iothread=1', 'volume') == {
        'volume': 'local-lvm:vm-101-disk-0', 'size': '32G', 'iothread': '1'}
    assert _proxmox.parse_props('') == {}


@pytest.mark.parametrize('text, size', [('32G', 32 * 1024 ** 3), ('512M', 512 * 1024 ** 2), ('1T', 1024 ** 4),
                                        ('1.5G', int(1.5 * 1024 ** 3)), ('4096', 4096), ('10GiB', 10 * 1024 ** 3)])
def test_parse_size(text, size):
    assert _proxmox.parse_size(text) == size


def test_parse_size_refuses_what_is_not_a_size():
    assert _proxmox.parse_size('big') is None
    assert _proxmox.parse_size(None) is None


def test_format_size_picks_the_largest_exact_unit():
    assert _proxmox.format_size(32 * 1024 ** 3) == '32G'
    assert _proxmox.format_size(1536 * 1024 ** 2) == '1536M'
    assert _proxmox.format_size(1000) == '1000'


def test_parse_net_separates_model_and_mac():
    assert _proxmox.parse_net('virtio=bc:24:11:00:00:01,bridge=vmbr0,firewall=1,tag=20') == {
        'model': 'virtio', 'macaddr': 'BC:24:11:00:00:01', 'bridge': 'vmbr0', 'firewall': '1', 'tag': '20'}
    assert _proxmox.parse_net('model=e1000,macaddr=BC:24:11:00:00:02,bridge=vmbr1') == {
        'model': 'e1000', 'macaddr': 'BC:24:11:00:00:02', 'bridge': 'vmbr1'}


def test_upid_parts_and_operation():
    assert _proxmox.upid_parts(UPID) == {'node': 'pve1', 'type': 'qmstart', 'id': '101', 'user': 'root@pam!proxtalos'}
    assert _proxmox.upid_operation(UPID) == 'start'
    assert _proxmox.upid_parts('not a upid') == {}


# ----------------------------------------------------------------------------- classification


@pytest.mark.parametrize('status, message', [
    (503, 'Service Unavailable'), (502, 'Bad Gateway'), (595, 'No route to host'), (596, 'Broken pipe'),
    (500, "can't lock file '/var/lock/qemu-server/lock-101.conf' - got timeout"),
    (500, 'cluster not ready - no quorum?'), (500, 'VM is locked (backup)'),
])
def test_transient_pve_errors(status, message):
    error = _proxmox.classify(pve_error(status, message), 'start', 'VM 101 on node pve1')
    assert isinstance(error, _errors.TransientApiError)
    assert 'VM 101 on node pve1: start failed' in error.message and message in error.message


@pytest.mark.parametrize('status, message', [
    (500, "Configuration file 'nodes/pve1/qemu-server/101.conf' does not exist"),
    (500, 'unable to create VM 101 - VM 101 already exists on node pve2'),
    (400, 'Parameter verification failed.'), (599, 'garbled URL'),
])
def test_permanent_pve_errors(status, message):
    error = _proxmox.classify(pve_error(status, message), 'create', 'VM 101')
    assert type(error) is _errors.ApiError  # pylint: disable=unidiomatic-typecheck
    assert error.status == status


def test_field_errors_are_in_the_message_and_details():
    error = _proxmox.classify(pve_error(400, 'Parameter verification failed.', {'cores': 'value must be > 0'}),
                              'update config', 'VM 101')
    assert 'cores: value must be > 0' in error.message
    assert error.details['pve_errors'] == {'cores': 'value must be > 0'}


def test_credentials_and_permission_errors_say_so():
    assert 'refused the credentials' in _proxmox.classify(pve_error(401, 'authentication failure'), 'read').message
    assert 'permission denied' in _proxmox.classify(pve_error(403, 'Permission check failed (/vms/101, VM.Audit)'),
                                                    'read').message


def test_connection_errors_are_transient_and_tls_errors_name_ca_path():
    assert isinstance(_proxmox.classify(requests.exceptions.ConnectionError('reset'), 'read'),
                      _errors.TransientApiError)
    assert isinstance(_proxmox.classify(requests.exceptions.ReadTimeout('slow'), 'read'), _errors.TransientApiError)
    tls = _proxmox.classify(requests.exceptions.SSLError('certificate verify failed'), 'read')
    assert not isinstance(tls, _errors.TransientApiError) and 'ca_path' in tls.message


@pytest.mark.parametrize('text', [
    "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: Hostname mismatch, certificate is not valid for "
    "'pve.example.internal'. (_ssl.c:1010)",
    "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: IP address mismatch, certificate is not valid for "
    "'10.0.0.5'. (_ssl.c:1010)"])
def test_a_certificate_for_another_name_names_api_host_not_ca_path(text):
    # A CA file does not help when the certificate does not carry the name connected to (audit finding 7).
    tls = _proxmox.classify(requests.exceptions.SSLError(text), 'read')
    assert tls.details['tls'] == 'hostname' and 'set api_host to a name or address the certificate carries' in tls.message
    assert 'ca_path' not in tls.message


def test_unknown_exceptions_are_not_classified():
    assert _proxmox.classify(KeyError('x'), 'read') is None


# -------------------------------------------------------------------------------------- client


def test_reads_are_retried_with_backoff_until_they_succeed():
    client, api, clock = make_client({('get', 'version'): [pve_error(503, 'Service Unavailable'),
                                                           requests.exceptions.ConnectionError('reset'),
                                                           {'version': '9.0.10'}]})
    assert client.get('version', 'read version') == {'version': '9.0.10'}
    assert len(api.calls) == 3
    assert clock.sleeps == [1.0, 2.0]
    assert [r['attempt'] for r in client.retried] == [1, 2]
    assert 'Service Unavailable' in client.retried[0]['error']


def test_permanent_errors_are_raised_at_once():
    client, api, clock = make_client({('get', 'nodes/pve1/qemu/101/config'): [pve_error(500, 'does not exist')]})
    with pytest.raises(_errors.ApiError) as caught:
        client.get('nodes/pve1/qemu/101/config', 'read config', 'VM 101 on node pve1')
    assert 'VM 101 on node pve1: read config failed' in caught.value.message
    assert len(api.calls) == 1 and clock.sleeps == []


def test_retries_stop_at_the_deadline_with_the_last_error():
    client, api, clock = make_client({('get', 'version'): [pve_error(595, 'No route to host')]}, timeout=10)
    with pytest.raises(_errors.TransientApiError) as caught:
        client.get('version', 'read version')
    assert '595' in caught.value.message
    assert clock.now - 1000.0 == pytest.approx(10.0)
    assert len(api.calls) >= 3


def test_writes_without_retry_are_sent_once():
    client, api, _clock = make_client({('post', 'nodes/pve1/qemu/101/status/start'): [
        requests.exceptions.ConnectionError('reset'), UPID]})
    with pytest.raises(_errors.TransientApiError):
        client.request('post', 'nodes/pve1/qemu/101/status/start', 'start', retry=False)
    assert len(api.calls) == 1


def test_a_failing_login_is_retried_inside_the_deadline():
    clock = FakeClock(start=1000.0)
    attempts = []
    api = FakeApi({('get', 'version'): [{'version': '9.0.10'}]})

    def factory():
        attempts.append(1)
        if len(attempts) < 2:
            raise requests.exceptions.ConnectionError('refused')
        return api
    client = _proxmox.PveClient(factory, _wait.Deadline(30, clock=clock.clock), clock=clock.clock, sleep=clock.sleep)
    assert client.get('version', 'read version')['version'] == '9.0.10'
    assert len(attempts) == 2


def status(state, exitstatus=None):
    data = {'status': state, 'upid': UPID}
    if exitstatus is not None:
        data['exitstatus'] = exitstatus
    return data


def test_wait_task_polls_until_the_task_stops():
    path = 'nodes/pve1/tasks/%s/status' % UPID
    client, api, clock = make_client({('get', path): [status('running'), status('running'), status('stopped', 'OK')]})
    assert client.wait_task('pve1', UPID, timeout=60, interval=2)['exitstatus'] == 'OK'
    assert len(api.calls) == 3
    assert clock.sleeps[0] == pytest.approx(0.2) and clock.sleeps[1] > clock.sleeps[0]


def test_wait_task_error_names_subject_node_operation_and_pve_message_with_the_log_tail():
    base = 'nodes/pve1/tasks/%s/' % UPID
    lines = [{'n': i, 't': 'line %d' % i} for i in range(1, 15)] + [{'n': 15, 't': 'TASK ERROR: start failed: QEMU exited'}]
    client, _api, _clock = make_client({('get', base + 'status'): [status('stopped', 'start failed: QEMU exited')],
                                        ('get', base + 'log'): [lines]})
    with pytest.raises(_errors.TaskFailed) as caught:
        client.wait_task('pve1', UPID, 60, 2, subject='VM 101 (cp-1) on node pve1')
    error = caught.value
    assert not isinstance(error, _errors.TransientApiError)
    assert error.message == 'VM 101 (cp-1) on node pve1: start failed on PVE node pve1: TASK ERROR: start failed: QEMU exited'
    assert error.details['task_log'][-1] == 'TASK ERROR: start failed: QEMU exited'
    assert len(error.details['task_log']) == _proxmox.LOG_TAIL_LINES
    assert error.details['operation'] == 'start' and error.details['upid'] == UPID


def test_a_task_that_ended_on_a_lock_timeout_is_transient():
    base = 'nodes/pve1/tasks/%s/' % UPID
    client, _api, _clock = make_client({
        ('get', base + 'status'): [status('stopped', "can't lock file '/var/lock/qemu-server/lock-101.conf' - got timeout")],
        ('get', base + 'log'): [[]]})
    with pytest.raises(_proxmox.TransientTaskFailed):
        client.wait_task('pve1', UPID, 60, 2)


def test_warnings_count_as_success():
    client, _api, _clock = make_client({('get', 'nodes/pve1/tasks/%s/status' % UPID): [status('stopped', 'WARNINGS: 1')]})
    assert client.wait_task('pve1', UPID, 60, 2)['exitstatus'] == 'WARNINGS: 1'


def test_wait_task_times_out_with_what_it_saw():
    client, _api, _clock = make_client({('get', 'nodes/pve1/tasks/%s/status' % UPID): [status('running')]})
    with pytest.raises(_errors.WaitTimeout) as caught:
        client.wait_task('pve1', UPID, timeout=5, interval=1, subject='VM 101')
    assert 'did not finish within 5 s' in caught.value.message and 'task running' in caught.value.message
    assert caught.value.details['last_observation'] == 'task running'


def test_wait_task_rides_out_connection_resets():
    path = 'nodes/pve1/tasks/%s/status' % UPID
    client, _api, _clock = make_client({('get', path): [requests.exceptions.ConnectionError('reset'),
                                                        status('stopped', 'OK')]})
    assert client.wait_task('pve1', UPID, 60, 1)['exitstatus'] == 'OK'


def test_run_task_waits_on_the_node_of_the_upid():
    other = UPID.replace(':pve1:', ':pve2:')
    client, api, _clock = make_client({('post', 'nodes/pve1/qemu/101/status/start'): [other],
                                       ('get', 'nodes/pve2/tasks/%s/status' % other): [status('stopped', 'OK')]})
    assert client.run_task('post', 'nodes/pve1/qemu/101/status/start', 'pve1', 'start', 'VM 101', 60, 1) == other
    assert api.calls[-1][1] == 'nodes/pve2/tasks/%s/status' % other


# -------------------------------------------------------------------------------------- lookups


def test_find_vm_by_id_and_refuse_a_container():
    client, _api, _clock = make_client({('get', 'cluster/resources'): [[
        {'vmid': 101, 'type': 'qemu', 'node': 'pve1', 'name': 'cp-1'},
        {'vmid': 200, 'type': 'lxc', 'node': 'pve1', 'name': 'ct'}]]})
    assert _proxmox.find_vm(client, 101)['name'] == 'cp-1'
    assert _proxmox.find_vm(client, 102) is None
    with pytest.raises(_errors.ValidationError) as caught:
        _proxmox.find_vm(client, 200)
    assert caught.value.field == 'vmid'


def test_config_and_pending_from_the_pending_endpoint():
    client, _api, _clock = make_client({('get', 'nodes/pve1/qemu/101/pending'): [[
        {'key': 'cores', 'value': 2, 'pending': 4}, {'key': 'memory', 'value': '2048'},
        {'key': 'serial0', 'value': 'socket', 'delete': 1}, {'key': 'tags', 'pending': 'new'}]]})
    config, pending = _proxmox.read_config_and_pending(client, 'pve1', 101)
    assert config == {'cores': 2, 'memory': '2048', 'serial0': 'socket'}
    assert pending == {'cores': 4, 'serial0': None, 'tags': 'new'}


def test_agent_addresses_skip_loopback_interface_ipv6_and_link_local():
    answer = {'result': [
        {'name': 'lo', 'ip-addresses': [{'ip-address': '127.0.0.1', 'ip-address-type': 'ipv4', 'prefix': 8}]},
        {'name': 'eth0', 'ip-addresses': [{'ip-address': '10.20.0.11', 'ip-address-type': 'ipv4', 'prefix': 24},
                                          {'ip-address': 'fe80::1', 'ip-address-type': 'ipv6', 'prefix': 64},
                                          {'ip-address': '169.254.1.1', 'ip-address-type': 'ipv4', 'prefix': 16}]},
        {'name': 'eth1', 'ip-addresses': [{'ip-address': '127.0.10.101', 'ip-address-type': 'ipv4', 'prefix': 24}]}]}
    client, _api, _clock = make_client({('get', 'nodes/pve1/qemu/101/agent/network-get-interfaces'): [answer]})
    assert _proxmox.agent_ipv4_addresses(client, 'pve1', 101) == [
        {'interface': 'eth0', 'address': '10.20.0.11', 'prefix': 24},
        {'interface': 'eth1', 'address': '127.0.10.101', 'prefix': 24}]


# ------------------------------------------------------------------------------------ connect


def test_connect_with_a_token_and_a_ca_file(tmp_path):
    ca = tmp_path / 'ca.pem'
    ca.write_text('x')
    api = _proxmox.connect(dict(api_host='pve.example.com', api_port=8006, api_user='automation@pve',
                                api_token_id='proxtalos', api_token_secret='s3cret', ca_path=str(ca),
                                validate_certs=True, api_timeout=7))
    backend = _proxmox.proxmoxer_session(api).auth
    assert backend.username == 'automation@pve' and backend.token_name == 'proxtalos'
    assert backend.verify_ssl == str(ca)
    assert api._store['base_url'] == 'https://pve.example.com:8006/api2/json'  # pylint: disable=protected-access


def test_proxmoxer_still_keeps_the_session_connect_gives_a_pool_to():
    # proxmoxer_session reads proxmoxer's private _store['session']: this fails when a proxmoxer release moves it
    params = dict(api_host='pve.example.com', api_port=8006, api_user='automation@pve', api_token_id='proxtalos',
                  api_token_secret='s3cret', ca_path=None, validate_certs=False, api_timeout=7)
    api = _proxmox.connect(params, warn=lambda message: None, connections=_proxmox.POOL_SIZE + 22)
    session = _proxmox.proxmoxer_session(api)
    assert isinstance(session, requests.Session)
    pool = session.get_adapter('https://pve.example.com:8006/api2/json').poolmanager.connection_pool_kw
    assert pool['maxsize'] == _proxmox.POOL_SIZE + 22
    # the session proxmoxer sends its requests through: a request to the API goes to this session's adapter
    sent = []

    def request(method, url, **kwargs):
        sent.append((method, url))
        raise requests.ConnectionError('not sent')
    session.request = request
    with pytest.raises(requests.ConnectionError):
        api.version.get()
    assert sent == [('GET', 'https://pve.example.com:8006/api2/json/version')]


def test_connect_accepts_the_full_token_id_and_warns_when_verification_is_off():
    warnings = []
    api = _proxmox.connect(dict(api_host='pve', api_port=None, api_user='root@pam', api_token_id='ops@pve!ci',
                                api_token_secret='s', ca_path=None, validate_certs=False, api_timeout=5),
                           warn=warnings.append)
    backend = _proxmox.proxmoxer_session(api).auth
    assert backend.username == 'ops@pve' and backend.token_name == 'ci'
    assert backend.verify_ssl is False
    assert len(warnings) == 1 and 'not verified' in warnings[0]
