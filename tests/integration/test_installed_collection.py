"""The collection as a user installs and runs it: the Galaxy tarball installed with docs/examples/requirements.yml into
a collections path of its own, and `ansible-playbook proxtalos.cluster.site` run from a project folder outside the
repository (docs/examples/ansible.cfg, an inventory next to it) against a lab (1 control plane + 1 worker) - every
stage, end to end. The artifacts land next to the inventory by default (<inventory>/artifacts/<cluster_name>; the
inventory sets no proxtalos_artifacts_dir), nothing inside the installed collection.

The run has only a vault password typed at the prompt (--ask-vault-pass, which reads stdin when it is not a terminal),
as the guide's first run does, and the inventory's PVE token secret is in a vault-encrypted vault.yml: no file of the
project then holds a private key in clear - the Talos secrets bundle and the sealed-secrets key in secrets/, the
machine configs, talosconfig and kubeconfig in artifacts/ are vault envelopes with the typed password.
"""
import json
import os
import shutil
import subprocess

import pytest
import yaml
from ansible.parsing.vault import VaultLib, VaultSecret

from k8s_stages_lab import TOOLS, start_rendered_lab
from key_scan import files_with_private_keys, private_keys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, '.venv', 'bin')
GALAXY = os.path.join(BIN, 'ansible-galaxy')
PLAYBOOK = os.path.join(BIN, 'ansible-playbook')
PASSWORD = 'typed at the prompt, never in a file'

pytestmark = [pytest.mark.lab, pytest.mark.slow,
              pytest.mark.skipif(not os.access(PLAYBOOK, os.X_OK), reason='no ansible-playbook in .venv (make setup)'),
              pytest.mark.skipif(not os.access(os.path.join(TOOLS, 'helm'), os.X_OK), reason='no helm in .tools/bin')]


def user_env(home, project):
    """The user's environment: no ANSIBLE_* setting but the project's ansible.cfg (docs/examples/ansible.cfg), which
    names the project's collections/ folder."""
    env = dict((key, value) for key, value in os.environ.items() if not key.startswith('ANSIBLE_'))
    env.update(HOME=str(home), ANSIBLE_CONFIG=os.path.join(str(project), 'ansible.cfg'),
               ANSIBLE_NOCOLOR='1', PATH=os.pathsep.join([BIN, TOOLS, os.environ.get('PATH', '')]))
    return env


@pytest.fixture(scope='module')
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp('user')
    home, project_dir = folder / 'home', folder / 'project'
    collections = project_dir / 'collections'
    for path in (home, project_dir):
        path.mkdir()
    shutil.copy(os.path.join(ROOT, 'docs', 'examples', 'ansible.cfg'), str(project_dir / 'ansible.cfg'))
    env = user_env(home, project_dir)
    build = subprocess.run([GALAXY, 'collection', 'build', ROOT, '--output-path', str(folder)], cwd=str(folder), env=env,
                           capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    tarballs = [str(folder / name) for name in os.listdir(str(folder)) if name.endswith('.tar.gz')]
    assert len(tarballs) == 1, tarballs
    tarball = tarballs[0]
    # The project's requirements.yml is the documented one; its tarball name follows galaxy.yml's version.
    with open(os.path.join(ROOT, 'docs', 'examples', 'requirements.yml'), encoding='utf-8') as handle:
        requirements = yaml.safe_load(handle)
    assert [item['name'] for item in requirements['collections']] == ['./' + os.path.basename(tarball)], requirements
    shutil.copy(os.path.join(ROOT, 'docs', 'examples', 'requirements.yml'), str(project_dir / 'requirements.yml'))
    shutil.copy(tarball, str(project_dir))
    # --offline: Galaxy is not reachable here; kubernetes.core (galaxy.yml's dependency) comes with the ansible package
    install = subprocess.run([GALAXY, 'collection', 'install', '-r', 'requirements.yml', '-p', 'collections/', '--offline'],
                             cwd=str(project_dir), env=env, capture_output=True, text=True, timeout=300, check=False)
    assert install.returncode == 0, install.stdout + install.stderr
    assert 'proxtalos.cluster:' in install.stdout and 'kubernetes.core' in install.stdout, install.stdout
    assert 'not part of the configured' not in install.stdout + install.stderr, install.stdout + install.stderr
    lab = start_rendered_lab(str(folder / 'lab'), control_planes=1, workers=1)
    try:
        inventory = project_dir / 'inventory'
        inventory.mkdir()
        # The PVE token secret goes into a vault-encrypted vault.yml, as the guide has a user keep it
        with open(lab.inventory, encoding='utf-8') as handle:
            hosts = yaml.safe_load(handle)
        del hosts['cluster']['vars']['pve_api_token_secret']
        (inventory / 'hosts.yml').write_text(yaml.safe_dump(hosts))
        for name in ('group_vars', 'files'):
            shutil.copytree(os.path.join(ROOT, 'inventories', 'lab', name), str(inventory / name), symlinks=False)
        (inventory / 'group_vars' / 'all' / 'pve_secret.yml').write_text(
            '---\npve_api_token_secret: "{{ vault_pve_api_token_secret }}"\n')
        vault = VaultLib([('default', VaultSecret(PASSWORD.encode()))])
        (inventory / 'group_vars' / 'all' / 'vault.yml').write_bytes(
            vault.encrypt(yaml.safe_dump({'vault_pve_api_token_secret': lab.token_secret})))
        yield project_dir, inventory, collections, env
    finally:
        lab.stop()


def test_the_installed_collection_runs_every_stage_from_a_project_of_its_own(project):
    project_dir, inventory, collections, env = project
    run = subprocess.run([PLAYBOOK, 'proxtalos.cluster.site', '-i', str(inventory), '--ask-vault-pass'], cwd=str(project_dir),
                         env=env, input=PASSWORD + '\n', capture_output=True, text=True, timeout=1500, check=False)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    installed = collections / 'ansible_collections' / 'proxtalos' / 'cluster'
    assert (installed / 'playbooks' / 'site.yml').exists()
    # the only copy the project's Ansible finds is the installed one (not the repository's .collections link)
    listed = subprocess.run([GALAXY, 'collection', 'list', 'proxtalos.cluster', '--format', 'json'], cwd=str(project_dir), env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert listed.returncode == 0, listed.stderr
    assert list(json.loads(listed.stdout)) == [str(collections / 'ansible_collections')], listed.stdout
    artifacts = inventory / 'artifacts' / 'lab'   # the lab's cluster_name
    for name in ('kubeconfig', 'talosconfig', 'report.json'):
        assert (artifacts / name).exists(), sorted(os.listdir(str(artifacts)))
    assert not (installed / 'artifacts').exists(), 'a run wrote into the installed collection'
    assert 'failed=0' in run.stdout


def test_a_prompted_vault_password_leaves_no_private_key_in_clear_anywhere(project):
    """After the whole run above (it ran first: same module), no file of the project holds a private key in clear:
    the kept secrets (Talos bundle, sealed-secrets key) and the run's artifacts (machine configs with the CA keys,
    talosconfig, kubeconfig) are vault envelopes that open with the typed password."""
    project_dir, inventory, collections, dummy = project
    secrets = inventory / 'secrets'
    kept = sorted(os.listdir(str(secrets)))
    assert 'talos-secrets.yaml' in kept and 'sealed-secrets.key' in kept, kept
    artifacts = inventory / 'artifacts' / 'lab'
    vault = VaultLib([('default', VaultSecret(PASSWORD.encode()))])
    for path in [secrets / 'talos-secrets.yaml', secrets / 'sealed-secrets.key'] + [
            artifacts / name for name in ('kubeconfig', 'talosconfig', 'lab-cp-1.yaml')]:
        data = path.read_bytes()
        assert data.startswith(b'$ANSIBLE_VAULT;'), path
        assert os.stat(str(path)).st_mode & 0o777 == 0o600, path
        assert private_keys(vault.decrypt(data)), '%s holds no private key once decrypted (the scan is broken)' % path
    assert files_with_private_keys(project_dir, skip=[collections]) == {}
