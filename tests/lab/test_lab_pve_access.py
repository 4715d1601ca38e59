"""The lab's PVE permissions: PVE's ACL semantics (lab.pve_access), the lab's role against the collection's table,
and the lab's token refused what the role does not grant."""
import pytest
from fakepve import shapes
from proxmoxer import ResourceException

from ansible_collections.proxtalos.cluster.plugins.module_utils import _proxmox_privileges
from lab.pve import PVE_USER, TOKEN_ID, lab_access, lab_roles
from lab.pve_access import AccessControl


def access():
    acl = AccessControl(shapes.PRIVILEGES)
    acl.add_role('Audit', ['Sys.Audit'])
    acl.add_role('VMs', ['VM.Audit', 'VM.PowerMgmt'])
    acl.add_role('ReadVMs', ['VM.Audit'])
    return acl


def test_an_entry_without_propagate_holds_for_its_path_alone():
    acl = access()
    acl.grant('/', 'ops@pve', 'Audit', propagate=False)
    assert acl.allowed('ops@pve', '/', 'Sys.Audit')
    assert not acl.allowed('ops@pve', '/nodes/pve1', 'Sys.Audit')
    assert acl.effective('ops@pve') == {'/': {'Sys.Audit': 0}}


def test_a_deeper_entry_replaces_what_was_granted_above():
    acl = access()
    acl.grant('/vms', 'ops@pve', 'VMs')
    acl.grant('/vms/101', 'ops@pve', 'ReadVMs')
    assert acl.allowed('ops@pve', '/vms/102', 'VM.PowerMgmt')
    assert not acl.allowed('ops@pve', '/vms/101', 'VM.PowerMgmt') and acl.allowed('ops@pve', '/vms/101', 'VM.Audit')


def test_a_privilege_separated_token_holds_what_both_it_and_its_user_hold():
    acl = access()
    acl.add_token('ops@pve!sep', privsep=True)
    acl.add_token('ops@pve!full', privsep=False)
    acl.grant('/vms', 'ops@pve', 'ReadVMs')
    acl.grant('/vms', 'ops@pve!sep', 'VMs')
    assert acl.permissions('ops@pve!sep', '/vms/101') == {'VM.Audit': True}
    assert acl.permissions('ops@pve!full', '/vms/101') == {'VM.Audit': True}
    assert acl.permissions('ops@pve!unknown', '/vms/101') == {}
    assert acl.permissions('root@pam!any', '/')['Sys.Modify'] is True


@pytest.mark.parametrize('major', [9, 8])
def test_the_labs_role_is_the_collections_table(major):
    # The lab's role is written from PVE's sources and the collection's table from the same; neither reads
    # the other. They must agree, path for path, propagation included, for each PVE major the lab can answer as.
    lab = dict((path, (propagate, set(privs))) for path, (_name, propagate, privs) in lab_roles(major).items())
    table = {}
    for need in _proxmox_privileges.required():
        table.setdefault(need.acl, (need.propagate, set()))[1].add(need.granted(major))
    assert lab == table
    assert lab_access(major).all_privileges >= set().union(*(privs for _propagate, privs in lab.values()))


def test_the_labs_token_holds_the_role_and_no_more():
    acl = lab_access()
    assert acl.tokens == {TOKEN_ID: True}
    assert acl.allowed(TOKEN_ID, '/vms/1011', 'VM.GuestAgent.Audit')
    assert not acl.allowed(TOKEN_ID, '/nodes/pve1', 'Sys.Audit') and not acl.allowed(TOKEN_ID, '/', 'Sys.Modify')
    assert acl.allowed(TOKEN_ID, '/nodes/pve1', 'Sys.AccessNetwork')
    assert acl.allowed(TOKEN_ID, '/sdn/zones/localnetwork/vmbr0/20', 'SDN.Use')
    assert acl.allowed(PVE_USER, '/', 'Sys.Audit') and not acl.allowed(PVE_USER, '/storage', 'Sys.Audit')


@pytest.mark.lab
def test_the_lab_answers_its_token_as_pve_does(clean_lab):
    api = clean_lab.proxmox()
    perms = api.access.permissions.get()
    assert perms['/'] == {'Sys.Audit': 0} and perms['/vms']['VM.GuestAgent.Audit'] == 1
    assert perms['/nodes'] == {'Sys.AccessNetwork': 1} and 'Sys.Modify' not in str(perms)
    with pytest.raises(ResourceException) as raised:
        api.nodes('pve1').network('vmbr0').get()    # reading one interface needs Sys.Audit on the node
    assert raised.value.status_code == 403 and '/nodes/pve1, Sys.Audit' in str(raised.value)
    with pytest.raises(ResourceException) as raised:
        api.nodes('pve1').qemu.post(vmid=4711, name='x', args='-no-reboot')   # "only root can set 'args'"
    assert raised.value.status_code == 403
    assert [b['iface'] for b in api.nodes('pve1').network.get(type='any_bridge')] == ['vmbr0']


@pytest.mark.lab
def test_the_labs_download_url_is_pves(clean_lab):
    # The token has Sys.AccessNetwork on the node and no Sys.Modify on /: PVE downloads (fakepve 0.5 refused);
    # PVE normalises the name and refuses an ISO name without .iso/.img.
    api = clean_lab.proxmox()
    storage = api.nodes('pve1').storage('local')
    upid = storage('download-url').post(url='https://example.org/a.iso', filename='talos v1+x.iso', content='iso')
    clean_lab.wait_until(lambda: (api.nodes('pve1').tasks(upid).status.get()['status'] == 'stopped', upid),
                         what='the download task')
    assert api.nodes('pve1').tasks(upid).status.get()['exitstatus'] == 'OK'
    volids = [item['volid'] for item in storage.content.get(content='iso')]
    assert 'local:iso/talos_v1_x.iso' in volids
    with pytest.raises(ResourceException) as raised:
        storage('download-url').post(url='https://example.org/a.txt', filename='a.txt', content='iso')
    assert raised.value.status_code == 400 and 'wrong file extension' in str(raised.value)


def test_a_bridge_is_listed_for_a_grant_on_one_of_its_vlans():
    from lab.pve import LabPve
    pve = LabPve.__new__(LabPve)      # only the permission side: no server, no world
    pve.access = AccessControl(shapes.PRIVILEGES)
    pve.access.add_role('Bridges', ['SDN.Use'])
    pve.access.grant('/sdn/zones/localnetwork/vmbr0/20', 'ops@pve', 'Bridges')
    assert pve._sdn_bridge_visible('ops@pve', 'vmbr0')          # pylint: disable=protected-access
    assert not pve._sdn_bridge_visible('ops@pve', 'vmbr1')      # pylint: disable=protected-access


@pytest.mark.lab
def test_the_labs_download_verifies_a_checksum(clean_lab):
    import hashlib
    from lab.pve import download_content
    api = clean_lab.proxmox()
    storage = api.nodes('pve1').storage('local')
    url = 'https://example.org/talos.iso'
    right = hashlib.sha512(download_content(url)).hexdigest()

    def ended(upid):
        clean_lab.wait_until(lambda: (api.nodes('pve1').tasks(upid).status.get()['status'] == 'stopped', upid),
                             what='the download task')
        return api.nodes('pve1').tasks(upid).status.get()['exitstatus']
    sha512 = {'checksum-algorithm': 'sha512'}
    assert ended(storage('download-url').post(url=url, filename='good.iso', content='iso', checksum=right, **sha512)) == 'OK'
    failed = ended(storage('download-url').post(url=url, filename='bad.iso', content='iso', checksum='0' * 128, **sha512))
    assert failed.startswith("checksum mismatch: got '%s' != expect '" % right)
    assert [i['volid'] for i in storage.content.get(content='iso')] == ['local:iso/good.iso']


@pytest.mark.lab
def test_an_sdn_vnet_is_listed_and_usable_once_the_admin_grants_it(clean_lab):
    # PVE lists a VNet with type vnet only to credentials that may audit or use it, in its own zone, and a NIC
    # on it needs SDN.Use there (pve-manager Network.pm:430-453, pve-guest-common GuestHelpers.pm:397-421).
    token, admin = clean_lab.proxmox(), clean_lab.proxmox(root=True)
    assert [(b['iface'], b['type']) for b in admin.nodes('pve1').network.get(type='any_bridge')] == [
        ('vmbr0', 'bridge'), ('labvnet', 'vnet')]
    assert [b['iface'] for b in admin.nodes('pve1').network.get(type='any_local_bridge')] == ['vmbr0']
    assert [b['iface'] for b in token.nodes('pve1').network.get(type='any_bridge')] == ['vmbr0']
    with pytest.raises(ResourceException) as raised:
        token.nodes('pve1').qemu.post(vmid=4712, name='on-vnet', net0='virtio,bridge=labvnet')
    assert raised.value.status_code == 403 and '/sdn/zones/labzone/labvnet, SDN.Use' in str(raised.value)
    with pytest.raises(ResourceException) as raised:     # the token itself may not hand out rights
        token.access.acl.put(path='/sdn/zones/labzone/labvnet', roles='ProxtalosBridges', tokens=TOKEN_ID)
    assert raised.value.status_code == 403 and 'Permissions.Modify' in str(raised.value)

    # a privilege-separated token holds what both it and its user hold: the admin grants both
    # (first without propagation: the VNet, not its VLANs)
    admin.access.acl.put(path='/sdn/zones/labzone/labvnet', roles='ProxtalosBridges', users=PVE_USER,
                         tokens=TOKEN_ID, propagate=0)
    assert [b['iface'] for b in token.nodes('pve1').network.get(type='vnet')] == ['labvnet']
    assert token.access.permissions.get(path='/sdn/zones/labzone/labvnet') == {
        '/sdn/zones/labzone/labvnet': {'SDN.Use': 0}}
    token.nodes('pve1').qemu.post(vmid=4712, name='on-vnet', net0='virtio,bridge=labvnet')
    with pytest.raises(ResourceException) as raised:     # a VLAN of it is checked on its own path
        token.nodes('pve1').qemu.post(vmid=4713, name='on-vlan', net0='virtio,bridge=labvnet,tag=30')
    assert raised.value.status_code == 403 and '/sdn/zones/labzone/labvnet/30, SDN.Use' in str(raised.value)
    # granting again sets the entry's flag (one flag per user or token and role)
    admin.access.acl.put(path='/sdn/zones/labzone/labvnet', roles='ProxtalosBridges', users=PVE_USER,
                         tokens=TOKEN_ID, propagate=1)
    token.nodes('pve1').qemu.post(vmid=4713, name='on-vlan', net0='virtio,bridge=labvnet,tag=30')

    admin.access.acl.put(path='/sdn/zones/labzone/labvnet', roles='ProxtalosBridges', tokens=TOKEN_ID, delete=1)
    assert [b['iface'] for b in token.nodes('pve1').network.get(type='any_bridge')] == ['vmbr0']
    with pytest.raises(ResourceException) as raised:
        admin.access.acl.put(path='/sdn/zones/labzone/labvnet', roles='NoSuchRole', tokens=TOKEN_ID)
    assert "role 'NoSuchRole' does not exist" in str(raised.value)
