#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: flux_graph
short_description: Lint the Flux dependency graph of a GitOps repository
version_added: 0.1.0
description:
  - Reads the YAML files of a GitOps repository checkout (multi-document files; other kinds, kustomize patch
    files, partial objects and unparsable templates are skipped and listed) and finds the Flux Kustomizations
    (C(kustomize.toolkit.fluxcd.io)) and HelmReleases (C(helm.toolkit.fluxcd.io)).
  - Reads the tree as Flux builds it. YAML as Go's reader takes it (an anchor defined again, C(=) as a plain key, a
    custom tag such as C(!reference) read as the value it tags). Without a C(kustomization.yaml), a directory is taken
    as kustomize-controller generates one - every YAML file below, except a sub-directory with its own kustomization
    file, which is taken whole through it. An object's namespace is the one the Kustomization that applies it gives
    it - its C(spec.targetNamespace), else the outermost C(namespace) of the kustomize inclusion chain from its
    C(spec.path), else its own. Names, namespaces and C(dependsOn) are substituted with that Kustomization's
    C(postBuild.substitute) and the C(substituteFrom) ConfigMaps and Secrets the tree holds; a reference left with a
    C(${VAR}) only the cluster can resolve is a warning, never a dangling reference.
  - Reports the C(dependsOn) tiers (longest-path levels), cycles (each with its members in order), dangling
    C(dependsOn) references, missing critical dependencies from rules, counts per kind, and a Mermaid graph.
  - Critical dependencies are checked on the effective order, which includes the C(dependsOn) of the
    Kustomization whose C(spec.path) applies an object, and are satisfied also by a release the bootstrap
    installs before Flux (O(bootstrap_releases), O(bootstrap_helmfile)).
  - Cross-checks the bootstrap releases' helmfile-style C(needs) against Flux's order and reports contradictions
    (the bootstrap installs B before A, but in Flux B depends on A), orders Flux does not keep, and needs that
    name no bootstrap release.
  - With O(bootstrap_rendered), also tells whether the tree needs the bootstrap releases installed before Flux
    applies it (RV(tree_needs_bootstrap)) - an object of an API group a release's CRD or APIService serves, the same
    object as one a release installs, a HelmRelease that takes over a release, an admission webhook, admission policy or
    webhook-registering role of a release that may see the tree's objects, a critical-dependency rule only a release
    satisfies, a release Flux's own controllers may need (DNS, networking, image pulls). What cannot be read ahead
    counts as needing them (HelmReleases' charts, Kustomizations of other sources, of another GitRepository than
    O(bootstrap_source) or of paths not in the checkout, files that are not YAML, remote kustomize resources, API groups
    nothing known defines). These findings describe an ordering choice, not a defect - they are never warnings or errors.
  - Read-only. Fails when a finding listed in O(fail_on) is present (cycles and dangling references by default);
    every other finding is returned and given as a warning.
  - The same analysis runs without Ansible, for CI, as
    C(python -m ansible_collections.proxtalos.cluster.plugins.module_utils._flux_graph REPO).
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes.INFO_MODULE
options:
  path:
    description: Root directory of the GitOps repository checkout.
    type: path
    required: true
  exclude:
    description:
      - Globs of repository-relative paths to leave out (for example V(clusters/staging/*) when the repository holds
        several clusters). Hidden directories (C(.git), C(.github)) are always left out.
    type: list
    elements: str
    default: []
  default_namespace:
    description:
      - Namespace of a Flux object that has none, is applied by no Kustomization of the tree that gives it one, and is not
        under a C(kustomization.yaml) with a C(namespace).
    type: str
    default: flux-system
  rules:
    description:
      - Critical-dependency rules. Each has C(subject) and C(requires) (lists of name globs), optionally C(name),
        C(reason) and C(exclude) (globs of subjects to leave out). A node matching C(subject) must come after a node
        matching C(requires). Nodes matching C(requires) are not subjects of the same rule.
      - Added to the built-in rules unless O(use_default_rules=false).
    type: list
    elements: dict
    default: []
  use_default_rules:
    description:
      - Apply the built-in rules - proxmox-csi needs proxmox-ccm and coredns; cert-manager and monitoring need
        coredns; everything except C(flux-system) and CRD/namespace bundles needs the CNI (cilium, calico, ...).
    type: bool
    default: true
  bootstrap_releases:
    description:
      - Releases installed before Flux, each with C(name), C(namespace) and C(needs) (a list of
        C(namespace/name), as in helmfile).
    type: list
    elements: dict
  bootstrap_helmfile:
    description:
      - A plain-YAML helmfile (or a YAML list of releases) to read O(bootstrap_releases) from.
      - Mutually exclusive with O(bootstrap_releases).
    type: path
  bootstrap_rendered:
    description:
      - What the bootstrap releases install, as the fact C(bootstrap_apps_rendered) of role
        P(proxtalos.cluster.bootstrap_apps#role) holds it - a mapping of C(namespace/name) of each release to a mapping
        with lists C(crds) and C(objects) of Kubernetes documents.
      - When given, the result has RV(tree_needs_bootstrap). An empty mapping means no releases, and no findings.
      - The release names also count for the critical-dependency rules (O(rules), O(use_default_rules)), as do
        O(bootstrap_releases) and O(bootstrap_helmfile).
    type: dict
  bootstrap_source:
    description:
      - The GitRepository Flux syncs from, as C(namespace/name) (for example V(flux-system/flux-system)).
      - When given, a Flux Kustomization whose C(sourceRef) is another GitRepository (its namespace defaulting to the
        Kustomization's) counts in RV(tree_needs_bootstrap) as C(unreadable_source) - its objects are not in this checkout.
    type: str
  tree_objects:
    description:
      - Objects the run adds to the tree before Flux fetches it (for example the SealedSecrets the flux stage seals
        into the repository). They count in RV(tree_needs_bootstrap) like the tree's own objects; one already in the
        tree (same API group, kind, namespace and name) counts once.
      - Each has C(apiVersion), C(kind) and C(metadata) (C(name), and C(namespace) when namespaced), and optionally
        C(file), the repository-relative path it will be written to.
    type: list
    elements: dict
  fail_on:
    description: Findings that fail the task; the others are warnings.
    type: list
    elements: str
    choices: [cycles, dangling, missing_critical, bootstrap_contradictions]
    default: [cycles, dangling]
  warn:
    description:
      - Give the findings that do not fail the task as Ansible warnings. V(false) leaves them in the result only (for a
        second read of a tree that an earlier task already linted, as the flux role's hand-off decision does).
    type: bool
    default: true
seealso:
  - name: Flux Kustomization dependencies
    description: How kustomize-controller orders Kustomizations with dependsOn.
    link: https://fluxcd.io/flux/components/kustomize/kustomizations/#dependencies
"""

EXAMPLES = r"""
- name: Lint the GitOps repository before handing the cluster to Flux
  proxtalos.cluster.flux_graph:
    path: "{{ gitops_repo_dir }}"
    bootstrap_releases: "{{ bootstrap_apps_releases }}"
  register: flux_graph

- name: Whether Flux may get the repository before the bootstrap releases are installed
  proxtalos.cluster.flux_graph:
    path: "{{ gitops_repo_dir }}"
    bootstrap_rendered: "{{ bootstrap_apps_rendered }}"
  register: flux_graph_needs

- name: Say why the releases come first
  ansible.builtin.debug:
    msg: "{{ flux_graph_needs.tree_needs_bootstrap | map(attribute='message') | list }}"
  when: flux_graph_needs.tree_needs_bootstrap | length > 0

- name: Show the order Flux will follow
  ansible.builtin.debug:
    msg: "{{ flux_graph.summary_table }}"
"""

RETURN = r"""
files_scanned:
  description: How many YAML files of the repository were read.
  returned: always
  type: int
  sample: 48
nodes:
  description: Every Kustomization and HelmRelease found, with its file, resolved dependsOn ids, tier and the
    Kustomizations whose C(spec.path) applies it (C(applied_by)).
  returned: always
  type: list
  elements: dict
tiers:
  description: Node ids per tier (index = tier); tier 0 depends on nothing.
  returned: always
  type: list
  elements: list
untiered:
  description: Node ids in a cycle or depending on one.
  returned: always
  type: list
  elements: str
cycles:
  description: Each cycle, with C(members), C(path) (ids in dependsOn order, first repeated at the end) and C(message).
  returned: always
  type: list
  elements: dict
dangling:
  description: dependsOn references that name nothing in the repository (C(node), C(file), C(ref), C(message)).
  returned: always
  type: list
  elements: dict
missing_critical:
  description: Nodes not ordered after what a rule says they need (C(rule), C(node), C(file), C(requires), C(message)).
  returned: always
  type: list
  elements: dict
components_not_found:
  description: Rules whose required component is neither in the repository nor a bootstrap release.
  returned: always
  type: list
  elements: dict
bootstrap_findings:
  description: Bootstrap cross-check findings, C(type) one of C(reversed), C(order_not_kept), C(unknown_need).
  returned: always
  type: list
  elements: dict
bootstrap_contradictions:
  description: The C(reversed) bootstrap findings.
  returned: always
  type: list
  elements: dict
counts:
  description: Per kind, C(total), C(with_depends_on), C(wait_true), C(with_health_checks) (the last two only for
    Kustomizations, null for HelmReleases).
  returned: always
  type: dict
  sample: {Kustomization: {total: 6, with_depends_on: 4, wait_true: 4, with_health_checks: 1},
           HelmRelease: {total: 5, with_depends_on: 0, wait_true: null, with_health_checks: null}}
summary_table:
  description: RV(counts) as a Markdown table.
  returned: always
  type: str
mermaid:
  description: The graph as a Mermaid flowchart, in apply order (dependency --> dependant).
  returned: always
  type: str
skipped_documents:
  description:
    - Flux-looking documents that were not taken as objects, with the reason (patch files, partial objects).
    - Named so because Ansible reads a result key C(skipped) as the task's own status.
  returned: always
  type: list
  elements: dict
parse_errors:
  description: Files that are not YAML (for example Helm chart templates), with the error.
  returned: always
  type: list
  elements: dict
duplicates:
  description: Objects defined more than once; the first definition is used.
  returned: always
  type: list
  elements: dict
errors:
  description: Messages of the findings that fail the task (see O(fail_on)).
  returned: always
  type: list
  elements: str
tree_needs_bootstrap:
  description:
    - What in the tree needs the bootstrap releases installed before Flux applies it; empty when nothing does.
    - Absent when O(bootstrap_rendered) is not given.
    - Each finding has C(release) (C(namespace/name), or null when no single release is concerned), C(object)
      (C(Kind namespace/name), C(Kind name) when cluster-scoped, or null), C(file) (repository-relative, or null),
      C(reason) and C(message) (one sentence naming the object, its file and the release).
    - C(reason) is one of C(uses_crd) (an object of a group a release's CRD defines), C(uses_api_service) (of a group
      a release's APIService serves), C(same_object) (an object a release installs too; Namespaces do not count),
      C(takes_over_release) (a HelmRelease whose Helm release is a bootstrap release), C(unreadable_helmrelease) (any
      other HelmRelease - its chart cannot be read ahead), C(unreadable_source) (a Kustomization of another source, of
      another GitRepository than O(bootstrap_source), or of a path not in the checkout, a file that is not YAML, remote
      resources or helmCharts in a kustomization.yaml),
      C(webhook) (a release's admission webhook whose rules reach beyond the release's own CRD groups, its admission
      policies or policy bindings, or a ClusterRole or Role of it that may create, update or patch webhook
      configurations), C(critical_rule) (a subject of a critical-dependency rule whose C(requires) only a bootstrap
      release satisfies), C(cluster_infrastructure) (a release Flux's own controllers may need - a workload in
      C(kube-system), a Service C(kube-dns), a DaemonSet on the host network or with host ports), C(unknown_api) (an
      object of an API group that no built-in API, Flux, CRD in the tree or release defines; one per group and kind).
  returned: when O(bootstrap_rendered) is given
  type: list
  elements: dict
  sample:
    - release: widgets-system/widget-operator
      object: HelmRelease widgets-system/widget-operator
      file: clusters/lab/widget-operator.yaml
      reason: takes_over_release
      message: >-
        HelmRelease widgets-system/widget-operator (clusters/lab/widget-operator.yaml) manages Helm release
        widget-operator in namespace widgets-system, which is bootstrap release widgets-system/widget-operator:
        Flux would take it over, so it must come after that release
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _flux_graph
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError

REPORT_KEYS = ('files_scanned', 'nodes', 'tiers', 'untiered', 'cycles', 'dangling', 'missing_critical', 'components_not_found',
               'bootstrap_findings', 'bootstrap_contradictions', 'counts', 'summary_table', 'mermaid',
               'parse_errors', 'duplicates', 'errors')


def argument_spec():
    return dict(
        path=dict(type='path', required=True),
        exclude=dict(type='list', elements='str', default=[]),
        default_namespace=dict(type='str', default=_flux_graph.DEFAULT_NAMESPACE),
        rules=dict(type='list', elements='dict', default=[]),
        use_default_rules=dict(type='bool', default=True),
        bootstrap_releases=dict(type='list', elements='dict'),
        bootstrap_helmfile=dict(type='path'),
        bootstrap_rendered=dict(type='dict'),
        bootstrap_source=dict(type='str'),
        tree_objects=dict(type='list', elements='dict'),
        fail_on=dict(type='list', elements='str', choices=list(_flux_graph.FINDINGS), default=list(_flux_graph.DEFAULT_FAIL_ON)),
        warn=dict(type='bool', default=True),
    )


def graph_report(params):
    """The report for the module parameters (raises ValidationError on bad input)."""
    own_rules = _flux_graph.check_rules(params['rules'])   # errors name the user's rules[i]
    rules = (list(_flux_graph.DEFAULT_RULES) if params['use_default_rules'] else []) + own_rules
    bootstrap = params['bootstrap_releases']
    if params['bootstrap_helmfile']:
        bootstrap = _flux_graph.releases_from_file(params['bootstrap_helmfile'])
    return _flux_graph.analyze_path(params['path'], rules, bootstrap, params['fail_on'], params['exclude'],
                                    params['default_namespace'], params['bootstrap_rendered'], params['bootstrap_source'],
                                    params['tree_objects'])


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), mutually_exclusive=[('bootstrap_releases', 'bootstrap_helmfile')],
        supports_check_mode=True,
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    if not _flux_graph.HAS_YAML:
        module.fail_json(msg=missing_required_lib('PyYAML'), exception=str(_flux_graph.YAML_IMPORT_ERROR))
    try:
        report = graph_report(module.params)
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **exc.details)
    except (OSError, IOError) as exc:
        module.fail_json(msg='cannot read the repository: %s' % exc, exception=traceback.format_exc())

    result = dict((key, report[key]) for key in REPORT_KEYS)
    result['skipped_documents'] = report['skipped']
    if 'tree_needs_bootstrap' in report:
        result['tree_needs_bootstrap'] = report['tree_needs_bootstrap']
    for warning in report['warnings'] if module.params['warn'] else ():
        module.warn(warning)
    if report['failed']:
        module.fail_json(msg='Flux dependency graph of %s: %d problem(s): %s' % (module.params['path'], len(report['errors']),
                                                                                 '; '.join(report['errors'])), **result)
    module.exit_json(changed=False, **result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
