#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: talos_etcd_backup
short_description: Save an etcd snapshot of a Talos cluster on the controller, keeping the newest few
version_added: 0.1.0
description:
  - Takes the snapshot from the first control plane of O(nodes) whose etcd service is Running and healthy
    (C(MachineService/EtcdSnapshot), like C(talosctl etcd snapshot)), and writes it under O(dest) as
    C(<prefix>-<UTC time>.snapshot), for example C(etcd-20261127T163000Z.snapshot).
  - The file is written next to its final name with mode 0600 and renamed into place once complete, so a
    half-written snapshot never carries a snapshot's name. O(dest) is created with mode 0700 when missing.
  - With O(artifacts_vault_password), the file is an Ansible Vault envelope of the snapshot (C(ansible-vault decrypt)
    gives the snapshot back), since a snapshot holds every Kubernetes Secret of the cluster, the sealed-secrets
    private key and the Flux Git credentials among them.
  - Then keeps the O(retention) newest snapshots of that prefix (by the time in their names) and deletes the older
    ones. Other files in O(dest) are never touched.
  - Fails naming every control plane tried and what each answered when none has a healthy etcd.
attributes:
  check_mode:
    support: full
    details:
      - Finds the control plane it would use and reports the file it would write and the snapshots retention would
        delete; writes and deletes nothing.
  diff_mode:
    support: none
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
  - proxtalos.cluster._talos_auth
  - proxtalos.cluster._wait
options:
  nodes:
    description:
      - Addresses of the control planes, tried in order.
    type: list
    elements: str
    required: true
  dest:
    description:
      - Folder on the controller for the snapshots.
    type: path
    required: true
  prefix:
    description:
      - Start of the file names (the cluster name is a good one). Letters, digits, C(.), C(_) and C(-).
    type: str
    default: etcd
  retention:
    description:
      - How many snapshots of this prefix to keep, the new one included. At least 1.
    type: int
    default: 7
  artifacts_vault_password:
    description:
      - When given, the snapshot is written as an Ansible Vault envelope encrypted with this password. The playbook
        C(proxtalos.cluster.etcd_backup) passes the run's vault password unless C(proxtalos_artifacts_in_clear) is true,
        as the roles do for every other file that holds a private key.
    type: str
notes:
  - Always reports C(changed) (each run takes a new snapshot).
  - Restoring is a separate, manual procedure (the collection's docs/operations/etcd_backup.md).
"""

EXAMPLES = r"""
- name: Snapshot etcd into artifacts/<cluster>/etcd-backups, keeping 7
  proxtalos.cluster.talos_etcd_backup:
    nodes: "{{ groups['controlplane'] | map('extract', hostvars, 'node_ip') | list }}"
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
    dest: "artifacts/{{ cluster_name }}/etcd-backups"
    prefix: "{{ cluster_name }}"
    retention: 7
"""

RETURN = r"""
path:
  description: The snapshot file written (in check mode, the one that would be).
  returned: always
  type: str
node:
  description: The control plane the snapshot came from (address:port).
  returned: always
  type: str
size:
  description: Bytes of the snapshot (the file is larger when encrypted); 0 in check mode.
  returned: always
  type: int
sha256:
  description: SHA-256 of the snapshot (before encryption, when encrypted); empty in check mode.
  returned: always
  type: str
encrypted:
  description: Whether the file is a vault envelope (O(artifacts_vault_password) given).
  returned: always
  type: bool
removed:
  description: Older snapshots deleted by retention (in check mode, those that would be).
  returned: always
  type: list
  elements: str
tried:
  description: Each control plane asked before one answered, with what it answered.
  returned: always
  type: list
  elements: str
"""

import datetime
import os
import re

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _vault
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import session

PREFIX_PATTERN = re.compile(r'^[A-Za-z0-9._-]+$')
STAMP_FORMAT = '%Y%m%dT%H%M%SZ'


def argument_spec():
    return _argspec.spec(
        _argspec.TALOS_AUTH_SPEC, _argspec.WAIT_SPEC,
        nodes=dict(type='list', elements='str', required=True),
        dest=dict(type='path', required=True),
        prefix=dict(type='str', default='etcd'),
        retention=dict(type='int', default=7),
        artifacts_vault_password=dict(type='str', no_log=True),
    )


def snapshot_name(prefix, now):
    return '%s-%s.snapshot' % (prefix, now.strftime(STAMP_FORMAT))


def existing_snapshots(dest, prefix):
    """Snapshot file names of this prefix in dest, oldest first (the UTC stamp in the name sorts by time)."""
    pattern = re.compile(r'^%s-\d{8}T\d{6}Z\.snapshot$' % re.escape(prefix))
    if not os.path.isdir(dest):
        return []
    return sorted(name for name in os.listdir(dest) if pattern.match(name) and os.path.isfile(os.path.join(dest, name)))


def to_remove(names, retention):
    """The oldest names beyond the newest `retention`."""
    return names[:-retention] if len(names) > retention else []


def healthy_etcd_problem(node_session):
    """None when the node's etcd service is Running and healthy, else what was seen."""
    services = dict((item['id'], item) for item in node_session.call('service_list'))
    etcd = services.get('etcd')
    if etcd is None:
        return 'no etcd service (not a control plane?)'
    if not etcd['healthy']:
        return 'etcd %s%s' % (etcd['state'], (': ' + etcd['health']['last_message']) if etcd['health']['last_message'] else '')
    return None


def pick_node(params, credentials):
    """(NodeSession, tried) of the first control plane with a healthy etcd."""
    tried = []
    for address in params['nodes']:
        node_session = session.NodeSession.from_params(params, credentials, host=address, field='nodes')
        node_session.require_credentials('gives its etcd snapshot only over mutual TLS')
        try:
            problem = healthy_etcd_problem(node_session)
        except (talos_errors.TalosTransientError, talos_errors.TalosApiError, talos_errors.TalosTlsError) as exc:
            problem = str(exc)
        if problem is None:
            return node_session, tried
        tried.append('%s: %s' % (node_session.name, problem))
    raise ProxtalosError('no control plane with a healthy etcd to take the snapshot from: %s' % '; '.join(tried),
                         tried=tried)


def write_snapshot(node_session, dest, name, password=None):
    """Stream the snapshot into dest/.name.partial (0600), vault-encrypt it there when a password is given, then
    rename it to dest/name; {size, sha256} of the snapshot. dest is made (or kept) 0700."""
    if not os.path.isdir(dest):
        os.makedirs(dest, mode=0o700)
    os.chmod(dest, 0o700)
    final = os.path.join(dest, name)
    partial = os.path.join(dest, '.%s.partial' % name)
    if os.path.exists(partial):
        os.unlink(partial)   # left by an earlier run that was interrupted
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, 'wb') as handle:
            written = node_session.call('etcd_snapshot', handle)
            handle.flush()
            os.fsync(handle.fileno())
        if password is not None:
            with open(partial, 'rb') as handle:
                envelope = _vault.encrypt(handle.read(), password)
            with open(partial, 'wb') as handle:
                handle.write(envelope)
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(partial, 0o600)
        os.replace(partial, final)
    except BaseException:
        if os.path.exists(partial):
            os.unlink(partial)
        raise
    return written


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True,
        mutually_exclusive=_argspec.TALOS_AUTH_CONSTRAINTS['mutually_exclusive'],
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    missing = session.missing_libraries()
    if missing:
        module.fail_json(msg=missing_required_lib(missing[0][0]), exception=missing[0][1])
    params = module.params
    result = dict(changed=True, path='', node='', size=0, sha256='', removed=[], tried=[],
                  encrypted=params['artifacts_vault_password'] is not None)
    try:
        if not params['nodes']:
            raise ValidationError('nodes', 'needs at least one control plane address')
        if not PREFIX_PATTERN.match(params['prefix'] or ''):
            raise ValidationError('prefix', 'may hold letters, digits, ".", "_" and "-" only, got %r' % (params['prefix'],))
        if params['retention'] < 1:
            raise ValidationError('retention', 'must keep at least 1 snapshot, got %d' % params['retention'])
        dest = os.path.abspath(params['dest'])
        credentials = session.load_credentials(params, module)
        node_session, tried = pick_node(params, credentials)
        result.update(node=node_session.name, tried=tried)
        name = snapshot_name(params['prefix'], datetime.datetime.now(datetime.timezone.utc))
        result['path'] = os.path.join(dest, name)
        names = existing_snapshots(dest, params['prefix'])
        if module.check_mode:
            result['removed'] = [os.path.join(dest, old) for old in to_remove(sorted(set(names + [name])), params['retention'])]
            module.exit_json(**result)
        if name in names:
            raise ProxtalosError('%s exists already (a snapshot taken in the same second); not overwriting it' % result['path'])
        written = write_snapshot(node_session, dest, name, params['artifacts_vault_password'])
        result.update(size=written['size'], sha256=written['sha256'])
        for old in to_remove(existing_snapshots(dest, params['prefix']), params['retention']):
            os.unlink(os.path.join(dest, old))
            result['removed'].append(os.path.join(dest, old))
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **dict(exc.details, changed=bool(result['size'])))
    except (IOError, OSError) as exc:
        module.fail_json(msg='cannot write the snapshot under %s: %s' % (params['dest'], exc.strerror or exc),
                         changed=bool(result['size']))
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
