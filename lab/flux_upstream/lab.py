"""Flux's upstream controllers in the lab's World, after the upstream control plane:
`python -m lab up --kubernetes upstream --flux upstream` (or --extensions talos,k8s_upstream,flux_upstream).

- At start: the lab's Git server with the GitOps repository and its working copy, and the artifact mirror
  (lab/flux_sources.py, the same as upstream Kubernetes without Flux has): a smart-HTTPS Git server on 127.0.0.1
  (lab/git_server.py) with one bare repository, proxtalos/lab-gitops, holding the tree of lab/gitops as one commit on
  main; HTTP basic auth user `flux`, the password in <run-dir>/git-token; the CA in <run-dir>/git-server/git-ca.crt;
  <run-dir>/gitops a clone the collection's flux stage pushes from; hosts.yml gets lab_git_url, lab_git_ca_file and
  lab_git_push. The artifact mirror (lab/artifact_mirror.py) serves the pinned upstream files the flux role downloads.
- Each cluster whose upstream control plane starts (lab.k8s_upstream's plane listener) is watched for Flux's
  controllers: once the Deployments of source-, kustomize- and helm-controller that the collection's flux stage
  applies (Flux's own install manifests) have an available replica - kwok has made their pods Running on a Node, which
  is when a kubelet would start the containers - and their CRDs are Established, the controllers run as processes with
  the args and ServiceAccounts of those Deployments (controllers.py, installed=True). They stop with the lab, or at
  `lab reset`. Each process follows the pods of its Deployment as a kubelet follows the pods bound to it (_follow_pods,
  FluxControllers.sync): no Running pod, no process; a new pod (a rollout, a deleted pod replaced, a scale from 0) ->
  the process starts again with that pod's args, a controller with its in-memory state gone that lists anew.
- Likewise flux-operator (the collection's operator method, flux_install_method=operator): once the Deployment
  flux-system/flux-operator has an available replica and its four CRDs are Established, the pinned upstream build runs
  as a process with a kubeconfig of that Deployment's ServiceAccount and the module's own distribution manifests
  (config/data, the image's /data) as --storage-path (controllers.py _operator_command). Its FluxInstance then applies
  Flux's manifests from there, and the Flux controllers start as above once kwok makes those Deployments available.
- Likewise the sealed-secrets controller: once the Deployment kube-system/sealed-secrets-controller (the lab's tree
  deploys it through Flux) has an available replica and the SealedSecret CRD is Established, the pinned upstream
  controller runs as a process with that Deployment's args and ServiceAccount, and plays its pod on the control
  plane's pod network (lab/k8s_upstream/podnet.py): kube-apiserver's service proxy - kubeseal's way and the
  collection's sealed_cert_gate's to /v1/cert.pem - reaches it at the pod address kwok gave.
- `lab status` has a `flux_upstream` section: the Git server's URL and, per cluster, each controller's pid, state and
  (sealed-secrets) pod address.

- The GitOps faults flux-healthcheck-fail, flux-build-fail and flux-source-not-ready, with the simulation's names and
  targets, made with real objects: commits pushed from the working copy and the Git server refusing (faults.py).

Not yet: notification-controller (its module is not served by the Go module proxy here).
"""

import asyncio
import logging
import os
import shutil

# LAB_REPO: faults.py and the tests import it from here
from lab.flux_sources import LAB_REPO, FluxSources  # noqa: F401  pylint: disable=unused-import
from lab.k8s_upstream.controlplane import ControlPlaneError

from .faults import GitopsFaults
from .controllers import FLUX_CONTROLLERS, FLUX_NAMESPACE, FLUX_OPERATOR, SEALED_NAMESPACE, SEALED_SECRETS, FluxControllers, FluxError, get

LOG = logging.getLogger('lab.flux_upstream')
WATCH_INITIAL, WATCH_MAX = 0.2, 2.0  # seconds between polls of the Flux Deployments


class LabUpstreamFlux:  # pylint: disable=too-many-instance-attributes
    """The Git server of the lab and the Flux controllers of every cluster, keyed by cluster id."""

    def __init__(self, world):
        self.world = world
        self.dir = os.path.join(world.run_dir, 'flux-upstream')
        self.sources = FluxSources(world)  # the Git server, the working copy and the artifact mirror
        self.controllers = {}  # cluster id -> [FluxControllers] running (Flux's, then sealed-secrets')
        self.watches = {}   # (cluster id, what) -> the task waiting for the cluster's Deployments of what
        self.faults = None  # faults.GitopsFaults, registered at install

    async def _blocking(self, function, *args):
        return await asyncio.get_running_loop().run_in_executor(None, function, *args)

    def start(self):
        """A fresh directory for the controllers' files; the Git server with the lab's repository; the artifact mirror."""
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir, mode=0o700)
        self.sources.start()

    # what faults.py and status() use of the sources
    @property
    def git(self):
        return self.sources.git

    @property
    def repo_dir(self):
        return self.sources.repo_dir

    @property
    def ca_file(self):
        return self.sources.ca_file

    async def on_control_plane(self, cluster_id, plane):
        if cluster_id in self.controllers or any(key[0] == cluster_id for key in self.watches):
            return
        loop = asyncio.get_running_loop()
        for what in ('flux', 'sealed-secrets', FLUX_OPERATOR):
            self.watches[(cluster_id, what)] = loop.create_task(self._run_when_installed(cluster_id, plane, what))

    @staticmethod
    def _deployments_available(plane, deployments):
        """(all available, what was seen): each Deployment (namespace, name) with an available replica."""
        seen = {}
        for namespace, name in deployments:
            try:
                found = get(plane, 'Deployment', name, namespace)
            except ControlPlaneError as exc:
                seen[name] = str(exc)[-200:]
                continue
            seen[name] = None if found is None else ((found.get('status') or {}).get('availableReplicas') or 0)
        return all(isinstance(value, int) and value > 0 for value in seen.values()), seen

    async def _run_when_installed(self, cluster_id, plane, what):
        """Wait for the cluster's Deployments of what (flux: the Flux controllers, which the collection's flux stage
        applies, or flux-operator from a FluxInstance; sealed-secrets: the controller the lab's tree deploys through
        Flux; flux-operator: the operator the collection's operator method applies) to be available - kwok runs their
        pods - then run the controllers."""
        if what == 'flux':
            deployments = [(FLUX_NAMESPACE, name) for name in FLUX_CONTROLLERS]
            options = {'sealed_secrets': False}
        elif what == FLUX_OPERATOR:
            deployments = [(FLUX_NAMESPACE, FLUX_OPERATOR)]
            options = {'controllers': (), 'sealed_secrets': False, 'operator': True}
        else:
            deployments = [(SEALED_NAMESPACE, SEALED_SECRETS)]
            options = {'controllers': (), 'sealed_secrets': True}
        interval, seen = WATCH_INITIAL, None
        while True:
            ready, observed = await self._blocking(self._deployments_available, plane, deployments)
            if ready:
                break
            if observed != seen:
                LOG.info('cluster %s: %s controllers wait for their Deployments: %s', cluster_id, what, observed)
                seen = observed
            # a poll of the Deployments' status (the lab has no watch client), backing off to WATCH_MAX
            await asyncio.sleep(interval)
            interval = min(interval * 1.5, WATCH_MAX)
        workdir = os.path.join(self.dir, 'clusters', str(cluster_id)[:12] or 'cluster')
        if what != 'flux':
            workdir = os.path.join(workdir, what)
        controllers = FluxControllers(plane, workdir, installed=True, **options)
        try:
            await self._blocking(controllers.start)
        except FluxError as exc:
            LOG.error('cluster %s: the %s controllers did not start: %s', cluster_id, what, exc)
            return
        finally:
            self.watches.pop((cluster_id, what), None)
        self.controllers.setdefault(cluster_id, []).append(controllers)
        LOG.info('cluster %s: %s controllers running: %s', cluster_id, what, ', '.join(controllers.processes))
        for name in controllers.deployments:
            self.watches[(cluster_id, name + ' pods')] = asyncio.get_running_loop().create_task(
                self._follow_pods(cluster_id, controllers, name))

    async def _follow_pods(self, cluster_id, controllers, name):
        """The kubelet's part for the pods of one controller's Deployment (FluxControllers.sync): the pod the process
        plays gone (deleted, replaced by a rollout, scaled away) -> the process stops; a Running pod and no process ->
        the process starts on it, with that pod's args."""
        interval = WATCH_INITIAL
        while True:
            try:
                did = await self._blocking(controllers.sync, name)
            except ControlPlaneError as exc:
                LOG.error('cluster %s: %s: %s', cluster_id, name, exc)
                did = None  # tried again at the next poll, backing off
            if did:
                LOG.info('cluster %s: %s: %s', cluster_id, name, did)
                interval = WATCH_INITIAL
            # a poll of the pods (the lab has no watch client), backing off to WATCH_MAX
            await asyncio.sleep(interval)
            interval = min(interval * 1.5, WATCH_MAX)

    async def _stop_controllers(self):
        for running in self.controllers.values():
            for controllers in running:
                controllers.stopping = True  # a sync under way starts nothing more
        for key, task in list(self.watches.items()):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self.watches.pop(key, None)
        for cluster_id, running in list(self.controllers.items()):
            for controllers in reversed(running):
                await self._blocking(controllers.stop)
            del self.controllers[cluster_id]

    async def on_lab_reset(self):
        await self._stop_controllers()

    async def close(self):
        await self._stop_controllers()
        self.sources.close()

    async def status(self):
        clusters = {}
        for cluster_id, running in list(self.controllers.items()):
            # each controller's health endpoint is asked: off the loop
            clusters[str(cluster_id)] = [entry for controllers in list(running) for entry in await self._blocking(controllers.status)]
        return {'git': self.sources.git_status(), 'clusters': clusters}


def install(world):
    """Plug the upstream Flux controllers into the World (after lab.k8s_upstream); returns LabUpstreamFlux."""
    k8s = getattr(world, 'k8s_upstream', None)
    flux = world.flux_upstream = LabUpstreamFlux(world)
    flux.start()
    if k8s is None:
        LOG.warning('no upstream control plane in this lab (extension k8s_upstream, before flux_upstream): '
                    'the Git server runs, no Flux controller will')
    else:
        k8s.add_plane_listener(flux.on_control_plane)
    world.add_listener(flux)
    flux.faults = GitopsFaults(flux)
    flux.faults.register(world.faults)
    world.add_status_section('flux_upstream', flux.status)
    world.add_shutdown_hook(flux.close)
    return flux
