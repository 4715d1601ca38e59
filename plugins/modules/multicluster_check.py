#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: multicluster_check
short_description: Check the values of several clusters against each other before any of them is built
version_added: 0.1.0
description:
  - Pure check on the controller, no API call. Fails with every problem found; each names the cluster (and the
    inventory it comes from), the field, the value and the conflicting value.
  - Names unique and valid as Cilium cluster names; Cilium C(cluster.id) an integer 1-255 and unique.
  - Pod and service CIDRs valid, and no two of them overlap, across clusters or within one.
  - Cilium's C(ipv4NativeRoutingCIDR) equals the cluster's pod subnet (the Talos C(podSubnets)); native routing
    without it is an error.
  - Every requested LoadBalancer IP (declared, or found as a C(lbipam.cilium.io/ips) / C(io.cilium/lb-ipam-ips)
    annotation or C(spec.loadBalancerIP) of a Service in the cluster's manifests) is inside an enabled
    C(CiliumLoadBalancerIPPool) of that cluster, selected by the pool's C(serviceSelector) when it has
    C(matchLabels); pools do not overlap across clusters, within a cluster, or the cluster's own CIDRs.
  - The preflight role runs it over the inventory's own cluster and the inventories listed in
    C(preflight_peer_inventories) (read with the P(proxtalos.cluster.inventory_vars#lookup) lookup).
author:
  - proxtalos.cluster contributors (@proxtalos)
options:
  clusters:
    description: One entry per cluster.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: The cluster name (C(cluster_name)).
        type: str
      inventory:
        description: Where the values come from (an inventory path), only used in messages.
        type: str
      id:
        description: The Cilium cluster id (C(cluster_id)); an integer 1-255.
        type: raw
      pod_cidr:
        description: The pod subnet (C(cluster_pod_cidr)), as given to Talos C(cluster.network.podSubnets).
        type: str
      service_cidr:
        description: The service subnet (C(cluster_service_cidr)).
        type: str
      cilium_values:
        description:
          - The Cilium Helm values of the cluster. Read are C(ipv4NativeRoutingCIDR), C(routingMode) (or the older
            C(tunnel=disabled)), C(cluster.id) and C(cluster.name) (which must then match O(clusters[].id) and
            O(clusters[].name)).
        type: dict
        default: {}
      lb_pools:
        description:
          - LoadBalancer IP pools declared in the inventory. Each is a CIDR text, a C(start-stop) text, or a dict
            with C(name), C(blocks) (a list of C({cidr}) or C({start, stop}), as a C(CiliumLoadBalancerIPPool)'s
            C(spec.blocks)), C(disabled) and C(service_selector).
        type: list
        elements: raw
        default: []
      lb_ips:
        description:
          - LoadBalancer IPs requested outside the manifests, each a dict with C(service) (C(namespace/name)),
            C(ips) (a list, or a comma-separated text) and optionally C(labels).
        type: list
        elements: dict
        default: []
      manifest_paths:
        description:
          - Files or folders of the cluster's manifests (its GitOps checkout). Every C(*.yaml)/C(*.yml) is read;
            C(CiliumLoadBalancerIPPool) objects add pools and Services with a requested IP add requests.
            Files that are not YAML (Helm templates) are skipped.
        type: list
        elements: path
        default: []
extends_documentation_fragment:
  - proxtalos.cluster._attributes
  - proxtalos.cluster._attributes.INFO_MODULE
notes:
  - The result is never C(changed).
  - A C(serviceSelector) with C(matchExpressions) is not evaluated; an IP inside such a pool counts as selected.
seealso:
  - module: proxtalos.cluster.proxmox_preflight
"""

EXAMPLES = r"""
- name: Check infra and apps together
  proxtalos.cluster.multicluster_check:
    clusters:
      - name: infra
        inventory: inventories/infra
        id: 1
        pod_cidr: 10.100.0.0/16
        service_cidr: 10.101.0.0/16
        cilium_values: {routingMode: native, ipv4NativeRoutingCIDR: 10.100.0.0/16}
        lb_pools: [10.20.0.200/28]
        manifest_paths: [gitops/clusters/infra]
      - name: apps
        inventory: inventories/apps
        id: 2
        pod_cidr: 10.110.0.0/16
        service_cidr: 10.111.0.0/16
        lb_pools:
          - name: apps-pool
            blocks: [{start: 10.30.0.200, stop: 10.30.0.231}]
        lb_ips:
          - service: ingress/traefik
            ips: [10.30.0.201]
"""

RETURN = r"""
clusters:
  description: What was checked per cluster, in the input order.
  type: list
  elements: dict
  returned: always
  sample: [{"name": "infra", "inventory": "inventories/infra", "id": 1, "pod_cidr": "10.100.0.0/16",
            "service_cidr": "10.101.0.0/16", "routing_mode": "native", "native_routing_cidr": "10.100.0.0/16",
            "lb_pools": [{"name": "cluster_lb_pool", "blocks": ["10.20.0.200/28"], "disabled": false, "source": null}],
            "lb_ips": []}]
problems:
  description: Every problem, with C(cluster), C(check) (name, id, cidr, native_routing, lb_pool, lb_ip), C(field), C(value),
    C(conflict) (the other value, or null) and C(message).
  type: list
  elements: dict
  returned: always
  sample: [{"cluster": "apps", "check": "id", "field": "cluster_id", "value": 1, "conflict": 1,
            "message": "apps (inventories/apps): cluster_id 1 is also the id of cluster infra (inventories/infra)
                        (Cilium cluster.id must be unique across clusters)"}]
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _multicluster
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError


def argument_spec():
    return dict(
        clusters=dict(type='list', elements='dict', required=True, options=dict(
            name=dict(type='str'),
            inventory=dict(type='str'),
            id=dict(type='raw'),
            pod_cidr=dict(type='str'),
            service_cidr=dict(type='str'),
            cilium_values=dict(type='dict', default={}),
            lb_pools=dict(type='list', elements='raw', default=[]),
            lb_ips=dict(type='list', elements='dict', default=[]),
            manifest_paths=dict(type='list', elements='path', default=[]),
        )),
    )


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True,
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    if not _multicluster.HAS_YAML:
        module.fail_json(msg=missing_required_lib('PyYAML'), exception=str(_multicluster.YAML_IMPORT_ERROR))
    try:
        clusters, problems = _multicluster.check(module.params['clusters'])
    except ValidationError as exc:
        module.fail_json(msg=str(exc), field=exc.field, changed=False)
    result = dict(changed=False, clusters=[_multicluster.summary(cluster) for cluster in clusters],
                  problems=[dict(problem) for problem in problems])
    if problems:
        module.fail_json(msg='%d multi-cluster problem(s):\n%s' % (len(problems), '\n'.join(
            '- %s' % problem['message'] for problem in problems)), **result)
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
