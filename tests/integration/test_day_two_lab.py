"""Day-two playbooks against one lab of their own (3 control planes + 2 workers, time scale 0), in order:

site.yml converges; etcd_backup three times with retention 2 (files 0600 in a 0700 folder, named by time, the two
newest kept, each a whole snapshot of the cluster's etcd); remove_node without its confirmation refused; remove_node
of a control plane refused while removing it would lose quorum (nothing changed: three etcd members, the Node still
there); remove_node of a worker (drain, Talos reset, Node and VM deleted), idempotent on a second run, and of a
control plane (its etcd member gone); then site.yml with an inventory without the worker is green and builds the
control plane again (a rebuild); the cluster runs Talos v1.12.11 until upgrade_talos to v1.13.9, refused by Talos while
an etcd member is unhealthy (the drained Node made schedulable again), then node by node (every node on it, a second
run changes nothing), then to v1.13.8 with a worker whose reboot hangs: the run stops naming it; destroy refused
without its confirmation, predicted in check mode, then every VM deleted with the kept secrets left in place, and
those removed only when asked.
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
DESTROY = os.path.join(ROOT, 'playbooks', 'destroy.yml')
UPGRADE = os.path.join(ROOT, 'playbooks', 'upgrade_talos.yml')
CONTROL_PLANES = ('lab-cp-1', 'lab-cp-2', 'lab-cp-3')
WORKERS = ('lab-w-1', 'lab-w-2')
START = 'v1.12.11'     # the Talos the cluster is built with
TARGET = 'v1.13.9'     # what upgrade_talos brings it to
OTHER = 'v1.13.8'      # a release the hung-reboot upgrade aims at (back within v1.13)


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    if not os.access(PLAYBOOK_BIN, os.X_OK):
        pytest.skip('no ansible-playbook in .venv (make setup)')
    folder = str(tmp_path_factory.mktemp('day-two'))
    lab = start_lab(os.path.join(folder, 'lab'), control_planes=3, workers=2)
    try:
        space = Workspace(lab, folder)
        # the cluster starts on Talos v1.12 (its ISO and installer), so that upgrade_talos goes to v1.13.9 as a user's
        # cluster would; the lab's nodes behave as the release they run (lab/talos/versions.py)
        os.makedirs(os.path.join(space.inventory, 'host_vars'), exist_ok=True)
        for host in CONTROL_PLANES + WORKERS:
            with open(os.path.join(space.inventory, 'host_vars', '%s.yml' % host), 'w', encoding='utf-8') as handle:
                yaml.safe_dump({'talos_version': START}, handle)
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


def test_remove_a_worker_and_a_control_plane_then_site_is_green(workspace):
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

    control_plane = workspace.run(label='remove-cp-3', playbook=REMOVE_NODE,
                                  extra_vars={'remove_node': 'lab-cp-3', 'confirm_remove_node': 'lab-cp-3'})
    assert control_plane.ok, control_plane.explain()
    removal = control_plane.results(task='Remove the etcd member')[0][3]
    assert removal['removed_by'] == 'leave' and removal['reset'] and removal['member']['hostname'] == 'lab-cp-3', removal
    assert sorted(m['hostname'] for m in etcd_members(workspace)) == ['lab-cp-1', 'lab-cp-2']
    assert 'lab-cp-3' not in node_names(workspace)

    hosts = inventory_hosts(workspace)
    del hosts['cluster']['children']['worker']['hosts']['lab-w-2']
    with open(os.path.join(workspace.inventory, 'hosts.yml'), 'w', encoding='utf-8') as handle:
        yaml.safe_dump(hosts, handle)
    # lab-cp-3 stays in the inventory (site.yml's preflight wants an odd number of control planes): site.yml builds
    # it again, and it joins etcd as a new member
    site = workspace.run(label='site-without-w-2')
    assert site.ok, site.explain()
    assert node_names(workspace) == ['lab-cp-1', 'lab-cp-2', 'lab-cp-3', 'lab-w-1']
    assert sorted(m['hostname'] for m in etcd_members(workspace)) == list(CONTROL_PLANES)


def talos_versions(space):
    return dict((node['name'], node['talos_version']) for node in space.lab.status()['talos']['nodes'] if node['name'])


def test_upgrade_talos_node_by_node(workspace):
    workspace.lab.fault('talos-etcd-unhealthy', 'lab-cp-2')
    try:
        refused = workspace.run(label='upgrade-refused', playbook=UPGRADE, extra_vars={'talos_version': TARGET})
    finally:
        workspace.lab.clear('talos-etcd-unhealthy', 'lab-cp-2')
    assert not refused.ok
    failures = refused.failures()
    # Talos' ValidateForUpgrade (internal/pkg/etcd/etcd.go:95-121): every member must be healthy
    # the upgrade task's own failure (ignored, the jsonl callback does not say so) then the task that stops the run
    assert set(f[2] for f in failures) == {'lab-cp-1'} and failures[-1][1] == 'Stop the upgrade at this node', refused.explain()
    assert 'is not healthy; all members must be healthy to perform an upgrade' in failures[-1][3]
    assert set(talos_versions(workspace).values()) == {START}
    # refused before it started: the drained Node is schedulable again
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    assert not client.CoreV1Api(workspace.k8s()).read_node('lab-cp-1').spec.unschedulable

    target = {'talos_version': TARGET}
    run = workspace.run(label='upgrade-1', playbook=UPGRADE, extra_vars=target)
    assert run.ok, run.explain()
    upgraded = [host for _s, task, host in run.changed() if task.startswith('Upgrade Talos and wait')]
    # one at a time, control planes first (serial: 1 for both plays here)
    assert upgraded == ['lab-cp-1', 'lab-cp-2', 'lab-cp-3', 'lab-w-1'], upgraded
    assert set(talos_versions(workspace).values()) == {TARGET}, talos_versions(workspace)
    running = dict((node['name'], node['version']) for node in workspace.lab.status()['talos']['nodes'] if node['name'])
    assert set(running.values()) == {TARGET}, running
    again = workspace.run(label='upgrade-1-again', playbook=UPGRADE, extra_vars=target)
    assert again.ok and not again.changed(), again.explain()


def test_upgrade_talos_stops_at_the_first_node_that_does_not_come_back(workspace):
    workspace.lab.fault('talos-reboot-hang', 'lab-w-1')
    run = workspace.run(label='upgrade-hang', playbook=UPGRADE,
                        extra_vars={'talos_version': OTHER, 'upgrade_talos_timeout': 15, 'upgrade_talos_wait_sleep': 1})
    assert not run.ok
    failures = run.failures()
    assert set(f[2] for f in failures) == {'lab-w-1'} and failures[-1][1] == 'Stop the upgrade at this node', run.explain()
    assert 'lab-w-1' in failures[-1][3] and 'back on %s' % OTHER in failures[-1][3], failures[-1][3]
    versions = talos_versions(workspace)
    assert [versions[name] for name in CONTROL_PLANES] == [OTHER] * 3
    # the worker installed the image, and its reboot hangs: it never answered again
    worker = next(node for node in workspace.lab.status()['talos']['nodes'] if node['name'] == 'lab-w-1')
    assert worker['phase'] == 'hung' and worker['mode'] != 'configured', worker


def test_destroy_deletes_every_vm_and_the_kept_secrets_only_when_asked(workspace):
    refused = workspace.run(label='destroy-unconfirmed', playbook=DESTROY)
    assert not refused.ok and any('confirm_destroy=lab' in m for _s, _t, _h, m in refused.failures()), refused.explain()
    before = sorted(vm['vmid'] for vm in workspace.lab.vms())
    assert before
    check = workspace.run('--check', label='destroy-check', playbook=DESTROY, extra_vars={'confirm_destroy': 'lab'})
    assert check.ok, check.explain()
    assert sorted(vm['vmid'] for vm in workspace.lab.vms()) == before   # check mode deletes nothing
    run = workspace.run(label='destroy', playbook=DESTROY, extra_vars={'confirm_destroy': 'lab'})
    assert run.ok, run.explain()
    assert workspace.lab.vms() == []
    assert os.path.isfile(workspace.bundle) and os.path.isfile(workspace.talosconfig)   # kept unless asked
    again = workspace.run(label='destroy-again', playbook=DESTROY,
                          extra_vars={'confirm_destroy': 'lab', 'destroy_remove_secrets': True,
                                      'destroy_remove_artifacts': True})
    assert again.ok, again.explain()
    assert [task for _s, task, _h in again.changed()] == [
        'Delete the kept secrets (Talos secrets bundle, sealed-secrets keypair)',
        'Delete the artifacts folder (talosconfig, kubeconfig, machine configs, reports, etcd backups)']
    assert not os.path.exists(workspace.secrets_dir)
    # the folder went; what is there now is this run's own report, which the timeline callback writes at its end
    assert set(os.listdir(workspace.artifacts)) <= {'report.json', 'report.html', 'timeline.md'}, os.listdir(workspace.artifacts)
