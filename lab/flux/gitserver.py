"""The lab's Git server: GitRepository URLs mapped to local directories or Git repositories.

Flux's source-controller clones a URL; in the lab there is no network, so the "Git server" is
a table of repository paths on one host name, each served from this machine:

    https://git.lab.internal/proxtalos/lab-gitops.git   ->  <run-dir>/gitops   (a Git repository, branch main)

A repository served from a Git repository (a working copy or a bare one) serves what is committed on
its branch - not its working tree: a fetch reads the branch's tip commit (`git ls-tree`, `git
cat-file`) into a snapshot, the artifact the kustomize-controller builds from, with the revision
`main@sha1:<the commit id>`. So a change reaches Flux exactly when it is committed, as a push to a
real server does. A plain directory (tests) is read whole (hidden files left out), with a revision
computed from the content, so the revision changes exactly when a file changes. It refuses what a real server
refuses, with the messages source-controller reports: an unknown host, an unknown repository,
a branch or tag it does not have, missing or wrong credentials (HTTP basic auth, when the
server has credentials set), and a server that is down (the flux-source-not-ready fault).
"""

import hashlib
import os
import subprocess
import urllib.parse

GIT_HOST = 'git.lab.internal'
DEFAULT_BRANCH = 'main'
MAX_FILE_BYTES = 4 * 1024 * 1024


class GitError(Exception):
    """A fetch that failed: reason (Flux's condition reason) and message."""

    def __init__(self, reason, message):
        super().__init__(message)
        self.reason = reason
        self.message = message


class Snapshot(object):
    """One artifact: the files of a repository at a revision."""

    def __init__(self, url, branch, files, commit=None):
        self.url = url
        self.branch = branch
        self.files = files  # repository-relative path (with /) -> bytes
        if commit is None:
            digest = hashlib.sha1()  # nosec - a Git-style content id, not security
            for path in sorted(files):
                digest.update(path.encode() + b'\0' + hashlib.sha1(files[path]).digest())  # nosec
            commit = digest.hexdigest()
        self.commit = commit
        self.revision = '%s@sha1:%s' % (branch, self.commit)
        self.size = sum(len(data) for data in files.values())
        self.digest = 'sha256:' + hashlib.sha256(self.commit.encode()).hexdigest()

    def __repr__(self):
        return 'Snapshot(%s, %d files)' % (self.revision, len(self.files))


def read_tree(directory):
    """Every file under directory (hidden files and directories left out) as {relpath: bytes}."""
    files = {}
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith('.'))
        for name in sorted(names):
            if name.startswith('.'):
                continue
            path = os.path.join(root, name)
            if os.path.getsize(path) > MAX_FILE_BYTES:
                continue
            with open(path, 'rb') as handle:
                files[os.path.relpath(path, directory).replace(os.sep, '/')] = handle.read()
    return files


def is_git_repository(directory):
    """Whether directory is a Git working copy (has .git) or a bare repository."""
    return os.path.isdir(os.path.join(directory, '.git', 'objects')) or (
        os.path.isfile(os.path.join(directory, 'HEAD')) and os.path.isdir(os.path.join(directory, 'objects')))


def _git(directory, *args, stdin=None):
    completed = subprocess.run(['git', '-C', directory] + list(args), input=stdin, capture_output=True, check=False, timeout=60)
    if completed.returncode != 0:
        raise GitError('GitOperationFailed', 'git %s failed in %s: %s' % (args[0], directory, completed.stderr.decode(errors='replace').strip()))
    return completed.stdout


def branch_tip(directory, branch):
    """The commit id at the tip of branch in the Git repository, or None when the branch does not exist."""
    try:
        return _git(directory, 'rev-parse', '--verify', '--quiet', 'refs/heads/%s^{commit}' % branch).decode().strip() or None
    except GitError:
        return None


def read_commit(directory, commit):
    """Every file of a commit (blobs up to MAX_FILE_BYTES, hidden files and directories left out) as {relpath: bytes}."""
    entries = []
    for record in _git(directory, 'ls-tree', '-r', '-z', '--full-tree', '-l', commit).split(b'\0'):
        if not record:
            continue
        header, dummy, path = record.partition(b'\t')
        mode, kind, sha, size = header.split()
        path = path.decode('utf-8', errors='replace')
        if kind != b'blob' or mode == b'120000' or any(part.startswith('.') for part in path.split('/')):
            continue
        if int(size) > MAX_FILE_BYTES:
            continue
        entries.append((path, sha.decode()))
    files = {}
    if not entries:
        return files
    output = _git(directory, 'cat-file', '--batch', stdin=''.join(sha + '\n' for dummy, sha in entries).encode())
    position = 0
    for path, sha in entries:
        newline = output.index(b'\n', position)
        size = int(output[position:newline].split()[2])
        start = newline + 1
        files[path] = output[start:start + size]
        position = start + size + 1
    return files


def wanted_branch(ref):
    """The branch a GitRepository spec.ref asks for (Flux's precedence), or (kind, value) for tags and commits."""
    ref = ref or {}
    if ref.get('commit'):
        return 'commit', ref['commit']
    if ref.get('name'):
        name = ref['name']
        if name.startswith('refs/heads/'):
            return 'branch', name[len('refs/heads/'):]
        if name.startswith('refs/tags/'):
            return 'tag', name[len('refs/tags/'):]
        return 'name', name
    if ref.get('semver'):
        return 'semver', ref['semver']
    if ref.get('tag'):
        return 'tag', ref['tag']
    return 'branch', ref.get('branch') or 'master'


class GitServer(object):
    """Repositories by path on GIT_HOST; credentials (username, password) or None for anonymous access."""

    def __init__(self, repos=None, credentials=None, host=GIT_HOST):
        self.host = host
        self.repos = {}
        self.credentials = credentials
        self.down = set()          # repository paths that answer 503 (fault flux-source-not-ready)
        self._commits = {}         # directory -> (commit id, files) of the last commit read there
        for path, directory in (repos or {}).items():
            self.add_repo(path, directory)

    def add_repo(self, path, directory, branch=DEFAULT_BRANCH):
        self.repos[self._key(path)] = (os.path.abspath(directory), branch)

    @staticmethod
    def _key(path):
        path = path.strip('/')
        return path[:-4] if path.endswith('.git') else path

    def url_for(self, path, scheme='https'):
        return '%s://%s/%s.git' % (scheme, self.host, self._key(path))

    def directory(self, url):
        """The local directory a URL is served from (None when the URL names no repository)."""
        parsed = urllib.parse.urlparse(url or '')
        if parsed.hostname != self.host:
            return None
        found = self.repos.get(self._key(parsed.path))
        return found[0] if found else None

    @staticmethod
    def check_url(url):
        """The reason a URL is not one source-controller accepts ('' when it is)."""
        parsed = urllib.parse.urlparse(url or '')
        if parsed.scheme not in ('http', 'https', 'ssh'):
            return 'unsupported URL scheme %r: the URL must start with http://, https:// or ssh:// (scp-style git@host:repo is not supported)' \
                % (parsed.scheme or url)
        if not parsed.hostname:
            return 'URL %r has no host' % url
        return ''

    def fetch(self, url, ref=None, auth=None):
        """A Snapshot of the repository at the ref, or GitError(reason, message) as source-controller words it.

        auth: None (no secretRef), or the Secret's decoded data: username/password (HTTP basic auth),
        identity/known_hosts (SSH), bearerToken.
        """
        where = "unable to clone '%s'" % url
        problem = self.check_url(url)
        if problem:
            raise GitError('URLInvalid', problem)
        parsed = urllib.parse.urlparse(url)
        if parsed.hostname != self.host:
            raise GitError('GitOperationFailed', 'failed to checkout and determine revision: %s: dial tcp: lookup %s: no such host'
                           % (where, parsed.hostname))
        key = self._key(parsed.path)
        if key in self.down:
            raise GitError('GitOperationFailed', 'failed to checkout and determine revision: %s: unexpected client error: unexpected '
                           'requesting "%s/info/refs?service=git-upload-pack" status code: 503' % (where, url.rstrip('/')))
        self._check_auth(parsed, auth, where)
        if key not in self.repos:
            raise GitError('GitOperationFailed', 'failed to checkout and determine revision: %s: repository not found' % where)
        directory, branch = self.repos[key]
        kind, value = wanted_branch(ref)
        if kind == 'branch' and value != branch:
            raise GitError('GitOperationFailed', "failed to checkout and determine revision: %s: couldn't find remote ref "
                           '"refs/heads/%s"' % (where, value))
        if kind in ('tag', 'semver', 'name'):
            raise GitError('GitOperationFailed', "failed to checkout and determine revision: %s: couldn't find remote ref "
                           '"%s" (the lab Git server has only the branch %s)' % (where, value, branch))
        if not os.path.isdir(directory):
            raise GitError('GitOperationFailed', 'failed to checkout and determine revision: %s: repository not found' % where)
        snapshot = self._snapshot(url, directory, branch, where)
        if kind == 'commit' and value not in (snapshot.commit, snapshot.commit[:len(value)]):
            raise GitError('GitOperationFailed', 'failed to checkout and determine revision: %s: object not found (commit %s)'
                           % (where, value))
        return snapshot

    def _snapshot(self, url, directory, branch, where):
        if not is_git_repository(directory):
            return Snapshot(url, branch, read_tree(directory))
        commit = branch_tip(directory, branch)
        if commit is None:
            raise GitError('GitOperationFailed', "failed to checkout and determine revision: %s: couldn't find remote ref "
                           '"refs/heads/%s"' % (where, branch))
        cached = self._commits.get(directory)
        if cached is None or cached[0] != commit:
            cached = self._commits[directory] = (commit, read_commit(directory, commit))
        return Snapshot(url, branch, cached[1], commit=commit)

    def _check_auth(self, parsed, auth, where):
        if parsed.scheme == 'ssh':
            if auth is None or not auth.get('identity'):
                raise GitError('AuthenticationFailed', 'failed to configure authentication options: invalid \'%s\' auth option: '
                               "'identity' is required" % 'ssh')
            if not auth.get('known_hosts'):
                raise GitError('AuthenticationFailed', "failed to configure authentication options: invalid 'ssh' auth option: "
                               "'known_hosts' is required")
            return
        if self.credentials is None:
            return
        if auth is None:
            raise GitError('GitOperationFailed', 'failed to checkout and determine revision: %s: authentication required' % where)
        username, password = auth.get('username'), auth.get('password')
        if username is None and password is None and not auth.get('bearerToken'):
            raise GitError('AuthenticationFailed', 'failed to configure authentication options: invalid \'%s\' auth option: '
                           "'username' and 'password' are required (the Secret has neither)" % parsed.scheme)
        if auth.get('bearerToken'):
            ok = auth['bearerToken'] == self.credentials[1]
        else:
            ok = (username, password) == tuple(self.credentials)
        if not ok:
            raise GitError('GitOperationFailed', 'failed to checkout and determine revision: %s: authentication required: '
                           'Invalid username or password' % where)
