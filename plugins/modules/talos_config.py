#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: talos_config
short_description: Render a Talos node's machine config and the cluster's talosconfig
version_added: 0.1.0
description:
  - Renders what C(talosctl gen config) would, without talosctl, from the secrets bundle kept by
    P(proxtalos.cluster.talos_secrets#module), the cluster values, the node's values and the cluster, group and
    host patches, then checks the result against Talos' own rules (a missing install disk, a worker with CA keys,
    a VIP on a worker... fail naming the config path).
  - O(dest) - one node's machine config (multi-document YAML), written mode V(0600) when its content changes.
    The same inputs always give the same bytes, so a re-run is unchanged. In diff mode the diff shows what changed
    in this node's config since the last render, with every secret value replaced by a placeholder and a short
    hash (a changed secret still shows as a changed line).
  - O(talosconfig_dest) - a talosconfig usable by talosctl (C(talosctl --talosconfig <file>)) with one context
    named after the cluster, the control planes as endpoints, and an os:admin client certificate from the
    bundle's OS CA. The certificate of an existing file is kept while the OS CA signed it and it has more than
    O(talosconfig_renew_days) left, so a re-run is unchanged.
  - Run the talosconfig part once (C(run_once)) and the machine config part once per host.
  - Keys Talos does not know (for example from a patch) are not caught here; the node refuses them when the config
    is applied (see P(proxtalos.cluster.talos_apply#module), whose dry run fails naming the key).
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
attributes:
  check_mode:
    support: full
    details:
      - Renders and compares, writes nothing. In check mode a talosconfig that does not exist yet would get a new
        certificate, which is not made.
      - When the secrets bundle does not exist yet (a first run in check mode), every file is predicted as written,
        with a warning, and there is no diff.
  diff_mode:
    support: full
    details:
      - Secrets (keys, tokens, encryption secrets, inline manifest contents) are hidden in the diff.
options:
  secrets_path:
    description:
      - The secrets bundle file (as P(proxtalos.cluster.talos_secrets#module) keeps it; may be vault-encrypted).
    type: path
    required: true
  vault_password:
    description:
      - Ansible Vault password of an encrypted O(secrets_path).
    type: str
  vault_password_file:
    description:
      - File holding the vault password of an encrypted O(secrets_path), or a script that prints it.
      - Mutually exclusive with O(vault_password).
    type: path
  cluster:
    description:
      - The cluster values. Keys (see the collection's docs/talos-config.md) - V(name) and V(endpoint) (required),
        V(pod_subnets), V(service_subnets), V(dns_domain), V(cert_sans), V(cni), V(cni_urls), V(proxy_disabled),
        V(allow_scheduling_on_control_planes), V(inline_manifests), V(extra_manifests), V(vip), V(network_link),
        V(installer_image), V(installer_schematic), V(install_wipe), V(kubeprism_port),
        V(forward_kube_dns_to_host), V(discovery).
      - An unknown key fails naming it, for example V(cluster.pod_subnet).
    type: dict
    required: true
  talos_version:
    description:
      - The Talos release the config is for (its minor version is the config contract; v1.12 and v1.13 are
        supported).
    type: str
    default: v1.13.9
  kubernetes_version:
    description:
      - Kubernetes version of the control-plane images and kubelet; the release's default when not set.
    type: str
  machine_type:
    description:
      - V(controlplane) or V(worker). Required with O(dest).
    type: str
    choices: [controlplane, worker]
  node:
    description:
      - This node's values - V(hostname), V(install_disk) (default V(/dev/sda)), V(ip) with V(prefix) and optional
        V(gateway) for a static address, V(link) (the network link, default the cluster's V(network_link)).
    type: dict
    default: {}
  patches:
    description:
      - Config patches in three levels, applied in order - V(cluster), V(group) (per machine type) and V(host),
        each a list of patches. A patch is a strategic-merge mapping, a list of RFC 6902 operations, or YAML text
        of either.
      - Errors name the patch, for example V(patches.host[0]), and the path.
    type: dict
    default: {}
  requires_install:
    description:
      - The node still has to install Talos to its disk (a metal or VM node booted from the ISO), so an install
        disk is required in the config.
    type: bool
    default: true
  dest:
    description:
      - Where to write the node's machine config.
    type: path
  talosconfig_dest:
    description:
      - Where to write the talosconfig.
    type: path
  talosconfig_endpoints:
    description:
      - The apid endpoints of the talosconfig context (the control planes' addresses).
    type: list
    elements: str
    default: []
  talosconfig_nodes:
    description:
      - Default target nodes of the talosconfig context.
    type: list
    elements: str
    default: []
  talosconfig_context:
    description:
      - Name of the talosconfig context; the cluster name when not set.
    type: str
  talosconfig_renew_days:
    description:
      - Issue a new client certificate when the kept one has fewer days left (it is valid for a year).
    type: int
    default: 30
notes:
  - At least one of O(dest) and O(talosconfig_dest) is required.
seealso:
  - module: proxtalos.cluster.talos_secrets
  - module: proxtalos.cluster.talos_apply
"""

EXAMPLES = r"""
- name: Write the talosconfig once
  proxtalos.cluster.talos_config:
    secrets_path: "{{ inventory_dir }}/secrets/talos-secrets.yaml"
    cluster:
      name: "{{ cluster_name }}"
      endpoint: "{{ cluster_endpoint }}"
    talosconfig_dest: "artifacts/{{ cluster_name }}/talosconfig"
    talosconfig_endpoints: "{{ groups['controlplane'] | map('extract', hostvars, 'node_ip') | list }}"
  run_once: true

- name: Render each node's machine config
  proxtalos.cluster.talos_config:
    secrets_path: "{{ inventory_dir }}/secrets/talos-secrets.yaml"
    cluster:
      name: "{{ cluster_name }}"
      endpoint: "{{ cluster_endpoint }}"
    machine_type: "{{ 'controlplane' if inventory_hostname in groups['controlplane'] else 'worker' }}"
    node:
      hostname: "{{ inventory_hostname }}"
      ip: "{{ node_ip | default(omit) }}"
      prefix: "{{ node_prefix | default(omit) }}"
    patches:
      host: "{{ talos_host_patches | default([]) }}"
    dest: "artifacts/{{ cluster_name }}/{{ inventory_hostname }}.yaml"
"""

RETURN = r"""
dest:
  description: The machine config file (when O(dest) is set).
  returned: always
  type: str
config_sha256:
  description: SHA-256 (hex) of the rendered machine config; empty without O(dest).
  returned: always
  type: str
config_changed:
  description: Whether the machine config file was (or would be) written.
  returned: always
  type: bool
talosconfig_dest:
  description: The talosconfig file (when O(talosconfig_dest) is set).
  returned: always
  type: str
talosconfig_changed:
  description: Whether the talosconfig was (or would be) written.
  returned: always
  type: bool
client_certificate_reused:
  description: Whether the talosconfig kept its client certificate (false when a new one was or would be issued).
  returned: always
  type: bool
contract:
  description: The config contract rendered for (the Talos minor version).
  returned: always
  type: str
  sample: '1.13'
"""

import datetime
import hashlib
import os
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _secrets
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import config as talos_config
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import files, pki, redact, talosyaml
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import secrets as talos_secrets
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import talosconfig as talos_talosconfig


def argument_spec():
    return dict(
        secrets_path=dict(type='path', required=True),
        vault_password=dict(type='str', no_log=True),
        vault_password_file=dict(type='path', no_log=False),
        cluster=dict(type='dict', required=True),
        talos_version=dict(type='str', default=talos_config.DEFAULT_TALOS_VERSION),
        kubernetes_version=dict(type='str'),
        machine_type=dict(type='str', choices=list(talos_config.MACHINE_TYPES)),
        node=dict(type='dict', default={}),
        patches=dict(type='dict', default={}),
        requires_install=dict(type='bool', default=True),
        dest=dict(type='path'),
        talosconfig_dest=dict(type='path'),
        talosconfig_endpoints=dict(type='list', elements='str', default=[]),
        talosconfig_nodes=dict(type='list', elements='str', default=[]),
        talosconfig_context=dict(type='str'),
        talosconfig_renew_days=dict(type='int', default=30),
    )


def read_bundle(params, password):
    data, dummy = files.read_maybe_vaulted(params['secrets_path'], password, 'secrets_path')
    try:
        return talos_secrets.parse_bundle(data.decode('utf-8'), 'secrets_path')
    except UnicodeDecodeError:
        raise ValidationError('secrets_path', 'is not UTF-8 text (not a secrets bundle)')


def _existing_text(path):
    """The file's text, or None when it does not exist (or is not text)."""
    if not os.path.exists(path):
        return None
    try:
        return files.read_bytes(path).decode('utf-8')
    except UnicodeDecodeError:
        return None


def render_node(params, bundle):
    """The node's machine config text (rendered, patched, checked)."""
    patches = params['patches'] or {}
    return talos_config.render_machine_config(
        bundle, params['machine_type'], params['cluster'], node=params['node'] or {}, patches=patches,
        talos_version=params['talos_version'], kubernetes_version=params['kubernetes_version'],
        requires_install=params['requires_install'])


def render_talosconfig(params, bundle, existing, now=None):
    """(text, reused, key_pem) of the talosconfig; the client certificate is kept while it is good."""
    if params['talosconfig_renew_days'] < 0:
        raise ValidationError('talosconfig_renew_days', 'must be zero or more days')
    cluster = talos_config.normalize_cluster(params['cluster'])
    context = params['talosconfig_context'] or cluster['name']
    crt, key, reused = talos_talosconfig.admin_credentials(
        bundle, existing, now=now, renew_before=datetime.timedelta(days=params['talosconfig_renew_days']))
    ca_crt, dummy = bundle.ca('os')
    text = talos_talosconfig.render_talosconfig(context, params['talosconfig_endpoints'], ca_crt, crt, key,
                                                nodes=params['talosconfig_nodes'] or None)
    return text, reused, key


def plan(params, bundle):
    """Render and compare. Returns {'writes': [(path, text)], 'diffs', 'secrets', 'config_changed',
    'talosconfig_changed', 'reused', 'config_sha256'}; a file whose mode is not 0600 is rewritten."""
    decision = {'writes': [], 'config_changed': False, 'talosconfig_changed': False, 'reused': False, 'diffs': [],
                'secrets': [], 'config_sha256': ''}
    if params['dest']:
        if not params['machine_type']:
            raise ValidationError('machine_type', 'is required with dest (controlplane or worker)')
        text = render_node(params, bundle)
        before = _existing_text(params['dest'])
        decision['secrets'].extend(redact.config_secret_values(talos_config.parse_machine_config(text)))
        decision['config_sha256'] = hashlib.sha256(text.encode('utf-8')).hexdigest()
        mode_wrong = before is not None and files.file_mode(params['dest']) != files.FILE_MODE
        if before != text or mode_wrong:
            decision['config_changed'] = True
            decision['writes'].append((params['dest'], text))
            decision['diffs'].append({'before': redact.config_text(before), 'after': redact.config_text(text),
                                      'before_header': '%s (last render)' % params['dest'] if before is not None else '(none)',
                                      'after_header': '%s (this render)' % params['dest']})
    if params['talosconfig_dest']:
        before = _existing_text(params['talosconfig_dest'])
        text, reused, key = render_talosconfig(params, bundle, before)
        decision['secrets'].extend([key.decode('ascii'), pki.b64encode_pem(key)])
        decision['reused'] = reused
        mode_wrong = before is not None and files.file_mode(params['talosconfig_dest']) != files.FILE_MODE
        if before != text or mode_wrong:
            decision['talosconfig_changed'] = True
            decision['writes'].append((params['talosconfig_dest'], text))
            decision['diffs'].append({'before': redact.talosconfig_text(before), 'after': redact.talosconfig_text(text),
                                      'before_header': params['talosconfig_dest'] if before is not None else '(none)',
                                      'after_header': params['talosconfig_dest']})
    return decision


def merge_diffs(diffs):
    """One Ansible diff dict (several files are joined under their headers)."""
    if not diffs:
        return {'before': '', 'after': ''}
    if len(diffs) == 1:
        return diffs[0]
    before = ''.join('# %s\n%s' % (diff['before_header'], diff['before']) for diff in diffs)
    after = ''.join('# %s\n%s' % (diff['after_header'], diff['after']) for diff in diffs)
    return {'before': before, 'after': after}


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True,
                           mutually_exclusive=[('vault_password', 'vault_password_file')],
                           required_one_of=[('dest', 'talosconfig_dest')])
    if not pki.HAS_CRYPTOGRAPHY:
        module.fail_json(msg=missing_required_lib('cryptography'), exception=str(pki.CRYPTOGRAPHY_IMPORT_ERROR))
    if not talosyaml.HAS_YAML:
        module.fail_json(msg=missing_required_lib('PyYAML'), exception=str(talosyaml.YAML_IMPORT_ERROR))
    params = module.params
    try:
        password = files.vault_password(params, module.run_command)
        _secrets.register(module, password)
        if module.check_mode and not os.path.exists(params['secrets_path']):
            # First run in check mode: the secrets task only predicted the bundle. Everything would be written.
            module.warn('%s does not exist yet (check mode): the files would be rendered from the bundle the secrets task '
                        'writes' % params['secrets_path'])
            decision = dict(writes=[(path, None) for path in (params['dest'], params['talosconfig_dest']) if path],
                            config_changed=bool(params['dest']), talosconfig_changed=bool(params['talosconfig_dest']),
                            reused=False, diffs=[], secrets=[], config_sha256='')
        else:
            bundle = read_bundle(params, password)
            _secrets.register(module, *bundle.secret_values())
            decision = plan(params, bundle)
        _secrets.register(module, *decision['secrets'])
        changed = bool(decision['writes'])
        if changed and not module.check_mode:
            for path, text in decision['writes']:
                files.write_private(path, text)
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **exc.details)
    except (IOError, OSError) as exc:
        module.fail_json(msg='cannot read or write a Talos config file: %s' % exc, exception=traceback.format_exc())

    result = dict(
        changed=changed,
        dest=params['dest'] or '',
        config_sha256=decision['config_sha256'],
        config_changed=decision['config_changed'],
        talosconfig_dest=params['talosconfig_dest'] or '',
        talosconfig_changed=decision['talosconfig_changed'],
        client_certificate_reused=decision['reused'],
        contract=talos_config.contract_of(params['talos_version']),
    )
    if module._diff:
        result['diff'] = merge_diffs(decision['diffs'])
    module.exit_json(**result)


if __name__ == '__main__':
    main()
