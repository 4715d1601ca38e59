#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: talos_node_remove
short_description: Take a Talos node out of its cluster - its etcd member, then a reset
version_added: 0.1.0
description:
  - For a control plane (O(control_plane=true)), first finds the node's etcd member (by its Talos hostname O(name),
    or a peer URL on O(node)) through the other control planes O(via), and refuses, changing nothing, when removing it
    would lose quorum - when no voting member would stay, or when no more than half of the members that stay have a
    healthy etcd now (their node's etcd service Running and healthy). Then the member goes - the node leaves etcd
    itself (C(EtcdLeaveCluster)) when it answers, else another control plane removes it (C(EtcdRemoveMemberByID)) -
    and the module waits until the member list no longer has it.
  - Then, with O(reset=true), resets the node (C(MachineService/Reset), like C(talosctl reset)) - graceful, the
    whole system disk wiped, and halted (C(reboot=false)), and waits until the node no longer answers over mutual
    TLS.
  - Idempotent - no member left and a node that no longer answers over mutual TLS (down, or in maintenance mode)
    report C(ok).
attributes:
  check_mode:
    support: full
    details:
      - Makes the same observations and the same quorum decision (a refusal fails in check mode too), and reports
        what it would do.
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
      - Address of the node that goes.
    type: str
    required: true
  name:
    description:
      - The node's Talos hostname (its etcd member name and Kubernetes Node name).
    type: str
    required: true
  control_plane:
    description:
      - Whether the node is a control plane (has an etcd member).
    type: bool
    default: false
  via:
    description:
      - Addresses of the other control planes, tried in order to read and change the etcd members. Required with
        O(control_plane=true).
    type: list
    elements: str
    default: []
  reset:
    description:
      - Reset the node once its member is gone.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Take lab-cp-3 out (the VM is deleted afterwards)
  proxtalos.cluster.talos_node_remove:
    node: 10.5.0.13
    name: lab-cp-3
    control_plane: true
    via: [10.5.0.11, 10.5.0.12]
    talosconfig: "artifacts/lab/talosconfig"
"""

RETURN = r"""
member:
  description: The etcd member found for the node (id as 16 hex digits, hostname), or empty.
  returned: always
  type: dict
quorum:
  description: The quorum decision, in words (control planes only).
  returned: always
  type: str
removed_by:
  description: C(leave) (the node left itself), C(remove) (another control plane removed it), or empty.
  returned: always
  type: str
reset:
  description: Whether the node was reset (in check mode, would be).
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import etcd_quorum, session

TALOS_FAILURES = (talos_errors.TalosTransientError, talos_errors.TalosApiError, talos_errors.TalosTlsError)


def argument_spec():
    return _argspec.spec(
        _argspec.TALOS_AUTH_SPEC, _argspec.WAIT_SPEC,
        node=dict(type='str', required=True),
        name=dict(type='str', required=True),
        control_plane=dict(type='bool', default=False),
        via=dict(type='list', elements='str', default=[]),
        reset=dict(type='bool', default=True),
    )


def peer_host(url):
    return url.split('://', 1)[-1].rsplit(':', 1)[0].strip('[]')


def etcd_health(address, params, credentials):
    """True when the etcd service of the node at `address` is Running and healthy, else what was seen."""
    try:
        services = dict((item['id'], item) for item in session.NodeSession.from_params(
            params, credentials, host=address).call('service_list'))
    except TALOS_FAILURES as exc:
        return str(exc)
    etcd = services.get('etcd')
    if etcd is None:
        return 'no etcd service'
    if etcd['healthy']:
        return True
    return 'etcd %s%s' % (etcd['state'], (': ' + etcd['health']['last_message']) if etcd['health']['last_message'] else '')


def member_list(params, credentials, exclude=None):
    """(members, session of the control plane that answered); fails naming each one tried."""
    tried = []
    for address in params['via']:
        if address == exclude:
            continue
        via_session = session.NodeSession.from_params(params, credentials, host=address, field='via')
        try:
            return via_session.call('etcd_member_list'), via_session
        except TALOS_FAILURES as exc:
            tried.append('%s: %s' % (via_session.name, exc))
    raise ProxtalosError('no other control plane lists the etcd members: %s' % ('; '.join(tried) or 'none given in via'))


def find_member(members, name, address):
    for member in members:
        if member['hostname'] == name or any(peer_host(url) == address for url in member['peer_urls']):
            return member
    return None


def answers_mtls(node_session):
    """True when the node answers over mTLS now (one call), else what was seen."""
    try:
        node_session.call('version')
        return True
    except TALOS_FAILURES as exc:
        return str(exc)


def remove_member(module, params, credentials, node_session, result, deadline, interval):
    members, via_session = member_list(params, credentials, exclude=params['node'])
    member = find_member(members, params['name'], params['node'])
    if member is None:
        result['quorum'] = 'no etcd member of %s (nothing to remove)' % params['name']
        return
    result['member'] = {'id': '%016x' % member['id'], 'hostname': member['hostname']}
    healthy = {}
    for other in members:
        if other['id'] == member['id'] or other['is_learner']:
            continue
        hosts = [peer_host(url) for url in other['client_urls'] or other['peer_urls']]
        healthy[other['id']] = etcd_health(hosts[0], params, credentials) if hosts else 'no address'
    ok, text = etcd_quorum.removal_verdict(members, member['id'], healthy)
    result['quorum'] = text
    if not ok:
        raise ProxtalosError('refusing to remove the etcd member of %s (%s): it would lose quorum - %s'
                             % (params['name'], result['member']['id'], text), quorum=text, member=result['member'])
    result['changed'] = True
    if module.check_mode:
        result['removed_by'] = 'leave' if answers_mtls(node_session) is True else 'remove'
        return
    try:
        node_session.call('etcd_leave_cluster')
        result['removed_by'] = 'leave'
    except TALOS_FAILURES as exc:
        module.warn('%s did not leave etcd itself (%s); removing its member through %s'
                    % (node_session.display, exc, via_session.name))
        try:
            via_session.call('etcd_remove_member_by_id', member['id'])
        except talos_errors.TalosApiError as gone:
            if gone.code != 'NOT_FOUND':
                raise
        result['removed_by'] = 'remove'

    def gone():
        listed = via_session.call('etcd_member_list')
        still = [m for m in listed if m['id'] == member['id']]
        return not still, '%d member(s), %s still listed' % (len(listed), params['name']) if still else 'gone'
    via_session.wait_until(gone, deadline, interval, 'the etcd member of %s gone from the member list' % params['name'])


def reset_node(module, node_session, result, deadline, interval):
    seen = answers_mtls(node_session)
    if seen is not True:
        module.warn('%s does not answer over mutual TLS (%s): not reset (already reset, or down)' % (node_session.display, seen))
        return
    result['changed'] = True
    result['reset'] = True
    if module.check_mode:
        return
    node_session.call('reset', graceful=True, reboot=False, wipe_mode='all')

    def down():
        state = answers_mtls(node_session)
        return state is not True, 'still answers over mutual TLS' if state is True else state
    node_session.wait_until(down, deadline, interval, 'the node to stop answering over mutual TLS after its reset')


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
    result = dict(changed=False, member={}, quorum='', removed_by='', reset=False)
    try:
        credentials = session.load_credentials(params, module)
        node_session = session.NodeSession.from_params(params, credentials, label=params['name'])
        node_session.require_credentials('is taken out of its cluster through its API')
        deadline, interval = session.deadline_for(params)
        if params['control_plane']:
            if not [address for address in params['via'] if address != params['node']]:
                raise ValidationError('via', 'needs the address of another control plane to change the etcd members')
            remove_member(module, params, credentials, node_session, result, deadline, interval)
        if params['reset']:
            reset_node(module, node_session, result, deadline, interval)
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **dict(exc.details, **result))
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
