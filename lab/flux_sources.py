"""What the collection's flux stage reads outside the cluster, without any Flux controller: the lab's Git server with its
GitOps repository, and the artifact mirror. `python -m lab up --kubernetes upstream` (--flux lab, or --extensions
talos,k8s_upstream,flux_sources); lab.flux_upstream starts the same two itself, then Flux's controllers.

- The Git server (lab/git_server.py: git http-backend behind HTTPS on 127.0.0.1) with one bare repository,
  proxtalos/lab-gitops, holding the tree of lab/gitops as one commit on main; HTTP basic auth user `flux` with a
  password new each `up`, in <run-dir>/git-token (0600, where the lab inventory reads it); the CA of its serving
  certificate in <run-dir>/git-server/git-ca.crt (what a GitRepository's secretRef `ca.crt` and git's http.sslCAInfo
  take). <run-dir>/gitops is a clone of it (remote origin, http.sslCAInfo set): the working copy the collection's flux
  stage commits the sealed Secrets to and pushes, and the preflight reads. hosts.yml gets lab_git_url, lab_git_ca_file
  and lab_git_push (inventories/lab/group_vars/all/flux.yml takes them).
- The artifact mirror (lab/artifact_mirror.py): the pinned upstream files the flux role downloads (Flux's and
  flux-operator's install manifests) over HTTPS on loopback, the lab's "internet".
- `lab status` has a `flux_sources` section (the extension's own; lab.flux_upstream shows the Git server in its own).
"""

import logging
import os
import secrets
import shutil
import subprocess
import tempfile

from lab import ROOT, pki
from lab.artifact_mirror import ArtifactMirror
from lab.git_server import GitServerError, SmartGitServer

LOG = logging.getLogger('lab.flux_sources')
LAB_REPO = 'proxtalos/lab-gitops'
GITOPS_TREE = os.path.join(ROOT, 'lab', 'gitops')
GIT_USER = 'flux'
GIT_ENDPOINT = 'git-server'
MIRROR_ENDPOINT = 'artifact-mirror'


def _write(path, text, mode):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, 'w', encoding='utf-8') as handle:
        handle.write(text)
    return path


class FluxSources:
    """The lab's Git server with the GitOps repository and its working copy, and the artifact mirror, of one World."""

    def __init__(self, world):
        self.world = world
        self.dir = os.path.join(world.run_dir, 'git-server')
        self.repo_dir = os.path.join(world.run_dir, 'gitops')
        self.git = None
        self.mirror = None
        self.ca_file = None
        self.password_file = None

    def start(self):
        self.start_git()
        self.start_mirror()
        return self

    def start_git(self):
        """The Git server with the lab's repository (the lab/gitops tree, one commit on main, pushed over HTTPS)."""
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir, mode=0o700)
        ca = pki.make_ca('lab-git')
        self.ca_file = _write(os.path.join(self.dir, 'git-ca.crt'), ca[0], 0o644)
        password = secrets.token_urlsafe(24)
        self.password_file = _write(os.path.join(self.world.run_dir, 'git-token'), password + '\n', 0o600)
        self.git = SmartGitServer(os.path.join(self.dir, 'git'), credentials=(GIT_USER, password),
                                  tls=pki.issue(ca[0], ca[1], '127.0.0.1', server=True, ip_addresses=['127.0.0.1']))
        self.git.start()
        self.git.create_repo(LAB_REPO)
        env = dict(os.environ, GIT_SSL_CAINFO=self.ca_file, GIT_TERMINAL_PROMPT='0', GIT_AUTHOR_NAME='lab',
                   GIT_AUTHOR_EMAIL='lab@lab.invalid', GIT_COMMITTER_NAME='lab', GIT_COMMITTER_EMAIL='lab@lab.invalid')

        def git(*args):
            done = subprocess.run(['git'] + list(args), capture_output=True, text=True, env=env, timeout=120, check=False)
            if done.returncode != 0:
                # a push or clone URL holds the password: name the command by its first word only
                raise GitServerError('git %s: %s' % (args[0] if args[0] != '-C' else args[2], done.stderr.strip()))
        with tempfile.TemporaryDirectory(prefix='lab-gitops-') as work:
            tree = os.path.join(work, 'tree')
            shutil.copytree(GITOPS_TREE, tree)
            git('init', '--quiet', '--initial-branch=main', tree)
            git('-C', tree, 'add', '--all')
            git('-C', tree, 'commit', '--quiet', '-m', 'the lab GitOps tree')
            git('-C', tree, 'push', '--quiet', self.git.url_for(LAB_REPO, credentials=True), 'main')
        # the working copy the collection commits to and pushes from: a clone as a user has one, trusting the server's
        # CA in its own configuration, its remote without credentials (the collection pushes with HTTP basic auth)
        shutil.rmtree(self.repo_dir, ignore_errors=True)
        git('-c', 'http.sslCAInfo=' + self.ca_file, 'clone', '--quiet', '--config', 'http.sslCAInfo=' + self.ca_file,
            self.git.url_for(LAB_REPO, credentials=True), self.repo_dir)
        git('-C', self.repo_dir, 'remote', 'set-url', 'origin', self.git.url_for(LAB_REPO))
        self.world.add_endpoint(GIT_ENDPOINT, self.git.host, self.git.port, 'https')
        self.world.add_inventory_vars({'lab_git_url': self.git.url_for(LAB_REPO), 'lab_git_ca_file': self.ca_file,
                                       'lab_git_push': True})

    def start_mirror(self):
        """The artifact mirror (lab/artifact_mirror.py): the pinned upstream files over HTTPS."""
        self.mirror = ArtifactMirror(self.world.run_dir).start()
        self.world.add_endpoint(MIRROR_ENDPOINT, self.mirror.host, self.mirror.port, 'https')

    def close(self):
        if self.mirror is not None:
            self.mirror.stop()
            self.world.remove_endpoint(MIRROR_ENDPOINT)
            self.mirror = None
        if self.git is not None:
            self.git.stop()
            self.world.remove_endpoint(GIT_ENDPOINT)
            self.git = None

    def git_status(self):
        return {'url': self.git.url_for(LAB_REPO) if self.git else None, 'user': GIT_USER,
                'password_file': self.password_file, 'ca_file': self.ca_file, 'directory': self.repo_dir,
                'down': sorted(self.git.down_repos) if self.git else []}

    def status(self):
        mirror = None
        if self.mirror is not None:
            mirror = {'url': self.mirror.url, 'ca': self.mirror.ca_path, 'pinned_files': len(self.mirror.entries),
                      'requests': len(self.mirror.served),
                      'not_found': sorted(set(path for path, code in self.mirror.served if code == 404))}
        return {'git': self.git_status(), 'artifact_mirror': mirror}


def install(world):
    """Plug the Git server and the artifact mirror into the World; returns FluxSources (also world.flux_sources)."""
    sources = world.flux_sources = FluxSources(world).start()
    world.add_status_section('flux_sources', sources.status)
    world.add_shutdown_hook(sources.close)
    LOG.info('Git server %s, artifact mirror %s', sources.git.url_for(LAB_REPO), sources.mirror.url)
    return sources
