"""_flux: the Kustomization tree in dependsOn order, blockers and what waits behind them, and the gate's diagnosis."""

import os
import sys

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _flux

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '_k8s'))
from fake_kube import FakeKube  # noqa: E402  pylint: disable=wrong-import-position,import-error

REVISION = 'main@sha1:0123456789abcdef0123456789abcdef01234567'


def ks(name, depends=(), ready='True', reason='ReconciliationSucceeded', message=None, generation=1, observed=1, **spec):
    conditions = []
    if ready is not None:
        conditions.append({'type': 'Ready', 'status': ready, 'reason': reason, 'observedGeneration': observed,
                           'message': message or ('Applied revision: %s' % REVISION if ready == 'True' else '')})
    body = {'interval': '10m', 'prune': True, 'sourceRef': {'kind': 'GitRepository', 'name': 'flux-system'}, 'path': './%s' % name}
    body.update(spec)
    if depends:
        body['dependsOn'] = [{'name': d} if '/' not in d else {'name': d.split('/')[1], 'namespace': d.split('/')[0]} for d in depends]
    return {'apiVersion': 'kustomize.toolkit.fluxcd.io/v1', 'kind': 'Kustomization',
            'metadata': {'name': name, 'namespace': 'flux-system', 'generation': generation},
            'spec': body, 'status': {'observedGeneration': observed if ready == 'True' else -1, 'conditions': conditions,
                                     # kustomize-controller v1.6.1 kustomization_controller.go:523, set with Ready=True
                                     'lastAppliedRevision': REVISION if ready == 'True' else None}}


def gitrepository(revision=REVISION):
    """The flux-system GitRepository with its artifact (source-controller api/v1.6.0 api/v1/artifact_types.go)."""
    return {'apiVersion': 'source.toolkit.fluxcd.io/v1', 'kind': 'GitRepository', 'metadata': {'name': 'flux-system', 'namespace': 'flux-system'},
            'status': {'conditions': [{'type': 'Ready', 'status': 'True', 'reason': 'Succeeded'}],
                       'artifact': {'revision': revision, 'digest': 'sha256:' + '0' * 64, 'path': 'p', 'url': 'u'}}}


HEALTH = ("health check failed after 5m0.02s: timeout waiting for: [DaemonSet/csi-proxmox/proxmox-csi-plugin-node status: 'InProgress']")


def lab_tree(csi=None):
    return [
        ks('flux-system'), ks('sealed-secrets'), ks('proxmox-ccm'), ks('cert-manager'),
        csi or ks('proxmox-csi', ['proxmox-ccm']),
        ks('cert-manager-issuers', ['cert-manager']),
        ks('apps', ['sealed-secrets', 'proxmox-csi', 'cert-manager-issuers'],
           ready='False' if csi else 'True', reason='DependencyNotReady' if csi else 'ReconciliationSucceeded',
           message="dependency 'flux-system/proxmox-csi' is not ready" if csi else None),
    ]


def test_a_ready_tree_passes_in_dependsOn_order():
    verdict = _flux.assess(lab_tree())
    assert verdict.ok and verdict.summary == 'Kustomizations Ready 7/7'
    assert [(i['name'], i['tier']) for i in verdict.items] == [
        ('flux-system/cert-manager', 0), ('flux-system/flux-system', 0), ('flux-system/proxmox-ccm', 0), ('flux-system/sealed-secrets', 0),
        ('flux-system/cert-manager-issuers', 1), ('flux-system/proxmox-csi', 1), ('flux-system/apps', 2)]
    assert _flux.blockers(verdict) == []


def test_a_failing_kustomization_is_named_with_its_reason_and_what_it_blocks():
    csi = ks('proxmox-csi', ['proxmox-ccm'], ready='False', reason='HealthCheckFailed', message=HEALTH)
    verdict = _flux.assess(lab_tree(csi))
    assert not verdict.ok and not verdict.failed
    assert verdict.summary == ('Kustomizations Ready 5/7: flux-system/proxmox-csi Ready=False HealthCheckFailed: %s '
                               '(blocks flux-system/apps); waiting behind them: flux-system/apps' % HEALTH)
    assert _flux.blockers(verdict) == [{'name': 'flux-system/proxmox-csi', 'reason': 'Ready=False HealthCheckFailed: %s' % HEALTH,
                                        'message': HEALTH, 'blocks': ['flux-system/apps']}]
    apps = verdict.items[-1]
    assert apps['role'] == 'blocked' and apps['blocked_by'] == ['flux-system/proxmox-csi'] and apps['waits_on'] == ['flux-system/proxmox-csi']


def test_blockers_are_found_at_the_root_of_a_chain():
    tree = [ks('a', ready='False', reason='BuildFailed', message='kustomize build failed: x'),
            ks('b', ['a'], ready='False', reason='DependencyNotReady', message="dependency 'flux-system/a' is not ready"),
            ks('c', ['b'], ready='False', reason='DependencyNotReady', message="dependency 'flux-system/b' is not ready"),
            ks('d', ['c', 'e']), ks('e')]
    tree[3]['status']['conditions'][0].update(status='False', reason='DependencyNotReady', message="dependency 'flux-system/c' is not ready")
    verdict = _flux.assess(tree)
    by_name = dict((i['name'], i) for i in verdict.items)
    assert by_name['flux-system/c']['blocked_by'] == ['flux-system/a'] and by_name['flux-system/c']['waits_on'] == ['flux-system/b']
    assert by_name['flux-system/d']['blocked_by'] == ['flux-system/a']
    assert _flux.blockers(verdict)[0]['blocks'] == ['flux-system/b', 'flux-system/c', 'flux-system/d']


def test_a_missing_dependency_and_a_cycle_are_blockers():
    missing = _flux.assess([ks('apps', ['database'], ready='False', reason='DependencyNotReady',
                               message="dependency 'flux-system/database' not found")])
    assert missing.items[0]['role'] == 'blocker'
    assert missing.items[0]['reason'].startswith('depends on flux-system/database, which does not exist')
    assert not missing.failed
    cycle = _flux.assess([ks('a', ['b'], ready='False', reason='DependencyNotReady'), ks('b', ['a'], ready='False', reason='DependencyNotReady'),
                          ks('c', ['a'], ready='False', reason='DependencyNotReady')])
    assert cycle.failed
    reasons = dict((i['name'], i['reason']) for i in cycle.items)
    assert reasons['flux-system/a'] == 'dependency cycle: flux-system/a -> flux-system/b -> flux-system/a'
    assert [i['name'] for i in cycle.items if i['role'] == 'blocked'] == ['flux-system/c']


def test_generation_lag_stalled_and_expected_names():
    lagging = _flux.assess([ks('apps', generation=2, observed=1)])
    assert not lagging.ok and 'not reconciled yet' in lagging.items[0]['reason']
    stalled = ks('apps', ready='False', reason='InvalidCELExpression')
    stalled['status']['conditions'].append({'type': 'Stalled', 'status': 'True', 'reason': 'InvalidCELExpression', 'message': 'bad expr',
                                            'observedGeneration': 1})
    stalled['status']['observedGeneration'] = 1
    assert _flux.assess([stalled]).failed
    fresh = ks('apps', ready=None)
    verdict = _flux.assess([fresh], expected=['flux-system/apps', 'flux-system/sealed-secrets'])
    assert verdict.problems == ['Kustomization flux-system/sealed-secrets not found (not applied yet?)']
    assert verdict.items[0]['reason'] == 'no Ready condition yet (waiting to be reconciled)'
    assert _flux.assess([]).problems == ['no Kustomizations found']


def test_health_targets_come_from_health_checks_or_the_inventory():
    checks = ks('proxmox-csi', healthChecks=[{'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'name': 'node', 'namespace': 'csi-proxmox'},
                                             {'apiVersion': 'apps/v1', 'kind': 'Deployment', 'name': 'controller'}])
    assert _flux.health_targets(checks) == [('apps/v1', 'DaemonSet', 'csi-proxmox', 'node'), ('apps/v1', 'Deployment', 'flux-system', 'controller')]
    waits = ks('cert-manager', wait=True)
    waits['status']['inventory'] = {'entries': [{'id': 'cert-manager_cert-manager_apps_Deployment', 'v': 'v1'},
                                                {'id': '_certificates.cert-manager.io_apiextensions.k8s.io_CustomResourceDefinition', 'v': 'v1'},
                                                {'id': 'cert-manager_cert-manager__Namespace', 'v': 'v1'}]}
    assert _flux.health_targets(waits) == [('apps/v1', 'Deployment', 'cert-manager', 'cert-manager'),
                                           ('apiextensions.k8s.io/v1', 'CustomResourceDefinition', '', 'certificates.cert-manager.io'),
                                           ('v1', 'Namespace', 'cert-manager', 'cert-manager')]


def test_the_gate_diagnosis_names_the_node_where_a_health_checked_daemonset_fails():
    csi = ks('proxmox-csi', ['proxmox-ccm'], ready='False', reason='HealthCheckFailed', message=HEALTH,
             healthChecks=[{'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'name': 'proxmox-csi-plugin-node', 'namespace': 'csi-proxmox'}])
    csi['status']['conditions'].append({'type': 'Healthy', 'status': 'False', 'reason': 'HealthCheckFailed', 'message': HEALTH})
    kube = FakeKube()
    kube.serve('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', 'kustomizations')
    kube.serve('source.toolkit.fluxcd.io/v1', 'GitRepository', 'gitrepositories')
    kube.add(*lab_tree(csi))
    kube.add(gitrepository())
    selector = {'app.kubernetes.io/name': 'proxmox-csi-plugin', 'app.kubernetes.io/component': 'node'}
    daemonset = {'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'metadata': {'name': 'proxmox-csi-plugin-node', 'namespace': 'csi-proxmox',
                                                                            'uid': 'ds-1', 'generation': 1},
                 'spec': {'selector': {'matchLabels': selector}, 'template': {'metadata': {'labels': selector},
                                                                              'spec': {'tolerations': [{'operator': 'Exists'}]}}},
                 'status': {'observedGeneration': 1, 'desiredNumberScheduled': 2, 'numberReady': 1, 'updatedNumberScheduled': 2,
                            'currentNumberScheduled': 2, 'numberAvailable': 1}}
    nodes = []
    pods = []
    for index, node in enumerate(('w-1', 'w-2')):
        nodes.append({'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': node, 'labels': {'kubernetes.io/hostname': node}},
                      'spec': {}, 'status': {'conditions': [{'type': 'Ready', 'status': 'True', 'reason': 'KubeletReady'}]}})
        crash = node == 'w-2'
        pods.append({'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'proxmox-csi-plugin-node-%d' % index, 'namespace': 'csi-proxmox',
                                                                     'labels': selector, 'ownerReferences': [{'kind': 'DaemonSet', 'uid': 'ds-1',
                                                                                                             'name': 'proxmox-csi-plugin-node'}]},
                     'spec': {'nodeName': node},
                     'status': {'phase': 'Running', 'conditions': [{'type': 'Ready', 'status': 'False' if crash else 'True'}],
                                'containerStatuses': [{'name': 'proxmox-csi-plugin-node', 'ready': not crash, 'restartCount': 4 if crash else 0,
                                                       'state': {'waiting': {'reason': 'CrashLoopBackOff', 'message': 'back-off 5m0s'}}
                                                       if crash else {'running': {}}}]}})
    kube.add(daemonset, *nodes)
    kube.add(*pods)
    gate = _flux.TreeGate({'namespace': 'flux-system', 'names': []})
    verdict = gate.observe(kube)
    lines = gate.diagnose(kube, verdict)
    assert lines[0] == 'flux-system/proxmox-csi: Ready=False HealthCheckFailed: %s; blocks flux-system/apps' % HEALTH
    text = '\n'.join(lines)
    assert 'DaemonSet csi-proxmox/proxmox-csi-plugin-node: DaemonSet csi-proxmox/proxmox-csi-plugin-node Ready on 1/2' in text
    assert 'w-2: proxmox-csi-plugin-node-1 CrashLoopBackOff' in text
    assert lines[-1].startswith('flux-system/apps waits on flux-system/proxmox-csi (Ready=False DependencyNotReady')


def test_kustomizations_not_served_is_a_problem_not_a_crash():
    verdict = _flux.TreeGate({'namespace': None, 'names': []}).observe(FakeKube())
    assert not verdict.ok and 'Flux not installed?' in verdict.summary


@pytest.mark.parametrize('graph, tiers', [
    ({'a': [], 'b': ['a'], 'c': ['b', 'x']}, [['a'], ['b'], ['c']]),
    ({'a': ['b'], 'b': []}, [['b'], ['a']]),
])
def test_order_ignores_dependencies_that_are_not_there(graph, tiers):
    assert _flux.order(graph) == (tiers, [])
