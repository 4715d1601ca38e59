"""gitops_commit pushing to an HTTPS Git server whose certificate a private CA signs: the lab's smart-HTTP server
(lab.git_server.SmartGitServer, which runs git http-backend) in this process."""
import os
import tempfile

from ansible_collections.proxtalos.cluster.tests.unit.plugins.modules.test_gitops_commit import git, run, write
from lab.git_server import SmartGitServer
from lab import pki


def test_a_push_to_a_server_of_a_private_ca_trusts_ca_cert_over_the_environment(capsys, monkeypatch, tmp_path):
    """An HTTPS Git server whose certificate a private CA signs (the lab's smart-HTTP server, git http-backend): with
    ca_cert the push trusts that CA, even when the environment names another bundle in GIT_SSL_CAINFO (which beats
    http.sslCAInfo of git's configuration); without it git refuses the server's certificate, and the error says so."""
    ca = pki.make_ca('test-git')
    other = pki.make_ca('another')[0]
    bundle = tmp_path / 'system-bundle.pem'
    bundle.write_text(other)
    monkeypatch.setenv('GIT_SSL_CAINFO', str(bundle))
    with SmartGitServer(str(tmp_path / 'served'), credentials=('flux', 's3cret-git-pw'),
                        tls=pki.issue(ca[0], ca[1], '127.0.0.1', server=True, ip_addresses=['127.0.0.1'])) as server:
        remote = server.create_repo('team/tree')
        work = tmp_path / 'work'
        git(tmp_path, 'init', '--quiet', '--initial-branch', 'main', str(work))
        git(work, 'remote', 'add', 'origin', server.url_for('team/tree'))
        write(str(work / 'e.yaml'), 'kind: SealedSecret\n')
        args = dict(repo_dir=str(work), paths=['e.yaml'], commit_message='seal e', push=True, username='flux', password='s3cret-git-pw')
        refused, dummy = run(capsys, **args)
        assert refused['failed'] and 'git ls-remote failed' in refused['msg'] and 'certificate' in refused['msg'], refused
        result, out = run(capsys, ca_cert=ca[0], **args)
        assert result.get('failed') is None and result['pushed'] is True, result
        assert git(remote, 'rev-parse', 'refs/heads/main') == result['commit'] == git(work, 'rev-parse', 'HEAD')
        assert 's3cret-git-pw' not in out
        assert not [name for name in os.listdir(tempfile.gettempdir()) if name.startswith('proxtalos-git-ca-')]
        wrong, dummy = run(capsys, ca_cert='not a certificate', **args)
        assert wrong['failed'] and wrong['msg'] == 'ca_cert: is not a PEM certificate (no BEGIN CERTIFICATE line)'
