"""The modules that read a kept key file after its keeper skip the RSA consistency check only when the keeper ran in
the same run: talos_config after talos_secrets (roles/talos_machines, not with --tags apply alone, where the secrets
task does not run), sealed_key_secret after sealed_key (roles/sealed_secrets). The roles' expressions are evaluated
by Ansible's own templating, with the keeper's registered result as a run leaves it."""
import os

import pytest
import yaml

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROLES = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'roles')


def tasks(role, name):
    with open(os.path.join(ROLES, role, 'tasks', name)) as handle:
        return yaml.safe_load(handle)


def named(task_list, prefix):
    return [t for t in task_list if t['name'].startswith(prefix)][0]


def evaluate(expression, **variables):
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression))


# (keeper's registered result: absent = the task did not run in this run) -> check the numbers again?
CASES = [({}, True), ({'result': {'changed': False, 'path': '/x'}}, False), ({'result': {'changed': True}}, False),
         ({'result': {'skipped': True, 'changed': False}}, True)]


@pytest.mark.parametrize('registered, check', CASES)
def test_talos_config_checks_the_bundle_unless_talos_secrets_ran(registered, check):
    secrets_tasks = tasks('talos_machines', 'secrets.yml')
    keeper = named(secrets_tasks, 'Secrets bundle')
    reader = named(secrets_tasks, 'Machine config of every node')
    assert 'proxtalos.cluster.talos_secrets' in keeper and keeper['register'] == 'talos_machines_bundle'
    assert 'apply' not in keeper.get('tags', []) and 'apply' in reader['tags']   # --tags apply runs the reader alone
    assert reader['proxtalos.cluster.talos_config']['secrets_path'] == keeper['proxtalos.cluster.talos_secrets']['path']
    expression = reader['proxtalos.cluster.talos_config']['check_key_consistency']
    variables = {'talos_machines_bundle': registered['result']} if registered else {}
    assert evaluate(expression, **variables) is check


@pytest.mark.parametrize('registered, check', CASES)
def test_sealed_key_secret_checks_the_key_unless_sealed_key_ran(registered, check):
    main = tasks('sealed_secrets', 'main.yml')
    keeper = named(main, 'Keep the sealed-secrets keypair')
    reader = named(main, "The controller's active key Secret")
    assert 'proxtalos.cluster.sealed_key' in keeper and keeper['register'] == 'sealed_secrets_keypair'
    assert keeper.get('tags') == reader.get('tags')   # no tag runs the reader without its keeper
    assert reader['proxtalos.cluster.sealed_key_secret']['private_key_path'] == keeper['proxtalos.cluster.sealed_key']['private_key_path']
    expression = reader['proxtalos.cluster.sealed_key_secret']['check_key_consistency']
    variables = {'sealed_secrets_keypair': registered['result']} if registered else {}
    assert evaluate(expression, **variables) is check
