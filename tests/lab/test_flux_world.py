"""lab.flux inside the World: the Git server's files in the run dir, the faults and the status section."""

import os
import ssl
import stat
import subprocess
import urllib.error
import urllib.request

import pytest

from lab.faults import FaultError
from lab.flux.gitserver import read_tree
from lab.flux.lab import LAB_REPO_DIR, LAB_REPO_PATH
from lab.testing import free_net, world_in_thread


@pytest.fixture
def running(tmp_path):
    with world_in_thread(tmp_path / 'run', free_net(), extensions=('lab.talos', 'lab.k8s', 'lab.flux'), profile='instant') as world:
        yield world


def test_install_writes_the_git_credentials_and_the_repository(running):
    world = running.world
    token = os.path.join(world.run_dir, 'git-token')
    assert stat.S_IMODE(os.stat(token).st_mode) == 0o600
    with open(token, encoding='utf-8') as handle:
        assert handle.read().strip() == world.flux.token
    repo = os.path.join(world.run_dir, 'gitops')
    assert os.path.isdir(os.path.join(repo, '.git')) and not os.path.islink(repo)
    log = subprocess.run(['git', '-C', repo, 'log', '--format=%H', 'main'], capture_output=True, text=True, check=True).stdout.split()
    assert len(log) == 1
    # what the server serves is the commit, and the commit is the tree shipped in lab/gitops
    snapshot = world.flux.git.fetch(world.flux.git.url_for(LAB_REPO_PATH), {'branch': 'main'}, {'username': 'flux', 'password': world.flux.token})
    assert snapshot.revision == 'main@sha1:%s' % log[0]
    assert snapshot.files == read_tree(LAB_REPO_DIR)
    assert world.flux.git.credentials == ('flux', world.flux.token)
    assert {'flux_git_fetch', 'flux_reconcile'} <= set(world.timing.kinds)


def test_faults_are_registered_and_checked(running):
    world = running.world
    faults = {f['name']: f for f in running.call(world.control({'op': 'faults'}))}
    assert faults['flux-healthcheck-fail']['target_kind'] == 'kustomization'
    assert faults['flux-source-not-ready']['target_kind'] == 'gitrepository'
    running.call(world.control({'op': 'fault', 'name': 'flux-source-not-ready', 'target': 'flux-system/flux-system', 'params': {}}))
    assert world.flux.git.down == {'proxtalos/lab-gitops'}
    status = running.call(world.status())
    assert status['flux']['git']['down'] == ['proxtalos/lab-gitops']
    running.call(world.control({'op': 'clear', 'name': 'flux-source-not-ready', 'target': 'flux-system/flux-system'}))
    assert not world.flux.git.down
    running.call(world.control({'op': 'fault', 'name': 'flux-healthcheck-fail', 'target': 'flux-system/proxmox-csi', 'params': {}}))
    assert world.flux.health_faults == {('flux-system', 'proxmox-csi')}
    with pytest.raises(FaultError, match='target must be NAMESPACE/KUSTOMIZATION'):
        world.flux.fault_healthcheck('proxmox-csi')
    assert faults['flux-build-fail']['target_kind'] == 'kustomization'
    running.call(world.control({'op': 'fault', 'name': 'flux-build-fail', 'target': 'flux-system/apps', 'params': {'resource': 'x.yaml'}}))
    assert world.flux.build_faults == {('flux-system', 'apps'): 'x.yaml'}
    running.call(world.control({'op': 'clear', 'name': 'flux-build-fail', 'target': 'flux-system/apps'}))
    assert world.flux.build_faults == {}
    with pytest.raises(FaultError, match='resource must be a file name'):
        world.flux.fault_build('flux-system/apps', resource='a/b.yaml')


def test_the_artifact_mirror_runs_with_the_world_and_the_inventory_files_name_it(running):
    """The World starts the artifact mirror: the run dir names its URL and CA (what inventories/lab reads), status and the
    endpoints show it, and an unknown path is 404 in the status."""
    world = running.world
    with open(os.path.join(world.run_dir, 'artifact-mirror.url'), encoding='utf-8') as handle:
        url = handle.read().strip()
    ca = os.path.join(world.run_dir, 'artifact-mirror-ca.crt')
    assert url == world.flux.mirror.url and url.startswith('https://127.0.0.1:')
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(url + '/nobody/nothing/v0/x.yaml', context=ssl.create_default_context(cafile=ca), timeout=10)
    status = running.call(world.status())
    mirror = status['flux']['artifact_mirror']
    assert mirror['url'] == url and mirror['ca'] == ca and mirror['pinned_files'] > 0
    assert mirror['not_found'] == ['/nobody/nothing/v0/x.yaml']
    assert any(e['name'] == 'artifact-mirror' and e['port'] == world.flux.mirror.port for e in status['lab']['endpoints'])
