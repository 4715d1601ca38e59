"""The lab's pod network (lab/k8s_upstream/podnet.py): kube-apiserver's `cluster` egress over an HTTP CONNECT proxy
of the lab's own, which takes a connection to a pod's address and port to the process that plays the pod. The judge
of the end-to-end tests is the upstream kube-apiserver's service and pod proxy; the proxy's own tests speak the
CONNECT protocol by hand, as k8s.io/apiserver@v0.36.3 pkg/server/egressselector/egress_selector.go:112-144 does.
Select with `-m upstream`."""

import http.server
import os
import stat
import threading

import pytest
import requests

from lab.k8s_upstream import ControlPlane
from lab.k8s_upstream.podnet import PodNetwork, PodNetworkError, connect_unix
from lab.testing import Lab

pytestmark = pytest.mark.upstream

WAIT = 60.0


class _Served(http.server.ThreadingHTTPServer):
    daemon_threads = True


def _serve(body):
    """An HTTP server on 127.0.0.1 at a free port answering every GET with body (the process playing a pod)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802  pylint: disable=invalid-name
            payload = ('%s %s' % (body, self.path)).encode()
            self.send_response(200)
            self.send_header('Content-Type', 'text/plain')
            self.send_header('Content-Length', str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):  # pylint: disable=arguments-differ
            pass
    server = _Served(('127.0.0.1', 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _connect(network, target):
    """CONNECT target over the network's socket as kube-apiserver's HTTPConnect egress does: (status line, socket)."""
    sock = connect_unix(network.socket_path)
    sock.sendall(('CONNECT %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n' % target).encode())
    head = b''
    while b'\r\n\r\n' not in head:
        chunk = sock.recv(1)
        if not chunk:
            break
        head += chunk
    return head.split(b'\r\n', 1)[0].decode(), sock


def _get_through(sock, path):
    sock.sendall(('GET %s HTTP/1.0\r\nHost: pod\r\n\r\n' % path).encode())
    data = b''
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data.decode()
        data += chunk


def test_two_pod_networks_with_the_same_subnet_take_the_same_pod_address_to_their_own_process(tmp_path):
    """Two labs at once, both with Talos's default pod subnet and the same pod address: each lab's proxy reaches its
    own process; no interface address, no route (nothing of the machine's) is involved."""
    first, second = _serve('first'), _serve('second')
    # a deep directory: the socket's path is longer than sun_path holds
    deep = tmp_path / ('d' * 60) / ('e' * 60)
    deep.mkdir(parents=True)
    one = PodNetwork('10.244.0.0/16', str(deep / 'pod-network.sock')).start()
    two = PodNetwork('10.244.0.0/16', str(tmp_path / 'two.sock')).start()
    try:
        assert len(one.socket_path) > 108
        one.expose('10.244.1.5', 8080, first.server_address)
        two.expose('10.244.1.5', 8080, second.server_address)
        for network, want in ((one, 'first'), (two, 'second')):
            status, sock = _connect(network, '10.244.1.5:8080')
            with sock:
                assert status == 'HTTP/1.1 200 Connection established'
                assert _get_through(sock, '/v1/cert.pem').endswith('\r\n\r\n%s /v1/cert.pem' % want)
        # another port of the pod, another pod: nothing plays them - refused, as a dial to them fails
        for target in ('10.244.1.5:8081', '10.244.1.6:8080'):
            status, sock = _connect(one, target)
            sock.close()
            assert status == 'HTTP/1.1 503 Service Unavailable', target
        one.forget('10.244.1.5')
        status, sock = _connect(one, '10.244.1.5:8080')
        sock.close()
        assert status.startswith('HTTP/1.1 503')
        with pytest.raises(PodNetworkError, match='not in the pod subnet 10.244.0.0/16'):
            one.expose('10.0.0.1', 8080, first.server_address)
        # outside the pod subnet (a node's address: the kubelet client takes the same egress) the proxy dials directly
        status, sock = _connect(one, '%s:%d' % first.server_address)
        with sock:
            assert status == 'HTTP/1.1 200 Connection established'
            assert _get_through(sock, '/direct').endswith('first /direct')
    finally:
        one.stop()
        two.stop()
        first.shutdown()
        second.shutdown()
    assert not os.path.exists(one.socket_path) and not os.path.exists(two.socket_path)


@pytest.fixture(scope='module')
def cp(tmp_path_factory):
    plane = ControlPlane(str(tmp_path_factory.mktemp('podnet-controlplane')))
    plane.start()
    yield plane
    plane.stop()


def _pod(name, labels):
    return {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': name, 'namespace': 'default', 'labels': labels},
            'spec': {'containers': [{'name': 'server', 'image': 'registry.k8s.io/pause:3.10',
                                     'ports': [{'name': 'http', 'containerPort': 8080}]}]}}


def _proxy_get(cp, path):
    return requests.get(cp.api_url + path, timeout=30, verify=cp.pki_file('ca.crt'),
                        cert=(cp.pki_file('admin.crt'), cp.pki_file('admin.key')))


def test_kube_apiservers_service_and_pod_proxy_reach_the_process_that_plays_the_pod(cp):
    cp.register_node('node-1', addresses=['127.0.0.31'], pod_cidr='10.244.9.0/24')

    def default_account():
        found = cp.api('GET', '/api/v1/namespaces/default/serviceaccounts')['items']
        return any(sa['metadata']['name'] == 'default' for sa in found), len(found)
    Lab.wait_until(default_account, WAIT, what='ServiceAccount default/default')
    cp.api('POST', '/api/v1/namespaces/default/pods', _pod('played', {'app': 'played'}), expect=(201,))
    cp.api('POST', '/api/v1/namespaces/default/pods', _pod('unplayed', {'app': 'unplayed'}), expect=(201,))
    for app in ('played', 'unplayed'):
        cp.api('POST', '/api/v1/namespaces/default/services', {
            'apiVersion': 'v1', 'kind': 'Service', 'metadata': {'name': app, 'namespace': 'default'},
            'spec': {'selector': {'app': app}, 'ports': [{'name': 'http', 'port': 80, 'targetPort': 'http'}]}},
            expect=(201,))
    server = _serve('played')
    try:
        ip = cp.expose_pod('default', 'played', {8080: server.server_address}, timeout=WAIT)
        assert ip.startswith('10.244.9.')

        def endpoints(name):
            def probe():
                found = cp.api('GET', '/api/v1/namespaces/default/endpoints/%s' % name, expect=(200, 404))
                ready = [a['ip'] for s in found.get('subsets') or () for a in s.get('addresses') or ()]
                return bool(ready), ready
            return Lab.wait_until(probe, WAIT, what='Endpoints default/%s' % name)
        assert endpoints('played') == [ip]
        endpoints('unplayed')
        # the way kubeseal reaches its controller: the Service's endpoint address, dialed through the egress
        answer = _proxy_get(cp, '/api/v1/namespaces/default/services/http:played:http/proxy/v1/cert.pem')
        assert answer.status_code == 200 and answer.text == 'played /v1/cert.pem', (answer.status_code, answer.text)
        answer = _proxy_get(cp, '/api/v1/namespaces/default/pods/http:played:8080/proxy/healthz')
        assert answer.status_code == 200 and answer.text == 'played /healthz', (answer.status_code, answer.text)
        # a pod that no process plays: kube-apiserver's dial fails, as with no listener at a pod address
        answer = _proxy_get(cp, '/api/v1/namespaces/default/services/http:unplayed:http/proxy/v1/cert.pem')
        assert answer.status_code == 503, (answer.status_code, answer.text)
        with open(os.path.join(cp.workdir, 'logs', 'pod-network.log'), encoding='utf-8') as handle:
            log = handle.read()
        assert 'CONNECT %s:8080 -> 127.0.0.1:%d' % (ip, server.server_address[1]) in log, log
    finally:
        server.shutdown()


def test_the_egress_configuration_names_the_socket_kube_apiserver_dials(cp):
    with open(cp.pki_file('egress-selector.yaml'), encoding='utf-8') as handle:
        text = handle.read()
    assert 'name: cluster' in text and 'proxyProtocol: HTTPConnect' in text
    # kube-apiserver runs in the work directory; the name is the socket's there
    name = [line.split(':', 1)[1].strip() for line in text.splitlines() if 'udsName' in line][0]
    assert os.path.samefile(os.path.join(cp.workdir, name), cp.pod_network.socket_path)
    assert stat.S_ISSOCK(os.stat(cp.pod_network.socket_path).st_mode)
