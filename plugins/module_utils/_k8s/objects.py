# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small readers over Kubernetes objects as plain dicts (JSON from the API). PRIVATE.

Nothing here talks to an API: every function takes dicts and returns plain values, so the
gate predicates built on them are tested on YAML fixtures.
"""

from __future__ import annotations


def metadata(obj):
    return (obj or {}).get('metadata') or {}


def spec(obj):
    return (obj or {}).get('spec') or {}


def status(obj):
    return (obj or {}).get('status') or {}


def name(obj):
    return metadata(obj).get('name') or '?'


def qualified_name(obj):
    """'namespace/name' for namespaced objects, 'name' otherwise."""
    meta = metadata(obj)
    if meta.get('namespace'):
        return '%s/%s' % (meta['namespace'], meta.get('name') or '?')
    return meta.get('name') or '?'


def labels(obj):
    return metadata(obj).get('labels') or {}


def generation(obj):
    return metadata(obj).get('generation')


def observed_generation(obj):
    return status(obj).get('observedGeneration')


def generation_lag(obj):
    """Text when the controller has not seen the latest spec yet, else None.

    Objects without metadata.generation (some custom resources) have nothing to compare.
    """
    gen = generation(obj)
    if gen is None:
        return None
    seen = observed_generation(obj)
    if seen is None or seen < gen:
        return 'observedGeneration %s < generation %s (controller has not seen the latest spec)' % (
            '-' if seen is None else seen, gen)
    return None


def conditions(obj):
    return status(obj).get('conditions') or []


def condition(obj, condition_type):
    """The condition dict of that type, or None."""
    for cond in conditions(obj):
        if cond.get('type') == condition_type:
            return cond
    return None


def condition_is(obj, condition_type, wanted='True'):
    cond = condition(obj, condition_type)
    return cond is not None and str(cond.get('status')) == wanted


def condition_text(cond):
    """'Reason: message' of a condition, whichever parts are present."""
    if not cond:
        return ''
    reason = cond.get('reason') or ''
    message = (cond.get('message') or '').strip()
    if reason and message:
        return '%s: %s' % (reason, message)
    return reason or message


def is_terminating(obj):
    return bool(metadata(obj).get('deletionTimestamp'))


def owner_uids(obj):
    return set(ref.get('uid') for ref in metadata(obj).get('ownerReferences') or [] if ref.get('uid'))


def _expression_matches(expression, values_by_key):
    key = expression.get('key')
    operator = expression.get('operator')
    values = [str(v) for v in expression.get('values') or []]
    present = key in values_by_key
    value = values_by_key.get(key)
    if operator == 'In':
        return present and str(value) in values
    if operator == 'NotIn':
        return not present or str(value) not in values
    if operator == 'Exists':
        return present
    if operator == 'DoesNotExist':
        return not present
    if operator in ('Gt', 'Lt'):
        if not present or len(values) != 1:
            return False
        try:
            have, limit = int(value), int(values[0])
        except (TypeError, ValueError):
            return False
        return have > limit if operator == 'Gt' else have < limit
    return False


def selector_matches(selector, object_labels):
    """Does a metav1.LabelSelector dict match these labels?

    An empty selector ({}) matches everything; a missing one (None) matches nothing, as for
    the selectors of pod (anti-)affinity terms.
    """
    if selector is None:
        return False
    object_labels = object_labels or {}
    for key, value in (selector.get('matchLabels') or {}).items():
        if object_labels.get(key) != value:
            return False
    return all(_expression_matches(expr, object_labels) for expr in selector.get('matchExpressions') or [])


def match_labels_query(selector):
    """The equality part of a LabelSelector as a labelSelector query string.

    Only matchLabels go to the server (every API server supports equality selectors); the
    full selector is then applied locally with selector_matches().
    """
    return ','.join('%s=%s' % (k, v) for k, v in sorted(((selector or {}).get('matchLabels') or {}).items()))


def node_selector_term_matches(term, node):
    """A NodeSelectorTerm: matchExpressions on labels and matchFields on metadata.name, ANDed.

    An empty term matches no node (as in the API).
    """
    expressions = term.get('matchExpressions') or []
    fields = term.get('matchFields') or []
    if not expressions and not fields:
        return False
    node_labels = labels(node)
    node_fields = {'metadata.name': name(node)}
    return (all(_expression_matches(expr, node_labels) for expr in expressions)
            and all(_expression_matches(expr, node_fields) for expr in fields))


def pod_ready(pod):
    """A pod counts as Ready when it is Running, not terminating and its Ready condition is True."""
    return (status(pod).get('phase') == 'Running' and not is_terminating(pod)
            and condition_is(pod, 'Ready', 'True'))


def pod_node(pod):
    return spec(pod).get('nodeName')


def node_is_ready(node):
    return condition_is(node, 'Ready', 'True')
