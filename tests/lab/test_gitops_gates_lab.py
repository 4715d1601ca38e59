"""sealed_cert_gate and flux_gate as Ansible runs them (arguments in, JSON out), against the lab's Kubernetes API with
the Flux simulation (lab.flux.testing.FluxLab: the sealed-secrets controller serving its certificate through the
service proxy, Flux's Kustomizations with their dependencies), in this process."""
import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _sealed
from ansible_collections.proxtalos.cluster.plugins.modules import flux_gate, sealed_cert_gate
from ansible_collections.proxtalos.cluster.tests.helpers import run_main as run, wait_until
from lab.flux import build
from lab.flux.gitserver import read_tree
from lab.flux.lab import LAB_REPO_DIR
from lab.flux.testing import FluxLab

pytest.importorskip('kubernetes')


@pytest.fixture(scope='module')
def keypair():
    return _sealed.generate_keypair(2048)


@pytest.fixture
def lab():
    with FluxLab() as flux:
        yield flux


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
               'the controller generating its own key', timeout=60, interval=0.05)
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
