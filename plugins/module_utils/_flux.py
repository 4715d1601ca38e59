# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Flux Kustomization tree as the gitops gate judges it. PRIVATE to the collection.

assess(kustomizations, sources) is pure: it orders the live Kustomizations by spec.dependsOn (the
namespace of a dependency defaults to the dependant's, as kustomize-controller resolves it),
judges each with kustomization_state() (what kustomize-controller v1.9.5 itself requires of a
dependency, plus the reconcile request and suspension; see there), and for each one that is not
Ready says why, in dependsOn terms:

- a *blocker* is not Ready for a reason of its own (HealthCheckFailed, BuildFailed, a source
  without artifact, ...), or depends on a Kustomization that does not exist, or is part of a
  dependency cycle;
- a *blocked* Kustomization waits on a dependency that is not Ready (Flux reports it as
  DependencyNotReady); it is listed under the blockers at the root of its chain.

TreeGate adds the reads (Kustomizations, and on failure the blockers' sources and health-checked
workloads, whose own diagnosis names the node and pod: k8s_gate's workload gate) and plugs into
_k8s.gates.run like any gate.
"""

from __future__ import annotations

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors, _graph
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import diagnosis
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import gates
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import objects
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import predicates

KUSTOMIZATION_API = 'kustomize.toolkit.fluxcd.io/v1'
REQUESTED_AT = predicates.REQUESTED_AT
# The source kinds a Kustomization may name (kustomize-controller api v1.9.5 v1/reference_types.go:33, the sourceRef
# kind enum); ExternalArtifact is source-controller api v1.9.5 v1/externalartifact_types.go (status.artifact as the others).
SOURCE_APIS = {'GitRepository': 'source.toolkit.fluxcd.io/v1', 'OCIRepository': 'source.toolkit.fluxcd.io/v1',
               'Bucket': 'source.toolkit.fluxcd.io/v1', 'ExternalArtifact': 'source.toolkit.fluxcd.io/v1'}
WORKLOAD_KINDS = ('Deployment', 'DaemonSet', 'StatefulSet')
MAX_HEALTH_TARGETS = 20


def ks_id(obj):
    meta = objects.metadata(obj)
    return '%s/%s' % (meta.get('namespace') or '', meta.get('name'))


def dependencies(obj):
    """The ids a Kustomization depends on (namespace defaulting to its own)."""
    namespace = objects.metadata(obj).get('namespace') or ''
    out = []
    for dep in objects.spec(obj).get('dependsOn') or []:
        if isinstance(dep, dict) and dep.get('name'):
            ident = '%s/%s' % (dep.get('namespace') or namespace, dep['name'])
            if ident not in out:
                out.append(ident)
    return out


def order(graph):
    """(tiers, cycles) of {id: [dependency ids]}: tier 0 depends on nothing present; each tier and the cycles sorted,
    a cycle as an id path from the smallest id of its strongly connected group back to it."""
    tiers, waiting = _graph.tiers(_graph.sorted_graph(graph))
    stuck = _graph.sorted_graph(dict((ident, graph[ident]) for ident in waiting))
    return tiers, sorted(_graph.cycle_through(stuck, component) for component in _graph.cyclic_components(stuck))


def source_key(obj):
    """(kind, namespace, name) of a Kustomization's spec.sourceRef (namespace defaulting to its own)."""
    ref = objects.spec(obj).get('sourceRef') or {}
    return (ref.get('kind') or '', ref.get('namespace') or objects.metadata(obj).get('namespace') or '', ref.get('name') or '')


def last_build_succeeded(obj):
    """False when the newest snapshot of a Kustomization's status.history (the outcome of its last reconcile that got
    as far as a build; kustomize-controller v1.9.5 kustomization_controller.go:473-547) is a failure; True when it is
    a success or when there is no history (a controller before status.history)."""
    history = objects.status(obj).get('history') or []
    newest = history[0] if history and isinstance(history[0], dict) else {}
    return newest.get('lastReconciledStatus') in (None, 'ReconciliationSucceeded')


def kustomization_state(obj, source=None, check_source=True):
    """Is this Kustomization done with what it has to apply now? A condition_met-shaped item.

    On top of the flux CLI's test (predicates.condition_met), what kustomize-controller v1.9.5 (Flux v2.9.5, the pinned
    release) itself requires before it counts a dependency as ready (internal/controller/kustomization_controller.go
    :558-630, checkDependencies): status.lastAppliedRevision equal to the source's status.artifact.revision (HasRevision:
    plain equality). A Kustomization's generation does not move when its source gets a new commit, so Ready=True alone
    can be the old commit's verdict.

    - spec.suspend: the controller returns before reconciling (kustomization_controller.go:183-187) and leaves the
      status as it was; named at once (`suspended`, fails the gate: no wait can change it).
    - A reconcile request (reconcile.fluxcd.io/requestedAt) on the Kustomization or on its source that the
      controller has not handled yet (predicates.request_pending) is not Ready.
    - Every reconcile, the periodic one with nothing new included, starts with Ready=Unknown `Progressing`
      and Reconciling=True (kustomization_controller.go:325-326) and keeps them through build, apply and health
      checks; status.observedGeneration moves only on success (finalizeStatus, :1304-1307). So Ready=Unknown
      `Progressing` is accepted when status.observedGeneration equals the generation, no request is pending, the
      last applied revision is the source's current one, and the last reconcile that got as far as a build succeeded:
      this object already completed a reconcile of this spec at this revision, and the one running now has nothing
      new to apply. A retry after a failure starts the same way, so what the last attempt ended with decides:
      - status.history (fluxcd/pkg apis/meta v1.30.2 history.go: newest snapshot first, Upsert) has the outcome of
        every reconcile that built: `ReconciliationSucceeded` (:541-545), else `ReconciliationFailed` (apply,
        inventory), `PruneFailed` or `HealthCheckFailed` (:473-529). Its newest entry must be the success.
      - Healthy=False (a failed health check) also refuses it: Healthy stays False until the retry's health checks
        start (:1052-1054), which covers a controller that writes no history.
      What is not seen: a retry after a failure before the build (a dependency, a source or decryption error at the
      same revision, :213-262, :424-454) records no history; its Ready=Unknown is accepted for the time it runs.
    - Stalled=True (at v1.9.5 InvalidCELExpression, FeatureGateDisabled and AccessDenied, :189-255) fails at once.

    With check_source false (no sources read) the revision is not compared.
    """
    item = predicates.condition_met(obj)
    item['last_applied_revision'] = objects.status(obj).get('lastAppliedRevision')
    kind, src_ns, src_name = source_key(obj)
    item['source'] = '%s %s/%s' % (kind, src_ns, src_name)
    artifact = ((objects.status(source) if source else {}).get('artifact') or {})
    item['source_revision'] = artifact.get('revision')
    if item['suspended'] or item['stalled'] or objects.is_terminating(obj):
        return item
    if not item['ok']:
        ready = objects.condition(obj, 'Ready') or {}
        healthy = objects.condition(obj, 'Healthy')
        if not (ready.get('status') == 'Unknown' and ready.get('reason') == 'Progressing' and not predicates.request_pending(obj)
                and (healthy is None or healthy.get('status') != 'False') and last_build_succeeded(obj)
                and objects.generation(obj) is not None and objects.observed_generation(obj) == objects.generation(obj)
                and check_source and item['source_revision'] and item['last_applied_revision'] == item['source_revision']):
            return item
        item.update(ok=True, reason=None)
        item['note'] = 'periodic reconcile in progress; revision %s already applied at generation %s' % (
            item['last_applied_revision'], objects.generation(obj))
    if not check_source:
        return item
    if kind not in SOURCE_APIS:
        item['note'] = 'source kind %s is not one the gate reads; its revision is not compared' % kind
        return item
    if source is None:
        item.update(ok=False, reason='source %s not found' % item['source'])
        return item
    pending = predicates.request_pending(source)
    if pending:
        item.update(ok=False, reason='source %s: %s' % (item['source'], pending))
        return item
    if not item['source_revision']:
        item.update(ok=False, reason='source %s has no artifact yet' % item['source'])
        return item
    if item['last_applied_revision'] != item['source_revision']:
        item.update(ok=False, reason='applied revision %s, source %s has %s (not applied yet)' % (
            item['last_applied_revision'] or '-', item['source'], item['source_revision']))
    return item


def assess(kustomizations, expected=None, sources=None):
    """Verdict over the Kustomization tree; items in dependsOn order, each with tier, depends_on, blocked_by.

    sources: {(kind, namespace, name): source object} as read (source_key() of each Kustomization); None leaves
    the revision unchecked (for callers that read no source)."""
    by_id = dict((ks_id(k), k) for k in kustomizations)
    graph = dict((ident, dependencies(obj)) for ident, obj in by_id.items())
    tiers, cycles = order(graph)
    tier_of = dict((node, number) for number, tier in enumerate(tiers) for node in tier)
    in_cycle = set(node for cycle in cycles for node in cycle)
    states = dict((ident, kustomization_state(obj, (sources or {}).get(source_key(obj)), sources is not None))
                  for ident, obj in by_id.items())
    roots = {}

    def root_blockers(ident, seen=()):
        if ident in roots:
            return roots[ident]
        if ident in seen or ident in in_cycle:
            return {ident}
        state = states[ident]
        if state['ok']:
            roots[ident] = set()
            return roots[ident]
        waiting = [d for d in graph[ident] if d in by_id and not states[d]['ok']]
        if not waiting or any(d not in by_id for d in graph[ident]):
            roots[ident] = {ident}
            return roots[ident]
        found = set()
        for dep in waiting:
            found |= root_blockers(dep, seen + (ident,))
        roots[ident] = found or {ident}
        return roots[ident]

    ordered = [node for tier in tiers for node in tier] + sorted(in_cycle) + sorted(set(by_id) - set(tier_of) - in_cycle)
    items = []
    for ident in ordered:
        state = states[ident]
        obj = by_id[ident]
        ready = objects.condition(obj, 'Ready') or {}
        item = {'name': ident, 'ok': state['ok'], 'reason': state['reason'], 'stalled': state['stalled'],
                'ready': ready.get('status'), 'ready_reason': ready.get('reason'), 'message': ready.get('message'),
                'generation': state['generation'], 'observed_generation': state['observed_generation'],
                'depends_on': graph[ident], 'tier': tier_of.get(ident), 'missing_dependencies': [d for d in graph[ident] if d not in by_id],
                'blocked_by': [], 'waits_on': [], 'role': None, 'suspended': state['suspended'],
                'last_applied_revision': state['last_applied_revision'], 'source': state['source'],
                'source_revision': state['source_revision'], 'note': state.get('note')}
        if not state['ok']:
            blockers = sorted(root_blockers(ident))
            item['waits_on'] = [d for d in graph[ident] if d in by_id and not states[d]['ok']]
            if ident in in_cycle:
                item['role'] = 'blocker'
                cycle = next(c for c in cycles if ident in c)
                item['reason'] = 'dependency cycle: %s' % ' -> '.join(cycle)
            elif blockers == [ident]:
                item['role'] = 'blocker'
                if item['missing_dependencies']:
                    item['reason'] = 'depends on %s, which does not exist (%s)' % (', '.join(item['missing_dependencies']), state['reason'])
            else:
                item['role'] = 'blocked'
                item['blocked_by'] = [b for b in blockers if b != ident]
        items.append(item)
    problems = []
    for name in expected or []:
        wanted = name if '/' in name else None
        if not any(i['name'] == name or (wanted is None and i['name'].split('/', 1)[1] == name) for i in items):
            problems.append('Kustomization %s not found (not applied yet?)' % name)
    if not items and not problems:
        problems.append('no Kustomizations found')
    failing = [i for i in items if not i['ok']]
    texts = []
    for item in failing:
        if item['role'] == 'blocker':
            blocked = [i['name'] for i in failing if item['name'] in i['blocked_by']]
            text = '%s %s' % (item['name'], item['reason'])
            if blocked:
                text += ' (blocks %s)' % ', '.join(blocked)
            texts.append(text)
    waiting = [i['name'] for i in failing if i['role'] == 'blocked']
    if waiting:
        texts.append('waiting behind them: %s' % ', '.join(waiting))
    good = len(items) - len(failing)
    summary = '%s %d/%d' % ('Kustomizations Ready', good, len(items))
    if problems or texts:
        summary += ': ' + '; '.join(problems + texts)
    failed = bool(cycles) or any(i['stalled'] or i['suspended'] for i in items)
    verdict = predicates.Verdict(not failing and not problems, summary, items, problems, failed=failed)
    return verdict


def blockers(verdict):
    """[{name, reason, blocks}] of a Verdict from assess()."""
    out = []
    for item in verdict.failing():
        if item.get('role') == 'blocker':
            out.append({'name': item['name'], 'reason': item['reason'], 'message': item.get('message'),
                        'blocks': [i['name'] for i in verdict.failing() if item['name'] in i.get('blocked_by', [])]})
    return out


def health_targets(obj):
    """(apiVersion, kind, namespace, name) a Kustomization health-checks: spec.healthChecks, or its inventory with wait: true."""
    spec = objects.spec(obj)
    namespace = objects.metadata(obj).get('namespace') or ''
    targets = []
    if spec.get('wait'):
        for entry in (objects.status(obj).get('inventory') or {}).get('entries') or []:
            parts = (entry.get('id') or '').split('_', 3)
            if len(parts) == 4:
                obj_ns, name, group, kind = parts
                targets.append(('%s/%s' % (group, entry.get('v')) if group else entry.get('v'), kind, obj_ns, name))
    else:
        for ref in spec.get('healthChecks') or []:
            if isinstance(ref, dict):
                targets.append((ref.get('apiVersion') or '', ref.get('kind') or '', ref.get('namespace') or namespace, ref.get('name') or ''))
    return targets[:MAX_HEALTH_TARGETS]


class TreeGate(gates.Gate):
    """Every Kustomization (in a namespace, or all) Ready, in dependsOn order, blockers named."""

    kind = 'flux'

    def __init__(self, params):
        super().__init__(params)
        self.namespace = params.get('namespace')
        self.expected = params.get('names') or []
        self.label_selector = ','.join(params.get('label_selectors') or []) or None
        self.by_id = {}

    def target(self):
        return 'Flux Kustomizations in %s' % ('namespace %s' % self.namespace if self.namespace else 'all namespaces')

    def observe(self, client):
        try:
            items = client.list(KUSTOMIZATION_API, 'Kustomization', namespace=self.namespace, label_selector=self.label_selector)
        except k8s_client.NotServed as exc:
            text = '%s (Flux not installed?)' % exc
            return predicates.Verdict(False, text, problems=[text])
        self.by_id = dict((ks_id(k), k) for k in items)
        return assess(items, self.expected, self.read_sources(client, items))

    def read_sources(self, client, items):
        """{(kind, namespace, name): object} of the sources the Kustomizations name (one list per kind and namespace)."""
        found = {}
        wanted = set(source_key(obj) for obj in items)
        for kind, namespace in sorted(set((k, ns) for k, ns, _name in wanted)):
            api = SOURCE_APIS.get(kind)
            if api is None:
                continue
            try:
                listed = client.list(api, kind, namespace=namespace)
            except k8s_client.NotServed:
                continue
            for source in listed:
                meta = objects.metadata(source)
                found[(kind, meta.get('namespace') or '', meta.get('name'))] = source
        return found

    def diagnose(self, client, verdict):
        lines = list(verdict.problems)
        for blocker in blockers(verdict):
            text = '%s: %s' % (blocker['name'], blocker['reason'])
            if blocker['blocks']:
                text += '; blocks %s' % ', '.join(blocker['blocks'])
            lines.append(text)
            obj = self.by_id.get(blocker['name'])
            if obj is not None:
                lines.extend('  ' + line for line in self._explain(client, obj))
        for item in verdict.failing():
            if item.get('role') == 'blocked':
                lines.append('%s waits on %s (%s)' % (item['name'], ', '.join(item['waits_on']) or ', '.join(item['blocked_by']),
                                                      item['reason']))
        return lines

    def _explain(self, client, obj):
        """What a blocker's source or health-checked workloads say (best effort, a few reads)."""
        lines = []
        ref = objects.spec(obj).get('sourceRef') or {}
        api = SOURCE_APIS.get(ref.get('kind'))
        if api:
            try:
                source = client.get(api, ref.get('kind'), ref.get('name'), ref.get('namespace') or objects.metadata(obj).get('namespace'))
            except (_errors.ProxtalosError, k8s_client.NotServed) as exc:
                source, text = None, 'source %s/%s: cannot read (%s)' % (ref.get('kind'), ref.get('name'), exc)
                lines.append(text)
            if source is not None and not objects.condition_is(source, 'Ready'):
                ready = objects.condition(source, 'Ready') or {}
                lines.append('source %s %s: Ready=%s %s'
                             % (ref.get('kind'), objects.qualified_name(source), ready.get('status', 'Unknown'), objects.condition_text(ready)))
        health_failed = (objects.condition(obj, 'Ready') or {}).get('reason') == 'HealthCheckFailed'
        if not objects.condition_is(obj, 'Ready') and (objects.condition(obj, 'Healthy') is not None or health_failed):
            for api_version, kind, namespace, name in health_targets(obj):
                if kind not in WORKLOAD_KINDS or api_version != 'apps/v1':
                    continue
                workload = gates.WorkloadGate({'kind': kind, 'api_version': api_version, 'name': name, 'namespace': namespace})
                try:
                    found = workload.observe(client)
                    if not found.ok:
                        lines.append('%s: %s' % (workload.target(), found.summary))
                        lines.extend('  %s' % line for line in workload.diagnose(client, found)[:8])
                except _errors.ProxtalosError as exc:
                    lines.append('%s: cannot read (%s)' % (workload.target(), diagnosis.clip(str(exc), 200)))
        return lines
