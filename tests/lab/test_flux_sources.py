"""lab.flux_sources inside the World, without any Flux: the Git server with the lab's GitOps repository, its working
copy and credentials, the hosts.yml vars the lab inventory reads, the artifact mirror, and both gone when the lab stops."""

import os
import socket
import ssl
import stat
import subprocess
import urllib.error
import urllib.request

import pytest
import yaml

from lab.flux_sources import GITOPS_TREE, LAB_REPO
from lab.testing import free_net, world_in_thread


def _git(*args, ca_file):
    env = dict(os.environ, GIT_SSL_CAINFO=ca_file, GIT_TERMINAL_PROMPT='0')
    return subprocess.run(['git'] + list(args), capture_output=True, text=True, env=env, timeout=120, check=False)


def _files(directory):
    found = set()
    for parent, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith('.')]
        found.update(os.path.relpath(os.path.join(parent, name), directory) for name in files if not name.startswith('.'))
    return found


@pytest.fixture(scope='module')
def running(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp('flux-sources') / 'run'
    with world_in_thread(run_dir, free_net(), extensions=('lab.flux_sources',), profile='instant') as world:
        yield world


def test_the_repository_is_the_gitops_tree_and_the_working_copy_is_a_clone_of_it(running):
    world = running.world
    git = running.call(world.status())['flux_sources']['git']
    assert git['url'] == world.flux_sources.git.url_for(LAB_REPO) and git['user'] == 'flux'
    assert stat.S_IMODE(os.stat(git['password_file']).st_mode) == 0o600
    with open(git['password_file'], encoding='utf-8') as handle:
        password = handle.read().strip()
    with_password = world.flux_sources.git.url_for(LAB_REPO, credentials=True)
    assert password and password in with_password and password not in git['url']
    served = _git('ls-remote', with_password, 'refs/heads/main', ca_file=git['ca_file'])
    assert served.returncode == 0, served.stderr
    tip = served.stdout.split()[0]
    # the working copy: main at the served commit, its origin the URL without the password
    repo = git['directory']
    assert _git('-C', repo, 'rev-parse', 'HEAD', ca_file=git['ca_file']).stdout.strip() == tip
    assert _git('-C', repo, 'remote', 'get-url', 'origin', ca_file=git['ca_file']).stdout.strip() == git['url']
    tree = _git('-C', repo, 'ls-tree', '-r', '--name-only', tip, ca_file=git['ca_file']).stdout.split()
    assert set(tree) == _files(GITOPS_TREE)
    # a wrong password is refused
    refused = _git('ls-remote', with_password.replace(password, 'wrong'), ca_file=git['ca_file'])
    assert refused.returncode != 0, refused.stdout
    assert 'Authentication failed' in refused.stderr or '401' in refused.stderr, refused.stderr


def test_hosts_yml_names_the_git_server_for_the_lab_inventory(running):
    world = running.world
    with open(world.paths.hosts, encoding='utf-8') as handle:
        cluster_vars = yaml.safe_load(handle)['cluster']['vars']
    git = world.flux_sources
    assert cluster_vars['lab_git_url'] == git.git.url_for(LAB_REPO)
    assert cluster_vars['lab_git_ca_file'] == git.ca_file and os.path.isfile(git.ca_file)
    assert cluster_vars['lab_git_push'] is True


def test_the_artifact_mirror_serves_over_https_with_the_labs_ca(running):
    world = running.world
    mirror = running.call(world.status())['flux_sources']['artifact_mirror']
    with open(os.path.join(world.run_dir, 'artifact-mirror.url'), encoding='utf-8') as handle:
        assert handle.read().strip() == mirror['url']
    context = ssl.create_default_context(cafile=mirror['ca'])
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(mirror['url'] + '/not/a/pinned/file', context=context, timeout=30)  # nosec - loopback test server
    assert refused.value.code == 404
    assert mirror['pinned_files'] > 0


def test_no_flux_and_no_flux_fault_comes_with_it(running):
    world = running.world
    assert getattr(world, 'flux', None) is None and getattr(world, 'flux_upstream', None) is None
    names = {fault['name'] for fault in running.call(world.control({'op': 'faults'}))}
    assert not {name for name in names if name.startswith('flux-')}, names


def test_the_servers_stop_with_the_lab(tmp_path):
    with world_in_thread(tmp_path / 'run', free_net(), extensions=('lab.flux_sources',), profile='instant') as running:
        sources = running.world.flux_sources
        addresses = [(sources.git.host, sources.git.port), (sources.mirror.host, sources.mirror.port)]
    for address in addresses:
        with pytest.raises(OSError):
            socket.create_connection(address, timeout=5).close()
