"""The simulated kubelets, scheduler and workload controllers (Part 2), through the Python client."""

import json
import time

import pytest

kubernetes = pytest.importorskip('kubernetes')
from kubernetes import client, config  # noqa: E402  pylint: disable=wrong-import-position
from kubernetes.client.rest import ApiException  # noqa: E402  pylint: disable=wrong-import-position

from lab.k8s.controllers import CNI_MESSAGE  # noqa: E402  pylint: disable=wrong-import-position
from lab.k8s.testing import ClusterThread  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.proxtalos.cluster.tests.helpers import wait_until  # noqa: E402  pylint: disable=wrong-import-position

CILIUM_DS = {
    'metadata': {'name': 'cilium', 'labels': {'k8s-app': 'cilium'}},
    'spec': {'selector': {'matchLabels': {'k8s-app': 'cilium'}}, 'template': {
        'metadata': {'labels': {'k8s-app': 'cilium'}},
        'spec': {'hostNetwork': True, 'tolerations': [{'operator': 'Exists'}],
                 'containers': [{'name': 'cilium-agent', 'image': 'quay.io/cilium/cilium:v1.17.4'}]}}}}


def operator_deployment(replicas=2):
    labels = {'io.cilium/app': 'operator', 'name': 'cilium-operator'}
    return {'metadata': {'name': 'cilium-operator'}, 'spec': {
        'replicas': replicas, 'selector': {'matchLabels': labels}, 'template': {
            'metadata': {'labels': labels},
            'spec': {'tolerations': [{'operator': 'Exists'}], 'containers': [{'name': 'operator', 'image': 'cilium/operator:v1.17.4'}],
                     'affinity': {'podAntiAffinity': {'requiredDuringSchedulingIgnoredDuringExecution': [
                         {'labelSelector': {'matchLabels': {'io.cilium/app': 'operator'}}, 'topologyKey': 'kubernetes.io/hostname'}]}}}}}}


@pytest.fixture()
def lab():
    with ClusterThread() as api:
        api.kube = config.new_client_from_config(config_file=api.kubeconfig)
        api.core = client.CoreV1Api(api.kube)
        api.apps = client.AppsV1Api(api.kube)
        yield api


def node_ready(lab, name):
    node = lab.core.read_node(name)
    return next(c for c in node.status.conditions if c.type == 'Ready')


def pods(lab, namespace, selector):
    return lab.core.list_namespaced_pod(namespace, label_selector=selector).items


def test_node_not_ready_until_its_cilium_agent_is_ready(lab):
    lab.call(lab.cluster.kubelet_started, 'cp-1', '127.0.0.1', control_plane=True)
    lab.call(lab.cluster.kubelet_started, 'w-1', '127.0.0.2')
    ready = node_ready(lab, 'w-1')
    assert (ready.status, ready.reason, ready.message) == ('False', 'KubeletNotReady', CNI_MESSAGE)
    taints = {(t.key, t.effect) for t in lab.core.read_node('w-1').spec.taints}
    assert ('node.kubernetes.io/not-ready', 'NoSchedule') in taints
    lab.apps.create_namespaced_daemon_set('kube-system', CILIUM_DS)
    wait_until(lambda: (node_ready(lab, 'w-1').status == 'True', node_ready(lab, 'w-1').message), what='w-1 Ready')
    assert node_ready(lab, 'cp-1').reason == 'KubeletReady'
    assert ('node.kubernetes.io/not-ready', 'NoSchedule') not in {(t.key, t.effect) for t in lab.core.read_node('w-1').spec.taints}
    ds = lab.apps.read_namespaced_daemon_set('cilium', 'kube-system').status
    assert (ds.desired_number_scheduled, ds.current_number_scheduled, ds.number_ready, ds.updated_number_scheduled,
            ds.number_available, ds.observed_generation) == (2, 2, 2, 2, 2, 1)
    agents = pods(lab, 'kube-system', 'k8s-app=cilium')
    assert sorted(p.spec.node_name for p in agents) == ['cp-1', 'w-1']
    assert all(p.status.pod_ip == p.status.host_ip for p in agents), 'hostNetwork pods use the node address'


def test_daemonset_respects_taints_and_node_selector(lab):
    lab.call(lab.cluster.kubelet_started, 'cp-1', '127.0.0.1', control_plane=True)
    lab.call(lab.cluster.kubelet_started, 'w-1', '127.0.0.2', labels={'disk': 'ssd'})
    lab.call(lab.cluster.kubelet_started, 'w-2', '127.0.0.3')
    lab.apps.create_namespaced_daemon_set('kube-system', CILIUM_DS)
    plain = {'metadata': {'name': 'csi-node'}, 'spec': {'selector': {'matchLabels': {'app': 'csi'}}, 'template': {
        'metadata': {'labels': {'app': 'csi'}}, 'spec': {'containers': [{'name': 'c', 'image': 'csi:1'}]}}}}
    lab.apps.create_namespaced_daemon_set('default', plain)
    selective = json.loads(json.dumps(plain))
    selective['metadata']['name'] = 'ssd-only'
    selective['spec']['selector']['matchLabels'] = selective['spec']['template']['metadata']['labels'] = {'app': 'ssd'}
    selective['spec']['template']['spec']['nodeSelector'] = {'disk': 'ssd'}
    lab.apps.create_namespaced_daemon_set('default', selective)

    def placement(name, selector):
        status = lab.apps.read_namespaced_daemon_set(name, 'default').status
        return status.number_ready == status.desired_number_scheduled, sorted(p.spec.node_name for p in pods(lab, 'default', selector))
    # the control plane keeps its NoSchedule taint: no csi pod there
    assert wait_until(lambda: placement('csi-node', 'app=csi'), what='csi-node ready') == ['w-1', 'w-2']
    assert wait_until(lambda: placement('ssd-only', 'app=ssd'), what='ssd-only ready') == ['w-1']


def test_operator_second_replica_pending_until_second_node(lab):
    lab.call(lab.cluster.kubelet_started, 'only', '127.0.0.1', control_plane=True, taints=[])
    lab.apps.create_namespaced_daemon_set('kube-system', CILIUM_DS)
    lab.apps.create_namespaced_deployment('kube-system', operator_deployment(2))

    def state():
        items = pods(lab, 'kube-system', 'io.cilium/app=operator')
        return sorted((p.status.phase, p.spec.node_name or '') for p in items), items
    wait_until(lambda: (state()[0] == [('Pending', ''), ('Running', 'only')], state()[0]), what='one operator running, one pending')
    pending = next(p for p in state()[1] if p.status.phase == 'Pending')
    scheduled = next(c for c in pending.status.conditions if c.type == 'PodScheduled')
    assert scheduled.status == 'False' and scheduled.reason == 'Unschedulable'
    assert scheduled.message.startswith("0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules.")
    status = lab.apps.read_namespaced_deployment('cilium-operator', 'kube-system').status
    assert (status.replicas, status.ready_replicas, status.available_replicas, status.unavailable_replicas) == (2, 1, 1, 1)
    available = next(c for c in status.conditions if c.type == 'Available')
    assert (available.status, available.reason) == ('False', 'MinimumReplicasUnavailable')
    lab.call(lab.cluster.kubelet_started, 'second', '127.0.0.2')

    def rolled_out():
        current = lab.apps.read_namespaced_deployment('cilium-operator', 'kube-system').status
        return current.available_replicas == 2, (current.ready_replicas, current.available_replicas)
    wait_until(rolled_out, what='both operator replicas available')
    assert sorted(p.spec.node_name for p in state()[1]) == ['only', 'second']


def test_deployment_status_fields_and_rollout(lab):
    lab.call(lab.cluster.kubelet_started, 'w-1', '127.0.0.2')
    lab.apps.create_namespaced_daemon_set('kube-system', CILIUM_DS)
    body = operator_deployment(1)
    body['metadata']['name'] = 'web'
    body['spec']['template']['spec'].pop('affinity')
    lab.apps.create_namespaced_deployment('default', body)

    def done():
        deploy = lab.apps.read_namespaced_deployment('web', 'default')
        status = deploy.status
        return (status.observed_generation == deploy.metadata.generation and status.updated_replicas == deploy.spec.replicas
                and status.available_replicas == deploy.spec.replicas), status
    status = wait_until(done, what='web rolled out')
    conditions = {c.type: (c.status, c.reason) for c in status.conditions}
    assert conditions == {'Available': ('True', 'MinimumReplicasAvailable'), 'Progressing': ('True', 'NewReplicaSetAvailable')}
    lab.apps.patch_namespaced_deployment('web', 'default', {'spec': {'replicas': 3, 'template': {'metadata': {'annotations': {'v': '2'}}}}})
    status = wait_until(done, what='web rolled out again')
    assert status.observed_generation == 2 and status.replicas == 3
    sets = client.AppsV1Api(lab.kube).list_namespaced_replica_set('default').items
    assert sorted(rs.spec.replicas for rs in sets) == [0, 3]


def test_pods_become_ready_after_the_pod_ready_delay(lab):
    lab.cluster.controllers.timing = {'pod_ready': 0.3}.get
    lab.call(lab.cluster.kubelet_started, 'w-1', '127.0.0.2')
    lab.apps.create_namespaced_daemon_set('kube-system', CILIUM_DS)
    started = time.monotonic()
    wait_until(lambda: (node_ready(lab, 'w-1').status == 'True', node_ready(lab, 'w-1').reason), what='w-1 Ready')
    assert time.monotonic() - started >= 0.3


def test_crashloop_fault_on_one_node(lab):
    lab.cluster.controllers.timing = {'crashloop_restart': 0.2}.get
    for name, ip in (('w-1', '127.0.0.2'), ('w-2', '127.0.0.3')):
        lab.call(lab.cluster.kubelet_started, name, ip)
    lab.call(lab.cluster.fault_crashloop, 'kube-system/cilium', 'w-2')
    lab.apps.create_namespaced_daemon_set('kube-system', CILIUM_DS)

    def agent_on(node):
        return next(p for p in pods(lab, 'kube-system', 'k8s-app=cilium') if p.spec.node_name == node)

    def looping():
        status = agent_on('w-2').status.container_statuses[0]
        waiting = status.state.waiting
        return bool(waiting and waiting.reason == 'CrashLoopBackOff' and status.restart_count >= 2), (waiting, status.restart_count)
    wait_until(looping, what='the w-2 agent crash-looping with restarts counting')
    assert node_ready(lab, 'w-1').status == 'True' and node_ready(lab, 'w-2').status == 'False'
    ds = lab.apps.read_namespaced_daemon_set('cilium', 'kube-system').status
    assert (ds.desired_number_scheduled, ds.number_ready, ds.number_unavailable) == (2, 1, 1)
    lab.call(lab.cluster.clear_faults, 'k8s-crashloop')
    wait_until(lambda: (node_ready(lab, 'w-2').status == 'True', node_ready(lab, 'w-2').message), what='w-2 Ready after the fault')


def test_pending_fault_keeps_deployment_pending(lab):
    lab.call(lab.cluster.kubelet_started, 'w-1', '127.0.0.2')
    lab.apps.create_namespaced_daemon_set('kube-system', CILIUM_DS)
    lab.call(lab.cluster.fault_pending, 'default/stuck')
    body = operator_deployment(1)
    body['metadata']['name'] = 'stuck'
    lab.apps.create_namespaced_deployment('default', body)

    def pending():
        items = pods(lab, 'default', 'io.cilium/app=operator')
        if not items or not items[0].status.conditions:
            return False, items
        condition = items[0].status.conditions[0]
        return condition.reason == 'Unschedulable', condition.message
    message = wait_until(pending, what='stuck pod Unschedulable')
    assert message.startswith('0/1 nodes are available: 1 Insufficient cpu.')
    lab.call(lab.cluster.clear_faults, 'k8s-pending')
    wait_until(lambda: (lab.apps.read_namespaced_deployment('stuck', 'default').status.available_replicas == 1, None),
               what='stuck available after the fault')


def test_image_pull_fault_keeps_new_pods_in_image_pull_backoff_and_spares_running_ones(lab):
    from lab.kubelet_hooks import DEFAULT_PULL_ERROR  # pylint: disable=import-outside-toplevel
    for name, ip in (('w-1', '127.0.0.2'), ('w-2', '127.0.0.3')):
        lab.call(lab.cluster.kubelet_started, name, ip)
    lab.apps.create_namespaced_daemon_set('kube-system', CILIUM_DS)
    lab.apps.create_namespaced_deployment('kube-system', operator_deployment(2))
    wait_until(lambda: (lab.apps.read_namespaced_deployment('cilium-operator', 'kube-system').status.available_replicas == 2, None),
               what='the operator available')
    lab.call(lab.cluster.fault_image_pull, 'kube-system/cilium-operator', DEFAULT_PULL_ERROR)
    # running pods have their image: nothing happens to them
    assert all(p.status.phase == 'Running' for p in pods(lab, 'kube-system', 'io.cilium/app=operator'))
    lab.core.delete_collection_namespaced_pod('kube-system', label_selector='io.cilium/app=operator')

    def backoff():
        items = pods(lab, 'kube-system', 'io.cilium/app=operator')
        waiting = [p.status.container_statuses[0].state.waiting for p in items if p.status.container_statuses]
        seen = [(p.status.phase, w) for p, w in zip(items, waiting)]
        return len(waiting) == 2 and all(w and w.reason == 'ImagePullBackOff' for w in waiting), seen
    seen = wait_until(backoff, what='both new operator pods in ImagePullBackOff')
    phase, waiting = seen[0]
    assert phase == 'Pending'
    assert waiting.message == ('Back-off pulling image "cilium/operator:v1.17.4": ErrImagePull: failed to pull and unpack image '
                               '"cilium/operator:v1.17.4": failed to resolve reference "cilium/operator:v1.17.4": '
                               'cilium/operator:v1.17.4: not found')
    assert not lab.apps.read_namespaced_deployment('cilium-operator', 'kube-system').status.available_replicas
    # the DaemonSet is another workload: untouched
    assert lab.apps.read_namespaced_daemon_set('cilium', 'kube-system').status.number_ready == 2
    lab.call(lab.cluster.clear_faults, 'k8s-image-pull')
    wait_until(lambda: (lab.apps.read_namespaced_deployment('cilium-operator', 'kube-system').status.available_replicas == 2, None),
               what='the operator available again once the image can be pulled')


def test_api_flap_answers_503_half_the_time(lab):
    lab.call(lab.cluster.fault_api_flap, 0.4)
    outcomes = set()

    def probe():
        try:
            lab.core.list_namespace(_request_timeout=2)
            outcomes.add('ok')
        except ApiException as exc:
            outcomes.add(exc.status)
        return len(outcomes) == 2, sorted(map(str, outcomes))
    wait_until(probe, 'both answers while flapping', timeout=5, interval=0.05)
    assert outcomes == {'ok', 503}
    lab.call(lab.cluster.clear_faults, 'k8s-api-flap')
    assert lab.core.list_namespace().items


def test_kubelet_stopped_makes_node_unknown(lab):
    lab.call(lab.cluster.kubelet_started, 'w-1', '127.0.0.2')
    lab.call(lab.cluster.kubelet_stopped, 'w-1')
    ready = node_ready(lab, 'w-1')
    assert (ready.status, ready.reason) == ('Unknown', 'NodeStatusUnknown')


def test_job_completes_and_statefulset_orders_pods(lab):
    lab.call(lab.cluster.kubelet_started, 'w-1', '127.0.0.2')
    lab.apps.create_namespaced_daemon_set('kube-system', CILIUM_DS)
    batch = client.BatchV1Api(lab.kube)
    batch.create_namespaced_job('default', {'metadata': {'name': 'once'}, 'spec': {'template': {'spec': {
        'restartPolicy': 'Never', 'containers': [{'name': 'c', 'image': 'busybox:1.36'}]}}}})

    def complete():
        job = batch.read_namespaced_job('once', 'default')
        return any(c.type == 'Complete' and c.status == 'True' for c in job.status.conditions or ()), job.status
    status = wait_until(complete, what='job complete')
    assert status.succeeded == 1
    with pytest.raises(ApiException) as exc:
        batch.create_namespaced_job('default', {'metadata': {'name': 'bad'}, 'spec': {'template': {'spec': {
            'containers': [{'name': 'c', 'image': 'busybox:1.36'}]}}}})
    assert exc.value.status == 422 and 'restartPolicy' in exc.value.body
    lab.apps.create_namespaced_stateful_set('default', {'metadata': {'name': 'db'}, 'spec': {
        'serviceName': 'db', 'replicas': 3, 'selector': {'matchLabels': {'app': 'db'}},
        'template': {'metadata': {'labels': {'app': 'db'}}, 'spec': {'containers': [{'name': 'c', 'image': 'postgres:17'}]}}}})

    def sts_ready():
        status = lab.apps.read_namespaced_stateful_set('db', 'default').status
        return status.ready_replicas == 3, status
    wait_until(sts_ready, what='statefulset ready')
    assert sorted(p.metadata.name for p in pods(lab, 'default', 'app=db')) == ['db-0', 'db-1', 'db-2']


def test_delays_come_from_the_lab_timing_and_are_recorded(lab):
    from lab.timing import Timing  # pylint: disable=import-outside-toplevel
    timing = Timing('realistic', scale=0.005, seed=3)
    lab.cluster.controllers.timing = timing
    lab.call(lab.cluster.kubelet_started, 'w-1', '127.0.0.2')
    lab.apps.create_namespaced_daemon_set('kube-system', CILIUM_DS)
    wait_until(lambda: (node_ready(lab, 'w-1').status == 'True', node_ready(lab, 'w-1').reason), what='w-1 Ready')
    records = lab.call(lambda: [dict(r) for r in timing.records if r['kind'] == 'pod_ready'])
    assert len(records) == 1 and records[0]['target'].startswith('pod/kube-system/cilium-')
    assert records[0]['outcome'] == 'done' and 10 <= records[0]['nominal'] <= 30
    assert records[0]['duration'] >= records[0]['planned'] > 0


def test_pod_logs_show_the_crash_loop(lab):
    lab.call(lab.cluster.kubelet_started, 'w-1', '127.0.0.2')
    lab.call(lab.cluster.fault_crashloop, 'kube-system/cilium', 'w-1')
    lab.apps.create_namespaced_daemon_set('kube-system', CILIUM_DS)

    def agent():
        items = pods(lab, 'kube-system', 'k8s-app=cilium')
        waiting = items[0].status.container_statuses[0].state.waiting if items and items[0].status.container_statuses else None
        return bool(waiting and waiting.reason == 'CrashLoopBackOff'), items
    name = wait_until(agent, what='agent crash-looping')[0].metadata.name
    log = lab.core.read_namespaced_pod_log(name, 'kube-system', tail_lines=1)
    assert 'level=fatal' in log and 'k8s-crashloop' in log
    with pytest.raises(ApiException) as exc:
        lab.core.read_namespaced_pod_log(name, 'kube-system', container='nope')
    assert exc.value.status == 400


def test_the_kubelet_registers_a_ready_csi_node_plugin_in_the_nodes_csinode(lab):
    """The kubelet's CSINode (kubernetes v1.36.3 pkg/volume/csi/nodeinfomanager/nodeinfomanager.go:502-525) lists a
    driver once its node plugin registered (csi_plugin.go:118-157); the Proxmox CSI chart's registrar names the
    driver in --kubelet-registration-path (charts/proxmox-csi-plugin/templates/node-deployment.yaml:85)."""
    lab.call(lab.cluster.kubelet_started, 'cp-1', '127.0.0.1', control_plane=True)
    lab.call(lab.cluster.kubelet_started, 'w-1', '127.0.0.2')
    lab.apps.create_namespaced_daemon_set('kube-system', CILIUM_DS)
    plugin = {'metadata': {'name': 'proxmox-csi-plugin-node'}, 'spec': {'selector': {'matchLabels': {'app': 'csi'}}, 'template': {
        'metadata': {'labels': {'app': 'csi'}}, 'spec': {'containers': [
            {'name': 'proxmox-csi-plugin-node', 'image': 'ghcr.io/sergelogvinov/proxmox-csi-node:v0.19.1'},
            {'name': 'csi-node-driver-registrar', 'image': 'registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.14.0',
             'args': ['--csi-address=unix:///csi/csi.sock',
                      '--kubelet-registration-path=/var/lib/kubelet/plugins/csi.proxmox.sinextra.dev/csi.sock']}]}}}}
    lab.apps.create_namespaced_daemon_set('default', plugin)
    storage = client.StorageV1Api(lab.kube)

    def drivers(name):
        try:
            found = storage.read_csi_node(name)
        except ApiException as exc:
            return None if exc.status == 404 else exc
        return [d.name for d in found.spec.drivers or []]
    wait_until(lambda: (drivers('w-1') == ['csi.proxmox.sinextra.dev'], drivers('w-1')), what='w-1 CSINode lists the driver')
    # the control plane's taint keeps the plugin off cp-1: its CSINode lists nothing
    assert drivers('cp-1') == []
    owner = storage.read_csi_node('w-1').metadata.owner_references[0]
    assert (owner.kind, owner.name) == ('Node', 'w-1')
    lab.apps.delete_namespaced_daemon_set('proxmox-csi-plugin-node', 'default')
    wait_until(lambda: (drivers('w-1') == [], drivers('w-1')), what='the driver deregistered with its pod')
