"""talos_kubeconfig: fetched, pointed at the endpoint, 0600; kept while good (a fetch always differs); no key out."""
import base64
import datetime
import os
import stat

import pytest
import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import pki
from ansible_collections.proxtalos.cluster.plugins.modules import talos_kubeconfig

from ansible_collections.proxtalos.cluster.tests.helpers import assert_no_secret, run_module
from talos_module_helpers import FakeCluster, FakeNode, make_talosconfig


@pytest.fixture(scope='module')
def talosconfig():
    return make_talosconfig()


class KubeconfigIssuer(object):
    """What Talos does on each Kubeconfig call: a new client certificate from the cluster CA."""

    def __init__(self, validity_days=365, accepted_cas=0):
        self.ca_crt, self.ca_key = pki.new_kubernetes_ca()
        # cluster.acceptedCAs come first in certificate-authority-data, the issuing CA last
        # (siderolabs/talos v1.13.9 pkg/kubeconfig/generate.go:36-40, 101)
        self.bundle = b''.join([pki.new_kubernetes_ca()[0] for dummy in range(accepted_cas)] + [self.ca_crt])
        self.validity = datetime.timedelta(days=validity_days)
        self.keys = []

    def __call__(self):
        crt, key = pki.new_client_certificate(self.ca_crt, self.ca_key, validity=self.validity)
        self.keys.append(key)

        def b64(pem):
            return base64.b64encode(pem).decode('ascii')
        document = {
            'apiVersion': 'v1', 'kind': 'Config',
            'clusters': [{'name': 'demo', 'cluster': {'server': 'https://10.5.0.10:6443', 'certificate-authority-data': b64(self.bundle)}}],
            'users': [{'name': 'admin@demo', 'user': {'client-certificate-data': b64(crt), 'client-key-data': b64(key)}}],
            'contexts': [{'name': 'admin@demo', 'context': {'cluster': 'demo', 'namespace': 'default', 'user': 'admin@demo'}}],
            'current-context': 'admin@demo',
        }
        return yaml.safe_dump(document).encode()


def install(monkeypatch, issuer):
    node = FakeNode('10.5.0.11')
    node.kubeconfig = issuer
    FakeCluster(node).install(monkeypatch)
    return node


def args(talosconfig, dest, **extra):
    values = dict(node='10.5.0.11', talosconfig_content=talosconfig[0], dest=dest, endpoint='10.5.0.10',
                  wait_timeout=1, wait_sleep=0.01)
    values.update(extra)
    return values


def read(path):
    with open(path) as handle:
        return yaml.safe_load(handle)


def test_written_then_kept_while_good(capsys, monkeypatch, talosconfig, tmp_path):
    issuer = KubeconfigIssuer()
    install(monkeypatch, issuer)
    dest = str(tmp_path / 'artifacts' / 'kubeconfig')
    checked, _out = run_module(talos_kubeconfig, capsys, _ansible_check_mode=True, **args(talosconfig, dest))
    assert checked['changed'] is True and not os.path.exists(dest)
    result, out = run_module(talos_kubeconfig, capsys, **args(talosconfig, dest))
    assert result['changed'] is True and result['outcome'] == 'written'
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o600
    assert read(dest)['clusters'][0]['cluster']['server'] == 'https://10.5.0.10:6443' == result['server']
    assert_no_secret(out, issuer.keys)
    with open(dest) as handle:
        content = handle.read()

    again, out = run_module(talos_kubeconfig, capsys, _ansible_diff=True, **args(talosconfig, dest))
    assert again['changed'] is False and again['outcome'] == 'kept'
    with open(dest) as handle:
        assert handle.read() == content
    assert_no_secret(out, issuer.keys)


def test_kept_with_accepted_cas_before_the_issuing_ca(capsys, monkeypatch, talosconfig, tmp_path):
    # audit finding 12: the client certificate is signed by the last CA of the bundle, not the first
    install(monkeypatch, KubeconfigIssuer(accepted_cas=1))
    dest = str(tmp_path / 'kubeconfig')
    first, _out = run_module(talos_kubeconfig, capsys, **args(talosconfig, dest))
    assert first['changed'] is True
    again, _out = run_module(talos_kubeconfig, capsys, **args(talosconfig, dest))
    assert again['changed'] is False and again['outcome'] == 'kept', again.get('reason')


def test_server_change_rewrites(capsys, monkeypatch, talosconfig, tmp_path):
    install(monkeypatch, KubeconfigIssuer())
    dest = str(tmp_path / 'kubeconfig')
    run_module(talos_kubeconfig, capsys, **args(talosconfig, dest))
    moved, _out = run_module(talos_kubeconfig, capsys, **args(talosconfig, dest, endpoint='https://api.demo.example:6443'))
    assert moved['changed'] is True and 'not https://api.demo.example:6443' in moved['reason']
    assert read(dest)['clusters'][0]['cluster']['server'] == 'https://api.demo.example:6443'


def test_new_cluster_ca_rewrites(capsys, monkeypatch, talosconfig, tmp_path):
    dest = str(tmp_path / 'kubeconfig')
    install(monkeypatch, KubeconfigIssuer())
    run_module(talos_kubeconfig, capsys, **args(talosconfig, dest))
    install(monkeypatch, KubeconfigIssuer())
    result, _out = run_module(talos_kubeconfig, capsys, **args(talosconfig, dest))
    assert result['changed'] is True and 'cluster CA differs' in result['reason']


def test_expiring_certificate_rewrites(capsys, monkeypatch, talosconfig, tmp_path):
    dest = str(tmp_path / 'kubeconfig')
    install(monkeypatch, KubeconfigIssuer(validity_days=10))
    run_module(talos_kubeconfig, capsys, **args(talosconfig, dest))
    result, _out = run_module(talos_kubeconfig, capsys, **args(talosconfig, dest))
    assert result['changed'] is True and 'less than 30 days left' in result['reason']
    kept, _out = run_module(talos_kubeconfig, capsys, **args(talosconfig, dest, renew_before_days=5))
    assert kept['changed'] is False


def test_loose_mode_is_fixed_without_refetching_content(capsys, monkeypatch, talosconfig, tmp_path):
    dest = str(tmp_path / 'kubeconfig')
    install(monkeypatch, KubeconfigIssuer())
    run_module(talos_kubeconfig, capsys, **args(talosconfig, dest))
    with open(dest) as handle:
        content = handle.read()
    os.chmod(dest, 0o644)
    result, _out = run_module(talos_kubeconfig, capsys, **args(talosconfig, dest))
    assert result['changed'] is True and result['outcome'] == 'kept'
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o600
    with open(dest) as handle:
        assert handle.read() == content


def test_not_served_yet_is_retried_until_the_deadline(capsys, monkeypatch, talosconfig, tmp_path):
    from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors

    def not_yet():
        raise talos_errors.from_status('10.5.0.11:50000', '/machine.MachineService/Kubeconfig', 14, 'etcd is not running')
    install(monkeypatch, not_yet)
    result, _out = run_module(talos_kubeconfig, capsys, **args(talosconfig, str(tmp_path / 'k'), wait_timeout=0.2))
    assert result['failed'] is True and 'no kubeconfig within' in result['msg'] and 'etcd is not running' in result['msg']


def test_with_artifacts_vault_password_the_kubeconfig_is_a_vault_envelope_kept_while_good(capsys, monkeypatch, talosconfig, tmp_path):
    """artifacts_vault_password: the kubeconfig (admin client key) is written encrypted, read through the vault and
    kept (changed=0, check mode too). Without the option the file is written in clear (an envelope it cannot open is
    replaced by a fetched kubeconfig); a kept one in clear is then encrypted with its content unchanged."""
    from ansible.parsing.vault import VaultLib, VaultSecret
    vault = VaultLib([('default', VaultSecret(b'typed'))])
    issuer = KubeconfigIssuer()
    install(monkeypatch, issuer)
    dest = str(tmp_path / 'kubeconfig')
    result, out = run_module(talos_kubeconfig, capsys, **args(talosconfig, dest, artifacts_vault_password='typed'))
    assert result['changed'] is True and 'typed' not in out
    with open(dest, 'rb') as handle:
        envelope = handle.read()
    assert envelope.startswith(b'$ANSIBLE_VAULT;1.1;AES256') and stat.S_IMODE(os.stat(dest).st_mode) == 0o600
    content = yaml.safe_load(vault.decrypt(envelope))
    assert content['users'][0]['user']['client-key-data']
    for check in (True, False):
        kept, _out = run_module(talos_kubeconfig, capsys, _ansible_check_mode=check,
                                **args(talosconfig, dest, artifacts_vault_password='typed'))
        assert kept['changed'] is False and kept['outcome'] == 'kept', kept.get('reason')
    with open(dest, 'rb') as handle:
        assert handle.read() == envelope

    clear, _out = run_module(talos_kubeconfig, capsys, **args(talosconfig, dest))
    assert clear['changed'] is True and clear['outcome'] == 'written'
    content = read(dest)
    assert content['users'][0]['user']['client-key-data']
    predicted, _out = run_module(talos_kubeconfig, capsys, _ansible_check_mode=True,
                                 **args(talosconfig, dest, artifacts_vault_password='typed'))
    assert predicted['changed'] is True and read(dest) == content
    encrypted, _out = run_module(talos_kubeconfig, capsys, **args(talosconfig, dest, artifacts_vault_password='typed'))
    assert encrypted['changed'] is True and encrypted['outcome'] == 'kept'
    with open(dest, 'rb') as handle:
        assert yaml.safe_load(vault.decrypt(handle.read())) == content
