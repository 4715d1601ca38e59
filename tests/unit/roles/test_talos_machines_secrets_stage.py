"""talos_machines secrets stage through ansible-playbook on local hosts (the real task files, vars and modules; no
Talos node): each host's config renders with its own cluster values (a host's talos_machines_cluster_values, a group's
talos_schematic_id), and a patch's credentials are not printed at -v by the per-host inputs task."""
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ANSIBLE_PLAYBOOK = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
SCHEMATIC = 'b' * 64
REGISTRY_PASSWORD = 'fixtalos-registry-pass-7f3a'

PLAYBOOK = """---
- name: Stage secrets, as site.yml runs it
  hosts: all
  gather_facts: false
  tasks:
    - name: The secrets entry point
      ansible.builtin.import_role:
        name: proxtalos.cluster.talos_machines
        tasks_from: secrets
      run_once: true
"""


def run_stage(tmp_path, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_LOCAL_TEMP=str(tmp_path / 'tmp'),
               PROXTALOS_REPORT_DIR=str(tmp_path / 'report'))
    return subprocess.run([ANSIBLE_PLAYBOOK, '-i', str(tmp_path / 'inventory' / 'hosts.yml'), str(tmp_path / 'play.yml')]
                          + list(extra), capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_each_host_renders_with_its_own_cluster_values_and_patch_credentials_stay_hidden(tmp_path):
    registry_patch = {'machine': {'registries': {'config': {'registry.example.com': {
        'auth': {'username': 'puller', 'password': REGISTRY_PASSWORD}}}}}}
    inventory = {'all': {
        'vars': {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable,
                 'cluster_name': 'demo', 'cluster_endpoint': 'https://10.5.0.10:6443', 'node_prefix': 24,
                 'proxtalos_artifacts_dir': str(tmp_path / 'artifacts'), 'talos_machines_vault_password_file': ''},
        'children': {
            'controlplane': {'hosts': {
                'cp-1': {'node_ip': '10.5.0.11'},
                # Not the first host: its own NIC name must still reach its config.
                'cp-2': {'node_ip': '10.5.0.12', 'talos_machines_cluster_values': {'network_link': 'enp6s18'},
                         'talos_host_patches': [registry_patch]}}},
            'worker': {
                'vars': {'talos_schematic_id': SCHEMATIC},
                'hosts': {'w-1': {'node_ip': '10.5.0.21'}}}}}}
    (tmp_path / 'inventory').mkdir()
    (tmp_path / 'inventory' / 'hosts.yml').write_text(yaml.safe_dump(inventory))
    (tmp_path / 'play.yml').write_text(PLAYBOOK)
    run = run_stage(tmp_path, '-v')
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert REGISTRY_PASSWORD not in run.stdout + run.stderr
    configs = dict((name, (tmp_path / 'artifacts' / ('%s.yaml' % name)).read_text()) for name in ('cp-1', 'cp-2', 'w-1'))
    assert REGISTRY_PASSWORD in configs['cp-2']  # the patch did reach the config: the check above is not vacuous
    assert 'enp6s18' in configs['cp-2'] and 'enp6s18' not in configs['cp-1'] + configs['w-1']
    assert 'factory.talos.dev/installer/%s:' % SCHEMATIC in configs['w-1']
    assert SCHEMATIC not in configs['cp-1'] + configs['cp-2']

    again = run_stage(tmp_path)
    assert again.returncode == 0 and 'changed=0' in again.stdout, again.stdout[-3000:]
    # The debugging switch shows the inputs (so the hiding above is the task's no_log, not an accident of the output).
    shown = run_stage(tmp_path, '-v', '-e', 'talos_machines_unsafe_show_logs=true')
    assert shown.returncode == 0 and REGISTRY_PASSWORD in shown.stdout, shown.stdout[-3000:]


def _docs(text):
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _vips(text):
    return [(doc['name'], doc['link']) for doc in _docs(text) if doc.get('kind') == 'Layer2VIPConfig']


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_cluster_values_of_several_group_vars_files_merge_and_the_endpoint_ip_becomes_the_control_planes_vip(tmp_path):
    """A user's cluster.yml and the template's cni.yml each add cluster values (one no longer replaces the other), and
    the endpoint's IP address, which no node has, is the control planes' Layer2VIPConfig (workers have none)."""
    group_vars = tmp_path / 'inventory' / 'group_vars' / 'all'
    group_vars.mkdir(parents=True)
    (group_vars / 'cluster.yml').write_text(yaml.safe_dump({
        'cluster_name': 'demo', 'cluster_endpoint_host': '10.5.0.10',
        'cluster_endpoint': 'https://{{ cluster_endpoint_host }}:6443', 'node_prefix': 24,
        'talos_machines_cluster_values': {'cert_sans': ['api.demo.example']}}))
    (group_vars / 'cni.yml').write_text(yaml.safe_dump({
        'talos_machines_cluster_values_cni': {'inline_manifests': [{'name': 'cilium', 'contents': 'kind: List\n'}]}}))
    (group_vars / 'run.yml').write_text(yaml.safe_dump({
        'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable,
        'proxtalos_artifacts_dir': str(tmp_path / 'artifacts'), 'talos_machines_vault_password_file': ''}))
    inventory = {'all': {'children': {
        'controlplane': {'hosts': {'cp-1': {'node_ip': '10.5.0.11'}, 'cp-2': {'node_ip': '10.5.0.12'}}},
        'worker': {'hosts': {'w-1': {'node_ip': '10.5.0.21'}}}}}}
    (tmp_path / 'inventory' / 'hosts.yml').write_text(yaml.safe_dump(inventory))
    (tmp_path / 'play.yml').write_text(PLAYBOOK)
    run = run_stage(tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    configs = dict((name, (tmp_path / 'artifacts' / ('%s.yaml' % name)).read_text()) for name in ('cp-1', 'cp-2', 'w-1'))
    for name in ('cp-1', 'cp-2'):
        cluster = _docs(configs[name])[0]['cluster']
        assert [m['name'] for m in cluster['inlineManifests']] == ['cilium'], name
        assert 'api.demo.example' in cluster['apiServer']['certSANs'], name
        assert _vips(configs[name]) == [('10.5.0.10', 'ens18')], name
    assert _vips(configs['w-1']) == []

    # An endpoint that is a control plane's own address needs no VIP; nor does one the user turns off.
    (tmp_path / 'extra.yml').write_text(yaml.safe_dump({'cluster_endpoint_host': '10.5.0.11'}))
    own = run_stage(tmp_path, '-e', '@' + str(tmp_path / 'extra.yml'))
    assert own.returncode == 0, own.stdout[-4000:] + own.stderr[-2000:]
    assert _vips((tmp_path / 'artifacts' / 'cp-1.yaml').read_text()) == []
    off = run_stage(tmp_path, '-e', 'talos_machines_vip=')
    assert off.returncode == 0, off.stdout[-4000:] + off.stderr[-2000:]
    assert _vips((tmp_path / 'artifacts' / 'cp-1.yaml').read_text()) == []
