"""plugin_utils/_in_process.py: a collection module run in Ansible's worker process.

The pure parts (the arguments and environment a module process would start with, the exit code and output it
would give, the interpreter check) are tested directly; the action plugin through ansible-playbook on a local
host: the same task in the worker process and as a module process gives the same result, check mode and a
failure included, and -vvvv says which way each task ran."""
import ast
import importlib
import json
import os
import subprocess
import sys

import pytest
import yaml

from ansible.module_utils import basic
from ansible.module_utils.basic import AnsibleModule

from ansible_collections.proxtalos.cluster.plugins.plugin_utils import _in_process

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
ANSIBLE_PLAYBOOK = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
MODULES = os.path.join(ROOT, 'plugins', 'modules')
ACTIONS = os.path.join(ROOT, 'plugins', 'action')


def module_args(**args):
    return json.dumps({'ANSIBLE_MODULE_ARGS': dict(args, _ansible_check_mode=False)}).encode()


def echo_main():
    """A module: its arguments and an environment variable back as its result."""
    module = AnsibleModule(argument_spec={'word': {'type': 'str', 'required': True}}, supports_check_mode=True)
    module.exit_json(changed=False, word=module.params['word'], env=os.environ.get('PROXTALOS_IN_PROCESS_TEST'))


def failing_main():
    module = AnsibleModule(argument_spec={'word': {'type': 'str'}})
    module.fail_json(msg='the word %s is not allowed' % module.params['word'])


def test_main_gets_its_arguments_and_the_task_environment_and_both_are_put_back():
    os.environ.pop('PROXTALOS_IN_PROCESS_TEST', None)
    before = (basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE)
    code, stdout, stderr = _in_process.run_main(echo_main, module_args(word='etcd'), {'PROXTALOS_IN_PROCESS_TEST': 'set'})
    result = json.loads(stdout)
    assert code == 0, stderr
    assert (result['word'], result['env'], result['changed']) == ('etcd', 'set', False)
    assert 'PROXTALOS_IN_PROCESS_TEST' not in os.environ
    assert (basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE) == before


def test_an_environment_variable_that_was_set_gets_its_old_value_back(monkeypatch):
    monkeypatch.setenv('PROXTALOS_IN_PROCESS_TEST', 'old')
    code, stdout, stderr = _in_process.run_main(echo_main, module_args(word='x'), {'PROXTALOS_IN_PROCESS_TEST': 'new'})
    assert code == 0, stderr
    assert json.loads(stdout)['env'] == 'new'
    assert os.environ['PROXTALOS_IN_PROCESS_TEST'] == 'old'


def test_fail_json_gives_exit_code_1_and_the_message():
    code, stdout, stderr = _in_process.run_main(failing_main, module_args(word='secret'), {})
    result = json.loads(stdout)
    assert code == 1, stderr
    assert result['failed'] is True and result['msg'] == 'the word secret is not allowed'


def test_bad_arguments_fail_like_a_module_process():
    code, stdout, stderr = _in_process.run_main(echo_main, module_args(wrd='x'), {})
    assert code == 1, stderr
    assert 'word' in json.loads(stdout)['msg']


def test_a_main_that_returns_without_a_result_is_a_failure():
    code, stdout, stderr = _in_process.run_main(lambda: None, module_args(), {})
    assert code == 1 and stdout == ''
    assert 'without reporting a result' in stderr


def test_an_exception_in_main_leaves_arguments_environment_and_stdout_as_they_were():
    def broken_main():
        print('half a result')
        raise RuntimeError('boom')

    before = (basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE, sys.stdout)
    with pytest.raises(RuntimeError, match='boom'):
        _in_process.run_main(broken_main, module_args(), {'PROXTALOS_IN_PROCESS_TEST': 'x'})
    assert (basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE, sys.stdout) == before
    assert 'PROXTALOS_IN_PROCESS_TEST' not in os.environ


def test_the_interpreter_must_be_this_very_path_not_what_it_links_to(tmp_path):
    link = tmp_path / 'python'
    link.symlink_to(sys.executable)
    assert _in_process.same_interpreter(sys.executable, sys.executable)
    assert _in_process.same_interpreter(os.path.join(os.path.dirname(sys.executable), '.', os.path.basename(sys.executable)),
                                        sys.executable)
    # Another virtualenv's python links to the same binary but has other packages: not the same interpreter.
    assert not _in_process.same_interpreter(str(link), sys.executable)
    assert not _in_process.same_interpreter(None, sys.executable)


def test_every_module_has_the_in_process_action_plugin_and_uses_the_legacy_profile():
    modules = sorted(name[:-3] for name in os.listdir(MODULES) if name.endswith('.py') and not name.startswith('_'))
    actions = sorted(name[:-3] for name in os.listdir(ACTIONS) if name.endswith('.py') and not name.startswith('_'))
    assert modules == actions
    for name in modules:
        action = importlib.import_module('ansible_collections.proxtalos.cluster.plugins.action.' + name).ActionModule
        assert issubclass(action, _in_process.InProcessModuleAction), name
        assert action.collection_module.__name__ == 'ansible_collections.proxtalos.cluster.plugins.modules.' + name
        with open(os.path.join(MODULES, name + '.py')) as module_file:
            tree = ast.parse(module_file.read())
        # A module with METADATA may name another serialization profile; the in-process run assumes legacy.
        assigned = {target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
                    if isinstance(target, ast.Name)}
        assert 'METADATA' not in assigned, name
        assert any(isinstance(node, ast.FunctionDef) and node.name == 'main' for node in tree.body), name


PLAYBOOK = """---
- name: One module, in the worker process and as a module process
  hosts: all
  gather_facts: false
  tasks:
    - name: Secrets bundle
      proxtalos.cluster.talos_secrets:
        path: "{{ bundle_path }}"
      register: bundle
    - name: Secrets bundle in check mode
      proxtalos.cluster.talos_secrets:
        path: "{{ bundle_path }}-check"
      check_mode: true
      register: bundle_check
    - name: An argument the module does not have
      proxtalos.cluster.talos_secrets:
        path: "{{ bundle_path }}"
        no_such_option: true
      register: bad
      ignore_errors: true
    - name: What each task returned
      ansible.builtin.copy:
        content: "{{ {'bundle': bundle, 'bundle_check': bundle_check, 'bad': bad} | to_json }}"
        dest: "{{ result_path }}"
        mode: '0600'
"""


def run_play(tmp_path, interpreter):
    inventory = {'all': {'hosts': {'node': {
        'ansible_connection': 'local', 'ansible_python_interpreter': interpreter,
        'bundle_path': str(tmp_path / 'secrets.yaml'), 'result_path': str(tmp_path / 'result.json')}}}}
    (tmp_path / 'hosts.yml').write_text(yaml.safe_dump(inventory))
    (tmp_path / 'play.yml').write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_LOCAL_TEMP=str(tmp_path / 'tmp'),
               PROXTALOS_REPORT_DIR=str(tmp_path / 'report'))
    run = subprocess.run([ANSIBLE_PLAYBOOK, '-i', str(tmp_path / 'hosts.yml'), str(tmp_path / 'play.yml'), '-vvvv'],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    with open(tmp_path / 'result.json') as result_file:
        return run.stdout, json.load(result_file)


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_a_task_gives_the_same_result_in_the_worker_as_in_a_module_process(tmp_path):
    venv_bin = os.path.join(os.path.realpath(os.path.join(ROOT, '.venv')), 'bin')  # ansible-playbook's sys.executable
    (tmp_path / 'worker').mkdir()
    (tmp_path / 'process').mkdir()
    worker_log, in_worker = run_play(tmp_path / 'worker', os.path.join(venv_bin, 'python'))
    # The same virtualenv under its other name: not the controller's path, so a module process (and it works).
    process_log, in_process = run_play(tmp_path / 'process', os.path.join(venv_bin, 'python3'))

    assert worker_log.count('proxtalos.cluster.talos_secrets runs in the worker process') == 3
    assert 'runs as a module process' not in worker_log
    assert process_log.count('proxtalos.cluster.talos_secrets runs as a module process: ansible_python_interpreter is') == 3
    for results in (in_worker, in_process):
        assert results['bundle']['changed'] is True
        assert results['bundle_check']['changed'] is True
        assert results['bad']['failed'] is True and 'no_such_option' in results['bad']['msg']
    assert os.stat(tmp_path / 'worker' / 'secrets.yaml').st_mode & 0o777 == 0o600
    assert not (tmp_path / 'worker' / 'secrets.yaml-check').exists()  # check mode wrote nothing
    assert sorted(in_worker['bundle']) == sorted(in_process['bundle'])
    assert in_worker['bad']['msg'] == in_process['bad']['msg']
