"""k8s_gate through ansible-playbook against upstream Kubernetes on loopback (lab/k8s_upstream), started per module.

One ControlPlane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok: the pinned builds of
upstream/*.json, docs/lab-kubernetes.md) with an admin client-certificate kubeconfig, whatever world
PROXTALOS_LAB_KUBERNETES chooses: the gates are judged against a real API server, the real DaemonSet, Deployment and
node lifecycle controllers and the real scheduler. kwok stands in for the kubelets, and lab/k8s_upstream/kubelet.py
for what kwok does not report: nodes NotReady (NetworkPluginNotReady) until a Cilium agent is Ready on them, and the
crash-loop fault of an agent. Each playbook run here reads results through the ansible.posix.json callback.

The tests share the control plane (module scope) and run in file order, as a cluster's life does: nodes registered
without a CNI, Cilium crash-looping on one node then recovering, a healthy cluster, scheduling limits, Flux-style
objects, and last a node joining while kube-apiserver restarts.

Where lab/k8s's controllers answered at once, upstream's act on their own time: a test that needs a state before its
short-deadline gate (an agent crash-looping, a replica found unschedulable) waits for that state through the API first.
"""
import json
import os
import subprocess

import kubernetes
import pytest
import yaml

from ansible_collections.proxtalos.cluster.tests.helpers import wait_until
from lab.testing import CILIUM_DAEMONSET as CILIUM
from lab.k8s_upstream import ControlPlane
from lab.k8s_upstream import kubelet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK_BIN = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
WAIT = 60.0

pytestmark = [pytest.mark.upstream,
              pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')]


# One more replica than nodes, with the Cilium operator's required anti-affinity: one stays Pending.
SPREAD = {
    'apiVersion': 'apps/v1', 'kind': 'Deployment',
    'metadata': {'name': 'spread', 'namespace': 'kube-system'},
    'spec': {'replicas': 4, 'selector': {'matchLabels': {'app': 'spread'}},
             'template': {'metadata': {'labels': {'app': 'spread'}},
                          'spec': {'tolerations': [{'operator': 'Exists'}],
                                   'affinity': {'podAntiAffinity': {'requiredDuringSchedulingIgnoredDuringExecution': [
                                       {'labelSelector': {'matchLabels': {'app': 'spread'}}, 'topologyKey': 'kubernetes.io/hostname'}]}},
                                   'containers': [{'name': 'web', 'image': 'nginx:1.27'}]}}},
}

KUSTOMIZATION_CRD = {
    'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
    'metadata': {'name': 'kustomizations.kustomize.toolkit.fluxcd.io', 'labels': {'app.kubernetes.io/part-of': 'flux'}},
    'spec': {'group': 'kustomize.toolkit.fluxcd.io', 'scope': 'Namespaced',
             'names': {'kind': 'Kustomization', 'listKind': 'KustomizationList', 'plural': 'kustomizations', 'singular': 'kustomization'},
             'versions': [{'name': 'v1', 'served': True, 'storage': True, 'subresources': {'status': {}},
                           'schema': {'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}}}]},
}
CONTROL_PLANE_TAINT = {'key': 'node-role.kubernetes.io/control-plane', 'effect': 'NoSchedule'}


def _ready_condition(plane, name):
    node = plane.api('GET', '/api/v1/nodes/' + name)
    return next((c for c in node['status'].get('conditions') or () if c['type'] == 'Ready'), {})


@pytest.fixture(scope='module')
def lab(tmp_path_factory):
    """Upstream Kubernetes with a control plane and two workers registered (kwok nodes), no CNI yet: each Node NotReady
    for its network as its kubelet reports it (nodes_wait_for_cni). The node lease and node monitor keep their upstream
    defaults (40 s, 5 s/50 s): no test here stops a kubelet, and the restart of kube-apiserver in the last test must not
    make the nodes Unknown."""
    plane = ControlPlane(str(tmp_path_factory.mktemp('controlplane')), nodes_wait_for_cni=True)
    plane.start()
    try:
        # as Talos registers them: the control plane labelled and tainted NoSchedule (SPREAD and CILIUM tolerate it)
        plane.register_node('cp-1', labels={'node-role.kubernetes.io/control-plane': ''}, taints=[CONTROL_PLANE_TAINT],
                            addresses=['127.0.0.1'])
        plane.register_node('w-1', addresses=['127.0.0.2'])
        plane.register_node('w-2', addresses=['127.0.0.3'])
        for name in ('cp-1', 'w-1', 'w-2'):
            wait_until(lambda name=name: (_ready_condition(plane, name).get('message') == kubelet.NETWORK_NOT_READY,
                                          _ready_condition(plane, name)), timeout=WAIT, what='%s NotReady as its kubelet reports it' % name)
        # pods are refused until kube-controller-manager made the namespace's default ServiceAccount; the DaemonSet
        # controller would back off after such a refusal
        wait_until(lambda: (any(sa['metadata']['name'] == 'default'
                                for sa in plane.api('GET', '/api/v1/namespaces/kube-system/serviceaccounts')['items']), None),
                   timeout=WAIT, what='ServiceAccount kube-system/default')
        plane.files = tmp_path_factory.mktemp('k8s-gate')
        plane.kube = kubernetes.config.new_client_from_config(plane.kubeconfig)
        plane.apps = kubernetes.client.AppsV1Api(plane.kube)
        plane.core = kubernetes.client.CoreV1Api(plane.kube)
        plane.custom = kubernetes.client.CustomObjectsApi(plane.kube)
        plane.extensions = kubernetes.client.ApiextensionsV1Api(plane.kube)
        yield plane
    finally:
        plane.stop()


def _agent_on(lab, node):
    pods = lab.core.list_namespaced_pod('kube-system', label_selector='k8s-app=cilium').items
    return next((p for p in pods if p.spec.node_name == node), None)


def _crash_looping(lab, node):
    """(the Cilium agent on node reports CrashLoopBackOff, what it reports)"""
    pod = _agent_on(lab, node)
    waiting = [((s.state.waiting.reason if s.state and s.state.waiting else None)) for s in (pod.status.container_statuses or [])] if pod else []
    return waiting == ['CrashLoopBackOff'], waiting


def _daemonset_ready(lab, count):
    status = lab.apps.read_namespaced_daemon_set('cilium', 'kube-system').status
    return status.number_ready == count and status.desired_number_scheduled == 3, (status.number_ready, status.desired_number_scheduled)


def playbook_command(lab, tasks, name='play', extra_args=()):
    book = lab.files / ('%s.yml' % name)
    book.write_text(yaml.safe_dump([{
        'name': 'k8s_gate against the lab', 'hosts': 'localhost', 'connection': 'local', 'gather_facts': False,
        'vars': {'ansible_python_interpreter': '{{ ansible_playbook_python }}'},
        'module_defaults': {'group/proxtalos.cluster.k8s': {'kubeconfig': lab.kubeconfig}},
        'tasks': tasks,
    }], sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_STDOUT_CALLBACK='ansible.posix.json',
               ANSIBLE_LOCALHOST_WARNING='false', ANSIBLE_INVENTORY_UNPARSED_WARNING='false')
    return [PLAYBOOK_BIN, str(book)] + list(extra_args), env


def parse(stdout, stderr):
    try:
        data = json.loads(stdout)
    except ValueError as exc:
        raise AssertionError('ansible-playbook did not print JSON:\n%s\n%s' % (stdout[-3000:], stderr[-2000:])) from exc
    return [task['hosts']['localhost'] for task in data['plays'][0]['tasks']]


def play(lab, tasks, name='play', extra_args=()):
    """Run the tasks; return each task's result (tasks should ignore_errors to be inspected)."""
    command, env = playbook_command(lab, tasks, name, extra_args)
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    return parse(result.stdout, result.stderr)


def gate(args, **task):
    body = dict({'proxtalos.cluster.k8s_gate': args, 'register': 'out', 'ignore_errors': True}, **task)
    body.setdefault('name', 'gate %s' % args.get('gate'))
    return body


def ensure(create, *args):
    try:
        create(*args)
    except kubernetes.client.ApiException as exc:
        if exc.status != 409:
            raise


def test_before_the_cni_nodes_are_registered_but_the_ready_gate_names_each_node_and_reason(lab):
    results = play(lab, [
        gate({'gate': 'api', 'wait_timeout': 30}),
        gate({'gate': 'nodes', 'node_state': 'registered', 'expected_count': 3, 'wait_timeout': 30}),
        gate({'gate': 'nodes', 'names': ['cp-1', 'w-1', 'w-2', 'w-3'], 'wait_timeout': 1, 'wait_sleep': 0.2}),
        gate({'gate': 'nodes', 'wait_timeout': 300}, check_mode=True),
    ], name='before-cni')
    api, registered, ready, checked = results
    assert not api.get('failed') and api['summary'] == 'API /readyz ok' and api['changed'] is False
    assert not registered.get('failed') and registered['summary'] == 'nodes registered 3/3'
    assert ready['failed'] is True and ready['changed'] is False
    first, rest = ready['msg'].split('\n', 1)
    assert first.startswith('nodes not reached after 1.')
    assert first.endswith('nodes Ready 0/4: cp-1 NetworkPluginNotReady; w-1 NetworkPluginNotReady; '
                          'w-2 NetworkPluginNotReady; w-3 not registered')
    assert '- w-3: not registered (no Node object; is kubelet running on it?)' in rest
    assert ('- w-1: Ready=False KubeletNotReady: container runtime network not ready: NetworkReady=false '
            'reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized; '
            'no pod on it reports a problem: is a CNI agent (Cilium) scheduled on this node?') in rest
    # check mode probes once instead of waiting 300 s
    assert checked['failed'] is True and checked['attempts'] == 1


def test_crashlooping_agent_is_named_then_the_gate_passes_live_when_it_recovers(lab):
    lab.crash_loop('w-2', 'kube-system/cilium')
    ensure(lab.apps.create_namespaced_daemon_set, 'kube-system', CILIUM)
    # the real DaemonSet controller, scheduler and kwok take a moment: the state the short gates judge, first
    wait_until(lambda: _crash_looping(lab, 'w-2'), timeout=WAIT, what='the agent on w-2 in CrashLoopBackOff')
    wait_until(lambda: _daemonset_ready(lab, 2), timeout=WAIT, what='the DaemonSet controller counting 2 agents Ready')
    wait_until(lambda: ([_ready_condition(lab, n).get('status') for n in ('cp-1', 'w-1')] == ['True', 'True'], None),
               timeout=WAIT, what='cp-1 and w-1 Ready once their agents are')
    failing = play(lab, [
        gate({'gate': 'workload', 'kind': 'DaemonSet', 'namespace': 'kube-system', 'name': 'cilium', 'wait_timeout': 2, 'wait_sleep': 0.2}),
        gate({'gate': 'nodes', 'wait_timeout': 1, 'wait_sleep': 0.2}),
    ], name='crashloop')
    daemonset, nodes = failing
    assert daemonset['failed'] is True
    headline = daemonset['msg'].split('\n', 1)[0]
    assert headline.startswith('DaemonSet kube-system/cilium not reached after 2.')
    assert 'DaemonSet kube-system/cilium Ready on 2/3 eligible nodes: w-2 cilium-' in headline
    assert 'CrashLoopBackOff (container cilium-agent' in headline
    assert [d['name'] for d in daemonset['details'] if not d['ok']] == ['w-2']
    assert nodes['failed'] is True
    assert nodes['msg'].split('\n', 1)[0].endswith('nodes Ready 2/3: w-2 NetworkPluginNotReady')
    assert 'pods not Ready there: kube-system/cilium-' in nodes['msg'] and 'CrashLoopBackOff' in nodes['msg']

    # Now wait for real, follow the progress file while waiting, and clear the fault mid-wait.
    progress = lab.files / 'progress.jsonl'
    command, env = playbook_command(lab, [
        gate({'gate': 'nodes', 'expected_count': 3, 'wait_timeout': 120, 'wait_sleep': 5, 'progress_file': str(progress)}),
        gate({'gate': 'workload', 'kind': 'DaemonSet', 'namespace': 'kube-system', 'name': 'cilium', 'wait_timeout': 60}),
    ], name='recover')
    running = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        def progress_says_not_ready():
            lines = progress.read_text().splitlines() if progress.exists() else []
            events = [json.loads(line) for line in lines]
            return any(e['event'] == 'progress' and 'w-2 NetworkPluginNotReady' in e['summary'] for e in events), events
        wait_until(progress_says_not_ready, timeout=120, interval=0.1, what='a progress line naming w-2')
        lab.clear_crash_loop('w-2')
        stdout, stderr = running.communicate(timeout=300)
    finally:
        if running.poll() is None:
            running.kill()
    nodes, daemonset = parse(stdout, stderr)
    assert not nodes.get('failed'), nodes.get('msg')
    assert nodes['summary'] == 'nodes Ready 3/3'
    assert nodes['progress'][0]['summary'] == 'nodes Ready 2/3: w-2 NetworkPluginNotReady'
    assert nodes['progress'][-1]['summary'] == 'nodes Ready 3/3'
    events = [json.loads(line) for line in progress.read_text().splitlines()]
    assert events[0]['event'] == 'start' and events[-1] == dict(events[-1], event='end', ok=True, summary='nodes Ready 3/3')
    assert not daemonset.get('failed') and daemonset['summary'] == 'DaemonSet kube-system/cilium Ready on 3/3 eligible nodes'


CNI_GATES = [
    {'title': 'Kubernetes API ready', 'gate': 'api'},
    {'title': 'ALL nodes registered', 'gate': 'nodes', 'node_state': 'registered', 'names': ['cp-1', 'w-1', 'w-2'], 'expected_count': 3},
    {'title': 'a Ready Cilium agent on every node', 'gate': 'pods', 'namespace': 'kube-system', 'label_selectors': ['k8s-app=cilium'],
     'every_node': True, 'expected_count': 3},
    {'title': 'ALL nodes Ready', 'gate': 'nodes', 'names': ['cp-1', 'w-1', 'w-2'], 'expected_count': 3},
    {'title': 'Cilium agent DaemonSet', 'gate': 'workload', 'kind': 'DaemonSet', 'namespace': 'kube-system', 'name': 'cilium'},
]
TITLES = [item['title'] for item in CNI_GATES]


def test_several_gates_in_one_run_stop_at_the_first_failing_one_and_name_it(lab):
    ensure(lab.apps.create_namespaced_daemon_set, 'kube-system', CILIUM)
    lab.crash_loop('w-2', 'kube-system/cilium')
    # w-2 was Ready: its agent now crash-loops (the node stays Ready: the CNI config its agent wrote stays on the node)
    wait_until(lambda: _crash_looping(lab, 'w-2'), timeout=WAIT, what='the agent on w-2 in CrashLoopBackOff')
    items = [dict(item) for item in CNI_GATES]
    items[2]['wait_timeout'] = 1   # its own deadline; the module's is 300
    bad_item = [dict(CNI_GATES[0]), {'title': 'operator', 'gate': 'workload', 'kind': 'Deployment', 'namespace': 'kube-system'}]
    failing, invalid = play(lab, [
        gate({'gates': items, 'wait_timeout': 300, 'wait_sleep': 0.2}, name='Cilium gates'),
        gate({'gates': bad_item}, name='bad item'),
    ], name='gates-crashloop')
    assert failing['failed'] is True and failing['changed'] is False
    first = failing['msg'].split('\n', 1)[0]
    assert first.startswith("gate 'a Ready Cilium agent on every node' (step 3 of 5) failed: pods k8s-app=cilium in namespace kube-system "
                            "not reached after 1.")
    assert 'w-2' in first and 'CrashLoopBackOff' in failing['msg']
    assert failing['msg'].splitlines()[-2:] == ['passed before it: Kubernetes API ready, ALL nodes registered',
                                                'not run: ALL nodes Ready, Cilium agent DaemonSet']
    assert [step['title'] for step in failing['results']] == TITLES[:3]
    assert [(g['name'], g['ok']) for g in failing['gates']] == [(TITLES[0], True), (TITLES[1], True), (TITLES[2], False)]
    assert 1 <= failing['results'][2]['elapsed'] < 30 and failing['not_run'] == TITLES[3:]
    assert invalid['failed'] is True
    assert invalid['msg'] == 'gates[1] (operator): gate is workload but all of the following are missing: name'
    assert 'results' not in invalid

    lab.clear_crash_loop('w-2')
    for extra in ((), ('--check',)):
        passing, = play(lab, [gate({'gates': CNI_GATES, 'wait_timeout': 120}, name='Cilium gates')], name='gates-healthy', extra_args=extra)
        assert not passing.get('failed'), passing.get('msg')
        assert passing['changed'] is False and passing['not_run'] == []
        assert [(g['name'], g['ok']) for g in passing['gates']] == [(title, True) for title in TITLES]
        assert [step['summary'] for step in passing['results']] == [
            'API /readyz ok', 'nodes registered 3/3', 'pods k8s-app=cilium Ready 3/3, on nodes 3/3', 'nodes Ready 3/3',
            'DaemonSet kube-system/cilium Ready on 3/3 eligible nodes']
        assert passing['report_facts_by_host']['w-2']['kubernetes_ready'] is True


def test_a_healthy_cluster_passes_every_gate_unchanged_also_in_check_mode(lab):
    ensure(lab.apps.create_namespaced_daemon_set, 'kube-system', CILIUM)
    lab.clear_crash_loop('w-2')
    tasks = [
        gate({'gate': 'nodes', 'names': ['cp-1', 'w-1', 'w-2'], 'wait_timeout': 60}),
        gate({'gate': 'workload', 'kind': 'DaemonSet', 'namespace': 'kube-system', 'name': 'cilium', 'wait_timeout': 60}),
        gate({'gate': 'pods', 'namespace': 'kube-system', 'label_selectors': ['k8s-app=cilium'], 'every_node': True, 'wait_timeout': 60}),
    ]
    for extra in ((), ('--check',)):
        results = play(lab, tasks, name='healthy', extra_args=extra)
        assert [r.get('failed', False) for r in results] == [False, False, False], [r.get('msg') for r in results]
        assert [r['changed'] for r in results] == [False, False, False]
    assert results[2]['summary'] == 'pods k8s-app=cilium Ready 3/3, on nodes 3/3'


def test_anti_affinity_leaves_a_replica_pending_and_accepting_schedulable_replicas_passes(lab):
    ensure(lab.apps.create_namespaced_daemon_set, 'kube-system', CILIUM)
    ensure(lab.apps.create_namespaced_deployment, 'kube-system', SPREAD)

    def three_available_one_unschedulable():
        pods = lab.core.list_namespaced_pod('kube-system', label_selector='app=spread').items
        unschedulable = [p for p in pods if any(c.type == 'PodScheduled' and c.reason == 'Unschedulable' for c in p.status.conditions or ())]
        available = lab.apps.read_namespaced_deployment('spread', 'kube-system').status.available_replicas
        return available == 3 and len(unschedulable) == 1, (available, len(unschedulable))
    # the state the 2 s gate judges: kube-scheduler has tried the fourth replica, the ReplicaSet counts three available
    wait_until(three_available_one_unschedulable, timeout=WAIT, what='three replicas available and one unschedulable')
    target = {'gate': 'workload', 'kind': 'Deployment', 'namespace': 'kube-system', 'name': 'spread'}
    strict, accepting = play(lab, [
        gate(dict(target, wait_timeout=2, wait_sleep=0.2)),
        gate(dict(target, accept_unschedulable_replicas=True, wait_timeout=60)),
    ], name='spread')
    assert strict['failed'] is True
    assert 'Deployment kube-system/spread available 3/4: ' in strict['msg'].split('\n', 1)[0]
    pending = [d for d in strict['details'] if not d['ok']]
    assert len(pending) == 1 and pending[0]['node'] is None
    # kube-scheduler's own message (k8s.io/kubernetes v1.36.3 pkg/scheduler/framework/types.go:903 NoNodeAvailableMsg
    # "0/%v nodes are available", plugins/interpodaffinity/filtering.go:41 ErrReasonAntiAffinityRulesNotMatch)
    assert pending[0]['reason'].startswith('Pending Unschedulable: 0/3 nodes are available')
    assert "didn't match pod anti-affinity rules" in pending[0]['reason']
    assert not accepting.get('failed'), accepting.get('msg')
    assert accepting['summary'].startswith('Deployment kube-system/spread available 3/4 (3 required: 3 of 4 replicas can be scheduled')


def _kustomization(name):
    return {'apiVersion': 'kustomize.toolkit.fluxcd.io/v1', 'kind': 'Kustomization',
            'metadata': {'name': name, 'namespace': 'default'}, 'spec': {'interval': '10m', 'path': './apps'}}


def _set_status(lab, name, conditions, observed=None):
    obj = lab.custom.get_namespaced_custom_object('kustomize.toolkit.fluxcd.io', 'v1', 'default', 'kustomizations', name)
    generation = obj['metadata']['generation']
    conds = [dict(c, lastTransitionTime='2026-11-25T12:00:00Z', observedGeneration=c.get('observedGeneration', generation))
             for c in conditions]
    lab.custom.patch_namespaced_custom_object_status('kustomize.toolkit.fluxcd.io', 'v1', 'default', 'kustomizations', name,
                                                     {'status': {'observedGeneration': observed or generation, 'conditions': conds}})
    return generation


def test_crds_and_flux_style_conditions(lab):
    ensure(lab.extensions.create_custom_resource_definition, KUSTOMIZATION_CRD)
    crd_name = KUSTOMIZATION_CRD['metadata']['name']

    def established():
        conditions = lab.extensions.read_custom_resource_definition(crd_name).status.conditions or []
        return any(c.type == 'Established' and c.status == 'True' for c in conditions), conditions

    wait_until(established, what='the Kustomization CRD Established')
    for name in ('apps', 'broken'):
        ensure(lab.custom.create_namespaced_custom_object, 'kustomize.toolkit.fluxcd.io', 'v1', 'default', 'kustomizations',
               _kustomization(name))
    _set_status(lab, 'apps', [{'type': 'Ready', 'status': 'True', 'reason': 'ReconciliationSucceeded', 'message': 'Applied revision: main@sha1:4f7a'}])
    _set_status(lab, 'broken', [
        {'type': 'Ready', 'status': 'False', 'reason': 'BuildFailed', 'message': "kustomize build failed: 'apps' not found"},
        {'type': 'Stalled', 'status': 'True', 'reason': 'BuildFailed', 'message': "kustomize build failed: 'apps' not found"}])
    ks = {'gate': 'condition', 'api_version': 'kustomize.toolkit.fluxcd.io/v1', 'kind': 'Kustomization', 'namespace': 'default'}
    crds, missing_crd, ready, stalled = play(lab, [
        gate({'gate': 'crds', 'label_selectors': ['app.kubernetes.io/part-of=flux'], 'wait_timeout': 30}),
        gate({'gate': 'crds', 'names': ['kustomizations.kustomize.toolkit.fluxcd.io', 'helmreleases.helm.toolkit.fluxcd.io'],
              'wait_timeout': 1, 'wait_sleep': 0.2}),
        gate(dict(ks, name='apps', wait_timeout=30)),
        gate(dict(ks, name='broken', wait_timeout=300)),
    ], name='flux')
    assert not crds.get('failed') and crds['summary'] == 'CRDs Established 1/1'
    assert missing_crd['failed'] and 'helmreleases.helm.toolkit.fluxcd.io not found' in missing_crd['msg']
    assert not ready.get('failed') and ready['summary'] == 'Kustomization Ready=True 1/1'
    assert ready['details'][0]['generation'] == ready['details'][0]['observed_generation']
    # Stalled fails at once instead of waiting out its 300 s
    assert stalled['failed'] and stalled['attempts'] == 1
    assert stalled['msg'].startswith('Kustomization default/broken failed (will not recover without a change)')
    assert "- default/broken: Stalled BuildFailed: kustomize build failed: 'apps' not found" in stalled['msg']

    # A spec change bumps the generation: Ready=True from the old generation no longer counts.
    lab.custom.patch_namespaced_custom_object('kustomize.toolkit.fluxcd.io', 'v1', 'default', 'kustomizations', 'apps',
                                              {'spec': {'path': './apps-v2'}})
    lagging, = play(lab, [gate(dict(ks, name='apps', wait_timeout=1, wait_sleep=0.2))], name='lag')
    assert lagging['failed']
    assert 'not reconciled yet: condition Ready observedGeneration 1 != generation 2' in lagging['msg']


def test_the_gate_rides_out_a_restarting_api_server(lab):
    """A node joins while kube-apiserver restarts (as when Talos restarts its static pod): the refused connections are
    'not yet', and the gate passes once the node is Ready.

    On lab/k8s this was fault_api_flap, 503 for half of every second. Upstream kube-apiserver has no such switch; the
    nearest real event is the process going away and coming back, which a client sees as connections refused (the
    gate's 'Kubernetes API at HOST:PORT unreachable: ...', plugins/module_utils/_k8s/client.py), not as a 503."""
    ensure(lab.apps.create_namespaced_daemon_set, 'kube-system', CILIUM)
    lab.clear_crash_loop('w-2')
    progress = lab.files / 'restart.jsonl'
    command, env = playbook_command(lab, [gate({'gate': 'nodes', 'names': ['cp-1', 'w-1', 'w-2', 'w-3'],
                                                'wait_timeout': 120, 'wait_sleep': 0.2, 'progress_file': str(progress)})],
                                    name='restart')
    running = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)

    def progress_says(text):
        def probe():
            lines = progress.read_text().splitlines() if progress.exists() else []
            summaries = [json.loads(line)['summary'] for line in lines]
            return any(text in summary for summary in summaries) or running.poll() is not None, summaries[-3:]
        return probe
    try:
        wait_until(progress_says('w-3 not registered'), timeout=120, interval=0.1, what='the gate waiting for w-3')
        # killed, not stopped gracefully: a graceful stop outlasts the leader-election renew deadline of
        # kube-controller-manager and kube-scheduler, which then exit (ControlPlane.stop_process says why)
        lab.stop_process('kube-apiserver', kill=True)
        try:
            wait_until(progress_says('unreachable'), timeout=30, interval=0.1, what='the gate reading nodes while kube-apiserver is down')
        finally:
            lab.start_process('kube-apiserver')
        survivors = {p['name']: p['running'] for p in lab.status()}
        assert survivors['kube-controller-manager'] and survivors['kube-scheduler'], survivors
        lab.register_node('w-3', addresses=['127.0.0.4'])
        stdout, stderr = running.communicate(timeout=300)
    finally:
        if running.poll() is None:
            running.kill()
    result, = parse(stdout, stderr)
    assert not result.get('failed'), result.get('msg')
    summaries = [entry['summary'] for entry in result['progress']]
    assert summaries[0] == 'nodes Ready 3/4: w-3 not registered', summaries
    assert any('unreachable' in s and 'Connection refused' in s for s in summaries), summaries
    assert summaries[-1] == 'nodes Ready 4/4'
