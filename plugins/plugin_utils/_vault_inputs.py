# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action plugin of every module of the collection: the module in the worker when it can, vault inputs opened. PRIVATE.

Two ways to run a module, both on ansible-core's public interfaces (docs/adr/0001-modules-in-the-worker-process.md):
- in the worker process Ansible forked for the task, through plugin_utils/_action_module.py's facade of AnsibleModule
  (the module's `run(module)` with its `module_kwargs()`), when the module would run with the controller's own Python
  anyway: a local connection, ansible_python_interpreter naming the controller's interpreter, no become, no async, no
  task `environment` (TMPDIR, TZ, PYTHONPATH... take effect only when a process starts). The action plugin imports its
  module (`collection_module`), so ansible-playbook's main process loads the module and its libraries once and every
  worker inherits them;
- otherwise as a module process, started by ActionBase._execute_module as ansible-core's own action plugin for a
  module without one (ansible.builtin.normal) starts it.
`-vvvv` says which way each task ran.

Input files kept as Ansible Vault envelopes (docs/stages/secrets.md: with only a prompted vault password the
kubeconfig, talosconfig and machine configs are): the options kubeconfig, talosconfig and config_path (also in the
items of `nodes`) that name an encrypted file are handed to the module as a decrypted copy - DataLoader.get_real_file
with the run's vault passwords, a 0600 file in Ansible's local temporary folder - removed when the task ends, whichever
way the module ran. The module never sees a vault password.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from ansible import constants as C
from ansible.errors import AnsibleError
from ansible.module_utils.common.parameters import PASS_VARS
from ansible.parsing.vault import is_encrypted_file
from ansible.plugins.action import ActionBase
from ansible.plugins.action.normal import ActionModule as NormalAction
from ansible.utils.display import Display

from ansible_collections.proxtalos.cluster.plugins.plugin_utils._action_module import run_module

display = Display()

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


def same_interpreter(interpreter, executable):
    """Whether the interpreter path names this very Python: the same folder once its symbolic links are resolved (a
    virtual environment is its folder: .venv may be a link to another checkout's) and the same program in the end (python
    and python3 of one environment). The program alone is not enough: every virtual environment's python links to the
    base interpreter, with another sys.path."""
    if not isinstance(interpreter, str) or not interpreter:
        return False

    def where(path):
        path = os.path.abspath(path)
        return os.path.realpath(os.path.dirname(path)), os.path.realpath(path)

    return where(interpreter) == where(executable)


def inject_invocation(task_vars):
    """Whether a module process would add `invocation` to its result: ansible-core 2.21 only when asked (the setting
    INJECT_INVOCATION, passed as _ansible_inject_invocation); 2.19 and 2.20 always."""
    if 'inject_invocation' not in PASS_VARS:
        return True
    return bool(C.config.get_config_value('INJECT_INVOCATION', variables=task_vars))


class VaultInputsAction(NormalAction):
    """The action plugin of a collection module: run(module) in the worker through the facade where it can
    (plugin_utils/_action_module.py), else ansible-core's normal action (the module process, check mode and async as
    for any module); the vault-encrypted input files handed over as decrypted copies either way. A subclass names its
    module: `collection_module`, the imported module file (None: always the module process)."""

    collection_module = None

    def run(self, tmp=None, task_vars=None):
        task_args = self._task.args
        copies = []
        try:
            try:
                self._task.args = open_vaulted_inputs(task_args, self._decrypted_copy, copies)
            except AnsibleError as exc:
                return {'failed': True, 'msg': str(exc)}
            return self._run_module(tmp, task_vars)
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

    def _run_module(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        host = task_vars.get('inventory_hostname')
        reason = self._not_in_worker_because(task_vars)
        if reason:
            display.vvvv('%s runs as a module process: %s' % (self._task.action, reason), host=host)
            return super().run(tmp, task_vars)
        display.vvvv("%s runs in the worker process (the controller's interpreter, a local connection)" % self._task.action, host=host)
        # ActionBase.run: the checks every action makes (check mode support, argument validation of the action)
        result = ActionBase.run(self, tmp, task_vars)
        del tmp
        result.update(run_module(self.collection_module, self._task.args, check_mode=bool(self._task.check_mode),
                                 diff=bool(self._task.diff), inject_invocation=inject_invocation(task_vars),
                                 name=self._task.action))
        return result

    def _not_in_worker_because(self, task_vars):
        """Why this task must start a module process; '' when it can run in the worker."""
        if self.collection_module is None:
            return 'the action plugin names no module to run in the worker'
        if self._connection.transport != 'local':
            return 'the connection is %s, not local' % self._connection.transport
        if self._task.async_val:
            return 'the task is async'
        if self._play_context.become:
            return 'the task uses become'
        environment = self._task_environment()
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
            return "ansible_python_interpreter is %s, not the controller's %s" % (interpreter, sys.executable)
        return ''

    def _task_environment(self):
        """The variables the task's `environment` sets (templated), as the names of a dict; a template that does not
        give a dict counts as setting something."""
        names = set()
        environment = self._task.environment
        for item in (environment if isinstance(environment, list) else [environment]):
            if not item:
                continue
            value = self._templar.template(item)
            if isinstance(value, Mapping):
                names.update(str(key) for key in value)
            elif value:
                names.add(str(value))
        return names
