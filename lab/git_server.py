"""A Git server on loopback that speaks Git's smart HTTP protocol, over HTTP or HTTPS.

The protocol is not imitated: every request is handed to `git http-backend`, Git's own CGI program for smart
HTTP (git-http-backend(1); Debian 12's git 2.39), run once per request with the CGI/1.1 variables it reads
(GIT_PROJECT_ROOT, PATH_INFO, QUERY_STRING, REQUEST_METHOD, CONTENT_TYPE, CONTENT_LENGTH, REMOTE_USER,
HTTP_CONTENT_ENCODING, GIT_PROTOCOL) and its CGI answer (a Status: line and headers, a blank line, the body)
turned into the HTTP response. This module only does what a web server in front of http-backend does:
HTTP basic authentication, TLS, and de-chunking a request body sent with Transfer-Encoding: chunked (git's
client does so for pushes larger than http.postBuffer).

Repositories are bare repositories under one root directory, served at /<path>.git. So source-controller (go-git)
really clones and fetches, and the collection's gitops_commit (git's client) really pushes:

    with SmartGitServer(root, credentials=('flux', 'secret'), tls=(cert_pem, key_pem)) as server:
        server.create_repo('proxtalos/lab-gitops')
        server.url_for('proxtalos/lab-gitops')     # https://127.0.0.1:<port>/proxtalos/lab-gitops.git

Pushes are allowed to an authenticated user (http-backend enables receive-pack when REMOTE_USER is set) and,
when the server has no credentials, to anyone (http.receivepack=true for that server only).
"""

import base64
import hmac
import http.server
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import urllib.parse

HOST = '127.0.0.1'
BACKEND_TIMEOUT = 120.0


class GitServerError(Exception):
    """The server could not start, or a repository could not be made."""


def _read_chunked(stream):
    """The body of a Transfer-Encoding: chunked request (RFC 9112 section 7.1), trailers dropped."""
    body = bytearray()
    while True:
        line = stream.readline(65537)
        size = int(line.split(b';', 1)[0].strip() or b'0', 16)
        if size == 0:
            while stream.readline(65537) not in (b'\r\n', b'\n', b''):
                pass
            return bytes(body)
        body += stream.read(size)
        stream.readline(3)  # the CRLF after each chunk


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    server_version = 'proxtalos-lab-git'

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        self.server.owner.log.append('%s %s' % (self.command, self.path))

    def _deny(self):
        body = b'authentication required\n'
        self.send_response(401)
        self.send_header('WWW-Authenticate', 'Basic realm="proxtalos lab git"')
        self.send_header('Content-Type', 'text/plain')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _user(self):
        """(allowed, user): the basic-auth user when the server has credentials; ('', True) when it has none."""
        credentials = self.server.owner.credentials
        if credentials is None:
            return True, ''
        header = self.headers.get('Authorization', '')
        scheme, dummy, value = header.partition(' ')
        if scheme.lower() != 'basic':
            return False, None
        try:
            user, dummy, password = base64.b64decode(value.strip()).decode('utf-8').partition(':')
        except (ValueError, UnicodeDecodeError):
            return False, None
        ok = hmac.compare_digest(user.encode(), credentials[0].encode()) & hmac.compare_digest(password.encode(), credentials[1].encode())
        return ok, user if ok else None

    def _serve(self):
        owner = self.server.owner
        url = urllib.parse.urlsplit(self.path)
        if owner.down or owner.refuses(url.path):
            self.send_response(503)
            self.send_header('Content-Length', '0')
            self.end_headers()
            return
        allowed, user = self._user()
        if self.headers.get('Transfer-Encoding', '').lower() == 'chunked':
            body = _read_chunked(self.rfile)
        else:
            body = self.rfile.read(int(self.headers.get('Content-Length') or 0))
        if not allowed:
            self._deny()
            return
        env = {
            'PATH': os.environ.get('PATH', '/usr/bin:/bin'),
            'GIT_PROJECT_ROOT': owner.root,
            'GIT_HTTP_EXPORT_ALL': '1',
            'GATEWAY_INTERFACE': 'CGI/1.1',
            'SERVER_PROTOCOL': 'HTTP/1.1',
            'REQUEST_METHOD': self.command,
            'PATH_INFO': urllib.parse.unquote(url.path),
            'QUERY_STRING': url.query,
            'CONTENT_TYPE': self.headers.get('Content-Type', ''),
            'CONTENT_LENGTH': str(len(body)),
            'REMOTE_ADDR': self.client_address[0],
            'HOME': owner.root,
        }
        if user:
            env['REMOTE_USER'] = user
        else:
            # no credentials on this server: anyone may push (http-backend's receive-pack needs REMOTE_USER or this)
            env.update(GIT_CONFIG_COUNT='1', GIT_CONFIG_KEY_0='http.receivepack', GIT_CONFIG_VALUE_0='true')
        if self.headers.get('Content-Encoding'):
            env['HTTP_CONTENT_ENCODING'] = self.headers['Content-Encoding']
        if self.headers.get('Git-Protocol'):
            env['GIT_PROTOCOL'] = self.headers['Git-Protocol']
        try:
            done = subprocess.run(['git', 'http-backend'], input=body, capture_output=True, env=env, check=False,
                                  timeout=BACKEND_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.send_error(504, 'git http-backend did not answer within %d s' % BACKEND_TIMEOUT)
            return
        self._answer(done)

    def _answer(self, done):
        head, sep, payload = done.stdout.partition(b'\r\n\r\n')
        if not sep:
            head, sep, payload = done.stdout.partition(b'\n\n')
        if not sep:
            self.server.owner.log.append('http-backend exit %d: %s' % (done.returncode, done.stderr.decode(errors='replace')[-500:]))
            self.send_error(500, 'git http-backend gave no CGI answer')
            return
        status, headers = 200, []
        for line in head.decode('latin-1').splitlines():
            name, dummy, value = line.partition(':')
            if name.lower() == 'status':
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name.strip(), value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header('Content-Length', str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = _serve
    do_POST = _serve


class SmartGitServer:
    """Bare repositories under root, served by `git http-backend` on 127.0.0.1 (a free port unless given)."""

    def __init__(self, root, credentials=None, tls=None, host=HOST, port=0):
        self.root = os.path.abspath(root)
        self.credentials = tuple(credentials) if credentials else None
        self.tls = tls  # (cert_pem, key_pem) of the serving certificate, or None for plain HTTP
        self.host = host
        self.port = port
        self.down = False  # True: every request answers 503 (a server that is down)
        self.down_repos = set()  # repository paths ('owner/name') whose requests answer 503 (fault flux-source-not-ready)
        self.log = []
        self._httpd = None
        self._thread = None

    @property
    def scheme(self):
        return 'https' if self.tls else 'http'

    def url_for(self, path, credentials=False):
        """The clone URL of the repository at path; with credentials=True, the user and password in it (for git's CLI)."""
        auth = ''
        if credentials and self.credentials:
            auth = '%s:%s@' % tuple(urllib.parse.quote(part, safe='') for part in self.credentials)
        return '%s://%s%s:%d/%s.git' % (self.scheme, auth, self.host, self.port, path.strip('/').removesuffix('.git'))

    @staticmethod
    def repo_path(url_path):
        """The repository path ('owner/name') a request path or clone URL path names: the part before '.git'."""
        return urllib.parse.unquote(url_path).strip('/').split('.git', 1)[0].strip('/')

    def refuses(self, url_path):
        """Whether a request for url_path answers 503: its repository is one of down_repos."""
        return bool(self.down_repos) and self.repo_path(url_path) in self.down_repos

    def repo_dir(self, path):
        return os.path.join(self.root, path.strip('/').removesuffix('.git') + '.git')

    def create_repo(self, path, branch='main'):
        """A new empty bare repository at path (its HEAD on branch); returns its directory."""
        directory = self.repo_dir(path)
        done = subprocess.run(['git', 'init', '--quiet', '--bare', '--initial-branch=' + branch, directory],
                              capture_output=True, text=True, check=False, timeout=60)
        if done.returncode != 0:
            raise GitServerError('git init --bare %s: %s' % (directory, done.stderr.strip()))
        return directory

    def start(self):
        os.makedirs(self.root, exist_ok=True)
        try:
            httpd = http.server.ThreadingHTTPServer((self.host, self.port), _Handler)
        except OSError as exc:
            raise GitServerError('cannot listen on %s:%s: %s' % (self.host, self.port, exc)) from exc
        httpd.daemon_threads = True
        httpd.owner = self
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            with tempfile.TemporaryDirectory() as scratch:
                cert, key = os.path.join(scratch, 'tls.crt'), os.path.join(scratch, 'tls.key')
                for path, text in ((cert, self.tls[0]), (key, self.tls[1])):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
                    with os.fdopen(fd, 'w', encoding='utf-8') as handle:
                        handle.write(text)
                context.load_cert_chain(cert, key)
            httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self._thread = threading.Thread(target=httpd.serve_forever, name='lab-git-%d' % self.port, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=10)
            self._httpd = self._thread = None

    def remove(self):
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
