"""_flux: a Kustomization is done only when it applied its source's current revision and handled the reconcile
request made of it; a periodic no-change reconcile is not a failure; a suspended one is named at once.

The status objects are shaped as the pinned controllers write them:
- kustomize-controller v1.9.5 (Flux v2.9.5) internal/controller/kustomization_controller.go: at the start of every
  reconcile Ready=Unknown `Progressing` "Reconciliation in progress" and Reconciling=True `Progressing` "Fetching
  manifests for revision ... with a timeout of ..." (:323-326); on success lastAppliedRevision (:533-534), Ready=True
  `ReconciliationSucceeded` "Applied revision: ..." (:536-540) and a status.history snapshot of the build's digest
  with lastReconciledStatus `ReconciliationSucceeded` and metadata.revision (:541-545; a failed apply, prune or
  health check records `ReconciliationFailed`, `PruneFailed`, `HealthCheckFailed` instead, :473-529; newest first,
  fluxcd/pkg apis/meta v1.30.2 history.go Upsert); finalizeStatus copies the reconcile request to
  lastHandledReconcileAt (:1297-1300), drops Reconciling and sets observedGeneration when Ready is True (:1302-1307).
  Every condition carries the object's generation as observedGeneration (fluxcd/pkg runtime/conditions/setter.go).
- source-controller v1.6.2: status.artifact.revision `<branch>@sha1:<hash>` (fluxcd/pkg git/git.go:97-102,
  Commit.String), lastHandledReconcileAt from RecordReconcileReq (internal/reconcile/summarize/processor.go:42-46).
"""

import os
import sys

from ansible_collections.proxtalos.cluster.plugins.module_utils import _flux
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import gates
from ansible_collections.proxtalos.cluster.tests.helpers import FakeClock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '_k8s'))
from fake_kube import FakeKube  # noqa: E402  pylint: disable=wrong-import-position,import-error

OLD = 'main@sha1:1111111111111111111111111111111111111111'
NEW = 'main@sha1:2222222222222222222222222222222222222222'
SOURCE = ('GitRepository', 'flux-system', 'flux-system')


def succeeded(name='apps', revision=OLD, generation=3, requested=None, handled=None, **spec):
    """A Kustomization after a successful reconcile of `revision` (finalizeStatus done)."""
    body = {'interval': '10m', 'path': './%s' % name, 'prune': True, 'sourceRef': {'kind': 'GitRepository', 'name': 'flux-system'}}
    body.update(spec)
    meta = {'name': name, 'namespace': 'flux-system', 'generation': generation}
    if requested:
        meta['annotations'] = {_flux.REQUESTED_AT: requested}
    status = {'observedGeneration': generation, 'lastAppliedRevision': revision, 'lastAttemptedRevision': revision,
              'conditions': [{'type': 'Ready', 'status': 'True', 'reason': 'ReconciliationSucceeded', 'observedGeneration': generation,
                              'message': 'Applied revision: %s' % revision, 'lastTransitionTime': '2026-11-27T10:00:00Z'}]}
    if handled:
        status['lastHandledReconcileAt'] = handled
    status['history'] = [snapshot('ReconciliationSucceeded', revision)]
    return {'apiVersion': 'kustomize.toolkit.fluxcd.io/v1', 'kind': 'Kustomization', 'metadata': meta, 'spec': body, 'status': status}


def snapshot(outcome, revision, digest='sha256:' + 'b' * 64):
    """One status.history entry (fluxcd/pkg apis/meta v1.30.2 history.go Snapshot) as kustomize-controller records a
    reconcile that got as far as a build."""
    return {'digest': digest, 'firstReconciled': '2026-11-27T10:00:00Z', 'lastReconciled': '2026-11-27T10:00:00Z',
            'lastReconciledDuration': '1.2s', 'lastReconciledStatus': outcome, 'totalReconciliations': 1,
            'metadata': {'revision': revision}}


def reconciling(obj, revision):
    """The same object patched at the start of a reconcile of `revision` (kustomization_controller.go:341-347)."""
    gen = obj['metadata']['generation']
    obj['status']['conditions'] = [
        {'type': 'Reconciling', 'status': 'True', 'reason': 'Progressing', 'observedGeneration': gen,
         'message': 'Fetching manifests for revision %s with a timeout of 9m30s' % revision},
        {'type': 'Ready', 'status': 'Unknown', 'reason': 'Progressing', 'observedGeneration': gen, 'message': 'Reconciliation in progress'}]
    return obj


def gitrepository(revision=NEW, requested=None, handled=None):
    meta = {'name': 'flux-system', 'namespace': 'flux-system', 'generation': 1}
    if requested:
        meta['annotations'] = {_flux.REQUESTED_AT: requested}
    status = {'observedGeneration': 1,
              'conditions': [{'type': 'Ready', 'status': 'True', 'reason': 'Succeeded', 'observedGeneration': 1,
                              'message': "stored artifact for revision '%s'" % revision}],
              'artifact': {'revision': revision, 'digest': 'sha256:' + 'a' * 64, 'lastUpdateTime': '2026-11-27T10:00:00Z',
                           'path': 'gitrepository/flux-system/flux-system/x.tar.gz', 'size': 1024,
                           'url': 'http://source-controller.flux-system.svc.cluster.local./gitrepository/flux-system/flux-system/x.tar.gz'}}
    if handled:
        status['lastHandledReconcileAt'] = handled
    return {'apiVersion': 'source.toolkit.fluxcd.io/v1', 'kind': 'GitRepository', 'metadata': meta, 'spec': {'url': 'https://git.example/r'},
            'status': status}


def judge(kustomizations, source):
    return _flux.assess(kustomizations, sources={SOURCE: source} if source is not None else {})


def test_ready_for_the_old_commit_is_not_ready_after_the_source_moved_on():
    verdict = judge([succeeded(revision=OLD)], gitrepository(NEW))
    assert not verdict.ok and not verdict.failed
    assert verdict.items[0]['reason'] == 'applied revision %s, source GitRepository flux-system/flux-system has %s (not applied yet)' % (OLD, NEW)
    assert judge([succeeded(revision=NEW)], gitrepository(NEW)).ok


def test_a_source_without_artifact_or_missing_is_not_ready():
    bare = gitrepository()
    del bare['status']['artifact']
    assert judge([succeeded(revision=NEW)], bare).items[0]['reason'] == 'source GitRepository flux-system/flux-system has no artifact yet'
    assert judge([succeeded(revision=NEW)], None).items[0]['reason'] == 'source GitRepository flux-system/flux-system not found'


def test_a_reconcile_request_is_not_done_until_handled():
    pending = judge([succeeded(revision=NEW, requested='2026-11-27T16:40:00Z', handled='2026-11-27T09:00:00Z')], gitrepository(NEW))
    assert not pending.ok
    assert pending.items[0]['reason'] == ('reconcile requested at 2026-11-27T16:40:00Z not handled yet '
                                          '(lastHandledReconcileAt 2026-11-27T09:00:00Z)')
    assert judge([succeeded(revision=NEW, requested='2026-11-27T16:40:00Z', handled='2026-11-27T16:40:00Z')], gitrepository(NEW)).ok


def test_a_reconcile_request_on_the_source_is_not_done_until_the_source_handled_it():
    source = gitrepository(OLD, requested='2026-11-27T16:40:00Z')
    verdict = judge([succeeded(revision=OLD)], source)
    assert verdict.items[0]['reason'] == ('source GitRepository flux-system/flux-system: reconcile requested at 2026-11-27T16:40:00Z '
                                          'not handled yet (lastHandledReconcileAt -)')
    source['status']['lastHandledReconcileAt'] = '2026-11-27T16:40:00Z'
    assert judge([succeeded(revision=OLD)], source).ok


def test_a_periodic_reconcile_of_an_applied_revision_is_tolerated():
    verdict = judge([reconciling(succeeded(revision=NEW), NEW)], gitrepository(NEW))
    assert verdict.ok, verdict.summary
    assert verdict.items[0]['note'] == 'periodic reconcile in progress; revision %s already applied at generation 3' % NEW


def test_a_reconcile_of_a_new_revision_or_a_new_spec_is_waited_for():
    new_revision = judge([reconciling(succeeded(revision=OLD), NEW)], gitrepository(NEW))
    assert not new_revision.ok and new_revision.items[0]['reason'] == 'Ready=Unknown Progressing: Reconciliation in progress'
    new_spec = reconciling(succeeded(revision=NEW), NEW)
    new_spec['metadata']['generation'] = 4
    for cond in new_spec['status']['conditions']:
        cond['observedGeneration'] = 4
    assert not judge([new_spec], gitrepository(NEW)).ok
    requested = reconciling(succeeded(revision=NEW, requested='2026-11-27T16:40:00Z', handled='2026-11-27T09:00:00Z'), NEW)
    assert not judge([requested], gitrepository(NEW)).ok


def test_a_suspended_kustomization_is_named_at_once():
    never = succeeded(suspend=True)
    never['status'] = {}
    verdict = judge([never, succeeded('infra', revision=NEW)], gitrepository(NEW))
    assert verdict.failed and not verdict.ok
    assert verdict.items[0]['name'] == 'flux-system/apps' and verdict.items[0]['suspended']
    assert 'suspended (spec.suspend: true)' in verdict.summary


def test_the_gate_stops_on_a_suspended_kustomization_instead_of_timing_out():
    clock = FakeClock()
    kube = FakeKube(clock)
    kube.serve('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', 'kustomizations')
    kube.serve('source.toolkit.fluxcd.io/v1', 'GitRepository', 'gitrepositories')
    never = succeeded(suspend=True)
    never['status'] = {}
    kube.add(never, gitrepository(NEW))
    outcome = gates.run(_flux.TreeGate({'namespace': 'flux-system', 'names': []}), kube, 600, 2, clock=clock.clock, sleep=clock.sleep)
    assert not outcome.passed and outcome.verdict.failed
    assert outcome.result.elapsed < 1
    assert 'flux-system/apps suspended' in gates.explain(outcome, kube)


def test_the_gate_reads_the_sources_and_waits_for_the_new_revision():
    clock = FakeClock()
    kube = FakeKube(clock)
    kube.serve('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', 'kustomizations')
    kube.serve('source.toolkit.fluxcd.io/v1', 'GitRepository', 'gitrepositories')
    kube.add(succeeded(revision=OLD), gitrepository(NEW))

    def applied(fake):
        fake.remove('Kustomization', 'apps')
        fake.add(succeeded(revision=NEW))
    kube.at(10, applied)
    outcome = gates.run(_flux.TreeGate({'namespace': 'flux-system', 'names': []}), kube, 60, 2, clock=clock.clock, sleep=clock.sleep)
    assert outcome.passed and 10 <= outcome.result.elapsed < 14
    assert ('list', 'GitRepository', 'flux-system', None, None) in kube.calls


def test_stalled_for_a_reason_upstream_stalls_on_fails_at_once():
    stalled = succeeded()
    stalled['status']['conditions'] = [
        {'type': 'Stalled', 'status': 'True', 'reason': 'InvalidCELExpression', 'observedGeneration': 3, 'message': 'x'},
        {'type': 'Ready', 'status': 'False', 'reason': 'InvalidCELExpression', 'observedGeneration': 3, 'message': 'x'}]
    verdict = judge([stalled], gitrepository(NEW))
    assert verdict.failed and verdict.items[0]['reason'] == 'Stalled InvalidCELExpression: x'


# --- HelmRelease: its released chart against its HelmChart's artifact ------------------------------------------------
# helm-controller v1.3.0: status.helmChart `namespace/name` (api/v2/helmrelease_types.go:973-976, set in
# internal/reconcile/helmchart_template.go:174), status.history snapshots (api/v2/snapshot_types.go:125-141: version,
# status, chartName, chartVersion, ...), Ready True `UpgradeSucceeded`; source-controller v1.6.2 HelmChart artifact
# revision = the chart version (internal/controller/helmchart_controller.go:843).

def helmrelease(released='6.5.3', version=2):
    return {'apiVersion': 'helm.toolkit.fluxcd.io/v2', 'kind': 'HelmRelease',
            'metadata': {'name': 'podinfo', 'namespace': 'apps', 'generation': 1},
            'spec': {'interval': '1h', 'chart': {'spec': {'chart': 'podinfo', 'sourceRef': {'kind': 'HelmRepository', 'name': 'podinfo'}}}},
            'status': {'observedGeneration': 1, 'lastAttemptedGeneration': 1, 'lastAttemptedRevision': released,
                       'helmChart': 'apps/apps-podinfo',
                       'history': [{'name': 'podinfo', 'namespace': 'apps', 'version': version, 'status': 'deployed',
                                    'chartName': 'podinfo', 'chartVersion': released, 'appVersion': released,
                                    'configDigest': 'sha256:' + 'c' * 64, 'digest': 'sha256:' + 'd' * 64,
                                    'firstDeployed': '2026-11-27T10:00:00Z', 'lastDeployed': '2026-11-27T11:00:00Z'}],
                       'conditions': [{'type': 'Ready', 'status': 'True', 'reason': 'UpgradeSucceeded', 'observedGeneration': 1,
                                       'message': 'Helm upgrade succeeded for release apps/podinfo.v%d with chart podinfo@%s' % (version, released)},
                                      {'type': 'Released', 'status': 'True', 'reason': 'UpgradeSucceeded', 'observedGeneration': 1,
                                       'message': 'Helm upgrade succeeded'}]}}


def helmchart(revision):
    return {'apiVersion': 'source.toolkit.fluxcd.io/v1', 'kind': 'HelmChart', 'metadata': {'name': 'apps-podinfo', 'namespace': 'apps',
                                                                                           'generation': 1},
            'spec': {'chart': 'podinfo', 'version': '*', 'sourceRef': {'kind': 'HelmRepository', 'name': 'podinfo'}},
            'status': {'observedGeneration': 1, 'artifact': {'revision': revision, 'digest': 'sha256:' + 'e' * 64,
                                                             'path': 'helmchart/apps/apps-podinfo/podinfo-%s.tgz' % revision}}}


def test_a_helmrelease_ready_for_the_previous_chart_is_not_ready_until_it_releases_the_new_one():
    kube = FakeKube()
    kube.serve('helm.toolkit.fluxcd.io/v2', 'HelmRelease', 'helmreleases')
    kube.serve('source.toolkit.fluxcd.io/v1', 'HelmChart', 'helmcharts')
    kube.add(helmrelease('6.5.3'), helmchart('6.5.4'))
    gate = gates.build_gate({'gate': 'condition', 'api_version': 'helm.toolkit.fluxcd.io/v2', 'kind': 'HelmRelease',
                             'namespace': 'apps', 'name': 'podinfo'})
    verdict = gate.observe(kube)
    assert not verdict.ok
    assert verdict.items[0]['reason'] == ('released chart 6.5.3 (release v2 deployed), HelmChart apps/apps-podinfo has 6.5.4 '
                                          '(not released yet)')
    kube.remove('HelmRelease', 'podinfo')
    kube.add(helmrelease('6.5.4', version=3))
    assert gate.observe(kube).ok


def test_a_retry_after_a_failed_health_check_is_not_taken_for_a_periodic_reconcile():
    # a health check failed at this generation and revision (kustomization_controller.go:1071 Healthy and :528-529
    # Ready False HealthCheckFailed); the retry starts with Ready Unknown Progressing and leaves Healthy False until
    # its health checks run again (:1053-1054). Without status.history (a controller before it) Healthy=False is what
    # tells the retry apart; once its health checks run, only the history can (the test after the next ones).
    retry = reconciling(succeeded(revision=NEW), NEW)
    del retry['status']['history']
    retry['status']['conditions'].append({'type': 'Healthy', 'status': 'False', 'reason': 'HealthCheckFailed', 'observedGeneration': 3,
                                          'message': 'health check failed after 5m0s: timeout waiting for: [Deployment/apps/web status: InProgress]'})
    assert not judge([retry], gitrepository(NEW)).ok
    retry['status']['conditions'][-1].update(status='Unknown', reason='Progressing', message='Running health checks for revision x')
    assert judge([retry], gitrepository(NEW)).ok


def test_an_external_artifact_source_is_read_and_compared_like_the_others():
    """kustomize-controller api v1.9.5 v1/reference_types.go:33 allows ExternalArtifact as sourceRef kind; its
    status.artifact is the same Artifact (source-controller api v1.9.5 v1/externalartifact_types.go:39-46)."""
    external = gitrepository(NEW)
    external['kind'] = 'ExternalArtifact'
    ks = succeeded(revision=NEW, sourceRef={'kind': 'ExternalArtifact', 'name': 'flux-system'})
    key = ('ExternalArtifact', 'flux-system', 'flux-system')
    assert _flux.SOURCE_APIS['ExternalArtifact'] == 'source.toolkit.fluxcd.io/v1'
    assert _flux.assess([ks], sources={key: external}).ok
    behind = _flux.assess([succeeded(revision=OLD, sourceRef={'kind': 'ExternalArtifact', 'name': 'flux-system'})],
                          sources={key: external})
    assert not behind.ok and 'not applied yet' in behind.items[0]['reason']


def test_a_source_kind_the_gate_does_not_read_is_not_taken_as_missing():
    verdict = _flux.assess([succeeded(revision=NEW, sourceRef={'kind': 'FutureSource', 'name': 'x'})], sources={})
    assert verdict.ok, verdict.items
    assert verdict.items[0]['note'] == 'source kind FutureSource is not one the gate reads; its revision is not compared'


def test_a_retry_after_a_failed_apply_at_the_applied_revision_is_waited_for():
    # Reviewer finding 8: an apply failed at the revision already applied (a drift the API server refused:
    # kustomization_controller.go:471-476 records ReconciliationFailed in status.history and Ready=False); the retry
    # starts with Ready=Unknown Progressing (:325-326) and Healthy still True from the last success, so only the
    # history tells it apart from a periodic reconcile of a healthy tree.
    retry = reconciling(succeeded(revision=NEW), NEW)
    retry['status']['conditions'].append({'type': 'Healthy', 'status': 'True', 'reason': 'Succeeded', 'observedGeneration': 3,
                                          'message': 'Health check passed in 1.1s'})
    retry['status']['history'].insert(0, snapshot('ReconciliationFailed', NEW))
    verdict = judge([retry], gitrepository(NEW))
    assert not verdict.ok
    assert verdict.items[0]['reason'] == 'Ready=Unknown Progressing: Reconciliation in progress'
    # the same retry once it succeeded again: Upsert moves the success snapshot of the same digest to the front
    retry['status']['history'].reverse()
    assert judge([retry], gitrepository(NEW)).ok


def test_a_retry_after_a_failed_health_check_stays_waited_for_once_its_health_checks_run():
    # HealthCheckFailed in the history (:528) keeps the retry out while its health checks run (Healthy=Unknown
    # Progressing, :1053-1054), where the Healthy condition alone no longer tells it apart
    retry = reconciling(succeeded(revision=NEW), NEW)
    retry['status']['conditions'].append({'type': 'Healthy', 'status': 'Unknown', 'reason': 'Progressing', 'observedGeneration': 3,
                                          'message': 'Running health checks for revision %s with a timeout of 9m30s' % NEW})
    retry['status']['history'].insert(0, snapshot('HealthCheckFailed', NEW))
    assert not judge([retry], gitrepository(NEW)).ok
    for outcome in ('PruneFailed', 'ReconciliationFailed'):
        retry['status']['history'][0]['lastReconciledStatus'] = outcome
        assert not judge([retry], gitrepository(NEW)).ok


def test_a_kustomization_without_history_is_judged_by_its_conditions():
    # a controller from before status.history (the field is omitempty): the conditions alone decide, as before
    periodic = reconciling(succeeded(revision=NEW), NEW)
    del periodic['status']['history']
    assert judge([periodic], gitrepository(NEW)).ok
