#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: k8s_gate
short_description: Wait until a Kubernetes state is observed, or fail saying what is wrong
version_added: 0.1.0
description:
  - A health gate between bootstrap stages. It reads the cluster, never changes it, and
    returns only when the state is observed; otherwise it fails with a diagnosis that names
    the node, pod or object and the reason (CrashLoopBackOff, NetworkPluginNotReady, a
    scheduler message, a Flux condition reason).
  - O(gate=nodes) - nodes registered and Ready (all, or a label selection; an exact count or
    named nodes).
  - O(gate=workload) - a DaemonSet with a Ready pod on every eligible node, or a Deployment or
    StatefulSet rolled out and available (optionally only as many replicas as can be
    scheduled now).
  - O(gate=pods) - selected pods Ready, optionally one Ready on every node.
  - O(gate=crds) - CustomResourceDefinitions Established.
  - O(gate=condition) - any resource with a condition (default C(Ready)) at the wanted status
    for its current generation, Flux/kstatus style. A C(Stalled) object fails at once.
  - O(gate=api) - the API server answers C(ok) on C(/readyz).
  - Progress while waiting is returned as a timeline (RV(progress)) and can be followed live
    in a JSON-lines file (O(progress_file)); see the proxtalos.cluster docs/gates.md page.
author:
  - proxtalos.cluster contributors (@proxtalos)
options:
  gate:
    description: Which kind of state to wait for.
    type: str
    required: true
    choices: [nodes, workload, pods, crds, condition, api]
  kind:
    description:
      - For O(gate=workload), one of V(DaemonSet), V(Deployment), V(StatefulSet).
      - For O(gate=condition), the resource kind, for example V(Kustomization).
    type: str
  api_version:
    description:
      - For O(gate=condition), the resource apiVersion, for example V(kustomize.toolkit.fluxcd.io/v1).
      - For O(gate=workload), defaults to V(apps/v1).
    type: str
  name:
    description:
      - Name of the workload (O(gate=workload), required) or of the object (O(gate=condition);
        when not set, every object of O(kind) in O(namespace) matching O(label_selectors)).
    type: str
  namespace:
    description:
      - Namespace of the workload, object or pods. For O(gate=pods) and O(gate=condition),
        all namespaces when not set.
    type: str
  names:
    description:
      - For O(gate=nodes), node names that must be registered (and Ready); missing ones are named.
      - For O(gate=crds), CRD names such as V(kustomizations.kustomize.toolkit.fluxcd.io).
    type: list
    elements: str
  label_selectors:
    description:
      - Label selectors (V(key=value), V(key!=value), V(key in (a,b))), ANDed, to choose the
        nodes (O(gate=nodes)), pods (O(gate=pods)), CRDs (O(gate=crds)) or objects (O(gate=condition)).
    type: list
    elements: str
    default: []
  node_label_selectors:
    description:
      - For O(gate=pods) with O(every_node=true), which nodes must each have a Ready pod (all nodes when empty).
    type: list
    elements: str
    default: []
  expected_count:
    description:
      - For O(gate=nodes), exactly this many nodes must be registered (extra ones are named).
      - For O(gate=pods), at least this many pods must exist (default 1).
    type: int
  node_state:
    description:
      - For O(gate=nodes), V(ready) waits for Ready; V(registered) only for the nodes to exist
        (before a CNI is installed, nodes are registered but NotReady).
    type: str
    choices: [ready, registered]
    default: ready
  every_node:
    description:
      - For O(gate=pods), also require a Ready pod on every node (see O(node_label_selectors)).
    type: bool
    default: false
  accept_unschedulable_replicas:
    description:
      - For O(gate=workload) with a Deployment or StatefulSet, require only as many available
        replicas as can be scheduled now (at least one), counting nodes that pass the pod's
        nodeSelector, required node affinity, taints, and its own required pod anti-affinity.
      - For example two cilium-operator replicas with anti-affinity on a one-node cluster
        pass with one available.
    type: bool
    default: false
  condition_type:
    description: For O(gate=condition), the condition type.
    type: str
    default: Ready
  condition_status:
    description: For O(gate=condition), the wanted status of the condition.
    type: str
    choices: ['True', 'False', 'Unknown']
    default: 'True'
  progress_file:
    description:
      - Append a JSON line to this file whenever the observed state changes while waiting (and
        at least every 30 seconds), so a callback or C(tail -f) can follow the wait live. Lines - C(start),
        C(progress) (C(summary), C(elapsed), C(attempt)), C(end) (with C(ok)).
      - Uses the E(PROXTALOS_PROGRESS_FILE) environment variable if not set. Created with mode 0600; its folder
        must exist.
      - The C(proxtalos.cluster.timeline) callback sets E(PROXTALOS_PROGRESS_FILE) for each task and prints each
        new summary on the terminal while the gate waits (its C(live_progress) option), so leave this unset to see
        the progress there.
    type: path
extends_documentation_fragment:
  - proxtalos.cluster._k8s_auth
  - proxtalos.cluster._wait
  - proxtalos.cluster._attributes
  - proxtalos.cluster._attributes.INFO_MODULE
attributes:
  check_mode:
    details:
      - Read-only. In check mode the gate probes once instead of waiting, and fails if the state
        is not reached at that moment (its prediction for a run that would start now).
notes:
  - The result is never C(changed).
  - O(wait=false) or O(wait_timeout=0) probes once.
  - Connection errors, HTTP 429 and 5xx answers count as "not yet" while waiting; TLS and
    authentication errors fail at once.
seealso:
  - module: kubernetes.core.k8s_info
"""

EXAMPLES = r"""
- name: Wait for every node to register (before the CNI exists they stay NotReady)
  proxtalos.cluster.k8s_gate:
    kubeconfig: "{{ proxtalos_artifacts_dir }}/kubeconfig"
    gate: nodes
    node_state: registered
    expected_count: "{{ groups['cluster'] | length }}"
    wait_timeout: 600

- name: Cilium agent Ready on every node
  proxtalos.cluster.k8s_gate:
    kubeconfig: "{{ proxtalos_artifacts_dir }}/kubeconfig"
    gate: workload
    kind: DaemonSet
    namespace: kube-system
    name: cilium
    wait_sleep: 1

- name: Cilium operator available, as many replicas as the nodes allow now
  proxtalos.cluster.k8s_gate:
    kubeconfig: "{{ proxtalos_artifacts_dir }}/kubeconfig"
    gate: workload
    kind: Deployment
    namespace: kube-system
    name: cilium-operator
    accept_unschedulable_replicas: true

- name: All nodes Ready, by inventory name
  proxtalos.cluster.k8s_gate:
    kubeconfig: "{{ proxtalos_artifacts_dir }}/kubeconfig"
    gate: nodes
    names: "{{ groups['cluster'] }}"

- name: Flux CRDs Established
  proxtalos.cluster.k8s_gate:
    kubeconfig: "{{ proxtalos_artifacts_dir }}/kubeconfig"
    gate: crds
    label_selectors: [app.kubernetes.io/part-of=flux]

- name: Every Flux Kustomization Ready for its current generation
  proxtalos.cluster.k8s_gate:
    kubeconfig: "{{ proxtalos_artifacts_dir }}/kubeconfig"
    gate: condition
    api_version: kustomize.toolkit.fluxcd.io/v1
    kind: Kustomization
    namespace: flux-system
    wait_timeout: 900

- name: API server ready
  proxtalos.cluster.k8s_gate:
    kubeconfig_content: "{{ vault_kubeconfig }}"
    gate: api
"""

RETURN = r"""
gate:
  description: The gate kind that ran.
  type: str
  returned: always
  sample: nodes
target:
  description: What the gate looked at, in words.
  type: str
  returned: always
  sample: DaemonSet kube-system/cilium
passed:
  description: Whether the state was reached (the module fails when it is not).
  type: bool
  returned: always
summary:
  description: The last observation in one line; names what is missing and why.
  type: str
  returned: always
  sample: "nodes Ready 6/6"
details:
  description:
    - Per-item details of the last observation, one dict per node, pod or object, each with at
      least C(name), C(ok) and C(reason) (null when ok). Gate kinds add fields such as
      C(pod), C(node), C(roles), C(generation), C(observed_generation), C(conditions); a node also has
      what its kubelet reports in status.nodeInfo, when it does (C(kubelet_version), C(os_image),
      C(kernel_version), C(container_runtime)), which the run report shows per node.
  type: list
  elements: dict
  returned: always
  sample: [{"name": "w-2", "ok": false, "ready": false, "reason": "NetworkPluginNotReady", "roles": []}]
problems:
  description: Object-level findings of the last observation (rollout not started, count mismatch).
  type: list
  elements: str
  returned: always
notes:
  description: Context that is not a failure (nodes not eligible for a DaemonSet and why, schedulable replica count).
  type: list
  elements: str
  returned: always
replicas:
  description:
    - For a C(workload) gate on a Deployment or StatefulSet, the replica counts of the last observation;
      null for other gates.
    - C(required) is what the gate waited for (C(desired), or with I(accept_unschedulable_replicas) as many as
      can be scheduled now, at least one); C(schedulable) is that count of the scheduler's, null unless
      I(accept_unschedulable_replicas) is set.
  type: dict
  returned: always
  sample: {"desired": 2, "available": 1, "updated": 1, "required": 1, "schedulable": 1}
  contains:
    desired:
      description: spec.replicas.
      type: int
    available:
      description: status.availableReplicas (readyReplicas for a StatefulSet that does not report it).
      type: int
    updated:
      description: status.updatedReplicas.
      type: int
    required:
      description: The number of available replicas the gate waited for.
      type: int
    schedulable:
      description: Replicas that can be placed on the nodes now (nodeSelector, taints, required self anti-affinity).
      type: int
diagnosis:
  description: On failure, the lines of the diagnosis (also in C(msg)).
  type: list
  elements: str
  returned: failure
elapsed:
  description: Seconds spent waiting.
  type: float
  returned: always
  sample: 12.4
attempts:
  description: Number of probes.
  type: int
  returned: always
  sample: 7
api_requests:
  description: Number of HTTP requests made to the API server.
  type: int
  returned: always
progress:
  description:
    - The wait's timeline, one entry each time the summary changed, and the final one
      (C(elapsed), C(attempt), C(summary)). At most 100 entries, the first kept.
  type: list
  elements: dict
  returned: always
  sample: [{"elapsed": 0.0, "attempt": 1, "summary": "nodes Ready 4/6: w-2 NetworkPluginNotReady"}]
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec
from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import gates
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import progress


def argument_spec():
    return _argspec.spec(
        _argspec.K8S_AUTH_SPEC, _argspec.WAIT_SPEC,
        gate=dict(type='str', required=True, choices=list(gates.GATE_KINDS)),
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
        progress_file=dict(type='path', fallback=(env_fallback, ['PROXTALOS_PROGRESS_FILE'])),
    )


def _result(gate_run, client, timeline, gate):
    verdict = gate_run.verdict if gate_run is not None else None
    result = {
        'changed': False,
        'gate': gate.kind,
        'target': gate.target(),
        'passed': bool(gate_run is not None and gate_run.passed),
        'summary': gate_run.headline() if gate_run is not None else '',
        'details': verdict.items if verdict is not None else [],
        'problems': verdict.problems if verdict is not None else [],
        'notes': verdict.notes if verdict is not None else [],
        'replicas': verdict.replicas if verdict is not None else None,
        'elapsed': round(gate_run.result.elapsed, 3) if gate_run is not None else 0.0,
        'attempts': gate_run.result.attempts if gate_run is not None else 0,
        'api_requests': client.requests if client is not None else 0,
        'progress': timeline.timeline if timeline is not None else [],
    }
    return result


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(),
        supports_check_mode=True,
        required_if=[
            ('gate', 'workload', ('kind', 'name', 'namespace')),
            ('gate', 'condition', ('api_version', 'kind')),
        ],
        **_argspec.K8S_AUTH_CONSTRAINTS
    )
    if not k8s_client.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib('kubernetes'), exception=str(k8s_client.KUBERNETES_IMPORT_ERROR))

    timeout, interval = _argspec.wait_params(module.params)
    if module.check_mode:
        timeout = 0.0
    gate = None
    client = None
    timeline = None
    try:
        gate = gates.build_gate(module.params)
        client = k8s_client.build_client(module.params, module=module, warn=module.warn)
        timeline = progress.Progress('k8s_gate %s' % gate.target(), module.params.get('progress_file'))
        gate_run = gates.run(gate, client, timeout, interval, on_progress=timeline.record)
        timeline.finish(gate_run.result.observation, gate_run.result.elapsed, gate_run.result.attempts, gate_run.passed)
    except _errors.ValidationError as exc:
        module.fail_json(msg=str(exc), field=exc.field, changed=False)
    except _errors.ProxtalosError as exc:
        result = _result(None, client, timeline, gate) if gate is not None else {'changed': False}
        result.update(exc.details)
        module.fail_json(msg=str(exc), exception=traceback.format_exc(), **result)

    result = _result(gate_run, client, timeline, gate)
    if gate_run.passed:
        module.exit_json(**result)
    message = gates.explain(gate_run, client)
    result['diagnosis'] = message.splitlines()[1:]
    module.fail_json(msg=message, **result)


if __name__ == '__main__':
    main()
