# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which nodes a pod can run on now: nodeSelector, required node affinity, taints. PRIVATE.

The gates use this to know where a DaemonSet must have a pod and how many replicas of a
Deployment or StatefulSet can be placed right now. It follows the scheduler's hard rules only:
nodeSelector, requiredDuringScheduling node affinity, taints with effect NoSchedule/NoExecute
against tolerations, cordoned nodes, and required pod anti-affinity of a workload against its
own replicas. It does not model resources (CPU, memory, ports), topology spread constraints or
volume topology; when those keep a pod Pending, the pod's own scheduler message says so.
"""

from __future__ import annotations

from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import objects

# The node lifecycle controller taints a node by its Ready condition (TaintNodesByCondition);
# a cordoned node gets the unschedulable taint. A node object read before the controller ran
# may lack them, so they are implied from the condition as the controller would add them.
NOT_READY_TAINT = 'node.kubernetes.io/not-ready'
UNREACHABLE_TAINT = 'node.kubernetes.io/unreachable'
UNSCHEDULABLE_TAINT = 'node.kubernetes.io/unschedulable'
NETWORK_UNAVAILABLE_TAINT = 'node.kubernetes.io/network-unavailable'

# Tolerations the DaemonSet controller adds to every daemon pod (pkg/controller/daemon/util).
DAEMONSET_TOLERATIONS = (
    {'key': NOT_READY_TAINT, 'operator': 'Exists', 'effect': 'NoExecute'},
    {'key': UNREACHABLE_TAINT, 'operator': 'Exists', 'effect': 'NoExecute'},
    {'key': 'node.kubernetes.io/disk-pressure', 'operator': 'Exists', 'effect': 'NoSchedule'},
    {'key': 'node.kubernetes.io/memory-pressure', 'operator': 'Exists', 'effect': 'NoSchedule'},
    {'key': 'node.kubernetes.io/pid-pressure', 'operator': 'Exists', 'effect': 'NoSchedule'},
    {'key': UNSCHEDULABLE_TAINT, 'operator': 'Exists', 'effect': 'NoSchedule'},
)
HOST_NETWORK_DAEMONSET_TOLERATIONS = (
    {'key': NETWORK_UNAVAILABLE_TAINT, 'operator': 'Exists', 'effect': 'NoSchedule'},
)

HOSTNAME_KEY = 'kubernetes.io/hostname'


def taint_text(taint):
    if taint.get('value'):
        return '%s=%s:%s' % (taint.get('key'), taint.get('value'), taint.get('effect'))
    return '%s:%s' % (taint.get('key'), taint.get('effect'))


def node_taints(node):
    """The node's taints plus those implied by its Ready condition and cordon."""
    taints = [dict(t) for t in objects.spec(node).get('taints') or []]
    have = set((t.get('key'), t.get('effect')) for t in taints)

    def imply(key):
        if (key, 'NoSchedule') not in have:
            taints.append({'key': key, 'effect': 'NoSchedule', 'implied': True})
            have.add((key, 'NoSchedule'))

    ready = objects.condition(node, 'Ready')
    if ready is None or ready.get('status') == 'False':
        imply(NOT_READY_TAINT)
    elif ready.get('status') != 'True':
        imply(UNREACHABLE_TAINT)
    if objects.spec(node).get('unschedulable'):
        imply(UNSCHEDULABLE_TAINT)
    return taints


def tolerates(toleration, taint):
    """Does one toleration match one taint (core/v1 Toleration.ToleratesTaint)?"""
    effect = toleration.get('effect')
    if effect and effect != taint.get('effect'):
        return False
    key = toleration.get('key')
    operator = toleration.get('operator') or 'Equal'
    if not key:
        return operator == 'Exists'
    if key != taint.get('key'):
        return False
    if operator == 'Exists':
        return True
    return (toleration.get('value') or '') == (taint.get('value') or '')


def untolerated_taints(tolerations, node):
    """Taints with effect NoSchedule or NoExecute that no toleration matches."""
    return [taint for taint in node_taints(node)
            if taint.get('effect') in ('NoSchedule', 'NoExecute')
            and not any(tolerates(tol, taint) for tol in tolerations)]


def pod_tolerations(pod_spec, daemonset=False):
    tolerations = list(pod_spec.get('tolerations') or [])
    if daemonset:
        tolerations.extend(DAEMONSET_TOLERATIONS)
        if pod_spec.get('hostNetwork'):
            tolerations.extend(HOST_NETWORK_DAEMONSET_TOLERATIONS)
    return tolerations


def node_fit(pod_spec, node, daemonset=False):
    """None when a pod with this spec may be placed on the node, else the reason it may not."""
    node_labels = objects.labels(node)
    for key, value in (pod_spec.get('nodeSelector') or {}).items():
        if node_labels.get(key) != value:
            return "node selector %s=%s does not match" % (key, value)
    node_affinity = (pod_spec.get('affinity') or {}).get('nodeAffinity') or {}
    required = node_affinity.get('requiredDuringSchedulingIgnoredDuringExecution')
    if required is not None:
        terms = required.get('nodeSelectorTerms') or []
        if not any(objects.node_selector_term_matches(term, node) for term in terms):
            return 'required node affinity does not match'
    blocking = untolerated_taints(pod_tolerations(pod_spec, daemonset), node)
    if blocking:
        return 'untolerated taint %s' % ', '.join(taint_text(t) for t in blocking)
    return None


def eligible_nodes(pod_spec, nodes, daemonset=False):
    """(nodes a pod with this spec may run on, {node name: reason} for the others)."""
    eligible = []
    excluded = {}
    for node in nodes:
        reason = node_fit(pod_spec, node, daemonset)
        if reason is None:
            eligible.append(node)
        else:
            excluded[objects.name(node)] = reason
    return eligible, excluded


def _self_anti_affinity_terms(template):
    """Required anti-affinity terms that select the workload's own pods."""
    pod_spec = objects.spec(template)
    pod_labels = objects.labels(template)
    anti = (pod_spec.get('affinity') or {}).get('podAntiAffinity') or {}
    terms = []
    for term in anti.get('requiredDuringSchedulingIgnoredDuringExecution') or []:
        if objects.selector_matches(term.get('labelSelector'), pod_labels):
            terms.append(term)
    return terms


def schedulable_replicas(template, replicas, nodes):
    """How many of `replicas` pods of this template can be placed on these nodes now.

    Returns (count, explanation). Each required anti-affinity term that selects the template's
    own pods allows at most one replica per value of its topologyKey among the eligible nodes
    (an eligible node without that label does not limit the count, as in the scheduler).
    """
    pod_spec = objects.spec(template)
    eligible, excluded = eligible_nodes(pod_spec, nodes)
    reasons = ''
    if excluded:
        reasons = '; not eligible: %s' % ', '.join('%s (%s)' % item for item in sorted(excluded.items()))
    if not eligible:
        return 0, 'no node is eligible%s' % reasons
    capacity = replicas
    limits = []
    for term in _self_anti_affinity_terms(template):
        key = term.get('topologyKey') or HOSTNAME_KEY
        domains = set()
        unlimited = False
        for node in eligible:
            value = objects.labels(node).get(key)
            if value is None and key == HOSTNAME_KEY:
                value = objects.name(node)
            if value is None:
                unlimited = True
                break
            domains.add(value)
        if not unlimited:
            capacity = min(capacity, len(domains))
            limits.append('required pod anti-affinity on %s allows %d' % (key, len(domains)))
    text = '%d of %d replicas can be scheduled on %d eligible node(s)' % (
        capacity, replicas, len(eligible))
    if limits:
        text += ' (%s)' % '; '.join(limits)
    return capacity, text + reasons
