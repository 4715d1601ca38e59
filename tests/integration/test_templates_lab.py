"""Each shipped template (inventories/infra, inventories/apps) run with the whole site.yml against a lab of its shape.

The template is copied as a user copies it, and only what the lab must change is overlaid; each override says why:

- hosts.yml: every address of the template's node network (its /24: node_ip, the VIP, gateway, nameservers, LB pool)
  moves into the lab's /24 with the same host number - the lab's nodes and VIP can only live on the lab's loopback
  net (lab/addresses.py). vm_id, vm_pve_node and sizes stay: the lab runs the template's three PVE nodes.
- pve_api_host: the lab's PVE answers on its own address (user, token id, port and TLS verification stay the
  template's: the lab's token is the documented least-privilege one, docs/guide-proxmox.md).
- vm_storage: the lab's PVE has local and local-lvm, no Ceph RBD pool (ceph-vm). local-lvm holds 100 GiB in the lab,
  less than the template's disks (40 GiB per control plane, 80 per worker) on one PVE node: the lab gives it the room a
  real pool of that size has, with its pve-storage-full control (free GiB; lab/pve.py).
- the Cilium chart (cni_helm_chart_ref/repo_url/version): helm.cilium.io is not reachable here; the lab's chart has the
  upstream chart's shape (docs/lab.md). infra renders its inline manifest from it with the cni role's render_manifest
  entry point, as the template's cni.yml tells a user to.
The files the guide has a user add are added as a user adds them: files/pve-root-ca.pem (the lab's CA) and
group_vars/all/vault.yml with every variable the guide's vault.yml template names.

- flux_git_url: the lab's Git server. On lab/flux (the default world) the simulated one, git.lab.internal, ssh:// as
  the templates have it (it checks that an identity and known_hosts are given, so the vault file's Flux values are
  placeholders). With Flux's upstream controllers (PROXTALOS_LAB_FLUX=upstream) the smart-HTTPS server the lab names
  in its hosts.yml (lab_git_url): source-controller really fetches, and has no SSH server to reach, so the Git
  credentials become that server's (user flux, the password the lab writes to <run_dir>/git-token, read with a lookup
  as inventories/lab does, and its private CA as flux_git_ca_cert). The repository it serves gets the
  template's cluster folder (clusters/<cluster_name>) from the GitOps skeleton (docs/gitops-skeleton), without the
  Proxmox CCM and CSI Kustomizations, as its README says for gitops_csi_enabled: false (the templates' setting); the
  infrastructure folders are the lab's (lab/gitops, checked against the skeleton by test_gitops_skeleton). On the
  upstream world that commit is pushed, as a user pushes it, before site.yml runs: flux-operator's FluxInstance waits
  for the sync GitRepository it applies to be Ready (flux-operator v0.59.0 internal/controller/
  fluxinstance_controller.go:570-581, 5 minutes by default: api/v1/fluxinstance_types.go:494-507), which it cannot be
  while its URL is unreachable or its path missing.

Not run against the lab today, said here and in the report: the apps stage. The templates' charts come from
charts.jetstack.io and ghcr.io, which the lab cannot reach; the flux stage's hand-off decision also renders them, and
records that failure (rescued: the run goes on) - the test checks that those are the only failures. The flux stage
runs the templates' flux_install_method operator path with the flux role's install artifacts as they are on this
branch (another branch replaces them with pinned upstream ones).
"""
import base64
import ipaddress
import json
import os
import shutil
import subprocess

import pytest
import yaml

from k8s_stages_lab import PLAYBOOK_BIN, ROOT, TOOLS, Run, environment
from lab.testing import start_lab

pytestmark = [pytest.mark.lab, pytest.mark.slow,
              pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)'),
              pytest.mark.skipif(not os.access(os.path.join(TOOLS, 'helm'), os.X_OK), reason='no helm in .tools/bin')]

NOT_AGAINST_THE_LAB = 'apps'
UNREACHABLE_CHART_HOSTS = ('charts.jetstack.io', 'ghcr.io')
LAB_GIT_URL = 'ssh://git@git.lab.internal/proxtalos/lab-gitops.git'
LAB_GIT_USER = 'flux'  # the upstream world's Git server (lab/flux_upstream/lab.py GIT_USER)
LAB_CHART = os.path.join(ROOT, 'inventories', 'lab', 'files', 'charts', 'cilium')


def _load(path):
    with open(path, encoding='utf-8') as handle:
        return yaml.safe_load(handle) or {}


def _template_values(inventory):
    values = {}
    folder = os.path.join(inventory, 'group_vars', 'all')
    for entry in sorted(os.listdir(folder)):
        values.update(_load(os.path.join(folder, entry)))
    return values


def _hosts(hosts_yml):
    children = hosts_yml['cluster']['children']
    return [(group, name, values) for group in ('controlplane', 'worker')
            for name, values in ((children.get(group) or {}).get('hosts') or {}).items()]


class Move(object):
    """Addresses of the template's node /24 moved to the lab's, host number kept."""

    def __init__(self, template_net, lab_net):
        self.source = ipaddress.ip_network(template_net, strict=False)
        self.target = ipaddress.ip_network('%s.0/24' % lab_net)

    def address(self, text):
        offset = int(ipaddress.ip_address(text)) - int(self.source.network_address)
        assert 0 < offset < 255, '%s is outside the template node network %s' % (text, self.source)
        return str(self.target.network_address + offset)

    def network(self, text):
        net = ipaddress.ip_network(text)
        return '%s/%d' % (self.address(str(net.network_address)), net.prefixlen)


def overlay(name, folder, lab):
    """The template copied to folder/<name>, with the lab's overrides; returns the inventory path."""
    inventory = os.path.join(folder, name)
    shutil.copytree(os.path.join(ROOT, 'inventories', name), inventory)
    values = _template_values(inventory)
    lab_vars = _load(lab.inventory)['cluster']['vars']
    move = Move('%s/%d' % (values['node_gateway'], values['node_prefix']), lab.net)

    hosts_yml = _load(os.path.join(inventory, 'hosts.yml'))
    for dummy, dummy, host in _hosts(hosts_yml):
        if host.get('node_ip'):
            host['node_ip'] = move.address(host['node_ip'])
    with open(os.path.join(inventory, 'hosts.yml'), 'w', encoding='utf-8') as handle:
        yaml.safe_dump(hosts_yml, handle, sort_keys=False)

    # What a user adds (docs/guide-proxmox.md): the PVE CA in files/, and vault.yml with every variable it names.
    os.makedirs(os.path.join(inventory, 'files'), exist_ok=True)
    shutil.copy(lab.ca_path, os.path.join(inventory, 'files', 'pve-root-ca.pem'))
    with open(os.path.join(inventory, 'group_vars', 'all', 'vault.yml'), 'w', encoding='utf-8') as handle:
        yaml.safe_dump({'vault_pve_api_token_secret': lab.token_secret,
                        'vault_flux_git_ssh_identity': 'a placeholder: the lab Git server checks that one is given',
                        'vault_flux_git_ssh_known_hosts': 'git.lab.internal ssh-ed25519 placeholder'}, handle)

    lab_overrides = {
        # addresses: the lab's /24 (see the module docstring)
        'cluster_endpoint_host': move.address(values['cluster_endpoint_host']),
        'node_gateway': move.address(values['node_gateway']),
        'proxmox_vms_nameservers': [move.address(a) for a in values['proxmox_vms_nameservers']],
        'cluster_lb_pool': move.network(values['cluster_lb_pool']),
        # the lab's PVE address; everything else of the connection is the template's
        'pve_api_host': lab_vars['pve_api_host'],
        # no Ceph in the lab
        'vm_storage': 'local-lvm',
        # no helm.cilium.io: the lab's chart of the upstream shape
        'cni_helm_chart_ref': LAB_CHART,
        'cni_helm_repo_url': '',
        'cni_helm_chart_version': '',
        # the lab's Git server
        'flux_git_url': LAB_GIT_URL,
    }
    if lab_vars.get('lab_git_url'):
        # the upstream world's smart-HTTPS Git server (see the module docstring): HTTP basic auth and its CA, no SSH
        lab_overrides.update({
            'flux_git_url': lab_vars['lab_git_url'],
            'flux_git_ssh_identity': '',
            'flux_git_ssh_known_hosts': '',
            'flux_git_username': LAB_GIT_USER,
            'flux_git_password': "{{ lookup('ansible.builtin.file', '%s') }}" % os.path.join(lab.run_dir, 'git-token'),
            'flux_git_ca_cert': "{{ lookup('ansible.builtin.file', '%s') }}" % lab_vars['lab_git_ca_file'],
        })
    lab_overrides.update({
        # no raw.githubusercontent.com: the lab's mirror of the same pinned upstream files, and its CA
        'flux_artifacts_base_url': open(os.path.join(lab.run_dir, 'artifact-mirror.url'), encoding='utf-8').read().strip(),
        'flux_artifacts_ca_path': os.path.join(lab.run_dir, 'artifact-mirror-ca.crt'),
    })
    # the template's VIP lands on the lab's endpoint address (lab/addresses.py: .10 of the net, as in both templates)
    assert lab_overrides['cluster_endpoint_host'] == lab.cluster_endpoint, (lab_overrides, lab.cluster_endpoint)
    # Loaded after the template's files of group_vars/all (Ansible reads a folder's files in sorted order).
    with open(os.path.join(inventory, 'group_vars', 'all', 'zz-lab-overrides.yml'), 'w', encoding='utf-8') as handle:
        handle.write('---\n# Written by tests/integration/test_templates_lab.py: what the lab must change.\n')
        yaml.safe_dump(lab_overrides, handle, sort_keys=False)
    return inventory, values


def _push(lab, repo, env, ca_file):
    """Push main of the upstream world's working copy to its Git server, trusting the server's CA (GIT_SSL_CAINFO,
    which outranks the clone's http.sslCAInfo when the environment sets it), with HTTP basic auth given through git's
    environment configuration (never on a command line that an error would print)."""
    with open(os.path.join(lab.run_dir, 'git-token'), encoding='utf-8') as handle:
        token = base64.b64encode(('%s:%s' % (LAB_GIT_USER, handle.read().strip())).encode()).decode()
    env = dict(env, GIT_SSL_CAINFO=ca_file, GIT_TERMINAL_PROMPT='0', GIT_CONFIG_COUNT='1', GIT_CONFIG_KEY_0='http.extraHeader',
               GIT_CONFIG_VALUE_0='Authorization: Basic %s' % token)
    pushed = subprocess.run(['git', 'push', '--quiet', 'origin', 'main'], cwd=repo, env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    assert pushed.returncode == 0, pushed.stderr


def gitops_repository(lab, values, lab_vars):
    """The lab's GitOps repository gets clusters/<cluster_name> from the skeleton, CCM and CSI left out while
    gitops_csi_enabled is false (the skeleton's README), committed on main as a user would push it (and pushed, on
    the upstream world, whose Git server serves what is pushed to it)."""
    assert values['flux_git_path'] == './clusters/%s' % values['cluster_name'], values['flux_git_path']
    assert values.get('gitops_csi_enabled') is False
    repo = os.path.join(lab.run_dir, 'gitops')
    target = os.path.join(repo, 'clusters', values['cluster_name'])
    shutil.copytree(os.path.join(ROOT, 'docs', 'gitops-skeleton', 'clusters', 'CLUSTER'), target)
    root = _load(os.path.join(target, 'kustomization.yaml'))
    for name in ('proxmox-ccm.yaml', 'proxmox-csi.yaml'):
        root['resources'].remove(name)
        os.remove(os.path.join(target, name))
    with open(os.path.join(target, 'kustomization.yaml'), 'w', encoding='utf-8') as handle:
        yaml.safe_dump(root, handle)
    env = dict(os.environ, GIT_AUTHOR_NAME='user', GIT_AUTHOR_EMAIL='user@example.invalid', GIT_COMMITTER_NAME='user',
               GIT_COMMITTER_EMAIL='user@example.invalid')
    for command in (['git', 'add', '-A'], ['git', 'commit', '-q', '-m', 'clusters/%s from the skeleton' % values['cluster_name']]):
        subprocess.run(command, cwd=repo, env=env, check=True, capture_output=True, timeout=60)
    if lab_vars.get('lab_git_push'):
        _push(lab, repo, env, lab_vars['lab_git_ca_file'])
    return [doc['metadata']['name'] for doc in (_load(os.path.join(target, name)) for name in root['resources'])]


def kustomizations(inventory):
    """name -> Ready status of the Flux Kustomizations, read with kubectl from the run's kubeconfig."""
    listed = subprocess.run([os.path.join(TOOLS, 'kubectl'), '--kubeconfig', os.path.join(inventory, 'artifacts', 'kubeconfig'),
                             'get', 'kustomizations.kustomize.toolkit.fluxcd.io', '-n', 'flux-system', '-o', 'json'],
                            capture_output=True, text=True, timeout=120, check=False)
    assert listed.returncode == 0, listed.stderr
    out = {}
    for item in json.loads(listed.stdout)['items']:
        ready = [c['status'] for c in item.get('status', {}).get('conditions', []) if c['type'] == 'Ready']
        out[item['metadata']['name']] = ready[0] if ready else None
    return out


def playbook(folder, inventory, *args, playbook_path=os.path.join(ROOT, 'site.yml')):
    command = [PLAYBOOK_BIN, playbook_path, '-i', inventory] + list(args)
    return Run(subprocess.run(command, capture_output=True, text=True, env=environment(folder), cwd=ROOT, timeout=1200,
                              check=False))


def render_cilium(folder, inventory):
    """The template's cni.yml: render files/cilium.yaml once with the cni role's render_manifest entry point."""
    book = os.path.join(folder, 'render-cilium.yml')
    with open(book, 'w', encoding='utf-8') as handle:
        yaml.safe_dump([{'name': 'Render Cilium', 'hosts': 'controlplane[0]', 'gather_facts': False,
                         'tasks': [{'name': 'Render', 'ansible.builtin.import_role': {
                             'name': 'proxtalos.cluster.cni', 'tasks_from': 'render_manifest'}}]}], handle)
    return playbook(folder, inventory, playbook_path=book)


@pytest.mark.parametrize('name', ['infra', 'apps'])
def test_the_template_brings_a_cluster_up_against_the_lab(name, tmp_path):
    folder = str(tmp_path)
    template_hosts = _hosts(_load(os.path.join(ROOT, 'inventories', name, 'hosts.yml')))
    control_planes = len([h for h in template_hosts if h[0] == 'controlplane'])
    workers = len(template_hosts) - control_planes
    pve_nodes = sorted(set(values['vm_pve_node'] for dummy, dummy, values in template_hosts))
    lab = start_lab(os.path.join(folder, 'lab'), control_planes=control_planes, workers=workers,
                    extra_args=('--pve-nodes', ','.join(pve_nodes)))
    try:
        lab.fault('pve-storage-full', 'local-lvm', free=1000.0)
        inventory, values = overlay(name, folder, lab)
        tree = gitops_repository(lab, values, _load(lab.inventory)['cluster']['vars'])
        if values.get('cni_mode', 'inline') == 'inline':
            rendered = render_cilium(folder, inventory)
            assert rendered.rc == 0, rendered.explain()
            assert os.path.exists(os.path.join(inventory, 'files', 'cilium.yaml'))
        run = playbook(folder, inventory, '--skip-tags', NOT_AGAINST_THE_LAB)
        assert run.rc == 0, run.explain()
        unexpected = [(task, message) for task, dummy, message in run.failures()
                      if not any(host in message for host in UNREACHABLE_CHART_HOSTS)]
        assert unexpected == [], unexpected
        artifacts = os.path.join(inventory, 'artifacts')
        for artifact in ('kubeconfig', 'talosconfig', 'report.json'):
            assert os.path.exists(os.path.join(artifacts, artifact)), sorted(os.listdir(artifacts))
        # every node of the template is a Kubernetes node of the lab's cluster, found where the template put it
        vms = dict((row['name'], row) for row in lab.vms())
        assert sorted(vms) == sorted(host for dummy, host, dummy in template_hosts)
        for dummy, host, host_values in template_hosts:
            assert vms[host]['status'] == 'running', vms[host]
            assert vms[host]['vmid'] == host_values['vm_id'] and vms[host]['node'] == host_values['vm_pve_node'], vms[host]
        # the lab answers on the endpoint only while a control plane holds it as the VIP of its Layer2VIPConfig
        status = lab.status()
        served = next(iter((status.get('k8s') or status['k8s_upstream']).values()))['api']  # lab/k8s or upstream's
        assert '%s:6443' % lab.cluster_endpoint in served, served
        # Flux follows the template's cluster folder: every Kustomization of it Ready (the gitops stage's gate passed)
        report = _load(os.path.join(artifacts, 'report.json'))
        stages = dict((stage['name'], stage['status']) for stage in report['stages'])
        assert [stages.get(name) for name in ('sealed_secrets', 'flux', 'gitops')] == ['ok'] * 3, stages
        assert kustomizations(inventory) == dict((name, 'True') for name in ['flux-system'] + tree)
    finally:
        lab.stop()
