"""What a Talos node's kubelet writes about its node's network (and its CSI plugins: CsiRegistrations, at the end), for
the kwok Nodes of the upstream world.

A kubelet reports its Node `Ready=False` until the container runtime says its network is ready, which containerd says
once a CNI config is on the node (on a Talos cluster with Cilium: once the cilium agent runs there and has written it):

- kubelet: k8s.io/kubernetes@v1.36.3 pkg/kubelet/kubelet.go:3260-3263 (updateRuntimeUp: a NetworkReady runtime
  condition that is false becomes the network error `container runtime network not ready: <condition>`, the condition
  printed as pkg/kubelet/container/runtime.go:665-666 `%s=%t reason:%s message:%s`), and
  pkg/kubelet/nodestatus/setters.go:480-516 (ReadyCondition: any such error makes Ready False, reason
  `KubeletNotReady`, message the errors; none: True, `KubeletReady`, `kubelet is posting ready status`); the other
  conditions it reports as not under pressure (setters.go:603, 665, 727 reasons). It writes them with a strategic merge
  patch of nodes/<name>/status (pkg/kubelet/kubelet_node_status.go:595, nodeutil.PatchNodeStatus).
- the runtime's NetworkReady condition: containerd's CRI Status answers reason `NetworkPluginNotReady`, message
  `Network plugin returns error: <err>` while its CNI plugin has no config, the error being go-cni's
  ErrCNINotInitialized, `cni plugin not initialized` (github.com/containerd/go-cni@v1.1.13 errors.go:24). (The CRI
  Status code was read in containerd's internal/cri/server/status.go, not at the exact containerd release Talos
  v1.13.9 ships: that source is not in the lab's module cache.)

How the lab does it: kwok's node-initialize stage (sigs.k8s.io/kwok@v0.8.0 kustomize/stage/node/fast/
node-initialize.yaml), taken from the kwok module, with its conditions replaced by the NotReady ones above and its
selector narrowed to a Node whose Ready is neither True nor False (a new Node, or one whose kubelet came back after
kube-controller-manager marked it Unknown); then CniReadiness, the small bridge, patches Ready True as kubelet does
once a Ready pod labelled k8s-app=cilium is bound to the node (the agent has written the CNI config there).
"""

import datetime
import json
import logging
import os
import threading

import requests
import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait

from lab import upstream

from . import policies

LOG = logging.getLogger('lab.k8s_upstream.kubelet')

NETWORK_NOT_READY = ('container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady '
                     'message:Network plugin returns error: cni plugin not initialized')
CNI_AGENT_SELECTOR = 'k8s-app=cilium'
STAGE_NAME = 'lab-node-initialize-network-not-ready'
# setters.go: type, reason, message of the conditions kubelet reports beside Ready (not under pressure)
_PRESSURE = (('MemoryPressure', 'KubeletHasSufficientMemory', 'kubelet has sufficient memory available'),
             ('DiskPressure', 'KubeletHasNoDiskPressure', 'kubelet has no disk pressure'),
             ('PIDPressure', 'KubeletHasSufficientPID', 'kubelet has sufficient PID available'))


def _condition_template(kind, status, reason, message):
    return ('- lastHeartbeatTime: {{ $now | Quote }}\n'
            '  lastTransitionTime: {{ $now | Quote }}\n'
            '  message: %s\n  reason: %s\n  status: "%s"\n  type: %s\n' % (json.dumps(message), reason, status, kind))


def network_not_ready_stage(node_initialize_text):
    """kwok's node-initialize Stage (its YAML text) made into the NotReady-until-CNI stage described above."""
    stage = yaml.safe_load(node_initialize_text)
    template = stage['spec']['next']['statusTemplate']
    start = template.index('conditions:\n')
    end = template.index('{{ end }}\n', start) + len('{{ end }}\n')
    conditions = 'conditions:\n' + ''.join(_condition_template(*c[:1], 'False', *c[1:]) for c in _PRESSURE)
    conditions += _condition_template('Ready', 'False', 'KubeletNotReady', NETWORK_NOT_READY)
    stage['spec']['next']['statusTemplate'] = template[:start] + conditions + template[end:]
    stage['metadata']['name'] = STAGE_NAME
    stage['spec']['selector'] = {'matchExpressions': [
        {'key': '.status.conditions.[] | select( .type == "Ready" ) | .status', 'operator': 'NotIn', 'values': ['True', 'False']}]}
    return yaml.safe_dump(stage, sort_keys=False, width=1 << 16)


def _ready(pod):
    conditions = (pod.get('status') or {}).get('conditions') or []
    return any(c.get('type') == 'Ready' and c.get('status') == 'True' for c in conditions)


def _node_ready(node):
    return next((c for c in (node.get('status') or {}).get('conditions') or () if c.get('type') == 'Ready'), {})


class _Watcher:
    """Watches some lists of the API (each a watch with a deadline per request, renewed until stop()); every event calls
    reconcile(), which a subclass defines, under one lock."""

    def __init__(self, plane):
        self.plane = plane
        self._stop = threading.Event()
        self._threads = []
        self._lock = threading.Lock()

    def paths(self):
        raise NotImplementedError

    def reconcile(self):
        raise NotImplementedError

    def start(self):
        for path in self.paths():
            thread = threading.Thread(target=self._watch, args=(path,), name='lab-kubelet ' + path, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def signal_stop(self):
        """Ask the watch threads to end (they do once their request returns); stop() then waits for them."""
        self._stop.set()

    def stop(self, timeout=10.0):
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []

    def _watch(self, path):
        """list, reconcile, then watch from the list's resourceVersion; any event reconciles. Until stop()."""
        session = requests.Session()
        auth = {'verify': self.plane.pki_file('ca.crt'), 'cert': self.plane.lab_client_cert}
        version = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self.plane.api('GET', path)['metadata']['resourceVersion']
                    self.reconcile()
                response = session.get(self.plane.api_url + path + '&watch=1&timeoutSeconds=5&allowWatchBookmarks=true&resourceVersion=' + version,
                                       stream=True, timeout=15, **auth)
                if response.status_code != 200:
                    version = None  # 410 Gone or another refusal: list again
                    continue
                for line in response.iter_lines():
                    if self._stop.is_set():
                        break
                    if not line:
                        continue
                    event = yaml.safe_load(line)
                    if event.get('type') == 'ERROR':
                        version = None
                        break
                    version = event['object']['metadata'].get('resourceVersion', version)
                    if event.get('type') != 'BOOKMARK':
                        self.reconcile()
            except Exception as exc:  # pylint: disable=broad-except
                if self._stop.is_set():
                    break
                LOG.debug('kubelet CNI watch %s: %s; listing again', path, exc)
                version = None
                # the API went away (the lab stopping it): wait for the stop or a second, whichever comes first
                self._stop.wait(1.0)
        session.close()


class CniReadiness(_Watcher):
    """The kubelets' side: a Node NotReady for its network becomes Ready once a Ready CNI agent pod is bound to it.
    Watches the agent pods and the kwok Nodes; every event reconciles all kwok-managed Nodes."""

    def __init__(self, plane, managed_label):
        super().__init__(plane)
        self.managed_label = managed_label

    def paths(self):
        # every pod, the CNI agents among them: kube-controller-manager may set Ready False on any pod of a node it deems
        # not Ready (below), and a running kubelet puts its own status back within its status manager's sync period
        return ('/api/v1/pods?labelSelector=', '/api/v1/nodes?labelSelector=%s%%3D%s' % self.managed_label)

    def reconcile(self):
        with self._lock:
            every_pod = self.plane.api('GET', '/api/v1/pods')['items']
            label, value = CNI_AGENT_SELECTOR.split('=', 1)
            pods = [p for p in every_pod if (p['metadata'].get('labels') or {}).get(label) == value]
            # an agent pod under the crash-loop fault never runs long enough to write the CNI config (the agent writes it
            # from its cniConfigManager's Start hook, github.com/cilium/cilium@v1.18.2 daemon/cmd/cni/config.go:191-246):
            # kwok's pod-ready stage makes it Ready for a moment before CrashLoops reports the crash, which must not count
            with_agent = {p['spec'].get('nodeName') for p in pods
                          if _ready(p) and not p['metadata'].get('deletionTimestamp') and not self.plane.crash_looping(p)}
            nodes = self.plane.api('GET', '/api/v1/nodes?labelSelector=%s%%3D%s' % self.managed_label)['items']
            self._pods_ready_again({n['metadata']['name'] for n in nodes if _node_ready(n).get('status') in ('True', 'False')},
                                   every_pod)
            for node in nodes:
                ready = _node_ready(node)
                name = node['metadata']['name']
                if name in with_agent and ready.get('status') == 'False' and ready.get('message') == NETWORK_NOT_READY:
                    self.set_ready(name)

    def _pods_ready_again(self, running, pods):
        """A kubelet that runs reports its pods' Ready condition from their containers (k8s.io/kubernetes@v1.36.3
        pkg/kubelet/status/generate.go:126 GeneratePodReadyCondition: Ready when ContainersReady). While it was away,
        kube-controller-manager set Ready False on them (pkg/controller/util/node/controller_utils.go:121
        MarkPodsNotReady); it also does so for a pod bound to a node whose Ready its node monitor has not yet seen True
        (pkg/controller/nodelifecycle/node_lifecycle_controller.go:1098-1142, processPod, reading its own node health
        cache: a pod placed on a node that just came back). A running kubelet's status manager finds the API's status
        differing from its own and writes its own back, every sync period (pkg/kubelet/status/status_manager.go:209
        syncPeriod 10 s, 1075-1130 syncBatch, 1269-1300 needsReconcile). kwok's stages take only Pending pods, so the
        lab writes it back for the pods, on the nodes whose kubelet runs (Ready True or False, not Unknown), whose
        containers are ready, on any pod or node event (at once, where kubelet takes up to its sync period)."""
        for pod in pods:
            if pod['spec'].get('nodeName') not in running or pod['metadata'].get('deletionTimestamp'):
                continue
            conditions = {c.get('type'): c.get('status') for c in (pod.get('status') or {}).get('conditions') or ()}
            if conditions.get('ContainersReady') == 'True' and conditions.get('Ready') == 'False':
                meta = pod['metadata']
                self.plane.api('PATCH', '/api/v1/namespaces/%s/pods/%s/status' % (meta['namespace'], meta['name']),
                               {'status': {'conditions': [{'type': 'Ready', 'status': 'True', 'lastTransitionTime': _now()}]}},
                               content_type='application/strategic-merge-patch+json')
                LOG.info('pod %s/%s: Ready again (its kubelet runs)', meta['namespace'], meta['name'])

    def set_ready(self, name):
        """Ready True as kubelet writes it when its runtime's network is ready (setters.go:484-490)."""
        now = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')
        condition = {'type': 'Ready', 'status': 'True', 'reason': 'KubeletReady', 'message': 'kubelet is posting ready status',
                     'lastHeartbeatTime': now, 'lastTransitionTime': now}
        self.plane.api('PATCH', '/api/v1/nodes/%s/status' % name, {'status': {'conditions': [condition]}},
                       content_type='application/strategic-merge-patch+json')
        LOG.info('node %s: Ready (a CNI agent runs on it)', name)


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


def _pod_ready_conditions(ready, now):
    return [{'type': kind, 'status': 'True' if ready else 'False', 'lastTransitionTime': now}
            for kind in ('Ready', 'ContainersReady')]


class CrashLoops(_Watcher):
    """Fault k8s-crashloop: the pod of a DaemonSet on one node crash-loops, as its kubelet reports it.

    kubelet's status of a container it keeps restarting: waiting, reason CrashLoopBackOff
    (k8s.io/kubernetes@v1.36.3 pkg/kubelet/container/sync_result.go:77), message `back-off <delay> restarting failed
    container=<name> pod=<name>_<namespace>(<uid>)` (pkg/kubelet/kuberuntime/kuberuntime_manager.go:1933, the pod as
    pkg/kubelet/util/format/pod.go:28-40 prints it), the last run terminated with an error, a restart count, and the pod
    Running but not Ready. Written as a patch of pods/<name>/status, as kubelet's status manager does. kwok leaves such
    a pod alone (its pod-ready stage takes only Pending pods). When the fault is cleared the container runs: Ready.
    Lab differences: the back-off shown is kubelet's maximum (5m0s) and the restart count is 1, not counting on.
    """

    def __init__(self, plane):
        super().__init__(plane)
        self.faults = {}      # node name -> (namespace, daemonset)
        self.recovering = {}  # node name -> (namespace, daemonset) whose pod runs again on the next reconcile

    def paths(self):
        return ('/api/v1/pods?fieldSelector=status.phase%3DRunning',)

    def set(self, node, namespace, daemonset):
        with self._lock:
            self.faults[node] = (namespace, daemonset)
            self.recovering.pop(node, None)
        self.reconcile()

    def clear(self, node):
        with self._lock:
            gone = self.faults.pop(node, None)
            if gone is not None:
                self.recovering[node] = gone
        self.reconcile()

    def targets(self, pod):
        """Whether pod is one the fault makes crash-loop (its DaemonSet's, on a faulted node)."""
        fault = dict(self.faults).get(pod['spec'].get('nodeName'))
        return fault is not None and self._owned_by(pod, *fault)

    @staticmethod
    def _owned_by(pod, namespace, daemonset):
        return pod['metadata']['namespace'] == namespace and any(
            ref.get('kind') == 'DaemonSet' and ref.get('name') == daemonset for ref in pod['metadata'].get('ownerReferences') or ())

    def reconcile(self):
        with self._lock:
            if not self.faults and not self.recovering:
                return
            pods = self.plane.api('GET', '/api/v1/pods?fieldSelector=status.phase%3DRunning')['items']
            for pod in pods:
                node = pod['spec'].get('nodeName')
                if node in self.faults and self._owned_by(pod, *self.faults[node]):
                    self._crash(pod)
                elif node in self.recovering and self._owned_by(pod, *self.recovering[node]):
                    self._run(pod)
            self.recovering.clear()

    def _patch(self, pod, status):
        meta = pod['metadata']
        self.plane.api('PATCH', '/api/v1/namespaces/%s/pods/%s/status' % (meta['namespace'], meta['name']), {'status': status},
                       content_type='application/strategic-merge-patch+json')

    def _crash(self, pod):
        meta = pod['metadata']
        previous = {c['name']: c for c in pod['status'].get('containerStatuses') or ()}
        if all(((previous.get(c['name']) or {}).get('state') or {}).get('waiting', {}).get('reason') == 'CrashLoopBackOff'
               for c in pod['spec']['containers']):
            return  # reported already
        now = _now()
        statuses = []
        for container in pod['spec']['containers']:
            before = previous.get(container['name']) or {}
            statuses.append({
                'name': container['name'], 'image': container.get('image', ''), 'imageID': before.get('imageID', ''),
                'ready': False, 'started': False, 'restartCount': max(1, before.get('restartCount', 0)),
                'state': {'waiting': {'reason': 'CrashLoopBackOff', 'message': 'back-off 5m0s restarting failed container=%s pod=%s_%s(%s)'
                                      % (container['name'], meta['name'], meta['namespace'], meta['uid'])}},
                'lastState': {'terminated': {'exitCode': 1, 'reason': 'Error', 'startedAt': now, 'finishedAt': now}}})
        self._patch(pod, {'conditions': _pod_ready_conditions(False, now), 'containerStatuses': statuses})
        LOG.info('pod %s/%s: CrashLoopBackOff (fault k8s-crashloop)', meta['namespace'], meta['name'])

    def _run(self, pod):
        now = _now()
        statuses = []
        for status in pod['status'].get('containerStatuses') or ():
            statuses.append(dict(status, ready=True, started=True, state={'running': {'startedAt': now}}))
        self._patch(pod, {'conditions': _pod_ready_conditions(True, now), 'containerStatuses': statuses})


def pod_ready_stage(pod_ready_text):
    """kwok's pod-ready Stage (its YAML text) with one more selector condition: a pod the k8s-image-pull fault marked
    (policies.IMAGE_PULL_LABEL) is not made Ready, since its kubelet cannot start its containers (ImagePulls)."""
    stage = yaml.safe_load(pod_ready_text)
    stage['spec']['selector']['matchExpressions'].append(
        {'key': '.metadata.labels["%s"]' % policies.IMAGE_PULL_LABEL, 'operator': 'DoesNotExist'})
    return yaml.safe_dump(stage, sort_keys=False, width=1 << 16)


def workload_of(pod):
    """NAMESPACE/NAME of the DaemonSet, StatefulSet or Deployment (through its ReplicaSet `<name>-<pod-template-hash>`)
    that owns pod, or None."""
    meta = pod['metadata']
    template_hash = (meta.get('labels') or {}).get('pod-template-hash')
    for ref in meta.get('ownerReferences') or ():
        name = ref.get('name') or ''
        if ref.get('kind') in ('DaemonSet', 'StatefulSet'):
            return '%s/%s' % (meta['namespace'], name)
        if ref.get('kind') == 'ReplicaSet' and template_hash and name.endswith('-' + template_hash):
            return '%s/%s' % (meta['namespace'], name[:-len(template_hash) - 1])
    return None


class ImagePulls(_Watcher):
    """Fault k8s-image-pull: the new pods of a workload cannot pull their image, as their kubelet reports it.

    The pods are the ones the fault's admission policy marked (policies.IMAGE_PULL_LABEL); kwok leaves them Pending
    (pod_ready_stage). kubelet's image manager, k8s.io/kubernetes@v1.36.3 pkg/kubelet/images/image_manager.go:
    a failed pull returns the runtime's error as the message with ErrImagePull (:412, evalCRIPullErr's fallback;
    pkg/kubelet/images/types.go:35) and keeps `<ErrImagePull>: <message>` for the back-off (:368); the next sync
    within the back-off returns ImagePullBackOff (types.go:29) with `Back-off pulling image "<image>": ErrImagePull:
    <message>` (:338-347). The container waits with that reason and message; the pod is Pending, Ready and
    ContainersReady False with reason ContainersNotReady (pkg/kubelet/status/generate.go:103, 111). Written as a patch
    of pods/<name>/status, the first failure, then on the next event the back-off. Cleared: the label is taken off the
    pods, kwok's pod-ready stage runs them (the pull succeeds on kubelet's next try). Left out: init containers, and
    the back-off's own timing (the second step follows at once).
    """

    def __init__(self, plane):
        super().__init__(plane)
        self.faults = {}   # NAMESPACE/NAME -> the registry's error ({image}: the container's image)

    def paths(self):
        return ('/api/v1/pods?labelSelector=' + policies.IMAGE_PULL_LABEL,)

    def set(self, workload, message):
        with self._lock:
            self.faults[workload] = message
        self.reconcile()

    def clear(self, workload):
        with self._lock:
            self.faults.pop(workload, None)
        self.reconcile()

    def reconcile(self):
        with self._lock:
            for pod in self.plane.api('GET', '/api/v1/pods?labelSelector=' + policies.IMAGE_PULL_LABEL)['items']:
                if pod['metadata'].get('deletionTimestamp'):
                    continue
                message = self.faults.get(workload_of(pod))
                if message is None:
                    self._pull_works(pod)
                elif pod['spec'].get('nodeName') and (pod.get('status') or {}).get('phase') == 'Pending':
                    self._pull_fails(pod, message)

    def _pull_works(self, pod):
        meta = pod['metadata']
        self.plane.api('PATCH', '/api/v1/namespaces/%s/pods/%s' % (meta['namespace'], meta['name']),
                       {'metadata': {'labels': {policies.IMAGE_PULL_LABEL: None}}}, content_type='application/merge-patch+json')
        LOG.info('pod %s/%s: its image pulls again (fault k8s-image-pull cleared)', meta['namespace'], meta['name'])

    def _pull_fails(self, pod, message):
        meta = pod['metadata']
        previous = {c['name']: ((c.get('state') or {}).get('waiting') or {}).get('reason')
                    for c in (pod.get('status') or {}).get('containerStatuses') or ()}
        containers = pod['spec']['containers']
        if all(previous.get(c['name']) == 'ImagePullBackOff' for c in containers):
            return  # reported already
        statuses = []
        for container in containers:
            image = container.get('image', '')
            error = message.replace('{image}', image)
            if previous.get(container['name']) in ('ErrImagePull', 'ImagePullBackOff'):
                waiting = {'reason': 'ImagePullBackOff', 'message': 'Back-off pulling image "%s": ErrImagePull: %s' % (image, error)}
            else:
                waiting = {'reason': 'ErrImagePull', 'message': error}
            statuses.append({'name': container['name'], 'image': image, 'imageID': '', 'ready': False, 'started': False,
                             'restartCount': 0, 'state': {'waiting': waiting}})
        now = _now()
        unready = 'containers with unready status: [%s]' % ' '.join(c['name'] for c in containers)
        conditions = [dict(c, reason='ContainersNotReady', message=unready) for c in _pod_ready_conditions(False, now)]
        conditions.append({'type': 'Initialized', 'status': 'True', 'lastTransitionTime': now})
        self.plane.api('PATCH', '/api/v1/namespaces/%s/pods/%s/status' % (meta['namespace'], meta['name']),
                       {'status': {'phase': 'Pending', 'conditions': conditions, 'containerStatuses': statuses}},
                       content_type='application/strategic-merge-patch+json')
        LOG.info('pod %s/%s: %s (fault k8s-image-pull)', meta['namespace'], meta['name'], statuses[0]['state']['waiting']['reason'])


CILIUM_NODE_CRD_FILE = 'pkg/k8s/apis/cilium.io/client/crds/v2/ciliumnodes.yaml'
OPERATOR_SELECTOR = 'io.cilium/app=operator'
CRD_WAIT = 30.0


class CiliumNodes(_Watcher):
    """What the Cilium agent and operator write that the cni stage's world can see (github.com/cilium/cilium v1.18.2,
    the module of the cilium-chart component):

    - the operator registers Cilium's CRDs when it starts (operator/cmd/root.go:220 apis.RegisterCRDsCell;
      pkg/k8s/apis/cilium.io/client/register.go:199 CreateCustomResourceDefinitions, the CRD documents embedded from
      crds/v2/, register.go:228 for ciliumnodes.yaml): the lab creates ciliumnodes.cilium.io from that very file once an
      operator pod is Ready (only that CRD, the one whose objects it imitates);
    - each agent creates its node's CiliumNode (pkg/nodediscovery/nodediscovery.go:208-297 UpdateCiliumNodeResource,
      282 Create) filled by mutateNodeResource (299-331: owner reference to its Node, the Node's labels and annotations,
      the node's addresses; with ipam mode kubernetes the Node's podCIDRs, nodediscovery.go:324-331): the lab creates it
      once that node's agent pod is Ready and the CRD is established. Left out: the agent's own addresses
      (CiliumInternalIP, health, ingress), boot id, encryption; later updates.
    """

    def __init__(self, plane):
        super().__init__(plane)
        self._crd = None

    def paths(self):
        return ('/api/v1/pods?labelSelector=' + CNI_AGENT_SELECTOR, '/api/v1/pods?labelSelector=' + OPERATOR_SELECTOR)

    def _crd_document(self):
        if self._crd is None:
            with open(os.path.join(upstream.module_dir('cilium-chart'), *CILIUM_NODE_CRD_FILE.split('/')), encoding='utf-8') as handle:
                self._crd = yaml.safe_load(handle)
        return self._crd

    def _established(self):
        try:
            crd = self.plane.api('GET', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions/ciliumnodes.cilium.io')
        except Exception:  # pylint: disable=broad-except
            return False
        return any(c.get('type') == 'Established' and c.get('status') == 'True' for c in (crd.get('status') or {}).get('conditions') or ())

    def reconcile(self):
        with self._lock:
            operators = self.plane.api('GET', '/api/v1/pods?labelSelector=' + OPERATOR_SELECTOR)['items']
            if not any(_ready(p) for p in operators):
                return
            if not self._established():
                self.plane.api('POST', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions', self._crd_document(), expect=(201, 409))
                # as the operator, which waits for each CRD it creates to be Established (pkg/k8s/apis/crdhelpers/register.go:181)
                result = _wait.wait_for(lambda: (self._established(), 'ciliumnodes.cilium.io not Established'), CRD_WAIT,
                                        interval=0.1, backoff=1.5, max_interval=1.0, progress=None)
                if not result.ok:
                    LOG.warning('CRD ciliumnodes.cilium.io not Established within %.0f s; CiliumNodes wait for the next pod event', CRD_WAIT)
                    return
            agents = self.plane.api('GET', '/api/v1/pods?labelSelector=' + CNI_AGENT_SELECTOR)['items']
            present = {n['metadata']['name'] for n in self.plane.api('GET', '/apis/cilium.io/v2/ciliumnodes')['items']}
            for node_name in sorted({p['spec'].get('nodeName') for p in agents if _ready(p)} - present - {None}):
                node = self.plane.api('GET', '/api/v1/nodes/' + node_name)
                meta, spec = node['metadata'], node.get('spec') or {}
                resource = {
                    'apiVersion': 'cilium.io/v2', 'kind': 'CiliumNode',
                    'metadata': {'name': node_name, 'labels': meta.get('labels') or {}, 'annotations': meta.get('annotations') or {},
                                 'ownerReferences': [{'apiVersion': 'v1', 'kind': 'Node', 'name': node_name, 'uid': meta['uid']}]},
                    'spec': {'addresses': [{'type': a['type'], 'ip': a['address']} for a in (node.get('status') or {}).get('addresses') or ()
                                           if a.get('type') in ('InternalIP', 'ExternalIP')],
                             'ipam': {'podCIDRs': list(spec.get('podCIDRs') or [])}},
                }
                self.plane.api('POST', '/apis/cilium.io/v2/ciliumnodes', resource, expect=(201, 409))
                LOG.info('CiliumNode %s created (its agent runs)', node_name)


def csi_registration(pod):
    """The CSI driver a pod registers with its node's kubelet: the directory of its node-driver-registrar's
    --kubelet-registration-path (what the CSI charts pass: /var/lib/kubelet/plugins/<driver>/csi.sock), or None."""
    for container in (pod.get('spec') or {}).get('containers') or ():
        for arg in list(container.get('args') or ()) + list(container.get('command') or ()):
            if isinstance(arg, str) and arg.startswith('--kubelet-registration-path='):
                parts = arg.split('=', 1)[1].rstrip('/').split('/')
                if len(parts) >= 2:
                    return parts[-2]
    return None


class CsiRegistrations(_Watcher):
    """What a kubelet writes about its CSI plugins, for the kwok Nodes (kwok runs no plugin manager): the CSINode.

    k8s.io/kubernetes v1.36.3:
    - kubelet start: the CSI volume plugin's Init (pkg/volume/csi/csi_plugin.go:281-359, initializeCSINode :361-415)
      runs nodeinfomanager's InitializeCSINodeWithAnnotation (pkg/volume/csi/nodeinfomanager/nodeinfomanager.go:
      410-462): it reads its Node's uid, creates the CSINode if there is none (CreateCSINode :502-529: owned by the
      Node, no drivers) and, if one is owned by another Node of that name (a Node deleted and registered again), deletes
      it and creates its own on the next try (ensureNodeOwnsCSINode :464-500). The garbage collector of
      kube-controller-manager deletes a CSINode whose Node is gone; the kubelet never watches its CSINode.
    - plugin registration: the plugin manager's reconciler (pkg/kubelet/pluginmanager/reconciler/reconciler.go:
      116-171) unregisters the plugins whose registration socket is gone or was made anew, then registers the ones not
      registered yet; for a CSI plugin RegisterPlugin (csi_plugin.go:118-170) asks NodeGetInfo and calls
      InstallCSIDriver, which creates the CSINode if missing, makes sure it is its Node's (as above) and puts the
      driver in spec.drivers (nodeinfomanager.go:385-408, 591-650); DeRegisterPlugin (csi_plugin.go:268-279, 962-970)
      calls UninstallCSIDriver, which drops it (:652-700).

    How the lab plays it: a kubelet starts when a kwok-managed Node appears (a new uid) or is managed again (its
    kubelet came back); it stops when the Node loses kwok's label or is deleted, and then writes nothing (its
    CSINode keeps what it had). A plugin's registration socket is a Ready, not terminating pod on the node whose
    registrar names the driver's socket (csi_registration), the pod's uid standing for the socket's; nodeID is the
    node's name (what the Proxmox CSI plugin answers), no topology keys, no attach limit, no migration annotation (the
    kubelet sets one only for in-tree plugins migrated to CSI). A failed write raises: the watch lists again and the
    next reconcile retries, as the kubelet retries with backoff.
    """

    def __init__(self, plane, managed_label):
        super().__init__(plane)
        self.managed_label = managed_label
        self._kubelets = {}    # node name -> the Node uid its running kubelet initialized the CSINode for
        self._registered = {}  # node name -> {driver: uid of the pod whose socket registered it}

    def paths(self):
        return ('/api/v1/pods?labelSelector=', '/api/v1/nodes?labelSelector=')

    def reconcile(self):
        with self._lock:
            key, value = self.managed_label
            nodes = {n['metadata']['name']: n['metadata']['uid'] for n in self.plane.api('GET', '/api/v1/nodes')['items']
                     if (n['metadata'].get('labels') or {}).get(key) == value}
            for name in sorted(self._kubelets):
                if nodes.get(name) != self._kubelets[name]:  # the kubelet stopped, or its Node was deleted
                    del self._kubelets[name]
                    self._registered.pop(name, None)
            for name in sorted(set(nodes) - set(self._kubelets)):
                self._owned(name, nodes[name])  # InitializeCSINodeWithAnnotation
                self._kubelets[name] = nodes[name]
                self._registered[name] = {}
            sockets = {}
            pods = sorted(self.plane.api('GET', '/api/v1/pods')['items'], key=lambda p: p['metadata'].get('creationTimestamp') or '')
            for pod in pods:
                node, driver = (pod.get('spec') or {}).get('nodeName'), csi_registration(pod)
                if driver and node in self._kubelets and _ready(pod) and not pod['metadata'].get('deletionTimestamp'):
                    sockets.setdefault(node, {})[driver] = pod['metadata']['uid']
            for name in sorted(self._kubelets):
                registered, wanted = self._registered[name], sockets.get(name, {})
                for driver in sorted(registered):
                    if wanted.get(driver) != registered[driver]:  # socket gone, or made anew by another pod
                        self._uninstall(name, driver)
                        del registered[driver]
                for driver in sorted(set(wanted) - set(registered)):
                    self._install(name, self._kubelets[name], driver)
                    registered[driver] = wanted[driver]

    def _path(self, name):
        return '/apis/storage.k8s.io/v1/csinodes/' + name

    def _get(self, name):
        found = self.plane.api('GET', self._path(name), expect=(200, 404))
        return None if found.get('kind') == 'Status' else found

    def _owned(self, name, node_uid):
        """The node's CSINode, created if missing, replaced if another Node of that name owns it (nodeinfomanager.go
        CreateCSINode, ensureNodeOwnsCSINode)."""
        csinode = self._get(name)
        if csinode is not None and not any(ref.get('kind') == 'Node' and ref.get('name') == name and ref.get('uid') == node_uid
                                           for ref in csinode['metadata'].get('ownerReferences') or ()):
            self.plane.api('DELETE', self._path(name), expect=(200, 404))
            LOG.info('CSINode %s deleted: owned by an earlier Node %s', name, name)
            csinode = None
        if csinode is None:
            csinode = self.plane.api('POST', '/apis/storage.k8s.io/v1/csinodes', {
                'apiVersion': 'storage.k8s.io/v1', 'kind': 'CSINode',
                'metadata': {'name': name, 'ownerReferences': [{'apiVersion': 'v1', 'kind': 'Node', 'name': name, 'uid': node_uid}]},
                'spec': {'drivers': []}}, expect=(201,))
            LOG.info('CSINode %s created (its kubelet runs)', name)
        return csinode

    def _install(self, name, node_uid, driver):
        csinode = self._owned(name, node_uid)
        drivers = [d for d in (csinode.get('spec') or {}).get('drivers') or () if d.get('name') != driver]
        old = next((d for d in (csinode.get('spec') or {}).get('drivers') or () if d.get('name') == driver), None)
        if old is not None and old.get('nodeID') == name and not old.get('topologyKeys') and not old.get('allocatable'):
            return
        csinode = dict(csinode, spec=dict(csinode.get('spec') or {}, drivers=drivers + [{'name': driver, 'nodeID': name}]))
        self.plane.api('PUT', self._path(name), csinode, expect=(200,))
        LOG.info('CSINode %s: driver %s registered', name, driver)

    def _uninstall(self, name, driver):
        csinode = self._get(name)
        if csinode is None:
            return
        drivers = (csinode.get('spec') or {}).get('drivers') or []
        if all(d.get('name') != driver for d in drivers):
            return
        csinode = dict(csinode, spec=dict(csinode.get('spec') or {}, drivers=[d for d in drivers if d.get('name') != driver]))
        self.plane.api('PUT', self._path(name), csinode, expect=(200,))
        LOG.info('CSINode %s: driver %s deregistered', name, driver)
