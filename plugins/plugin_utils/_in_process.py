# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run one of the collection's modules inside Ansible's worker process. PRIVATE to the collection.

Every module of this collection runs on the controller (docs/development.md: the inventory sets
`ansible_connection: local` and `ansible_python_interpreter: "{{ ansible_playbook_python }}"`).
Started the usual way, each task costs a new Python process: AnsiballZ, the interpreter start,
`ansible.module_utils.basic`, then the module's own imports - about 0.3 s of a 2-core machine
before the module does anything, paid by every task of a run (docs/performance.md).

InProcessModuleAction is the action plugin of such a module. When the task would start the
module with the controller's own interpreter on a local connection, it runs the module's
`main()` in the worker process Ansible already forked for the task (the module file and its
imports were loaded once, in Ansible's main process, with the action plugin):
- the arguments are Ansible's own (check mode, diff, no_log, verbosity added by ActionBase),
  serialised as they would be sent to a module process and read by AnsibleModule from
  ansible.module_utils.basic, where AnsiballZ puts them;
- the printed result is parsed by ActionBase's code for a module process's output;
- an exception that escapes main() becomes the failed result AnsiballZ would print for it, so
  failed_when, until and register see what they would see of a module process;
- exit handlers (atexit) registered while main() runs are run when it ends: a forked worker
  leaves with os._exit and would never run them (the kubernetes package removes the temporary
  files holding a kubeconfig's client key in one).
The task starts the module process as before when any of that cannot hold: another interpreter
or connection, become, async, a task `environment` (TMPDIR, TZ, PYTHONPATH... take effect only
when a process starts), or an ansible-core other than the one whose internals this is built on.
`-vvvv` says which way each task ran.

Input files kept as Ansible Vault envelopes (docs/stages/secrets.md: with only a prompted vault password the
kubeconfig, talosconfig and machine configs are): the options kubeconfig, talosconfig and config_path (also in the
items of `nodes`) that name an encrypted file are handed to the module as a decrypted copy - DataLoader.get_real_file
with the run's vault passwords, a 0600 file in Ansible's local temporary folder - removed when the task ends,
whichever way the module ran. The module never sees a vault password.

Left as it is: Ctrl-C ends a worker at once (Ansible's handler), where a module process would get
KeyboardInterrupt and run its `finally` blocks; a half-written file of ours is then left as
after a SIGKILL (the atomic writes' temporary file, 0600, which the next run replaces). Module
globals carry over between the items of a loop (the items run in one worker).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import sys

from ansible.errors import AnsibleError
from ansible.module_utils import basic
from ansible.module_utils.common.json import Direction, get_module_encoder
from ansible.parsing.vault import is_encrypted_file
from ansible.plugins.action import ActionBase
from ansible.release import __version__ as ansible_core_version
from ansible.utils.display import Display
from ansible.utils.vars import merge_hash

try:
    # What AnsiballZ prints for an exception that escapes a module's main() (ansible-core 2.19+).
    from ansible.module_utils._internal._ansiballz._loader import _handle_exception as print_module_exception
except ImportError:
    print_module_exception = None

display = Display()

# The ansible-core (major, minor) whose internals the in-worker run relies on: ActionBase._update_module_args and
# _parse_returned_data (a UnifiedTaskResult), basic._ANSIBLE_ARGS/_ANSIBLE_PROFILE, AnsiballZ's exception result.
# requirements.txt allows 2.19 to 2.21; on the others the module process runs.
IN_WORKER_CORE = (2, 21)

# How arguments travel to a module and results back. A module without METADATA (none of ours
# declares it) uses the legacy profile; tests/unit/plugins/plugin_utils/test_in_process.py checks that no
# module of the collection declares another.
SERIALIZATION_PROFILE = 'legacy'


def core_version(version=ansible_core_version):
    """'2.21.5' -> (2, 21)."""
    return tuple(int(part) for part in version.split('.')[:2])


def same_interpreter(interpreter, executable):
    """Whether the interpreter path names this very Python (a virtualenv's python is a symlink whose location is the
    environment: the paths are compared as given, not resolved)."""
    return isinstance(interpreter, str) and os.path.normpath(os.path.abspath(interpreter)) == os.path.normpath(os.path.abspath(executable))


@contextlib.contextmanager
def module_arguments(json_args):
    """The arguments where AnsibleModule reads them (AnsiballZ sets the same two); put back afterwards."""
    saved = (basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE)
    basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE = json_args, SERIALIZATION_PROFILE
    try:
        yield
    finally:
        basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE = saved


@contextlib.contextmanager
def exit_handlers_run_at_the_end():
    """atexit handlers registered inside the block are run, last first, when it ends (see the module docstring)."""
    registered = []
    register, unregister = atexit.register, atexit.unregister

    def register_for_the_end(func, *args, **kwargs):
        registered.append((func, args, kwargs))
        return func

    def unregister_for_the_end(func):
        registered[:] = [entry for entry in registered if entry[0] != func]
        unregister(func)

    atexit.register, atexit.unregister = register_for_the_end, unregister_for_the_end
    try:
        yield
    finally:
        atexit.register, atexit.unregister = register, unregister
        for func, args, kwargs in reversed(registered):
            try:
                func(*args, **kwargs)
            except Exception as exc:  # pylint: disable=broad-exception-caught
                display.warning('an exit handler of the module failed: %s: %s' % (type(exc).__name__, exc))


# Options naming a file the module reads that the collection may keep vault-encrypted (top level and in `nodes` items).
VAULTED_INPUTS = ('kubeconfig', 'talosconfig', 'config_path')


def vault_encrypted(path):
    """Whether path is an existing file holding an Ansible Vault envelope."""
    if not isinstance(path, str) or not os.path.isfile(path):
        return False
    with open(path, 'rb') as handle:
        return is_encrypted_file(handle)


def open_vaulted_inputs(args, open_file, copies):
    """args with every VAULTED_INPUTS option that names a vault-encrypted file replaced by open_file(path, option) -
    the path of a decrypted copy, appended to copies as soon as it exists. args itself is not changed."""

    def opened(values, where):
        changed = None
        for key in VAULTED_INPUTS:
            # as AnsibleModule reads a path option: ~ and environment variables expanded
            path = values.get(key)
            path = os.path.expanduser(os.path.expandvars(path)) if isinstance(path, str) else path
            if vault_encrypted(path):
                changed = dict(values) if changed is None else changed
                changed[key] = open_file(os.path.abspath(path), where + key)
                copies.append(changed[key])
        return values if changed is None else changed

    new_args = opened(args, '')
    nodes = new_args.get('nodes')
    if isinstance(nodes, list):
        items = [opened(item, 'nodes[%d].' % index) if isinstance(item, dict) else item for index, item in enumerate(nodes)]
        if any(new is not old for new, old in zip(items, nodes)):
            new_args = dict(new_args, nodes=items)
    return new_args


def run_main(main, json_args):
    """main() with the given arguments; (exit code, stdout, stderr) as a module process would give them."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with module_arguments(json_args), exit_handlers_run_at_the_end(), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            try:
                main()
            except Exception as exc:  # pylint: disable=broad-exception-caught
                # Exception, not BaseException, as AnsiballZ: SystemExit, a task timeout and Ctrl-C go through.
                print_module_exception(exc, SERIALIZATION_PROFILE)
        except SystemExit as exit_request:
            code = exit_request.code
            if not isinstance(code, int):
                if code is not None:
                    stderr.write('%s\n' % code)
                code = 0 if code is None else 1
        else:
            code = 1
            stderr.write('the module returned without reporting a result (exit_json or fail_json)\n')
    return code, stdout.getvalue(), stderr.getvalue()


class InProcessModuleAction(ActionBase):
    """The action plugin of a collection module: in the worker when the module would run on the controller's Python.

    A subclass names its module (`collection_module`, the imported module file). Ansible loads action plugins in its
    main process before it forks the task's worker, so the module and everything it imports (the kubernetes, grpclib
    and cryptography packages) are imported once per run and every worker starts with them.
    """

    _supports_check_mode = True
    _supports_async = True
    collection_module = None

    def run(self, tmp=None, task_vars=None):
        task_args = self._task.args
        copies = []
        try:
            try:
                self._task.args = open_vaulted_inputs(task_args, self._decrypted_copy, copies)
            except AnsibleError as exc:
                return {'failed': True, 'msg': str(exc)}
            return self._run(tmp, task_vars)
        finally:
            self._task.args = task_args
            for path in copies:
                self._loader.cleanup_tmp_file(path)

    def _decrypted_copy(self, path, option):
        """A 0600 decrypted copy of the vault-encrypted file of an option (removed by run() when the task ends)."""
        try:
            return self._loader.get_real_file(path, decrypt=True)
        except AnsibleError as exc:
            raise AnsibleError('%s: %s is vault-encrypted and no vault password of this run opens it (%s). Run with the '
                               'vault password it was written with (--ask-vault-pass or a vault password file); see the '
                               "collection's docs/stages/secrets.md" % (option, path, getattr(exc, 'message', exc))) from None

    def _run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        host = task_vars.get('inventory_hostname')
        reason = self._not_in_worker_because(task_vars)
        if reason:
            display.vvvv('%s runs as a module process: %s' % (self._task.action, reason), host=host)
            result = merge_hash(result, self._execute_module(task_vars=task_vars, wrap_async=self._task.async_val))
            if not self._task.async_val:
                self._remove_tmp_path(self._connection._shell.tmpdir)
            return result
        display.vvvv('%s runs in the worker process (the controller\'s interpreter, a local connection)' % self._task.action, host=host)
        return merge_hash(result, self._run_in_worker(task_vars))

    def _not_in_worker_because(self, task_vars):
        """Why this task must start a module process; '' when it can run in the worker."""
        if core_version() != IN_WORKER_CORE or print_module_exception is None:
            return 'ansible-core %s (the in-worker run is built on %d.%d)' % (ansible_core_version, IN_WORKER_CORE[0], IN_WORKER_CORE[1])
        if self._connection.transport != 'local':
            return 'the connection is %s, not local' % self._connection.transport
        if self._task.async_val:
            return 'the task is async'
        if self._play_context.become:
            return 'the task uses become'
        environment = {}
        self._compute_environment_string(raw_environment_out=environment)
        if environment:
            return 'the task sets an environment (%s)' % ', '.join(sorted(environment))
        host_vars = task_vars
        if self._task.delegate_to:
            host_vars = (task_vars.get('ansible_delegated_vars') or {}).get(self._task.delegate_to, task_vars)
        interpreter = host_vars.get('ansible_python_interpreter')
        if interpreter is None:
            return 'ansible_python_interpreter is not set (it would be discovered)'
        interpreter = self._templar.template(interpreter)
        if not same_interpreter(interpreter, sys.executable):
            return 'ansible_python_interpreter is %s, not the controller\'s %s' % (interpreter, sys.executable)
        return ''

    def _run_in_worker(self, task_vars):
        module_args = dict(self._task.args)
        self._update_module_args(self._task.action, module_args, task_vars)
        encoder = get_module_encoder(SERIALIZATION_PROFILE, Direction.CONTROLLER_TO_MODULE)
        json_args = json.dumps({'ANSIBLE_MODULE_ARGS': module_args}, cls=encoder).encode('utf-8')
        code, stdout, stderr = run_main(self.collection_module.main, json_args)
        returned = self._parse_returned_data({'rc': code, 'stdout': stdout, 'stderr': stderr}, SERIALIZATION_PROFILE)
        returned.remove_internal_keys()
        return returned.as_result_dict(for_round_trip=True)
