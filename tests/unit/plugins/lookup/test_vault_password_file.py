"""The vault_password_file lookup: ansible-playbook's order of vault sources, files found, prompts warned about."""
import json
import os
import subprocess

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


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
# PROXTALOS_ANSIBLE_PLAYBOOK (as tests/integration/test_oldest_core.py) runs the play on another ansible-core.
ANSIBLE_PLAYBOOK = os.environ.get('PROXTALOS_ANSIBLE_PLAYBOOK') or os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_ansible_playbooks_own_command_line_reaches_the_lookup(tmp_path):
    # the real context.CLIARGS of ansible-playbook (its keys vault_ids and vault_password_files), not a stand-in
    password = tmp_path / 'vault-pass'
    password.write_text('s3cret\n')
    labelled = tmp_path / 'labelled-pass'
    labelled.write_text('other\n')
    playbook = tmp_path / 'play.yml'
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n    - ansible.builtin.copy:\n"
                        "        content: \"{{ lookup('proxtalos.cluster.vault_password_file') | to_json }}\"\n"
                        "        dest: \"{{ out }}\"\n        mode: '0600'\n")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_LOCAL_TEMP=str(tmp_path / 'tmp'))
    for name in ('ANSIBLE_VAULT_PASSWORD_FILE', 'ANSIBLE_VAULT_IDENTITY_LIST', 'ANSIBLE_CALLBACKS_ENABLED'):
        env.pop(name, None)
    for options, expected in ((['--vault-password-file', str(password)], password),
                              (['--vault-id', 'ops@%s' % labelled, '--vault-password-file', str(password)], labelled)):
        out = tmp_path / 'out.json'
        done = subprocess.run([ANSIBLE_PLAYBOOK, '-i', 'localhost,', '-c', 'local', str(playbook), '-e', 'out=%s' % out,
                               '-e', 'ansible_python_interpreter={{ ansible_playbook_python }}']
                              + options, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        assert json.loads(out.read_text()) == str(expected)
