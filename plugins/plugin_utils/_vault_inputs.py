# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action plugin of every module of the collection: vault-encrypted input files opened for the module. PRIVATE.

The module itself runs as any module does: a module process started by ActionBase._execute_module, as ansible-core's
own action plugin for a module without one (ansible.builtin.normal) starts it - on every ansible-core the collection
supports, through public interfaces only (docs/adr/0001-modules-in-the-worker-process.md: the earlier in-worker run on
ansible-core internals was replaced).

Input files kept as Ansible Vault envelopes (docs/stages/secrets.md: with only a prompted vault password the
kubeconfig, talosconfig and machine configs are): the options kubeconfig, talosconfig and config_path (also in the
items of `nodes`) that name an encrypted file are handed to the module as a decrypted copy - DataLoader.get_real_file
with the run's vault passwords, a 0600 file in Ansible's local temporary folder - removed when the task ends. The
module never sees a vault password.
"""

from __future__ import annotations

import os

from ansible.errors import AnsibleError
from ansible.parsing.vault import is_encrypted_file
from ansible.plugins.action.normal import ActionModule as NormalAction

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


class VaultInputsAction(NormalAction):
    """The action plugin of a collection module: ansible-core's normal action (the module process, check mode and
    async as for any module) with the vault-encrypted input files handed over as decrypted copies."""

    def run(self, tmp=None, task_vars=None):
        task_args = self._task.args
        copies = []
        try:
            try:
                self._task.args = open_vaulted_inputs(task_args, self._decrypted_copy, copies)
            except AnsibleError as exc:
                return {'failed': True, 'msg': str(exc)}
            return super().run(tmp, task_vars)
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
