"""The GitOps faults of the upstream Flux world, made with real objects: nothing here writes a status.

The names and targets are those lab/flux registers for its simulation, so a test or the fault matrix names either
world. Each fault is what a person or an outage does to a real cluster, and the upstream controllers judge it:

- flux-healthcheck-fail NAMESPACE/KUSTOMIZATION [progress_deadline=10]: a commit, pushed to the lab's Git server
  from the working copy (<run-dir>/gitops, as a user pushes), that makes a Deployment the Kustomization health-checks
  never roll out: its pod template gets a nodeSelector no Node has (kube-scheduler leaves the new pod Pending) and
  spec.progressDeadlineSeconds the given seconds, so kube-controller-manager's deployment controller marks it
  Progressing=False ProgressDeadlineExceeded (k8s.io/kubernetes v1.36.3 pkg/controller/deployment/progress.go), which
  kstatus reads as Failed (github.com/fluxcd/cli-utils v1.2.3 pkg/kstatus/status/core.go:182-188), and
  kustomize-controller's health check, which fails fast on a Failed object (github.com/fluxcd/pkg/ssa v0.76.2
  manager_wait.go:148, 192), gives Ready=False HealthCheckFailed "health check failed after <d>: failed early due to
  stalled resources: [Deployment/<ns>/<name> status: 'Failed']" (kustomize-controller v1.9.5
  internal/controller/kustomization_controller.go:1061-1072, 526-529). The Deployment is the Kustomization's first
  health-checked Deployment (spec.healthChecks; with spec.wait, the first one of its inventory).
- flux-build-fail NAMESPACE/KUSTOMIZATION [resource=missing.yaml]: a commit whose kustomization.yaml in the
  Kustomization's path also lists a file the commit does not have (a kustomization.yaml listing the directory's
  manifests is made when the directory had none): kustomize-controller's build fails, Ready=False BuildFailed with
  kustomize's error (kustomization_controller.go:437-440); what it applied before stays.
- flux-source-not-ready NAMESPACE/GITREPOSITORY: the lab's Git server answers 503 for that GitRepository's repository
  (every request: source-controller's fetches and a push alike, as a server that is down): FetchFailed=True and
  Ready=False GitOperationFailed "failed to checkout and determine revision: ..." (source-controller v1.9.5
  internal/controller/gitrepository_controller.go:1066-1072).

Each fault is then followed by what `flux reconcile source git` does: the annotation reconcile.fluxcd.io/requestedAt
on the GitRepository, so source-controller fetches at once instead of at its next interval. Clearing a commit fault
pushes `git revert` of its commit (and asks for a fetch again); clearing the source fault lets the requests through.
"""

import asyncio
import datetime
import functools
import logging
import os
import subprocess

import yaml

from lab.faults import FaultError, Param
from lab.k8s_upstream.controlplane import ControlPlaneError

from .controllers import annotate, get

LOG = logging.getLogger('lab.flux_upstream.faults')
FAULT_NODE_LABEL = 'lab.proxtalos.invalid/flux-healthcheck-fail'  # no Node has it: the pod is never scheduled
RECONCILE_ANNOTATION = 'reconcile.fluxcd.io/requestedAt'
MANIFEST_SUFFIXES = ('.yaml', '.yml')
KUSTOMIZATION_FILES = ('kustomization.yaml', 'kustomization.yml', 'Kustomization')


def split_target(fault, target, what):
    namespace, dummy, name = (target or '').partition('/')
    if not namespace or not name or '/' in name:
        raise FaultError('fault %s: target must be NAMESPACE/%s, got %r' % (fault, what, target))
    return namespace, name


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%S.%fZ')


def manifest_files(directory):
    """The YAML files under directory (recursively, sorted), as Flux's generator reads a directory."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith('.'))
        found += [os.path.join(root, name) for name in sorted(files) if name.endswith(MANIFEST_SUFFIXES)]
    return found


def find_document(directory, kind, name, namespace):
    """(path, documents, index) of the manifest of kind/name under directory (its namespace that one or unset)."""
    for path in manifest_files(directory):
        with open(path, encoding='utf-8') as handle:
            try:
                docs = list(yaml.safe_load_all(handle))
            except yaml.YAMLError:
                continue
        for index, doc in enumerate(docs):
            meta = (doc or {}).get('metadata') or {} if isinstance(doc, dict) else {}
            if doc and isinstance(doc, dict) and doc.get('kind') == kind and meta.get('name') == name \
                    and meta.get('namespace') in (None, namespace):
                return path, docs, index
    return None


def health_checked_deployment(kustomization):
    """(namespace, name) of the Deployment a Kustomization's health check waits for, or None."""
    spec = kustomization.get('spec') or {}
    default_namespace = spec.get('targetNamespace') or kustomization['metadata']['namespace']
    for check in spec.get('healthChecks') or ():
        if check.get('kind') == 'Deployment':
            return check.get('namespace') or default_namespace, check['name']
    if spec.get('wait'):
        # inventory entry ids: <namespace>_<name>_<group>_<kind> (Kubernetes names hold no underscore)
        for entry in ((kustomization.get('status') or {}).get('inventory') or {}).get('entries') or ():
            parts = entry.get('id', '').split('_')
            if len(parts) == 4 and parts[2] == 'apps' and parts[3] == 'Deployment':
                return parts[0], parts[1]
    return None


class GitopsFaults:
    """The faults of lab.flux_upstream (module docstring). flux: the LabUpstreamFlux (its Git server, working copy)."""

    def __init__(self, flux):
        self.flux = flux
        self.applied = {}  # (fault name, target) -> the commit the fault pushed (reverted when cleared), or the repository refused

    # --- the cluster side ---------------------------------------------------------------------------------------------

    def _planes(self):
        k8s = getattr(self.flux.world, 'k8s_upstream', None)
        return list(k8s.planes.values()) if k8s is not None else []

    def _find(self, fault, kind, namespace, name):
        """(plane, object) of the first cluster that has it; FaultError naming what was looked for when none has."""
        for plane in self._planes():
            try:
                found = get(plane, kind, name, namespace)
            except ControlPlaneError as exc:
                LOG.warning('fault %s: %s %s/%s not read: %s', fault, kind, namespace, name, exc)
                continue
            if found is not None:
                return plane, found
        raise FaultError('fault %s: no cluster of the lab has %s %s/%s (yet)' % (fault, kind, namespace, name))

    def _request_fetch(self, plane, namespace, name):
        """`flux reconcile source git NAME`: the requestedAt annotation on the GitRepository."""
        try:
            annotate(plane, 'GitRepository', name, namespace, {RECONCILE_ANNOTATION: _now()})
        except ControlPlaneError as exc:
            LOG.warning('GitRepository %s/%s: no reconcile requested: %s', namespace, name, exc)

    def _source_of(self, kustomization):
        ref = (kustomization.get('spec') or {}).get('sourceRef') or {}
        return ref.get('namespace') or kustomization['metadata']['namespace'], ref.get('name')

    # --- the repository side --------------------------------------------------------------------------------------

    def _git(self, *args):
        env = dict(os.environ, GIT_SSL_CAINFO=self.flux.ca_file, GIT_TERMINAL_PROMPT='0', GIT_AUTHOR_NAME='lab fault',
                   GIT_AUTHOR_EMAIL='lab-fault@lab.invalid', GIT_COMMITTER_NAME='lab fault', GIT_COMMITTER_EMAIL='lab-fault@lab.invalid')
        done = subprocess.run(['git', '-C', self.flux.repo_dir] + list(args), capture_output=True, text=True, env=env,
                              timeout=120, check=False)
        if done.returncode != 0:
            # the push URL holds the password: name the command by its first word only
            raise FaultError('git %s in %s: %s' % (args[0], self.flux.repo_dir, done.stderr.strip()[-500:]))
        return done.stdout.strip()

    def _push(self):
        from .lab import LAB_REPO  # pylint: disable=import-outside-toplevel
        self._git('push', '--quiet', self.flux.git.url_for(LAB_REPO, credentials=True), 'HEAD:refs/heads/main')

    def _commit(self, key, paths, message):
        self._git('add', '--', *paths)
        self._git('commit', '--quiet', '-m', message, '--', *paths)
        commit = self._git('rev-parse', 'HEAD')
        self._push()
        self.applied[key] = commit
        return commit

    def _revert(self, key):
        commit = self.applied.pop(key, None)
        if commit is None:
            return None
        try:
            self._git('merge-base', '--is-ancestor', commit, 'HEAD')
        except FaultError:
            LOG.warning('fault %s %s: its commit %s is no longer in the working copy; nothing to revert', key[0], key[1], commit[:12])
            return None
        self._git('revert', '--no-edit', commit)
        self._push()
        return self._git('rev-parse', 'HEAD')

    def _path_dir(self, fault, kustomization):
        path = ((kustomization.get('spec') or {}).get('path') or './').strip()
        directory = os.path.normpath(os.path.join(self.flux.repo_dir, path.lstrip('/')))
        if not (directory + os.sep).startswith(os.path.normpath(self.flux.repo_dir) + os.sep) or not os.path.isdir(directory):
            raise FaultError('fault %s: the path %r of Kustomization %s/%s is not a directory of the working copy %s'
                             % (fault, path, kustomization['metadata']['namespace'], kustomization['metadata']['name'], self.flux.repo_dir))
        return directory

    # --- the faults -------------------------------------------------------------------------------------------------------

    def fault_healthcheck(self, target, progress_deadline=10):
        fault = 'flux-healthcheck-fail'
        namespace, name = split_target(fault, target, 'KUSTOMIZATION')
        if progress_deadline < 1:
            raise FaultError('fault %s: progress_deadline must be at least 1 (seconds), got %r' % (fault, progress_deadline))
        plane, kustomization = self._find(fault, 'Kustomization', namespace, name)
        deployment = health_checked_deployment(kustomization)
        if deployment is None:
            raise FaultError('fault %s: Kustomization %s health-checks no Deployment (spec.healthChecks, or spec.wait with one '
                             'in its inventory)' % (fault, target))
        found = find_document(self._path_dir(fault, kustomization), 'Deployment', deployment[1], deployment[0])
        if found is None:
            raise FaultError('fault %s: no manifest of Deployment %s/%s under the path of Kustomization %s in %s'
                             % (fault, deployment[0], deployment[1], target, self.flux.repo_dir))
        path, docs, index = found
        spec = docs[index].setdefault('spec', {})
        spec['progressDeadlineSeconds'] = int(progress_deadline)
        pod = spec.setdefault('template', {}).setdefault('spec', {})
        pod['nodeSelector'] = dict(pod.get('nodeSelector') or {}, **{FAULT_NODE_LABEL: 'true'})
        with open(path, 'w', encoding='utf-8') as handle:
            yaml.safe_dump_all(docs, handle, sort_keys=False)
        commit = self._commit((fault, target), [path], 'lab fault %s: Deployment %s/%s can never be scheduled' % (fault, *deployment))
        self._request_fetch(plane, *self._source_of(kustomization))
        return 'commit %s: Deployment %s/%s of Kustomization %s can never be scheduled (nodeSelector %s), progress deadline %d s' % (
            commit[:12], deployment[0], deployment[1], target, FAULT_NODE_LABEL, progress_deadline)

    def fault_build(self, target, resource='missing.yaml'):
        fault = 'flux-build-fail'
        namespace, name = split_target(fault, target, 'KUSTOMIZATION')
        if not resource or '/' in resource.strip('./'):
            raise FaultError('fault %s: resource must be a file name, got %r' % (fault, resource))
        plane, kustomization = self._find(fault, 'Kustomization', namespace, name)
        directory = self._path_dir(fault, kustomization)
        if os.path.exists(os.path.join(directory, resource)):
            raise FaultError('fault %s: %s is in %s: name a file the commit does not have' % (fault, resource, directory))
        existing = [os.path.join(directory, f) for f in KUSTOMIZATION_FILES if os.path.isfile(os.path.join(directory, f))]
        if existing:
            path = existing[0]
            with open(path, encoding='utf-8') as handle:
                document = yaml.safe_load(handle) or {}
        else:
            # what Flux's generator would build from the directory, written down, plus the missing file
            path = os.path.join(directory, 'kustomization.yaml')
            document = {'apiVersion': 'kustomize.config.k8s.io/v1beta1', 'kind': 'Kustomization',
                        'resources': [os.path.relpath(p, directory) for p in manifest_files(directory)]}
        document['resources'] = list(document.get('resources') or []) + [resource]
        with open(path, 'w', encoding='utf-8') as handle:
            yaml.safe_dump(document, handle, sort_keys=False)
        commit = self._commit((fault, target), [path], 'lab fault %s: %s lists %s, which the commit does not have'
                              % (fault, os.path.relpath(path, self.flux.repo_dir), resource))
        self._request_fetch(plane, *self._source_of(kustomization))
        return 'commit %s: %s lists %s, not in the commit' % (commit[:12], os.path.relpath(path, self.flux.repo_dir), resource)

    def _clear_commit(self, fault, target, what):
        namespace, name = split_target(fault, target, what)
        reverted = self._revert((fault, target))
        if reverted is None:
            return
        try:
            plane, kustomization = self._find(fault, 'Kustomization', namespace, name)
        except FaultError as exc:
            LOG.warning('%s (the revert %s is pushed; no fetch requested)', exc, reverted[:12])
            return
        self._request_fetch(plane, *self._source_of(kustomization))

    def clear_healthcheck(self, target):
        self._clear_commit('flux-healthcheck-fail', target, 'KUSTOMIZATION')

    def clear_build(self, target):
        self._clear_commit('flux-build-fail', target, 'KUSTOMIZATION')

    def _repository_of(self, fault, target):
        """(plane, repository path on the lab's Git server) of a GitRepository; FaultError when its URL is elsewhere."""
        namespace, name = split_target(fault, target, 'GITREPOSITORY')
        plane, repository = self._find(fault, 'GitRepository', namespace, name)
        url = (repository.get('spec') or {}).get('url') or ''
        server = self.flux.git
        prefix = '%s://%s:%d/' % (server.scheme, server.host, server.port)
        if not url.startswith(prefix):
            raise FaultError('fault %s: GitRepository %s fetches %r, not a repository of the lab\'s Git server (%s)'
                             % (fault, target, url, prefix))
        return plane, server.repo_path(url[len(prefix) - 1:])

    def fault_source(self, target):
        fault = 'flux-source-not-ready'
        plane, repo = self._repository_of(fault, target)
        self.flux.git.down_repos.add(repo)
        self.applied[(fault, target)] = repo
        self._request_fetch(plane, *split_target(fault, target, 'GITREPOSITORY'))
        return "the lab's Git server answers 503 for %s (GitRepository %s)" % (repo, target)

    def clear_source(self, target):
        fault = 'flux-source-not-ready'
        repo = self.applied.pop((fault, target), None)
        if repo is None:
            return
        if not any(key[0] == fault and value == repo for key, value in self.applied.items()):
            self.flux.git.down_repos.discard(repo)
        try:
            plane = self._find(fault, 'GitRepository', *split_target(fault, target, 'GITREPOSITORY'))[0]
        except FaultError as exc:
            LOG.warning('%s (no fetch requested)', exc)
            return
        self._request_fetch(plane, *split_target(fault, target, 'GITREPOSITORY'))

    @staticmethod
    def _in_executor(function):
        """function as a coroutine run on the World loop's executor: git and the API calls block, the loop must not."""
        async def run(target, **params):
            return await asyncio.get_running_loop().run_in_executor(None, functools.partial(function, target, **params))
        return run

    def register(self, registry):
        wrap = self._in_executor
        registry.register('flux-healthcheck-fail', 'a commit makes the first Deployment a Flux Kustomization health-checks '
                          'unschedulable, with a short progress deadline: ProgressDeadlineExceeded, Ready=False '
                          'HealthCheckFailed (cleared: the commit reverted)', 'kustomization',
                          wrap(self.fault_healthcheck), wrap(self.clear_healthcheck),
                          params=[Param('progress_deadline', int, 10, "the Deployment's progressDeadlineSeconds in the commit")])
        registry.register('flux-source-not-ready', "the lab's Git server answers 503 for a GitRepository's repository: "
                          'Ready=False GitOperationFailed', 'gitrepository', wrap(self.fault_source), wrap(self.clear_source))
        registry.register('flux-build-fail', "a commit whose kustomization.yaml in a Flux Kustomization's path lists a file "
                          "that is not there: Ready=False BuildFailed with kustomize's error; what it applied before stays "
                          '(cleared: the commit reverted)', 'kustomization', wrap(self.fault_build), wrap(self.clear_build),
                          params=[Param('resource', str, 'missing.yaml', 'the file the kustomization.yaml lists')])
