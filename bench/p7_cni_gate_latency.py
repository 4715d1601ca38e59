"""P7: cni gate latency - the cni stage's Kubernetes gates, each made to wait and then released at a known moment.

A lab (1 control plane + 2 workers, time scale 0) is taken through site.yml up to the cni stage. Then, for each of
the stage's waiting gates, N times over:

1. the gate's condition is made false in the lab (a fault);
2. the gate runs (k8s_gate through ansible-playbook with the options the role gives that gate, and a progress
   file) and is seen polling (its first "progress" line: it observed the condition false). The role runs the
   stage's gates as the steps of one `gates` run; here each runs alone, so its latency is its own;
3. the fault is cleared; a watch on the lab API (the kubernetes client, on this machine) records the moment the
   condition became true in the API's objects;
4. the module's "end" line in the progress file is the moment the gate returned.

Latency = gate returned - condition true (both wall clock, this machine). It covers the gate's wake-up (a watch on
what it read, or its poll interval), its last probe and its result, not Ansible's process start or end (reported
apart as `process`). Gates:
- agents: `pods k8s-app=cilium, every_node` - a worker's Cilium agent crash-loops (k8s-crashloop), then recovers;
- operator: `Deployment cilium-operator, accept_unschedulable_replicas` - an operator pod is deleted while its
  replacement cannot be scheduled (k8s-pending), then it can;
- nodes: `nodes Ready` - a worker's kubelet waits on its volume after a Talos reboot (talos-kubelet-volume), then
  the volume comes.
Goal: median <= 1 s (as P4).
"""

import datetime
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time

import yaml

from bench.common import PLAYBOOK, ROOT, Benchmark, Metric, load_average, option, start_lab

GOAL = 1.0
SAMPLES = 10
WAIT_SLEEP = 2.0
TOOLS = os.path.join(ROOT, '.tools', 'bin')
THROUGH_CNI = 'preflight,vms,secrets,apply,bootstrap,kubeconfig,cni'


def percentile(values, fraction):
    """Nearest-rank percentile of the values (0 < fraction <= 1)."""
    ordered = sorted(values)
    rank = max(1, int(round(fraction * len(ordered) + 0.4999)))
    return ordered[min(rank, len(ordered)) - 1]


def _wait(predicate, timeout, what):
    """Poll predicate() until true (a setup step of the benchmark, not a measured gate)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError('benchmark setup: %s not seen within %ss' % (what, timeout))
        time.sleep(0.05)


class Cluster(object):
    """The lab, its inventory folder, artifacts, and a kubernetes client."""

    def __init__(self, lab, folder):
        self.lab = lab
        self.folder = folder
        self.inventory = os.path.join(folder, 'inventory')
        self.artifacts = os.path.join(folder, 'artifacts')
        os.makedirs(self.inventory)
        with open(lab.inventory, encoding='utf-8') as source, \
                open(os.path.join(self.inventory, 'hosts.yml'), 'w', encoding='utf-8') as target:
            target.write(source.read())
        for name in ('group_vars', 'files'):
            os.symlink(os.path.join(ROOT, 'inventories', 'lab', name), os.path.join(self.inventory, name))
        self.env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), PATH=TOOLS + os.pathsep + os.environ['PATH'],
                        ANSIBLE_LOCAL_TEMP=os.path.join(folder, 'tmp'), ANSIBLE_REMOTE_TEMP=os.path.join(folder, 'tmp'))
        self.api = None

    def playbook(self, path, *args):
        command = [PLAYBOOK, path, '-i', self.inventory, '-e', 'proxtalos_artifacts_dir=%s' % self.artifacts] + list(args)
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env, cwd=ROOT)

    def bring_up(self):
        process = self.playbook(os.path.join(ROOT, 'site.yml'), '--tags', THROUGH_CNI)
        output = process.communicate()[0]
        if process.returncode != 0:
            raise RuntimeError('site.yml through cni failed:\n%s' % output[-3000:])
        from kubernetes import client, config  # pylint: disable=import-outside-toplevel
        self.api = client.CoreV1Api(config.new_client_from_config(config_file=os.path.join(self.artifacts, 'kubeconfig')))
        self.apps = client.AppsV1Api(self.api.api_client)


def _now():
    return time.time()


def _parse_time(text):
    return datetime.datetime.fromisoformat(text).timestamp()


class Watcher(object):
    """Watches one collection of the lab API and records when a predicate over its objects first holds."""

    def __init__(self, list_call, holds, **list_args):
        self.list_call = list_call
        self.holds = holds
        self.list_args = list_args
        self.true_at = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(10)

    def _run(self):
        from kubernetes import watch  # pylint: disable=import-outside-toplevel
        objects = {}
        listed = self.list_call(**self.list_args)
        for item in listed.items:
            objects[item.metadata.name] = item
        stream = watch.Watch()
        for event in stream.stream(self.list_call, resource_version=listed.metadata.resource_version, timeout_seconds=120,
                                   **self.list_args):
            seen = _now()
            item = event['object']
            if event['type'] == 'DELETED':
                objects.pop(item.metadata.name, None)
            else:
                objects[item.metadata.name] = item
            if self.true_at is None and self.holds(list(objects.values())):
                self.true_at = seen
            if self._stop.is_set():
                stream.stop()


def _ready(conditions):
    return any(c.type == 'Ready' and c.status == 'True' for c in conditions or [])


def agents_ready(expected):
    return lambda pods: len(pods) == expected and all(_ready(p.status.conditions) and not p.metadata.deletion_timestamp for p in pods)


def nodes_ready(expected):
    return lambda nodes: len(nodes) == expected and all(_ready(n.status.conditions) for n in nodes)


def operator_available(replicas):
    return lambda deployments: any((d.status.available_replicas or 0) >= replicas for d in deployments)


class GateRun(object):
    """One k8s_gate task in its own ansible-playbook, with a progress file."""

    def __init__(self, cluster, name, args):
        self.progress = os.path.join(cluster.folder, 'progress-%s-%d.jsonl' % (name, time.monotonic_ns()))
        book = os.path.join(cluster.folder, 'gate-%s.yml' % name)
        task = dict(args, kubeconfig=os.path.join(cluster.artifacts, 'kubeconfig'), progress_file=self.progress,
                    wait_timeout=120, wait_sleep=WAIT_SLEEP)
        with open(book, 'w', encoding='utf-8') as handle:
            yaml.safe_dump([{'name': 'gate', 'hosts': 'controlplane[0]', 'gather_facts': False,
                             'tasks': [{'name': 'Gate', 'proxtalos.cluster.k8s_gate': task}]}], handle)
        self.process = cluster.playbook(book)

    def lines(self):
        if not os.path.exists(self.progress):
            return []
        with open(self.progress, encoding='utf-8') as handle:
            return [json.loads(line) for line in handle if line.strip()]

    def polling(self):
        return any(line['event'] == 'progress' for line in self.lines())

    def finish(self):
        output = self.process.communicate(timeout=300)[0]
        exited = _now()
        end = [line for line in self.lines() if line['event'] == 'end']
        if self.process.returncode != 0 or not end or not end[-1].get('ok'):
            raise RuntimeError('gate failed:\n%s' % output[-3000:])
        return _parse_time(end[-1]['time']), exited


def sample(cluster, name, gate_args, break_it, watcher, fix_it):
    """One measurement: (latency, process seconds after the gate returned)."""
    break_it()
    gate = GateRun(cluster, name, gate_args)
    _wait(gate.polling, 120, '%s gate polling' % name)
    watch = watcher().start()
    time.sleep(0.2)          # the watch is open before the condition can turn true
    fix_it()
    returned, exited = gate.finish()
    watch.stop()
    if watch.true_at is None:
        raise RuntimeError('%s: the watch never saw the condition true' % name)
    return returned - watch.true_at, exited - returned


def measure(cluster, samples):
    lab, api, apps = cluster.lab, cluster.api, cluster.apps
    nodes = len(api.list_node().items)
    worker = 'lab-w-1'
    results = {'agents': [], 'operator': [], 'nodes': []}
    process = []

    def agent_broken():
        pods = api.list_namespaced_pod('kube-system', label_selector='k8s-app=cilium', field_selector='spec.nodeName=%s' % worker).items
        return bool(pods) and not _ready(pods[0].status.conditions)

    def operator_short():
        deployment = apps.read_namespaced_deployment('cilium-operator', 'kube-system')
        return (deployment.status.available_replicas or 0) < 2

    def node_not_ready():
        return not _ready(api.read_node(worker).status.conditions)

    for index in range(samples):
        def break_agent():
            lab.fault('k8s-crashloop', worker)
            _wait(agent_broken, 60, 'the agent on %s crash-looping' % worker)
        latency, rest = sample(
            cluster, 'agents', {'gate': 'pods', 'namespace': 'kube-system', 'label_selectors': ['k8s-app=cilium'],
                                'every_node': True, 'expected_count': nodes}, break_agent,
            lambda: Watcher(api.list_namespaced_pod, agents_ready(nodes), namespace='kube-system', label_selector='k8s-app=cilium'),
            lambda: lab.clear('k8s-crashloop', worker))
        results['agents'].append(latency)
        process.append(rest)

        def break_operator():
            lab.fault('k8s-pending', 'kube-system/cilium-operator')
            pod = api.list_namespaced_pod('kube-system', label_selector='io.cilium/app=operator').items[0]
            api.delete_namespaced_pod(pod.metadata.name, 'kube-system')
            _wait(operator_short, 60, 'cilium-operator short of a replica')
        latency, rest = sample(
            cluster, 'operator', {'gate': 'workload', 'kind': 'Deployment', 'namespace': 'kube-system', 'name': 'cilium-operator',
                                  'accept_unschedulable_replicas': True}, break_operator,
            lambda: Watcher(apps.list_namespaced_deployment, operator_available(2), namespace='kube-system',
                            field_selector='metadata.name=cilium-operator'),
            lambda: lab.clear('k8s-pending', 'kube-system/cilium-operator'))
        results['operator'].append(latency)
        process.append(rest)

        def break_node():
            lab.fault('talos-kubelet-volume', worker, p=0.0)
            _reboot(cluster, worker)
            _wait(node_not_ready, 60, '%s NotReady' % worker)
        latency, rest = sample(
            cluster, 'nodes', {'gate': 'nodes', 'expected_count': nodes}, break_node,
            lambda: Watcher(api.list_node, nodes_ready(nodes)),
            lambda: lab.clear('talos-kubelet-volume', worker))
        results['nodes'].append(latency)
        process.append(rest)
        print('   sample %d/%d: agents %.3f s, operator %.3f s, nodes %.3f s'
              % (index + 1, samples, results['agents'][-1], results['operator'][-1], results['nodes'][-1]), flush=True)
    return results, process


def _reboot(cluster, host):
    """A Talos reboot of the node (its kubelet then waits on its volume: the fault is set with p=0)."""
    from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client  # pylint: disable=import-outside-toplevel
    address = next(vm['address'] for vm in cluster.lab.vms() if vm['name'] == host)
    with open(os.path.join(cluster.artifacts, 'talosconfig'), encoding='utf-8') as handle:
        credentials = client.TalosCredentials.from_talosconfig(yaml.safe_load(handle))
    with client.TalosClient(address, credentials=credentials, timeout=10) as talos:
        talos.reboot()


def run(options):
    samples = int(option(options, 'samples', SAMPLES))
    folder = tempfile.mkdtemp(prefix='bench-p7-')
    lab = start_lab(1, 2, 0.0, profile='realistic')
    load_before = load_average()
    try:
        cluster = Cluster(lab, folder)
        cluster.bring_up()
        results, process = measure(cluster, samples)
    finally:
        lab.stop()
    everything = [value for values in results.values() for value in values]
    median = statistics.median(everything)
    detail = {'samples_per_gate': samples, 'wait_sleep': WAIT_SLEEP,
              'per_gate': dict((name, {'median': round(statistics.median(values), 3), 'p95': round(percentile(values, 0.95), 3),
                                       'max': round(max(values), 3), 'values': [round(v, 4) for v in values]})
                               for name, values in results.items()),
              'process_after_return_median': round(statistics.median(process), 3),
              'load': [load_before, load_average()]}
    print('   latency median %.3f s, p95 %.3f s over %d gates' % (median, percentile(everything, 0.95), len(everything)), flush=True)
    metrics = [Metric('cni gate latency, median (%d gates)' % len(everything), round(median, 3), 's', goal='<= %.1f s' % GOAL,
                      met=median <= GOAL, detail=detail),
               Metric('cni gate latency, p95', round(percentile(everything, 0.95), 3), 's')]
    for name, values in results.items():
        metrics.append(Metric('%s gate latency, median / p95' % name, round(statistics.median(values), 3), 's',
                              detail={'p95': round(percentile(values, 0.95), 3)}))
    return metrics


BENCHMARK = Benchmark('p7_cni_gate_latency', 'P7 - cni gate latency (condition true in the lab -> k8s_gate returns)',
                      __doc__.strip(), run)
