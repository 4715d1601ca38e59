"""Day-two playbooks against one lab of their own (3 control planes + 2 workers, time scale 0), in order:

site.yml converges; etcd_backup three times with retention 2 (files 0600 in a 0700 folder, named by time, the two
newest kept, each a whole snapshot of the cluster's etcd); remove_node without its confirmation refused; remove_node
of a control plane refused while removing it would lose quorum (nothing changed: three etcd members, the Node still
there); remove_node of a worker (drain, Talos reset, Node and VM deleted), idempotent on a second run, and of a
control plane (its etcd member gone); then site.yml with an inventory without the worker is green and builds the
control plane again; rebuild_node refused without its confirmation, for several hosts, under --limit and
while a control plane's removal would lose quorum (nothing changed), then lab-w-2 put back in the inventory and
built by rebuild_node (nothing left to remove), lab-w-1 and lab-cp-3 rebuilt (a new VM, a new etcd member), and a
site.yml run afterwards changes nothing; the cluster runs Talos v1.12.11 until upgrade_talos to v1.13.9, refused by Talos while
an etcd member is unhealthy (the drained Node made schedulable again, Flux resumed by the rescue), predicted in check
mode, then node by node while a thread watches the cluster (every node cordoned in turn; Flux's Kustomizations and a
HelmRelease suspended all that time, a HelmRelease the user suspended left alone, all as before afterwards; a
Deployment with a replica on each worker never without a Ready replica - the lab serves no eviction subresource, so
this shows the drain, the rescheduling and the node-by-node order, not PodDisruptionBudgets; docs/lab-kubernetes.md;
every node on v1.13.9; what an interrupted run leaves suspended resumed by --tags flux_resume; a second run changes
nothing), then to v1.13.8 with a worker whose reboot hangs: the run stops naming it; destroy refused
without its confirmation, predicted in check mode, then every VM deleted with the kept secrets left in place, and
those removed only when asked.
"""

import os
import stat
import sys
import threading
import time

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_lab import PLAYBOOK_BIN, ROOT, Workspace, file_mode, wait_until  # noqa: E402  pylint: disable=wrong-import-position,import-error

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client as talos_client  # noqa: E402
from lab.talos import etcd as lab_etcd  # noqa: E402  pylint: disable=wrong-import-position
from lab.testing import start_lab  # noqa: E402  pylint: disable=wrong-import-position

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ETCD_BACKUP = os.path.join(ROOT, 'playbooks', 'etcd_backup.yml')
REMOVE_NODE = os.path.join(ROOT, 'playbooks', 'remove_node.yml')
DESTROY = os.path.join(ROOT, 'playbooks', 'destroy.yml')
UPGRADE = os.path.join(ROOT, 'playbooks', 'upgrade_talos.yml')
REBUILD = os.path.join(ROOT, 'playbooks', 'rebuild_node.yml')
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
        space.render_cilium_manifest()
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
    workspace.removed_hosts = {'lab-w-2': hosts['cluster']['children']['worker']['hosts'].pop('lab-w-2')}
    with open(os.path.join(workspace.inventory, 'hosts.yml'), 'w', encoding='utf-8') as handle:
        yaml.safe_dump(hosts, handle)
    # lab-cp-3 stays in the inventory (site.yml's preflight wants an odd number of control planes): site.yml builds
    # it again, and it joins etcd as a new member
    site = workspace.run(label='site-without-w-2')
    assert site.ok, site.explain()
    assert node_names(workspace) == ['lab-cp-1', 'lab-cp-2', 'lab-cp-3', 'lab-w-1']
    assert sorted(m['hostname'] for m in etcd_members(workspace)) == list(CONTROL_PLANES)


def write_hosts(space, hosts):
    with open(os.path.join(space.inventory, 'hosts.yml'), 'w', encoding='utf-8') as handle:
        yaml.safe_dump(hosts, handle)


def vm_ids(space):
    return sorted(vm.get('vmid') for vm in space.lab.vms())


def test_rebuild_node_refusals(workspace):
    unconfirmed = workspace.run(label='rebuild-unconfirmed', playbook=REBUILD, extra_vars={'rebuild_node': 'lab-w-1'})
    assert not unconfirmed.ok and not unconfirmed.changed()
    assert any('confirm_rebuild_node' in m for _s, _t, _h, m in unconfirmed.failures()), unconfirmed.explain()
    several = workspace.run(label='rebuild-several', playbook=REBUILD,
                            extra_vars={'rebuild_node': 'lab-w-1,lab-cp-1', 'confirm_rebuild_node': 'lab-w-1,lab-cp-1'})
    assert not several.ok and not several.changed()
    assert any('one inventory host per run' in m for _s, _t, _h, m in several.failures()), several.explain()
    limited = workspace.run('--limit', 'lab-w-1', label='rebuild-limited', playbook=REBUILD,
                            extra_vars={'rebuild_node': 'lab-w-1', 'confirm_rebuild_node': 'lab-w-1'})
    assert not limited.ok and not limited.changed()
    assert any('without --limit' in m for _s, _t, _h, m in limited.failures()), limited.explain()

    workspace.lab.fault('talos-etcd-unhealthy', 'lab-cp-2')
    try:
        quorum = workspace.run(label='rebuild-cp-refused', playbook=REBUILD,
                               extra_vars={'rebuild_node': 'lab-cp-1', 'confirm_rebuild_node': 'lab-cp-1'})
    finally:
        workspace.lab.clear('talos-etcd-unhealthy', 'lab-cp-2')
    assert not quorum.ok and not quorum.changed()
    messages = [message for _s, task, _h, message in quorum.failures() if 'keeps quorum' in task]
    assert messages and 'would lose quorum' in messages[0], quorum.explain()
    assert len(etcd_members(workspace)) == 3 and 'lab-cp-1' in node_names(workspace)


def test_rebuild_a_worker_and_a_control_plane_then_site_changes_nothing(workspace):
    # lab-w-2 back in the inventory: its rebuild finds nothing to remove (Node, VM gone) and builds it
    hosts = inventory_hosts(workspace)
    hosts['cluster']['children']['worker']['hosts'].update(getattr(workspace, 'removed_hosts', {}))
    write_hosts(workspace, hosts)
    back = workspace.run(label='rebuild-w-2', playbook=REBUILD,
                         extra_vars={'rebuild_node': 'lab-w-2', 'confirm_rebuild_node': 'lab-w-2'})
    assert back.ok, back.explain()
    assert 'lab-w-2' in node_names(workspace)

    for host in ('lab-w-1', 'lab-cp-3'):
        before = vm_ids(workspace)
        members = dict((m['hostname'], m['id']) for m in etcd_members(workspace))
        extra = {'rebuild_node': host, 'confirm_rebuild_node': host}
        run = workspace.run(label='rebuild-%s' % host, playbook=REBUILD, extra_vars=extra)
        assert run.ok, run.explain()
        changed = [(task, changed_host) for _s, task, changed_host in run.changed()]
        assert {'Cordon and drain the Kubernetes Node', 'Remove the etcd member (control plane) and reset Talos',
                'Delete the Kubernetes Node object', 'Delete the VM and its disks'} <= set(t for t, _h in changed), changed
        assert node_names(workspace) == ['lab-cp-1', 'lab-cp-2', 'lab-cp-3', 'lab-w-1', 'lab-w-2']
        now = dict((m['hostname'], m['id']) for m in etcd_members(workspace))
        assert sorted(now) == list(CONTROL_PLANES), now
        if host in CONTROL_PLANES:
            assert now[host] != members[host], (members, now)   # a new etcd member
        assert before == vm_ids(workspace)                      # the same VM ids, the rebuilt one created again
    assert set(talos_versions(workspace).values()) == {START}

    site = workspace.run(label='site-after-rebuilds')
    assert site.ok and not site.changed(), site.explain() + '\nchanged: %r' % site.changed()


def talos_versions(space):
    return dict((node['name'], node['talos_version']) for node in space.lab.status()['talos']['nodes'] if node['name'])


SUSPENDED_BY = 'proxtalos.cluster/suspended-by'
APP_NAMESPACE = 'day-two'
FLUX_KINDS = (('kustomize.toolkit.fluxcd.io', 'v1', 'kustomizations'), ('helm.toolkit.fluxcd.io', 'v2', 'helmreleases'))


def flux_objects(api):
    """{(plural, namespace, name): (spec.suspend, suspended-by annotation)} of every Kustomization and HelmRelease."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    out = {}
    for group, version, plural in FLUX_KINDS:
        for item in client.CustomObjectsApi(api).list_cluster_custom_object(group, version, plural)['items']:
            meta = item['metadata']
            out[(plural, meta['namespace'], meta['name'])] = (
                (item.get('spec') or {}).get('suspend') is True, (meta.get('annotations') or {}).get(SUSPENDED_BY))
    return out


def start_workload(api):
    """A Deployment of two replicas, one per worker (required pod anti-affinity; the control planes' NoSchedule taint
    keeps them off those), and two HelmReleases: one the user suspended, one not. The lab stores HelmReleases without
    reconciling them (docs/lab-flux.md), which is enough to see what the upgrade does with their spec.suspend."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    client.CoreV1Api(api).create_namespace({'metadata': {'name': APP_NAMESPACE}})
    labels = {'app': 'web'}
    client.AppsV1Api(api).create_namespaced_deployment(APP_NAMESPACE, {
        'metadata': {'name': 'web', 'namespace': APP_NAMESPACE},
        'spec': {'replicas': 2, 'selector': {'matchLabels': labels}, 'template': {
            'metadata': {'labels': labels},
            'spec': {'containers': [{'name': 'web', 'image': 'registry.k8s.io/pause:3.10'}],
                     'affinity': {'podAntiAffinity': {'requiredDuringSchedulingIgnoredDuringExecution': [
                         {'labelSelector': {'matchLabels': labels}, 'topologyKey': 'kubernetes.io/hostname'}]}}}}}})
    for name, suspend in (('user-suspended', True), ('running', False)):
        body = {'apiVersion': 'helm.toolkit.fluxcd.io/v2', 'kind': 'HelmRelease',
                'metadata': {'name': name, 'namespace': APP_NAMESPACE},
                'spec': {'interval': '10m', 'suspend': suspend,
                         'chart': {'spec': {'chart': 'podinfo', 'sourceRef': {'kind': 'HelmRepository', 'name': 'podinfo'}}}}}
        client.CustomObjectsApi(api).create_namespaced_custom_object('helm.toolkit.fluxcd.io', 'v2', APP_NAMESPACE,
                                                                     'helmreleases', body)

    def two_ready():
        pods = ready_pods(api)
        return len(pods) == 2 and len(set(pods.values())) == 2, pods
    wait_until(two_ready, 'two Ready replicas of day-two/web on two workers', timeout=120)


def ready_pods(api):
    """{pod name: node} of the Ready, not terminating pods of day-two/web."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    out = {}
    for pod in client.CoreV1Api(api).list_namespaced_pod(APP_NAMESPACE, label_selector='app=web').items:
        conditions = pod.status.conditions or []
        if pod.metadata.deletion_timestamp is None and any(c.type == 'Ready' and c.status == 'True' for c in conditions):
            out[pod.metadata.name] = pod.spec.node_name
    return out


class Watch(threading.Thread):
    """Polls the lab's Kubernetes API while a playbook runs: the Ready replicas of day-two/web, the cordoned Nodes and
    the Flux objects' spec.suspend, one sample about every 0.1 s."""

    def __init__(self, api):
        super().__init__(daemon=True)
        self.api = api
        self.samples = []
        self.errors = []
        self.done = threading.Event()

    def run(self):
        from kubernetes import client  # pylint: disable=import-outside-toplevel
        core = client.CoreV1Api(self.api)
        while not self.done.is_set():
            try:
                cordoned = sorted(n.metadata.name for n in core.list_node().items if n.spec.unschedulable)
                self.samples.append({'t': time.monotonic(), 'ready': ready_pods(self.api), 'cordoned': cordoned,
                                     'flux': flux_objects(self.api)})
            except Exception as exc:  # pylint: disable=broad-except  # a failed poll is kept and reported, not fatal
                self.errors.append(repr(exc))
            self.done.wait(0.1)

    def stop(self):
        self.done.set()
        self.join(30)
        return self


def assert_flux_resumed(api, before):
    """Every Flux object is as it was before the run: the user's suspended one still suspended, none annotated."""
    now = flux_objects(api)
    assert now == before, dict((key, (before.get(key), now.get(key))) for key in set(now) | set(before)
                               if now.get(key) != before.get(key))


def test_upgrade_talos_node_by_node(workspace):
    api = workspace.k8s()
    start_workload(api)
    flux_before = flux_objects(api)
    kustomizations = sorted(key for key in flux_before if key[0] == 'kustomizations')
    assert kustomizations and not any(flux_before[key][0] for key in kustomizations), flux_before
    assert flux_before[('helmreleases', APP_NAMESPACE, 'user-suspended')] == (True, None)

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
    # refused before it started: the drained Node is schedulable again, and Flux was suspended, then resumed by the
    # rescue of the node where the run stopped
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    assert not client.CoreV1Api(api).read_node('lab-cp-1').spec.unschedulable
    changed = [task for _s, task, _h in refused.changed()]
    assert any('Suspend Flux' in task for task in changed) and any('Resume Flux' in task for task in changed), changed
    assert_flux_resumed(api, flux_before)

    target = {'talos_version': TARGET}
    check = workspace.run('--check', label='upgrade-check', playbook=UPGRADE, extra_vars=target)
    assert check.ok, check.explain()
    predicted = [result for _s, task, _h, result, _e in check.results(task='Suspend Flux') if result.get('results')]
    assert predicted and len([item for item in predicted[0]['results'] if item.get('changed')]) == len(kustomizations) + 1, predicted
    assert_flux_resumed(api, flux_before)   # check mode changed nothing
    assert set(talos_versions(workspace).values()) == {START}

    watch = Watch(api)
    watch.start()
    try:
        run = workspace.run(label='upgrade-1', playbook=UPGRADE, extra_vars=target)
    finally:
        watch.stop()
    assert run.ok, run.explain()
    upgraded = [host for _s, task, host in run.changed() if task.startswith('Upgrade Talos and wait')]
    # one at a time, control planes first (serial: 1 for both plays here)
    assert upgraded == ['lab-cp-1', 'lab-cp-2', 'lab-cp-3', 'lab-w-1', 'lab-w-2'], upgraded
    assert set(talos_versions(workspace).values()) == {TARGET}, talos_versions(workspace)
    running = dict((node['name'], node['version']) for node in workspace.lab.status()['talos']['nodes'] if node['name'])
    assert set(running.values()) == {TARGET}, running

    # what the watch saw: every node cordoned in turn, Flux suspended all that time, the workload never without a Ready
    # replica, and a replica moved off each drained worker (a new pod name on the other... then back)
    samples = watch.samples
    assert not watch.errors or len(watch.errors) < len(samples) / 10, watch.errors[:5]
    seen_cordoned = set(name for sample in samples for name in sample['cordoned'])
    assert seen_cordoned == set(CONTROL_PLANES + WORKERS), seen_cordoned
    for sample in samples:
        if sample['cordoned']:
            not_suspended = [key for key in kustomizations if not sample['flux'][key][0]]
            assert not not_suspended, (sample['cordoned'], not_suspended)
            assert sample['flux'][('helmreleases', APP_NAMESPACE, 'running')] == (True, 'upgrade_talos')
            assert sample['flux'][('helmreleases', APP_NAMESPACE, 'user-suspended')] == (True, None)
    lowest = min(samples, key=lambda sample: len(sample['ready']))
    assert len(lowest['ready']) >= 1, lowest
    assert any(len(sample['ready']) == 1 for sample in samples), 'no drain moved a replica'
    replicas = set(name for sample in samples for name in sample['ready'])
    assert len(replicas) >= 4, replicas   # the two first ones, and a new one for each drained worker
    assert_flux_resumed(api, flux_before)

    # what a run that was interrupted between its suspend and its resume leaves: --tags flux_resume resumes it (and
    # only it), the user's own suspended HelmRelease stays suspended
    from kubernetes import client as k8s_client  # pylint: disable=import-outside-toplevel
    k8s_client.CustomObjectsApi(api).patch_namespaced_custom_object(
        'helm.toolkit.fluxcd.io', 'v2', APP_NAMESPACE, 'helmreleases', 'running',
        {'metadata': {'annotations': {SUSPENDED_BY: 'upgrade_talos'}}, 'spec': {'suspend': True}})
    resume = workspace.run('--tags', 'flux_resume', label='upgrade-flux-resume', playbook=UPGRADE, extra_vars=target)
    assert resume.ok, resume.explain()
    resumed = [result for _s, task, _h, result, _e in resume.results(task='Resume Flux') if result.get('results')]
    assert [item['item']['name'] for item in resumed[0]['results'] if item.get('changed')] == ['running'], resumed
    assert not any('Upgrade Talos and wait' in task or 'Suspend Flux' in task for _s, task, _h, _r, _e in resume.results())
    assert_flux_resumed(api, flux_before)

    again = workspace.run(label='upgrade-1-again', playbook=UPGRADE, extra_vars=target)
    assert again.ok and not again.changed(), again.explain()
    assert not again.results(task='Suspend Flux') or all(r[3].get('skipped') for r in again.results(task='Suspend Flux'))


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
    # Flux was suspended for the run and resumed by the rescue of the worker where it stopped
    assert not any(suspended or owner for suspended, owner in
                   (value for key, value in flux_objects(workspace.k8s()).items() if key[2] != 'user-suspended'))


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
