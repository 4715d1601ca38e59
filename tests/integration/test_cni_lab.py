"""The cni stage against lab clusters: inline Cilium on 3+3, a crash-looping agent, a single control plane, Helm.

Each module-scoped cluster is a lab of its own (time scale 0) taken through site.yml up to the cni stage; kubectl
and helm are the npm package's binaries from .tools/bin, talking to the lab API with the kubeconfig the run wrote.
"""
import os
import re

import pytest

from k8s_stages_lab import PLAYBOOK_BIN, THROUGH_APPS, THROUGH_CNI, TOOLS, StageCluster

pytestmark = [
    pytest.mark.lab, pytest.mark.slow,
    pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)'),
    pytest.mark.skipif(not os.access(os.path.join(TOOLS, 'helm'), os.X_OK), reason='no helm in .tools/bin (make setup)'),
]

CNI_GATES = ['Kubernetes API ready', 'ALL nodes registered', 'a Ready Cilium agent on every node', 'ALL nodes Ready',
             'Cilium operator available (as many replicas as can be scheduled now)']
GATES_TASK = 'Gates - Kubernetes API ready, ALL nodes registered'


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    """3 control planes + 3 workers, site.yml through the apps stage once."""
    handle = StageCluster.start(str(tmp_path_factory.mktemp('cni')), control_planes=3, workers=3)
    try:
        handle.first = handle.site('--tags', THROUGH_APPS)
        yield handle
    finally:
        handle.stop()


def gate_order(run):
    """The names of the gates of the cni play, in the order they ran: a `Gate - ` task's name, or each gate a
    task lists in its result's `gates` (the run report's convention 0)."""
    names = []
    for play in run.data['plays']:
        if not play['play']['name'].startswith('Stage cni'):
            continue
        for task in play['tasks']:
            name = task['task']['name'].split(' : ', 1)[-1]   # the JSON callback may prefix the role
            listed = [result.get('gates') for result in task['hosts'].values() if isinstance(result.get('gates'), list)]
            if listed:
                names.extend(gate['name'] for gate in listed[0])
            elif name.startswith('Gate - ') and not all(result.get('skipped') for result in task['hosts'].values()):
                names.append(name[len('Gate - '):])   # a skipped one (the other cni_mode's tasks) did not run
    return names


def changed_tasks(run):
    """[(task name, host)] of every result that reported changed: what a re-run that should change nothing did."""
    return [(task['task']['name'], host) for play in run.data['plays'] for task in play['tasks']
            for host, result in task['hosts'].items() if result.get('changed')]


def gate_result(run, title):
    """[(host, result)] of the cni gate with that title, from the result of the stage's one gates task."""
    return [(host, step) for host, result in run.results(GATES_TASK) for step in result.get('results', [])
            if step['title'] == title]


def test_inline_cilium_passes_the_gates_in_order_and_a_rerun_changes_nothing(cluster):
    first = cluster.first
    assert first.rc == 0, first.explain()
    assert gate_order(first) == CNI_GATES
    (host, gates), = first.results(GATES_TASK)   # one module run for the five gates
    assert [gate['ok'] for gate in gates['gates']] == [True] * 5
    (host, report), = first.results('Cilium operator replicas - available, and schedulable now')
    assert report['msg'] == ('cilium-operator: Deployment kube-system/cilium-operator available 2/2; 2 of 2 schedulable now')
    (host, agents), = gate_result(first, 'a Ready Cilium agent on every node')
    assert agents['passed'] is True and agents['summary'] == 'DaemonSet kube-system/cilium Ready on 6/6 eligible nodes'

    again = cluster.site('--tags', 'cni,apps')
    assert again.rc == 0, again.explain()
    assert set(again.changed().values()) == {0}, changed_tasks(again)

    # check mode over the healthy cluster: every gate probes once and passes, nothing would change
    checked = cluster.site('--tags', 'cni,apps', '--check')
    assert checked.rc == 0, checked.explain()
    assert set(checked.changed().values()) == {0}, changed_tasks(checked)
    (host, gates), = checked.results(GATES_TASK)
    assert [step['attempts'] for step in gates['results']] == [1] * 5


def test_kubectl_and_helm_from_the_npm_package_read_the_lab_cluster(cluster):
    daemonset = cluster.kubectl_json('-n', 'kube-system', 'get', 'daemonset', 'cilium', '--show-managed-fields')
    assert daemonset['status']['numberReady'] == 6
    managers = set(entry['manager'] for entry in daemonset['metadata']['managedFields'])
    assert 'talos' in managers, 'inline Cilium is created by Talos (field manager talos), got %s' % managers
    config = cluster.kubectl_json('-n', 'kube-system', 'get', 'configmap', 'cilium-config')['data']
    assert (config['cluster-name'], config['cluster-id'], config['ipam'], config['kube-proxy-replacement']) == ('lab', '3', 'kubernetes', 'true')
    assert config['ipv4-native-routing-cidr'] == '10.244.0.0/16' and config['cgroup-root'] == '/sys/fs/cgroup'
    nodes = cluster.kubectl('get', 'nodes', '--no-headers').stdout.splitlines()
    assert len(nodes) == 6 and all(' Ready ' in line for line in nodes), nodes
    releases = cluster.helm('list', '-A', '-o', 'json').stdout
    assert '"name":"widget-operator"' in releases and '"status":"deployed"' in releases


def test_a_crashlooping_cilium_agent_fails_the_cni_gate_naming_the_node_and_the_reason(cluster):
    cluster.lab.fault('k8s-crashloop', 'lab-w-3')
    try:
        failed = cluster.site('--tags', 'cni', '-e', 'cni_agents_timeout=2', '-e', 'cni_wait_sleep=1')
        assert failed.rc != 0
        (task, host, message), = failed.failures()
        assert GATES_TASK in task
        first, rest = message.split('\n', 1)
        assert first.startswith("gate 'a Ready Cilium agent on every node' (step 3 of 5) failed: "
                                'DaemonSet kube-system/cilium not reached after 2.')
        assert 'DaemonSet kube-system/cilium Ready on 5/6 eligible nodes: lab-w-3 cilium-' in first
        assert rest.endswith('not run: ALL nodes Ready, Cilium operator available (as many replicas as can be scheduled now)')
        (host, gates), = failed.results(GATES_TASK)
        assert [(gate['name'], gate['ok']) for gate in gates['gates']] == [(name, name != CNI_GATES[2]) for name in CNI_GATES[:3]]
        assert re.search(r'- lab-w-3: cilium-\w+ CrashLoopBackOff \(container cilium-agent, \d+ restarts?, last exit code 1 Error\)',
                         rest), rest
        assert 'lab-w-1' not in rest and 'lab-w-2' not in rest
    finally:
        cluster.lab.clear('k8s-crashloop', 'lab-w-3')
    healed = cluster.site('--tags', 'cni')
    assert healed.rc == 0, healed.explain()


def test_inline_mode_without_the_manifest_in_the_talos_values_fails_naming_the_variable(cluster):
    run = cluster.site('--tags', 'cni', '-e', '{"talos_machines_cluster_values_cni": {}}')
    assert run.rc != 0
    (task, host, message), = run.failures()
    assert 'Inline Cilium - the control planes' in task
    assert "no inline manifest named 'cilium' is in the cluster values' inline_manifests (talos_machines_cluster_values_cni" in message
    assert 'cni_inline_check=false' in message


@pytest.fixture(scope='module')
def single(tmp_path_factory):
    """One control plane, no worker, through the cni stage."""
    handle = StageCluster.start(str(tmp_path_factory.mktemp('cni-single')), control_planes=1, workers=0)
    try:
        handle.first = handle.site('--tags', THROUGH_CNI)
        yield handle
    finally:
        handle.stop()


def test_single_control_plane_passes_with_one_operator_replica_of_two_schedulable(single):
    run = single.first
    assert run.rc == 0, run.explain()
    (host, gate), = gate_result(run, CNI_GATES[4])
    assert gate['passed'] is True
    assert gate['summary'].startswith('Deployment kube-system/cilium-operator available 1/2 (1 required: 1 of 2 replicas can be '
                                      'scheduled on 1 eligible node(s) (required pod anti-affinity on kubernetes.io/hostname allows 1)')
    (host, report), = run.results('Cilium operator replicas - available, and schedulable now')
    assert report['msg'].endswith('; 1 of 2 schedulable now')
    pods = single.kubectl_json('-n', 'kube-system', 'get', 'pods', '-l', 'io.cilium/app=operator')['items']
    phases = sorted(pod['status']['phase'] for pod in pods)
    assert phases == ['Pending', 'Running']
    pending = next(pod for pod in pods if pod['status']['phase'] == 'Pending')
    scheduled = next(c for c in pending['status']['conditions'] if c['type'] == 'PodScheduled')
    assert (scheduled['status'], scheduled['reason']) == ('False', 'Unschedulable')
    # the scheduler names the first filter the one node fails: the upstream chart's operator asks for host ports
    # (hostNetwork), which the Running replica holds - the NodePorts filter runs before InterPodAffinity
    # (k8s.io/kubernetes v1.36.3 pkg/scheduler/apis/config/v1/default_plugins.go:40, 47); the lab's stand-in chart asks
    # for none, so there it is the anti-affinity
    host_ports = [p for c in pending['spec']['containers'] for p in c.get('ports') or () if p.get('hostPort')]
    expected = "didn't have free ports for the requested pod ports" if host_ports else "didn't match pod anti-affinity rules"
    assert '0/1 nodes are available: 1 node(s) ' + expected in scheduled['message']


@pytest.fixture(scope='module')
def helm_cluster(tmp_path_factory):
    """One control plane and one worker, Cilium by Helm (the lab's local chart), through the cni stage."""
    handle = StageCluster.start(str(tmp_path_factory.mktemp('cni-helm')), control_planes=1, workers=1)
    try:
        handle.first = handle.site('--tags', THROUGH_CNI, '-e', 'cni_mode=helm')
        yield handle
    finally:
        handle.stop()


def test_helm_mode_installs_the_release_gates_it_and_a_rerun_changes_nothing(helm_cluster):
    first = helm_cluster.first
    assert first.rc == 0, first.explain()
    (host, release), = first.results('Helm Cilium - install or upgrade the release with the Talos values')
    assert release['changed'] is True
    status = helm_cluster.helm('status', 'cilium', '-n', 'kube-system', '-o', 'json').stdout
    assert '"status":"deployed"' in status
    values = helm_cluster.helm('get', 'values', 'cilium', '-n', 'kube-system', '-o', 'json').stdout
    for expected in ('"k8sServicePort":7445', '"kubeProxyReplacement":true', '"hostRoot":"/sys/fs/cgroup"', '"replicas":2'):
        assert expected in values.replace(' ', ''), values
    (host, report), = first.results('Cilium operator replicas - available, and schedulable now')
    assert report['msg'].endswith('available 2/2; 2 of 2 schedulable now')

    again = helm_cluster.site('--tags', 'cni', '-e', 'cni_mode=helm')
    assert again.rc == 0, again.explain()
    assert set(again.changed().values()) == {0}, again.changed()


def test_helm_mode_without_a_helm_binary_names_the_option(helm_cluster):
    run = helm_cluster.site('--tags', 'cni', '-e', 'cni_mode=helm', '-e', 'cni_helm_binary=/nonexistent/helm')
    assert run.rc != 0
    (task, host, message), = run.failures()
    assert task.endswith('Helm Cilium - fail clearly without helm')
    assert message.startswith('cni_mode=helm needs the helm binary, and cni_helm_binary (/nonexistent/helm) was not found')
    assert 'cni_mode=inline' in message
