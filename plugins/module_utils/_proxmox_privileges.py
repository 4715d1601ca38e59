# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Proxmox VE privileges the collection needs: the one table, per PVE major version. PRIVATE to the collection.

Every entry (a Need) says what needs it (the API calls), on which ACL path (a template filled per VM, node,
storage or bridge), which privilege, and the permission check of PVE it satisfies (upstream file, tag, line).
The preflight checks a token against it (proxmox_preflight), a 403 is explained with it (_proxmox.classify),
and docs/guide-proxmox.md shows it: the block between the `privileges` markers there is render_guide()
(tests/unit/plugins/module_utils/test_proxmox_privileges.py compares the two).

Upstream versions read: qemu-server 9.2.6 (e6352be6), pve-manager 14a22df3, pve-storage 9.1.7 (0c56bad),
pve-access-control 9.1.1 (5ccd07d); PVE 8 from qemu-server b92a40ce~1 (the last commit before the guest agent
privileges of PVE 9).
"""

from __future__ import annotations

import re

MAJORS = (8, 9)
NEWEST = 9


class Need(object):
    """One privilege the collection needs.

    key: a short id. calls: the API calls that need it. path: the ACL path template ({vmid}, {node}, {storage},
    {bridge}). privileges: major -> the privileges of which any one is enough; the first one is the one the
    documented role grants. alternative: (path, privileges-all-of) that PVE accepts instead, or None.
    acl: where the documented role is granted (an ACL path, with propagate). scope: what the preflight fills the
    path with - vm (each vm_id), vm_storage (vm_storage and vm_cloudinit_storage), image_storage, bridge (each
    vm_bridge), root; download_storage and download_node are checked only for a node that lacks the image.
    optional: not in the documented role, not checked by the preflight (a path the roles do not use).
    """

    def __init__(self, key, what, calls, path, privileges, source, acl, scope, alternative=None, optional=False,
                 propagate=True):
        self.key = key
        self.what = what
        self.calls = calls
        self.path = path
        self.privileges = privileges
        self.source = source
        self.acl = acl
        self.scope = scope
        self.alternative = alternative
        self.optional = optional
        self.propagate = propagate

    def privileges_for(self, major):
        return self.privileges.get(_major(major))

    def granted(self, major):
        """The privilege the documented role grants for it on this PVE major."""
        return self.privileges_for(major)[0]


def _same(*privileges):
    return dict((major, tuple(privileges)) for major in MAJORS)


VMS = '/vms'
QEMU = 'qemu-server 9.2.6 src/PVE/API2/Qemu.pm'
NEEDS = (
    Need('vm-allocate', 'create and delete the VMs', ('POST /nodes/{node}/qemu', 'DELETE /nodes/{node}/qemu/{vmid}'),
         '/vms/{vmid}', _same('VM.Allocate'),
         QEMU + ':1309 (create: VM.Allocate on /vms/{vmid}), :2776 destroy_vm permissions',
         VMS, 'vm'),
    Need('vm-audit', 'read the VMs: list, config, pending changes, cloud-init drift, power state',
         ('GET /cluster/resources', 'GET /nodes/{node}/qemu/{vmid}/pending', 'GET /nodes/{node}/qemu/{vmid}/cloudinit',
          'GET /nodes/{node}/qemu/{vmid}/status/current'),
         '/vms/{vmid}', _same('VM.Audit'),
         'pve-manager PVE/API2/Cluster.pm:588 (resources lists a VM only with VM.Audit); ' + QEMU
         + ':1859 (pending), :1923 (cloudinit), :3427 (status/current): VM.Audit', VMS, 'vm'),
    Need('vm-power', 'start, stop, shut down, reboot and reset the VMs',
         ('POST /nodes/{node}/qemu/{vmid}/status/start', 'POST .../status/stop', 'POST .../status/shutdown',
          'POST .../status/reboot', 'POST .../status/reset'),
         '/vms/{vmid}', _same('VM.PowerMgmt'), QEMU + ':3494 vm_start, :3682 vm_stop, :3804 vm_reset, :3857 vm_shutdown, :3973 vm_reboot (VM.PowerMgmt)',
         VMS, 'vm'),
    Need('vm-config-disk', 'set the system disk, the cloud-init drive and the boot order, grow the disk',
         ('POST /nodes/{node}/qemu (scsi0, ide0, boot)', 'PUT /nodes/{node}/qemu/{vmid}/config', 'PUT .../resize'),
         '/vms/{vmid}', _same('VM.Config.Disk'), QEMU + ':2273-2287 ($check_drive_perms: a disk on update), :847-851,1022-1023 (boot), :5940 (resize)',
         VMS, 'vm'),
    Need('vm-config-cdrom', 'put the Talos ISO in the CD-ROM drive', ('POST /nodes/{node}/qemu (ide2 media=cdrom)',),
         '/vms/{vmid}', _same('VM.Config.CDROM'),
         QEMU + ':2275-2285 ($check_drive_perms: a CD-ROM, and with VM.Config.Cloudinit the cloud-init drive)', VMS, 'vm'),
    Need('vm-config-cpu', 'set cores, sockets and CPU type', ('POST /nodes/{node}/qemu', 'PUT .../config'),
         '/vms/{vmid}', _same('VM.Config.CPU'), QEMU + ':789-799,1008-1009 ($cpuoptions)', VMS, 'vm'),
    Need('vm-config-memory', 'set the memory', ('POST /nodes/{node}/qemu', 'PUT .../config'),
         '/vms/{vmid}', _same('VM.Config.Memory'), QEMU + ':801-806,1010-1011 ($memoryoptions)', VMS, 'vm'),
    Need('vm-config-network', 'set the NIC (net0: model, MAC, bridge, VLAN tag)', ('POST /nodes/{node}/qemu', 'PUT .../config'),
         '/vms/{vmid}', _same('VM.Config.Network'), QEMU + ':1024-1025 (net\\d+)', VMS, 'vm'),
    Need('vm-config-options', 'set name, description, tags, onboot, OS type, guest agent',
         ('POST /nodes/{node}/qemu', 'PUT .../config'),
         '/vms/{vmid}', _same('VM.Config.Options'), QEMU + ':823-841,1014-1015 ($generaloptions)', VMS, 'vm'),
    Need('vm-config-hwtype', 'set the SCSI controller, machine type, serial console socket',
         ('POST /nodes/{node}/qemu', 'PUT .../config'),
         '/vms/{vmid}', _same('VM.Config.HWType'), QEMU + ':808-821,1012-1013 ($hwtypeoptions), :870-881 (serial socket)',
         VMS, 'vm'),
    Need('vm-config-cloudinit', 'set the cloud-init values: ipconfig0, nameserver, searchdomain',
         ('POST /nodes/{node}/qemu', 'PUT .../config'),
         '/vms/{vmid}', _same('VM.Config.Cloudinit', 'VM.Config.Network'),
         QEMU + ':853-862,1026-1029 (cloud-init options: VM.Config.Cloudinit or VM.Config.Network)', VMS, 'vm'),
    Need('vm-guest-agent', "read the guest agent's addresses (the vms gate, address discovery)",
         ('GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces',),
         '/vms/{vmid}', {8: ('VM.Monitor',), 9: ('VM.GuestAgent.Audit', 'VM.GuestAgent.Unrestricted')},
         'qemu-server 9.2.6 src/PVE/API2/Qemu/Agent.pm:65-67,184 (PVE 9: VM.GuestAgent.Audit or '
         'VM.GuestAgent.Unrestricted); qemu-server b92a40ce~1 src/PVE/API2/Qemu/Agent.pm:147-148 (PVE 8: VM.Monitor)',
         VMS, 'vm'),
    Need('storage-space', 'allocate the VM disks and cloud-init drives', ('POST /nodes/{node}/qemu', 'PUT .../config'),
         '/storage/{storage}', _same('Datastore.AllocateSpace'),
         QEMU + ':186-190 ($check_storage_access: a new disk needs Datastore.AllocateSpace)', '/storage', 'vm_storage'),
    Need('image-read', 'list the image storage (is the ISO there?), attach the ISO to a VM',
         ('GET /nodes/{node}/storage/{storage}/content', 'POST /nodes/{node}/qemu (ide2)'),
         '/storage/{storage}', _same('Datastore.Audit', 'Datastore.AllocateSpace'),
         'pve-storage 9.1.7 src/PVE/API2/Storage/Content.pm:27-31 (index: Datastore.Audit or AllocateSpace); '
         'src/PVE/Storage.pm check_volume_access (an ISO: the same)', '/storage', 'image_storage'),
    Need('image-download', 'have PVE download the Talos ISO (proxmox_image)',
         ('POST /nodes/{node}/storage/{storage}/download-url',),
         '/storage/{storage}', _same('Datastore.AllocateTemplate'),
         'pve-storage 9.1.7 src/PVE/API2/Storage/Status.pm:750', '/storage', 'download_storage'),
    Need('image-network', 'have PVE fetch a URL (the preflight asks about the image URL; the download)',
         ('GET /nodes/{node}/query-url-metadata', 'POST /nodes/{node}/storage/{storage}/download-url'),
         '/nodes/{node}', _same('Sys.AccessNetwork'),
         'pve-storage 9.1.7 src/PVE/API2/Storage/Status.pm:747-754 and pve-manager PVE/API2/Nodes.pm:1899-1905 '
         '(Sys.AccessNetwork on the node, or Sys.Audit and Sys.Modify on /; PVE 8.1 and later)',
         '/nodes', 'download_node', alternative=('/', ('Sys.Audit', 'Sys.Modify'))),
    Need('cluster-status', 'read the quorum (the preflight)', ('GET /cluster/status',),
         '/', _same('Sys.Audit'), 'pve-manager PVE/API2/Cluster.pm:872 (status: Sys.Audit on /)', '/', 'root',
         propagate=False),
    Need('bridge-use', 'attach a NIC to vm_bridge (and see it in the node network list); zone localnetwork for a '
         'plain bridge, the VNet\'s zone for an SDN VNet; with vm_vlan, SDN.Use on .../<vlan> is enough',
         ('POST /nodes/{node}/qemu (net0)', 'PUT .../config (net0)', 'GET /nodes/{node}/network?type=any_bridge'),
         '/sdn/zones/{zone}/{bridge}', _same('SDN.Use'),
         'qemu-server 9.2.6 src/PVE/QemuServer.pm:6417-6430 (check_bridge_access), pve-guest-common '
         'GuestHelpers.pm check_vnet_access (SDN.Use on the zone/bridge, and /<tag> with a VLAN tag); '
         'pve-manager PVE/API2/Network.pm:470-480 (the list shows a bridge with SDN.Audit or SDN.Use)',
         '/sdn/zones/localnetwork', 'bridge'),
    Need('image-delete', 'delete the ISO (proxmox_image state: absent; no role does this)',
         ('DELETE /nodes/{node}/storage/{storage}/content/{volume}',),
         '/storage/{storage}', _same('Datastore.Allocate'),
         'pve-storage 9.1.7 src/PVE/API2/Storage/Content.pm:459,506', '/storage', 'image_storage', optional=True),
)


def _major(major):
    """The table's major for a PVE version (an int, '9', '9.1.1' or '9.1-2'); None means the newest."""
    if major is None:
        return NEWEST
    try:
        number = int(str(major).split('.', maxsplit=1)[0].split('-', maxsplit=1)[0])
    except ValueError:
        return NEWEST
    return min(max(number, MAJORS[0]), MAJORS[-1])


def major_of(version):
    """The table's major for a GET /version answer's `version` ('9.1.1'), and whether the table knows it."""
    try:
        number = int(str(version).split('.', maxsplit=1)[0])
    except (TypeError, ValueError):
        return NEWEST, False
    return _major(number), number in MAJORS


def role(major, acl=None):
    """The documented role: {acl path: [privileges]} (every required Need's granted privilege, by ACL path)."""
    out = {}
    for need in NEEDS:
        if need.optional or (acl is not None and need.acl != acl):
            continue
        privileges = out.setdefault(need.acl, [])
        if need.granted(major) not in privileges:
            privileges.append(need.granted(major))
    return out


def required(scope=None):
    """The Needs the preflight checks (not optional), of one scope or all."""
    return [n for n in NEEDS if not n.optional and (scope is None or n.scope == scope)]


def for_call(method, path):
    """The Needs of one API call (method, 'nodes/pve1/qemu/101/agent/network-get-interfaces'), most specific first."""
    parts = [p for p in path.strip('/').split('/') if p]
    found = []
    for need in NEEDS:
        for call in need.calls:
            verb, _sep, template = call.partition(' ')
            template = template.split(' ', maxsplit=1)[0].split('?', maxsplit=1)[0]
            if template.startswith('.../'):
                template = '/nodes/{node}/qemu/{vmid}/' + template[4:]
            if verb != method.upper():
                continue
            pattern = [p for p in template.strip('/').split('/') if p]
            if len(pattern) == len(parts) and all(t.startswith('{') or t == p for t, p in zip(pattern, parts)):
                found.append(need)
                break
    return found


def _major_refused(need, refused):
    """The PVE major whose privilege PVE's 403 text names, when only one major's list for this need has it.

    PVE words a refusal `Permission check failed (/vms/101, VM.Monitor)`: pve-common 9.2.1 src/PVE/Exception.pm:53-60
    raise_perm_exc, with the path and the privilege (check, pve-access-control 9.1.1 src/PVE/RPCEnvironment.pm:300)
    or the privileges joined by | (check_any, :325)."""
    if not refused:
        return None
    found = re.search(r'Permission check failed \(([^,()]+), ([^()]+)\)', str(refused))
    if not found:
        return None
    asked = set(p.strip() for p in re.split(r'[|,]', found.group(2)) if p.strip())
    majors = [major for major in MAJORS if asked & set(need.privileges_for(major))]
    return majors[0] if len(majors) == 1 else None


def explain_403(method, path, major=None, refused=None):
    """What the table says the call needs, in words, or '' for a call it does not list.

    'the token needs VM.GuestAgent.Audit (or VM.GuestAgent.Unrestricted) on /vms/101 (PVE 9; VM.Monitor on PVE 8)
    to read ...'. major: the PVE major when known; None names both where they differ, unless refused (PVE's own
    403 text) names a privilege of one major only: then that major's.
    """
    parts = [p for p in path.strip('/').split('/') if p]
    values = {}
    if len(parts) >= 2 and parts[0] == 'nodes':
        values['node'] = parts[1]
    if len(parts) >= 4 and parts[2] in ('qemu', 'storage'):
        values['vmid' if parts[2] == 'qemu' else 'storage'] = parts[3]
    texts = []
    for need in for_call(method, path):
        acl_path = need.path
        for name, value in values.items():
            acl_path = acl_path.replace('{%s}' % name, value)
        known = major if major is not None else _major_refused(need, refused)
        shown = [_major(known)] if known is not None else list(reversed(MAJORS))
        variants = []
        for each in shown:
            privileges = need.privileges_for(each)
            text = privileges[0] + (' (or %s)' % ', '.join(privileges[1:]) if privileges[1:] else '')
            if not variants or variants[-1][1] != text:
                variants.append((each, text))
        if len(variants) == 1:
            text = '%s on %s' % (variants[0][1], acl_path)
        else:
            text = '%s on %s (PVE %d; %s)' % (variants[0][1], acl_path, variants[0][0],
                                              '; '.join('%s on PVE %d' % (t, m) for m, t in variants[1:]))
        if need.alternative:
            text += ' (or %s on %s)' % (' and '.join(need.alternative[1]), need.alternative[0])
        texts.append(text + ' to ' + need.what)
    if not texts:
        return ''
    return 'the credentials need %s (the role in docs/guide-proxmox.md)' % '; '.join(texts)


# ------------------------------------------------------------------------------------------------ guide

def render_guide():
    """The privileges section of docs/guide-proxmox.md (between its `privileges` markers)."""
    acls = []
    for need in NEEDS:
        if not need.optional and (need.acl, need.propagate) not in acls:
            acls.append((need.acl, need.propagate))
    lines = ['```sh', 'pveum user add proxtalos@pve --comment "proxtalos.cluster"',
             'pveum user token add proxtalos@pve proxtalos --privsep 1      # prints the secret once', '']
    for major in MAJORS:
        lines.append('# PVE %d' % major)
        for acl, propagate in acls:
            name = _role_name(acl)
            lines.append('pveum role add %s --privs "%s"' % (name, ','.join(role(major, acl)[acl])))
        lines.append('')
    lines.append('# both versions: the same ACLs for the user and for its token')
    for acl, propagate in acls:
        for who in ('--users proxtalos@pve', '--tokens proxtalos@pve!proxtalos'):
            lines.append('pveum acl modify %s %s --roles %s%s' % (acl, who, _role_name(acl),
                                                                  '' if propagate else ' --propagate 0'))
    lines += ['```', '', '| privilege (PVE 9) | PVE 8 | on | what needs it | PVE checks it in |', '|---|---|---|---|---|']
    for need in NEEDS:
        nine, eight = need.privileges_for(9), need.privileges_for(8)
        cell9 = ' or '.join('`%s`' % p for p in nine)
        cell8 = 'the same' if nine == eight else ' or '.join('`%s`' % p for p in eight)
        where = '`%s`' % need.path
        if need.alternative:
            cell9 += ' (or %s on `%s`)' % (' + '.join('`%s`' % p for p in need.alternative[1]), need.alternative[0])
        what = need.what + (' - optional, not in the role' if need.optional else '')
        lines.append('| %s | %s | %s | %s | %s |' % (cell9, cell8, where, what, need.source.replace('|', '/')))
    return '\n'.join(lines)


def _role_name(acl):
    names = {'/vms': 'ProxtalosVMs', '/storage': 'ProxtalosStorage', '/nodes': 'ProxtalosNodes', '/': 'ProxtalosAudit',
             '/sdn/zones/localnetwork': 'ProxtalosBridges'}
    return names[acl]
