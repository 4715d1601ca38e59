"""The lab's sealed-secrets controller: keys loaded at start, its own key when it has none (or when renewal
replaces an old one), the certificate served through the API server's service proxy, SealedSecrets unsealed."""

import base64
import datetime

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _sealed

from lab.flux.gitserver import read_tree
from lab.flux.lab import LAB_REPO_DIR
from lab.flux import build
from lab.flux.testing import FluxLab
from ansible_collections.proxtalos.cluster.tests.helpers import wait_until

kubernetes = pytest.importorskip('kubernetes')
from kubernetes import client, config  # noqa: E402  pylint: disable=wrong-import-position
from kubernetes.client.rest import ApiException  # noqa: E402  pylint: disable=wrong-import-position

PROXY_REF = 'http:sealed-secrets-controller:http'
KEY_LABEL = 'sealedsecrets.bitnami.com/sealed-secrets-key'


@pytest.fixture(scope='module')
def keypair():
    return _sealed.generate_keypair(2048)


def controller_objects(renew_period=None):
    """The sealed-secrets manifests of the lab repository, optionally with another --key-renew-period."""
    objects = build.build(read_tree(LAB_REPO_DIR), './infrastructure/sealed-secrets')
    if renew_period is not None:
        for obj in objects:
            if obj['kind'] == 'Deployment':
                args = obj['spec']['template']['spec']['containers'][0]['args']
                args[args.index('--key-renew-period') + 1] = renew_period
    return objects


def start_controller(lab, renew_period=None):
    for obj in controller_objects(renew_period):
        lab.apply(obj)


def core_api(lab):
    return client.CoreV1Api(config.new_client_from_config(config_file=lab.kubeconfig))


def served_certificate(lab, timeout=30):
    core = core_api(lab)

    def probe():
        try:
            data = core.connect_get_namespaced_service_proxy_with_path(PROXY_REF, 'kube-system', 'v1/cert.pem', _preload_content=False).data
        except ApiException as exc:
            return False, '%s %s' % (exc.status, exc.body)
        return True, data
    return wait_until(probe, timeout=timeout, what='the controller serving /v1/cert.pem')


def active_keys(lab):
    return sorted(s['metadata']['name'] for s in lab.items('v1', 'Secret', 'kube-system')
                  if (s['metadata'].get('labels') or {}).get(KEY_LABEL) == 'active')


def test_the_controller_serves_our_key_and_unseals_every_scope(keypair):
    key_pem, cert_pem = keypair
    with FluxLab() as lab:
        lab.put_key(key_pem, cert_pem)
        start_controller(lab)
        assert served_certificate(lab) == cert_pem
        assert active_keys(lab) == ['sealed-secrets-key']
        lab.apply({'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'apps'}})
        for scope in ('strict', 'namespace-wide', 'cluster-wide'):
            name = 'db-%s' % scope
            secret = {'apiVersion': 'v1', 'kind': 'Secret', 'type': 'Opaque',
                      'metadata': {'name': name, 'namespace': 'apps', 'labels': {'app': 'db'}},
                      'stringData': {'password': 'pw-%s' % scope, 'user': 'app'}}
            lab.apply(_sealed.seal(secret, cert_pem, scope=scope))

            def unsealed(name=name):
                found = lab.get('v1', 'Secret', 'apps', name)
                return found is not None, found
            created = wait_until(unsealed, what='Secret apps/%s unsealed' % name)
            assert {k: base64.b64decode(v).decode() for k, v in created['data'].items()} == {'password': 'pw-%s' % scope, 'user': 'app'}
            assert created['metadata']['labels'] == {'app': 'db'}
            assert created['metadata']['ownerReferences'][0]['kind'] == 'SealedSecret'
            sealed = lab.get('bitnami.com/v1alpha1', 'SealedSecret', 'apps', name)
            assert sealed['status']['conditions'][0]['type'] == 'Synced' and sealed['status']['conditions'][0]['status'] == 'True'


def test_a_sealedsecret_for_another_key_or_name_is_not_synced(keypair):
    key_pem, cert_pem = keypair
    other_key, other_cert = _sealed.generate_keypair(2048)
    del other_key
    with FluxLab() as lab:
        lab.put_key(key_pem, cert_pem)
        start_controller(lab)
        served_certificate(lab)
        sealed = _sealed.seal({'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {'name': 'x', 'namespace': 'default'},
                               'stringData': {'a': 'b'}}, other_cert)
        lab.apply(sealed)

        def synced():
            found = lab.get('bitnami.com/v1alpha1', 'SealedSecret', 'default', 'x')
            conditions = (found.get('status') or {}).get('conditions') or []
            return bool(conditions), conditions
        condition = wait_until(synced, what='SealedSecret default/x judged')[0]
        assert condition['status'] == 'False' and condition['message'].startswith('no key could decrypt secret')
        assert lab.get('v1', 'Secret', 'default', 'x') is None


def test_without_a_key_the_controller_generates_its_own():
    with FluxLab() as lab:
        start_controller(lab)
        served = served_certificate(lab, timeout=60)
        keys = active_keys(lab)
        assert len(keys) == 1 and keys[0].startswith('sealed-secrets-key') and len(keys[0]) == len('sealed-secrets-key') + 5
        secret = lab.get('v1', 'Secret', 'kube-system', keys[0])
        assert secret['type'] == 'kubernetes.io/tls'
        assert base64.b64decode(secret['data']['tls.crt']) == served


def test_key_renewal_left_on_replaces_an_old_key_at_start():
    old = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=40)
    key_pem, cert_pem = _sealed.generate_keypair(2048, now=old)
    with FluxLab() as lab:
        lab.put_key(key_pem, cert_pem)
        start_controller(lab, renew_period='720h')
        served = served_certificate(lab, timeout=60)
        assert served != cert_pem
        assert len(active_keys(lab)) == 2
    with FluxLab() as lab:
        lab.put_key(key_pem, cert_pem)
        start_controller(lab)
        assert served_certificate(lab) == cert_pem


def test_an_unparsable_active_key_keeps_the_controller_from_starting(keypair):
    dummy, cert_pem = keypair
    with FluxLab() as lab:
        lab.put_key(b'-----BEGIN RSA PRIVATE KEY-----\nnot a key\n-----END RSA PRIVATE KEY-----\n', cert_pem)
        start_controller(lab)
        core = core_api(lab)

        def refused():
            status = lab.call(lab.flux.sealed.status)
            return bool(status['problem']), status
        status = wait_until(refused, what='the controller refusing its key')
        assert status['problem'].startswith('panic: Secret sealed-secrets-key tls.key') and not status['running']
        with pytest.raises(ApiException) as caught:
            core.connect_get_namespaced_service_proxy_with_path(PROXY_REF, 'kube-system', 'v1/cert.pem')
        assert caught.value.status == 503
