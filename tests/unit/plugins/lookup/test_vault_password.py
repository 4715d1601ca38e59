"""The vault_password lookup: the prompted vault password when the run has no password file, else nothing."""

import pytest
from ansible import context
from ansible.module_utils.common.collections import ImmutableDict
from ansible.parsing.vault import VaultSecret

from ansible_collections.proxtalos.cluster.plugins.lookup import vault_password as plugin


@pytest.fixture
def cli(monkeypatch):
    def set_cli(**args):
        values = dict(vault_ids=[], vault_password_files=[], ask_vault_pass=False)
        values.update(args)
        monkeypatch.setattr(context, 'CLIARGS', ImmutableDict(values))
    monkeypatch.setattr(plugin.C.config, 'get_config_value', lambda name, *a, **k: None)
    monkeypatch.setattr(plugin.C, 'DEFAULT_VAULT_ENCRYPT_IDENTITY', None, raising=False)
    set_cli()
    return set_cli


def lookup(secrets):
    # ansible-playbook's secrets (CLI.setup_vault_secrets initialises the context once per process): set for this call
    saved = plugin.VaultSecretsContext._current  # pylint: disable=protected-access
    plugin.VaultSecretsContext._current = plugin.VaultSecretsContext(secrets)  # pylint: disable=protected-access
    try:
        return _run_lookup()
    finally:
        plugin.VaultSecretsContext._current = saved  # pylint: disable=protected-access


def _run_lookup():
    instance = plugin.LookupModule()
    instance.set_options = lambda **kwargs: None
    return instance.run([])


def test_the_prompted_password_is_returned_when_there_is_no_file(cli):
    cli(ask_vault_pass=True)
    assert lookup([('default', VaultSecret(b'typed at the prompt'))]) == ['typed at the prompt']


def test_nothing_when_a_password_file_exists_or_nothing_was_prompted(cli, tmp_path):
    password = tmp_path / 'vault-pass'
    password.write_text('from the file\n')
    cli(ask_vault_pass=True, vault_password_files=[str(password)])
    assert lookup([('default', VaultSecret(b'from the file'))]) == ['']
    cli()
    assert lookup([]) == ['']
    cli(ask_vault_pass=True)
    assert lookup([]) == ['']


def test_the_secret_ansible_vault_would_encrypt_with():
    secrets = [('dev', VaultSecret(b'dev-pass')), ('prod', VaultSecret(b'prod-pass'))]
    assert plugin.prompted_password(secrets) == 'dev-pass'
    assert plugin.prompted_password(secrets, encrypt_vault_id='prod') == 'prod-pass'
    assert plugin.prompted_password(secrets, encrypt_vault_id='nope') == ''
    assert plugin.prompted_password([]) == ''
