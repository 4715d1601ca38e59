"""The lab's Flux controllers on a lab Kubernetes cluster: sources, Kustomizations in dependsOn order,
conditions and reasons as Flux writes them, health checks, prune, faults, flux-operator."""

import os
import subprocess

import pytest
import yaml

from lab.flux.lab import LAB_REPO_PATH
from lab.flux.testing import FluxLab, copy_repo
from ansible_collections.proxtalos.cluster.tests.helpers import wait_until

KS = 'kustomize.toolkit.fluxcd.io/v1'
TREE = ['flux-system', 'sealed-secrets', 'flux-credentials', 'proxmox-ccm', 'proxmox-csi', 'cert-manager', 'cert-manager-issuers', 'apps']
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def condition(obj, kind='Ready'):
    return next((c for c in ((obj or {}).get('status') or {}).get('conditions') or () if c['type'] == kind), None)


@pytest.fixture
def flux():
    with FluxLab() as lab:
        lab.install_components()
        yield lab


def test_the_lab_tree_reconciles_with_flux_status_fields(flux):
    flux.sync()
    flux.wait_ready(count=len(TREE) + 1)
    repo = flux.git_repository()
    revision = repo['status']['artifact']['revision']
    assert revision.startswith('main@sha1:')
    assert condition(repo) == dict(condition(repo), status='True', reason='Succeeded', message="stored artifact for revision '%s'" % revision)
    assert condition(repo, 'ArtifactInStorage')['status'] == 'True'
    for name in TREE:
        ks = flux.kustomization(name)
        status = ks['status']
        assert condition(ks)['message'] == 'Applied revision: %s' % revision, name
        assert condition(ks)['observedGeneration'] == ks['metadata']['generation'] == status['observedGeneration']
        assert status['lastAppliedRevision'] == status['lastAttemptedRevision'] == revision
        assert condition(ks, 'Reconciling') is None
    csi = flux.kustomization('proxmox-csi')
    assert condition(csi, 'Healthy')['status'] == 'True' and condition(csi, 'Healthy')['message'].startswith('Health check passed in ')
    assert {'id': 'csi-proxmox_proxmox-csi-plugin-node_apps_DaemonSet', 'v': 'v1'} in csi['status']['inventory']['entries']
    node_plugin = flux.get('apps/v1', 'DaemonSet', 'csi-proxmox', 'proxmox-csi-plugin-node')
    assert node_plugin['metadata']['labels']['kustomize.toolkit.fluxcd.io/name'] == 'proxmox-csi'
    assert node_plugin['metadata']['labels']['kustomize.toolkit.fluxcd.io/namespace'] == 'flux-system'
    assert [m['manager'] for m in node_plugin['metadata']['managedFields'] if m['operation'] == 'Apply'] == ['kustomize-controller']
    assert node_plugin['status']['numberReady'] == 4
    # the root applied the other Kustomizations, so they are in its inventory
    root_ids = [e['id'] for e in flux.kustomization('flux-system')['status']['inventory']['entries']]
    assert 'flux-system_apps_kustomize.toolkit.fluxcd.io_Kustomization' in root_ids


def test_a_poll_that_finds_the_same_revision_leaves_the_objects_as_they_are(flux):
    # source-controller fetches again every interval (the lab: at least every 2 s); with no new revision, neither the
    # GitRepository nor the Kustomizations change - a client's apply racing the poll sees no change of theirs
    flux.sync()
    flux.wait_ready(count=len(TREE) + 1)
    before = dict((name, flux.kustomization(name)['metadata']['resourceVersion']) for name in TREE)
    before['GitRepository'] = flux.git_repository()['metadata']['resourceVersion']
    fetches = []
    fetch = flux.git.fetch

    def counted(*args, **kwargs):
        fetches.append(args[0])
        return fetch(*args, **kwargs)
    flux.git.fetch = counted
    wait_until(lambda: (len(fetches) >= 2, fetches), timeout=15.0, what='two polls of the repository')
    after = dict((name, flux.kustomization(name)['metadata']['resourceVersion']) for name in TREE)
    after['GitRepository'] = flux.git_repository()['metadata']['resourceVersion']
    assert after == before
    assert condition(flux.git_repository())['status'] == 'True'


def test_a_failing_health_check_blocks_its_dependants_with_dependency_not_ready(flux):
    flux.call(flux.flux.flux.set_health_fault, 'flux-system', 'cert-manager', True)
    flux.sync()
    failed = flux.wait_condition('cert-manager', 'HealthCheckFailed')
    assert failed['status'] == 'False'
    assert failed['message'].startswith('health check failed after ')
    assert 'timeout waiting for: [' in failed['message'] and "status: 'InProgress'" in failed['message']
    ks = flux.kustomization('cert-manager')
    assert condition(ks, 'Healthy')['status'] == 'False'
    assert condition(ks, 'Reconciling')['reason'] == 'ProgressingWithRetry'
    blocked = flux.wait_condition('cert-manager-issuers', 'DependencyNotReady')
    assert blocked['message'] == "dependency 'flux-system/cert-manager' is not ready"
    apps = flux.wait_condition('apps', 'DependencyNotReady')
    assert apps['status'] == 'False' and 'is not ready' in apps['message']
    # the unrelated branch of the tree is not held up
    flux.wait_condition('proxmox-csi', 'ReconciliationSucceeded')
    assert flux.get('cert-manager.io/v1', 'ClusterIssuer', '', 'selfsigned') is None
    flux.call(flux.flux.flux.set_health_fault, 'flux-system', 'cert-manager', False)
    flux.wait_ready(count=len(TREE) + 1)
    assert flux.get('cert-manager.io/v1', 'ClusterIssuer', '', 'selfsigned') is not None


def test_a_broken_build_fails_with_kustomizes_error_keeps_what_was_applied_and_recovers(flux):
    flux.sync()
    flux.wait_ready(count=len(TREE) + 1)
    flux.call(flux.flux.flux.set_build_fault, 'flux-system', 'proxmox-csi', 'csi-node.yaml')
    failed = flux.wait_condition('proxmox-csi', 'BuildFailed')
    assert failed['status'] == 'False'
    assert failed['message'].startswith("kustomize build failed: accumulating resources: accumulation err='accumulating resources "
                                        "from 'csi-node.yaml': open /tmp/kustomization-")
    assert 'csi-node.yaml: no such file or directory' in failed['message']
    # what the last good build applied stays, and nothing depends on proxmox-csi in the lab tree
    assert flux.get('apps/v1', 'DaemonSet', 'csi-proxmox', 'proxmox-csi-plugin-node') is not None
    assert condition(flux.kustomization('cert-manager'))['status'] == 'True'
    flux.call(flux.flux.flux.set_build_fault, 'flux-system', 'proxmox-csi', None)
    flux.wait_condition('proxmox-csi', 'ReconciliationSucceeded')


def test_a_source_that_is_down_or_refuses_the_credentials(flux):
    flux.call(flux.git.down.add, LAB_REPO_PATH)
    flux.sync()
    down = flux.wait_condition('flux-system', 'GitOperationFailed', kind='GitRepository')
    assert down['status'] == 'False' and 'status code: 503' in down['message']
    assert condition(flux.git_repository(), 'FetchFailed')['status'] == 'True'
    root = flux.wait_condition('flux-system', 'ArtifactFailed')
    assert root['message'] == 'Source artifact not found, retrying in 30s'
    flux.call(flux.git.down.discard, LAB_REPO_PATH)
    flux.reconcile('flux-system', kind='GitRepository')
    flux.wait_ready(count=len(TREE) + 1)
    # wrong credentials: Ready=False until the Secret is right (the source is re-fetched when its Secret changes)
    flux.sync(password='not-the-password')
    flux.reconcile('flux-system', kind='GitRepository')
    refused = flux.wait_condition('flux-system', 'GitOperationFailed', kind='GitRepository')
    assert 'authentication required: Invalid username or password' in refused['message']
    flux.sync()
    flux.wait_condition('flux-system', 'Succeeded', kind='GitRepository')


def test_objects_removed_from_git_are_pruned_unless_prune_is_disabled(flux, tmp_path):
    repo = copy_repo(tmp_path / 'gitops')
    flux.call(flux.git.add_repo, 'team/copy', repo)
    flux.sync(url='https://git.lab.internal/team/copy.git')
    flux.wait_ready(count=len(TREE) + 1)
    assert flux.get('v1', 'Service', 'podinfo', 'podinfo') is not None
    flux.apply({'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'podinfo', 'annotations': {
        'kustomize.toolkit.fluxcd.io/prune': 'disabled'}}}, manager='kubectl')
    with open(os.path.join(repo, 'apps', 'lab', 'kustomization.yaml'), 'w', encoding='utf-8') as handle:
        handle.write('resources: [deployment-podinfo.yaml]\nnamespace: podinfo\n')
    old = flux.git_repository()['status']['artifact']['revision']
    flux.reconcile('flux-system', kind='GitRepository')
    wait_until(lambda: (flux.kustomization('apps')['status'].get('lastAppliedRevision') not in (None, old),
                        flux.kustomization('apps')['status']), what='apps applied at the new revision')
    assert flux.get('v1', 'Service', 'podinfo', 'podinfo') is None
    assert flux.get('v1', 'Namespace', '', 'podinfo') is not None


def test_custom_resources_before_their_crd_fail_naming_the_object_then_recover(flux, tmp_path):
    """The Flux CRD ordering pain point: issuers applied without dependsOn on cert-manager, whose CRDs are not there yet."""
    repo = copy_repo(tmp_path / 'gitops')
    folder = os.path.join(repo, 'clusters', 'lab')

    def write(suspend_cert_manager):
        for name in ('cert-manager', 'cert-manager-issuers'):
            path = os.path.join(folder, name + '.yaml')
            with open(path, encoding='utf-8') as handle:
                doc = yaml.safe_load(handle)
            if name == 'cert-manager-issuers':
                doc['spec'].pop('dependsOn', None)
            else:
                doc['spec']['suspend'] = suspend_cert_manager
            with open(path, 'w', encoding='utf-8') as handle:
                yaml.safe_dump(doc, handle)
    write(True)
    flux.call(flux.git.add_repo, 'team/copy', repo)
    flux.sync(url='https://git.lab.internal/team/copy.git')
    failed = flux.wait_condition('cert-manager-issuers', 'ReconciliationFailed')
    assert failed['message'] == 'ClusterIssuer/selfsigned dry-run failed: no matches for kind "ClusterIssuer" in version "cert-manager.io/v1"'
    write(False)
    flux.reconcile('flux-system', kind='GitRepository')
    flux.wait_ready(count=len(TREE) + 1)
    assert flux.get('cert-manager.io/v1', 'ClusterIssuer', '', 'selfsigned') is not None


def test_without_running_controllers_nothing_is_reconciled():
    with FluxLab(nodes=(('cp-1', '127.0.0.1', True),)) as lab:
        lab.install_components()
        lab.sync()

        def pending():
            pods = [p for p in lab.items('v1', 'Pod', 'flux-system') if p['metadata']['name'].startswith('source-controller-')]
            scheduled = [c for p in pods for c in p['status'].get('conditions') or () if c['type'] == 'PodScheduled']
            return bool(scheduled) and scheduled[0]['status'] == 'False', scheduled
        reason = wait_until(pending, what='the source-controller pod Pending (no worker yet)')
        assert 'untolerated taint' in reason[0]['message'] or 'node(s)' in reason[0]['message']
        assert (lab.git_repository().get('status') or {}).get('conditions') is None
        lab.call(lab.api.cluster.kubelet_started, 'w-1', '127.0.0.2')
        lab.wait_ready(count=len(TREE) + 1)


def test_flux_operator_installs_the_components_and_the_sync_from_a_fluxinstance():
    with FluxLab() as lab:
        lab.install_operator()
        lab.csi_secret()
        lab.apply({'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {'name': 'flux-system', 'namespace': 'flux-system'},
                   'stringData': {'username': 'flux', 'password': 'lab-git-password'}})
        lab.apply({'apiVersion': 'fluxcd.controlplane.io/v1', 'kind': 'FluxInstance', 'metadata': {'name': 'flux', 'namespace': 'flux-system'},
                   'spec': {'distribution': {'version': '2.x', 'registry': 'ghcr.io/fluxcd'},
                            'components': ['source-controller', 'kustomize-controller'],
                            'sync': {'kind': 'GitRepository', 'url': lab.url, 'ref': 'refs/heads/main', 'path': './clusters/lab',
                                     'pullSecret': 'flux-system'}}})

        def instance_ready():
            obj = lab.get('fluxcd.controlplane.io/v1', 'FluxInstance', 'flux-system', 'flux')
            return (condition(obj) or {}).get('status') == 'True', condition(obj)
        ready = wait_until(instance_ready, timeout=30, what='FluxInstance Ready')
        assert ready['reason'] == 'ReconciliationSucceeded' and ready['message'].startswith('Reconciliation finished in ')
        instance = lab.get('fluxcd.controlplane.io/v1', 'FluxInstance', 'flux-system', 'flux')
        assert instance['status']['lastAppliedRevision'].startswith('v2.')
        assert [c['name'] for c in instance['status']['components']] == ['kustomize-controller', 'source-controller']
        assert lab.get('apps/v1', 'Deployment', 'flux-system', 'helm-controller') is None
        assert lab.git_repository()['spec']['ref'] == {'name': 'refs/heads/main'}
        lab.wait_ready(count=len(TREE) + 2)


def test_the_csi_kustomization_is_not_ready_until_its_config_secret_exists(flux):
    flux.sync(csi_secret=False)

    def controller_waits():
        pods = [p for p in flux.items('v1', 'Pod', 'csi-proxmox') if p['metadata']['name'].startswith('proxmox-csi-plugin-controller')]
        states = [s['state'].get('waiting', {}) for p in pods for s in (p.get('status') or {}).get('containerStatuses') or ()]
        return bool(states) and all(w.get('message') == 'MountVolume.SetUp failed: secret "proxmox-csi-plugin" not found' for w in states), states
    wait_until(controller_waits, timeout=30, what='the CSI controller waiting for its Secret')
    csi = flux.kustomization('proxmox-csi')
    assert condition(csi)['status'] != 'True', condition(csi)
    assert condition(flux.kustomization('apps'))['status'] != 'True'
    flux.csi_secret()
    flux.wait_ready(count=len(TREE) + 1)
    assert condition(flux.kustomization('proxmox-csi'))['reason'] == 'ReconciliationSucceeded'


def test_kubectl_shows_flux_objects_with_their_ready_columns(flux):
    kubectl = os.path.join(ROOT, '.tools', 'bin', 'kubectl')
    if not os.access(kubectl, os.X_OK):
        pytest.skip('no kubectl in .tools/bin (make setup)')
    flux.sync()
    flux.wait_ready(count=len(TREE) + 1)
    done = subprocess.run([kubectl, '--kubeconfig', flux.kubeconfig, 'get', 'kustomizations', '-n', 'flux-system'],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:4] == ['NAME', 'AGE', 'READY', 'STATUS']
    assert len(lines) == len(TREE) + 1 and all(' True ' in line for line in lines[1:])
    done = subprocess.run([kubectl, '--kubeconfig', flux.kubeconfig, 'wait', 'kustomization/apps', '-n', 'flux-system',
                           '--for=condition=Ready', '--timeout=20s'], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and 'condition met' in done.stdout, done.stderr


def test_a_reconcile_request_is_handled_by_a_blocked_or_suspended_kustomization_too(flux):
    """kustomize-controller v1.6.1 copies reconcile.fluxcd.io/requestedAt to status.lastHandledReconcileAt in
    finalizeStatus (internal/controller/kustomization_controller.go:1186-1188), deferred by Reconcile (:188-193), so
    a reconcile that ends at DependencyNotReady (:291-300) or at spec.suspend (:230-234) handles the request too."""
    flux.call(flux.flux.flux.set_health_fault, 'flux-system', 'cert-manager', True)
    flux.sync()
    flux.wait_condition('cert-manager-issuers', 'DependencyNotReady')
    flux.reconcile('cert-manager-issuers')
    requested = flux.kustomization('cert-manager-issuers')['metadata']['annotations']['reconcile.fluxcd.io/requestedAt']
    wait_until(lambda: (flux.kustomization('cert-manager-issuers')['status'].get('lastHandledReconcileAt') == requested,
                        flux.kustomization('cert-manager-issuers')['status']), timeout=15.0, what='the request handled while blocked')
    assert condition(flux.kustomization('cert-manager-issuers'))['reason'] == 'DependencyNotReady'
    flux.apply({'apiVersion': 'kustomize.toolkit.fluxcd.io/v1', 'kind': 'Kustomization', 'metadata': {'name': 'apps', 'namespace': 'flux-system'},
                'spec': dict(flux.kustomization('apps')['spec'], suspend=True)}, manager='flux-client-side-apply')
    flux.reconcile('apps')
    requested = flux.kustomization('apps')['metadata']['annotations']['reconcile.fluxcd.io/requestedAt']
    wait_until(lambda: (flux.kustomization('apps')['status'].get('lastHandledReconcileAt') == requested,
                        flux.kustomization('apps')['status']), timeout=15.0, what='the request handled while suspended')
