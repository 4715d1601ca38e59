#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sealed_key_secret
short_description: Put the sealed-secrets keypair into the cluster as the controller's active key Secret
version_added: 0.1.0
description:
  - Creates or updates the Secret the sealed-secrets controller loads its keys from - type C(kubernetes.io/tls), data
    C(tls.key) and C(tls.crt), label C(sealedsecrets.bitnami.com/sealed-secrets-key=active) - in the controller's
    namespace, from the key files M(proxtalos.cluster.sealed_key) keeps.
  - Reads the files itself (the private key may be vault-encrypted), so no key material passes through task
    arguments, results or logs; the key is also registered as a secret to mask.
  - Validates the pair before writing (an RSA key in a PEM block the controller reads, a certificate for that
    key, not expired) - an C(active) Secret the controller cannot parse makes it crash at start.
  - Re-run with the same files is C(changed=false). Other C(active) key Secrets in the namespace are reported (the
    controller seals with the newest of all of them), and with O(other_keys=deactivate) relabelled
    C(compromised), which the controller ignores.
  - Create it before the controller starts - the controller reads its keys at start only.
author:
  - proxtalos.cluster contributors (@proxtalos)
options:
  private_key_path:
    description: The private key file (PEM, or an Ansible Vault envelope of it).
    type: path
    required: true
  certificate_path:
    description: The certificate file (PEM).
    type: path
    required: true
  vault_password:
    description: Vault password of an encrypted O(private_key_path).
    type: str
  vault_password_file:
    description: File holding the vault password, or an executable that prints it (as for C(--vault-password-file)).
    type: path
  namespace:
    description: The controller's namespace.
    type: str
    default: kube-system
  name:
    description:
      - Name of the Secret. V(sealed-secrets-key), the controller's default key prefix, is also loaded by name.
    type: str
    default: sealed-secrets-key
  other_keys:
    description:
      - What to do with other Secrets of the namespace labelled C(active). V(keep) reports them (a warning);
        V(deactivate) relabels them C(compromised) so the controller, at its next start, uses only ours.
    type: str
    choices: [keep, deactivate]
    default: keep
  check_key_consistency:
    description:
      - Check the RSA numbers of the private key (its primes and CRT values; a quarter to half a second for 4096
        bits). The PEM block, key type and size, and that the certificate is the key's, are checked either way.
      - V(false) only when M(proxtalos.cluster.sealed_key) checked the same file earlier in the same run, as the
        sealed_secrets role does; a key with broken numbers would otherwise become the controller's active key.
    type: bool
    default: true
extends_documentation_fragment:
  - proxtalos.cluster._k8s_auth
  - proxtalos.cluster._attributes
attributes:
  check_mode:
    support: full
    details:
      - Reads the Secret and predicts C(changed) without writing.
  diff_mode:
    support: full
    details:
      - The diff shows the Secret's type, labels and key fingerprints; key material is never shown.
seealso:
  - module: proxtalos.cluster.sealed_key
  - module: proxtalos.cluster.sealed_cert_gate
"""

EXAMPLES = r"""
- name: The controller's key Secret, before the controller starts
  proxtalos.cluster.sealed_key_secret:
    kubeconfig: "{{ proxtalos_artifacts_dir }}/kubeconfig"
    private_key_path: "{{ inventory_dir }}/secrets/sealed-secrets.key"
    certificate_path: "{{ inventory_dir }}/secrets/sealed-secrets.crt"
    vault_password_file: "{{ lookup('ansible.builtin.config', 'DEFAULT_VAULT_PASSWORD_FILE') or omit }}"
"""

RETURN = r"""
operation:
  description: What was done to the Secret (or would be in check mode).
  type: str
  returned: always
  choices: [created, updated, unchanged]
secret:
  description: namespace/name of the Secret.
  type: str
  returned: always
  sample: kube-system/sealed-secrets-key
public_key_sha256:
  description: SHA-256 of the keypair's public key (SubjectPublicKeyInfo DER), to compare with what the controller serves.
  type: str
  returned: always
certificate_sha256:
  description: SHA-256 of the certificate (DER).
  type: str
  returned: always
other_active_keys:
  description: Other Secrets of the namespace labelled active when the module ran (names only).
  type: list
  elements: str
  returned: always
deactivated:
  description: The Secrets relabelled compromised (O(other_keys=deactivate)).
  type: list
  elements: str
  returned: always
"""

import base64
import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec
from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils import _sealed
from ansible_collections.proxtalos.cluster.plugins.module_utils import _secrets
from ansible_collections.proxtalos.cluster.plugins.module_utils import _vault
from ansible_collections.proxtalos.cluster.plugins.module_utils._diff import make_diff
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client

KEY_LABEL = 'sealedsecrets.bitnami.com/sealed-secrets-key'
SECRET_TYPE = 'kubernetes.io/tls'


def argument_spec():
    return _argspec.spec(
        _argspec.K8S_AUTH_SPEC,
        private_key_path=dict(type='path', required=True),
        certificate_path=dict(type='path', required=True),
        vault_password=dict(type='str', no_log=True),
        vault_password_file=dict(type='path', no_log=False),
        namespace=dict(type='str', default='kube-system'),
        name=dict(type='str', default='sealed-secrets-key'),
        other_keys=dict(type='str', default='keep', choices=['keep', 'deactivate']),
        check_key_consistency=dict(type='bool', default=True),
    )


def read_keypair(params, password):
    """(key PEM bytes, cert PEM bytes, facts, warnings) - validated as the controller will read them."""
    try:
        with open(params['private_key_path'], 'rb') as handle:
            key_pem = handle.read()
    except OSError as exc:
        raise _errors.ValidationError('private_key_path', 'cannot read: %s (run proxtalos.cluster.sealed_key first)' % exc.strerror)
    try:
        with open(params['certificate_path'], 'rb') as handle:
            cert_pem = handle.read()
    except OSError as exc:
        raise _errors.ValidationError('certificate_path', 'cannot read: %s' % exc.strerror)
    if _vault.is_encrypted(key_pem):
        if not password:
            raise _errors.ValidationError('private_key_path', 'is vault-encrypted; give vault_password or vault_password_file')
        try:
            key_pem = _vault.decrypt(key_pem, password)
        except _vault.VaultError as exc:
            raise _errors.ValidationError('vault_password', 'does not open %s: %s' % (params['private_key_path'], exc))
    described, warnings = _sealed.describe_keypair(key_pem, cert_pem, key_field='private_key_path', cert_field='certificate_path',
                                                   check_consistency=params['check_key_consistency'])
    return key_pem, cert_pem, described, warnings


def wanted_secret(params, key_pem, cert_pem):
    return {'apiVersion': 'v1', 'kind': 'Secret', 'type': SECRET_TYPE,
            'metadata': {'name': params['name'], 'namespace': params['namespace'], 'labels': {KEY_LABEL: 'active'}},
            'data': {'tls.crt': base64.b64encode(cert_pem).decode('ascii'), 'tls.key': base64.b64encode(key_pem).decode('ascii')}}


def plan(live, wanted):
    """'created', 'updated' or 'unchanged' for a live Secret (dict or None) against the wanted one."""
    if live is None:
        return 'created'
    labels = (live.get('metadata') or {}).get('labels') or {}
    if live.get('type') != wanted['type']:
        return 'replaced'
    if labels.get(KEY_LABEL) != 'active' or (live.get('data') or {}) != wanted['data']:
        return 'updated'
    return 'unchanged'


def _fingerprint_view(secret):
    """A Secret as the diff shows it: type, labels and fingerprints of the pair, never the key."""
    if secret is None:
        return {}
    data = secret.get('data') or {}
    view = {'type': secret.get('type'), 'labels': (secret.get('metadata') or {}).get('labels') or {}, 'data_keys': sorted(data)}
    try:
        certificate, dummy = _sealed.load_certificate(base64.b64decode(data.get('tls.crt') or ''))
        view.update(_sealed.fingerprints(certificate))
    except (_errors.ProxtalosError, ValueError, TypeError):
        view['certificate'] = 'not a parsable certificate'
    return view


def secret_path(namespace, name=None):
    """The API path of the namespace's Secrets, or of one Secret."""
    return k8s_client.api_path('v1', 'secrets', namespace, name)


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True,
        mutually_exclusive=[('vault_password', 'vault_password_file')] + _argspec.K8S_AUTH_CONSTRAINTS['mutually_exclusive'],
    )


def run(module):  # pylint: disable=too-many-locals
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    params = module.params
    namespace, name = params['namespace'], params['name']
    result = {'changed': False, 'operation': 'unchanged', 'secret': '%s/%s' % (namespace, name), 'public_key_sha256': '',
              'certificate_sha256': '', 'other_active_keys': [], 'deactivated': []}
    try:
        password = params['vault_password']
        if params['vault_password_file']:
            try:
                password = _vault.read_password_file(params['vault_password_file'], module.run_command)
            except _vault.VaultError as exc:
                raise _errors.ValidationError('vault_password_file', str(exc))
            _secrets.register(module, password)
        key_pem, cert_pem, described, warnings = read_keypair(params, password)
        _secrets.register(module, key_pem, base64.b64encode(key_pem))
        for warning in warnings:
            module.warn(warning)
        result['public_key_sha256'] = described['public_key_sha256']
        result['certificate_sha256'] = described['certificate_sha256']
        wanted = wanted_secret(params, key_pem, cert_pem)
        # The collection's own client (urllib3): reads and the few writes below, without the kubernetes package's API
        # classes, whose import alone takes longer than everything else this module does.
        api = k8s_client.build_client(params, module=module, warn=module.warn)
        live = api.get('v1', 'Secret', name, namespace)
        action = plan(live, wanted)
        others = api.list('v1', 'Secret', namespace, label_selector='%s=active' % KEY_LABEL)
        other_names = sorted(s['metadata']['name'] for s in others if s['metadata']['name'] != name)
        result['other_active_keys'] = other_names
        result['operation'] = 'updated' if action == 'replaced' else action
        changed = action != 'unchanged'
        if module._diff:  # pylint: disable=protected-access
            result['diff'] = make_diff(_fingerprint_view(live), _fingerprint_view(wanted), before_header='%s (live)' % result['secret'],
                                       after_header='%s (wanted)' % result['secret'])
        if other_names and params['other_keys'] == 'keep':
            module.warn('other active sealed-secrets key Secrets in %s: %s; the controller seals with the newest key of all '
                        '(other_keys=deactivate relabels them compromised)' % (namespace, ', '.join(other_names)))
        if other_names and params['other_keys'] == 'deactivate':
            changed = True
            result['deactivated'] = other_names
        result['changed'] = changed
        if module.check_mode or not changed:
            module.exit_json(**result)
        written = {'fieldManager': 'proxtalos'}
        if action == 'created':
            api.send_json('POST', secret_path(namespace), wanted, query=written)
        elif action == 'replaced':
            # the type of a Secret cannot change: delete it, then create it with the controller's type
            api.send_json('DELETE', secret_path(namespace, name))
            api.send_json('POST', secret_path(namespace), wanted, query=written)
        elif action == 'updated':
            body = dict(wanted, metadata=dict(wanted['metadata'], resourceVersion=live['metadata']['resourceVersion']))
            body['metadata']['labels'] = dict((live['metadata'].get('labels') or {}), **wanted['metadata']['labels'])
            api.send_json('PUT', secret_path(namespace, name), body, query=written)
        for other in result['deactivated']:
            api.send_json('PATCH', secret_path(namespace, other), {'metadata': {'labels': {KEY_LABEL: 'compromised'}}},
                          query=written, content_type='application/merge-patch+json')
    except _errors.ValidationError as exc:
        module.fail_json(msg=str(exc), field=exc.field, **result)
    except _errors.ProxtalosError as exc:
        result.update(exc.details)
        module.fail_json(msg='%s (Secret %s)' % (exc, result['secret']), exception=traceback.format_exc(), **result)
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
