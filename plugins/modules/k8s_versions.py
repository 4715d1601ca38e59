#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: k8s_versions
short_description: The Kubernetes versions a cluster runs, the upgrade path to a target, a wait on one node
version_added: 0.1.0
description:
  - Reads the version of every kubelet (the Nodes' C(status.nodeInfo.kubeletVersion)) and of every control-plane
    component (the image tag of the C(kube-apiserver), C(kube-controller-manager), C(kube-scheduler) and
    C(kube-proxy) pods in C(kube-system), labelled C(k8s-app=<component>), as C(talosctl upgrade-k8s) detects the
    lowest version) and returns them by node, with the lowest.
  - With O(check_path=true), fails before anything changes when O(target) is older than the lowest version the
    cluster runs (a downgrade) or more than one minor above it (a skipped minor); the message names both versions.
  - With O(node), waits until that Node reports a kubelet on O(target) and Ready (O(kubelet=true)), and until the
    O(components) pods on it run the image of O(target) and are Ready; on timeout it says what it saw last.
attributes:
  check_mode:
    support: full
    details:
      - Only reads; the wait runs in check mode too.
  diff_mode:
    support: none
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
  - proxtalos.cluster._k8s_auth
  - proxtalos.cluster._wait
options:
  target:
    description:
      - The Kubernetes version to upgrade to, like V(1.36.3) (a leading V(v) is accepted).
    type: str
    required: true
  check_path:
    description:
      - Fail when O(target) is a downgrade or skips a minor from the lowest version the cluster runs.
    type: bool
    default: true
  node:
    description:
      - A Node's name; wait until it runs O(target) (see O(kubelet) and O(components)).
    type: str
  kubelet:
    description:
      - With O(node), wait for its kubelet to report O(target) and the Node to be Ready.
    type: bool
    default: false
  components:
    description:
      - With O(node), wait for the pods of these components on it to run the image tag of O(target) and be Ready.
    type: list
    elements: str
    default: []
    choices: [kube-apiserver, kube-controller-manager, kube-scheduler]
"""

EXAMPLES = r"""
- name: Refuse a downgrade or a skipped minor
  proxtalos.cluster.k8s_versions:
    kubeconfig: artifacts/lab/kubeconfig
    target: 1.36.3
  register: versions

- name: Wait for lab-cp-1's kube-apiserver on 1.36.3
  proxtalos.cluster.k8s_versions:
    kubeconfig: artifacts/lab/kubeconfig
    target: 1.36.3
    check_path: false
    node: lab-cp-1
    components: [kube-apiserver]
    wait_timeout: 300
"""

RETURN = r"""
nodes:
  description:
    - Per Node name, C(kubelet) (its kubelet's version, like C(v1.35.4)) and C(components) (component name to the
      version of its pod's image tag, like C(v1.35.4)).
  returned: always
  type: dict
lowest:
  description: The lowest version the cluster runs (kubelets and components), without a leading C(v), like C(1.35.4).
  returned: always
  type: str
target:
  description: O(target) without a leading C(v).
  returned: always
  type: str
path:
  description: The upgrade path as C(<minor>-><minor>), like C(1.35->1.36).
  returned: always
  type: str
"""

import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _errors, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client

COMPONENTS = ('kube-apiserver', 'kube-controller-manager', 'kube-scheduler', 'kube-proxy')
_VERSION_RE = re.compile(r'^v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?$')


def argument_spec():
    return _argspec.spec(
        _argspec.K8S_AUTH_SPEC, _argspec.WAIT_SPEC,
        target=dict(type='str', required=True),
        check_path=dict(type='bool', default=True),
        node=dict(type='str'),
        kubelet=dict(type='bool', default=False),
        components=dict(type='list', elements='str', default=[], choices=list(COMPONENTS[:3])),
    )


def parse_version(text):
    """(major, minor, patch) of 'v1.36.3' or '1.36.3', else None."""
    match = _VERSION_RE.match((text or '').strip())
    return tuple(int(part) for part in match.groups()) if match else None


def image_version(image):
    """The tag of an image reference (digest dropped), with a leading v: '' when it has none."""
    name = (image or '').split('@', 1)[0]
    last = name.rsplit('/', 1)[-1]
    if ':' not in last:
        return ''
    tag = last.rsplit(':', 1)[1]
    return tag if tag.startswith('v') else 'v' + tag


def _ready(conditions):
    return any(c.get('type') == 'Ready' and c.get('status') == 'True' for c in conditions or ())


def observe(kube):
    """{node: {'kubelet': version, 'ready': bool, 'components': {component: {'version', 'ready', 'pod'}}}}."""
    nodes = {}
    for node in kube.list('v1', 'Node'):
        status = node.get('status') or {}
        nodes[node['metadata']['name']] = {'kubelet': (status.get('nodeInfo') or {}).get('kubeletVersion', ''),
                                           'ready': _ready(status.get('conditions')), 'components': {}}
    for pod in kube.list('v1', 'Pod', namespace='kube-system'):
        component = ((pod.get('metadata') or {}).get('labels') or {}).get('k8s-app')
        node = (pod.get('spec') or {}).get('nodeName')
        if component not in COMPONENTS or not node:
            continue
        image = next((c.get('image') for c in (pod.get('spec') or {}).get('containers') or () if c.get('name') == component), '')
        entry = nodes.setdefault(node, {'kubelet': '', 'ready': False, 'components': {}})
        entry['components'][component] = {'version': image_version(image), 'pod': pod['metadata']['name'],
                                          'ready': _ready((pod.get('status') or {}).get('conditions')),
                                          'deleting': bool(pod['metadata'].get('deletionTimestamp'))}
    return nodes


def lowest_version(nodes):
    versions = []
    for entry in nodes.values():
        versions.append(parse_version(entry['kubelet']))
        versions.extend(parse_version(c['version']) for c in entry['components'].values())
    versions = [v for v in versions if v is not None]
    return min(versions) if versions else None


def path_problem(lowest, target):
    """Why upgrading from lowest to target is refused, or None (upstream's upgrade paths: same minor or the next)."""
    def text(version):
        return '%d.%d.%d' % version
    if target < lowest:
        return ('kubernetes_version %s is older than %s, the lowest version the cluster runs: a downgrade is refused'
                % (text(target), text(lowest)))
    if target[0] != lowest[0] or target[1] > lowest[1] + 1:
        return ('kubernetes_version %s skips a minor from %s, the lowest version the cluster runs: upgrade one minor at '
                'a time (%d.%d first)' % (text(target), text(lowest), lowest[0], lowest[1] + 1))
    return None


def node_problem(nodes, node, want, kubelet, components):
    """What keeps `node` from running `want` (a 'v1.36.3' string) as asked, or None."""
    entry = nodes.get(node)
    if entry is None:
        return 'Node %s does not exist' % node
    problems = []
    if kubelet:
        if entry['kubelet'] != want:
            problems.append('kubelet reports %s' % (entry['kubelet'] or 'no version'))
        elif not entry['ready']:
            problems.append('kubelet on %s, the Node not Ready' % want)
    for component in components:
        pod = entry['components'].get(component)
        if pod is None:
            problems.append('no %s pod' % component)
        elif pod['version'] != want:
            problems.append('%s runs %s' % (pod['pod'], pod['version'] or 'an image without a tag'))
        elif pod['deleting'] or not pod['ready']:
            problems.append('%s on %s, not Ready' % (pod['pod'], want))
    return '; '.join(problems) or None


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True,
        mutually_exclusive=_argspec.K8S_AUTH_CONSTRAINTS['mutually_exclusive'],
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    params = module.params
    target = parse_version(params['target'])
    if target is None:
        module.fail_json(msg='target: must be a Kubernetes version like 1.36.3, got %r' % params['target'])
    want = 'v%d.%d.%d' % target
    result = dict(changed=False, nodes={}, lowest='', target=want[1:], path='')
    try:
        kube = k8s_client.build_client(params, module=module, warn=module.warn)
        timeout, interval = _argspec.wait_params(params)
        deadline = _wait.Deadline(timeout)
        kube.deadline = deadline
        nodes = observe(kube)
        lowest = lowest_version(nodes)
        result['nodes'] = dict((name, {'kubelet': e['kubelet'],
                                       'components': dict((c, p['version']) for c, p in e['components'].items())})
                               for name, e in nodes.items())
        if lowest is not None:
            result['lowest'] = '%d.%d.%d' % lowest
            result['path'] = '%d.%d->%d.%d' % (lowest[0], lowest[1], target[0], target[1])
        if params['check_path']:
            if lowest is None:
                module.fail_json(msg='no kubelet or control-plane component reports a version: is this a Talos cluster?',
                                 **result)
            problem = path_problem(lowest, target)
            if problem:
                module.fail_json(msg=problem, **result)
        if params['node']:
            name = params['node']

            def probe():
                problem = node_problem(observe(kube), name, want, params['kubelet'], params['components'])
                return problem is None, problem or 'on %s' % want
            waited = _wait.wait_for(probe, deadline.remaining(), interval=interval, transient=(_errors.TransientApiError,))
            if not waited.ok:
                raise _errors.WaitTimeout('Node %s: not on Kubernetes %s after %gs; last seen: %s'
                                          % (name, want, deadline.timeout, waited.observation), waited, node=name)
    except _errors.ProxtalosError as exc:
        module.fail_json(msg=str(exc), **dict(exc.details, **result))
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
