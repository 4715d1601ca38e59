# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gate kinds of k8s_gate: what each reads, how it judges, how it explains. PRIVATE.

A gate is built from module parameters (bad combinations raise ValidationError naming the
option). observe(client) reads the objects it needs (a few GETs) and returns a Verdict from the
pure predicates; diagnose(client, verdict) reads a little more (pods on a NotReady node, the
verbose /readyz) and returns lines for the failure message. run() is the wait: it hands
observe() to _wait.wait_for with the transient API errors as "not yet".
"""

from __future__ import annotations

import time

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import diagnosis
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import objects
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import predicates

# The taint a node carries while it is not Ready; a pod without its toleration waits for a Ready node.
NOT_READY_TAINT = 'node.kubernetes.io/not-ready'
# How many NotReady nodes a pod that waits for a Ready node lists in full (the rest by name).
MAX_NODE_LINES = 8
GATE_KINDS = ('nodes', 'workload', 'pods', 'crds', 'condition', 'api')
WORKLOAD_KINDS = ('DaemonSet', 'Deployment', 'StatefulSet')
# A FluxInstance's spec.sync.kind -> the apiVersion of the source flux-operator writes for it (v0.59.0
# internal/builder/templates.go:413-425 syncTmpl: GitRepository always source.toolkit.fluxcd.io/v1; OCIRepository and
# Bucket the distribution's source API version, v1 from Flux 2.6.0 on: internal/builder/semver.go:174-192).
FLUX_SYNC_SOURCES = {'GitRepository': 'source.toolkit.fluxcd.io/v1', 'OCIRepository': 'source.toolkit.fluxcd.io/v1',
                     'Bucket': 'source.toolkit.fluxcd.io/v1'}

# Options each gate reads; any other gate-specific option set to a non-default value is an
# error, so a misplaced option is reported instead of silently ignored.
GATE_OPTIONS = {
    'nodes': ('names', 'label_selectors', 'expected_count', 'node_state'),
    'workload': ('kind', 'api_version', 'name', 'namespace', 'accept_unschedulable_replicas', 'csi_driver'),
    'pods': ('namespace', 'label_selectors', 'expected_count', 'every_node', 'node_label_selectors'),
    'crds': ('names', 'label_selectors'),
    'condition': ('kind', 'api_version', 'name', 'namespace', 'label_selectors', 'condition_type', 'condition_status'),
    'api': (),
}
OPTION_DEFAULTS = {
    'kind': None, 'api_version': None, 'name': None, 'namespace': None, 'names': None,
    'label_selectors': [], 'node_label_selectors': [], 'expected_count': None, 'node_state': 'ready',
    'every_node': False, 'accept_unschedulable_replicas': False, 'condition_type': 'Ready',
    'condition_status': 'True', 'csi_driver': None,
}
# The argument spec of the gate options: k8s_gate's own options for its one gate, and the options of each
# item of its `gates` list (with `title`, `gate` and `wait_timeout`, see step_spec()).
GATE_OPTION_SPEC = dict(
    kind=dict(type='str'),
    api_version=dict(type='str'),
    name=dict(type='str'),
    namespace=dict(type='str'),
    names=dict(type='list', elements='str'),
    label_selectors=dict(type='list', elements='str', default=[]),
    node_label_selectors=dict(type='list', elements='str', default=[]),
    expected_count=dict(type='int'),
    node_state=dict(type='str', default='ready', choices=['ready', 'registered']),
    every_node=dict(type='bool', default=False),
    accept_unschedulable_replicas=dict(type='bool', default=False),
    condition_type=dict(type='str', default='Ready'),
    condition_status=dict(type='str', default='True', choices=['True', 'False', 'Unknown']),
    csi_driver=dict(type='str'),
)
GATE_REQUIRED_IF = [
    ('gate', 'workload', ('kind', 'name', 'namespace')),
    ('gate', 'condition', ('api_version', 'kind')),
]


def _selector(values):
    return ','.join(v.strip() for v in values or [] if v and v.strip()) or None


class Gate(object):
    """Base: subclasses set `kind` and implement observe(); diagnose() has a generic form."""

    kind = None

    def __init__(self, params):
        self.params = params

    def target(self):
        return self.kind

    def observe(self, client):
        raise NotImplementedError

    def diagnose(self, client, verdict):
        return _failing_lines(client, verdict.failing())


def _failing_lines(client, items, unplaced=None):
    """'name on node: reason' for each failing item. A pod's node that is not Ready adds its reason, so that a pod
    waiting for its node (its Cilium agent, its kubelet) names the node and why. A pod the scheduler cannot place
    because nodes are not Ready (their not-ready taint: Flux's controllers before any node has its network) is followed
    by each node that is not Ready, its reason and the pods not Ready there (the Cilium agent, its state), as the nodes
    gate says them. Nodes are read only when a failing item has a node or waits for one."""
    on_nodes = set(item['node'] for item in items if item.get('node'))
    waits_for_ready_node = any(NOT_READY_TAINT in (item.get('unschedulable') or '') for item in items)
    not_ready = {}
    if on_nodes or waits_for_ready_node:
        for node in client.list('v1', 'Node'):
            reason = diagnosis.node_reason(node)
            if reason:
                not_ready[objects.name(node)] = (node, reason)
    lines = []
    for item in items:
        node = item.get('node') or unplaced
        text = '%s%s: %s' % (item['name'], ' on %s' % node if node else '', item.get('reason'))
        if node in not_ready and item.get('node'):
            text += ' (node not Ready: %s)' % not_ready[node][1]
        lines.append(text)
    if waits_for_ready_node:
        names = sorted(not_ready)
        lines.extend('node %s' % _node_line(client, name, *not_ready[name]) for name in names[:MAX_NODE_LINES])
        if len(names) > MAX_NODE_LINES:
            lines.append('%d more nodes not Ready: %s' % (len(names) - MAX_NODE_LINES, diagnosis.limit_list(names[MAX_NODE_LINES:], 20)))
    return lines


def _node_line(client, name, node, reason):
    """'NAME: Ready status, pressures, cordon; pods not Ready there: ...' for a node that is not Ready."""
    text = '%s: %s' % (name, diagnosis.node_detail(node))
    pods = client.list('v1', 'Pod', field_selector='spec.nodeName=%s' % name)
    bad = [diagnosis.pod_line(pod) for pod in pods if diagnosis.pod_reason(pod)
           and objects.status(pod).get('phase') not in predicates.TERMINAL_PHASES]
    if bad:
        text += '; pods not Ready there: %s' % diagnosis.limit_list(bad, 8)
    elif reason == 'NetworkPluginNotReady':
        text += '; no pod on it reports a problem: is a CNI agent (Cilium) scheduled on this node?'
    return text


class NodesGate(Gate):
    kind = 'nodes'

    def __init__(self, params):
        super().__init__(params)
        self.label_selector = _selector(params.get('label_selectors'))
        self.names = params.get('names') or []
        self.expected_count = params.get('expected_count')
        self.registered_only = params.get('node_state') == 'registered'

    def target(self):
        return 'nodes%s' % (' (%s)' % self.label_selector if self.label_selector else '')

    def observe(self, client):
        nodes = client.list('v1', 'Node', label_selector=self.label_selector)
        return predicates.nodes_ready(nodes, self.expected_count, self.names, self.registered_only)

    def diagnose(self, client, verdict):
        lines = list(verdict.problems)
        nodes = dict((objects.name(n), n) for n in client.list('v1', 'Node', label_selector=self.label_selector))
        for item in verdict.failing():
            node = nodes.get(item['name'])
            if node is None:
                lines.append('%s: not registered (no Node object; is kubelet running on it?)' % item['name'])
                continue
            lines.append(_node_line(client, item['name'], node, item.get('reason')))
        return lines


class WorkloadGate(Gate):
    kind = 'workload'

    def __init__(self, params):
        super().__init__(params)
        self.workload_kind = params.get('kind')
        if self.workload_kind not in WORKLOAD_KINDS:
            raise _errors.ValidationError('kind', 'gate=workload takes one of %s, got %r' % (', '.join(WORKLOAD_KINDS), self.workload_kind))
        self.api_version = params.get('api_version') or 'apps/v1'
        self.name = params['name']
        self.namespace = params['namespace']
        self.accept_unschedulable = bool(params.get('accept_unschedulable_replicas'))
        if self.accept_unschedulable and self.workload_kind == 'DaemonSet':
            raise _errors.ValidationError('accept_unschedulable_replicas', 'applies to Deployment and StatefulSet, not DaemonSet')
        self.csi_driver = params.get('csi_driver') or None
        if self.csi_driver and self.workload_kind != 'DaemonSet':
            raise _errors.ValidationError('csi_driver', 'applies to the DaemonSet of a CSI node plugin, not to a %s' % self.workload_kind)

    def target(self):
        return '%s %s/%s' % (self.workload_kind, self.namespace, self.name)

    def _read(self, client):
        workload = client.get(self.api_version, self.workload_kind, self.name, self.namespace)
        nodes = pods = None
        if workload is not None:
            if self.workload_kind == 'DaemonSet' or self.accept_unschedulable:
                nodes = client.list('v1', 'Node')
            selector = objects.spec(workload).get('selector')
            pods = client.list('v1', 'Pod', namespace=self.namespace, label_selector=objects.match_labels_query(selector) or None)
        return workload, nodes, pods

    def observe(self, client):
        workload, nodes, pods = self._read(client)
        what = '%s/%s' % (self.namespace, self.name)
        if self.workload_kind == 'DaemonSet':
            csi_nodes = None
            if self.csi_driver and workload is not None:
                csi_nodes = dict((objects.name(c), c) for c in client.list('storage.k8s.io/v1', 'CSINode'))
            return predicates.daemonset_ready(workload, nodes or [], pods or [], what=what, csi_driver=self.csi_driver, csi_nodes=csi_nodes)
        if self.workload_kind == 'Deployment':
            return predicates.deployment_available(workload, nodes, pods or [], self.accept_unschedulable, what=what)
        return predicates.statefulset_available(workload, nodes, pods or [], self.accept_unschedulable, what=what)

    def diagnose(self, client, verdict):
        lines = list(verdict.problems)
        lines.extend(creation_failures(client, self.workload_kind, self.namespace, self.name))
        if self.workload_kind == 'DaemonSet':
            for item in verdict.failing():
                text = '%s: %s%s' % (item['name'], '%s ' % item['pod'] if item.get('pod') else '', item.get('reason'))
                if item.get('node_reason'):
                    text += ' (node not Ready: %s)' % item['node_reason']
                lines.append(text)
        else:
            lines.extend(_failing_lines(client, verdict.failing(), unplaced='(no node)'))
        lines.extend(verdict.notes)
        return lines


# How many FailedCreate events a diagnosis quotes (the newest; their count says how often each repeated).
MAX_EVENT_LINES = 3


def creation_failures(client, kind, namespace, name):
    """'FailedCreate (N times, last at T): <message>' of the Warning events on a DaemonSet or StatefulSet, newest first.

    A pod the API refuses (PodSecurity admission, a webhook, a quota) never exists, so no pod can say why; the
    controller records the refusal on its workload: the DaemonSet controller through RealPodControl.CreatePods
    (kubernetes v1.36.3 pkg/controller/controller_utils.go:600, reason FailedCreate, "Error creating: <error>"), the
    StatefulSet controller in recordPodEvent (pkg/controller/statefulset/stateful_pod_control.go:339-344, reason
    FailedCreate). A Deployment says it in its ReplicaFailure condition (predicates.replica_failure), which is
    already in the verdict. Best effort: events that cannot be read are left out.
    """
    if kind not in ('DaemonSet', 'StatefulSet'):
        return []
    try:
        events = client.list('v1', 'Event', namespace=namespace,
                             field_selector='involvedObject.kind=%s,involvedObject.name=%s' % (kind, name))
    except (_errors.ProxtalosError, k8s_client.NotServed):
        return []
    found = []
    for event in events:
        involved = event.get('involvedObject') or {}
        if involved.get('kind') != kind or involved.get('name') != name:
            continue
        if event.get('type') != 'Warning' or event.get('reason') != 'FailedCreate':
            continue
        when = (event.get('lastTimestamp') or event.get('eventTime') or (event.get('series') or {}).get('lastObservedTime')
                or objects.metadata(event).get('creationTimestamp') or '')
        found.append((when, event))
    lines = []
    for when, event in sorted(found, key=lambda pair: pair[0], reverse=True)[:MAX_EVENT_LINES]:
        count = event.get('count') or (event.get('series') or {}).get('count') or 1
        last = ', last at %s' % when if when else ''
        times = '%d time%s%s' % (count, '' if count == 1 else 's', last)
        lines.append('event FailedCreate (%s): %s' % (times, diagnosis.clip(event.get('message'))))
    return lines


class PodsGate(Gate):
    kind = 'pods'

    def __init__(self, params):
        super().__init__(params)
        self.namespace = params.get('namespace')
        self.label_selector = _selector(params.get('label_selectors'))
        self.node_selector = _selector(params.get('node_label_selectors'))
        self.every_node = bool(params.get('every_node'))
        self.min_count = params.get('expected_count')
        if self.min_count is None:
            self.min_count = 1
        if self.node_selector and not self.every_node:
            raise _errors.ValidationError('node_label_selectors', 'only used with every_node=true')

    def target(self):
        where = 'namespace %s' % self.namespace if self.namespace else 'all namespaces'
        return 'pods %s in %s' % (self.label_selector or '(all)', where)

    def observe(self, client):
        pods = client.list('v1', 'Pod', namespace=self.namespace, label_selector=self.label_selector)
        nodes = client.list('v1', 'Node', label_selector=self.node_selector) if self.every_node else None
        return predicates.pods_ready(pods, nodes, self.every_node, self.min_count,
                                     what='pods %s' % self.label_selector if self.label_selector else 'pods')


class CrdsGate(Gate):
    kind = 'crds'

    def __init__(self, params):
        super().__init__(params)
        self.names = params.get('names') or []
        self.label_selector = _selector(params.get('label_selectors'))
        if not self.names and not self.label_selector:
            raise _errors.ValidationError('names', 'gate=crds needs names or label_selectors')

    def target(self):
        return 'CRDs %s' % (', '.join(self.names) if self.names else self.label_selector)

    def observe(self, client):
        crds = client.list('apiextensions.k8s.io/v1', 'CustomResourceDefinition', label_selector=self.label_selector)
        return predicates.crds_established(crds, self.names)


class ConditionGate(Gate):
    kind = 'condition'

    def __init__(self, params):
        super().__init__(params)
        self.api_version = params['api_version']
        self.resource_kind = params['kind']
        self.name = params.get('name')
        self.namespace = params.get('namespace')
        self.label_selector = _selector(params.get('label_selectors'))
        self.condition_type = params.get('condition_type') or 'Ready'
        self.wanted = params.get('condition_status') or 'True'
        if self.name and self.label_selector:
            raise _errors.ValidationError('label_selectors', 'select objects by name or by label_selectors, not both')

    def target(self):
        if self.name:
            return '%s %s' % (self.resource_kind, '%s/%s' % (self.namespace, self.name) if self.namespace else self.name)
        return '%s %s in %s' % (self.resource_kind, self.label_selector or '(all)',
                                'namespace %s' % self.namespace if self.namespace else 'all namespaces')

    def observe(self, client):
        what = self.resource_kind
        try:
            found = client.resource(self.api_version, self.resource_kind)
            if found is None:
                raise k8s_client.NotServed(self.api_version, self.resource_kind)
            if self.name:
                if found[1] and not self.namespace:
                    raise _errors.ValidationError('namespace', '%s is namespaced: give the namespace of %s' % (self.resource_kind, self.name))
                obj = client.get(self.api_version, self.resource_kind, self.name, self.namespace)
                if obj is None:
                    missing = '%s not found' % self.target()
                    return predicates.Verdict(False, missing, problems=[missing])
                obj.setdefault('kind', self.resource_kind)
                objs = [obj]
            else:
                objs = client.list(self.api_version, self.resource_kind, namespace=self.namespace, label_selector=self.label_selector)
        except k8s_client.NotServed as exc:
            text = '%s (CRD not installed?)' % exc
            return predicates.Verdict(False, text, problems=[text])
        extra = None
        if self.resource_kind == 'HelmRelease' and self.api_version.startswith('helm.toolkit.fluxcd.io/') \
                and (self.condition_type, self.wanted) == ('Ready', 'True'):
            def extra(obj):
                return predicates.helmrelease_applied(obj, self._helmchart(client, obj))
        return predicates.conditions_met(objs, self.condition_type, self.wanted, what=what, extra_checks=extra)

    @staticmethod
    def _helmchart(client, helmrelease):
        """The HelmChart a HelmRelease's status names (helm-controller writes `namespace/name`), or None."""
        ref = objects.status(helmrelease).get('helmChart') or ''
        if objects.spec(helmrelease).get('chartRef') or '/' not in ref:
            return None
        namespace, name = ref.split('/', 1)
        try:
            chart = client.get('source.toolkit.fluxcd.io/v1', 'HelmChart', name, namespace)
        except k8s_client.NotServed:
            return None
        return chart if chart is not None else {'metadata': {'name': name, 'namespace': namespace}, 'status': {}}

    def diagnose(self, client, verdict):
        lines = list(verdict.problems)
        for item in verdict.failing():
            text = '%s: %s' % (item['name'], item.get('reason'))
            if item.get('generation') is not None:
                text += ' (generation %s, observedGeneration %s)' % (item.get('generation'), item.get('observed_generation'))
            lines.append(text)
            if self.resource_kind == 'FluxInstance' and self.api_version.startswith('fluxcd.controlplane.io/'):
                lines.extend(self._flux_instance_sync(client, item['name']))
        return lines

    def _flux_instance_sync(self, client, qualified_name):
        """Why a FluxInstance's sync objects are not Ready, one line each. flux-operator applies the sync source and
        Kustomization with Flux's components and marks the FluxInstance Ready only once all it applied are Ready
        (v0.59.0 internal/controller/fluxinstance_controller.go:570-581, for up to 5 minutes:
        api/v1/fluxinstance_types.go:494-507); meanwhile the FluxInstance's own Ready says only that the
        reconciliation is in progress, and its observedGeneration stays unset. The sync objects are named after
        spec.sync.name, else the FluxInstance's namespace (fluxinstance_controller.go:394-398)."""
        namespace, dummy, name = qualified_name.rpartition('/')
        try:
            instance = client.get(self.api_version, self.resource_kind, name, namespace or None)
        except k8s_client.NotServed:
            return []
        sync = objects.spec(instance or {}).get('sync') or {}
        if not sync.get('kind'):
            return []
        sync_name = sync.get('name') or namespace
        lines = []
        for api_version, kind in ((FLUX_SYNC_SOURCES.get(sync['kind']), sync['kind']),
                                  ('kustomize.toolkit.fluxcd.io/v1', 'Kustomization')):
            label = 'sync %s %s/%s' % (kind, namespace, sync_name)
            if api_version is None:
                continue
            try:
                obj = client.get(api_version, kind, sync_name, namespace)
            except k8s_client.NotServed:
                lines.append('%s: its kind is not served (Flux CRDs not installed yet)' % label)
                continue
            if obj is None:
                lines.append('%s: not created yet' % label)
                continue
            obj.setdefault('kind', kind)
            met = predicates.condition_met(obj)
            if not met['ok']:
                lines.append('%s: %s' % (label, met['reason']))
        return lines


class ApiGate(Gate):
    kind = 'api'

    def target(self):
        return 'API /readyz'

    def observe(self, client):
        status, body = client.readyz()
        return predicates.api_ready(status, body)

    def diagnose(self, client, verdict):
        status, body = client.readyz(verbose=True)
        checks = [line.strip() for line in body.splitlines() if line.strip().startswith('[-]')]
        if checks:
            return ['/readyz?verbose answered %s; failing: %s' % (status, ', '.join(checks))]
        return [verdict.summary]


GATES = {'nodes': NodesGate, 'workload': WorkloadGate, 'pods': PodsGate, 'crds': CrdsGate,
         'condition': ConditionGate, 'api': ApiGate}


def build_gate(params):
    """The Gate for params['gate']; options that do not apply to it raise ValidationError."""
    kind = params.get('gate')
    if kind not in GATES:
        raise _errors.ValidationError('gate', 'must be one of %s, got %r' % (', '.join(GATE_KINDS), kind))
    allowed = GATE_OPTIONS[kind]
    for option, default in sorted(OPTION_DEFAULTS.items()):
        value = params.get(option, default)
        if option not in allowed and value not in (default, None, []):
            raise _errors.ValidationError(option, 'does not apply to gate=%s (it reads: %s)' % (kind, ', '.join(allowed) or 'no options'))
    if params.get('expected_count') is not None and params['expected_count'] < 0:
        raise _errors.ValidationError('expected_count', 'must be zero or more, got %s' % params['expected_count'])
    return GATES[kind](params)


class GateRun(object):
    """The outcome of run(): the wait result, the last Verdict seen, and the failure text."""

    def __init__(self, gate, result, verdict):
        self.gate = gate
        self.result = result
        self.verdict = verdict

    @property
    def passed(self):
        return bool(self.result.ok and self.verdict is not None and self.verdict.ok)

    def headline(self):
        """The last observation in one line: the verdict, or the API error of the last probe."""
        if isinstance(self.result.observation, predicates.Verdict):
            return self.result.observation.summary
        text = str(self.result.observation)
        if self.verdict is not None:
            text += ' (last answer: %s)' % self.verdict.summary
        return text


def run(gate, client, timeout, interval, clock=time.monotonic, sleep=None, progress=_wait.FROM_ENVIRONMENT):
    """Probe the gate until it passes, fails for good (e.g. Stalled) or the timeout passes.

    Between probes it sleeps with client.sleep_until_change when the client has it (a watch on
    what the probe read wakes it as soon as something changes), else with time.sleep. progress is
    _wait.wait_for's progress recorder (default: one for the PROXTALOS_PROGRESS_FILE file, if set).
    The caller of an announced recorder ends it (finish) with the gate's verdict.
    """
    seen = {}
    client.deadline = _wait.Deadline(timeout, clock)
    if sleep is None:
        sleep = getattr(client, 'sleep_until_change', time.sleep)

    def probe():
        if hasattr(client, 'forget_reads'):
            client.forget_reads()
        verdict = gate.observe(client)
        seen['verdict'] = verdict
        return verdict.ok or verdict.failed, verdict

    result = _wait.wait_for(probe, timeout, interval=interval, transient=(_errors.TransientApiError,),
                            clock=clock, sleep=sleep, progress=progress)
    return GateRun(gate, result, seen.get('verdict'))


def explain(run_outcome, client):
    """Failure text: the headline, then the gate's diagnosis lines (best effort)."""
    gate = run_outcome.gate
    result = run_outcome.result
    verdict = run_outcome.verdict
    if verdict is not None and verdict.failed:
        intro = '%s failed (will not recover without a change) after %.1fs' % (gate.target(), result.elapsed)
    else:
        intro = '%s not reached after %.1fs (%d probes)' % (gate.target(), result.elapsed, result.attempts)
    lines = ['%s: %s' % (intro, run_outcome.headline())]
    if verdict is not None:
        client.deadline = None
        try:
            detail = gate.diagnose(client, verdict)
        except _errors.ProxtalosError as exc:
            detail = ['(could not read more detail: %s)' % exc]
        lines.extend('- %s' % line for line in detail if line)
    return '\n'.join(lines)
