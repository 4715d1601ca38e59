"""kstatus, as Flux's health checks compute it (fluxcd/cli-utils pkg/kstatus/status), for the lab.

status(obj) -> (status, message) with status one of Current, InProgress, Failed, NotFound,
Terminating. Built-in rules for the kinds the lab's GitOps repository ships (Deployment,
DaemonSet, StatefulSet, ReplicaSet, Pod, Job, PVC, CRD, Namespace, Service); any other object
follows the generic rules: observedGeneration behind generation, Reconciling=True and a Ready
condition that is not True mean InProgress, Stalled=True means Failed, and no conditions mean
Current.
"""

CURRENT, IN_PROGRESS, FAILED, NOT_FOUND, TERMINATING = 'Current', 'InProgress', 'Failed', 'NotFound', 'Terminating'


def _conditions(obj):
    return {c.get('type'): c for c in ((obj.get('status') or {}).get('conditions') or ()) if isinstance(c, dict)}


def _generation_lag(obj):
    status = obj.get('status') or {}
    generation = (obj.get('metadata') or {}).get('generation')
    observed = status.get('observedGeneration')
    if generation is not None and observed is not None and observed < generation:
        return '%s generation is %d, but latest observed generation is %d' % (obj.get('kind'), generation, observed)
    return ''


def _deployment(obj):
    spec, status = obj.get('spec') or {}, obj.get('status') or {}
    replicas = spec.get('replicas', 1)
    for condition in status.get('conditions') or ():
        if condition.get('type') == 'Progressing' and condition.get('reason') == 'ProgressDeadlineExceeded':
            return FAILED, 'Progress deadline exceeded'
    updated, available, ready = (status.get(k, 0) for k in ('updatedReplicas', 'availableReplicas', 'readyReplicas'))
    total = status.get('replicas', 0)
    if updated < replicas:
        return IN_PROGRESS, 'Updated: %d/%d' % (updated, replicas)
    if total > updated:
        return IN_PROGRESS, 'Pending termination: %d' % (total - updated)
    if available < replicas:
        return IN_PROGRESS, 'Available: %d/%d' % (available, replicas)
    if ready < replicas:
        return IN_PROGRESS, 'Ready: %d/%d' % (ready, replicas)
    return CURRENT, 'Deployment is available. Replicas: %d' % replicas


def _daemonset(obj):
    status = obj.get('status') or {}
    desired = status.get('desiredNumberScheduled')
    if desired is None:
        return IN_PROGRESS, 'Missing .status.desiredNumberScheduled'
    for field, label in (('currentNumberScheduled', 'Current'), ('updatedNumberScheduled', 'Updated'),
                         ('numberAvailable', 'Available'), ('numberReady', 'Ready')):
        value = status.get(field, 0)
        if value < desired:
            return IN_PROGRESS, '%s: %d/%d' % (label, value, desired)
    return CURRENT, 'All replicas scheduled as expected. Replicas: %d' % desired


def _statefulset(obj):
    spec, status = obj.get('spec') or {}, obj.get('status') or {}
    replicas = spec.get('replicas', 1)
    ready = status.get('readyReplicas', 0)
    if ready < replicas:
        return IN_PROGRESS, 'Ready: %d/%d' % (ready, replicas)
    if status.get('currentRevision') != status.get('updateRevision'):
        return IN_PROGRESS, 'waiting for updated revision %s' % status.get('updateRevision')
    return CURRENT, 'All replicas scheduled as expected. Replicas: %d' % replicas


def _replicaset(obj):
    spec, status = obj.get('spec') or {}, obj.get('status') or {}
    replicas = spec.get('replicas', 1)
    available = status.get('availableReplicas', 0)
    if available < replicas:
        return IN_PROGRESS, 'Available: %d/%d' % (available, replicas)
    return CURRENT, 'ReplicaSet is available. Replicas: %d' % replicas


def _pod(obj):
    status = obj.get('status') or {}
    phase = status.get('phase')
    if phase == 'Succeeded':
        return CURRENT, 'Pod has completed successfully'
    if phase == 'Failed':
        return FAILED, 'Pod has completed, but not successfully'
    for container in status.get('containerStatuses') or ():
        waiting = (container.get('state') or {}).get('waiting') or {}
        if waiting.get('reason') == 'CrashLoopBackOff':
            return FAILED, 'Pod container %s is in CrashLoopBackOff' % container.get('name')
    ready = _conditions(obj).get('Ready') or {}
    if ready.get('status') == 'True':
        return CURRENT, 'Pod is Ready'
    return IN_PROGRESS, 'Pod phase %s, not Ready' % (phase or 'Pending')


def _job(obj):
    conditions = _conditions(obj)
    if (conditions.get('Complete') or {}).get('status') == 'True':
        return CURRENT, 'Job Completed. succeeded: %d' % (obj.get('status') or {}).get('succeeded', 0)
    if (conditions.get('Failed') or {}).get('status') == 'True':
        return FAILED, 'Job Failed'
    return IN_PROGRESS, 'Job in progress'


def _pvc(obj):
    phase = (obj.get('status') or {}).get('phase')
    if phase == 'Bound':
        return CURRENT, 'PVC is Bound'
    return IN_PROGRESS, 'PVC is not Bound. phase: %s' % (phase or 'Pending')


def _crd(obj):
    conditions = _conditions(obj)
    if (conditions.get('NamesAccepted') or {}).get('status') == 'False':
        return FAILED, 'CRD names not accepted: %s' % conditions['NamesAccepted'].get('message', '')
    if (conditions.get('Established') or {}).get('status') == 'True':
        return CURRENT, 'CRD is established'
    return IN_PROGRESS, 'CRD is not established'


def _namespace(obj):
    phase = (obj.get('status') or {}).get('phase')
    if phase == 'Terminating':
        return TERMINATING, 'Namespace is terminating'
    return CURRENT, 'Resource is current'


def _generic(obj):
    conditions = _conditions(obj)
    stalled = conditions.get('Stalled') or {}
    if stalled.get('status') == 'True':
        return FAILED, stalled.get('message') or 'Stalled'
    reconciling = conditions.get('Reconciling') or {}
    if reconciling.get('status') == 'True':
        return IN_PROGRESS, reconciling.get('message') or 'Reconciling'
    ready = conditions.get('Ready')
    if ready is not None:
        if ready.get('status') == 'True':
            return CURRENT, ready.get('message') or 'Resource is Ready'
        return IN_PROGRESS, '%s: %s' % (ready.get('reason') or 'NotReady', ready.get('message') or '')
    return CURRENT, 'Resource is current'


RULES = {
    ('apps', 'Deployment'): _deployment, ('apps', 'DaemonSet'): _daemonset, ('apps', 'StatefulSet'): _statefulset,
    ('apps', 'ReplicaSet'): _replicaset, ('', 'Pod'): _pod, ('batch', 'Job'): _job, ('', 'PersistentVolumeClaim'): _pvc,
    ('apiextensions.k8s.io', 'CustomResourceDefinition'): _crd, ('', 'Namespace'): _namespace,
}


def status(obj, kind=None, group=None):
    """(status, message) of one object (None: NotFound)."""
    if obj is None:
        return NOT_FOUND, 'Resource not found'
    meta = obj.get('metadata') or {}
    if meta.get('deletionTimestamp'):
        return TERMINATING, 'Resource scheduled for deletion'
    kind = kind or obj.get('kind')
    if group is None:
        group = (obj.get('apiVersion') or '').rpartition('/')[0]
    lag = _generation_lag(obj)
    if lag:
        return IN_PROGRESS, lag
    rule = RULES.get((group, kind), _generic)
    return rule(obj)
