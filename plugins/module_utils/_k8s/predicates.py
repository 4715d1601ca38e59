# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Gate predicates: pure functions over plain dicts that say whether a state is reached. PRIVATE.

Every predicate returns a Verdict: `ok`, a one-line `summary` (the progress line, naming what
is missing and why), per-item `items` (one dict per node, pod or object, each with `name`, `ok`
and `reason`), `problems` (object-level findings such as a generation lag) and `failed` (the
state cannot come right without a change, e.g. a Flux object that is Stalled). Nothing here
calls an API; the gates (gates.py) fetch the objects and hand them in.
"""

from __future__ import annotations

from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import diagnosis
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import objects
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import scheduling

TERMINAL_PHASES = ('Succeeded', 'Failed')


class Verdict(object):
    """What a predicate concluded from what it was shown."""

    __slots__ = ('ok', 'summary', 'items', 'problems', 'notes', 'failed', 'replicas')

    def __init__(self, ok, summary, items=None, problems=None, notes=None, failed=False, replicas=None):
        self.ok = bool(ok)
        self.summary = summary
        self.items = items or []
        self.problems = problems or []
        self.notes = notes or []
        self.failed = bool(failed)
        # replica workloads only: desired, available, updated, required and (when counted) schedulable
        self.replicas = replicas

    def failing(self):
        return [item for item in self.items if not item.get('ok')]

    def as_dict(self):
        return {'ok': self.ok, 'summary': self.summary, 'items': self.items,
                'problems': self.problems, 'notes': self.notes, 'failed': self.failed, 'replicas': self.replicas}

    def __repr__(self):
        return 'Verdict(ok=%r, summary=%r)' % (self.ok, self.summary)


def _headline(title, good, total, failing_texts, problems=()):
    text = '%s %d/%d' % (title, good, total)
    details = list(problems) + list(failing_texts)
    if details:
        text += ': ' + diagnosis.limit_list(details)
    return text


def node_roles(node):
    prefix = 'node-role.kubernetes.io/'
    return sorted(key[len(prefix):] for key in objects.labels(node) if key.startswith(prefix))


# --- nodes -------------------------------------------------------------------------------------

def node_ready(node):
    """(ready, reason): reason is None when the node is Ready."""
    reason = diagnosis.node_reason(node)
    return reason is None, reason


NODE_INFO_FIELDS = (
    ('kubelet_version', 'kubeletVersion'), ('os_image', 'osImage'),
    ('kernel_version', 'kernelVersion'), ('container_runtime', 'containerRuntimeVersion'),
)


def node_versions(node):
    """What the kubelet reports of its node in status.nodeInfo (kubelet, OS image, kernel, runtime), as set."""
    info = objects.status(node).get('nodeInfo') or {}
    return dict((key, info[field]) for key, field in NODE_INFO_FIELDS if info.get(field))


def nodes_ready(nodes, expected_count=None, names=None, registered_only=False):
    """All nodes (or the named ones) registered and, unless registered_only, Ready.

    expected_count: exactly this many nodes must be registered (extra nodes are named).
    names: these node names must be registered.
    With neither, at least one node must be registered.
    """
    names = list(names or [])
    by_name = dict((objects.name(node), node) for node in nodes)
    items = []
    for node_name in sorted(by_name):
        node = by_name[node_name]
        ready, reason = node_ready(node)
        item = {'name': node_name, 'ok': True if registered_only else ready, 'ready': ready,
                'reason': reason, 'roles': node_roles(node), 'conditions_true': diagnosis.node_pressures(node)}
        item.update(node_versions(node))
        items.append(item)
    for missing in names:
        if missing not in by_name:
            items.append({'name': missing, 'ok': False, 'ready': False, 'reason': 'not registered',
                          'roles': [], 'conditions_true': []})
    problems = []
    if expected_count is not None and len(by_name) != expected_count:
        if len(by_name) < expected_count:
            problems.append('%d of %d expected nodes registered' % (len(by_name), expected_count))
        else:
            extra = sorted(set(by_name) - set(names)) if names else []
            problems.append('%d nodes registered, expected %d%s' % (
                len(by_name), expected_count, ' (not in names: %s)' % ', '.join(extra) if extra else ''))
    if not by_name and expected_count is None and not names:
        problems.append('no node registered yet')
    total = max(expected_count or 0, len(items))
    good = len([item for item in items if item['ok']])
    failing = ['%s %s' % (item['name'], item['reason']) for item in items if not item['ok']]
    ok = not problems and not failing
    title = 'nodes registered' if registered_only else 'nodes Ready'
    return Verdict(ok, _headline(title, good, total, failing, problems), items, problems)


# --- workloads --------------------------------------------------------------------------------

def owned_pods(owner, pods, direct=True):
    """Pods that belong to a workload.

    DaemonSets and StatefulSets own their pods directly: when pods carry ownerReferences, the
    owner's uid decides (a pod of an older object of the same name does not count). A
    Deployment's pods are owned by its ReplicaSets (direct=False): its selector decides.
    """
    uid = objects.metadata(owner).get('uid')
    selector = objects.spec(owner).get('selector')
    result = []
    for pod in pods:
        owners = objects.owner_uids(pod)
        if direct and uid and owners:
            if uid in owners:
                result.append(pod)
        elif objects.selector_matches(selector, objects.labels(pod)):
            result.append(pod)
    return result


def _not_found(kind, what):
    return Verdict(False, '%s %s not found' % (kind, what), problems=['%s %s not found' % (kind, what)])


def csi_drivers(csi_node):
    """The driver names a CSINode lists (spec.drivers[].name; k8s.io/api v0.36.3 storage/v1 CSINodeSpec)."""
    return [d.get('name') for d in objects.spec(csi_node).get('drivers') or [] if isinstance(d, dict)]


def daemonset_ready(daemonset, nodes, pods, what=None, csi_driver=None, csi_nodes=None):
    """A Ready pod of the DaemonSet on every eligible node, and the rollout complete.

    Eligible nodes are those the DaemonSet controller would place a pod on (nodeSelector,
    required node affinity, taints against the pod's tolerations plus the ones the controller
    adds). Nodes without a Ready pod are named with the pod's reason. No eligible node at all
    is not a pass: a gate must see the thing it vouches for.

    csi_driver (a CSI node plugin's DaemonSet): each eligible node's CSINode (csi_nodes, by node
    name) must also list the driver. The kubelet adds it only after the plugin registered and
    answered NodeGetInfo (kubernetes v1.36.3 pkg/volume/csi/csi_plugin.go:118-157,
    RegisterPlugin -> nodeinfomanager.InstallCSIDriver); a Ready pod alone does not say that
    (the Proxmox CSI node pod has no readiness probe, and its NodeGetInfo fails on a node without
    topology labels), and without it the node cannot attach the driver's volumes.
    """
    if daemonset is None:
        return _not_found('DaemonSet', what or '?')
    label = 'DaemonSet %s' % objects.qualified_name(daemonset)
    template_spec = objects.spec(objects.spec(daemonset).get('template'))
    eligible, excluded = scheduling.eligible_nodes(template_spec, nodes, daemonset=True)
    by_node = {}
    for pod in owned_pods(daemonset, pods):
        by_node.setdefault(objects.pod_node(pod) or '', []).append(pod)
    items = []
    for node in sorted(eligible, key=objects.name):
        node_name = objects.name(node)
        here = by_node.get(node_name, [])
        ready = [pod for pod in here if objects.pod_ready(pod)]
        item = {'name': node_name, 'ok': bool(ready), 'node_ready': objects.node_is_ready(node),
                'node_reason': diagnosis.node_reason(node),
                'pod': objects.name(ready[0]) if ready else None, 'reason': None}
        if not ready:
            live = [pod for pod in here if not objects.is_terminating(pod)] or here
            if live:
                item['pod'] = objects.name(live[0])
                item['reason'] = diagnosis.pod_reason(live[0])
            else:
                item['reason'] = 'no pod scheduled'
        elif csi_driver:
            csi_node = (csi_nodes or {}).get(node_name)
            if csi_node is None:
                item.update(ok=False, reason='no CSINode %s yet (the kubelet has not registered any CSI driver)' % node_name)
            elif csi_driver not in csi_drivers(csi_node):
                item.update(ok=False, reason='pod %s Ready, but CSI driver %s is not registered in CSINode %s (drivers: %s)'
                            % (item['pod'], csi_driver, node_name, ', '.join(csi_drivers(csi_node)) or 'none'))
                item['pod'] = None
        items.append(item)
    unplaced = by_node.get('', [])
    problems = []
    lag = objects.generation_lag(daemonset)
    if lag:
        problems.append('rollout not started: %s' % lag)
    ds_status = objects.status(daemonset)
    desired = ds_status.get('desiredNumberScheduled') or 0
    updated = ds_status.get('updatedNumberScheduled') or 0
    on_delete = (objects.spec(daemonset).get('updateStrategy') or {}).get('type') == 'OnDelete'
    notes = []
    if on_delete:
        # The DaemonSet controller replaces nothing for OnDelete (kubernetes v1.36.3
        # pkg/controller/daemon/daemon_controller.go:976-980 calls rollingUpdate only for RollingUpdate), and kubectl
        # rollout status refuses it (rollout_status.go:104-106): old-template pods stay until someone deletes them.
        if updated < desired:
            notes.append('updateStrategy OnDelete: %d of %d pods run the current template; the others are replaced '
                         'only when deleted' % (updated, desired))
    elif updated < desired:
        problems.append('rolling out: %d of %d pods updated' % (updated, desired))
    # kubectl rollout status (k8s.io/kubectl v0.36.3 pkg/polymorphichelpers/rollout_status.go:107-114) and kstatus
    # (cli-utils pkg/kstatus/status/core.go:340-343): numberAvailable, which honours minReadySeconds
    if (ds_status.get('numberAvailable') or 0) < desired:
        problems.append('status numberAvailable %d < desiredNumberScheduled %d' % (ds_status.get('numberAvailable') or 0, desired))
    if not eligible:
        problems.append('no eligible node')
    notes.extend('not eligible: %s (%s)' % item for item in sorted(excluded.items()))
    if desired != len(eligible):
        notes.append('DaemonSet status desiredNumberScheduled=%d, gate counted %d eligible node(s)' % (desired, len(eligible)))
    if unplaced:
        notes.append('pods not bound to a node: %s' % ', '.join(diagnosis.pod_line(pod) for pod in unplaced))
    good = len([item for item in items if item['ok']])
    failing = ['%s %s%s' % (item['name'], '%s ' % item['pod'] if item['pod'] else '', item['reason'])
               for item in items if not item['ok']]
    ok = not failing and not problems
    summary = '%s Ready%s on %d/%d eligible nodes' % (label, ' and %s registered' % csi_driver if csi_driver else '', good, len(items))
    if failing or problems:
        summary += ': ' + diagnosis.limit_list(failing + problems)
    return Verdict(ok, summary, items, problems, notes)


def _pod_items(pods):
    """Each pod: name, namespace, node, ok, reason, and 'unschedulable' - the scheduler's whole message while it
    cannot place the pod (the reason is clipped), else None."""
    items = []
    for pod in sorted(pods, key=objects.name):
        reason = diagnosis.pod_reason(pod)
        scheduled = objects.condition(pod, 'PodScheduled')
        unschedulable = scheduled.get('message') if scheduled and scheduled.get('status') == 'False' else None
        items.append({'name': objects.name(pod), 'namespace': objects.metadata(pod).get('namespace'),
                      'node': objects.pod_node(pod), 'ok': reason is None, 'reason': reason,
                      'unschedulable': unschedulable})
    return items


def replica_failure(workload):
    """'ReplicaFailure <reason>: <message>' while a Deployment (or ReplicaSet) cannot create pods, else None.

    The ReplicaSet controller sets ReplicaFailure=True `FailedCreate` with the API's refusal as message (kubernetes
    v1.36.3 pkg/controller/replicaset/replica_set_utils.go:124-133) and the Deployment controller copies it to the
    Deployment (pkg/controller/deployment/progress.go:99-104): an admission refusal (PodSecurity, a webhook, a quota)
    is said there, where no pod exists to say anything.
    """
    cond = objects.condition(workload, 'ReplicaFailure')
    if cond is None or cond.get('status') != 'True':
        return None
    return 'ReplicaFailure %s' % diagnosis.clip(objects.condition_text(cond))


def _replica_workload(kind, workload, nodes, pods, accept_unschedulable, available, updated, extra_problems, failed=False):
    label = '%s %s' % (kind, objects.qualified_name(workload))
    replicas = objects.spec(workload).get('replicas')
    replicas = 1 if replicas is None else replicas
    required = replicas
    capacity = None
    notes = []
    problems = list(extra_problems)
    if accept_unschedulable and replicas > 0:
        if nodes is None:
            raise ValueError('nodes are needed to count schedulable replicas')
        capacity, text = scheduling.schedulable_replicas(objects.spec(workload).get('template'), replicas, nodes)
        notes.append(text)
        if capacity == 0:
            problems.append('no replica can be scheduled now: %s' % text)
        required = max(1, min(replicas, capacity))
    lag = objects.generation_lag(workload)
    if lag:
        problems.insert(0, 'rollout not started: %s' % lag)
    if updated < required:
        problems.append('%d of %d replicas updated' % (updated, required))
    items = _pod_items(owned_pods(workload, pods, direct=kind != 'Deployment'))
    failing_pods = ['%s %s' % (item['name'], item['reason']) for item in items if not item['ok']]
    ok = not problems and available >= required
    summary = '%s available %d/%d' % (label, available, replicas)
    if required != replicas:
        summary += ' (%d required: %s)' % (required, notes[-1])
    if not ok:
        details = problems + failing_pods
        if details:
            summary += ': ' + diagnosis.limit_list(details)
    counts = {'desired': replicas, 'available': available, 'updated': updated, 'required': required,
              'schedulable': capacity}
    return Verdict(ok, summary, items, problems, notes, replicas=counts, failed=failed and not ok)


def deployment_available(deployment, nodes=None, pods=(), accept_unschedulable=False, what=None):
    """Deployment rolled out and available.

    Without accept_unschedulable: every replica updated and available and no old replica left
    (kubectl rollout status). With it: as many replicas as can be scheduled now (at least one),
    counting nodes that pass nodeSelector, taints and the workload's own required anti-affinity.
    """
    if deployment is None:
        return _not_found('Deployment', what or '?')
    dep_status = objects.status(deployment)
    available = dep_status.get('availableReplicas') or 0
    updated = dep_status.get('updatedReplicas') or 0
    problems = []
    failed = False
    failure = replica_failure(deployment)
    if failure:
        problems.append(failure)
    progressing = objects.condition(deployment, 'Progressing')
    if progressing is not None and progressing.get('reason') == 'ProgressDeadlineExceeded' and not objects.generation_lag(deployment):
        # kubectl rollout status errors out (rollout_status.go:75-79, for the observed generation) and kstatus says
        # Failed (cli-utils core.go:184-190): the controller stops trying, waiting longer cannot help
        problems.append(objects.condition_text(progressing))
        failed = True
    total = dep_status.get('replicas') or 0
    if not accept_unschedulable and total > updated:
        problems.append('%d old replica(s) pending termination' % (total - updated))
    return _replica_workload('Deployment', deployment, nodes, pods, accept_unschedulable, available, updated, problems, failed)


def statefulset_available(statefulset, nodes=None, pods=(), accept_unschedulable=False, what=None):
    """StatefulSet rolled out (updateRevision reached) and its replicas available."""
    if statefulset is None:
        return _not_found('StatefulSet', what or '?')
    sts_status = objects.status(statefulset)
    ready = sts_status.get('readyReplicas') or 0
    available = sts_status.get('availableReplicas')
    available = ready if available is None else available
    updated = sts_status.get('updatedReplicas') or 0
    problems = []
    current, update = sts_status.get('currentRevision'), sts_status.get('updateRevision')
    if not accept_unschedulable and update and current and current != update:
        problems.append('rolling out: currentRevision %s, updateRevision %s' % (current, update))
    return _replica_workload('StatefulSet', statefulset, nodes, pods, accept_unschedulable, available, updated, problems)


# --- pods ---------------------------------------------------------------------------------------

def pods_ready(pods, nodes=None, every_node=False, min_count=1, what='pods'):
    """Every live pod Ready, at least min_count of them, and with every_node a Ready pod on each node.

    Pods in a terminal phase (Succeeded, Failed) and pods being deleted are not counted; they
    are listed in notes.
    """
    live, gone = [], []
    for pod in pods:
        counted = objects.status(pod).get('phase') not in TERMINAL_PHASES and not objects.is_terminating(pod)
        (live if counted else gone).append(pod)
    items = _pod_items(live)
    problems = []
    if len(live) < min_count:
        problems.append('%d pod(s) found, at least %d expected' % (len(live), min_count))
    node_items = []
    if every_node:
        ready_nodes = set(objects.pod_node(pod) for pod in live if objects.pod_ready(pod))
        for node in sorted(nodes or [], key=objects.name):
            node_name = objects.name(node)
            if node_name not in ready_nodes:
                here = [item for item in items if item['node'] == node_name]
                reason = '%s %s' % (here[0]['name'], here[0]['reason']) if here else 'no pod'
                node_items.append({'name': node_name, 'ok': False, 'reason': reason, 'kind': 'node'})
        if not nodes:
            problems.append('no node matched')
    notes = ['not counted: %s' % diagnosis.pod_line(pod) for pod in gone]
    failing = ['%s %s' % (item['name'], item['reason']) for item in items + node_items if not item['ok']]
    ok = not problems and not failing
    good = len([item for item in items if item['ok']])
    if every_node:
        covered = len(nodes or []) - len(node_items)
        summary = _headline('%s Ready %d/%d, on nodes' % (what, good, len(items)), covered, len(nodes or []), failing, problems)
    else:
        summary = _headline('%s Ready' % what, good, len(items), failing, problems)
    return Verdict(ok, summary, items + node_items, problems, notes)


# --- CRDs ----------------------------------------------------------------------------------------

def crd_established(crd):
    """(established, reason): Established=True and NamesAccepted not False."""
    established = objects.condition(crd, 'Established')
    names = objects.condition(crd, 'NamesAccepted')
    if names is not None and names.get('status') == 'False':
        return False, 'NamesAccepted=False %s' % objects.condition_text(names)
    if established is None:
        return False, 'no Established condition yet'
    if established.get('status') != 'True':
        return False, 'Established=%s %s' % (established.get('status'), objects.condition_text(established))
    return True, None


def crds_established(crds, names=None):
    """Each named CRD (or each CRD given, when no names) exists and is Established."""
    by_name = dict((objects.name(crd), crd) for crd in crds)
    wanted = list(names) if names else sorted(by_name)
    items = []
    for crd_name in wanted:
        crd = by_name.get(crd_name)
        if crd is None:
            items.append({'name': crd_name, 'ok': False, 'reason': 'not found'})
            continue
        ok, reason = crd_established(crd)
        items.append({'name': crd_name, 'ok': ok, 'reason': reason,
                      'stored_versions': objects.status(crd).get('storedVersions') or []})
    problems = [] if wanted else ['no CRD matched']
    failing = ['%s %s' % (item['name'], item['reason']) for item in items if not item['ok']]
    good = len(items) - len(failing)
    return Verdict(not failing and not problems, _headline('CRDs Established', good, len(items), failing, problems),
                   items, problems)


# --- conditions (Flux, kstatus) ---------------------------------------------------------------

# fluxcd/pkg apis/meta v1.12.0 annotations.go:23 (ReconcileRequestAnnotation): what `flux reconcile` sets; a Flux
# controller copies the value it handled to status.lastHandledReconcileAt (annotations.go:40-46).
REQUESTED_AT = 'reconcile.fluxcd.io/requestedAt'


def request_pending(obj):
    """Text when obj carries a reconcile request its controller has not handled yet, else None.

    Flux's controllers copy the annotation's value to status.lastHandledReconcileAt when they finish a reconcile
    (kustomize-controller v1.6.1 internal/controller/kustomization_controller.go:1186-1188, finalizeStatus;
    source-controller v1.6.2 internal/reconcile/summarize/processor.go:42-46, RecordReconcileReq).
    """
    requested = (objects.metadata(obj).get('annotations') or {}).get(REQUESTED_AT)
    if requested is None:
        return None
    handled = objects.status(obj).get('lastHandledReconcileAt')
    if handled == requested:
        return None
    return 'reconcile requested at %s not handled yet (lastHandledReconcileAt %s)' % (requested, handled or '-')


def condition_met(obj, condition_type='Ready', wanted='True'):
    """Is the condition at the wanted status for the object's current generation?

    The flux CLI's readiness test (cmd/flux/readiness.go) and kstatus: the condition must exist;
    its own observedGeneration, when set, else status.observedGeneration, must equal
    metadata.generation; a reconcile request (reconcile.fluxcd.io/requestedAt) not yet copied to
    status.lastHandledReconcileAt means not yet; Reconciling=True means still in progress; Stalled=True (for the current
    generation) means failed, which no amount of waiting fixes. spec.suspend true (the Flux API's
    switch: a suspended object is not reconciled and its status is left as it was, e.g.
    kustomize-controller v1.6.1 internal/controller/kustomization_controller.go:230-234) fails at
    once too, named `suspended`. Returns a dict item with `ok`, `reason`, `stalled`, `suspended`,
    `generation`, `observed_generation` and the conditions seen.
    """
    item = {'name': objects.qualified_name(obj), 'kind': obj.get('kind'), 'ok': False, 'reason': None,
            'stalled': False, 'suspended': False, 'generation': objects.generation(obj),
            'observed_generation': objects.observed_generation(obj),
            'conditions': dict((c.get('type'), c.get('status')) for c in objects.conditions(obj))}
    gen = objects.generation(obj)
    cond = objects.condition(obj, condition_type)
    if objects.is_terminating(obj):
        item['reason'] = 'being deleted'
        return item
    if objects.spec(obj).get('suspend') is True:
        item['suspended'] = True
        item['reason'] = 'suspended (spec.suspend: true): its controller does not reconcile it until it is resumed'
        return item
    lag = None
    if gen is not None:
        cond_gen = (cond or {}).get('observedGeneration')
        if cond_gen:
            if cond_gen != gen:
                lag = 'condition %s observedGeneration %s != generation %s' % (condition_type, cond_gen, gen)
        else:
            lag = objects.generation_lag(obj)
    stalled = objects.condition(obj, 'Stalled')
    if stalled is not None and stalled.get('status') == 'True' and not lag and condition_type != 'Stalled':
        item['stalled'] = True
        item['reason'] = 'Stalled %s' % objects.condition_text(stalled)
        return item
    if cond is None:
        item['reason'] = 'no %s condition yet (waiting to be reconciled)' % condition_type
        return item
    if lag:
        item['reason'] = 'not reconciled yet: %s' % lag
        return item
    if str(cond.get('status')) != wanted:
        item['reason'] = '%s=%s %s' % (condition_type, cond.get('status'), objects.condition_text(cond))
        item['reason'] = item['reason'].strip()
        return item
    pending = request_pending(obj)
    if pending:
        item['reason'] = pending
        return item
    reconciling = objects.condition(obj, 'Reconciling')
    if condition_type not in ('Reconciling', 'Stalled') and reconciling is not None and reconciling.get('status') == 'True':
        item['reason'] = 'Reconciling %s' % objects.condition_text(reconciling)
        return item
    item['ok'] = True
    item['message'] = objects.condition_text(cond)
    return item


def helmrelease_applied(helmrelease, chart):
    """None when a HelmRelease has released its chart's current version, else why not.

    helm-controller v1.3.0's own record of what it released is status.history, whose latest snapshot (the highest
    version, api/v2/snapshot_types.go:54-61) carries the release's status and chartVersion (:125-141); the chart it
    should release is the HelmChart it made (status.helmChart, `namespace/name`, api/v2/helmrelease_types.go:973-976),
    whose artifact revision is the chart version (source-controller v1.6.2
    internal/controller/helmchart_controller.go:843). A HelmRelease with spec.chartRef has no HelmChart of its
    own: chart is None and nothing is compared.
    """
    if chart is None:
        return None
    revision = (objects.status(chart).get('artifact') or {}).get('revision')
    if not revision:
        return 'HelmChart %s has no artifact yet' % objects.qualified_name(chart)
    history = [snap for snap in objects.status(helmrelease).get('history') or [] if isinstance(snap, dict)]
    latest = max(history, key=lambda snap: snap.get('version') or 0) if history else None
    if latest is None:
        return 'no release in status.history yet (HelmChart %s has %s)' % (objects.qualified_name(chart), revision)
    if latest.get('chartVersion') != revision or latest.get('status') != 'deployed':
        return 'released chart %s (release v%s %s), HelmChart %s has %s (not released yet)' % (
            latest.get('chartVersion'), latest.get('version'), latest.get('status'), objects.qualified_name(chart), revision)
    return None


def conditions_met(objs, condition_type='Ready', wanted='True', what='objects', extra_checks=None):
    """condition_met for each object; at least one object must be there. extra_checks(obj): why an object that meets
    the condition is still not done, or None (the HelmRelease's released chart, helmrelease_applied)."""
    items = [condition_met(obj, condition_type, wanted) for obj in sorted(objs, key=objects.qualified_name)]
    for item, obj in zip(items, sorted(objs, key=objects.qualified_name)):
        if item['ok'] and extra_checks is not None:
            why = extra_checks(obj)
            if why:
                item.update(ok=False, reason=why)
    problems = [] if items else ['no %s found' % what]
    failing = ['%s %s' % (item['name'], item['reason']) for item in items if not item['ok']]
    good = len(items) - len(failing)
    summary = _headline('%s %s=%s' % (what, condition_type, wanted), good, len(items), failing, problems)
    failed = any(item['stalled'] or item['suspended'] for item in items)
    return Verdict(not failing and not problems, summary, items, problems, failed=failed)


# --- API server ------------------------------------------------------------------------------------

def api_ready(status_code, body, path='/readyz'):
    """The API server answers 200 'ok' on /readyz; otherwise name the failing checks it lists."""
    text = (body or '').strip()
    if status_code == 200 and text == 'ok':
        return Verdict(True, 'API %s ok' % path, [{'name': path, 'ok': True, 'reason': None}])
    failing_checks = [line.strip()[3:].strip() for line in text.splitlines() if line.strip().startswith('[-]')]
    reason = 'answered %s' % status_code
    if failing_checks:
        reason += ', failing checks: %s' % ', '.join(failing_checks)
    elif text:
        reason += ': %s' % diagnosis.clip(text, 200)
    return Verdict(False, 'API %s %s' % (path, reason), [{'name': path, 'ok': False, 'reason': reason,
                                                          'failing_checks': failing_checks}])
