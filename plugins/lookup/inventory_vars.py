# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: inventory_vars
short_description: Read named variables of another inventory (another cluster's values)
version_added: 0.1.0
description:
  - Loads each inventory source given as a term (a folder or file, as for C(-i)), takes one host of O(group) (the
    first by name) and returns the values of the variables in O(names) for that host, templated in that inventory's
    context (its group_vars and host_vars, C(inventory_dir)). Variables the inventory does not define are left out.
  - Used by the preflight role to check cluster values across inventories (C(preflight_peer_inventories)) - two
    cluster inventories cannot be given together with C(-i), since both define the same groups and C(group_vars/all).
  - Only the variables named are templated, so an inventory's vault-encrypted secrets are not decrypted unless one
    is asked for. Vault-encrypted files of the inventory are read with the vault secrets of the current run.
options:
  _terms:
    description: Inventory sources (paths), relative to the current directory or absolute.
    type: list
    elements: path
    required: true
  names:
    description: The variables to read.
    type: list
    elements: str
    required: true
  group:
    description: The group one of whose hosts is read.
    type: str
    default: cluster
"""

EXAMPLES = r"""
- name: Cluster values of the apps inventory
  ansible.builtin.debug:
    msg: "{{ lookup('proxtalos.cluster.inventory_vars', 'inventories/apps', names=['cluster_name', 'cluster_id']) }}"
"""

RETURN = r"""
_raw:
  description: Per inventory, a dict with C(inventory) (the path), C(host) (the host read) and C(vars) (name to value).
  type: list
  elements: dict
"""

import os

from ansible.errors import AnsibleLookupError
from ansible.inventory.manager import InventoryManager
from ansible.plugins.lookup import LookupBase
from ansible.template import Templar
from ansible.vars.manager import VariableManager


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        names = self.get_option('names')
        group = self.get_option('group')
        results = []
        for term in self._flatten(terms):
            path = os.path.abspath(os.path.expanduser(str(term)))
            if not os.path.exists(path):
                raise AnsibleLookupError('inventory_vars: inventory %s does not exist' % term)
            results.append(self._read(path, str(term), names, group))
        return results

    def _read(self, path, label, names, group):
        inventory = InventoryManager(loader=self._loader, sources=[path])
        hosts = sorted(host.name for host in inventory.get_hosts(group)) if group in inventory.groups else []
        if not hosts:
            raise AnsibleLookupError('inventory_vars: inventory %s has no host in group %s' % (label, group))
        manager = VariableManager(loader=self._loader, inventory=inventory)
        host_vars = manager.get_vars(host=inventory.get_host(hosts[0]), include_hostvars=False)
        templar = Templar(loader=self._loader, variables=host_vars)
        values = {}
        for name in names:
            if name not in host_vars:
                continue
            try:
                values[name] = templar.template(host_vars[name])
            except Exception as exc:  # pylint: disable=broad-except
                raise AnsibleLookupError('inventory_vars: %s of inventory %s (host %s) cannot be templated: %s'
                                         % (name, label, hosts[0], exc))
        return {'inventory': label, 'host': hosts[0], 'vars': values}
