#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: talos_upgrade
short_description: Upgrade one Talos node to an installer image and wait until it is back on that version
version_added: 0.1.0
description:
  - Reads the node's Talos version; when it is O(version) already, does nothing (C(ok)).
  - Otherwise asks the node to upgrade (C(MachineService/Upgrade), like C(talosctl upgrade --image)), and waits until
    it answers over mutual TLS from a new boot with O(version), with O(healthy_services) Running and healthy, and,
    with O(etcd_members), until its etcd lists that many members, all voting and started.
  - A node that does not come back in time fails the task, naming the node and what was seen last.
attributes:
  check_mode:
    support: full
    details:
      - Reads the version and reports whether the node would be upgraded; does not upgrade.
  diff_mode:
    support: none
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
  - proxtalos.cluster._talos_auth
  - proxtalos.cluster._wait
options:
  node:
    description:
      - Address of the node.
    type: str
    required: true
  label:
    description:
      - The node's inventory name, for messages.
    type: str
  image:
    description:
      - The installer image, for example C(factory.talos.dev/installer/<schematic>:v1.13.9).
    type: str
    required: true
  version:
    description:
      - The Talos version the image installs (the node's Version tag afterwards). Default - the image's tag.
    type: str
  preserve:
    description:
      - Talos' C(preserve) flag. On a control plane it also skips Talos' own etcd checks before the upgrade.
    type: bool
    default: false
  stage:
    description:
      - Stage the upgrade - the node reboots, installs on that boot, and reboots again into the new version.
    type: bool
    default: false
  force:
    description:
      - Talos' C(force) flag - skips Talos' own etcd checks on a control plane.
    type: bool
    default: false
  healthy_services:
    description:
      - Services that must be Running and healthy again for the node to count as back.
    type: list
    elements: str
    default: [apid, kubelet]
  etcd_members:
    description:
      - For a control plane - how many etcd members its member list must show, all voting and started (named),
        for the node to count as back. 0 skips this check.
    type: int
    default: 0
notes:
  - The node is not drained here; drain it before (the proxtalos.cluster.upgrade_talos playbook does).
"""

EXAMPLES = r"""
- name: Upgrade lab-cp-1 to v1.13.9
  proxtalos.cluster.talos_upgrade:
    node: 10.5.0.11
    label: lab-cp-1
    image: factory.talos.dev/installer/ce4c9805...:v1.13.9
    healthy_services: [apid, etcd, kubelet]
    etcd_members: 3
    talosconfig: artifacts/lab/talosconfig
    wait_timeout: 900
"""

RETURN = r"""
version_before:
  description: The node's Talos version before.
  returned: always
  type: str
version_after:
  description: Its version at the end (in check mode, the one before).
  returned: always
  type: str
actor_id:
  description: Talos' id of the upgrade action; empty when nothing was done.
  returned: always
  type: str
"""

import re

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import health, session


def argument_spec():
    return _argspec.spec(
        _argspec.TALOS_AUTH_SPEC, _argspec.WAIT_SPEC,
        node=dict(type='str', required=True),
        label=dict(type='str'),
        image=dict(type='str', required=True),
        version=dict(type='str'),
        preserve=dict(type='bool', default=False),
        stage=dict(type='bool', default=False),
        force=dict(type='bool', default=False),
        healthy_services=dict(type='list', elements='str', default=['apid', 'kubelet']),
        etcd_members=dict(type='int', default=0),
    )


def target_version(params):
    if params['version']:
        return params['version']
    match = re.search(r':(v\d+\.\d+\.\d+[0-9A-Za-z.+-]*)$', params['image'])
    if not match:
        raise ValidationError('version', 'is required: the image %r has no Talos version as its tag' % params['image'])
    return match.group(1)


def observe(node_session, required, etcd_members):
    """(version, boot marker, [problems]) as the node answers now over mTLS."""
    version = node_session.call('version')['tag']
    services = node_session.call('service_list')
    problems = [health.describe_service_problem(problem) for problem in health.service_problems(services, required)]
    if etcd_members and not problems:
        members = node_session.call('etcd_member_list')
        pending = [m['hostname'] or '%016x' % m['id'] for m in members if m['is_learner'] or not m['hostname']]
        if len(members) != etcd_members or pending:
            waiting = (', not yet voting or started: ' + ', '.join(pending)) if pending else ''
            problems.append('etcd lists %d of %d members%s' % (len(members), etcd_members, waiting))
    return version, health.boot_marker(services), problems


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True,
        mutually_exclusive=_argspec.TALOS_AUTH_CONSTRAINTS['mutually_exclusive'],
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    missing = session.missing_libraries()
    if missing:
        module.fail_json(msg=missing_required_lib(missing[0][0]), exception=missing[0][1])
    params = module.params
    result = dict(changed=False, version_before='', version_after='', actor_id='')
    try:
        version = target_version(params)
        credentials = session.load_credentials(params, module)
        node_session = session.NodeSession.from_params(params, credentials, label=params['label'])
        node_session.require_credentials('is upgraded through its API with os:admin rights')
        deadline, interval = session.deadline_for(params)
        try:
            before = _wait.retry(lambda: node_session.call('version')['tag'], deadline.remaining(), interval=interval,
                                 transient=session.TRANSIENT, backoff=1.0, max_interval=interval)
            boot_before = health.boot_marker(node_session.call('service_list'))
        except talos_errors.TalosTransientError as exc:
            raise ProxtalosError('talos node %s does not answer over mTLS (%s); not upgrading it' % (node_session.display, exc),
                                 node=node_session.name)
        result.update(version_before=before, version_after=before)
        if before == version:
            module.exit_json(**result)
        result['changed'] = True
        if module.check_mode:
            module.exit_json(**result)
        reply = node_session.call('upgrade', params['image'], stage=params['stage'], preserve=params['preserve'],
                                  force=params['force'])
        result['actor_id'] = reply['actor_id']
        seen = {}

        def back():
            try:
                now, boot, problems = observe(node_session, params['healthy_services'], params['etcd_members'])
            except talos_errors.TalosTlsError as exc:
                return False, 'not answering over mTLS (%s)' % exc.reason.replace('_', ' ')
            seen['version'] = now
            if boot == boot_before:
                return False, 'still answers from the boot before the upgrade (%s)' % now
            if now != version:
                return False, 'back on %s, not %s' % (now, version)
            if problems:
                return False, 'back on %s, but %s' % (now, '; '.join(problems))
            return True, 'back on %s' % now
        node_session.wait_until(back, deadline, interval, 'the node back on %s after its upgrade' % version)
        result['version_after'] = seen.get('version', '')
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **dict(exc.details, **result))
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
