# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Check every host's own role options in one task: host_argument_spec and host_arguments.

A role whose tasks all run once for the play (run_once) has its argument check run once too, in the first host's
context. The options a host may set for itself (host and group vars) are then checked for every host by one
ansible.builtin.validate_argument_spec task: the spec has one dict option per host, whose suboptions are the role's
options (without `required` and `default`, which are the role's own check's, and their descriptions), and the arguments are each host's own
values of those options from hostvars - so that an error names the host ("... found in 'lab-w-2'") and the option.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

# What a role option declares that belongs to the role's own check (required, default) or to its documentation, not to
# the check of a host's own value.
ROLE_ONLY_KEYS = ('required', 'default', 'description')


def host_argument_spec(options, hosts):
    """{host: {type: dict, options: the role's options without required, default and description}} for every host."""
    if not isinstance(options, dict):
        raise AnsibleFilterError('host_argument_spec: expected the role\'s options (a dict), got %s' % type(options).__name__)
    own = {}
    for name, spec in options.items():
        if not isinstance(spec, dict):
            raise AnsibleFilterError('host_argument_spec: option %s is not a dict' % name)
        own[name] = dict((key, value) for key, value in spec.items() if key not in ROLE_ONLY_KEYS)
    return dict((str(host), {'type': 'dict', 'options': own}) for host in hosts)


def host_arguments(hosts, hostvars, names):
    """{host: {option: value}}: each host's own values of those options in hostvars (its host and group vars, facts,
    extra vars), only the hosts that set one."""
    found = {}
    for host in hosts:
        values = hostvars[host]
        own = dict((name, values[name]) for name in names if name in values)
        if own:
            found[str(host)] = own
    return found


class FilterModule(object):
    """Per-host role option checks."""

    def filters(self):
        return {'host_argument_spec': host_argument_spec, 'host_arguments': host_arguments}
