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
