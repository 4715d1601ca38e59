"""The lab's smart-HTTP Git server (lab/git_server.py) with git's own client: clone, push (a body large
enough that git sends it chunked), basic auth, TLS and a server that is down. Needs only git."""

import io
import os
import subprocess

import pytest

from lab.flux_upstream import controllers
from lab.git_server import SmartGitServer, _read_chunked
from lab import pki

IDENTITY = dict(GIT_AUTHOR_NAME='lab', GIT_AUTHOR_EMAIL='lab@lab.invalid', GIT_COMMITTER_NAME='lab',
                GIT_COMMITTER_EMAIL='lab@lab.invalid', GIT_TERMINAL_PROMPT='0')


def _git(*args, env=None, check=True):
    done = subprocess.run(['git'] + list(args), capture_output=True, text=True, timeout=120, check=False,
                          env=dict(os.environ, **IDENTITY, **(env or {})))
    if check:
        assert done.returncode == 0, done.stderr
    return done


@pytest.fixture
def tls_server(tmp_path):
    ca = pki.make_ca('lab-git')
    (tmp_path / 'ca.crt').write_text(ca[0])
    server = SmartGitServer(str(tmp_path / 'srv'), credentials=('flux', 'pw'),
                            tls=pki.issue(ca[0], ca[1], '127.0.0.1', server=True, ip_addresses=['127.0.0.1']))
    with server:
        server.create_repo('team/repo')
        yield server, {'GIT_SSL_CAINFO': str(tmp_path / 'ca.crt')}


def test_clone_push_and_clone_again_over_https_with_basic_auth(tls_server, tmp_path):
    server, env = tls_server
    work = str(tmp_path / 'work')
    _git('clone', '--quiet', server.url_for('team/repo', credentials=True), work, env=env)
    # incompressible content over git's default http.postBuffer (1 MiB): the push body comes chunked
    with open(os.path.join(work, 'blob.bin'), 'wb') as handle:
        handle.write(os.urandom(3 * 1024 * 1024))
    _git('-C', work, 'checkout', '--quiet', '-b', 'main')
    _git('-C', work, 'add', 'blob.bin')
    _git('-C', work, 'commit', '--quiet', '-m', 'a large file')
    _git('-C', work, 'push', '--quiet', 'origin', 'main', env=env)
    pushed = _git('-C', work, 'rev-parse', 'HEAD').stdout.strip()
    assert _git('-C', server.repo_dir('team/repo'), 'rev-parse', 'refs/heads/main').stdout.strip() == pushed
    again = str(tmp_path / 'again')
    _git('clone', '--quiet', server.url_for('team/repo', credentials=True), again, env=env)
    assert _git('-C', again, 'rev-parse', 'HEAD').stdout.strip() == pushed
    assert 'POST /team/repo.git/git-receive-pack' in server.log


def test_without_or_with_wrong_credentials_nothing_is_served(tls_server):
    server, env = tls_server
    anonymous = _git('ls-remote', server.url_for('team/repo'), env=env, check=False)
    assert anonymous.returncode != 0 and 'could not read Username' in anonymous.stderr
    wrong = _git('ls-remote', server.url_for('team/repo').replace('https://', 'https://flux:nope@'), env=env, check=False)
    assert wrong.returncode != 0 and 'Authentication failed' in wrong.stderr


def test_an_untrusted_certificate_is_refused_and_a_down_server_answers_503(tls_server):
    server, env = tls_server
    untrusted = _git('ls-remote', server.url_for('team/repo', credentials=True), check=False)
    assert untrusted.returncode != 0 and 'certificate' in untrusted.stderr
    server.down = True
    down = _git('ls-remote', server.url_for('team/repo', credentials=True), env=env, check=False)
    assert down.returncode != 0 and '503' in down.stderr


def test_a_server_without_credentials_takes_anonymous_pushes(tmp_path):
    with SmartGitServer(str(tmp_path / 'srv')) as server:
        server.create_repo('open')
        work = str(tmp_path / 'work')
        _git('init', '--quiet', '--initial-branch=main', work)
        _git('-C', work, 'commit', '--quiet', '--allow-empty', '-m', 'first')
        _git('-C', work, 'push', '--quiet', server.url_for('open'), 'main')
        assert server.url_for('open').startswith('http://127.0.0.1:')


def test_read_chunked_joins_the_chunks_and_drops_extensions_and_trailers():
    body = b'5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\nnext'
    stream = io.BytesIO(body)
    assert _read_chunked(stream) == b'hello world'
    assert stream.read() == b'next'


def test_without_flags_drops_both_spellings_and_keeps_the_rest():
    args = ['--update-status', '--key-prefix', 'k', '--listen-addr', ':8080', '--listen-metrics-addr=:8081', '--x']
    assert controllers.without_flags(args, ('--listen-addr', '--listen-metrics-addr')) == ['--update-status', '--key-prefix', 'k', '--x']
