"""Flux's controllers for one lab cluster: source-controller (GitRepository), kustomize-controller
(Kustomization) and flux-operator (FluxInstance), event-driven on the cluster's store.

Each acts only while its Deployment (flux-system/source-controller, .../kustomize-controller,
.../flux-operator) has an available replica, as the real controllers act only while they run.
What they write follows the controllers' code (kustomize-controller
internal/controller/kustomization_controller.go, source-controller, flux-operator):

GitRepository: the URL is fetched from the lab's Git server (gitserver.py), with the Secret of
  spec.secretRef; Ready/ArtifactInStorage True `Succeeded` "stored artifact for revision 'R'",
  or Ready False with FetchFailed (`GitOperationFailed`, `AuthenticationFailed`); an invalid URL
  is Stalled (`URLInvalid`). status.artifact.revision is `main@sha1:<commit>`.
Kustomization: source artifact (`ArtifactFailed` "Source artifact not found, retrying in 30s"),
  dependsOn (`DependencyNotReady` "dependency 'ns/name' is not ready", the four checks of
  checkDependencies), build (`BuildFailed`; `ArtifactFailed` for a missing path), server-side
  apply in two stages (CRDs and Namespaces first) with field manager kustomize-controller and the
  kustomize.toolkit.fluxcd.io/name|namespace labels (`ReconciliationFailed` naming the object),
  inventory and prune, health checks of every applied object (`wait: true`) or of
  `healthChecks` (`HealthCheckFailed` "health check failed after Xs: timeout waiting for: [...]"),
  then Ready True `ReconciliationSucceeded` "Applied revision: R" with observedGeneration and
  lastAppliedRevision. While it works: Reconciling True `Progressing` and Ready Unknown; after a
  failure Reconciling `ProgressingWithRetry` and a retry after spec.retryInterval.
FluxInstance: applies the components of the gotk manifest (the same file the collection's flux
  role ships) and the sync GitRepository + Kustomization, waits for all of them and reports
  Ready `ReconciliationSucceeded`.

Time: reconcile work takes the delays `flux_git_fetch` and `flux_reconcile`; retries wait
spec.retryInterval (or interval) times the time scale, at least REQUEUE_FLOOR real seconds;
health checks time out after spec.timeout times the time scale - at time scale 0 they never
time out by themselves (they end on observed state only), so a lab test that wants a failure
uses the flux-healthcheck-fail fault. Dependencies, sources and health are re-checked on store
events, not on a timer.

HelmRelease objects are stored but not reconciled (the lab's GitOps repository uses plain
manifests).
"""

import asyncio
import base64
import hashlib
import logging
import os
import time

import yaml

from lab.k8s.errors import ApiError
from lab.k8s.store import timestamp

from . import build as build_mod
from . import durations
from . import health
from .gitserver import GitError

LOG = logging.getLogger('lab.flux')

GIT_KEY = ('source.toolkit.fluxcd.io', 'gitrepositories')
KS_KEY = ('kustomize.toolkit.fluxcd.io', 'kustomizations')
FI_KEY = ('fluxcd.controlplane.io', 'fluxinstances')
DEPLOY_KEY = ('apps', 'deployments')
SECRET_KEY = ('', 'secrets')
HEALTH_KEYS = {('apps', 'deployments'), ('apps', 'daemonsets'), ('apps', 'statefulsets'), ('apps', 'replicasets'), ('batch', 'jobs'),
               ('', 'persistentvolumeclaims'), ('', 'namespaces'), ('apiextensions.k8s.io', 'customresourcedefinitions'), KS_KEY,
               GIT_KEY, ('helm.toolkit.fluxcd.io', 'helmreleases')}
NAME_LABEL = 'kustomize.toolkit.fluxcd.io/name'
NAMESPACE_LABEL = 'kustomize.toolkit.fluxcd.io/namespace'
PRUNE_ANNOTATION = 'kustomize.toolkit.fluxcd.io/prune'
RECONCILE_ANNOTATION = 'kustomize.toolkit.fluxcd.io/reconcile'
REQUESTED_AT = 'reconcile.fluxcd.io/requestedAt'
KUSTOMIZE_MANAGER = 'kustomize-controller'
OPERATOR_MANAGER = 'flux-operator'
# The kinds of Flux's distribution manifests that have no namespace.
CLUSTER_SCOPED_KINDS = ('Namespace', 'CustomResourceDefinition', 'ClusterRole', 'ClusterRoleBinding')
DEPENDENCY_REQUEUE = 30.0
REQUEUE_FLOOR = 0.5
GIT_POLL_FLOOR = 2.0
DEFAULT_COMPONENTS = ('source-controller', 'kustomize-controller', 'helm-controller', 'notification-controller')
FLUX_VERSION = 'v2.9.5'  # the Flux release of the flux role's pinned manifests (roles/flux/vars/artifacts.yml)
DELAY_KINDS = {
    'flux_git_fetch': ((1.0, 4.0), 'source-controller cloning a Git repository and storing the artifact'),
    'flux_reconcile': ((1.0, 3.0), 'kustomize-controller building and applying one Kustomization (flux-operator: one FluxInstance)'),
}


class NullTiming(object):
    """No delays (a KubeCluster without a World)."""

    scale = 0.0

    @staticmethod
    async def sleep(kind, target):
        del kind, target


def _conditions(old, updates, generation):
    """The new conditions list: updates {type: (status, reason, message)} or {type: None} (remove)."""
    now = timestamp()
    previous = {c.get('type'): c for c in old or () if isinstance(c, dict)}
    order = ['Reconciling', 'Stalled', 'Ready', 'Healthy', 'ArtifactInStorage', 'FetchFailed']
    merged = dict(previous)
    for kind, value in updates.items():
        if value is None:
            merged.pop(kind, None)
            continue
        status, reason, message = value
        before = previous.get(kind) or {}
        merged[kind] = {'type': kind, 'status': status, 'observedGeneration': generation,
                        'lastTransitionTime': before.get('lastTransitionTime', now) if before.get('status') == status else now,
                        'reason': reason, 'message': message}
    return sorted(merged.values(), key=lambda c: (order.index(c['type']) if c['type'] in order else len(order), c['type']))


def _condition(obj, kind):
    for condition in ((obj or {}).get('status') or {}).get('conditions') or ():
        if condition.get('type') == kind:
            return condition
    return None


def _is_true(obj, kind):
    condition = _condition(obj, kind)
    return condition is not None and condition.get('status') == 'True'


def _strip_times(value):
    if isinstance(value, dict):
        return {k: _strip_times(v) for k, v in value.items() if k not in ('lastTransitionTime', 'lastUpdateTime')}
    if isinstance(value, list):
        return [_strip_times(v) for v in value]
    return value


def flatten(docs):
    """The objects of YAML documents, the items of a v1 List counted one by one."""
    out = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get('kind') == 'List' and isinstance(doc.get('items'), list):
            out.extend(d for d in doc['items'] if d)
        elif doc:
            out.append(doc)
    return out


def _ref_text(kind, namespace, name):
    return '%s/%s/%s' % (kind, namespace, name) if namespace else '%s/%s' % (kind, name)


class Record(object):
    """What a controller remembers about one object between reconciles."""

    def __init__(self):
        self.inputs = None         # what the last completed attempt was for
        self.ready_inputs = None   # a GitRepository: the inputs of its last successful fetch
        self.phase = 'new'         # new, deps, working, health, ready, failed
        self.health = []           # [(apiVersion, kind, namespace, name)]
        self.health_started = 0.0
        self.deadline = None       # monotonic seconds, None: no timeout
        self.revision = None
        self.inventory = []
        self.prune = False
        self.finish = None         # callable(ok, message) run when the health wait ends
        self.timer = None


def broken_build_message(path, resource):
    """kustomize's error for a kustomization.yaml whose resources list a file the commit does not have (as Flux shows it)."""
    folder = '/tmp/kustomization-2417963150/%s' % (path or '.').strip('./').strip('/')
    missing = '%s/%s' % (folder.rstrip('/'), resource)
    return ("kustomize build failed: accumulating resources: accumulation err='accumulating resources from '%s': open %s: no such "
            "file or directory': must build at directory: not a valid directory: evalsymlink failure on '%s' : lstat %s: no such "
            "file or directory" % (resource, missing, missing, missing))


class FluxControllers(object):  # pylint: disable=too-many-instance-attributes,too-many-public-methods
    """The Flux controllers of one cluster (store = lab.k8s.store.Store)."""

    def __init__(self, store, git, timing=None, components_file=None, namespace='flux-system', require_controllers=True,
                 clock=time.monotonic):
        self.store = store
        self.registry = store.registry
        self.git = git
        self.timing = timing or NullTiming()
        self.components_file = components_file
        self.namespace = namespace
        self.require_controllers = require_controllers
        self.clock = clock
        self.health_faults = set()        # (namespace, kustomization): fault flux-healthcheck-fail
        self.build_faults = {}            # (namespace, kustomization) -> missing resource: fault flux-build-fail
        self.artifacts = {}               # (namespace, gitrepository) -> Snapshot
        self.records = {}                 # (key, namespace, name) -> Record
        self._dirty = {}
        self._running = {}
        self._again = set()
        self._wake = None
        self._task = None
        store.subscribe(self._on_event)

    # --- plumbing ---------------------------------------------------------------------------

    @property
    def scale(self):
        return float(getattr(self.timing, 'scale', 0.0) or 0.0)

    def start(self):
        if self._task is not None:
            return
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())
        self.kick_all()

    def stop(self):
        self.store.unsubscribe(self._on_event)
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for task in self._running.values():
            task.cancel()
        self._running.clear()
        for record in self.records.values():
            if record.timer is not None:
                record.timer.cancel()

    def kick(self, item):
        self._dirty[item] = True
        if self._wake is not None:
            self._wake.set()

    def kick_all(self):
        for key, tag in ((GIT_KEY, 'git'), (KS_KEY, 'ks'), (FI_KEY, 'fi')):
            for obj in self.store.items(key):
                self.kick((tag, obj['metadata'].get('namespace', ''), obj['metadata']['name']))

    def record(self, tag, namespace, name):
        return self.records.setdefault((tag, namespace, name), Record())

    def _on_event(self, event):
        meta = event.obj['metadata']
        namespace, name = meta.get('namespace', ''), meta['name']
        key = event.key
        if key == GIT_KEY:
            self.kick(('git', namespace, name))
            for ks in self.store.items(KS_KEY):
                ref = (ks.get('spec') or {}).get('sourceRef') or {}
                if ref.get('kind') == 'GitRepository' and ref.get('name') == name and (ref.get('namespace') or ks['metadata']['namespace']) \
                        == namespace:
                    self.kick(('ks', ks['metadata']['namespace'], ks['metadata']['name']))
        elif key == KS_KEY:
            self.kick(('ks', namespace, name))
            for ks in self.store.items(KS_KEY):
                for dep in (ks.get('spec') or {}).get('dependsOn') or ():
                    if isinstance(dep, dict) and dep.get('name') == name and (dep.get('namespace') or ks['metadata']['namespace']) == namespace:
                        self.kick(('ks', ks['metadata']['namespace'], ks['metadata']['name']))
        elif key == FI_KEY:
            self.kick(('fi', namespace, name))
        elif key == SECRET_KEY:
            for repo in self.store.items(GIT_KEY, namespace):
                if ((repo.get('spec') or {}).get('secretRef') or {}).get('name') == name:
                    self.record('git', namespace, repo['metadata']['name']).inputs = None
                    self.kick(('git', namespace, repo['metadata']['name']))
        if key == DEPLOY_KEY and namespace == self.namespace:
            self.kick(('controllers',))
        if key in HEALTH_KEYS or key == ('', 'pods'):
            self.kick(('health',))

    async def _run(self):
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._dirty:
                item = next(iter(self._dirty))
                del self._dirty[item]
                if item == ('controllers',):
                    self.kick_all()
                    continue
                if item == ('health',):
                    self._check_all_health()
                    continue
                if item in self._running:
                    self._again.add(item)
                    continue
                self._running[item] = asyncio.get_running_loop().create_task(self._guard(item))

    async def _guard(self, item):
        try:
            tag, namespace, name = item
            if tag == 'git':
                await self.reconcile_git(namespace, name)
            elif tag == 'ks':
                await self.reconcile_kustomization(namespace, name)
            elif tag == 'fi':
                await self.reconcile_instance(namespace, name)
        except asyncio.CancelledError:
            raise
        except Exception:  # pylint: disable=broad-except
            LOG.exception('reconcile %s failed', item)
        finally:
            self._running.pop(item, None)
            if item in self._again:
                self._again.discard(item)
                self.kick(item)

    def _later(self, record, seconds, item, reset=True):
        """Reconcile item again after seconds (scaled already), replacing a pending timer."""
        if record.timer is not None:
            record.timer.cancel()
        loop = asyncio.get_running_loop()

        def fire():
            record.timer = None
            if reset:
                record.inputs = None
            self.kick(item)
        record.timer = loop.call_later(max(0.0, seconds), fire)

    def _requeue_seconds(self, simulated):
        return max(simulated * self.scale, REQUEUE_FLOOR)

    def controller_up(self, name):
        if not self.require_controllers:
            return True
        deployment = self.store.peek(DEPLOY_KEY, self.namespace, name)
        return deployment is not None and ((deployment.get('status') or {}).get('availableReplicas') or 0) >= 1

    def _write_status(self, key, namespace, name, status, manager):
        current = self.store.peek(key, namespace, name)
        if current is None:
            return None
        if _strip_times(current.get('status') or {}) == _strip_times(status):
            return current
        rtype = self.registry.by_key(key)
        body = dict(current, status=status)
        try:
            stored, dummy = self.store.update(rtype, namespace, name, body, manager, subresource='status')
        except ApiError as exc:
            LOG.warning('status of %s %s/%s not written: %s', rtype.kind, namespace, name, exc.message)
            return None
        return stored

    def _namespaced(self, api_version, kind):
        rtype = self.registry.find_kind(api_version, kind)
        if rtype is None:
            return build_mod.default_namespaced(api_version, kind)
        return rtype.namespaced

    # --- GitRepository ------------------------------------------------------------------------

    def _secret_data(self, namespace, name):
        secret = self.store.peek(SECRET_KEY, namespace, name)
        if secret is None:
            return None
        out = {}
        for key, value in (secret.get('data') or {}).items():
            try:
                out[key] = base64.b64decode(value).decode('utf-8', 'replace')
            except (ValueError, TypeError):
                out[key] = ''
        return out

    async def reconcile_git(self, namespace, name):  # pylint: disable=too-many-locals
        repo = self.store.peek(GIT_KEY, namespace, name)
        record = self.record('git', namespace, name)
        if repo is None:
            self.artifacts.pop((namespace, name), None)
            self.records.pop(('git', namespace, name), None)
            return
        spec = repo.get('spec') or {}
        if spec.get('suspend') or not self.controller_up('source-controller'):
            return
        meta = repo['metadata']
        generation = meta.get('generation', 1)
        requested = (meta.get('annotations') or {}).get(REQUESTED_AT)
        down = self.git.down and self._repo_key(spec.get('url')) in self.git.down
        inputs = (generation, requested, down)
        if record.inputs == inputs and record.phase in ('ready', 'failed', 'stalled'):
            return
        # The interval's poll of a repository already Ready for these inputs fetches again without marking it
        # Reconciling first: as source-controller, whose status changes on a poll only when the revision does (a status
        # that flipped on every poll would make a client's apply of the object, racing it, report a change).
        polling = record.phase == 'ready' and record.ready_inputs == inputs
        record.inputs = inputs
        status = dict(repo.get('status') or {})
        url = spec.get('url') or ''
        problem = self.git.check_url(url)
        interval = self._interval(spec.get('interval'), 60.0)
        if problem:
            status['conditions'] = _conditions(status.get('conditions'), {
                'Stalled': ('True', 'URLInvalid', problem), 'Ready': ('False', 'URLInvalid', problem), 'Reconciling': None}, generation)
            status['observedGeneration'] = generation
            record.phase = 'stalled'
            self._write_status(GIT_KEY, namespace, name, status, 'source-controller')
            return
        record.phase = 'working'
        message = 'building artifact: new upstream revision' if not status.get('artifact') else 'building artifact'
        if not polling:
            status['conditions'] = _conditions(status.get('conditions'), {
                'Reconciling': ('True', 'Progressing', message), 'Ready': ('Unknown', 'Progressing', message), 'Stalled': None},
                generation)
            self._write_status(GIT_KEY, namespace, name, status, 'source-controller')
        await self.timing.sleep('flux_git_fetch', _ref_text('GitRepository', namespace, name))
        repo = self.store.peek(GIT_KEY, namespace, name)
        if repo is None:
            return
        status = dict(repo.get('status') or {})
        auth = None
        secret_ref = (spec.get('secretRef') or {}).get('name')
        try:
            if secret_ref:
                auth = self._secret_data(namespace, secret_ref)
                if auth is None:
                    raise GitError('AuthenticationFailed', "failed to get secret '%s/%s': secrets \"%s\" not found"
                                   % (namespace, secret_ref, secret_ref))
            snapshot = self.git.fetch(url, spec.get('ref'), auth)
        except GitError as exc:
            record.phase = 'failed'
            status['conditions'] = _conditions(status.get('conditions'), {
                'FetchFailed': ('True', exc.reason, exc.message), 'Ready': ('False', exc.reason, exc.message),
                'Reconciling': ('True', 'ProgressingWithRetry', message)}, generation)
            self._write_status(GIT_KEY, namespace, name, status, 'source-controller')
            self._later(record, self._requeue_seconds(interval), ('git', namespace, name))
            return
        self.artifacts[(namespace, name)] = snapshot
        path = 'gitrepository/%s/%s/%s.tar.gz' % (namespace, name, snapshot.commit)
        previous = status.get('artifact') or {}
        stored = "stored artifact for revision '%s'" % snapshot.revision
        status['artifact'] = {'digest': snapshot.digest, 'lastUpdateTime': previous.get('lastUpdateTime', timestamp())
                              if previous.get('revision') == snapshot.revision else timestamp(),
                              'path': path, 'revision': snapshot.revision, 'size': snapshot.size,
                              'url': 'http://source-controller.%s.svc.cluster.local./%s' % (self.namespace, path)}
        status['conditions'] = _conditions(status.get('conditions'), {
            'Ready': ('True', 'Succeeded', stored), 'ArtifactInStorage': ('True', 'Succeeded', stored), 'Reconciling': None,
            'FetchFailed': None, 'Stalled': None}, generation)
        status['observedGeneration'] = generation
        if requested:
            status['lastHandledReconcileAt'] = requested
        record.phase = 'ready'
        record.ready_inputs = inputs
        self._write_status(GIT_KEY, namespace, name, status, 'source-controller')
        # Poll the repository for new commits every interval (scaled, at least GIT_POLL_FLOOR real seconds).
        self._later(record, max(interval * self.scale, GIT_POLL_FLOOR), ('git', namespace, name))

    def _repo_key(self, url):
        import urllib.parse  # pylint: disable=import-outside-toplevel
        path = urllib.parse.urlparse(url or '').path.strip('/')
        return path[:-4] if path.endswith('.git') else path

    def _interval(self, text, default):
        try:
            return durations.parse(text, default)
        except ValueError:
            return default

    # --- Kustomization ------------------------------------------------------------------------

    def _source(self, ks):
        """(GitRepository object, snapshot, error (reason, message))."""
        namespace = ks['metadata']['namespace']
        ref = (ks.get('spec') or {}).get('sourceRef') or {}
        kind = ref.get('kind')
        source_ns = ref.get('namespace') or namespace
        if kind != 'GitRepository':
            return None, None, ('ArtifactFailed', "source `%s` kind '%s' not supported (the lab's source-controller serves GitRepository)"
                                % (ref.get('name'), kind))
        repo = self.store.peek(GIT_KEY, source_ns, ref.get('name'))
        if repo is None:
            return None, None, ('ArtifactFailed', 'GitRepository.source.toolkit.fluxcd.io "%s" not found' % ref.get('name'))
        snapshot = self.artifacts.get((source_ns, ref.get('name')))
        artifact = (repo.get('status') or {}).get('artifact')
        if not artifact or snapshot is None:
            return repo, None, ('ArtifactFailed', 'Source artifact not found, retrying in %s' % durations.format(DEPENDENCY_REQUEUE))
        return repo, snapshot, None

    def check_dependencies(self, ks, revision):
        """'' when every dependsOn is ready as kustomize-controller's checkDependencies requires, else why not."""
        namespace = ks['metadata']['namespace']
        my_ref = (ks.get('spec') or {}).get('sourceRef') or {}
        my_source = (my_ref.get('kind'), my_ref.get('name'), my_ref.get('namespace') or namespace)
        for dep in (ks.get('spec') or {}).get('dependsOn') or ():
            dep_ns = dep.get('namespace') or namespace
            text = '%s/%s' % (dep_ns, dep.get('name'))
            other = self.store.peek(KS_KEY, dep_ns, dep.get('name'))
            if other is None:
                return 'dependency \'%s\' not found: kustomizations.kustomize.toolkit.fluxcd.io "%s" not found' % (text, dep.get('name'))
            status = other.get('status') or {}
            if not status.get('conditions') or other['metadata'].get('generation') != status.get('observedGeneration'):
                return "dependency '%s' is not ready" % text
            if not _is_true(other, 'Ready'):
                return "dependency '%s' is not ready" % text
            ref = (other.get('spec') or {}).get('sourceRef') or {}
            if (ref.get('kind'), ref.get('name'), ref.get('namespace') or dep_ns) == my_source and status.get('lastAppliedRevision') != revision:
                return "dependency '%s' revision is not up to date" % text
        return ''

    async def reconcile_kustomization(self, namespace, name):  # pylint: disable=too-many-return-statements,too-many-locals
        ks = self.store.peek(KS_KEY, namespace, name)
        record = self.record('ks', namespace, name)
        if ks is None:
            if record.prune and record.inventory:
                self._delete_entries(record.inventory, namespace, name)
            if record.timer is not None:
                record.timer.cancel()
            self.records.pop(('ks', namespace, name), None)
            return
        spec = ks.get('spec') or {}
        if not self.controller_up('kustomize-controller'):
            return
        meta = ks['metadata']
        generation = meta.get('generation', 1)
        requested = (meta.get('annotations') or {}).get(REQUESTED_AT)
        # kustomize-controller v1.9.5 copies the reconcile request to status.lastHandledReconcileAt in finalizeStatus
        # (internal/controller/kustomization_controller.go:1294-1300), which Reconcile defers (:141-166) before any
        # early return: a suspended object (:183-187), a missing source (:212-240) and a dependency that is not ready
        # (:243-262) handle the request too. A suspended object is otherwise left as it is (no apply, no prune, no
        # health check, its status untouched); setting spec.suspend back to false is a spec change, a new generation,
        # which this controller reconciles as any other (record.inputs below).
        if spec.get('suspend'):
            if requested and (ks.get('status') or {}).get('lastHandledReconcileAt') != requested:
                self._write_status(KS_KEY, namespace, name, dict(ks.get('status') or {}, lastHandledReconcileAt=requested),
                                   KUSTOMIZE_MANAGER)
            return
        fault = (namespace, name) in self.health_faults
        broken = self.build_faults.get((namespace, name))
        status = dict(ks.get('status') or {})
        retry = self._interval(spec.get('retryInterval'), None) or self._interval(spec.get('interval'), 600.0)
        if requested:
            status['lastHandledReconcileAt'] = requested
        repo, snapshot, problem = self._source(ks)
        if problem:
            record.phase, record.inputs = 'failed', None
            status['conditions'] = _conditions(status.get('conditions'), {'Ready': ('False',) + problem}, generation)
            self._write_status(KS_KEY, namespace, name, status, KUSTOMIZE_MANAGER)
            if repo is None:
                self._later(record, self._requeue_seconds(retry), ('ks', namespace, name))
            return
        revision = repo['status']['artifact']['revision']
        inputs = (generation, revision, requested, fault, broken)
        if record.inputs == inputs and record.phase in ('working', 'health', 'ready', 'failed'):
            if record.phase == 'health':
                self.check_health(('ks', namespace, name))
            return
        waiting = self.check_dependencies(ks, revision)
        if waiting:
            record.phase, record.inputs = 'deps', None
            status['conditions'] = _conditions(status.get('conditions'), {'Ready': ('False', 'DependencyNotReady', waiting)}, generation)
            self._write_status(KS_KEY, namespace, name, status, KUSTOMIZE_MANAGER)
            return
        record.inputs = inputs
        record.phase = 'working'
        # a reconcile that goes on hands the request only in finalizeStatus, with its final Ready
        # (v1.9.5 kustomization_controller.go:141-166, 1294-1300): the in-progress status keeps the earlier value
        handled_before = (ks.get('status') or {}).get('lastHandledReconcileAt')
        if handled_before is None:
            status.pop('lastHandledReconcileAt', None)
        else:
            status['lastHandledReconcileAt'] = handled_before
        timeout = self._interval(spec.get('timeout'), None) or self._interval(spec.get('interval'), 600.0)
        timeout_text = durations.format(timeout)
        status['conditions'] = _conditions(status.get('conditions'), {
            'Ready': ('Unknown', 'Progressing', 'Reconciliation in progress'),
            'Reconciling': ('True', 'Progressing', 'Fetching manifests for revision %s with a timeout of %s' % (revision, timeout_text))},
            generation)
        self._write_status(KS_KEY, namespace, name, status, KUSTOMIZE_MANAGER)
        started = self.clock()
        await self.timing.sleep('flux_reconcile', _ref_text('Kustomization', namespace, name))
        ks = self.store.peek(KS_KEY, namespace, name)
        if ks is None:
            return
        status = dict(ks.get('status') or {})
        status['lastAttemptedRevision'] = revision
        if requested:
            status['lastHandledReconcileAt'] = requested
        try:
            if broken:
                raise build_mod.BuildError(broken_build_message(spec.get('path'), broken))
            objects = build_mod.build(snapshot.files, spec.get('path'), self._namespaced)
        except build_mod.PathNotFound as exc:
            self._ks_failed(ks, status, record, 'ArtifactFailed', str(exc), retry)
            return
        except build_mod.BuildError as exc:
            self._ks_failed(ks, status, record, 'BuildFailed', str(exc), retry)
            return
        entries, error = self._apply(objects, ks)
        old_inventory = list(((status.get('inventory') or {}).get('entries')) or record.inventory)
        if error:
            self._ks_failed(ks, status, record, 'ReconciliationFailed', error, retry)
            return
        status['inventory'] = {'entries': entries}
        record.inventory, record.prune = entries, bool(spec.get('prune'))
        if spec.get('prune'):
            stale = [e for e in old_inventory if e['id'] not in {n['id'] for n in entries}]
            self._delete_entries(stale, namespace, name)
        checks = self._health_targets(ks, objects)
        if not checks:
            self._ks_ready(ks, status, record, revision, None)
            return
        record.phase = 'health'
        record.health = checks
        record.health_started = started
        record.deadline = self.clock() if fault else (self.clock() + timeout * self.scale if self.scale > 0 else None)
        record.revision = revision
        message = 'Running health checks for revision %s with a timeout of %s' % (revision, timeout_text)
        status['conditions'] = _conditions(status.get('conditions'), {
            'Reconciling': ('True', 'Progressing', message), 'Healthy': ('Unknown', 'Progressing', message)}, generation)
        in_progress = dict(status)
        if handled_before is None:
            in_progress.pop('lastHandledReconcileAt', None)
        else:
            in_progress['lastHandledReconcileAt'] = handled_before
        self._write_status(KS_KEY, namespace, name, in_progress, KUSTOMIZE_MANAGER)

        def finish(ok, text):
            current = self.store.peek(KS_KEY, namespace, name)
            if current is None:
                return
            current_status = dict(current.get('status') or {})
            if requested:
                current_status['lastHandledReconcileAt'] = requested
            if ok:
                self._ks_ready(current, current_status, record, revision, text)
            else:
                current_status['conditions'] = _conditions(current_status.get('conditions'), {
                    'Healthy': ('False', 'HealthCheckFailed', text)}, current['metadata'].get('generation', 1))
                self._ks_failed(current, current_status, record, 'HealthCheckFailed', text, retry)
        record.finish = finish
        self.check_health(('ks', namespace, name))

    def _ks_ready(self, ks, status, record, revision, health_message):
        namespace, name = ks['metadata']['namespace'], ks['metadata']['name']
        generation = ks['metadata'].get('generation', 1)
        updates = {'Ready': ('True', 'ReconciliationSucceeded', 'Applied revision: %s' % revision), 'Reconciling': None}
        updates['Healthy'] = ('True', 'Succeeded', health_message) if health_message else None
        status['conditions'] = _conditions(status.get('conditions'), updates, generation)
        status['observedGeneration'] = generation
        status['lastAppliedRevision'] = revision
        record.phase = 'ready'
        record.finish = None
        self._write_status(KS_KEY, namespace, name, status, KUSTOMIZE_MANAGER)
        if self.scale > 0:
            spec = ks.get('spec') or {}
            self._later(record, self._interval(spec.get('interval'), 600.0) * self.scale, ('ks', namespace, name))

    def _ks_failed(self, ks, status, record, reason, message, retry):  # pylint: disable=too-many-arguments
        namespace, name = ks['metadata']['namespace'], ks['metadata']['name']
        generation = ks['metadata'].get('generation', 1)
        updates = {'Ready': ('False', reason, message)}
        reconciling = _condition({'status': status}, 'Reconciling')
        if reconciling is not None:
            updates['Reconciling'] = ('True', 'ProgressingWithRetry', reconciling.get('message', ''))
        status['conditions'] = _conditions(status.get('conditions'), updates, generation)
        record.phase = 'failed'
        record.finish = None
        self._write_status(KS_KEY, namespace, name, status, KUSTOMIZE_MANAGER)
        self._later(record, self._requeue_seconds(retry), ('ks', namespace, name))

    def _health_targets(self, ks, objects):
        spec = ks.get('spec') or {}
        me = ('kustomize.toolkit.fluxcd.io', 'Kustomization', ks['metadata']['namespace'], ks['metadata']['name'])
        targets = []
        if spec.get('wait'):
            for obj in objects:
                meta = obj.get('metadata') or {}
                targets.append((obj['apiVersion'], obj['kind'], meta.get('namespace') or '', meta['name']))
        else:
            for ref in spec.get('healthChecks') or ():
                namespace = ref.get('namespace') or ''
                targets.append((ref.get('apiVersion') or '', ref.get('kind') or '', namespace, ref.get('name') or ''))
        return [t for t in targets if (t[0].rpartition('/')[0], t[1], t[2], t[3]) != me]

    # --- apply and prune --------------------------------------------------------------------------

    def _apply(self, objects, ks, manager=KUSTOMIZE_MANAGER, owner_labels=True):
        """Server-side apply in two stages; returns (inventory entries, error message or '')."""
        spec = (ks or {}).get('spec') or {}
        target_ns = spec.get('targetNamespace')
        first = [o for o in objects if o['kind'] in ('CustomResourceDefinition', 'Namespace')]
        rest = [o for o in objects if o['kind'] not in ('CustomResourceDefinition', 'Namespace')]
        entries = []
        for stage in (first, rest):
            for obj in stage:
                obj = build_mod._copy(obj)  # pylint: disable=protected-access
                meta = obj.setdefault('metadata', {})
                rtype = self.registry.find_kind(obj['apiVersion'], obj['kind'])
                label = _ref_text(obj['kind'], meta.get('namespace'), meta['name'])
                if rtype is None:
                    group, dummy, version = obj['apiVersion'].rpartition('/')
                    return entries, '%s dry-run failed: no matches for kind "%s" in version "%s"' % (
                        label, obj['kind'], '%s/%s' % (group, version) if group else version)
                if (meta.get('annotations') or {}).get(RECONCILE_ANNOTATION) == 'disabled':
                    continue
                if rtype.namespaced:
                    if target_ns:
                        meta['namespace'] = target_ns
                    meta.setdefault('namespace', 'default')
                else:
                    meta.pop('namespace', None)
                if owner_labels and ks is not None:
                    owner = {NAME_LABEL: ks['metadata']['name'], NAMESPACE_LABEL: ks['metadata']['namespace']}
                    meta['labels'] = dict(meta.get('labels') or {}, **owner)
                namespace = meta.get('namespace', '')
                try:
                    self.store.patch(rtype, namespace, meta['name'], 'apply', obj, manager, force=True)
                except ApiError as exc:
                    return entries, '%s dry-run failed (%s): %s' % (_ref_text(obj['kind'], namespace, meta['name']), exc.reason, exc.message)
                entries.append({'id': '%s_%s_%s_%s' % (namespace, meta['name'], rtype.group, rtype.kind), 'v': rtype.version})
        return sorted(entries, key=lambda e: e['id']), ''

    def _delete_entries(self, entries, namespace, name):
        for entry in entries:
            obj_ns, obj_name, group, kind = entry['id'].split('_', 3)
            rtype = self.registry.find_kind('%s/%s' % (group, entry['v']) if group else entry['v'], kind)
            if rtype is None:
                continue
            obj = self.store.peek(rtype.key, obj_ns if rtype.namespaced else '', obj_name)
            if obj is None:
                continue
            labels = obj['metadata'].get('labels') or {}
            annotations = obj['metadata'].get('annotations') or {}
            if labels.get(NAME_LABEL) != name or labels.get(NAMESPACE_LABEL) != namespace:
                continue
            if annotations.get(PRUNE_ANNOTATION) == 'disabled' or labels.get(PRUNE_ANNOTATION) == 'disabled':
                continue
            try:
                self.store.delete(rtype, obj_ns, obj_name, 'Background')
            except ApiError as exc:
                LOG.warning('prune of %s failed: %s', entry['id'], exc.message)

    # --- health ------------------------------------------------------------------------------------

    def _check_all_health(self):
        for key, record in list(self.records.items()):
            if record.phase == 'health':
                self.check_health(key)

    def object_health(self, target):
        api_version, kind, namespace, name = target
        rtype = self.registry.find_kind(api_version, kind)
        if rtype is None:
            return health.NOT_FOUND, 'no matches for kind "%s" in version "%s"' % (kind, api_version)
        obj = self.store.peek(rtype.key, namespace if rtype.namespaced else '', name)
        return health.status(obj, kind, rtype.group)

    def check_health(self, key):
        """Evaluate a health wait: finish it when everything is Current, or when its deadline passed."""
        record = self.records.get(key)
        if record is None or record.phase != 'health' or record.finish is None:
            return
        tag, namespace, name = key
        results = [(target, self.object_health(target)) for target in record.health]
        pending = [(t, s) for t, s in results if s[0] != health.CURRENT]
        fault = tag == 'ks' and (namespace, name) in self.health_faults
        if fault and not pending and results:
            pending = [(results[0][0], (health.IN_PROGRESS, 'lab fault flux-healthcheck-fail'))]
        now = self.clock()
        if not pending:
            record.phase = 'finishing'
            record.finish(True, 'Health check passed in %s' % durations.format(round(now - record.health_started, 3)))
            return
        expired = record.deadline is not None and now >= record.deadline
        if not expired:
            if record.deadline is not None and record.timer is None:
                self._later(record, record.deadline - now, ('health',), reset=False)
            return
        waited = ', '.join("%s status: '%s'" % (_ref_text(t[1], t[2], t[3]), s[0]) for t, s in pending)
        record.phase = 'finishing'
        record.finish(False, 'health check failed after %s: timeout waiting for: [%s]'
                      % (durations.format(round(now - record.health_started, 3)), waited))

    # --- FluxInstance (flux-operator) ------------------------------------------------------------

    def components(self, instance):
        """The objects of the components a FluxInstance asks for, from Flux's distribution manifests: the pinned upstream
        files of the flux role's manifest method (roles/flux/vars/artifacts.yml, from the lab's artifact cache), the
        same Flux v2.9.5 files flux-operator v0.59.0 carries under config/data/flux. As the operator's build does,
        objects without a namespace go to the instance's namespace and the images to distribution.registry
        (upstream's files name them fluxcd/<controller>:<tag>). Unlike the real operator, the lab applies that one
        Flux version whatever distribution.version asks for."""
        spec = instance.get('spec') or {}
        wanted = set(spec.get('components') or DEFAULT_COMPONENTS)
        registry = ((spec.get('distribution') or {}).get('registry') or 'ghcr.io/fluxcd').rstrip('/')
        namespace = instance['metadata']['namespace']
        paths = self.components_file if isinstance(self.components_file, (list, tuple)) else [self.components_file]
        absent = [path for path in paths if not path or not os.path.exists(path)]
        if absent:
            raise build_mod.BuildError('the lab flux-operator has no distribution manifest %s (make setup fills the lab '
                                       'artifact cache)' % absent[0])
        docs = []
        for path in paths:
            with open(path, encoding='utf-8') as handle:
                docs.extend(flatten(doc for doc in yaml.safe_load_all(handle) if doc))
        out = []
        for doc in docs:
            labels = (doc.get('metadata') or {}).get('labels') or {}
            component = labels.get('app.kubernetes.io/component')
            if component and component not in wanted:
                continue
            doc = build_mod._copy(doc)  # pylint: disable=protected-access
            meta = doc['metadata']
            if doc['kind'] == 'Namespace':
                meta['name'] = namespace
            elif not meta.get('namespace') and doc['kind'] not in CLUSTER_SCOPED_KINDS:
                meta['namespace'] = namespace
            elif meta.get('namespace'):
                meta['namespace'] = namespace
            for container in ((((doc.get('spec') or {}).get('template') or {}).get('spec') or {}).get('containers') or ()):
                image = container.get('image') or ''
                for prefix in ('ghcr.io/fluxcd/', 'fluxcd/'):
                    if image.startswith(prefix):
                        container['image'] = registry + '/' + image[len(prefix):]
                        break
            out.append(doc)
        return out

    @staticmethod
    def sync_objects(instance):
        spec = instance.get('spec') or {}
        sync = spec.get('sync') or {}
        if not sync:
            return []
        namespace = instance['metadata']['namespace']
        name = sync.get('name') or namespace
        source = {'apiVersion': 'source.toolkit.fluxcd.io/v1', 'kind': 'GitRepository',
                  'metadata': {'name': name, 'namespace': namespace},
                  'spec': {'interval': sync.get('interval') or '1m', 'url': sync.get('url'), 'ref': {'name': sync.get('ref')}}}
        if sync.get('pullSecret'):
            source['spec']['secretRef'] = {'name': sync['pullSecret']}
        kustomization = {'apiVersion': 'kustomize.toolkit.fluxcd.io/v1', 'kind': 'Kustomization',
                         'metadata': {'name': name, 'namespace': namespace},
                         'spec': {'interval': '10m0s', 'path': sync.get('path') or './', 'prune': True,
                                  'sourceRef': {'kind': 'GitRepository', 'name': name}}}
        return [source, kustomization]

    async def reconcile_instance(self, namespace, name):  # pylint: disable=too-many-locals
        instance = self.store.peek(FI_KEY, namespace, name)
        record = self.record('fi', namespace, name)
        if instance is None:
            self.records.pop(('fi', namespace, name), None)
            return
        deployment = self.store.peek(DEPLOY_KEY, namespace, 'flux-operator')
        if self.require_controllers and (deployment is None or ((deployment.get('status') or {}).get('availableReplicas') or 0) < 1):
            return
        meta = instance['metadata']
        generation = meta.get('generation', 1)
        requested = (meta.get('annotations') or {}).get('reconcile.fluxcd.io/requestedAt')
        inputs = (generation, requested)
        if record.inputs == inputs and record.phase in ('working', 'health', 'ready', 'failed'):
            if record.phase == 'health':
                self.check_health(('fi', namespace, name))
            return
        record.inputs = inputs
        status = dict(instance.get('status') or {})
        if name != 'flux':
            text = 'the FluxInstance must be named flux, got %s' % name
            status['conditions'] = _conditions(status.get('conditions'), {'Ready': ('False', 'ReconciliationFailed', text),
                                                                          'Stalled': ('True', 'ReconciliationFailed', text)}, generation)
            status['observedGeneration'] = generation
            record.phase = 'failed'
            self._write_status(FI_KEY, namespace, name, status, OPERATOR_MANAGER)
            return
        record.phase = 'working'
        status['conditions'] = _conditions(status.get('conditions'), {
            'Ready': ('Unknown', 'Progressing', 'Reconciliation in progress'),
            'Reconciling': ('True', 'Progressing', 'Reconciliation in progress')}, generation)
        self._write_status(FI_KEY, namespace, name, status, OPERATOR_MANAGER)
        started = self.clock()
        await self.timing.sleep('flux_reconcile', _ref_text('FluxInstance', namespace, name))
        instance = self.store.peek(FI_KEY, namespace, name)
        if instance is None:
            return
        status = dict(instance.get('status') or {})
        try:
            objects = self.components(instance) + self.sync_objects(instance)
        except build_mod.BuildError as exc:
            self._instance_failed(instance, status, record, str(exc))
            return
        entries, error = self._apply(objects, None, manager=OPERATOR_MANAGER, owner_labels=False)
        if error:
            self._instance_failed(instance, status, record, error)
            return
        version = FLUX_VERSION
        digest = hashlib.sha256(yaml.safe_dump(objects).encode()).hexdigest()
        registry = (instance['spec'].get('distribution') or {}).get('registry') or 'ghcr.io/fluxcd'
        components = [{'name': c, 'repository': '%s/%s' % (registry, c), 'tag': version}
                      for c in sorted(set(instance['spec'].get('components') or DEFAULT_COMPONENTS))]
        revision = '%s@sha256:%s' % (version, digest)
        targets = [(o['apiVersion'], o['kind'], o['metadata'].get('namespace') or '', o['metadata']['name']) for o in objects]
        if (instance.get('spec') or {}).get('wait', True) is False:
            targets = []

        def finish(ok, text):
            current = self.store.peek(FI_KEY, namespace, name)
            if current is None:
                return
            current_status = dict(current.get('status') or {})
            if ok:
                current_status['conditions'] = _conditions(current_status.get('conditions'), {
                    'Ready': ('True', 'ReconciliationSucceeded', 'Reconciliation finished in %s' % durations.format(
                        round(self.clock() - started, 3))), 'Reconciling': None}, current['metadata'].get('generation', 1))
                current_status['observedGeneration'] = current['metadata'].get('generation', 1)
                current_status['inventory'] = {'entries': entries}
                current_status['components'] = components
                current_status['lastAppliedRevision'] = revision
                current_status['lastAttemptedRevision'] = revision
                record.phase = 'ready'
                self._write_status(FI_KEY, namespace, name, current_status, OPERATOR_MANAGER)
            else:
                self._instance_failed(current, current_status, record, text)
        record.finish = finish
        if not targets:
            finish(True, '')
            return
        record.phase = 'health'
        record.health = targets
        record.health_started = started
        timeout = self._interval((meta.get('annotations') or {}).get('fluxcd.controlplane.io/reconcileTimeout'), 300.0)
        record.deadline = self.clock() + timeout * self.scale if self.scale > 0 else None
        self.check_health(('fi', namespace, name))

    def _instance_failed(self, instance, status, record, message):
        generation = instance['metadata'].get('generation', 1)
        status['conditions'] = _conditions(status.get('conditions'), {
            'Ready': ('False', 'ReconciliationFailed', message), 'Reconciling': ('True', 'ProgressingWithRetry', 'Reconciliation in progress')},
            generation)
        record.phase = 'failed'
        record.finish = None
        self._write_status(FI_KEY, instance['metadata']['namespace'], instance['metadata']['name'], status, OPERATOR_MANAGER)
        self._later(record, self._requeue_seconds(60.0), ('fi', instance['metadata']['namespace'], instance['metadata']['name']))

    # --- faults and status -------------------------------------------------------------------------

    def set_build_fault(self, namespace, name, resource):
        """resource: the file the broken kustomization.yaml lists but the commit lacks (None: the build works again)."""
        if resource:
            self.build_faults[(namespace, name)] = resource
        else:
            self.build_faults.pop((namespace, name), None)
        self.kick(('ks', namespace, name))

    def set_health_fault(self, namespace, name, active):
        if active:
            self.health_faults.add((namespace, name))
        else:
            self.health_faults.discard((namespace, name))
        self.kick(('ks', namespace, name))

    def status(self):
        out = []
        for key, tag in ((GIT_KEY, 'GitRepository'), (KS_KEY, 'Kustomization'), (FI_KEY, 'FluxInstance')):
            for obj in self.store.items(key):
                ready = _condition(obj, 'Ready') or {}
                out.append({'kind': tag, 'namespace': obj['metadata'].get('namespace'), 'name': obj['metadata']['name'],
                            'ready': ready.get('status', 'Unknown'), 'reason': ready.get('reason'), 'message': ready.get('message'),
                            'revision': (obj.get('status') or {}).get('lastAppliedRevision')
                            or ((obj.get('status') or {}).get('artifact') or {}).get('revision')})
        return out
