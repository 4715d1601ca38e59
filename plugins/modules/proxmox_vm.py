#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_vm
short_description: Create, update, start, stop, reset or delete Proxmox VE VMs, with truthful changed, diff and check mode
version_added: 0.1.0
description:
  - Makes each QEMU VM of O(vms) match its options, in one module run (a C(run_once) task over every node; one VM
    is a one-element list). It observes each VM (config, pending changes, power state), plans the changes, and
    applies them. Only the options that are set are managed; every other config key is left alone.
  - The VMs are worked on concurrently (a pool of at most 16 threads over one HTTPS session), under one
    O(wait_timeout) deadline. PVE serialises what it must by itself (a VM's config lock, the storage lock of disk
    allocation); a lock timeout is a transient error that the VM's own retries ride out. Every item is checked
    before anything is done; a bad item fails the run naming it and the option. The result has each VM's part
    under its name (RV(vms)); when some VM fails, the module fails naming every VM that failed (its name, VM id,
    PVE node and PVE's error), the VMs that completed are still in RV(vms), and the failed ones are in
    RV(failed_vms).
  - A re-run over VMs that match reports C(changed=false). Check mode returns the plan without writing. Diff
    mode shows the managed keys before and after.
  - Values PVE normalises are compared by meaning, not text (memory V(2048) and C("2048"), C(agent=1) and
    C(enabled=1), tag order and case, the generated MAC of C(net0) when O(vms[].macaddr) is not set).
  - Written because M(community.proxmox.proxmox_kvm) cannot do this - it has no check mode and reports
    C(changed) on every C(update) - while keeping its connection options and environment fallbacks.
  - PVE tasks are awaited by UPID on the O(wait_timeout) deadline. Transient errors (HTTP 502/503/504/595/596,
    lock timeouts, a locked VM, lost quorum, connection resets) are retried with backoff until that deadline;
    after a write meets one, the VM is observed again before anything is repeated, so a lost answer never
    creates or starts a VM twice. A C(TASK ERROR) fails at once, naming the VM, the PVE node, the operation and
    PVE's message with the end of the task log.
  - Changes PVE cannot apply to a running VM (cores, memory, CPU type and most hardware) are written to the VM's
    pending config and take effect at its next start. The module reports them in the VM's C(reboot_required) and
    C(pending) (RV(vms)) with a warning; with O(vms[].restart_on_change=true) it reboots the VM through PVE to
    apply them.
  - Cloud-init values (O(vms[].ipconfig0), O(vms[].nameserver), O(vms[].searchdomain)) of a running VM are
    written into its config at once by PVE, but the guest reads them from the cloud-init drive, which PVE
    generates again only at the next start. The module reports such a change in the VM's C(pending) with
    C(reboot_required=true), and a drift left by an earlier run, as PVE lists it in C(GET .../cloudinit) (PVE
    lists a changed C(ipconfig0) there only in the run that made the change). With
    O(vms[].restart_on_change=true) it shuts the VM down before
    such a change and starts it after, so that a run ending in between leaves a stopped VM that the next run
    starts.
  - The VM's disk is only ever grown (PVE C(resize)); a smaller O(vms[].disk_size) fails, and so does a different
    O(vms[].disk_storage), since moving a disk is out of scope.
  - A per-VM option at the top level (O(vms[].vmid) given as C(vmid) beside O(vms)...) fails as an unsupported
    parameter; each VM's options go in its item of O(vms).
author:
  - proxtalos.cluster contributors (@proxtalos)
options:
  vms:
    description:
      - The VMs, each made to match its options, in one module run (a C(run_once) task over every node). One VM is a
        one-element list. The connection and wait options are top level and shared, and O(wait_timeout) is one
        deadline for every VM.
      - Names and VM ids must be unique in the list.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description:
          - What the VM is called in the result (its key in RV(vms)) and in messages - the inventory host whose VM it
            is. It is also the VM's PVE name (a DNS name, renamed in place when it differs) unless O(vms[].vm_name)
            is set.
        type: str
        required: true
      vm_name:
        description: The VM's PVE name (a DNS name), when it differs from O(vms[].name).
        type: str
      vmid:
        description:
          - PVE id of the VM. Always given, so that parallel runs never race for the next free id.
        type: int
        required: true
      node:
        description:
          - PVE node that holds (or will hold) the VM. A VM found on another node is an error, not a migration.
        type: str
        required: true
      state:
        description:
          - V(present) - the VM exists with the given config; its power state is left as it is. A new VM is not started.
          - V(started) - as V(present), and running.
          - V(stopped) - as V(present), and stopped (ACPI shutdown, forced off after O(vms[].shutdown_timeout)).
          - V(absent) - the VM does not exist; a running VM is stopped first, and its disks are deleted. A VM of that
            id with another PVE name (O(vms[].vm_name), else O(vms[].name)) is not deleted; the task fails naming both
            names (a wrong id must not delete another VM).
          - V(reset) - hard reset of a running VM through PVE C(status/reset), for remediation. It always acts when
            asked (C(changed=true)), never touches the config, and is safe to repeat. A stopped VM is started instead.
            A missing VM is an error.
        type: str
        choices: [present, started, stopped, absent, reset]
        default: present
      cores:
        description: CPU cores per socket.
        type: int
      sockets:
        description: CPU sockets.
        type: int
      cpu:
        description:
          - CPU type, for example V(x86-64-v2-AES) or V(host). Talos needs at least x86-64-v2.
        type: str
      memory:
        description: Memory in MiB.
        type: int
      bridge:
        description:
          - Bridge of the first NIC (C(net0)). When not set, C(net0) is not managed.
        type: str
      net_model:
        description: Model of C(net0). Only used with O(vms[].bridge).
        type: str
        default: virtio
      vlan_tag:
        description: VLAN tag of C(net0). Only used with O(vms[].bridge).
        type: int
      firewall:
        description: PVE firewall on C(net0). Only used with O(vms[].bridge); not managed when not set.
        type: bool
      macaddr:
        description:
          - MAC address of C(net0). When not set, PVE generates one at creation and it is kept on every update.
          - PVE takes only a unicast address (the second hex digit even); a multicast one fails naming this option.
        type: str
      disk_storage:
        description: Storage of the boot disk C(scsi0). Used with O(vms[].disk_size).
        type: str
      disk_size:
        description:
          - Size of C(scsi0) in GiB. A larger value grows the disk; a smaller one fails (PVE cannot shrink disks).
        type: int
      scsihw:
        description: SCSI controller, for example V(virtio-scsi-single).
        type: str
      cdrom:
        description:
          - Volume in the CD-ROM drive C(ide2), for example V(local:iso/talos-v1.13.9-nocloud-amd64.iso), or V(none)
            for an empty drive. The file must be on the storage (see M(proxtalos.cluster.proxmox_image)).
        type: str
      cloudinit_storage:
        description:
          - Storage for a cloud-init drive on C(ide0); PVE generates its content from O(vms[].ipconfig0),
            O(vms[].nameserver) and O(vms[].searchdomain). Talos' nocloud platform reads its static address from it.
        type: str
      ipconfig0:
        description:
          - Cloud-init network config of C(net0), for example V(ip=10.20.0.11/24,gw=10.20.0.1). Compared by its parts.
        type: str
      nameserver:
        description: Cloud-init DNS servers, separated by spaces.
        type: str
      searchdomain:
        description: Cloud-init DNS search domain.
        type: str
      boot:
        description: Boot order, for example V(order=scsi0;ide2;net0).
        type: str
      agent:
        description: Enable the QEMU guest agent device (Talos runs the agent when its image has the extension).
        type: bool
      serial:
        description: Add (V(true)) or remove (V(false)) a serial console on C(serial0) (a socket).
        type: bool
      ostype:
        description: Guest OS type, for example V(l26).
        type: str
      machine:
        description: QEMU machine type, for example V(q35).
        type: str
      onboot:
        description: Start the VM when the PVE node boots.
        type: bool
      tags:
        description:
          - Tags of the VM. Compared as a set, case-insensitive, as PVE stores them. An empty list removes them.
        type: list
        elements: str
      description:
        description: VM notes. An empty string removes them.
        type: str
      restart_on_change:
        description:
          - When a change is left pending on a running VM, reboot the VM through PVE (C(status/reboot)) so it takes
            effect; a cloud-init change is made between a shutdown and a start instead. When V(false), the change
            waits for the next start and the VM's C(reboot_required) (RV(vms)) is V(true).
        type: bool
        default: false
      shutdown_timeout:
        description:
          - Seconds PVE waits for the guest to power off on an ACPI shutdown (O(vms[].state=stopped)) or a reboot
            before it forces it off.
        type: int
        default: 120
extends_documentation_fragment:
  - proxtalos.cluster._proxmox_auth
  - proxtalos.cluster._wait
  - proxtalos.cluster._attributes
attributes:
  check_mode:
    support: full
    details:
      - Each VM's plan is computed from the observed VM and returned under its name in RV(vms) (C(changed),
        C(actions), C(diff)); nothing is written. Its C(reboot_required) is then a prediction from PVE's default
        hotplug set. C(changed) is true when any VM would change.
  diff_mode:
    support: full
    details:
      - Shows the managed keys (and the power state) before and after of every changed VM, each under its name.
  idempotent:
    support: partial
    details:
      - Every state but V(reset) is idempotent. V(reset) acts whenever it is asked to.
    description: When run twice in a row with the same arguments, the second run reports no change.
notes:
  - With O(wait=false), tasks are started and their UPIDs returned without waiting or verifying the result.
  - Nothing is waited for in check mode.
seealso:
  - module: proxtalos.cluster.proxmox_vm_info
  - module: proxtalos.cluster.proxmox_image
  - module: community.proxmox.proxmox_kvm
"""

EXAMPLES = r"""
- name: Every node's VM in one module run (run_once), each VM created or updated and started concurrently
  proxtalos.cluster.proxmox_vm:
    api_host: pve.example.com
    api_user: automation@pve
    api_token_id: proxtalos
    api_token_secret: "{{ vault_pve_token_secret }}"
    ca_path: /etc/ssl/pve-ca.pem
    vms:
      - name: infra-cp-1
        vmid: 811
        node: pve1
        state: started
        cores: 4
        memory: 8192
        cpu: x86-64-v2-AES
        bridge: vmbr0
        disk_storage: local-lvm
        disk_size: 40
        scsihw: virtio-scsi-single
        cdrom: local:iso/talos-v1.13.9-nocloud-amd64.iso
        boot: order=scsi0;ide2;net0
        agent: true
        serial: true
        cloudinit_storage: local-lvm
        ipconfig0: ip=10.20.0.11/24,gw=10.20.0.1
        tags: [talos, infra, controlplane]
      - {name: infra-w-1, vmid: 821, node: pve2, state: started, cores: 4, memory: 8192, bridge: vmbr0}
    wait_timeout: 600
  register: all_vms
  run_once: true

- name: What was done to this host's VM
  ansible.builtin.debug:
    msg: "{{ all_vms.vms[inventory_hostname].actions }}"

- name: Hard reset one VM (remediation; one VM is a one-element list)
  proxtalos.cluster.proxmox_vm:
    api_host: pve.example.com
    api_user: automation@pve
    api_token_id: proxtalos
    api_token_secret: "{{ vault_pve_token_secret }}"
    vms:
      - {name: infra-w-4, vmid: 814, node: pve2, state: reset}

- name: Grow the memory of two VMs and apply it at once (the connection from the environment)
  proxtalos.cluster.proxmox_vm:
    vms:
      - {name: infra-cp-1, vmid: 811, node: pve1, memory: 12288, restart_on_change: true}
      - {name: infra-w-1, vmid: 821, node: pve2, memory: 12288, restart_on_change: true}
  environment:
    PROXMOX_HOST: pve.example.com
    PROXMOX_USER: automation@pve
    PROXMOX_TOKEN_ID: proxtalos
    PROXMOX_TOKEN_SECRET: "{{ vault_pve_token_secret }}"
"""

RETURN = r"""
retries:
  description:
    - Transient errors that were met and retried (what was being done, the error, when), every VM's, each with the
      VM's O(vms[].name) under C(vm).
  returned: always
  type: list
  elements: dict
elapsed:
  description: Seconds the module spent.
  returned: always
  type: float
diff:
  description:
    - Managed keys (and the power state) before and after - C(before) and C(after) hold every changed VM's view
      under its O(vms[].name).
  returned: when diff mode is on
  type: dict
vms:
  description:
    - Each VM that completed under its O(vms[].name), with the keys below; C(elapsed) is counted from the module's
      start.
    - C(changed) (bool) - Whether this VM was (in check mode, would be) changed.
    - C(vmid) (int) - The VM id.
    - C(node) (str) - The PVE node.
    - C(status) (str) - Power state observed at the end (in check mode, at the start); C(absent) when there is no VM.
    - C(actions) (list) - What was done (in check mode, what would be done), in order, for example
      C(["update cores, memory", "start"]).
    - C(config) (dict) - The managed config keys as observed at the end, in the form the diff shows them.
    - C(reboot_required) (bool) - True when changes wait for the VM's next start - in its pending config, or
      cloud-init values its cloud-init drive does not have yet (see O(vms[].restart_on_change)).
    - C(pending) (list) - Config keys whose pending value differs from the running one, and cloud-init keys the
      running VM's cloud-init drive does not have yet (changed by this run, or listed by PVE's
      C(GET .../cloudinit)).
    - C(upids) (list) - UPIDs of the PVE tasks that were started.
    - C(retries) (list) - This VM's retried transient errors.
    - C(diff) (dict) - This VM's managed keys before and after (in diff mode).
  returned: always (also on failure)
  type: dict
  sample: {"lab-w-1": {"changed": true, "vmid": 1021, "node": "pve1", "status": "running", "actions": ["create", "start"]}}
failed_vms:
  description:
    - Each VM that failed under its O(vms[].name) - msg (its name, VM id, PVE node and the error), vmid,
      node, changed and actions (what was done to it before it failed), upids, retries, elapsed, and the error's
      details (for a task error operation, upid, exitstatus, task_log; for bad input field).
  returned: when some VM of O(vms) failed (on failure)
  type: dict
workers:
  description: The most VMs that were worked on at the same time.
  returned: always
  type: int
"""

import time
import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _errors, _proxmox, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._proxmox_vm import (
    MAX_WORKERS, STATES, run_vms, validate_vms, vms_result)


def vm_options():
    """The suboptions of each item of `vms`: the VM's options, named by `name` (and `vm_name`, its PVE name)."""
    return dict(
        name=dict(type='str', required=True),
        vm_name=dict(type='str'),
        vmid=dict(type='int', required=True),
        node=dict(type='str', required=True),
        state=dict(type='str', choices=list(STATES), default='present'),
        cores=dict(type='int'),
        sockets=dict(type='int'),
        cpu=dict(type='str'),
        memory=dict(type='int'),
        bridge=dict(type='str'),
        net_model=dict(type='str', default='virtio'),
        vlan_tag=dict(type='int'),
        firewall=dict(type='bool'),
        macaddr=dict(type='str'),
        disk_storage=dict(type='str'),
        disk_size=dict(type='int'),
        scsihw=dict(type='str'),
        cdrom=dict(type='str'),
        cloudinit_storage=dict(type='str'),
        ipconfig0=dict(type='str'),
        nameserver=dict(type='str'),
        searchdomain=dict(type='str'),
        boot=dict(type='str'),
        agent=dict(type='bool'),
        serial=dict(type='bool'),
        ostype=dict(type='str'),
        machine=dict(type='str'),
        onboot=dict(type='bool'),
        tags=dict(type='list', elements='str'),
        description=dict(type='str'),
        restart_on_change=dict(type='bool', default=False),
        shutdown_timeout=dict(type='int', default=120),
    )


def argument_spec():
    return _argspec.spec(_argspec.PROXMOX_AUTH_SPEC, _argspec.WAIT_SPEC,
                         vms=dict(type='list', elements='dict', required=True, options=vm_options()))


def run_all(module, params, deadline, interval):
    """Every VM of `vms` at once; (ok, result, message). Bad input raises ValidationError."""
    items = validate_vms(params['vms'], params)
    shared = _proxmox.SharedApi(lambda: _proxmox.connect(params, module.warn,
                                                         connections=min(len(items), MAX_WORKERS)))
    outcome = run_vms(items, lambda: _proxmox.PveClient(shared, deadline, interval=interval), deadline,
                      module.check_mode, module.warn)
    return vms_result(outcome, module._diff)  # pylint: disable=protected-access


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True, **_argspec.PROXMOX_AUTH_CONSTRAINTS,
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    started = time.monotonic()
    params = module.params
    if not _proxmox.HAS_PROXMOXER:
        module.fail_json(msg='proxmoxer and requests are required on the controller', exception=_proxmox.PROXMOXER_IMPORT_ERROR)
    try:
        deadline = _wait.Deadline(max(params['wait_timeout'], 0))
        timeout_unused, interval = _argspec.wait_params(params)
        interval = min(interval, _proxmox.FIRST_RETRY)
        ok, result, message = run_all(module, params, deadline, interval)
    except _errors.ProxtalosError as exc:
        failure = dict(exc.details)
        failure.setdefault('elapsed', round(time.monotonic() - started, 3))
        module.fail_json(msg=str(exc), exception=traceback.format_exc(), **failure)
    result['elapsed'] = round(time.monotonic() - started, 3)
    if not ok:
        module.fail_json(msg=message, **result)
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
