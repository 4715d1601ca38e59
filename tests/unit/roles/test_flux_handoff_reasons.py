"""The flux role's hand-off decision (roles/flux/vars/main.yml flux_handoff_reasons), rendered with Ansible's own
templating for each case of the table in docs/stages/flux.md: which way it goes and the reason it gives."""

import os

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..'))


def decide(tmp_path, **facts):
    with open(os.path.join(ROOT, 'roles', 'flux', 'vars', 'main.yml'), encoding='utf-8') as handle:
        role_vars = yaml.safe_load(handle)
    variables = dict((name, trust_as_template(value)) for name, value in role_vars.items())
    variables.update(flux_handoff='auto', flux_install_before_apps=True, flux_repo_dir=str(tmp_path), flux_git_branch='main',
                     bootstrap_apps_releases=[{'name': 'widget-operator'}, {'name': 'widget-demo'}], flux_sealed_secrets=[],
                     flux_handoff_repo_head='refs/heads/main', flux_handoff_graph={'tree_needs_bootstrap': [], 'files_scanned': 49})
    variables.update(facts)
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template('{{ flux_handoff_reasons }}'))


def test_nothing_needs_the_releases_before(tmp_path):
    assert decide(tmp_path) == {'before': True, 'why': [
        'nothing in the GitOps tree (49 files in %s) needs the releases widget-operator, widget-demo' % tmp_path]}


def test_findings_after_with_the_first_five_and_a_count(tmp_path):
    needs = [{'message': 'finding %d' % number} for number in range(7)]
    decision = decide(tmp_path, flux_handoff_graph={'tree_needs_bootstrap': needs, 'files_scanned': 3})
    assert decision == {'before': False, 'why': ['finding 0', 'finding 1', 'finding 2', 'finding 3', 'finding 4', 'and 2 more']}


@pytest.mark.parametrize('facts, before, reason', [
    ({'flux_handoff': 'before_apps', 'flux_handoff_graph': None}, True, 'flux_handoff is before_apps'),
    ({'flux_handoff': 'after_apps'}, False, 'flux_handoff is after_apps'),
    ({'flux_install_before_apps': 'false'}, False, "flux_install_before_apps is false (Flux's controllers need a bootstrap release)"),
    ({'bootstrap_apps_releases': [], 'flux_handoff_graph': None}, True, 'there are no bootstrap releases (bootstrap_apps_releases is empty)'),
    ({'flux_repo_dir': ''}, False, 'the GitOps tree cannot be read here: flux_repo_dir (its working copy on the controller) is not set'),
    ({'flux_handoff_repo_head': 'refs/heads/side'}, False, 'is not on flux_git_branch main, what Flux fetches (git: on branch side)'),
    ({'flux_handoff_repo_head': ''}, False, 'is not on flux_git_branch main, what Flux fetches (git: HEAD is detached)'),
    ({'flux_handoff_repo_head': 'fatal: not a git repository (or any of the parent directories): .git'}, False,
     'what Flux fetches (git: fatal: not a git repository'),
    ({'flux_handoff_read_failure': 'helm: not found'}, False,
     'the bootstrap releases or the GitOps tree could not be read: helm: not found'),
])
def test_each_row_of_the_table(tmp_path, facts, before, reason):
    decision = decide(tmp_path, **facts)
    assert decision['before'] is before and len(decision['why']) == 1 and reason in decision['why'][0], decision


def test_a_missing_directory_is_after(tmp_path):
    decision = decide(tmp_path, flux_repo_dir=str(tmp_path / 'gone'))
    assert decision == {'before': False, 'why': ['the GitOps tree cannot be read here: flux_repo_dir (%s) is not a directory' % (tmp_path / 'gone')]}


def test_the_sealed_secrets_become_tree_objects(tmp_path):
    sealed = [{'name': 'creds', 'namespace': 'web', 'path': 'apps/creds.yaml', 'string_data': {'a': 'b'}}]
    variables = {}
    with open(os.path.join(ROOT, 'roles', 'flux', 'vars', 'main.yml'), encoding='utf-8') as handle:
        variables.update((name, trust_as_template(value)) for name, value in yaml.safe_load(handle).items())
    variables['flux_sealed_secrets'] = sealed
    objects = Templar(loader=DataLoader(), variables=variables).template(trust_as_template('{{ flux_handoff_tree_objects }}'))
    assert objects == [{'apiVersion': 'bitnami.com/v1alpha1', 'kind': 'SealedSecret', 'file': 'apps/creds.yaml',
                        'metadata': {'name': 'creds', 'namespace': 'web'}}]
