#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sealed_secret
short_description: Seal a Secret offline into a kubeseal-compatible SealedSecret
version_added: 0.1.0
description:
  - Turns Secret values into a C(bitnami.com/v1alpha1) SealedSecret the way C(kubeseal --cert) does, without a
    cluster. Every item is sealed on its own with a fresh AES-256-GCM session key, wrapped with RSA-OAEP (SHA-256)
    for the certificate's public key, with the OAEP label of the scope (V(strict) binds namespace and name,
    V(namespace-wide) the namespace, V(cluster-wide) nothing).
  - Writes the SealedSecret to O(dest) (for the GitOps repository) and returns it.
  - Sealing is randomised, so a new seal never equals the old one byte for byte. With O(private_key_path) the
    module opens an existing O(dest) and leaves it alone when it already seals exactly these values for this
    key, scope, name and metadata (C(changed=false)). Without O(private_key_path) it cannot tell, and re-seals
    O(dest) on every run (C(changed=true)).
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
attributes:
  check_mode:
    support: full
    details:
      - Seals in memory and predicts C(changed); writes nothing.
  diff_mode:
    support: full
    details:
      - The diff shows the metadata, template and item names; values are never shown.
options:
  name:
    description: Name of the Secret (and of the SealedSecret).
    type: str
    required: true
  namespace:
    description:
      - Namespace of the Secret. Required unless O(scope=cluster-wide).
    type: str
  scope:
    description:
      - Where the sealed values may be unsealed; the scope annotation is written on the SealedSecret's metadata
        and on its template, as kubeseal does.
    type: str
    choices: [strict, namespace-wide, cluster-wide]
    default: strict
  type:
    description: Type of the Secret the controller will create.
    type: str
    default: Opaque
  labels:
    description: Labels of the Secret the controller will create (C(spec.template.metadata.labels)).
    type: dict
  annotations:
    description: Annotations of the Secret the controller will create (C(spec.template.metadata.annotations)).
    type: dict
  immutable:
    description: Make the created Secret immutable.
    type: bool
  data:
    description:
      - Items with base64-encoded values, as in a Secret's C(data).
    type: dict
  string_data:
    description:
      - Items with plain-text values, as in a Secret's C(stringData); they win over O(data) on the same key.
      - Values are masked in the task result; a value of one to three characters may therefore also mask matching
        characters of the returned ciphertext. The file written to O(dest) is always intact.
    type: dict
  certificate:
    description:
      - PEM of the sealing certificate (public). One of O(certificate) and O(certificate_path) is required.
    type: str
  certificate_path:
    description: Path of the sealing certificate PEM, for example the one kept by M(proxtalos.cluster.sealed_key).
    type: path
  private_key_path:
    description:
      - Path of the matching private key (PEM, may be vault-encrypted). Used only to check whether O(dest) is
        already up to date; it is never written or returned.
    type: path
  vault_password:
    description: Vault password to open a vault-encrypted O(private_key_path).
    type: str
  vault_password_file:
    description: File (or executable script) with the vault password for O(private_key_path).
    type: path
  dest:
    description:
      - Where to write the SealedSecret as YAML, mode V(0644) (it holds no clear secrets). When not set, the
        SealedSecret is only returned and C(changed) is V(false).
    type: path
seealso:
  - module: proxtalos.cluster.sealed_key
"""

EXAMPLES = r"""
- name: Seal the Proxmox CSI credentials into the GitOps repository
  proxtalos.cluster.sealed_secret:
    name: proxmox-csi-plugin
    namespace: csi-proxmox
    string_data:
      config.yaml: "{{ csi_config | ansible.builtin.to_nice_yaml }}"
    certificate_path: "{{ inventory_dir }}/secrets/sealed-secrets.crt"
    private_key_path: "{{ inventory_dir }}/secrets/sealed-secrets.key"
    vault_password_file: "{{ lookup('ansible.builtin.config', 'DEFAULT_VAULT_PASSWORD_FILE') }}"
    dest: "{{ gitops_repo_dir }}/kubernetes/apps/csi-proxmox/proxmox-csi/app/secret.sealed.yaml"
"""

RETURN = r"""
sealed_secret:
  description: The SealedSecret object.
  returned: always
  type: dict
  sample:
    apiVersion: bitnami.com/v1alpha1
    kind: SealedSecret
    metadata: {name: proxmox-csi-plugin, namespace: csi-proxmox}
    spec:
      encryptedData: {config.yaml: AgB...}
      template:
        metadata: {name: proxmox-csi-plugin, namespace: csi-proxmox}
        type: Opaque
reason:
  description: Why O(dest) was (or would be) written, or why it was left alone.
  returned: always
  type: str
  sample: up to date
"""

import os
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _atomic_file, _crypto, _sealed, _secrets, _vault
from ansible_collections.proxtalos.cluster.plugins.module_utils._diff import make_diff
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError

try:
    import yaml
except ImportError:
    HAS_YAML = False
    YAML_IMPORT_ERROR = traceback.format_exc()
else:
    HAS_YAML = True
    YAML_IMPORT_ERROR = None

DEST_MODE = 0o644
DEST_DIR_MODE = 0o755


def argument_spec():
    return dict(
        name=dict(type='str', required=True),
        namespace=dict(type='str'),
        scope=dict(type='str', default='strict', choices=list(_sealed.SCOPES)),
        type=dict(type='str', default='Opaque'),
        labels=dict(type='dict'),
        annotations=dict(type='dict'),
        immutable=dict(type='bool'),
        data=dict(type='dict', no_log=True),
        string_data=dict(type='dict', no_log=True),
        certificate=dict(type='str'),
        certificate_path=dict(type='path'),
        private_key_path=dict(type='path', no_log=False),
        vault_password=dict(type='str', no_log=True),
        vault_password_file=dict(type='path', no_log=False),
        dest=dict(type='path'),
    )


def secret_manifest(params):
    """The Secret (v1) that the module parameters describe."""
    metadata = {'name': params['name']}
    if params['namespace']:
        metadata['namespace'] = params['namespace']
    if params['labels']:
        metadata['labels'] = dict((str(k), str(v)) for k, v in params['labels'].items())
    if params['annotations']:
        metadata['annotations'] = dict((str(k), str(v)) for k, v in params['annotations'].items())
    secret = {'apiVersion': 'v1', 'kind': 'Secret', 'metadata': metadata, 'type': params['type']}
    if params['data']:
        secret['data'] = params['data']
    if params['string_data']:
        secret['stringData'] = params['string_data']
    if params['immutable'] is not None:
        secret['immutable'] = params['immutable']
    return secret


def _load_private_key(path, password):
    """The PEM bytes of the private key file, opened with the vault password when encrypted."""
    with open(path, 'rb') as handle:
        content = handle.read()
    if _vault.is_encrypted(content):
        if password is None:
            raise ValidationError('private_key_path', 'is vault-encrypted; give vault_password or vault_password_file')
        try:
            content = _vault.decrypt(content, password)
        except _vault.VaultError as exc:
            raise ValidationError('private_key_path', str(exc)) from None
    return content


def _read_existing(dest):
    """The SealedSecret document at dest, None when absent, or a string saying why it is unusable."""
    if not os.path.exists(dest):
        return None
    try:
        with open(dest, 'rb') as handle:
            documents = [doc for doc in yaml.safe_load_all(handle) if doc is not None]
    except yaml.YAMLError as exc:
        return 'the existing file is not valid YAML (%s)' % str(exc).splitlines()[0]
    if len(documents) != 1:
        return 'the existing file holds %d YAML documents, not one SealedSecret' % len(documents)
    return documents[0]


def plan(params, secret, cert_pem, key_pem):
    """(sealed_secret, write, reason). The seal is fresh; write says whether dest must change."""
    sealed = _sealed.seal(secret, cert_pem, params['scope'])
    dest = params['dest']
    if not dest:
        return sealed, False, 'no dest: the SealedSecret is only returned'
    existing = _read_existing(dest)
    if existing is None:
        return sealed, True, '%s does not exist' % dest
    if isinstance(existing, str):
        return sealed, True, existing
    if key_pem is None:
        return sealed, True, 'no private_key_path: cannot tell whether %s seals the same values, so it is sealed again' % dest
    private_key = _sealed.load_private_key(key_pem, 'private_key_path')
    certificate, _warnings = _sealed.load_certificate(cert_pem)
    if certificate.public_key().public_numbers() != private_key.public_key().public_numbers():
        raise ValidationError('private_key_path', 'does not match the sealing certificate')
    same, reason = _sealed.same_sealed_content(existing, secret, params['scope'], private_key)
    if same:
        return existing, False, 'up to date'
    return sealed, True, reason


def _write(dest, sealed):
    content = yaml.safe_dump(sealed, default_flow_style=False, sort_keys=False, width=2 ** 31).encode('utf-8')
    _atomic_file.write_atomically(dest, content, DEST_MODE, DEST_DIR_MODE)


def _without_values(sealed):
    """The SealedSecret with each encrypted value replaced by a marker, for diffs."""
    if not isinstance(sealed, dict):
        return {}
    view = dict(sealed)
    spec = dict(view.get('spec') or {})
    spec['encryptedData'] = dict((key, '<sealed>') for key in (spec.get('encryptedData') or {}))
    view['spec'] = spec
    return view


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(),
        required_one_of=[('certificate', 'certificate_path')],
        mutually_exclusive=[('certificate', 'certificate_path'), ('vault_password', 'vault_password_file')],
        supports_check_mode=True,
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    if not _crypto.HAS_CRYPTOGRAPHY:
        module.fail_json(msg=missing_required_lib('cryptography'), exception=str(_crypto.CRYPTOGRAPHY_IMPORT_ERROR))
    if not HAS_YAML:
        module.fail_json(msg=missing_required_lib('PyYAML'), exception=YAML_IMPORT_ERROR)
    params = module.params
    try:
        if not params['data'] and not params['string_data']:
            raise ValidationError('data', 'give at least one item in data or string_data')
        password = params['vault_password']
        if params['vault_password_file']:
            password = _vault.read_password_file(params['vault_password_file'], module.run_command)
            _secrets.register(module, password)
        cert_pem = params['certificate']
        if params['certificate_path']:
            with open(params['certificate_path'], 'rb') as handle:
                cert_pem = handle.read()
        key_pem = _load_private_key(params['private_key_path'], password) if params['private_key_path'] else None
        _secrets.register(module, key_pem)
        secret = secret_manifest(params)
        existing = _read_existing(params['dest']) if params['dest'] else None
        sealed, write, reason = plan(params, secret, cert_pem, key_pem)
        if write and not module.check_mode:
            _write(params['dest'], sealed)
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **exc.details)
    except (OSError, IOError) as exc:
        module.fail_json(msg='cannot read or write a file: %s' % exc, exception=traceback.format_exc())

    result = dict(changed=write, sealed_secret=sealed, reason=reason)
    if module._diff and params['dest']:
        before = _without_values(existing) if isinstance(existing, dict) else {}
        result['diff'] = make_diff(before, _without_values(sealed), before_header=params['dest'], after_header=params['dest'])
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
