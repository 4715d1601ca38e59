"""The Flux simulation's pure parts: the lab Git server, the small kustomize build, kstatus, durations."""

import os
import subprocess

import pytest
import yaml

from lab.flux import build, durations, health
from lab.flux.gitserver import GitError, GitServer, wanted_branch
from lab.flux.lab import LAB_REPO_DIR, LAB_REPO_PATH

URL = 'https://git.lab.internal/proxtalos/lab-gitops.git'


# --- Git server -------------------------------------------------------------------------------

def test_fetch_gives_a_revision_that_follows_the_content(tmp_path):
    repo = tmp_path / 'repo'
    repo.mkdir()
    (repo / 'a.yaml').write_text('kind: ConfigMap\n')
    (repo / '.git').mkdir()
    (repo / '.git' / 'HEAD').write_text('ref: refs/heads/main\n')
    server = GitServer({'team/repo': str(repo)})
    first = server.fetch('https://git.lab.internal/team/repo.git', {'branch': 'main'})
    assert first.revision.startswith('main@sha1:') and len(first.commit) == 40
    assert set(first.files) == {'a.yaml'}
    assert server.fetch('https://git.lab.internal/team/repo', {'name': 'refs/heads/main'}).revision == first.revision
    (repo / 'a.yaml').write_text('kind: Secret\n')
    assert server.fetch('https://git.lab.internal/team/repo.git', {'branch': 'main'}).revision != first.revision


@pytest.mark.parametrize('url, ref, reason, text', [
    ('git@git.lab.internal:proxtalos/lab-gitops.git', None, 'URLInvalid', 'scp-style'),
    ('https://github.com/proxtalos/lab-gitops.git', {'branch': 'main'}, 'GitOperationFailed', 'lookup github.com: no such host'),
    ('https://git.lab.internal/proxtalos/nothing.git', {'branch': 'main'}, 'GitOperationFailed', 'repository not found'),
    (URL, None, 'GitOperationFailed', 'couldn\'t find remote ref "refs/heads/master"'),
    (URL, {'tag': 'v1.0.0'}, 'GitOperationFailed', 'only the branch main'),
])
def test_fetch_refuses_what_source_controller_would_report(url, ref, reason, text):
    server = GitServer({LAB_REPO_PATH: LAB_REPO_DIR})
    with pytest.raises(GitError) as caught:
        server.fetch(url, ref)
    assert caught.value.reason == reason
    assert text in caught.value.message


def test_credentials_are_checked_and_a_down_repository_answers_503():
    server = GitServer({LAB_REPO_PATH: LAB_REPO_DIR}, credentials=('flux', 'secret'))
    with pytest.raises(GitError, match='authentication required'):
        server.fetch(URL, {'branch': 'main'})
    with pytest.raises(GitError, match='Invalid username or password'):
        server.fetch(URL, {'branch': 'main'}, {'username': 'flux', 'password': 'wrong'})
    assert server.fetch(URL, {'branch': 'main'}, {'username': 'flux', 'password': 'secret'}).files
    server.down.add(LAB_REPO_PATH)
    with pytest.raises(GitError, match='status code: 503'):
        server.fetch(URL, {'branch': 'main'}, {'username': 'flux', 'password': 'secret'})
    with pytest.raises(GitError) as caught:
        GitServer({LAB_REPO_PATH: LAB_REPO_DIR}).fetch('ssh://git@git.lab.internal/proxtalos/lab-gitops.git', {'branch': 'main'})
    assert caught.value.reason == 'AuthenticationFailed' and "'identity' is required" in caught.value.message


def test_ref_precedence_is_fluxs():
    assert wanted_branch(None) == ('branch', 'master')
    assert wanted_branch({'branch': 'main', 'tag': 'v1'}) == ('tag', 'v1')
    assert wanted_branch({'branch': 'main', 'name': 'refs/heads/dev'}) == ('branch', 'dev')
    assert wanted_branch({'tag': 'v1', 'commit': 'abc'}) == ('commit', 'abc')


# --- build ------------------------------------------------------------------------------------

DEPLOY = 'apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n'
NAMESPACE = 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: apps\n'


def test_kustomization_resources_namespace_and_labels():
    files = {'app/kustomization.yaml': b'resources: [ns.yaml, web.yaml, sub]\nnamespace: apps\ncommonLabels: {team: a}\n',
             'app/ns.yaml': NAMESPACE.encode(), 'app/web.yaml': DEPLOY.encode(),
             'app/sub/kustomization.yaml': b'resources: [cm.yaml]\n',
             'app/sub/cm.yaml': b'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n'}
    objects = build.build(files, './app/')
    assert [(o['kind'], o['metadata'].get('namespace')) for o in objects] == [('Namespace', None), ('Deployment', 'apps'), ('ConfigMap', 'apps')]
    assert all(o['metadata']['labels'] == {'team': 'a'} for o in objects)


def test_without_kustomization_every_manifest_below_is_taken():
    files = {'app/web.yaml': DEPLOY.encode(), 'app/notes.txt': b'x', 'app/more/ns.yaml': NAMESPACE.encode(),
             'app/values.yaml': b'replicas: 3\n'}
    kinds = sorted(o['kind'] for o in build.build(files, 'app'))
    assert kinds == ['Deployment', 'Namespace']


@pytest.mark.parametrize('files, path, error, text', [
    ({'a/x.yaml': DEPLOY.encode()}, './b', build.PathNotFound, 'kustomization path not found'),
    ({'a/kustomization.yaml': b'resources: [missing.yaml]\n'}, 'a', build.BuildError, 'no such file or directory'),
    ({'a/kustomization.yaml': b'resources: [x.yaml, y.yaml]\n', 'a/x.yaml': DEPLOY.encode(), 'a/y.yaml': DEPLOY.encode()}, 'a',
     build.BuildError, 'already registered id: Deployment.apps.v1/web'),
    ({'a/kustomization.yaml': b'resources: [x.yaml]\npatches: []\n', 'a/x.yaml': DEPLOY.encode()}, 'a', build.BuildError,
     'patches are not supported'),
    ({'a/kustomization.yaml': b'resources: [sub]\n', 'a/sub/x.yaml': DEPLOY.encode()}, 'a', build.BuildError,
     "unable to find one of 'kustomization.yaml'"),
    ({'a/x.yaml': b'apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n'}, 'a', build.BuildError, 'failed to decode Kubernetes apiVersion'),
    ({'a/x.yaml': DEPLOY.encode()}, '../etc', build.BuildError, 'leaves the source artifact'),
])
def test_build_errors_name_the_problem(files, path, error, text):
    with pytest.raises(error) as caught:
        build.build(files, path)
    assert text in str(caught.value)


def test_the_lab_repository_builds_into_flux_kustomizations():
    from lab.flux.gitserver import read_tree  # pylint: disable=import-outside-toplevel
    files = read_tree(LAB_REPO_DIR)
    root = build.build(files, './clusters/lab')
    names = [o['metadata']['name'] for o in root if o['kind'] == 'Kustomization']
    assert names == ['sealed-secrets', 'flux-credentials', 'proxmox-ccm', 'proxmox-csi', 'cert-manager', 'cert-manager-issuers', 'apps']
    for ks in root:
        built = build.build(files, ks['spec']['path'])
        # flux-credentials holds only what the collection commits there (nothing before the first run)
        assert built or ks['metadata']['name'] == 'flux-credentials', ks['spec']['path']
    csi = build.build(files, './infrastructure/proxmox-csi')
    node = next(o for o in csi if o['kind'] == 'DaemonSet')
    assert node['metadata']['labels']['app.kubernetes.io/component'] == 'node'
    assert next(o for o in csi if o['kind'] == 'Namespace')['metadata']['labels']['pod-security.kubernetes.io/enforce'] == 'privileged'


# --- kstatus and durations ------------------------------------------------------------------------

def test_kstatus_rules():
    deploy = {'apiVersion': 'apps/v1', 'kind': 'Deployment', 'metadata': {'generation': 2},
              'spec': {'replicas': 2}, 'status': {'observedGeneration': 1}}
    assert health.status(deploy) == ('InProgress', 'Deployment generation is 2, but latest observed generation is 1')
    deploy['status'] = {'observedGeneration': 2, 'replicas': 2, 'updatedReplicas': 2, 'availableReplicas': 1, 'readyReplicas': 1}
    assert health.status(deploy) == ('InProgress', 'Available: 1/2')
    deploy['status'].update(availableReplicas=2, readyReplicas=2)
    assert health.status(deploy)[0] == 'Current'
    ds = {'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'metadata': {'generation': 1},
          'status': {'observedGeneration': 1, 'desiredNumberScheduled': 3, 'currentNumberScheduled': 3, 'updatedNumberScheduled': 3,
                     'numberAvailable': 2, 'numberReady': 2}}
    assert health.status(ds) == ('InProgress', 'Available: 2/3')
    stalled = {'apiVersion': 'x.io/v1', 'kind': 'Thing', 'status': {'conditions': [{'type': 'Stalled', 'status': 'True', 'message': 'bad'}]}}
    assert health.status(stalled) == ('Failed', 'bad')
    assert health.status({'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {}})[0] == 'Current'
    assert health.status(None)[0] == 'NotFound'


@pytest.mark.parametrize('text, seconds, back', [('10m', 600, '10m0s'), ('1h30m', 5400, '1h30m0s'), ('30s', 30, '30s'),
                                                 ('500ms', 0.5, '500ms'), ('5m0s', 300, '5m0s'), ('1.5s', 1.5, '1.5s')])
def test_go_durations(text, seconds, back):
    assert durations.parse(text) == seconds
    assert durations.format(seconds) == back


def test_bad_duration_is_refused():
    with pytest.raises(ValueError, match='invalid duration "10 minutes"'):
        durations.parse('10 minutes')


def test_lab_repository_yaml_is_plain_kubernetes_yaml():
    for root, dummy, names in os.walk(LAB_REPO_DIR):
        for name in names:
            if name.endswith('.yaml'):
                with open(os.path.join(root, name), encoding='utf-8') as handle:
                    for doc in yaml.safe_load_all(handle):
                        assert doc is None or ('apiVersion' in doc and 'kind' in doc), (root, name)


def test_a_git_repository_is_served_from_its_commits_not_its_working_tree(tmp_path):
    repo = str(tmp_path / 'repo')
    os.makedirs(os.path.join(repo, 'apps'))
    env = dict(os.environ, GIT_AUTHOR_NAME='t', GIT_AUTHOR_EMAIL='t@t', GIT_COMMITTER_NAME='t', GIT_COMMITTER_EMAIL='t@t')

    def git(*args):
        return subprocess.run(['git', '-C', repo] + list(args), check=True, capture_output=True, text=True, env=env).stdout.strip()

    git('init', '--quiet', '--initial-branch', 'main')
    with open(os.path.join(repo, 'apps', 'a.yaml'), 'w', encoding='utf-8') as handle:
        handle.write('kind: ConfigMap\n')
    with open(os.path.join(repo, '.hidden.yaml'), 'w', encoding='utf-8') as handle:
        handle.write('hidden\n')
    git('add', '--all')
    git('commit', '--quiet', '-m', 'one')
    server = GitServer({'team/repo': repo})
    first = server.fetch('https://git.lab.internal/team/repo.git', {'branch': 'main'})
    assert first.revision == 'main@sha1:%s' % git('rev-parse', 'HEAD')
    assert first.files == {'apps/a.yaml': b'kind: ConfigMap\n'}
    with open(os.path.join(repo, 'apps', 'b.yaml'), 'w', encoding='utf-8') as handle:
        handle.write('kind: Secret\n')
    assert server.fetch('https://git.lab.internal/team/repo.git', {'branch': 'main'}).revision == first.revision  # not committed
    git('add', 'apps/b.yaml')
    git('commit', '--quiet', '-m', 'two')
    second = server.fetch('https://git.lab.internal/team/repo.git', {'branch': 'main'})
    assert second.revision == 'main@sha1:%s' % git('rev-parse', 'HEAD') != first.revision
    assert second.files == {'apps/a.yaml': b'kind: ConfigMap\n', 'apps/b.yaml': b'kind: Secret\n'}
    git('branch', '-m', 'main', 'trunk')
    with pytest.raises(GitError, match='couldn\'t find remote ref "refs/heads/main"'):
        server.fetch('https://git.lab.internal/team/repo.git', {'branch': 'main'})
