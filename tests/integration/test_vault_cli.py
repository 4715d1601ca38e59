"""A vault password given on the ansible-playbook command line reaches the roles: the secrets bundle is vault-encrypted.

Before, the roles saw only the vault_password_file setting (lookup config DEFAULT_VAULT_PASSWORD_FILE), and a run
with --vault-password-file kept the bundle in plain text. Runs `--tags secrets` for the control planes (they have a
static node_ip, so no VM is needed), with the bundle and artifacts in the test's own folder.

With only a prompted password, every file the run writes is scanned for private keys in clear (the machine configs
and the talosconfig were written in clear before); proxtalos_artifacts_in_clear opts out. Without
proxtalos_artifacts_dir the artifacts and the report go next to the inventory.
"""
import json
import os
import re
import shutil
import stat
import subprocess

import pytest
from ansible.parsing.vault import VaultLib, VaultSecret

from ansible_collections.proxtalos.cluster.tests.integration.key_scan import files_with_private_keys, private_keys
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


def prompted_run(lab, tmp_path, *args, extra=None):
    """ansible-playbook --tags secrets with only --ask-vault-pass (read from stdin when it is not a terminal)."""
    values = dict(extra_vars(tmp_path), **(extra or {}))
    command = [PLAYBOOK_BIN, SITE, '-i', str(lab.inventory_dir), '--tags', 'secrets', '--limit', 'controlplane',
               '--ask-vault-pass', '-v', '-e', json.dumps(values)] + list(args)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1')
    done = subprocess.run(command, cwd=ROOT, env=env, input=PASSWORD + '\n', capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = ' '.join((done.stdout + done.stderr).split())
    assert 'written unencrypted' not in output and PASSWORD not in output
    return done


def recap_changed(done):
    """The changed= count of the run's recap, summed over its hosts."""
    counts = re.findall(r'\bchanged=(\d+)', done.stdout.split('PLAY RECAP', 1)[-1])
    assert counts, done.stdout[-2000:]
    return sum(int(count) for count in counts)


def key_files(artifacts):
    """The artifacts that hold private keys: the machine configs and the talosconfig (not the run report)."""
    return sorted(name for name in os.listdir(str(artifacts)) if name.endswith('.yaml') or name == 'talosconfig')


def opened(path):
    """The plaintext of a vault envelope written with the typed password (it must be one)."""
    data = path.read_bytes()
    assert data.startswith(b'$ANSIBLE_VAULT;1.1;AES256'), (path, data[:40])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    return VaultLib([('default', VaultSecret(PASSWORD.encode()))]).decrypt(data)


def test_a_password_typed_at_the_prompt_encrypts_the_bundle_with_it(clean_lab, tmp_path):
    """Only --ask-vault-pass (the guide's prompt, no file a module could read): no private key is written in clear -
    the bundle is vault-encrypted with the typed password, which no output shows."""
    prompted_run(clean_lab, tmp_path)
    path = tmp_path / 'secrets' / 'talos-secrets.yaml'
    bundle = path.read_bytes()
    plain = opened(path)
    assert b'certs:' in plain and b'trustdinfo:' in plain
    # the machine configs were rendered from the encrypted bundle, and a second run keeps it as it is
    assert (tmp_path / 'artifacts' / 'lab-cp-1.yaml').exists()
    again = prompted_run(clean_lab, tmp_path)
    assert path.read_bytes() == bundle, again.stdout[-3000:] + again.stderr[-3000:]


def test_a_prompted_password_run_writes_no_private_key_in_clear_anywhere(clean_lab, tmp_path):
    """Every file the run wrote - the bundle, each control plane's machine config (the cluster's CA keys) and the
    talosconfig (the admin client key) - holds no private key in clear: they are vault envelopes with the typed
    password (before, the configs and the talosconfig were written in clear). A second run changes nothing. (Check
    mode stops at the vms stage here - the lab has no VMs - so its prediction is the modules' unit tests'.)"""
    prompted_run(clean_lab, tmp_path)
    assert files_with_private_keys(tmp_path) == {}
    artifacts = tmp_path / 'artifacts'
    written = key_files(artifacts)
    assert 'talosconfig' in written and 'lab-cp-1.yaml' in written, written
    for name in written:
        # each holds keys once opened: the scan above would have found them in clear
        assert private_keys(opened(artifacts / name)), name
    envelopes = dict((name, (artifacts / name).read_bytes()) for name in written)
    assert recap_changed(prompted_run(clean_lab, tmp_path)) == 0
    assert dict((name, (artifacts / name).read_bytes()) for name in written) == envelopes


def test_the_opt_in_writes_the_artifacts_in_clear_and_leaving_it_encrypts_them(clean_lab, tmp_path):
    """proxtalos_artifacts_in_clear: true - the machine configs and the talosconfig in clear (0600), the bundle still
    encrypted. Then without it the run encrypts them (the same content); the next run changes nothing."""
    prompted_run(clean_lab, tmp_path, extra={'proxtalos_artifacts_in_clear': True})
    artifacts = tmp_path / 'artifacts'
    in_clear = files_with_private_keys(tmp_path)
    assert 'artifacts/lab-cp-1.yaml' in in_clear and 'artifacts/talosconfig' in in_clear, in_clear
    assert sorted(in_clear) == ['artifacts/' + name for name in key_files(artifacts)], in_clear
    assert set(in_clear.values()) == {'0o600'}, in_clear
    assert opened(tmp_path / 'secrets' / 'talos-secrets.yaml')
    assert recap_changed(prompted_run(clean_lab, tmp_path, extra={'proxtalos_artifacts_in_clear': True})) == 0

    before = dict((name, (artifacts / name).read_bytes()) for name in key_files(artifacts))
    assert recap_changed(prompted_run(clean_lab, tmp_path)) > 0
    assert files_with_private_keys(tmp_path) == {}
    for name in before:
        assert opened(artifacts / name) == before[name], name   # the same content, now encrypted
    assert recap_changed(prompted_run(clean_lab, tmp_path)) == 0


def test_without_proxtalos_artifacts_dir_the_artifacts_and_the_report_go_next_to_the_inventory(clean_lab, tmp_path):
    """Run from a folder outside the repository, with no proxtalos_artifacts_dir: the machine configs, the talosconfig
    and the timeline report go to <inventory folder>/artifacts/<cluster_name> (before: artifacts/ beside the
    playbooks' folder - the repository, or an installed collection)."""
    target = os.path.join(str(clean_lab.inventory_dir), 'artifacts')
    shutil.rmtree(target, ignore_errors=True)
    command = [PLAYBOOK_BIN, SITE, '-i', str(clean_lab.inventory_dir), '--tags', 'secrets', '--limit', 'controlplane',
               '-e', json.dumps({'talos_machines_secrets_path': str(tmp_path / 'secrets' / 'talos-secrets.yaml')})]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1')
    done = subprocess.run(command, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600, check=False)
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        written = sorted(os.listdir(os.path.join(target, 'lab')))
        for name in ('lab-cp-1.yaml', 'talosconfig', 'report.json'):
            assert name in written, written
        assert not os.path.exists(str(tmp_path / 'artifacts'))
    finally:
        shutil.rmtree(target, ignore_errors=True)
