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
        'apps/other.yaml': obj('other.example.dev/v1', 'Gizmo', 'x', 'web'),     # a group no release serves
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
