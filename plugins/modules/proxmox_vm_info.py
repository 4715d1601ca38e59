#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_vm_info
short_description: Read one Proxmox VE VM and optionally wait until it runs and its guest agent reports an address
version_added: 0.1.0
description:
  - Reads one VM's power state, lock, config and the IPv4 addresses its QEMU guest agent reports.
  - With O(wait_for=running) or O(wait_for=address) it is a gate - it polls until the VM is running (and the agent
    reports an address, or O(expected_address)) or fails at the O(wait_timeout) deadline with what it saw last.
  - Talos runs the QEMU guest agent only when its image has the C(siderolabs/qemu-guest-agent) system extension;
    without it the address gate cannot pass, and its failure says so.
author:
  - proxtalos.cluster contributors (@proxtalos)
options:
  vmid:
    description: PVE id of the VM.
    type: int
    required: true
  node:
    description:
      - PVE node of the VM. When not set, the node is looked up; when set, a VM on another node is an error.
    type: str
  wait_for:
    description:
      - V(none) - read once; a missing VM is reported with RV(exists=false), not as an error.
      - V(running) - wait until the VM is running.
      - V(address) - wait until the VM is running and its guest agent reports an IPv4 address (not on the loopback
        interface, not link-local), or O(expected_address) when that is set.
      - A missing VM fails the waits at once.
    type: str
    choices: [none, running, address]
    default: none
  expected_address:
    description:
      - With O(wait_for=address), the address the agent must report (a static address given by cloud-init).
    type: str
extends_documentation_fragment:
  - proxtalos.cluster._proxmox_auth
  - proxtalos.cluster._wait
  - proxtalos.cluster._attributes
  - proxtalos.cluster._attributes.INFO_MODULE
seealso:
  - module: proxtalos.cluster.proxmox_vm
"""

EXAMPLES = r"""
- name: Wait until the VM runs and its agent reports the address cloud-init gave it
  proxtalos.cluster.proxmox_vm_info:
    api_host: pve.example.com
    api_user: automation@pve
    api_token_id: proxtalos
    api_token_secret: "{{ vault_pve_token_secret }}"
    vmid: 811
    node: pve1
    wait_for: address
    expected_address: 10.20.0.11
    wait_timeout: 600
  register: vm

- name: Show the address
  ansible.builtin.debug:
    msg: "{{ vm.address }}"
"""

RETURN = r"""
exists:
  description: Whether the VM exists.
  returned: always
  type: bool
vmid:
  description: The VM id.
  returned: always
  type: int
node:
  description: PVE node of the VM (the one asked for when the VM does not exist).
  returned: always
  type: str
name:
  description: VM name.
  returned: when the VM exists
  type: str
status:
  description: PVE power state (C(running), C(stopped)); C(absent) when the VM does not exist.
  returned: always
  type: str
lock:
  description: PVE config lock (C(backup), C(migrate), ...), or null.
  returned: always
  type: str
config:
  description: The VM config as PVE returns it; cloud-init passwords and SSH keys are hidden.
  returned: when the VM exists
  type: dict
pending:
  description: Pending config changes, key to new value (null for a pending delete).
  returned: when the VM exists
  type: dict
agent_addresses:
  description: IPv4 addresses the guest agent reports, with interface and prefix; empty when it does not answer.
  returned: always
  type: list
  elements: dict
  sample: [{"interface": "eth0", "address": "10.20.0.11", "prefix": 24}]
agent_error:
  description: Why no addresses were read (PVE's answer), or null.
  returned: always
  type: str
address:
  description: O(expected_address) when reported, else the first address the agent reports, else null.
  returned: always
  type: str
  sample: 10.20.0.11
elapsed:
  description: Seconds spent, including waiting.
  returned: always
  type: float
attempts:
  description: How many times the VM was probed.
  returned: always
  type: int
"""

import time
import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _errors, _proxmox, _wait

HIDDEN_CONFIG_KEYS = ('cipassword', 'sshkeys')
AGENT_HINT = ('Talos runs the QEMU guest agent only when its image has the siderolabs/qemu-guest-agent system '
              'extension (Image Factory schematic), and the VM needs agent enabled in PVE')


def argument_spec():
    return _argspec.spec(
        _argspec.PROXMOX_AUTH_SPEC, _argspec.WAIT_SPEC,
        vmid=dict(type='int', required=True),
        node=dict(type='str'),
        wait_for=dict(type='str', choices=['none', 'running', 'address'], default='none'),
        expected_address=dict(type='str'),
    )


class VmProbe(object):
    """One look at the VM: status, config, agent addresses."""

    def __init__(self, client, params):
        self.client = client
        self.params = params
        self.vmid = params['vmid']
        self.node = params.get('node')

    @property
    def subject(self):
        return 'VM %s%s' % (self.vmid, ' on node %s' % self.node if self.node else '')

    def read(self, with_agent):
        entry = _proxmox.find_vm(self.client, self.vmid, self.subject)
        info = dict(exists=entry is not None, vmid=self.vmid, node=self.node, status='absent', lock=None,
                    agent_addresses=[], agent_error=None, address=None)
        if entry is None:
            return info
        if self.node and entry.get('node') != self.node:
            raise _errors.ValidationError('node', 'VM %s (%s) is on PVE node %r, not %r'
                                          % (self.vmid, entry.get('name'), entry.get('node'), self.node))
        self.node = entry.get('node')
        config, pending = _proxmox.read_config_and_pending(self.client, self.node, self.vmid, self.subject)
        status = self.client.get('nodes/%s/qemu/%s/status/current' % (self.node, self.vmid), 'read status',
                                 self.subject) or {}
        for key in HIDDEN_CONFIG_KEYS:
            if config.get(key):
                config[key] = '<hidden>'
            if pending.get(key):
                pending[key] = '<hidden>'
        info.update(node=self.node, name=entry.get('name') or config.get('name'), status=status.get('status'),
                    lock=status.get('lock') or entry.get('lock'), config=config, pending=pending)
        if with_agent and info['status'] == 'running':
            try:
                info['agent_addresses'] = _proxmox.agent_ipv4_addresses(self.client, self.node, self.vmid,
                                                                        self.subject)
            except _errors.ApiError as exc:
                # 500 'QEMU guest agent is not running' until the guest's agent starts.
                info['agent_error'] = exc.details.get('pve_message') or str(exc)
        addresses = [a['address'] for a in info['agent_addresses']]
        expected = self.params.get('expected_address')
        if expected and expected in addresses:
            info['address'] = expected
        elif addresses and not expected:
            info['address'] = addresses[0]
        return info


def describe(info):
    """What the gate saw, in words."""
    if not info['exists']:
        return 'VM does not exist'
    if info['status'] != 'running':
        return 'VM is %s%s' % (info['status'], ' (lock: %s)' % info['lock'] if info['lock'] else '')
    if info['agent_error']:
        return 'VM is running; guest agent: %s' % info['agent_error']
    addresses = [a['address'] for a in info['agent_addresses']]
    if not addresses:
        return 'VM is running; its guest agent reports no IPv4 address yet'
    return 'VM is running; its guest agent reports %s' % ', '.join(addresses)


def gate(probe, params, clock=time.monotonic, sleep=time.sleep):
    """Read once or wait; returns the module result. Raises WaitTimeout with what was seen last."""
    timeout, interval = _argspec.wait_params(params)
    wait_for = params['wait_for']
    seen = {}

    def once():
        info = probe.read(with_agent=True)
        seen.clear()
        seen.update(info)
        if wait_for == 'none':
            return True, describe(info)
        if not info['exists']:
            raise _errors.ValidationError('vmid', 'VM %s does not exist%s' % (
                params['vmid'], ' on node %s' % params['node'] if params.get('node') else ''))
        if wait_for == 'running':
            return info['status'] == 'running', describe(info)
        return info['address'] is not None, describe(info)

    result = _wait.wait_for(once, timeout=timeout if wait_for != 'none' else 0, interval=interval, backoff=1.0,
                            transient=(_errors.TransientApiError,), clock=clock, sleep=sleep)
    if not result.ok:
        subject = 'VM %s%s on node %s' % (params['vmid'], ' (%s)' % seen['name'] if seen.get('name') else '',
                                          seen.get('node') or params.get('node'))
        if wait_for == 'running':
            goal = 'running'
        elif params.get('expected_address'):
            goal = 'running with its guest agent reporting %s' % params['expected_address']
        else:
            goal = 'running with its guest agent reporting an IPv4 address'
        message = '%s: not %s after %.0f s (last seen: %s)' % (subject, goal, result.elapsed, result.observation)
        if wait_for == 'address' and seen.get('status') == 'running' and not seen.get('agent_addresses'):
            message += '. ' + AGENT_HINT
        raise _errors.WaitTimeout(message, result, vm=seen or None)
    out = dict(seen)
    out.update(changed=False, elapsed=round(result.elapsed, 3), attempts=result.attempts)
    return out


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True,
                           **_argspec.PROXMOX_AUTH_CONSTRAINTS)
    params = module.params
    if not _proxmox.HAS_PROXMOXER:
        module.fail_json(msg='proxmoxer and requests are required on the controller', exception=_proxmox.PROXMOXER_IMPORT_ERROR)
    started = time.monotonic()
    try:
        deadline = _wait.Deadline(max(params['wait_timeout'], 0) if params['wait_for'] != 'none' else 30.0)
        client = _proxmox.PveClient(lambda: _proxmox.connect(params, module.warn), deadline,
                                    interval=min(params['wait_sleep'] or 1.0, _proxmox.FIRST_RETRY))
        result = gate(VmProbe(client, params), params)
    except _errors.ProxtalosError as exc:
        failure = dict(exc.details)
        failure.setdefault('elapsed', round(time.monotonic() - started, 3))
        module.fail_json(msg=str(exc), exception=traceback.format_exc(), **failure)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
