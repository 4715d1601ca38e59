"""flux_graph: does the GitOps tree need the bootstrap releases before Flux applies it (bootstrap_needs)?

Each reason code on a small tree in tmp_path, the cases that must not count, the lab's real tree against the lab's
real releases (the widget-operator chart rendered by the real helm binary, as roles/bootstrap_apps/tasks/render.yml
renders it), and bad bootstrap_rendered shapes.
"""
import io
import json
import os
import shutil
import subprocess

import pytest
import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils import _flux_graph
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
LAB_TREE = os.path.join(ROOT, 'lab', 'gitops')
LAB_FILES = os.path.join(ROOT, 'inventories', 'lab', 'files')
HELM = os.path.join(ROOT, '.tools', 'bin', 'helm')


def write_tree(root, files):
    """files: repository-relative path -> a document (mapping) or a list of documents."""
    for relpath, content in files.items():
        path = os.path.join(str(root), relpath)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        documents = content if isinstance(content, list) else [content]
        with open(path, 'w', encoding='utf-8') as handle:
            yaml.safe_dump_all(documents, handle, sort_keys=False)
    return str(root)


def needs(root, rendered, **load):
    return _flux_graph.bootstrap_needs(_flux_graph.load_repo(str(root), **load), _flux_graph.check_bootstrap_rendered(rendered))


def obj(api_version, kind, name, namespace=None, **fields):
    metadata = {'name': name}
    if namespace:
        metadata['namespace'] = namespace
    return dict({'apiVersion': api_version, 'kind': kind, 'metadata': metadata}, **fields)


def crd(group, kind, plural, scope='Namespaced'):
    return obj('apiextensions.k8s.io/v1', 'CustomResourceDefinition', '%s.%s' % (plural, group),
               spec={'group': group, 'scope': scope, 'names': {'kind': kind, 'plural': plural},
                     'versions': [{'name': 'v1', 'served': True, 'storage': True}]})


def flux_ks(name, path, source_kind='GitRepository', **spec):
    return obj('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', name, 'flux-system',
               spec=dict({'interval': '1h', 'path': path, 'prune': True, 'sourceRef': {'kind': source_kind, 'name': 'flux-system'}}, **spec))


def helm_release(name, namespace, **spec):
    return obj('helm.toolkit.fluxcd.io/v2', 'HelmRelease', name, namespace,
               spec=dict({'interval': '1h', 'chart': {'spec': {'chart': name, 'sourceRef': {'kind': 'HelmRepository', 'name': 'charts'}}}}, **spec))


DEPLOYMENT = obj('apps/v1', 'Deployment', 'web', 'web', spec={'replicas': 1})
OPERATOR = {'crds': [crd('example.dev', 'Gizmo', 'gizmos')],
            'objects': [obj('v1', 'ServiceAccount', 'gizmo-operator', 'gizmos'),
                        obj('apps/v1', 'Deployment', 'gizmo-operator', spec={'replicas': 1}),
                        obj('rbac.authorization.k8s.io/v1', 'ClusterRole', 'gizmo-operator', rules=[]),
                        obj('v1', 'Namespace', 'web')]}


def reasons(findings):
    return [finding['reason'] for finding in findings]


# --- each reason ---------------------------------------------------------------------------------------------------

def test_uses_crd_names_object_file_and_release(tmp_path):
    tree = write_tree(tmp_path, {'apps/gizmo.yaml': obj('example.dev/v1', 'Gizmo', 'blue', 'web'),
                                 'apps/deployment.yaml': DEPLOYMENT})
    findings = needs(tree, {'gizmos/gizmo-operator': OPERATOR})
    assert findings == [{
        'release': 'gizmos/gizmo-operator', 'object': 'Gizmo web/blue', 'file': 'apps/gizmo.yaml', 'reason': 'uses_crd',
        'message': 'Gizmo web/blue (apps/gizmo.yaml) is of API group example.dev, whose CustomResourceDefinition '
                   'gizmos.example.dev bootstrap release gizmos/gizmo-operator brings: it cannot be applied before that release'}]


def test_uses_crd_also_from_a_crd_among_the_objects_and_cluster_scope_from_the_crd(tmp_path):
    tree = write_tree(tmp_path, {'issuer.yaml': obj('certs.example.dev/v1', 'Authority', 'root')})
    release = {'crds': [], 'objects': [crd('certs.example.dev', 'Authority', 'authorities', scope='Cluster')]}
    findings = needs(tree, {'certs/certs': release})
    assert [(f['reason'], f['object'], f['release']) for f in findings] == [('uses_crd', 'Authority root', 'certs/certs')]


def test_uses_api_service(tmp_path):
    tree = write_tree(tmp_path, {'metrics.yaml': obj('metrics.example.dev/v1beta1', 'NodeMetric', 'n1')})
    service = obj('apiregistration.k8s.io/v1', 'APIService', 'v1beta1.metrics.example.dev',
                  spec={'group': 'metrics.example.dev', 'version': 'v1beta1', 'service': {'name': 'metrics', 'namespace': 'kube-system'}})
    findings = needs(tree, {'kube-system/metrics': {'crds': [], 'objects': [service]}})
    assert reasons(findings) == ['uses_api_service']
    assert findings[0]['release'] == 'kube-system/metrics'
    assert 'APIService v1beta1.metrics.example.dev of bootstrap release kube-system/metrics' in findings[0]['message']
    assert 'NodeMetric n1 (metrics.yaml)' in findings[0]['message']


def test_same_object_in_the_releases_namespace_and_cluster_scoped(tmp_path):
    # The tree's Deployment gets gizmos from its kustomization.yaml; the release's has no namespace: the release's.
    tree = write_tree(tmp_path, {
        'ops/kustomization.yaml': {'apiVersion': 'kustomize.config.k8s.io/v1beta1', 'kind': 'Kustomization',
                                   'namespace': 'gizmos', 'resources': ['deployment.yaml', 'clusterrole.yaml']},
        'ops/deployment.yaml': obj('apps/v1', 'Deployment', 'gizmo-operator', spec={'replicas': 3}),
        'ops/clusterrole.yaml': obj('rbac.authorization.k8s.io/v1', 'ClusterRole', 'gizmo-operator', rules=[])})
    findings = needs(tree, {'gizmos/gizmo-operator': OPERATOR})
    assert [(f['reason'], f['object'], f['file']) for f in findings] == [
        ('same_object', 'ClusterRole gizmo-operator', 'ops/clusterrole.yaml'),
        ('same_object', 'Deployment gizmos/gizmo-operator', 'ops/deployment.yaml')]
    assert findings[1]['message'] == ('Deployment gizmos/gizmo-operator (ops/deployment.yaml) is the same object as the Deployment '
                                      'gizmos/gizmo-operator that bootstrap release gizmos/gizmo-operator installs: Flux and the '
                                      'release would both manage it')


def test_same_name_in_another_namespace_is_not_the_same_object(tmp_path):
    tree = write_tree(tmp_path, {'deployment.yaml': obj('apps/v1', 'Deployment', 'gizmo-operator', 'staging', spec={})})
    assert needs(tree, {'gizmos/gizmo-operator': OPERATOR}) == []


def test_same_object_through_the_flux_kustomizations_target_namespace(tmp_path):
    tree = write_tree(tmp_path, {'clusters/ops.yaml': flux_ks('ops', './ops', targetNamespace='gizmos'),
                                 'ops/deployment.yaml': obj('apps/v1', 'Deployment', 'gizmo-operator', 'staging', spec={})})
    findings = needs(tree, {'gizmos/gizmo-operator': OPERATOR})
    assert [(f['reason'], f['file']) for f in findings] == [('same_object', 'ops/deployment.yaml')]


@pytest.mark.parametrize('spec, namespace', [
    ({}, 'gizmos'),                                                   # metadata.name in its own namespace
    ({'releaseName': 'gizmo-operator'}, 'flux-system'),               # spec.releaseName
    ({'targetNamespace': 'gizmos'}, 'flux-system'),                   # composed: <targetNamespace>-<name>
])
def test_takes_over_release(tmp_path, spec, namespace):
    name = 'operator' if spec.get('targetNamespace') else 'gizmo-operator'
    release_id = 'gizmos/gizmos-operator' if spec.get('targetNamespace') else 'gizmos/gizmo-operator'
    if spec.get('releaseName'):
        spec = dict(spec, storageNamespace='gizmos')
    tree = write_tree(tmp_path, {'hr.yaml': helm_release(name, namespace, **spec)})
    findings = needs(tree, {release_id: OPERATOR})
    assert [(f['reason'], f['release'], f['object']) for f in findings] == [
        ('takes_over_release', release_id, 'HelmRelease %s/%s' % (namespace, name))]
    assert '(hr.yaml)' in findings[0]['message'] and release_id in findings[0]['message']


def test_release_name_alone_in_another_namespace_is_not_a_takeover(tmp_path):
    tree = write_tree(tmp_path, {'hr.yaml': helm_release('gizmo-operator', 'staging')})
    findings = needs(tree, {'gizmos/gizmo-operator': OPERATOR})
    assert [(f['reason'], f['release']) for f in findings] == [('unreadable_helmrelease', None)]
    assert findings[0]['message'].startswith('HelmRelease staging/gizmo-operator (hr.yaml) installs a chart whose objects cannot be read ahead')


def test_unreadable_sources(tmp_path):
    tree = write_tree(tmp_path, {
        'clusters/oci.yaml': flux_ks('from-oci', './oci', source_kind='OCIRepository'),
        'clusters/elsewhere.yaml': flux_ks('elsewhere', './not-here'),
        'clusters/here.yaml': flux_ks('here', './apps'),
        'apps/deployment.yaml': DEPLOYMENT,
        'remote/kustomization.yaml': {'apiVersion': 'kustomize.config.k8s.io/v1beta1', 'kind': 'Kustomization',
                                      'resources': ['https://example.org/manifests.yaml']}})
    with open(os.path.join(tree, 'apps', 'template.yaml'), 'w', encoding='utf-8') as handle:
        handle.write('kind: Deployment\nmetadata:\n  name: {{ .Release.Name }\n  labels: [\n')
    findings = needs(tree, {'gizmos/gizmo-operator': OPERATOR})
    assert all(f['reason'] == 'unreadable_source' and f['release'] is None for f in findings)
    assert [(f['object'], f['file']) for f in findings] == [
        (None, 'apps/template.yaml'),
        (None, 'remote/kustomization.yaml'),
        ('Kustomization flux-system/elsewhere', 'clusters/elsewhere.yaml'),
        ('Kustomization flux-system/from-oci', 'clusters/oci.yaml')]
    assert 'spec.path ./not-here, which is not a directory of this repository' in findings[2]['message']
    assert 'applies from OCIRepository flux-system' in findings[3]['message']


def test_a_path_left_out_by_exclude_cannot_be_read(tmp_path):
    tree = write_tree(tmp_path, {'clusters/here.yaml': flux_ks('here', './apps'), 'apps/deployment.yaml': DEPLOYMENT})
    assert needs(tree, {'gizmos/gizmo-operator': OPERATOR}) == []
    findings = needs(tree, {'gizmos/gizmo-operator': OPERATOR}, exclude=['apps/*'])
    assert [(f['reason'], f['object']) for f in findings] == [('unreadable_source', 'Kustomization flux-system/here')]
    assert 'left out by exclude' in findings[0]['message']


@pytest.mark.parametrize('groups, counts', [
    (['example.dev'], False),          # only its own CRD group
    (['*'], True),
    ([''], True),                      # core: Pods, Secrets...
    (['apps'], True),
])
def test_webhook(tmp_path, groups, counts):
    tree = write_tree(tmp_path, {'apps/deployment.yaml': DEPLOYMENT})
    rule = {'apiGroups': groups, 'apiVersions': ['*'], 'operations': ['CREATE'], 'resources': ['*']}
    hook = obj('admissionregistration.k8s.io/v1', 'ValidatingWebhookConfiguration', 'gizmo-validator',
               webhooks=[{'name': 'v.example.dev', 'rules': [rule]}])
    release = {'crds': OPERATOR['crds'], 'objects': OPERATOR['objects'] + [hook]}
    findings = needs(tree, {'gizmos/gizmo-operator': release})
    if not counts:
        assert findings == []
        return
    assert [(f['reason'], f['release'], f['object'], f['file']) for f in findings] == [
        ('webhook', 'gizmos/gizmo-operator', 'ValidatingWebhookConfiguration gizmo-validator', None)]
    assert findings[0]['message'].startswith('bootstrap release gizmos/gizmo-operator installs ValidatingWebhookConfiguration gizmo-validator')


# --- what does not count -------------------------------------------------------------------------------------------

def test_a_shared_namespace_an_unserved_group_and_flux_kinds_do_not_count(tmp_path):
    flux_release = {'crds': [crd('kustomize.toolkit.fluxcd.io', 'Kustomization', 'kustomizations'),
                             crd('source.toolkit.fluxcd.io', 'GitRepository', 'gitrepositories')], 'objects': []}
    tree = write_tree(tmp_path, {
        'apps/namespace.yaml': obj('v1', 'Namespace', 'web'),                     # the operator release renders it too
        'apps/other.yaml': obj('other.example.dev/v1', 'Gizmo', 'x', 'web'),     # a group no release serves...
        'apps/other-crd.yaml': crd('other.example.dev', 'Gizmo', 'gizmos'),       # ...the tree's own CRD defines
        'apps/deployment.yaml': DEPLOYMENT,
        'clusters/apps.yaml': flux_ks('apps', './apps'),                          # Flux's kinds, even with Flux CRDs rendered
        'clusters/source.yaml': obj('source.toolkit.fluxcd.io/v1', 'GitRepository', 'other', 'flux-system',
                                    spec={'url': 'https://example.org/x.git'})})
    assert needs(tree, {'gizmos/gizmo-operator': OPERATOR, 'flux-system/flux': flux_release}) == []


def test_kustomize_configs_patches_and_partial_documents_are_not_objects(tmp_path):
    tree = write_tree(tmp_path, {
        'apps/kustomization.yaml': {'apiVersion': 'kustomize.config.k8s.io/v1beta1', 'kind': 'Kustomization',
                                    'resources': ['deployment.yaml'], 'patches': [{'path': 'patch.yaml'}]},
        'apps/deployment.yaml': DEPLOYMENT,
        # Would be same_object and uses_crd if they were objects.
        'apps/patch.yaml': obj('apps/v1', 'Deployment', 'gizmo-operator', 'gizmos', spec={'replicas': 2}),
        'apps/smp.yaml': dict(obj('example.dev/v1', 'Gizmo', 'g', 'web'), **{'$patch': 'delete'}),
        'apps/nameless.yaml': {'apiVersion': 'example.dev/v1', 'kind': 'Gizmo', 'metadata': {'labels': {'a': 'b'}}},
        'apps/partial-hr.yaml': {'apiVersion': 'helm.toolkit.fluxcd.io/v2', 'kind': 'HelmRelease',
                                 'metadata': {'name': 'gizmo-operator', 'namespace': 'gizmos'}, 'spec': {'values': {'a': 1}}}})
    assert needs(tree, {'gizmos/gizmo-operator': OPERATOR}) == []


def test_no_releases_no_findings(tmp_path):
    tree = write_tree(tmp_path, {'hr.yaml': helm_release('anything', 'x'),
                                 'clusters/oci.yaml': flux_ks('from-oci', './oci', source_kind='OCIRepository')})
    assert needs(tree, {}) == []


# --- critical rules, Flux's own needs, admission at run time, other repositories, unknown APIs, the run's additions -----

def ccm_release():
    """proxmox-ccm as a bootstrap release, without objects that count by themselves (no kube-system workload)."""
    return {'crds': [], 'objects': [obj('v1', 'ServiceAccount', 'proxmox-ccm', 'kube-system'),
                                    obj('rbac.authorization.k8s.io/v1', 'ClusterRole', 'proxmox-ccm', rules=[])]}


CSI_TREE = {'clusters/proxmox-csi.yaml': flux_ks('proxmox-csi', './csi'),
            'csi/deployment.yaml': obj('apps/v1', 'Deployment', 'proxmox-csi-controller', 'csi-proxmox', spec={})}


def test_critical_rule_satisfied_only_by_a_bootstrap_release(tmp_path):
    tree = write_tree(tmp_path, CSI_TREE)
    repo = _flux_graph.load_repo(tree)
    releases = _flux_graph.check_bootstrap_rendered({'kube-system/proxmox-ccm': ccm_release()})
    rules = _flux_graph.check_rules(_flux_graph.DEFAULT_RULES)
    assert _flux_graph.bootstrap_needs(repo, releases) == []          # without rules, nothing says the CSI needs it
    findings = _flux_graph.bootstrap_needs(repo, releases, rules)
    assert findings == [{
        'release': 'kube-system/proxmox-ccm', 'object': 'Kustomization flux-system/proxmox-csi', 'file': 'clusters/proxmox-csi.yaml',
        'reason': 'critical_rule',
        'message': 'Kustomization flux-system/proxmox-csi (clusters/proxmox-csi.yaml) is a subject of rule "proxmox-csi needs '
                   'proxmox-ccm" (the CSI reads region and zone from the node labels the CCM sets) and comes after nothing in '
                   'the tree named proxmox-ccm* or proxmox-cloud-controller-manager*: only bootstrap release '
                   'kube-system/proxmox-ccm provides it, so it must come after that release'}]


def test_critical_rule_counts_bootstrap_releases_given_by_name_and_user_rules(tmp_path):
    tree = write_tree(tmp_path, CSI_TREE)
    repo = _flux_graph.load_repo(tree)
    releases = _flux_graph.check_bootstrap_rendered({'kube-system/proxmox-ccm': ccm_release()})
    bootstrap = _flux_graph.check_bootstrap([{'name': 'coredns', 'namespace': 'kube-system'}])
    rules = _flux_graph.check_rules(list(_flux_graph.DEFAULT_RULES) + [{'subject': 'proxmox-csi', 'requires': 'kube-vip'}])
    findings = _flux_graph.bootstrap_needs(repo, releases, rules, bootstrap)
    assert [(f['reason'], f['release'], f['object']) for f in findings] == [
        ('critical_rule', 'kube-system/proxmox-ccm', 'Kustomization flux-system/proxmox-csi'),
        ('critical_rule', 'kube-system/coredns', 'Kustomization flux-system/proxmox-csi')]
    assert 'rule "proxmox-csi needs coredns"' in findings[1]['message']
    own = _flux_graph.check_rules([{'name': 'csi needs kube-vip', 'subject': 'proxmox-csi', 'requires': 'kube-vip'}])
    vip = _flux_graph.check_bootstrap_rendered({'kube-system/kube-vip': {'crds': [], 'objects': []}})
    assert [(f['reason'], f['release']) for f in _flux_graph.bootstrap_needs(repo, vip, own)] == [('critical_rule', 'kube-system/kube-vip')]


def test_critical_rule_not_when_the_tree_orders_the_subject_after_its_own_provider(tmp_path):
    tree = write_tree(tmp_path, dict(CSI_TREE, **{
        'clusters/proxmox-csi.yaml': flux_ks('proxmox-csi', './csi', dependsOn=[{'name': 'proxmox-ccm'}]),
        'clusters/proxmox-ccm.yaml': flux_ks('proxmox-ccm', './ccm'),
        'ccm/sa.yaml': obj('v1', 'ServiceAccount', 'ccm', 'ccm')}))
    rules = _flux_graph.check_rules(_flux_graph.DEFAULT_RULES)
    assert needs_with(tree, {'kube-system/proxmox-ccm': ccm_release()}, rules=rules) == []


def test_critical_rule_through_analyze_uses_the_analysis_rules(tmp_path):
    tree = write_tree(tmp_path, CSI_TREE)
    rendered = {'kube-system/proxmox-ccm': ccm_release()}
    assert reasons(_flux_graph.analyze_path(tree, bootstrap_rendered=rendered)['tree_needs_bootstrap']) == ['critical_rule']
    assert _flux_graph.analyze_path(tree, rules=[], bootstrap_rendered=rendered)['tree_needs_bootstrap'] == []


def needs_with(root, rendered, **options):
    return _flux_graph.bootstrap_needs(_flux_graph.load_repo(str(root)), _flux_graph.check_bootstrap_rendered(rendered), **options)


def daemonset(name, namespace=None, host_network=False, host_port=None):
    port = {'containerPort': 5000}
    if host_port:
        port['hostPort'] = host_port
    pod = {'containers': [{'name': name, 'image': 'example.org/%s:1' % name, 'ports': [port]}]}
    if host_network:
        pod['hostNetwork'] = True
    return obj('apps/v1', 'DaemonSet', name, namespace, spec={'template': {'spec': pod}})


@pytest.mark.parametrize('release_id, objects, expected', [
    ('kube-system/coredns', [obj('v1', 'ConfigMap', 'coredns'), obj('apps/v1', 'Deployment', 'coredns', spec={}),
                             obj('apps/v1', 'StatefulSet', 'other', 'kube-system', spec={})],
     ('Deployment kube-system/coredns', 'a workload in kube-system')),
    ('dns/coredns', [obj('apps/v1', 'Deployment', 'coredns', spec={}), obj('v1', 'Service', 'kube-dns', spec={})],
     ('Service dns/kube-dns', 'the cluster DNS Service')),
    ('mirror/spegel', [daemonset('spegel', host_port=29999)], ('DaemonSet mirror/spegel', 'a DaemonSet with host ports')),
    ('net/cni', [daemonset('cni-agent', 'net', host_network=True)], ('DaemonSet net/cni-agent', 'a DaemonSet on the host network')),
])
def test_cluster_infrastructure(tmp_path, release_id, objects, expected):
    tree = write_tree(tmp_path, {'apps/deployment.yaml': DEPLOYMENT})
    findings = needs(tree, {release_id: {'crds': [], 'objects': objects}})
    assert [(f['reason'], f['release'], f['object'], f['file']) for f in findings] == [
        ('cluster_infrastructure', release_id, expected[0], None)]
    assert findings[0]['message'].startswith('bootstrap release %s installs %s, %s' % (release_id, expected[0], expected[1]))


def test_cluster_infrastructure_not_for_workloads_in_their_own_namespace(tmp_path):
    tree = write_tree(tmp_path, {'apps/deployment.yaml': DEPLOYMENT})
    objects = [obj('apps/v1', 'Deployment', 'gizmo-operator', spec={}), daemonset('gizmo-agent'),
               obj('v1', 'Service', 'dns', 'kube-system', spec={}), obj('v1', 'ConfigMap', 'settings', 'kube-system')]
    assert needs(tree, {'gizmos/gizmo-operator': {'crds': [], 'objects': objects}}) == []


def webhook_role(kind, verbs, groups=('admissionregistration.k8s.io',), resources=('mutatingwebhookconfigurations',), namespace=None):
    rule = {'apiGroups': list(groups), 'resources': list(resources), 'verbs': list(verbs)}
    return obj('rbac.authorization.k8s.io/v1', kind, 'gizmo-webhooks', namespace, rules=[{'apiGroups': [''], 'resources': ['secrets'],
                                                                                          'verbs': ['get']}, rule])


@pytest.mark.parametrize('document, label', [
    (obj('admissionregistration.k8s.io/v1', 'ValidatingAdmissionPolicy', 'no-latest', spec={}), 'ValidatingAdmissionPolicy no-latest'),
    (obj('admissionregistration.k8s.io/v1', 'ValidatingAdmissionPolicyBinding', 'no-latest', spec={}),
     'ValidatingAdmissionPolicyBinding no-latest'),
    (obj('admissionregistration.k8s.io/v1alpha1', 'MutatingAdmissionPolicy', 'labels', spec={}), 'MutatingAdmissionPolicy labels'),
    (obj('admissionregistration.k8s.io/v1alpha1', 'MutatingAdmissionPolicyBinding', 'labels', spec={}),
     'MutatingAdmissionPolicyBinding labels'),
])
def test_webhook_admission_policies(tmp_path, document, label):
    tree = write_tree(tmp_path, {'apps/deployment.yaml': DEPLOYMENT})
    findings = needs(tree, {'gizmos/gizmo-operator': {'crds': OPERATOR['crds'], 'objects': OPERATOR['objects'] + [document]}})
    assert [(f['reason'], f['release'], f['object']) for f in findings] == [('webhook', 'gizmos/gizmo-operator', label)]
    assert findings[0]['message'].startswith('bootstrap release gizmos/gizmo-operator installs %s, admission policy' % label)


@pytest.mark.parametrize('role, label', [
    (webhook_role('ClusterRole', ['get', 'list', 'patch']), 'ClusterRole gizmo-webhooks'),      # cert-manager's cainjector
    (webhook_role('ClusterRole', ['create'], resources=['validatingwebhookconfigurations']), 'ClusterRole gizmo-webhooks'),
    (webhook_role('ClusterRole', ['*'], groups=['*'], resources=['*']), 'ClusterRole gizmo-webhooks'),
    (webhook_role('Role', ['update'], resources=['*']), 'Role gizmos/gizmo-webhooks'),
])
def test_webhook_registered_at_run_time(tmp_path, role, label):
    tree = write_tree(tmp_path, {'apps/deployment.yaml': DEPLOYMENT})
    findings = needs(tree, {'gizmos/gizmo-operator': {'crds': OPERATOR['crds'], 'objects': OPERATOR['objects'] + [role]}})
    assert [(f['reason'], f['release'], f['object']) for f in findings] == [('webhook', 'gizmos/gizmo-operator', label)]
    assert 'which may create, update or patch admission webhook configurations' in findings[0]['message']


@pytest.mark.parametrize('role', [
    webhook_role('ClusterRole', ['get', 'list', 'watch']),                                       # only reads them
    webhook_role('ClusterRole', ['patch'], groups=['apps']),                                     # another group
    webhook_role('ClusterRole', ['patch'], resources=['validatingadmissionpolicies']),           # another resource
])
def test_webhook_not_for_a_release_that_only_reads_webhook_configurations(tmp_path, role):
    tree = write_tree(tmp_path, {'apps/deployment.yaml': DEPLOYMENT})
    assert needs(tree, {'gizmos/gizmo-operator': {'crds': OPERATOR['crds'], 'objects': OPERATOR['objects'] + [role]}}) == []


def test_unreadable_source_of_another_git_repository(tmp_path):
    tree = write_tree(tmp_path, {
        'clusters/same.yaml': flux_ks('same', './apps'),
        'clusters/other.yaml': obj('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', 'other', 'flux-system',
                                   spec={'path': './apps', 'sourceRef': {'kind': 'GitRepository', 'name': 'platform'}}),
        'clusters/elsewhere.yaml': obj('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', 'elsewhere', 'team-a',
                                       spec={'path': './apps', 'sourceRef': {'kind': 'GitRepository', 'name': 'flux-system'}}),
        'clusters/explicit.yaml': obj('kustomize.toolkit.fluxcd.io/v1', 'Kustomization', 'explicit', 'team-a',
                                      spec={'path': './apps', 'sourceRef': {'kind': 'GitRepository', 'name': 'flux-system',
                                                                            'namespace': 'flux-system'}}),
        'apps/deployment.yaml': DEPLOYMENT})
    assert needs(tree, {'gizmos/gizmo-operator': OPERATOR}) == []            # without bootstrap_source: read as this checkout
    findings = needs_with(tree, {'gizmos/gizmo-operator': OPERATOR}, bootstrap_source='flux-system/flux-system')
    assert [(f['reason'], f['object'], f['file']) for f in findings] == [
        ('unreadable_source', 'Kustomization flux-system/other', 'clusters/other.yaml'),
        ('unreadable_source', 'Kustomization team-a/elsewhere', 'clusters/elsewhere.yaml')]
    assert findings[0]['message'] == (
        'Kustomization flux-system/other (clusters/other.yaml) applies from GitRepository flux-system/platform, not from '
        'flux-system/flux-system that Flux syncs (bootstrap_source), so its objects are not in this checkout and cannot be '
        'read ahead: it may need the bootstrap releases')
    assert 'applies from GitRepository team-a/flux-system' in findings[1]['message']


@pytest.mark.parametrize('source', ['flux-system', 'a/b/c', '/flux-system', 7, ['flux-system', 'flux-system']])
def test_bad_bootstrap_source_names_the_field(tmp_path, source):
    tree = write_tree(tmp_path, {'apps/deployment.yaml': DEPLOYMENT})
    with pytest.raises(ValidationError) as error:
        needs_with(tree, {'gizmos/gizmo-operator': OPERATOR}, bootstrap_source=source)
    assert error.value.field == 'bootstrap_source'
    assert 'namespace/name' in str(error.value)
    with pytest.raises(ValidationError):                 # analyze checks it even without bootstrap_rendered
        _flux_graph.analyze_path(tree, bootstrap_source=source)


def test_unknown_api_once_per_group_and_kind(tmp_path):
    tree = write_tree(tmp_path, {
        'net/policies.yaml': [obj('cilium.io/v2', 'CiliumNetworkPolicy', 'deny', 'web', spec={}),
                              obj('cilium.io/v2', 'CiliumNetworkPolicy', 'allow-dns', 'web', spec={})],
        'net/pool.yaml': obj('cilium.io/v2alpha1', 'CiliumLoadBalancerIPPool', 'pool', spec={}),
        'apps/deployment.yaml': DEPLOYMENT})
    findings = needs(tree, {'gizmos/gizmo-operator': OPERATOR})
    assert [(f['reason'], f['release'], f['object'], f['file']) for f in findings] == [
        ('unknown_api', None, 'CiliumLoadBalancerIPPool pool', 'net/pool.yaml'),
        ('unknown_api', None, 'CiliumNetworkPolicy web/deny', 'net/policies.yaml')]
    assert findings[1]['message'] == (
        'CiliumNetworkPolicy web/deny (net/policies.yaml) is of kind CiliumNetworkPolicy in API group cilium.io, which no '
        'Kubernetes built-in API, no CRD in the tree and no bootstrap release defines: something installed at run time must '
        'create it (an operator, a CNI - maybe a bootstrap release), so it may need the bootstrap releases')


def test_unknown_api_not_for_builtin_flux_tree_crd_or_release_groups(tmp_path):
    builtin = [obj('v1', 'ConfigMap', 'c', 'web'), obj('batch/v1', 'CronJob', 'c', 'web', spec={}),
               obj('networking.k8s.io/v1', 'NetworkPolicy', 'n', 'web', spec={}), obj('policy/v1', 'PodDisruptionBudget', 'p', 'web'),
               obj('storage.k8s.io/v1', 'StorageClass', 's'), obj('scheduling.k8s.io/v1', 'PriorityClass', 'p'),
               obj('autoscaling/v2', 'HorizontalPodAutoscaler', 'h', 'web'), obj('coordination.k8s.io/v1', 'Lease', 'l', 'web'),
               obj('resource.k8s.io/v1', 'DeviceClass', 'd'), obj('node.k8s.io/v1', 'RuntimeClass', 'r', handler='runc')]
    tree = write_tree(tmp_path, {
        'apps/builtin.yaml': builtin,
        'apps/widget-crd.yaml': crd('widgets.example.dev', 'Widget', 'widgets'),
        'apps/widget.yaml': obj('widgets.example.dev/v1', 'Widget', 'w', 'web'),                 # the tree's own CRD
        'flux/instance.yaml': obj('fluxcd.controlplane.io/v1', 'FluxInstance', 'flux', 'flux-system', spec={}),
        'flux/alert.yaml': obj('notification.toolkit.fluxcd.io/v1beta3', 'Alert', 'a', 'flux-system', spec={})})
    assert needs(tree, {'gizmos/gizmo-operator': OPERATOR}) == []
    # A group a release defines is uses_crd, not unknown_api.
    tree = write_tree(tmp_path / 'served', {'apps/gizmo.yaml': obj('example.dev/v1', 'Gizmo', 'g', 'web')})
    assert reasons(needs(tree, {'gizmos/gizmo-operator': OPERATOR})) == ['uses_crd']


SEALED_SECRETS_CRD = crd('bitnami.com', 'SealedSecret', 'sealedsecrets')


def sealed_secret(name, namespace, relpath=None):
    item = obj('bitnami.com/v1alpha1', 'SealedSecret', name, namespace)
    if relpath:
        item['file'] = relpath
    return item


def test_tree_objects_count_like_the_trees_own(tmp_path):
    tree = write_tree(tmp_path, {'apps/deployment.yaml': DEPLOYMENT})
    added = [sealed_secret('creds', 'web', 'apps/creds.sealedsecret.yaml'), sealed_secret('other', 'web')]
    # No CRD for bitnami.com anywhere: unknown_api, once, with the file it will be written to.
    findings = needs_with(tree, {'gizmos/gizmo-operator': OPERATOR}, tree_objects=added)
    assert [(f['reason'], f['object'], f['file']) for f in findings] == [
        ('unknown_api', 'SealedSecret web/creds', 'apps/creds.sealedsecret.yaml')]
    # A release brings the CRD: uses_crd for each; one without a file says it is added by the run.
    release = {'crds': [SEALED_SECRETS_CRD], 'objects': [obj('v1', 'Secret', 'creds', 'web')]}
    findings = needs_with(tree, {'kube-system/sealed-secrets': release}, tree_objects=added)
    assert [(f['reason'], f['object'], f['file']) for f in findings] == [
        ('uses_crd', 'SealedSecret web/creds', 'apps/creds.sealedsecret.yaml'), ('uses_crd', 'SealedSecret web/other', None)]
    assert findings[1]['message'].startswith('SealedSecret web/other (added to the tree by the run) is of API group bitnami.com')
    # same_object: the run adds a Secret a release installs too.
    findings = needs_with(tree, {'kube-system/sealed-secrets': release}, tree_objects=[obj('v1', 'Secret', 'creds', 'web')])
    assert [(f['reason'], f['object']) for f in findings] == [('same_object', 'Secret web/creds')]


def test_tree_objects_already_in_the_tree_count_once_and_a_tree_crd_covers_them(tmp_path):
    tree = write_tree(tmp_path, {'crds/sealed-secrets.yaml': SEALED_SECRETS_CRD,
                                 'apps/creds.sealedsecret.yaml': obj('bitnami.com/v1alpha1', 'SealedSecret', 'creds', 'web')})
    added = [sealed_secret('creds', 'web', 'apps/creds.sealedsecret.yaml'), sealed_secret('more', 'web')]
    assert needs_with(tree, {'gizmos/gizmo-operator': OPERATOR}, tree_objects=added) == []
    release = {'crds': [SEALED_SECRETS_CRD], 'objects': []}
    findings = needs_with(tree, {'kube-system/sealed-secrets': release}, tree_objects=added)
    assert [(f['reason'], f['object'], f['file']) for f in findings] == [
        ('uses_crd', 'SealedSecret web/creds', 'apps/creds.sealedsecret.yaml'),
        ('same_object', 'CustomResourceDefinition sealedsecrets.bitnami.com', 'crds/sealed-secrets.yaml'),   # both install it
        ('uses_crd', 'SealedSecret web/more', None)]


@pytest.mark.parametrize('objects, field', [
    ({'apiVersion': 'v1'}, 'tree_objects'),
    (['kind: Secret'], 'tree_objects[0]'),
    ([{'kind': 'Secret', 'metadata': {'name': 'a'}}], 'tree_objects[0].apiVersion'),
    ([{'apiVersion': 'v1', 'kind': '', 'metadata': {'name': 'a'}}], 'tree_objects[0].kind'),
    ([{'apiVersion': 'v1', 'kind': 'Secret'}], 'tree_objects[0].metadata'),
    ([{'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {'namespace': 'a'}}], 'tree_objects[0].metadata.name'),
    ([{'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {'name': 'a', 'namespace': ['x']}}], 'tree_objects[0].metadata.namespace'),
    ([{'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {'name': 'a'}}, {'apiVersion': 'v1', 'kind': 'Secret',
                                                                          'metadata': {'name': 'b'}, 'file': 5}], 'tree_objects[1].file'),
])
def test_bad_tree_objects_name_the_field(objects, field):
    with pytest.raises(ValidationError) as error:
        _flux_graph.check_tree_objects(objects)
    assert error.value.field == field
    assert str(error.value).startswith(field + ': ')


def test_uses_crd_names_the_crd_of_the_objects_kind(tmp_path):
    tree = write_tree(tmp_path, {'certs/certificate.yaml': obj('cert-manager.io/v1', 'Certificate', 'web', 'web', spec={})})
    release = {'crds': [crd('cert-manager.io', 'CertificateRequest', 'certificaterequests'), crd('cert-manager.io', 'Certificate', 'certificates')],
               'objects': []}
    findings = needs(tree, {'cert-manager/cert-manager': release})
    assert reasons(findings) == ['uses_crd']
    assert 'whose CustomResourceDefinition certificates.cert-manager.io bootstrap release' in findings[0]['message']


# --- the shape of bootstrap_rendered -------------------------------------------------------------------------------

@pytest.mark.parametrize('rendered, field', [
    ([], 'bootstrap_rendered'),
    ({'widget-operator': {'crds': [], 'objects': []}}, 'bootstrap_rendered["widget-operator"]'),
    ({'a/b/c': {'crds': [], 'objects': []}}, 'bootstrap_rendered["a/b/c"]'),
    ({'ns/app': []}, 'bootstrap_rendered["ns/app"]'),
    ({'ns/app': {'objects': []}}, 'bootstrap_rendered["ns/app"].crds'),
    ({'ns/app': {'crds': [], 'objects': {'kind': 'Deployment'}}}, 'bootstrap_rendered["ns/app"].objects'),
    ({'ns/app': {'crds': ['kind: CustomResourceDefinition'], 'objects': []}}, 'bootstrap_rendered["ns/app"].crds[0]'),
    ({'ns/app': {'crds': [], 'objects': [{}, None]}}, 'bootstrap_rendered["ns/app"].objects[1]'),
])
def test_bad_shapes_name_the_field(rendered, field):
    with pytest.raises(ValidationError) as error:
        _flux_graph.check_bootstrap_rendered(rendered)
    assert error.value.field == field
    assert str(error.value).startswith(field + ': ')


# --- the lab: its real tree against its real releases ---------------------------------------------------------------

def render_chart(chart, name, namespace, values):
    """{'crds': [...], 'objects': [...]} as render.yml splits `helm template --include-crds` (crds/ folder vs templates)."""
    argv = [HELM, 'template', name, chart, '--namespace', namespace, '--include-crds']
    for key, value in values.items():
        argv += ['--set', '%s=%s' % (key, value)]
    output = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    split = {'crds': [], 'objects': []}
    for section in ('\n' + output).split('\n---\n# Source: ')[1:]:
        source, _newline, text = section.partition('\n')
        documents = [doc for doc in yaml.safe_load_all(text) if isinstance(doc, dict)]
        crds_folder = source.split('/')[1:2] == ['crds']
        split['crds' if crds_folder else 'objects'].extend(
            doc for doc in documents if not crds_folder or doc.get('kind') == 'CustomResourceDefinition')
    return split


def lab_rendered():
    """The lab's two releases (inventories/lab/group_vars/all/apps.yml) as bootstrap_apps_rendered holds them."""
    with open(os.path.join(ROOT, 'inventories', 'lab', 'group_vars', 'all', 'apps.yml'), encoding='utf-8') as handle:
        releases = yaml.safe_load(handle)['bootstrap_apps_releases']
    rendered = {}
    for release in releases:
        key = '%s/%s' % (release['namespace'], release['name'])
        if 'chart' in release:
            chart = release['chart']['ref'].replace('{{ inventory_dir }}/files', LAB_FILES)
            rendered[key] = render_chart(chart, release['name'], release['namespace'], release.get('values') or {})
            continue
        documents = []
        for manifest in release['manifests']:
            with open(manifest.replace('{{ inventory_dir }}/files', LAB_FILES), encoding='utf-8') as handle:
                documents.extend(doc for doc in yaml.safe_load_all(handle) if isinstance(doc, dict))
        rendered[key] = {'crds': [doc for doc in documents if doc.get('kind') == 'CustomResourceDefinition'],
                         'objects': [doc for doc in documents if doc.get('kind') != 'CustomResourceDefinition']}
    return rendered


@pytest.fixture(scope='module')
def lab_releases():
    if not os.access(HELM, os.X_OK):
        pytest.fail('the helm binary %s is missing: run make setup' % HELM)
    rendered = lab_rendered()
    # What the test relies on: the chart rendered its CRD from crds/ and its workloads from templates/.
    assert [doc['metadata']['name'] for doc in rendered['widgets-system/widget-operator']['crds']] == ['widgets.lab.proxtalos.dev']
    assert 'Deployment' in [doc['kind'] for doc in rendered['widgets-system/widget-operator']['objects']]
    assert [doc['metadata']['name'] for doc in rendered['widgets/widget-demo']['crds']] == ['gadgets.lab.proxtalos.dev']
    return rendered


def test_the_lab_tree_does_not_need_the_lab_releases(lab_releases):
    repo = _flux_graph.load_repo(LAB_TREE)
    assert len(repo.objects) > 30      # the tree was read: cert-manager, sealed-secrets, CSI, CCM, podinfo...
    assert _flux_graph.bootstrap_needs(repo, _flux_graph.check_bootstrap_rendered(lab_releases)) == []


def lab_sealed_secrets():
    """The SealedSecrets the flux stage seals into the lab's repository (flux_sealed_secrets), as the role passes them."""
    with open(os.path.join(ROOT, 'inventories', 'lab', 'group_vars', 'all', 'flux.yml'), encoding='utf-8') as handle:
        sealed = yaml.safe_load(handle)['flux_sealed_secrets']
    return [{'apiVersion': 'bitnami.com/v1alpha1', 'kind': 'SealedSecret', 'metadata': {'name': item['name'], 'namespace': item['namespace']},
             'file': item['path']} for item in sealed]


def test_the_lab_tree_with_the_roles_options_does_not_need_the_lab_releases(lab_releases):
    """As the flux role asks: the default rules, the GitRepository Flux syncs and the sealed secrets the run adds."""
    added = lab_sealed_secrets()
    assert sorted((item['metadata']['namespace'], item['metadata']['name']) for item in added) == [
        ('csi-proxmox', 'proxmox-csi-plugin'), ('flux-system', 'flux-system')]
    report = _flux_graph.analyze_path(LAB_TREE, bootstrap_rendered=lab_releases, bootstrap_source='flux-system/flux-system',
                                      tree_objects=added)
    assert report['tree_needs_bootstrap'] == []
    # The options are read: another synced repository makes every Kustomization unreadable; without the tree's
    # sealed-secrets CRD the added SealedSecrets are of an unknown API.
    other = _flux_graph.analyze_path(LAB_TREE, bootstrap_rendered=lab_releases, bootstrap_source='flux-system/platform')
    assert set(reasons(other['tree_needs_bootstrap'])) == set(['unreadable_source'])
    without_crd = _flux_graph.analyze_path(LAB_TREE, bootstrap_rendered=lab_releases, tree_objects=added,
                                           exclude=['infrastructure/sealed-secrets/crd.yaml'])
    assert [(f['reason'], f['object']) for f in without_crd['tree_needs_bootstrap']] == [
        ('unknown_api', 'SealedSecret csi-proxmox/proxmox-csi-plugin')]


def test_the_lab_tree_with_a_helmrelease_taking_over_the_operator(tmp_path, lab_releases):
    tree = str(tmp_path / 'gitops')
    shutil.copytree(LAB_TREE, tree)
    write_tree(tree, {'clusters/lab/widget-operator.yaml': [
        obj('source.toolkit.fluxcd.io/v1', 'HelmRepository', 'widgets', 'flux-system', spec={'url': 'https://charts.example.org'}),
        helm_release('widget-operator', 'widgets-system')]})
    findings = needs(tree, lab_releases)
    assert findings == [{
        'release': 'widgets-system/widget-operator', 'object': 'HelmRelease widgets-system/widget-operator',
        'file': 'clusters/lab/widget-operator.yaml', 'reason': 'takes_over_release',
        'message': 'HelmRelease widgets-system/widget-operator (clusters/lab/widget-operator.yaml) manages Helm release '
                   'widget-operator in namespace widgets-system, which is bootstrap release widgets-system/widget-operator: '
                   'Flux would take it over, so it must come after that release'}]


# --- through analyze and the command line --------------------------------------------------------------------------

def test_findings_are_not_warnings_errors_or_failures(tmp_path):
    tree = write_tree(tmp_path, {'apps/gizmo.yaml': obj('example.dev/v1', 'Gizmo', 'blue', 'web')})
    plain = _flux_graph.analyze_path(tree)
    report = _flux_graph.analyze_path(tree, bootstrap_rendered={'gizmos/gizmo-operator': OPERATOR}, fail_on=list(_flux_graph.FINDINGS))
    assert 'tree_needs_bootstrap' not in plain
    assert reasons(report['tree_needs_bootstrap']) == ['uses_crd']
    assert report.pop('tree_needs_bootstrap') and report == plain
    with pytest.raises(ValidationError) as error:
        _flux_graph.analyze_path(tree, bootstrap_rendered={'gizmos': OPERATOR})
    assert error.value.field == 'bootstrap_rendered["gizmos"]'


def test_cli_bootstrap_rendered(tmp_path):
    tree = write_tree(tmp_path / 'tree', {'apps/gizmo.yaml': obj('example.dev/v1', 'Gizmo', 'blue', 'web')})
    rendered = tmp_path / 'rendered.json'
    rendered.write_text(json.dumps({'gizmos/gizmo-operator': OPERATOR}), encoding='utf-8')
    out = io.StringIO()
    assert _flux_graph.main([tree, '--bootstrap-rendered', str(rendered)], stdout=out) == 0
    assert 'the tree needs the bootstrap releases: yes (1 findings)' in out.getvalue()
    assert 'needs (uses_crd): Gizmo web/blue (apps/gizmo.yaml) is of API group example.dev' in out.getvalue()
    out = io.StringIO()
    assert _flux_graph.main([tree, '--bootstrap-rendered', str(rendered), '--format', 'json'], stdout=out) == 0
    assert reasons(json.loads(out.getvalue())['tree_needs_bootstrap']) == ['uses_crd']
    rendered.write_text('{"gizmo-operator": {"crds": [], "objects": []}}', encoding='utf-8')
    assert _flux_graph.main([tree, '--bootstrap-rendered', str(rendered)], stdout=io.StringIO()) == 2
    out = io.StringIO()
    assert _flux_graph.main([tree], stdout=out) == 0 and 'bootstrap releases' not in out.getvalue()


def test_cli_bootstrap_source_and_tree_objects(tmp_path):
    tree = write_tree(tmp_path / 'tree', {'clusters/platform.yaml': obj(
        'kustomize.toolkit.fluxcd.io/v1', 'Kustomization', 'platform', 'flux-system',
        spec={'path': './clusters', 'sourceRef': {'kind': 'GitRepository', 'name': 'platform'}})})
    rendered = tmp_path / 'rendered.json'
    rendered.write_text(json.dumps({'gizmos/gizmo-operator': OPERATOR}), encoding='utf-8')
    added = tmp_path / 'added.yaml'
    added.write_text(yaml.safe_dump([sealed_secret('creds', 'web')]), encoding='utf-8')
    out = io.StringIO()
    assert _flux_graph.main([tree, '--bootstrap-rendered', str(rendered), '--bootstrap-source', 'flux-system/flux-system',
                             '--tree-objects', str(added), '--format', 'json'], stdout=out) == 0
    assert reasons(json.loads(out.getvalue())['tree_needs_bootstrap']) == ['unknown_api', 'unreadable_source']
    assert _flux_graph.main([tree, '--bootstrap-rendered', str(rendered), '--bootstrap-source', 'platform'], stdout=io.StringIO()) == 2
