# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: vault_password
short_description: The vault password typed at a prompt of the run, for modules that keep secret files encrypted
version_added: 0.1.0
description:
  - When the run has no vault password file (see P(proxtalos.cluster.vault_password_file#lookup)) but a vault password
    typed at a prompt (C(--ask-vault-pass), C(--vault-id LABEL@prompt)), returns that password - the one
    C(ansible-vault encrypt) would use (C(--encrypt-vault-id) / C(vault_encrypt_identity), else the first) - so that a
    module's O(proxtalos.cluster.talos_secrets#module:vault_password) (no_log) keeps the file vault-encrypted with it.
    Otherwise returns an empty string; the password file, when there is one, is the way to pass it.
  - The roles of this collection use it for the Talos secrets bundle and the sealed-secrets private key, so a run with
    only C(--ask-vault-pass) writes no private key in clear.
  - The value is a secret - hand it only to a module option marked no_log, never to a debug task.
options: {}
notes:
  - Reads the vault secrets ansible-playbook loaded at start (C(ansible.parsing.vault.VaultSecretsContext), ansible-core
    2.19 and later).
"""

EXAMPLES = r"""
- name: Keep the bundle encrypted with the password typed at --ask-vault-pass, or the password file
  proxtalos.cluster.talos_secrets:
    path: "{{ inventory_dir }}/secrets/talos-secrets.yaml"
    vault_password_file: "{{ lookup('proxtalos.cluster.vault_password_file', prompt_warning=false) or omit }}"
    vault_password: "{{ lookup('proxtalos.cluster.vault_password') or omit }}"
"""

RETURN = r"""
_raw:
  description: One element - the prompted vault password, or an empty string.
  type: list
  elements: str
"""

from ansible import constants as C
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.lookup import LookupBase

from ansible_collections.proxtalos.cluster.plugins.lookup.vault_password_file import run_choice

from ansible.parsing.vault import AnsibleVaultError, VaultSecretsContext, match_encrypt_secret


def prompted_password(secrets, encrypt_vault_id=None):
    """The text of the secret ansible-vault would encrypt with, from [(vault id, secret)]; '' when there is none."""
    if not secrets:
        return ''
    try:
        match = match_encrypt_secret(secrets, encrypt_vault_id=encrypt_vault_id)
    except AnsibleVaultError:  # no secret of that vault id
        return ''
    if not match:
        return ''
    secret = match[1]
    data = getattr(secret, 'bytes', None)
    return to_text(data, errors='surrogate_or_strict') if data else ''


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        path, prompts = run_choice()
        if path or not prompts:
            return ['']
        # the secrets ansible-playbook set up at start (the same list its data loader holds)
        secrets_context = VaultSecretsContext.current(optional=True)
        return [prompted_password(getattr(secrets_context, 'secrets', None) or [], C.DEFAULT_VAULT_ENCRYPT_IDENTITY)]
