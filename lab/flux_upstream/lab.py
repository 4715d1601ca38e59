"""Flux's upstream controllers in the lab's World, opt-in, after the upstream control plane:
`python -m lab up --extensions talos,k8s_upstream,flux_upstream`.

- At start: a smart-HTTPS Git server on 127.0.0.1 (gitserver.py) with one bare repository, proxtalos/lab-gitops,
  holding the tree of lab/gitops as one commit on main; HTTP basic auth user `flux` with a password new each `up`,
  in <run-dir>/flux-upstream/git-password (0600); the CA of its serving certificate in
  <run-dir>/flux-upstream/git-ca.crt (what a GitRepository's secretRef `ca.crt` and git's GIT_SSL_CAINFO take).
- Each cluster whose upstream control plane starts (lab.k8s_upstream's plane listener) gets source-controller,
  kustomize-controller and helm-controller (controllers.py: their CRDs, RBAC and Deployments applied, the processes
  run with their ServiceAccounts' tokens); they stop with the lab, or at `lab reset`.
- `lab status` has a `flux_upstream` section: the Git server's URL and, per cluster, each controller's pid and state.

Not yet: the sealed-secrets controller (it must start after the collection's sealed_secrets stage has put its key in
place: it reads its keys once, at start); the collection's flux stage pointed at this Git server (the lab inventory
still names the simulation's https://git.lab.internal/...); faults.
"""

import asyncio
import logging
import os
import secrets
import shutil
import subprocess
import tempfile

from lab import ROOT
from lab.k8s import pki

from .controllers import FluxControllers, FluxError
from .gitserver import GitServerError, SmartGitServer

LOG = logging.getLogger('lab.flux_upstream')
LAB_REPO = 'proxtalos/lab-gitops'
GITOPS_TREE = os.path.join(ROOT, 'lab', 'gitops')
GIT_USER = 'flux'


def _write(path, text, mode):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, 'w', encoding='utf-8') as handle:
        handle.write(text)
    return path


class LabUpstreamFlux:
    """The Git server of the lab and the Flux controllers of every cluster, keyed by cluster id."""

    def __init__(self, world):
        self.world = world
        self.dir = os.path.join(world.run_dir, 'flux-upstream')
        self.git = None
        self.ca_file = None
        self.password_file = None
        self.controllers = {}

    async def _blocking(self, function, *args):
        return await asyncio.get_running_loop().run_in_executor(None, function, *args)

    def start_git(self):
        """The Git server with the lab's repository (the lab/gitops tree, one commit on main, pushed over HTTPS)."""
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir, mode=0o700)
        ca = pki.make_ca('lab-git')
        self.ca_file = _write(os.path.join(self.dir, 'git-ca.crt'), ca[0], 0o644)
        password = secrets.token_urlsafe(24)
        self.password_file = _write(os.path.join(self.dir, 'git-password'), password + '\n', 0o600)
        self.git = SmartGitServer(os.path.join(self.dir, 'git'), credentials=(GIT_USER, password),
                                  tls=pki.issue(ca[0], ca[1], '127.0.0.1', server=True, ip_addresses=['127.0.0.1']))
        self.git.start()
        self.git.create_repo(LAB_REPO)
        env = dict(os.environ, GIT_SSL_CAINFO=self.ca_file, GIT_TERMINAL_PROMPT='0', GIT_AUTHOR_NAME='lab',
                   GIT_AUTHOR_EMAIL='lab@lab.invalid', GIT_COMMITTER_NAME='lab', GIT_COMMITTER_EMAIL='lab@lab.invalid')
        with tempfile.TemporaryDirectory(prefix='lab-gitops-') as work:
            tree = os.path.join(work, 'tree')
            shutil.copytree(GITOPS_TREE, tree)
            for args in (['init', '--quiet', '--initial-branch=main', tree], ['-C', tree, 'add', '--all'],
                         ['-C', tree, 'commit', '--quiet', '-m', 'the lab GitOps tree'],
                         ['-C', tree, 'push', '--quiet', self.git.url_for(LAB_REPO, credentials=True), 'main']):
                done = subprocess.run(['git'] + args, capture_output=True, text=True, env=env, timeout=120, check=False)
                if done.returncode != 0:
                    raise GitServerError('git %s: %s' % (args[0] if args[0] != '-C' else args[2], done.stderr.strip()))
        self.world.add_endpoint('flux-upstream-git', self.git.host, self.git.port, 'https')

    async def on_control_plane(self, cluster_id, plane):
        if cluster_id in self.controllers:
            return
        controllers = FluxControllers(plane, os.path.join(self.dir, 'clusters', str(cluster_id)[:12] or 'cluster'),
                                      sealed_secrets=False)
        try:
            await self._blocking(controllers.start)
        except FluxError as exc:
            LOG.error('cluster %s: the Flux controllers did not start: %s', cluster_id, exc)
            return
        self.controllers[cluster_id] = controllers

    async def _stop_controllers(self):
        for cluster_id, controllers in list(self.controllers.items()):
            await self._blocking(controllers.stop)
            del self.controllers[cluster_id]

    async def on_lab_reset(self):
        await self._stop_controllers()

    async def close(self):
        await self._stop_controllers()
        if self.git is not None:
            self.git.stop()
            self.world.remove_endpoint('flux-upstream-git')
            self.git = None

    async def status(self):
        return {
            'git': {'url': self.git.url_for(LAB_REPO) if self.git else None, 'user': GIT_USER,
                    'password_file': self.password_file, 'ca_file': self.ca_file, 'down': bool(self.git and self.git.down)},
            'clusters': {str(cluster_id): controllers.status() for cluster_id, controllers in self.controllers.items()},
        }


def install(world):
    """Plug the upstream Flux controllers into the World (after lab.k8s_upstream); returns LabUpstreamFlux."""
    k8s = getattr(world, 'k8s_upstream', None)
    flux = world.flux_upstream = LabUpstreamFlux(world)
    flux.start_git()
    if k8s is None:
        LOG.warning('no upstream control plane in this lab (extension k8s_upstream, before flux_upstream): '
                    'the Git server runs, no Flux controller will')
    else:
        k8s.add_plane_listener(flux.on_control_plane)
    world.add_listener(flux)
    world.add_status_section('flux_upstream', flux.status)
    world.add_shutdown_hook(flux.close)
    return flux
