# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Check every host's own role options in one task: host_argument_spec and host_arguments.

A role whose tasks all run once for the play (run_once) has its argument check run once too, in the first host's
context. The options a host may set for itself (host and group vars) are then checked for every host by one
ansible.builtin.validate_argument_spec task: the spec has one dict option per host, whose suboptions are the role's
options (without `default`, which is the role's own check's, and their descriptions; `required` only where the first
host has the option among its own values), and the arguments are each host's own values of those options from
hostvars - so that an error names the host ("... found in 'lab-w-2'") and the option.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

# What a role option declares that belongs to the role's own check (default) or to its documentation, not to the check
# of a host's own value.
ROLE_ONLY_KEYS = ('default', 'description')


def host_argument_spec(options, hosts, first_host_values=None):
    """{host: {type: dict, options: the role's options}} for every host, without defaults and descriptions.

    An option stays required for every host only when the first host (the one the task runs on) has it among its own
    values (first_host_values, its hostvars: inventory, facts, extra vars): then each host must have its own too - a
    host without vm_id fails naming that host. An option the first host gets from the play (play or role vars) is the
    same for every host, and the role's own argument check already checked it.
    """
    if not isinstance(options, dict):
        raise AnsibleFilterError('host_argument_spec: expected the role\'s options (a dict), got %s' % type(options).__name__)
    first_host_values = first_host_values if first_host_values is not None else {}
    own = {}
    for name, spec in options.items():
        if not isinstance(spec, dict):
            raise AnsibleFilterError('host_argument_spec: option %s is not a dict' % name)
        checked = dict((key, value) for key, value in spec.items() if key not in ROLE_ONLY_KEYS)
        if checked.get('required') and name not in first_host_values:
            del checked['required']
        own[name] = checked
    return dict((str(host), {'type': 'dict', 'options': own}) for host in hosts)


def host_arguments(hosts, hostvars, names):
    """{host: {option: value}} for every host: its own values of those options in hostvars (its host and group vars,
    facts, extra vars); {} for a host that sets none. Each host's values are templated by hostvars[host] (with the host's
    own variables as the context)."""
    found = {}
    for host in hosts:
        values = hostvars[host]
        found[str(host)] = dict((name, values[name]) for name in names if name in values)
    return found


class FilterModule(object):
    """Per-host role option checks."""

    def filters(self):
        return {'host_argument_spec': host_argument_spec, 'host_arguments': host_arguments}
