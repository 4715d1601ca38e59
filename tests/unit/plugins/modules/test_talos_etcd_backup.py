"""talos_etcd_backup: file names by UTC time, which files retention deletes, and that other files are left alone."""
import datetime

from ansible_collections.proxtalos.cluster.plugins.modules import talos_etcd_backup


def test_names_sort_by_time():
    first = talos_etcd_backup.snapshot_name('lab', datetime.datetime(2026, 11, 27, 9, 5, 3, tzinfo=datetime.timezone.utc))
    second = talos_etcd_backup.snapshot_name('lab', datetime.datetime(2026, 11, 27, 10, 0, 0, tzinfo=datetime.timezone.utc))
    assert first == 'lab-20261127T090503Z.snapshot' and sorted([second, first]) == [first, second]


def test_retention_keeps_the_newest_of_the_prefix_only(tmp_path):
    names = ['lab-20261127T0%d0000Z.snapshot' % hour for hour in range(1, 6)]
    for name in names + ['lab-notes.txt', 'other-20261127T010000Z.snapshot', '.lab-20261127T070000Z.snapshot.partial']:
        (tmp_path / name).write_bytes(b'x')
    found = talos_etcd_backup.existing_snapshots(str(tmp_path), 'lab')
    assert found == names
    assert talos_etcd_backup.to_remove(found, 2) == names[:3]
    assert talos_etcd_backup.to_remove(found, 5) == [] and talos_etcd_backup.to_remove(found, 9) == []
    assert talos_etcd_backup.existing_snapshots(str(tmp_path / 'missing'), 'lab') == []


class _SnapshotSession(object):
    """What write_snapshot calls: etcd_snapshot streams the snapshot into a file handle."""
    data = b'etcd snapshot bytes \x00\x01' * 100

    def call(self, method, handle):
        assert method == 'etcd_snapshot'
        handle.write(self.data)
        return {'size': len(self.data), 'sha256': 'x'}


def test_a_snapshot_with_a_vault_password_is_a_vault_envelope_ansible_vault_opens(tmp_path):
    """Decrypted with ansible-core's own VaultLib, not the collection's code."""
    from ansible.parsing.vault import VaultLib, VaultSecret  # pylint: disable=import-outside-toplevel
    dest = tmp_path / 'etcd-backups'
    dest.mkdir(mode=0o755)
    talos_etcd_backup.write_snapshot(_SnapshotSession(), str(dest), 'lab.snapshot', 'correct horse')
    written = (dest / 'lab.snapshot').read_bytes()
    assert written.startswith(b'$ANSIBLE_VAULT;1.1;AES256\n') and _SnapshotSession.data not in written
    vault = VaultLib([('default', VaultSecret(b'correct horse'))])
    assert vault.decrypt(written) == _SnapshotSession.data
    # the file 0600, and a folder that was there already tightened to 0700
    assert (dest / 'lab.snapshot').stat().st_mode & 0o777 == 0o600
    assert dest.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in dest.iterdir()] == ['lab.snapshot']


def test_a_snapshot_without_a_password_is_the_snapshot(tmp_path):
    talos_etcd_backup.write_snapshot(_SnapshotSession(), str(tmp_path / 'new'), 'lab.snapshot')
    assert (tmp_path / 'new' / 'lab.snapshot').read_bytes() == _SnapshotSession.data
    assert (tmp_path / 'new').stat().st_mode & 0o777 == 0o700
