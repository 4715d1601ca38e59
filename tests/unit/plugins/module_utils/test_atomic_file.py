"""_atomic_file: a file replaced in one rename, created with its mode, and the temporaries of killed writers removed by
the next write of the same path (the interrupted-runs integration test found a killed run's `.kubeconfig.*` left)."""
import os
import stat
import subprocess
import sys

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _atomic_file


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def finished_pid():
    """The id of a process that has ended (its number is not reused within a test)."""
    child = subprocess.Popen([sys.executable, '-c', 'pass'])
    child.wait()
    return child.pid


def test_a_new_file_has_its_content_and_mode_and_no_temporary_is_left(tmp_path):
    path = tmp_path / 'secrets' / 'kubeconfig'
    _atomic_file.write_atomically(str(path), 'apiVersion: v1\n')
    assert path.read_bytes() == b'apiVersion: v1\n'
    assert mode_of(path) == 0o600
    assert mode_of(path.parent) == 0o700
    assert sorted(os.listdir(path.parent)) == ['kubeconfig']


def test_the_mode_given_is_the_mode_written(tmp_path):
    path = tmp_path / 'sealed.yaml'
    _atomic_file.write_atomically(str(path), b'kind: SealedSecret\n', mode=0o644)
    assert mode_of(path) == 0o644


def test_a_killed_writers_temporary_is_removed_by_the_next_write_and_a_running_writers_is_kept(tmp_path):
    path = tmp_path / 'kubeconfig'
    dead = tmp_path / (_atomic_file.temporary_prefix(str(path), pid=finished_pid()) + 'ne122xfb')
    running = tmp_path / (_atomic_file.temporary_prefix(str(path), pid=os.getppid()) + 'a1b2c3d4')
    others = [
        tmp_path / '.kubeconfig.bak',
        tmp_path / ('.kubeconfig.%d.backup' % finished_pid()),                          # a user's file, not mkstemp's
        tmp_path / ('.kubeconfig.another-host.%d.q1w2e3r4' % finished_pid()),           # another host's writer
        tmp_path / (_atomic_file.temporary_prefix(str(tmp_path / 'talosconfig'), pid=finished_pid()) + 'zz9y8x7w'),
        tmp_path / 'kubeconfig.1',
    ]
    for leftover in [dead, running] + others:
        leftover.write_text('partial')
    assert _atomic_file.stale_temporaries(str(path)) == [str(dead)]

    _atomic_file.write_atomically(str(path), 'new')

    assert path.read_text() == 'new'
    assert not dead.exists()
    assert running.exists() and all(other.exists() for other in others)


def test_a_failed_write_removes_its_own_temporary_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / 'talosconfig'
    path.write_text('old')

    def refuse(_source, _target):
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(_atomic_file.os, 'replace', refuse)
    with pytest.raises(OSError, match='No space left'):
        _atomic_file.write_atomically(str(path), 'new')
    assert path.read_text() == 'old'
    assert os.listdir(tmp_path) == ['talosconfig']


def test_the_temporary_name_carries_the_target_the_host_and_the_writer(tmp_path, monkeypatch):
    monkeypatch.setattr(_atomic_file.socket, 'gethostname', lambda: 'ctl.lab.internal')
    prefix = _atomic_file.temporary_prefix(str(tmp_path / 'sealed-secrets.key'), pid=4242)
    assert prefix == '.sealed-secrets.key.ctl-lab-internal.4242.'
