"""plugin_utils/_in_process.py: a collection module run in Ansible's worker process.

The pure parts (arguments where AnsibleModule reads them, the exit code and output a module process would give, exit
handlers, the interpreter check) are tested directly. The action plugin is tested through ansible-playbook on two
local hosts, one whose interpreter is ansible-playbook's own (the module runs in the worker) and one that names the
same virtualenv by another path (a module process): every task must give both the same result - a plain run with a
no_log value and a warning, check and diff mode, an exception under failed_when and under until, an exit handler,
bad arguments - and -vvvv must say which way each ran. A scratch collection holds the probe module; a real module of
the collection (talos_secrets) is run the same way."""
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
# ansible-playbook's sys.executable: the venv's python, by the path its entry point's shebang names (make setup).
VENV_BIN = os.path.join(os.path.realpath(os.path.join(ROOT, '.venv')), 'bin')
TOKEN = 'probe-token-4b1d9e'


def module_args(**args):
    return json.dumps({'ANSIBLE_MODULE_ARGS': dict(args, _ansible_check_mode=False)}).encode()


def echo_main():
    """A module: its arguments back as its result."""
    module = AnsibleModule(argument_spec={'word': {'type': 'str', 'required': True}}, supports_check_mode=True)
    module.exit_json(changed=False, word=module.params['word'])


def failing_main():
    module = AnsibleModule(argument_spec={'word': {'type': 'str'}})
    module.fail_json(msg='the word %s is not allowed' % module.params['word'])


def test_main_gets_its_arguments_and_they_are_put_back():
    before = (basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE)
    code, stdout, stderr = _in_process.run_main(echo_main, module_args(word='etcd'))
    result = json.loads(stdout)
    assert code == 0, stderr
    assert (result['word'], result['changed']) == ('etcd', False)
    assert (basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE) == before


def test_fail_json_gives_exit_code_1_and_the_message():
    code, stdout, stderr = _in_process.run_main(failing_main, module_args(word='secret'))
    result = json.loads(stdout)
    assert code == 1, stderr
    assert result['failed'] is True and result['msg'] == 'the word secret is not allowed'


def test_bad_arguments_fail_like_a_module_process():
    code, stdout, stderr = _in_process.run_main(echo_main, module_args(wrd='x'))
    assert code == 1, stderr
    assert 'word' in json.loads(stdout)['msg']


def test_a_main_that_returns_without_a_result_is_a_failure():
    code, stdout, stderr = _in_process.run_main(lambda: None, module_args())
    assert code == 1 and stdout == ''
    assert 'without reporting a result' in stderr


def test_sys_exit_with_a_message_is_a_failure_with_that_message():
    code, stdout, stderr = _in_process.run_main(lambda: sys.exit('cannot go on'), module_args())
    assert (code, stdout, stderr) == (1, '', 'cannot go on\n')


def test_an_exception_in_main_is_the_failed_result_ansiballz_prints_and_state_is_put_back():
    def broken_main():
        raise RuntimeError('boom')

    before = (basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE, sys.stdout)
    code, stdout, stderr = _in_process.run_main(broken_main, module_args())
    result = json.loads(stdout)
    assert code == 1, stderr
    assert result['failed'] is True and 'boom' in json.dumps(result['exception'])
    assert (basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE, sys.stdout) == before


def test_keyboard_interrupt_is_not_turned_into_a_result():
    def interrupted_main():
        raise KeyboardInterrupt()

    with pytest.raises(KeyboardInterrupt):
        _in_process.run_main(interrupted_main, module_args())


def test_exit_handlers_registered_by_main_run_last_first_when_it_ends(tmp_path):
    ran = []
    marker = tmp_path / 'client.key'

    def main_with_exit_handlers():
        import atexit  # pylint: disable=import-outside-toplevel
        marker.write_text('key material')
        atexit.register(ran.append, 'first')
        atexit.register(os.remove, str(marker))
        atexit.register(ran.append, 'dropped')
        atexit.unregister(ran.append)
        atexit.register(ran.append, 'last')
        assert ran == []
        echo_main()

    import atexit  # pylint: disable=import-outside-toplevel
    register = atexit.register
    code, stdout, stderr = _in_process.run_main(main_with_exit_handlers, module_args(word='x'))
    assert code == 0, stdout + stderr
    assert ran == ['last'] and not marker.exists()
    assert atexit.register is register


def test_the_interpreter_must_be_this_very_path_not_what_it_links_to(tmp_path):
    link = tmp_path / 'python'
    link.symlink_to(sys.executable)
    assert _in_process.same_interpreter(sys.executable, sys.executable)
    assert _in_process.same_interpreter(os.path.join(os.path.dirname(sys.executable), '.', os.path.basename(sys.executable)),
                                        sys.executable)
    # Another virtualenv's python links to the same binary but has other packages: not the same interpreter.
    assert not _in_process.same_interpreter(str(link), sys.executable)
    assert not _in_process.same_interpreter(None, sys.executable)


def test_core_version():
    assert _in_process.core_version('2.21.5') == (2, 21)
    assert _in_process.core_version('2.19.0rc1') == (2, 19)


# Modules that are an action plugin alone (the module file holds their documentation only): no module to run.
ACTION_ONLY = ('host_values',)


def test_every_module_has_the_in_process_action_plugin_and_uses_the_legacy_profile():
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
        assert issubclass(action, _in_process.InProcessModuleAction), name
        assert action.collection_module.__name__ == 'ansible_collections.proxtalos.cluster.plugins.modules.' + name
        with open(os.path.join(MODULES, name + '.py')) as module_file:
            tree = ast.parse(module_file.read())
        # A module with METADATA may name another serialization profile; the in-worker run assumes legacy.
        assigned = {target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
                    if isinstance(target, ast.Name)}
        assert 'METADATA' not in assigned, name


PROBE_MODULE = '''#!/usr/bin/python
DOCUMENTATION = "{module: probe, short_description: probe, description: [probe], author: [test]}"
import atexit
import os
from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={'mode': {'type': 'str', 'default': 'ok'}, 'token': {'type': 'str', 'no_log': True},
                                          'marker': {'type': 'path'}}, supports_check_mode=True)
    params = module.params
    if params['marker']:
        with open(params['marker'], 'w') as handle:
            handle.write('removed by an exit handler')
        atexit.register(os.remove, params['marker'])
    if params['mode'] == 'raise':
        raise RuntimeError('probe broke')
    result = {'changed': not module.check_mode, 'check': module.check_mode, 'echoed_token': params['token'],
              'env': os.environ.get('PROBE_ENV')}
    if module._diff:
        result['diff'] = {'before': 'old\\n', 'after': 'new\\n'}
    module.warn('probe warns')
    module.exit_json(**result)


if __name__ == '__main__':
    main()
'''

PROBE_ACTION = '''from ansible_collections.proxtalos.cluster.plugins.plugin_utils._in_process import InProcessModuleAction
from ansible_collections.scratch.inworker.plugins.modules import probe


class ActionModule(InProcessModuleAction):
    collection_module = probe
'''

PROBE_PLAY = """---
- name: The probe module in the worker and as a module process
  hosts: all
  gather_facts: false
  tasks:
    - name: Plain
      scratch.inworker.probe:
        token: "%(token)s"
      register: plain
    - name: Check and diff
      scratch.inworker.probe: {}
      check_mode: true
      diff: true
      register: check_diff
    - name: An exception under failed_when
      scratch.inworker.probe:
        mode: raise
      failed_when: false
      register: raised
    - name: An exception under until
      scratch.inworker.probe:
        mode: raise
      until: false
      retries: 2
      delay: 0
      ignore_errors: true
      register: retried
    - name: An exit handler
      scratch.inworker.probe:
        marker: "{{ marker_path }}"
      register: exit_handler
    - name: The marker after the task
      ansible.builtin.stat:
        path: "{{ marker_path }}"
      register: marker
    - name: With an environment
      scratch.inworker.probe: {}
      environment:
        PROBE_ENV: set
      register: with_env
    - name: An argument the module does not have
      scratch.inworker.probe:
        no_such_option: true
      register: bad
      ignore_errors: true
    - name: What each task returned
      ansible.builtin.copy:
        content: "{{ {'plain': plain, 'check_diff': check_diff, 'raised': raised, 'retried': retried, 'exit_handler': exit_handler,
                      'marker_exists': marker.stat.exists, 'with_env': with_env, 'bad': bad} | to_json }}"
        dest: "{{ result_path }}"
        mode: '0600'
""" % {'token': TOKEN}

SECRETS_PLAY = """---
- name: A module of the collection in the worker and as a module process
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
        dest: "{{ folder }}/result.json"
        mode: '0600'
"""


def run_on_both(tmp_path, play, extra_env=None):
    """The play on host `worker` (ansible-playbook's own interpreter) and `process` (the venv's python3)."""
    hosts = {}
    for name, interpreter in (('worker', os.path.join(VENV_BIN, 'python')), ('process', os.path.join(VENV_BIN, 'python3'))):
        folder = tmp_path / name
        folder.mkdir()
        hosts[name] = {'ansible_connection': 'local', 'ansible_python_interpreter': interpreter, 'folder': str(folder),
                       'marker_path': str(folder / 'marker'), 'result_path': str(folder / 'result.json')}
    (tmp_path / 'hosts.yml').write_text(yaml.safe_dump({'all': {'hosts': hosts}}))
    (tmp_path / 'play.yml').write_text(play)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_LOCAL_TEMP=str(tmp_path / 'tmp'),
               PROXTALOS_REPORT_DIR=str(tmp_path / 'report'), **(extra_env or {}))
    run = subprocess.run([ANSIBLE_PLAYBOOK, '-i', str(tmp_path / 'hosts.yml'), str(tmp_path / 'play.yml'), '-vvvv', '--forks', '1'],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    results = {}
    for name in hosts:
        with open(tmp_path / name / 'result.json') as result_file:
            results[name] = json.load(result_file)
    return run.stdout, results


def paths_taken(log, module):
    """{host: ['worker' | 'process', ...]} in task order, from the -vvvv lines of the action plugin."""
    taken = {}
    for line in log.splitlines():
        for way, text in (('worker', '%s runs in the worker process' % module), ('process', '%s runs as a module process' % module)):
            if text in line:
                host = line.split('<', 1)[1].split('>', 1)[0] if line.startswith('<') else None
                taken.setdefault(host, []).append(way)
    return taken


def comparable(result):
    """A registered result without what differs between any two runs (exception tracebacks name their frames)."""
    result = dict(result)
    result.pop('exception', None)
    return result


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_the_probe_gives_the_same_results_in_the_worker_as_in_a_module_process(tmp_path):
    collection = tmp_path / 'collections' / 'ansible_collections' / 'scratch' / 'inworker'
    (collection / 'plugins' / 'modules').mkdir(parents=True)
    (collection / 'plugins' / 'action').mkdir(parents=True)
    (collection / 'galaxy.yml').write_text('{namespace: scratch, name: inworker, version: 1.0.0, readme: README.md, authors: [test]}\n')
    (collection / 'plugins' / 'modules' / 'probe.py').write_text(PROBE_MODULE)
    (collection / 'plugins' / 'action' / 'probe.py').write_text(PROBE_ACTION)
    paths = '%s:%s' % (tmp_path / 'collections', os.path.join(ROOT, '.collections'))
    (tmp_path / 'run').mkdir()
    log, results = run_on_both(tmp_path / 'run', PROBE_PLAY, {'ANSIBLE_COLLECTIONS_PATH': paths})

    taken = paths_taken(log, 'scratch.inworker.probe')
    # plain, check/diff, raised, retried (each attempt), exit handler: in the worker; environment: a module process; bad
    ways = taken['worker']
    assert ways[-2:] == ['process', 'worker'] and set(ways[:-2]) == {'worker'} and len(ways) >= 8, taken
    assert taken['process'] == ['process'] * len(ways), taken
    assert 'the task sets an environment (PROBE_ENV)' in log

    worker, process = results['worker'], results['process']
    for task in ('plain', 'check_diff', 'raised', 'retried', 'exit_handler', 'with_env', 'bad'):
        assert comparable(worker[task]) == comparable(process[task]), task
    # ...and what they are, so that two equally wrong results cannot pass
    assert worker['plain']['changed'] is True and worker['plain']['warnings'] == ['probe warns']
    assert worker['plain']['echoed_token'] != TOKEN and TOKEN not in log  # no_log: masked in the result and the output
    assert worker['check_diff']['check'] is True and worker['check_diff']['changed'] is False
    assert worker['check_diff']['diff'] == {'before': 'old\n', 'after': 'new\n'}
    assert worker['raised']['failed'] is False and 'failed_when_suppressed_exception' in worker['raised']
    assert worker['retried']['attempts'] == 2 and worker['retried']['msg'] == 'Task failed: Module failed: probe broke'
    assert worker['exit_handler']['changed'] is True and worker['marker_exists'] is False
    assert worker['with_env']['env'] == 'set'
    assert worker['bad']['failed'] is True and 'no_such_option' in worker['bad']['msg']


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_a_module_of_the_collection_runs_in_the_worker_with_the_same_result(tmp_path):
    log, results = run_on_both(tmp_path, SECRETS_PLAY)
    assert paths_taken(log, 'proxtalos.cluster.talos_secrets') == {'worker': ['worker'] * 2, 'process': ['process'] * 2}
    for host in ('worker', 'process'):
        assert results[host]['bundle']['changed'] is True and results[host]['bundle_check']['changed'] is True
        assert os.stat(tmp_path / host / 'secrets.yaml').st_mode & 0o777 == 0o600
        assert not (tmp_path / host / 'secrets-check.yaml').exists()  # check mode wrote nothing
    assert sorted(results['worker']['bundle']) == sorted(results['process']['bundle'])


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
    new = _in_process.open_vaulted_inputs(args, open_file, copies)
    assert args == given
    assert sorted(opened) == ['kubeconfig', 'nodes[0].config_path', 'talosconfig']
    assert sorted(copies) == sorted(path + '.copy' for path in (args['kubeconfig'], args['talosconfig'],
                                                                args['nodes'][0]['config_path']))
    assert new['kubeconfig'] == args['kubeconfig'] + '.copy' and new['talosconfig'] == args['talosconfig'] + '.copy'
    assert new['nodes'][0]['config_path'] == args['nodes'][0]['config_path'] + '.copy'
    assert new['nodes'][1:] == args['nodes'][1:] and new['dest'] == args['dest'] and new['mode'] == 'auto'

    plain = {'kubeconfig': str(clear), 'nodes': [{'config_path': str(clear)}]}
    assert _in_process.open_vaulted_inputs(plain, open_file, []) is plain
