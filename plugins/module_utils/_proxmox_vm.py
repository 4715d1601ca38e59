# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Making the Proxmox VE VMs of a list match their options, all at once. PRIVATE to the collection.

Used by the module proxmox_vm (its `vms` list; one VM is a one-element list):
- `validate_vms`: every item's params (the shared connection and wait options plus the item's own), validated
  before anything is done;
- `run_vms`: every VM goes through `run` (observe, plan - pure: `plan` -, and outside check mode act and
  converge on the deadline) on its own thread of a small pool (proxmoxer is synchronous), all under one deadline,
  each VM with its own PveClient (its own retry record) over one shared HTTPS session;
- `vms_result`: the module's result, each VM's part under its inventory name; it names, for every VM that
  failed, its inventory name, VM id, PVE node and the error.
"""

from __future__ import annotations

import re
import time

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _diff, _errors, _fanout, _proxmox, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._proxmox_vm_info import check_vms

STATES = ('present', 'started', 'stopped', 'absent', 'reset')
DISK_KEY = 'scsi0'
CLOUDINIT_KEY = 'ide0'
CDROM_KEY = 'ide2'
NET_KEY = 'net0'
# Keys PVE applies to a running VM at once (its default hotplug set is network, disk, usb); the others
# go to the pending config until the next start. Only used to predict reboot_required in check mode.
LIVE_KEYS = ('name', 'description', 'onboot', 'tags', 'protection', 'startup', NET_KEY, DISK_KEY, CDROM_KEY)
# Cloud-init options: on a running VM PVE writes them into the config at once (fast-plug, qemu-server 9.2.6
# src/PVE/QemuServer.pm:4594-4611,4699-4707), not into [PENDING]; the guest sees them only when the cloud-init
# drive is generated again, at the next start (:5598-5611; hotplug has no `cloudinit` by default, :4941). So a
# change of them on a running VM is owed a restart, and GET /pending never shows it.
CLOUDINIT_KEYS = ('ipconfig0', 'nameserver', 'searchdomain')
NAME_RE = r'^(?=.{1,63}$)[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*$'
TAG_RE = r'^[a-zA-Z0-9_][a-zA-Z0-9_+.-]*$'
# run_vms: at most this many VMs are worked on at the same time (threads, and HTTPS connections to PVE).
MAX_WORKERS = 16

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
    # PVE takes only unicast MACs: the I/G bit (lowest bit of the first octet) clear (pve-common 9.2.1
    # src/PVE/JSONSchema.pm:456-466 pve_verify_mac_addr).
    if params.get('macaddr') is not None and not re.match(r'^[0-9A-Fa-f][02468aceACE](:[0-9A-Fa-f]{2}){5}$', params['macaddr']):
        raise _errors.ValidationError('macaddr', '%r is not a unicast MAC address like BC:24:11:00:00:01 (the second '
                                                 'hex digit must be even)' % params['macaddr'])
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


def plan(params, observed_config, observed_status, observed_pending=None, observed_drift=()):
    """What to do: (changed, [Action], diff) from the options and what was observed. Pure; no I/O.

    observed_config: the VM's current config, or None when there is no VM.
    observed_status: 'running', 'stopped' (or another PVE status), or None when there is no VM.
    observed_pending: key -> pending value (None: pending delete), from GET .../pending.
    observed_drift: cloud-init options the running VM's cloud-init drive does not have yet (GET .../cloudinit).
    With restart_on_change, a running VM whose cloud-init options change is shut down before the change and
    started after it: a run that ends between the two leaves a stopped VM, which the next run starts (and a
    start generates the cloud-init drive), so the restart is never lost - PVE does not list every such change
    afterwards (a changed ipconfig0 is not in GET .../cloudinit, qemu-server src/PVE/API2/Qemu.pm:1988).
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
        # Deleting purges the VM and its disks: only the VM this task names. A wrong vm_id must not delete another
        # VM (the preflight's taken-id check does not run before the day-two playbooks).
        if params.get('name') is not None and observed_config.get('name') != params['name']:
            raise _errors.ValidationError('vmid', 'VM %s on node %s is %s, not %r: refusing to delete another VM '
                                          '(check vm_id)' % (params['vmid'], params['node'],
                                                             'named %r' % observed_config['name']
                                                             if observed_config.get('name') else 'unnamed',
                                                             params['name']))
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
    cloudinit_changes = [k for k in list(values) + delete if k in CLOUDINIT_KEYS]
    restart_around = running and state != 'stopped' and params.get('restart_on_change') and cloudinit_changes
    if restart_around:
        actions.append(Action('shutdown'))
    if values or delete:
        actions.append(Action('update', values=values, delete=delete))
    if resize is not None:
        actions.append(resize)
    if restart_around:
        actions.append(Action('start'))
    elif state == 'started' and not running:
        actions.append(Action('start'))
    elif state == 'stopped' and running:
        actions.append(Action('shutdown'))
    elif running and params.get('restart_on_change'):
        cold = [k for k in list(values) + delete if k not in LIVE_KEYS]
        if cold or pending_keys(observed_config, observed_pending) or observed_drift:
            actions.append(Action('reboot'))
    if state in ('started', 'stopped'):
        after['status'] = 'running' if state == 'started' else 'stopped'
    # The after view keeps what is not managed as observed (disk shown as it will be).
    before_view = dict((k, v) for k, v in before.items() if k in after)
    return bool(actions), actions, _diff.make_diff(before_view, after)


def predict_reboot_required(params, actions, observed_config, observed_pending, observed_status, observed_drift=()):
    """Check mode's guess: changes to keys PVE cannot apply live (cloud-init options included: the guest sees
    them at the next start), on a VM that stays running; or pending changes or cloud-init drift already there."""
    if observed_status != 'running' or any(a.kind in ('shutdown', 'stop', 'delete', 'reboot') for a in actions):
        return False
    if pending_keys(observed_config, observed_pending) or observed_drift:
        return True
    for action in actions:
        if action.kind == 'update':
            keys = list(action.data['values']) + list(action.data['delete'])
            if any(k not in LIVE_KEYS for k in keys):
                return True
    return False


# ------------------------------------------------------------------------------- observe/act


class Observed(object):
    __slots__ = ('config', 'pending', 'status', 'lock', 'name', 'drift')

    def __init__(self, config=None, pending=None, status=None, lock=None, name=None, drift=()):
        self.config = config
        self.pending = pending or {}
        self.status = status
        self.lock = lock
        self.name = name
        self.drift = list(drift)


def has_cloudinit_drive(config):
    """Whether the VM config has a cloud-init drive (what canon() calls cloudinit on any IDE/SATA/SCSI slot)."""
    for key, value in (config or {}).items():
        if re.match(r'^(ide|sata|scsi)\d+$', key) and key != DISK_KEY and (canon(CLOUDINIT_KEY, value) or {}).get('cloudinit'):
            return True
    return False


def read_cloudinit_drift(client, node, vmid, subject=None):
    """The cloud-init options whose value differs from the one the VM's cloud-init drive was made from:
    GET .../cloudinit (qemu-server 9.2.6 src/PVE/API2/Qemu.pm:1921-2010) lists them with `pending` (changed or
    added since) or `delete`. PVE does not list a changed ipconfigN there (:1988 loops over $cloudinitoptions)."""
    items = client.get('nodes/%s/qemu/%s/cloudinit' % (node, vmid), 'read cloud-init drift', subject) or []
    drift = []
    for item in items:
        if not isinstance(item, dict) or not item.get('key'):
            continue
        if 'pending' in item or str(item.get('delete') or '0') not in ('0', ''):
            drift.append(str(item['key']))
    return sorted(set(drift))


def static_ipv4(config):
    """The address ipconfig0 gives the guest (`ip=192.0.2.11/24`), or None for DHCP or none."""
    ip = _proxmox.parse_props(str((config or {}).get('ipconfig0') or '')).get('ip') or ''
    address = ip.split('/', 1)[0]
    return address if re.match(r'^\d{1,3}(\.\d{1,3}){3}$', address) else None


def read_address_drift(client, node, vmid, config, subject=None):
    """['ipconfig0'] when the running guest reports addresses and none is the one ipconfig0 names, else [].

    PVE does not list a changed ipconfig0 among the cloud-init drift (read_cloudinit_drift), and the guest keeps the
    address of its cloud-init drive until the VM starts again, so a change made by a run that ended before the
    restart would be lost. The guest itself says what it runs: its agent's addresses. An agent that does not answer
    yet says nothing (no drift claimed); a refused agent privilege fails (PermissionDenied), as in the vms gate."""
    wanted = static_ipv4(config)
    if wanted is None:
        return []
    try:
        seen = [entry['address'] for entry in _proxmox.agent_ipv4_addresses(client, node, vmid, subject)]
    except _proxmox.PermissionDenied:
        raise
    except _errors.ApiError:
        return []
    return ['ipconfig0'] if seen and wanted not in seen else []


class VmRunner(object):
    """Observe and act on one VM through a PveClient."""

    def __init__(self, client, params):
        self.client = client
        self.params = params
        self.vmid = params['vmid']
        self.node = params['node']
        self.upids = []
        self.done = []
        # Cloud-init options this run changed on the running VM, not yet seen by it (no start since).
        self.unapplied_cloudinit = set()
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
        drift = []
        if status.get('status') == 'running' and has_cloudinit_drive(config):
            drift = read_cloudinit_drift(self.client, self.node, self.vmid, self.subject)
            if 'ipconfig0' not in drift:
                drift += read_address_drift(self.client, self.node, self.vmid, config, self.subject)
        return Observed(config, pending, status.get('status'), status.get('lock') or entry.get('lock'),
                        entry.get('name'), drift)

    def _task(self, method, path, operation, wait=True, **params):
        upid = self.client.run_task(method, path, self.node, operation, self.subject, self.task_timeout,
                                    self.interval, wait=wait, params=params)
        if isinstance(upid, str) and upid.startswith('UPID:'):
            self.upids.append(upid)
        return upid

    def act(self, action, wait=True, running=False):
        """Do one action. running: whether the VM ran when the plan was made (cloud-init bookkeeping)."""
        base = 'nodes/%s/qemu/%s' % (self.node, self.vmid)
        data = action.data
        if action.kind == 'update' and running:
            self.unapplied_cloudinit.update(k for k in list(data['values']) + list(data['delete']) if k in CLOUDINIT_KEYS)
        elif action.kind in ('shutdown', 'stop', 'start', 'reboot', 'delete'):
            self.unapplied_cloudinit.clear()
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
            if wait:
                self.await_power('running', 'start')
        elif action.kind == 'shutdown':
            self._task('post', base + '/status/shutdown', 'shutdown', wait=wait,
                       timeout=self.params['shutdown_timeout'], forceStop=1)
            if wait:
                self.await_power('stopped', 'shutdown')
        elif action.kind == 'stop':
            self._task('post', base + '/status/stop', 'stop', wait=wait)
            if wait:
                self.await_power('stopped', 'stop')
        elif action.kind == 'reboot':
            self._task('post', base + '/status/reboot', 'reboot', wait=wait, timeout=self.params['shutdown_timeout'])
        elif action.kind == 'reset':
            self._task('post', base + '/status/reset', 'reset', wait=wait)
        elif action.kind == 'delete':
            self._task('delete', base, 'delete', wait=wait, purge=1, **{'destroy-unreferenced-disks': 1})
        else:  # pragma: no cover - plan() makes only the kinds above
            raise _errors.ProxtalosError('unknown action %r' % action.kind)
        self.done.append(action.describe())

    def await_power(self, want, operation, clock=time.monotonic, sleep=time.sleep):
        """Wait until the VM's observed power state is `want` after its start/stop/shutdown task ended.

        For an HA-managed VM, PVE answers those with a `hastart`/`hastop` task that only asks the HA stack and
        ends before the VM's state changes (qemu-server 9.2.6 src/PVE/API2/Qemu.pm:3631-3642,3757-3768,
        3934-3945); a DELETE sent then fails "VM <id> is running - destroy failed" (:2842). For other VMs the
        state is there when the task ends, and this is one read.
        """
        path = 'nodes/%s/qemu/%s/status/current' % (self.node, self.vmid)

        started = clock()
        attempts = {'n': 0}

        def probe():
            attempts['n'] += 1
            try:
                status = self.client.request('get', path, 'read status', self.subject, retry=False) or {}
            except _errors.TransientApiError as exc:
                self.client.retried.append({'what': 'read status', 'error': str(exc),
                                            'elapsed': round(clock() - started, 3), 'attempt': attempts['n']})
                return False, str(exc)
            ha = status.get('ha') or {}
            note = ' (HA-managed, HA state %s)' % ha.get('state') if str(ha.get('managed') or 0) == '1' else ''
            return status.get('status') == want, 'VM is %s%s' % (status.get('status'), note)

        result = _wait.wait_for(probe, timeout=min(self.task_timeout, self.client.deadline.remaining()),
                                interval=min(0.2, self.interval), backoff=1.6, max_interval=self.interval,
                                clock=clock, sleep=sleep)
        if not result.ok:
            raise _errors.WaitTimeout('%s: the %s task ended, but the VM is not %s after %.0f s (last seen: %s)'
                                      % (self.subject, operation, want, result.elapsed, result.observation), result)

    def converge(self, deadline, clock=time.monotonic, sleep=time.sleep):
        """Apply the plan, observe again, and repeat until nothing is left to do or the deadline passes.

        A transient error (or a task that failed on a lock) is "not yet": the VM is observed again before
        anything is repeated. Permanent errors are raised at once.
        """
        last_error = {}

        def step():
            observed = self.observe()
            _changed, actions, _diff_unused = plan(self.params, observed.config, observed.status, observed.pending,
                                                   observed.drift)
            if not actions:
                return True, observed
            running = observed.status == 'running'
            try:
                for action in actions:
                    self.act(action, running=running)
                    if action.kind in ('shutdown', 'stop'):
                        running = False
                    if action.kind == 'reset':
                        return True, None
            except _errors.TransientApiError as exc:
                last_error['error'] = exc
                raise
            observed = self.observe()
            _changed, actions, _diff_unused = plan(self.params, observed.config, observed.status, observed.pending,
                                                   observed.drift)
            if not actions:
                return True, observed
            return False, 'still to do after applying: %s' % ', '.join(a.describe() for a in actions)

        def progress(observation, elapsed, attempts):
            self.client.retried.append({'what': 'converge', 'error': observation, 'elapsed': round(elapsed, 3),
                                        'attempt': attempts})

        result = _wait.wait_for(step, timeout=deadline.remaining(), interval=min(self.interval, _proxmox.FIRST_RETRY),
                                backoff=2.0, max_interval=max(self.interval, 10.0),
                                transient=(_errors.TransientApiError,), progress=_wait.Progress.from_environment(note=progress),
                                clock=clock, sleep=sleep)
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


def run(module_params, client, deadline, check_mode, warn, runner=None):
    """One VM: observe, plan and (outside check mode) act; returns the VM's part of the result, `diff` included.

    module_params: the VM's params (item_params of its item of `vms`).
    runner: the VmRunner to use (run_vms passes its own, to report what was done when the VM then fails).
    """
    runner = runner or VmRunner(client, module_params)
    observed = runner.observe()
    changed, actions, diff = plan(module_params, observed.config, observed.status, observed.pending, observed.drift)
    result = dict(changed=changed, vmid=module_params['vmid'], node=module_params['node'],
                  actions=[a.describe() for a in actions], upids=runner.upids, diff=diff)
    if check_mode or not actions:
        exists = observed.config is not None
        current = effective(observed.config, observed.pending) if exists else None
        result.update(status=observed.status or 'absent',
                      config=managed_view(module_params, current) if exists else {},
                      pending=sorted(set(pending_keys(observed.config, observed.pending)) | set(observed.drift))
                      if exists else [],
                      reboot_required=predict_reboot_required(module_params, actions, observed.config,
                                                              observed.pending, observed.status, observed.drift))
        return result
    if not module_params['wait']:
        for action in actions:
            runner.act(action, wait=False, running=observed.status == 'running')
        result.update(status=observed.status or 'absent', config={}, pending=[], reboot_required=False)
        return result
    final = runner.converge(deadline)
    result['actions'] = runner.done
    if final is None:
        final = runner.observe()
    exists = final.config is not None
    pending = []
    if exists:
        unapplied = runner.unapplied_cloudinit if final.status == 'running' else set()
        pending = sorted(set(pending_keys(final.config, final.pending)) | set(final.drift) | unapplied)
    result.update(status=final.status or 'absent', pending=pending, reboot_required=bool(pending),
                  config=managed_view(module_params, effective(final.config, final.pending)) if exists else {})
    if pending:
        warn('%s: %s pending until the VM restarts (set restart_on_change to apply at once)'
             % (runner.subject, ', '.join(pending)))
    return result


# ------------------------------------------------------------------------------ the list of VMs


def item_params(shared, item):
    """The params of one item of `vms` (what `run` takes): the shared (connection, wait) options plus the item's own.

    The item's `name` is the inventory host; the VM's PVE name is its `vm_name`, or that same name.
    """
    params = dict(shared)
    params.pop('vms', None)
    params.update((key, value) for key, value in item.items() if key != 'vm_name')
    params['name'] = item.get('vm_name') or item['name']
    return params


def validate_vms(vms, shared):
    """[(inventory name, params)] of the items, each validated; a bad item raises ValidationError('vms') naming it."""
    check_vms(vms)
    items = []
    for index, item in enumerate(vms):
        params = item_params(shared, item)
        try:
            validate(params)
        except _errors.ValidationError as exc:
            raise _errors.ValidationError('vms', 'item %d (%s): %s' % (index, item['name'], exc)) from exc
        items.append((item['name'], params))
    return items


class VmJob(object):
    """One VM of the run: its inventory name, params, and how it ended (result or error)."""

    def __init__(self, name, params, client):
        self.name = name
        self.params = params
        self.client = client
        self.runner = VmRunner(client, params)
        self.result = None
        self.error = None            # the ProxtalosError that ended this VM's run
        self.elapsed = None

    def label(self):
        """'lab-w-1 (VM 1021 on PVE node pve1)'."""
        return '%s (VM %s on PVE node %s)' % (self.name, self.params['vmid'], self.params['node'])

    def failure(self):
        """The failed VM's part of the result: the message, the error's details, and what was done before."""
        out = dict(self.error.details)
        out.update(msg='%s: %s' % (self.label(), self.error), vmid=self.params['vmid'], node=self.params['node'],
                   changed=bool(self.runner.done), actions=list(self.runner.done), upids=list(self.runner.upids),
                   retries=self.client.retried, elapsed=round(self.elapsed, 3))
        return out


class VmsOutcome(object):
    """run_vms's outcome: each VM's job, in the order of `vms`, and the largest number worked on at once."""

    def __init__(self, jobs, workers):
        self.jobs = jobs
        self.workers = workers

    @property
    def failed(self):
        return [job for job in self.jobs if job.error is not None]


def run_vms(items, make_client, deadline, check_mode, warn, max_workers=MAX_WORKERS, clock=time.monotonic):
    """Every VM in one process: each goes through run() on a _fanout.run_each worker, under one deadline.

    items: [(inventory name, params)] from validate_vms.
    make_client(): a PveClient for one VM (its own retry record; the HTTPS session is shared).
    PVE serialises what it must by itself - a VM's config lock, the storage lock of disk allocation - and a
    lock timeout is a transient error that the VM's converge loop rides out, as for concurrent module runs.
    Never raises for a VM that failed with a ProxtalosError (its job says why); other exceptions are bugs and
    propagate.
    """
    jobs = [VmJob(name, params, make_client()) for name, params in items]
    start = clock()

    def work(job):
        try:
            job.result = run(job.params, job.client, deadline, check_mode, warn, runner=job.runner)
        finally:
            job.elapsed = clock() - start

    fanout = _fanout.run_each(jobs, work, deadline, max_workers=max_workers, name=lambda job: job.name)
    for job, outcome in zip(jobs, fanout):
        job.error = outcome.error
        if job.elapsed is None:      # not started: its turn came after the deadline
            job.elapsed = clock() - start
    return VmsOutcome(jobs, fanout.most_at_once)


def vms_result(outcome, with_diff):
    """(ok, result dict, message) of run_vms's outcome, for exit_json / fail_json.

    vms: each VM that completed, under its inventory name, with its part of the result from run() (diff in diff mode).
    diff (diff mode): before/after of every changed VM, keyed by its inventory name.
    failed_vms: each VM that failed, with its message, the error's details and what was done before.
    retries: every VM's retried errors, each with the VM's inventory name under `vm`.
    """
    vms, before, after = {}, {}, {}
    for job in outcome.jobs:
        if job.error is not None:
            continue
        result = dict(job.result)
        diff = result.pop('diff')
        if with_diff:
            result['diff'] = diff
            if result['changed']:
                before[job.name] = diff['before']
                after[job.name] = diff['after']
        result.update(retries=job.client.retried, elapsed=round(job.elapsed, 3))
        vms[job.name] = result
    failed = outcome.failed
    result = dict(changed=any(vm['changed'] for vm in vms.values()) or any(job.runner.done for job in failed),
                  vms=vms, workers=outcome.workers,
                  retries=[dict(retry, vm=job.name) for job in outcome.jobs for retry in job.client.retried])
    if with_diff:
        result['diff'] = _diff.make_diff(before, after)
    if not failed:
        return True, result, None
    result['failed_vms'] = dict((job.name, job.failure()) for job in failed)
    reasons = '; '.join(result['failed_vms'][job.name]['msg'] for job in failed)
    message = '%d of %d VMs failed: %s' % (len(failed), len(outcome.jobs), reasons)
    return False, result, message
