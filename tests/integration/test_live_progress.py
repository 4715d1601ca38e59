"""Live progress: what a waiting gate sees is on the terminal while it waits, before its result.

Upstream Kubernetes on loopback (lab/k8s_upstream ControlPlane: kube-apiserver, the real controllers and scheduler,
kwok nodes; one control plane and two workers, whatever world PROXTALOS_LAB_KUBERNETES chooses) with the Cilium agent
crash-looping on w-2 from its start (the crash-loop fault set before the DaemonSet exists), so w-2 stays NotReady
for its network as its kubelet reports it (lab/k8s_upstream/kubelet.py): the nodes gate waits, naming w-2. The test reads
ansible-playbook's stdout (default callback, timeline callback enabled) while it runs; once the
progress line is there it clears the fault, so the gate can only pass after that line was printed.
Under a JSON stdout callback nothing is added: stdout stays one JSON document.
"""
import json
import os
import pathlib
import shutil
import subprocess
import tempfile

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

PROGRESS = '  [lab-cp-1] Gate - ALL nodes Ready: nodes Ready 2/3: w-2 NetworkPluginNotReady ('


def _ready(plane, name):
    node = plane.api('GET', '/api/v1/nodes/' + name)
    return next((c for c in node['status'].get('conditions') or () if c['type'] == 'Ready'), {})


def _agent_waiting(plane, node):
    pods = plane.api('GET', '/api/v1/namespaces/kube-system/pods?labelSelector=k8s-app%3Dcilium')['items']
    return [s.get('state', {}).get('waiting', {}).get('reason') for p in pods if p['spec'].get('nodeName') == node
            for s in p['status'].get('containerStatuses') or ()]


@pytest.fixture
def lab(tmp_path_factory):
    """Three nodes; the Cilium agent of w-2 crash-loops from its start (fault set before the DaemonSet exists).

    A control plane per test (about 10 s each): every test needs w-2 NotReady for its network at its start, and a node
    whose agent once ran stays Ready (its CNI config stays), so a cleared fault cannot be set back for the next test.
    Before the test, the state the gates judge: cp-1 and w-1 Ready, the agent on w-2 reported in CrashLoopBackOff (the
    real controllers, scheduler and kwok act on their own time, where lab/k8s answered at once)."""
    plane = ControlPlane(str(tmp_path_factory.mktemp('controlplane')), nodes_wait_for_cni=True)
    plane.start()
    try:
        plane.register_node('cp-1', labels={'node-role.kubernetes.io/control-plane': ''}, addresses=['127.0.0.1'],
                            taints=[{'key': 'node-role.kubernetes.io/control-plane', 'effect': 'NoSchedule'}])
        plane.register_node('w-1', addresses=['127.0.0.2'])
        plane.register_node('w-2', addresses=['127.0.0.3'])
        for name in ('cp-1', 'w-1', 'w-2'):
            wait_until(lambda name=name: (_ready(plane, name).get('message') == kubelet.NETWORK_NOT_READY, _ready(plane, name)),
                       timeout=WAIT, what='%s NotReady as its kubelet reports it' % name)
        wait_until(lambda: (any(sa['metadata']['name'] == 'default'
                                for sa in plane.api('GET', '/api/v1/namespaces/kube-system/serviceaccounts')['items']), None),
                   timeout=WAIT, what='ServiceAccount kube-system/default')
        plane.crash_loop('w-2', 'kube-system/cilium')
        client = kubernetes.config.new_client_from_config(plane.kubeconfig)
        kubernetes.client.AppsV1Api(client).create_namespaced_daemon_set('kube-system', CILIUM)
        wait_until(lambda: (_agent_waiting(plane, 'w-2') == ['CrashLoopBackOff'], _agent_waiting(plane, 'w-2')), timeout=WAIT,
                   what='the agent on w-2 in CrashLoopBackOff')
        wait_until(lambda: ([_ready(plane, n).get('status') for n in ('cp-1', 'w-1')] == ['True', 'True'], None), timeout=WAIT,
                   what='cp-1 and w-1 Ready once their agents are')
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def short_tmp():
    """An empty TMPDIR for the run, short enough for the Unix socket of ansible-core's local RPC server (a socket path
    must stay under 108 bytes: one under pytest's tmp_path, with xdist's popen-gwN in it, is too long)."""
    folder = tempfile.mkdtemp(prefix='proxtalos-lp-', dir='/tmp')
    try:
        yield pathlib.Path(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_run(folder, kubeconfig, wait_timeout, temporary, task=None):
    inventory = folder / 'hosts.yml'
    inventory.write_text(yaml.safe_dump({'all': {'hosts': {'lab-cp-1': {
        'ansible_connection': 'local', 'ansible_python_interpreter': '{{ ansible_playbook_python }}',
        'cluster_name': 'progress'}}}}))
    playbook = folder / 'site.yml'
    playbook.write_text(yaml.safe_dump([{
        'name': 'Stage cni', 'hosts': 'all', 'gather_facts': False, 'tags': ['cni'],
        'tasks': [task or {'name': 'Gate - ALL nodes Ready', 'proxtalos.cluster.k8s_gate': {
            'kubeconfig': kubeconfig, 'gate': 'nodes', 'expected_count': 3,
            'wait_timeout': wait_timeout, 'wait_sleep': 0.5}}],
    }], sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_STDOUT_CALLBACK='ansible.builtin.default',
               ANSIBLE_CALLBACKS_ENABLED='proxtalos.cluster.timeline', PROXTALOS_REPORT_DIR=str(folder / 'report'),
               PROXTALOS_PROGRESS_INTERVAL='0', ANSIBLE_NOCOLOR='1', ANSIBLE_FORCE_COLOR='0',
               ANSIBLE_LOCAL_TEMP=str(folder / 'ansible-local'), TMPDIR=str(temporary))
    env.pop('PROXTALOS_PROGRESS_FILE', None)
    return [PLAYBOOK_BIN, '-i', str(inventory), str(playbook)], env, temporary


def run_until_progress_then_clear(lab, command, env, output, line, what):
    """Run the playbook; once `line` is on its stdout (the gate still waiting on the fault), clear the lab's
    faults and let it finish. Returns its stdout; the run must have passed."""
    with open(str(output), 'w', encoding='utf-8') as stdout:
        running = subprocess.Popen(command, stdout=stdout, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        def progress_printed():
            text = output.read_text()
            return line in text or running.poll() is not None, text[-2000:]
        wait_until(progress_printed, timeout=240, interval=0.1, what=what)
        assert running.poll() is None, output.read_text()   # still waiting: the fault is still there
        lab.clear_crash_loop('w-2')
        running.wait(timeout=300)
    finally:
        if running.poll() is None:
            running.kill()
    text = output.read_text()
    assert running.returncode == 0, text
    return text


def test_the_progress_line_is_printed_while_the_gate_waits_and_before_its_result(lab, tmp_path, short_tmp):
    command, env, temporary = write_run(tmp_path, lab.kubeconfig, wait_timeout=240, temporary=short_tmp)
    text = run_until_progress_then_clear(lab, command, env, tmp_path / 'stdout.txt', PROGRESS,
                                         'the progress line on stdout')
    progress_at = text.index(PROGRESS)
    result_at = text.index('ok: [lab-cp-1]')
    assert text.index('TASK [Gate - ALL nodes Ready]') < progress_at < result_at
    assert text.count(PROGRESS) == 1                   # the summary did not change while it waited: one line
    # the follower's folder (under TMPDIR) is gone, and the run's own variable did not leak into the report
    assert os.listdir(str(temporary)) == []
    with open(str(tmp_path / 'report' / 'progress' / 'report.json'), encoding='utf-8') as stream:
        report = json.load(stream)
    assert [gate['ok'] for gate in report['gates']] == [True]


def test_under_a_json_stdout_callback_nothing_is_added(lab, tmp_path, short_tmp):
    command, env, temporary = write_run(tmp_path, lab.kubeconfig, wait_timeout=3, temporary=short_tmp)
    env['ANSIBLE_STDOUT_CALLBACK'] = 'ansible.posix.json'
    process = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert process.returncode == 2, process.stdout[-2000:] + process.stderr[-2000:]
    result = json.loads(process.stdout)['plays'][0]['tasks'][0]['hosts']['lab-cp-1']
    assert result['failed'] and result['summary'] == 'nodes Ready 2/3: w-2 NetworkPluginNotReady'
    assert 'NetworkPluginNotReady (' not in process.stderr
    assert os.listdir(str(temporary)) == []


GATES_PROGRESS = '  [lab-cp-1] Gates - API, then nodes: ALL nodes Ready: nodes Ready 2/3: w-2 NetworkPluginNotReady ('


def test_with_several_gates_in_one_task_the_progress_line_names_the_gate_being_waited_on(lab, tmp_path, short_tmp):
    task = {'name': 'Gates - API, then nodes', 'proxtalos.cluster.k8s_gate': {
        'kubeconfig': lab.kubeconfig, 'wait_sleep': 0.5, 'wait_timeout': 240,
        'gates': [{'title': 'Kubernetes API ready', 'gate': 'api'},
                  {'title': 'ALL nodes Ready', 'gate': 'nodes', 'expected_count': 3}]}}
    command, env, _temporary = write_run(tmp_path, lab.kubeconfig, wait_timeout=240, temporary=short_tmp, task=task)
    text = run_until_progress_then_clear(lab, command, env, tmp_path / 'stdout.txt', GATES_PROGRESS,
                                         'the progress line of the second gate on stdout')
    assert text.index('TASK [Gates - API, then nodes]') < text.index(GATES_PROGRESS) < text.index('ok: [lab-cp-1]')
    # the run report has one gate record per gate of the task, by its title
    with open(str(tmp_path / 'report' / 'progress' / 'report.json'), encoding='utf-8') as stream:
        report = json.load(stream)
    assert [(gate['name'], gate['ok'], gate['host']) for gate in report['gates']] == [
        ('Kubernetes API ready', True, 'lab-cp-1'), ('ALL nodes Ready', True, 'lab-cp-1')]
    assert report['gates'][1]['observation'] == 'nodes Ready 3/3'
