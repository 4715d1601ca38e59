"""An address of a control plane on which kube-apiserver answers, as a TCP forward to the one real kube-apiserver.

On a Talos control plane kube-apiserver listens on every address of the node (siderolabs/talos v1.13.9
internal/app/machined/pkg/controllers/k8s/control_plane_static_pod.go:361, bind-address 0.0.0.0): its own address
and, while the node holds it, the shared VIP. The upstream world runs one kube-apiserver per cluster on a private
address of its own; an AddressForward stands for "this address is on a control plane's link now": it accepts on
ADDRESS:6443 and copies bytes both ways to kube-apiserver (TLS and HTTP stay end to end, it answers nothing itself).
Closing it drops the address: no listener, and the connections through it are cut, as when the address leaves the
link.

    forward = AddressForward('127.0.10.10', 6443, '127.0.0.1', 40123)
    await forward.start()
    await forward.close()
"""

import asyncio
import logging

LOG = logging.getLogger('lab.k8s_upstream')
CHUNK = 65536


async def close_listener(listener):
    """Stop listener.server (an asyncio Server) accepting, cut its open connections (the tasks in
    listener.connections) and wait until all is closed; listener.server is None after."""
    server, listener.server = listener.server, None
    if server is not None:
        server.close()
    for task in list(listener.connections):
        task.cancel()
    if listener.connections:
        await asyncio.gather(*listener.connections, return_exceptions=True)
    listener.connections.clear()
    if server is not None:
        await server.wait_closed()   # (Python 3.12 waits here for the connections cut above)


class AddressForward(object):
    """host:port -> target_host:target_port, byte for byte, until closed."""

    def __init__(self, host, port, target_host, target_port):
        self.host = host
        self.port = port
        self.target = (target_host, target_port)
        self.server = None
        self.connections = set()   # the copying tasks of open connections

    async def start(self):
        self.server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)

    async def _accept(self, reader, writer):
        task = asyncio.current_task()
        self.connections.add(task)
        try:
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
            except OSError as exc:
                LOG.info('%s:%d: kube-apiserver at %s:%d refused the connection: %s', self.host, self.port, self.target[0],
                         self.target[1], exc)
                return
            try:
                await asyncio.gather(_copy(reader, upstream_writer), _copy(upstream_reader, writer))
            finally:
                upstream_writer.close()
        finally:
            writer.close()
            self.connections.discard(task)

    async def close(self):
        await close_listener(self)


async def _copy(reader, writer):
    """Bytes from reader to writer until end of stream, then half-close the writer."""
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()
