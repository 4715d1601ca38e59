"""The shipped templates (inventories/infra, inventories/apps) render machine configs that would bring a cluster up.

A copy of each template, with the files and vault values its guide names, goes through the secrets stage for its
control planes (static addresses: no PVE call). The control-plane configs must pass the lab's Talos config validation
(lab/talos/machineconfig.py, Talos' schema and rules - not the collection's own checks) and carry what real hardware
needs: the endpoint as the layer-2 VIP, the pinned Kubernetes version, the inline Cilium manifest (infra) and the CRI
config part Spegel needs (apps); static nodes get nameservers.
"""
import os
import re
import shutil

import pytest
import yaml

from ansible_collections.proxtalos.cluster.tests.integration.pve_playbook import PLAYBOOK_BIN, ROOT, run_playbook
from lab.talos import machineconfig, vip

pytestmark = [pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')]

VAULT = {'vault_pve_api_token_secret': 'unused', 'vault_flux_git_ssh_identity': 'unused',
         'vault_flux_git_ssh_known_hosts': 'unused'}
CILIUM = 'apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: cilium, namespace: kube-system}\n'


def group_vars(name):
    values = {}
    folder = os.path.join(ROOT, 'inventories', name, 'group_vars', 'all')
    for entry in sorted(os.listdir(folder)):
        with open(os.path.join(folder, entry), encoding='utf-8') as handle:
            values.update(yaml.safe_load(handle) or {})
    return values


@pytest.fixture(scope='module', params=['infra', 'apps'])
def rendered(request, tmp_path_factory):
    name = request.param
    folder = tmp_path_factory.mktemp('template-%s' % name)
    inventory = folder / name
    shutil.copytree(os.path.join(ROOT, 'inventories', name), str(inventory))
    (inventory / 'files').mkdir(exist_ok=True)
    (inventory / 'files' / 'cilium.yaml').write_text(CILIUM)
    artifacts = folder / 'artifacts'
    run = run_playbook(str(inventory), '--tags', 'secrets', '--limit', 'controlplane',
                       extra_vars=dict(VAULT, proxtalos_artifacts_dir=str(artifacts), talos_machines_vault_password_file=''))
    assert run.rc == 0, run.describe()
    with open(os.path.join(str(inventory), 'hosts.yml'), encoding='utf-8') as handle:
        hosts = yaml.safe_load(handle)['cluster']['children']['controlplane']['hosts']
    configs = dict((host, (artifacts / ('%s.yaml' % host)).read_bytes()) for host in hosts)
    return name, group_vars(name), hosts, configs


def test_every_control_plane_config_passes_talos_validation_and_holds_the_vip(rendered):
    name, values, hosts, configs = rendered
    assert len(configs) == 3, name
    for host, data in configs.items():
        config, dummy = machineconfig.parse(data, installed=False)
        assert config.control_plane, host
        assert vip.layer2_vips(config) == {values['cluster_endpoint_host']}, host
        assert config.endpoint == 'https://%s:6443' % values['cluster_endpoint_host']
        assert hosts[host]['node_ip'] != values['cluster_endpoint_host']


def test_the_kubernetes_version_is_pinned(rendered):
    name, values, dummy, configs = rendered
    assert values.get('kubernetes_version'), '%s: kubernetes_version is not pinned' % name
    for data in configs.values():
        config, dummy = machineconfig.parse(data, installed=False)
        assert config.cluster['apiServer']['image'].endswith(':v%s' % values['kubernetes_version'])
        assert config.machine['kubelet']['image'].endswith(':v%s' % values['kubernetes_version'])


def test_static_nodes_get_nameservers(rendered):
    name, values, dummy, dummy = rendered
    assert values.get('proxmox_vms_nameservers'), '%s: no proxmox_vms_nameservers for the static nodes' % name


def test_what_each_template_installs_is_in_the_configs(rendered):
    name, values, dummy, configs = rendered
    for data in configs.values():
        config, dummy = machineconfig.parse(data, installed=False)
        manifests = [m['name'] for m in config.cluster.get('inlineManifests') or []]
        files = dict((f['path'], f) for f in config.machine.get('files') or [])
        if values.get('cni_mode', 'inline') == 'inline':
            assert manifests == ['cilium'], name
        else:
            assert manifests == [], name
        spegel = [r for r in values.get('bootstrap_apps_releases', []) if r['name'] == 'spegel']
        if spegel:
            # Spegel serves layers from containerd, which Talos tells to discard them unless a CRI part says otherwise
            part = files['/etc/cri/conf.d/20-customization.part']
            assert part['op'] == 'create' and 'discard_unpacked_layers = false' in part['content']
        else:
            assert '/etc/cri/conf.d/20-customization.part' not in files


def test_the_csi_gate_is_off_until_the_gitops_repository_installs_the_csi(rendered):
    name, values, dummy, dummy = rendered
    assert values.get('gitops_csi_enabled') is False, '%s: the gitops stage would wait for a CSI nobody installs' % name


def test_the_vault_template_names_every_secret_the_templates_refer_to():
    """docs/examples/vault.yml (the first-cluster guide's vault file) has exactly the vault_* variables the shipped
    templates refer to, so a user who fills it leaves none undefined."""
    referred = set()
    for name in ('infra', 'apps'):
        for folder, dummy, files in os.walk(os.path.join(ROOT, 'inventories', name)):
            for entry in files:
                with open(os.path.join(folder, entry), encoding='utf-8') as handle:
                    referred.update(re.findall(r'\{\{[^}]*?\b(vault_\w+)', handle.read()))
    with open(os.path.join(ROOT, 'docs', 'examples', 'vault.yml'), encoding='utf-8') as handle:
        template = yaml.safe_load(handle)
    assert referred, 'no vault variable found in the templates (the scan is broken)'
    assert set(template) == referred, (sorted(template), sorted(referred))
