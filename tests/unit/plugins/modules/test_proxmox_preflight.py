"""proxmox_preflight: the inventory checks (pure) and the PVE checks against an in-process fakepve."""

import pytest


from ansible_collections.proxtalos.cluster.plugins.modules import proxmox_preflight
from ansible_collections.proxtalos.cluster.tests.helpers import run_main

SECRET = 'beefcafe-5ec2-e7a1-b0b0-preflight'
IMAGE = {'storage': 'local', 'filename': 'talos.iso', 'url': 'https://factory.talos.dev/x/nocloud-amd64.iso'}


def vm(host, vmid, role='controlplane', **more):
    entry = dict(host=host, role=role, vm_id=vmid, vm_pve_node='pve1', vm_bridge='vmbr0', vm_storage='local-lvm',
                 vm_cores=2, vm_memory_mb=2048, vm_disk_gb=10)
    entry.update(more)
    return entry


def good_cluster():
    return [vm('cp-1', 101, node_ip='10.0.0.11', node_prefix=24, node_gateway='10.0.0.1'),
            vm('cp-2', 102, node_ip='10.0.0.12', node_prefix=24, node_gateway='10.0.0.1'),
            vm('cp-3', 103, node_ip='10.0.0.13', node_prefix=24, node_gateway='10.0.0.1'),
            vm('w-1', 111, role='worker')]


def inventory_problems(vms, reserved=()):
    report = proxmox_preflight.Report()
    proxmox_preflight.check_inventory(vms, list(reserved), None, report)
    return [(p['host'], p['field']) for p in report.problems], report


def test_a_good_inventory_has_no_problem():
    problems, report = inventory_problems(good_cluster())
    assert problems == [] and report.checks[0]['ok'] is True


def test_duplicate_vmid_names_both_hosts():
    vms = good_cluster()
    vms[3]['vm_id'] = 101
    problems, report = inventory_problems(vms)
    assert problems == [('w-1', 'vm_id')]
    assert report.problems[0]['reason'] == '101 is also the vm_id of cp-1'


def test_an_even_number_of_control_planes_is_refused():
    problems, report = inventory_problems(good_cluster()[1:])
    assert problems == [('controlplane', 'groups')]
    assert report.problems[0]['reason'].startswith('2 control planes (cp-2, cp-3): etcd needs an odd number')


def test_no_control_plane_is_refused():
    problems, _report = inventory_problems([vm('w-1', 111, role='worker')])
    assert problems == [('controlplane', 'groups')]


@pytest.mark.parametrize('change, expected', [
    (dict(vm_id=None), ('cp-1', 'vm_id')), (dict(vm_id='abc'), ('cp-1', 'vm_id')), (dict(vm_id=42), ('cp-1', 'vm_id')),
    (dict(node_ip='10.0.0.13'), ('cp-3', 'node_ip')), (dict(node_ip='10.0.0.300'), ('cp-1', 'node_ip')),
    (dict(node_ip='10.0.0.10'), ('cp-1', 'node_ip')), (dict(node_prefix=None), ('cp-1', 'node_prefix')),
    (dict(node_prefix=40), ('cp-1', 'node_prefix')), (dict(node_gateway='10.9.0.1'), ('cp-1', 'node_gateway')),
    (dict(node_ip='10.0.0.0'), ('cp-1', 'node_ip')), (dict(vm_name='cp_1'), ('cp-1', 'vm_name')),
    (dict(vm_name='CP-2'), ('cp-2', 'inventory_hostname')), (dict(vm_memory_mb=1024), ('cp-1', 'vm_memory_mb')),
    (dict(vm_cores='two'), ('cp-1', 'vm_cores')), (dict(vm_bridge=''), ('cp-1', 'vm_bridge')),
    (dict(role=''), ('cp-1', 'groups')),
])
def test_bad_values_name_host_and_field(change, expected):
    vms = good_cluster()
    vms[0].update(change)
    problems, report = inventory_problems(vms, reserved=[{'name': 'cluster_endpoint_host', 'address': '10.0.0.10'}])
    assert expected in problems, report.problems


def test_the_message_lists_every_problem():
    vms = good_cluster()[1:]
    vms[2]['vm_id'] = 102
    _problems, report = inventory_problems(vms)
    assert report.message().splitlines() == [
        'preflight found 2 problems; nothing was created:',
        '- w-1: vm_id: 102 is also the vm_id of cp-2',
        '- controlplane: groups: 2 control planes (cp-2, cp-3): etcd needs an odd number to keep a majority; use 1 or 3']


def test_inherited_privileges():
    perms = {'/': {'Sys.Audit': 1}, '/vms': {'VM.Allocate': 1}, '/storage': {'Datastore.AllocateSpace': 0}}
    assert proxmox_preflight.has_privilege(perms, '/vms/101', 'VM.Allocate')
    assert proxmox_preflight.has_privilege(perms, '/', 'Sys.Audit')
    assert not proxmox_preflight.has_privilege(perms, '/storage/local-lvm', 'Datastore.AllocateSpace')
    assert proxmox_preflight.has_privilege(perms, '/storage', 'Datastore.AllocateSpace')
    assert not proxmox_preflight.has_privilege(perms, '/vms/101', 'VM.PowerMgmt')


# ------------------------------------------------------------------------------ against fakepve


@pytest.fixture
def pve(fakepve):
    fakepve.apitokens['root@pam!proxtalos'] = SECRET
    return fakepve


def args(pve, cafile, vms, **overrides):
    values = dict(api_host=pve.host, api_port=pve.port, api_user='root@pam', api_token_id='proxtalos',
                  api_token_secret=SECRET, ca_path=cafile, vms=vms, image=IMAGE, wait_timeout=2, wait_sleep=0.1)
    values.update(overrides)
    return values


def run(values, capsys):
    code, result, out = run_main(proxmox_preflight, values, capsys, check_mode=True)
    assert SECRET not in out
    return code, result


def test_everything_checks_out_and_nothing_is_written(pve, fakepve_cafile, capsys):
    code, result = run(args(pve, fakepve_cafile, good_cluster()), capsys)
    assert code == 0 and result['changed'] is False and result['problems'] == []
    assert all(check['ok'] for check in result['checks'])
    assert result['pve']['image'] == {'pve1': 'downloadable'} and result['pve']['nodes'] == {'pve1': 'online'}
    assert [r for r in pve.requests if r[0] != 'GET'] == []


def test_the_image_found_on_storage(pve, fakepve_cafile, capsys):
    pve.store_file('local', 'talos.iso', 1024)
    code, result = run(args(pve, fakepve_cafile, good_cluster()), capsys)
    assert code == 0 and result['pve']['image'] == {'pve1': 'present'}


def test_unknown_bridge_storage_and_node_are_named(pve, fakepve_cafile, capsys):
    vms = good_cluster()
    vms[0]['vm_bridge'] = 'vmbr7'
    vms[1]['vm_storage'] = 'local'      # exists, but holds no VM images
    vms[2]['vm_storage'] = 'nvme-pool'
    vms[3]['vm_pve_node'] = 'pve9'
    code, result = run(args(pve, fakepve_cafile, vms), capsys)
    assert code == 1
    assert [(p['host'], p['field']) for p in result['problems']] == [
        ('w-1', 'vm_pve_node'), ('cp-2', 'vm_storage'), ('cp-3', 'vm_storage'), ('cp-1', 'vm_bridge')]
    assert "PVE node pve1 has no bridge 'vmbr7' that these credentials can see (bridges: vmbr0;" in result['msg']
    assert "storage 'local' does not hold VM disks" in result['msg']


def test_a_vmid_taken_by_another_vm(pve, fakepve_cafile, capsys):
    pve.add_vm(102, 'someone-else')
    pve.add_vm(101, 'cp-1')          # ours, from an earlier run: fine
    code, result = run(args(pve, fakepve_cafile, good_cluster()), capsys)
    assert code == 1 and result['problems'] == [{
        'host': 'cp-2', 'field': 'vm_id',
        'reason': "102 is taken by another VM, 'someone-else' on PVE node pve1; pick a free id or remove that VM"}]


def test_a_storage_without_room_for_the_vms_to_create_is_named_before_anything_is_created(pve, fakepve_cafile, capsys):
    gib = 1024 ** 3
    pve.add_vm(101, 'cp-1')              # exists: its disk is there already and is not counted
    pve.storages['local-lvm'].update(avail=25 * gib, total=100 * gib)
    vms = good_cluster()
    del vms[3]['vm_disk_gb']             # unset: counted at the worker minimum (10 GiB), a lower bound
    code, result = run(args(pve, fakepve_cafile, vms), capsys)
    reason = ("no room: storage 'local-lvm' on PVE node pve1 has 25.0 GiB free; the disks of the 3 VM(s) to create there "
              "need at least 30 GiB (cp-2 10, cp-3 10, w-1 10)")
    expected = [{'host': host, 'field': 'vm_storage', 'reason': reason} for host in ('cp-2', 'cp-3', 'w-1')]
    assert code == 1 and result['problems'] == expected
    assert {'check': 'storages have room for the disks of the VMs to create', 'ok': False} in result['checks']
    assert [r for r in pve.requests if r[0] != 'GET'] == []
    pve.storages['local-lvm']['avail'] = 30 * gib   # exactly enough
    code, result = run(args(pve, fakepve_cafile, vms), capsys)
    assert code == 0 and result['problems'] == []


def test_bad_credentials_name_the_token(pve, fakepve_cafile, capsys):
    code, result = run(args(pve, fakepve_cafile, good_cluster(), api_token_secret='wrong'), capsys)
    assert code == 1 and result['problems'][0]['field'] == 'pve_api_token_id'
    assert 'refused the credentials' in result['problems'][0]['reason']


def test_tls_failure_names_the_ca_path(pve, fakepve_cafile, capsys, tmp_path):
    from fakepve.certs import make_cert  # pylint: disable=import-outside-toplevel
    other_ca = make_cert(str(tmp_path), hosts=('127.0.0.1',))[0]
    code, result = run(args(pve, other_ca, good_cluster()), capsys)
    assert code == 1 and result['problems'][0]['field'] == 'pve_ca_path'


def test_missing_privileges_are_listed(pve, fakepve_cafile, capsys):
    pve.apitokens['auditor@pve!ro'] = SECRET
    pve.grant('auditor@pve', '/', 'Sys.Audit', 'VM.Audit', 'Datastore.Audit')
    code, result = run(args(pve, fakepve_cafile, good_cluster(), api_user='auditor@pve', api_token_id='ro'), capsys)
    assert code == 1
    fields = set(p['field'] for p in result['problems'])
    assert fields == {'pve_api_token_id', 'talos_image_url'}
    assert any('auditor@pve!ro lacks the privilege VM.Allocate' in p['reason'] for p in result['problems'])
    assert any('SDN.Use on /sdn/zones/localnetwork/vmbr0' in p['reason'] for p in result['problems'])


def test_inventory_only_makes_no_api_call(pve, fakepve_cafile, capsys):
    code, result = run(args(pve, fakepve_cafile, good_cluster(), check_pve=False), capsys)
    assert code == 0 and 'pve' not in result and pve.requests == []


def test_an_image_pve_cannot_fetch_is_named_with_the_url_and_pve_message(pve, fakepve_cafile, capsys):
    # The ISO is not on the storage, and PVE's query-url-metadata (what download-url does first) fails for the URL.
    pve.fail('GET', '/nodes/pve1/query-url-metadata', 500, "invalid server response: '404 Not Found'")
    code, result = run(args(pve, fakepve_cafile, good_cluster()), capsys)
    assert code == 1 and result['pve']['image'] == {'pve1': 'missing'}
    assert result['problems'] == [{
        'host': 'all', 'field': 'talos_image_url',
        'reason': "local:iso/talos.iso is not on PVE node pve1, and PVE cannot fetch %s: invalid server response: "
                  "'404 Not Found'" % IMAGE['url']}]
    assert IMAGE['url'] in result['msg']
    queried = [r for r in pve.requests if r[0] == 'GET' and r[1].endswith('/query-url-metadata')]
    assert len(queried) == 1 and [r for r in pve.requests if r[0] != 'GET'] == []


# ------------------------------------------------------------------- the privilege table (audit findings 1, 4, 11)

GUIDE_ROLE_9 = {
    '/vms': ('VM.Allocate', 'VM.Audit', 'VM.PowerMgmt', 'VM.Config.Disk', 'VM.Config.CDROM', 'VM.Config.CPU',
             'VM.Config.Memory', 'VM.Config.Network', 'VM.Config.Options', 'VM.Config.HWType', 'VM.Config.Cloudinit',
             'VM.GuestAgent.Audit'),
    '/storage': ('Datastore.AllocateSpace', 'Datastore.Audit', 'Datastore.AllocateTemplate'),
    '/nodes': ('Sys.AccessNetwork',),
    '/': ('Sys.Audit',),
    '/sdn/zones/localnetwork': ('SDN.Use',),
}


def grant_role(pve, user, role, leave_out=()):
    """The role written out here (not read from the collection's table), less the privileges leave_out."""
    pve.apitokens[user + '!proxtalos'] = SECRET
    for path, privs in role.items():
        kept = [p for p in privs if p not in leave_out]
        if kept:
            pve.grant(user, path, *kept)
    return args


def test_the_guide_role_passes_without_sys_modify(pve, fakepve_cafile, capsys):
    # Sys.AccessNetwork on the node is what download-url and query-url-metadata accept besides Sys.Audit+Sys.Modify
    # on / (pve-storage Status.pm:747-754): the old check asked for Sys.Modify on / and refused this role.
    grant_role(pve, 'ops@pve', GUIDE_ROLE_9)
    code, result = run(args(pve, fakepve_cafile, good_cluster(), api_user='ops@pve'), capsys)
    assert code == 0, result['problems']
    assert result['pve']['image'] == {'pve1': 'downloadable'}


def test_a_role_without_the_agent_privilege_is_named_before_anything_is_created(pve, fakepve_cafile, capsys):
    grant_role(pve, 'ops@pve', GUIDE_ROLE_9, leave_out=('VM.GuestAgent.Audit',))
    code, result = run(args(pve, fakepve_cafile, good_cluster(), api_user='ops@pve'), capsys)
    assert code == 1
    reasons = [p['reason'] for p in result['problems']]
    assert len(reasons) == 4 and all(p['field'] == 'pve_api_token_id' for p in result['problems'])
    assert reasons[0].startswith('ops@pve!proxtalos lacks the privilege VM.GuestAgent.Audit (or '
                                 'VM.GuestAgent.Unrestricted) on /vms/101, needed to read the guest agent\'s addresses')
    assert reasons[0].endswith('for cp-1; see the role in docs/guide-proxmox.md')


def test_pve8_asks_for_vm_monitor_for_the_agent(pve, fakepve_cafile, capsys):
    pve.version = '8.4.1'
    grant_role(pve, 'ops@pve', GUIDE_ROLE_9)
    code, result = run(args(pve, fakepve_cafile, good_cluster(), api_user='ops@pve'), capsys)
    assert code == 1
    assert any('lacks the privilege VM.Monitor on /vms/101' in p['reason'] for p in result['problems'])
    assert 'PVE 8' in [c for c in result['checks'] if c['check'].startswith('the credentials')][0]['check']


def test_a_role_without_download_privileges_names_them_only_when_the_image_is_missing(pve, fakepve_cafile, capsys):
    grant_role(pve, 'ops@pve', GUIDE_ROLE_9, leave_out=('Sys.AccessNetwork',))
    code, result = run(args(pve, fakepve_cafile, good_cluster(), api_user='ops@pve'), capsys)
    assert code == 1 and [p['field'] for p in result['problems']] == ['talos_image_url']
    assert 'Sys.AccessNetwork on /nodes/pve1 (or Sys.Audit and Sys.Modify on /)' in result['problems'][0]['reason']
    pve.store_file('local', 'talos.iso', 1024)
    code, result = run(args(pve, fakepve_cafile, good_cluster(), api_user='ops@pve'), capsys)
    assert code == 0, result['problems']


def test_no_read_access_to_the_image_storage_is_a_privilege_not_a_dead_node(pve, fakepve_cafile, capsys):
    role = dict(GUIDE_ROLE_9, **{'/storage/local-lvm': ('Datastore.AllocateSpace',),
                                 '/storage/local': ('Datastore.AllocateTemplate',)})
    del role['/storage']
    grant_role(pve, 'ops@pve', role)
    code, result = run(args(pve, fakepve_cafile, good_cluster(), api_user='ops@pve'), capsys)
    assert code == 1
    assert not any('does not answer' in p['reason'] for p in result['problems'])
    assert any('lacks the privilege Datastore.Audit (or Datastore.AllocateSpace) on /storage/local' in p['reason']
               for p in result['problems'])


# ------------------------------------------------------------------- SDN VNets and VLAN-scoped grants (audit finding 5)

class NodeReads(object):
    """The two reads _check_node makes of a node: its storages and its bridges (any_bridge)."""

    def __init__(self, bridges):
        self.bridges = bridges

    def get(self, path, what, subject=None, **params):
        if path.endswith('/network'):
            assert params == {'type': 'any_bridge'}
            return self.bridges
        assert path.endswith('/storage')
        return [{'storage': 'local-lvm', 'content': 'images,rootdir', 'active': 1, 'enabled': 1, 'avail': 10 ** 12}]


def role_permissions(**sdn):
    perms = dict((path, dict.fromkeys(privs, 1)) for path, privs in GUIDE_ROLE_9.items() if path != '/sdn/zones/localnetwork')
    perms['/'] = {'Sys.Audit': 0}
    perms.update((path, {'SDN.Use': 1}) for path in sdn.values())
    return perms


def sdn_problems(bridges, permissions, **vm_values):
    vms = [vm('cp-1', 101, **vm_values)]
    report = proxmox_preflight.Report()
    learnt = {'image': {}}
    proxmox_preflight._check_node(NodeReads(bridges), 'pve1', vms, None, permissions, learnt, report)  # pylint: disable=protected-access
    proxmox_preflight._check_privileges(vms, permissions, {'api_user': 'ops@pve', 'api_token_id': 'proxtalos'},  # pylint: disable=protected-access
                                        report, '9.0.10', None, learnt['bridges'])
    return [p['reason'] for p in report.problems]


def test_an_sdn_vnet_is_a_bridge_and_its_use_is_checked_in_its_zone():
    bridges = [{'iface': 'vmbr0', 'type': 'bridge'}, {'iface': 'vnet20', 'type': 'vnet'}]
    assert sdn_problems(bridges, role_permissions(p='/sdn/zones/dc1/vnet20'), vm_bridge='vnet20') == []
    reasons = sdn_problems(bridges, role_permissions(), vm_bridge='vnet20')
    assert len(reasons) == 1 and 'SDN.Use on /sdn/zones/<zone of vnet20>/vnet20' in reasons[0]
    # a plain bridge keeps the zone localnetwork
    reasons = sdn_problems(bridges, role_permissions(p='/sdn/zones/dc1/vnet20'), vm_bridge='vmbr0')
    assert len(reasons) == 1 and 'SDN.Use on /sdn/zones/localnetwork/vmbr0,' in reasons[0]


def test_a_grant_on_the_vlan_alone_is_enough_for_a_tagged_nic():
    bridges = [{'iface': 'vmbr0', 'type': 'bridge'}]
    assert sdn_problems(bridges, role_permissions(p='/sdn/zones/localnetwork/vmbr0/20'), vm_vlan=20) == []
    reasons = sdn_problems(bridges, role_permissions(p='/sdn/zones/localnetwork/vmbr0/30'), vm_vlan=20)
    assert len(reasons) == 1 and 'SDN.Use on /sdn/zones/localnetwork/vmbr0/20' in reasons[0]
    assert sdn_problems(bridges, role_permissions(p='/sdn/zones/localnetwork'), vm_vlan=20) == []


def test_a_shared_storage_is_counted_once_for_every_node(pve, fakepve_cafile, capsys):
    # A shared storage's avail is its pool's, for every node: its disks are added up over the nodes (audit finding 8;
    # the old check judged each node alone against the whole pool's free space and let 40 GiB into 25).
    gib = 1024 ** 3
    pve.nodes['pve2'] = {'online': True}
    pve.storages['local-lvm'].update(avail=25 * gib, total=100 * gib, shared=1)
    vms = [vm('cp-1', 101), vm('w-1', 111, role='worker'), vm('w-2', 112, role='worker', vm_pve_node='pve2'),
           vm('w-3', 113, role='worker', vm_pve_node='pve2')]
    code, result = run(args(pve, fakepve_cafile, vms, image=None), capsys)
    room = [p for p in result['problems'] if p['reason'].startswith('no room')]
    assert code == 1 and sorted(p['host'] for p in room) == ['cp-1', 'w-1', 'w-2', 'w-3']
    assert room[0]['reason'].startswith("no room: storage 'local-lvm' (shared by PVE nodes pve1, pve2) has 25.0 GiB free; "
                                        "the disks of the 4 VM(s) to create there need at least 40 GiB")
