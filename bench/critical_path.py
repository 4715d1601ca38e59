"""The critical path of the delays a lab imposed: the shortest time any orchestrator could have taken.

The lab records every delay it imposes (`python -m lab delays --json`): kind, target, start, the planned
seconds (profile value x time scale) and the real duration. A bootstrap cannot end before the longest chain
of delays that gate one another has passed, however fast the orchestrator reacts. That chain is the critical
path; the ratio wall time / critical path is what the collection adds (1.0 = nothing).

Definition
----------
Each recorded delay (outcome `done`) is a step. Of the steps with the same kind and target only the first
counts: later ones are refreshes (a GitRepository fetched again at its interval) or repeats caused by the
orchestrator (a second run, a remediation reboot), not something the bootstrap had to wait for.

A step's weight is its planned seconds (what the world imposed, independent of how busy the machine was);
PVE tasks, which fakepve times itself, weigh their measured duration.

Each step can start only once its prerequisites have ended. The prerequisites are what the real systems
need, not the order the collection happens to use (stage order is the collection's choice and counts as
overhead):

    pve_task qmcreate:V      every image download (the ISO must be on the storage)
    pve_task qmstart:V       qmcreate:V
    vm_boot N                qmstart of N's vmid
    talos_install_reboot N   vm_boot N (the config can be applied once the node answers)
    etcd_bootstrap N         talos_install_reboot N
    etcd_join N              talos_install_reboot N, etcd_bootstrap (of the cluster)
    talos_apid_cert N        talos_install_reboot N, and the first control plane up (ANY control plane's
                             talos_install_reboot: trustd on one of them signs the certificate)
    kubelet_start N          control plane: its etcd_bootstrap or etcd_join; worker: talos_apid_cert N
                             (else talos_install_reboot N)
    pod_ready P on node N    the API (etcd_bootstrap), kubelet_start N; unless P uses the host network,
                             N's network: the pod_ready of the CNI agent on N (label k8s-app=cilium, the
                             lab's rule for NetworkReady); and what its workload's creation needs:
                               - applied by Flux Kustomization K (label kustomize.toolkit.fluxcd.io/name):
                                 flux_reconcile K
                               - of a bootstrap release R (Helm release annotation, or the only release in
                                 P's namespace unless that is kube-system, where Talos's own workloads run):
                                 the pods of every release R needs
    flux_git_fetch G         the source-controller pods
    flux_reconcile K         the kustomize-controller pods, the first fetch of K's source, the reconcile of
                             the Kustomization that applied K (if any), and for each D in K.dependsOn: D
                             Ready = flux_reconcile D and the pods of D's workloads (health checks)

With stage_contract=True the collection's documented stage order holds too, rather than only the physical needs:
the pods of the bootstrap releases wait for the Cilium agent on every node (the apps stage writes after the cni
stage's gate, which waits for all of them; Flux's controllers do not: site.yml applies them right after the
kubeconfig stage). With handoff_before_apps=False (flux_handoff decided after_apps: the tree needs the releases), the
first fetch of a GitRepository waits for the pods of every bootstrap release ("the releases a cluster needs before
GitOps takes over"), and so for every agent too. With True, site.yml hands Flux the repository before the cni stage's
gates, after the bootstrap stage's services gate and the cni stage's kubelet check of every worker: the first fetch
waits for the source controller and the kubelet of every node (not for every agent), and the releases' pods also
wait for the flux stage's gates: the pods of every Deployment in Flux's namespace (its controllers) and the first
fetch. The difference between the two critical paths is what the stage order costs; what is left between the stage-order
critical path and the wall time is the collection's own time.

Earliest finish: EF(s) = max(EF(p) for p in prerequisites(s)) + weight(s) (an ANY group contributes its
smallest EF). The cluster's critical path is max EF over all steps; the chain is found by walking back from
that step through the prerequisite that set each start. Kinds without a rule (talos_reboot, etcd_start,
crashloop_restart, ...) are what a remediation or a fault adds: they are listed as `unmodelled` and left out,
which can only make the critical path shorter and the ratio larger (never flatter the collection).

On upstream Kubernetes (python -m lab up --kubernetes upstream) the lab records the node delays only (PVE tasks, VM
boot, the Talos install, etcd, kubelet): kube-scheduler, kube-controller-manager and kwok make pods Ready without a
pod_ready delay, and with --flux upstream Flux's own controllers fetch and reconcile without flux_git_fetch or
flux_reconcile records. The rules above hold for what is recorded; the chain then ends at the last kubelet_start, and
what the upstream processes take after it counts as the collection's time in the ratio. world_latencies() names that
time per object (creation -> Ready of the pods and Kustomizations without a record).
"""

import re

CNI_AGENT_LABEL = ('k8s-app', 'cilium')
KUSTOMIZATION_LABEL = 'kustomize.toolkit.fluxcd.io/name'
KUSTOMIZATION_NS_LABEL = 'kustomize.toolkit.fluxcd.io/namespace'
HELM_RELEASE_ANNOTATION = 'meta.helm.sh/release-name'
HELM_NAMESPACE_ANNOTATION = 'meta.helm.sh/release-namespace'
SOURCE_CONTROLLER = 'source-controller'
KUSTOMIZE_CONTROLLER = 'kustomize-controller'
NODE_KINDS = ('vm_boot', 'talos_install_reboot', 'talos_apid_cert', 'etcd_bootstrap', 'etcd_join', 'kubelet_start')
MODELLED = NODE_KINDS + ('pve_task', 'pod_ready', 'flux_git_fetch', 'flux_reconcile')


class Facts(object):
    """What the rules need to know about the world besides the delays.

    control_planes, workers: node names (= VM names = inventory hosts)
    vmids: {VM name: vmid}
    pods: {'ns/name': {'node': str, 'host_network': bool, 'labels': {}, 'workload': 'Kind/ns/name' or None}}
    workloads: {'Kind/ns/name': {'labels': {}, 'annotations': {}}}
    kustomizations: {'ns/name': {'depends_on': ['ns/name'], 'source': 'ns/name' or None, 'labels': {}}}
    releases: {'ns/name': {'needs': ['ns/name']}} (the bootstrap apps, from the inventory)
    """

    def __init__(self, control_planes=(), workers=(), vmids=None, pods=None, workloads=None, kustomizations=None,
                 releases=None):
        self.control_planes = list(control_planes)
        self.workers = list(workers)
        self.vmids = dict(vmids or {})
        self.pods = dict(pods or {})
        self.workloads = dict(workloads or {})
        self.kustomizations = dict(kustomizations or {})
        self.releases = dict(releases or {})

    def as_dict(self):
        return {'control_planes': self.control_planes, 'workers': self.workers, 'vmids': self.vmids,
                'pods': self.pods, 'workloads': self.workloads, 'kustomizations': self.kustomizations,
                'releases': self.releases}


class Step(object):
    """One counted delay: key (kind, target), weight, and after the computation its earliest start/finish."""

    __slots__ = ('kind', 'target', 'weight', 'record', 'start', 'finish', 'cause')

    def __init__(self, record):
        self.kind = record['kind']
        self.target = record['target']
        self.record = record
        planned = float(record.get('planned') or 0.0)
        measured = float(record.get('duration') or 0.0)
        self.weight = measured if self.kind == 'pve_task' else planned
        self.start = None
        self.finish = None
        self.cause = None

    @property
    def key(self):
        return (self.kind, self.target)

    def as_dict(self):
        return {'kind': self.kind, 'target': self.target, 'weight': round(self.weight, 3),
                'earliest_start': round(self.start, 3), 'earliest_finish': round(self.finish, 3),
                'recorded_start': self.record.get('start'), 'recorded_duration': self.record.get('duration')}


class CriticalPath(object):
    """The result: length (seconds), the chain of steps, and what was left out."""

    def __init__(self, length, chain, steps, unmodelled, unmatched):
        self.length = length
        self.chain = chain
        self.steps = steps
        self.unmodelled = unmodelled
        self.unmatched = unmatched

    def as_dict(self):
        return {'seconds': round(self.length, 3), 'chain': [s.as_dict() for s in self.chain],
                'steps': len(self.steps), 'unmodelled': self.unmodelled, 'unmatched_pods': self.unmatched}

    def summary(self):
        return ' -> '.join('%s %s (%.1f s)' % (s.kind, s.target, s.weight) for s in self.chain)


def _split_pod(target):
    match = re.match(r'^pod/([^/]+)/(.+)$', target)
    return '%s/%s' % (match.group(1), match.group(2)) if match else None


def _split_ref(target):
    """'Kustomization/ns/name' -> ('Kustomization', 'ns/name')."""
    kind, _sep, rest = target.partition('/')
    return kind, rest


class _Rules(object):
    """The prerequisites of each step, from the facts and the steps present."""

    def __init__(self, facts, steps, stage_contract=False, handoff_before_apps=False):
        self.facts = facts
        self.steps = steps
        self.stage_contract = stage_contract
        self.handoff_before_apps = handoff_before_apps
        self.control_planes = set(facts.control_planes)
        self.pods_by_workload = {}
        self.cni_pod_on_node = {}
        for pod_key, pod in facts.pods.items():
            self.pods_by_workload.setdefault(pod.get('workload'), []).append(pod_key)
            labels = pod.get('labels') or {}
            if labels.get(CNI_AGENT_LABEL[0]) == CNI_AGENT_LABEL[1] and pod.get('node'):
                self.cni_pod_on_node.setdefault(pod['node'], pod_key)
        self.etcd_bootstrap = [k for k in steps if k[0] == 'etcd_bootstrap']
        self.downloads = [k for k in steps if k[0] == 'pve_task' and k[1].startswith('download:')]

    def _have(self, *keys):
        return [k for k in keys if k in self.steps]

    def _pods_of(self, workload_keys):
        found = []
        for workload in workload_keys:
            found += [('pod_ready', 'pod/' + p) for p in self.pods_by_workload.get(workload, ())]
        return self._have(*found)

    def _workloads_named(self, name):
        return [w for w in self.facts.workloads if w.split('/')[-1] == name]

    def _workloads_of_kustomization(self, ks_key):
        namespace, name = ks_key.split('/', 1)
        found = []
        for workload, info in self.facts.workloads.items():
            labels = info.get('labels') or {}
            if labels.get(KUSTOMIZATION_LABEL) == name and labels.get(KUSTOMIZATION_NS_LABEL, namespace) == namespace:
                found.append(workload)
        return found

    def _release_of(self, workload, pod_namespace):
        info = self.facts.workloads.get(workload) or {}
        annotations = info.get('annotations') or {}
        if annotations.get(HELM_RELEASE_ANNOTATION):
            key = '%s/%s' % (annotations.get(HELM_NAMESPACE_ANNOTATION, pod_namespace), annotations[HELM_RELEASE_ANNOTATION])
            if key in self.facts.releases:
                return key
        if pod_namespace == 'kube-system':
            return None   # Talos's own workloads (CoreDNS, an inline CNI) live there: only the Helm annotation tells
        in_namespace = [r for r in self.facts.releases if r.split('/', 1)[0] == pod_namespace]
        return in_namespace[0] if len(in_namespace) == 1 else None

    def _workloads_of_release(self, release):
        namespace = release.split('/', 1)[0]
        return [w for w in self.facts.workloads if w.split('/')[1] == namespace and self._release_of(w, namespace) == release]

    def prerequisites(self, key):
        """[(mode, [keys])]: mode 'all' (every key must end first) or 'any' (the first to end is enough)."""
        kind, target = key
        method = getattr(self, '_' + kind, None)
        return method(target) if method else []

    # --- PVE and nodes -------------------------------------------------------------------------

    def _pve_task(self, target):
        operation, _sep, ident = target.partition(':')
        if operation == 'qmcreate':
            return [('all', list(self.downloads))]
        if operation == 'qmstart':
            return [('all', self._have(('pve_task', 'qmcreate:' + ident)))]
        return []

    def _vm_boot(self, node):
        vmid = self.facts.vmids.get(node)
        return [('all', self._have(('pve_task', 'qmstart:%s' % vmid)))] if vmid is not None else []

    def _talos_install_reboot(self, node):
        return [('all', self._have(('vm_boot', node)))]

    def _etcd_bootstrap(self, node):
        return [('all', self._have(('talos_install_reboot', node)))]

    def _etcd_join(self, node):
        return [('all', self._have(('talos_install_reboot', node)) + list(self.etcd_bootstrap))]

    def _talos_apid_cert(self, node):
        issuers = self._have(*[('talos_install_reboot', cp) for cp in self.facts.control_planes])
        groups = [('all', self._have(('talos_install_reboot', node)))]
        if issuers:
            groups.append(('any', issuers))
        return groups

    def _kubelet_start(self, node):
        if node in self.control_planes:
            return [('all', self._have(('etcd_bootstrap', node), ('etcd_join', node)))]
        return [('all', self._have(('talos_apid_cert', node)) or self._have(('talos_install_reboot', node)))]

    # --- Kubernetes and Flux -------------------------------------------------------------------

    def _pod_ready(self, target):
        pod_key = _split_pod(target)
        pod = self.facts.pods.get(pod_key)
        if pod is None:
            return []
        needs = list(self.etcd_bootstrap)
        node = pod.get('node')
        needs += self._have(('kubelet_start', node))
        if not pod.get('host_network'):
            agent = self.cni_pod_on_node.get(node)
            if agent and agent != pod_key:
                needs += self._have(('pod_ready', 'pod/' + agent))
        workload = pod.get('workload')
        labels = ((self.facts.workloads.get(workload) or {}).get('labels')) or {}
        if labels.get(KUSTOMIZATION_LABEL):
            ks = '%s/%s' % (labels.get(KUSTOMIZATION_NS_LABEL, pod_key.split('/')[0]), labels[KUSTOMIZATION_LABEL])
            needs += self._have(('flux_reconcile', 'Kustomization/' + ks))
        else:
            release = self._release_of(workload, pod_key.split('/')[0]) if workload else None
            for needed in (self.facts.releases.get(release) or {}).get('needs') or ():
                needs += self._pods_of(self._workloads_of_release(needed))
            if self.stage_contract and release and pod_key not in self.cni_pod_on_node.values():
                # written only after the cni stage's gate: a Ready agent on every node
                needs += self._every_agent()
                if self.handoff_before_apps:
                    # and after the flux play before the apps stage, whose gates wait for every Flux controller and
                    # the first fetch
                    needs += self._flux_controller_pods() + self._have(*[k for k in self.steps if k[0] == 'flux_git_fetch'])
        return [('all', needs)]

    def _flux_controller_pods(self):
        namespaces = set(w.split('/')[1] for w in self._workloads_named(SOURCE_CONTROLLER))
        return self._pods_of([w for w in self.facts.workloads if w.split('/')[0] == 'Deployment' and w.split('/')[1] in namespaces])

    def _every_agent(self):
        return self._have(*[('pod_ready', 'pod/' + agent) for agent in self.cni_pod_on_node.values()])

    def _flux_git_fetch(self, target):
        del target
        needs = self._pods_of(self._workloads_named(SOURCE_CONTROLLER))
        if self.stage_contract and not self.handoff_before_apps:
            # handed over after the releases, so after the cni stage's gate (a Ready agent on every node) too
            needs += self._every_agent()
            for release in self.facts.releases:
                needs += self._pods_of(self._workloads_of_release(release))
        elif self.stage_contract:
            # handed over before the cni stage's gates, but after the bootstrap stage's services gate and the cni
            # stage's kubelet check of every worker: the kubelet of every node runs
            needs += self._have(*[k for k in self.steps if k[0] == 'kubelet_start'])
        return [('all', needs)]

    def _flux_reconcile(self, target):
        kind, ks_key = _split_ref(target)
        needs = self._pods_of(self._workloads_named(KUSTOMIZE_CONTROLLER))
        info = self.facts.kustomizations.get(ks_key) if kind == 'Kustomization' else None
        if info is None:
            return [('all', needs)]
        if info.get('source'):
            needs += self._have(('flux_git_fetch', 'GitRepository/' + info['source']))
        labels = info.get('labels') or {}
        if labels.get(KUSTOMIZATION_LABEL):
            creator = '%s/%s' % (labels.get(KUSTOMIZATION_NS_LABEL, ks_key.split('/')[0]), labels[KUSTOMIZATION_LABEL])
            if creator != ks_key:
                needs += self._have(('flux_reconcile', 'Kustomization/' + creator))
        for dependency in info.get('depends_on') or ():
            needs += self._have(('flux_reconcile', 'Kustomization/' + dependency))
            needs += self._pods_of(self._workloads_of_kustomization(dependency))
        return [('all', needs)]


def select_steps(records):
    """The first `done` record of each (kind, target) of a modelled kind; the other kinds, counted."""
    steps, unmodelled = {}, {}
    for record in sorted(records, key=lambda r: (r.get('start') or 0.0, r.get('seq') or 0)):
        if record.get('outcome') != 'done':
            continue
        if record['kind'] not in MODELLED:
            unmodelled[record['kind']] = unmodelled.get(record['kind'], 0) + 1
            continue
        key = (record['kind'], record['target'])
        if key not in steps:
            steps[key] = Step(record)
    return steps, unmodelled


def compute(records, facts, stage_contract=False, handoff_before_apps=False):
    """The critical path of `records` (the lab's delay records) under the rules above (stage_contract: also the
    stage order, with Flux handed the repository before or after the bootstrap releases)."""
    steps, unmodelled = select_steps(records)
    unmatched = sorted(k[1] for k in steps if k[0] == 'pod_ready' and _split_pod(k[1]) not in facts.pods)
    for key in list(steps):
        if key[0] == 'pod_ready' and _split_pod(key[1]) not in facts.pods:
            del steps[key]   # a pod that no longer exists (replaced): not part of the end state
    rules = _Rules(facts, steps, stage_contract, handoff_before_apps)
    visiting = set()

    def finish(key):
        step = steps[key]
        if step.finish is not None:
            return step.finish
        if key in visiting:
            raise ValueError('the prerequisites of %s %s form a cycle' % key)
        visiting.add(key)
        candidates = []   # (finish, key): what each group lets this step start after
        for mode, keys in rules.prerequisites(key):
            ends = [(finish(k), k) for k in keys if k in steps and k != key]
            if ends:
                candidates.append((min if mode == 'any' else max)(ends))
        start, cause = max(candidates) if candidates else (0.0, None)
        visiting.discard(key)
        step.start, step.cause = start, cause
        step.finish = start + step.weight
        return step.finish

    for key in steps:
        finish(key)
    if not steps:
        return CriticalPath(0.0, [], steps, unmodelled, unmatched)
    last = max(steps.values(), key=lambda s: (s.finish, s.weight))
    chain = []
    cursor = last
    while cursor is not None:
        chain.append(cursor)
        cursor = steps.get(cursor.cause) if cursor.cause else None
    chain.reverse()
    return CriticalPath(last.finish, chain, steps, unmodelled, unmatched)


# --------------------------------------------------------------------------------- collecting the facts

def _owner(meta, kinds):
    for ref in meta.get('ownerReferences') or ():
        if ref.get('kind') in kinds:
            return ref['kind'], ref['name']
    return None


def facts_from_objects(hosts, vms, pods, replicasets, workloads, kustomizations, releases):
    """Facts from plain API objects.

    hosts: {'controlplane': [...], 'worker': [...]}; vms: lab status VM rows (vmid, name);
    pods, replicasets, workloads (Deployments, DaemonSets, StatefulSets, each with kind), kustomizations:
    Kubernetes objects as dicts; releases: the bootstrap releases as the inventory lists them
    (name, namespace, needs).
    """
    rs_owner = {}
    for rs in replicasets:
        meta = rs['metadata']
        owner = _owner(meta, ('Deployment',))
        if owner:
            rs_owner['%s/%s' % (meta['namespace'], meta['name'])] = 'Deployment/%s/%s' % (meta['namespace'], owner[1])
    pod_facts = {}
    for pod in pods:
        meta, spec = pod['metadata'], pod.get('spec') or {}
        namespace = meta['namespace']
        workload = None
        owner = _owner(meta, ('ReplicaSet', 'DaemonSet', 'StatefulSet', 'Job'))
        if owner and owner[0] == 'ReplicaSet':
            workload = rs_owner.get('%s/%s' % (namespace, owner[1]), 'ReplicaSet/%s/%s' % (namespace, owner[1]))
        elif owner:
            workload = '%s/%s/%s' % (owner[0], namespace, owner[1])
        pod_facts['%s/%s' % (namespace, meta['name'])] = {
            'node': spec.get('nodeName'), 'host_network': bool(spec.get('hostNetwork')),
            'labels': dict(meta.get('labels') or {}), 'workload': workload}
    workload_facts = {}
    for obj in workloads:
        meta = obj['metadata']
        workload_facts['%s/%s/%s' % (obj['kind'], meta['namespace'], meta['name'])] = {
            'labels': dict(meta.get('labels') or {}), 'annotations': dict(meta.get('annotations') or {})}
    ks_facts = {}
    for ks in kustomizations:
        meta, spec = ks['metadata'], ks.get('spec') or {}
        namespace = meta['namespace']
        source = spec.get('sourceRef') or {}
        ks_facts['%s/%s' % (namespace, meta['name'])] = {
            'depends_on': ['%s/%s' % (d.get('namespace', namespace), d['name']) for d in spec.get('dependsOn') or ()],
            'source': '%s/%s' % (source.get('namespace', namespace), source['name'])
            if source.get('kind') == 'GitRepository' and source.get('name') else None,
            'labels': dict(meta.get('labels') or {})}
    release_facts = {}
    for release in releases or ():
        if not isinstance(release, dict) or not release.get('name'):
            continue
        namespace = release.get('namespace') or 'default'
        release_facts['%s/%s' % (namespace, release['name'])] = {'needs': list(release.get('needs') or ())}
    return Facts(control_planes=hosts.get('controlplane', ()), workers=hosts.get('worker', ()),
                 vmids={vm['name']: vm['vmid'] for vm in vms}, pods=pod_facts, workloads=workload_facts,
                 kustomizations=ks_facts, releases=release_facts)


def read_objects(kubeconfig):
    """Pods, ReplicaSets, workloads and Flux Kustomizations of the cluster the kubeconfig reaches."""
    import json  # pylint: disable=import-outside-toplevel
    from kubernetes import client, config  # pylint: disable=import-outside-toplevel
    api = config.new_client_from_config(config_file=kubeconfig)
    try:
        core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)

        def items(call, kind=None):
            found = json.loads(call(_preload_content=False).data).get('items') or []
            for obj in found:
                if kind:
                    obj['kind'] = kind
            return found
        workloads = (items(apps.list_deployment_for_all_namespaces, 'Deployment')
                     + items(apps.list_daemon_set_for_all_namespaces, 'DaemonSet')
                     + items(apps.list_stateful_set_for_all_namespaces, 'StatefulSet'))
        try:
            kustomizations = custom.list_cluster_custom_object('kustomize.toolkit.fluxcd.io', 'v1', 'kustomizations')['items']
        except client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise
            kustomizations = []   # no Flux in this cluster
        return {'pods': items(core.list_pod_for_all_namespaces), 'replicasets': items(apps.list_replica_set_for_all_namespaces),
                'workloads': workloads, 'kustomizations': kustomizations}
    finally:
        api.close()


# ------------------------------------------------------------------ what the world took without a delay record

def _timestamp(text):
    import datetime  # pylint: disable=import-outside-toplevel
    return datetime.datetime.fromisoformat(text.replace('Z', '+00:00')).timestamp() if text else None


def _ready_since(obj):
    """Epoch seconds of the Ready condition's last transition to True, or None when it is not Ready."""
    for condition in (obj.get('status') or {}).get('conditions') or ():
        if condition.get('type') == 'Ready' and condition.get('status') == 'True':
            return _timestamp(condition.get('lastTransitionTime'))
    return None


def _spread(rows):
    """count, median, max and the five slowest of [(name, seconds)]."""
    values = sorted(seconds for _name, seconds in rows)
    if not values:
        return {'count': 0}
    return {'count': len(values), 'median': values[len(values) // 2], 'max': values[-1],
            'slowest': [list(row) for row in sorted(rows, key=lambda row: -row[1])[:5]]}


def world_latencies(objects, records):
    """What the world took between creating an object and its Ready condition when the lab recorded no delay for it:
    on upstream Kubernetes kube-scheduler, kube-controller-manager and kwok make pods Ready (the lab imposes no pod_ready
    delay there), and Flux's own controllers fetch and reconcile (no flux_git_fetch or flux_reconcile record). Such
    time is on the cluster's real critical path, but not in compute()'s, which only chains recorded delays: it can only
    make the critical path shorter and the ratio larger. Kubernetes timestamps have whole seconds.

    objects: read_objects(); records: the lab's delay records. Returns the recorded kinds (counted) and, for the pods
    and the Kustomizations without a record of their own, the creation -> Ready seconds (count, median, max, slowest).
    """
    kinds = {}
    recorded = set()
    for record in records:
        kinds[record['kind']] = kinds.get(record['kind'], 0) + 1
        recorded.add((record['kind'], record.get('target')))
    pods, kustomizations = [], []
    for pod in objects.get('pods') or ():
        meta = pod.get('metadata') or {}
        name = '%s/%s' % (meta.get('namespace'), meta.get('name'))
        ready, created = _ready_since(pod), _timestamp(meta.get('creationTimestamp'))
        if ready is not None and created is not None and ('pod_ready', 'pod/' + name) not in recorded:
            pods.append((name, ready - created))
    for kustomization in objects.get('kustomizations') or ():
        meta = kustomization.get('metadata') or {}
        name = '%s/%s' % (meta.get('namespace'), meta.get('name'))
        ready, created = _ready_since(kustomization), _timestamp(meta.get('creationTimestamp'))
        if ready is not None and created is not None and ('flux_reconcile', 'Kustomization/' + name) not in recorded:
            kustomizations.append((name, ready - created))
    return {'recorded_delay_kinds': dict(sorted(kinds.items())),
            'pods_created_to_ready_without_a_delay_record': _spread(pods),
            'kustomizations_created_to_ready_without_a_delay_record': _spread(kustomizations)}
