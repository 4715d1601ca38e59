"""upgrade_kubernetes against a lab of its own (3 control planes + 3 workers, time scale 0), in order:

site.yml builds the cluster on Kubernetes 1.35.4 (host_vars, as a cluster built before the upgrade would be), with one
straggler: lab-w-3's kubelet on 1.34.3. An upgrade to 1.36.3 is then a skip of two minors from the lowest version the
cluster runs: refused before anything changes, naming both versions; an upgrade to 1.35.4 brings only that kubelet
up. The upgrade to 1.36.3 then moves
kube-apiserver, then kube-controller-manager, then kube-scheduler on one control plane at a time, then the kubelets of
the control planes and then of the workers one at a time, while a thread watching the cluster sees a Deployment Ready
throughout and the versions move in that order; a second run changes nothing; an upgrade to 1.36.4 with one
worker's apply rejected by Talos stops at that worker, naming it, the nodes after it untouched; a downgrade is
refused.

kube-proxy is on (proxy_disabled: false): Talos creates its DaemonSet with the image of the config it first sees and
never updates it, so only the sync that ends the upgrade (as `talosctl upgrade-k8s` ends: the Manifest resources of a
control plane read over the Talos API, every object applied as field manager talos) moves it to the new version, and
the upgrade ends once its rollout is done; a rollout that cannot finish (new kube-proxy pods that cannot pull their
image) fails the upgrade naming the DaemonSet and the reason.
"""

import os
import sys
import threading
import time

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_lab import PLAYBOOK_BIN, ROOT, Workspace, wait_until  # noqa: E402  pylint: disable=wrong-import-position,import-error

from lab.testing import start_lab  # noqa: E402  pylint: disable=wrong-import-position

pytestmark = [pytest.mark.lab, pytest.mark.slow]

UPGRADE = os.path.join(ROOT, 'playbooks', 'upgrade_kubernetes.yml')
CONTROL_PLANES = ('lab-cp-1', 'lab-cp-2', 'lab-cp-3')
WORKERS = ('lab-w-1', 'lab-w-2', 'lab-w-3')
START = '1.35.4'     # what site.yml builds (a version Talos v1.13.9 runs: 1.31-1.36)
TARGET = '1.36.3'    # one minor up
PATCH = '1.36.4'     # the upgrade that meets the fault
STRAGGLER = ('lab-w-3', '1.34.3')   # a kubelet two minors below TARGET
COMPONENTS = ('kube-apiserver', 'kube-controller-manager', 'kube-scheduler')
APPLY_TASK = 'Apply the machine config of this batch'
SYNC_TASK = 'The bootstrap manifests of the control plane'
ROLLOUT_TASK = 'The synced workloads rolled out'
DEPLOYMENT = 'web'
PROXY = 'registry.k8s.io/kube-proxy:v'


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    if not os.access(PLAYBOOK_BIN, os.X_OK):
        pytest.skip('no ansible-playbook in .venv (make setup)')
    folder = str(tmp_path_factory.mktemp('upgrade-k8s'))
    lab = start_lab(os.path.join(folder, 'lab'), control_planes=3, workers=3)
    try:
        space = Workspace(lab, folder)
        space.render_cilium_manifest()
        os.makedirs(os.path.join(space.inventory, 'host_vars'), exist_ok=True)
        for host in CONTROL_PLANES + WORKERS:
            with open(os.path.join(space.inventory, 'host_vars', '%s.yml' % host), 'w', encoding='utf-8') as handle:
                yaml.safe_dump({'kubernetes_version': STRAGGLER[1] if host == STRAGGLER[0] else START,
                                'talos_machines_cluster_values': {'proxy_disabled': False},
                                'cni_kube_proxy_replacement': False}, handle)
        first = space.run(label='site')
        assert first.ok, first.explain()
        yield space
    finally:
        lab.stop()


def versions(space):
    """{node: {'kubelet': 'v1.35.4', 'kube-apiserver': 'v1.35.4', ...}} as the cluster reports them."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    api = client.CoreV1Api(space.k8s())
    out = dict((node.metadata.name, {'kubelet': node.status.node_info.kubelet_version}) for node in api.list_node().items)
    for pod in api.list_namespaced_pod('kube-system').items:
        component = (pod.metadata.labels or {}).get('k8s-app')
        if component in COMPONENTS and pod.spec.node_name in out:
            out[pod.spec.node_name][component] = 'v' + pod.spec.containers[0].image.rsplit(':v', 1)[1]
    return out


def kube_proxy(space):
    """(the DaemonSet's image, its status counters, the images of its pods)."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    daemonset = client.AppsV1Api(space.k8s()).read_namespaced_daemon_set('kube-proxy', 'kube-system')
    status = daemonset.status
    pods = client.CoreV1Api(space.k8s()).list_namespaced_pod('kube-system', label_selector='k8s-app=kube-proxy').items
    return (daemonset.spec.template.spec.containers[0].image,
            (status.desired_number_scheduled, status.updated_number_scheduled, status.number_available),
            sorted(set(pod.spec.containers[0].image for pod in pods if not pod.metadata.deletion_timestamp)))


def task_results(run, task):
    return [(host, result) for _s, name, host, result, _e in run.results() if task in name]


def ready_replicas(space):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    return client.AppsV1Api(space.k8s()).read_namespaced_deployment(DEPLOYMENT, 'default').status.ready_replicas or 0


class Watcher(threading.Thread):
    """Polls the Deployment's readyReplicas and every node's versions until stopped."""

    def __init__(self, space):
        super().__init__(daemon=True)
        self.space = space
        self.samples = []      # (time, ready replicas, versions)
        self.errors = []
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            try:
                self.samples.append((time.time(), ready_replicas(self.space), versions(self.space)))
            except Exception as exc:  # pylint: disable=broad-except
                # the API answers from every control plane; a failed read is recorded, and the test fails on it
                self.errors.append(repr(exc))
            self.halt.wait(0.1)


def applies(run):
    """[(play name, host)] of the applies that changed a node, in run order."""
    out = []
    play = None
    for event in run.events:
        kind = event.get('_event', '')
        if kind == 'v2_playbook_on_play_start':
            play = event['play']['name']
        elif kind == 'v2_runner_on_ok' and APPLY_TASK in event['task']['name']:
            out += [(play, host) for host, result in event['hosts'].items() if result.get('changed')]
    return out


def first_time(samples, predicate):
    return next((when for when, _ready, seen in samples if predicate(seen)), None)


def upgrade(space, label, version, **extra):
    return space.run(label=label, playbook=UPGRADE, extra_vars=dict({'kubernetes_version': version}, **extra))


def test_a_skip_of_two_minors_is_refused_before_anything_changes(workspace):
    before = versions(workspace)
    assert before[STRAGGLER[0]]['kubelet'] == 'v' + STRAGGLER[1], before
    run = upgrade(workspace, 'upgrade-skip', TARGET)
    assert not run.ok
    failures = run.failures()
    assert [task for _s, task, _h, _m in failures] == ['The versions the cluster runs - a downgrade or a skipped minor refused'], \
        run.explain()
    message = failures[0][3]
    assert 'kubernetes_version %s skips a minor from %s' % (TARGET, STRAGGLER[1]) in message, message
    assert not run.changed() and versions(workspace) == before


def test_kube_proxy_is_created_with_the_image_of_the_config(workspace):
    image, (desired, updated, available), pods = kube_proxy(workspace)
    assert image == PROXY + START and pods == [PROXY + START], (image, pods)
    assert desired == updated == available == len(CONTROL_PLANES + WORKERS), (desired, updated, available)


def test_the_straggler_comes_up_first(workspace):
    run = upgrade(workspace, 'upgrade-straggler', START)
    assert run.ok, run.explain()
    # the manifests already match the config: the sync changes nothing
    assert [r.get('changed') for _h, r in task_results(run, SYNC_TASK)] == [False], run.explain()
    assert [host for _play, host in applies(run)] == [STRAGGLER[0]], applies(run)
    assert set(v for node in versions(workspace).values() for v in node.values()) == {'v' + START}, versions(workspace)


def test_upgrade_node_by_node_with_workloads_ready_throughout(workspace):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    apps = client.AppsV1Api(workspace.k8s())
    labels = {'app': DEPLOYMENT}
    apps.create_namespaced_deployment('default', {
        'apiVersion': 'apps/v1', 'kind': 'Deployment', 'metadata': {'name': DEPLOYMENT, 'labels': labels},
        'spec': {'replicas': 3, 'selector': {'matchLabels': labels},
                 'template': {'metadata': {'labels': labels},
                              'spec': {'containers': [{'name': 'web', 'image': 'registry.k8s.io/pause:3.10'}]}}}})
    wait_until(lambda: (ready_replicas(workspace) == 3, 'readyReplicas %d' % ready_replicas(workspace)),
               'the Deployment %s Ready' % DEPLOYMENT, timeout=120)

    # check mode: the path checked, the configs predicted as rendered anew (talos_config writes nothing in check mode,
    # so the applies dry-run the configs on disk), nothing changed on the nodes
    before = versions(workspace)
    check = workspace.run('--check', label='upgrade-check', playbook=UPGRADE, extra_vars={'kubernetes_version': TARGET})
    assert check.ok, check.explain()
    assert any('Machine config of every node' in task for _s, task, _h in check.changed()), check.changed()
    assert not applies(check) and versions(workspace) == before
    assert kube_proxy(workspace)[0] == PROXY + START

    watcher = Watcher(workspace)
    watcher.start()
    try:
        run = upgrade(workspace, 'upgrade', TARGET)
    finally:
        watcher.halt.set()
        watcher.join(10)
    assert run.ok, run.explain()
    assert not watcher.errors, watcher.errors[:5]
    assert watcher.samples and min(ready for _t, ready, _v in watcher.samples) > 0, \
        'the Deployment had no Ready replica during the upgrade'

    # the order of the applies: each component on each control plane, then the kubelets, one node at a time
    order = applies(run)
    expected = ([('kube-apiserver', cp) for cp in CONTROL_PLANES] + [('kube-controller-manager', cp) for cp in CONTROL_PLANES]
                + [('kube-scheduler', cp) for cp in CONTROL_PLANES] + [('kubelets', node) for node in CONTROL_PLANES + WORKERS])
    assert len(order) == len(expected), order
    for (play, host), (what, node) in zip(order, expected):
        assert what in play and host == node, (order, expected)

    # what the cluster showed: every control plane's component on the new version before the next component moved,
    # every component before any kubelet, the control planes' kubelets before the workers'
    new = 'v' + TARGET
    samples = watcher.samples

    def done(what, nodes):
        return lambda seen: all(seen.get(node, {}).get(what) == new for node in nodes)

    def started(what, nodes):
        return lambda seen: any(seen.get(node, {}).get(what) == new for node in nodes)
    steps = [('kube-apiserver', CONTROL_PLANES), ('kube-controller-manager', CONTROL_PLANES),
             ('kube-scheduler', CONTROL_PLANES), ('kubelet', CONTROL_PLANES), ('kubelet', WORKERS)]
    for (what, nodes), (later, later_nodes) in zip(steps, steps[1:]):
        finished, begun = first_time(samples, done(what, nodes)), first_time(samples, started(later, later_nodes))
        assert finished is not None and begun is not None and finished <= begun, (what, later, finished, begun)
    assert versions(workspace) == dict((node, dict([('kubelet', new)] + ([(c, new) for c in COMPONENTS] if node in CONTROL_PLANES else [])))
                                       for node in CONTROL_PLANES + WORKERS), versions(workspace)

    # the last step: kube-proxy synced to the new version after every kubelet, its rollout done when the run ends
    synced = task_results(run, SYNC_TASK)
    assert [r.get('changed') for _h, r in synced] == [True], run.explain()
    # read from the first control plane's Manifest resources (COSI): every object Talos renders, only kube-proxy changed
    result = synced[0][1]
    assert {'10-kube-proxy', '11-core-dns', '99-cilium'} <= set(result['manifests']), result['manifests']
    assert [(o['kind'], o['name']) for o in result['objects'] if o['action'] != 'unchanged'] == \
        [('DaemonSet', 'kube-proxy')], result['objects']
    assert ('Deployment', 'coredns') in [(o['kind'], o['name']) for o in result['objects']]
    assert [h for h, r in task_results(run, ROLLOUT_TASK) if not r.get('skipped')] == [CONTROL_PLANES[0]], run.explain()
    image, (desired, updated, available), pods = kube_proxy(workspace)
    assert image == PROXY + TARGET and pods == [PROXY + TARGET], (image, pods)
    assert desired == updated == available == len(CONTROL_PLANES + WORKERS), (desired, updated, available)

    again = upgrade(workspace, 'upgrade-again', TARGET)
    assert again.ok and not again.changed(), again.explain() + repr(again.changed())
    assert [r.get('changed') for _h, r in task_results(again, SYNC_TASK)] == [False]


def test_site_rolling_apply_goes_node_by_node_and_changes_nothing_on_a_converged_cluster(workspace):
    run = workspace.run('--tags', 'secrets,apply', label='site-rolling',
                        extra_vars={'kubernetes_version': TARGET, 'talos_machines_rolling': True})
    assert run.ok and not run.changed(), run.explain() + repr(run.changed())
    batches = [host for _s, task, host, _r, _e in run.results() if APPLY_TASK in task]
    assert batches == list(CONTROL_PLANES + WORKERS), batches
    # the stage's one apply over every node did not run
    one_apply = 'Apply the machine config - insecure in maintenance mode, mTLS after; a dry run decides changed; every node in one run'
    assert not [t for _s, t, _h, _r, event in run.results() if t.endswith(one_apply) and event != 'v2_runner_on_skipped'], \
        run.explain()


def test_a_downgrade_is_refused(workspace):
    run = upgrade(workspace, 'downgrade', START)
    assert not run.ok
    message = run.failures()[-1][3]
    assert 'kubernetes_version %s is older than %s' % (START, TARGET) in message and 'downgrade' in message, message
    assert not run.changed()


def test_a_fault_on_one_node_stops_the_upgrade_there(workspace):
    workspace.lab.fault('talos-apply-reject', 'lab-w-2')
    try:
        run = upgrade(workspace, 'upgrade-fault', PATCH, talos_machines_apply_timeout=30)
    finally:
        workspace.lab.clear('talos-apply-reject', 'lab-w-2')
    assert not run.ok
    failures = run.failures()
    assert set(host for _s, _t, host, _m in failures) == {'lab-w-2'}, run.explain()
    assert 'lab-w-2' in failures[-1][3] and 'INVALID_ARGUMENT' in failures[-1][3], failures[-1][3]
    seen = versions(workspace)
    new = 'v' + PATCH
    assert [seen[node]['kubelet'] for node in CONTROL_PLANES + WORKERS] == [new] * 4 + ['v' + TARGET] * 2, seen


def test_a_kube_proxy_rollout_that_cannot_finish_fails_the_upgrade_naming_it(workspace):
    # after the fault above: two workers still on TARGET; kube-proxy's new pods cannot pull their image
    workspace.lab.fault('k8s-image-pull', 'kube-system/kube-proxy')
    try:
        run = upgrade(workspace, 'upgrade-proxy-stuck', PATCH, talos_machines_apply_timeout=20)
    finally:
        workspace.lab.clear('k8s-image-pull', 'kube-system/kube-proxy')
    assert not run.ok
    failures = run.failures()
    assert failures[-1][1] == 'Stop the upgrade at the manifests', run.explain()
    message = failures[-1][3]
    assert 'DaemonSet kube-system/kube-proxy' in message and 'ImagePullBackOff' in message, message
    assert kube_proxy(workspace)[0] == PROXY + PATCH
    assert set(seen['kubelet'] for seen in versions(workspace).values()) == {'v' + PATCH}
