"""The lab's Proxmox VE: fakepve run in-process, with what the lab adds to it.

fakepve (AGPL, imported and run, never copied) answers the real PVE API from PVE's schema. The
lab adds:

- TLS with a CA of its own (pve-ca.pem) so clients verify the server, and an API token;
- storages `local` (iso, vztmpl, import, snippets, backup) and `local-lvm` (images, rootdir), and a
  `vmbr0` bridge per node served by GET /nodes/{node}/network[/{iface}], and the SDN VNet `labvnet` (zone
  `labzone`) in that list for credentials that may see it; PUT /access/acl for the lab's admin;
- VM power events: `LabVm` replaces fakepve's FakeVm; its `status` and `started_at` are observed,
  and `PowerEvents` turns their changes (and additions to / removals from `pve.vms`) into
  started, stopped, reset and deleted events;
- guest networking (`GuestNetwork`): the VM's address (cloud-init ipconfig0, else DHCP) and a
  guest agent that answers network-get-interfaces after the boot delay, only when the VM config
  enables the agent; other VMs get PVE's own agent errors;
- the request log (method, path, status of every request) and the record of PVE task durations;
- the PVE faults (`PveFaults`): task errors, config lock, flaky or slow network, 5xx answers,
  node offline, a guest agent that does not run, a full storage.
"""

import asyncio
import datetime
import hashlib
import ipaddress
import logging
import os
import re
import time

import fakepve.lxc
import fakepve.model
import fakepve.qemu
import fakepve.server
import fakepve.shapes
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from fakepve import FakePve, FakeVm, PveError, TaskError

from lab.addresses import DhcpServer, agent_enabled, nic_mac, parse_ipconfig
from lab.faults import FaultError, Param
from lab.pve_access import AccessControl

LOG = logging.getLogger('lab.pve')

PVE_PORT = 8006
# The lab's PVE has root@pam (password login, for tests that play the PVE admin) and the collection's user,
# a non-root PVE user with a privilege-separated API token granted the documented least-privilege role.
ROOT_USER = 'root@pam'
PVE_USER = 'proxtalos@pve'
TOKEN_NAME = 'proxtalos'
TOKEN_ID = PVE_USER + '!' + TOKEN_NAME

# The role, per ACL path: (role name, propagate, privileges), as an admin creates it with pveum. Written from
# PVE's permission checks, not read from the collection (its table is compared to this one by
# tests/lab/test_lab_pve_access.py). PVE 9 privileges (fakepve serves PVE 9's API schema).
LAB_ROLES = {
    # qemu-server 9.2.6 src/PVE/API2/Qemu.pm: create :1309 (VM.Allocate), $check_vm_modify_config_perm :995-1040
    # (the VM.Config.* of each option; ipconfig/nameserver/searchdomain: VM.Config.Cloudinit), $check_drive_perms
    # :2273-2287 (Disk, CDROM, the cloud-init drive), vm_start :3494 / vm_stop :3682 / vm_reset :3804 /
    # vm_shutdown :3857 / vm_reboot :3973 (VM.PowerMgmt), vm_pending :1859 / cloudinit :1923 / status :3427
    # (VM.Audit), destroy_vm :2776 (VM.Allocate); src/PVE/API2/Qemu/Agent.pm:65-67,184 (network-get-interfaces:
    # VM.GuestAgent.Audit or VM.GuestAgent.Unrestricted).
    '/vms': ('ProxtalosVMs', True, (
        'VM.Allocate', 'VM.Audit', 'VM.PowerMgmt', 'VM.Config.Disk', 'VM.Config.CDROM', 'VM.Config.CPU',
        'VM.Config.Memory', 'VM.Config.Network', 'VM.Config.Options', 'VM.Config.HWType', 'VM.Config.Cloudinit',
        'VM.GuestAgent.Audit')),
    # qemu-server Qemu.pm:186-190 (a new disk: Datastore.AllocateSpace); pve-storage 9.1.7
    # src/PVE/API2/Storage/Content.pm:27-31 (content list: Datastore.Audit or AllocateSpace),
    # src/PVE/API2/Storage/Status.pm:750 (download-url: Datastore.AllocateTemplate).
    '/storage': ('ProxtalosStorage', True, ('Datastore.AllocateSpace', 'Datastore.Audit', 'Datastore.AllocateTemplate')),
    # pve-storage Status.pm:747-754, pve-manager PVE/API2/Nodes.pm:1899-1905 (download-url, query-url-metadata:
    # Sys.AccessNetwork on the node, or Sys.Audit + Sys.Modify on /).
    '/nodes': ('ProxtalosNodes', True, ('Sys.AccessNetwork',)),
    # pve-manager PVE/API2/Cluster.pm:872 (GET /cluster/status: Sys.Audit on /), on / alone.
    '/': ('ProxtalosAudit', False, ('Sys.Audit',)),
    # qemu-server src/PVE/QemuServer.pm:6417-6430 check_bridge_access (SDN.Use on the bridge of the local zone);
    # pve-manager PVE/API2/Network.pm:470-480 (a bridge is listed with SDN.Audit or SDN.Use).
    '/sdn/zones/localnetwork': ('ProxtalosBridges', True, ('SDN.Use',)),
}

# The lab's SDN: one simple zone with one VNet on every node, beside the Linux bridge vmbr0 (pve-network
# ecf98c5 src/PVE/Network/SDN.pm:311-352 get_local_vnets: a VNet is listed with type `vnet`, and only to
# credentials with SDN.Audit or SDN.Use on /sdn/zones/<its zone>/<vnet> or one of its VLANs). The lab's token is
# granted only the local zone (LAB_ROLES), so it sees and may use `labvnet` only once granted it.
SDN_VNETS = {'labvnet': {'zone': 'labzone', 'vlanaware': False}}

# The PVE releases the lab's PVE answers as (`python -m lab up --pve-major 8|9`): GET /version, the privileges PVE
# knows, and what the guest agent's API asks for. fakepve answers PVE 9's schema; for PVE 8 the lab changes only
# what the collection's table of privileges (plugins/module_utils/_proxmox_privileges.py) says differs:
# - pve-access-control 8.2.2 (25dd375) src/PVE/AccessControl.pm:1040-1080 knows VM.Monitor and no VM.GuestAgent.*
#   privilege (added by 922f710 "add VM.GuestAgent privileges"; VM.Monitor dropped by 0706945, both in 9.x);
# - qemu-server 8.3.13 (c2287c17) PVE/API2/Qemu/Agent.pm:133-146: every agent command needs VM.Monitor on
#   /vms/{vmid} (PVE 9: VM.GuestAgent.Audit or .Unrestricted, qemu-server b92a40ce);
# - the version is pve-manager's (8.4.1: 2a5fa54a; 9: fakepve's own answer).
PVE_RELEASES = {
    9: {'version': None, 'release': None},
    8: {'version': '8.4.1', 'release': '8.4'},
}
PVE8_AGENT_PRIVILEGE = 'VM.Monitor'


def pve_privileges(major):
    """The privileges PVE of this major release knows."""
    if major == 8:
        return frozenset([p for p in fakepve.shapes.PRIVILEGES if not p.startswith('VM.GuestAgent.')]
                         + [PVE8_AGENT_PRIVILEGE])
    return frozenset(fakepve.shapes.PRIVILEGES)


def lab_roles(major):
    """LAB_ROLES as the documented role is for this PVE major: on PVE 8, VM.Monitor for the guest agent."""
    if major == 9:
        return LAB_ROLES
    roles = dict(LAB_ROLES)
    name, propagate, privileges = roles['/vms']
    roles['/vms'] = (name, propagate, tuple(PVE8_AGENT_PRIVILEGE if p == 'VM.GuestAgent.Audit' else p
                                            for p in privileges))
    return roles


GIB = 1024 ** 3
STORAGE_CONTENT = {'local': 'backup,import,iso,snippets,vztmpl', 'local-lvm': 'images,rootdir'}

# `lab fault pve-task-error OPERATION`: operation words and the PVE task types they mean. Any other
# word is taken as a task type itself (resize, move_disk, ...).
TASK_OPERATIONS = {
    'create': 'qmcreate', 'start': 'qmstart', 'stop': 'qmstop', 'shutdown': 'qmshutdown', 'reboot': 'qmreboot',
    'reset': 'qmreset', 'suspend': 'qmsuspend', 'resume': 'qmresume', 'config': 'qmconfig',
    'destroy': 'qmdestroy', 'delete': 'qmdestroy', 'clone': 'qmclone', 'template': 'qmtemplate',
    'migrate': 'qmigrate', 'snapshot': 'qmsnapshot', 'rollback': 'qmrollback', 'download-url': 'download',
    'upload': 'imgcopy',
}
# The exit status a failed task of each type shows when the fault gives no message: PVE's wording.
TASK_MESSAGES = {
    'qmcreate': 'unable to create VM {tid} - lvcreate \'pve/vm-{tid}-disk-0\' error:   Volume group "pve" has '
                'insufficient free space (0 extents): 8192 required.',
    'qmstart': 'start failed: QEMU exited with code 1',
    'qmstop': 'VM quit/powerdown failed',
    'qmshutdown': 'VM quit/powerdown failed - got timeout',
    'qmreboot': 'VM quit/powerdown failed - got timeout',
    'qmreset': "VM {tid} qmp command 'system_reset' failed - got timeout",
    'qmconfig': "VM {tid} qmp command 'device_add' failed - got timeout",
    'qmdestroy': 'failed to remove config file: Device or resource busy',
    'qmclone': 'clone failed: command \'qemu-img convert\' failed: exit code 1',
    'download': 'download failed: 500 Can\'t connect to the download host (Connection timed out)',
    'imgcopy': 'error during upload: No space left on device',
}


# ----------------------------------------------------------------------------------- TLS

def pve_node_names(host, nodename='pve1', search_domain='lab.internal'):
    """The names a PVE node's default certificate (pve-ssl.pem) carries: pve-cluster 9.1.6 (7091d92)
    src/PVE/Cluster/Setup.pm:487-529 gen_pve_ssl_cert: IP 127.0.0.1 and ::1, DNS localhost, the node's IP, its name,
    and name.<search domain of /etc/resolv.conf> when there is one, which is also the CN. -> (cn, [x509 names])."""
    fqdn = '%s.%s' % (nodename, search_domain) if search_domain else nodename
    names = [x509.IPAddress(ipaddress.ip_address('127.0.0.1')), x509.IPAddress(ipaddress.ip_address('::1')),
             x509.DNSName('localhost'), x509.IPAddress(ipaddress.ip_address(host)), x509.DNSName(nodename)]
    if search_domain:
        names.append(x509.DNSName(fqdn))
    return fqdn, names


def write_tls(directory, host, days=365):
    """Make a CA and a server certificate for host, with the names of a PVE node's default certificate
    (pve_node_names: the lab's API is node pve1's); write them into directory.

    Returns (ca_path, cert_path, key_path): pve-ca.pem (give it to clients), pve.crt, pve.key (0600).
    """
    now = datetime.datetime.now(datetime.timezone.utc)
    cn, names = pve_node_names(host)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, 'proxtalos lab'),
                         x509.NameAttribute(NameOID.COMMON_NAME, 'proxtalos lab PVE CA')])
    ca_cert = (x509.CertificateBuilder()
               .subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                            crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, 'PVE Cluster Node'),
                                     x509.NameAttribute(NameOID.ORGANIZATION_NAME, 'Proxmox Virtual Environment'),
                                     x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_path = os.path.join(directory, 'pve-ca.pem')
    cert_path = os.path.join(directory, 'pve.crt')
    key_path = os.path.join(directory, 'pve.key')
    write_file(ca_path, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    write_file(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    write_file(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()), 0o600)
    return ca_path, cert_path, key_path


def write_file(path, data, mode=0o600):
    """Write data (bytes or text) to path atomically, with this mode from the first byte on."""
    if isinstance(data, str):
        data = data.encode()
    tmp = '%s.tmp.%d' % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


# ------------------------------------------------------------------------- power events

class LabVm(FakeVm):
    """fakepve's FakeVm whose power state is observed: changes go to `lab_observer` (a PowerEvents)."""

    def __init__(self, *args, **kwargs):
        self.lab_observer = None
        self._lab_status = None
        self._lab_started_at = None
        # PVE's [special:cloudinit] section: the values the cloud-init drive was generated from, of the options
        # changed since (and 'added': options set since), see LabPve.record_cloudinit_change.
        self.cloudinit_record = {}
        super().__init__(*args, **kwargs)

    def apply_pending(self):
        """A start: the pending changes are applied and the cloud-init drive is generated again, which empties
        the record (qemu-server 9.2.6 src/PVE/QemuServer.pm:5598-5611 in vm_start_nolock;
        src/PVE/QemuServer/Cloudinit.pm:727-738 apply_cloudinit_config: only with a cloud-init drive)."""
        super().apply_pending()
        if has_cloudinit_drive(self.config):
            self.cloudinit_record = {}

    @property
    def status(self):
        return self._lab_status

    @status.setter
    def status(self, value):
        old, self._lab_status = self._lab_status, value
        if self.lab_observer is not None and old != value:
            self.lab_observer.status_changed(self, old, value)

    @property
    def started_at(self):
        return self._lab_started_at

    @started_at.setter
    def started_at(self, value):
        self._lab_started_at = value
        if self.lab_observer is not None and value is not None:
            self.lab_observer.started_at_changed(self)


def install_lab_vm():
    """Make fakepve create LabVm wherever it creates a FakeVm (model.add_vm, qemu create and clone)."""
    for module in (fakepve.model, fakepve.qemu, fakepve.server):
        module.FakeVm = LabVm


class ObservedVmList(list):
    """pve.vms: tells the observer when fakepve adds a VM (create, clone) or removes one (destroy).

    fakepve changes the list only with append() and remove(); the other mutators are refused so
    that a future fakepve that uses them fails loudly instead of silently losing events.
    """

    def __init__(self, observer):
        super().__init__()
        self.observer = observer

    def append(self, vm):
        super().append(vm)
        self.observer.vm_added(vm)

    def remove(self, vm):
        super().remove(vm)
        self.observer.vm_removed(vm)

    def _refuse(self, *args, **kwargs):
        raise NotImplementedError('the lab observes pve.vms through append() and remove() only')

    insert = extend = pop = clear = __delitem__ = __setitem__ = __iadd__ = _refuse


class PowerEvents(object):
    """Turns LabVm changes into power events: emit(kind, vm), kind = started, stopped, reset or deleted.

    A start sets status and then started_at in one go; a reset sets only started_at while the VM
    runs; a reboot is a stop and a start. To tell them apart, a start is reported once the code
    that made it has run to its end (call_soon), and a started_at change then is not a reset.
    """

    def __init__(self, emit, loop):
        self._emit = emit
        self._loop = loop
        self._starting = set()

    def vm_added(self, vm):
        vm.lab_observer = self
        if vm.status == 'running':
            self.status_changed(vm, 'stopped', 'running')

    def vm_removed(self, vm):
        vm.lab_observer = None
        if vm in self._starting:
            self._starting.discard(vm)
        elif vm.status == 'running':
            self._emit('stopped', vm)
        self._emit('deleted', vm)

    def status_changed(self, vm, old, new):
        was_running, running = old == 'running', new == 'running'
        if running and not was_running:
            self._starting.add(vm)
            self._loop.call_soon(self._started, vm)
        elif was_running and not running:
            if vm in self._starting:
                self._starting.discard(vm)  # stopped before its start was reported: nothing happened
            else:
                self._emit('stopped', vm)

    def started_at_changed(self, vm):
        if vm.status == 'running' and vm not in self._starting:
            self._emit('reset', vm)

    def _started(self, vm):
        if vm in self._starting:
            self._starting.discard(vm)
            if vm.status == 'running' and vm.lab_observer is self:
                self._emit('started', vm)


# ------------------------------------------------------------------------ guest network

class GuestNetwork(object):
    """VM addresses and guest agents.

    At power-on a VM gets its address: the static one of its cloud-init `ipconfig0` when a cloud-init drive
    is attached (a running VM keeps it until its next power-on, whatever ipconfig0 says meanwhile), else a
    DHCP lease for the MAC of `net0`. If its config enables the agent, the agent starts after the
    `vm_boot` delay and reports lo and eth0 with that address; it is gone while the VM is off
    and comes back after each boot.
    """

    def __init__(self, net, pve, timing):
        self.net = net
        self.pve = pve
        self.timing = timing
        self.dhcp = DhcpServer(net)
        self.current = {}   # vm -> {'address', 'prefix', 'source', 'mac'} while it runs
        self._boots = {}    # vm -> asyncio task starting its agent
        self._leased = {}   # vm -> the MAC it holds a DHCP lease for
        self.agent_down = set()   # vmids whose guest agent does not run (fault pve-agent-down)
        # vmids whose guest agent runs only once the guest runs its installed OS (fault talos-agent-maintenance), and
        # how to tell (the Talos simulation sets it: its node of the VM runs an installed config)
        self.agent_needs_config = set()
        self.guest_configured = lambda vm: True

    def _static_addresses(self, exclude=None):
        taken = set()
        for vm in self.pve.vms:
            if vm is exclude:
                continue
            try:
                config = parse_ipconfig(vm.config.get('ipconfig0'))
            except ValueError:
                continue
            if config is not None and config.static:
                taken.add(config.address)
        return taken

    def plan(self, vm, lease=False):
        """Where the VM's address comes from now: {'address', 'prefix', 'source', 'mac'}.

        source: static (ipconfig0), dhcp (a lease, made only when lease=True), none (no net0,
        pool used up, or no lease yet), or 'invalid ipconfig0: ...'.
        """
        mac = nic_mac(vm.config)
        try:
            ipconfig = parse_ipconfig(vm.config.get('ipconfig0'))
        except ValueError as exc:
            return {'address': None, 'prefix': None, 'source': 'invalid ipconfig0: %s' % exc, 'mac': mac}
        if mac is None:
            return {'address': None, 'prefix': None, 'source': 'none', 'mac': None}
        if ipconfig is not None and ipconfig.static and has_cloudinit_drive(vm.config):
            # The guest learns ipconfig0 only from the cloud-init drive (PVE writes it into the nocloud
            # network-config of that drive: qemu-server src/PVE/QemuServer/Cloudinit.pm:610-634 generate_nocloud).
            return {'address': ipconfig.address, 'prefix': ipconfig.prefix, 'source': 'static', 'mac': mac}
        if lease:
            previous = self._leased.get(vm)
            if previous is not None and previous != mac:
                self.dhcp.release(previous)   # its net0 got a new MAC: the old lease is free again
            address = self.dhcp.lease(mac, self._static_addresses(exclude=vm))
            if address is not None:
                self._leased[vm] = mac
        else:
            address = self.dhcp.leases.get(mac)
        if address is None:
            return {'address': None, 'prefix': None, 'source': 'none', 'mac': mac}
        return {'address': address, 'prefix': 24, 'source': 'dhcp', 'mac': mac}

    def power_on(self, vm):
        """The VM booted (start or reset): assign its address, start its agent after the boot delay."""
        self.power_off(vm)
        plan = self.plan(vm, lease=True)
        if plan['address'] is None and plan['source'] != 'none':
            LOG.warning('VM %s (%s) has no address: %s', vm.vmid, vm.name, plan['source'])
        self.current[vm] = plan
        if agent_enabled(vm.config):
            seconds = self.timing.seconds('vm_boot')
            if seconds <= 0:
                # No boot delay: the agent is there before the next request is read.
                self.timing.end(self.timing.begin('vm_boot', vm.name, 0.0, 0.0))
                self._agent_up(vm)
            else:
                self._boots[vm] = asyncio.ensure_future(self._boot(vm))
        return plan['address']

    async def _boot(self, vm):
        try:
            await self.timing.sleep('vm_boot', vm.name)
        finally:
            if self._boots.get(vm) is asyncio.current_task():
                del self._boots[vm]
        if vm.status == 'running' and vm in self.current:
            self._agent_up(vm)

    def _agent_up(self, vm):
        if vm.vmid in self.agent_down:
            vm.agent = None   # qemu-guest-agent not started in the guest: PVE answers "not running"
            return
        if vm.vmid in self.agent_needs_config and not self.guest_configured(vm):
            vm.agent = None   # the guest (Talos in maintenance mode) runs no agent yet
            return
        plan = self.current[vm]
        interfaces = [{'name': 'lo', 'hardware-address': '00:00:00:00:00:00',
                       'ip-addresses': [{'ip-address': '127.0.0.1', 'ip-address-type': 'ipv4', 'prefix': 8},
                                        {'ip-address': '::1', 'ip-address-type': 'ipv6', 'prefix': 128}]}]
        if plan['mac']:
            eth0 = {'name': 'eth0', 'hardware-address': plan['mac'], 'ip-addresses': []}
            if plan['address']:
                eth0['ip-addresses'].append({'ip-address': plan['address'], 'ip-address-type': 'ipv4',
                                             'prefix': plan['prefix']})
            interfaces.append(eth0)
        vm.agent = {'interfaces': interfaces}

    def stop_agent(self, vm):
        """The guest agent of the VM stops, and does not start again at the next boot, until start_agent()."""
        self.agent_down.add(vm.vmid)
        vm.agent = None

    def start_agent(self, vm):
        """The guest agent of the VM runs again: at once if the VM runs and has booted, else at its next boot."""
        self.agent_down.discard(vm.vmid)
        if vm.status == 'running' and vm in self.current and vm not in self._boots:
            self._agent_up(vm)

    def guest_changed(self, vm):
        """The guest's own state changed (Talos entered or left maintenance mode): its agent follows, if the VM
        runs and has booted."""
        if vm.status == 'running' and vm in self.current and vm not in self._boots:
            self._agent_up(vm)

    def power_off(self, vm):
        """The VM stopped (or is about to boot again): its agent is gone."""
        boot = self._boots.pop(vm, None)
        if boot is not None:
            boot.cancel()
        self.current.pop(vm, None)
        vm.agent = None

    def forget(self, vm):
        """The VM was deleted: power off and release its DHCP lease."""
        self.power_off(vm)
        mac = self._leased.pop(vm, None)
        if mac:
            self.dhcp.release(mac)

    def clear(self):
        for vm in list(self.current):
            self.power_off(vm)
        self._leased = {}
        self.dhcp.clear()

    def agent_state(self, vm):
        """none (not enabled in the config), off (VM not running), down (fault pve-agent-down), booting, or running."""
        if not agent_enabled(vm.config):
            return 'none'
        if vm.status != 'running':
            return 'off'
        if vm.vmid in self.agent_down:
            return 'down'
        if vm.vmid in self.agent_needs_config and vm.agent is None:
            return 'down (maintenance)'
        return 'running' if vm.agent is not None else 'booting'


# ------------------------------------------------------------------------------ fakepve

class AnyOf(str):
    """A privilege question answered by any one of 'A|B' (PVE's check_vm_perm with any => 1)."""


DRIVE_OPTION = re.compile(r'^(ide|sata|scsi|virtio|efidisk|tpmstate)\d+$')
NET_OPTION = re.compile(r'^net\d+$')
IPCONFIG_OPTION = re.compile(r'^ipconfig\d+$')
# qemu-server 9.2.6 src/PVE/API2/Qemu.pm:853-862 ($cloudinitoptions, what GET .../cloudinit lists); with
# ipconfigN they are $confdesc_cloudinit (src/PVE/QemuServer.pm:781-880).
CLOUDINIT_OPTIONS = ('cicustom', 'cipassword', 'citype', 'ciuser', 'ciupgrade', 'nameserver', 'searchdomain', 'sshkeys')
# src/PVE/QemuServer.pm:4594-4611: applied to a running VM's config at once.
FAST_PLUG_OPTIONS = ('description', 'hookscript', 'lock', 'migrate_downtime', 'migrate_speed', 'name', 'onboot',
                     'protection', 'shares', 'startup', 'tags', 'vmstatestorage')


def _split_list(text):
    """A PVE list parameter (pve-common split_list: commas, semicolons or blanks) as a list."""
    return [item for item in re.split(r'[,;\s]+', str(text or '')) if item]


def download_content(url):
    """The bytes the lab's PVE "downloads" from a URL (nothing is fetched): their checksum is what a test passes
    as the download's `checksum`."""
    return ('proxtalos lab download of %s\n' % url).encode()


def _size_bytes(text):
    """Bytes of a PVE size ('32G'), or None."""
    found = re.fullmatch(r'(\d+(?:\.\d+)?)([KMGT])?', str(text or ''))
    if found is None:
        return None
    return int(float(found.group(1)) * {None: 1, 'K': 1024, 'M': 1024 ** 2, 'G': GIB, 'T': 1024 ** 4}[found.group(2)])


def has_cloudinit_drive(config):
    """Whether the config has a cloud-init drive: a CD-ROM drive that is not an ISO (fakepve names its volume
    like a disk; PVE calls it vm-<id>-cloudinit)."""
    for key, value in config.items():
        volume = str(value).split(',', maxsplit=1)[0]
        if DRIVE_OPTION.match(key) and 'media=cdrom' in str(value) and volume not in ('none', 'cdrom') \
                and ':iso/' not in volume:
            return True
    return False


def is_fast_plug(key):
    return key in FAST_PLUG_OPTIONS or key in CLOUDINIT_OPTIONS or bool(IPCONFIG_OPTION.match(key))


# qemu-server 9.2.6 src/PVE/API2/Qemu.pm:789-862: the option groups of $check_vm_modify_config_perm.
CLOUDINIT_PRIVILEGE = AnyOf('VM.Config.Cloudinit|VM.Config.Network')   # :1026-1029
CONFIG_OPTION_PRIVILEGES = (
    ('VM.Config.CPU', ('cores', 'cpu', 'runningcpu', 'cpulimit', 'cpuunits', 'numa', 'smp', 'sockets', 'vcpus')),
    ('VM.Config.Memory', ('memory', 'balloon', 'shares', 'allow-ksm')),
    ('VM.Config.HWType', ('acpi', 'hotplug', 'kvm', 'machine', 'runningmachine', 'scsihw', 'smbios1', 'tablet', 'vga',
                          'watchdog', 'audio0', 'rng0')),
    ('VM.Config.Options', ('agent', 'autostart', 'bios', 'description', 'keyboard', 'localtime', 'migrate_downtime',
                           'migrate_speed', 'name', 'onboot', 'ostype', 'protection', 'reboot', 'startdate', 'startup',
                           'tdf', 'template')),
    ('VM.PowerMgmt', ('freeze',)),
    ('VM.Config.Disk', ('boot', 'bootdisk', 'vmstatestorage')),
    (CLOUDINIT_PRIVILEGE, ('cicustom', 'cipassword', 'citype', 'ciuser', 'ciupgrade', 'nameserver', 'searchdomain',
                           'sshkeys')),
)


def lab_access(major=9):
    """The lab's users and ACLs: PVE_USER and its privilege-separated token, each granted the lab's role for this
    PVE major (lab_roles)."""
    access = AccessControl(pve_privileges(major))
    access.add_token(TOKEN_ID, privsep=True)
    for path, (name, propagate, privileges) in lab_roles(major).items():
        access.add_role(name, privileges)
        for who in (PVE_USER, TOKEN_ID):
            access.grant(path, who, name, propagate)
    return access


class TaskFault(object):
    """Tasks of one type (and optionally one VM) end in TASK ERROR: message; `times` tasks, or every one."""

    def __init__(self, operation, task_type, vmid, message, times, on_exhausted):
        self.operation = operation
        self.task_type = task_type
        self.vmid = vmid
        self.message = message
        self.times = times
        self.on_exhausted = on_exhausted

    def matches(self, task_type, tid):
        return task_type == self.task_type and (self.vmid is None or str(tid) == str(self.vmid))


class ApiErrorFault(object):
    """Requests (one method or any, paths ending with `path`) answer status/message; `times` of them, or every one."""

    def __init__(self, status, message, path, method, times, on_exhausted):
        self.status = status
        self.message = message
        self.path = path
        self.method = method
        self.times = times
        self.on_exhausted = on_exhausted

    def matches(self, request):
        return (self.method == 'ANY' or request.method == self.method) and request.path.endswith(self.path)


class LabPve(FakePve):
    """fakepve with the lab's TLS, token, storages, bridges, observed VMs, request log and faults."""

    def __init__(self, host, nodes, net, timing, power_events, on_request=None, port=PVE_PORT,
                 password=None, token_secret=None, major=9):
        install_lab_vm()
        super().__init__(user=ROOT_USER, password=password, host=host, port=port)
        self.major = major
        release = PVE_RELEASES[major]
        if release['version']:
            self.version, self.release_version = release['version'], release['release']
        self.time_scale = timing.pve_time_scale
        self.timing = timing
        self.on_request = on_request
        self.vms = ObservedVmList(power_events)
        self.nodes = dict((name, {'online': True}) for name in nodes)
        self.net = net
        if token_secret:
            self.apitokens[TOKEN_ID] = token_secret
        self.access = lab_access(major)
        # fakepve checks permissions only once its acl is not None; the lab's AccessControl answers them.
        self.acl = {}
        self.reset_storages()
        self.node_networks = {}
        for index, node in enumerate(nodes):
            self.node_networks[node] = self._default_networks(min(2 + index, 9))
        self.task_faults = {}
        self.api_error = None
        self.ha_crm_delay = {}   # vmid -> real seconds the HA stack takes to act on a request

    # ------------------------------------------------------------ permissions

    def allowed(self, user, path, priv):
        """fakepve's permission question, answered as PVE does (lab.pve_access); AnyOf: one of several."""
        if isinstance(priv, AnyOf):
            return any(self.access.allowed(user, path, each) for each in priv.split('|'))
        return self.access.allowed(user, path, priv)

    def _config_priv(self, key):
        """The privilege a config option needs, as qemu-server 9.2.6 src/PVE/API2/Qemu.pm:995-1040
        ($check_vm_modify_config_perm) maps it; drives, serial ports and tags keep fakepve's mapping (their checks
        depend on the value: :2273-2287, :864-879)."""
        if DRIVE_OPTION.match(key) or re.match(r'^(unused|serial|usb)\d+$', key) or key == 'tags':
            return super()._config_priv(key)
        for privilege, options in CONFIG_OPTION_PRIVILEGES:
            if key in options:
                return privilege
        if re.match(r'^numa\d+$', key):
            return 'VM.Config.CPU'
        if re.match(r'^net\d+$', key):
            return 'VM.Config.Network'
        if re.match(r'^ipconfig\d+$', key):
            return CLOUDINIT_PRIVILEGE
        return 'root'   # :1034-1037 "only root can set '$opt' config"

    def grant(self, user, path, *privs):
        """fakepve's grant(): a role of these privileges on path for user (or token), propagated."""
        name = 'lab-%d' % len(self.access.roles)
        self.access.add_role(name, privs)
        if '!' in user and user not in self.access.tokens:
            self.access.add_token(user, privsep=False)
        self.access.grant(path, user, name)

    def _check_bridge_access(self, user, params):
        """SDN.Use on the bridge of each NIC (and on its VLAN with a tag): qemu-server 9.2.6
        src/PVE/QemuServer.pm:6417-6430 check_bridge_access, called at create (src/PVE/API2/Qemu.pm:1364) and for
        a changed NIC (:2381, :2499); pve-guest-common 4a8f6cb src/PVE/GuestHelpers.pm:397-421 check_vnet_access
        (zone localnetwork for a plain bridge). VLAN trunks are not modelled."""
        if user is None or user.split('!', maxsplit=1)[0] == ROOT_USER:
            return
        for key, value in sorted(params.items()):
            if not re.match(r'^net\d+$', key):
                continue
            props = dict(part.split('=', 1) for part in str(value).split(',') if '=' in part)
            if not props.get('bridge'):
                continue
            # check_vnet_access: the zone of a VNet is the one its config names, a plain bridge is in localnetwork
            # (pve-guest-common 4a8f6cb src/PVE/GuestHelpers.pm:400-407).
            zone = SDN_VNETS.get(props['bridge'], {}).get('zone', 'localnetwork')
            path = '/sdn/zones/%s/%s' % (zone, props['bridge'])
            if props.get('tag'):
                path += '/' + props['tag']
            self.require(user, path, 'SDN.Use')

    def _missing_iso(self, vm):
        """The first ISO volume of the VM's drives that its storage does not hold, or None."""
        for key in sorted(vm.config):
            if not re.match(r'^(ide|sata|scsi|virtio)\d+$', key):
                continue
            found = re.match(r'^([^:,]+):iso/([^,]+)', str(vm.config[key]))
            if found and 'iso/' + found.group(2) not in (self.storages.get(found.group(1)) or {}).get('volumes', {}):
                return '%s:iso/%s' % (found.group(1), found.group(2))
        return None

    async def _do_start(self, vm, user, p):
        """A start whose ISO is gone fails in the start task: vm_start activates every volume of the VM first
        (qemu-server 9.2.6 src/PVE/QemuServer.pm:5667-5676), and a file-based volume that is not there dies with
        "volume '<storage>:<volname>' does not exist" (pve-storage 9.1.7 src/PVE/Storage/Plugin.pm:2049-2060).
        fakepve starts it anyway. The earlier checks of the task (template, lock, already running) stay fakepve's."""
        missing = self._missing_iso(vm)
        if missing is None or vm.ha_managed or vm.template or vm.status == 'running' or (
                vm.lock and vm.lock != 'suspended'):
            return await super()._do_start(vm, user, p)

        async def body():
            raise TaskError("volume '%s' does not exist" % missing)
        return await self.task(vm.node, 'qmstart', vm.vmid, user, body, vm=vm)

    async def _qm_create(self, v, user):
        self._check_bridge_access(user, v)
        return await super()._qm_create(v, user)

    async def _apply_config(self, vm, user, p):
        self._check_bridge_access(user, p)
        running = vm.status == 'running'
        before = dict(vm.config)
        result = await super()._apply_config(vm, user, p)
        if running:
            self._hotplug_as_pve(vm, before, p)
        return result

    def _hotplug_as_pve(self, vm, before, params):
        """Correct fakepve's split of a running VM's config change into applied and pending, as PVE's
        vmconfig_hotplug_pending does it (qemu-server 9.2.6 src/PVE/QemuServer.pm:4617-4945):
        - fast-plug options (:4594-4611: name, description, onboot, protection, startup, tags, shares, ..., and
          every cloud-init option: ipconfigN, nameserver, searchdomain, ciuser, ...) are written into the
          config at once, set (:4699-4707) or deleted (:4764-4795), and recorded for cloud-init;
        - netN is hot-plugged with the default hotplug set network,disk,usb (:253-262, vmconfig_update_net
          :5108-5185), and recorded (:4893-4897);
        - an agent change stays pending (vmconfig_update_agent :5207-5228 skips unless only
          fstrim_cloned_disks changes).
        The cloud-init drive is not generated again (hotplug has no `cloudinit` by default, :4941)."""
        updates = dict((k, v) for k, v in params.items() if k not in ('delete', 'digest', 'skiplock', 'revert'))
        deletes = [k for k in str(params.get('delete', '') or '').split(',') if k]
        hotplug = str(vm.config.get('hotplug', 'network,disk,usb'))
        network_hotplug = hotplug == '1' or 'network' in hotplug.split(',')
        for key, value in sorted(updates.items()):
            if is_fast_plug(key) or (NET_OPTION.match(key) and network_hotplug):
                if key in vm.pending:
                    vm.config[key] = vm.pending.pop(key)
                self.record_cloudinit_change(vm, key, before.get(key), value)
            elif key == 'agent' and str(value) != str(before.get('agent')):
                vm.pending[key] = value
                if 'agent' in before:
                    vm.config['agent'] = before['agent']
                else:
                    vm.config.pop('agent', None)
        for key in deletes:
            if is_fast_plug(key):
                vm.pending.pop(key, None)
                vm.config.pop(key, None)
                self.record_cloudinit_change(vm, key, before.get(key), None)

    @staticmethod
    def record_cloudinit_change(vm, key, old, new):
        """The [special:cloudinit] bookkeeping of qemu-server 9.2.6 src/PVE/QemuServer.pm:4635-4696
        ($cloudinit_record_changed), for the options of cloudinit_pending_properties (:1792-1798: the
        cloud-init options, name and netN): the first change of a value records its old value, a change back
        to it drops the record, a value set where there was none is listed in 'added'."""
        if not (key in CLOUDINIT_OPTIONS or key == 'name' or IPCONFIG_OPTION.match(key) or NET_OPTION.match(key)):
            return
        record = vm.cloudinit_record
        recorded = record.get(key)
        added = set(item for item in str(record.pop('added', '') or '').split(',') if item)
        if new is not None:
            if recorded is not None:
                if str(new) == str(recorded):
                    record.pop(key, None)
                    added.discard(key)
            elif key in added:
                pass
            elif old is not None:
                record[key] = old
            else:
                added.add(key)
        elif old is not None:
            if recorded is None:
                if key in added:
                    added.discard(key)
                else:
                    record[key] = old
        if added:
            record['added'] = ','.join(sorted(added))

    def _routes_lab_cloudinit(self):
        return [('GET', '/nodes/{node}/qemu/{vmid}/cloudinit', self._lab_cloudinit_pending)]

    async def _lab_cloudinit_pending(self, values, user):
        """GET .../cloudinit as qemu-server 9.2.6 src/PVE/API2/Qemu.pm:1969-2010 (cloudinit_pending) answers:
        the options set since the drive was generated (pending), the options of $cloudinitoptions (:853-862:
        not ipconfigN, not name, not netN) with the value the drive has and, when changed, the pending one,
        and the recorded options no longer set (delete). A changed ipconfig0 is recorded but not listed."""
        vm = self.find(values['node'], values['vmid'])
        conf = dict(vm.config)
        record = dict(vm.cloudinit_record)
        if 'cipassword' in conf:
            conf['cipassword'] = '**********'
        if 'cipassword' in record:
            record['cipassword'] = '**********'
        out = []
        added = str(record.pop('added', '') or '')
        for key in [item for item in added.split(',') if item]:
            out.append({'key': key, 'pending': conf.get(key)})
        for key in sorted(CLOUDINIT_OPTIONS):
            if not conf.get(key) or key in added:   # PVE: next if $added =~ m/$opt/
                continue
            item = {'key': key}
            if record.get(key):
                item.update(value=record[key], pending=conf[key])
            else:
                item['value'] = conf[key]
            out.append(item)
        for key in sorted(record):
            if not conf.get(key):
                out.append({'key': key, 'delete': 1})
        return out

    def _routes_lab_acl(self):
        return [('PUT', '/access/acl', self._update_acl)]

    async def _update_acl(self, v, user):
        """PUT /access/acl (`pveum acl modify|delete`), pve-access-control 9.1.1 src/PVE/API2/ACL.pm:107-268 for
        users and tokens: the caller needs Permissions.Modify on the path (:112-114 perm-modify; the alternative of
        handing out a subset of one's own privileges, :189-222, is not modelled), the path is normalised (:161-167),
        roles, users and tokens must exist (:186, :240, :251), each (user or token, role) gets the propagate flag
        (default 1, :177-182) or is removed with `delete`. Groups are not modelled (the lab has none)."""
        if not (v.get('users') or v.get('tokens') or v.get('groups')):
            raise PveError(400, 'Parameter verification failed.',
                           dict.fromkeys(('users', 'groups', 'tokens'), "either 'users', 'groups' or 'tokens' is required."))
        path = str(v.get('path') or '')
        if not re.match(r'^[A-Za-z0-9._/-]+$', path):
            raise PveError(400, 'Parameter verification failed.', {'path': "invalid ACL path '%s'" % path})
        path = '/' + '/'.join(part for part in path.split('/') if part)
        if user is not None and not self.allowed(user, path, 'Permissions.Modify'):
            raise PveError(403, 'Permission check failed (%s, Permissions.Modify)' % path)
        if v.get('groups'):
            raise PveError(500, "group '%s' does not exist" % _split_list(v['groups'])[0])
        delete = str(v.get('delete', '0')) in ('1', 'true')
        propagate = str(v.get('propagate', '1')) not in ('0', 'false')
        split = _split_list
        for role in split(v.get('roles')):
            if role not in self.access.roles:
                raise PveError(500, "role '%s' does not exist" % role)
            for who in split(v.get('users')) + split(v.get('tokens')):
                known = who in self.access.tokens if '!' in who else who in (PVE_USER, ROOT_USER)
                if not known:
                    raise PveError(500, "%s '%s' does not exist" % ('token' if '!' in who else 'user', who))
                if delete:
                    self.access.revoke(path, who, role)
                else:
                    self.access.grant(path, who, role, propagate)
        return None

    async def _permissions(self, v, user):
        # pve-access-control src/PVE/API2/AccessControl.pm:549-570: the caller's own (or its token's) permissions.
        who = v.get('userid') or user
        if who != user and who.split('!', maxsplit=1)[0] != user:
            raise PveError(403, 'Permission check failed (/access, Sys.Audit)')
        return self.access.effective(who, v.get('path'))

    # ------------------------------------------------------------------ setup

    def reseed(self, seed):
        """Seed the generator behind the network faults (fakepve seeds it only when it starts)."""
        self._random.seed(seed)

    def reset_access(self):
        """The lab's users, token and ACL entries as at start (lab_access), the token's secret kept."""
        self.access = lab_access(self.major)

    def check_permissions(self, user, perms, values, declared=None):
        """fakepve's check of the schema's rule; on PVE 8 a guest-agent rule asks for VM.Monitor (PVE_RELEASES)."""
        if self.major == 8 and perms and 'check' in perms and perms['check'][0] == 'perm' and any(
                str(p).startswith('VM.GuestAgent.') for p in perms['check'][2]):
            perms = dict(perms, check=['perm', perms['check'][1], [PVE8_AGENT_PRIVILEGE]])
        return super().check_permissions(user, perms, values, declared)

    def reset_storages(self):
        """Storages as on a fresh node: empty, with the content types the collection needs."""
        fresh = fakepve.model.Model()
        self.storages = fresh.storages
        self.file_sources = {}   # volid -> the URL download-url fetched it from
        for name, content in STORAGE_CONTENT.items():
            self.storages[name]['content'] = content

    def _default_networks(self, host_number):
        address = self.net.host(host_number)
        return [
            {'iface': 'vmbr0', 'type': 'bridge', 'method': 'static', 'method6': 'manual', 'families': ['inet'],
             'priority': 3, 'active': 1, 'autostart': 1, 'exists': 1, 'address': address,
             'netmask': '255.255.255.0', 'cidr': address + '/24', 'gateway': self.net.gateway,
             'bridge_ports': 'eno1', 'bridge_stp': 'off', 'bridge_fd': '0', 'comments': 'lab bridge\n'},
            {'iface': 'eno1', 'type': 'eth', 'method': 'manual', 'method6': 'manual', 'families': ['inet'],
             'priority': 2, 'active': 1, 'exists': 1},
        ]

    def _build_app(self):
        app = super()._build_app()
        # Outermost: sees every request and the final status, including dropped connections.
        app.middlewares.insert(0, self._lab_middleware)
        return app

    # ---------------------------------------------------------- request log

    @web.middleware
    async def _lab_middleware(self, request, handler):
        started = time.monotonic()
        status = None
        try:
            rule = self.api_error
            if rule is not None and rule.matches(request):
                response = fakepve.server.error(rule.status, rule.message)
                self._count_api_error(rule)
            else:
                response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except ConnectionResetError:
            status = 'dropped'
            raise
        except asyncio.CancelledError:
            status = 'cancelled'
            raise
        finally:
            if self.on_request is not None:
                self.on_request('pve', request.method, request.path, status,
                                duration_ms=round((time.monotonic() - started) * 1000, 3))

    def _count_api_error(self, rule):
        if rule.times is None:
            return
        rule.times -= 1
        if rule.times <= 0:
            if self.api_error is rule:
                self.api_error = None
            rule.on_exhausted()

    # ----------------------------------------------------------------- tasks

    async def task(self, node, ttype, tid, user, body, vm=None, lock=True, log=()):
        """fakepve's task runner, with the injected task errors and the duration record."""
        fault = self._take_task_fault(ttype, tid)
        if fault is not None:
            body = self._failing_body(fault, ttype, tid, vm)
        timing = self.timing
        run = body

        async def timed():
            record = timing.begin('pve_task', '%s:%s' % (ttype, tid), 0.0, 0.0)
            outcome = 'failed'
            try:
                result = await run()
                outcome = 'done'
                return result
            finally:
                timing.end(record, outcome)
        return await super().task(node, ttype, tid, user, timed, vm=vm, lock=lock, log=log)

    def _take_task_fault(self, ttype, tid):
        for fault in list(self.task_faults.values()):
            if fault.matches(ttype, tid):
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self.task_faults.pop(fault.operation, None)
                        fault.on_exhausted()
                return fault
        return None

    def _failing_body(self, fault, ttype, tid, vm):
        message = fault.message or TASK_MESSAGES.get(ttype, '{type} failed: error injected by the lab')
        message = message.replace('{tid}', str(tid)).replace('{type}', ttype)

        async def fail():
            if ttype in ('qmcreate', 'qmclone') and vm is not None and vm in self.vms:
                # PVE removes what a failed create or clone had started.
                self.vms.remove(vm)
            raise TaskError(message)
        return fail

    # ------------------------------------------------------------ guest agent

    async def _agent_call(self, match, values):
        # PVE::QemuServer::Agent::agent_available: configured, VM running, agent answering.
        vm = self.find(values['node'], values['vmid'])
        if not agent_enabled(vm.config):
            raise PveError(500, 'No QEMU guest agent configured')
        if vm.status != 'running':
            raise PveError(500, 'VM {0} is not running'.format(vm.vmid))
        return await super()._agent_call(match, values)

    # ---------------------------------------------------------------- resize

    def _routes_lab_resize(self):
        return [('PUT', '/nodes/{node}/qemu/{vmid}/resize', self._lab_resize)]

    async def _lab_resize(self, values, user):
        """PUT .../resize as qemu-server 9.2.6 src/PVE/API2/Qemu.pm:5940-6073 (resize_vm) does it, which fakepve 0.5
        answers with a task that changes nothing. A `resize` task (:6067-6072) runs the checks and the change
        (:6004-6065): a missing disk, a CD-ROM and shrinking end the task in an error (:6010,6021,6048); the size is
        absolute, or added with `+` (:6032-6046); the same size changes nothing (:6050). The storage's free space
        shrinks by the growth."""
        vm = self.find(values['node'], values['vmid'])
        disk = values['disk']
        found = re.fullmatch(r'(\+)?(\d+(?:\.\d+)?)([KMGT])?', str(values['size']))
        if found is None:
            raise PveError(400, 'Parameter verification failed.', {'size': 'value does not match the regex pattern'})

        async def body():
            if not vm.config.get(disk):
                raise TaskError("disk '{0}' does not exist".format(disk))
            volume, props = fakepve.qemu.split_drive(vm.config[disk])
            if props.get('media') == 'cdrom' or volume in ('none', 'cdrom'):
                raise TaskError("you can't resize a cdrom")
            sid, volname = fakepve.qemu.volume_ref(volume)
            store = self.storages.get(sid) or {}
            record = store.get('volumes', {}).get(volname) or {}
            size = int(record.get('size') or _size_bytes(props.get('size')) or 0)
            new = _size_bytes(found.group(2) + (found.group(3) or ''))
            if found.group(1):
                new += size
            if new < size:
                raise TaskError('shrinking disks is not supported')
            if new == size:
                return
            if 'avail' in store:
                if new - size > store['avail']:
                    raise TaskError("unable to write to storage '{0}': No space left on device".format(sid))
                store['avail'] -= new - size
            if record:
                record['size'] = new
            props['size'] = fakepve.lxc.format_size(new)
            vm.config[disk] = fakepve.qemu.join_drive(volume, props)
        return await self.task(values['node'], 'resize', vm.vmid, user, body, vm=vm)

    # -------------------------------------------------------------------- HA

    async def _ha_request(self, vm, user, state):
        """An HA-managed VM's start, stop or shutdown as qemu-server 9.2.6 src/PVE/API2/Qemu.pm does it: a
        `hastart` (:3631-3642) or `hastop` (:3757-3768 stop, :3934-3945 shutdown) task that only asks the HA
        stack (`ha-manager set --state started`, `ha-manager crm-command stop`) and ends at once; the CRM/LRM
        then change the VM's power state later, here ha_crm_delay real seconds after the task (default 1 s,
        whatever the time scale, so that a client that takes the end of the task for the state change meets
        the race it meets on PVE)."""
        delay = self.ha_crm_delay.get(vm.vmid, 1.0)
        loop = asyncio.get_running_loop()

        def crm():
            if vm not in self.vms:
                return
            if state == 'started' and vm.status != 'running':
                vm.apply_pending()
                vm.status = vm.qmpstatus = 'running'
                vm.started_at = time.time()
            elif state == 'stopped' and vm.status == 'running':
                vm.status = vm.qmpstatus = 'stopped'
            vm.ha_state = state

        async def body():
            loop.call_later(delay, crm)
        verb = 'start' if state == 'started' else 'stop'
        return await self.task(vm.node, 'ha' + verb, vm.vmid, user, body, lock=False,
                               log=['Requesting HA {0} for VM {1}'.format(verb, vm.vmid)])

    # -------------------------------------------------------------- download

    async def _download_url(self, request):
        """POST /nodes/{node}/storage/{storage}/download-url as pve-storage 9.1.7 src/PVE/API2/Storage/Status.pm
        does it, where fakepve 0.5 differs: the permission is Datastore.AllocateTemplate on the storage and either
        Sys.Audit + Sys.Modify on / or Sys.AccessNetwork on the node (:743-756); the file name is normalised
        (:831, src/PVE/Storage.pm:2483-2491: the directory part dropped, other characters than [a-zA-Z0-9_.-]
        become _) and an ISO must end in .iso or .img (:836-840, Storage.pm:116); a `checksum` is verified
        (:871-880; the lab's download of a URL is download_content(url)) and a mismatch ends the task in PVE's
        error."""
        name, store = self._file_storage(request, 'download')
        user = request[fakepve.server.USER]
        node = request.match_info['node']
        self.require(user, '/storage/' + name, 'Datastore.AllocateTemplate')
        if not (self.allowed(user, '/nodes/' + node, 'Sys.AccessNetwork')
                or (self.allowed(user, '/', 'Sys.Audit') and self.allowed(user, '/', 'Sys.Modify'))):
            raise PveError(403, 'Permission check failed')   # PVE names no reason when no alternative holds
        values = await fakepve.server.params(request)
        # size is fakepve's own parameter: how large the download pretends to be.
        size = fakepve.server.int_param(values, 'size', 1024 ** 2, minimum=0)
        values = self._verify(request, values, drop=('size',))
        self._need_file_storage(store, "can't upload to storage type '{0}', not a file based storage!")
        content = values['content']
        if content not in str(store.get('content', '')).split(','):
            raise PveError(500, "storage '{0}' is not configured for content-type '{1}'".format(name, content))
        filename = re.sub(r'[^a-zA-Z0-9_.-]', '_', re.sub(r'^.*[/\\]', '', str(values['filename']).rstrip('\n')))
        if content == 'iso' and not re.search(r'[^/]+\.(?:iso|img)$', filename, re.I):
            raise PveError(400, 'Parameter verification failed.', {'filename': 'wrong file extension'})
        checksum, algorithm = values.get('checksum'), values.get('checksum-algorithm')

        async def body():
            await self.pause(5)
            if checksum:
                # pve-common 9.2.1 src/PVE/Tools.pm:1553-1562: the download is hashed and compared. The lab's
                # download of a URL is the bytes of download_content(url).
                got = hashlib.new(algorithm or 'sha256', download_content(values.get('url'))).hexdigest()
                if got.lower() != str(checksum).lower():
                    raise TaskError("checksum mismatch: got '{0}' != expect '{1}'".format(got, checksum))
            self.store_file(name, filename, size, content)
            # what the file holds, for the simulations that boot from it (lab.talos.versions)
            self.file_sources['%s:%s/%s' % (name, content, filename)] = values.get('url')
        return fakepve.server.ok(await self.task(node, 'download', name, user, body,
                                                 log=['downloading {0} to {1}'.format(values.get('url'), filename)]))

    # --------------------------------------------------------------- network

    def _routes_lab_network(self):
        return [('GET', '/nodes/{node}/network', self._lab_network_list),
                ('GET', '/nodes/{node}/network/{iface}', self._lab_network_read)]

    async def _lab_network_list(self, values, user):
        wanted = values.get('type')
        out = []
        for iface in self.node_networks.get(values['node'], []):
            kind = iface['type']
            if kind in ('bridge', 'OVSBridge') and user is not None and not self._sdn_bridge_visible(user, iface['iface']):
                # pve-manager PVE/API2/Network.pm:470-480: a bridge the caller may neither audit nor use is left out.
                continue
            if wanted in (None, '') or wanted == kind or (
                    wanted in ('any_bridge', 'any_local_bridge') and kind in ('bridge', 'OVSBridge')):
                out.append(dict(iface))
        # pve-manager 14a22df3 PVE/API2/Network.pm:430-453: with type any_bridge, include_sdn or vnet, the VNets
        # the caller may see are added (get_local_vnets, access-filtered; any_local_bridge leaves them out).
        if wanted in ('any_bridge', 'include_sdn', 'vnet'):
            for vnet, config in sorted(SDN_VNETS.items()):
                if user is None or self._sdn_bridge_visible(user, vnet, config['zone']):
                    out.append({'iface': vnet, 'type': 'vnet', 'active': 1, 'ipam': 0,
                                'vlanaware': int(config['vlanaware'])})
        return out

    def _sdn_bridge_visible(self, user, bridge, zone='localnetwork'):
        """pve-access-control 9.1.1 src/PVE/RPCEnvironment.pm:338-360 check_sdn_bridge: SDN.Audit or SDN.Use on
        /sdn/zones/<zone>/<bridge>, or on one of the VLANs below it that has an ACL entry."""
        path = '/sdn/zones/%s/%s' % (zone, bridge)
        privileges = AnyOf('SDN.Audit|SDN.Use')
        if self.allowed(user, path, privileges):
            return True
        return any(self.allowed(user, acl, privileges) for acl in self.access.acl_paths()
                   if acl.startswith(path + '/') and acl.count('/') == path.count('/') + 1)

    async def _lab_network_read(self, values, user):
        for iface in self.node_networks.get(values['node'], []):
            if iface['iface'] == values['iface']:
                return dict((k, v) for k, v in iface.items() if k != 'iface')
        raise PveError(400, 'Parameter verification failed.', {'iface': 'interface does not exist'})


# ------------------------------------------------------------------------------- faults

class PveFaults(object):
    """The PVE faults, each mapped onto fakepve's own scenario API where it has one."""

    def __init__(self, pve, registry, loop, network=None):
        self.pve = pve
        self.registry = registry
        self.loop = loop
        self.network = network
        self._lock_timers = {}
        self._storage_before = {}   # storage id -> (avail, total, used) before pve-storage-full
        self._revoked = {}          # privilege -> the roles pve-privilege-revoked took it from

    def register(self):
        reg = self.registry.register
        reg('pve-task-error',
            'tasks of OPERATION end in "TASK ERROR: <message>" (the API call itself answers a UPID). OPERATION: '
            + ', '.join(sorted(TASK_OPERATIONS)) + ', or a PVE task type', 'operation',
            self.apply_task_error, self.clear_task_error,
            params=[Param('vmid', str, None, 'only tasks of this VM (for download-url/upload: the storage id)'),
                    Param('message', str, None, 'the exit status (default: what PVE says for such a failure)'),
                    Param('times', int, None, 'fail this many tasks, then stop (default: every task until cleared)')])
        reg('pve-config-lock',
            "another task holds VMID's config lock: config changes fail with \"can't lock file ... got timeout\", "
            'tasks end in that TASK ERROR (fakepve hold_config_lock)', 'vmid',
            self.apply_config_lock, self.clear_config_lock,
            params=[Param('secs', float, None, 'release after this many real seconds (default: until cleared)')])
        reg('pve-flaky-network',
            'a share of API requests is dropped (connection reset) or hangs (fakepve flaky_network)', None,
            self.apply_flaky_network, self.clear_network,
            params=[Param('drop_rate', float, 0.3, 'share of requests dropped, 0-1'),
                    Param('hang_rate', float, 0.0, 'share of requests that hang for hang_secs, 0-1'),
                    Param('hang_secs', float, 120.0,
                          'PVE seconds a hung request waits (times the time scale; real seconds at time scale 0)'),
                    Param('seed', int, None, 'seed of the random choice, for repeatable runs')])
        reg('pve-slow-network', 'every API answer is delayed by LATENCY PVE seconds times the time scale (no effect '
                                'at time scale 0; fakepve slow_network)', None,
            self.apply_slow_network, self.clear_network,
            params=[Param('latency', float, 2.0, 'PVE seconds added to every answer'),
                    Param('jitter', float, 0.0, 'random extra PVE seconds, up to this')])
        reg('pve-5xx', 'the API answers the next TIMES requests (any method, or METHOD; paths ending with PATH) with '
                       'an HTTP 5xx error, before authentication, as a failing proxy would', None,
            self.apply_api_error, self.clear_api_error,
            params=[Param('times', int, 1, 'number of requests that fail (0: every request until cleared)'),
                    Param('status', int, 503, 'HTTP status, 500-599'),
                    Param('message', str, 'Service Unavailable', 'error message'),
                    Param('path', str, '', 'only paths ending with this (e.g. /status/current)'),
                    Param('method', str, 'ANY', 'GET, POST, PUT, DELETE or ANY')])
        reg('pve-node-offline', 'the PVE node is unreachable: requests for it answer 595 No route to host '
                                '(fakepve set_node_offline)', 'node', self.apply_node_offline, self.clear_node_offline,
            target_required=False)
        if self.network is not None:
            reg('pve-agent-down', 'the QEMU guest agent of VMID does not run (not in the image, or its service stopped): '
                                  'agent calls answer 500 "QEMU guest agent is not running", so PVE reports no address; '
                                  'it stays down across reboots until cleared', 'vmid',
                self.apply_agent_down, self.clear_agent_down)
        reg('pve-privilege-revoked', 'the collection\'s token loses PRIVILEGE (e.g. VM.GuestAgent.Audit, Sys.AccessNetwork) '
                                     'from every role of the lab: PVE answers 403 "Permission check failed" where it is '
                                     'needed, and GET /access/permissions no longer lists it', 'privilege',
            self.apply_privilege_revoked, self.clear_privilege_revoked)
        reg('pve-ha-managed', 'VMID becomes an HA resource (ha-manager add vm:VMID): its start, stop and shutdown '
                              'answer hastart/hastop tasks that end before the HA stack changes the power state, '
                              'DELAY real seconds later; DELETE while it still runs fails "VM VMID is running - '
                              'destroy failed"', 'vmid', self.apply_ha_managed, self.clear_ha_managed,
            params=[Param('delay', float, 1.0, 'real seconds between the ha task and the power state change')])
        reg('pve-storage-full', 'STORAGE has no free space left (or FREE GiB): disk allocations on it fail with '
                                '"unable to write to storage ...: No space left on device", and its status reports the '
                                'space', 'storage', self.apply_storage_full, self.clear_storage_full,
            params=[Param('free', float, 0.0, 'GiB left free on the storage')])

    # ----------------------------------------------------------- task errors

    def apply_task_error(self, operation, vmid=None, message=None, times=None):
        task_type = TASK_OPERATIONS.get(operation, operation)
        if times is not None and times < 1:
            raise FaultError('fault pve-task-error: times must be 1 or more, got %d' % times)

        def exhausted():
            self.registry.expire('pve-task-error', operation)
        self.pve.task_faults[operation] = TaskFault(operation, task_type, vmid, message, times, exhausted)
        return {'task_type': task_type}

    def clear_task_error(self, operation):
        self.pve.task_faults.pop(operation, None)

    # ----------------------------------------------------------- config lock

    def _vm(self, target):
        try:
            vmid = int(target)
        except ValueError:
            raise FaultError('VMID must be a number, got %r' % (target,)) from None
        vm = self.pve.vm(vmid)
        if vm is None:
            raise FaultError('no VM %d in the lab (VMs: %s)' % (
                vmid, ', '.join(str(v.vmid) for v in self.pve.vms) or 'none'))
        return vm

    async def apply_config_lock(self, target, secs=None):
        vm = self._vm(target)
        if secs is not None and secs <= 0:
            raise FaultError('fault pve-config-lock: secs must be more than 0, got %r' % secs)
        if vm.lock_holder == 'scenario':
            self.pve.release_config_lock(vm.vmid)
        try:
            await self.pve.hold_config_lock(vm.vmid, None)
        except TaskError as exc:
            raise FaultError('VM %d: the config lock is busy (%s)' % (vm.vmid, exc)) from None
        timer = self._lock_timers.pop(target, None)
        if timer is not None:
            timer.cancel()
        if secs is not None:
            def release():
                self._lock_timers.pop(target, None)
                self.clear_config_lock(target)
                self.registry.expire('pve-config-lock', target)
            self._lock_timers[target] = self.loop.call_later(secs, release)
        return {'vmid': vm.vmid}

    def clear_config_lock(self, target):
        timer = self._lock_timers.pop(target, None)
        if timer is not None:
            timer.cancel()
        vm = self.pve.vm(int(target))
        if vm is not None:
            self.pve.release_config_lock(vm.vmid)

    # --------------------------------------------------------------- network

    def apply_flaky_network(self, target, drop_rate=0.3, hang_rate=0.0, hang_secs=120.0, seed=None):
        for name, rate in (('drop_rate', drop_rate), ('hang_rate', hang_rate)):
            if not 0 <= rate <= 1:
                raise FaultError('fault pve-flaky-network: %s must be between 0 and 1, got %r' % (name, rate))
        self.pve.flaky_network(drop_rate=drop_rate, hang_rate=hang_rate, hang_secs=hang_secs, seed=seed)
        if seed is not None:
            # fakepve seeds its generator when it starts; a fault applied later seeds it here.
            self.pve.reseed(seed)

    def apply_slow_network(self, target, latency=2.0, jitter=0.0):
        if latency < 0 or jitter < 0:
            raise FaultError('fault pve-slow-network: latency and jitter must be zero or more')
        self.pve.slow_network(latency, jitter)

    def clear_network(self, target):
        self.pve.flaky_network(0.0, 0.0)
        self.pve.slow_network(0.0, 0.0)

    # ------------------------------------------------------------ API errors

    def apply_api_error(self, target, times=1, status=503, message='Service Unavailable', path='', method='ANY'):
        if not 500 <= status <= 599:
            raise FaultError('fault pve-5xx: status must be 500-599, got %d' % status)
        method = method.upper()
        if method not in ('ANY', 'GET', 'POST', 'PUT', 'DELETE'):
            raise FaultError('fault pve-5xx: method must be GET, POST, PUT, DELETE or ANY, got %r' % method)
        if times < 0:
            raise FaultError('fault pve-5xx: times must be 0 (until cleared) or more, got %d' % times)

        def exhausted():
            self.registry.expire('pve-5xx')
        self.pve.api_error = ApiErrorFault(status, message, path, method, times or None, exhausted)

    def clear_api_error(self, target):
        self.pve.api_error = None

    # ------------------------------------------------------------ node offline

    def _node(self, target):
        node = target or sorted(self.pve.nodes)[0]
        if node not in self.pve.nodes:
            raise FaultError('no PVE node %r in the lab (nodes: %s)' % (node, ', '.join(sorted(self.pve.nodes))))
        return node

    def apply_node_offline(self, target):
        node = self._node(target)
        self.pve.set_node_offline(node)
        return {'node': node}

    def clear_node_offline(self, target):
        self.pve.set_node_offline(self._node(target), offline=False)

    # ------------------------------------------------------------ guest agent

    def apply_agent_down(self, target):
        vm = self._vm(target)
        self.network.stop_agent(vm)
        return {'vmid': vm.vmid, 'name': vm.name}

    def clear_agent_down(self, target):
        vm = self.pve.vm(int(target))
        if vm is not None:
            self.network.start_agent(vm)
        else:
            self.network.agent_down.discard(int(target))

    # ------------------------------------------------------------------- HA

    def apply_ha_managed(self, target, delay=1.0):
        vm = self._vm(target)
        if delay < 0:
            raise FaultError('fault pve-ha-managed: delay must be 0 or more seconds, got %r' % delay)
        vm.ha_state = 'started' if vm.status == 'running' else 'stopped'
        self.pve.ha_crm_delay[vm.vmid] = delay
        return {'vmid': vm.vmid, 'ha_state': vm.ha_state}

    def clear_ha_managed(self, target):
        vm = self.pve.vm(int(target))
        if vm is not None:
            vm.ha_state = None
        self.pve.ha_crm_delay.pop(int(target), None)

    # ------------------------------------------------------------ privileges

    def apply_privilege_revoked(self, target):
        access = self.pve.access
        if target not in access.all_privileges:
            raise FaultError('PVE has no privilege %r' % target)
        held = [name for name, privileges in access.roles.items() if target in privileges]
        if not held:
            raise FaultError('no role of the lab grants %s (roles: %s)' % (target, ', '.join(sorted(access.roles))))
        self._revoked[target] = held
        for name in held:
            access.roles[name] = access.roles[name] - {target}
        return {'privilege': target, 'roles': held}

    def clear_privilege_revoked(self, target):
        for name in self._revoked.pop(target, []):
            if name in self.pve.access.roles:
                self.pve.access.roles[name] = self.pve.access.roles[name] | {target}

    # ------------------------------------------------------------ storage full

    def apply_storage_full(self, target, free=0.0):
        store = self.pve.storages.get(target)
        if store is None:
            raise FaultError('no storage %r in the lab (storages: %s)' % (target, ', '.join(sorted(self.pve.storages))))
        if free < 0:
            raise FaultError('fault pve-storage-full: free must be 0 or more GiB, got %r' % free)
        total, used, _avail = self.pve._space(store)  # pylint: disable=protected-access
        if target not in self._storage_before:
            self._storage_before[target] = (store.get('avail'), store.get('total'), used)
        avail = int(free * GIB)
        store['avail'] = avail
        store['total'] = max(total, used + avail)
        return {'storage': target, 'total_gib': round(store['total'] / GIB, 1), 'free_gib': round(avail / GIB, 1)}

    def clear_storage_full(self, target):
        before = self._storage_before.pop(target, None)
        store = self.pve.storages.get(target)
        if before is None or store is None:
            return
        avail, total, used_then = before
        _total, used_now, _avail = self.pve._space(store)  # pylint: disable=protected-access
        for key, value in (('avail', None if avail is None else max(0, avail - (used_now - used_then))), ('total', total)):
            if value is None:
                store.pop(key, None)
            else:
                store[key] = value
