#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: talos_secrets
short_description: Keep a Talos cluster's secrets bundle (generate once, import, validate)
version_added: 0.1.0
description:
  - Keeps the secrets bundle of a Talos cluster in one file, in the layout of C(talosctl gen secrets)
    (cluster id and secret, bootstrap and trustd tokens, the encryption secret, the OS, Kubernetes, etcd
    and aggregator CAs and the service-account key).
  - When O(path) does not exist, generates a new bundle, or imports the one given with O(import_src) or
    O(import_content) (for example a file written by C(talosctl gen secrets)), and writes it before anything
    else can use it, mode V(0600).
  - When O(path) exists, the bundle is never regenerated or replaced. It is read and validated; a malformed
    bundle fails the task naming the field (for example V(certs.os.key)), and the file is left as it is.
  - With O(vault_password) or O(vault_password_file), the file is kept encrypted with Ansible Vault (the format
    C(ansible-vault view) and the P(ansible.builtin.file#lookup) lookup read). A plain bundle found then is
    encrypted in place; its content does not change.
  - Returns fingerprints of the CAs, never a secret.
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
attributes:
  check_mode:
    support: full
    details:
      - Predicts C(changed) and writes nothing; a bundle that would be generated is not generated, so the
        fingerprints are empty then.
  diff_mode:
    support: full
    details:
      - The diff shows the file state (present, encrypted, mode) and the CA fingerprints, never a secret.
options:
  path:
    description:
      - Where the bundle is kept, for example C({{ inventory_dir }}/secrets/talos-secrets.yaml).
    type: path
    required: true
  import_src:
    description:
      - A bundle file to import when O(path) does not exist yet (may be vault-encrypted with the same password).
      - When O(path) exists, the import must hold the same bundle, otherwise the task fails (an existing bundle
        is never replaced).
      - Mutually exclusive with O(import_content).
    type: path
  import_content:
    description:
      - The bundle to import, as YAML text or a dictionary in the layout of C(talosctl gen secrets).
      - Same rules as O(import_src).
    type: raw
  os_key_type:
    description:
      - Key type of the Talos API (OS) CA of a generated bundle. V(ed25519) is what talosctl makes; V(ecdsa)
        (P-256) is for clients that cannot do Ed25519.
    type: str
    choices: [ed25519, ecdsa]
    default: ed25519
  vault_password:
    description:
      - Ansible Vault password with which the bundle file is kept encrypted.
    type: str
  vault_password_file:
    description:
      - File holding the vault password, or an executable script that prints it, as for
        C(ansible-playbook --vault-password-file).
      - Mutually exclusive with O(vault_password).
    type: path
  vault_id:
    description:
      - Vault ID label written in the envelope (format 1.2) of an encrypted bundle.
    type: str
notes:
  - Losing the bundle means losing the cluster's CAs; keep a copy (for example in the vault of the inventory).
seealso:
  - module: proxtalos.cluster.talos_config
"""

EXAMPLES = r"""
- name: Keep the cluster secrets next to the inventory, vault-encrypted
  proxtalos.cluster.talos_secrets:
    path: "{{ inventory_dir }}/secrets/talos-secrets.yaml"
    vault_password_file: "{{ lookup('ansible.builtin.config', 'DEFAULT_VAULT_PASSWORD_FILE') }}"
  run_once: true

- name: Import the secrets of an existing cluster (talosctl gen secrets -o secrets.yaml)
  proxtalos.cluster.talos_secrets:
    path: "{{ inventory_dir }}/secrets/talos-secrets.yaml"
    import_src: /secure/secrets.yaml
  run_once: true
"""

RETURN = r"""
path:
  description: The bundle file.
  returned: always
  type: str
outcome:
  description: What was done (or would be done in check mode).
  returned: always
  type: str
  choices: [generated, imported, kept, encrypted]
  sample: kept
encrypted:
  description: Whether the file is (or would be) vault-encrypted.
  returned: always
  type: bool
mode_fixed:
  description: Whether the file mode was (or would be) changed to 0600.
  returned: always
  type: bool
os_ca_key_type:
  description: Key type of the Talos API CA (V(ed25519) or V(ecdsa)); empty when a bundle would be generated in check mode.
  returned: always
  type: str
  sample: ed25519
ca_sha256:
  description: SHA-256 fingerprints (lower-case hex, of the certificate DER) of the bundle's CAs, by bundle name.
  returned: always
  type: dict
  sample: {os: 3d2eba..., k8s: 77a1c0..., etcd: 9b01e2..., k8saggregator: 0c4f1d...}
"""

import base64
import hashlib
import os
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _crypto, _secrets
from ansible_collections.proxtalos.cluster.plugins.module_utils._diff import make_diff
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import files, talosyaml
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import secrets as talos_secrets


def argument_spec():
    return dict(
        path=dict(type='path', required=True),
        import_src=dict(type='path'),
        import_content=dict(type='raw', no_log=True),
        os_key_type=dict(type='str', choices=['ed25519', 'ecdsa'], default='ed25519'),
        vault_password=dict(type='str', no_log=True),
        vault_password_file=dict(type='path', no_log=False),
        vault_id=dict(type='str'),
    )


MUTUALLY_EXCLUSIVE = [('import_src', 'import_content'), ('vault_password', 'vault_password_file')]


def ca_fingerprints(bundle):
    """{name: sha256 hex of the CA certificate (DER)} for the bundle's four CAs."""
    out = {}
    for name in talos_secrets.CA_NAMES:
        blocks = _crypto.pem_blocks(bundle.certs[name]['crt'])
        der = base64.b64decode(''.join(blocks[0][1].split())) if blocks else b''
        out[name] = hashlib.sha256(der).hexdigest()
    return out


def _parse(text, field, prefix=True):
    """A SecretsBundle. YAML errors name `field`; content errors name the bundle field (after `field: `
    when prefix is set, so an import's problem is told apart from the kept bundle's)."""
    try:
        return talos_secrets.parse_bundle(text, field)
    except ValidationError as exc:
        if exc.field == field or not prefix:
            raise
        raise ValidationError('%s: %s' % (field, exc.field), exc.reason)


def _import_text(params, password):
    if params['import_src']:
        data, dummy = files.read_maybe_vaulted(params['import_src'], password, 'import_src')
        return data.decode('utf-8'), 'import_src'
    content = params['import_content']
    if content in (None, ''):
        return None, None
    if isinstance(content, dict):
        return talosyaml.dump(content), 'import_content'
    if not isinstance(content, str):
        raise ValidationError('import_content', 'must be YAML text or a mapping, got %s' % type(content).__name__)
    return content, 'import_content'


def plan(params, password):
    """Observe the file and decide: {'action', 'bundle', 'write', 'fix_mode', 'encrypted', 'was_encrypted'}."""
    path = params['path']
    import_text, import_field = _import_text(params, password)
    imported = _parse(import_text, import_field) if import_text is not None else None
    decision = {'write': False, 'fix_mode': False, 'encrypted': password is not None, 'was_encrypted': False,
                'existed': os.path.exists(path)}
    if decision['existed']:
        if os.path.isdir(path):
            raise ValidationError('path', '%s is a directory' % path)
        data, was_encrypted = files.read_maybe_vaulted(path, password, 'path')
        try:
            text = data.decode('utf-8')
        except UnicodeDecodeError:
            raise ValidationError('path', '%s is not UTF-8 text (not a secrets bundle); it is left as it is' % path)
        try:
            bundle = _parse(text, 'path', prefix=False)
        except ValidationError as exc:
            raise ValidationError(exc.field, '%s (in %s; an existing bundle is never replaced: fix or restore it)'
                                  % (exc.reason, path))
        if imported is not None and imported.to_yaml() != bundle.to_yaml():
            raise ValidationError(import_field, 'holds another bundle than the one kept at %s; an existing bundle is never '
                                                'replaced (remove the file first if you really mean to switch clusters)' % path)
        decision.update(action='kept', bundle=bundle, was_encrypted=was_encrypted, encrypted=was_encrypted or password is not None)
        if password is not None and not was_encrypted:
            decision.update(action='encrypted', write=True)
        decision['fix_mode'] = files.file_mode(path) != files.FILE_MODE
        return decision
    if imported is not None:
        decision.update(action='imported', bundle=imported, write=True)
    else:
        decision.update(action='generated', bundle=None, write=True)
    return decision


def act(params, decision, password):
    if decision['action'] == 'generated':
        decision['bundle'] = talos_secrets.generate_bundle(os_key_type=params['os_key_type'])
    if decision['write']:
        files.write_private(params['path'], files.encrypt_if(decision['bundle'].to_yaml(), password, params['vault_id']))
    elif decision['fix_mode']:
        os.chmod(params['path'], files.FILE_MODE)


def _state(decision, after):
    fingerprints = ca_fingerprints(decision['bundle']) if decision.get('bundle') is not None else {}
    if not after and not decision['existed']:
        return {}
    return {
        'path': 'present',
        'encrypted': decision['encrypted'] if after else decision['was_encrypted'],
        'mode': '0600' if after or not decision['fix_mode'] else 'not 0600',
        'ca_sha256': fingerprints or '(known once generated)',
    }


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), mutually_exclusive=MUTUALLY_EXCLUSIVE, supports_check_mode=True,
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    if not _crypto.HAS_CRYPTOGRAPHY:
        module.fail_json(msg=missing_required_lib('cryptography'), exception=str(_crypto.CRYPTOGRAPHY_IMPORT_ERROR))
    if not talosyaml.HAS_YAML:
        module.fail_json(msg=missing_required_lib('PyYAML'), exception=str(talosyaml.YAML_IMPORT_ERROR))
    params = module.params
    try:
        password = files.vault_password(params, module.run_command)
        _secrets.register(module, password)
        decision = plan(params, password)
        if decision.get('bundle') is not None:
            _secrets.register(module, *decision['bundle'].secret_values())
        changed = decision['write'] or decision['fix_mode']
        if changed and not module.check_mode:
            act(params, decision, password)
            _secrets.register(module, *decision['bundle'].secret_values())
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **exc.details)
    except (IOError, OSError) as exc:
        module.fail_json(msg='cannot read or write the secrets bundle %s: %s' % (params['path'], exc), exception=traceback.format_exc())

    bundle = decision.get('bundle')
    result = dict(
        changed=changed,
        path=params['path'],
        outcome=decision['action'],
        encrypted=decision['encrypted'],
        mode_fixed=decision['fix_mode'],
        os_ca_key_type=(bundle.os_key_type() or '') if bundle is not None else '',
        ca_sha256=ca_fingerprints(bundle) if bundle is not None else {},
    )
    if module._diff:
        result['diff'] = make_diff(_state(decision, after=False), _state(decision, after=True),
                                   before_header=params['path'], after_header=params['path'])
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
