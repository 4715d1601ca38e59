"""sealed_key_secret as Ansible runs it (arguments in, JSON out) over a fake Secrets API at KubeClient.request.

FakeSecretsApi answers the requests the module makes (GET one Secret, GET the Secrets of a namespace by label, POST,
PUT, DELETE, merge PATCH) with the bodies kube-apiserver v1.36.3 sends:
- a Secret and a SecretList as core/v1 types.go defines them (k8s.io/api v0.36.3): list items carry no kind or
  apiVersion, the list's metadata carries the resourceVersion;
- errors as v1 Status objects (k8s.io/apimachinery v0.36.3 pkg/api/errors/errors.go): NewNotFound (404,
  `secrets "<name>" not found`), NewAlreadyExists (409, `secrets "<name>" already exists`), NewConflict (409,
  `Operation cannot be fulfilled on secrets "<name>": the object has been modified; ...`, the optimistic lock of
  apiserver/pkg/storage), NewInvalid (422, `Secret "<name>" is invalid: type: Invalid value: ...: field is immutable`,
  from ValidateSecretUpdate in kubernetes pkg/apis/core/validation/validation.go, which refuses a type change);
- DELETE of a Secret answers a Status with status Success (the Secret registry does not return the deleted object).
"""
import base64
import copy
import json
from urllib.parse import unquote

import pytest
from cryptography.hazmat.primitives import serialization

from ansible_collections.proxtalos.cluster.plugins.module_utils import _sealed, _vault
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client
from ansible_collections.proxtalos.cluster.plugins.modules import sealed_key_secret
from ansible_collections.proxtalos.cluster.tests.helpers import run_main as run
from ansible_collections.proxtalos.cluster.tests.unit.broken_keys import flipped_exponent_pem

VAULT_PASSWORD = 'vault-pass-for-tests'
KEY_LABEL = 'sealedsecrets.bitnami.com/sealed-secrets-key'
COLLECTION = '/api/v1/namespaces/kube-system/secrets'
KUBECONFIG = '''apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster: {server: 'https://127.0.0.1:6443', insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: fake-token}
contexts:
- name: admin@fake
  context: {cluster: fake, user: admin}
current-context: admin@fake
'''


def status(code, reason, message, name, kind='secrets'):
    return code, {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure', 'message': message,
                  'reason': reason, 'details': {'name': name, 'kind': kind}, 'code': code}


class FakeSecretsApi(object):
    """The Secrets of namespace kube-system, served as kube-apiserver serves them; `writes` lists (method, path)."""

    def __init__(self):
        self.secrets = {}
        self.version = 100
        self.writes = []

    def _stored(self, secret):
        self.version += 1
        stored = copy.deepcopy(secret)
        stored.pop('kind', None)
        stored.pop('apiVersion', None)
        metadata = stored.setdefault('metadata', {})
        metadata['namespace'] = 'kube-system'
        metadata['resourceVersion'] = str(self.version)
        metadata.setdefault('uid', 'uid-%d' % self.version)
        stored.setdefault('type', 'Opaque')
        self.secrets[metadata['name']] = stored
        return self.shown(metadata['name'])

    def put(self, secret):
        """A Secret as a test sets it up (written around the module)."""
        return self._stored(secret)

    def shown(self, name):
        """The Secret as a GET answers it, or None."""
        if name not in self.secrets:
            return None
        return dict({'kind': 'Secret', 'apiVersion': 'v1'}, **copy.deepcopy(self.secrets[name]))

    def answer(self, path, query, method, body):
        """(status, body dict) for one request."""
        name = unquote(path[len(COLLECTION) + 1:]) if path.startswith(COLLECTION + '/') else None
        assert path == COLLECTION or name, 'the module asked for %s %s' % (method, path)
        sent = json.loads(body) if body else None
        if method != 'GET':
            self.writes.append((method, path))
        if method == 'GET' and name is None:
            selector = dict(term.split('=', 1) for term in (query.get('labelSelector') or '').split(',') if term)
            items = [copy.deepcopy(s) for s in self.secrets.values()
                     if all(((s['metadata'].get('labels') or {}).get(k) == v) for k, v in selector.items())]
            return 200, {'kind': 'SecretList', 'apiVersion': 'v1', 'metadata': {'resourceVersion': str(self.version)},
                         'items': items}
        if method == 'GET':
            found = self.shown(name)
            return (200, found) if found else status(404, 'NotFound', 'secrets "%s" not found' % name, name)
        if method == 'POST':
            name = sent['metadata']['name']
            if name in self.secrets:
                return status(409, 'AlreadyExists', 'secrets "%s" already exists' % name, name)
            return 201, self._stored(sent)
        if name not in self.secrets:
            return status(404, 'NotFound', 'secrets "%s" not found' % name, name)
        live = self.secrets[name]
        if method == 'DELETE':
            del self.secrets[name]
            return 200, {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Success',
                         'details': {'name': name, 'kind': 'secrets', 'uid': live['metadata']['uid']}}
        if method == 'PUT':
            if sent['metadata'].get('resourceVersion') != live['metadata']['resourceVersion']:
                return status(409, 'Conflict', 'Operation cannot be fulfilled on secrets "%s": the object has been '
                              'modified; please apply your changes to the latest version and try again' % name, name)
            if sent.get('type', 'Opaque') != live['type']:
                return status(422, 'Invalid', 'Secret "%s" is invalid: type: Invalid value: "%s": field is immutable'
                              % (name, sent.get('type')), name, kind='Secret')
            sent['metadata']['uid'] = live['metadata']['uid']
            return 200, self._stored(sent)
        if method == 'PATCH':
            merged = copy.deepcopy(live)
            for key, value in (sent.get('metadata') or {}).get('labels', {}).items():
                merged['metadata'].setdefault('labels', {})[key] = value
            return 200, self._stored(merged)
        raise AssertionError('the module sent %s %s' % (method, path))

    def request(self, client, path, query=None, method='GET', body=None, content_type='application/json'):
        """KubeClient.request's contract: (status, body bytes)."""
        if method == 'PATCH':
            assert content_type == 'application/merge-patch+json', content_type
        code, answer = self.answer(path, dict(query or {}), method, body)
        return code, json.dumps(answer).encode('utf-8')


@pytest.fixture
def api(monkeypatch):
    fake = FakeSecretsApi()
    monkeypatch.setattr(k8s_client.KubeClient, 'request',
                        lambda client, path, query=None, method='GET', body=None, content_type='application/json':
                        fake.request(client, path, query, method, body, content_type))
    return fake


@pytest.fixture(scope='module')
def keypair():
    return _sealed.generate_keypair(2048)


@pytest.fixture
def files(tmp_path, keypair):
    """The kept pair as sealed_key writes it (the key vault-encrypted, a password file) and a kubeconfig."""
    key_pem, cert_pem = keypair
    (tmp_path / 'vault-pass').write_text(VAULT_PASSWORD + '\n')
    (tmp_path / 'sealed-secrets.key').write_bytes(_vault.encrypt(key_pem, VAULT_PASSWORD))
    (tmp_path / 'sealed-secrets.crt').write_bytes(cert_pem)
    (tmp_path / 'kubeconfig').write_text(KUBECONFIG)
    return {'private_key_path': str(tmp_path / 'sealed-secrets.key'), 'certificate_path': str(tmp_path / 'sealed-secrets.crt'),
            'vault_password_file': str(tmp_path / 'vault-pass'), 'kubeconfig': str(tmp_path / 'kubeconfig')}


def key_secret(name, key_pem, cert_pem, label='active', type_='kubernetes.io/tls', **labels):
    return {'apiVersion': 'v1', 'kind': 'Secret', 'type': type_,
            'metadata': {'name': name, 'namespace': 'kube-system', 'labels': dict(labels, **{KEY_LABEL: label})},
            'data': {'tls.key': base64.b64encode(key_pem).decode(), 'tls.crt': base64.b64encode(cert_pem).decode()}}


def test_the_fake_refuses_what_kube_apiserver_refuses(api, keypair):
    """The fake's own rules, so that the module tests below can fail: a stale resourceVersion and a type change are
    refused as kube-apiserver refuses them, a create of an existing name too."""
    key_pem, cert_pem = keypair
    live = api.put(key_secret('sealed-secrets-key', key_pem, cert_pem))
    stale = dict(live, metadata=dict(live['metadata'], resourceVersion='1'))
    assert api.answer(COLLECTION + '/sealed-secrets-key', {}, 'PUT', json.dumps(stale))[0] == 409
    retyped = dict(live, type='Opaque')
    code, body = api.answer(COLLECTION + '/sealed-secrets-key', {}, 'PUT', json.dumps(retyped))
    assert code == 422 and body['reason'] == 'Invalid' and 'field is immutable' in body['message']
    code, body = api.answer(COLLECTION, {}, 'POST', json.dumps(live))
    assert code == 409 and body['reason'] == 'AlreadyExists'
    code, body = api.answer(COLLECTION + '/missing', {}, 'GET', None)
    assert code == 404 and body['message'] == 'secrets "missing" not found'


def test_sealed_key_secret_creates_the_active_key_once_and_never_prints_it(api, files, keypair, capsys):
    key_pem, cert_pem = keypair
    code, result, out = run(sealed_key_secret, files, capsys, check_mode=True)
    assert code == 0 and result['changed'] is True and result['operation'] == 'created'
    assert api.shown('sealed-secrets-key') is None and api.writes == []
    code, result, out = run(sealed_key_secret, files, capsys, diff=True)
    assert code == 0 and result['changed'] is True and result['secret'] == 'kube-system/sealed-secrets-key'
    assert api.writes == [('POST', COLLECTION)]
    body = ''.join(line for line in key_pem.decode().splitlines() if not line.startswith('-----'))
    assert body[:40] not in out and base64.b64encode(key_pem).decode()[:40] not in out
    assert result['diff']['after']['public_key_sha256'] == result['public_key_sha256']
    secret = api.shown('sealed-secrets-key')
    assert secret['type'] == 'kubernetes.io/tls' and secret['metadata']['labels'][KEY_LABEL] == 'active'
    assert base64.b64decode(secret['data']['tls.key']) == key_pem and base64.b64decode(secret['data']['tls.crt']) == cert_pem
    code, result, out = run(sealed_key_secret, files, capsys)
    assert code == 0 and result['changed'] is False and result['operation'] == 'unchanged'
    assert api.writes == [('POST', COLLECTION)]


def test_sealed_key_secret_replaces_a_secret_of_another_type_and_updates_a_changed_one(api, files, keypair, capsys):
    """A Secret of the name that is not kubernetes.io/tls is deleted and created again (a Secret's type cannot
    change); one with other data or without the active label is updated in place, keeping labels of others."""
    key_pem, cert_pem = keypair
    api.put({'apiVersion': 'v1', 'kind': 'Secret', 'type': 'Opaque',
             'metadata': {'name': 'sealed-secrets-key', 'namespace': 'kube-system', 'labels': {'team': 'platform'}},
             'data': {'tls.key': base64.b64encode(b'not a key').decode()}})
    code, result, out = run(sealed_key_secret, files, capsys, check_mode=True)
    assert code == 0 and result['changed'] is True and result['operation'] == 'updated'
    assert api.shown('sealed-secrets-key')['type'] == 'Opaque' and api.writes == []
    code, result, out = run(sealed_key_secret, files, capsys)
    assert code == 0 and result['changed'] is True and result['operation'] == 'updated', result
    assert api.writes == [('DELETE', COLLECTION + '/sealed-secrets-key'), ('POST', COLLECTION)]
    secret = api.shown('sealed-secrets-key')
    assert secret['type'] == 'kubernetes.io/tls' and base64.b64decode(secret['data']['tls.key']) == key_pem
    assert secret['metadata']['labels'] == {KEY_LABEL: 'active'}
    api.put(key_secret('sealed-secrets-key', key_pem, cert_pem, label='compromised', team='platform'))
    del api.writes[:]
    code, result, out = run(sealed_key_secret, files, capsys)
    assert code == 0 and result['changed'] is True and result['operation'] == 'updated', result
    assert api.writes == [('PUT', COLLECTION + '/sealed-secrets-key')]
    assert api.shown('sealed-secrets-key')['metadata']['labels'] == {KEY_LABEL: 'active', 'team': 'platform'}
    code, result, out = run(sealed_key_secret, files, capsys)
    assert code == 0 and result['changed'] is False and result['operation'] == 'unchanged'


def test_sealed_key_secret_names_the_secret_and_the_api_answer_when_a_write_is_refused(api, files, capsys, monkeypatch):
    """A write the API refuses fails the task with the Secret, the request and the API's message - never the key."""
    sent = []

    def refuse(client, path, query=None, method='GET', body=None, content_type='application/json'):
        if method == 'GET':
            return api.request(client, path, query)
        sent.append((method, path))
        forbidden = {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
                     'message': 'secrets is forbidden: admission says no', 'reason': 'Forbidden',
                     'details': {'kind': 'secrets'}, 'code': 403}
        return 403, json.dumps(forbidden).encode()
    monkeypatch.setattr(k8s_client.KubeClient, 'request', refuse)
    code, result, out = run(sealed_key_secret, files, capsys)
    assert sent == [('POST', COLLECTION)]
    assert code == 1 and result['status'] == 403 and 'kube-system/sealed-secrets-key' in result['msg'], result
    assert 'admission says no' in result['msg'] and 'POST %s' % COLLECTION in result['msg']
    assert 'BEGIN' not in out and api.shown('sealed-secrets-key') is None


def test_sealed_key_secret_checks_the_keys_numbers_unless_the_keeper_just_did(api, files, keypair, capsys, tmp_path):
    """A key whose private exponent has one bit flipped still matches its certificate; by default it is refused
    (naming the file) and nothing is written; check_key_consistency=false (the sealed_secrets role passes it only
    right after sealed_key checked the same file in the same run) does not look at the numbers."""
    key_pem, dummy = keypair
    (tmp_path / 'broken.key').write_bytes(flipped_exponent_pem(serialization.load_pem_private_key(key_pem, password=None)))
    args = dict(kubeconfig=files['kubeconfig'], private_key_path=str(tmp_path / 'broken.key'),
                certificate_path=files['certificate_path'])
    code, result, out = run(sealed_key_secret, args, capsys)
    assert code == 1 and result['field'] == 'private_key_path' and 'cannot be parsed as a private key' in result['msg'], result
    assert api.shown('sealed-secrets-key') is None and api.writes == []
    code, result, out = run(sealed_key_secret, dict(args, check_key_consistency=False), capsys, check_mode=True)
    assert code == 0 and result['operation'] == 'created', result


@pytest.fixture
def warnings(monkeypatch):
    """What the module passes to AnsibleModule.warn (where warnings end up depends on the process)."""
    seen = []
    monkeypatch.setattr(sealed_key_secret.AnsibleModule, 'warn', lambda self, message: seen.append(message))
    return seen


def test_sealed_key_secret_reports_and_deactivates_other_active_keys(api, files, capsys, warnings):
    other_key, other_cert = _sealed.generate_keypair(2048)
    api.put(key_secret('sealed-secrets-keyabcde', other_key, other_cert))
    api.put(key_secret('sealed-secrets-keyold01', other_key, other_cert, label='compromised'))
    code, result, out = run(sealed_key_secret, files, capsys)
    assert code == 0 and result['other_active_keys'] == ['sealed-secrets-keyabcde'] and result['deactivated'] == []
    assert any('sealed-secrets-keyabcde' in w for w in warnings)
    code, result, out = run(sealed_key_secret, dict(files, other_keys='deactivate'), capsys)
    assert code == 0 and result['changed'] is True and result['deactivated'] == ['sealed-secrets-keyabcde']
    assert api.writes[-1] == ('PATCH', COLLECTION + '/sealed-secrets-keyabcde')
    assert api.shown('sealed-secrets-keyabcde')['metadata']['labels'][KEY_LABEL] == 'compromised'


def test_sealed_key_secret_refuses_a_pair_that_does_not_match(api, files, capsys, tmp_path):
    other_key, other_cert = _sealed.generate_keypair(2048)
    del other_key
    (tmp_path / 'sealed-secrets.crt').write_bytes(other_cert)
    code, result, out = run(sealed_key_secret, files, capsys)
    assert code == 1 and result['field'] == 'certificate_path' and 'does not match' in result['msg']
    assert api.shown('sealed-secrets-key') is None and api.writes == []
    wrong = dict((k, v) for k, v in files.items() if k != 'vault_password_file')
    code, result, out = run(sealed_key_secret, dict(wrong, vault_password='wrong'), capsys)
    assert code == 1 and result.get('field') == 'vault_password', result
