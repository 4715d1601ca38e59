"""The preflight stage through ansible-playbook: bad inventories fail before anything is created.

Each bad inventory is the lab's inventory with one mistake; site.yml runs whole, and preflight must
stop it with a message naming host, variable and reason, with no write request reaching PVE.
"""
import os
import shutil

import pytest
import yaml

from ansible_collections.proxtalos.cluster.tests.integration.pve_playbook import PLAYBOOK_BIN, ROOT, run_playbook

pytestmark = [pytest.mark.lab,
              pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')]


def variant(lab, tmp_path, change):
    """A copy of the lab's inventory folder whose hosts.yml went through change(inventory)."""
    with open(os.path.join(lab.inventory_dir, 'hosts.yml'), encoding='utf-8') as handle:
        inventory = yaml.safe_load(handle)
    change(inventory['cluster']['children'])
    folder = tmp_path / 'inventory'
    folder.mkdir()
    (folder / 'hosts.yml').write_text(yaml.safe_dump(inventory, sort_keys=False))
    for name in ('group_vars', 'files'):
        os.symlink(os.path.join(ROOT, 'inventories', 'lab', name), str(folder / name))
    return folder


def fails_in_preflight(lab, inventory):
    since = lab.last_seq('requests')
    run = run_playbook(inventory)
    assert run.rc != 0, run.describe()
    failures = run.failures()
    assert list(failures) == ['lab-cp-1'], run.describe()        # the run_once preflight task, nothing else
    assert run.results('Create or update the VM') == []
    assert [r for r in lab.requests(since=since, source='pve') if r['method'] != 'GET'] == []
    assert lab.vms() == []
    return failures['lab-cp-1'].splitlines()


def test_duplicate_vmid(clean_lab, tmp_path):
    def duplicate(groups):
        groups['worker']['hosts']['lab-w-1']['vm_id'] = 1011
    lines = fails_in_preflight(clean_lab, variant(clean_lab, tmp_path, duplicate))
    assert lines == ['preflight found 1 problem; nothing was created:',
                     '- lab-w-1: vm_id: 1011 is also the vm_id of lab-cp-1']


def test_even_number_of_control_planes(clean_lab, tmp_path):
    def drop_one(groups):
        del groups['controlplane']['hosts']['lab-cp-3']
    lines = fails_in_preflight(clean_lab, variant(clean_lab, tmp_path, drop_one))
    assert lines[1] == ('- controlplane: groups: 2 control planes (lab-cp-1, lab-cp-2): etcd needs an odd number to '
                        'keep a majority; use 1 or 3')


def test_unknown_bridge(clean_lab, tmp_path):
    def bad_bridge(groups):
        groups['controlplane']['hosts']['lab-cp-2']['vm_bridge'] = 'vmbr9'
    lines = fails_in_preflight(clean_lab, variant(clean_lab, tmp_path, bad_bridge))
    assert lines[1:] == ["- lab-cp-2: vm_bridge: PVE node pve1 has no bridge 'vmbr9' that these credentials can "
                         "see (bridges: vmbr0; a bridge or SDN VNet is listed only with SDN.Audit or SDN.Use on "
                         "/sdn/zones/<zone>/vmbr9, docs/guide-proxmox.md)"]


def test_an_sdn_vnet_needs_its_grant_in_its_own_zone(clean_lab, tmp_path):
    # The lab's PVE has the VNet labvnet in zone labzone; the documented role grants the local zone only, so the
    # token does not see it (PVE lists it only to credentials that may audit or use it) until the admin grants it.
    def on_vnet(groups):
        for group in groups.values():
            for values in group['hosts'].values():
                values['vm_bridge'] = 'labvnet'
    inventory = variant(clean_lab, tmp_path, on_vnet)
    lines = fails_in_preflight(clean_lab, inventory)
    assert "- lab-cp-2: vm_bridge: PVE node pve1 has no bridge 'labvnet' that these credentials can see" in \
        '\n'.join(lines)
    admin = clean_lab.proxmox(root=True)
    admin.access.acl.put(path='/sdn/zones/labzone/labvnet', roles='ProxtalosBridges', users='proxtalos@pve',
                         tokens='proxtalos@pve!proxtalos')
    run = run_playbook(inventory, '--tags', 'preflight')
    assert run.rc == 0 and run.changed == 0, run.describe()


def test_every_problem_is_listed_at_once(clean_lab, tmp_path):
    def many(groups):
        groups['worker']['hosts']['lab-w-1']['vm_id'] = 1011
        groups['worker']['hosts']['lab-w-2']['vm_storage'] = 'nvme'
        groups['controlplane']['hosts']['lab-cp-3']['node_ip'] = groups['controlplane']['hosts']['lab-cp-1']['node_ip']
    lines = fails_in_preflight(clean_lab, variant(clean_lab, tmp_path, many))
    assert lines[0] == 'preflight found 3 problems; nothing was created:'
    assert {line.split(':')[0] + ':' + line.split(':')[1] for line in lines[1:]} == {
        '- lab-w-1: vm_id', '- lab-cp-3: node_ip', '- lab-w-2: vm_storage'}


def test_a_good_inventory_passes_and_nothing_is_written(clean_lab):
    since = clean_lab.last_seq('requests')
    run = run_playbook(clean_lab.inventory_dir, '--tags', 'preflight')
    assert run.rc == 0 and run.changed == 0, run.describe()
    checks = run.results('Check every VM')[0][2]['checks']
    assert checks and all(check['ok'] for check in checks)
    assert [r for r in clean_lab.requests(since=since, source='pve') if r['method'] != 'GET'] == []


@pytest.mark.parametrize('cluster', ['infra', 'apps'])
def test_the_example_inventories_pass_the_inventory_checks(cluster, tmp_path, monkeypatch):
    """A copy of the template with the inputs its guide names (the vault values, the PVE CA, the rendered Cilium
    manifest, helm)."""
    helm_dir = os.path.join(ROOT, '.tools', 'bin')
    if not os.access(os.path.join(helm_dir, 'helm'), os.X_OK):
        pytest.skip('no helm in .tools/bin (make setup)')
    monkeypatch.setenv('PATH', os.pathsep.join([helm_dir, os.environ.get('PATH', '')]))
    inventory = tmp_path / cluster
    shutil.copytree(os.path.join(ROOT, 'inventories', cluster), str(inventory))
    (inventory / 'files').mkdir(exist_ok=True)
    (inventory / 'files' / 'cilium.yaml').write_text('kind: List\n')
    (inventory / 'files' / 'pve-root-ca.pem').write_text('-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n')
    # --skip-tags always: the address discovery play needs the (example) PVE, which does not exist here.
    run = run_playbook(str(inventory), '--tags', 'preflight', '--skip-tags', 'always',
                       extra_vars={'preflight_check_pve': False, 'vault_pve_api_token_secret': 'unused',
                                   'vault_flux_git_ssh_identity': 'unused', 'vault_flux_git_ssh_known_hosts': 'unused'})
    assert run.rc == 0, run.describe()
    result = run.results('Check every VM')[0][2]
    assert result['problems'] == [] and result['checks'][0]['ok'] is True and 'pve' not in result


@pytest.mark.parametrize('tags', ['preflight', 'vms'])
def test_missing_credentials_are_named_with_where_they_are_documented(tags):
    # A fresh inventories/infra without its vault file: vault_pve_api_token_secret is undefined. The module used to
    # fail with "parameters are required together: api_token_id, api_token_secret".
    run = run_playbook(os.path.join(ROOT, 'inventories', 'infra'), '--tags', tags, '--skip-tags', 'always')
    assert run.rc != 0
    message = ' '.join(str(m) for m in run.failures().values()) + run.stderr
    assert 'required together' not in message
    if tags == 'preflight':
        # the inputs check (before the PVE checks) names it, where the templates read it from, and the guide
        assert 'pve_api_token_secret: undefined or empty' in message and 'vault_pve_api_token_secret' in message
        assert 'docs/guide-proxmox.md' in message
    else:   # the stage's argument check meets it first, and names it
        assert "'vault_pve_api_token_secret' is undefined" in message
