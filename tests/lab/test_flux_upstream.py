"""Flux's controllers and the sealed-secrets controller, the pinned upstream builds (lab/flux_upstream), against the lab's
upstream control plane (lab/k8s_upstream): one control plane, one smart-HTTP Git server and one set of controllers for
the module. The judges here are the upstream controllers; nothing of the collection decides an outcome (the collection's
gitops_commit pushes and its _sealed module seals: they are what is tested). Select with `-m upstream`."""

import base64
import os
import re
import shutil
import subprocess

import pytest
import requests
import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils import _sealed
from ansible_collections.proxtalos.cluster.plugins.modules import gitops_commit, sealed_secret
from ansible_collections.proxtalos.cluster.tests.helpers import run_module
from lab import upstream
from lab.flux_upstream import controllers as flux
from lab.git_server import SmartGitServer
from lab import pki
from lab.k8s_upstream import ControlPlane
from lab.testing import Lab

pytestmark = pytest.mark.upstream

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GITOPS = os.path.join(ROOT, 'lab', 'gitops')
WAIT = 120.0
CREDENTIALS = ('flux', 'lab-git-password')
REPO = 'proxtalos/lab-gitops'
IDENTITY = dict(GIT_AUTHOR_NAME='lab', GIT_AUTHOR_EMAIL='lab@lab.invalid', GIT_COMMITTER_NAME='lab',
                GIT_COMMITTER_EMAIL='lab@lab.invalid', GIT_TERMINAL_PROMPT='0')


@pytest.fixture(scope='module')
def world(tmp_path_factory):
    """(control plane, git server, controllers, the sealing key pair the controller holds, the git CA file)."""
    base = tmp_path_factory.mktemp('flux-upstream')
    plane = ControlPlane(str(base / 'controlplane'))
    plane.start()
    git_ca = pki.make_ca('lab-git')
    ca_file = str(base / 'git-ca.crt')
    with open(ca_file, 'w', encoding='utf-8') as handle:
        handle.write(git_ca[0])
    server = SmartGitServer(str(base / 'git'), credentials=CREDENTIALS,
                            tls=pki.issue(git_ca[0], git_ca[1], '127.0.0.1', server=True, ip_addresses=['127.0.0.1']))
    server.start()
    controllers = None
    try:
        # a kubelet for the controllers' pods and the workloads (kwok makes their pods Ready)
        plane.register_node('worker-1', addresses=['127.0.0.21'])
        # the sealing key made by the collection, in place before the controller starts (it loads its keys at start:
        # sealed-secrets v0.40.0 pkg/controller/main.go initKeyRegistry), as the collection's sealed_secrets stage does
        key_pem, cert_pem = _sealed.generate_keypair(key_size=2048)
        plane.api('POST', '/api/v1/namespaces/kube-system/secrets', {
            'apiVersion': 'v1', 'kind': 'Secret', 'type': 'kubernetes.io/tls',
            'metadata': {'name': 'sealed-secrets-key', 'namespace': 'kube-system',
                         'labels': {'sealedsecrets.bitnami.com/sealed-secrets-key': 'active'}},
            'data': {'tls.crt': base64.b64encode(cert_pem).decode(), 'tls.key': base64.b64encode(key_pem).decode()}},
            expect=(201,))
        controllers = flux.FluxControllers(plane, str(base / 'flux')).start()
        yield plane, server, controllers, (key_pem, cert_pem), ca_file
    finally:
        if controllers is not None:
            controllers.stop()
        server.stop()
        plane.stop()


def _git(cwd, *args, env=None):
    done = subprocess.run(['git'] + list(args), cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
                          env=dict(os.environ, **IDENTITY, **(env or {})))
    assert done.returncode == 0, 'git %s: %s' % (' '.join(args), done.stderr)
    return done.stdout.strip()


@pytest.fixture(scope='module')
def working_copy(world, tmp_path_factory):
    """A clone (over HTTPS, with the password) of a new repository that holds the lab GitOps tree, pushed."""
    dummy, server, dummy, dummy, ca_file = world
    server.create_repo(REPO)
    work = str(tmp_path_factory.mktemp('work') / 'gitops')
    env = {'GIT_SSL_CAINFO': ca_file}
    _git(None, 'clone', '--quiet', server.url_for(REPO, credentials=True), work, env=env)
    _git(work, 'checkout', '--quiet', '-b', 'main')
    shutil.copytree(GITOPS, work, dirs_exist_ok=True)
    _git(work, 'add', '--all')
    _git(work, 'commit', '--quiet', '-m', 'the lab GitOps tree')
    _git(work, 'push', '--quiet', 'origin', 'main', env=env)
    return work


def _push_with_gitops_commit(capsys, monkeypatch, world, work, paths, message):
    """The collection's gitops_commit commits paths and pushes over HTTPS with basic auth; returns its result."""
    dummy, server, dummy, dummy, ca_file = world
    monkeypatch.setenv('GIT_SSL_CAINFO', ca_file)
    _git(work, 'remote', 'set-url', 'origin', server.url_for(REPO))  # no password in the URL: the module's own auth
    args = dict(repo_dir=work, paths=paths, commit_message=message, push=True, username=CREDENTIALS[0], password=CREDENTIALS[1])
    result = run_module(gitops_commit, capsys, **args)[0]
    assert not result.get('failed'), result
    return result


def _remote_tip(world):
    dummy, server, dummy, dummy, dummy = world
    return _git(server.repo_dir(REPO), 'rev-parse', 'refs/heads/main')


def _apply_source(world, name):
    """Secret (basic auth and the server's CA, as source-controller's docs name the keys) and GitRepository."""
    cp, server, dummy, dummy, ca_file = world
    with open(ca_file, encoding='utf-8') as handle:
        ca_pem = handle.read()
    flux.apply(cp, {'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {'name': name + '-auth', 'namespace': 'flux-system'},
                    'stringData': {'username': CREDENTIALS[0], 'password': CREDENTIALS[1], 'ca.crt': ca_pem}})
    flux.apply(cp, {'apiVersion': 'source.toolkit.fluxcd.io/v1', 'kind': 'GitRepository',
                    'metadata': {'name': name, 'namespace': 'flux-system'},
                    'spec': {'url': server.url_for(REPO), 'ref': {'branch': 'main'}, 'interval': '1m',
                             'secretRef': {'name': name + '-auth'}}})


def _source_ready_at(world, name, commit):
    cp = world[0]

    def probe():
        found = flux.get(cp, 'GitRepository', name, 'flux-system') or {}
        artifact = (found.get('status') or {}).get('artifact') or {}
        ready = flux.conditions(found).get('Ready', {})
        return ready.get('status') == 'True' and artifact.get('revision') == 'main@sha1:' + commit, (ready, artifact)

    return Lab.wait_until(probe, WAIT, what='GitRepository %s Ready at %s' % (name, commit))[1]


def _kustomization(world, name, source, path, wait=True, timeout='2m'):
    flux.apply(world[0], {'apiVersion': 'kustomize.toolkit.fluxcd.io/v1', 'kind': 'Kustomization',
                          'metadata': {'name': name, 'namespace': 'flux-system'},
                          'spec': {'interval': '10m', 'retryInterval': '5s', 'path': path, 'prune': True, 'wait': wait,
                                   'timeout': timeout, 'sourceRef': {'kind': 'GitRepository', 'name': source}}})


def _ready_condition(world, name, want):
    """Wait until Kustomization name's Ready condition satisfies want(condition, status); returns the object."""
    cp = world[0]

    def probe():
        found = flux.get(cp, 'Kustomization', name, 'flux-system') or {}
        ready = flux.conditions(found).get('Ready', {})
        status = found.get('status') or {}
        return want(ready, status), {'Ready': ready, 'lastAppliedRevision': status.get('lastAppliedRevision')}

    Lab.wait_until(probe, WAIT, what='Kustomization %s' % name)
    return flux.get(cp, 'Kustomization', name, 'flux-system')


# ---------------------------------------------------------------------------------------------------------------


def test_the_controller_versions_are_those_of_one_flux_release():
    """upstream/<controller>.json pins the versions that flux2 FLUX_DISTRIBUTION's manifests/bases name."""
    bases = os.path.join(flux.go_module_dir(*flux.FLUX_DISTRIBUTION), 'manifests', 'bases')
    specs = upstream.components()
    for name in flux.FLUX_CONTROLLERS:
        with open(os.path.join(bases, name, 'kustomization.yaml'), encoding='utf-8') as handle:
            resources = yaml.safe_load(handle)['resources']
        released = {re.search(r'/releases/download/v([^/]+)/', url).group(1) for url in resources if '/releases/download/' in url}
        assert released == {specs[name]['version']}, (name, released)
        assert specs[name]['go_module']['version'] == 'v' + specs[name]['version']


def test_controllers_run_and_their_deployments_are_available_through_kwok(world):
    cp, dummy, controllers, dummy, dummy = world
    assert {entry['name'] for entry in controllers.status() if entry['running']} == set(flux.FLUX_CONTROLLERS) | {flux.SEALED_SECRETS}

    def available():
        seen = {}
        for namespace, name in [('flux-system', c) for c in flux.FLUX_CONTROLLERS] + [('kube-system', flux.SEALED_SECRETS)]:
            found = flux.get(cp, 'Deployment', name, namespace) or {}
            seen[name] = flux.conditions(found).get('Available', {}).get('status')
        return all(status == 'True' for status in seen.values()), seen

    Lab.wait_until(available, WAIT, what='the controllers\' Deployments Available')
    # each Flux controller is its ServiceAccount for RBAC: flux2's crd-controller lets source-controller read Secrets,
    # not write them, nor anything outside Flux's groups
    review = {'apiVersion': 'authorization.k8s.io/v1', 'kind': 'SubjectAccessReview',
              'spec': {'user': 'system:serviceaccount:flux-system:source-controller',
                       'groups': ['system:serviceaccounts', 'system:serviceaccounts:flux-system'],
                       'resourceAttributes': {'namespace': 'podinfo', 'verb': 'create', 'resource': 'secrets'}}}
    assert cp.api('POST', '/apis/authorization.k8s.io/v1/subjectaccessreviews', review, expect=(201,))['status']['allowed'] is False
    review['spec']['resourceAttributes'] = {'namespace': 'flux-system', 'verb': 'get', 'resource': 'secrets'}
    assert cp.api('POST', '/apis/authorization.k8s.io/v1/subjectaccessreviews', review, expect=(201,))['status']['allowed'] is True


def test_git_server_speaks_smart_http_and_refuses_a_wrong_password(world, working_copy, tmp_path):
    dummy, server, dummy, dummy, ca_file = world
    env = dict(os.environ, GIT_SSL_CAINFO=ca_file, GIT_TERMINAL_PROMPT='0')
    wrong = server.url_for(REPO).replace('https://', 'https://flux:wrong@')
    refused = subprocess.run(['git', 'ls-remote', wrong], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert refused.returncode != 0 and 'Authentication failed' in refused.stderr
    clone = str(tmp_path / 'clone')
    _git(None, 'clone', '--quiet', server.url_for(REPO, credentials=True), clone, env={'GIT_SSL_CAINFO': ca_file})
    assert _git(clone, 'rev-parse', 'HEAD') == _git(working_copy, 'rev-parse', 'HEAD')
    assert 'POST /%s.git/git-upload-pack' % REPO in server.log


def test_kustomization_becomes_ready_at_the_revision_source_controller_fetched(world, working_copy):
    commit = _git(working_copy, 'rev-parse', 'HEAD')
    _apply_source(world, 'gitops')
    artifact = _source_ready_at(world, 'gitops', commit)
    # the artifact is served by source-controller's own artifact server, at the address it was told to advertise
    assert artifact['url'].startswith('http://%s/' % world[2].artifact_address), artifact
    _kustomization(world, 'apps', 'gitops', './apps/lab')
    # both: the conditions are patched before the rest of the status (fluxcd/pkg/runtime v0.110.3 patch/patch.go:223-235)
    found = _ready_condition(world, 'apps', lambda ready, status: ready.get('status') == 'True'
                             and status.get('lastAppliedRevision') == artifact['revision'])
    assert found['status']['lastAppliedRevision'] == artifact['revision'] == 'main@sha1:' + commit
    assert flux.conditions(found)['Ready']['reason'] == 'ReconciliationSucceeded'
    deployment = flux.get(world[0], 'Deployment', 'podinfo', 'podinfo')
    assert deployment['metadata']['labels']['kustomize.toolkit.fluxcd.io/name'] == 'apps'
    assert deployment['status'].get('readyReplicas') == 2


def test_a_broken_commit_pushed_by_gitops_commit_fails_the_build(world, working_copy, capsys, monkeypatch):
    _apply_source(world, 'gitops')
    os.makedirs(os.path.join(working_copy, 'broken'), exist_ok=True)
    with open(os.path.join(working_copy, 'broken', 'kustomization.yaml'), 'w', encoding='utf-8') as handle:
        handle.write('apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - missing.yaml\n')
    result = _push_with_gitops_commit(capsys, monkeypatch, world, working_copy, ['broken'], 'a kustomization naming a missing file')
    assert result['pushed'] is True and result['commit'] == _remote_tip(world)
    # a reconcile request, as the collection's flux stage makes one after a push
    flux.annotate(world[0], 'GitRepository', 'gitops', 'flux-system', {'reconcile.fluxcd.io/requestedAt': result['commit']})
    artifact = _source_ready_at(world, 'gitops', result['commit'])
    _kustomization(world, 'broken', 'gitops', './broken')
    found = _ready_condition(world, 'broken', lambda ready, status: ready.get('reason') == 'BuildFailed')
    # kustomize-controller v1.9.5 internal/controller/kustomization_controller.go:437-440 (BuildFailed, the kustomize error)
    ready = flux.conditions(found)['Ready']
    assert ready['status'] == 'False' and 'missing.yaml' in ready['message'], ready
    assert found['status'].get('lastAppliedRevision') != artifact['revision']


def test_a_deployment_that_never_becomes_ready_fails_the_health_check(world, working_copy, capsys, monkeypatch):
    _apply_source(world, 'gitops')
    directory = os.path.join(working_copy, 'stuck')
    os.makedirs(directory, exist_ok=True)
    deployment = {'apiVersion': 'apps/v1', 'kind': 'Deployment', 'metadata': {'name': 'stuck', 'namespace': 'default'},
                  'spec': {'replicas': 1, 'selector': {'matchLabels': {'app': 'stuck'}},
                           'template': {'metadata': {'labels': {'app': 'stuck'}},
                                        # no node has this label: the pod stays Pending, the Deployment never available
                                        'spec': {'nodeSelector': {'lab.invalid/nowhere': 'true'},
                                                 'containers': [{'name': 'app', 'image': 'registry.k8s.io/pause:3.10'}]}}}}
    with open(os.path.join(directory, 'deployment.yaml'), 'w', encoding='utf-8') as handle:
        yaml.safe_dump(deployment, handle)
    result = _push_with_gitops_commit(capsys, monkeypatch, world, working_copy, ['stuck'], 'a Deployment that cannot schedule')
    flux.annotate(world[0], 'GitRepository', 'gitops', 'flux-system', {'reconcile.fluxcd.io/requestedAt': result['commit']})
    _source_ready_at(world, 'gitops', result['commit'])
    _kustomization(world, 'stuck', 'gitops', './stuck', timeout='15s')
    found = _ready_condition(world, 'stuck', lambda ready, status: ready.get('reason') == 'HealthCheckFailed')
    # kustomize-controller v1.9.5 kustomization_controller.go:1058-1071 (checkHealth: WaitForSet, then Ready and Healthy
    # False HealthCheckFailed); the status of the object it waited for is kstatus' InProgress
    ready = flux.conditions(found)['Ready']
    assert ready['status'] == 'False' and 'Deployment/default/stuck' in ready['message'], ready
    assert flux.conditions(found)['Healthy']['reason'] == 'HealthCheckFailed'
    assert found['status'].get('lastAppliedRevision') != 'main@sha1:' + result['commit']


def test_a_secret_sealed_by_the_collection_is_unsealed_by_the_upstream_controller(world):
    cp, dummy, dummy, (dummy, cert_pem), dummy = world
    secret = {'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {'name': 'db', 'namespace': 'default'},
              'stringData': {'password': 's3cr3t', 'user': 'app'}}
    for scope, name in (('strict', 'db'), ('namespace-wide', 'db-ns'), ('cluster-wide', 'db-cluster')):
        manifest = dict(secret, metadata={'name': name, 'namespace': 'default'})
        flux.apply(cp, _sealed.seal(manifest, cert_pem, scope=scope))

        def unsealed(name=name):
            found = flux.get(cp, 'Secret', name, 'default')
            synced = flux.conditions(flux.get(cp, 'SealedSecret', name, 'default')).get('Synced', {})
            return found is not None and synced.get('status') == 'True', (flux.secret_data(found), synced)

        data, synced = Lab.wait_until(unsealed, WAIT, what='Secret default/%s unsealed by the controller' % name)
        assert data == {'password': 's3cr3t', 'user': 'app'}, (scope, data)
        assert synced['status'] == 'True', synced


def assert_certificate_through_service_proxy(cp, cert_pem, what):
    """kubeseal's GET of the controller's certificate through kube-apiserver's service proxy answers, within WAIT, the
    certificate the controller serves."""
    def served():
        response = requests.get(cp.api_url + '/api/v1/namespaces/kube-system/services/http:sealed-secrets-controller:http'
                                '/proxy/v1/cert.pem', timeout=30, verify=cp.pki_file('ca.crt'),
                                cert=(cp.pki_file('admin.crt'), cp.pki_file('admin.key')))
        return response.status_code == 200, (response.status_code, response.text)
    status, body = Lab.wait_until(served, WAIT, what=what)
    want = cert_pem.decode() if isinstance(cert_pem, bytes) else cert_pem
    assert status == 200 and body.strip() == want.strip()


def test_the_controller_serves_its_certificate_through_kube_apiservers_service_proxy(world):
    """kubeseal's way to the controller (and the collection's sealed_cert_gate's): kube-apiserver's service proxy, which
    dials the pod address kwok gave the controller's pod; the lab's pod network takes it to the process."""
    cp, dummy, controllers, (dummy, cert_pem), dummy = world
    pod_ip = {entry['name']: entry.get('pod_ip') for entry in controllers.status()}[flux.SEALED_SECRETS]
    assert pod_ip and cp.pod_network.routes()[(pod_ip, 8080)] == ('127.0.0.1', controllers.ports[flux.SEALED_SECRETS])

    assert_certificate_through_service_proxy(cp, cert_pem, 'the certificate through the service proxy')


def test_a_git_server_that_is_down_fails_the_fetch(world, working_copy):
    cp, server, dummy, dummy, dummy = world
    _apply_source(world, 'gitops')
    _source_ready_at(world, 'gitops', _remote_tip(world))
    server.down = True
    try:
        flux.annotate(cp, 'GitRepository', 'gitops', 'flux-system', {'reconcile.fluxcd.io/requestedAt': 'server-down'})

        def failed():
            found = flux.conditions(flux.get(cp, 'GitRepository', 'gitops', 'flux-system'))
            return found.get('FetchFailed', {}).get('status') == 'True', found

        found = Lab.wait_until(failed, WAIT, what='GitRepository gitops FetchFailed')
        # source-controller v1.9.5 internal/controller/gitrepository_controller.go:1066-1072 (gitCheckout: the clone failed)
        assert found['FetchFailed']['reason'] == 'GitOperationFailed'
        assert 'failed to checkout and determine revision' in found['FetchFailed']['message']
        assert '503' in found['FetchFailed']['message'], found['FetchFailed']
    finally:
        server.down = False


def test_a_helmrelease_of_a_chart_in_the_repository_is_installed_by_helm_controller(world, working_copy, capsys, monkeypatch):
    cp = world[0]
    _apply_source(world, 'gitops')
    chart = os.path.join(working_copy, 'charts', 'greeting')
    os.makedirs(os.path.join(chart, 'templates'), exist_ok=True)
    with open(os.path.join(chart, 'Chart.yaml'), 'w', encoding='utf-8') as handle:
        handle.write('apiVersion: v2\nname: greeting\nversion: 0.1.0\n')
    with open(os.path.join(chart, 'values.yaml'), 'w', encoding='utf-8') as handle:
        handle.write('greeting: hello\n')
    with open(os.path.join(chart, 'templates', 'configmap.yaml'), 'w', encoding='utf-8') as handle:
        handle.write('apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n'
                     'data:\n  greeting: {{ .Values.greeting | quote }}\n')
    result = _push_with_gitops_commit(capsys, monkeypatch, world, working_copy, ['charts'], 'a chart')
    flux.annotate(cp, 'GitRepository', 'gitops', 'flux-system', {'reconcile.fluxcd.io/requestedAt': 'chart'})
    _source_ready_at(world, 'gitops', result['commit'])
    flux.apply(cp, {'apiVersion': 'helm.toolkit.fluxcd.io/v2', 'kind': 'HelmRelease',
                    'metadata': {'name': 'greeting', 'namespace': 'flux-system'},
                    'spec': {'interval': '10m', 'targetNamespace': 'default', 'releaseName': 'greeting',
                             'chart': {'spec': {'chart': './charts/greeting', 'reconcileStrategy': 'Revision',
                                                'sourceRef': {'kind': 'GitRepository', 'name': 'gitops'}}},
                             'values': {'greeting': 'bonjour'}}})

    def released():
        found = flux.conditions(flux.get(cp, 'HelmRelease', 'greeting', 'flux-system'))
        return found.get('Ready', {}).get('status') == 'True', found

    found = Lab.wait_until(released, WAIT, what='HelmRelease flux-system/greeting Ready')
    # helm-controller v1.6.4 internal/reconcile/install.go:184 (Released=True InstallSucceeded after a Helm install)
    assert found['Released']['reason'] == 'InstallSucceeded', found
    configmap = flux.get(cp, 'ConfigMap', 'greeting', 'default')
    assert configmap['data'] == {'greeting': 'bonjour'}
    assert configmap['metadata']['labels']['app.kubernetes.io/managed-by'] == 'Helm'


def test_the_collections_seal_commit_push_flow_ends_in_a_secret_of_the_upstream_controller(  # pylint: disable=too-many-locals
        world, working_copy, capsys, monkeypatch, tmp_path):
    """sealed_secret writes a SealedSecret into the working copy, gitops_commit pushes it, source-controller fetches,
    kustomize-controller applies it, the sealed-secrets controller unseals it: the collection's flux stage, end to end."""
    cp, dummy, dummy, (dummy, cert_pem), dummy = world
    cert_file = tmp_path / 'sealed-secrets.crt'
    cert_file.write_bytes(cert_pem)
    directory = os.path.join(working_copy, 'sealed')
    os.makedirs(directory, exist_ok=True)
    args = dict(name='app-credentials', namespace='default', string_data={'token': 't0ken', 'user': 'app'},
                labels={'app': 'demo'}, certificate_path=str(cert_file), dest=os.path.join(directory, 'app-credentials.yaml'))
    sealed = run_module(sealed_secret, capsys, **args)[0]
    assert sealed['changed'] is True and not sealed.get('failed'), sealed
    result = _push_with_gitops_commit(capsys, monkeypatch, world, working_copy, ['sealed'], 'sealed app credentials')
    flux.annotate(cp, 'GitRepository', 'gitops', 'flux-system', {'reconcile.fluxcd.io/requestedAt': 'sealed'})
    artifact = _source_ready_at(world, 'gitops', result['commit'])
    _kustomization(world, 'sealed', 'gitops', './sealed')
    found = _ready_condition(world, 'sealed', lambda ready, status: ready.get('status') == 'True'
                             and status.get('lastAppliedRevision') == artifact['revision'])
    assert found['status']['lastAppliedRevision'] == artifact['revision']

    def unsealed():
        secret = flux.get(cp, 'Secret', 'app-credentials', 'default')
        return secret is not None, secret

    secret = Lab.wait_until(unsealed, WAIT, what='Secret default/app-credentials')
    assert flux.secret_data(secret) == {'token': 't0ken', 'user': 'app'}
    assert secret['metadata']['labels'] == {'app': 'demo'}
    assert secret['metadata']['ownerReferences'][0]['kind'] == 'SealedSecret'


def follow(controllers, name, done, what):
    """What the lab's follower does (lab.py _follow_pods), until done(): controllers.sync(name) at each poll."""
    def probe():
        did = controllers.sync(name)
        process = controllers.processes.get(name)
        return done(), {'did': did, 'pod': controllers.pods.get(name), 'running': bool(process and process.running)}
    return Lab.wait_until(probe, WAIT, what='%s: %s' % (name, what))


def test_a_new_pod_of_the_controller_starts_its_process_again_and_the_proxy_follows_it(world):
    """What the kubelet does when the ReplicaSet replaces a deleted pod: the container of the new pod starts. The lab
    stops the process with the old pod, starts it again once kwok runs the new one, and exposes the new address; the
    service proxy (kube-apiserver picks the new endpoint) reaches it, and the old address leads nowhere."""
    cp, dummy, controllers, (dummy, cert_pem), dummy = world
    old_ip, old_pid = controllers.pod_ips[flux.SEALED_SECRETS], controllers.processes[flux.SEALED_SECRETS].popen.pid
    namespace, old_pod = controllers.pods[flux.SEALED_SECRETS]
    old_uid = controllers.pod_uids[flux.SEALED_SECRETS]
    assert controllers.sync(flux.SEALED_SECRETS) is None  # its pod runs: nothing to do
    with open(cp.pod_network.log_path, encoding='utf-8') as handle:
        logged = len(handle.readlines())
    cp.api('DELETE', '/api/v1/namespaces/%s/pods/%s' % (namespace, old_pod))
    follow(controllers, flux.SEALED_SECRETS, lambda: controllers.pod_uids.get(flux.SEALED_SECRETS) not in (None, old_uid),
           'the process playing the new pod')
    new_ip = controllers.pod_ips[flux.SEALED_SECRETS]
    assert controllers.pods[flux.SEALED_SECRETS][1] != old_pod
    assert controllers.processes[flux.SEALED_SECRETS].running and controllers.processes[flux.SEALED_SECRETS].popen.pid != old_pid
    # the old address is forgotten before the new pod's is exposed (kwok may give the new pod the address it freed)
    with open(cp.pod_network.log_path, encoding='utf-8') as handle:
        replayed = [line.strip() for line in handle.readlines()[logged:]]
    assert replayed[0] == 'forget %s' % old_ip and 'expose %s:8080 -> 127.0.0.1:%d' % (
        new_ip, controllers.ports[flux.SEALED_SECRETS]) in replayed[1:], replayed
    assert cp.pod_network.routes()[(new_ip, 8080)] == ('127.0.0.1', controllers.ports[flux.SEALED_SECRETS])

    assert_certificate_through_service_proxy(cp, cert_pem, 'the certificate through the service proxy at the new pod')


def _handled(cp, kind, name, token):
    """Wait until the controller of kind has handled the reconcile request token on flux-system/name: the value of the
    reconcile.fluxcd.io/requestedAt annotation copied to status.lastHandledReconcileAt, which only the controller does
    (kustomize-controller v1.9.5 kustomization_controller.go:1297-1300, in the deferred finalizeStatus of every
    reconcile; source-controller v1.9.5 internal/reconcile/summarize/processor.go:42-46)."""
    flux.annotate(cp, kind, name, 'flux-system', {'reconcile.fluxcd.io/requestedAt': token})

    def probe():
        status = (flux.get(cp, kind, name, 'flux-system') or {}).get('status') or {}
        return status.get('lastHandledReconcileAt') == token, status.get('lastHandledReconcileAt')
    Lab.wait_until(probe, WAIT, what='%s %s handling the request %s' % (kind, name, token))


def test_a_rollout_restart_of_kustomize_controller_gives_a_new_process_with_the_new_pods_args(world, working_copy):
    """`kubectl rollout restart` (the template's kubectl.kubernetes.io/restartedAt annotation), here with one more arg,
    as a re-applied install.yaml with a changed spec would give: the Deployment's new ReplicaSet runs a new pod, the old
    one is deleted, and the process starts again - a new pid, the new pod's args - and reconciles."""
    cp, dummy, controllers, dummy, dummy = world
    name = 'kustomize-controller'
    assert flux.get(cp, 'Kustomization', 'apps', 'flux-system') is not None, 'made by an earlier test of this module'
    old_pid, old_uid = controllers.processes[name].popen.pid, controllers.pod_uids[name]
    container = flux.get(cp, 'Deployment', name, 'flux-system')['spec']['template']['spec']['containers'][0]
    assert '--concurrent=7' not in container['args']
    cp.api('PATCH', '/apis/apps/v1/namespaces/flux-system/deployments/' + name, {'spec': {'template': {
        'metadata': {'annotations': {'kubectl.kubernetes.io/restartedAt': 'lab-test'}},
        'spec': {'containers': [{'name': container['name'], 'args': container['args'] + ['--concurrent=7']}]}}}},
        content_type='application/strategic-merge-patch+json')
    follow(controllers, name, lambda: controllers.pod_uids.get(name) not in (None, old_uid), 'the process playing the new pod')
    process = controllers.processes[name]
    assert process.running and process.popen.pid != old_pid
    assert '--concurrent=7' in process.args
    pod = flux.get(cp, 'Pod', controllers.pods[name][1], 'flux-system')
    assert pod['metadata']['annotations']['kubectl.kubernetes.io/restartedAt'] == 'lab-test'
    _handled(cp, 'Kustomization', 'apps', 'after-rollout-restart')


def test_scaling_source_controller_to_zero_stops_its_process_and_to_one_starts_one(world, working_copy):
    cp, dummy, controllers, dummy, dummy = world
    name = 'source-controller'
    assert flux.get(cp, 'GitRepository', 'gitops', 'flux-system') is not None, 'made by an earlier test of this module'
    old_pid = controllers.processes[name].popen.pid

    def scale(replicas):
        cp.api('PATCH', '/apis/apps/v1/namespaces/flux-system/deployments/%s/scale' % name, {'spec': {'replicas': replicas}},
               content_type='application/merge-patch+json')
    scale(0)
    follow(controllers, name, lambda: name not in controllers.pods and not controllers.processes[name].running,
           'no pod, no process')
    assert controllers.sync(name) is None  # still no pod: nothing starts
    assert not controllers.processes[name].running
    scale(1)
    follow(controllers, name, lambda: name in controllers.pods and controllers.processes[name].running, 'a process again')
    assert controllers.processes[name].popen.pid != old_pid
    _handled(cp, 'GitRepository', 'gitops', 'after-scale-from-zero')
