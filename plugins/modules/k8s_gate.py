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
  - Several gates in one run - O(gates) lists them, each with a title and its own options; they run in
    order on one API client, each with its own deadline, and the first that does not pass fails the
    module (naming it) and the ones after it are not run. One module process instead of one per gate.
author:
  - proxtalos.cluster contributors (@proxtalos)
options:
  gate:
    description:
      - Which kind of state to wait for (the single form).
      - Exactly one of O(gate) and O(gates) is required.
    type: str
    choices: [nodes, workload, pods, crds, condition, api]
  gates:
    description:
      - Several gates to run in order in this one module run. Each item is a dict with a O(gates[].title), a
        O(gates[].gate), the options of that gate kind - the same as the module's gate options, with the same
        rules and defaults - and optionally its own O(gates[].wait_timeout).
      - Every item is checked before any gate runs. An error names the item by index and title, for example
        gates[2] (ALL nodes Ready).expected_count, and says what is wrong.
      - Each gate waits with its own deadline (its O(gates[].wait_timeout), else O(wait_timeout)), the
        module's O(wait_sleep) and watch. The first gate that does not pass ends the run; C(msg) names its
        title and what it saw, and the gates after it are not run (RV(not_run)). With O(gates), the gate
        options are set in the items, not at the top level.
      - Results are RV(results) (one dict per gate that ran, with the single form's keys) and RV(gates) (the
        run report's records, one per gate that ran).
    type: list
    elements: dict
    suboptions:
      title:
        description: The gate's name in messages, in the live progress and in the run report. Unique in the list.
        type: str
        required: true
      gate:
        description: Which kind of state to wait for, as O(gate).
        type: str
        required: true
        choices: [nodes, workload, pods, crds, condition, api]
      wait_timeout:
        description: This gate's deadline in seconds (O(wait_timeout) when not set, also when that is 0). Check mode and O(wait=false) probe once.
        type: float
      kind:
        description: As O(kind).
        type: str
      api_version:
        description: As O(api_version).
        type: str
      name:
        description: As O(name).
        type: str
      namespace:
        description: As O(namespace).
        type: str
      names:
        description: As O(names).
        type: list
        elements: str
      label_selectors:
        description: As O(label_selectors).
        type: list
        elements: str
        default: []
      node_label_selectors:
        description: As O(node_label_selectors).
        type: list
        elements: str
        default: []
      expected_count:
        description: As O(expected_count).
        type: int
      node_state:
        description: As O(node_state).
        type: str
        choices: [ready, registered]
        default: ready
      every_node:
        description: As O(every_node).
        type: bool
        default: false
      accept_unschedulable_replicas:
        description: As O(accept_unschedulable_replicas).
        type: bool
        default: false
      condition_type:
        description: As O(condition_type).
        type: str
        default: Ready
      condition_status:
        description: As O(condition_status).
        type: str
        choices: ['True', 'False', 'Unknown']
        default: 'True'
      csi_driver:
        description: As O(csi_driver).
        type: str
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
  csi_driver:
    description:
      - For O(gate=workload) with the DaemonSet of a CSI node plugin, the driver's name (for example
        V(csi.proxmox.sinextra.dev)). Each node the DaemonSet is eligible for must also list the driver in its
        C(CSINode) (C(spec.drivers)), which the kubelet writes only once the plugin registered and answered
        NodeGetInfo; a Ready pod alone does not mean the node can attach the driver's volumes.
    type: str
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
  - With O(gates), each live progress line starts with the title of the gate being waited on.
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

- name: Nodes, then the Cilium agents, then the operator - in order, in one module run
  proxtalos.cluster.k8s_gate:
    kubeconfig: "{{ proxtalos_artifacts_dir }}/kubeconfig"
    wait_sleep: 1
    gates:
      - title: ALL nodes registered
        gate: nodes
        node_state: registered
        names: "{{ groups['cluster'] }}"
        wait_timeout: 600
      - title: a Ready Cilium agent on every node
        gate: pods
        namespace: kube-system
        label_selectors: [k8s-app=cilium]
        every_node: true
      - title: Cilium operator available
        gate: workload
        kind: Deployment
        namespace: kube-system
        name: cilium-operator
        accept_unschedulable_replicas: true
  register: cilium_gates

- name: The operator's replica counts, from its gate's result
  ansible.builtin.debug:
    msg: "{{ (cilium_gates.results | selectattr('title', 'eq', 'Cilium operator available') | first).replicas }}"
"""

RETURN = r"""
gate:
  description: The gate kind that ran.
  type: str
  returned: with O(gate)
  sample: nodes
target:
  description: What the gate looked at, in words.
  type: str
  returned: with O(gate)
  sample: DaemonSet kube-system/cilium
passed:
  description: Whether the state was reached (the module fails when it is not); with O(gates), whether every gate passed.
  type: bool
  returned: always
summary:
  description: The last observation in one line; names what is missing and why.
  type: str
  returned: with O(gate)
  sample: "nodes Ready 6/6"
details:
  description:
    - Per-item details of the last observation, one dict per node, pod or object, each with at
      least C(name), C(ok) and C(reason) (null when ok). Gate kinds add fields such as
      C(pod), C(node), C(roles), C(generation), C(observed_generation), C(conditions), C(unschedulable) (a pod's
      scheduler message while it cannot be placed, else null); a node also has
      what its kubelet reports in status.nodeInfo, when it does (C(kubelet_version), C(os_image),
      C(kernel_version), C(container_runtime)), which the run report shows per node.
  type: list
  elements: dict
  returned: with O(gate)
  sample: [{"name": "w-2", "ok": false, "ready": false, "reason": "NetworkPluginNotReady", "roles": []}]
problems:
  description: Object-level findings of the last observation (rollout not started, count mismatch).
  type: list
  elements: str
  returned: with O(gate)
notes:
  description: Context that is not a failure (nodes not eligible for a DaemonSet and why, schedulable replica count).
  type: list
  elements: str
  returned: with O(gate)
replicas:
  description:
    - For a C(workload) gate on a Deployment or StatefulSet, the replica counts of the last observation;
      null for other gates.
    - C(required) is what the gate waited for (C(desired), or with I(accept_unschedulable_replicas) as many as
      can be scheduled now, at least one); C(schedulable) is that count of the scheduler's, null unless
      I(accept_unschedulable_replicas) is set.
  type: dict
  returned: with O(gate)
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
  description: On failure, the lines of the diagnosis (also in C(msg)); with O(gates), those of the gate that failed.
  type: list
  elements: str
  returned: failure
elapsed:
  description: Seconds spent waiting (with O(gates), by all the gates that ran).
  type: float
  returned: always
  sample: 12.4
attempts:
  description: Number of probes.
  type: int
  returned: with O(gate)
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
  returned: with O(gate)
  sample: [{"elapsed": 0.0, "attempt": 1, "summary": "nodes Ready 4/6: w-2 NetworkPluginNotReady"}]
results:
  description:
    - With O(gates), one dict per gate that ran, in order - the single form's result keys (C(gate), C(target),
      C(passed), C(summary), C(details), C(problems), C(notes), C(replicas), C(elapsed), C(attempts), C(progress),
      C(diagnosis) when it failed) plus C(title) and the gate's own C(api_requests).
  type: list
  elements: dict
  returned: with O(gates)
  sample: [{"title": "ALL nodes Ready", "gate": "nodes", "target": "nodes", "passed": true, "summary": "nodes Ready 6/6",
            "elapsed": 0.02, "attempts": 1, "replicas": null, "details": [], "problems": [], "notes": [], "progress": [],
            "api_requests": 1}]
gates:
  description:
    - With O(gates), the run report's gate records (proxtalos.cluster docs/report.md, convention 0), one per gate
      that ran, in order - C(name) (the title), C(ok), C(observation) (the summary), C(elapsed), C(attempts),
      C(target), C(diagnosis), and C(started_at) and C(ended_at), the wall clock (seconds since the epoch) when the
      gate began and finished.
  type: list
  elements: dict
  returned: with O(gates)
  sample: [{"name": "Kubernetes API ready", "ok": true, "observation": "API /readyz ok", "elapsed": 0.01, "attempts": 1,
            "target": "API /readyz", "diagnosis": []}]
not_run:
  description: With O(gates), the titles of the gates that did not run because an earlier one failed.
  type: list
  elements: str
  returned: with O(gates)
failed_gate:
  description: With O(gates), the title of the gate that failed.
  type: str
  returned: failure with O(gates)
report_facts_by_host:
  description:
    - With O(gates), what the C(nodes) gates observed of each Node, by Node name (the run report matches a Node
      to its inventory host) - C(kubernetes_ready), C(kubernetes_reason) when not Ready, and what the kubelet
      reports (C(kubelet_version), C(os_image), C(kernel_version), C(container_runtime)).
  type: dict
  returned: with O(gates)
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec
from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import gates
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import steps


def argument_spec():
    return _argspec.spec(
        _argspec.K8S_AUTH_SPEC, _argspec.WAIT_SPEC, gates.GATE_OPTION_SPEC,
        gate=dict(type='str', choices=list(gates.GATE_KINDS)),
        gates=dict(type='list', elements='dict'),
        progress_file=dict(type='path', fallback=(env_fallback, ['PROXTALOS_PROGRESS_FILE'])),
    )


def _result(gate_run, client, timeline, gate):
    result = steps.gate_result(gate, gate_run, timeline)
    result.update(changed=False, api_requests=client.requests if client is not None else 0)
    return result


def _check_no_gate_options(params):
    """With `gates`, the gate options belong in its items: one set at the top would be ignored."""
    for option, default in sorted(gates.OPTION_DEFAULTS.items()):
        if params.get(option) not in (default, None, []):
            raise _errors.ValidationError(option, 'with gates, set it in the gate item it belongs to, not at the top')


def run_one(module, timeout, interval):
    """The single form: one gate, the module's options."""
    gate = None
    client = None
    timeline = None
    try:
        gate = gates.build_gate(module.params)
        client = k8s_client.build_client(module.params, module=module, warn=module.warn)
        timeline = _wait.Progress(module.params.get('progress_file'), label='k8s_gate %s' % gate.target(), announce=True)
        gate_run = gates.run(gate, client, timeout, interval, progress=timeline)
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


def run_several(module, timeout, interval):
    """The `gates` form: every item validated first, then run in order on one client until one fails."""
    try:
        _check_no_gate_options(module.params)
        # an item's own wait_timeout counts unless nothing may wait (check mode, wait=false)
        gate_steps = steps.build_steps(module.params['gates'], timeout, probe_once=module.check_mode or not module.params['wait'])
    except _errors.ValidationError as exc:
        module.fail_json(msg=str(exc), field=exc.field, changed=False)
    try:
        client = k8s_client.build_client(module.params, module=module, warn=module.warn)
    except _errors.ProxtalosError as exc:
        module.fail_json(msg=str(exc), exception=traceback.format_exc(), changed=False, results=[], gates=[],
                         not_run=[step.title for step in gate_steps], **exc.details)
    outcomes = steps.run_steps(gate_steps, client, interval, progress_file=module.params.get('progress_file'))
    result = {
        'changed': False,
        'passed': all(outcome.passed for outcome in outcomes) and len(outcomes) == len(gate_steps),
        'results': [outcome.result for outcome in outcomes],
        'gates': [outcome.report_gate() for outcome in outcomes],
        'not_run': steps.not_run_titles(gate_steps, outcomes),
        'elapsed': round(sum(outcome.result['elapsed'] for outcome in outcomes), 3),
        'api_requests': client.requests,
        'report_facts_by_host': steps.node_facts(outcomes),
    }
    if result['passed']:
        module.exit_json(**result)
    failed = outcomes[-1]
    result.update(failed_gate=failed.step.title, diagnosis=failed.result.get('diagnosis', []))
    module.fail_json(msg=steps.failure_message(gate_steps, outcomes), **result)


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(),
        supports_check_mode=True,
        required_if=gates.GATE_REQUIRED_IF,
        required_one_of=[('gate', 'gates')],
        mutually_exclusive=[('gate', 'gates')] + _argspec.K8S_AUTH_CONSTRAINTS['mutually_exclusive'],
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    if not k8s_client.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib('kubernetes'), exception=str(k8s_client.KUBERNETES_IMPORT_ERROR))

    timeout, interval = _argspec.wait_params(module.params)
    if module.check_mode:
        timeout = 0.0
    if module.params['gates'] is not None:
        run_several(module, timeout, interval)
    else:
        run_one(module, timeout, interval)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
