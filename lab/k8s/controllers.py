"""The lab's kubelets, scheduler and workload controllers, in-process and event-driven.

They react to store changes (no polling): a change marks work items dirty and one asyncio task
reconciles them. What they write is what the real components write, to the fields clients read:

- kubelet: the Node (conditions, taints, addresses, nodeInfo), NotReady with reason
  KubeletNotReady / NetworkPluginNotReady until a Cilium agent (a pod labelled k8s-app=cilium)
  is Ready on it; pods go Running/Ready `pod_ready` seconds after they can start (their node is
  Ready, or they use the host network).
- scheduler: nodeName from nodeSelector, required node affinity, taints/tolerations and required
  pod anti-affinity; an unschedulable pod gets PodScheduled=False/Unschedulable with a
  scheduler-style message ("0/2 nodes are available: ...").
- DaemonSet, Deployment (through ReplicaSets), ReplicaSet, StatefulSet and Job controllers with
  the status fields and conditions the real controllers write.
- faults: a DaemonSet pod in CrashLoopBackOff on one node; a Deployment stuck Pending.
"""

import asyncio
import hashlib
import ipaddress
import json
import time
import uuid

from .patch import clone
from .selectors import match_label_selector
from .store import timestamp

NOT_READY_TAINT = {'key': 'node.kubernetes.io/not-ready', 'effect': 'NoSchedule'}
UNREACHABLE_TAINT = {'key': 'node.kubernetes.io/unreachable', 'effect': 'NoSchedule'}
CONTROL_PLANE_TAINT = {'key': 'node-role.kubernetes.io/control-plane', 'effect': 'NoSchedule'}
CNI_MESSAGE = ('container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns '
               'error: cni plugin not initialized')
CILIUM_LABEL = ('k8s-app', 'cilium')
DAEMONSET_TOLERATIONS = (
    {'key': 'node.kubernetes.io/not-ready', 'operator': 'Exists', 'effect': 'NoExecute'},
    {'key': 'node.kubernetes.io/unreachable', 'operator': 'Exists', 'effect': 'NoExecute'},
    {'key': 'node.kubernetes.io/disk-pressure', 'operator': 'Exists', 'effect': 'NoSchedule'},
    {'key': 'node.kubernetes.io/memory-pressure', 'operator': 'Exists', 'effect': 'NoSchedule'},
    {'key': 'node.kubernetes.io/pid-pressure', 'operator': 'Exists', 'effect': 'NoSchedule'},
    {'key': 'node.kubernetes.io/unschedulable', 'operator': 'Exists', 'effect': 'NoSchedule'},
)
_HASH_ALPHABET = 'bcdfghjklmnpqrstvwxz2456789'


def template_hash(template):
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    return ''.join(_HASH_ALPHABET[b % len(_HASH_ALPHABET)] for b in digest[:10])


def _suffix():
    return ''.join(_HASH_ALPHABET[b % len(_HASH_ALPHABET)] for b in uuid.uuid4().bytes[:5])


def tolerates(tolerations, taint):
    for toleration in tolerations or ():
        effect = toleration.get('effect')
        if effect and effect != taint.get('effect'):
            continue
        operator = toleration.get('operator', 'Equal')
        key = toleration.get('key')
        if operator == 'Exists' and (not key or key == taint.get('key')):
            return True
        if operator == 'Equal' and key == taint.get('key') and (toleration.get('value') or '') == (taint.get('value') or ''):
            return True
    return False


def _node_ready(node):
    for condition in (node.get('status') or {}).get('conditions') or ():
        if condition.get('type') == 'Ready':
            return condition.get('status') == 'True'
    return False


def _match_node_terms(terms, node):
    labels = node['metadata'].get('labels') or {}
    for term in terms or ():
        ok = True
        for expr in term.get('matchExpressions') or ():
            key, op, values = expr.get('key'), expr.get('operator'), expr.get('values') or []
            value = labels.get(key)
            if op == 'In' and value not in values:
                ok = False
            elif op == 'NotIn' and value in values:
                ok = False
            elif op == 'Exists' and key not in labels:
                ok = False
            elif op == 'DoesNotExist' and key in labels:
                ok = False
            elif op in ('Gt', 'Lt'):
                try:
                    number, limit = int(value), int(values[0])
                except (TypeError, ValueError, IndexError):
                    ok = False
                else:
                    ok = ok and (number > limit if op == 'Gt' else number < limit)
        for expr in term.get('matchFields') or ():
            if expr.get('key') == 'metadata.name':
                inside = node['metadata']['name'] in (expr.get('values') or [])
                if (expr.get('operator') == 'In') != inside:
                    ok = False
        if ok:
            return True
    return False


class Faults:
    """Active Kubernetes faults."""

    def __init__(self):
        self.crashloop = {}       # (namespace, daemonset, node) -> True
        self.pending = set()      # (namespace, deployment)
        self.image_pull = {}      # (namespace, deployment/daemonset/statefulset) -> registry error


class NodeAgent:
    """The kubelets: Node registration and status."""

    def __init__(self, controllers):
        self.c = controllers
        self.running = {}          # node name -> registration info
        self.cni_ready = set()     # nodes whose CNI config was written by a Ready Cilium agent
        self._next_cidr = 0
        self._cidrs = {}

    def _node_type(self):
        return self.c.rtype('', 'nodes')

    def kubelet_started(self, name, ip, control_plane=False, labels=None, taints=None, kubelet_version='v1.33.1', **info):  # pylint: disable=too-many-arguments
        self.running[name] = {'ip': ip, 'control_plane': control_plane, 'labels': dict(labels or {}), 'taints': taints,
                              'kubelet_version': kubelet_version, 'info': info}
        self._write(name)
        self.c.kick()

    def kubelet_stopped(self, name):
        self.running.pop(name, None)
        self.cni_ready.discard(name)
        node = self.c.store.peek(('', 'nodes'), '', name)
        if node is not None:
            new = clone(node)
            for condition in new['status']['conditions']:
                condition['status'] = 'Unknown'
                condition['reason'] = 'NodeStatusUnknown'
                condition['message'] = 'Kubelet stopped posting node status.'
                condition['lastTransitionTime'] = timestamp()
            taints = [t for t in new['spec'].get('taints') or () if t.get('key') not in (NOT_READY_TAINT['key'], UNREACHABLE_TAINT['key'])]
            new['spec']['taints'] = taints + [dict(UNREACHABLE_TAINT, timeAdded=timestamp())]
            self.c.store.internal_replace(self._node_type(), new, node)
        self.c.kick()

    def _pod_cidr(self, name):
        if name not in self._cidrs:
            self._cidrs[name] = str(ipaddress.ip_network('10.244.0.0/16').network_address + self._next_cidr * 256) + '/24'
            self._next_cidr += 1
        return self._cidrs[name]

    def _write(self, name):  # pylint: disable=too-many-locals
        info = self.running.get(name)
        if info is None:
            return
        store = self.c.store
        old = store.peek(('', 'nodes'), '', name)
        ready = name in self.cni_ready
        now = timestamp()
        labels = {'kubernetes.io/hostname': name, 'kubernetes.io/os': 'linux', 'kubernetes.io/arch': 'amd64',
                  'beta.kubernetes.io/os': 'linux', 'beta.kubernetes.io/arch': 'amd64'}
        if info['control_plane']:
            labels['node-role.kubernetes.io/control-plane'] = ''
        labels.update(info['labels'])
        base_taints = info['taints'] if info['taints'] is not None else ([dict(CONTROL_PLANE_TAINT)] if info['control_plane'] else [])
        if old is not None:
            # keep what clients changed on the Node (labels, taints they added), drop the kubelet's own
            kept_labels = dict(old['metadata'].get('labels') or {})
            kept_labels.update(labels)
            labels = kept_labels
            managed = {NOT_READY_TAINT['key'], UNREACHABLE_TAINT['key']}
            known = {t.get('key') for t in base_taints}
            base_taints = list(base_taints) + [t for t in old['spec'].get('taints') or () if t.get('key') not in managed | known]
        taints = [dict(t) for t in base_taints]
        if not ready:
            previous = next((t for t in (old or {}).get('spec', {}).get('taints') or () if t.get('key') == NOT_READY_TAINT['key']), None)
            taints.append(dict(NOT_READY_TAINT, timeAdded=(previous or {}).get('timeAdded', now)))
        conditions = []
        if ready:
            conditions.append({'type': 'NetworkUnavailable', 'status': 'False', 'reason': 'CiliumIsUp', 'message': 'Cilium is running on this node'})
        for kind, reason, message in (('MemoryPressure', 'KubeletHasSufficientMemory', 'kubelet has sufficient memory available'),
                                      ('DiskPressure', 'KubeletHasNoDiskPressure', 'kubelet has no disk pressure'),
                                      ('PIDPressure', 'KubeletHasSufficientPID', 'kubelet has sufficient PID available')):
            conditions.append({'type': kind, 'status': 'False', 'reason': reason, 'message': message})
        if ready:
            conditions.append({'type': 'Ready', 'status': 'True', 'reason': 'KubeletReady', 'message': 'kubelet is posting ready status'})
        else:
            conditions.append({'type': 'Ready', 'status': 'False', 'reason': 'KubeletNotReady', 'message': CNI_MESSAGE})
        old_conditions = {c['type']: c for c in ((old or {}).get('status') or {}).get('conditions') or ()}
        for condition in conditions:
            previous = old_conditions.get(condition['type'])
            same = previous is not None and previous.get('status') == condition['status']
            condition['lastHeartbeatTime'] = previous.get('lastHeartbeatTime', now) if same else now
            condition['lastTransitionTime'] = previous.get('lastTransitionTime', now) if same else now
        extra = info['info']
        cidr = self._pod_cidr(name)
        node = {
            'apiVersion': 'v1', 'kind': 'Node',
            'metadata': dict((old or {}).get('metadata') or {}, name=name, labels=labels),
            'spec': dict((old or {}).get('spec') or {}, podCIDR=cidr, podCIDRs=[cidr], taints=taints),
            'status': {
                'capacity': {'cpu': str(extra.get('cpu', 2)), 'memory': '%dKi' % (int(extra.get('memory_mb', 4096)) * 1024),
                             'pods': '110', 'ephemeral-storage': '%dKi' % (int(extra.get('disk_gb', 32)) * 1024 * 1024)},
                'allocatable': {'cpu': str(extra.get('cpu', 2)), 'memory': '%dKi' % (int(extra.get('memory_mb', 4096)) * 1024 - 262144),
                                'pods': '110', 'ephemeral-storage': '%dKi' % (int(extra.get('disk_gb', 32)) * 1024 * 1024 * 9 // 10)},
                'conditions': conditions,
                'addresses': [{'type': 'InternalIP', 'address': info['ip']}, {'type': 'Hostname', 'address': name}],
                'daemonEndpoints': {'kubeletEndpoint': {'Port': 10250}},
                'nodeInfo': {'machineID': hashlib.md5(name.encode()).hexdigest(), 'systemUUID': str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),  # nosec
                             'bootID': extra.get('boot_id', ''), 'kernelVersion': extra.get('kernel_version', '6.12.25-talos'),
                             'osImage': extra.get('os_image', 'Talos (v1.13.9)'),
                             'containerRuntimeVersion': extra.get('container_runtime', 'containerd://2.0.5'),
                             'kubeletVersion': info['kubelet_version'], 'kubeProxyVersion': '', 'operatingSystem': 'linux',
                             'architecture': 'amd64'},
            },
        }
        if old is None:
            node['metadata'].pop('resourceVersion', None)
            self.c.store.internal_create(self._node_type(), node)
        else:
            node['metadata'] = dict(node['metadata'], resourceVersion=old['metadata']['resourceVersion'])
            self.c.store.internal_replace(self._node_type(), node, old)

    def reconcile_cni(self):
        """A node's network is ready once a Cilium agent pod on it has been Ready."""
        changed = set()
        for pod in self.c.store.items(('', 'pods')):
            labels = pod['metadata'].get('labels') or {}
            node = (pod.get('spec') or {}).get('nodeName')
            if labels.get(CILIUM_LABEL[0]) == CILIUM_LABEL[1] and node in self.running and node not in self.cni_ready and _pod_ready(pod):
                self.cni_ready.add(node)
                changed.add(node)
        for name in changed:
            self._write(name)
        if changed:
            from .manifests import ensure_cilium_nodes  # pylint: disable=import-outside-toplevel
            ensure_cilium_nodes(self.c.store, {name: self.running[name]['ip'] for name in self.cni_ready if name in self.running})

    def reconcile_csi(self):
        """Each running node's CSINode lists the CSI drivers whose node plugin has a Ready pod there.

        The kubelet creates a CSINode per node, owned by its Node (kubernetes v1.36.3
        pkg/volume/csi/nodeinfomanager/nodeinfomanager.go:502-525), and adds a driver to spec.drivers once the plugin
        registered through its node-driver-registrar socket and answered NodeGetInfo (pkg/volume/csi/csi_plugin.go:
        118-157, InstallCSIDriver); it removes it when the plugin deregisters (:270, UninstallCSIDriver). The lab runs
        no plugin: the driver name is the directory of the registrar's --kubelet-registration-path (what the chart
        passes: /var/lib/kubelet/plugins/<driver>/csi.sock), registered while a Ready pod carries it on the node.
        """
        drivers = dict((name, {}) for name in self.running)
        for pod in self.c.store.items(('', 'pods')):
            node = (pod.get('spec') or {}).get('nodeName')
            driver = _csi_registration(pod)
            if driver and node in drivers and _pod_ready(pod) and not pod['metadata'].get('deletionTimestamp'):
                drivers[node][driver] = {'name': driver, 'nodeID': node, 'topologyKeys': None}
        rtype = self.c.rtype('storage.k8s.io', 'csinodes')
        for name, found in sorted(drivers.items()):
            node = self.c.store.peek(('', 'nodes'), '', name)
            if node is None:
                continue
            wanted = [found[key] for key in sorted(found)]
            old = self.c.store.peek(('storage.k8s.io', 'csinodes'), '', name)
            if old is None:
                self.c.store.internal_create(rtype, {
                    'apiVersion': 'storage.k8s.io/v1', 'kind': 'CSINode',
                    'metadata': {'name': name, 'ownerReferences': [{'apiVersion': 'v1', 'kind': 'Node', 'name': name,
                                                                    'uid': node['metadata'].get('uid')}]},
                    'spec': {'drivers': wanted}})
            elif (old.get('spec') or {}).get('drivers') != wanted:
                new = clone(old)
                new['spec'] = {'drivers': wanted}
                self.c.store.internal_replace(rtype, new, old)


def _csi_registration(pod):
    """The CSI driver a pod registers with the kubelet (its registrar's --kubelet-registration-path directory), or None."""
    for container in (pod.get('spec') or {}).get('containers') or ():
        for arg in list(container.get('args') or ()) + list(container.get('command') or ()):
            if isinstance(arg, str) and arg.startswith('--kubelet-registration-path='):
                parts = arg.split('=', 1)[1].rstrip('/').split('/')
                if len(parts) >= 2:
                    return parts[-2]
    return None


def _missing_secret_candidates(pod):
    """Names of the Secrets the pod's volumes need (secret volumes and projected secret sources not marked optional)."""
    names = []
    for volume in (pod.get('spec') or {}).get('volumes') or ():
        secret = volume.get('secret')
        if secret and secret.get('secretName') and not secret.get('optional'):
            names.append(secret['secretName'])
        for source in (volume.get('projected') or {}).get('sources') or ():
            ref = source.get('secret') or {}
            if ref.get('name') and not ref.get('optional'):
                names.append(ref['name'])
    return names


def _pod_ready(pod):
    for condition in (pod.get('status') or {}).get('conditions') or ():
        if condition.get('type') == 'Ready':
            return condition.get('status') == 'True'
    return False


class Controllers:  # pylint: disable=too-many-instance-attributes,too-many-public-methods
    """All simulated control loops of one cluster."""

    def __init__(self, store, timing=None, clock=None, ca_pem=None):
        self.store = store
        self.ca_pem = ca_pem
        self.timing = timing
        self.clock = clock or time.monotonic
        self.faults = Faults()
        self.nodes = NodeAgent(self)
        self._dirty = {}
        self._wake = None
        self._task = None
        self._timers = {}
        self._ready_at = {}
        self._records = {}
        self._next_pod_ip = 2
        self._crash_timer = None
        store.subscribe(self._on_event)

    # --- plumbing -----------------------------------------------------------------------------

    def rtype(self, group, plural):
        return self.store.registry.by_key((group, plural))

    def delay(self, key, target=None):
        """Real seconds of one delay. timing: the lab's Timing (the delay is recorded, see finish_delay), a
        callable kind -> seconds, or None (no delays)."""
        if self.timing is None:
            return 0.0
        if hasattr(self.timing, 'nominal') and hasattr(self.timing, 'begin'):
            nominal = self.timing.nominal(key)
            seconds = nominal * self.timing.scale
            if target is not None:
                self._records[target] = self.timing.begin(key, target, nominal, seconds)
            return seconds
        return float(self.timing(key) or 0.0)

    def finish_delay(self, target, outcome='done'):
        record = self._records.pop(target, None)
        if record is not None:
            self.timing.end(record, outcome)

    @property
    def running(self):
        return self._task is not None

    def start(self):
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = loop.create_task(self._run())
        self.kick()

    def stop(self):
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._crash_timer is not None:
            self._crash_timer.cancel()
            self._crash_timer = None

    def kick(self, item=('all',)):
        self._dirty[item] = True
        if self._wake is not None:
            self._wake.set()

    def _on_event(self, event):
        group, plural = event.key
        obj = event.obj
        meta = obj['metadata']
        if plural in ('deployments', 'daemonsets', 'statefulsets', 'replicasets', 'jobs') and group in ('apps', 'batch'):
            self._dirty[(plural, meta.get('namespace'), meta['name'])] = True
            for ref in meta.get('ownerReferences') or ():
                self._dirty[(_plural_of(ref.get('kind')), meta.get('namespace'), ref.get('name'))] = True
        elif event.key == ('', 'pods'):
            self._dirty[('pod', meta.get('namespace'), meta['name'])] = True
            for ref in meta.get('ownerReferences') or ():
                self._dirty[(_plural_of(ref.get('kind')), meta.get('namespace'), ref.get('name'))] = True
                if ref.get('kind') == 'ReplicaSet':
                    rs = self.store.peek(('apps', 'replicasets'), meta.get('namespace'), ref.get('name'))
                    for owner in ((rs or {}).get('metadata') or {}).get('ownerReferences') or ():
                        self._dirty[(_plural_of(owner.get('kind')), meta.get('namespace'), owner.get('name'))] = True
            labels = meta.get('labels') or {}
            if labels.get(CILIUM_LABEL[0]) == CILIUM_LABEL[1]:
                self._dirty[('cni',)] = True
            if _csi_registration(obj):
                self._dirty[('csi',)] = True
        elif event.key == ('', 'secrets'):
            # kubelet mounts a Secret volume once the Secret exists: pods waiting for it in that namespace look again
            for pod in self.store.items(('', 'pods'), meta.get('namespace')):
                if meta['name'] in _missing_secret_candidates(pod):
                    self._dirty[('pod', meta.get('namespace'), pod['metadata']['name'])] = True
        elif event.key == ('', 'nodes'):
            self._dirty[('all',)] = True
        elif event.key == ('', 'namespaces') and event.type == 'ADDED':
            self._dirty[('namespace', meta['name'])] = True
        else:
            return
        if self._wake is not None:
            self._wake.set()

    async def _run(self):
        while True:
            await self._wake.wait()
            self._wake.clear()
            rounds = 0
            while self._dirty and rounds < 10000:
                rounds += 1
                item = next(iter(self._dirty))
                del self._dirty[item]
                try:
                    self.reconcile(item)
                except Exception as exc:  # pylint: disable=broad-except
                    import logging  # pylint: disable=import-outside-toplevel
                    logging.getLogger('lab.k8s').exception('reconcile %s failed: %s', item, exc)
                if rounds % 50 == 0:
                    await asyncio.sleep(0)

    def reconcile(self, item):
        kind = item[0]
        if kind == 'all':
            for key, plural in ((('apps', 'daemonsets'), 'daemonsets'), (('apps', 'deployments'), 'deployments'),
                                (('apps', 'replicasets'), 'replicasets'), (('apps', 'statefulsets'), 'statefulsets'),
                                (('batch', 'jobs'), 'jobs')):
                for obj in self.store.items(key):
                    self._dirty[(plural, obj['metadata']['namespace'], obj['metadata']['name'])] = True
            for pod in self.store.items(('', 'pods')):
                self._dirty[('pod', pod['metadata']['namespace'], pod['metadata']['name'])] = True
            for namespace in self.store.items(('', 'namespaces')):
                self._dirty[('namespace', namespace['metadata']['name'])] = True
            self._dirty[('cni',)] = True
            self._dirty[('csi',)] = True
        elif kind == 'cni':
            self.nodes.reconcile_cni()
        elif kind == 'csi':
            self.nodes.reconcile_csi()
        elif kind == 'pod':
            self.reconcile_pod(item[1], item[2])
        elif kind == 'daemonsets':
            self.reconcile_daemonset(item[1], item[2])
        elif kind == 'deployments':
            self.reconcile_deployment(item[1], item[2])
        elif kind == 'replicasets':
            self.reconcile_replicaset(item[1], item[2])
        elif kind == 'statefulsets':
            self.reconcile_statefulset(item[1], item[2])
        elif kind == 'jobs':
            self.reconcile_job(item[1], item[2])
        elif kind == 'namespace':
            self.reconcile_namespace(item[1])

    def _timer(self, key, delay, item):
        if key in self._timers:
            return
        loop = asyncio.get_running_loop()

        def fire():
            self._timers.pop(key, None)
            self.kick(item)

        self._timers[key] = loop.call_later(max(0.0, delay), fire)

    # --- namespaces (serviceaccount and root-ca-cert-publisher controllers) ---------------------------

    def reconcile_namespace(self, name):
        """Every namespace gets the ServiceAccount `default` and the ConfigMap `kube-root-ca.crt`."""
        if self.store.peek(('', 'namespaces'), '', name) is None:
            return
        if self.store.peek(('', 'serviceaccounts'), name, 'default') is None:
            self.store.internal_create(self.rtype('', 'serviceaccounts'), {'metadata': {'name': 'default', 'namespace': name}})
        if self.ca_pem and self.store.peek(('', 'configmaps'), name, 'kube-root-ca.crt') is None:
            self.store.internal_create(self.rtype('', 'configmaps'), {
                'metadata': {'name': 'kube-root-ca.crt', 'namespace': name,
                             'annotations': {'kubernetes.io/description': 'Contains a CA bundle that can be used to verify the '
                                             'kube-apiserver when using internal endpoints such as the internal service IP or '
                                             'kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes '
                                             'clusters.'}},
                'data': {'ca.crt': self.ca_pem}})

    # --- pods -----------------------------------------------------------------------------------

    def _pods_owned_by(self, namespace, uid):
        return [p for p in self.store.items(('', 'pods'), namespace)
                if any(ref.get('uid') == uid for ref in p['metadata'].get('ownerReferences') or ())]

    def _new_pod(self, owner, owner_kind, template, name, extra_labels, node_name=None, extra_tolerations=()):  # pylint: disable=too-many-arguments
        meta = clone((template or {}).get('metadata') or {})
        meta['labels'] = dict(meta.get('labels') or {}, **extra_labels)
        meta['name'] = name
        meta['namespace'] = owner['metadata']['namespace']
        meta['ownerReferences'] = [{'apiVersion': owner.get('apiVersion', 'apps/v1'), 'kind': owner_kind, 'name': owner['metadata']['name'],
                                    'uid': owner['metadata']['uid'], 'controller': True, 'blockOwnerDeletion': True}]
        spec = clone((template or {}).get('spec') or {})
        if node_name:
            spec['nodeName'] = node_name
        tolerations = list(spec.get('tolerations') or [])
        for toleration in extra_tolerations:
            if toleration not in tolerations:
                tolerations.append(dict(toleration))
        if tolerations:
            spec['tolerations'] = tolerations
        spec.setdefault('serviceAccountName', 'default')
        spec.setdefault('serviceAccount', spec['serviceAccountName'])
        pod = {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': meta, 'spec': spec,
               'status': {'phase': 'Pending', 'qosClass': 'BestEffort'}}
        return self.store.internal_create(self.rtype('', 'pods'), pod)

    def _delete(self, group, plural, obj):
        self._ready_at.pop(obj['metadata'].get('uid'), None)
        if plural == 'pods':
            self.finish_delay('pod/%s/%s' % (obj['metadata'].get('namespace'), obj['metadata']['name']), 'cancelled')
        self.store.internal_delete(self.rtype(group, plural), obj)

    def _nodes(self):
        return [n for n in self.store.items(('', 'nodes')) if n['metadata']['name'] in self.nodes.running]

    def reconcile_pod(self, namespace, name):  # pylint: disable=too-many-branches,too-many-locals,too-many-statements
        pod = self.store.peek(('', 'pods'), namespace, name)
        if pod is None or pod['metadata'].get('deletionTimestamp'):
            return
        status = pod.get('status') or {}
        if status.get('phase') in ('Succeeded', 'Failed'):
            return
        spec = pod.get('spec') or {}
        node_name = spec.get('nodeName')
        if not node_name:
            self._schedule(pod)
            return
        node = self.store.peek(('', 'nodes'), '', node_name)
        uid = pod['metadata']['uid']
        kubelet_up = node_name in self.nodes.running
        host_network = bool(spec.get('hostNetwork'))
        can_start = kubelet_up and node is not None and (host_network or _node_ready(node))
        missing = [] if status.get('phase') == 'Running' else [  # a running pod keeps what it mounted
            secret for secret in _missing_secret_candidates(pod) if self.store.peek(('', 'secrets'), namespace, secret) is None]
        if missing:
            # kubelet: MountVolume.SetUp failed ... secret "x" not found; the containers stay ContainerCreating
            can_start = False
            self._ready_at.pop(uid, None)
        now = self.clock()
        new = clone(pod)
        new_status = new.setdefault('status', {})
        containers = spec.get('containers') or []
        ready_at = self._ready_at.get(uid)
        if can_start and ready_at is None:
            ready_at = self._ready_at[uid] = now + self.delay('pod_ready', 'pod/%s/%s' % (namespace, name))
        crash = self._crashlooping(pod)
        old_statuses = {s.get('name'): s for s in status.get('containerStatuses') or ()}
        # an image cannot be pulled: only containers that never started wait for it (a running one has its image)
        pull_error = None if any((s.get('state') or {}).get('running') or s.get('started') for s in old_statuses.values()) \
            else self._image_pull_fault(pod)
        running = can_start and ready_at is not None and now >= ready_at and pull_error is None
        if running:
            self.finish_delay('pod/%s/%s' % (namespace, name))
        if can_start and not running and pull_error is None:
            self._timer(('ready', uid), ready_at - now, ('pod', namespace, name))
        stamp = timestamp()
        owner_job = any(ref.get('kind') == 'Job' for ref in pod['metadata'].get('ownerReferences') or ())
        statuses = []
        for container in containers:
            previous = old_statuses.get(container.get('name')) or {}
            entry = {'name': container.get('name'), 'image': container.get('image', ''), 'imageID': '',
                     'restartCount': previous.get('restartCount', 0), 'started': False, 'ready': False}
            if can_start and pull_error is not None:
                image = container.get('image', '')
                entry['state'] = {'waiting': {'reason': 'ImagePullBackOff', 'message': 'Back-off pulling image "%s": ErrImagePull: %s'
                                              % (image, pull_error.replace('{image}', image))}}
            elif running and crash:
                entry['state'] = {'waiting': {'reason': 'CrashLoopBackOff', 'message': 'back-off 5m0s restarting failed container=%s pod=%s_%s(%s)'
                                              % (container.get('name'), name, namespace, uid)}}
                entry['lastState'] = {'terminated': {'exitCode': 1, 'reason': 'Error', 'startedAt': stamp, 'finishedAt': stamp}}
                entry['restartCount'] = max(1, entry['restartCount'])
            elif running and owner_job:
                entry['state'] = {'terminated': {'exitCode': 0, 'reason': 'Completed', 'startedAt': stamp, 'finishedAt': stamp}}
            elif running:
                entry['state'] = {'running': {'startedAt': ((previous.get('state') or {}).get('running') or {}).get('startedAt', stamp)}}
                entry['ready'] = entry['started'] = True
                entry['containerID'] = previous.get('containerID') or 'containerd://' + hashlib.sha256(uid.encode()).hexdigest()
            elif missing:
                entry['state'] = {'waiting': {'reason': 'ContainerCreating', 'message': 'MountVolume.SetUp failed: secret "%s" not found'
                                              % missing[0]}}
            else:
                entry['state'] = {'waiting': {'reason': 'ContainerCreating'}}
            statuses.append(entry)
        all_ready = running and not crash and not owner_job and all(s['ready'] for s in statuses)
        if running and owner_job and not crash:
            phase = 'Succeeded'
        elif running:
            phase = 'Running'
        else:
            phase = 'Pending'
        new_status['phase'] = phase
        new_status['containerStatuses'] = statuses
        if node is not None:
            new_status['hostIP'] = self._node_ip(node)
            new_status['hostIPs'] = [{'ip': new_status['hostIP']}]
        if running:
            new_status.setdefault('startTime', stamp)
            if 'podIP' not in new_status:
                new_status['podIP'] = new_status['hostIP'] if host_network else self._pod_ip(node)
                new_status['podIPs'] = [{'ip': new_status['podIP']}]
        old_conditions = {c.get('type'): c for c in status.get('conditions') or ()}
        wanted = [('PodReadyToStartContainers', running), ('Initialized', True), ('Ready', all_ready), ('ContainersReady', all_ready),
                  ('PodScheduled', True)]
        conditions = []
        for kind, value in wanted:
            text = 'True' if value else 'False'
            previous = old_conditions.get(kind) or {}
            condition = {'type': kind, 'status': text, 'lastProbeTime': None,
                         'lastTransitionTime': previous.get('lastTransitionTime', stamp) if previous.get('status') == text else stamp}
            if kind in ('Ready', 'ContainersReady') and not value:
                condition['reason'] = 'ContainersNotReady'
                condition['message'] = 'containers with unready status: [%s]' % ' '.join(c.get('name', '') for c in containers)
            conditions.append(condition)
        new_status['conditions'] = conditions
        new_status.pop('nominatedNodeName', None)
        if _strip_times(new_status) != _strip_times(status):
            self.store.internal_replace(self.rtype('', 'pods'), new, pod)
        if running and crash:
            self._arm_crash_timer()

    def _workload_names(self, pod):
        """Names of the Deployment, DaemonSet or StatefulSet that owns the pod (through its ReplicaSet for a Deployment)."""
        namespace = pod['metadata']['namespace']
        names = []
        for ref in pod['metadata'].get('ownerReferences') or ():
            if ref.get('kind') == 'ReplicaSet':
                rs = self.store.peek(('apps', 'replicasets'), namespace, ref.get('name'))
                names += [owner.get('name') for owner in (rs or {}).get('metadata', {}).get('ownerReferences') or ()
                          if owner.get('kind') == 'Deployment']
            elif ref.get('kind') in ('DaemonSet', 'StatefulSet', 'Deployment'):
                names.append(ref.get('name'))
        return names

    def _image_pull_fault(self, pod):
        """The registry error for the pod's image (fault k8s-image-pull on its workload), or None."""
        namespace = pod['metadata']['namespace']
        for name in self._workload_names(pod):
            if (namespace, name) in self.faults.image_pull:
                return self.faults.image_pull[(namespace, name)]
        return None

    def _crashlooping(self, pod):
        node = (pod.get('spec') or {}).get('nodeName')
        for ref in pod['metadata'].get('ownerReferences') or ():
            if ref.get('kind') == 'DaemonSet' and self.faults.crashloop.get((pod['metadata']['namespace'], ref.get('name'), node)):
                return True
        return False

    def _arm_crash_timer(self):
        """Crash-looping containers restart again every `crashloop_restart` seconds (at least 0.2 s)."""
        if self._crash_timer is not None:
            return
        loop = asyncio.get_running_loop()

        def restart():
            self._crash_timer = None
            any_left = False
            for pod in self.store.items(('', 'pods')):
                if pod.get('status', {}).get('phase') == 'Running' and self._crashlooping(pod):
                    new = clone(pod)
                    for status in new['status'].get('containerStatuses') or ():
                        status['restartCount'] = status.get('restartCount', 0) + 1
                    self.store.internal_replace(self.rtype('', 'pods'), new, pod)
                    any_left = True
            if any_left:
                self._arm_crash_timer()

        self._crash_timer = loop.call_later(max(0.2, self.delay('crashloop_restart')), restart)

    @staticmethod
    def _node_ip(node):
        for address in (node.get('status') or {}).get('addresses') or ():
            if address.get('type') == 'InternalIP':
                return address.get('address')
        return ''

    def _pod_ip(self, node):
        cidr = ipaddress.ip_network((node.get('spec') or {}).get('podCIDR') or '10.244.0.0/24')
        self._next_pod_ip += 1
        return str(cidr.network_address + (self._next_pod_ip % 250) + 2)

    # --- scheduler ------------------------------------------------------------------------------

    def _pending_fault(self, pod):
        refs = pod['metadata'].get('ownerReferences') or ()
        namespace = pod['metadata']['namespace']
        for ref in refs:
            if ref.get('kind') == 'ReplicaSet':
                rs = self.store.peek(('apps', 'replicasets'), namespace, ref.get('name'))
                for owner in (rs or {}).get('metadata', {}).get('ownerReferences') or ():
                    if owner.get('kind') == 'Deployment' and (namespace, owner.get('name')) in self.faults.pending:
                        return True
            if ref.get('kind') in ('Deployment', 'StatefulSet') and (namespace, ref.get('name')) in self.faults.pending:
                return True
        return False

    def feasible(self, pod, node, placed):
        """'' when pod fits node, else the scheduler's reason text for this node."""
        spec = pod.get('spec') or {}
        labels = node['metadata'].get('labels') or {}
        if node['spec'].get('unschedulable') and not tolerates(spec.get('tolerations'), {'key': 'node.kubernetes.io/unschedulable',
                                                                                         'effect': 'NoSchedule'}):
            return "node(s) were unschedulable"
        for key, value in (spec.get('nodeSelector') or {}).items():
            if labels.get(key) != value:
                return "node(s) didn't match Pod's node affinity/selector"
        affinity = spec.get('affinity') or {}
        required = ((affinity.get('nodeAffinity') or {}).get('requiredDuringSchedulingIgnoredDuringExecution') or {})
        if required.get('nodeSelectorTerms') and not _match_node_terms(required['nodeSelectorTerms'], node):
            return "node(s) didn't match Pod's node affinity/selector"
        for taint in node['spec'].get('taints') or ():
            if taint.get('effect') in ('NoSchedule', 'NoExecute') and not tolerates(spec.get('tolerations'), taint):
                return 'node(s) had untolerated taint {%s: %s}' % (taint.get('key'), taint.get('value', ''))
        anti = ((affinity.get('podAntiAffinity') or {}).get('requiredDuringSchedulingIgnoredDuringExecution') or [])
        for term in anti:
            topology = term.get('topologyKey', 'kubernetes.io/hostname')
            domain = labels.get(topology)
            namespaces = set(term.get('namespaces') or [pod['metadata']['namespace']])
            for other in placed:
                other_node = self.store.peek(('', 'nodes'), '', other['spec'].get('nodeName'))
                if other_node is None or other['metadata']['uid'] == pod['metadata']['uid']:
                    continue
                if (other_node['metadata'].get('labels') or {}).get(topology) != domain:
                    continue
                if other['metadata']['namespace'] in namespaces and match_label_selector(term.get('labelSelector') or {},
                                                                                         other['metadata'].get('labels')):
                    return "node(s) didn't match pod anti-affinity rules"
        return ''

    def _schedule(self, pod):
        nodes = self._nodes()
        placed = [p for p in self.store.items(('', 'pods')) if (p.get('spec') or {}).get('nodeName')
                  and (p.get('status') or {}).get('phase') not in ('Succeeded', 'Failed')]
        reasons = {}
        candidates = []
        if self._pending_fault(pod):
            reasons = {'Insufficient cpu': len(nodes)}
        else:
            for node in nodes:
                reason = self.feasible(pod, node, placed)
                if reason:
                    reasons[reason] = reasons.get(reason, 0) + 1
                else:
                    candidates.append(node)
        if candidates:
            load = {}
            for other in placed:
                load[other['spec']['nodeName']] = load.get(other['spec']['nodeName'], 0) + 1
            chosen = min(candidates, key=lambda n: (load.get(n['metadata']['name'], 0), n['metadata']['name']))
            new = clone(pod)
            new['spec']['nodeName'] = chosen['metadata']['name']
            new['status']['conditions'] = [{'type': 'PodScheduled', 'status': 'True', 'lastProbeTime': None,
                                            'lastTransitionTime': timestamp()}]
            self.store.internal_replace(self.rtype('', 'pods'), new, pod)
            return
        total = len(nodes)
        parts = ', '.join('%d %s' % (count, reason) for reason, count in sorted(reasons.items(), key=lambda kv: kv[0]))
        message = '0/%d nodes are available: %s. preemption: 0/%d nodes are available: %d Preemption is not helpful for scheduling.' % (
            total, parts or 'no nodes registered', total, total) if total else 'no nodes available to schedule pods'
        condition = {'type': 'PodScheduled', 'status': 'False', 'reason': 'Unschedulable', 'message': message, 'lastProbeTime': None}
        current = next((c for c in (pod.get('status') or {}).get('conditions') or () if c.get('type') == 'PodScheduled'), None)
        if current and current.get('message') == message and current.get('status') == 'False':
            return
        new = clone(pod)
        condition['lastTransitionTime'] = (current or {}).get('lastTransitionTime') if current and current.get('status') == 'False' \
            else timestamp()
        new['status'] = {'phase': 'Pending', 'qosClass': pod.get('status', {}).get('qosClass', 'BestEffort'), 'conditions': [condition]}
        self.store.internal_replace(self.rtype('', 'pods'), new, pod)

    # --- DaemonSet ------------------------------------------------------------------------------

    def reconcile_daemonset(self, namespace, name):  # pylint: disable=too-many-locals
        ds = self.store.peek(('apps', 'daemonsets'), namespace, name)
        if ds is None:
            return
        spec = ds.get('spec') or {}
        template = spec.get('template') or {}
        revision = template_hash(template)
        pods = self._pods_owned_by(namespace, ds['metadata']['uid'])
        by_node = {}
        for pod in pods:
            by_node.setdefault(pod['spec'].get('nodeName'), []).append(pod)
        eligible = []
        probe = {'metadata': {'namespace': namespace, 'uid': '', 'labels': (template.get('metadata') or {}).get('labels') or {}},
                 'spec': dict(template.get('spec') or {}, tolerations=list((template.get('spec') or {}).get('tolerations') or [])
                              + list(DAEMONSET_TOLERATIONS))}
        for node in self._nodes():
            reason = self.feasible(probe, node, [])
            if not reason or (reason.startswith('node(s) had untolerated taint {node.kubernetes.io/not-ready')):
                eligible.append(node['metadata']['name'])
        for node_name, node_pods in by_node.items():
            keep = None
            for pod in node_pods:
                labels = pod['metadata'].get('labels') or {}
                if node_name in eligible and keep is None and labels.get('controller-revision-hash') == revision:
                    keep = pod
                else:
                    self._delete('', 'pods', pod)
        pods = self._pods_owned_by(namespace, ds['metadata']['uid'])
        have = {p['spec'].get('nodeName') for p in pods}
        for node_name in eligible:
            if node_name not in have:
                extra = [{'key': 'node.kubernetes.io/network-unavailable', 'operator': 'Exists', 'effect': 'NoSchedule'}] \
                    if (template.get('spec') or {}).get('hostNetwork') else []
                self._new_pod(ds, 'DaemonSet', template, '%s-%s' % (name, _suffix()),
                              {'controller-revision-hash': revision, 'pod-template-generation': str(ds['metadata'].get('generation', 1))},
                              node_name, list(DAEMONSET_TOLERATIONS) + extra)
        pods = self._pods_owned_by(namespace, ds['metadata']['uid'])
        scheduled = [p for p in pods if p['spec'].get('nodeName') in eligible]
        ready = [p for p in scheduled if _pod_ready(p)]
        updated = [p for p in scheduled if (p['metadata'].get('labels') or {}).get('controller-revision-hash') == revision]
        status = {'currentNumberScheduled': len(scheduled), 'numberMisscheduled': len(pods) - len(scheduled),
                  'desiredNumberScheduled': len(eligible), 'numberReady': len(ready),
                  'observedGeneration': ds['metadata'].get('generation', 1), 'updatedNumberScheduled': len(updated),
                  'numberAvailable': len(ready)}
        if len(eligible) - len(ready) > 0:
            status['numberUnavailable'] = len(eligible) - len(ready)
        self._set_status('apps', 'daemonsets', ds, status)

    def _set_status(self, group, plural, obj, status):
        current = self.store.peek((group, plural), obj['metadata'].get('namespace', ''), obj['metadata']['name'])
        if current is None:
            return
        if _strip_times(current.get('status') or {}) == _strip_times(status):
            return
        new = dict(current, status=status)
        self.store.internal_replace(self.rtype(group, plural), new, current)

    # --- Deployment / ReplicaSet ------------------------------------------------------------------

    def reconcile_deployment(self, namespace, name):  # pylint: disable=too-many-locals
        deploy = self.store.peek(('apps', 'deployments'), namespace, name)
        if deploy is None:
            return
        spec = deploy.get('spec') or {}
        template = spec.get('template') or {}
        revision = template_hash(template)
        replicas = spec.get('replicas', 1)
        rs_type = self.rtype('apps', 'replicasets')
        owned = [rs for rs in self.store.items(('apps', 'replicasets'), namespace)
                 if any(ref.get('uid') == deploy['metadata']['uid'] for ref in rs['metadata'].get('ownerReferences') or ())]
        current = next((rs for rs in owned if (rs['metadata'].get('labels') or {}).get('pod-template-hash') == revision), None)
        number = int((deploy['metadata'].get('annotations') or {}).get('deployment.kubernetes.io/revision', '0') or 0)
        if current is None:
            number = max([int((rs['metadata'].get('annotations') or {}).get('deployment.kubernetes.io/revision', '0') or 0)
                          for rs in owned] + [0]) + 1
            labels = dict((template.get('metadata') or {}).get('labels') or {}, **{'pod-template-hash': revision})
            rs_template = clone(template)
            rs_template.setdefault('metadata', {})['labels'] = labels
            selector = clone(spec.get('selector') or {})
            selector.setdefault('matchLabels', {})['pod-template-hash'] = revision
            current = self.store.internal_create(rs_type, {
                'apiVersion': 'apps/v1', 'kind': 'ReplicaSet',
                'metadata': {'name': '%s-%s' % (name, revision), 'namespace': namespace, 'labels': labels,
                             'annotations': {'deployment.kubernetes.io/desired-replicas': str(replicas),
                                             'deployment.kubernetes.io/max-replicas': str(replicas),
                                             'deployment.kubernetes.io/revision': str(number)},
                             'ownerReferences': [{'apiVersion': 'apps/v1', 'kind': 'Deployment', 'name': name,
                                                  'uid': deploy['metadata']['uid'], 'controller': True, 'blockOwnerDeletion': True}]},
                'spec': {'replicas': replicas, 'selector': selector, 'template': rs_template}})
        elif current['spec'].get('replicas') != replicas:
            new = clone(current)
            new['spec']['replicas'] = replicas
            new['metadata']['generation'] = current['metadata'].get('generation', 1) + 1
            current = self.store.internal_replace(rs_type, new, current)
        for rs in owned:
            if rs['metadata']['uid'] != current['metadata']['uid'] and rs['spec'].get('replicas', 0) != 0:
                new = clone(rs)
                new['spec']['replicas'] = 0
                new['metadata']['generation'] = rs['metadata'].get('generation', 1) + 1
                self.store.internal_replace(rs_type, new, rs)
        history_limit = spec.get('revisionHistoryLimit', 10)
        old_sets = sorted([rs for rs in owned if rs['metadata']['uid'] != current['metadata']['uid']],
                          key=lambda rs: rs['metadata'].get('creationTimestamp', ''))
        for rs in old_sets[:max(0, len(old_sets) - history_limit)]:
            self._delete('apps', 'replicasets', rs)
        all_pods = []
        for rs in owned + ([current] if current not in owned else []):
            all_pods += self._pods_owned_by(namespace, rs['metadata']['uid'])
        updated = [p for p in all_pods if (p['metadata'].get('labels') or {}).get('pod-template-hash') == revision]
        ready = [p for p in all_pods if _pod_ready(p)]
        status = {'observedGeneration': deploy['metadata'].get('generation', 1), 'replicas': len(all_pods), 'updatedReplicas': len(updated),
                  'readyReplicas': len(ready), 'availableReplicas': len(ready)}
        if len(all_pods) - len(ready) > 0:
            status['unavailableReplicas'] = len(all_pods) - len(ready)
        status = {k: v for k, v in status.items() if v or k in ('observedGeneration', 'replicas')}
        max_unavailable = _scaled((spec.get('strategy') or {}).get('rollingUpdate', {}).get('maxUnavailable', '25%'), replicas, False)
        available = len(ready) >= replicas - max_unavailable
        complete = len(updated) == replicas and len(all_pods) == replicas and len(ready) >= replicas
        stamp = timestamp()
        old_conditions = {c.get('type'): c for c in (deploy.get('status') or {}).get('conditions') or ()}
        conditions = []
        for kind, value, reason, message in (
                ('Available', available, 'MinimumReplicasAvailable' if available else 'MinimumReplicasUnavailable',
                 'Deployment has minimum availability.' if available else 'Deployment does not have minimum availability.'),
                ('Progressing', True, 'NewReplicaSetAvailable' if complete else 'ReplicaSetUpdated',
                 ('ReplicaSet "%s" has successfully progressed.' if complete else 'ReplicaSet "%s" is progressing.')
                 % current['metadata']['name'])):
            text = 'True' if value else 'False'
            previous = old_conditions.get(kind) or {}
            same = previous.get('status') == text and previous.get('reason') == reason
            conditions.append({'type': kind, 'status': text, 'lastUpdateTime': previous.get('lastUpdateTime', stamp) if same else stamp,
                               'lastTransitionTime': previous.get('lastTransitionTime', stamp) if previous.get('status') == text else stamp,
                               'reason': reason, 'message': message})
        status['conditions'] = conditions
        annotations = deploy['metadata'].get('annotations') or {}
        if annotations.get('deployment.kubernetes.io/revision') != str(number or 1):
            new = clone(deploy)
            new['metadata'].setdefault('annotations', {})['deployment.kubernetes.io/revision'] = str(number or 1)
            deploy = self.store.internal_replace(self.rtype('apps', 'deployments'), new, deploy)
        self._set_status('apps', 'deployments', deploy, status)

    def reconcile_replicaset(self, namespace, name):
        rs = self.store.peek(('apps', 'replicasets'), namespace, name)
        if rs is None:
            return
        pods = [p for p in self._pods_owned_by(namespace, rs['metadata']['uid']) if not p['metadata'].get('deletionTimestamp')]
        replicas = rs['spec'].get('replicas', 1)
        template = rs['spec'].get('template') or {}
        if len(pods) < replicas:
            for dummy in range(replicas - len(pods)):
                self._new_pod(rs, 'ReplicaSet', template, '%s-%s' % (name, _suffix()), {})
        elif len(pods) > replicas:
            ranked = sorted(pods, key=lambda p: (_pod_ready(p), bool(p['spec'].get('nodeName')), p['metadata'].get('creationTimestamp', '')))
            for pod in ranked[:len(pods) - replicas]:
                self._delete('', 'pods', pod)
        pods = self._pods_owned_by(namespace, rs['metadata']['uid'])
        ready = [p for p in pods if _pod_ready(p)]
        status = {'replicas': len(pods), 'fullyLabeledReplicas': len(pods), 'readyReplicas': len(ready), 'availableReplicas': len(ready),
                  'observedGeneration': rs['metadata'].get('generation', 1)}
        self._set_status('apps', 'replicasets', rs, {k: v for k, v in status.items() if v or k in ('replicas', 'observedGeneration')})

    # --- StatefulSet ------------------------------------------------------------------------------

    def reconcile_statefulset(self, namespace, name):
        sts = self.store.peek(('apps', 'statefulsets'), namespace, name)
        if sts is None:
            return
        spec = sts.get('spec') or {}
        template = spec.get('template') or {}
        revision = '%s-%s' % (name, template_hash(template))
        replicas = spec.get('replicas', 1)
        pods = {p['metadata']['name']: p for p in self._pods_owned_by(namespace, sts['metadata']['uid'])}
        ordered = spec.get('podManagementPolicy', 'OrderedReady') == 'OrderedReady'
        for index in range(replicas):
            pod_name = '%s-%d' % (name, index)
            pod = pods.get(pod_name)
            if pod is not None and (pod['metadata'].get('labels') or {}).get('controller-revision-hash') != revision:
                self._delete('', 'pods', pod)
                pod = None
            if pod is None:
                self._new_pod(sts, 'StatefulSet', template, pod_name,
                              {'controller-revision-hash': revision, 'statefulset.kubernetes.io/pod-name': pod_name,
                               'apps.kubernetes.io/pod-index': str(index)})
                if ordered:
                    break
            elif ordered and not _pod_ready(pod):
                break
        for pod_name, pod in pods.items():
            index = pod_name.rsplit('-', 1)[-1]
            if not index.isdigit() or int(index) >= replicas:
                self._delete('', 'pods', pod)
        pods = self._pods_owned_by(namespace, sts['metadata']['uid'])
        ready = [p for p in pods if _pod_ready(p)]
        updated = [p for p in pods if (p['metadata'].get('labels') or {}).get('controller-revision-hash') == revision]
        status = {'observedGeneration': sts['metadata'].get('generation', 1), 'replicas': len(pods), 'readyReplicas': len(ready),
                  'currentReplicas': len(updated), 'updatedReplicas': len(updated), 'availableReplicas': len(ready),
                  'currentRevision': revision, 'updateRevision': revision, 'collisionCount': 0}
        self._set_status('apps', 'statefulsets', sts, {k: v for k, v in status.items()
                                                       if v or k in ('observedGeneration', 'replicas', 'availableReplicas')})

    # --- Job ------------------------------------------------------------------------------------

    def reconcile_job(self, namespace, name):
        job = self.store.peek(('batch', 'jobs'), namespace, name)
        if job is None:
            return
        spec = job.get('spec') or {}
        status = dict(job.get('status') or {})
        if any(c.get('type') == 'Complete' and c.get('status') == 'True' for c in status.get('conditions') or ()):
            return
        pods = self._pods_owned_by(namespace, job['metadata']['uid'])
        succeeded = [p for p in pods if p['status'].get('phase') == 'Succeeded']
        active = [p for p in pods if p['status'].get('phase') not in ('Succeeded', 'Failed')]
        completions = spec.get('completions', 1)
        if not spec.get('suspend') and len(succeeded) + len(active) < completions and len(active) < spec.get('parallelism', 1):
            self._new_pod(job, 'Job', spec.get('template') or {}, '%s-%s' % (name, _suffix()),
                          {'batch.kubernetes.io/job-name': name, 'job-name': name})
            pods = self._pods_owned_by(namespace, job['metadata']['uid'])
            active = [p for p in pods if p['status'].get('phase') not in ('Succeeded', 'Failed')]
        stamp = timestamp()
        new_status = {'startTime': status.get('startTime', stamp), 'active': len(active), 'succeeded': len(succeeded),
                      'ready': len([p for p in active if _pod_ready(p)]), 'terminating': 0,
                      'uncountedTerminatedPods': {}}
        if len(succeeded) >= completions:
            new_status['completionTime'] = stamp
            new_status['conditions'] = [
                {'type': 'SuccessCriteriaMet', 'status': 'True', 'reason': 'CompletionsReached', 'message': 'Reached expected number of succeeded pods',
                 'lastProbeTime': stamp, 'lastTransitionTime': stamp},
                {'type': 'Complete', 'status': 'True', 'reason': 'CompletionsReached', 'message': 'Reached expected number of succeeded pods',
                 'lastProbeTime': stamp, 'lastTransitionTime': stamp}]
            new_status['active'] = 0
        new_status = {k: v for k, v in new_status.items() if v or k in ('ready', 'terminating', 'uncountedTerminatedPods')}
        self._set_status('batch', 'jobs', job, new_status)


def _plural_of(kind):
    return {'ReplicaSet': 'replicasets', 'DaemonSet': 'daemonsets', 'StatefulSet': 'statefulsets', 'Job': 'jobs',
            'Deployment': 'deployments'}.get(kind, 'unknown')


def _scaled(value, total, round_up):
    if isinstance(value, str) and value.endswith('%'):
        number = int(value[:-1]) * total / 100.0
        return int(-(-number // 1)) if round_up else int(number)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


_TIME_FIELDS = frozenset(('lastHeartbeatTime', 'lastTransitionTime', 'lastUpdateTime', 'lastProbeTime', 'startTime', 'completionTime',
                          'startedAt', 'finishedAt'))


def _strip_times(value):
    """Status without timestamps, to decide whether anything really changed."""
    if isinstance(value, dict):
        return {k: _strip_times(v) for k, v in value.items() if k not in _TIME_FIELDS}
    if isinstance(value, list):
        return [_strip_times(v) for v in value]
    return value
