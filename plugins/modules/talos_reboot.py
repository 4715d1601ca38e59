#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: talos_reboot
short_description: Reboot a Talos node and wait until it is back
version_added: 0.1.0
description:
  - Reboots one configured Talos node through its API (C(MachineService/Reboot), like C(talosctl reboot)), for
    remediation.
  - Before the call it notes the node's current boot (the time of the first event of its machined service); after
    it, waits until the node answers over mutual TLS again with a different boot - that is "back". A node that only
    stopped answering, or still answers from the old boot, is not back.
  - With O(healthy_services), "back" also needs those services Running and healthy.
  - A reboot that hangs (the node never answers again) fails the task after O(wait_timeout), naming the node and
    what was seen last; it is not waited on forever.
attributes:
  check_mode:
    support: full
    details:
      - Checks that the node answers over mutual TLS and reports that it would reboot; does not reboot.
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
  mode:
    description:
      - V(default) - a normal reboot (Talos may use kexec). V(powercycle) - skip kexec. V(force) - skip the graceful
        shutdown of workloads (Talos 1.12 and later).
    type: str
    choices: [default, powercycle, force]
    default: default
  healthy_services:
    description:
      - Services that must be Running and healthy again before the node counts as back (for example V(kubelet)).
    type: list
    elements: str
    default: []
notes:
  - Always reports C(changed) (a reboot is an action, not a state).
seealso:
  - module: proxtalos.cluster.talos_info
"""

EXAMPLES = r"""
- name: Reboot a worker whose kubelet waits for its volume, and wait for kubelet
  proxtalos.cluster.talos_reboot:
    node: "{{ node_ip }}"
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
    healthy_services: [kubelet]
    wait_timeout: 600
"""

RETURN = r"""
node:
  description: The node as reached (address:port).
  returned: always
  type: str
boot_before:
  description: The boot seen before the reboot (machined's first event).
  returned: always
  type: str
boot_after:
  description: The boot seen after it; empty in check mode or without waiting.
  returned: always
  type: str
actor_id:
  description: Talos' id of the reboot action.
  returned: always
  type: str
elapsed:
  description: Seconds spent, waiting included.
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import health, session


def argument_spec():
    return _argspec.spec(
        _argspec.TALOS_AUTH_SPEC, _argspec.WAIT_SPEC,
        node=dict(type='str', required=True),
        mode=dict(type='str', choices=['default', 'powercycle', 'force'], default='default'),
        healthy_services=dict(type='list', elements='str', default=[]),
    )


def current_boot(node_session, deadline, interval):
    """The node's boot marker, asking again (within the deadline) while it does not answer."""
    try:
        services = _wait.retry(lambda: node_session.call('service_list'), deadline.remaining(), interval=interval,
                               transient=session.TRANSIENT, backoff=1.0, max_interval=interval)
    except talos_errors.TalosTransientError as exc:
        raise ProxtalosError('talos node %s does not answer over mTLS (%s); not rebooting it' % (node_session.name, exc),
                             node=node_session.name)
    return health.boot_marker(services)


def wait_back(node_session, boot_before, required, deadline, interval):
    """Until the node answers over mTLS with a new boot (and the required services healthy); the new marker."""
    seen = {}

    def probe():
        try:
            services = node_session.call('service_list')
        except talos_errors.TalosTlsError as exc:
            if exc.reason in ('server_certificate_untrusted', 'handshake_failed'):
                return False, 'not answering over mTLS (%s)' % exc.reason.replace('_', ' ')
            raise
        marker = health.boot_marker(services)
        if marker == boot_before:
            return False, 'still answers from the boot before the reboot'
        seen['boot'] = marker
        problems = health.service_problems(services, required)
        if problems:
            return False, 'back, but ' + '; '.join(health.describe_service_problem(problem) for problem in problems)
        return True, 'back with a new boot'
    node_session.wait_until(probe, deadline, interval, 'the node back after the reboot')
    return seen['boot']


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
    result = dict(changed=True, node='', boot_before='', boot_after='', actor_id='', elapsed=0.0)
    try:
        credentials = session.load_credentials(params, module)
        node_session = session.NodeSession.from_params(params, credentials)
        node_session.require_credentials('is rebooted through its API with os:admin rights')
        result['node'] = node_session.name
        deadline, interval = session.deadline_for(params)
        boot_before = current_boot(node_session, deadline, interval)
        result['boot_before'] = boot_before or ''
        if not module.check_mode:
            reply = node_session.call('reboot', mode=params['mode'])
            result['actor_id'] = reply.get('actor_id') or ''
            if params['wait']:
                result['boot_after'] = wait_back(node_session, boot_before, params['healthy_services'], deadline, interval) or ''
        result['elapsed'] = round(deadline.elapsed(), 3)
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **dict(exc.details, node=result['node'] or params['node'], changed=bool(result['actor_id'])))
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
