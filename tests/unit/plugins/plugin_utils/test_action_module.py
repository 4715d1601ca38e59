"""plugin_utils/_action_module.py: a module's run(module) in the worker through the public facade of AnsibleModule.

Every module has the skeleton (module_kwargs(), run(module), main() = run(AnsibleModule(**module_kwargs()))) and uses
only the part of AnsibleModule the facade provides. For a probe module and for modules of the collection, the facade's
result is the result AnsibleModule prints in a module process: a normal run, check mode and diff, a failure, argument
errors, a warning, no_log redaction of an option's value (suboptions too) and of a value run() registers
(module_utils/_secrets.register), run_command and get_bin_path. An exception escaping run() and exit handlers are the
facade's alone."""
import ast
import atexit
import importlib
import importlib.util
import json
import os
import subprocess

import pytest
from ansible.module_utils import _internal
from ansible.module_utils.common import parameters
from ansible.module_utils.common import warnings as module_warnings

from ansible_collections.proxtalos.cluster.plugins.plugin_utils import _action_module
from ansible_collections.proxtalos.cluster.tests.helpers import run_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
MODULES = os.path.join(ROOT, 'plugins', 'modules')
ACTION_ONLY = ('host_values',)
# The part of AnsibleModule a module's run() may use (docs/development.md): the facade provides exactly these.
MODULE_API = frozenset(('params', 'check_mode', '_diff', 'exit_json', 'fail_json', 'warn', 'run_command', 'get_bin_path',
                        'no_log_values'))
INVOCATION = {'_ansible_inject_invocation': True} if 'inject_invocation' in parameters.PASS_VARS else {}


@pytest.fixture(autouse=True)
def module_process(monkeypatch):
    """AnsibleModule.warn puts warnings in the result only where ansible-core does not think it is the controller."""
    monkeypatch.setattr(_internal, 'is_controller', False)
    # a module process starts with no warnings; in this test process they would pile up across modules
    monkeypatch.setattr(module_warnings, '_global_warnings', {})


def module_names():
    return sorted(name[:-3] for name in os.listdir(MODULES) if name.endswith('.py') and name[:-3] not in ACTION_ONLY)


def module_attributes(tree):
    """The attributes read of a variable named module anywhere in the source."""
    return set(node.attr for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == 'module')


@pytest.mark.parametrize('name', module_names())
def test_every_module_has_the_skeleton(name):
    module = importlib.import_module('ansible_collections.proxtalos.cluster.plugins.modules.' + name)
    kwargs = module.module_kwargs()
    assert set(kwargs) <= _action_module.KNOWN_KWARGS and 'argument_spec' in kwargs, name
    assert kwargs['supports_check_mode'] is True, name
    with open(os.path.join(MODULES, name + '.py'), encoding='utf-8') as handle:
        tree = ast.parse(handle.read())
    functions = dict((node.name, node) for node in tree.body if isinstance(node, ast.FunctionDef))
    assert [arg.arg for arg in functions['run'].args.args] == ['module'], name
    main = functions['main']
    assert len(main.body) == 1 and ast.unparse(main.body[0]) == 'run(AnsibleModule(**module_kwargs()))', name
    used = module_attributes(tree) - MODULE_API
    assert not used, '%s uses AnsibleModule attributes the facade does not provide: %s' % (name, sorted(used))


def test_the_module_utils_use_no_more_of_the_module():
    used = set()
    for folder, _dirs, files in os.walk(os.path.join(ROOT, 'plugins', 'module_utils')):
        for file_name in files:
            if file_name.endswith('.py'):
                with open(os.path.join(folder, file_name), encoding='utf-8') as handle:
                    used |= module_attributes(ast.parse(handle.read()))
    assert used <= MODULE_API, sorted(used - MODULE_API)


def test_the_facade_provides_the_module_api():
    facade = _action_module.ModuleFacade({'argument_spec': {}}, {})
    assert all(hasattr(facade, name) for name in MODULE_API)


PROBE = '''
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.proxtalos.cluster.plugins.module_utils import _secrets


def module_kwargs():
    return dict(
        argument_spec=dict(
            name=dict(type='str', required=True),
            token=dict(type='str', no_log=True),
            items=dict(type='list', elements='dict', options=dict(key=dict(type='str', no_log=True), label=dict(type='str'))),
            mode=dict(type='str', default='ok', choices=['ok', 'fail', 'raise', 'command', 'atexit', 'path', 'path-fail']),
            count=dict(type='int', default=1),
            marker=dict(type='path'),
        ),
        supports_check_mode=True,
        mutually_exclusive=[('token', 'items')],
        required_if=[('mode', 'atexit', ('marker',)), ('mode', 'path', ('marker',))],
    )


def run(module):
    params = module.params
    if params['mode'] == 'raise':
        raise RuntimeError('boom in run')
    if params['mode'] == 'atexit':
        import atexit
        atexit.register(os.remove, params['marker'])
        module.exit_json(changed=False)
    if params['mode'] == 'path':
        module.exit_json(changed=False, path=params['marker'])
    if params['mode'] == 'path-fail':
        module.fail_json(msg='no', dest=os.path.dirname(params['marker']))
    module.warn('careful with %s' % params['name'])
    found = 'found-%s-secret' % params['name']
    _secrets.register(module, found)
    result = dict(changed=not module.check_mode, check_mode=module.check_mode, diff=module._diff, name=params['name'],
                  token=params['token'], items=params['items'], count=params['count'], found=found,
                  sentence='the token is %s' % params['token'])
    if params['mode'] == 'command':
        git = module.get_bin_path('git')
        rc, out, err = module.run_command(['sh', '-c', 'cat; echo "$PROBE_VAR" >&2; exit 3', 'ignored'], data='to stdin',
                                          environ_update={'PROBE_VAR': 'from environ_update'})
        result.update(git=git, rc=rc, out=out, err=err, missing=module.get_bin_path('no-such-program-here'))
    if params['mode'] == 'fail':
        module.fail_json(msg='failed for %s with %s' % (params['name'], found), **result)
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))
'''


@pytest.fixture
def probe(tmp_path):
    path = tmp_path / 'probe_module.py'
    path.write_text(PROBE)
    spec = importlib.util.spec_from_file_location('probe_module', str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def as_module_process(module, args, capsys, check_mode=False, diff=False):
    """The result AnsibleModule prints for main() (the JSON a module process writes)."""
    args = dict(args, **INVOCATION)
    if check_mode:
        args['_ansible_check_mode'] = True
    if diff:
        args['_ansible_diff'] = True
    capsys.readouterr()
    module_warnings._global_warnings.clear()  # pylint: disable=protected-access
    return run_module(module, capsys, **args)[0]


def in_the_worker(module, args, check_mode=False, diff=False):
    return _action_module.run_module(module, args, check_mode=check_mode, diff=diff, inject_invocation=True)


def comparable(result):
    """A result without what differs by nature: the traceback text, the ansible-core warnings list format."""
    result = dict(result)
    result.pop('exception', None)
    result['warnings'] = [warning if isinstance(warning, str) else warning['event']['msg'] for warning in result.get('warnings', [])]
    return result


CASES = {
    'normal': (dict(name='n1', token='tok-s3cr3t-1'), {}),
    'check mode and diff': (dict(name='n2', token='tok-s3cr3t-2', count='7'), dict(check_mode=True, diff=True)),
    'failure': (dict(name='n3', mode='fail', items=[{'key': 'sub-s3cr3t-3', 'label': 'l'}]), {}),
    'run_command and get_bin_path': (dict(name='n4', mode='command'), {}),
    'unsupported option': (dict(name='n5', bogus=1), {}),
    'mutually exclusive': (dict(name='n6', token='tok-s3cr3t-6', items=[]), {}),
    'missing required': (dict(token='tok-s3cr3t-7'), {}),
    'bad choice and type': (dict(name='n8', mode='nope', count='many'), {}),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_the_facade_gives_the_module_process_result(probe, capsys, case):
    args, how = CASES[case]
    process = as_module_process(probe, args, capsys, **how)
    worker = in_the_worker(probe, args, **how)
    if process.get('failed') and 'changed' not in process:
        # an argument error: the same message (AnsibleModule adds more of its own keys there)
        # (the module's name in it: a module process has the task's action, here basic.py)
        assert worker['failed'] is True and worker['msg'] == process['msg'].replace('(basic.py) module', '(probe_module) module')
    else:
        assert comparable(worker) == comparable(process)
    text = json.dumps(worker)
    for secret in ('s3cr3t', 'found-n'):
        assert secret not in text, case


def test_no_log_values_and_registered_values_are_masked(probe):
    result = in_the_worker(probe, dict(name='n9', token='tok-s3cr3t-9'))
    assert result['token'] == 'VALUE_SPECIFIED_IN_NO_LOG_PARAMETER' and result['found'] == 'VALUE_SPECIFIED_IN_NO_LOG_PARAMETER'
    assert result['sentence'] == 'the token is ********' and result['warnings'] == ['careful with n9']
    assert result['invocation']['module_args']['token'] == 'VALUE_SPECIFIED_IN_NO_LOG_PARAMETER'
    failed = in_the_worker(probe, dict(name='n10', mode='fail', items=[{'key': 'sub-s3cr3t-10', 'label': 'visible'}]))
    assert failed['failed'] is True and failed['msg'] == 'failed for n10 with ********'
    assert failed['items'] == [{'key': 'VALUE_SPECIFIED_IN_NO_LOG_PARAMETER', 'label': 'visible'}]


def test_a_path_or_dest_result_gets_the_file_details_as_from_ansible_module(probe, capsys, tmp_path):
    marker = tmp_path / 'marker'
    marker.write_text('12345')
    marker.chmod(0o640)
    for mode in ('path', 'path-fail'):
        args = dict(name='n15', mode=mode, marker=str(marker))
        process = as_module_process(probe, args, capsys)
        worker = in_the_worker(probe, args)
        assert comparable(worker) == comparable(process)
    assert in_the_worker(probe, dict(name='n15', mode='path', marker=str(marker)))['mode'] == '0640'


def test_no_log_values_are_collected_as_ansible_module_collects_them():
    spec = {'token': {'type': 'raw', 'no_log': True}, 'port': {'type': 'int', 'no_log': True}, 'off': {'type': 'int', 'no_log': True},
            'nodes': {'type': 'list', 'elements': 'dict', 'options': {'key': {'no_log': True}, 'name': {}}},
            'one': {'type': 'dict', 'options': {'key': {'no_log': True}}}, 'plain': {'type': 'str'}}
    params = {'token': {'a': ['x1', 2, True, None]}, 'port': 6443, 'off': 0, 'plain': 'p',
              'nodes': [{'key': 'k1', 'name': 'n1'}, {'key': None, 'name': 'n2'}], 'one': {'key': 'k2'}}
    assert _action_module.no_log_values(spec, params) == {'x1', '2', '6443', 'k1', 'k2'}
    # what ansible-core's own (private) collector finds, which the facade must not import
    assert _action_module.no_log_values(spec, params) == parameters._list_no_log_values(spec, params)  # pylint: disable=protected-access


def test_run_command_as_ansible_module_runs_it(probe):
    result = in_the_worker(probe, dict(name='n11', mode='command'))
    assert result['rc'] == 3 and result['out'] == 'to stdin\n' and result['err'] == 'from environ_update\n'
    assert result['git'] and os.path.basename(result['git']) == 'git' and result['missing'] is None


def test_an_exception_escaping_run_is_a_failed_result_with_its_traceback(probe):
    result = in_the_worker(probe, dict(name='n12', mode='raise'))
    assert result['failed'] is True and 'RuntimeError: boom in run' in result['msg']
    assert 'Traceback (most recent call last)' in result['exception'] and 'boom in run' in result['exception']


def test_exit_handlers_registered_in_run_run_at_its_end(probe, tmp_path):
    marker = tmp_path / 'marker'
    marker.write_text('x')
    before = atexit._ncallbacks()  # pylint: disable=protected-access
    result = in_the_worker(probe, dict(name='n13', mode='atexit', marker=str(marker)))
    assert result == {'changed': False, 'invocation': result['invocation']}
    assert not marker.exists() and atexit._ncallbacks() == before  # pylint: disable=protected-access


def test_check_mode_of_a_module_without_it_is_skipped(probe):
    kwargs = probe.module_kwargs()
    probe.module_kwargs = lambda: dict(kwargs, supports_check_mode=False)
    result = in_the_worker(probe, dict(name='n14'), check_mode=True)
    assert result['skipped'] is True and 'does not support check mode' in result['msg']


def test_unknown_module_keywords_are_refused():
    with pytest.raises(ValueError, match='add_file_common_args'):
        _action_module.ModuleFacade({'argument_spec': {}, 'add_file_common_args': True}, {})


# ---- modules of the collection, both ways


def git(repo, *args):
    identity = dict(GIT_AUTHOR_NAME='t', GIT_AUTHOR_EMAIL='t@t', GIT_COMMITTER_NAME='t', GIT_COMMITTER_EMAIL='t@t')
    return subprocess.run(['git', '-C', str(repo)] + list(args), check=True, capture_output=True, text=True,
                          env=dict(os.environ, **identity)).stdout.strip()


def test_gitops_commit_both_ways(capsys, tmp_path, monkeypatch):
    """run_command and get_bin_path: the same commit (same tree, author date and committer) in two equal repositories."""
    from ansible_collections.proxtalos.cluster.plugins.modules import gitops_commit  # pylint: disable=import-outside-toplevel
    monkeypatch.setenv('GIT_AUTHOR_DATE', '2026-01-01T00:00:00Z')
    monkeypatch.setenv('GIT_COMMITTER_DATE', '2026-01-01T00:00:00Z')
    results = []
    for way in ('process', 'worker'):
        repo = tmp_path / way
        git(tmp_path, 'init', '--quiet', '--initial-branch', 'main', str(repo))
        (repo / 'a.yaml').write_text('kind: A\n')
        args = dict(repo_dir=str(repo), paths=['a.yaml'], commit_message='add a')
        check = as_module_process(gitops_commit, args, capsys, check_mode=True) if way == 'process' else in_the_worker(gitops_commit, args, check_mode=True)
        done = as_module_process(gitops_commit, args, capsys) if way == 'process' else in_the_worker(gitops_commit, args)
        again = as_module_process(gitops_commit, args, capsys) if way == 'process' else in_the_worker(gitops_commit, args)
        results.append([comparable(result) for result in (check, done, again)])
    for result in results[0] + results[1]:
        for step in ('invocation',):
            result[step]['module_args']['repo_dir'] = 'REPO'
    assert results[0] == results[1]
    assert results[1][1]['changed'] is True and results[1][2]['changed'] is False


def test_talos_secrets_both_ways(capsys, tmp_path):
    """Check mode, a no_log option (vault_password) in the invocation, an argument error."""
    from ansible_collections.proxtalos.cluster.plugins.modules import talos_secrets  # pylint: disable=import-outside-toplevel
    args = dict(path=str(tmp_path / 'secrets.yaml'), vault_password='vault-s3cr3t')
    process = as_module_process(talos_secrets, args, capsys, check_mode=True, diff=True)
    worker = in_the_worker(talos_secrets, args, check_mode=True, diff=True)
    assert comparable(worker) == comparable(process) and worker['changed'] is True
    assert worker['invocation']['module_args']['vault_password'] == 'VALUE_SPECIFIED_IN_NO_LOG_PARAMETER'
    assert not (tmp_path / 'secrets.yaml').exists() and 'vault-s3cr3t' not in json.dumps(worker)
    bad = dict(args, vault_password_file=str(tmp_path / 'pw'))
    process = as_module_process(talos_secrets, bad, capsys)
    worker = in_the_worker(talos_secrets, bad)
    assert worker['failed'] is True and worker['msg'] == process['msg']


def test_multicluster_check_failure_both_ways(capsys):
    from ansible_collections.proxtalos.cluster.plugins.modules import multicluster_check  # pylint: disable=import-outside-toplevel
    args = dict(clusters=[{'name': 'a'}, {'name': 'a'}])
    process = as_module_process(multicluster_check, args, capsys)
    worker = in_the_worker(multicluster_check, args)
    assert process.get('failed') is True
    assert comparable(worker) == comparable(process)
