# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: vault_password_file
short_description: The vault password file ansible-playbook was given, from its command line or its configuration
version_added: 0.1.0
description:
  - Returns the path of the first vault password file (or script) of the current run, in the order ansible-playbook
    itself uses them - the configured vault identities (C(vault_identity_list)), C(--vault-id) options,
    C(--vault-password-file) options, then the configured C(vault_password_file) (C(ANSIBLE_VAULT_PASSWORD_FILE)) -
    or an empty string when the run has none.
  - C(lookup('ansible.builtin.config', 'DEFAULT_VAULT_PASSWORD_FILE')) sees only the configuration; a password file
    given on the command line is seen here too. The roles of this collection use it as the default of
    C(talos_machines_vault_password_file) and C(sealed_secrets_vault_password_file), so that the secret files they
    keep are vault-encrypted whenever ansible-playbook has a vault password file.
  - A password typed at a prompt (C(--ask-vault-pass), C(--vault-id <label>@prompt)) is not in a file. When the run
    has only such passwords, the lookup returns an empty string and, unless O(prompt_warning=false), warns that
    O(purpose) is kept unencrypted, and why; P(proxtalos.cluster.vault_password#lookup) returns that password for a
    module's no_log C(vault_password) option, as the roles of this collection do.
  - Relative C(--vault-id) paths are taken from the current directory, as ansible-playbook does; sources whose file
    does not exist are skipped (ansible-playbook has already warned about them).
options:
  purpose:
    description: What the file is for, named in the warning (for example V(the Talos secrets bundle)).
    type: str
    default: the secret files kept by proxtalos.cluster
  prompt_warning:
    description:
      - Warn when the run has only a prompted vault password. The roles of this collection turn it off - they hand
        that password to their modules through P(proxtalos.cluster.vault_password#lookup) instead.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Keep the cluster secrets vault-encrypted whenever ansible-playbook has a vault password file
  proxtalos.cluster.talos_secrets:
    path: "{{ inventory_dir }}/secrets/talos-secrets.yaml"
    vault_password_file: "{{ lookup('proxtalos.cluster.vault_password_file', purpose='the Talos secrets bundle') or omit }}"
"""

RETURN = r"""
_raw:
  description: One element - the absolute path of the vault password file, or an empty string.
  type: list
  elements: str
"""

import os

from ansible import constants as C
from ansible import context
from ansible.plugins.lookup import LookupBase
from ansible.utils.display import Display

PROMPTS = ('prompt', 'prompt_ask_vault_pass')


def split_vault_id(slug):
    """(label or None, source) of a `--vault-id` value: `label@source` or just `source`."""
    slug = str(slug)
    if '@' not in slug:
        return None, slug
    label, source = slug.split('@', 1)
    return label or None, source


def vault_sources(cli_vault_ids=(), cli_password_files=(), ask_vault_pass=False, identity_list=(), password_file=None):
    """[(label, source)] in the order ansible-playbook builds its vault secrets (ansible.cli.CLI).

    Configured identities first, then --vault-id, then --vault-password-file and the configured
    password file, then the --ask-vault-pass prompt. A source is a path or 'prompt'/'prompt_ask_vault_pass'.
    """
    sources = [split_vault_id(slug) for slug in list(identity_list or []) + list(cli_vault_ids or [])]
    files = list(cli_password_files or [])
    if password_file:
        files.append(password_file)
    sources.extend((None, str(path)) for path in files)
    if ask_vault_pass:
        sources.append((None, 'prompt_ask_vault_pass'))
    return sources


def choose(sources, exists=os.path.exists, cwd=None):
    """(absolute path of the first file source that exists, or '', [the prompt sources seen])."""
    prompts = []
    for label, source in sources:
        if source in PROMPTS:
            prompts.append('--ask-vault-pass' if source == 'prompt_ask_vault_pass' else '--vault-id %s@prompt' % (label or 'default'))
            continue
        path = os.path.abspath(os.path.join(cwd or os.getcwd(), os.path.expanduser(source)))
        if exists(path):
            return path, prompts
    return '', prompts


def unusable_password_warning(prompts, purpose):
    return ('A vault password was given only at a prompt (%s); the modules of proxtalos.cluster read the vault password '
            'from a file, so %s is written unencrypted (mode 0600). To keep it vault-encrypted, give the password as a '
            'file: --vault-password-file FILE, --vault-id LABEL@FILE or ANSIBLE_VAULT_PASSWORD_FILE.'
            % (', '.join(prompts), purpose))


def run_choice():
    """choose() over the vault sources of this ansible-playbook run (its command line, then its configuration)."""
    # ansible.context.CLIARGS: the command line as ansible-core's own plugins read it, the module's one public name
    # (its __all__); docs/adr/0001-modules-in-the-worker-process.md says why it stays.
    cliargs = context.CLIARGS
    return choose(vault_sources(
        cli_vault_ids=cliargs.get('vault_ids') or (),
        cli_password_files=cliargs.get('vault_password_files') or (),
        ask_vault_pass=bool(cliargs.get('ask_vault_pass')),
        identity_list=C.config.get_config_value('DEFAULT_VAULT_IDENTITY_LIST') or (),
        password_file=C.config.get_config_value('DEFAULT_VAULT_PASSWORD_FILE')))


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        path, prompts = run_choice()
        if not path and prompts and self.get_option('prompt_warning'):
            Display().warning(unusable_password_warning(prompts, self.get_option('purpose')))
        return [path]
