"""Day-two playbooks against one lab of their own (3 control planes + 2 workers, time scale 0), in order:

site.yml converges; etcd_backup three times with retention 2 (files 0600 in a 0700 folder, named by time, the two
newest kept, each a whole snapshot of the cluster's etcd); remove_node without its confirmation refused; remove_node
of a control plane refused while removing it would lose quorum (nothing changed: three etcd members, the Node still
there); remove_node of a worker (drain, Talos reset, Node and VM deleted), idempotent on a second run; then site.yml
with an inventory without that worker is green.
"""

import os
import stat
import sys

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_lab import PLAYBOOK_BIN, ROOT, Workspace, file_mode  # noqa: E402  pylint: disable=wrong-import-position,import-error

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client as talos_client  # noqa: E402
from lab.talos import etcd as lab_etcd  # noqa: E402  pylint: disable=wrong-import-position
from lab.testing import start_lab  # noqa: E402  pylint: disable=wrong-import-position

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ETCD_BACKUP = os.path.join(ROOT, 'playbooks', 'etcd_backup.yml')
REMOVE_NODE = os.path.join(ROOT, 'playbooks', 'remove_node.yml')
CONTROL_PLANES = ('lab-cp-1', 'lab-cp-2', 'lab-cp-3')


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    if not os.access(PLAYBOOK_BIN, os.X_OK):
        pytest.skip('no ansible-playbook in .venv (make setup)')
    folder = str(tmp_path_factory.mktemp('day-two'))
    lab = start_lab(os.path.join(folder, 'lab'), control_planes=3, workers=2)
    try:
        space = Workspace(lab, folder)
        first = space.run(label='site')
        assert first.ok, first.explain()
        yield space
    finally:
        lab.stop()


def inventory_hosts(space):
    with open(os.path.join(space.inventory, 'hosts.yml'), encoding='utf-8') as handle:
        return yaml.safe_load(handle)


def etcd_members(space):
    credentials = talos_client.TalosCredentials.from_talosconfig(yaml.safe_load(open(space.talosconfig, encoding='utf-8')))
    address = inventory_hosts(space)['cluster']['children']['controlplane']['hosts']['lab-cp-1']['node_ip']
    with talos_client.TalosClient(address, credentials=credentials, timeout=10) as talos:
        return talos.etcd_member_list()


def node_names(space):
    api = space.k8s()
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    return sorted(node.metadata.name for node in client.CoreV1Api(api).list_node().items)


def test_etcd_backup_writes_0600_snapshots_and_keeps_the_newest(workspace):
    folder = os.path.join(workspace.folder, 'backups')
    paths = []
    for attempt in range(3):
        run = workspace.run(label='etcd-backup-%d' % attempt, playbook=ETCD_BACKUP,
                            extra_vars={'etcd_backup_dir': folder, 'etcd_backup_retention': 2})
        assert run.ok, run.explain()
        result = run.results(task='Snapshot etcd')[0][3]
        assert result['changed'] and os.path.isfile(result['path']), result
        paths.append(result['path'])
    assert file_mode(folder) == 0o700
    kept = sorted(os.listdir(folder))
    # named by time (UTC), the two newest kept, the oldest deleted by the third run
    assert kept == sorted(os.path.basename(path) for path in paths[1:]) and all(name.startswith('lab-') for name in kept)
    assert not os.path.exists(paths[0])
    for name in kept:
        path = os.path.join(folder, name)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with open(path, 'rb') as handle:
            document = lab_etcd.read_snapshot(handle.read())
        assert sorted(m['hostname'] for m in document['members']) == sorted(CONTROL_PLANES)

    check = workspace.run('--check', label='etcd-backup-check', playbook=ETCD_BACKUP,
                          extra_vars={'etcd_backup_dir': folder, 'etcd_backup_retention': 2})
    assert check.ok, check.explain()
    predicted = check.results(task='Snapshot etcd')[0][3]
    assert predicted['removed'] == [os.path.join(folder, kept[0])] and sorted(os.listdir(folder)) == kept


def test_remove_node_needs_its_confirmation(workspace):
    run = workspace.run(label='remove-unconfirmed', playbook=REMOVE_NODE, extra_vars={'remove_node': 'lab-w-2'})
    assert not run.ok
    assert any('confirm_remove_node' in message for _s, _t, _h, message in run.failures()), run.explain()
    assert 'lab-w-2' in node_names(workspace)


def test_remove_node_of_a_control_plane_is_refused_when_quorum_would_be_lost(workspace):
    workspace.lab.fault('talos-etcd-unhealthy', 'lab-cp-2')
    try:
        run = workspace.run(label='remove-cp-refused', playbook=REMOVE_NODE,
                            extra_vars={'remove_node': 'lab-cp-1', 'confirm_remove_node': 'lab-cp-1'})
    finally:
        workspace.lab.clear('talos-etcd-unhealthy', 'lab-cp-2')
    assert not run.ok
    messages = [message for _s, task, _h, message in run.failures() if 'keeps quorum' in task]
    assert messages, run.explain()
    assert 'refusing to remove the etcd member of lab-cp-1' in messages[0] and 'would lose quorum' in messages[0]
    assert 'lab-cp-2 not healthy' in messages[0] and 'quorum needs 2' in messages[0]
    assert not run.changed()
    assert len(etcd_members(workspace)) == 3 and 'lab-cp-1' in node_names(workspace)


def test_remove_a_worker_then_site_without_it_is_green(workspace):
    extra = {'remove_node': 'lab-w-2', 'confirm_remove_node': 'lab-w-2'}
    run = workspace.run(label='remove-w-2', playbook=REMOVE_NODE, extra_vars=extra)
    assert run.ok, run.explain()
    changed = set(task for _s, task, _h in run.changed())
    assert {'Cordon and drain the Kubernetes Node', 'Remove the etcd member (control plane) and reset Talos',
            'Delete the Kubernetes Node object', 'Delete the VM and its disks'} <= changed, changed
    assert 'lab-w-2' not in node_names(workspace)
    vm_ids = [vm.get('vmid') for vm in workspace.lab.vms()]
    worker = inventory_hosts(workspace)['cluster']['children']['worker']['hosts']['lab-w-2']
    assert worker['vm_id'] not in vm_ids

    again = workspace.run(label='remove-w-2-again', playbook=REMOVE_NODE, extra_vars=extra)
    assert again.ok and not again.changed(), again.explain()

    hosts = inventory_hosts(workspace)
    del hosts['cluster']['children']['worker']['hosts']['lab-w-2']
    with open(os.path.join(workspace.inventory, 'hosts.yml'), 'w', encoding='utf-8') as handle:
        yaml.safe_dump(hosts, handle)
    site = workspace.run(label='site-without-w-2')
    assert site.ok, site.explain()
    assert node_names(workspace) == ['lab-cp-1', 'lab-cp-2', 'lab-cp-3', 'lab-w-1']
