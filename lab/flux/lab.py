"""The Flux simulation plugged into the lab's World (lab/world.py), after lab.k8s.

`install(world)` (called by the World at start):

- starts the lab's Git server (gitserver.py) with the repository of this lab
  (`https://git.lab.internal/proxtalos/lab-gitops.git` -> `<run-dir>/gitops`, branch main), HTTP
  basic auth user `flux` with a password written to `<run-dir>/git-token` (0600, new each `up`).
  `<run-dir>/gitops` is a Git repository created at the first `up` from the tree shipped in
  lab/gitops/ (one commit) and kept across `up --reuse`: the working copy the collection commits
  sealed Secrets to and the preflight lint reads; the server serves what is committed on main;
- attaches to every Kubernetes cluster the Kubernetes simulation starts (Talos listener
  `on_etcd_bootstrapped`, after lab.k8s has created it) the Flux controllers and the
  sealed-secrets controller (attach()), and drops them with the cluster (`lab reset`);
- starts the artifact mirror (lab/artifact_mirror.py): the pinned upstream artifacts over HTTPS on loopback, the
  "internet" the flux role downloads Flux's and flux-operator's manifests from;
- registers the faults, the `flux` status section and the delay kinds.

Faults:
    flux-healthcheck-fail NAMESPACE/KUSTOMIZATION   its health checks time out at once (Ready=False HealthCheckFailed)
    flux-source-not-ready NAMESPACE/GITREPOSITORY   the Git server answers 503 for its URL (Ready=False GitOperationFailed)
    flux-build-fail NAMESPACE/KUSTOMIZATION [resource=missing.yaml]
                                                    its kustomize build fails as for a commit whose kustomization.yaml
                                                    lists a file that is not there (Ready=False BuildFailed)
A crash-looping CSI node plugin is the Kubernetes fault
    k8s-crashloop NODE workload=csi-proxmox/proxmox-csi-plugin-node
"""

import logging
import os
import secrets
import shutil
import subprocess

from lab import ROOT, artifacts
from lab.artifact_mirror import ArtifactMirror

from .controllers import DELAY_KINDS, FluxControllers
from .gitserver import GitServer
from .sealed import SealedSecretsController

LOG = logging.getLogger('lab.flux')
LAB_REPO_PATH = 'proxtalos/lab-gitops'
LAB_REPO_DIR = os.path.join(ROOT, 'lab', 'gitops')
GIT_USER = 'flux'
GIT_IDENTITY = {'GIT_AUTHOR_NAME': 'proxtalos lab', 'GIT_AUTHOR_EMAIL': 'lab@git.lab.internal',
                'GIT_COMMITTER_NAME': 'proxtalos lab', 'GIT_COMMITTER_EMAIL': 'lab@git.lab.internal'}
# Flux's distribution manifests, in order: the pinned upstream files of the flux role's manifest method
# (roles/flux/vars/artifacts.yml) in the lab's artifact cache (lab/artifacts.py; make setup fills it).
COMPONENTS_FILES = [str(artifacts.cached_path(entry)) for entry in artifacts.pins()['flux']['files']]


def init_repository(directory, source=LAB_REPO_DIR, branch='main'):
    """A Git repository at directory holding the tree of source as its first commit on branch; kept when it exists.

    A link left by an older lab (run-dir/gitops -> lab/gitops) is replaced."""
    if os.path.islink(directory):
        os.unlink(directory)
    if os.path.isdir(os.path.join(directory, '.git')):
        return False
    if os.path.exists(directory):
        shutil.rmtree(directory)
    shutil.copytree(source, directory, ignore=shutil.ignore_patterns('.*'))
    env = dict(os.environ, **GIT_IDENTITY)
    for args in (['init', '--quiet', '--initial-branch', branch], ['add', '--all'],
                 ['commit', '--quiet', '--no-gpg-sign', '-m', 'lab: the GitOps tree shipped in lab/gitops']):
        subprocess.run(['git', '-C', directory] + args, check=True, capture_output=True, env=env, timeout=60)
    return True


class FluxCluster(object):
    """The Flux and sealed-secrets controllers attached to one KubeCluster."""

    def __init__(self, cluster, git, timing=None, require_controllers=True, components_file=None):  # pylint: disable=too-many-arguments
        self.cluster = cluster
        self.flux = FluxControllers(cluster.store, git, timing=timing, components_file=components_file or COMPONENTS_FILES,
                                    require_controllers=require_controllers)
        self.sealed = SealedSecretsController(cluster.store)
        cluster.register_service_proxy(self.sealed.namespace, self.sealed.name, self._sealed_backend)

    def _sealed_backend(self, method, path, query, body):
        del query
        return self.sealed.serve(method, path, body)

    def start(self):
        self.flux.start()
        self.sealed.start()

    def stop(self):
        self.flux.stop()
        self.sealed.stop()
        self.cluster.register_service_proxy(self.sealed.namespace, self.sealed.name, None)

    def status(self):
        return {'objects': self.flux.status(), 'sealed_secrets': self.sealed.status(),
                'faults': {'healthcheck_fail': ['%s/%s' % f for f in sorted(self.flux.health_faults)],
                           'build_fail': ['%s/%s' % f for f in sorted(self.flux.build_faults)]}}


def attach(cluster, git=None, timing=None, require_controllers=True, start=True):
    """Flux for a KubeCluster (on its loop); returns the FluxCluster. git: a GitServer (default: the lab repository, no auth)."""
    if git is None:
        git = GitServer({LAB_REPO_PATH: LAB_REPO_DIR})
    flux = FluxCluster(cluster, git, timing=timing, require_controllers=require_controllers)
    if start:
        flux.start()
    return flux


class LabFlux(object):
    """Flux for every cluster of the World."""

    def __init__(self, world):
        self.world = world
        self.token = secrets.token_urlsafe(24)
        self.repo_dir = os.path.join(world.run_dir, 'gitops')
        self.git = GitServer(credentials=(GIT_USER, self.token))
        self.clusters = {}
        self.health_faults = set()
        self.build_faults = {}        # (namespace, kustomization) -> the file its kustomization.yaml lists in vain
        for kind, (realistic, description) in DELAY_KINDS.items():
            if kind not in world.timing.kinds:
                world.timing.register(kind, realistic, description)
        self._write_files()
        self.mirror = ArtifactMirror(world.run_dir).start()
        world.add_endpoint('artifact-mirror', self.mirror.host, self.mirror.port, 'https')

    def _write_files(self):
        run_dir = self.world.run_dir
        os.makedirs(run_dir, exist_ok=True)
        path = os.path.join(run_dir, 'git-token')
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, 'w', encoding='utf-8') as handle:
            handle.write(self.token + '\n')
        init_repository(self.repo_dir)
        self.git.add_repo(LAB_REPO_PATH, self.repo_dir)

    # --- Talos fleet listener -------------------------------------------------------------------

    async def on_etcd_bootstrapped(self, cluster_id, node):
        del node
        k8s = getattr(self.world, 'k8s', None)
        cluster = k8s.clusters.get(cluster_id) if k8s is not None else None
        if cluster is None:
            LOG.warning('cluster %s: no Kubernetes cluster to attach Flux to', cluster_id)
            return
        if cluster_id in self.clusters and self.clusters[cluster_id].cluster is cluster:
            return
        flux = self.clusters[cluster_id] = attach(cluster, self.git, timing=self.world.timing)
        for namespace, name in self.health_faults:
            flux.flux.set_health_fault(namespace, name, True)
        for (namespace, name), resource in self.build_faults.items():
            flux.flux.set_build_fault(namespace, name, resource)
        LOG.info('cluster %s: Flux and sealed-secrets controllers attached', cluster_id)

    # --- World listener ----------------------------------------------------------------------------

    async def on_lab_reset(self):
        self.close()
        self.git.down.clear()

    async def on_lab_stop(self):
        self.close()
        self.mirror.stop()

    def close(self):
        for flux in self.clusters.values():
            flux.stop()
        self.clusters = {}

    # --- faults ----------------------------------------------------------------------------------

    @staticmethod
    def _split(fault, target, what):
        from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
        namespace, dummy, name = (target or '').partition('/')
        if not namespace or not name or '/' in name:
            raise FaultError('fault %s: target must be NAMESPACE/%s, got %r' % (fault, what, target))
        return namespace, name

    def fault_healthcheck(self, target):
        namespace, name = self._split('flux-healthcheck-fail', target, 'KUSTOMIZATION')
        for flux in self.clusters.values():
            flux.flux.set_health_fault(namespace, name, True)
        self.health_faults.add((namespace, name))
        return 'the health checks of Kustomization %s time out at once' % target

    def clear_healthcheck(self, target):
        namespace, name = self._split('flux-healthcheck-fail', target, 'KUSTOMIZATION')
        self.health_faults.discard((namespace, name))
        for flux in self.clusters.values():
            flux.flux.set_health_fault(namespace, name, False)

    def fault_build(self, target, resource='missing.yaml'):
        from lab.faults import FaultError  # pylint: disable=import-outside-toplevel
        namespace, name = self._split('flux-build-fail', target, 'KUSTOMIZATION')
        if not resource or '/' in resource.strip('./'):
            raise FaultError('fault flux-build-fail: resource must be a file name, got %r' % resource)
        self.build_faults[(namespace, name)] = resource
        for flux in self.clusters.values():
            flux.flux.set_build_fault(namespace, name, resource)
        return 'the kustomize build of Kustomization %s fails (%s listed, not in the commit)' % (target, resource)

    def clear_build(self, target):
        namespace, name = self._split('flux-build-fail', target, 'KUSTOMIZATION')
        self.build_faults.pop((namespace, name), None)
        for flux in self.clusters.values():
            flux.flux.set_build_fault(namespace, name, None)

    def fault_source(self, target):
        namespace, name = self._split('flux-source-not-ready', target, 'GITREPOSITORY')
        keys = self._repo_keys(namespace, name)
        self.git.down.update(keys)
        self._kick_source(namespace, name)
        return 'the Git server answers 503 for GitRepository %s (%s)' % (target, ', '.join(sorted(keys)) or 'no such GitRepository yet')

    def clear_source(self, target):
        namespace, name = self._split('flux-source-not-ready', target, 'GITREPOSITORY')
        for key in self._repo_keys(namespace, name):
            self.git.down.discard(key)
        self._kick_source(namespace, name)

    def _repo_keys(self, namespace, name):
        keys = set()
        for flux in self.clusters.values():
            repo = flux.cluster.store.peek(('source.toolkit.fluxcd.io', 'gitrepositories'), namespace, name)
            if repo is not None:
                keys.add(flux.flux._repo_key((repo.get('spec') or {}).get('url')))  # pylint: disable=protected-access
        return keys or {LAB_REPO_PATH}

    def _kick_source(self, namespace, name):
        for flux in self.clusters.values():
            flux.flux.record('git', namespace, name).inputs = None
            flux.flux.kick(('git', namespace, name))

    def register_faults(self, registry):
        from lab.faults import Param  # pylint: disable=import-outside-toplevel
        registry.register('flux-healthcheck-fail', 'a Flux Kustomization fails its health checks: they time out at once, waiting for '
                          'its first not-Current object (or its first health-checked object): Ready=False HealthCheckFailed',
                          'kustomization', self.fault_healthcheck, self.clear_healthcheck)
        registry.register('flux-source-not-ready', "a GitRepository's source is not ready: the lab Git server answers 503 for its URL, "
                          'Ready=False GitOperationFailed', 'gitrepository', self.fault_source, self.clear_source)
        registry.register('flux-build-fail', 'the kustomize build of a Flux Kustomization fails, as for a commit whose '
                          'kustomization.yaml lists a file that is not there: Ready=False BuildFailed with kustomize\'s error; '
                          'what it applied before stays', 'kustomization', self.fault_build, self.clear_build,
                          params=[Param('resource', str, 'missing.yaml', 'the file the kustomization.yaml lists')])

    # --- status ------------------------------------------------------------------------------------

    def status(self):
        return {'git': {'url': self.git.url_for(LAB_REPO_PATH), 'directory': self.repo_dir, 'user': GIT_USER,
                        'down': sorted(self.git.down)},
                'artifact_mirror': {'url': self.mirror.url, 'ca': self.mirror.ca_path, 'pinned_files': len(self.mirror.entries),
                                    'requests': len(self.mirror.served),
                                    'not_found': sorted(set(path for path, code in self.mirror.served if code == 404))},
                'clusters': {str(cluster_id): flux.status() for cluster_id, flux in self.clusters.items()}}


def install(world):
    """Plug Flux into the World (after lab.k8s); returns LabFlux (also world.flux)."""
    flux = LabFlux(world)
    talos = getattr(world, 'talos', None)
    if talos is not None:
        talos.add_listener(flux)
    else:
        LOG.warning('no Talos simulation in this lab: Flux attaches only through lab.flux.attach()')
    world.add_listener(flux)
    flux.register_faults(world.faults)
    world.add_status_section('flux', flux.status)
    world.add_shutdown_hook(flux.close)
    world.flux = flux
    return flux
