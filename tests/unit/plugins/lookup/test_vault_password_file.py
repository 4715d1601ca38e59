"""The vault_password_file lookup: ansible-playbook's order of vault sources, files found, prompts warned about."""
import pytest
import yaml

from ansible import context
from ansible.module_utils.common.collections import ImmutableDict
from ansible.utils.display import Display

from ansible_collections.proxtalos.cluster.plugins.lookup import vault_password_file as plugin


def test_sources_follow_ansible_playbooks_order():
    sources = plugin.vault_sources(cli_vault_ids=['prod@/cli/prod', '/cli/plain'], cli_password_files=['/cli/file'],
                                   ask_vault_pass=True, identity_list=['cfg@/cfg/id'], password_file='/cfg/file')
    assert sources == [('cfg', '/cfg/id'), ('prod', '/cli/prod'), (None, '/cli/plain'), (None, '/cli/file'),
                       (None, '/cfg/file'), (None, 'prompt_ask_vault_pass')]
    assert plugin.vault_sources() == []


def test_the_first_existing_file_wins_and_relative_paths_are_from_the_current_directory(tmp_path):
    existing = {str(tmp_path / 'second'), str(tmp_path / 'rel')}
    found = plugin.choose([('a', str(tmp_path / 'missing')), ('b', 'prompt'), (None, str(tmp_path / 'second')),
                           (None, str(tmp_path / 'rel'))], exists=existing.__contains__)
    assert found == (str(tmp_path / 'second'), ['--vault-id b@prompt'])
    assert plugin.choose([(None, 'rel')], exists=existing.__contains__, cwd=str(tmp_path)) == (str(tmp_path / 'rel'), [])
    assert plugin.choose([(None, 'prompt_ask_vault_pass')]) == ('', ['--ask-vault-pass'])


@pytest.fixture
def cli(monkeypatch):
    """Set the command line the lookup sees (context.CLIARGS) and the vault settings of the configuration."""
    settings = {'DEFAULT_VAULT_IDENTITY_LIST': [], 'DEFAULT_VAULT_PASSWORD_FILE': None}
    real_get = plugin.C.config.get_config_value
    monkeypatch.setattr(plugin.C.config, 'get_config_value',
                        lambda name, *args, **kwargs: settings[name] if name in settings else real_get(name, *args, **kwargs))
    warnings = []
    monkeypatch.setattr(Display, 'warning', lambda self, msg, *args, **kwargs: warnings.append(msg))

    def set_cli(**args):
        values = dict(vault_ids=[], vault_password_files=[], ask_vault_pass=False)
        values.update(args)
        monkeypatch.setattr(context, 'CLIARGS', ImmutableDict(values))
    set_cli()
    set_cli.settings = settings
    set_cli.warnings = warnings
    return set_cli


def lookup(**options):
    """Run the lookup with its options declared from its DOCUMENTATION, as the plugin loader does."""
    instance = plugin.LookupModule()
    instance._load_name = 'proxtalos.cluster.vault_password_file'  # pylint: disable=protected-access
    definitions = yaml.safe_load(plugin.DOCUMENTATION)['options']
    plugin.C.config.initialize_plugin_configuration_definitions('lookup', instance._load_name, definitions)  # pylint: disable=protected-access
    return instance.run([], variables={}, **options)


def test_a_password_file_given_on_the_command_line_is_returned(cli, tmp_path):
    password = tmp_path / 'vault-pass'
    password.write_text('s3cret\n')
    cli(vault_password_files=[str(password)])
    assert lookup() == [str(password)] and cli.warnings == []
    cli(vault_ids=['lab@%s' % password])
    assert lookup() == [str(password)]


def test_the_configured_file_is_returned_after_the_command_line(cli, tmp_path):
    configured, given = tmp_path / 'configured', tmp_path / 'given'
    configured.write_text('a\n')
    given.write_text('b\n')
    cli.settings['DEFAULT_VAULT_PASSWORD_FILE'] = str(configured)
    assert lookup() == [str(configured)]
    cli(vault_password_files=[str(given)])
    assert lookup() == [str(given)]


def test_no_vault_password_gives_an_empty_string_quietly(cli):
    assert lookup() == [''] and cli.warnings == []


def test_a_prompt_only_password_warns_that_the_file_stays_plain(cli, tmp_path):
    cli(ask_vault_pass=True)
    assert lookup(purpose='the Talos secrets bundle') == ['']
    assert len(cli.warnings) == 1
    warning = cli.warnings[0]
    assert '--ask-vault-pass' in warning and 'the Talos secrets bundle is written unencrypted (mode 0600)' in warning
    assert '--vault-password-file' in warning
    cli(vault_ids=['prod@prompt'])
    assert lookup() == [''] and '--vault-id prod@prompt' in cli.warnings[1]
    # A prompt and a file: the file is used, no warning.
    password = tmp_path / 'vault-pass'
    password.write_text('x\n')
    cli(ask_vault_pass=True, vault_password_files=[str(password)])
    assert lookup() == [str(password)] and len(cli.warnings) == 2
