"""The preflight stage's inputs check: a fresh copy of a shipped template with one required input missing fails in
preflight - the first task of site.yml, before any PVE call or VM - with a message naming that input and why.

No lab: site.yml runs whole against the copy (its PVE host does not exist), so anything that got past preflight would
fail on the address discovery or the PVE checks instead, and the tests would see it.
"""
import importlib.util
import json
import os
import shutil

import pytest

from ansible_collections.proxtalos.cluster.tests.integration.pve_playbook import PLAYBOOK_BIN, ROOT, run_playbook

pytestmark = [pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')]

VAULT = {'vault_pve_api_token_secret': 'pve-secret-of-the-test',
         'vault_flux_git_ssh_identity': '-----BEGIN OPENSSH PRIVATE KEY-----\nx\n-----END OPENSSH PRIVATE KEY-----\n',
         'vault_flux_git_ssh_known_hosts': 'git.example.internal ssh-ed25519 AAAA'}
INPUTS_TASK = "Inputs - every stage's required variables and files are there"


def template(tmp_path, name, cilium=True, ca=True):
    """A copy of inventories/NAME with the files its guide names (the PVE CA, the rendered Cilium manifest)."""
    inventory = tmp_path / name
    shutil.copytree(os.path.join(ROOT, 'inventories', name), str(inventory))
    (inventory / 'files').mkdir(exist_ok=True)
    if cilium:
        (inventory / 'files' / 'cilium.yaml').write_text('kind: List\n')
    if ca:
        (inventory / 'files' / 'pve-root-ca.pem').write_text('-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n')
    return inventory


def problems(run):
    """The inputs check's lines after its headline; the run must have stopped there, before anything else ran."""
    assert run.rc != 0, run.describe()
    (name, dummy, result), = [r for r in run.results() if r[2].get('failed')]
    assert INPUTS_TASK in name, run.describe()
    assert run.results('Check every VM') == [] and run.results('Create or update the VM') == []
    message = result['msg']
    assert message[0].startswith('preflight found %d missing' % (len(message) - 1)) and message[0].endswith('nothing was created:')
    return message[1:]


def run_site(inventory, values, *args):
    return run_playbook(str(inventory), *args, extra_vars=dict(values, preflight_check_pve=False))


@pytest.mark.parametrize('missing', sorted(VAULT))
def test_a_missing_vault_value_fails_in_preflight_naming_it(tmp_path, missing):
    values = dict((key, value) for key, value in VAULT.items() if key != missing)
    lines = problems(run_site(template(tmp_path, 'infra'), values))
    assert len(lines) == 1, lines
    named = missing[len('vault_'):]
    assert lines[0].startswith('- %s: undefined or empty' % named), lines
    assert missing in lines[0] and 'group_vars/all/vault.yml' in lines[0]
    assert 'VAULT' not in lines[0] and VAULT[missing] not in lines[0]


@pytest.mark.parametrize('missing', ['cilium', 'ca'])
def test_a_missing_file_fails_in_preflight_naming_it(tmp_path, missing):
    inventory = template(tmp_path, 'infra', **{missing: False})
    lines = problems(run_site(inventory, VAULT))
    expected = {
        'cilium': ('- cni_cilium_manifest: %s/files/cilium.yaml does not exist, and cni_mode is inline: the control planes\' '
                   'machine configs carry the rendered Cilium manifest. Render it with the cni role\'s render_manifest '
                   'entry point (docs/stages/cni.md), or set cni_mode: helm'),
        'ca': ('- pve_ca_path: %s/files/pve-root-ca.pem does not exist, and pve_validate_certs is true: the PVE '
               'certificate is checked against that CA. Copy /etc/pve/pve-root-ca.pem of a PVE node there; '
               'docs/guide-proxmox.md, section 2')}
    assert lines == [expected[missing] % inventory]


@pytest.mark.parametrize('values, expected', [
    ({'kubernetes_version': '1.37.0'}, '- kubernetes_version: 1.37.0 does not run on Talos v1.13.9, which supports Kubernetes 1.31.0 up '
                                       'to (not including) 1.37.0; docs/talos-config.md'),
    ({'kubernetes_version': 'v1.30.4'}, '- kubernetes_version: 1.30.4 does not run on Talos v1.13.9, which supports Kubernetes 1.31.0 '
                                        'up to (not including) 1.37.0; docs/talos-config.md'),
    ({'talos_version': 'v1.12.11', 'kubernetes_version': '1.36.3'},
     '- kubernetes_version: 1.36.3 does not run on Talos v1.12.11, which supports Kubernetes 1.30.0 up to (not including) 1.36.0; '
     'docs/talos-config.md'),
    ({'talos_version': 'v1.11.5'}, '- talos_version: v1.11.5 is not a release the collection renders configs for (v1.12.x or v1.13.x); '
                                   'docs/talos-config.md')])
def test_a_talos_or_kubernetes_version_that_does_not_fit_fails_in_preflight(tmp_path, values, expected):
    assert problems(run_site(template(tmp_path, 'infra'), dict(VAULT, **values))) == [expected]


def test_every_missing_input_is_listed_at_once(tmp_path):
    lines = problems(run_site(template(tmp_path, 'infra', cilium=False, ca=False), {}))
    assert [line.split(':')[0] for line in lines] == ['- pve_api_token_secret', '- pve_ca_path', '- cni_cilium_manifest',
                                                      '- flux_git_ssh_identity', '- flux_git_ssh_known_hosts']


def test_helm_missing_fails_in_preflight_when_cilium_is_installed_by_helm(tmp_path):
    helm = str(tmp_path / 'no-such-helm')
    lines = problems(run_site(template(tmp_path, 'apps'), dict(VAULT, cni_helm_binary=helm)))
    assert len(lines) == 1 and lines[0].startswith('- helm: `%s version` failed (' % helm), lines
    assert 'cni_mode is helm (cni_helm_binary)' in lines[0]


def test_helm_4_with_a_kubernetes_core_before_6_4_fails_in_preflight_naming_both(tmp_path, monkeypatch):
    """kubernetes.core's helm module before 6.4.0 runs `helm list --all`, a flag helm 4 removed (kubernetes.core
    CHANGELOG v6.4.0: Helm v4 compatibility across the Helm modules); the ansible 12 package ships 6.2.0. A helm that
    says it is 4 and a kubernetes.core 6.2.0 found first on the collections path: refused before anything is created."""
    helm = tmp_path / 'helm'
    helm.write_text('#!/bin/sh\necho v4.1.4+g05fa379\n')
    helm.chmod(0o755)
    old_core = tmp_path / 'collections' / 'ansible_collections' / 'kubernetes' / 'core'
    # a copy of the kubernetes.core this venv has, relabelled 6.2.0 (the playbook's tasks must still resolve)
    installed = list(importlib.util.find_spec('ansible_collections.kubernetes.core').submodule_search_locations)[0]
    shutil.copytree(installed, str(old_core))
    manifest = json.loads((old_core / 'MANIFEST.json').read_text())
    manifest['collection_info']['version'] = '6.2.0'
    (old_core / 'MANIFEST.json').write_text(json.dumps(manifest))
    monkeypatch.setenv('ANSIBLE_COLLECTIONS_PATH', os.pathsep.join([os.path.join(ROOT, '.collections'), str(tmp_path / 'collections')]))
    lines = problems(run_site(template(tmp_path, 'apps'), dict(VAULT, cni_helm_binary=str(helm))))
    assert len(lines) == 1, lines
    assert lines[0].startswith('- helm: v4.1.4+g05fa379 is helm 4, and the kubernetes.core this run loads is 6.2.0: '), lines
    assert 'install kubernetes.core 6.4.0 or later' in lines[0] and 'cni_mode is helm (cni_helm_binary)' in lines[0]


def test_only_the_selected_stages_inputs_are_checked(tmp_path):
    """A run of --tags vms needs the PVE secret, not Cilium or Flux: its inputs check is not refused for them (the
    preflight role in a play tagged vms, so that nothing after it calls the example PVE)."""
    play = tmp_path / 'play.yml'
    play.write_text('- name: The inputs check in a vms-only run\n  hosts: cluster\n  gather_facts: false\n  tags: [vms]\n'
                    '  tasks:\n    - name: Preflight\n      ansible.builtin.import_role:\n        name: proxtalos.cluster.preflight\n'
                    '      run_once: true\n')
    inventory = template(tmp_path, 'infra', cilium=False)
    run = run_playbook(str(inventory), '--tags', 'vms', playbook=str(play),
                       extra_vars={'vault_pve_api_token_secret': 'x', 'preflight_check_pve': False})
    assert run.rc == 0 and run.results(INPUTS_TASK), run.describe()
    refused = run_playbook(str(inventory), '--tags', 'vms', playbook=str(play), extra_vars={'preflight_check_pve': False})
    assert [line.split(':')[0] for line in problems(refused)] == ['- pve_api_token_secret']


def test_a_sub_stage_tag_selects_its_stages_inputs(tmp_path):
    """`--tags vms_proxmox` checks the vms stage's inputs only; `--tags cni_gates` (a sub-stage tag of the cni stage)
    checks the cni stage's inputs as `--tags cni` would: the Cilium manifest missing is refused."""
    play = tmp_path / 'play.yml'
    play.write_text('- name: The inputs check in a sub-stage run\n  hosts: cluster\n  gather_facts: false\n'
                    '  tags: [vms_proxmox, cni_gates]\n  tasks:\n    - name: Preflight\n'
                    '      ansible.builtin.import_role:\n        name: proxtalos.cluster.preflight\n      run_once: true\n')
    inventory = template(tmp_path, 'infra', cilium=False)
    extra_vars = {'vault_pve_api_token_secret': 'x', 'preflight_check_pve': False}
    run = run_playbook(str(inventory), '--tags', 'vms_proxmox', playbook=str(play), extra_vars=extra_vars)
    assert run.rc == 0 and run.results(INPUTS_TASK), run.describe()
    refused = run_playbook(str(inventory), '--tags', 'cni_gates', playbook=str(play), extra_vars=extra_vars)
    assert any('cilium' in line for line in problems(refused)), refused.describe()
