"""The client factory and KubeClient against a real loopback HTTP(S) server with canned answers."""
import base64
import datetime
import ipaddress
import json
import os
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client

TOKEN = 'kube-token-0123456789abcdef'


class CannedApi(object):
    """Answers by path (without query); records what it was asked.

    A request with watch=1 gets a chunked stream: the lines put in `watch_lines` are sent once
    `watch_go` is set, then the stream ends when its timeoutSeconds pass (as a real server does).
    """

    def __init__(self):
        self.routes = {}
        self.seen = []
        self.watch_lines = []
        self.watch_go = threading.Event()

    def handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'

            def _chunk(self, data):
                self.wfile.write(b'%x\r\n%s\r\n' % (len(data), data))
                self.wfile.flush()

            def _watch(self, query):
                self.send_response(200)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Transfer-Encoding', 'chunked')
                self.end_headers()
                self.wfile.flush()
                timeout = float(dict(part.split('=', 1) for part in query.split('&')).get('timeoutSeconds', '5'))
                try:
                    if api.watch_go.wait(timeout):
                        for line in api.watch_lines:
                            self._chunk(line.encode() + b'\n')
                        api.watch_go.wait(timeout)
                    self._chunk(b'')
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self):  # noqa: N802 (http.server naming)
                path, query = (self.path.split('?', 1) + [''])[:2]
                api.seen.append({'path': path, 'query': query, 'authorization': self.headers.get('Authorization')})
                if 'watch=1' in query.split('&'):
                    self._watch(query)
                    return
                status, body = api.routes.get(path, (404, {'kind': 'Status', 'message': 'not found'}))
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _write(self):
                path, query = (self.path.split('?', 1) + [''])[:2]
                length = int(self.headers.get('Content-Length') or 0)
                body = self.rfile.read(length) if length else b''
                api.seen.append({'path': path, 'query': query, 'authorization': self.headers.get('Authorization'),
                                 'method': self.command, 'content_type': self.headers.get('Content-Type'),
                                 'body': json.loads(body) if body else None})
                status, answer = api.routes.get((self.command, path), (404, {'kind': 'Status', 'message': 'not found'}))
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_PUT = do_PATCH = do_DELETE = _write  # noqa: N815 (http.server naming)

            def log_message(self, *args):
                pass

        return Handler


def _serve(api, tls_context=None):
    server = ThreadingHTTPServer(('127.0.0.1', 0), api.handler())
    if tls_context is not None:
        server.socket = tls_context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    return server


def _kubeconfig(server_url, ca_pem=None, user=None):
    cluster = {'server': server_url}
    if ca_pem:
        cluster['certificate-authority-data'] = base64.b64encode(ca_pem).decode()
    return {
        'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'admin@lab',
        'clusters': [{'name': 'lab', 'cluster': cluster}],
        'users': [{'name': 'admin@lab', 'user': user or {'token': TOKEN}}],
        'contexts': [{'name': 'admin@lab', 'context': {'cluster': 'lab', 'user': 'admin@lab'}},
                     {'name': 'other', 'context': {'cluster': 'lab', 'user': 'admin@lab', 'namespace': 'x'}}],
    }


class FakeModule(object):
    def __init__(self):
        self.no_log_values = set()


@pytest.fixture
def api():
    canned = CannedApi()
    server = _serve(canned)
    canned.url = 'http://127.0.0.1:%d' % server.server_address[1]
    yield canned
    server.shutdown()
    server.server_close()


def _client(api, **params):
    base = {'kubeconfig_content': _kubeconfig(api.url), 'validate_certs': True, 'api_timeout': 5.0}
    base.update(params)
    return k8s_client.build_client(base)


def test_list_returns_items_with_kind_and_sends_the_token(api):
    api.routes['/api/v1/nodes'] = (200, {'kind': 'NodeList', 'items': [{'metadata': {'name': 'cp-1'}}]})
    client = _client(api)
    items = client.list('v1', 'Node', label_selector='node-role.kubernetes.io/control-plane')
    assert items == [{'metadata': {'name': 'cp-1'}, 'kind': 'Node', 'apiVersion': 'v1'}]
    assert api.seen[-1]['authorization'] == 'Bearer %s' % TOKEN
    assert api.seen[-1]['query'] == 'labelSelector=node-role.kubernetes.io%2Fcontrol-plane'
    assert client.requests == 1


def test_namespaced_get_and_404_is_none(api):
    api.routes['/apis/apps/v1/namespaces/kube-system/daemonsets/cilium'] = (200, {'metadata': {'name': 'cilium'}})
    client = _client(api)
    assert client.get('apps/v1', 'DaemonSet', 'cilium', 'kube-system')['metadata']['name'] == 'cilium'
    assert client.get('apps/v1', 'DaemonSet', 'nope', 'kube-system') is None


@pytest.mark.parametrize('status', [429, 500, 503])
def test_throttling_and_server_errors_are_transient(api, status):
    api.routes['/api/v1/nodes'] = (status, {'kind': 'Status', 'message': 'etcdserver: leader changed'})
    with pytest.raises(_errors.TransientApiError) as caught:
        _client(api).list('v1', 'Node')
    assert caught.value.status == status
    assert 'answered %d for /api/v1/nodes: etcdserver: leader changed' % status in str(caught.value)


@pytest.mark.parametrize('status, hint', [(401, 'credentials in the kubeconfig rejected'),
                                          (403, 'the kubeconfig user may not read this')])
def test_auth_errors_are_not_transient(api, status, hint):
    api.routes['/api/v1/nodes'] = (status, {'kind': 'Status', 'message': 'Unauthorized'})
    with pytest.raises(_errors.ApiError) as caught:
        _client(api).list('v1', 'Node')
    assert not isinstance(caught.value, _errors.TransientApiError)
    assert hint in str(caught.value)


def test_writes_send_their_json_with_its_content_type_and_return_the_answer(api):
    secrets = '/api/v1/namespaces/kube-system/secrets'
    api.routes[('POST', secrets)] = (201, {'kind': 'Secret', 'metadata': {'name': 'k', 'resourceVersion': '7'}})
    api.routes[('PATCH', secrets + '/k')] = (200, {'kind': 'Secret', 'metadata': {'name': 'k', 'resourceVersion': '8'}})
    api.routes[('DELETE', secrets + '/k')] = (200, {'kind': 'Status', 'status': 'Success'})
    client = _client(api)
    created = client.send_json('POST', secrets, {'metadata': {'name': 'k'}}, query={'fieldManager': 'proxtalos'})
    assert created['metadata']['resourceVersion'] == '7'
    assert api.seen[-1] == {'path': secrets, 'query': 'fieldManager=proxtalos', 'authorization': 'Bearer %s' % TOKEN,
                            'method': 'POST', 'content_type': 'application/json', 'body': {'metadata': {'name': 'k'}}}
    client.send_json('PATCH', secrets + '/k', {'metadata': {'labels': {'a': 'b'}}}, content_type='application/merge-patch+json')
    assert (api.seen[-1]['method'], api.seen[-1]['content_type']) == ('PATCH', 'application/merge-patch+json')
    assert client.send_json('DELETE', secrets + '/k')['status'] == 'Success'
    assert (api.seen[-1]['method'], api.seen[-1]['body'], api.seen[-1]['content_type']) == ('DELETE', None, None)


@pytest.mark.parametrize('status, error, text', [
    (409, _errors.ApiError, 'answered 409 for POST /api/v1/namespaces/kube-system/secrets: secrets "k" already exists'),
    (403, _errors.ApiError, 'the kubeconfig user may not write this'),
    (503, _errors.TransientApiError, 'answered 503 for POST /api/v1/namespaces/kube-system/secrets')])
def test_a_refused_write_names_the_request_and_the_api_message(api, status, error, text):
    secrets = '/api/v1/namespaces/kube-system/secrets'
    api.routes[('POST', secrets)] = (status, {'kind': 'Status', 'message': 'secrets "k" already exists'})
    with pytest.raises(error) as caught:
        _client(api).send_json('POST', secrets, {'metadata': {'name': 'k'}, 'data': {'tls.key': 'c2VjcmV0'}})
    assert caught.value.status == status and text in str(caught.value)
    assert (status == 503) == isinstance(caught.value, _errors.TransientApiError)
    assert 'c2VjcmV0' not in str(caught.value)


def test_connection_refused_is_transient():
    sock = socket.socket()
    sock.bind(('127.0.0.1', 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    client = k8s_client.build_client({'kubeconfig_content': _kubeconfig('http://127.0.0.1:%d' % port)})
    with pytest.raises(_errors.TransientApiError) as caught:
        client.list('v1', 'Node')
    assert 'unreachable' in str(caught.value)


# --- waking on change ------------------------------------------------------------------------

def _watch_threads():
    return [t for t in threading.enumerate() if t.name == 'k8s-gate-watch' and t.is_alive()]


def _no_watch_threads_left():
    for thread in _watch_threads():
        thread.join(5)
    return not _watch_threads()


def test_a_change_wakes_the_sleep_early(api):
    api.routes['/api/v1/nodes'] = (200, {'kind': 'NodeList', 'metadata': {'resourceVersion': '41'}, 'items': []})
    api.routes['/apis/apps/v1/namespaces/kube-system/daemonsets/cilium'] = (
        200, {'metadata': {'name': 'cilium', 'resourceVersion': '40'}})
    client = _client(api)
    client.list('v1', 'Node', label_selector='a=b')
    client.get('apps/v1', 'DaemonSet', 'cilium', 'kube-system')
    api.watch_lines = ['{"type":"MODIFIED","object":{"metadata":{"name":"w-2","resourceVersion":"42"}}}']
    threading.Timer(0.1, api.watch_go.set).start()
    assert client.sleep_until_change(5.0) is True
    assert client.wakeups == 1
    watches = sorted(seen['query'] for seen in api.seen if 'watch=1' in seen['query'])
    assert len(watches) == 2
    assert 'resourceVersion=41' in watches[1] and 'labelSelector=a%3Db' in watches[1]
    assert 'resourceVersion=40' in watches[0] and 'fieldSelector=metadata.name%3Dcilium' in watches[0]
    assert _no_watch_threads_left()


def test_without_a_change_the_sleep_lasts_its_time(api):
    api.routes['/api/v1/nodes'] = (200, {'kind': 'NodeList', 'metadata': {'resourceVersion': '7'}, 'items': []})
    client = _client(api)
    client.list('v1', 'Node')
    slept = []
    assert client.sleep_until_change(0.3, sleep=slept.append) is False
    assert client.wakeups == 0 and slept == []  # the watch itself did the waiting
    assert _no_watch_threads_left()


@pytest.mark.parametrize('line', [
    '{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired"}}',
    '{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}',
    'not json',
])
def test_errors_and_bookmarks_do_not_wake(api, line):
    api.routes['/api/v1/nodes'] = (200, {'kind': 'NodeList', 'metadata': {'resourceVersion': '7'}, 'items': []})
    client = _client(api)
    client.list('v1', 'Node')
    api.watch_lines = [line]
    api.watch_go.set()
    assert client.sleep_until_change(0.3) is False
    assert _no_watch_threads_left()


def test_nothing_read_means_a_plain_sleep(api):
    client = _client(api)
    slept = []
    assert client.sleep_until_change(1.5, sleep=slept.append) is False
    assert slept == [1.5]
    client.forget_reads()
    api.routes['/api/v1/nodes'] = (200, {'kind': 'NodeList', 'metadata': {'resourceVersion': '7'}, 'items': []})
    client.list('v1', 'Node')
    client.forget_reads()
    assert client.sleep_until_change(0.5, sleep=slept.append) is False and slept == [1.5, 0.5]


def test_a_refused_watch_does_not_wake_or_raise():
    sock = socket.socket()
    sock.bind(('127.0.0.1', 0))
    port = sock.getsockname()[1]
    sock.close()
    client = k8s_client.build_client({'kubeconfig_content': _kubeconfig('http://127.0.0.1:%d' % port)})
    client._remember('/api/v1/nodes', None, None, '5')  # pylint: disable=protected-access
    assert client.sleep_until_change(0.2) is False


def test_readyz_returns_500_as_an_answer(api):
    api.routes['/readyz'] = (500, '[+]ping ok\n[-]etcd failed: reason withheld\nreadyz check failed')
    status, text = _client(api).readyz(verbose=True)
    assert status == 500 and '[-]etcd failed' in text
    assert api.seen[-1]['query'] == 'verbose=true'


def test_discovery_resolves_a_custom_kind_once(api):
    api.routes['/apis/kustomize.toolkit.fluxcd.io/v1'] = (200, {'kind': 'APIResourceList', 'resources': [
        {'name': 'kustomizations', 'kind': 'Kustomization', 'namespaced': True},
        {'name': 'kustomizations/status', 'kind': 'Kustomization', 'namespaced': True}]})
    api.routes['/apis/kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/apps'] = (
        200, {'metadata': {'name': 'apps'}})
    client = _client(api)
    assert client.resource('kustomize.toolkit.fluxcd.io/v1', 'Kustomization') == ('kustomizations', True)
    assert client.get('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', 'apps', 'flux-system') is not None
    assert [s['path'] for s in api.seen].count('/apis/kustomize.toolkit.fluxcd.io/v1') == 1


def test_a_group_not_served_yet(api):
    client = _client(api)
    assert client.resource('helm.toolkit.fluxcd.io/v2', 'HelmRelease') is None
    with pytest.raises(k8s_client.NotServed) as caught:
        client.list('helm.toolkit.fluxcd.io/v2', 'HelmRelease')
    assert str(caught.value) == 'Kubernetes API does not serve kind HelmRelease in helm.toolkit.fluxcd.io/v2 (yet)'


def test_context_selection_and_unknown_context(api):
    client = _client(api, context='other')
    assert client.host == api.url
    with pytest.raises(_errors.ValidationError) as caught:
        _client(api, context='nope')
    assert caught.value.field == 'context'


def test_kubeconfig_path_missing_and_both_given(tmp_path, api):
    with pytest.raises(_errors.ValidationError) as caught:
        k8s_client.build_client({'kubeconfig': str(tmp_path / 'absent')})
    assert caught.value.field == 'kubeconfig' and 'no such file' in str(caught.value)
    path = tmp_path / 'kubeconfig'
    path.write_text(yaml.safe_dump(_kubeconfig(api.url)))
    with pytest.raises(_errors.ValidationError) as caught:
        k8s_client.build_client({'kubeconfig': str(path), 'kubeconfig_content': 'x'})
    assert caught.value.field == 'kubeconfig'
    assert k8s_client.build_client({'kubeconfig': str(path)}).host == api.url


@pytest.mark.parametrize('content, reason', [
    ('clusters: [unclosed', 'not valid YAML'),
    ('just a string', 'not a kubeconfig: no clusters list'),
])
def test_bad_kubeconfig_content_names_the_field(content, reason):
    with pytest.raises(_errors.ValidationError) as caught:
        k8s_client.build_client({'kubeconfig_content': content})
    assert caught.value.field == 'kubeconfig_content' and reason in str(caught.value)


def test_secrets_in_kubeconfig_content_are_registered(api):
    key_pem = b'-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIFAKEFAKEFAKE\n-----END EC PRIVATE KEY-----\n'
    user = {'client-certificate-data': base64.b64encode(b'cert').decode(),
            'client-key-data': base64.b64encode(key_pem).decode(), 'token': TOKEN}
    content = yaml.safe_dump(_kubeconfig(api.url, user=user))
    module = FakeModule()
    # the client key is not a real key, so loading may fail later; registration comes first
    try:
        k8s_client.build_client({'kubeconfig_content': content}, module=module)
    except _errors.ProxtalosError:
        pass
    assert user['client-key-data'] in module.no_log_values
    assert key_pem.decode() in module.no_log_values
    assert TOKEN in module.no_log_values
    assert user['client-certificate-data'] not in module.no_log_values  # a certificate is not a secret


# --- TLS -------------------------------------------------------------------------------------------

def _self_signed(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'kube-apiserver')])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address('127.0.0.1'))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_path, cert_path = tmp_path / 'tls.key', tmp_path / 'tls.crt'
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert_pem)
    os.chmod(str(key_path), 0o600)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert_path), str(key_path))
    return context, cert_pem, cert_path


@pytest.fixture
def tls_api(tmp_path):
    context, cert_pem, cert_path = _self_signed(tmp_path)
    canned = CannedApi()
    server = _serve(canned, context)
    canned.url = 'https://127.0.0.1:%d' % server.server_address[1]
    canned.ca_pem, canned.ca_path = cert_pem, str(cert_path)
    canned.routes['/readyz'] = (200, 'ok')
    yield canned
    server.shutdown()
    server.server_close()


def test_tls_verified_with_the_kubeconfig_ca(tls_api):
    client = k8s_client.build_client({'kubeconfig_content': _kubeconfig(tls_api.url, tls_api.ca_pem)})
    assert client.readyz() == (200, 'ok')


def test_tls_with_an_unknown_ca_fails_at_once_not_transient(tls_api):
    client = k8s_client.build_client({'kubeconfig_content': _kubeconfig(tls_api.url)})
    with pytest.raises(_errors.ApiError) as caught:
        client.readyz()
    assert not isinstance(caught.value, _errors.TransientApiError)
    assert 'TLS with %s failed' % tls_api.url in str(caught.value)


def test_ca_path_option_supplies_the_ca(tls_api):
    client = k8s_client.build_client({'kubeconfig_content': _kubeconfig(tls_api.url), 'ca_path': tls_api.ca_path})
    assert client.readyz() == (200, 'ok')
    with pytest.raises(_errors.ValidationError) as caught:
        k8s_client.build_client({'kubeconfig_content': _kubeconfig(tls_api.url), 'ca_path': '/nonexistent/ca.pem'})
    assert caught.value.field == 'ca_path'


def test_validate_certs_false_is_explicit_and_warned(tls_api):
    warnings = []
    client = k8s_client.build_client({'kubeconfig_content': _kubeconfig(tls_api.url), 'validate_certs': False},
                                     warn=warnings.append)
    assert client.readyz() == (200, 'ok')
    assert warnings == ['validate_certs=false: the certificate of the Kubernetes API at %s is not verified' % tls_api.url]


def test_insecure_skip_in_kubeconfig_does_not_turn_verification_off(tls_api):
    config = _kubeconfig(tls_api.url)
    config['clusters'][0]['cluster']['insecure-skip-tls-verify'] = True
    client = k8s_client.build_client({'kubeconfig_content': config, 'validate_certs': True})
    with pytest.raises(_errors.ApiError):
        client.readyz()


def test_api_path():
    assert k8s_client.api_path('v1', 'pods', 'kube-system', 'a') == '/api/v1/namespaces/kube-system/pods/a'
    assert k8s_client.api_path('apps/v1', 'daemonsets') == '/apis/apps/v1/daemonsets'


# --- static kubeconfigs are read without the kubernetes package ------------------------------------

def test_a_static_kubeconfig_does_not_import_the_kubernetes_package(tmp_path, api):
    """Importing kubernetes costs more CPU than a gate's whole probe; a token/cert kubeconfig does not need it."""
    api.routes['/readyz'] = (200, 'ok')
    path = tmp_path / 'kubeconfig'
    path.write_text(yaml.safe_dump(_kubeconfig(api.url)))
    script = ('import sys; from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as c; '
              'k = c.build_client({"kubeconfig": sys.argv[1]}); print(k.readyz()[0], "kubernetes" in sys.modules)')
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(root, '.collections'), root]))
    done = subprocess.run([sys.executable, '-c', script, str(path)], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ['200', 'False']


def test_token_file_is_read_relative_to_the_kubeconfig(tmp_path, api):
    api.routes['/api/v1/nodes'] = (200, {'kind': 'NodeList', 'items': []})
    (tmp_path / 'token').write_text(TOKEN + '\n')
    path = tmp_path / 'kubeconfig'
    path.write_text(yaml.safe_dump(_kubeconfig(api.url, user={'tokenFile': 'token'})))
    k8s_client.build_client({'kubeconfig': str(path)}).list('v1', 'Node')
    assert api.seen[-1]['authorization'] == 'Bearer %s' % TOKEN


def test_basic_auth_header(api):
    api.routes['/api/v1/nodes'] = (200, {'kind': 'NodeList', 'items': []})
    _client(api, kubeconfig_content=_kubeconfig(api.url, user={'username': 'admin', 'password': 's3cret'})).list('v1', 'Node')
    assert api.seen[-1]['authorization'] == 'Basic %s' % base64.b64encode(b'admin:s3cret').decode()


def test_exec_credentials_go_to_the_kubernetes_package(api):
    user = {'exec': {'apiVersion': 'client.authentication.k8s.io/v1', 'command': 'true'}}
    client = _client(api, kubeconfig_content=_kubeconfig(api.url, user=user))
    assert not isinstance(client._configuration, k8s_client.StaticConfiguration)  # pylint: disable=protected-access
    assert client.host == api.url


def test_configuration_of_a_static_client_is_the_packages(api):
    client = _client(api)
    assert isinstance(client._configuration, k8s_client.StaticConfiguration)  # pylint: disable=protected-access
    configuration = client.configuration
    assert configuration.host == api.url
    assert [v['value'] for v in configuration.auth_settings().values()] == ['Bearer %s' % TOKEN]


def test_client_certificate_data_is_presented(tmp_path):
    """mTLS as in a Talos admin kubeconfig: the server requires a client certificate signed by its CA."""
    server_context, server_pem, _server_path = _self_signed(tmp_path)
    client_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'admin')])
    now = datetime.datetime.now(datetime.timezone.utc)
    client_cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(client_key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
                   .not_valid_after(now + datetime.timedelta(days=1)).sign(client_key, hashes.SHA256()))
    client_pem = client_cert.public_bytes(serialization.Encoding.PEM)
    server_context.verify_mode = ssl.CERT_REQUIRED
    server_context.load_verify_locations(cadata=client_pem.decode())
    canned = CannedApi()
    canned.routes['/readyz'] = (200, 'ok')
    server = _serve(canned, server_context)
    try:
        url = 'https://127.0.0.1:%d' % server.server_address[1]
        key_pem = client_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())
        user = {'client-certificate-data': base64.b64encode(client_pem).decode(),
                'client-key-data': base64.b64encode(key_pem).decode()}
        client = k8s_client.build_client({'kubeconfig_content': _kubeconfig(url, server_pem, user=user)})
        assert client.readyz() == (200, 'ok')
        without = k8s_client.build_client({'kubeconfig_content': _kubeconfig(url, server_pem, user={'token': TOKEN})})
        with pytest.raises(_errors.ProxtalosError):
            without.readyz()
    finally:
        server.shutdown()
        server.server_close()
