"""The collection as a user installs and runs it: the Galaxy tarball installed into a collections path of its own, and
`ansible-playbook proxtalos.cluster.site` run from a project folder outside the repository (docs/examples/ansible.cfg,
an inventory next to it) against a lab (1 control plane + 1 worker) - every stage, end to end. The artifacts land next
to the inventory (proxtalos_artifacts_dir, as the templates set it), nothing inside the installed collection.
"""
import json
import os
import shutil
import subprocess

import pytest

from k8s_stages_lab import TOOLS
from lab.testing import start_lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, '.venv', 'bin')
GALAXY = os.path.join(BIN, 'ansible-galaxy')
PLAYBOOK = os.path.join(BIN, 'ansible-playbook')

pytestmark = [pytest.mark.lab, pytest.mark.slow,
              pytest.mark.skipif(not os.access(PLAYBOOK, os.X_OK), reason='no ansible-playbook in .venv (make setup)'),
              pytest.mark.skipif(not os.access(os.path.join(TOOLS, 'helm'), os.X_OK), reason='no helm in .tools/bin')]


def user_env(home, collections, project):
    env = dict((key, value) for key, value in os.environ.items() if not key.startswith('ANSIBLE_'))
    env.update(HOME=str(home), ANSIBLE_CONFIG=os.path.join(str(project), 'ansible.cfg'), ANSIBLE_COLLECTIONS_PATH=str(collections),
               ANSIBLE_NOCOLOR='1', PATH=os.pathsep.join([BIN, TOOLS, os.environ.get('PATH', '')]))
    return env


@pytest.fixture(scope='module')
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp('user')
    home, collections, project_dir = folder / 'home', folder / 'collections', folder / 'project'
    for path in (home, collections, project_dir):
        path.mkdir()
    shutil.copy(os.path.join(ROOT, 'docs', 'examples', 'ansible.cfg'), str(project_dir / 'ansible.cfg'))
    env = user_env(home, collections, project_dir)
    build = subprocess.run([GALAXY, 'collection', 'build', ROOT, '--output-path', str(folder)], cwd=str(folder), env=env,
                           capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    tarballs = [str(folder / name) for name in os.listdir(str(folder)) if name.endswith('.tar.gz')]
    assert len(tarballs) == 1, tarballs
    tarball = tarballs[0]
    # --no-deps: community.proxmox and kubernetes.core come with the ansible package (Galaxy is not reachable here)
    install = subprocess.run([GALAXY, 'collection', 'install', tarball, '-p', str(collections), '--no-deps'], cwd=str(project_dir),
                             env=env, capture_output=True, text=True, timeout=300, check=False)
    assert install.returncode == 0, install.stdout + install.stderr
    lab = start_lab(str(folder / 'lab'), control_planes=1, workers=1)
    try:
        inventory = project_dir / 'inventory'
        inventory.mkdir()
        shutil.copy(lab.inventory, str(inventory / 'hosts.yml'))
        for name in ('group_vars', 'files'):
            shutil.copytree(os.path.join(ROOT, 'inventories', 'lab', name), str(inventory / name), symlinks=False)
        (inventory / 'group_vars' / 'all' / 'artifacts.yml').write_text(
            '---\nproxtalos_artifacts_dir: "{{ inventory_dir }}/artifacts"\n')
        yield project_dir, inventory, collections, env
    finally:
        lab.stop()


def test_the_installed_collection_runs_every_stage_from_a_project_of_its_own(project):
    project_dir, inventory, collections, env = project
    run = subprocess.run([PLAYBOOK, 'proxtalos.cluster.site', '-i', str(inventory)], cwd=str(project_dir), env=env,
                         capture_output=True, text=True, timeout=1500, check=False)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    installed = collections / 'ansible_collections' / 'proxtalos' / 'cluster'
    assert (installed / 'playbooks' / 'site.yml').exists()
    # the only copy the project's Ansible finds is the installed one (not the repository's .collections link)
    listed = subprocess.run([GALAXY, 'collection', 'list', 'proxtalos.cluster', '--format', 'json'], cwd=str(project_dir), env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert listed.returncode == 0, listed.stderr
    assert list(json.loads(listed.stdout)) == [str(collections / 'ansible_collections')], listed.stdout
    artifacts = inventory / 'artifacts'
    for name in ('kubeconfig', 'talosconfig', 'report.json'):
        assert (artifacts / name).exists(), sorted(os.listdir(str(artifacts)))
    assert not (installed / 'artifacts').exists(), 'a run wrote into the installed collection'
    assert 'failed=0' in run.stdout
