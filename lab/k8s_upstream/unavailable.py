"""An address of the API whose load balancer has no healthy backend: TLS with kube-apiserver's own certificate, then
503 to every request.

Where a client meets a 503 from the API endpoint in practice, the endpoint is a load balancer that terminates TLS
(an HTTP-mode HAProxy, `bind :6443 ssl crt <the apiserver's certificate and key>`) and finds no backend to pass the
request to. HAProxy then answers its built-in 503 (haproxy/haproxy v3.5-dev5 src/http.c:338-344, HTTP_ERR_503):

    HTTP/1.1 503 Service Unavailable
    Content-length: 107
    Cache-Control: no-cache
    Content-Type: text/html

    <html><body><h1>503 Service Unavailable</h1>
    No server is available to handle this request.
    </body></html>

An UnavailableFront plays that load balancer in the down half of the fault k8s-api-flap mode=503 (lab/k8s_upstream/
lab.py): it listens on ADDRESS:6443 in place of the AddressForward, presents kube-apiserver's serving certificate
(the lab made the cluster's PKI, so it holds the key), asks for a client certificate signed by the cluster CA only to
name the user in the lab's request log (HAProxy's `verify optional`), and answers every request with those bytes.
It reads each request whole (headers and a Content-Length body), so a kept-alive connection gets one answer per
request; a request body it cannot measure (chunked) gets the answer and the connection closes.

    front = UnavailableFront('127.0.10.10', 6443, 'apiserver.crt', 'apiserver.key', 'ca.crt', on_request)
    await front.start()      # on_request(method, target, user) for every answered request
    await front.close()
"""

import asyncio
import logging
import ssl

from lab.k8s_upstream.forward import close_listener

LOG = logging.getLogger('lab.k8s_upstream')
ANSWER_BODY = (b'<html><body><h1>503 Service Unavailable</h1>\nNo server is available to handle this request.\n'
               b'</body></html>\n')
ANSWER = (b'HTTP/1.1 503 Service Unavailable\r\nContent-length: %d\r\nCache-Control: no-cache\r\n'
          b'Content-Type: text/html\r\n\r\n' % len(ANSWER_BODY)) + ANSWER_BODY
MAX_HEADER_BYTES = 1 << 20


class UnavailableFront(object):
    """host:port answers 503 over TLS with kube-apiserver's certificate, until closed."""

    def __init__(self, host, port, cert_file, key_file, client_ca_file, on_request):  # pylint: disable=too-many-arguments
        self.host = host
        self.port = port
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert_file, key_file)
        self.context.load_verify_locations(cafile=client_ca_file)
        self.context.verify_mode = ssl.CERT_OPTIONAL
        self.context.set_alpn_protocols(['http/1.1'])
        self.on_request = on_request
        self.server = None
        self.connections = set()

    async def start(self):
        self.server = await asyncio.start_server(self._accept, self.host, self.port, ssl=self.context, reuse_address=True)

    async def _accept(self, reader, writer):
        task = asyncio.current_task()
        self.connections.add(task)
        try:
            user = _user(writer.get_extra_info('peercert'))
            while await self._answer(reader, writer, user):
                pass
            writer.close()
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ssl.SSLError):
            writer.close()
        except asyncio.CancelledError:
            # close() cuts the connection: no TLS close_notify exchange, which would wait on a client that keeps
            # the connection idle in its pool (asyncio's ssl_shutdown_timeout, 30 s)
            writer.transport.abort()
        finally:
            self.connections.discard(task)

    async def _answer(self, reader, writer, user):
        """Read one request and answer it; True when the connection can carry another."""
        head = await reader.readuntil(b'\r\n\r\n')
        if len(head) > MAX_HEADER_BYTES:
            return False
        lines = head.decode('latin-1').split('\r\n')
        method, target = (lines[0].split(' ') + ['', ''])[:2]
        headers = dict((name.strip().lower(), value.strip()) for name, _colon, value in
                       (line.partition(':') for line in lines[1:] if line))
        keep = 'chunked' not in headers.get('transfer-encoding', '').lower()
        length = headers.get('content-length', '0')
        keep = keep and length.isdigit()
        if keep and int(length):
            await reader.readexactly(int(length))
        self.on_request(method, target, user)
        writer.write(ANSWER)
        await writer.drain()
        return keep and headers.get('connection', '').lower() != 'close'

    async def close(self):
        await close_listener(self)


def _user(peercert):
    """The common name of the client certificate (the Kubernetes user name), or None without one."""
    for field in (peercert or {}).get('subject', ()):
        for key, value in field:
            if key == 'commonName':
                return value
    return None
