"""The privilege table: the guide shows it, and PVE's own API schema (fakepve's copy) agrees with it."""
import os
import re

import pytest

from fakepve import schema as pve_schema
from fakepve import shapes

from ansible_collections.proxtalos.cluster.plugins.module_utils import _proxmox_privileges as privileges

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
GUIDE = os.path.join(ROOT, 'docs', 'guide-proxmox.md')


def test_the_guide_shows_the_table():
    with open(GUIDE, encoding='utf-8') as handle:
        text = handle.read()
    block = re.search(r'<!-- privileges:begin[^>]*-->\n(.*?)\n<!-- privileges:end -->', text, re.S)
    assert block, 'docs/guide-proxmox.md lost its privileges markers'
    assert block.group(1) == privileges.render_guide(), 'regenerate the block with _proxmox_privileges.render_guide()'


def test_the_pve9_privileges_exist_in_pve9():
    known = set(shapes.PRIVILEGES)
    for need in privileges.NEEDS:
        assert set(need.privileges_for(9)) <= known, need.key
        if need.alternative:
            assert set(need.alternative[1]) <= known, need.key


def test_pve8_reads_the_agent_with_vm_monitor_and_pve9_with_the_guest_agent_privilege():
    assert 'VM.Monitor' in privileges.role(8)['/vms'] and 'VM.GuestAgent.Audit' not in privileges.role(8)['/vms']
    assert 'VM.GuestAgent.Audit' in privileges.role(9)['/vms'] and 'VM.Monitor' not in privileges.role(9)['/vms']


def test_the_role_grants_no_sys_modify():
    for major in privileges.MAJORS:
        assert not any('Sys.Modify' in privs for privs in privileges.role(major).values())


def _rule_holds(rule, granted, values):
    """Whether PVE's schema permission rule holds for {path: privileges}, the table's grants filled with values."""
    form = rule[0]
    if form in ('and', 'or'):
        results = [_rule_holds(sub, granted, values) for sub in rule[1:]]
        return all(results) if form == 'and' else any(results)
    assert form == 'perm', rule
    path = rule[1]
    for name, value in values.items():
        path = path.replace('{%s}' % name, value)
    opts = dict(zip(rule[3::2], rule[4::2]))
    held = set()
    for acl, privs in granted.items():
        if path == acl or path.startswith(acl.rstrip('/') + '/') or acl == path:
            held |= set(privs)
    wanted = rule[2]
    return any(p in held for p in wanted) if opts.get('any') else all(p in held for p in wanted)


CALLS = sorted(set(call for need in privileges.NEEDS if not need.optional for call in need.calls))


@pytest.mark.parametrize('call', CALLS)
def test_each_call_of_the_table_passes_pves_schema_check_with_the_pve9_role(call):
    # The schema is PVE's (apidoc.js); its `permissions` is the method's declared check. Calls whose check is
    # in the code (create, update config) declare `user: all` there and are covered by the table's sources.
    verb, _sep, template = call.partition(' ')
    template = template.split(' ', maxsplit=1)[0].split('?', maxsplit=1)[0]
    if template.startswith('.../'):
        template = '/nodes/{node}/qemu/{vmid}/' + template[4:]
    info = pve_schema.load().paths[template][verb]
    rule = (info.get('permissions') or {}).get('check')
    if rule is None:
        assert (info.get('permissions') or {}).get('user') == 'all', call
        return
    granted = dict(privileges.role(9))
    # The role's / grant does not propagate: it counts only for the path / itself.
    root = granted.pop('/')
    values = dict(node='pve1', vmid='101', storage='local')
    assert _rule_holds(rule, granted, values) or _rule_holds(rule, {'/': root}, values) and rule[1] == '/', call


def test_a_403_is_explained_with_the_call_and_both_majors():
    text = privileges.explain_403('get', 'nodes/pve1/qemu/101/agent/network-get-interfaces')
    assert text.startswith('the credentials need VM.GuestAgent.Audit (or VM.GuestAgent.Unrestricted) on /vms/101 '
                           '(PVE 9; VM.Monitor on PVE 8)')
    assert privileges.explain_403('get', 'nodes/pve1/qemu/101/agent/network-get-interfaces', 8).startswith(
        'the credentials need VM.Monitor on /vms/101 to')
    assert 'Sys.AccessNetwork on /nodes/pve1 (or Sys.Audit and Sys.Modify on /)' in privileges.explain_403(
        'post', 'nodes/pve1/storage/local/download-url')
    assert privileges.explain_403('get', 'nodes/pve1/qemu/101/rrd') == ''


@pytest.mark.parametrize('version, major, known', [('9.0.10', 9, True), ('8.4.1', 8, True), ('7.4-3', 8, False),
                                                   ('10.0', 9, False), (None, 9, False)])
def test_major_of(version, major, known):
    assert privileges.major_of(version) == (major, known)


def test_a_403_names_the_major_whose_privilege_pve_asked_for():
    # PVE's own refusal names the privilege it checked (pve-common Exception.pm raise_perm_exc): VM.Monitor is PVE 8's
    # agent privilege, the VM.GuestAgent.* pair (check_any, joined by |) PVE 9's.
    path = 'nodes/pve1/qemu/101/agent/network-get-interfaces'
    pve8 = privileges.explain_403('get', path, refused='Permission check failed (/vms/101, VM.Monitor)')
    assert pve8.startswith('the credentials need VM.Monitor on /vms/101 to ') and 'GuestAgent' not in pve8
    pve9 = privileges.explain_403(
        'get', path, refused='Permission check failed (/vms/101, VM.GuestAgent.Audit|VM.GuestAgent.Unrestricted)')
    assert pve9.startswith('the credentials need VM.GuestAgent.Audit (or VM.GuestAgent.Unrestricted) on /vms/101 to ')
    assert 'PVE 8' not in pve9
    # a text that names no privilege of the table leaves both
    assert '(PVE 9; VM.Monitor on PVE 8)' in privileges.explain_403('get', path, refused='Permission check failed')
