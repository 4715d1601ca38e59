"""The GitOps hand-off (stages sealed_secrets, flux, gitops) through site.yml against the lab: a Ready tree,
re-run changed=0, the blocker named when a Kustomization fails, the node named when a CSI node plugin
crash-loops, a dependsOn cycle stopped at preflight, and the same sealed-secrets key after a lab rebuild."""

import base64
import datetime
import os
import shutil
import sys

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gitops_lab import ROOT, gitops_cluster  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import,import-error

from ansible_collections.proxtalos.cluster.tests.helpers import wait_until  # noqa: E402  pylint: disable=wrong-import-position

kubernetes = pytest.importorskip('kubernetes')
from kubernetes import client  # noqa: E402  pylint: disable=wrong-import-position

TREE = ['apps', 'cert-manager', 'cert-manager-issuers', 'flux-credentials', 'flux-system', 'proxmox-ccm', 'proxmox-csi', 'sealed-secrets']


def kustomization(cluster, name):
    return client.CustomObjectsApi(cluster.api()).get_namespaced_custom_object(
        'kustomize.toolkit.fluxcd.io', 'v1', 'flux-system', 'kustomizations', name)


def ready_of(obj):
    return next((c for c in (obj.get('status') or {}).get('conditions') or () if c['type'] == 'Ready'), {})


def request_reconcile(cluster, name):
    """What `flux reconcile kustomization NAME` does: the requestedAt annotation."""
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat()
    client.CustomObjectsApi(cluster.api()).patch_namespaced_custom_object(
        'kustomize.toolkit.fluxcd.io', 'v1', 'flux-system', 'kustomizations', name,
        {'metadata': {'annotations': {'reconcile.fluxcd.io/requestedAt': stamp}}})


def test_site_ends_with_a_ready_gitops_tree_and_a_rerun_changes_nothing(gitops_cluster):
    first = gitops_cluster.first
    assert first.rc == 0, first.explain()
    gate = first.result_values('Gate on the Flux Kustomization tree')[0]
    assert gate['summary'] == 'Kustomizations Ready 8/8'
    assert sorted(k['name'].split('/')[1] for k in gate['kustomizations']) == TREE
    assert gate['order'][0] == ['flux-system/cert-manager', 'flux-system/flux-system', 'flux-system/proxmox-ccm', 'flux-system/sealed-secrets']
    served = first.result_values('The sealed-secrets controller serves our certificate')[0]
    assert served['passed'] and served['url_path'].endswith('/services/http:sealed-secrets-controller:http/proxy/v1/cert.pem')
    again = gitops_cluster.site()
    assert again.rc == 0, again.explain()
    assert again.changed() == dict((host, 0) for host in again.changed()), again.changed()
    checked = gitops_cluster.site('--check', '--tags', 'sealed_secrets,flux,gitops')
    assert checked.rc == 0 and set(checked.changed().values()) == {0}, checked.explain()


def task_times(run, task_part):
    """[(start, end)] of the tasks whose name contains task_part, as ISO strings of one clock (the callback's)."""
    return [(task['task']['duration']['start'], task['task']['duration']['end'])
            for play in run.data['plays'] for task in play['tasks'] if task_part in task['task']['name']]


def test_flux_controllers_start_before_the_cni_gate_and_get_the_repository_before_the_releases(gitops_cluster):
    """The lab's tree needs neither widget release (flux_handoff auto): Flux's components are applied before the cni
    stage's gates, and Flux gets the repository after Cilium, the kubelet check of the workers and the sealed-secrets
    key, before the cni gates (its controllers need only their own nodes' network); the cni gates still come before
    the releases are installed. The releases and the tree roll out side by side; both are gated."""
    first = gitops_cluster.first
    assert first.rc == 0, first.explain()
    # applied once, right after the kubeconfig stage; the flux stage's main part skips it (in both of its plays: the
    # one after the apps stage skips all its tasks)
    applied = first.result_values("Apply Flux's components")
    assert [r.get('changed') for r in applied] == [True, False, False], applied
    assert [r.get('skipped') is True for r in applied] == [False, True, True], applied
    decided = first.result_values('Flux hand-off - when Flux gets the GitOps repository')
    assert len(decided) == 1 and decided[0]['msg'].startswith('Flux gets the GitOps repository before the bootstrap releases: nothing'), decided
    components_end = task_times(first, "Apply Flux's components")[0][1]
    cni_gate_start, cni_gate_end = task_times(first, 'a Ready Cilium agent on every node')[0]
    kubelet_check_end = task_times(first, 'Kubelet on the workers - running, or why not')[0][1]
    key_end = task_times(first, 'Keep the sealed-secrets keypair')[-1][1]
    release_starts = [start for start, _end in task_times(first, 'Helm release - install or upgrade')
                      + task_times(first, 'Manifests release - server-side apply')]
    sync_start = task_times(first, 'The GitRepository and the root Kustomization')[0][0]
    assert release_starts
    assert components_end < cni_gate_start, (components_end, cni_gate_start)
    assert key_end < sync_start and kubelet_check_end < sync_start < cni_gate_start, (key_end, kubelet_check_end, sync_start, cni_gate_start)
    assert cni_gate_end < min(release_starts), (cni_gate_end, release_starts)

    # after_apps: Flux gets the repository only after every release's gates (nothing to change on this cluster)
    late = gitops_cluster.site('--tags', 'flux,apps', '-e', 'flux_handoff=after_apps')
    assert late.rc == 0, late.explain()
    release_gate_ends = [end for _start, end in task_times(late, 'Gate - workloads of the release rolled out')]
    sync_start = task_times(late, 'The GitRepository and the root Kustomization')[-1][0]
    assert release_gate_ends and sync_start > max(release_gate_ends), (sync_start, release_gate_ends)
    assert set(late.changed().values()) == {0}, late.changed()

    # flux_install_before_apps false: the flux stage applies the components itself, after the releases
    late = gitops_cluster.site('--tags', 'flux', '-e', 'flux_install_before_apps=false')
    assert late.rc == 0, late.explain()
    applied = [r for r in late.result_values("Apply Flux's components") if r.get('skipped') is not True]
    assert len(applied) == 1, late.result_values("Apply Flux's components")
    assert 'after the bootstrap releases: flux_install_before_apps is false' in \
        late.result_values('Flux hand-off - when Flux gets the GitOps repository')[0]['msg']
    assert set(late.changed().values()) == {0}, late.changed()


def test_a_tree_that_takes_over_a_release_gets_the_repository_after_the_releases(gitops_cluster):
    """A HelmRelease in the working copy that takes over widget-operator: auto hands Flux the repository after the
    releases, and says why (file and release). Read only from the working copy: nothing is committed or served."""
    path = os.path.join(gitops_cluster.lab.run_dir, 'gitops', 'infrastructure', 'widget-operator-helmrelease.yaml')
    with open(path, 'w', encoding='utf-8') as handle:
        yaml.safe_dump({'apiVersion': 'helm.toolkit.fluxcd.io/v2', 'kind': 'HelmRelease',
                        'metadata': {'name': 'widget-operator', 'namespace': 'widgets-system'},
                        'spec': {'interval': '10m', 'chart': {'spec': {'chart': 'widget-operator',
                                                                       'sourceRef': {'kind': 'HelmRepository', 'name': 'widgets'}}}}},
                       handle)
    try:
        run = gitops_cluster.site('--tags', 'flux_install')
        assert run.rc == 0, run.explain()
        message = run.result_values('Flux hand-off - when Flux gets the GitOps repository')[0]['msg']
        assert message.startswith('Flux gets the GitOps repository after the bootstrap releases:'), message
        assert 'widget-operator-helmrelease.yaml' in message and 'widgets-system/widget-operator' in message, message
        assert set(run.changed().values()) == {0}, run.changed()
    finally:
        os.unlink(path)


def test_the_key_in_the_cluster_is_the_kept_one_byte_for_byte(gitops_cluster):
    core = client.CoreV1Api(gitops_cluster.api())
    secret = core.read_namespaced_secret('sealed-secrets-key', 'kube-system')
    assert secret.type == 'kubernetes.io/tls'
    assert secret.metadata.labels['sealedsecrets.bitnami.com/sealed-secrets-key'] == 'active'
    with open(os.path.join(gitops_cluster.secrets, 'sealed-secrets.key'), 'rb') as handle:
        assert base64.b64decode(secret.data['tls.key']) == handle.read()
    for name in ('sealed-secrets.key', 'sealed-secrets.crt'):
        assert oct(os.stat(os.path.join(gitops_cluster.secrets, name)).st_mode & 0o777) == '0o600'
    # no key material in what the playbook printed
    with open(os.path.join(gitops_cluster.secrets, 'sealed-secrets.key'), encoding='utf-8') as handle:
        body = ''.join(line for line in handle if not line.startswith('-----'))
    text = str(gitops_cluster.first.data)
    assert body[:64].strip() not in text and secret.data['tls.key'][:64] not in text


def kustomizations_ready_at_the_source_revision(cluster, but):
    """(every Kustomization not in but Ready with lastAppliedRevision the GitRepository's artifact revision, what was seen)."""
    custom = client.CustomObjectsApi(cluster.api())
    source = custom.get_namespaced_custom_object('source.toolkit.fluxcd.io', 'v1', 'flux-system', 'gitrepositories', 'flux-system')
    revision = ((source.get('status') or {}).get('artifact') or {}).get('revision')
    seen = {}
    for item in custom.list_namespaced_custom_object('kustomize.toolkit.fluxcd.io', 'v1', 'flux-system', 'kustomizations')['items']:
        name = item['metadata']['name']
        if name not in but:
            seen[name] = (ready_of(item).get('status'), (item.get('status') or {}).get('lastAppliedRevision') == revision)
    return bool(seen) and all(value == ('True', True) for value in seen.values()), (revision, seen)


def test_a_failing_kustomization_fails_the_gate_naming_it_its_reason_and_what_waits_behind_it(gitops_cluster):
    """The fault: in the default world the simulation's health check of proxmox-csi times out at once; in the upstream
    Flux world (PROXTALOS_LAB_FLUX=upstream) a commit pushed to the lab's Git server makes its controller Deployment
    unschedulable with a 10 s progress deadline, and kustomize-controller's health check fails on the Deployment's
    ProgressDeadlineExceeded (docs/lab-flux.md "Faults"). That commit is a new revision for every Kustomization, and a
    dependent one waits for its dependencies (kustomize-controller's --requeue-dependency, 30 s): hence the deadlines."""
    lab = gitops_cluster.lab
    lab.fault('flux-healthcheck-fail', 'flux-system/proxmox-csi')
    try:
        wait_until(lambda: (ready_of(kustomization(gitops_cluster, 'proxmox-csi')).get('reason') == 'HealthCheckFailed',
                            ready_of(kustomization(gitops_cluster, 'proxmox-csi'))), timeout=150, what='proxmox-csi HealthCheckFailed')
        request_reconcile(gitops_cluster, 'apps')
        blocked = "dependency 'flux-system/proxmox-csi' is not ready"
        wait_until(lambda: (ready_of(kustomization(gitops_cluster, 'apps')).get('message') == blocked,
                            ready_of(kustomization(gitops_cluster, 'apps'))), timeout=60, what='apps DependencyNotReady')
        wait_until(lambda: kustomizations_ready_at_the_source_revision(gitops_cluster, ('proxmox-csi', 'apps')), timeout=120,
                   what='the other Kustomizations Ready at the revision of the GitRepository')
        run = gitops_cluster.site('--tags', 'gitops', '-e', 'gitops_timeout=3', '-e', 'gitops_wait_sleep=1')
        assert run.rc != 0
        name, message = run.failure_messages()[0]
        assert 'Gate on the Flux Kustomization tree' in name
        first_line = message.splitlines()[0]
        assert 'Kustomizations Ready 6/8: flux-system/proxmox-csi Ready=False HealthCheckFailed: health check failed after' in first_line
        assert '(blocks flux-system/apps); waiting behind them: flux-system/apps' in first_line
        assert "- flux-system/proxmox-csi: Ready=False HealthCheckFailed: health check failed after" in message
        assert "- flux-system/apps waits on flux-system/proxmox-csi (Ready=False DependencyNotReady: dependency 'flux-system/proxmox-csi' " \
               "is not ready)" in message
        gate = run.result_values('Gate on the Flux Kustomization tree')[0]
        assert gate['blockers'][0]['name'] == 'flux-system/proxmox-csi' and gate['blockers'][0]['blocks'] == ['flux-system/apps']
    finally:
        lab.clear('flux-healthcheck-fail', 'flux-system/proxmox-csi')
    run = gitops_cluster.site('--tags', 'gitops')
    assert run.rc == 0, run.explain()


def test_a_commit_that_breaks_the_build_fails_the_gate_naming_the_kustomization_and_kustomizes_error(gitops_cluster):
    """The fault: in the default world the simulation's build of proxmox-csi fails as for a missing file; in the upstream
    Flux world a commit pushed to the lab's Git server adds a kustomization.yaml to ./infrastructure/proxmox-csi that
    lists missing.yaml, and kustomize-controller's build fails (docs/lab-flux.md "Faults"). What it applied stays."""
    lab = gitops_cluster.lab
    before = kustomization(gitops_cluster, 'proxmox-csi')['status']['inventory']
    lab.fault('flux-build-fail', 'flux-system/proxmox-csi')
    try:
        wait_until(lambda: (ready_of(kustomization(gitops_cluster, 'proxmox-csi')).get('reason') == 'BuildFailed',
                            ready_of(kustomization(gitops_cluster, 'proxmox-csi'))), timeout=150, what='proxmox-csi BuildFailed')
        wait_until(lambda: kustomizations_ready_at_the_source_revision(gitops_cluster, ('proxmox-csi', 'apps')), timeout=120,
                   what='the other Kustomizations Ready at the revision of the GitRepository')
        run = gitops_cluster.site('--tags', 'gitops', '-e', 'gitops_timeout=3', '-e', 'gitops_wait_sleep=1')
        assert run.rc != 0
        name, message = run.failure_messages()[0]
        assert 'Gate on the Flux Kustomization tree' in name
        assert 'flux-system/proxmox-csi Ready=False BuildFailed: kustomize build failed' in message.splitlines()[0], message
        assert "accumulating resources from 'missing.yaml'" in message, message
        gate = run.result_values('Gate on the Flux Kustomization tree')[0]
        assert gate['blockers'][0]['name'] == 'flux-system/proxmox-csi', gate['blockers']
        # what it applied before stays: the same inventory, its Deployment still there
        assert kustomization(gitops_cluster, 'proxmox-csi')['status']['inventory'] == before
        assert client.AppsV1Api(gitops_cluster.api()).read_namespaced_deployment('proxmox-csi-plugin-controller', 'csi-proxmox')
    finally:
        lab.clear('flux-build-fail', 'flux-system/proxmox-csi')
    run = gitops_cluster.site('--tags', 'gitops')
    assert run.rc == 0, run.explain()


def test_a_crashlooping_csi_node_plugin_fails_the_gate_naming_the_node(gitops_cluster):
    lab = gitops_cluster.lab
    lab.fault('k8s-crashloop', 'lab-w-2', workload='csi-proxmox/proxmox-csi-plugin-node')
    try:
        run = gitops_cluster.site('--tags', 'gitops', '-e', 'gitops_csi_timeout=3', '-e', 'gitops_wait_sleep=1', '-e', 'gitops_timeout=30')
        assert run.rc != 0
        name, message = run.failure_messages()[0]
        assert 'CSI node plugin' in name, run.failure_messages()
        assert 'lab-w-2' in message.splitlines()[0] and 'CrashLoopBackOff' in message, message
        assert 'registered on 5/6 eligible nodes' in message.splitlines()[0]
    finally:
        lab.clear('k8s-crashloop', 'lab-w-2')
    run = gitops_cluster.site('--tags', 'gitops')
    assert run.rc == 0, run.explain()


def test_a_dependency_cycle_in_the_gitops_repository_fails_preflight_naming_it(gitops_cluster, tmp_path):
    repo = str(tmp_path / 'gitops')
    shutil.copytree(os.path.join(ROOT, 'lab', 'gitops'), repo)
    path = os.path.join(repo, 'clusters', 'lab', 'proxmox-ccm.yaml')
    with open(path, encoding='utf-8') as handle:
        doc = yaml.safe_load(handle)
    doc['spec']['dependsOn'] = [{'name': 'proxmox-csi'}]
    with open(path, 'w', encoding='utf-8') as handle:
        yaml.safe_dump(doc, handle)
    run = gitops_cluster.site('--tags', 'preflight', '-e', 'flux_repo_dir=%s' % repo)
    assert run.rc != 0
    name, message = run.failure_messages()[0]
    assert 'Flux dependency graph' in name
    assert 'Kustomization/flux-system/proxmox-ccm' in message and 'Kustomization/flux-system/proxmox-csi' in message and 'cycle' in message
    assert gitops_cluster.site('--tags', 'preflight').rc == 0


def test_a_lab_rebuilt_from_the_same_inventory_gets_the_same_key(gitops_cluster):
    core = client.CoreV1Api(gitops_cluster.api())
    before = core.read_namespaced_secret('sealed-secrets-key', 'kube-system').data['tls.key']
    gitops_cluster.rebuild()
    run = gitops_cluster.site()
    assert run.rc == 0, run.explain()
    after = client.CoreV1Api(gitops_cluster.api()).read_namespaced_secret('sealed-secrets-key', 'kube-system').data['tls.key']
    assert base64.b64decode(after) == base64.b64decode(before)
    keypair = run.result_values('Keep the sealed-secrets keypair')[0]
    assert keypair['changed'] is False
    written = run.result_values("The controller's active key Secret")[0]
    assert written['operation'] == 'created' and written['public_key_sha256'] == keypair['public_key_sha256']
    served = run.result_values('The sealed-secrets controller serves our certificate')[0]
    assert served['passed'] and served['served_public_key_sha256'] == keypair['public_key_sha256']


def test_preflight_cross_checks_the_apps_stage_releases_against_flux_and_reports_a_contradiction(gitops_cluster, tmp_path):
    # The lab's bootstrap_apps_releases install widget-operator before widget-demo (widget-demo needs it). A repository
    # whose Flux tree orders them the other way round contradicts that; preflight derives the releases it checks from
    # the apps stage's own list (no hand-kept copy), so it sees it.
    repo = str(tmp_path / 'gitops')
    shutil.copytree(os.path.join(ROOT, 'lab', 'gitops'), repo)
    kustomizations = []
    for name, depends in (('widget-operator', ['widget-demo']), ('widget-demo', [])):
        spec = {'interval': '1h', 'path': './apps/lab', 'prune': True, 'sourceRef': {'kind': 'GitRepository', 'name': 'flux-system'}}
        if depends:
            spec['dependsOn'] = [{'name': need} for need in depends]
        kustomizations.append({'apiVersion': 'kustomize.toolkit.fluxcd.io/v1', 'kind': 'Kustomization',
                               'metadata': {'name': name, 'namespace': 'flux-system'}, 'spec': spec})
    with open(os.path.join(repo, 'clusters', 'lab', 'widgets.yaml'), 'w', encoding='utf-8') as handle:
        yaml.safe_dump_all(kustomizations, handle)
    warned = gitops_cluster.site('--tags', 'preflight', '-e', 'flux_repo_dir=%s' % repo)
    assert warned.rc == 0, warned.explain()
    lint = warned.result_values('Lint the Flux dependency graph')[0]
    assert [(c['release'], c['needs']) for c in lint['bootstrap_contradictions']] == [('widgets/widget-demo', 'widgets-system/widget-operator')]
    message = lint['bootstrap_contradictions'][0]['message']
    assert 'bootstrap installs widgets-system/widget-operator before widgets/widget-demo' in message
    assert 'Kustomization/flux-system/widget-operator' in message and 'Kustomization/flux-system/widget-demo' in message
    failed = gitops_cluster.site('--tags', 'preflight', '-e', 'flux_repo_dir=%s' % repo,
                                 '-e', '{"preflight_flux_fail_on": ["cycles", "dangling", "bootstrap_contradictions"]}')
    assert failed.rc != 0
    name, text = failed.failure_messages()[0]
    assert 'Flux dependency graph' in name and 'bootstrap installs widgets-system/widget-operator before widgets/widget-demo' in text
    # the lab's own repository has no contradiction with those releases
    clean = gitops_cluster.site('--tags', 'preflight', '-e', '{"preflight_flux_fail_on": ["cycles", "dangling", "bootstrap_contradictions"]}')
    assert clean.rc == 0, clean.explain()
    assert clean.result_values('Lint the Flux dependency graph')[0]['bootstrap_contradictions'] == []
