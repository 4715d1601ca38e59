"""The lab's "internet" for the collection's upstream artifacts: an HTTPS mirror on loopback.

It serves the pinned upstream files (roles/flux/vars/artifacts.yml) from the per-machine cache that
`make setup` fills from the upstream Go modules (lab/artifacts.py), in the raw-file host's layout
`/<repo>/<ref>/<path>`, so that the lab inventory only changes the base URL (flux_artifacts_base_url)
and the role downloads and checks the same bytes as on a real site. Only pinned paths are served
(anything else is 404); a pinned file missing from the cache is 404 with a body that says to run
`make setup`. Its certificate is issued by a CA the mirror makes at each start; the lab writes

    <run-dir>/artifact-mirror.url      https://127.0.0.1:<port>
    <run-dir>/artifact-mirror-ca.crt   the CA the lab inventory trusts (flux_artifacts_ca_path)

The server key stays in memory and in a 0600 file of the run dir (Python's ssl module loads keys from files).
"""

import http.server
import logging
import os
import ssl
import threading

from lab import artifacts
from lab import pki

LOG = logging.getLogger('lab.artifact_mirror')
URL_FILE = 'artifact-mirror.url'
CA_FILE = 'artifact-mirror-ca.crt'
KEY_FILE = 'artifact-mirror.key'
CERT_FILE = 'artifact-mirror.crt'


def _write(path, text, mode):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, 'w', encoding='utf-8') as handle:
        handle.write(text)
    os.chmod(path, mode)


class ArtifactMirror(object):
    """An HTTPS server on 127.0.0.1 serving the pinned artifacts from the cache (root)."""

    def __init__(self, run_dir, root=None, host='127.0.0.1'):
        self.run_dir = run_dir
        self.root = root or artifacts.cache_dir()
        self.host = host
        self.entries = {artifacts.url_path(entry): entry for entry in artifacts.files()}
        self.served = []          # (path, status) of each request, for status and tests
        self._server = None
        self._thread = None
        self.url = None
        self.port = None
        self.ca_path = os.path.join(run_dir, CA_FILE)

    def start(self):
        os.makedirs(self.run_dir, exist_ok=True)
        ca_cert, ca_key = pki.make_ca('proxtalos lab artifact mirror CA')
        cert, key = pki.issue(ca_cert, ca_key, self.host, ip_addresses=[self.host], dns_names=['localhost'], server=True)
        cert_path, key_path = os.path.join(self.run_dir, CERT_FILE), os.path.join(self.run_dir, KEY_FILE)
        _write(key_path, key, 0o600)
        _write(cert_path, cert, 0o644)
        _write(self.ca_path, ca_cert, 0o644)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_path, key_path)
        mirror = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                mirror._answer(self, body=True)  # pylint: disable=protected-access

            def do_HEAD(self):  # noqa: N802
                mirror._answer(self, body=False)  # pylint: disable=protected-access

            def log_message(self, format, *args):  # pylint: disable=redefined-builtin
                LOG.debug('mirror: ' + format, *args)

        self._server = http.server.ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self.url = 'https://%s:%d' % (self.host, self.port)
        _write(os.path.join(self.run_dir, URL_FILE), self.url + '\n', 0o644)
        self._thread = threading.Thread(target=self._server.serve_forever, name='artifact-mirror', daemon=True)
        self._thread.start()
        absent = artifacts.missing(self.root)
        if absent:
            LOG.warning('artifact mirror: %d pinned file(s) not in the cache %s (run make setup): %s', len(absent), self.root,
                        ', '.join(artifacts.url_path(entry) for entry in absent[:3]))
        LOG.info('artifact mirror at %s (%d pinned files)', self.url, len(self.entries))
        return self

    def _answer(self, request, body):
        path = request.path.split('?', 1)[0]
        entry = self.entries.get(path)
        local = artifacts.cached_path(entry, self.root) if entry else None
        if entry is None or not local.is_file():
            text = ('not a pinned artifact: %s\n' % path if entry is None else
                    'pinned artifact %s is not in the lab cache %s: run make setup\n' % (path, self.root)).encode()
            status = 404
            request.send_response(status)
            request.send_header('Content-Type', 'text/plain; charset=utf-8')
            request.send_header('Content-Length', str(len(text)))
            request.end_headers()
            if body:
                request.wfile.write(text)
        else:
            data = local.read_bytes()
            status = 200
            request.send_response(status)
            request.send_header('Content-Type', 'text/plain; charset=utf-8')
            request.send_header('Content-Length', str(len(data)))
            request.end_headers()
            if body:
                request.wfile.write(data)
        self.served.append((path, status))

    def stop(self):
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
