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
imports were loaded once, in Ansible's main process, with the action plugin): the same arguments,
including Ansible's internal ones (check mode, diff, no_log, verbosity), serialised and read
back exactly as the module process would have them, the module's printed result parsed by the
same code as a module process's output. A module that fails or raises ends the task as a
module process's failure would. Anything else (another interpreter, another connection, become,
async) runs the module process as before.

The worker process is forked for one task and ends with it, so nothing the module sets up
(imports, threads, environment) outlives the task; the arguments, stdout and environment are
still put back after the run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

from ansible.module_utils import basic
from ansible.module_utils.common.json import Direction, get_module_encoder
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible.utils.vars import merge_hash

display = Display()

# How arguments travel to a module and results back. A module without METADATA (none of ours
# declares it) uses the legacy profile; tests/unit/plugins/plugin_utils/test_in_process.py checks that no
# module of the collection declares another.
SERIALIZATION_PROFILE = 'legacy'


def same_interpreter(interpreter, executable):
    """Whether the interpreter path names this very Python (a virtualenv's python is a symlink whose location is the
    environment: the paths are compared as given, not resolved)."""
    return isinstance(interpreter, str) and os.path.normpath(os.path.abspath(interpreter)) == os.path.normpath(os.path.abspath(executable))


@contextlib.contextmanager
def module_process_state(json_args, environment):
    """What a module process would start with: its arguments in basic, the task's environment; put back afterwards."""
    saved_args = (basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE)
    saved_environment = {name: os.environ.get(name) for name in environment}
    basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE = json_args, SERIALIZATION_PROFILE
    os.environ.update({name: str(value) for name, value in environment.items()})
    try:
        yield
    finally:
        basic._ANSIBLE_ARGS, basic._ANSIBLE_PROFILE = saved_args
        for name, value in saved_environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_main(main, json_args, environment):
    """main() with the given arguments; (exit code, stdout, stderr) as a module process would give them."""
    stdout, stderr = io.StringIO(), io.StringIO()
    code = 0
    with module_process_state(json_args, environment), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main()
        except SystemExit as exit_request:
            code = exit_request.code if isinstance(exit_request.code, int) else (0 if exit_request.code is None else 1)
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
        result = super().run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        reason = self._not_in_process_because(task_vars)
        if reason:
            display.vvvv('%s runs as a module process: %s' % (self._task.action, reason))
            result = merge_hash(result, self._execute_module(task_vars=task_vars, wrap_async=self._task.async_val))
            if not self._task.async_val:
                self._remove_tmp_path(self._connection._shell.tmpdir)
            return result
        display.vvvv('%s runs in the worker process (the controller\'s interpreter, a local connection)' % self._task.action)
        return merge_hash(result, self._run_in_process(task_vars))

    def _not_in_process_because(self, task_vars):
        """Why this task must start a module process; '' when it can run in the worker."""
        if self._connection.transport != 'local':
            return 'the connection is %s, not local' % self._connection.transport
        if self._task.async_val:
            return 'the task is async'
        if self._play_context.become:
            return 'the task uses become'
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

    def _run_in_process(self, task_vars):
        module_args = dict(self._task.args)
        self._update_module_args(self._task.action, module_args, task_vars)
        encoder = get_module_encoder(SERIALIZATION_PROFILE, Direction.CONTROLLER_TO_MODULE)
        json_args = json.dumps({'ANSIBLE_MODULE_ARGS': module_args}, cls=encoder).encode('utf-8')
        environment = {}
        self._compute_environment_string(raw_environment_out=environment)
        code, stdout, stderr = run_main(self.collection_module.main, json_args, environment)
        returned = self._parse_returned_data({'rc': code, 'stdout': stdout, 'stderr': stderr}, SERIALIZATION_PROFILE)
        returned.remove_internal_keys()
        return returned.as_result_dict(for_round_trip=True)
