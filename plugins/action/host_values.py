# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of proxtalos.cluster.host_values: one variable as each host's own task would see it, in one task.

A `set_fact` on every host costs the ansible-playbook main process a worker and the variables of each host, whatever
the task does (about 4 s for the machine config inputs at 96 nodes). This plugin runs once (run_once) and templates the
variable in each host's context: the variables come from the same call the strategy makes for a host's run of this
task (VariableManager.get_vars with the play, the host and this task: role defaults and vars, group and host vars,
facts, play, block and task vars, extra vars, magic variables), plus the play-level variables, the same for every
host, copied from this task's own variables: the hosts of the play and of its batch (ansible_play_hosts_all,
ansible_play_hosts, ansible_play_batch, play_hosts) and those the strategy adds (ansible_current_hosts,
ansible_failed_hosts). Not quite every host's own task variables: see the notes of plugins/modules/host_values.py.

Another host's variables for this task come from VariableManager.get_delegated_vars_and_hostname, the public method
ansible-core's task executor calls for a delegated task's variables (the same get_vars call with the play, that host
and the task), over one copy of this task delegated to each host in turn: an action plugin has no public way to the
inventory's Host objects that get_vars takes. Host names are checked against the inventory first (the hostvars magic
variable), since that method would make up a host for a name the inventory lacks.

The variable is templated for every host by a Templar of its own over that host's variables (the task's Templar
copied with copy_with_new_env): every host's value is rendered from its own variables.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.validation import check_type_list, check_type_str
from ansible.plugins.action import ActionBase

# Variables of the play, not of a host, that the strategy gives every task (VariableManager.get_vars with the hosts
# of the play and of the batch; add_tqm_variables): copied from this task's variables for every host.
PLAY_LEVEL_VARS = ('ansible_play_hosts_all', 'ansible_play_hosts', 'ansible_play_batch', 'play_hosts',
                   'ansible_current_hosts', 'ansible_failed_hosts')


class ActionModule(ActionBase):
    """proxtalos.cluster.host_values (plugins/modules/host_values.py)."""

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(('hosts', 'var'))
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        try:
            hosts = [check_type_str(host) for host in check_type_list(self._task.args.get('hosts'))]
            name = check_type_str(self._task.args.get('var'))
        except TypeError as exc:
            raise AnsibleActionFail('host_values: hosts must be a list of host names and var a variable name: %s' % exc) from exc
        if not hosts or not name:
            raise AnsibleActionFail('host_values: hosts and var are required')
        manager = self._task.get_variable_manager()
        inventory_hosts = task_vars.get('hostvars')
        if inventory_hosts is None:
            raise AnsibleActionFail('host_values: the task has no hostvars variable to find the hosts in')
        play_level = dict((key, task_vars[key]) for key in PLAY_LEVEL_VARS if key in task_vars)
        delegated = None
        values = {}
        for host_name in hosts:
            if host_name not in inventory_hosts:
                raise AnsibleActionFail('host_values: %s is not a host of the inventory' % host_name)
            if host_name == task_vars.get('inventory_hostname'):
                host_vars = task_vars
            else:
                if delegated is None:
                    delegated = self._task.copy(exclude_tasks=True)
                host_vars = other_host_vars(manager, self._templar, delegated, host_name)
                host_vars.update(play_level)
            if name not in host_vars:
                raise AnsibleActionFail('host_values: %s has no variable %s' % (host_name, name))
            try:
                values[host_name] = self._templar.copy_with_new_env(available_variables=host_vars).template(host_vars[name])
            except Exception as exc:  # pylint: disable=broad-except
                raise AnsibleActionFail('host_values: %s: %s' % (host_name, exc)) from exc
        result.update(changed=False, by_host=values)
        return result


def other_host_vars(manager, templar, delegated, host_name):
    """The variables of host_name for this task: get_vars(play, that host, the task) through the delegation method.

    delegated is a copy of the task (Task.copy); its delegate_to is set to host_name for the call. The method puts
    the variables under ansible_delegated_vars[<host name>] and sets their inventory_hostname to the one of the
    `variables` it is given (the delegating host's), here host_name's own."""
    delegated.delegate_to = host_name
    found, name = manager.get_delegated_vars_and_hostname(templar, delegated, {'inventory_hostname': host_name})
    if name != host_name:
        raise AnsibleActionFail('host_values: the variables of %s were not found (got those of %r)' % (host_name, name))
    return found['ansible_delegated_vars'][host_name]
