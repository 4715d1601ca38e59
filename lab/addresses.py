"""Addresses in the lab: the /24 a lab lives in, cloud-init static addresses and the DHCP server.

A lab owns one loopback /24, given as three octets (`--net 127.0.10`). Inside it:

    .1          gateway (named in inventories, nothing listens)
    .2          PVE API, port 8006 (.3 and up: the vmbr0 address of further PVE nodes)
    .10         cluster endpoint (control-plane VIP)
    .11 - .99   static node addresses, as the lab's hosts.yml plans them
    .100 - .254 DHCP pool for VMs without a static cloud-init ipconfig0

Linux routes all of 127.0.0.0/8 to the loopback interface, so every address can be bound
without configuring anything, and two labs on different nets never collide.
"""

import ipaddress
import re

GATEWAY_HOST = 1
PVE_HOST = 2
ENDPOINT_HOST = 10
FIRST_STATIC_HOST = 11
LAST_STATIC_HOST = 99
DHCP_FIRST_HOST = 100
DHCP_LAST_HOST = 254
PREFIX_LENGTH = 24

LOOPBACK = ipaddress.ip_network('127.0.0.0/8')
MAC = re.compile(r'^[0-9a-f]{2}(:[0-9a-f]{2}){5}$')


class Net(object):
    """A lab's /24, from its first three octets ('127.0.10')."""

    def __init__(self, text):
        parts = str(text).strip().split('.')
        if len(parts) != 3 or not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
            raise ValueError('net must be the first three octets of a /24, such as 127.0.10, got %r' % (text,))
        network = ipaddress.ip_network('%s.0/24' % '.'.join(str(int(p)) for p in parts))
        if not network.subnet_of(LOOPBACK):
            raise ValueError('net must be inside the loopback range 127.0.0.0/8 (the lab binds its addresses '
                             'on this machine only), got %r' % (text,))
        self.prefix = '.'.join(str(int(p)) for p in parts)
        self.network = network

    def __str__(self):
        return self.prefix

    def __repr__(self):
        return 'Net(%r)' % self.prefix

    def __eq__(self, other):
        return isinstance(other, Net) and other.prefix == self.prefix

    def __hash__(self):
        return hash(self.prefix)

    def host(self, number):
        """The address of host `number` (1-254) in this net."""
        if not 1 <= int(number) <= 254:
            raise ValueError('host number must be 1-254, got %r' % (number,))
        return '%s.%d' % (self.prefix, int(number))

    @property
    def gateway(self):
        return self.host(GATEWAY_HOST)

    @property
    def pve_host(self):
        return self.host(PVE_HOST)

    @property
    def endpoint_host(self):
        return self.host(ENDPOINT_HOST)

    def static_host(self, index):
        """The static address of the index-th (1-based) planned node."""
        number = FIRST_STATIC_HOST + int(index) - 1
        if number > LAST_STATIC_HOST:
            raise ValueError('only %d static addresses (.%d-.%d) exist in a lab net'
                             % (LAST_STATIC_HOST - FIRST_STATIC_HOST + 1, FIRST_STATIC_HOST, LAST_STATIC_HOST))
        return self.host(number)

    def contains(self, address):
        try:
            return ipaddress.ip_address(address) in self.network
        except ValueError:
            return False


class IpConfig(object):
    """A cloud-init ipconfigN value: a static IPv4 address (or None for DHCP), its prefix and gateway."""

    __slots__ = ('address', 'prefix', 'gateway')

    def __init__(self, address, prefix, gateway):
        self.address = address
        self.prefix = prefix
        self.gateway = gateway

    @property
    def static(self):
        return self.address is not None


def parse_ipconfig(value):
    """Parse PVE's ipconfigN ('ip=10.0.0.5/24,gw=10.0.0.1', 'ip=dhcp', ...) into an IpConfig.

    Returns None when the value is empty. Raises ValueError naming what is wrong otherwise, as
    PVE's own format check does for a bad address.
    """
    if value in (None, ''):
        return None
    options = {}
    for part in str(value).split(','):
        key, sep, val = part.partition('=')
        if not sep:
            raise ValueError('ipconfig item %r is not key=value' % (part,))
        options[key.strip()] = val.strip()
    ip = options.get('ip')
    if ip in (None, '', 'dhcp'):
        return IpConfig(None, None, options.get('gw'))
    try:
        interface = ipaddress.IPv4Interface(ip)
    except ValueError:
        raise ValueError('ipconfig ip=%r is not an IPv4 address with a prefix (A.B.C.D/N)' % (ip,)) from None
    if '/' not in ip:
        raise ValueError('ipconfig ip=%r has no prefix length (A.B.C.D/N)' % (ip,))
    return IpConfig(str(interface.ip), interface.network.prefixlen, options.get('gw'))


def nic_mac(config, key='net0'):
    """The MAC address (lower case) of network device `key` in a VM config, or None without one."""
    value = config.get(key)
    if not value:
        return None
    # 'virtio=BC:24:11:00:00:01,bridge=vmbr0' or 'model=virtio,macaddr=BC:24:11:00:00:01,...'
    for part in str(value).split(','):
        val = part.partition('=')[2].strip().lower()
        if MAC.match(val):
            return val
    return None


def agent_enabled(config):
    """True when the VM config enables the QEMU guest agent ('1', 'enabled=1', '1,fstrim_cloned_disks=1')."""
    value = config.get('agent')
    if value in (None, ''):
        return False
    for position, part in enumerate(str(value).split(',')):
        key, sep, val = part.partition('=')
        if not sep and position == 0:
            return key.strip() in ('1', 'true', 'yes', 'on')
        if key.strip() == 'enabled':
            return val.strip() in ('1', 'true', 'yes', 'on')
    return False


class DhcpServer(object):
    """Hands out addresses from the lab's pool, one lease per MAC, kept across reboots.

    A MAC that had a lease before gets the same address again when it is still free (as a
    DHCP server that remembers its clients). Deleting the VM releases its lease.
    """

    def __init__(self, net, first=DHCP_FIRST_HOST, last=DHCP_LAST_HOST):
        self.net = net
        self.pool = [net.host(n) for n in range(first, last + 1)]
        self.leases = {}
        self._remembered = {}

    def lease(self, mac, taken=()):
        """The address leased to mac; a new lease from the pool when it has none. None if the pool is used up.

        taken: addresses in use outside the DHCP server (static ipconfig addresses), never handed out.
        """
        if mac in self.leases:
            return self.leases[mac]
        busy = set(self.leases.values()) | set(taken)
        before = self._remembered.get(mac)
        if before is not None and before not in busy:
            choice = before
        else:
            choice = next((address for address in self.pool if address not in busy), None)
        if choice is not None:
            self.leases[mac] = choice
            self._remembered[mac] = choice
        return choice

    def release(self, mac):
        """Forget the lease of mac (its VM was deleted); returns the address it had, or None."""
        return self.leases.pop(mac, None)

    def clear(self):
        self.leases = {}
        self._remembered = {}
