#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sealed_key
short_description: Keep the sealed-secrets keypair (generate once, import, validate)
version_added: 0.1.0
description:
  - Keeps the RSA private key and the self-signed certificate that the sealed-secrets controller will use,
    as two files on the host the module runs on (the Ansible controller with C(ansible_connection=local)).
  - When neither file exists, generates an RSA key (4096 bits by default) and a long-lived self-signed certificate,
    or imports the key and certificate given with O(import_private_key)/O(import_private_key_src) and
    O(import_certificate)/O(import_certificate_src).
  - When only the private key exists (what a run stopped between writing the key and the certificate leaves, as
    the key is written first), the key is kept and its certificate is made again from it (RV(outcome=completed)).
    A certificate without its key is refused.
  - When both files exist, they are never regenerated or replaced. They are validated instead, as the controller and
    kubeseal need them (an RSA key in a V(RSA PRIVATE KEY) or V(PRIVATE KEY) PEM block, a certificate for that key,
    not expired); a bad pair fails the task with the field and the reason, because the controller crashes on a
    Secret it cannot parse.
  - Both files are mode V(0600). With O(vault_password) or O(vault_password_file), the private key file is kept
    encrypted with Ansible Vault (the format C(ansible-vault) and the P(ansible.builtin.file#lookup) lookup read);
    a plain key file found then is encrypted in place (the key itself is unchanged). The certificate is public and
    stays plain.
  - Returns the certificate and fingerprints, never the private key unless O(return_content=true).
  - Creating the C(kube-system) Secret from these files is not done here (see the C(sealed_secrets) role).
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
attributes:
  check_mode:
    support: full
    details:
      - Predicts C(changed) without writing; a key that would be generated is not generated, so RV(certificate)
        and the fingerprints are empty then.
  diff_mode:
    support: full
    details:
      - The diff shows fingerprints and file states; the private key is always hidden.
options:
  private_key_path:
    description:
      - Where the private key is kept (PEM; vault-encrypted when a vault password is given).
    type: path
    required: true
  certificate_path:
    description:
      - Where the certificate is kept (PEM).
    type: path
    required: true
  import_private_key:
    description:
      - PEM of an existing private key to import when O(private_key_path) does not exist yet.
      - Must be given with O(import_certificate) or O(import_certificate_src).
      - When the files already exist, the import must be the same keypair, otherwise the task fails (an existing
        key is never replaced).
    type: str
  import_private_key_src:
    description:
      - Path of a PEM file (may be vault-encrypted with the same vault password) holding the key to import.
      - Mutually exclusive with O(import_private_key).
    type: path
  import_certificate:
    description:
      - PEM of the certificate of the imported key.
    type: str
  import_certificate_src:
    description:
      - Path of a PEM file holding the certificate of the imported key.
      - Mutually exclusive with O(import_certificate).
    type: path
  key_size:
    description:
      - RSA key size in bits for a generated key.
    type: int
    default: 4096
  common_name:
    description:
      - Subject common name of a generated certificate.
    type: str
    default: sealed-secret
  validity_days:
    description:
      - Validity of a generated certificate, in days. kubeseal refuses to seal with an expired certificate.
    type: int
    default: 3650
  vault_password:
    description:
      - Ansible Vault password with which the private key file is kept encrypted.
    type: str
  vault_password_file:
    description:
      - File holding the vault password (first line), or an executable script that prints it, as for
        C(ansible-playbook --vault-password-file).
      - Mutually exclusive with O(vault_password).
    type: path
  vault_id:
    description:
      - Vault ID label written in the envelope (format 1.2) of an encrypted key file.
    type: str
  return_content:
    description:
      - Also return the private key PEM in RV(private_key).
      - B(Use no_log) on the task when you set this, or the key ends up in logs.
    type: bool
    default: false
notes:
  - With the controller's default key renewal (30 days) a certificate whose NotBefore is older than that makes the
    controller generate and use a new key at start; install the controller with C(keyrenewperiod "0") to keep this
    key as the sealing key. The module warns when this applies.
seealso:
  - module: proxtalos.cluster.sealed_secret
"""

EXAMPLES = r"""
- name: Keep the sealed-secrets keypair next to the inventory, vault-encrypted
  proxtalos.cluster.sealed_key:
    private_key_path: "{{ inventory_dir }}/secrets/sealed-secrets.key"
    certificate_path: "{{ inventory_dir }}/secrets/sealed-secrets.crt"
    vault_password_file: "{{ lookup('ansible.builtin.config', 'DEFAULT_VAULT_PASSWORD_FILE') }}"
  register: sealed_keypair

- name: Import an existing key (from an older cluster)
  proxtalos.cluster.sealed_key:
    private_key_path: "{{ inventory_dir }}/secrets/sealed-secrets.key"
    certificate_path: "{{ inventory_dir }}/secrets/sealed-secrets.crt"
    import_private_key_src: /secure/old-cluster/tls.key
    import_certificate_src: /secure/old-cluster/tls.crt
"""

RETURN = r"""
outcome:
  description:
    - What was done (or would be done in check mode).
    - Not named C(action), because callbacks such as the JSON one overwrite a result key of that name.
    - V(completed) means the private key was kept and its missing certificate made again from it.
  returned: always
  type: str
  sample: kept
  choices: [generated, imported, kept, encrypted, completed]
certificate:
  description: The certificate PEM (public). Empty when a key would be generated in check mode.
  returned: always
  type: str
certificate_sha256:
  description: SHA-256 fingerprint of the certificate (DER), lower-case hex.
  returned: always
  type: str
  sample: 3d2ebafaf8d3ad83f0caa1b4ee8110dab34123eadab3787a29b84d4f6547d064
public_key_sha256:
  description: SHA-256 of the public key (SubjectPublicKeyInfo DER), lower-case hex.
  returned: always
  type: str
key_size:
  description: RSA key size in bits.
  returned: always
  type: int
  sample: 4096
subject:
  description: Certificate subject (RFC 4514).
  returned: always
  type: str
  sample: CN=sealed-secret
not_before:
  description: Certificate NotBefore (ISO 8601, UTC). The controller seals with the key whose certificate is newest.
  returned: always
  type: str
not_after:
  description: Certificate NotAfter (ISO 8601, UTC).
  returned: always
  type: str
private_key_encrypted:
  description: Whether the private key file is (or would be) vault-encrypted.
  returned: always
  type: bool
private_key:
  description: The private key PEM. Only with O(return_content=true).
  returned: when O(return_content=true)
  type: str
"""

import os
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _atomic_file, _crypto, _sealed, _secrets, _vault
from ansible_collections.proxtalos.cluster.plugins.module_utils._diff import make_diff
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError

FILE_MODE = 0o600
DIR_MODE = 0o700


def argument_spec():
    return dict(
        private_key_path=dict(type='path', required=True),
        certificate_path=dict(type='path', required=True),
        import_private_key=dict(type='str', no_log=True),
        import_private_key_src=dict(type='path'),
        import_certificate=dict(type='str'),
        import_certificate_src=dict(type='path'),
        key_size=dict(type='int', default=_sealed.DEFAULT_KEY_SIZE),
        common_name=dict(type='str', default=_sealed.DEFAULT_COMMON_NAME),
        validity_days=dict(type='int', default=_sealed.DEFAULT_VALIDITY_DAYS),
        vault_password=dict(type='str', no_log=True),
        vault_password_file=dict(type='path', no_log=False),
        vault_id=dict(type='str'),
        return_content=dict(type='bool', default=False),
    )


MUTUALLY_EXCLUSIVE = [('import_private_key', 'import_private_key_src'),
                      ('import_certificate', 'import_certificate_src'),
                      ('vault_password', 'vault_password_file')]


def _read(path):
    with open(path, 'rb') as handle:
        return handle.read()


def _open_key(data, password, field):
    """Plain PEM bytes of a key file's content; (pem, was_encrypted)."""
    if _vault.is_encrypted(data):
        if password is None:
            raise ValidationError(field, 'is vault-encrypted; give vault_password or vault_password_file to open it')
        try:
            return _vault.decrypt(data, password), True
        except _vault.VaultError as exc:
            raise ValidationError(field, str(exc)) from None
    return data, False


def _import_material(params, password):
    """(key_pem, cert_pem) to import, or (None, None)."""
    key_pem = params['import_private_key']
    cert_pem = params['import_certificate']
    if params['import_private_key_src']:
        key_pem, _encrypted = _open_key(_read(params['import_private_key_src']), password, 'import_private_key_src')
    if params['import_certificate_src']:
        cert_pem = _read(params['import_certificate_src'])
    if (key_pem is None) != (cert_pem is None):
        raise ValidationError('import_private_key' if key_pem is None else 'import_certificate',
                              'an import needs both the private key and its certificate')
    if key_pem is None:
        return None, None
    return _sealed.to_bytes(key_pem), _sealed.to_bytes(cert_pem)


def _mode_of(path):
    return os.stat(path).st_mode & 0o7777


def plan(params, password):
    """Observe the files and decide. Returns a dict: action, key_pem, cert_pem, writes, facts, warnings.

    `writes` lists (path, content bytes) that act() must write; empty means nothing changes
    except possibly file modes (`modes` lists paths whose mode is not 0600).
    """
    key_path = params['private_key_path']
    cert_path = params['certificate_path']
    key_exists = os.path.exists(key_path)
    cert_exists = os.path.exists(cert_path)
    import_key, import_cert = _import_material(params, password)
    encrypt = password is not None
    result = {'writes': [], 'modes': [], 'warnings': []}

    if cert_exists and not key_exists:
        raise ValidationError('private_key_path',
                              '%s exists but %s does not; refusing to generate a new keypair over half of an existing one '
                              '(restore the missing file, or remove both to start over)' % (cert_path, key_path))

    if key_exists and not cert_exists:
        # The key is written first: a run that stopped between the two writes leaves the key alone. The key is what
        # matters and is kept; its certificate (public, derived from it) is made again.
        stored_key, was_encrypted = _open_key(_read(key_path), password, 'private_key_path')
        cert_pem = _sealed.certificate_for(stored_key, params['common_name'], params['validity_days'])
        facts, warnings = _sealed.describe_keypair(stored_key, cert_pem, key_field='private_key_path',
                                                   cert_field='certificate_path')
        result.update(action='completed', key_pem=stored_key, cert_pem=cert_pem, facts=facts, encrypted=was_encrypted or encrypt,
                      was_encrypted=was_encrypted)
        result['warnings'].extend(warnings)
        result['writes'] = ([(key_path, 'key')] if encrypt and not was_encrypted else []) + [(cert_path, 'cert')]
        result['modes'] = [key_path] if _mode_of(key_path) != FILE_MODE else []
        return result

    if key_exists:
        stored_key, was_encrypted = _open_key(_read(key_path), password, 'private_key_path')
        stored_cert = _read(cert_path)
        facts, warnings = _sealed.describe_keypair(stored_key, stored_cert, key_field='private_key_path',
                                                   cert_field='certificate_path')
        if import_key is not None:
            import_facts, _import_warnings = _sealed.describe_keypair(import_key, import_cert, key_field='import_private_key',
                                                                      cert_field='import_certificate')
            if import_facts['public_key_sha256'] != facts['public_key_sha256']:
                raise ValidationError('import_private_key', 'differs from the key already kept at %s; an existing key is never '
                                      'replaced (remove the files first if you really mean to switch keys)' % key_path)
        result.update(action='kept', key_pem=stored_key, cert_pem=stored_cert, facts=facts, encrypted=was_encrypted,
                      was_encrypted=was_encrypted)
        result['warnings'].extend(warnings)
        if encrypt and not was_encrypted:
            result['action'] = 'encrypted'
            result['writes'].append((key_path, 'key'))
            result['encrypted'] = True
        result['modes'] = [path for path in (key_path, cert_path) if _mode_of(path) != FILE_MODE]
        return result

    if import_key is not None:
        facts, warnings = _sealed.describe_keypair(import_key, import_cert, key_field='import_private_key',
                                                   cert_field='import_certificate')
        result.update(action='imported', key_pem=import_key, cert_pem=import_cert, facts=facts, encrypted=encrypt)
        result['warnings'].extend(warnings)
    else:
        if params['key_size'] < _sealed.MIN_KEY_SIZE:
            raise ValidationError('key_size', 'must be at least %d bits, got %d' % (_sealed.MIN_KEY_SIZE, params['key_size']))
        if params['validity_days'] < 1:
            raise ValidationError('validity_days', 'must be at least 1 day, got %d' % params['validity_days'])
        result.update(action='generated', key_pem=None, cert_pem=None, facts={}, encrypted=encrypt)
    result['writes'] = [(key_path, 'key'), (cert_path, 'cert')]
    return result


def act(params, decision, password):
    """Generate if needed and write what plan() decided."""
    if decision['action'] == 'generated':
        key_pem, cert_pem = _sealed.generate_keypair(params['key_size'], params['common_name'], params['validity_days'])
        decision['key_pem'], decision['cert_pem'] = key_pem, cert_pem
        decision['facts'], warnings = _sealed.describe_keypair(key_pem, cert_pem)
        decision['warnings'].extend(warnings)
    for path, what in decision['writes']:
        if what == 'key':
            content = decision['key_pem']
            if password is not None:
                content = _vault.encrypt(content, password, params['vault_id'])
        else:
            content = decision['cert_pem']
        _atomic_file.write_atomically(path, content, FILE_MODE, DIR_MODE)
    for path in decision['modes']:
        os.chmod(path, FILE_MODE)


def _diff_states(decision):
    """Before/after views of the keypair files for diff mode; the key itself is never shown."""
    facts = decision.get('facts') or {}
    fingerprint = facts.get('certificate_sha256') or '(known once generated)'
    after = {'private_key': '<kept, hidden>', 'certificate_sha256': fingerprint,
             'private_key_encrypted': bool(decision.get('encrypted')), 'mode': '0600'}
    if decision['action'] in ('generated', 'imported'):
        return {}, after
    before = {'private_key': '<kept, hidden>', 'certificate_sha256': fingerprint,
              'private_key_encrypted': bool(decision.get('was_encrypted')),
              'mode': '0600' if not decision['modes'] else 'not 0600: %s' % ', '.join(decision['modes'])}
    if decision['action'] == 'completed':
        before['certificate_sha256'] = '(certificate missing)'
    return before, after


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), mutually_exclusive=MUTUALLY_EXCLUSIVE, supports_check_mode=True,
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    if not _crypto.HAS_CRYPTOGRAPHY:
        module.fail_json(msg=missing_required_lib('cryptography'), exception=str(_crypto.CRYPTOGRAPHY_IMPORT_ERROR))
    params = module.params
    try:
        password = params['vault_password']
        if params['vault_password_file']:
            password = _vault.read_password_file(params['vault_password_file'], module.run_command)
            _secrets.register(module, password)
        decision = plan(params, password)
        changed = bool(decision['writes'] or decision['modes'])
        if changed and not module.check_mode:
            act(params, decision, password)
        if not params['return_content']:
            # Mask the key wherever it might surface (it is never put in the result on purpose).
            _secrets.register(module, decision.get('key_pem'))
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **exc.details)
    except (OSError, IOError) as exc:
        module.fail_json(msg='cannot read or write the keypair files: %s' % exc, exception=traceback.format_exc())

    for warning in decision['warnings']:
        module.warn(warning)
    facts = decision.get('facts') or {}
    result = dict(
        changed=changed,
        outcome=decision['action'],
        certificate=(decision.get('cert_pem') or b'').decode('ascii'),
        certificate_sha256=facts.get('certificate_sha256', ''),
        public_key_sha256=facts.get('public_key_sha256', ''),
        key_size=facts.get('key_size', params['key_size'] if decision['action'] == 'generated' else 0),
        subject=facts.get('subject', ''),
        not_before=facts.get('not_before', ''),
        not_after=facts.get('not_after', ''),
        private_key_encrypted=bool(decision.get('encrypted')),
    )
    if module._diff:
        before, after = _diff_states(decision)
        result['diff'] = make_diff(before, after)
    if params['return_content']:
        result['private_key'] = (decision.get('key_pem') or b'').decode('ascii')
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
