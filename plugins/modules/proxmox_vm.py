#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_vm
short_description: Create, update, start, stop, reset or delete one Proxmox VE VM, with truthful changed, diff and check mode
version_added: 0.1.0
description:
  - Makes one QEMU VM match the options. It observes the VM (config, pending changes, power state), plans the
    changes, and applies them. Only the options that are set are managed; every other config key is left alone.
  - A re-run over a VM that matches reports C(changed=false). Check mode returns the plan without writing. Diff
    mode shows the managed keys before and after.
  - Values PVE normalises are compared by meaning, not text (memory V(2048) and C("2048"), C(agent=1) and
    C(enabled=1), tag order and case, the generated MAC of C(net0) when O(macaddr) is not set).
  - Written because M(community.proxmox.proxmox_kvm) cannot do this - it has no check mode and reports
    C(changed) on every C(update) - while keeping its connection options and environment fallbacks.
  - PVE tasks are awaited by UPID on the O(wait_timeout) deadline. Transient errors (HTTP 502/503/504/595/596,
    lock timeouts, a locked VM, lost quorum, connection resets) are retried with backoff until that deadline;
    after a write meets one, the VM is observed again before anything is repeated, so a lost answer never
    creates or starts a VM twice. A C(TASK ERROR) fails at once, naming the VM, the PVE node, the operation and
    PVE's message with the end of the task log.
  - Changes PVE cannot apply to a running VM (cores, memory, CPU type and most hardware) are written to the VM's
    pending config and take effect at its next start. The module reports them in RV(reboot_required) and
    RV(pending) with a warning; with O(restart_on_change=true) it reboots the VM through PVE to apply them.
  - The VM's disk is only ever grown (PVE C(resize)); a smaller O(disk_size) fails, and so does a different
    O(disk_storage), since moving a disk is out of scope.
author:
  - proxtalos.cluster contributors (@proxtalos)
options:
  vmid:
    description:
      - PVE id of the VM. Required, so that parallel runs never race for the next free id.
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
      - V(stopped) - as V(present), and stopped (ACPI shutdown, forced off after O(shutdown_timeout)).
      - V(absent) - the VM does not exist; a running VM is stopped first, and its disks are deleted.
      - V(reset) - hard reset of a running VM through PVE C(status/reset), for remediation. It always acts when
        asked (C(changed=true)), never touches the config, and is safe to repeat. A stopped VM is started instead.
        A missing VM is an error.
    type: str
    choices: [present, started, stopped, absent, reset]
    default: present
  name:
    description: VM name (a DNS name). Renamed in place when it differs.
    type: str
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
    description: Model of C(net0). Only used with O(bridge).
    type: str
    default: virtio
  vlan_tag:
    description: VLAN tag of C(net0). Only used with O(bridge).
    type: int
  firewall:
    description: PVE firewall on C(net0). Only used with O(bridge); not managed when not set.
    type: bool
  macaddr:
    description:
      - MAC address of C(net0). When not set, PVE generates one at creation and it is kept on every update.
    type: str
  disk_storage:
    description: Storage of the boot disk C(scsi0). Used with O(disk_size).
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
      - Storage for a cloud-init drive on C(ide0); PVE generates its content from O(ipconfig0), O(nameserver) and
        O(searchdomain). Talos' nocloud platform reads its static address from it.
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
        effect. When V(false), the change waits for the next start and RV(reboot_required) is V(true).
    type: bool
    default: false
  shutdown_timeout:
    description:
      - Seconds PVE waits for the guest to power off on an ACPI shutdown (O(state=stopped)) or a reboot before it
        forces it off.
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
      - The plan is computed from the observed VM and returned as C(changed), C(actions) and C(diff); nothing is
        written. C(reboot_required) is then a prediction from PVE's default hotplug set.
  diff_mode:
    support: full
    details:
      - Shows the managed keys (and the power state) before and after.
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
- name: A Talos control plane VM, started
  proxtalos.cluster.proxmox_vm:
    api_host: pve.example.com
    api_user: automation@pve
    api_token_id: proxtalos
    api_token_secret: "{{ vault_pve_token_secret }}"
    ca_path: /etc/ssl/pve-ca.pem
    vmid: 811
    node: pve1
    name: infra-cp-1
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

- name: Hard reset one VM (remediation)
  proxtalos.cluster.proxmox_vm:
    api_host: pve.example.com
    api_user: automation@pve
    api_token_id: proxtalos
    api_token_secret: "{{ vault_pve_token_secret }}"
    vmid: 814
    node: pve2
    state: reset

- name: Grow the memory of all nodes and apply it at once
  proxtalos.cluster.proxmox_vm:
    vmid: "{{ vm_id }}"
    node: "{{ vm_pve_node }}"
    memory: 12288
    restart_on_change: true
  environment:
    PROXMOX_HOST: pve.example.com
    PROXMOX_USER: automation@pve
    PROXMOX_TOKEN_ID: proxtalos
    PROXMOX_TOKEN_SECRET: "{{ vault_pve_token_secret }}"
"""

RETURN = r"""
vmid:
  description: The VM id.
  returned: always
  type: int
  sample: 811
node:
  description: The PVE node.
  returned: always
  type: str
  sample: pve1
status:
  description: Power state observed at the end (in check mode, at the start); C(absent) when there is no VM.
  returned: always
  type: str
  sample: running
actions:
  description: What was done (in check mode, what would be done), in order.
  returned: always
  type: list
  elements: str
  sample: ["update cores, memory", "start"]
config:
  description: The managed config keys as observed at the end, in the form the diff shows them.
  returned: always
  type: dict
  sample: {"cores": 4, "memory": 8192, "net0": {"bridge": "vmbr0", "model": "virtio"}}
reboot_required:
  description:
    - True when changes wait in the VM's pending config for the next start (see O(restart_on_change)).
  returned: always
  type: bool
  sample: false
pending:
  description: Config keys whose pending value differs from the running one.
  returned: always
  type: list
  elements: str
  sample: ["cores"]
upids:
  description: UPIDs of the PVE tasks that were started.
  returned: always
  type: list
  elements: str
retries:
  description: Transient errors that were met and retried (what was being done, the error, when).
  returned: always
  type: list
  elements: dict
elapsed:
  description: Seconds the module spent.
  returned: always
  type: float
diff:
  description: Managed keys before and after.
  returned: when diff mode is on
  type: dict
"""

import re
import time
import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _diff, _errors, _proxmox, _wait

STATES = ('present', 'started', 'stopped', 'absent', 'reset')
DISK_KEY = 'scsi0'
CLOUDINIT_KEY = 'ide0'
CDROM_KEY = 'ide2'
NET_KEY = 'net0'
# Keys PVE applies to a running VM at once (its default hotplug set is network, disk, usb); the others
# go to the pending config until the next start. Only used to predict reboot_required in check mode.
LIVE_KEYS = ('name', 'description', 'onboot', 'tags', 'protection', 'startup', NET_KEY, DISK_KEY, CDROM_KEY)
NAME_RE = r'^(?=.{1,63}$)[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*$'
TAG_RE = r'^[a-zA-Z0-9_][a-zA-Z0-9_+.-]*$'


def argument_spec():
    return _argspec.spec(
        _argspec.PROXMOX_AUTH_SPEC, _argspec.WAIT_SPEC,
        vmid=dict(type='int', required=True),
        node=dict(type='str', required=True),
        state=dict(type='str', choices=list(STATES), default='present'),
        name=dict(type='str'),
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


# ---------------------------------------------------------------------------- validation


def validate(params):
    """Raise ValidationError naming the first bad option and why."""
    if not 100 <= params['vmid'] <= 999999999:
        raise _errors.ValidationError('vmid', 'must be between 100 and 999999999, got %s' % params['vmid'])
    if params.get('name') is not None and not re.match(NAME_RE, params['name']):
        raise _errors.ValidationError('name', '%r is not a valid DNS name (letters, digits, "-", at most 63 '
                                              'characters a label)' % params['name'])
    for key, low in (('cores', 1), ('sockets', 1), ('memory', 16), ('disk_size', 1), ('shutdown_timeout', 0)):
        if params.get(key) is not None and params[key] < low:
            raise _errors.ValidationError(key, 'must be at least %d, got %d' % (low, params[key]))
    if params.get('vlan_tag') is not None and not 1 <= params['vlan_tag'] <= 4094:
        raise _errors.ValidationError('vlan_tag', 'must be between 1 and 4094, got %d' % params['vlan_tag'])
    if params.get('net_model') not in _proxmox.NET_MODELS:
        raise _errors.ValidationError('net_model', '%r is not a PVE NIC model (one of %s)'
                                      % (params.get('net_model'), ', '.join(_proxmox.NET_MODELS)))
    if params.get('macaddr') is not None and not re.match(r'^([0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}$', params['macaddr']):
        raise _errors.ValidationError('macaddr', '%r is not a MAC address like BC:24:11:00:00:01' % params['macaddr'])
    for tag in params.get('tags') or []:
        if not re.match(TAG_RE, tag):
            raise _errors.ValidationError('tags', '%r is not a valid PVE tag (letters, digits, _ + . -)' % tag)
    if (params.get('disk_storage') is None) != (params.get('disk_size') is None):
        raise _errors.ValidationError('disk_size' if params.get('disk_size') is None else 'disk_storage',
                                      'disk_storage and disk_size are given together')
    if params.get('ipconfig0'):
        parts = _proxmox.parse_props(params['ipconfig0'])
        unknown = sorted(set(parts) - {'ip', 'gw', 'ip6', 'gw6'})
        if unknown:
            raise _errors.ValidationError('ipconfig0', 'unknown part %s (expected ip=, gw=, ip6=, gw6=)'
                                          % ', '.join(unknown))


# ---------------------------------------------------------------------- desired config


def _bool_pve(value):
    return 1 if value else 0


def net_value(params, macaddr=None):
    """The net0 value to send; an existing MAC is kept unless macaddr is managed."""
    mac = params.get('macaddr') or macaddr
    model = params['net_model']
    parts = ['%s=%s' % (model, mac.upper()) if mac else model, 'bridge=%s' % params['bridge']]
    if params.get('vlan_tag') is not None:
        parts.append('tag=%d' % params['vlan_tag'])
    if params.get('firewall') is not None:
        parts.append('firewall=%d' % _bool_pve(params['firewall']))
    return ','.join(parts)


def desired_config(params):
    """PVE config key -> value to send, for the options that are set (the disk is handled apart)."""
    want = {}
    for key in ('name', 'cpu', 'scsihw', 'ostype', 'machine', 'boot', 'ipconfig0', 'nameserver', 'searchdomain',
                'description'):
        if params.get(key) is not None:
            want[key] = params[key]
    for key in ('cores', 'sockets', 'memory'):
        if params.get(key) is not None:
            want[key] = params[key]
    if params.get('agent') is not None:
        want['agent'] = 'enabled=%d' % _bool_pve(params['agent'])
    if params.get('onboot') is not None:
        want['onboot'] = _bool_pve(params['onboot'])
    if params.get('serial') is not None:
        want['serial0'] = 'socket' if params['serial'] else ''
    if params.get('tags') is not None:
        want['tags'] = ';'.join(canon_tags(params['tags']))
    if params.get('bridge') is not None:
        want[NET_KEY] = net_value(params)
    if params.get('cdrom') is not None:
        want[CDROM_KEY] = '%s,media=cdrom' % params['cdrom']
    if params.get('cloudinit_storage') is not None:
        want[CLOUDINIT_KEY] = '%s:cloudinit' % params['cloudinit_storage']
    return want


# ------------------------------------------------------------------------ canonical forms


def canon_tags(value):
    if isinstance(value, (list, tuple)):
        items = value
    else:
        items = re.split(r'[;, ]+', str(value or ''))
    return sorted(set(item.strip().lower() for item in items if item and item.strip()))


def _int_of(value):
    text = str(value).strip()
    if '=' in text:  # memory: [current=]<MiB>
        text = _proxmox.parse_props(text, 'current').get('current', '')
    try:
        return int(text)
    except ValueError:
        return text


def _flag(value):
    return str(value).strip().lower() in ('1', 'true', 'on', 'yes')


def canon(key, value):
    """A comparable, readable form of a config value (None: the key is absent)."""
    if value is None or value == '':
        return None
    if key in ('cores', 'sockets', 'memory'):
        return _int_of(value)
    if key == 'cpu':
        return _proxmox.parse_props(value, 'cputype').get('cputype')
    if key == 'agent':
        return _flag(_proxmox.parse_props(value, 'enabled').get('enabled', '0'))
    if key == 'onboot':
        return _flag(value)
    if key == 'tags':
        return canon_tags(value) or None
    if key == 'description':
        return str(value).rstrip('\n') or None
    if key == 'nameserver':
        return str(value).replace(',', ' ').split() or None
    if key in ('ipconfig0', 'boot'):
        if key == 'boot' and not str(value).startswith('order='):
            return str(value).replace(' ', '')
        props = _proxmox.parse_props(str(value).replace(' ', ''))
        return props if key == 'ipconfig0' else props.get('order', '')
    if key == NET_KEY:
        net = _proxmox.parse_net(value)
        if 'firewall' in net:
            net['firewall'] = _flag(net['firewall'])
        if 'tag' in net:
            net['tag'] = _int_of(net['tag'])
        return net
    if key == CDROM_KEY:
        return _proxmox.parse_props(value, 'volume').get('volume')
    if key == CLOUDINIT_KEY:
        props = _proxmox.parse_props(value, 'volume')
        volume = props.get('volume', '')
        is_cloudinit = 'cloudinit' in volume or (props.get('media') == 'cdrom' and '/iso/' not in volume
                                                 and ':iso/' not in volume and volume not in ('none', 'cdrom'))
        return {'storage': volume.split(':', 1)[0], 'cloudinit': is_cloudinit}
    return str(value)


def net_matches(desired, observed):
    """net0 matches when every part the options set is equal; the generated MAC is not compared."""
    if observed is None:
        return False
    return all(observed.get(k) == v for k, v in desired.items() if k != 'macaddr' or v)


def disk_view(value):
    """{'storage': ..., 'size': '32G'} of a disk value, or None."""
    if not value:
        return None
    props = _proxmox.parse_props(value, 'volume')
    size = _proxmox.parse_size(props.get('size'))
    return {'storage': props.get('volume', '').split(':', 1)[0],
            'size': _proxmox.format_size(size) if size is not None else None, 'bytes': size}


def effective(config, pending):
    """The config the VM will have at its next start: config with the pending changes applied."""
    out = dict(config or {})
    for key, value in (pending or {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def pending_keys(config, pending):
    """Keys whose pending value really differs from the current one (PVE may keep equal entries)."""
    keys = []
    for key, value in sorted((pending or {}).items()):
        if canon(key, value) != canon(key, (config or {}).get(key)):
            keys.append(key)
    return keys


def managed_view(params, config, status=None):
    """What the diff and the result show: the managed keys in canonical form, plus the power state."""
    want = desired_config(params)
    view = {}
    for key in sorted(want):
        value = canon(key, (config or {}).get(key))
        if key == NET_KEY and isinstance(value, dict):
            # Only the parts the options set: the generated MAC and unmanaged parts are not shown.
            shown = canon(key, want[key])
            if not params.get('macaddr'):
                shown.pop('macaddr', None)
            value = dict((k, v) for k, v in value.items() if k in shown)
        view[key] = value
    if params.get('disk_storage') is not None:
        disk = disk_view((config or {}).get(DISK_KEY))
        view[DISK_KEY] = dict((k, v) for k, v in disk.items() if k != 'bytes') if disk else None
    if status is not None and params['state'] in ('started', 'stopped', 'absent'):
        view['status'] = status
    return view


def desired_view(params):
    want = desired_config(params)
    view = dict((key, canon(key, value)) for key, value in sorted(want.items()))
    if NET_KEY in view and not params.get('macaddr'):
        view[NET_KEY].pop('macaddr', None)
    if params.get('disk_storage') is not None:
        view[DISK_KEY] = {'storage': params['disk_storage'], 'size': '%dG' % params['disk_size']}
    return view


# ----------------------------------------------------------------------------------- plan


class Action(object):
    """One step of a plan: kind (create, update, resize, start, shutdown, stop, delete, reset, reboot) and data."""

    def __init__(self, kind, **data):
        self.kind = kind
        self.data = data

    def describe(self):
        if self.kind == 'update':
            return 'update %s' % ', '.join(sorted(list(self.data.get('values', {})) + list(self.data.get('delete', []))))
        if self.kind == 'resize':
            return 'resize %s to %s' % (self.data['disk'], self.data['size'])
        return self.kind

    def __eq__(self, other):
        return isinstance(other, Action) and (self.kind, self.data) == (other.kind, other.data)

    def __repr__(self):
        return 'Action(%r, %r)' % (self.kind, self.data)


def _config_changes(params, current):
    """(values to set, keys to delete, disk action or None) to turn `current` into what the options ask for."""
    values, delete = {}, []
    for key, value in sorted(desired_config(params).items()):
        have = current.get(key)
        if key == NET_KEY:
            want = canon(key, value)
            if not params.get('macaddr'):
                want.pop('macaddr', None)
            if not net_matches(want, canon(key, have) if have else None):
                mac = (canon(key, have) or {}).get('macaddr') if have else None
                values[key] = net_value(params, mac)
            continue
        if key == CLOUDINIT_KEY:
            observed = canon(key, have) if have else None
            if not observed or not observed['cloudinit'] or observed['storage'] != params['cloudinit_storage']:
                values[key] = value
            continue
        if canon(key, value) == canon(key, have):
            continue
        if value == '':
            delete.append(key)
        else:
            values[key] = value
    disk = None
    if params.get('disk_storage') is not None:
        want_bytes = params['disk_size'] * _proxmox.SIZE_UNITS['G']
        have = disk_view(current.get(DISK_KEY))
        if have is None:
            values[DISK_KEY] = '%s:%d' % (params['disk_storage'], params['disk_size'])
        elif have['storage'] != params['disk_storage']:
            raise _errors.ValidationError('disk_storage', '%s of VM %s is on storage %r, not %r; moving a disk is '
                                          'not done by this module (move it in PVE, or set disk_storage to %r)'
                                          % (DISK_KEY, params['vmid'], have['storage'], params['disk_storage'],
                                             have['storage']))
        elif have['bytes'] is not None and have['bytes'] > want_bytes:
            raise _errors.ValidationError('disk_size', '%s of VM %s is %s; it cannot shrink to %dG (PVE only grows '
                                          'disks)' % (DISK_KEY, params['vmid'], have['size'], params['disk_size']))
        elif have['bytes'] is not None and have['bytes'] < want_bytes:
            disk = Action('resize', disk=DISK_KEY, size='%dG' % params['disk_size'])
    return values, delete, disk


def create_params(params):
    """The POST nodes/{node}/qemu parameters of a new VM."""
    want = dict((k, v) for k, v in desired_config(params).items() if v != '')
    if params.get('disk_storage') is not None:
        want[DISK_KEY] = '%s:%d' % (params['disk_storage'], params['disk_size'])
    want['vmid'] = params['vmid']
    return want


def plan(params, observed_config, observed_status, observed_pending=None):
    """What to do: (changed, [Action], diff) from the options and what was observed. Pure; no I/O.

    observed_config: the VM's current config, or None when there is no VM.
    observed_status: 'running', 'stopped' (or another PVE status), or None when there is no VM.
    observed_pending: key -> pending value (None: pending delete), from GET .../pending.
    The comparison is made against the config the VM will have at its next start (config + pending).
    """
    state = params['state']
    exists = observed_config is not None
    running = observed_status == 'running'
    current = effective(observed_config, observed_pending) if exists else None
    before = managed_view(params, current, observed_status if exists else 'absent') if exists else {}
    actions = []

    if state == 'reset':
        if not exists:
            raise _errors.ValidationError('vmid', 'VM %s does not exist on node %s; there is nothing to reset'
                                          % (params['vmid'], params['node']))
        actions.append(Action('reset' if running else 'start'))
        after = dict(before)
        after['status'] = 'running'
        before = dict(before, status=observed_status)
        return True, actions, _diff.make_diff(before, after)

    if state == 'absent':
        if not exists:
            return False, [], _diff.make_diff({}, {})
        if running:
            actions.append(Action('stop'))
        actions.append(Action('delete'))
        return True, actions, _diff.make_diff(before, {})

    after = desired_view(params)
    if not exists:
        actions.append(Action('create', values=create_params(params)))
        if state == 'started':
            actions.append(Action('start'))
        if state in ('started', 'stopped'):
            after['status'] = 'running' if state == 'started' else 'stopped'
        return True, actions, _diff.make_diff({}, after)

    values, delete, resize = _config_changes(params, current)
    if values or delete:
        actions.append(Action('update', values=values, delete=delete))
    if resize is not None:
        actions.append(resize)
    if state == 'started' and not running:
        actions.append(Action('start'))
    elif state == 'stopped' and running:
        actions.append(Action('shutdown'))
    elif running and params.get('restart_on_change'):
        cold = [k for k in list(values) + delete if k not in LIVE_KEYS]
        if cold or pending_keys(observed_config, observed_pending):
            actions.append(Action('reboot'))
    if state in ('started', 'stopped'):
        after['status'] = 'running' if state == 'started' else 'stopped'
    # The after view keeps what is not managed as observed (disk shown as it will be).
    before_view = dict((k, v) for k, v in before.items() if k in after)
    return bool(actions), actions, _diff.make_diff(before_view, after)


def predict_reboot_required(params, actions, observed_config, observed_pending, observed_status):
    """Check mode's guess: changes to keys PVE cannot apply live, on a VM that stays running."""
    if observed_status != 'running' or any(a.kind in ('shutdown', 'stop', 'delete', 'reboot') for a in actions):
        return False
    if pending_keys(observed_config, observed_pending):
        return True
    for action in actions:
        if action.kind == 'update':
            keys = list(action.data['values']) + list(action.data['delete'])
            if any(k not in LIVE_KEYS for k in keys):
                return True
    return False


# ------------------------------------------------------------------------------- observe/act


class Observed(object):
    __slots__ = ('config', 'pending', 'status', 'lock', 'name')

    def __init__(self, config=None, pending=None, status=None, lock=None, name=None):
        self.config = config
        self.pending = pending or {}
        self.status = status
        self.lock = lock
        self.name = name


class VmRunner(object):
    """Observe and act on one VM through a PveClient."""

    def __init__(self, client, params):
        self.client = client
        self.params = params
        self.vmid = params['vmid']
        self.node = params['node']
        self.upids = []
        self.done = []
        timeout, interval = _argspec.wait_params(params)
        self.interval = interval
        self.task_timeout = timeout

    @property
    def subject(self):
        name = self.params.get('name')
        return 'VM %s%s on node %s' % (self.vmid, ' (%s)' % name if name else '', self.node)

    def observe(self):
        entry = _proxmox.find_vm(self.client, self.vmid, self.subject)
        if entry is None:
            return Observed()
        if entry.get('node') != self.node:
            raise _errors.ValidationError('node', 'VM %s (%s) is on PVE node %r, not %r; migrate it in PVE or set '
                                                  'node to %r' % (self.vmid, entry.get('name'), entry.get('node'),
                                                                  self.node, entry.get('node')))
        if entry.get('lock') == 'create':
            raise _errors.TransientApiError('%s: still being created by another task (lock: create)' % self.subject)
        config, pending = _proxmox.read_config_and_pending(self.client, self.node, self.vmid, self.subject)
        status = self.client.get('nodes/%s/qemu/%s/status/current' % (self.node, self.vmid), 'read status',
                                 self.subject) or {}
        return Observed(config, pending, status.get('status'), status.get('lock') or entry.get('lock'),
                        entry.get('name'))

    def _task(self, method, path, operation, wait=True, **params):
        upid = self.client.run_task(method, path, self.node, operation, self.subject, self.task_timeout,
                                    self.interval, wait=wait, params=params)
        if isinstance(upid, str) and upid.startswith('UPID:'):
            self.upids.append(upid)
        return upid

    def act(self, action, wait=True):
        base = 'nodes/%s/qemu/%s' % (self.node, self.vmid)
        data = action.data
        if action.kind == 'create':
            self._task('post', 'nodes/%s/qemu' % self.node, 'create', wait=wait, **data['values'])
        elif action.kind == 'update':
            body = dict(data['values'])
            if data['delete']:
                body['delete'] = ','.join(data['delete'])
            # The synchronous PUT: PVE answers when the config is written (or the change is pending).
            self.client.request('put', base + '/config', 'update config (%s)' % ', '.join(sorted(
                list(data['values']) + list(data['delete']))), self.subject, retry=False, **body)
        elif action.kind == 'resize':
            self._task('put', base + '/resize', 'resize disk', wait=wait, disk=data['disk'], size=data['size'])
        elif action.kind == 'start':
            self._task('post', base + '/status/start', 'start', wait=wait)
        elif action.kind == 'shutdown':
            self._task('post', base + '/status/shutdown', 'shutdown', wait=wait,
                       timeout=self.params['shutdown_timeout'], forceStop=1)
        elif action.kind == 'stop':
            self._task('post', base + '/status/stop', 'stop', wait=wait)
        elif action.kind == 'reboot':
            self._task('post', base + '/status/reboot', 'reboot', wait=wait, timeout=self.params['shutdown_timeout'])
        elif action.kind == 'reset':
            self._task('post', base + '/status/reset', 'reset', wait=wait)
        elif action.kind == 'delete':
            self._task('delete', base, 'delete', wait=wait, purge=1, **{'destroy-unreferenced-disks': 1})
        else:  # pragma: no cover - plan() makes only the kinds above
            raise _errors.ProxtalosError('unknown action %r' % action.kind)
        self.done.append(action.describe())

    def converge(self, deadline, clock=time.monotonic, sleep=time.sleep):
        """Apply the plan, observe again, and repeat until nothing is left to do or the deadline passes.

        A transient error (or a task that failed on a lock) is "not yet": the VM is observed again before
        anything is repeated. Permanent errors are raised at once.
        """
        last_error = {}

        def step():
            observed = self.observe()
            _changed, actions, _diff_unused = plan(self.params, observed.config, observed.status, observed.pending)
            if not actions:
                return True, observed
            try:
                for action in actions:
                    self.act(action)
                    if action.kind == 'reset':
                        return True, None
            except _errors.TransientApiError as exc:
                last_error['error'] = exc
                raise
            observed = self.observe()
            _changed, actions, _diff_unused = plan(self.params, observed.config, observed.status, observed.pending)
            if not actions:
                return True, observed
            return False, 'still to do after applying: %s' % ', '.join(a.describe() for a in actions)

        def progress(observation, elapsed, attempts):
            self.client.retried.append({'what': 'converge', 'error': observation, 'elapsed': round(elapsed, 3),
                                        'attempt': attempts})

        result = _wait.wait_for(step, timeout=deadline.remaining(), interval=min(self.interval, _proxmox.FIRST_RETRY),
                                backoff=2.0, max_interval=max(self.interval, 10.0),
                                transient=(_errors.TransientApiError,), on_progress=progress, clock=clock, sleep=sleep)
        if not result.ok:
            error = last_error.get('error')
            message = '%s: gave up after %.0f s and %d attempts: %s' % (
                self.subject, result.elapsed, result.attempts, error.message if error else result.observation)
            if error is not None and 'locked' in error.message.lower():
                message += ('. If no backup, migration or snapshot is running, clear the lock on the PVE node with '
                            '`qm unlock %s`' % self.vmid)
            details = dict(error.details) if error is not None else {}
            for key in ('elapsed', 'attempts', 'last_observation'):
                details.pop(key, None)
            raise _errors.WaitTimeout(message, result, **details)
        # What the last probe saw once nothing was left to do (None after a reset, which is not observed).
        return result.observation


def run(module_params, client, deadline, check_mode, warn):
    """Observe, plan and (outside check mode) act; returns the module result without `diff` trimming."""
    runner = VmRunner(client, module_params)
    observed = runner.observe()
    changed, actions, diff = plan(module_params, observed.config, observed.status, observed.pending)
    result = dict(changed=changed, vmid=module_params['vmid'], node=module_params['node'],
                  actions=[a.describe() for a in actions], upids=runner.upids, diff=diff)
    if check_mode or not actions:
        exists = observed.config is not None
        current = effective(observed.config, observed.pending) if exists else None
        result.update(status=observed.status or 'absent',
                      config=managed_view(module_params, current) if exists else {},
                      pending=pending_keys(observed.config, observed.pending) if exists else [],
                      reboot_required=predict_reboot_required(module_params, actions, observed.config,
                                                              observed.pending, observed.status))
        return result
    if not module_params['wait']:
        for action in actions:
            runner.act(action, wait=False)
        result.update(status=observed.status or 'absent', config={}, pending=[], reboot_required=False)
        return result
    final = runner.converge(deadline)
    result['actions'] = runner.done
    if final is None:
        final = runner.observe()
    exists = final.config is not None
    pending = pending_keys(final.config, final.pending) if exists else []
    result.update(status=final.status or 'absent', pending=pending, reboot_required=bool(pending),
                  config=managed_view(module_params, effective(final.config, final.pending)) if exists else {})
    if pending:
        warn('%s: %s pending until the VM restarts (set restart_on_change to apply at once)'
             % (runner.subject, ', '.join(pending)))
    return result


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True,
                           **_argspec.PROXMOX_AUTH_CONSTRAINTS)
    started = time.monotonic()
    params = module.params
    if not _proxmox.HAS_PROXMOXER:
        module.fail_json(msg='proxmoxer and requests are required on the controller', exception=_proxmox.PROXMOXER_IMPORT_ERROR)
    try:
        validate(params)
        deadline = _wait.Deadline(max(params['wait_timeout'], 0))
        timeout_unused, interval = _argspec.wait_params(params)
        client = _proxmox.PveClient(lambda: _proxmox.connect(params, module.warn), deadline,
                                    interval=min(interval, _proxmox.FIRST_RETRY))
        result = run(params, client, deadline, module.check_mode, module.warn)
    except _errors.ProxtalosError as exc:
        failure = dict(exc.details)
        failure.setdefault('elapsed', round(time.monotonic() - started, 3))
        module.fail_json(msg=str(exc), exception=traceback.format_exc(), **failure)
    diff = result.pop('diff')
    if module._diff:  # pylint: disable=protected-access
        result['diff'] = diff
    result['retries'] = client.retried
    result['elapsed'] = round(time.monotonic() - started, 3)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
