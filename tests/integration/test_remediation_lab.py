"""The cni stage's remediation of a worker whose kubelet waits on its volume, against a lab cluster (3+3, time scale 0).

The field scenario: the cluster runs, a worker reboots, and its kubelet then waits forever for /var/lib/kubelet
(lab fault talos-kubelet-volume; a Talos reboot clears it with probability p, a PVE hard reset always). The stage
is re-run (`--tags cni`): it must find the worker from Talos' own service events, try a Talos reboot, then a PVE hard
reset, log every step, and converge - or fail naming the node, the evidence and the steps tried. Every test leaves
the cluster converged for the next.
"""
import os

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait
from k8s_stages_lab import PLAYBOOK_BIN, StageCluster

pytestmark = [
    pytest.mark.lab, pytest.mark.slow,
    pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)'),
]

# Short deadlines: at time scale 0 a kubelet that can run, runs at once; these only bound the stuck cases.
FAST = ['-e', 'cni_remediate_detect_timeout=3', '-e', 'cni_remediate_wait_timeout=10', '-e', 'cni_remediate_wait_sleep=1']


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    yield from StageCluster.through_cni(str(tmp_path_factory.mktemp('remediation')), control_planes=3, workers=3)


def steps(run, host):
    """The remediation log entries (the `remediation` key of each step's log task) of one host."""
    return [result['remediation'] for name, result in run.results('Remediation step - log of the')
            if name == host and 'remediation' in result]


def assert_converged(run):
    assert run.rc == 0, run.explain()
    (host, gates), = run.results('Gates - Kubernetes API ready')   # the stage's gates, one k8s_gate run
    passed = dict((step['title'], step['passed']) for step in gates['results'])
    for gate in ('ALL nodes registered', 'a Ready Cilium agent on every node', 'ALL nodes Ready'):
        assert passed.get(gate) is True, (gate, gates['results'])


def test_a_talos_reboot_clears_a_kubelet_stuck_on_its_volume_and_the_run_converges(cluster):
    seen = cluster.stick_kubelet('lab-w-2', p=1.0)
    assert seen['msg'] == 'Waiting for volume "/var/lib/kubelet" to be mounted'
    run = cluster.site('--tags', 'cni', *FAST)
    assert_converged(run)
    # one run diagnosed every worker (run_once); each worker's part is under its inventory name
    (host, diagnosis), = run.results('Kubelet on the workers - running, or why not')
    assert sorted(diagnosis['nodes']) == ['lab-w-1', 'lab-w-2', 'lab-w-3']
    found = diagnosis['nodes']['lab-w-2']
    assert found['classification'] == 'waiting_on_volume' and found['volume'] == '/var/lib/kubelet'
    assert found['node'] == '%s:50000' % cluster.node_address('lab-w-2')
    assert diagnosis['nodes_remediable'] == ['lab-w-2'] and diagnosis['nodes_running'] == ['lab-w-1', 'lab-w-3']
    logged = steps(run, 'lab-w-2')
    assert [(step['action'], step['attempt'], step['outcome']) for step in logged] == [('talos reboot', 1, 'kubelet running')]
    assert 'Waiting for volume "/var/lib/kubelet" to be mounted' in logged[0]['reason']
    reset_tasks = [name for name, result in run.results("PVE hard reset of the worker's VM") if not result.get('skipped')]
    assert reset_tasks == [], 'no hard reset once the reboot cleared it'
    # the other workers were diagnosed, found running, and left alone
    assert steps(run, 'lab-w-1') == [] and steps(run, 'lab-w-3') == []
    # the reboot cleared the fault (p=1), so the lab lists it no more
    assert [fault for fault in cluster.lab.status()['lab']['faults'] if fault['name'] == 'talos-kubelet-volume'] == []


def test_with_p_zero_the_reboot_does_not_help_and_the_pve_hard_reset_does(cluster):
    cluster.stick_kubelet('lab-w-1', p=0.0)
    run = cluster.site('--tags', 'cni', *FAST)
    assert_converged(run)
    logged = steps(run, 'lab-w-1')
    assert [(step['action'], step['outcome']) for step in logged] == [('talos reboot', 'waiting_on_volume'),
                                                                      ('pve hard reset', 'kubelet running')]
    assert 'Waiting for volume "/var/lib/kubelet"' in logged[0]['evidence']
    resets = [event for event in cluster.lab.events() if event['event'] == 'reset' and event['name'] == 'lab-w-1']
    assert len(resets) == 1, 'the lab saw no VM reset of lab-w-1: %s' % cluster.lab.events()[-5:]


def test_out_of_attempts_it_fails_naming_the_node_the_evidence_and_the_steps_tried(cluster):
    cluster.stick_kubelet('lab-w-3', p=0.0)
    failed = cluster.site('--tags', 'cni', *FAST, '-e', 'cni_remediate_reset_attempts=0')
    assert failed.rc != 0
    (task, host, message), = failed.failures()
    assert host == 'lab-w-3' and task.endswith('fail naming the node, the evidence and the steps tried')
    address = cluster.node_address('lab-w-3')
    assert message.startswith('worker lab-w-3 (%s): kubelet still does not run after the remediation.' % address)
    assert 'Found: talos node %s:50000: kubelet is Waiting: Waiting for volume "/var/lib/kubelet" to be mounted' % address in message
    assert 'Tried: talos reboot #1 (done) -> ' in message and 'pve hard reset' not in message
    # the default attempts converge it again
    healed = cluster.site('--tags', 'cni', *FAST)
    assert_converged(healed)
    assert [step['action'] for step in steps(healed, 'lab-w-3')] == ['talos reboot', 'pve hard reset']


def test_with_remediation_off_the_gates_name_the_notready_worker_and_nothing_is_rebooted(cluster):
    cluster.stick_kubelet('lab-w-2', p=1.0)

    # The Node shows its kubelet stopped only once kube-controller-manager's node lifecycle controller has seen its
    # Lease run out (upstream Kubernetes: 40 s lease, 50 s grace; the lab/k8s world at once): the gates judge the Node as
    # kubectl shows it, so they run once kubectl shows it not Ready
    def not_ready():
        node = cluster.kubectl_json('get', 'node', 'lab-w-2')
        ready = [c['status'] for c in node['status'].get('conditions') or () if c['type'] == 'Ready']
        return ready != ['True'], ready
    seen = _wait.wait_for(not_ready, 180, interval=0.5, backoff=1.5, max_interval=2.0)
    assert seen.ok, 'lab-w-2 still Ready %s after its kubelet stopped' % seen.observation
    failed = cluster.site('--tags', 'cni', *FAST, '-e', 'cni_remediate=false', '-e', 'cni_agents_timeout=2',
                          '-e', 'cni_nodes_registered_timeout=2', '-e', 'cni_wait_sleep=1')
    assert failed.rc != 0
    assert failed.results('Talos reboot of the worker') == []
    (task, host, message), = failed.failures()
    assert 'lab-w-2' in message, message
    assert 'NodeStatusUnknown' in message or 'not registered' in message or 'no pod' in message, message
    healed = cluster.site('--tags', 'cni', *FAST)
    assert_converged(healed)
    assert [step['action'] for step in steps(healed, 'lab-w-2')] == ['talos reboot']


def test_the_remediation_runs_alone_with_tag_remediate(cluster):
    cluster.stick_kubelet('lab-w-1', p=1.0)
    run = cluster.site('--tags', 'remediate', *FAST)
    assert run.rc == 0, run.explain()
    assert run.results('Gates - Kubernetes API ready') == [], 'only the remediation ran'
    assert [(step['action'], step['outcome']) for step in steps(run, 'lab-w-1')] == [('talos reboot', 'kubelet running')]
    kubelet = cluster.kubelet('lab-w-1')
    assert kubelet is not None and kubelet['healthy'] is True
    assert_converged(cluster.site('--tags', 'cni', *FAST))


def test_two_stuck_workers_are_remediated_at_the_same_step_each_on_its_own_host(cluster):
    cluster.stick_kubelet('lab-w-1', p=1.0)
    cluster.stick_kubelet('lab-w-3', p=1.0)
    run = cluster.site('--tags', 'cni', *FAST)
    assert_converged(run)
    (host, diagnosis), = run.results('Kubelet on the workers - running, or why not')
    assert diagnosis['nodes_remediable'] == ['lab-w-1', 'lab-w-3']
    # one task (run_once) put the stuck workers, and only them, in the repair play's group, each with its log
    (host, stuck), = run.results('Workers whose kubelet waits on its volume')
    added = dict((item['cni_worker'], item['add_host']) for item in stuck['results'])
    assert sorted(added) == ['lab-w-1', 'lab-w-3']
    for worker, entry in added.items():
        assert entry['groups'] == ['proxtalos_cni_kubelet_stuck']
        assert entry['host_vars']['cni_remediation']['outcome'] == 'pending'
        assert entry['host_vars']['cni_kubelet']['classification'] == 'waiting_on_volume'
    # the repair is per worker: the same reboot task ran for both stuck workers, each under its own host (not one
    # host looping over them), and the healthy worker ran none of it
    rebooted = sorted(name for name, result in run.results('Talos reboot of the worker') if not result.get('skipped'))
    assert rebooted == ['lab-w-1', 'lab-w-3']
    for worker in ('lab-w-1', 'lab-w-3'):
        assert [(step['action'], step['outcome']) for step in steps(run, worker)] == [('talos reboot', 'kubelet running')]
    assert steps(run, 'lab-w-2') == []
    # the repair play ran on the stuck workers alone: the healthy worker has no result in it, not even a skipped one
    repaired = sorted(name for name, result in run.results('Talos reboot attempts'))
    assert repaired == ['lab-w-1', 'lab-w-3']


def test_check_mode_says_which_worker_would_be_remediated_and_reboots_nothing(cluster):
    cluster.stick_kubelet('lab-w-2', p=1.0)
    since = cluster.lab.last_seq('requests')
    checked = cluster.site('--tags', 'remediate', '--check', *FAST)
    assert checked.rc == 0, checked.explain()
    would = [(name, result['msg']) for name, result in checked.results('would be remediated') if not result.get('skipped')]
    assert len(would) == 1 and would[0][0] == 'lab-w-2', would
    assert 'Waiting for volume "/var/lib/kubelet" to be mounted' in would[0][1] and 'would try a Talos reboot' in would[0][1]
    assert [name for name, result in checked.results('Talos reboot of the worker') if not result.get('skipped')] == []
    # neither a Talos reboot nor a PVE reset (or any other write) reached the lab
    acted = [(request['source'], request['method'], request['path']) for request in cluster.lab.requests(since=since)
             if request['path'].endswith(('/Reboot', '/Reset', '/status/reset', '/status/stop', '/status/start'))]
    assert acted == [], 'check mode acted: %s' % acted
    healed = cluster.site('--tags', 'cni', *FAST)
    assert_converged(healed)
    assert [step['action'] for step in steps(healed, 'lab-w-2')] == ['talos reboot']


def test_skip_tags_remediate_runs_the_gates_without_the_kubelet_check(cluster):
    run = cluster.site('--tags', 'cni', '--skip-tags', 'remediate', *FAST)
    assert_converged(run)
    assert run.results('Kubelet on the workers') == [] and run.results('Workers whose kubelet waits on its volume') == []
    assert run.results('Talos reboot attempts') == []


def test_with_limit_only_the_limited_workers_are_checked_and_repaired(cluster):
    cluster.stick_kubelet('lab-w-2', p=1.0)
    run = cluster.site('--tags', 'cni', '--limit', 'lab-cp-2,lab-w-2', *FAST)
    assert_converged(run)
    (host, diagnosis), = run.results('Kubelet on the workers - running, or why not')
    assert host == 'lab-cp-2', 'the check runs on the first node of the limited set'
    assert sorted(diagnosis['nodes']) == ['lab-w-2']
    assert [(step['action'], step['outcome']) for step in steps(run, 'lab-w-2')] == [('talos reboot', 'kubelet running')]


def test_a_wrong_remediation_setting_in_a_workers_host_vars_fails_naming_the_worker(cluster):
    host_vars = os.path.join(cluster.inventory, 'host_vars')
    os.makedirs(host_vars, exist_ok=True)
    path = os.path.join(host_vars, 'lab-w-3.yml')
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write('cni_remediate_reset_attempts: twice\n')
    try:
        failed = cluster.site('--tags', 'cni', *FAST)
    finally:
        os.remove(path)
    assert failed.rc != 0
    (task, host, message), = failed.failures()
    assert task.endswith("Check each worker's settings of the kubelet check and the repair (node_ip, cni_remediate_* in host or group vars)")
    assert message == 'cni settings of the workers: lab-w-3: cni_remediate_reset_attempts must be a whole number of zero or more (got twice)'
    assert failed.results('Kubelet on the workers') == [], 'nothing was checked or repaired before the settings'
