"""The lab's pod network, as far as kube-apiserver sees it: an HTTP CONNECT proxy of one control plane that
kube-apiserver's `cluster` egress dials through, mapping the (pod IP, port) of a pod whose container the lab runs as a
process to the loopback address where that process listens.

Why: kwok gives each pod an address of the pod subnet that nothing on this machine answers. kube-apiserver reaches
pods through its service and pod proxy (GET /api/v1/namespaces/NS/services/SCHEME:NAME:PORT/proxy/PATH, what kubeseal
and the collection's sealed_cert_gate use): the Service's REST storage picks a ready endpoint address and port
(k8s.io/kubernetes@v1.36.3 pkg/registry/core/service/storage/storage.go:423-494, ResourceLocation) and the proxy
handler dials it with the control plane's ProxyTransport (pkg/registry/core/service/proxy.go:66-78). With an egress
selector configured, kube-apiserver replaces that transport's DialContext by the dialer of the `cluster` egress
selection (cmd/kube-apiserver/app/server.go:249-261), and the core REST storage of services, pods and nodes gets that
transport (pkg/controlplane/instance.go:388-392; Extra, which holds it, is embedded in that Config:
pkg/controlplane/apiserver/config.go:66-69). An HTTPConnect egress over a unix socket connects to the socket
(k8s.io/apiserver@v0.36.3 pkg/server/egressselector/egress_selector.go:198-209) and writes `CONNECT host:port
HTTP/1.1`, then wants a 200 status and nothing buffered after the response's head (tunnelHTTPConnect, 112-144); the
connection is then the one to host:port. This proxy answers that. A unix socket, not TCP: the TCP transport always
speaks TLS with a client certificate (tcpHTTPConnectConnector.connect, 187-196, and getTLSConfig, 278-305, which reads
the tlsConfig an http:// URL may not have: config.go:186-195), which a proxy of the lab's own would only imitate.

No machine state: no address is added to an interface and no route changed, so two labs with the same pod subnet run
side by side: each kube-apiserver has its own egress configuration naming its own socket, in its control plane's work
directory.

What the proxy does with a CONNECT to host:port:
- host in the pod subnet, (host, port) exposed: 200, then bytes relayed both ways to the process's address;
- host in the pod subnet, not exposed: 503 - no process plays that pod at that port (what a pod without a listener
  gives kube-apiserver: a failed dial, reported to the client as 503 by the proxy handler);
- any other host (a node address for the kubelet client, which takes the same egress lookup: server.go:249-251):
  dialed directly, as the `Direct` egress kube-apiserver has without a configuration would.
"""

import ipaddress
import logging
import os
import select
import socket
import socketserver
import threading

LOG = logging.getLogger('lab.k8s_upstream.podnet')
DIAL_TIMEOUT = 10.0
MAX_HEAD = 64 * 1024  # bytes of a CONNECT request's head the proxy reads before it gives up on the client
RELAY_CHUNK = 64 * 1024


class PodNetworkError(Exception):
    """A pod address that is not in the pod subnet, or a proxy that is not running."""


# what fits in sockaddr_un.sun_path (108 bytes with the terminating NUL)
UNIX_PATH_MAX = 107


def egress_selector_configuration(uds_name):
    """The EgressSelectorConfiguration (apiserver.k8s.io/v1beta1) with one selection, `cluster`, over HTTPConnect to the
    unix socket uds_name: k8s.io/apiserver@v0.36.3 pkg/apis/apiserver/v1beta1/types.go:27-99 (EgressSelection,
    Connection, Transport.UDS), validated by pkg/server/egressselector/config.go:118-142 and 175-184 (a udsName is
    required, nothing more). The other selections (controlplane, etcd) stay Direct."""
    return {
        'apiVersion': 'apiserver.k8s.io/v1beta1', 'kind': 'EgressSelectorConfiguration',
        'egressSelections': [{'name': 'cluster',
                              'connection': {'proxyProtocol': 'HTTPConnect', 'transport': {'uds': {'udsName': uds_name}}}}],
    }


def short_unix_path(path):
    """path, or a name of the same file that fits in sun_path: /proc/self/fd/N/<name> through an open descriptor of
    its directory (Linux), with that descriptor (the caller closes it after the bind or connect) - else None."""
    if len(os.fsencode(path)) <= UNIX_PATH_MAX:
        return path, None
    directory = os.open(os.path.dirname(path) or '.', os.O_RDONLY | os.O_DIRECTORY)
    return '/proc/self/fd/%d/%s' % (directory, os.path.basename(path)), directory


def connect_unix(path, timeout=DIAL_TIMEOUT):
    """A stream socket connected to the unix socket at path (however long the path)."""
    name, directory = short_unix_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(name)
    except OSError:
        sock.close()
        raise
    finally:
        if directory is not None:
            os.close(directory)
    return sock


def _read_head(conn):
    """The bytes of an HTTP request head (up to and with the blank line), or None when the client closed or sent too much."""
    data = b''
    while b'\r\n\r\n' not in data:
        chunk = conn.recv(4096)
        if not chunk or len(data) + len(chunk) > MAX_HEAD:
            return None
        data += chunk
    return data


def _relay(one, other):
    """Copy bytes both ways until either side closes; the other side is then shut for writing."""
    sockets = [one, other]
    peer = {one: other, other: one}
    open_reads = set(sockets)
    while open_reads:
        readable, _w, _x = select.select(list(open_reads), [], [])
        for sock in readable:
            try:
                chunk = sock.recv(RELAY_CHUNK)
            except OSError:
                chunk = b''
            if chunk:
                try:
                    peer[sock].sendall(chunk)
                    continue
                except OSError:
                    return
            open_reads.discard(sock)
            try:
                peer[sock].shutdown(socket.SHUT_WR)
            except OSError:
                pass


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        network = self.server.network
        conn = self.request
        head = _read_head(conn)
        if head is None:
            return
        line = head.split(b'\r\n', 1)[0].decode('latin-1')
        parts = line.split()
        if len(parts) != 3 or parts[0] != 'CONNECT':
            network.record('refused %r: not a CONNECT' % line)
            conn.sendall(b'HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n')
            return
        host, _colon, port = parts[1].rpartition(':')
        host = host.strip('[]')
        try:
            target = network.route(host, int(port))
        except (ValueError, PodNetworkError) as exc:
            network.record('CONNECT %s: 503 %s' % (parts[1], exc))
            reason = str(exc).replace('\r', ' ').replace('\n', ' ')
            conn.sendall(('HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n'
                          'X-Lab-Reason: %s\r\n\r\n' % reason).encode('latin-1', 'replace'))
            return
        try:
            upstream = socket.create_connection(target, timeout=DIAL_TIMEOUT)
        except OSError as exc:
            network.record('CONNECT %s -> %s:%d: 502 %s' % (parts[1], target[0], target[1], exc))
            conn.sendall(b'HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n')
            return
        network.record('CONNECT %s -> %s:%d' % (parts[1], target[0], target[1]))
        with upstream:
            upstream.settimeout(None)
            conn.sendall(b'HTTP/1.1 200 Connection established\r\n\r\n')
            _relay(conn, upstream)


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, path, network):
        self.network = network
        super().__init__(path, _Handler)

    def server_bind(self):
        name, directory = short_unix_path(self.server_address)
        try:
            self.socket.bind(name)
        finally:
            if directory is not None:
                os.close(directory)


class PodNetwork:
    """The CONNECT proxy of one control plane, on the unix socket socket_path; the pods the lab plays by (IP, port)."""

    def __init__(self, pod_subnet, socket_path, log_path=None):
        self.pod_subnet = ipaddress.ip_network(pod_subnet)
        self.socket_path = os.path.abspath(socket_path)
        self.log_path = log_path
        self._routes = {}   # (pod IP, port) -> (host, port) where the process listens
        self._lock = threading.Lock()
        self._server = None
        self._thread = None

    @property
    def running(self):
        return self._server is not None

    def start(self):
        if self._server is None:
            if os.path.lexists(self.socket_path):  # an earlier start's, whose owner died without stop()
                os.unlink(self.socket_path)
            self._server = _Server(self.socket_path, self)
            self._thread = threading.Thread(target=self._server.serve_forever, name='lab-pod-network', daemon=True)
            self._thread.start()
        return self

    def stop(self):
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = self._thread = None
            if os.path.lexists(self.socket_path):
                os.unlink(self.socket_path)

    def _pod_ip(self, ip):
        address = ipaddress.ip_address(ip)
        if address not in self.pod_subnet:
            raise PodNetworkError('%s is not in the pod subnet %s' % (ip, self.pod_subnet))
        return str(address)

    def expose(self, pod_ip, port, target):
        """Connections to pod_ip:port go to target (host, port), where the process playing that pod listens."""
        with self._lock:
            self._routes[(self._pod_ip(pod_ip), int(port))] = (target[0], int(target[1]))
        self.record('expose %s:%d -> %s:%d' % (pod_ip, int(port), target[0], int(target[1])))

    def forget(self, pod_ip):
        """The pod is gone: none of its ports is exposed any longer."""
        ip = self._pod_ip(pod_ip)
        with self._lock:
            for key in [key for key in self._routes if key[0] == ip]:
                del self._routes[key]
        self.record('forget %s' % ip)

    def routes(self):
        with self._lock:
            return dict(self._routes)

    def route(self, host, port):
        """Where a connection to host:port goes: the exposed process of a pod, or host itself outside the pod subnet."""
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return host, port   # a name (not what kube-apiserver's proxy dials; a Direct dial would resolve it)
        if address not in self.pod_subnet:
            return str(address), port
        with self._lock:
            target = self._routes.get((str(address), port))
        if target is None:
            raise PodNetworkError('no process of the lab plays pod %s at port %d' % (address, port))
        return target

    def record(self, text):
        LOG.debug('%s', text)
        if self.log_path:
            with open(self.log_path, 'a', encoding='utf-8') as handle:
                handle.write(text + '\n')

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
