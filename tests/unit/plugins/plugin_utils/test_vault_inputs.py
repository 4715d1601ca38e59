"""plugin_utils/_vault_inputs.py: the action plugin of every module - in the worker or as a module process, with
vault-encrypted input files handed over as decrypted copies.

The pure part (which options are replaced by a copy) is tested directly; the action plugin through ansible-playbook on
a local host with a scratch collection's probe module: the module gets a decrypted copy of a vault-encrypted
kubeconfig, the copy is gone after the task, a file in clear is passed as given, and a wrong vault password fails the
task naming the option. A real module of the collection (talos_secrets) is run the same way, in check mode too."""
import ast
import importlib
import json
import os
import subprocess

import pytest
import yaml

from ansible.plugins.action.normal import ActionModule as NormalAction

from ansible_collections.proxtalos.cluster.plugins.plugin_utils import _vault_inputs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
# PROXTALOS_ANSIBLE_PLAYBOOK (as tests/integration/test_oldest_core.py) runs the plays on another ansible-core.
ANSIBLE_PLAYBOOK = os.environ.get('PROXTALOS_ANSIBLE_PLAYBOOK') or os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
MODULES = os.path.join(ROOT, 'plugins', 'modules')
ACTIONS = os.path.join(ROOT, 'plugins', 'action')

# Modules that are an action plugin alone (the module file holds their documentation only): no module to run.
ACTION_ONLY = ('host_values',)


def test_every_module_has_the_vault_inputs_action_plugin():
    modules = sorted(name[:-3] for name in os.listdir(MODULES) if name.endswith('.py') and not name.startswith('_'))
    actions = sorted(name[:-3] for name in os.listdir(ACTIONS) if name.endswith('.py') and not name.startswith('_'))
    assert modules == actions
    for name in modules:
        if name in ACTION_ONLY:
            with open(os.path.join(MODULES, name + '.py')) as module_file:
                tree = ast.parse(module_file.read())
            assert not [node for node in tree.body if isinstance(node, ast.FunctionDef)], name  # documentation only
            continue
        action = importlib.import_module('ansible_collections.proxtalos.cluster.plugins.action.' + name).ActionModule
        assert issubclass(action, _vault_inputs.VaultInputsAction) and issubclass(action, NormalAction), name
        # the action plugin names its module, for the run in the worker (plugin_utils/_action_module.py)
        module = importlib.import_module('ansible_collections.proxtalos.cluster.plugins.modules.' + name)
        assert action.collection_module is module, name


PROBE_MODULE = '''#!/usr/bin/python
DOCUMENTATION = "{module: probe, short_description: probe, description: [probe], author: [test]}"
import os
from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={'kubeconfig': {'type': 'path'}}, supports_check_mode=True)
    path = module.params['kubeconfig']
    with open(path) as handle:
        content = handle.read()
    module.exit_json(changed=False, path=path, content=content, file_mode=os.stat(path).st_mode & 0o777, pid=os.getpid())


if __name__ == '__main__':
    main()
'''

PROBE_ACTION = '''from ansible_collections.proxtalos.cluster.plugins.plugin_utils._vault_inputs import VaultInputsAction


class ActionModule(VaultInputsAction):
    pass
'''

PROBE_PLAY = """---
- name: The probe module with a vault-encrypted and a clear kubeconfig
  hosts: all
  gather_facts: false
  tasks:
    - name: Encrypted
      scratch.vaultinputs.probe:
        kubeconfig: "{{ encrypted }}"
      register: encrypted_run
    - name: The copy after the task
      ansible.builtin.stat:
        path: "{{ encrypted_run.path }}"
      register: copy
    - name: Clear
      scratch.vaultinputs.probe:
        kubeconfig: "{{ clear }}"
      check_mode: true
      register: clear_run
    - name: What each task returned
      ansible.builtin.copy:
        content: "{{ {'encrypted': encrypted_run, 'copy_exists': copy.stat.exists, 'clear': clear_run} | to_json }}"
        dest: "{{ result_path }}"
        mode: '0600'
"""


def write_probe_collection(tmp_path):
    collection = tmp_path / 'collections' / 'ansible_collections' / 'scratch' / 'vaultinputs'
    (collection / 'plugins' / 'modules').mkdir(parents=True)
    (collection / 'plugins' / 'action').mkdir(parents=True)
    (collection / 'galaxy.yml').write_text('{namespace: scratch, name: vaultinputs, version: 1.0.0, readme: README.md, authors: [test]}\n')
    (collection / 'plugins' / 'modules' / 'probe.py').write_text(PROBE_MODULE)
    (collection / 'plugins' / 'action' / 'probe.py').write_text(PROBE_ACTION)
    return '%s:%s' % (tmp_path / 'collections', os.path.join(ROOT, '.collections'))


def run_play(tmp_path, play, host_vars, password, extra_env=None, verbosity=None):
    # the python of the ansible-core that runs the play, as the inventory's "{{ ansible_playbook_python }}"
    hosts = {'local': dict({'ansible_connection': 'local', 'ansible_python_interpreter': os.path.join(os.path.dirname(ANSIBLE_PLAYBOOK), 'python'),
                            'result_path': str(tmp_path / 'result.json'), 'folder': str(tmp_path)}, **host_vars)}
    (tmp_path / 'hosts.yml').write_text(yaml.safe_dump({'all': {'hosts': hosts}}))
    (tmp_path / 'play.yml').write_text(play)
    (tmp_path / 'password').write_text(password)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_LOCAL_TEMP=str(tmp_path / 'tmp'),
               PROXTALOS_REPORT_DIR=str(tmp_path / 'report'), **(extra_env or {}))
    return subprocess.run([ANSIBLE_PLAYBOOK, '-i', str(tmp_path / 'hosts.yml'), str(tmp_path / 'play.yml'),
                           '--vault-password-file', str(tmp_path / 'password'), '--forks', '1'] + ([verbosity] if verbosity else []),
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)


def encrypt(path, text, password=b'typed'):
    from ansible.parsing.vault import VaultLib, VaultSecret
    path.write_bytes(VaultLib([('default', VaultSecret(password))]).encrypt(text.encode()))


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_a_module_gets_a_decrypted_copy_removed_after_the_task(tmp_path):
    paths = write_probe_collection(tmp_path)
    encrypt(tmp_path / 'kubeconfig', 'apiVersion: v1\n')
    (tmp_path / 'clear').write_text('in clear\n')
    run = run_play(tmp_path, PROBE_PLAY, {'encrypted': str(tmp_path / 'kubeconfig'), 'clear': str(tmp_path / 'clear')},
                   'typed', {'ANSIBLE_COLLECTIONS_PATH': paths})
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    with open(tmp_path / 'result.json') as result_file:
        results = json.load(result_file)
    assert results['encrypted']['content'] == 'apiVersion: v1\n' and results['encrypted']['file_mode'] == 0o600
    assert results['encrypted']['path'] != str(tmp_path / 'kubeconfig') and results['copy_exists'] is False
    assert results['encrypted']['pid'] != results['clear']['pid']   # module processes (no collection_module), one a task
    assert results['clear']['path'] == str(tmp_path / 'clear') and results['clear']['content'] == 'in clear\n'


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_a_wrong_vault_password_fails_the_task_naming_the_option(tmp_path):
    paths = write_probe_collection(tmp_path)
    encrypt(tmp_path / 'kubeconfig', 'apiVersion: v1\n')
    run = run_play(tmp_path, PROBE_PLAY, {'encrypted': str(tmp_path / 'kubeconfig'), 'clear': str(tmp_path / 'kubeconfig')},
                   'not-the-password', {'ANSIBLE_COLLECTIONS_PATH': paths})
    assert run.returncode != 0
    assert 'kubeconfig: %s is vault-encrypted and no vault password of this run opens it' % (tmp_path / 'kubeconfig') in run.stdout


SECRETS_PLAY = """---
- name: A module of the collection
  hosts: all
  gather_facts: false
  tasks:
    - name: Secrets bundle
      proxtalos.cluster.talos_secrets:
        path: "{{ folder }}/secrets.yaml"
      register: bundle
    - name: Secrets bundle in check mode
      proxtalos.cluster.talos_secrets:
        path: "{{ folder }}/secrets-check.yaml"
      check_mode: true
      register: bundle_check
    - name: What each task returned
      ansible.builtin.copy:
        content: "{{ {'bundle': bundle, 'bundle_check': bundle_check} | to_json }}"
        dest: "{{ result_path }}"
        mode: '0600'
"""


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
@pytest.mark.parametrize('environment', [False, True], ids=['in-the-worker', 'module-process'])
def test_a_module_of_the_collection_runs_in_the_worker_or_as_a_module_process(tmp_path, environment):
    play = SECRETS_PLAY
    if environment:
        # a task environment takes effect only when a process starts: the module process runs
        play = play.replace('        path: "{{ folder }}/secrets.yaml"\n', '        path: "{{ folder }}/secrets.yaml"\n      environment:\n        TZ: UTC\n')
    run = run_play(tmp_path, play, {}, 'unused', verbosity='-vvvv')
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    if environment:
        assert 'proxtalos.cluster.talos_secrets runs as a module process: the task sets an environment (TZ)' in run.stdout
    else:
        assert 'proxtalos.cluster.talos_secrets runs as a module process' not in run.stdout
    assert 'proxtalos.cluster.talos_secrets runs in the worker process' in run.stdout  # the check-mode task at least
    with open(tmp_path / 'result.json') as result_file:
        results = json.load(result_file)
    assert results['bundle']['changed'] is True and results['bundle_check']['changed'] is True
    assert os.stat(tmp_path / 'secrets.yaml').st_mode & 0o777 == 0o600
    assert not (tmp_path / 'secrets-check.yaml').exists()  # check mode wrote nothing


def test_vault_encrypted_inputs_are_handed_over_as_decrypted_copies_and_clear_ones_as_they_are(tmp_path):
    """kubeconfig, talosconfig and config_path (top level and in the items of nodes) that name a vault envelope are
    replaced by the copy open_file makes, each copy recorded for removal; a file in clear, a missing one and any
    other option are left as given, and the task's own arguments are not changed."""
    from ansible.parsing.vault import VaultLib, VaultSecret
    envelope = VaultLib([('default', VaultSecret(b'typed'))]).encrypt(b'apiVersion: v1\n')
    encrypted = {}
    for name in ('kubeconfig', 'talosconfig', 'cp-1.yaml', 'other'):
        encrypted[name] = tmp_path / name
        encrypted[name].write_bytes(envelope)
    clear = tmp_path / 'clear.yaml'
    clear.write_text('apiVersion: v1\n')
    args = {'kubeconfig': str(encrypted['kubeconfig']), 'talosconfig': str(encrypted['talosconfig']),
            'dest': str(encrypted['other']), 'mode': 'auto',
            'nodes': [{'name': 'cp-1', 'config_path': str(encrypted['cp-1.yaml'])},
                      {'name': 'w-1', 'config_path': str(clear)},
                      {'name': 'w-2', 'config_path': str(tmp_path / 'missing.yaml')}]}
    given = json.loads(json.dumps(args))
    opened = []

    def open_file(path, option):
        opened.append(option)
        return path + '.copy'

    copies = []
    new = _vault_inputs.open_vaulted_inputs(args, open_file, copies)
    assert args == given
    assert sorted(opened) == ['kubeconfig', 'nodes[0].config_path', 'talosconfig']
    assert sorted(copies) == sorted(path + '.copy' for path in (args['kubeconfig'], args['talosconfig'],
                                                                args['nodes'][0]['config_path']))
    assert new['kubeconfig'] == args['kubeconfig'] + '.copy' and new['talosconfig'] == args['talosconfig'] + '.copy'
    assert new['nodes'][0]['config_path'] == args['nodes'][0]['config_path'] + '.copy'
    assert new['nodes'][1:] == args['nodes'][1:] and new['dest'] == args['dest'] and new['mode'] == 'auto'

    plain = {'kubeconfig': str(clear), 'nodes': [{'config_path': str(clear)}]}
    assert _vault_inputs.open_vaulted_inputs(plain, open_file, []) is plain
