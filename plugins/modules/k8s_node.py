#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: k8s_node
short_description: Cordon and drain a Kubernetes Node, make it schedulable again, or delete it
version_added: 0.1.0
description:
  - O(state=drained) - marks the Node unschedulable (cordon), then evicts its pods (the C(pods/eviction) subresource,
    which honours PodDisruptionBudgets; an eviction a budget refuses is asked again until the deadline) and waits
    until each of them is gone. A pod its controller puts on the node again afterwards (one that tolerates the
    unschedulable taint, such as the Cilium operator) is not waited for, as with C(kubectl drain). DaemonSet pods
    and static (mirror) pods stay, as with C(kubectl drain --ignore-daemonsets). An API server without the eviction subresource gets a plain delete of the pod.
  - A Node that is not Ready (its kubelet down) cannot finish its pods, so O(state=drained) asks their evictions
    and does not wait for them; the pods still there are in RV(left_terminating), with a warning. Deleting the Node
    (O(state=absent)) lets kube-controller-manager's PodGC remove them, as it does for pods bound to a Node that no
    longer exists. A budget that refuses an eviction is not asked again then.
  - O(state=uncordoned) - marks the Node schedulable again (after a drain for an upgrade).
  - O(state=absent) - deletes the Node object and waits until it is gone. Meant for a node whose machine was
    reset or deleted; drain it first.
  - A Node that does not exist reports C(ok) for both states.
attributes:
  check_mode:
    support: full
    details:
      - Reads the Node and its pods and reports what it would cordon, evict or delete.
  diff_mode:
    support: none
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
  - proxtalos.cluster._k8s_auth
  - proxtalos.cluster._wait
options:
  name:
    description:
      - The Node's name.
    type: str
    required: true
  state:
    description:
      - V(drained), V(uncordoned) or V(absent), see above.
    type: str
    choices: [drained, uncordoned, absent]
    default: drained
"""

EXAMPLES = r"""
- name: Drain lab-w-2
  proxtalos.cluster.k8s_node:
    kubeconfig: "artifacts/lab/kubeconfig"
    name: lab-w-2
    state: drained
    wait_timeout: 300
"""

RETURN = r"""
cordoned:
  description: Whether this run marked the Node unschedulable.
  returned: always
  type: bool
uncordoned:
  description: Whether this run marked the Node schedulable again.
  returned: always
  type: bool
evicted:
  description: The pods this run evicted or deleted, as namespace/name (in check mode, would).
  returned: always
  type: list
  elements: str
left_terminating:
  description: The evicted pods still there when the Node is not Ready (their kubelet cannot finish them); PodGC
    removes them once the Node object is deleted.
  returned: always
  type: list
  elements: str
deleted:
  description: Whether this run deleted the Node object (in check mode, would).
  returned: always
  type: bool
"""

import json
from urllib.parse import quote

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _errors, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client


def argument_spec():
    return _argspec.spec(
        _argspec.K8S_AUTH_SPEC, _argspec.WAIT_SPEC,
        name=dict(type='str', required=True),
        state=dict(type='str', choices=['drained', 'uncordoned', 'absent'], default='drained'),
    )


def node_path(name):
    return '/api/v1/nodes/%s' % quote(name, safe='')


def pod_path(pod):
    meta = pod['metadata']
    return '/api/v1/namespaces/%s/pods/%s' % (quote(meta['namespace'], safe=''), quote(meta['name'], safe=''))


def evictable(pod):
    """Pods a drain moves: not a DaemonSet's, not a static (mirror) pod, not finished already."""
    meta = pod.get('metadata') or {}
    if 'kubernetes.io/config.mirror' in (meta.get('annotations') or {}):
        return False
    if any(owner.get('kind') == 'DaemonSet' for owner in meta.get('ownerReferences') or []):
        return False
    return (pod.get('status') or {}).get('phase') not in ('Succeeded', 'Failed')


def pods_on(kube, name):
    pods = kube.list('v1', 'Pod', field_selector='spec.nodeName=%s' % name)
    return [pod for pod in pods if (pod.get('spec') or {}).get('nodeName') == name and evictable(pod)]


def evict(kube, pod):
    """True once the pod is asked to go; False when a disruption budget refuses it now (429)."""
    meta = pod['metadata']
    body = {'apiVersion': 'policy/v1', 'kind': 'Eviction',
            'metadata': {'name': meta['name'], 'namespace': meta['namespace']}}
    status, answer = kube.request(pod_path(pod) + '/eviction', method='POST',
                                  body=json.dumps(body).encode('utf-8'))
    if status in (200, 201):
        return True
    if status == 429:
        return False
    if status in (404, 405):
        if kube.get_json(pod_path(pod)) is None:
            return True   # gone already
        kube.send_json('DELETE', pod_path(pod))   # no eviction subresource here
        return True
    raise _errors.ApiError('evicting pod %s/%s failed: HTTP %d %s' % (meta['namespace'], meta['name'], status,
                                                                      answer[:300].decode('utf-8', 'replace')),
                           service='Kubernetes API', status=status)


def pod_key(pod):
    return '%s/%s' % (pod['metadata']['namespace'], pod['metadata']['name'])


def still_there(kube, pod):
    """True while the pod (this very pod: same uid) exists."""
    now = kube.get_json(pod_path(pod))
    return now is not None and (now.get('metadata') or {}).get('uid') == pod['metadata'].get('uid')


def node_ready(node):
    """Whether the Node's Ready condition is True (kubelet reports it; Unknown once its lease ran out)."""
    for condition in (node.get('status') or {}).get('conditions') or []:
        if condition.get('type') == 'Ready':
            return condition.get('status') == 'True'
    return False


def drain(module, kube, name, result, deadline, interval):
    """Cordon, then evict the pods on the node now and wait until each of them is gone (as kubectl drain does: a pod
    its controller puts on the node again - one that tolerates the unschedulable taint - is not waited for).

    A Node that is not Ready has no kubelet to finish its pods: an evicted pod stays Terminating there. Its evictions
    are asked and not waited for (result left_terminating); once the Node object is deleted, kube-controller-manager's
    PodGC deletes the pods bound to it (kubernetes v1.36.3 pkg/controller/podgc/gc_controller.go:229-259,
    gcOrphaned, after a 40 s quarantine)."""
    node = kube.get('v1', 'Node', name)
    if node is None:
        return
    ready = node_ready(node)
    if not (node.get('spec') or {}).get('unschedulable'):
        result['cordoned'] = True
        if not module.check_mode:
            kube.send_json('PATCH', node_path(name), {'spec': {'unschedulable': True}},
                           content_type='application/merge-patch+json')
    pods = pods_on(kube, name)
    result['evicted'] = sorted(pod_key(pod) for pod in pods)
    if module.check_mode or not pods:
        return
    if not ready:
        for pod in pods:
            evict(kube, pod)
        result['left_terminating'] = sorted(pod_key(pod) for pod in pods if still_there(kube, pod))
        if result['left_terminating']:
            module.warn('Node %s is not Ready: its kubelet cannot finish the %d evicted pod(s) still there (%s); they '
                        'are not waited for. Deleting the Node object lets PodGC remove them.'
                        % (name, len(result['left_terminating']), ', '.join(result['left_terminating'][:10])))
        return
    asked = set()

    def probe():
        refused = []
        for pod in pods:
            if pod_key(pod) in asked:
                continue
            if evict(kube, pod):
                asked.add(pod_key(pod))
            else:
                refused.append(pod_key(pod))
        left = sorted(pod_key(pod) for pod in pods if still_there(kube, pod))
        if not left:
            return True, 'every evicted pod is gone'
        return False, '%d pod(s) not gone yet: %s%s' % (
            len(left), ', '.join(left[:10]),
            ('; a disruption budget refuses the eviction of ' + ', '.join(refused)) if refused else '')
    waited = _wait.wait_for(probe, deadline.remaining(), interval=interval, transient=(_errors.TransientApiError,))
    if not waited.ok:
        raise _errors.WaitTimeout('Node %s: gave up after %gs draining it; last seen: %s'
                                  % (name, deadline.timeout, waited.observation), waited, node=name)


def uncordon(module, kube, name, result):
    node = kube.get('v1', 'Node', name)
    if node is None or not (node.get('spec') or {}).get('unschedulable'):
        return
    result['uncordoned'] = True
    if not module.check_mode:
        kube.send_json('PATCH', node_path(name), {'spec': {'unschedulable': None}},
                       content_type='application/merge-patch+json')


def delete(module, kube, name, result, deadline, interval):
    if kube.get('v1', 'Node', name) is None:
        return
    result['deleted'] = True
    if module.check_mode:
        return
    kube.send_json('DELETE', node_path(name))
    waited = _wait.wait_for(lambda: (kube.get('v1', 'Node', name) is None, 'still there'), deadline.remaining(),
                            interval=interval, transient=(_errors.TransientApiError,))
    if not waited.ok:
        raise _errors.WaitTimeout('Node %s: still there %gs after its delete' % (name, deadline.timeout), waited, node=name)


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True,
        mutually_exclusive=_argspec.K8S_AUTH_CONSTRAINTS['mutually_exclusive'],
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    params = module.params
    result = dict(changed=False, cordoned=False, uncordoned=False, evicted=[], left_terminating=[], deleted=False)
    try:
        kube = k8s_client.build_client(params, module=module, warn=module.warn)
        timeout, interval = _argspec.wait_params(params)
        deadline = _wait.Deadline(timeout)
        kube.deadline = deadline
        if params['state'] == 'drained':
            drain(module, kube, params['name'], result, deadline, interval)
        elif params['state'] == 'uncordoned':
            uncordon(module, kube, params['name'], result)
        else:
            delete(module, kube, params['name'], result, deadline, interval)
    except _errors.ProxtalosError as exc:
        result['changed'] = bool(result['cordoned'] or result['uncordoned'] or result['evicted'] or result['deleted'])
        module.fail_json(msg=str(exc), **dict(exc.details, **result))
    result['changed'] = bool(result['cordoned'] or result['uncordoned'] or result['evicted'] or result['deleted'])
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
