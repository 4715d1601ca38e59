"""Sealed secrets against the lab after site.yml: the flux stage seals the CSI config and the Git credentials into the
GitOps repository, commits them, the lab's controller unseals them and the CSI comes up on them, a re-run leaves the
files byte for byte and a changed value is sealed again; a SealedSecret made by the collection (sealed_secret, with
the kept certificate) unseals in the cluster with the managed key for each scope; a controller that started without
our key is caught by the verification, which names the key Secret it uses, and the sealed_secrets stage repairs it."""

import base64
import json
import os
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gitops_lab import gitops_cluster  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import,import-error

from ansible_collections.proxtalos.cluster.tests.helpers import wait_until  # noqa: E402  pylint: disable=wrong-import-position

kubernetes = pytest.importorskip('kubernetes')
from kubernetes import client  # noqa: E402  pylint: disable=wrong-import-position
from kubernetes.client.rest import ApiException  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.proxtalos.cluster.plugins.module_utils import _sealed  # noqa: E402  pylint: disable=wrong-import-position

SCOPES = ('strict', 'namespace-wide', 'cluster-wide')
KEY_LABEL = 'sealedsecrets.bitnami.com/sealed-secrets-key'
CSI_FILE = 'infrastructure/proxmox-csi/proxmox-csi-plugin.sealedsecret.yaml'
GIT_FILE = 'infrastructure/flux-credentials/flux-system.sealedsecret.yaml'


def repo_of(cluster):
    return os.path.join(cluster.lab.run_dir, 'gitops')


def git(repo, *args):
    return subprocess.run(['git', '-C', repo] + list(args), capture_output=True, text=True, check=True).stdout.strip()


def read_bytes(path):
    with open(path, 'rb') as handle:
        return handle.read()


def unseal_file(cluster, path):
    """{key: plain bytes} of a sealed file of the repository, opened with the kept private key."""
    with open(os.path.join(cluster.secrets, 'sealed-secrets.key'), 'rb') as handle:
        private_key = _sealed.load_private_key(handle.read())
    return _sealed.unseal(yaml.safe_load(read_bytes(path)), [private_key])


def git_token(cluster):
    with open(os.path.join(cluster.lab.run_dir, 'git-token'), encoding='utf-8') as handle:
        return handle.read().strip()


def test_the_flux_stage_seals_the_csi_config_and_the_git_credentials_into_the_repository(gitops_cluster):
    assert gitops_cluster.first.rc == 0, gitops_cluster.first.explain()
    repo = repo_of(gitops_cluster)
    token, pve_token = git_token(gitops_cluster), gitops_cluster.lab.token_secret
    # committed (nothing of them left uncommitted), with the stage's message, and served: Flux applied that commit
    assert git(repo, 'status', '--porcelain', '--', CSI_FILE, GIT_FILE) == ''
    assert git(repo, 'log', '-1', '--format=%s', '--', CSI_FILE) == 'proxtalos: sealed Secrets of cluster lab'
    head = git(repo, 'rev-parse', 'HEAD')
    custom = client.CustomObjectsApi(gitops_cluster.api())
    source = custom.get_namespaced_custom_object('source.toolkit.fluxcd.io', 'v1', 'flux-system', 'gitrepositories', 'flux-system')
    assert source['status']['artifact']['revision'] == 'main@sha1:%s' % head
    # the files hold no plain value, and unseal with the kept key to exactly what the inventory gives
    for name in (CSI_FILE, GIT_FILE):
        text = read_bytes(os.path.join(repo, name)).decode()
        assert token not in text and pve_token not in text and base64.b64encode(token.encode()).decode() not in text
    config = yaml.safe_load(unseal_file(gitops_cluster, os.path.join(repo, CSI_FILE))['config.yaml'])
    assert config == {'clusters': [{'url': 'https://%s:%d/api2/json' % (gitops_cluster.lab.pve_host, gitops_cluster.lab.pve_port),
                                    'insecure': False, 'token_id': 'proxtalos@pve!proxtalos', 'token_secret': pve_token, 'region': 'lab'}]}
    credentials = {'username': b'flux', 'password': token.encode()}
    # a Git server of a private CA (the upstream Flux world's, lab_git_ca_file -> flux_git_ca_cert, read with the file
    # lookup, which strips the trailing newline): its CA goes along
    ca_file = (gitops_cluster.hosts['cluster'].get('vars') or {}).get('lab_git_ca_file')
    if ca_file:
        credentials['ca.crt'] = read_bytes(ca_file).rstrip()
    assert unseal_file(gitops_cluster, os.path.join(repo, GIT_FILE)) == credentials
    # the lab's controller unsealed both into Secrets it owns; the CSI controller runs on its config
    core = client.CoreV1Api(gitops_cluster.api())
    csi = core.read_namespaced_secret('proxmox-csi-plugin', 'csi-proxmox')
    assert yaml.safe_load(base64.b64decode(csi.data['config.yaml'])) == config
    assert [(r.kind, r.name) for r in csi.metadata.owner_references] == [('SealedSecret', 'proxmox-csi-plugin')]
    credentials = core.read_namespaced_secret('flux-system', 'flux-system')
    assert base64.b64decode(credentials.data['password']).decode() == token
    assert [(r.kind, r.name) for r in credentials.metadata.owner_references] == [('SealedSecret', 'flux-system')]
    assert credentials.metadata.annotations['sealedsecrets.bitnami.com/managed'] == 'true'
    for namespace, name in (('csi-proxmox', 'proxmox-csi-plugin'), ('flux-system', 'flux-system')):
        sealed = custom.get_namespaced_custom_object('bitnami.com', 'v1alpha1', namespace, 'sealedsecrets', name)
        assert [(c['type'], c['status']) for c in sealed['status']['conditions']] == [('Synced', 'True')]
    csi_ks = custom.get_namespaced_custom_object('kustomize.toolkit.fluxcd.io', 'v1', 'flux-system', 'kustomizations', 'proxmox-csi')
    assert {'id': 'csi-proxmox_proxmox-csi-plugin_bitnami.com_SealedSecret', 'v': 'v1alpha1'} in csi_ks['status']['inventory']['entries']
    assert client.AppsV1Api(gitops_cluster.api()).read_namespaced_deployment(
        'proxmox-csi-plugin-controller', 'csi-proxmox').status.available_replicas == 1
    # the plain values never reached the output
    printed = json.dumps(gitops_cluster.first.data)
    assert token not in printed and pve_token not in printed


def test_a_rerun_leaves_the_sealed_files_byte_for_byte_and_commits_nothing(gitops_cluster):
    repo = repo_of(gitops_cluster)
    before = dict((name, read_bytes(os.path.join(repo, name))) for name in (CSI_FILE, GIT_FILE))
    head = git(repo, 'rev-parse', 'HEAD')
    run = gitops_cluster.site('--tags', 'flux,gitops')
    assert run.rc == 0, run.explain()
    assert set(run.changed().values()) == {0}, run.changed()
    assert dict((name, read_bytes(os.path.join(repo, name))) for name in before) == before
    assert git(repo, 'rev-parse', 'HEAD') == head
    checked = gitops_cluster.site('--check', '--tags', 'flux')
    assert checked.rc == 0 and set(checked.changed().values()) == {0}, checked.explain()


def test_a_changed_value_is_sealed_again_committed_and_reaches_the_cluster(gitops_cluster, tmp_path):
    repo = repo_of(gitops_cluster)
    before = read_bytes(os.path.join(repo, CSI_FILE))
    head = git(repo, 'rev-parse', 'HEAD')
    changed = [{'name': 'proxmox-csi-plugin', 'namespace': 'csi-proxmox', 'path': CSI_FILE,
                'string_data': {'config.yaml': 'clusters: []\n'}}]
    extra = tmp_path / 'changed.yml'
    extra.write_text(yaml.safe_dump({'flux_sealed_secrets': changed}))
    try:
        predicted = gitops_cluster.site('--check', '--tags', 'flux', '-e', '@%s' % extra)
        assert predicted.rc == 0, predicted.explain()
        assert predicted.result_values('Seal the Secrets into the GitOps working copy')[0]['changed'] is True
        assert read_bytes(os.path.join(repo, CSI_FILE)) == before and git(repo, 'rev-parse', 'HEAD') == head
        run = gitops_cluster.site('--tags', 'flux', '-e', '@%s' % extra)
        assert run.rc == 0, run.explain()
        commit = run.result_values('Commit the sealed Secrets')[0]
        assert commit['changed'] is True
        assert git(repo, 'rev-parse', 'HEAD') != head and git(repo, 'rev-parse', 'HEAD~1') == head
        assert git(repo, 'show', '--name-only', '--format=', 'HEAD').splitlines() == [CSI_FILE]
        core = client.CoreV1Api(gitops_cluster.api())
        wait_until(lambda: (base64.b64decode(core.read_namespaced_secret('proxmox-csi-plugin', 'csi-proxmox').data['config.yaml'])
                            == b'clusters: []\n', 'not yet unsealed'), timeout=60, what='the changed CSI Secret in the cluster')
    finally:
        restored = gitops_cluster.site('--tags', 'flux,gitops')
    assert restored.rc == 0, restored.explain()
    assert unseal_file(gitops_cluster, os.path.join(repo, CSI_FILE))['config.yaml'] != b'clusters: []\n'


def test_a_sealedsecret_made_by_the_collection_unseals_with_the_managed_key_in_each_scope(gitops_cluster, tmp_path):
    assert gitops_cluster.first.rc == 0, gitops_cluster.first.explain()
    tasks = [{'name': 'Namespace for the test', 'kubernetes.core.k8s': {
        'kubeconfig': gitops_cluster.kubeconfig, 'state': 'present',
        'definition': {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'sealed-test'}}}}]
    for scope in SCOPES:
        dest = str(tmp_path / ('%s.yaml' % scope))
        tasks.append({'name': 'Seal (%s)' % scope, 'proxtalos.cluster.sealed_secret': {
            'certificate_path': '{{ inventory_dir }}/secrets/sealed-secrets.crt',
            'private_key_path': '{{ inventory_dir }}/secrets/sealed-secrets.key',
            'scope': scope, 'dest': dest, 'name': 'db-%s' % scope, 'namespace': 'sealed-test',
            'string_data': {'password': 'pw-%s' % scope}}})
        tasks.append({'name': 'Apply (%s)' % scope, 'kubernetes.core.k8s': {'kubeconfig': gitops_cluster.kubeconfig, 'state': 'present',
                                                                            'src': dest}})
    run = gitops_cluster.tasks('seal', tasks)
    assert run.rc == 0, run.explain()
    core = client.CoreV1Api(gitops_cluster.api())
    for scope in SCOPES:
        name = 'db-%s' % scope

        def unsealed(name=name):
            try:
                return True, core.read_namespaced_secret(name, 'sealed-test')
            except ApiException as exc:
                return False, exc.status
        secret = wait_until(unsealed, timeout=30, what='Secret sealed-test/%s unsealed by the controller' % name)
        assert base64.b64decode(secret.data['password']).decode() == 'pw-%s' % scope
        assert secret.metadata.owner_references[0].kind == 'SealedSecret'
    rerun = gitops_cluster.tasks('seal', tasks)
    assert rerun.rc == 0 and set(rerun.changed().values()) == {0}, rerun.explain()


def test_a_controller_on_another_key_is_caught_and_the_stage_repairs_it(gitops_cluster):
    assert gitops_cluster.first.rc == 0, gitops_cluster.first.explain()
    core = client.CoreV1Api(gitops_cluster.api())
    # The controller starts while our key Secret is missing: it generates its own key and seals with it.
    core.delete_namespaced_secret('sealed-secrets-key', 'kube-system')
    selector = 'app.kubernetes.io/name=sealed-secrets'
    core.delete_collection_namespaced_pod('kube-system', label_selector=selector)

    def own_key():
        names = [s.metadata.name for s in core.list_namespaced_secret('kube-system', label_selector='%s=active' % KEY_LABEL).items]
        return len(names) == 1 and names[0] != 'sealed-secrets-key', names
    generated = wait_until(own_key, timeout=60, what='the controller generating its own key')[0]
    run = gitops_cluster.site('--tags', 'gitops', '-e', 'sealed_secrets_verify_timeout=5')
    assert run.rc != 0
    name, message = run.failure_messages()[0]
    assert 'serves our certificate' in name
    assert 'serves another certificate' in message and 'not ours' in message
    assert '- the served certificate is in Secret kube-system/%s' % generated in message
    result = run.result_values('serves our certificate')[0]
    assert result['served_by_secret'] == generated and result['served_public_key_sha256'] != result['expected_public_key_sha256']
    # The stage puts our key back, deactivates the other one; the controller restarted picks ours.
    run = gitops_cluster.site('--tags', 'sealed_secrets', '-e', 'sealed_secrets_other_keys=deactivate')
    assert run.rc == 0, run.explain()
    written = run.result_values("The controller's active key Secret")[0]
    assert written['operation'] == 'created' and written['deactivated'] == [generated]
    core.delete_collection_namespaced_pod('kube-system', label_selector=selector)
    run = gitops_cluster.site('--tags', 'gitops')
    assert run.rc == 0, run.explain()
    labels = core.read_namespaced_secret(generated, 'kube-system').metadata.labels
    assert labels[KEY_LABEL] == 'compromised'


def test_with_a_vault_password_the_key_is_kept_encrypted_and_still_reaches_the_cluster(gitops_cluster, tmp_path):
    """ansible-playbook --vault-password-file (here its environment form): the kept key is an Ansible Vault envelope."""
    assert gitops_cluster.first.rc == 0, gitops_cluster.first.explain()
    password_file = tmp_path / 'vault-pass'
    password_file.write_text('correct horse battery staple\n')
    kept = tmp_path / 'secrets'
    args = ('--tags', 'sealed_secrets', '-e', 'sealed_secrets_dir=%s' % kept, '-e', 'sealed_secrets_secret_name=vault-test-key')
    core = client.CoreV1Api(gitops_cluster.api())
    try:
        run = gitops_cluster.site(*args, env={'ANSIBLE_VAULT_PASSWORD_FILE': str(password_file)})
        assert run.rc == 0, run.explain()
        key_file = (kept / 'sealed-secrets.key').read_bytes()
        assert key_file.startswith(b'$ANSIBLE_VAULT;1.1;AES256') and oct((kept / 'sealed-secrets.key').stat().st_mode & 0o777) == '0o600'
        secret = core.read_namespaced_secret('vault-test-key', 'kube-system')
        assert base64.b64decode(secret.data['tls.key']).startswith(b'-----BEGIN RSA PRIVATE KEY-----')
        assert base64.b64decode(secret.data['tls.crt']) == (kept / 'sealed-secrets.crt').read_bytes()
        again = gitops_cluster.site(*args, env={'ANSIBLE_VAULT_PASSWORD_FILE': str(password_file)})
        assert again.rc == 0 and set(again.changed().values()) == {0}, again.explain()
        refused = gitops_cluster.site(*args)
        assert refused.rc != 0
        assert 'is vault-encrypted; give vault_password or vault_password_file' in refused.failure_messages()[0][1]
    finally:
        try:
            core.delete_namespaced_secret('vault-test-key', 'kube-system')
        except ApiException:
            pass
