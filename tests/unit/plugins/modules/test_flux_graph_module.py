"""flux_graph module: read-only, fails on cycles and dangling references, warns on the rest."""
import os
import shutil

import pytest

from ansible_collections.proxtalos.cluster.plugins.modules import flux_graph
from ansible_collections.proxtalos.cluster.tests.helpers import run_module

FIXTURES = os.path.join(os.path.dirname(__file__), '..', 'module_utils', 'fixtures', 'flux_repos')
REPOS = None


@pytest.fixture(scope='module', autouse=True)
def repos(tmp_path_factory):
    """The fixture repositories with their *.yaml.in files renamed to *.yaml (see module_utils/test_flux_graph.py)."""
    global REPOS  # pylint: disable=global-statement
    REPOS = str(tmp_path_factory.mktemp('flux_repos'))
    shutil.copytree(FIXTURES, REPOS, dirs_exist_ok=True)
    for directory, _dirnames, filenames in os.walk(REPOS):
        for filename in filenames:
            if filename.endswith('.in'):
                os.rename(os.path.join(directory, filename), os.path.join(directory, filename[:-3]))
    yield REPOS


def run(capsys, **args):
    return run_module(flux_graph, capsys, **args)[0]


@pytest.fixture
def warnings(monkeypatch):
    """What the module passes to AnsibleModule.warn (where warnings end up depends on the process)."""
    seen = []
    monkeypatch.setattr(flux_graph.AnsibleModule, 'warn', lambda self, message: seen.append(message))
    return seen


def test_clean_repo_passes_unchanged(capsys, warnings):
    result = run(capsys, path=os.path.join(REPOS, 'clean'))
    assert result.get('failed') is not True
    assert result['changed'] is False
    assert result['counts']['Kustomization']['total'] == 6
    assert result['mermaid'].startswith('flowchart LR')
    assert warnings == []


def test_cycle_fails_with_the_cycle_named(capsys):
    result = run(capsys, path=os.path.join(REPOS, 'cycle'), _ansible_check_mode=True)
    assert result['failed'] is True
    assert 'app-a -> Kustomization/flux-system/app-b -> Kustomization/flux-system/app-c -> Kustomization/flux-system/app-a' in result['msg']
    assert len(result['cycles']) == 2


def test_dangling_fails(capsys):
    result = run(capsys, path=os.path.join(REPOS, 'dangling'))
    assert result['failed'] is True and len(result['dangling']) == 3
    assert 'cache, which is not in the repository' in result['msg']


def test_missing_critical_warns_then_fails_on_request(capsys, warnings):
    result = run(capsys, path=os.path.join(REPOS, 'missing_critical'))
    assert result.get('failed') is not True
    assert len(result['missing_critical']) == 3
    assert any('proxmox-csi needs proxmox-ccm' in warning for warning in warnings)
    strict = run(capsys, path=os.path.join(REPOS, 'missing_critical'), fail_on=['missing_critical'])
    assert strict['failed'] is True and len(strict['errors']) == 3


def test_own_rules_only(capsys):
    result = run(capsys, path=os.path.join(REPOS, 'missing_critical'), use_default_rules=False,
                 rules=[{'subject': ['monitoring'], 'requires': ['cert-manager']}])
    assert [item['node'] for item in result['missing_critical']] == ['Kustomization/flux-system/monitoring']


def test_bootstrap_helmfile_cross_check(capsys):
    path = os.path.join(REPOS, 'bootstrap')
    result = run(capsys, path=path, bootstrap_helmfile=os.path.join(path, 'bootstrap', 'helmfile.yaml'))
    assert result.get('failed') is not True
    assert [item['type'] for item in result['bootstrap_contradictions']] == ['reversed']
    failing = run(capsys, path=path, bootstrap_helmfile=os.path.join(path, 'bootstrap', 'helmfile.yaml'),
                  fail_on=['cycles', 'dangling', 'bootstrap_contradictions'])
    assert failing['failed'] is True and 'needs kube-system/cilium' in failing['msg']


def test_bad_input_names_the_field(capsys):
    result = run(capsys, path=os.path.join(REPOS, 'no-such-repo'))
    assert result['failed'] is True and result['field'] == 'path'
    result = run(capsys, path=os.path.join(REPOS, 'clean'), rules=[{'subject': ['x']}])
    assert result['failed'] is True and result['field'] == 'rules[0].requires'


def test_skipped_documents_are_returned_under_a_name_ansible_does_not_read_as_status(capsys):
    """A result key `skipped` would be taken by Ansible as the task's own skipped flag (it warns and converts it)."""
    result = run(capsys, path=os.path.join(REPOS, 'counts'))
    assert 'skipped' not in result
    reasons = dict((item['file'], item['reason']) for item in result['skipped_documents'])
    assert reasons['apps/podinfo/patches/interval.yaml'] == 'a kustomize patch file'


def test_every_default_rule_firing_reaches_the_user_as_a_warning_then_as_the_failure(capsys, warnings):
    """rules_fire: each default rule has a subject ordered without what it needs (module_utils/test_flux_graph.py has the texts)."""
    path = os.path.join(REPOS, 'rules_fire')
    result = run(capsys, path=path)
    assert result.get('failed') is not True and result['changed'] is False
    assert sorted(set(item['rule'] for item in result['missing_critical'])) == sorted(
        ['cert-manager needs coredns', 'monitoring needs coredns', 'networked workloads need the CNI',
         'proxmox-csi needs coredns', 'proxmox-csi needs proxmox-ccm'])
    assert warnings == [item['message'] for item in result['missing_critical']]
    assert ('Kustomization/flux-system/monitoring (clusters/lab/apps.yaml) is not ordered after Kustomization/flux-system/coredns: '
            'monitoring needs coredns (scrape targets and alert receivers are found by name)') in warnings
    strict = run(capsys, path=path, fail_on=['missing_critical'])
    assert strict['failed'] is True
    assert all(item['message'] in strict['msg'] for item in strict['missing_critical']), strict['msg']


def test_bootstrap_rendered_gives_tree_needs_bootstrap_and_nothing_else(capsys, warnings, tmp_path):
    """The findings are returned, never warned about or failed on; without the option the key is absent."""
    (tmp_path / 'apps').mkdir()
    (tmp_path / 'apps' / 'gizmo.yaml').write_text('apiVersion: example.dev/v1\nkind: Gizmo\nmetadata: {name: blue, namespace: web}\n',
                                                  encoding='utf-8')
    gizmo_crd = {'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition', 'metadata': {'name': 'gizmos.example.dev'},
                 'spec': {'group': 'example.dev', 'scope': 'Namespaced', 'names': {'kind': 'Gizmo', 'plural': 'gizmos'}}}
    rendered = {'gizmos/gizmo-operator': {'crds': [gizmo_crd], 'objects': []}}
    result = run(capsys, path=str(tmp_path), bootstrap_rendered=rendered, fail_on=['cycles', 'dangling', 'missing_critical', 'bootstrap_contradictions'])
    assert result.get('failed') is not True and result['changed'] is False and warnings == []
    assert [(item['reason'], item['release'], item['object'], item['file']) for item in result['tree_needs_bootstrap']] == [
        ('uses_crd', 'gizmos/gizmo-operator', 'Gizmo web/blue', 'apps/gizmo.yaml')]
    assert 'tree_needs_bootstrap' not in run(capsys, path=str(tmp_path))
    assert run(capsys, path=str(tmp_path), bootstrap_rendered={})['tree_needs_bootstrap'] == []
    bad = run(capsys, path=str(tmp_path), bootstrap_rendered={'gizmos/gizmo-operator': {'crds': [gizmo_crd]}})
    assert bad['failed'] is True and bad['field'] == 'bootstrap_rendered["gizmos/gizmo-operator"].objects'


def test_bootstrap_source_and_tree_objects_reach_tree_needs_bootstrap(capsys, warnings, tmp_path):
    """bootstrap_source and tree_objects are passed to the analysis; bad shapes fail naming the field."""
    (tmp_path / 'clusters').mkdir()
    (tmp_path / 'clusters' / 'platform.yaml').write_text(
        'apiVersion: kustomize.toolkit.fluxcd.io/v1\nkind: Kustomization\nmetadata: {name: platform, namespace: flux-system}\n'
        'spec: {interval: 1h, path: ./clusters, prune: true, sourceRef: {kind: GitRepository, name: platform}}\n', encoding='utf-8')
    rendered = {'tools/tools': {'crds': [], 'objects': []}}
    sealed = {'apiVersion': 'bitnami.com/v1alpha1', 'kind': 'SealedSecret', 'metadata': {'name': 'creds', 'namespace': 'web'},
              'file': 'apps/creds.sealedsecret.yaml'}
    assert run(capsys, path=str(tmp_path), bootstrap_rendered=rendered)['tree_needs_bootstrap'] == []
    warnings.clear()
    result = run(capsys, path=str(tmp_path), bootstrap_rendered=rendered, bootstrap_source='flux-system/flux-system', tree_objects=[sealed],
                 use_default_rules=False)
    assert result.get('failed') is not True and result['changed'] is False and warnings == []
    assert [(item['reason'], item['object'], item['file']) for item in result['tree_needs_bootstrap']] == [
        ('unknown_api', 'SealedSecret web/creds', 'apps/creds.sealedsecret.yaml'),
        ('unreadable_source', 'Kustomization flux-system/platform', 'clusters/platform.yaml')]
    bad = run(capsys, path=str(tmp_path), bootstrap_rendered=rendered, bootstrap_source='flux-system')
    assert bad['failed'] is True and bad['field'] == 'bootstrap_source'
    bad = run(capsys, path=str(tmp_path), bootstrap_rendered=rendered, tree_objects=[{'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {}}])
    assert bad['failed'] is True and bad['field'] == 'tree_objects[0].metadata.name'


def test_warn_false_keeps_the_findings_in_the_result_only(capsys, warnings):
    """A second read of a linted tree (the flux role's hand-off decision) does not repeat preflight's warnings."""
    result = run(capsys, path=os.path.join(REPOS, 'missing_critical'), warn=False)
    assert not result.get('failed') and result['missing_critical'], result
    assert warnings == []
    assert result['files_scanned'] > 0
