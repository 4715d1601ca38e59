#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_preflight
short_description: Check a cluster's VM definitions against each other and against Proxmox VE, before anything is created
version_added: 0.1.0
description:
  - Takes every VM of the cluster at once (one entry per inventory host, with the inventory's variable names) and
    reports every problem it finds, each with the host, the inventory variable and the reason. It fails when there
    is at least one problem, and it never changes anything.
  - Inventory checks, without PVE - vm_id present, in range and unique; VM names valid DNS names and unique;
    node_ip addresses valid, unique, not one of O(reserved_addresses), with node_prefix, and a node_gateway inside
    the node's subnet; each host either a control plane or a worker; an odd number (at least one) of control
    planes, since etcd needs a majority; cores, memory and disk at least Talos' minimums.
  - PVE checks (O(check_pve=true)) - the API answers and accepts the credentials (a TLS failure names
    pve_ca_path); the cluster is quorate; every vm_pve_node exists and is online; on each of those nodes, vm_storage
    (and the cloud-init storage) exists, is active and holds VM images, and has room for the disks of the VMs still
    to be created (vm_disk_gb, or the role's minimum O(minimums) C(disk_gb) when unset, as a lower bound; so a full
    storage is caught before some VMs are created and others fail), vm_bridge exists as a bridge, and the
    image storage holds O(image) content; the Talos image is on the storage of every node, or PVE can fetch its URL
    (C(query-url-metadata)) and the credentials may download it (C(Datastore.AllocateTemplate) on the storage and
    C(Sys.AccessNetwork) on the node, or C(Sys.Audit) and C(Sys.Modify) on C(/)); the credentials hold every privilege
    of the collection's privilege table for the PVE major version found (8 or 9; the guide's role), each missing one
    named with its ACL path and what needs it; no vm_id is already taken by a different VM (another name, or
    another node).
  - Written as one read-only module, rather than with M(community.proxmox.proxmox_node_info) and friends, so that
    all problems come back in one list with the inventory's names, and so that the same connection options
    (including O(ca_path)) and error mapping as the other modules are used.
author:
  - proxtalos.cluster contributors (@proxtalos)
options:
  vms:
    description:
      - One entry per cluster host. Keys are the inventory variables; unknown keys are ignored.
      - C(host) (required) - the inventory host name.
      - C(role) - V(controlplane) or V(worker) (from the host's groups).
      - C(vm_name) - the VM name; defaults to C(host).
      - C(vm_id), C(vm_pve_node), C(vm_cores), C(vm_memory_mb), C(vm_disk_gb), C(vm_bridge), C(vm_vlan), C(vm_storage),
        C(vm_cloudinit_storage), C(node_ip), C(node_prefix), C(node_gateway).
    type: list
    elements: dict
    required: true
  image:
    description:
      - The Talos image the VMs boot from - C(storage), C(filename), C(url), and C(content) (default V(iso)).
      - When not set, the image is not checked.
    type: dict
  reserved_addresses:
    description:
      - Addresses no node may use, each C(name) (the variable, for the message) and C(address); for example the
        cluster endpoint's virtual IP.
    type: list
    elements: dict
    default: []
  check_pve:
    description: Also check the PVE side. With V(false), only the inventory is checked and no API call is made.
    type: bool
    default: true
  minimums:
    description:
      - Smallest C(cores), C(memory_mb) and C(disk_gb) per role. The defaults are Talos' documented minimums.
    type: dict
    default:
      controlplane: {cores: 2, memory_mb: 2048, disk_gb: 10}
      worker: {cores: 1, memory_mb: 1024, disk_gb: 10}
extends_documentation_fragment:
  - proxtalos.cluster._proxmox_auth
  - proxtalos.cluster._wait
  - proxtalos.cluster._attributes
  - proxtalos.cluster._attributes.INFO_MODULE
notes:
  - O(wait_timeout) bounds the retries of transient API errors; keep it short here, a preflight should fail fast.
seealso:
  - module: proxtalos.cluster.proxmox_vm
  - module: proxtalos.cluster.proxmox_image
"""

EXAMPLES = r"""
- name: Check the cluster before creating anything
  proxtalos.cluster.proxmox_preflight:
    api_host: pve.example.com
    api_user: automation@pve
    api_token_id: proxtalos
    api_token_secret: "{{ vault_pve_token_secret }}"
    ca_path: /etc/ssl/pve-ca.pem
    wait_timeout: 30
    vms:
      - {host: infra-cp-1, role: controlplane, vm_id: 811, vm_pve_node: pve1, vm_bridge: vmbr0, vm_storage: local-lvm,
         vm_cores: 4, vm_memory_mb: 8192, vm_disk_gb: 40, node_ip: 10.20.0.11, node_prefix: 24, node_gateway: 10.20.0.1}
      - {host: infra-w-1, role: worker, vm_id: 821, vm_pve_node: pve2, vm_bridge: vmbr0, vm_storage: local-lvm,
         vm_cores: 4, vm_memory_mb: 8192, vm_disk_gb: 60}
    image:
      storage: local
      filename: talos-v1.13.9-ce4c9805-nocloud-amd64.iso
      url: https://factory.talos.dev/image/ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515/v1.13.9/nocloud-amd64.iso
    reserved_addresses:
      - {name: cluster_endpoint_host, address: 10.20.0.10}
"""

RETURN = r"""
problems:
  description: Every problem found, each with the host (or C(all)), the inventory variable and the reason.
  returned: always
  type: list
  elements: dict
  sample: [{"host": "infra-cp-2", "field": "vm_id", "reason": "811 is also the vm_id of infra-cp-1"}]
checks:
  description: Every check that ran, with whether it passed.
  returned: always
  type: list
  elements: dict
  sample: [{"check": "PVE API answers and accepts the credentials", "ok": true}]
pve:
  description: What was learnt from PVE - version, nodes with their status, and where the image already is.
  returned: when O(check_pve=true)
  type: dict
retries:
  description: Transient API errors that were met and retried.
  returned: always
  type: list
  elements: dict
"""

import ipaddress
import re
import time
import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _errors, _proxmox, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils import _proxmox_privileges as _privileges

ROLES = ('controlplane', 'worker')
DNS_LABEL = re.compile(r'^(?=.{1,63}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?$', re.I)
GIB = 1024 ** 3
DEFAULT_MINIMUMS = {'controlplane': {'cores': 2, 'memory_mb': 2048, 'disk_gb': 10},
                    'worker': {'cores': 1, 'memory_mb': 1024, 'disk_gb': 10}}
# GET /nodes/{node}/network?type=any_bridge lists Linux and OVS bridges and the SDN VNets the credentials may see
# (pve-manager PVE/API2/Network.pm:425-452; pve-network src/PVE/Network/SDN.pm:311-352: type vnet, no zone).
BRIDGE_TYPES = ('bridge', 'OVSBridge', 'vnet')


def argument_spec():
    return _argspec.spec(
        _argspec.PROXMOX_AUTH_SPEC, _argspec.WAIT_SPEC,
        vms=dict(type='list', elements='dict', required=True),
        image=dict(type='dict'),
        reserved_addresses=dict(type='list', elements='dict', default=[]),
        check_pve=dict(type='bool', default=True),
        minimums=dict(type='dict', default=DEFAULT_MINIMUMS),
    )


class Report(object):
    """Problems and checks, in the order found."""

    def __init__(self):
        self.problems = []
        self.checks = []

    def problem(self, host, field, reason):
        entry = {'host': host, 'field': field, 'reason': reason}
        if entry not in self.problems:
            self.problems.append(entry)

    def check(self, name, ok, detail=None):
        entry = {'check': name, 'ok': bool(ok)}
        if detail:
            entry['detail'] = detail
        self.checks.append(entry)
        return ok

    def message(self):
        count = len(self.problems)
        lines = ['preflight found %d problem%s; nothing was created:' % (count, '' if count == 1 else 's')]
        lines += ['- %s: %s: %s' % (p['host'], p['field'], p['reason']) for p in self.problems]
        return '\n'.join(lines)


def _int(value):
    if isinstance(value, bool):
        return None
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _blank(value):
    return value is None or (isinstance(value, str) and not value.strip())


# --------------------------------------------------------------------------- inventory


def check_inventory(vms, reserved, minimums, report):
    """Checks that need no API: ids, names, addresses, roles and sizes."""
    seen_ids, seen_names, seen_ips = {}, {}, {}
    reserved_ips = {}
    for item in reserved or []:
        try:
            reserved_ips[str(ipaddress.ip_address(str(item.get('address', '')).strip()))] = item.get('name', 'reserved')
        except ValueError:
            report.problem('all', item.get('name', 'reserved_addresses'), '%r is not an IP address'
                           % item.get('address'))
    roles = {'controlplane': [], 'worker': []}
    for vm in vms:
        host = vm['host']
        vmid = _int(vm.get('vm_id'))
        if _blank(vm.get('vm_id')):
            report.problem(host, 'vm_id', 'missing; every VM needs a fixed PVE id (100-999999999)')
        elif vmid is None or not 100 <= vmid <= 999999999:
            report.problem(host, 'vm_id', '%r is not an id between 100 and 999999999' % vm.get('vm_id'))
        elif vmid in seen_ids:
            report.problem(host, 'vm_id', '%d is also the vm_id of %s' % (vmid, seen_ids[vmid]))
        else:
            seen_ids[vmid] = host
        name = str(vm.get('vm_name') or host)
        if not DNS_LABEL.match(name):
            report.problem(host, 'vm_name' if vm.get('vm_name') else 'inventory_hostname',
                           '%r is not a valid VM name (a DNS label: letters, digits and "-", at most 63 characters)'
                           % name)
        elif name.lower() in seen_names:
            report.problem(host, 'vm_name' if vm.get('vm_name') else 'inventory_hostname',
                           'VM name %r is also used by %s' % (name, seen_names[name.lower()]))
        else:
            seen_names[name.lower()] = host
        if _blank(vm.get('vm_pve_node')):
            report.problem(host, 'vm_pve_node', 'missing; the PVE node that holds the VM')
        for field in ('vm_bridge', 'vm_storage'):
            if _blank(vm.get(field)):
                report.problem(host, field, 'missing')
        _check_address(vm, host, seen_ips, reserved_ips, report)
        role = vm.get('role')
        if role not in ROLES:
            report.problem(host, 'groups', 'the host must be in exactly one of the groups controlplane and worker '
                                           '(found: %s)' % (role or 'neither'))
        else:
            roles[role].append(host)
            _check_size(vm, host, role, minimums, report)
    count = len(roles['controlplane'])
    if count == 0:
        report.problem('controlplane', 'groups', 'no control plane; at least one host must be in the group '
                                                 'controlplane')
    elif count % 2 == 0:
        report.problem('controlplane', 'groups', '%d control planes (%s): etcd needs an odd number to keep a '
                                                 'majority; use %d or %d' % (count, ', '.join(roles['controlplane']),
                                                                             count - 1, count + 1))
    report.check('vm_id, names and addresses are unique and valid; control planes are an odd number',
                 not report.problems)
    return roles


def _check_address(vm, host, seen_ips, reserved_ips, report):
    if _blank(vm.get('node_ip')):
        return
    try:
        address = ipaddress.IPv4Address(str(vm['node_ip']).strip())
    except ValueError:
        report.problem(host, 'node_ip', '%r is not an IPv4 address' % vm['node_ip'])
        return
    text = str(address)
    if text in seen_ips:
        report.problem(host, 'node_ip', '%s is also the node_ip of %s' % (text, seen_ips[text]))
    else:
        seen_ips[text] = host
    if text in reserved_ips:
        report.problem(host, 'node_ip', '%s is the %s' % (text, reserved_ips[text]))
    prefix = _int(vm.get('node_prefix'))
    if _blank(vm.get('node_prefix')):
        report.problem(host, 'node_prefix', 'missing; a static node_ip needs its prefix length (e.g. 24)')
        return
    if prefix is None or not 1 <= prefix <= 32:
        report.problem(host, 'node_prefix', '%r is not a prefix length between 1 and 32' % vm.get('node_prefix'))
        return
    network = ipaddress.IPv4Network('%s/%d' % (text, prefix), strict=False)
    if prefix < 31 and address in (network.network_address, network.broadcast_address):
        report.problem(host, 'node_ip', '%s is the network or broadcast address of %s' % (text, network))
    if _blank(vm.get('node_gateway')):
        return
    try:
        gateway = ipaddress.IPv4Address(str(vm['node_gateway']).strip())
    except ValueError:
        report.problem(host, 'node_gateway', '%r is not an IPv4 address' % vm['node_gateway'])
        return
    if gateway not in network:
        report.problem(host, 'node_gateway', '%s is outside the node subnet %s' % (gateway, network))
    elif gateway == address:
        report.problem(host, 'node_gateway', 'is the node_ip itself')


def _check_size(vm, host, role, minimums, report):
    lows = (minimums or DEFAULT_MINIMUMS).get(role) or DEFAULT_MINIMUMS[role]
    for field, key, unit in (('vm_cores', 'cores', ''), ('vm_memory_mb', 'memory_mb', ' MiB'),
                             ('vm_disk_gb', 'disk_gb', ' GiB')):
        if _blank(vm.get(field)):
            continue
        value = _int(vm.get(field))
        if value is None:
            report.problem(host, field, '%r is not a whole number' % vm.get(field))
        elif value < int(lows[key]):
            report.problem(host, field, '%d%s is below the Talos minimum of %d%s for a %s'
                           % (value, unit, int(lows[key]), unit, role.replace('controlplane', 'control plane')))


# ------------------------------------------------------------------------------- PVE


def has_privilege(permissions, path, privilege):
    """Whether the permissions map (GET /access/permissions) grants privilege on path, directly or inherited."""
    parts = path.rstrip('/').split('/')
    candidates = ['/'.join(parts[:i]) or '/' for i in range(len(parts), 0, -1)]
    for index, candidate in enumerate(candidates):
        granted = (permissions or {}).get(candidate) or {}
        if privilege in granted:
            inherited = index > 0
            if not inherited or str(granted[privilege]) in ('1', 'True', 'true'):
                return True
    return False


def _api_problem(report, exc, params):
    """Turn a failure of the first call into the problem that names the right inventory variable."""
    text = str(exc)
    status = exc.details.get('status') if isinstance(exc, _errors.ProxtalosError) else None
    where = _proxmox.endpoint(params)
    if status == 401:
        field = 'pve_api_token_id' if params.get('api_token_id') else 'pve_api_password'
        report.problem('all', field, 'PVE at %s refused the credentials of %s: %s' % (where, params['api_user'], text))
    elif isinstance(exc, _errors.ProxtalosError) and exc.details.get('tls') == 'hostname':
        report.problem('all', 'pve_api_host', 'the certificate of PVE at %s does not name %s: %s'
                       % (where, params.get('api_host'), text))
    elif 'TLS verification' in text:
        report.problem('all', 'pve_ca_path', 'the certificate of PVE at %s does not verify: %s' % (where, text))
    elif isinstance(exc, _errors.TransientApiError):
        report.problem('all', 'pve_api_host', 'PVE API at %s is not reachable: %s' % (where, text))
    else:
        report.problem('all', 'pve_api_host', 'PVE API at %s: %s' % (where, text))


def check_pve(client, params, vms, image, report):
    """PVE-side checks. Returns what was learnt."""
    learnt = {}
    try:
        version = client.get('version', 'read version')
    except _errors.ProxtalosError as exc:
        _api_problem(report, exc, params)
        report.check('PVE API answers and accepts the credentials', False)
        return learnt
    learnt['version'] = (version or {}).get('version')
    report.check('PVE API answers and accepts the credentials', True, 'PVE %s' % learnt['version'])

    status = client.get('cluster/status', 'read cluster status') or []
    cluster = [item for item in status if item.get('type') == 'cluster']
    if cluster and not int(cluster[0].get('quorate', 1)):
        report.problem('all', 'pve_api_host', 'the PVE cluster %s has no quorum: VMs cannot be created or changed'
                       % cluster[0].get('name'))
    report.check('PVE cluster is quorate', not cluster or int(cluster[0].get('quorate', 1)))

    nodes = dict((n.get('node'), n.get('status')) for n in client.get('nodes', 'list nodes') or [])
    learnt['nodes'] = nodes
    usable = set()
    for vm in vms:
        node = vm.get('vm_pve_node')
        if _blank(node):
            continue
        if node not in nodes:
            report.problem(vm['host'], 'vm_pve_node', 'PVE has no node %r (nodes: %s)' % (node, ', '.join(sorted(nodes))))
        elif nodes[node] != 'online':
            report.problem(vm['host'], 'vm_pve_node', 'PVE node %r is %s' % (node, nodes[node]))
        else:
            usable.add(node)
    report.check('every vm_pve_node exists and is online', all(
        vm.get('vm_pve_node') in usable for vm in vms if not _blank(vm.get('vm_pve_node'))))

    permissions = client.get('access/permissions', 'read own permissions') or {}
    existing = dict((str(r.get('vmid')), r) for r in client.get('cluster/resources', 'list VMs', type='vm') or [])
    learnt['image'] = {}
    shared_space = {}
    for node in sorted(usable):
        on_node = [vm for vm in vms if vm.get('vm_pve_node') == node]
        to_create = [vm for vm in on_node if str(_int(vm.get('vm_id'))) not in existing]
        try:
            _check_node(client, node, on_node, image, permissions, learnt, report, to_create, params.get('minimums'),
                        shared_space)
        except _errors.ApiError as exc:
            if exc.status == 403:
                # Refused, not unreachable: the privilege check below names what is missing.
                report.problem('all', 'pve_api_token_id' if params.get('api_token_id') else 'pve_api_user',
                               'PVE node %s refused a read: %s' % (node, exc))
                continue
            for vm in on_node:
                report.problem(vm['host'], 'vm_pve_node', 'PVE node %s does not answer: %s' % (node, exc))
    check_space_of_shared(shared_space, report)
    report.check('storages and bridges exist on the VMs\' nodes', not any(
        p['field'] in ('vm_storage', 'vm_bridge', 'vm_cloudinit_storage') for p in report.problems))
    if image:
        report.check('the Talos image is on PVE storage or PVE can download it',
                     not any(p['field'].startswith('talos_image') for p in report.problems))

    _check_privileges(vms, permissions, params, report, learnt.get('version'), image, learnt.pop('bridges', None))
    report.check('storages have room for the disks of the VMs to create',
                 not any(p['reason'].startswith('no room') for p in report.problems))
    _check_taken_ids(existing, vms, report)
    return learnt


def _storages(client, node):
    listed = client.get('nodes/%s/storage' % node, 'list storages', 'node %s' % node) or []
    return dict((s.get('storage'), s) for s in listed)


def _check_space(node, to_create, storages, minimums, report, space=None):
    """Each storage has room for the disks of the VMs still to be created on it (a lower bound of what they need).

    A shared storage (PVE's `shared` flag: Ceph RBD, NFS, ...) has one pool for every node, and its `avail` is that
    pool's: its disks are added up over the nodes in `space` and judged once by check_space_of_shared(). Thin pools
    (LVM-thin, ZFS, RBD) are counted as if thick, on purpose: PVE creates their disks beyond `avail`, but writing them
    fails once the pool is full.
    """
    wanted = {}
    for vm in to_create:
        name = vm.get('vm_storage')
        store = storages.get(name) if not _blank(name) else None
        if store is None or store.get('avail') is None:
            continue
        size = _int(vm.get('vm_disk_gb'))
        if size is None:
            size = _int(((minimums or DEFAULT_MINIMUMS).get(vm.get('role')) or {}).get('disk_gb')) or 0
        if space is not None and str(store.get('shared', 0)) in ('1', 'True', 'true'):
            entry = space.setdefault(name, {'free': int(store['avail']), 'disks': [], 'nodes': []})
            entry['disks'].append((vm['host'], size))
            if node not in entry['nodes']:
                entry['nodes'].append(node)
            continue
        wanted.setdefault(name, []).append((vm['host'], size))
    for name, disks in sorted(wanted.items()):
        _room(name, 'on PVE node %s' % node, int(storages[name]['avail']), disks, report)


def check_space_of_shared(space, report):
    """The shared storages' room, once for all the nodes that create VMs on them."""
    for name, entry in sorted((space or {}).items()):
        _room(name, '(shared by PVE nodes %s)' % ', '.join(sorted(entry['nodes'])), entry['free'], entry['disks'], report)


def _room(name, where, free, disks, report):
    need = sum(size for _host, size in disks)
    if need and free < need * GIB:
        text = ('no room: storage %r %s has %.1f GiB free; the disks of the %d VM(s) to create there need '
                'at least %d GiB (%s)' % (name, where, free / float(GIB), len(disks), need,
                                          ', '.join('%s %d' % disk for disk in disks)))
        for host, _size in disks:
            report.problem(host, 'vm_storage', text)


def _check_node(client, node, on_node, image, permissions, learnt, report, to_create=(), minimums=None, space=None):
    """Storages (and their free space for the VMs to_create), bridges and the image on one PVE node."""
    storages = _storages(client, node)
    _check_space(node, to_create, storages, minimums, report, space)
    _check_storages(on_node, node, storages, image, report)
    bridges = dict((i.get('iface'), i.get('type')) for i in client.get('nodes/%s/network' % node, 'list bridges',
                                                                       'node %s' % node, type='any_bridge') or []
                   if i.get('type') in BRIDGE_TYPES)
    learnt.setdefault('bridges', {})[node] = bridges
    for vm in on_node:
        bridge = vm.get('vm_bridge')
        if not _blank(bridge) and bridge not in bridges:
            # PVE lists a bridge or an SDN VNet only to credentials with SDN.Audit or SDN.Use on it (pve-manager
            # PVE/API2/Network.pm:430-482), so a VNet the token may not see looks absent.
            report.problem(vm['host'], 'vm_bridge', 'PVE node %s has no bridge %r that these credentials can see '
                           '(bridges: %s; a bridge or SDN VNet is listed only with SDN.Audit or SDN.Use on '
                           '/sdn/zones/<zone>/%s, docs/guide-proxmox.md)'
                           % (node, bridge, ', '.join(sorted(bridges)) or 'none', bridge))
    if image:
        learnt['image'][node] = _check_image(client, node, storages, image, permissions, report, learnt.get('version'))


def _check_storages(on_node, node, storages, image, report):
    for vm in on_node:
        for field in ('vm_storage', 'vm_cloudinit_storage'):
            name = vm.get(field)
            if _blank(name):
                continue
            store = storages.get(name)
            if store is None:
                report.problem(vm['host'], field, 'PVE node %s has no storage %r (storages: %s)'
                               % (node, name, ', '.join(sorted(storages))))
            elif not int(store.get('enabled', 1)) or not int(store.get('active', 1)):
                report.problem(vm['host'], field, 'storage %r is not active on PVE node %s' % (name, node))
            elif 'images' not in str(store.get('content', '')).split(','):
                report.problem(vm['host'], field, 'storage %r does not hold VM disks (content: %s); enable "images"'
                               % (name, store.get('content')))
    if image:
        name = image.get('storage')
        content = image.get('content') or 'iso'
        store = storages.get(name)
        if store is None:
            report.problem('all', 'talos_image_storage', 'PVE node %s has no storage %r' % (node, name))
        elif content not in str(store.get('content', '')).split(','):
            report.problem('all', 'talos_image_storage', 'storage %r on PVE node %s does not hold %s files (content: '
                           '%s); enable "%s"' % (name, node, content, store.get('content'), content))


def _check_image(client, node, storages, image, permissions, report, major=None):
    """'present', 'downloadable' or 'missing' for one node."""
    name, content = image.get('storage'), image.get('content') or 'iso'
    if name not in storages or content not in str(storages[name].get('content', '')).split(','):
        return 'missing'
    volid = '%s:%s/%s' % (name, content, image.get('filename'))
    items = client.get('nodes/%s/storage/%s/content' % (node, name), 'list %s content' % content,
                       'node %s' % node, content=content) or []
    if any(item.get('volid') == volid for item in items):
        return 'present'
    missing = []
    for need in _privileges.required('download_storage') + _privileges.required('download_node'):
        path = need.path.replace('{storage}', name).replace('{node}', node)
        if not _holds(permissions, need, path, major):
            missing.append(_need_text(need, major, path))
    if missing:
        report.problem('all', 'talos_image_url', '%s is not on PVE node %s and the credentials may not download it '
                       '(missing: %s)' % (volid, node, '; '.join(missing)))
        return 'missing'
    if not image.get('url'):
        report.problem('all', 'talos_image_url', '%s is not on PVE node %s and no URL is given' % (volid, node))
        return 'missing'
    try:
        client.get('nodes/%s/query-url-metadata' % node, 'query image URL', 'node %s' % node, url=image['url'])
    except _errors.ApiError as exc:
        report.problem('all', 'talos_image_url', '%s is not on PVE node %s, and PVE cannot fetch %s: %s'
                       % (volid, node, image['url'], exc.details.get('pve_message') or exc))
        return 'missing'
    return 'downloadable'


def _holds(permissions, need, path, major):
    """Whether the permissions satisfy one Need on path: any of its privileges, or its alternative."""
    if any(has_privilege(permissions, path, priv) for priv in need.privileges_for(major)):
        return True
    if need.alternative:
        return all(has_privilege(permissions, need.alternative[0], priv) for priv in need.alternative[1])
    return False


def _need_text(need, major, path):
    """'VM.GuestAgent.Audit (or VM.GuestAgent.Unrestricted) on /vms/101'."""
    privileges = need.privileges_for(major)
    text = privileges[0] + (' (or %s)' % ', '.join(privileges[1:]) if privileges[1:] else '') + ' on ' + path
    if need.alternative:
        text += ' (or %s on %s)' % (' and '.join(need.alternative[1]), need.alternative[0])
    return text


def _bridge_path(need, vm, bridges, permissions):
    """The SDN path PVE checks SDN.Use on for the VM's NIC: /sdn/zones/<zone>/<bridge>, and /<tag> below it with
    a VLAN tag (pve-guest-common src/PVE/GuestHelpers.pm:397-421 check_vnet_access). A plain bridge is in the zone
    localnetwork; a VNet is in its own zone, which the bridge list does not say: it is taken from the ACL paths of
    the permissions (/sdn/zones/<zone>/<vnet>), else shown as <zone of VNET> (only a grant above the zones can
    then satisfy it)."""
    bridge = str(vm['vm_bridge'])
    zone = 'localnetwork'
    kinds = (bridges or {}).get(vm.get('vm_pve_node')) or {}
    if kinds.get(bridge) == 'vnet':
        zone = '<zone of %s>' % bridge
        for path in sorted(permissions or {}):
            parts = path.strip('/').split('/')
            if len(parts) >= 4 and parts[:2] == ['sdn', 'zones'] and parts[3] == bridge:
                zone = parts[2]
                break
    path = need.path.replace('{zone}', zone).replace('{bridge}', bridge)
    if _int(vm.get('vm_vlan')) is not None:
        path += '/%d' % _int(vm.get('vm_vlan'))
    return path


def _need_paths(need, vms, image, bridges=None, permissions=None):
    """(ACL path, hosts) pairs a Need is checked on, from the inventory."""
    out = {}

    def add(path, host):
        out.setdefault(path, []).append(host)
    for vm in vms:
        host = vm['host']
        if need.scope == 'vm':
            vmid = _int(vm.get('vm_id'))
            if vmid is not None:
                add(need.path.replace('{vmid}', str(vmid)), host)
        elif need.scope == 'vm_storage':
            for field in ('vm_storage', 'vm_cloudinit_storage'):
                if not _blank(vm.get(field)):
                    add(need.path.replace('{storage}', str(vm[field])), host)
        elif need.scope == 'image_storage':
            if image and not _blank(image.get('storage')):
                add(need.path.replace('{storage}', str(image['storage'])), host)
        elif need.scope == 'bridge':
            if not _blank(vm.get('vm_bridge')):
                add(_bridge_path(need, vm, bridges, permissions), host)
        elif need.scope == 'root':
            add(need.path, host)
    return out


def _check_privileges(vms, permissions, params, report, major=None, image=None, bridges=None):
    """The token against the privilege table (_proxmox_privileges): each missing one named with its path and use."""
    missing = []
    for need in _privileges.required():
        for path, hosts in sorted(_need_paths(need, vms, image, bridges, permissions).items()):
            if not _holds(permissions, need, path, major):
                missing.append((need, path, hosts))
    who = params.get('api_user') or ''
    if params.get('api_token_id'):
        who = '%s!%s' % (who, params['api_token_id']) if '!' not in params['api_token_id'] else params['api_token_id']
    field = 'pve_api_token_id' if params.get('api_token_id') else 'pve_api_user'
    for need, path, hosts in missing:
        hosts = sorted(set(hosts))
        whom = ', '.join(hosts) if len(hosts) < len(vms) or len(vms) == 1 else 'every VM'
        report.problem('all', field, '%s lacks the privilege %s, needed to %s (%s) for %s; see the role in '
                       'docs/guide-proxmox.md' % (who, _need_text(need, major, path), need.what,
                                                  ', '.join(need.calls[:2]), whom))
    table_major = _privileges.major_of(major)[0]
    report.check('the credentials hold the privileges the vms stage needs (PVE %d)' % table_major, not missing)


def _check_taken_ids(existing, vms, report):
    ok = True
    for vm in vms:
        vmid = _int(vm.get('vm_id'))
        entry = existing.get(str(vmid)) if vmid is not None else None
        if entry is None:
            continue
        name = str(vm.get('vm_name') or vm['host'])
        if entry.get('type', 'qemu') != 'qemu':
            report.problem(vm['host'], 'vm_id', '%d is taken by the container %r on PVE node %s'
                           % (vmid, entry.get('name'), entry.get('node')))
            ok = False
        elif (entry.get('name') or '').lower() != name.lower():
            report.problem(vm['host'], 'vm_id', '%d is taken by another VM, %r on PVE node %s; pick a free id or '
                           'remove that VM' % (vmid, entry.get('name'), entry.get('node')))
            ok = False
        elif not _blank(vm.get('vm_pve_node')) and entry.get('node') != vm.get('vm_pve_node'):
            report.problem(vm['host'], 'vm_pve_node', 'VM %d (%s) exists on PVE node %s, not %s; migrate it in PVE '
                           'or change vm_pve_node' % (vmid, name, entry.get('node'), vm['vm_pve_node']))
            ok = False
    report.check('no vm_id is taken by a different VM', ok)


def preflight(params, client):
    """All checks; returns (report, learnt)."""
    report = Report()
    vms = []
    for index, vm in enumerate(params['vms']):
        if not isinstance(vm, dict) or _blank(vm.get('host')):
            raise _errors.ValidationError('vms[%d]' % index, 'each entry needs a host')
        vms.append(vm)
    check_inventory(vms, params.get('reserved_addresses'), params.get('minimums'), report)
    learnt = {}
    if params['check_pve']:
        learnt = check_pve(client, params, vms, params.get('image'), report)
    return report, learnt


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True,
        **_argspec.PROXMOX_AUTH_CONSTRAINTS,
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    params = module.params
    if params['check_pve'] and not _proxmox.HAS_PROXMOXER:
        module.fail_json(msg='proxmoxer and requests are required on the controller', exception=_proxmox.PROXMOXER_IMPORT_ERROR)
    started = time.monotonic()
    try:
        deadline = _wait.Deadline(max(params['wait_timeout'], 0))
        client = _proxmox.PveClient(lambda: _proxmox.connect(params, module.warn), deadline,
                                    interval=min(params['wait_sleep'] or 1.0, _proxmox.FIRST_RETRY))
        report, learnt = preflight(params, client)
    except _errors.ProxtalosError as exc:
        failure = dict(exc.details)
        failure.setdefault('elapsed', round(time.monotonic() - started, 3))
        module.fail_json(msg=str(exc), exception=traceback.format_exc(), **failure)
    result = dict(changed=False, problems=report.problems, checks=report.checks, retries=client.retried,
                  elapsed=round(time.monotonic() - started, 3))
    if params['check_pve']:
        result['pve'] = learnt
    if report.problems:
        module.fail_json(msg=report.message(), **result)
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
