#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: k8s_manifests_sync
short_description: Sync the images of Talos' bootstrap manifests to a control plane's machine config
version_added: 0.1.0
description:
  - The last step of C(talosctl upgrade-k8s) for the bootstrap objects whose rendering follows the machine config's
    images - the C(kube-proxy) DaemonSet (C(cluster.proxy.image)) and the C(coredns) Deployment
    (C(cluster.coreDNS.image)), both in C(kube-system). Talos' manifest controller only creates these objects, so
    without this step they keep the images they were created with.
  - Each object is applied server-side as field manager C(talos), forcing conflicts, as C(talosctl upgrade-k8s)
    does. What is applied is what field manager C(talos) owns in the live object, with the container image the
    config names; the fields of other managers are left as they are. A dry run first decides whether it changed anything.
  - A disabled part (C(cluster.proxy.disabled), C(cluster.coreDNS.disabled)) or one without an image in the config is
    not synced. An object that does not exist is reported (its RV(objects) entry's action V(missing)), not created. An object
    of which field manager C(talos) owns nothing fails the module, naming it.
  - It does not read Talos' C(Manifests) resources (the COSI State API) as C(talosctl) does, so the other bootstrap
    objects (RBAC, the bootstrap token, inline manifests) are not synced, and nothing is pruned.
attributes:
  check_mode:
    support: full
    details:
      - Dry-run applies only; the task reports changed when the applies would change an object.
  diff_mode:
    support: none
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
  - proxtalos.cluster._k8s_auth
options:
  config_path:
    description:
      - A control plane's machine config file (as the talos_machines role writes it), read for the images.
    type: path
    required: true
"""

EXAMPLES = r"""
- name: Sync kube-proxy's and CoreDNS' images to the control plane's config
  proxtalos.cluster.k8s_manifests_sync:
    kubeconfig: artifacts/lab/kubeconfig
    config_path: artifacts/lab/lab-cp-1.yaml
  register: synced
"""

RETURN = r"""
objects:
  description:
    - One entry per synced object - C(kind), C(namespace), C(name), C(setting) (the config key of its image),
      C(image) (the config's), C(image_before) (the live object's, empty when missing) and C(action)
      (V(configured), V(unchanged) or V(missing)).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import manifests_sync
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import config as talos_config
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import files


def argument_spec():
    return _argspec.spec(_argspec.K8S_AUTH_SPEC, config_path=dict(type='path', required=True))


def read_documents(path):
    try:
        data = files.read_bytes(path)
    except (IOError, OSError) as exc:
        raise _errors.ValidationError('config_path', 'cannot read %s: %s' % (path, exc.strerror or exc))
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError:
        raise _errors.ValidationError('config_path', 'is not UTF-8 text')
    return talos_config.parse_machine_config(text, 'config_path')


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True,
                           mutually_exclusive=_argspec.K8S_AUTH_CONSTRAINTS['mutually_exclusive'])
    result = dict(changed=False, objects=[])
    try:
        wanted = manifests_sync.targets(read_documents(module.params['config_path']))
        if wanted:
            kube = k8s_client.build_client(module.params, module=module, warn=module.warn)
            result['objects'] = manifests_sync.sync(kube, wanted, check_mode=module.check_mode)
        result['changed'] = any(entry['action'] == 'configured' for entry in result['objects'])
        for entry in result['objects']:
            if entry['action'] == 'missing':
                module.warn('%s %s/%s does not exist: not synced (Talos creates it)'
                            % (entry['kind'], entry['namespace'], entry['name']))
    except _errors.ProxtalosError as exc:
        module.fail_json(msg=str(exc), **dict(exc.details, **result))
    module.exit_json(**result)


if __name__ == '__main__':
    main()
