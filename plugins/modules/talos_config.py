#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: talos_config
short_description: Render every node's Talos machine config in one run, and the cluster's talosconfig
version_added: 0.1.0
description:
  - Renders what C(talosctl gen config) would, without talosctl, from the secrets bundle kept by
    P(proxtalos.cluster.talos_secrets#module), the cluster values, the node's values and the cluster, group and
    host patches, then checks the result against Talos' own rules (a missing install disk, a worker with CA keys,
    a VIP on a worker... fail naming the config path).
  - O(nodes) - every node's machine config (multi-document YAML) in one run (a C(run_once) task; one node is a
    one-element list), each item carrying the node's machine type, values, patches and file (V(machine_type),
    V(node), V(patches), V(dest)), and its own cluster values when they differ from another node's. The bundle is
    read, decrypted and its keys parsed once for all of them. Each node's file is written mode V(0600) when its
    content changes; the same inputs always give the same bytes, so a re-run is unchanged. C(changed) is true when
    any node's file (or the talosconfig) was or would be written, and RV(nodes) holds each node's result under its
    name. When any node fails (a patch that does not apply, a config that breaks Talos' rules), the error names the
    node and the field, and no file is written. In diff mode the diff shows what changed in each node's config
    since the last render, with every secret value replaced by a placeholder and a short hash (a changed secret
    still shows as a changed line).
  - O(talosconfig_dest) - a talosconfig usable by talosctl (C(talosctl --talosconfig <file>)) with one context
    named after the cluster, the control planes as endpoints, and an os:admin client certificate from the
    bundle's OS CA. The certificate of an existing file is kept while the OS CA signed it and it has more than
    O(talosconfig_renew_days) left, so a re-run is unchanged.
  - Without O(nodes), only the talosconfig is written (O(talosconfig_dest)).
  - A per-node option at the top level (C(machine_type), C(node), C(patches) or C(dest) beside O(nodes)) fails as an
    unsupported parameter; each node's values go in its item of O(nodes).
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
      - The diff is a list with one entry per node whose file changes (its headers name the node and the file), and
        one for the talosconfig.
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
  artifacts_vault_password:
    description:
      - When given, every file the module writes (the machine configs of O(nodes), whose control-plane
        configs hold the cluster's CA keys, and the talosconfig with its client key) is an Ansible Vault envelope
        encrypted with this password, the one C(ansible-vault view) and C(ansible-vault decrypt) open. An existing
        file is read through the vault to compare what it holds, so an unchanged render is not rewritten.
      - Without it the files are written in clear (0600); an encrypted one is then rewritten in clear.
      - The roles of this collection pass the run's prompted vault password here unless C(proxtalos_artifacts_in_clear)
        is true (the collection's docs/stages/secrets.md).
    type: str
  cluster:
    description:
      - The cluster values. Keys (see the collection's docs/talos-config.md) - V(name) and V(endpoint) (required),
        V(pod_subnets), V(service_subnets), V(dns_domain), V(cert_sans), V(cni), V(cni_urls), V(proxy_disabled),
        V(allow_scheduling_on_control_planes), V(inline_manifests), V(extra_manifests), V(vip), V(network_link),
        V(installer_image), V(installer_schematic), V(install_wipe), V(kubeprism_port),
        V(forward_kube_dns_to_host), V(discovery).
      - An unknown key fails naming it, for example V(cluster.pod_subnet).
      - The talosconfig's (its context name) and the values of every node whose item does not set its own
        V(cluster).
    type: dict
    required: true
  talos_version:
    description:
      - The Talos release the configs are for (its minor version is the config contract; v1.12 and v1.13 are
        supported), of every node whose item does not set its own.
    type: str
    default: v1.13.9
  kubernetes_version:
    description:
      - Kubernetes version of the control-plane images and kubelet, of every node whose item does not set its own;
        the release's default when not set.
    type: str
  requires_install:
    description:
      - The node still has to install Talos to its disk (a metal or VM node booted from the ISO), so an install
        disk is required in the config.
      - The value of every node whose item does not set its own.
    type: bool
    default: true
  nodes:
    description:
      - Every node's machine config, rendered and written in this one run from one reading of the bundle. One node
        is a one-element list. Each item is a mapping with the keys below; a missing or wrong key fails naming the
        node and the key, for example V(nodes[lab-w-1].machine_type), and an empty list fails naming O(nodes).
      - V(name) (required) - the node's name in results and errors (the inventory host name); names are unique.
      - V(machine_type) (required) - V(controlplane) or V(worker).
      - V(dest) (required) - where to write the node's machine config; no two items share one, nor one with
        O(talosconfig_dest).
      - V(node) - the node's values - V(hostname), V(install_disk) (default V(/dev/sda)), V(ip) with V(prefix) and
        optional V(gateway) for a static address, V(link) (the network link, default the cluster's
        V(network_link)). None given means no values (the defaults).
      - V(patches) - config patches in three levels, applied in order - V(cluster), V(group) (per machine type) and
        V(host), each a list of patches. A patch is a strategic-merge mapping, a list of RFC 6902 operations, or
        YAML text of either. None given means no patches. Errors name the node, the patch and the path, for
        example V(nodes[lab-w-1].patches.host[0]).
      - V(talos_version), V(kubernetes_version), V(requires_install) - this node's, instead of O(talos_version),
        O(kubernetes_version) and O(requires_install).
      - V(cluster) - this node's cluster values, as O(cluster), instead of O(cluster) (for example a host's own
        V(network_link) or a group's V(installer_schematic)); its V(name) and V(endpoint) must be those of
        O(cluster). Errors name the node, for example V(nodes[lab-w-1].cluster.network_link). Each distinct value
        is checked once, however many nodes share it; the bundle is read once either way.
    type: list
    elements: dict
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
  check_key_consistency:
    description:
      - Check the RSA numbers of the bundle's service account key (its primes and CRT values; a quarter of a second
        for its 4096 bits). The PEM blocks, key types and certificate pairs are checked either way.
      - V(false) only when P(proxtalos.cluster.talos_secrets#module) checked the same file earlier in the same run,
        as the talos_machines role does when its secrets task ran; a key with broken numbers would otherwise reach
        every control plane's config.
    type: bool
    default: true
notes:
  - At least one of O(nodes) and O(talosconfig_dest) is required.
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

- name: Render every node's machine config and the talosconfig in one run
  proxtalos.cluster.talos_config:
    secrets_path: "{{ inventory_dir }}/secrets/talos-secrets.yaml"
    cluster:
      name: "{{ cluster_name }}"
      endpoint: "{{ cluster_endpoint }}"
    nodes:
      - name: cp-1
        machine_type: controlplane
        node: {hostname: cp-1, ip: 10.5.0.11, prefix: 24}
        dest: "artifacts/{{ cluster_name }}/cp-1.yaml"
      - name: w-1
        machine_type: worker
        node: {hostname: w-1}
        patches:
          host: [{machine: {nodeLabels: {zone: b}}}]
        dest: "artifacts/{{ cluster_name }}/w-1.yaml"
    talosconfig_dest: "artifacts/{{ cluster_name }}/talosconfig"
    talosconfig_endpoints: [10.5.0.11]
  run_once: true
  register: rendered

- name: Each host reads its own node's result
  ansible.builtin.debug:
    msg: "{{ rendered.nodes[inventory_hostname].config_sha256 }}"
"""

RETURN = r"""
config_changed:
  description: Whether any node's machine config file was (or would be) written.
  returned: always
  type: bool
nodes:
  description:
    - Each node's result under its name - C(dest) (its machine config file), C(config_sha256) (SHA-256, hex, of
      its rendered config; empty in check mode before the secrets bundle exists), C(config_changed) (whether its
      file was or would be written) and C(contract) (the config contract it was rendered for). Empty without
      O(nodes).
    - A C(run_once) task's registered result is set on every host, so a host reads its own part as
      C(result.nodes[inventory_hostname]).
  returned: always
  type: dict
  sample:
    lab-w-1:
      dest: artifacts/lab/lab-w-1.yaml
      config_sha256: 4f0e...
      config_changed: false
      contract: '1.13'
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
import json
import os
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.common.validation import check_type_path

from ansible_collections.proxtalos.cluster.plugins.module_utils import _crypto, _secrets
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import config as talos_config
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import files, pki, redact, talosyaml
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import secrets as talos_secrets
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import talosconfig as talos_talosconfig

# The keys of a `nodes` item: what is rendered for one node, and where it is written.
NODE_ITEM_KEYS = ('name', 'machine_type', 'dest', 'node', 'patches', 'talos_version', 'kubernetes_version',
                  'requires_install', 'cluster')


def argument_spec():
    return dict(
        secrets_path=dict(type='path', required=True),
        vault_password=dict(type='str', no_log=True),
        vault_password_file=dict(type='path', no_log=False),
        artifacts_vault_password=dict(type='str', no_log=True),
        cluster=dict(type='dict', required=True),
        talos_version=dict(type='str', default=talos_config.DEFAULT_TALOS_VERSION),
        kubernetes_version=dict(type='str'),
        requires_install=dict(type='bool', default=True),
        nodes=dict(type='list', elements='dict'),
        talosconfig_dest=dict(type='path'),
        talosconfig_endpoints=dict(type='list', elements='str', default=[]),
        talosconfig_nodes=dict(type='list', elements='str', default=[]),
        talosconfig_context=dict(type='str'),
        talosconfig_renew_days=dict(type='int', default=30),
        check_key_consistency=dict(type='bool', default=True),
    )


def read_bundle(params, password):
    data, dummy = files.read_maybe_vaulted(params['secrets_path'], password, 'secrets_path')
    try:
        return talos_secrets.parse_bundle(data.decode('utf-8'), 'secrets_path', check_key_consistency=params['check_key_consistency'])
    except UnicodeDecodeError:
        raise ValidationError('secrets_path', 'is not UTF-8 text (not a secrets bundle)')


CLEAR = files.Artifacts()


def _item_string(item, key, where, required=False):
    value = item.get(key)
    if value is None or value == '':
        if required:
            raise ValidationError('%s.%s' % (where, key), 'is required')
        return None
    if not isinstance(value, str):
        raise ValidationError('%s.%s' % (where, key), 'must be a string, got %s' % type(value).__name__)
    return value


def _item_mapping(item, key, where):
    value = item.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError('%s.%s' % (where, key), 'must be a mapping, got %s' % type(value).__name__)
    return value


def node_specs(params):
    """The validated items of the `nodes` option, each a dict with every key of NODE_ITEM_KEYS (defaults from the
    module's options). Errors name the item by its name (nodes[NAME].KEY) or, without one, by its index."""
    specs = []
    names = set()
    dests = {}
    talosconfig_dest = os.path.abspath(params['talosconfig_dest']) if params['talosconfig_dest'] else None
    for index, item in enumerate(params['nodes']):
        where = 'nodes[%d]' % index
        if not isinstance(item, dict):
            raise ValidationError(where, 'must be a mapping, got %s' % type(item).__name__)
        name = _item_string(item, 'name', where, required=True)
        where = 'nodes[%s]' % name
        if name in names:
            raise ValidationError(where + '.name', 'two items have this name; every node once')
        names.add(name)
        unknown = sorted(str(key) for key in item if key not in NODE_ITEM_KEYS)
        if unknown:
            raise ValidationError('%s.%s' % (where, unknown[0]), 'unknown key (expected %s)' % ', '.join(NODE_ITEM_KEYS))
        machine_type = _item_string(item, 'machine_type', where, required=True)
        if machine_type not in talos_config.MACHINE_TYPES:
            raise ValidationError(where + '.machine_type', 'must be controlplane or worker, got %r' % (machine_type,))
        dest = check_type_path(_item_string(item, 'dest', where, required=True))  # as a type=path option (~, $VAR)
        if os.path.abspath(dest) in dests:
            raise ValidationError(where + '.dest', 'is also the dest of nodes[%s]' % dests[os.path.abspath(dest)])
        if os.path.abspath(dest) == talosconfig_dest:
            raise ValidationError(where + '.dest', 'is also talosconfig_dest')
        dests[os.path.abspath(dest)] = name
        requires_install = item.get('requires_install')
        if requires_install is None:
            requires_install = params['requires_install']
        elif not isinstance(requires_install, bool):
            raise ValidationError(where + '.requires_install', 'must be true or false')
        cluster = item.get('cluster')
        if cluster is not None and not isinstance(cluster, dict):
            raise ValidationError(where + '.cluster', 'must be a mapping, got %s' % type(cluster).__name__)
        specs.append(dict(
            name=name, machine_type=machine_type, dest=dest, cluster=cluster,
            node=_item_mapping(item, 'node', where), patches=_item_mapping(item, 'patches', where),
            talos_version=_item_string(item, 'talos_version', where) or params['talos_version'],
            kubernetes_version=_item_string(item, 'kubernetes_version', where) or params['kubernetes_version'],
            requires_install=requires_install))
    if not specs:
        raise ValidationError('nodes', 'is empty: give at least one node')
    return specs


def render_node(spec, cluster, bundle):
    """The node's machine config text (rendered, patched, checked)."""
    return talos_config.render_machine_config(
        bundle, spec['machine_type'], cluster, node=spec['node'], patches=spec['patches'],
        talos_version=spec['talos_version'], kubernetes_version=spec['kubernetes_version'],
        requires_install=spec['requires_install'])


def plan_node(spec, cluster, bundle, artifacts=CLEAR):
    """Render one node and compare with its file: {'name', 'dest', 'text', 'write', 'config_sha256', 'contract',
    'secrets', 'diff'}; 'diff' is None when the file stays as it is."""
    text = render_node(spec, cluster, bundle)
    before, encrypted = artifacts.read(spec['dest'])
    write = artifacts.needs_write(spec['dest'], before, encrypted, text)
    label = '%s: %s' % (spec['name'], spec['dest'])
    diff = None
    if write:
        diff = {'before': redact.config_text(before), 'after': redact.config_text(text),
                'before_header': '%s (last render)' % label if before is not None else '(none)',
                'after_header': '%s (this render)' % label}
    return {'name': spec['name'], 'dest': spec['dest'], 'text': text, 'write': write, 'diff': diff,
            'config_sha256': hashlib.sha256(text.encode('utf-8')).hexdigest(),
            'contract': talos_config.contract_of(spec['talos_version']),
            'secrets': redact.config_secret_values(talos_config.parse_machine_config(text))}


def _in_node(spec, exc):
    """The error of one node, naming the node: nodes[NAME].FIELD (FIELD as the node's rendering named it)."""
    details = dict((key, value) for key, value in exc.details.items() if key != 'field')
    details.update(node=spec['name'], dest=spec['dest'])
    if isinstance(exc, ValidationError):
        return ValidationError('nodes[%s].%s' % (spec['name'], exc.field), exc.reason, **details)
    return ProxtalosError('nodes[%s] (%s): %s' % (spec['name'], spec['dest'], exc), **details)


def _cluster_key(cluster):
    return json.dumps(cluster, sort_keys=True, default=str)


def node_cluster(spec, cluster, checked):
    """The checked cluster values of one node: its own (spec['cluster']) or the module's (cluster, already
    checked). checked caches each distinct value's result (values or error), so each is checked once. A node's own
    values must keep the cluster's name and endpoint (the talosconfig and every node are of one cluster)."""
    if spec['cluster'] is None:
        return cluster
    key = _cluster_key(spec['cluster'])
    if key not in checked:
        try:
            own = talos_config.normalize_cluster(spec['cluster'])
            for field in ('name', 'endpoint'):
                if own[field] != cluster[field]:
                    raise ValidationError('cluster.' + field, 'is %r, the cluster option has %r: every node is of one '
                                          'cluster' % (own[field], cluster[field]))
            checked[key] = own
        except ValidationError as exc:
            checked[key] = exc
    if isinstance(checked[key], ValidationError):
        raise checked[key]
    return checked[key]


def plan_nodes(specs, cluster, bundle, artifacts=CLEAR):
    """plan_node of every spec, each with its own cluster values when its item has them (cluster: the module's,
    checked). When nodes fail, every node is still tried and the error raised names them all (the first one's field
    in `field`, each node's message in `failed_nodes`)."""
    planned = []
    failures = []
    checked = {}
    for spec in specs:
        try:
            planned.append(plan_node(spec, node_cluster(spec, cluster, checked), bundle, artifacts))
        except ProxtalosError as exc:
            failures.append(_in_node(spec, exc))
    if len(failures) == 1:
        raise failures[0]
    if failures:
        first = failures[0]
        message = '%d nodes cannot be rendered: %s' % (len(failures), '; '.join(str(exc) for exc in failures))
        details = dict(first.details, failed_nodes=dict((exc.details.get('node'), str(exc)) for exc in failures))
        raise ProxtalosError(message, **details)
    return planned


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


def plan(params, bundle, specs, artifacts=CLEAR):
    """Render and compare. Returns {'writes': [(path, text)], 'diffs', 'secrets', 'nodes' (plan_node of each spec),
    'talosconfig_changed', 'reused'}; a file whose mode is not 0600 is rewritten."""
    decision = {'writes': [], 'talosconfig_changed': False, 'reused': False, 'diffs': [], 'secrets': [], 'nodes': []}
    if specs:
        # Each distinct cluster value is checked once (the module's here, a node's own in plan_nodes).
        decision['nodes'] = plan_nodes(specs, talos_config.normalize_cluster(params['cluster']), bundle, artifacts)
        for planned in decision['nodes']:
            decision['secrets'].extend(planned['secrets'])
            if planned['write']:
                decision['writes'].append((planned['dest'], planned['text']))
                decision['diffs'].append(planned['diff'])
    if params['talosconfig_dest']:
        before, encrypted = artifacts.read(params['talosconfig_dest'])
        text, reused, key = render_talosconfig(params, bundle, before)
        decision['secrets'].extend([key.decode('ascii'), pki.b64encode_pem(key)])
        decision['reused'] = reused
        if artifacts.needs_write(params['talosconfig_dest'], before, encrypted, text):
            decision['talosconfig_changed'] = True
            decision['writes'].append((params['talosconfig_dest'], text))
            decision['diffs'].append({'before': redact.talosconfig_text(before), 'after': redact.talosconfig_text(text),
                                      'before_header': params['talosconfig_dest'] if before is not None else '(none)',
                                      'after_header': params['talosconfig_dest']})
    return decision


def predict_without_bundle(params, specs):
    """The decision of a check-mode run before the bundle exists: every file would be written."""
    nodes = [{'name': spec['name'], 'dest': spec['dest'], 'text': None, 'write': True, 'diff': None,
              'config_sha256': '', 'contract': talos_config.contract_of(spec['talos_version']), 'secrets': []}
             for spec in specs]
    writes = [(planned['dest'], None) for planned in nodes]
    if params['talosconfig_dest']:
        writes.append((params['talosconfig_dest'], None))
    return dict(writes=writes, nodes=nodes, talosconfig_changed=bool(params['talosconfig_dest']), reused=False,
                diffs=[], secrets=[])


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True,
        mutually_exclusive=[('vault_password', 'vault_password_file')],
        required_one_of=[('nodes', 'talosconfig_dest')],
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    if not _crypto.HAS_CRYPTOGRAPHY:
        module.fail_json(msg=missing_required_lib('cryptography'), exception=str(_crypto.CRYPTOGRAPHY_IMPORT_ERROR))
    if not talosyaml.HAS_YAML:
        module.fail_json(msg=missing_required_lib('PyYAML'), exception=str(talosyaml.YAML_IMPORT_ERROR))
    params = module.params
    try:
        contract = talos_config.contract_of(params['talos_version'])
        specs = node_specs(params) if params['nodes'] is not None else []
        # before anything is rendered: an error of any node must not leave a patch's secret in the output
        _secrets.register(module, *redact.patch_secret_values([spec['patches'] for spec in specs]))
        password = files.vault_password(params, module.run_command)
        _secrets.register(module, password)
        artifacts = files.Artifacts(params['artifacts_vault_password'], read_passwords=[password])
        if module.check_mode and not os.path.exists(params['secrets_path']):
            # First run in check mode: the secrets task only predicted the bundle. Everything would be written.
            module.warn('%s does not exist yet (check mode): the files would be rendered from the bundle the secrets task '
                        'writes' % params['secrets_path'])
            decision = predict_without_bundle(params, specs)
        else:
            bundle = read_bundle(params, password)
            _secrets.register(module, *bundle.secret_values())
            decision = plan(params, bundle, specs, artifacts)
        _secrets.register(module, *decision['secrets'])
        changed = bool(decision['writes'])
        if changed and not module.check_mode:
            for path, text in decision['writes']:
                files.write_private(path, artifacts.encode(text))
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **exc.details)
    except (IOError, OSError) as exc:
        module.fail_json(msg='cannot read or write a Talos config file: %s' % exc, exception=traceback.format_exc())

    result = dict(
        changed=changed,
        config_changed=any(planned['write'] for planned in decision['nodes']),
        nodes=dict((planned['name'], dict(dest=planned['dest'], config_sha256=planned['config_sha256'],
                                          config_changed=planned['write'], contract=planned['contract']))
                   for planned in decision['nodes']),
        talosconfig_dest=params['talosconfig_dest'] or '',
        talosconfig_changed=decision['talosconfig_changed'],
        client_certificate_reused=decision['reused'],
        contract=contract,
    )
    if module._diff:
        result['diff'] = decision['diffs']
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
