"""_talos/files.py Artifacts: the files a module renders, kept in clear or as vault envelopes, compared by content."""
import os
import stat

from ansible.parsing.vault import VaultLib, VaultSecret

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import files


def test_with_a_password_the_file_is_an_envelope_read_back_as_its_text(tmp_path):
    path = str(tmp_path / 'talosconfig')
    artifacts = files.Artifacts('typed')
    assert artifacts.read(path) == (None, False)
    assert artifacts.needs_write(path, None, False, 'key: x\n') is True
    files.write_private(path, artifacts.encode('key: x\n'))
    with open(path, 'rb') as handle:
        data = handle.read()
    assert data.startswith(b'$ANSIBLE_VAULT;1.1;AES256') and b'key' not in data
    assert VaultLib([('default', VaultSecret(b'typed'))]).decrypt(data) == b'key: x\n'
    assert artifacts.read(path) == ('key: x\n', True)
    assert artifacts.needs_write(path, 'key: x\n', True, 'key: x\n') is False
    assert artifacts.needs_write(path, 'key: x\n', True, 'key: y\n') is True
    os.chmod(path, 0o644)
    assert artifacts.needs_write(path, 'key: x\n', True, 'key: x\n') is True


def test_without_a_password_an_envelope_is_rewritten_in_clear_and_one_no_password_opens_is_unreadable(tmp_path):
    path = str(tmp_path / 'cp-1.yaml')
    files.write_private(path, files.Artifacts('typed').encode('key: x\n'))
    clear = files.Artifacts(None, read_passwords=['typed'])
    assert clear.read(path) == ('key: x\n', True)
    assert clear.needs_write(path, 'key: x\n', True, 'key: x\n') is True   # the same text, but encrypted
    files.write_private(path, clear.encode('key: x\n'))
    assert clear.read(path) == ('key: x\n', False) and clear.needs_write(path, 'key: x\n', False, 'key: x\n') is False
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # a password that no longer opens it: the file is rewritten, never an error
    files.write_private(path, files.Artifacts('another').encode('key: x\n'))
    assert files.Artifacts('typed').read(path) == (None, True)
    # a clear file where an envelope is wanted
    files.write_private(path, 'key: x\n')
    assert files.Artifacts('typed').needs_write(path, 'key: x\n', False, 'key: x\n') is True
