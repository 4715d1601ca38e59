#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_vm_info
short_description: Read Proxmox VE VMs and optionally wait until they run and their guest agents report an address
version_added: 0.1.0
description:
  - Reads the VMs of O(vms) - each one's power state, lock, config and the IPv4 addresses its QEMU guest agent
    reports - in one module run (a C(run_once) task over every node; one VM is a one-element list). The VMs are
    probed concurrently (at most 16 at a time), with one deadline and one poll interval; a VM that passed is not
    probed again. A round lists the VMs (that request is retried) and
    reads each VM once, without retries - a transient PVE error (a 5xx answer, a dropped connection) is "not yet"
    for that VM until the next round, so one VM whose reads keep failing does not hold up the others (with
    O(wait_for=none), only such VMs are read again, for up to 30 s). The result has each VM's part under its name
    (RV(vms)) and, when waiting, one gate per VM (RV(gates)) for the run report. When some VM does not pass,
    the module fails naming every such VM (its name, VM id, PVE node and what was seen last); the VMs that
    passed are still in RV(vms).
  - With O(wait_for=running) or O(wait_for=address) it is a gate - it polls until the VM is running (and the agent
    reports an address, or the VM's O(vms[].expected_address)) or fails at the O(wait_timeout) deadline with what it saw last.
  - Talos runs the QEMU guest agent only when its image has the C(siderolabs/qemu-guest-agent) system extension;
    without it the address gate cannot pass, and its failure says so - unless O(talos_api_port) is set and the VM
    has an expected (static) address, where a Talos API answering there stands in for the agent.
author:
  - proxtalos.cluster contributors (@proxtalos)
options:
  vms:
    description:
      - The VMs, read (and waited for) in one module run. One VM is a one-element list.
      - Names and VM ids must be unique in the list.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description:
          - What the VM is called in the result and in messages - the inventory host whose VM it is.
        type: str
        required: true
      vmid:
        description: PVE id of the VM.
        type: int
        required: true
      node:
        description:
          - PVE node of the VM; looked up when not set, and a VM on another node is an error when set.
        type: str
      expected_address:
        description:
          - With O(wait_for=address), the address this VM's agent must report.
        type: str
  wait_for:
    description:
      - V(none) - read once; a missing VM is reported with C(exists=false) in RV(vms), not as an error.
      - V(running) - wait until the VM is running.
      - V(address) - wait until the VM is running and its guest agent reports an IPv4 address (not on the loopback
        interface, not link-local), or the VM's O(vms[].expected_address) when that is set.
      - A missing VM fails the waits at once.
    type: str
    choices: [none, running, address]
    default: none
  talos_api_port:
    description:
      - With an expected address (O(vms[].expected_address)), when PVE answers that the VM's
        guest agent does not run, a TLS server completing a handshake at that address on this port passes the
        address gate instead (the VM's C(address_source) is V(talos_api)); its certificate is not verified here (Talos in
        maintenance mode has a self-signed one), so follow this with a gate on the Talos API itself.
      - Talos has been reported both with and without the guest agent in maintenance mode.
      - Unset - only the agent counts. Never used for a VM without an expected address, or when the agent runs.
    type: int
extends_documentation_fragment:
  - proxtalos.cluster._proxmox_auth
  - proxtalos.cluster._wait
  - proxtalos.cluster._attributes
  - proxtalos.cluster._attributes.INFO_MODULE
seealso:
  - module: proxtalos.cluster.proxmox_vm
"""

EXAMPLES = r"""
- name: Wait until the VM runs and its agent reports the address cloud-init gave it (one VM, a one-element list)
  proxtalos.cluster.proxmox_vm_info:
    api_host: pve.example.com
    api_user: automation@pve
    api_token_id: proxtalos
    api_token_secret: "{{ vault_pve_token_secret }}"
    vms:
      - {name: cp-1, vmid: 811, node: pve1, expected_address: 10.20.0.11}
    wait_for: address
    wait_timeout: 600
  register: vm

- name: Show the address
  ansible.builtin.debug:
    msg: "{{ vm.vms['cp-1'].address }}"

- name: Gate - every VM of the play runs and reports its address (one module run, every VM probed concurrently)
  proxtalos.cluster.proxmox_vm_info:
    api_host: pve.example.com
    api_user: automation@pve
    api_token_id: proxtalos
    api_token_secret: "{{ vault_pve_token_secret }}"
    vms:
      - {name: cp-1, vmid: 811, node: pve1, expected_address: 10.20.0.11}
      - {name: w-1, vmid: 821, node: pve2}
    wait_for: address
    wait_timeout: 600
  register: all_vms
  run_once: true

- name: Each host's address
  ansible.builtin.debug:
    msg: "{{ all_vms.vms[inventory_hostname].address }}"
"""

RETURN = r"""
elapsed:
  description: Seconds the run spent, including waiting.
  returned: always
  type: float
attempts:
  description: How many rounds of probes ran.
  returned: once the VMs are probed
  type: int
vms:
  description:
    - Each VM that passed (or, with O(wait_for=none), was read) under its name (the keys below).
    - The keys of each entry follow.
    - C(exists) (bool) - Whether the VM exists.
    - C(vmid) (int) - The VM id.
    - C(node) (str) - PVE node of the VM (the one asked for when the VM does not exist).
    - C(name) (str) - VM name.
    - C(status) (str) - PVE power state (C(running), C(stopped)); C(absent) when the VM does not exist.
    - C(lock) (str) - PVE config lock (C(backup), C(migrate), ...), or null.
    - C(config) (dict) - The VM config as PVE returns it; cloud-init passwords and SSH keys are hidden.
    - C(pending) (dict) - Pending config changes, key to new value (null for a pending delete).
    - C(agent_addresses) (list) - IPv4 addresses the guest agent reports, with interface and prefix; empty when it
      does not answer.
    - C(agent_error) (str) - Why no addresses were read (PVE's answer), or null.
    - C(address) (str) - The VM's O(vms[].expected_address) when reported (or, with O(talos_api_port), when its
      Talos API answers while the agent does not run), else the first address the agent reports, else null.
    - C(address_source) (str) - Where C(address) was seen - C(agent), C(talos_api) (O(talos_api_port)), or null
      without an address.
    - C(elapsed) (float) - Seconds from the module's start until this VM passed or the wait ended.
    - C(attempts) (int) - How many times this VM was probed.
  returned: once the VMs are probed (also on failure)
  type: dict
  sample: {"lab-w-1": {"exists": true, "vmid": 1021, "node": "pve1", "status": "running", "address": "10.20.0.101"}}
failed_vms:
  description: Each VM that did not pass, under its name, with what was seen last (same keys as RV(vms)).
  returned: when some VM did not pass (on failure)
  type: dict
gates:
  description:
    - With O(wait_for) running or address, one gate per VM for the run report (convention 0 of
      docs/report.md) - name (C(the VM runs and its guest agent reports its address), or C(the VM runs)), ok,
      host (the VM's O(vms[].name)), observation, elapsed, attempts, target (VM id and PVE node), diagnosis,
      started_at and ended_at (wall clock, seconds since the epoch - from the first round until this VM passed or
      the wait ended).
  returned: when waiting (also on failure)
  type: list
  elements: dict
workers:
  description: The most VMs that were probed at the same time.
  returned: once the VMs are probed
  type: int
"""

import time
import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _errors, _proxmox, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._proxmox_vm_info import (
    MAX_WORKERS, READ_RETRY_SECONDS, check_vms, probe_vms, vms_result)


def argument_spec():
    return _argspec.spec(
        _argspec.PROXMOX_AUTH_SPEC, _argspec.WAIT_SPEC,
        vms=dict(type='list', elements='dict', required=True, options=dict(
            name=dict(type='str', required=True),
            vmid=dict(type='int', required=True),
            node=dict(type='str'),
            expected_address=dict(type='str'),
        )),
        wait_for=dict(type='str', choices=['none', 'running', 'address'], default='none'),
        talos_api_port=dict(type='int'),
    )


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True, **_argspec.PROXMOX_AUTH_CONSTRAINTS,
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    params = module.params
    if not _proxmox.HAS_PROXMOXER:
        module.fail_json(msg='proxmoxer and requests are required on the controller', exception=_proxmox.PROXMOXER_IMPORT_ERROR)
    started = time.monotonic()
    vms = params['vms']
    try:
        check_vms(vms)
        connections = min(len(vms), MAX_WORKERS)
        deadline = _wait.Deadline(max(params['wait_timeout'], 0) if params['wait_for'] != 'none' else READ_RETRY_SECONDS)
        client = _proxmox.PveClient(lambda: _proxmox.connect(params, module.warn, connections=connections), deadline,
                                    interval=min(params['wait_sleep'] or 1.0, _proxmox.FIRST_RETRY))
        ok, result, message = vms_result(probe_vms(client, vms, params), params['wait_for'])
        if not ok:
            module.fail_json(msg=message, **result)
    except _errors.ProxtalosError as exc:
        failure = dict(exc.details)
        failure.setdefault('elapsed', round(time.monotonic() - started, 3))
        module.fail_json(msg=str(exc), exception=traceback.format_exc(), **failure)
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
