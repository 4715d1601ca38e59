# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Turn observed Nodes and Pods into short human text: what is wrong, where, and why. PRIVATE.

`*_reason` functions give the short form used in progress lines ("CrashLoopBackOff",
"NetworkPluginNotReady"); `*_detail` functions give the longer form used when a gate times out
(with the kubelet's or scheduler's own message).
"""

from __future__ import annotations

from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import objects

PRESSURE_CONDITIONS = ('MemoryPressure', 'DiskPressure', 'PIDPressure', 'NetworkUnavailable')
# Kubelet puts the runtime's reason inside the Ready message:
# "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:..."
KUBELET_RUNTIME_REASONS = ('NetworkPluginNotReady', 'ContainerRuntimeNotReady', 'PLEG is not healthy')
MAX_MESSAGE = 300


def clip(text, limit=MAX_MESSAGE):
    text = ' '.join((text or '').split())
    return text if len(text) <= limit else text[:limit - 3] + '...'


def node_reason(node):
    """Short reason a node is not Ready, or None when it is Ready."""
    ready = objects.condition(node, 'Ready')
    if ready is None:
        return 'no Ready condition yet (kubelet has not reported)'
    if ready.get('status') == 'True':
        return None
    message = ready.get('message') or ''
    for reason in KUBELET_RUNTIME_REASONS:
        if reason in message:
            return reason
    if ready.get('status') == 'Unknown':
        return ready.get('reason') or 'NodeStatusUnknown'
    return ready.get('reason') or 'NotReady'


def node_pressures(node):
    """Names of problem conditions that are True (MemoryPressure, DiskPressure, ...)."""
    return [cond for cond in PRESSURE_CONDITIONS if objects.condition_is(node, cond, 'True')]


def node_detail(node):
    """Longer text for a node: Ready status with the kubelet message, pressures, cordon."""
    parts = []
    ready = objects.condition(node, 'Ready')
    if ready is None:
        parts.append('no Ready condition yet (kubelet has not reported)')
    elif ready.get('status') != 'True':
        parts.append('Ready=%s %s' % (ready.get('status'), clip(objects.condition_text(ready))))
    pressures = node_pressures(node)
    if pressures:
        parts.append('conditions True: %s' % ', '.join(pressures))
    if objects.spec(node).get('unschedulable'):
        parts.append('cordoned (spec.unschedulable)')
    return '; '.join(parts) if parts else 'Ready'


def _container_problem(container_status, init=False):
    """Text for one containerStatus that is not running and ready, or None."""
    cname = container_status.get('name') or '?'
    kind = 'init container' if init else 'container'
    state = container_status.get('state') or {}
    restarts = container_status.get('restartCount') or 0
    waiting = state.get('waiting')
    terminated = state.get('terminated')
    if waiting:
        reason = waiting.get('reason') or 'Waiting'
        if init and reason == 'PodInitializing':
            return None
        if reason in ('ContainerCreating', 'PodInitializing') and not waiting.get('message'):
            return '%s (%s %s)' % (reason, kind, cname)
        extra = ['%s %s' % (kind, cname)]
        if restarts:
            extra.append('%d restart%s' % (restarts, '' if restarts == 1 else 's'))
        last = (container_status.get('lastState') or {}).get('terminated')
        if last:
            extra.append('last exit code %s%s' % (last.get('exitCode'), ' %s' % last['reason'] if last.get('reason') else ''))
        text = '%s (%s)' % (reason, ', '.join(extra))
        if waiting.get('message') and reason != 'CrashLoopBackOff':
            text += ': %s' % clip(waiting['message'], 200)
        return text
    if terminated:
        if init and terminated.get('exitCode') == 0:
            return None
        return 'Terminated %s (%s %s, exit code %s)' % (
            terminated.get('reason') or '', kind, cname, terminated.get('exitCode'))
    if not init and not container_status.get('ready'):
        return 'not Ready (%s %s running, readiness probe not passing)' % (kind, cname)
    return None


def pod_reason(pod):
    """Short reason a pod is not Ready, or None when it is Ready."""
    if objects.pod_ready(pod):
        return None
    if objects.is_terminating(pod):
        return 'Terminating'
    pod_status = objects.status(pod)
    phase = pod_status.get('phase') or 'Pending'
    if phase in ('Failed', 'Succeeded'):
        text = phase
        if pod_status.get('reason'):
            text += ' %s' % pod_status['reason']
        if pod_status.get('message'):
            text += ': %s' % clip(pod_status['message'], 200)
        return text
    scheduled = objects.condition(pod, 'PodScheduled')
    if scheduled is not None and scheduled.get('status') == 'False':
        return 'Pending %s' % (clip(objects.condition_text(scheduled)) or 'not scheduled')
    for container_status in pod_status.get('initContainerStatuses') or []:
        problem = _container_problem(container_status, init=True)
        if problem:
            return 'Init:%s' % problem
    for container_status in pod_status.get('containerStatuses') or []:
        problem = _container_problem(container_status)
        if problem:
            return problem
    if phase == 'Pending':
        if not objects.pod_node(pod):
            return 'Pending (not scheduled yet)'
        return 'Pending (ContainerCreating)'
    ready = objects.condition(pod, 'Ready')
    if ready is not None and ready.get('status') != 'True':
        return 'not Ready (%s)' % (objects.condition_text(ready) or 'Ready=%s' % ready.get('status'))
    return 'not Ready (%s)' % phase


def pod_line(pod):
    """'namespace/name on node: reason' for a pod that is not Ready."""
    node = objects.pod_node(pod)
    where = ' on %s' % node if node else ''
    return '%s%s: %s' % (objects.qualified_name(pod), where, pod_reason(pod) or 'Ready')


def limit_list(texts, limit=5):
    """Join texts with '; ', naming at most `limit` of them and counting the rest."""
    texts = list(texts)
    if len(texts) <= limit:
        return '; '.join(texts)
    return '%s; and %d more' % ('; '.join(texts[:limit]), len(texts) - limit)
