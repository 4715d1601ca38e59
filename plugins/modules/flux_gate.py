#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: flux_gate
short_description: Wait until the Flux Kustomization tree is Ready, naming what blocks it
version_added: 0.1.0
description:
  - The gitops gate. Reads the Flux Kustomizations (C(kustomize.toolkit.fluxcd.io/v1)) of the cluster and their
    sources, orders them by C(spec.dependsOn) and waits until every one is Ready for its current generation (the
    flux CLI's test - Ready True with the condition's or the status' observedGeneration equal to the generation,
    not Reconciling) B(and) has applied its source's current revision (C(status.lastAppliedRevision) equal to the
    source's C(status.artifact.revision), as kustomize-controller requires of a dependency) B(and) has handled any
    reconcile request (C(reconcile.fluxcd.io/requestedAt) equal to C(status.lastHandledReconcileAt)) made of it or
    of its source.
  - A reconcile in progress (Ready Unknown C(Progressing), Reconciling True, which every reconcile of
    kustomize-controller starts with, the periodic one too) passes when the status' observedGeneration is the
    generation and the source's revision is already applied.
  - When one is not Ready, it says why in dependsOn terms. A B(blocker) is not Ready for a reason of its own (Flux's
    reason and message, such as C(HealthCheckFailed) or C(ArtifactFailed)), depends on a Kustomization that does
    not exist, or is in a dependency cycle; the Kustomizations B(blocked) behind it (C(DependencyNotReady)) are
    listed with it, and which one each waits on.
  - On failure the diagnosis also reads, for each blocker, its source (a GitRepository that is not Ready) and the
    Deployments, DaemonSets and StatefulSets it health-checks (C(spec.healthChecks), or its inventory with
    C(wait) true), naming the node and pod that are not Ready and why (for example a CSI node plugin in
    CrashLoopBackOff on one node).
  - A Stalled or suspended (C(spec.suspend)) Kustomization or a dependency cycle fails at once (waiting cannot fix it).
  - Read-only; never changed.
author:
  - proxtalos.cluster contributors (@proxtalos)
options:
  namespace:
    description: Only the Kustomizations of this namespace (all namespaces when not set).
    type: str
  names:
    description:
      - Kustomizations that must exist (C(name) in O(namespace), or C(namespace/name)); the gate waits for them to
        appear, as a parent Kustomization applies them.
    type: list
    elements: str
    default: []
  label_selectors:
    description: Only Kustomizations matching these label selectors (ANDed).
    type: list
    elements: str
    default: []
  progress_file:
    description:
      - Append a JSON line to this file whenever the observed state changes while waiting (see
        M(proxtalos.cluster.k8s_gate)). Uses E(PROXTALOS_PROGRESS_FILE) if not set, which the
        C(proxtalos.cluster.timeline) callback sets per task to print the progress live. Created with mode 0600.
    type: path
extends_documentation_fragment:
  - proxtalos.cluster._k8s_auth
  - proxtalos.cluster._wait
  - proxtalos.cluster._attributes
  - proxtalos.cluster._attributes.INFO_MODULE
attributes:
  check_mode:
    details:
      - Read-only. In check mode the gate probes once instead of waiting.
notes:
  - O(wait=false) or O(wait_timeout=0) probes once.
  - Connection errors, HTTP 429 and 5xx answers count as "not yet" while waiting.
seealso:
  - module: proxtalos.cluster.k8s_gate
  - module: proxtalos.cluster.flux_graph
"""

EXAMPLES = r"""
- name: Every Kustomization Ready, in dependsOn order
  proxtalos.cluster.flux_gate:
    kubeconfig: "{{ proxtalos_artifacts_dir }}/kubeconfig"
    namespace: flux-system
    names: [flux-system, sealed-secrets, proxmox-csi]
    wait_timeout: 900
"""

RETURN = r"""
passed:
  description: Whether every Kustomization was Ready (the module fails when not).
  type: bool
  returned: always
summary:
  description: The last observation in one line, naming the blockers and what waits behind them.
  type: str
  returned: always
  sample: "Kustomizations Ready 5/7: flux-system/proxmox-csi Ready=False HealthCheckFailed: health check failed after 5m0s:
    timeout waiting for: [DaemonSet/csi-proxmox/proxmox-csi-plugin-node status: 'InProgress'] (blocks flux-system/apps);
    waiting behind them: flux-system/apps"
kustomizations:
  description:
    - One entry per Kustomization, in dependsOn order, with C(name) (namespace/name), C(ok), C(reason), C(ready),
      C(ready_reason), C(message), C(tier), C(depends_on), C(missing_dependencies), C(generation),
      C(observed_generation), C(suspended), C(source), C(source_revision), C(last_applied_revision), C(note),
      C(role) (V(blocker), V(blocked) or null when Ready), C(blocked_by) and C(waits_on).
  type: list
  elements: dict
  returned: always
order:
  description: The Kustomization ids per dependsOn tier (tier 0 depends on nothing).
  type: list
  elements: list
  returned: always
blockers:
  description: The blockers of the last observation, each with C(name), C(reason), C(message) and C(blocks).
  type: list
  elements: dict
  returned: always
diagnosis:
  description: On failure, the lines of the diagnosis (also in C(msg)).
  type: list
  elements: str
  returned: failure
elapsed:
  description: Seconds spent waiting.
  type: float
  returned: always
attempts:
  description: Number of probes.
  type: int
  returned: always
api_requests:
  description: Number of HTTP requests made to the API server.
  type: int
  returned: always
progress:
  description: The wait's timeline, one entry each time the summary changed (C(elapsed), C(attempt), C(summary)).
  type: list
  elements: dict
  returned: always
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec
from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils import _flux
from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import gates


def argument_spec():
    return _argspec.spec(
        _argspec.K8S_AUTH_SPEC, _argspec.WAIT_SPEC,
        namespace=dict(type='str'),
        names=dict(type='list', elements='str', default=[]),
        label_selectors=dict(type='list', elements='str', default=[]),
        progress_file=dict(type='path', fallback=(env_fallback, ['PROXTALOS_PROGRESS_FILE'])),
    )


def _result(gate_run, client, timeline):
    verdict = gate_run.verdict if gate_run is not None else None
    items = verdict.items if verdict is not None else []
    tiers = {}
    for item in items:
        if item.get('tier') is not None:
            tiers.setdefault(item['tier'], []).append(item['name'])
    return {
        'changed': False,
        'passed': bool(gate_run is not None and gate_run.passed),
        'summary': gate_run.headline() if gate_run is not None else '',
        'kustomizations': items,
        'order': [tiers[number] for number in sorted(tiers)],
        'blockers': _flux.blockers(verdict) if verdict is not None else [],
        'elapsed': round(gate_run.result.elapsed, 3) if gate_run is not None else 0.0,
        'attempts': gate_run.result.attempts if gate_run is not None else 0,
        'api_requests': client.requests if client is not None else 0,
        'progress': timeline.timeline if timeline is not None else [],
    }


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True, **_argspec.K8S_AUTH_CONSTRAINTS,
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    if not k8s_client.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib('kubernetes'), exception=str(k8s_client.KUBERNETES_IMPORT_ERROR))
    timeout, interval = _argspec.wait_params(module.params)
    if module.check_mode:
        timeout = 0.0
    for name in module.params['names']:
        if not name or name.count('/') > 1 or name.startswith('/') or name.endswith('/'):
            module.fail_json(msg='names: %r is not NAME or NAMESPACE/NAME' % name, field='names', changed=False)
        if '/' not in name and not module.params['namespace']:
            module.fail_json(msg='names: %r has no namespace; give NAMESPACE/NAME or set namespace' % name, field='names', changed=False)
    client = timeline = gate_run = None
    try:
        params = dict(module.params)
        if params['namespace']:
            params['names'] = [n if '/' in n else '%s/%s' % (params['namespace'], n) for n in params['names']]
        gate = _flux.TreeGate(params)
        client = k8s_client.build_client(module.params, module=module, warn=module.warn)
        timeline = _wait.Progress(module.params.get('progress_file'), label='flux_gate %s' % gate.target(), announce=True)
        gate_run = gates.run(gate, client, timeout, interval, progress=timeline)
        timeline.finish(gate_run.result.observation, gate_run.result.elapsed, gate_run.result.attempts, gate_run.passed)
    except _errors.ValidationError as exc:
        module.fail_json(msg=str(exc), field=exc.field, changed=False)
    except _errors.ProxtalosError as exc:
        result = _result(gate_run, client, timeline)
        result.update(exc.details)
        module.fail_json(msg=str(exc), exception=traceback.format_exc(), **result)
    result = _result(gate_run, client, timeline)
    if gate_run.passed:
        module.exit_json(**result)
    message = gates.explain(gate_run, client)
    result['diagnosis'] = message.splitlines()[1:]
    module.fail_json(msg=message, **result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
