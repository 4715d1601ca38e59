"""sealed_key_secret, sealed_cert_gate and flux_gate as Ansible runs them (arguments in, JSON out), against the lab's
Kubernetes API with the Flux simulation (lab.flux.testing.FluxLab), in this process."""
import base64
import json
import os

import pytest


from ansible_collections.proxtalos.cluster.plugins.module_utils import _sealed, _vault
from ansible_collections.proxtalos.cluster.plugins.modules import flux_gate, sealed_cert_gate, sealed_key_secret
from ansible_collections.proxtalos.cluster.tests.unit.broken_keys import flipped_exponent_pem
from module_run import run_main as run

from lab.flux import build
from lab.flux.gitserver import read_tree
from lab.flux.lab import LAB_REPO_DIR
from lab.flux.testing import FluxLab
from lab.k8s.testing import wait_until

pytest.importorskip('kubernetes')

VAULT_PASSWORD = 'vault-pass-for-tests'
KEY_LABEL = 'sealedsecrets.bitnami.com/sealed-secrets-key'


@pytest.fixture(scope='module')
def keypair():
    return _sealed.generate_keypair(2048)


@pytest.fixture
def files(tmp_path, keypair):
    """The kept pair as sealed_key writes it: the key vault-encrypted, a password file."""
    key_pem, cert_pem = keypair
    (tmp_path / 'vault-pass').write_text(VAULT_PASSWORD + '\n')
    (tmp_path / 'sealed-secrets.key').write_bytes(_vault.encrypt(key_pem, VAULT_PASSWORD))
    (tmp_path / 'sealed-secrets.crt').write_bytes(cert_pem)
    return {'private_key_path': str(tmp_path / 'sealed-secrets.key'), 'certificate_path': str(tmp_path / 'sealed-secrets.crt'),
            'vault_password_file': str(tmp_path / 'vault-pass')}


@pytest.fixture
def lab():
    with FluxLab() as flux:
        yield flux


def test_sealed_key_secret_creates_the_active_key_once_and_never_prints_it(lab, files, keypair, capsys):
    key_pem, cert_pem = keypair
    args = dict(files, kubeconfig=lab.kubeconfig)
    code, result, out = run(sealed_key_secret, args, capsys, check_mode=True)
    assert code == 0 and result['changed'] is True and result['operation'] == 'created'
    assert lab.get('v1', 'Secret', 'kube-system', 'sealed-secrets-key') is None
    code, result, out = run(sealed_key_secret, args, capsys, diff=True)
    assert code == 0 and result['changed'] is True and result['secret'] == 'kube-system/sealed-secrets-key'
    body = ''.join(line for line in key_pem.decode().splitlines() if not line.startswith('-----'))
    assert body[:40] not in out and base64.b64encode(key_pem).decode()[:40] not in out
    assert result['diff']['after']['public_key_sha256'] == result['public_key_sha256']
    secret = lab.get('v1', 'Secret', 'kube-system', 'sealed-secrets-key')
    assert secret['type'] == 'kubernetes.io/tls' and secret['metadata']['labels'][KEY_LABEL] == 'active'
    assert base64.b64decode(secret['data']['tls.key']) == key_pem and base64.b64decode(secret['data']['tls.crt']) == cert_pem
    code, result, out = run(sealed_key_secret, args, capsys)
    assert code == 0 and result['changed'] is False and result['operation'] == 'unchanged'


def test_sealed_key_secret_replaces_a_secret_of_another_type_and_updates_a_changed_one(lab, files, keypair, capsys):
    """A Secret of the name that is not kubernetes.io/tls is deleted and created again (a Secret's type cannot
    change); one with other data or without the active label is updated in place, keeping labels of others."""
    key_pem, cert_pem = keypair
    args = dict(files, kubeconfig=lab.kubeconfig)
    lab.apply({'apiVersion': 'v1', 'kind': 'Secret', 'type': 'Opaque',
               'metadata': {'name': 'sealed-secrets-key', 'namespace': 'kube-system', 'labels': {'team': 'platform'}},
               'data': {'tls.key': base64.b64encode(b'not a key').decode()}})
    code, result, out = run(sealed_key_secret, args, capsys, check_mode=True)
    assert code == 0 and result['changed'] is True and result['operation'] == 'updated'
    assert lab.get('v1', 'Secret', 'kube-system', 'sealed-secrets-key')['type'] == 'Opaque'
    code, result, out = run(sealed_key_secret, args, capsys)
    assert code == 0 and result['changed'] is True and result['operation'] == 'updated', result
    secret = lab.get('v1', 'Secret', 'kube-system', 'sealed-secrets-key')
    assert secret['type'] == 'kubernetes.io/tls' and base64.b64decode(secret['data']['tls.key']) == key_pem
    assert secret['metadata']['labels'] == {KEY_LABEL: 'active'}
    lab.apply({'apiVersion': 'v1', 'kind': 'Secret', 'type': 'kubernetes.io/tls',
               'metadata': {'name': 'sealed-secrets-key', 'namespace': 'kube-system', 'labels': {KEY_LABEL: 'compromised', 'team': 'platform'}},
               'data': {'tls.crt': base64.b64encode(cert_pem).decode(), 'tls.key': base64.b64encode(key_pem).decode()}})
    code, result, out = run(sealed_key_secret, args, capsys)
    assert code == 0 and result['changed'] is True and result['operation'] == 'updated', result
    assert lab.get('v1', 'Secret', 'kube-system', 'sealed-secrets-key')['metadata']['labels'] == {KEY_LABEL: 'active', 'team': 'platform'}
    code, result, out = run(sealed_key_secret, args, capsys)
    assert code == 0 and result['changed'] is False and result['operation'] == 'unchanged'


def test_sealed_key_secret_names_the_secret_and_the_api_answer_when_a_write_is_refused(lab, files, capsys, monkeypatch):
    """A write the API refuses fails the task with the Secret, the request and the API's message - never the key."""
    from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client  # pylint: disable=import-outside-toplevel
    sent = []

    def refuse(self, path, query=None, method='GET', body=None, content_type='application/json'):
        if method == 'GET':
            return real(self, path, query)
        sent.append((method, path))
        status = {'kind': 'Status', 'status': 'Failure', 'message': 'secrets is forbidden: admission says no', 'code': 403}
        return 403, json.dumps(status).encode()
    real = k8s_client.KubeClient.request
    monkeypatch.setattr(k8s_client.KubeClient, 'request', refuse)
    code, result, out = run(sealed_key_secret, dict(files, kubeconfig=lab.kubeconfig), capsys)
    assert sent == [('POST', '/api/v1/namespaces/kube-system/secrets')]
    assert code == 1 and result['status'] == 403 and 'kube-system/sealed-secrets-key' in result['msg'], result
    assert 'admission says no' in result['msg'] and 'POST /api/v1/namespaces/kube-system/secrets' in result['msg']
    assert 'BEGIN' not in out and lab.get('v1', 'Secret', 'kube-system', 'sealed-secrets-key') is None


def test_sealed_key_secret_checks_the_keys_numbers_unless_the_keeper_just_did(lab, files, keypair, capsys, tmp_path):
    """A key whose private exponent has one bit flipped still matches its certificate; by default it is refused
    (naming the file) and nothing is written; check_key_consistency=false (the sealed_secrets role passes it only
    right after sealed_key checked the same file in the same run) does not look at the numbers."""
    from cryptography.hazmat.primitives import serialization  # pylint: disable=import-outside-toplevel
    key_pem, cert_pem = keypair
    (tmp_path / 'broken.key').write_bytes(flipped_exponent_pem(serialization.load_pem_private_key(key_pem, password=None)))
    args = dict(kubeconfig=lab.kubeconfig, private_key_path=str(tmp_path / 'broken.key'), certificate_path=files['certificate_path'])
    code, result, out = run(sealed_key_secret, args, capsys)
    assert code == 1 and result['field'] == 'private_key_path' and 'cannot be parsed as a private key' in result['msg'], result
    assert lab.get('v1', 'Secret', 'kube-system', 'sealed-secrets-key') is None
    code, result, out = run(sealed_key_secret, dict(args, check_key_consistency=False), capsys, check_mode=True)
    assert code == 0 and result['operation'] == 'created', result


@pytest.fixture
def warnings(monkeypatch):
    """What the module passes to AnsibleModule.warn (where warnings end up depends on the process)."""
    seen = []
    monkeypatch.setattr(sealed_key_secret.AnsibleModule, 'warn', lambda self, message: seen.append(message))
    return seen


def test_sealed_key_secret_reports_and_deactivates_other_active_keys(lab, files, capsys, warnings):
    other_key, other_cert = _sealed.generate_keypair(2048)
    lab.put_key(other_key, other_cert, name='sealed-secrets-keyabcde')
    args = dict(files, kubeconfig=lab.kubeconfig)
    code, result, out = run(sealed_key_secret, args, capsys)
    assert code == 0 and result['other_active_keys'] == ['sealed-secrets-keyabcde'] and result['deactivated'] == []
    assert any('sealed-secrets-keyabcde' in w for w in warnings)
    code, result, out = run(sealed_key_secret, dict(args, other_keys='deactivate'), capsys)
    assert code == 0 and result['changed'] is True and result['deactivated'] == ['sealed-secrets-keyabcde']
    assert lab.get('v1', 'Secret', 'kube-system', 'sealed-secrets-keyabcde')['metadata']['labels'][KEY_LABEL] == 'compromised'


def test_sealed_key_secret_refuses_a_pair_that_does_not_match(lab, files, capsys, tmp_path):
    other_key, other_cert = _sealed.generate_keypair(2048)
    del other_key
    (tmp_path / 'sealed-secrets.crt').write_bytes(other_cert)
    code, result, out = run(sealed_key_secret, dict(files, kubeconfig=lab.kubeconfig), capsys)
    assert code == 1 and result['field'] == 'certificate_path' and 'does not match' in result['msg']
    assert lab.get('v1', 'Secret', 'kube-system', 'sealed-secrets-key') is None
    wrong = dict((k, v) for k, v in files.items() if k != 'vault_password_file')
    code, result, out = run(sealed_key_secret, dict(wrong, kubeconfig=lab.kubeconfig, vault_password='wrong'), capsys)
    assert code == 1 and result.get('field') == 'vault_password', result


def start_controller(lab):
    for obj in build.build(read_tree(LAB_REPO_DIR), './infrastructure/sealed-secrets'):
        lab.apply(obj)


def test_sealed_cert_gate_passes_on_our_certificate_and_names_the_key_otherwise(lab, keypair, capsys, tmp_path):
    key_pem, cert_pem = keypair
    cert_path = tmp_path / 'ours.crt'
    cert_path.write_bytes(cert_pem)
    args = {'kubeconfig': lab.kubeconfig, 'certificate_path': str(cert_path), 'wait_timeout': 0}
    code, result, out = run(sealed_cert_gate, args, capsys)
    assert code == 1 and 'Service kube-system/sealed-secrets-controller not found' in result['msg']
    lab.put_key(key_pem, cert_pem)
    start_controller(lab)
    code, result, out = run(sealed_cert_gate, dict(args, wait_timeout=30, wait_sleep=0.2), capsys)
    assert code == 0 and result['passed'] and result['served_public_key_sha256'] == result['expected_public_key_sha256']
    assert result['url_path'] == '/api/v1/namespaces/kube-system/services/http:sealed-secrets-controller:http/proxy/v1/cert.pem'
    # a controller that started on a key of its own
    lab.delete('v1', 'Secret', 'kube-system', 'sealed-secrets-key')
    for pod in lab.items('v1', 'Pod', 'kube-system'):
        if pod['metadata']['name'].startswith('sealed-secrets-controller-'):
            lab.delete('v1', 'Pod', 'kube-system', pod['metadata']['name'])
    wait_until(lambda: (lab.call(lab.flux.sealed.status)['generated'] != [], lab.call(lab.flux.sealed.status)),
               timeout=60, what='the controller generating its own key')
    code, result, out = run(sealed_cert_gate, dict(args, wait_timeout=30, wait_sleep=0.2), capsys)
    generated = lab.call(lab.flux.sealed.status)['generated'][0]
    assert code == 1 and result['served_by_secret'] == generated
    assert 'serves another certificate' in result['msg'] and '- the served certificate is in Secret kube-system/%s' % generated in result['msg']
    assert result['attempts'] == 1


def test_flux_gate_passes_on_a_ready_tree_and_names_the_blocker(lab, capsys):
    lab.install_components()
    lab.sync()
    args = {'kubeconfig': lab.kubeconfig, 'namespace': 'flux-system', 'names': ['flux-system', 'apps'], 'wait_timeout': 60, 'wait_sleep': 0.5}
    code, result, out = run(flux_gate, args, capsys)
    # lab/gitops: flux-system, sealed-secrets, flux-credentials, proxmox-ccm, proxmox-csi, cert-manager, cert-manager-issuers, apps
    assert code == 0 and result['passed'] and result['summary'] == 'Kustomizations Ready 8/8', result.get('msg')
    assert result['order'][-1] == ['flux-system/apps']
    lab.call(lab.flux.flux.set_health_fault, 'flux-system', 'proxmox-ccm', True)
    lab.wait_condition('proxmox-ccm', 'HealthCheckFailed')
    lab.reconcile('proxmox-csi')
    lab.wait_condition('proxmox-csi', 'DependencyNotReady')
    code, result, out = run(flux_gate, dict(args, wait_timeout=1), capsys)
    assert code == 1 and result['blockers'][0]['name'] == 'flux-system/proxmox-ccm', result['msg']
    assert result['blockers'][0]['blocks'] == ['flux-system/proxmox-csi'], result['msg']
    assert "- flux-system/proxmox-csi waits on flux-system/proxmox-ccm (Ready=False DependencyNotReady: dependency " \
           "'flux-system/proxmox-ccm' is not ready)" in result['msg']
    code, result, out = run(flux_gate, args, capsys, check_mode=True)
    assert code == 1 and result['attempts'] == 1 and result['changed'] is False, result.get('msg')
    code, result, out = run(flux_gate, dict(args, names=['apps']), capsys, check_mode=True)
    assert result['kustomizations'][0]['name'] == 'flux-system/cert-manager'


def test_flux_gate_refuses_a_name_without_namespace(capsys, tmp_path):
    kubeconfig = tmp_path / 'kubeconfig'
    kubeconfig.write_text('apiVersion: v1\nkind: Config\n')
    code, result, out = run(flux_gate, {'kubeconfig': str(kubeconfig), 'names': ['apps']}, capsys)
    assert code == 1 and result['field'] == 'names' and 'has no namespace' in result['msg']
    assert os.path.exists(str(kubeconfig))
