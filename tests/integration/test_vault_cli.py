"""A vault password given on the ansible-playbook command line reaches the roles: the secrets bundle is vault-encrypted.

Before, the roles saw only the vault_password_file setting (lookup config DEFAULT_VAULT_PASSWORD_FILE), and a run
with --vault-password-file kept the bundle in plain text. Runs `--tags secrets` for the control planes (they have a
static node_ip, so no VM is needed), with the bundle and artifacts in the test's own folder.
"""
import json
import os
import stat
import subprocess

import pytest
from ansible.parsing.vault import VaultLib, VaultSecret

from ansible_collections.proxtalos.cluster.tests.integration.pve_playbook import PLAYBOOK_BIN, ROOT, SITE, run_playbook

pytestmark = [pytest.mark.lab,
              pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')]

PASSWORD = 'correct horse battery staple'


def extra_vars(tmp_path):
    return {'talos_machines_secrets_path': str(tmp_path / 'secrets' / 'talos-secrets.yaml'),
            'proxtalos_artifacts_dir': str(tmp_path / 'artifacts')}


def secrets_run(lab, tmp_path, *args):
    return run_playbook(lab.inventory_dir, '--tags', 'secrets', '--limit', 'controlplane', *args,
                        extra_vars=extra_vars(tmp_path))


def test_a_vault_password_file_on_the_command_line_encrypts_the_bundle(clean_lab, tmp_path):
    password_file = tmp_path / 'vault-pass'
    password_file.write_text(PASSWORD + '\n')
    bundle = tmp_path / 'secrets' / 'talos-secrets.yaml'

    run = secrets_run(clean_lab, tmp_path, '--vault-password-file', str(password_file))
    assert run.rc == 0 and run.failed == 0, run.describe()
    created = run.results('Secrets bundle')[0][2]
    assert created['changed'] is True and created['encrypted'] is True
    data = bundle.read_bytes()
    assert data.startswith(b'$ANSIBLE_VAULT;1.1;AES256')
    assert stat.S_IMODE(os.stat(bundle).st_mode) == 0o600
    plain = VaultLib([('default', VaultSecret(PASSWORD.encode()))]).decrypt(data)
    assert b'certs:' in plain and b'trustdinfo:' in plain
    # The machine configs were rendered from the encrypted bundle in the same run.
    assert (tmp_path / 'artifacts' / 'lab-cp-1.yaml').exists()

    # The same password through --vault-id: the bundle is opened, kept as it is.
    again = secrets_run(clean_lab, tmp_path, '--vault-id', 'lab@%s' % password_file)
    assert again.rc == 0 and again.changed == 0, again.describe()
    assert bundle.read_bytes() == data


def test_without_a_vault_password_the_bundle_stays_plain_and_nothing_warns(clean_lab, tmp_path):
    run = secrets_run(clean_lab, tmp_path)
    assert run.rc == 0, run.describe()
    bundle = (tmp_path / 'secrets' / 'talos-secrets.yaml').read_bytes()
    assert not bundle.startswith(b'$ANSIBLE_VAULT') and b'certs:' in bundle
    assert 'vault password was given only at a prompt' not in run.stderr


def test_a_password_typed_at_the_prompt_encrypts_the_bundle_with_it(clean_lab, tmp_path):
    """Only --ask-vault-pass (the guide's prompt, no file a module could read): no private key is written in clear -
    the bundle is vault-encrypted with the typed password, which no output shows."""
    # --ask-vault-pass reads the password from stdin when it is not a terminal.
    command = [PLAYBOOK_BIN, SITE, '-i', str(clean_lab.inventory_dir), '--tags', 'secrets', '--limit', 'controlplane',
               '--ask-vault-pass', '-v', '-e', json.dumps(extra_vars(tmp_path))]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1')

    def run():
        return subprocess.run(command, cwd=ROOT, env=env, input=PASSWORD + '\n', capture_output=True, text=True, timeout=600,
                              check=False)
    done = run()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = ' '.join((done.stdout + done.stderr).split())
    assert 'written unencrypted' not in output and PASSWORD not in output
    path = tmp_path / 'secrets' / 'talos-secrets.yaml'
    bundle = path.read_bytes()
    assert bundle.startswith(b'$ANSIBLE_VAULT;1.1;AES256'), bundle[:40]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    plain = VaultLib([('default', VaultSecret(PASSWORD.encode()))]).decrypt(bundle)
    assert b'certs:' in plain and b'trustdinfo:' in plain
    # the machine configs were rendered from the encrypted bundle, and a second run keeps it as it is
    assert (tmp_path / 'artifacts' / 'lab-cp-1.yaml').exists()
    again = run()
    assert again.returncode == 0 and path.read_bytes() == bundle, again.stdout[-3000:] + again.stderr[-3000:]
