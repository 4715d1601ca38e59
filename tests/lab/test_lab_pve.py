"""The lab's PVE through proxmoxer over verified TLS: token, storages, bridges, VMs, addresses, agents."""
import json
import socket
import ssl

import pytest
import requests
from proxmoxer import ResourceException
from proxmoxer.tools import Tasks

from ansible_collections.proxtalos.cluster.plugins.module_utils import _proxmox

pytestmark = pytest.mark.lab


def finished(api, upid):
    return Tasks.blocking_status(api, upid, timeout=30, polling_interval=0.01)


def ok(api, upid):
    status = finished(api, upid)
    assert status['exitstatus'] == 'OK', status
    return status


def create_vm(api, vmid, node='pve1', start=False, **config):
    config.setdefault('name', 'vm-%d' % vmid)
    config.setdefault('net0', 'virtio,bridge=vmbr0')
    config.setdefault('scsi0', 'local-lvm:4')
    ok(api, api.nodes(node).qemu.post(vmid=vmid, **config))
    if start:
        ok(api, api.nodes(node).qemu(vmid).status.start.post())
    return api.nodes(node).qemu(vmid)


def interfaces(qemu):
    return dict((i['name'], [a['ip-address'] for a in i['ip-addresses']])
                for i in qemu.agent('network-get-interfaces').get()['result'])


def agent_error(qemu):
    with pytest.raises(ResourceException) as raised:
        qemu.agent('network-get-interfaces').get()
    return raised.value


# ------------------------------------------------------------------------------ access

def test_tls_is_verified_against_the_lab_ca_for_the_pve_address(clean_lab):
    assert clean_lab.proxmox().version.get()['version']
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(clean_lab.pve_url + '/api2/json/version', timeout=10)   # the system CAs do not know the lab
    context = ssl.create_default_context(cafile=clean_lab.ca_path)
    with socket.create_connection((clean_lab.pve_host, clean_lab.pve_port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=clean_lab.pve_host) as tls:
            assert tls.version()
    # The names of a PVE node's default certificate (pve-cluster Setup.pm:497-505): loopback, localhost, the node's
    # IP, name and FQDN; an alias such as a cluster VIP's name is not among them.
    for name in ('localhost', '127.0.0.1', 'pve1', 'pve1.lab.internal'):
        with socket.create_connection((clean_lab.pve_host, clean_lab.pve_port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname=name) as tls:
                assert tls.version()
    with socket.create_connection((clean_lab.pve_host, clean_lab.pve_port), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError, match='mismatch') as raised:
            context.wrap_socket(raw, server_hostname='pve.lab.internal')
    # ... and the collection tells that error from an unknown CA (it says to use a name the certificate carries)
    assert _proxmox.is_hostname_mismatch(str(raised.value))


def test_token_and_password_logins(clean_lab):
    from proxmoxer import ProxmoxAPI
    wrong = clean_lab.proxmox(token_value='not-the-secret')
    with pytest.raises(ResourceException) as raised:
        wrong.nodes.get()
    assert raised.value.status_code == 401
    ticket = ProxmoxAPI(clean_lab.pve_host, user='root@pam', password=clean_lab.password, verify_ssl=clean_lab.ca_path)
    assert [n['node'] for n in ticket.nodes.get()] == ['pve1']


def test_storages_and_bridge_the_preflight_checks(clean_lab):
    node = clean_lab.proxmox(root=True).nodes('pve1')
    storages = dict((s['storage'], set(s['content'].split(','))) for s in node.storage.get())
    assert {'iso', 'vztmpl', 'import', 'snippets'} <= storages['local']
    assert 'images' in storages['local-lvm']
    bridges = node.network.get(type='bridge')
    assert [b['iface'] for b in bridges] == ['vmbr0']
    assert bridges[0]['cidr'] == clean_lab.pve_host + '/24'
    assert node.network('vmbr0').get()['type'] == 'bridge'
    with pytest.raises(ResourceException) as raised:
        node.network('vmbr7').get()
    assert raised.value.status_code == 400 and 'interface does not exist' in str(raised.value)


def test_requests_are_logged_with_method_path_and_status(clean_lab):
    since = clean_lab.last_seq('requests')
    api = clean_lab.proxmox()
    api.version.get()
    with pytest.raises(ResourceException):
        api.nodes('pve1').qemu(4242).config.get()
    logged = [(r['source'], r['method'], r['path'], r['status']) for r in clean_lab.requests(since=since)]
    assert logged == [('pve', 'GET', '/api2/json/version', 200),
                      ('pve', 'GET', '/api2/json/nodes/pve1/qemu/4242/config', 500)]
    with open(clean_lab.paths.requests, encoding='utf-8') as handle:
        last = json.loads(handle.readlines()[-1])
    assert last['path'] == '/api2/json/nodes/pve1/qemu/4242/config' and last['status'] == 500


# ------------------------------------------------------------------------------ addresses

def test_cloud_init_vm_gets_its_static_address_from_the_agent(clean_lab):
    api = clean_lab.proxmox()
    address = clean_lab.net + '.11'
    qemu = create_vm(api, 1011, start=True, agent='enabled=1', ide2='local-lvm:cloudinit',
                     ipconfig0='ip=%s/24,gw=%s.1' % (address, clean_lab.net))
    found = interfaces(qemu)
    assert found['eth0'] == [address]
    assert found['lo'][0] == '127.0.0.1'
    row = clean_lab.vms()[0]
    assert (row['address'], row['address_source'], row['agent']) == (address, 'static', 'running')


def test_dhcp_addresses_are_handed_out_in_order_and_kept_across_reboots(clean_lab):
    api = clean_lab.proxmox()
    first = create_vm(api, 1021, start=True, agent=1)
    second = create_vm(api, 1022, start=True, agent=1)
    assert interfaces(first)['eth0'] == [clean_lab.net + '.100']
    assert interfaces(second)['eth0'] == [clean_lab.net + '.101']
    ok(api, first.status.stop.post())
    ok(api, first.status.start.post())
    ok(api, first.status.reboot.post())
    assert interfaces(first)['eth0'] == [clean_lab.net + '.100']
    # Deleting a VM releases its lease: the next new VM gets the address.
    ok(api, second.status.stop.post())
    ok(api, second.delete())
    third = create_vm(api, 1023, start=True, agent=1)
    assert interfaces(third)['eth0'] == [clean_lab.net + '.101']


def test_dhcp_skips_addresses_taken_by_static_vms(clean_lab):
    api = clean_lab.proxmox()
    create_vm(api, 1011, ipconfig0='ip=%s.100/24' % clean_lab.net)
    dynamic = create_vm(api, 1021, start=True, agent=1)
    assert interfaces(dynamic)['eth0'] == [clean_lab.net + '.101']


def test_agent_errors_are_pves(clean_lab):
    api = clean_lab.proxmox()
    agentless = create_vm(api, 1031, start=True)
    assert 'No QEMU guest agent configured' in str(agent_error(agentless))
    stopped = create_vm(api, 1032, agent=1)
    assert 'VM 1032 is not running' in str(agent_error(stopped))
    assert [(r['vmid'], r['agent']) for r in clean_lab.vms()] == [(1031, 'none'), (1032, 'off')]


def test_agent_comes_up_after_the_boot_delay(lab_factory):
    # vm_boot: 20 s x 0.02 = 0.4 s. Without the other simulations, whose nodes boot with their own vm_boot delay.
    slow = lab_factory(control_planes=1, workers=1, time_scale=0.02, extra_args=('--extensions', 'none'))
    api = slow.proxmox()
    qemu = create_vm(api, 1021, agent=1)
    ok(api, qemu.status.start.post())
    # The VM runs, the agent is not there yet: PVE's answer for a booting guest.
    assert 'QEMU guest agent is not running' in str(agent_error(qemu))
    assert slow.vms()[0]['agent'] == 'booting'

    def agent_address():
        try:
            return True, interfaces(qemu)['eth0']
        except ResourceException as exc:
            return False, str(exc)
    assert slow.wait_until(agent_address, timeout=20, what='the guest agent') == [slow.net + '.100']
    boots = slow.delays(kind='vm_boot')
    assert [(d['target'], d['nominal'], d['planned'], d['outcome']) for d in boots] == [('vm-1021', 20.0, 0.4, 'done')]


def test_a_vm_whose_iso_is_gone_does_not_start(clean_lab):
    # PVE activates every volume at start (qemu-server vm_start); an ISO deleted since the VM was made fails the start.
    api = clean_lab.proxmox(root=True)
    node = api.nodes('pve1')

    def finished(upid, what):
        clean_lab.wait_until(lambda: (node.tasks(upid).status.get()['status'] == 'stopped', upid), what=what)
        return node.tasks(upid).status.get()['exitstatus']
    download = node.storage('local')('download-url')
    assert finished(download.post(url='https://example.org/gone.iso', filename='gone.iso', content='iso'),
                    'the download') == 'OK'
    assert finished(node.qemu.post(vmid=4720, name='no-iso', ide2='local:iso/gone.iso,media=cdrom'), 'the create') == 'OK'
    node.storage('local').content('local:iso/gone.iso').delete()
    assert finished(node.qemu(4720).status.start.post(), 'the start') == "volume 'local:iso/gone.iso' does not exist"
    assert node.qemu(4720).status.current.get()['status'] == 'stopped'
    # deleting a VM leaves the ISO it booted (PVE's destroy_vm frees only what the VM owns): a new VM starts from it
    finished(download.post(url='https://example.org/gone.iso', filename='gone.iso', content='iso'), 'the second download')
    assert finished(node.qemu(4720).delete(), 'the destroy') == 'OK'
    assert 'local:iso/gone.iso' in [item['volid'] for item in node.storage('local').content.get(content='iso')]
    assert finished(node.qemu.post(vmid=4721, name='iso-kept', ide2='local:iso/gone.iso,media=cdrom'),
                    'the second create') == 'OK'
    assert finished(node.qemu(4721).status.start.post(), 'the second start') == 'OK'
