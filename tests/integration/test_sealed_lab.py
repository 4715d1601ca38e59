"""Sealed secrets against the lab after site.yml: a SealedSecret made by the collection (sealed_secret, with the
kept certificate) unseals in the cluster with the managed key for each scope; a controller that started without our
key is caught by the verification, which names the key Secret it uses, and the sealed_secrets stage repairs it."""

import base64
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gitops_lab import gitops_cluster  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import,import-error

from lab.k8s.testing import wait_until  # noqa: E402  pylint: disable=wrong-import-position

kubernetes = pytest.importorskip('kubernetes')
from kubernetes import client  # noqa: E402  pylint: disable=wrong-import-position
from kubernetes.client.rest import ApiException  # noqa: E402  pylint: disable=wrong-import-position

SCOPES = ('strict', 'namespace-wide', 'cluster-wide')
KEY_LABEL = 'sealedsecrets.bitnami.com/sealed-secrets-key'


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
    name, message = run.failures()[0]
    assert 'serves our certificate' in name
    assert 'serves another certificate' in message and 'not ours' in message
    assert '- the served certificate is in Secret kube-system/%s' % generated in message
    result = run.results('serves our certificate')[0]
    assert result['served_by_secret'] == generated and result['served_public_key_sha256'] != result['expected_public_key_sha256']
    # The stage puts our key back, deactivates the other one; the controller restarted picks ours.
    run = gitops_cluster.site('--tags', 'sealed_secrets', '-e', 'sealed_secrets_other_keys=deactivate')
    assert run.rc == 0, run.explain()
    written = run.results("The controller's active key Secret")[0]
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
        assert 'is vault-encrypted; give vault_password or vault_password_file' in refused.failures()[0][1]
    finally:
        try:
            core.delete_namespaced_secret('vault-test-key', 'kube-system')
        except ApiException:
            pass
