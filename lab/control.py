"""The control endpoint: a Unix socket, one JSON object a line each way.

    request:  {"op": "fault", "name": "pve-5xx", "target": null, "params": {"times": 2}}
    answer:   {"ok": true, "result": ...}   or   {"ok": false, "error": "what was wrong"}

A client may send several requests on one connection; answers come back in order. The ops are
World.control's (status, faults, fault, clear, delays, requests, events, reset, ping, shutdown).
"""

import asyncio
import json
import logging
import os
import socket

LOG = logging.getLogger('lab.control')
MAX_LINE = 1024 * 1024
DEFAULT_TIMEOUT = 60.0


class ControlError(Exception):
    """The lab answered a request with an error."""


class LabNotRunning(ControlError):
    """Nothing answers on the control socket."""


class ControlServer(object):
    """Serves handler(request dict) -> result on a Unix socket (mode 0600)."""

    def __init__(self, path, handler, errors=(ValueError, KeyError)):
        self.path = path
        self.handler = handler
        self.errors = tuple(errors) + (ControlError,)
        self.server = None
        self._writers = set()

    async def start(self):
        if len(self.path.encode()) > 107:
            raise ValueError('control socket path is too long for a Unix socket (%d bytes, 107 at most): %s; '
                             'use a shorter --run-dir' % (len(self.path.encode()), self.path))
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.server = await asyncio.start_unix_server(self._serve, self.path, limit=MAX_LINE)
        os.chmod(self.path, 0o600)

    async def close(self):
        if self.server is not None:
            self.server.close()
            for writer in list(self._writers):
                writer.close()
            await self.server.wait_closed()
            self.server = None
        if os.path.exists(self.path):
            os.unlink(self.path)

    async def _serve(self, reader, writer):
        self._writers.add(writer)
        try:
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    await self._send(writer, {'ok': False, 'error': 'request longer than %d bytes' % MAX_LINE})
                    break
                if not line:
                    break
                answer = await self._answer(line)
                await self._send(writer, answer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, line):
        try:
            request = json.loads(line)
            if not isinstance(request, dict) or not isinstance(request.get('op'), str):
                raise ValueError('a request is a JSON object with "op" (a string)')
        except ValueError as exc:
            return {'ok': False, 'error': 'bad request: %s' % exc}
        try:
            return {'ok': True, 'result': await self.handler(request)}
        except self.errors as exc:  # pylint: disable=catching-non-exception
            return {'ok': False, 'error': exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], str) else str(exc)}
        except Exception as exc:  # pylint: disable=broad-except
            LOG.exception('control op %s failed', request.get('op'))
            return {'ok': False, 'error': 'internal error in the lab: %s: %s' % (exc.__class__.__name__, exc)}

    @staticmethod
    async def _send(writer, answer):
        writer.write(json.dumps(answer, default=str).encode() + b'\n')
        await writer.drain()


def call(path, op, timeout=DEFAULT_TIMEOUT, **params):
    """Send one request to the lab at socket `path`; returns its result or raises ControlError/LabNotRunning."""
    request = dict(params, op=op)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise LabNotRunning('no lab answers on %s (%s)' % (path, exc.strerror or exc)) from None
        sock.sendall(json.dumps(request).encode() + b'\n')
        data = b''
        while not data.endswith(b'\n'):
            chunk = sock.recv(65536)
            if not chunk:
                raise ControlError('the lab closed the connection before answering %r' % op)
            data += chunk
    except socket.timeout:
        raise ControlError('the lab did not answer %r within %.0f s' % (op, timeout)) from None
    finally:
        sock.close()
    answer = json.loads(data)
    if not answer.get('ok'):
        raise ControlError(answer.get('error') or 'the lab refused %r' % op)
    return answer.get('result')
