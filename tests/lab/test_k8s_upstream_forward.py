"""lab/k8s_upstream/forward.py: an address on which kube-apiserver answers, while it is on the link."""

import asyncio

import pytest

from lab.k8s_upstream.forward import AddressForward
from lab.k8s_upstream.controlplane import free_port


async def _echo_server():
    async def echo(reader, writer):
        while True:
            data = await reader.read(1024)
            if not data:
                break
            writer.write(b'echo:' + data)
            await writer.drain()
        writer.close()
    server = await asyncio.start_server(echo, '127.0.0.1', 0)
    return server, server.sockets[0].getsockname()[1]


def test_bytes_go_through_both_ways_and_closing_cuts_the_connections_and_the_listener():
    async def scenario():
        server, port = await _echo_server()
        address = '127.0.0.%d' % 77
        forward_port = free_port(address)
        forward = AddressForward(address, forward_port, '127.0.0.1', port)
        await forward.start()
        reader, writer = await asyncio.open_connection(address, forward_port)
        writer.write(b'ping')
        await writer.drain()
        assert await asyncio.wait_for(reader.read(1024), 10) == b'echo:ping'
        await forward.close()
        # the open connection is cut (end of stream or reset), and nothing listens on the address any more
        try:
            assert await asyncio.wait_for(reader.read(1024), 10) == b''
        except ConnectionError:
            pass
        writer.close()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(address, forward_port)
        server.close()
        await server.wait_closed()
    asyncio.run(scenario())


def test_a_connection_while_kube_apiserver_is_down_is_closed_and_the_forward_keeps_listening():
    async def scenario():
        address = '127.0.0.%d' % 78
        forward_port = free_port(address)
        target_port = free_port()   # nothing listens there
        forward = AddressForward(address, forward_port, '127.0.0.1', target_port)
        await forward.start()
        try:
            reader, writer = await asyncio.open_connection(address, forward_port)
            assert await asyncio.wait_for(reader.read(1024), 10) == b''
            writer.close()
            server, port = await _echo_server()
            forward.target = ('127.0.0.1', port)
            reader, writer = await asyncio.open_connection(address, forward_port)
            writer.write(b'up')
            await writer.drain()
            assert await asyncio.wait_for(reader.read(1024), 10) == b'echo:up'
            writer.close()
            server.close()
        finally:
            await forward.close()
    asyncio.run(scenario())
