"""The lab's Git server: GitRepository URLs mapped to local directories.

Flux's source-controller clones a URL; in the lab there is no network, so the "Git server" is
a table of repository paths on one host name, each served from a directory of this machine:

    https://git.lab.internal/proxtalos/lab-gitops.git   ->  <checkout>/lab/gitops   (branch main)

A fetch reads every file of the directory (hidden ones left out) into a snapshot, the artifact
the kustomize-controller builds from, with a revision `main@sha1:<40 hex>` computed from the
content, so the revision changes exactly when a file changes. It refuses what a real server
refuses, with the messages source-controller reports: an unknown host, an unknown repository,
a branch or tag it does not have, missing or wrong credentials (HTTP basic auth, when the
server has credentials set), and a server that is down (the flux-source-not-ready fault).
"""

import hashlib
import os
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

    def __init__(self, url, branch, files):
        self.url = url
        self.branch = branch
        self.files = files  # repository-relative path (with /) -> bytes
        digest = hashlib.sha1()  # nosec - a Git-style content id, not security
        for path in sorted(files):
            digest.update(path.encode() + b'\0' + hashlib.sha1(files[path]).digest())  # nosec
        self.commit = digest.hexdigest()
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
        snapshot = Snapshot(url, branch, read_tree(directory))
        if kind == 'commit' and value not in (snapshot.commit, snapshot.commit[:len(value)]):
            raise GitError('GitOperationFailed', 'failed to checkout and determine revision: %s: object not found (commit %s)'
                           % (where, value))
        return snapshot

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
