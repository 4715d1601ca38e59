#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: host_values
short_description: One variable as each host's own task would see it, read for every host in one task
version_added: 0.1.0
description:
  - Templates the variable O(var) in the context of each host of O(hosts) - the variables Ansible gives that host's
    run of this very task (role defaults and role vars, group and host vars, facts, play, block and task vars, extra
    vars, magic variables such as C(inventory_hostname)) - and returns each host's value under its name
    (RV(by_host)).
  - Made for a C(run_once) task in place of a C(set_fact) on every host, whose cost grows with the hosts (a worker
    process and the variables of each host); the values are the same as each host's own C(set_fact) of that
    variable would set.
  - A template compiled for one host serves the next hosts (the values are still each host's own).
  - A value that cannot be templated for a host fails the task with a message that starts with C(host_values), that
    host's name and the error, also under C(no_log).
  - Runs on the controller, as an action plugin; never changes anything.
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
  - proxtalos.cluster._attributes.INFO_MODULE
attributes:
  action:
    support: full
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
options:
  hosts:
    description:
      - The inventory hosts whose values to read, in the order of RV(by_host).
      - Each is an inventory host name (not an address such as an C(ansible_host)); a name the inventory lacks fails
        the task, naming it.
    type: list
    elements: str
    required: true
  var:
    description:
      - The name of the variable, untemplated (its value is templated in each host's context).
      - Every host must have it (a role default or var of the task's role, for example).
    type: str
    required: true
notes:
  - Use C(no_log) on the task when the values hold secrets.
  - The variables of a host other than the one the task runs on are those Ansible's variable manager gives that host
    for this task, plus the play's variables of this task (C(ansible_play_hosts_all), C(ansible_play_hosts),
    C(ansible_play_batch), C(play_hosts), C(ansible_current_hosts), C(ansible_failed_hosts)). They lack what the task
    executor adds to a host's own run only - C(ansible_search_path), and the connection variables it sets from the
    host's connection (C(ansible_host), C(ansible_user), C(ansible_port) when the inventory does not set them) - so a
    variable that reads those gets another value (or none) than the host's own C(set_fact) would. Read them from the
    inventory, or keep such a variable to a C(set_fact).
"""

EXAMPLES = r"""
- name: Every node's inputs, each read in the node's own context (role defaults, group and host vars)
  proxtalos.cluster.host_values:
    hosts: "{{ ansible_play_batch }}"
    var: talos_machines_node_config_inputs
  run_once: true
  register: inputs

- name: Use them
  ansible.builtin.debug:
    msg: "{{ ansible_play_batch | map('extract', inputs.by_host) | list }}"
  run_once: true
"""

RETURN = r"""
by_host:
  description: Each host's value of O(var), by host name, in the order of O(hosts).
  returned: always
  type: dict
  sample: {"cp-1": {"name": "cp-1", "machine_type": "controlplane"}}
"""
