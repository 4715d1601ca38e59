"""gitops_commit against real Git repositories in a temporary folder: commit only the given paths, nothing to do on a
re-run, check mode writes nothing, push to a remote (a bare repository) and retry of a missed push, bad input named."""
import base64
import os
import subprocess

import pytest

from ansible_collections.proxtalos.cluster.plugins.modules import gitops_commit
from ansible_collections.proxtalos.cluster.tests.helpers import run_module

IDENTITY = dict(GIT_AUTHOR_NAME='t', GIT_AUTHOR_EMAIL='t@t', GIT_COMMITTER_NAME='t', GIT_COMMITTER_EMAIL='t@t')


def run(capsys, **args):
    return run_module(gitops_commit, capsys, **args)


def git(repo, *args):
    return subprocess.run(['git', '-C', str(repo)] + list(args), check=True, capture_output=True, text=True,
                          env=dict(os.environ, **IDENTITY)).stdout.strip()


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write(text)


@pytest.fixture
def repos(tmp_path):
    """(working copy cloned from a bare remote, the bare remote)."""
    remote = tmp_path / 'remote.git'
    git(tmp_path, 'init', '--quiet', '--bare', '--initial-branch', 'main', str(remote))
    work = tmp_path / 'work'
    git(tmp_path, 'clone', '--quiet', str(remote), str(work))
    git(work, 'checkout', '--quiet', '-b', 'main')
    write(str(work / 'README.md'), 'tree\n')
    git(work, 'add', 'README.md')
    git(work, 'commit', '--quiet', '-m', 'first')
    git(work, 'push', '--quiet', 'origin', 'main')
    return work, remote


def test_commits_only_the_given_paths_and_a_rerun_changes_nothing(capsys, repos):
    work, dummy = repos
    write(str(work / 'infra' / 'a.sealedsecret.yaml'), 'kind: SealedSecret\n')
    write(str(work / 'unrelated.txt'), 'work in progress\n')
    result, dummy = run(capsys, repo_dir=str(work), paths=['infra/a.sealedsecret.yaml'], commit_message='seal a')
    assert result['changed'] is True and result['committed'] == ['infra/a.sealedsecret.yaml'] and result['pushed'] is False
    assert result['commit'] == git(work, 'rev-parse', 'HEAD') and result['branch'] == 'main'
    assert git(work, 'show', '--name-only', '--format=%s|%an', 'HEAD').splitlines() == ['seal a|proxtalos', '', 'infra/a.sealedsecret.yaml']
    assert git(work, 'status', '--porcelain') == '?? unrelated.txt'
    again, dummy = run(capsys, repo_dir=str(work), paths=['infra/a.sealedsecret.yaml'], commit_message='seal a')
    assert again['changed'] is False and again['committed'] == [] and again['commit'] == result['commit']


def test_check_mode_predicts_and_writes_nothing(capsys, repos):
    work, dummy = repos
    head = git(work, 'rev-parse', 'HEAD')
    write(str(work / 'b.yaml'), 'kind: SealedSecret\n')
    result, dummy = run(capsys, repo_dir=str(work), paths=[str(work / 'b.yaml')], commit_message='seal b', _ansible_check_mode=True)
    assert result['changed'] is True and result['committed'] == ['b.yaml'] and result['commit'] == head
    assert git(work, 'rev-parse', 'HEAD') == head and git(work, 'status', '--porcelain') == '?? b.yaml'


def test_push_sends_the_commit_and_retries_a_missed_push(capsys, repos):
    work, remote = repos
    write(str(work / 'c.yaml'), 'kind: SealedSecret\n')
    result, dummy = run(capsys, repo_dir=str(work), paths=['c.yaml'], commit_message='seal c', push=True)
    assert result['changed'] is True and result['pushed'] is True
    assert git(remote, 'rev-parse', 'refs/heads/main') == result['commit']
    again, dummy = run(capsys, repo_dir=str(work), paths=['c.yaml'], commit_message='seal c', push=True)
    assert again['changed'] is False and again['pushed'] is False
    # a commit that never reached the remote (an earlier run failed to push) is pushed by the next run
    write(str(work / 'c.yaml'), 'kind: SealedSecret # 2\n')
    git(work, 'commit', '--quiet', '-am', 'local only')
    missed, dummy = run(capsys, repo_dir=str(work), paths=['c.yaml'], commit_message='seal c', push=True)
    assert missed['changed'] is True and missed['committed'] == [] and missed['pushed'] is True
    assert git(remote, 'rev-parse', 'refs/heads/main') == git(work, 'rev-parse', 'HEAD')


def test_credentials_go_to_git_through_the_environment_and_are_masked(capsys, repos):
    environment = gitops_commit.auth_environment('flux', 's3cret-token')
    assert environment['GIT_CONFIG_KEY_0'] == 'http.extraHeader'
    assert environment['GIT_CONFIG_VALUE_0'] == 'Authorization: Basic ' + base64.b64encode(b'flux:s3cret-token').decode()
    assert gitops_commit.auth_environment('flux', '') == {}
    work, dummy = repos
    write(str(work / 'd.yaml'), 'x\n')
    result, out = run(capsys, repo_dir=str(work), paths=['d.yaml'], commit_message='d', push=True, username='flux', password='s3cret-token')
    assert result['pushed'] is True  # the local remote ignores the header, the push itself works
    assert 's3cret-token' not in out and base64.b64encode(b'flux:s3cret-token').decode() not in out


def test_a_failed_push_names_the_remote_and_gits_error_without_the_urls_credentials(capsys, repos):
    work, dummy = repos
    # nothing listens on port 9 (discard) of loopback: git cannot connect
    git(work, 'remote', 'add', 'unreachable', 'https://flux:s3cret-in-url@127.0.0.1:9/proxtalos/tree.git')
    write(str(work / 'e.yaml'), 'x\n')
    result, out = run(capsys, repo_dir=str(work), paths=['e.yaml'], commit_message='e', push=True, remote='unreachable')
    assert result['failed'] and result['msg'].startswith('git ls-remote failed in %s (rc 128): ' % work)
    assert '127.0.0.1' in result['msg'] and 's3cret-in-url' not in out
    assert gitops_commit.without_userinfo("fatal: unable to access 'https://u:p@git.example:8443/r.git/': 503") == \
        "fatal: unable to access 'https://git.example:8443/r.git/': 503"
    assert gitops_commit.without_userinfo('ssh://git@host/r.git and git@host:r.git') == 'ssh://host/r.git and git@host:r.git'


def test_bad_input_is_named(capsys, repos, tmp_path):
    work, dummy = repos
    result, dummy = run(capsys, repo_dir=str(tmp_path / 'nowhere'), paths=['a'], commit_message='m')
    assert result['failed'] and result['msg'].startswith('repo_dir: ') and 'not a directory' in result['msg']
    plain = tmp_path / 'plain'
    plain.mkdir()
    result, dummy = run(capsys, repo_dir=str(plain), paths=['a'], commit_message='m')
    assert result['failed'] and 'is not inside a Git working copy' in result['msg']
    result, dummy = run(capsys, repo_dir=str(work), paths=['../outside.yaml'], commit_message='m')
    assert result['failed'] and result['msg'].startswith('paths[0]: ') and 'not inside the repository' in result['msg']
    result, dummy = run(capsys, repo_dir=str(work), paths=['a'], commit_message='m', branch='trunk')
    assert result['failed'] and result['msg'] == 'branch: %s has branch main checked out, not trunk' % work
    result, dummy = run(capsys, repo_dir=str(work), paths=['a'], commit_message='m', password='x')
    assert result['failed'] and result['msg'] == 'username: is required with password (HTTP basic auth)'


def test_porcelain_parsing_handles_renames():
    assert gitops_commit.changed_paths('R  new.yaml\0old.yaml\0?? x y.yaml\0') == ['new.yaml', 'x y.yaml']
