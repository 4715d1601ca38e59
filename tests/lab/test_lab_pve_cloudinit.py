"""The lab's PVE applies a running VM's config changes as PVE does: cloud-init options fast-plug (the guest keeps
the old values until the next start), NICs hot-plugged, the agent pending; GET .../cloudinit shows the drift."""
import pytest
from proxmoxer.tools import Tasks

pytestmark = pytest.mark.lab


def ok(api, upid):
    status = Tasks.blocking_status(api, upid, timeout=30, polling_interval=0.01)
    assert status['exitstatus'] == 'OK', status
    return status


def addresses(qemu):
    return dict((i['name'], [a['ip-address'] for a in i['ip-addresses']])
                for i in qemu.agent('network-get-interfaces').get()['result'])['eth0']


def pending(qemu):
    return dict((i['key'], i) for i in qemu.pending.get() if 'pending' in i or i.get('delete'))


def cloudinit(qemu):
    return dict((i['key'], i) for i in qemu.cloudinit.get())


def test_cloud_init_changes_on_a_running_vm_are_written_at_once_and_reach_the_guest_at_the_next_start(clean_lab):
    api = clean_lab.proxmox()
    net = clean_lab.net
    node = api.nodes('pve1')
    ok(api, node.qemu.post(vmid=1011, name='cp', net0='virtio,bridge=vmbr0', scsi0='local-lvm:4', agent='enabled=1',
                           ide0='local-lvm:cloudinit', ipconfig0='ip=%s.11/24,gw=%s.1' % (net, net), nameserver='1.1.1.1'))
    qemu = node.qemu(1011)
    ok(api, qemu.status.start.post())
    assert addresses(qemu) == [net + '.11'] and cloudinit(qemu) == {'nameserver': {'key': 'nameserver', 'value': '1.1.1.1'}}

    qemu.config.put(ipconfig0='ip=%s.21/24,gw=%s.1' % (net, net), nameserver='9.9.9.9', agent='enabled=1,type=isa')
    # fast-plug: in the config at once, not in [PENDING]; the agent change is pending
    config = qemu.config.get(current=1)
    assert config['ipconfig0'].startswith('ip=%s.21/' % net) and config['nameserver'] == '9.9.9.9'
    assert list(pending(qemu)) == ['agent']
    # the drive (and so the guest) still has the old values; GET .../cloudinit lists the nameserver's drift,
    # not the ipconfig0 one (PVE lists only $cloudinitoptions there)
    assert cloudinit(qemu)['nameserver'] == {'key': 'nameserver', 'value': '1.1.1.1', 'pending': '9.9.9.9'}
    assert 'ipconfig0' not in cloudinit(qemu)
    assert addresses(qemu) == [net + '.11']

    # changed back: no drift left for it
    qemu.config.put(nameserver='1.1.1.1')
    assert cloudinit(qemu)['nameserver'] == {'key': 'nameserver', 'value': '1.1.1.1'}

    # a setting added and one deleted while running
    qemu.config.put(searchdomain='lab.internal', delete='nameserver')
    seen = cloudinit(qemu)
    assert seen['searchdomain'] == {'key': 'searchdomain', 'pending': 'lab.internal'}
    assert seen['nameserver'] == {'key': 'nameserver', 'delete': 1}

    # the next start generates the drive again: the guest gets the new address, the drift is gone
    ok(api, qemu.status.reboot.post())
    assert addresses(qemu) == [net + '.21']
    assert cloudinit(qemu) == {'searchdomain': {'key': 'searchdomain', 'value': 'lab.internal'}}
    assert pending(qemu) == {} and qemu.config.get()['agent'] == 'enabled=1,type=isa'


def test_a_nic_change_on_a_running_vm_is_hot_plugged(clean_lab):
    api = clean_lab.proxmox()
    node = api.nodes('pve1')
    ok(api, node.qemu.post(vmid=1021, name='w', net0='virtio,bridge=vmbr0', scsi0='local-lvm:4', start=1))
    qemu = node.qemu(1021)
    mac = qemu.config.get()['net0'].split(',', maxsplit=1)[0]
    qemu.config.put(net0='%s,bridge=vmbr0,tag=20,firewall=1' % mac)
    assert qemu.config.get(current=1)['net0'] == '%s,bridge=vmbr0,tag=20,firewall=1' % mac
    assert pending(qemu) == {}


def test_a_disk_grows_by_resize_and_never_shrinks(clean_lab):
    # fakepve 0.5 answered resize with a task that changed nothing (audit L3).
    api = clean_lab.proxmox()
    node = api.nodes('pve1')
    ok(api, node.qemu.post(vmid=1022, name='w', net0='virtio,bridge=vmbr0', scsi0='local-lvm:10', start=1))
    qemu = node.qemu(1022)
    ok(api, qemu.resize.put(disk='scsi0', size='20G'))
    assert qemu.config.get()['scsi0'].endswith('size=20G')
    ok(api, qemu.resize.put(disk='scsi0', size='+2G'))
    assert qemu.config.get()['scsi0'].endswith('size=22G')
    status = Tasks.blocking_status(api, qemu.resize.put(disk='scsi0', size='5G'), timeout=30, polling_interval=0.01)
    assert status['exitstatus'] == 'shrinking disks is not supported'
