#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: k8s_manifests_sync
short_description: Sync Talos' bootstrap manifests to the cluster, as talosctl upgrade-k8s ends
version_added: 0.1.0
description:
  - The last step of C(talosctl upgrade-k8s). Reads the bootstrap manifests Talos renders from a control plane's
    machine config - its C(Manifests.kubernetes.talos.dev) resources in namespace C(controlplane), over the COSI
    State API of the Talos node O(node) - and applies every object they hold to the cluster.
  - Each object is applied server-side as field manager C(talos), forcing conflicts, with the annotation
    C(config.k8s.io/owning-inventory=talos-bootstrap-manifests-inventory), cluster definitions (CRDs, Namespaces,
    ClusterRoles) first, then kinds ending in C(Class), then the rest, as C(talosctl upgrade-k8s) does. Talos' own
    manifest controller only creates missing objects, so without this step a new config's kube-proxy image never
    reaches the running DaemonSet.
  - A dry run of each object decides whether it changes; only changing objects are applied. The first object the
    API refuses fails the module, naming the object and the API's reason.
  - Not done as upstream does - the inventory ConfigMap is not written and nothing is pruned; an object whose
    immutable fields changed is not recreated.
  - The result names the objects and what happened to each; it never holds their content (the manifests include
    the bootstrap token Secret).
attributes:
  check_mode:
    support: full
    details:
      - Dry-run applies only; the task reports changed when an object would change.
  diff_mode:
    support: none
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
  - proxtalos.cluster._k8s_auth
options:
  node:
    description:
      - The address of the control plane whose manifests are read (its Talos API).
    type: str
    required: true
  talosconfig:
    description:
      - The talosconfig file whose client certificate reaches O(node) over mutual TLS.
    type: path
    required: true
  talos_context:
    description:
      - The talosconfig context to use; its current context when not set.
    type: str
  talos_port:
    description:
      - The Talos API port of O(node).
    type: int
    default: 50000
  talos_timeout:
    description:
      - Seconds to wait for the Talos API's answer.
    type: float
    default: 15.0
"""

EXAMPLES = r"""
- name: Sync the bootstrap manifests of lab-cp-1's config to the cluster
  proxtalos.cluster.k8s_manifests_sync:
    kubeconfig: artifacts/lab/kubeconfig
    talosconfig: artifacts/lab/talosconfig
    node: 10.0.0.11
  register: synced
"""

RETURN = r"""
manifests:
  description: The ids of the Manifest resources read, in order (like C(10-kube-proxy), C(99-cilium)).
  returned: always
  type: list
  elements: str
objects:
  description:
    - One entry per object, in the order applied - C(kind), C(namespace) (empty for a cluster-scoped object),
      C(name) and C(action) (V(created), V(configured) or V(unchanged)).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import manifests_sync
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import session, talosyaml


def argument_spec():
    return _argspec.spec(
        _argspec.K8S_AUTH_SPEC,
        node=dict(type='str', required=True),
        talosconfig=dict(type='path', required=True),
        talos_context=dict(type='str'),
        talos_port=dict(type='int', default=50000),
        talos_timeout=dict(type='float', default=15.0),
    )


def read_manifests(params, module=None):
    """[{'id', 'yaml_spec', ...}] of the node's Manifest resources (COSI State List)."""
    credentials = session.load_credentials({'talosconfig': params['talosconfig'], 'talosconfig_content': None,
                                            'context': params['talos_context']}, module=module)
    node = session.NodeSession(params['node'], port=params['talos_port'], api_timeout=params['talos_timeout'],
                               credentials=credentials, talosconfig_path=params['talosconfig'])
    return node.call('cosi_list', manifests_sync.MANIFEST_NAMESPACE, manifests_sync.MANIFEST_TYPE)


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True,
        mutually_exclusive=_argspec.K8S_AUTH_CONSTRAINTS['mutually_exclusive'],
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    result = dict(changed=False, manifests=[], objects=[])
    missing = session.missing_libraries()
    if missing:
        module.fail_json(msg=missing_required_lib(missing[0][0]), exception=missing[0][1])
    try:
        resources = read_manifests(module.params, module=module)
        result['manifests'] = sorted(resource['id'] for resource in resources)
        objects = manifests_sync.objects_from_resources(resources, lambda text: talosyaml.load(text, 'yaml_spec'))
        if not objects:
            raise _errors.ApiError('talos node %s lists no bootstrap manifests (%s in namespace %s): is it a control plane?'
                                   % (module.params['node'], manifests_sync.MANIFEST_TYPE, manifests_sync.MANIFEST_NAMESPACE))
        kube = k8s_client.build_client(module.params, module=module, warn=module.warn)
        manifests_sync.sync(kube, objects, check_mode=module.check_mode, done=result['objects'])
        result['changed'] = any(entry['action'] != 'unchanged' for entry in result['objects'])
    except _errors.ProxtalosError as exc:
        result['changed'] = any(entry['action'] != 'unchanged' for entry in result['objects']) and not module.check_mode
        module.fail_json(msg=str(exc), **dict(exc.details, **result))
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
