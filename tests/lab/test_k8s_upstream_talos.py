"""What a Talos cluster adds to the upstream control plane (lab/k8s_upstream): the manifests Talos applies, rendered by
Talos's own templates (tools/talos-manifests) and applied as its ManifestApplyController does, and Nodes NotReady as
kubelet reports them until a CNI agent runs on them. One control plane serves the module. Select with `-m upstream`."""

import json

import pytest
from lab.k8s_upstream import ControlPlane
from lab.k8s_upstream import kubelet, manifests
from lab.talos import testing
from lab.testing import Lab

pytestmark = pytest.mark.upstream
WAIT = 60.0

WIDGET_CRD = {
    'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition', 'metadata': {'name': 'widgets.lab.example'},
    'spec': {'group': 'lab.example', 'scope': 'Namespaced',
             'names': {'kind': 'Widget', 'plural': 'widgets', 'singular': 'widget', 'listKind': 'WidgetList'},
             'versions': [{'name': 'v1', 'served': True, 'storage': True,
                           'schema': {'openAPIV3Schema': {'type': 'object', 'properties': {
                               'spec': {'type': 'object', 'properties': {'size': {'type': 'integer'}}}}}}}]},
}
# the custom resource first and its namespace last: Talos sorts Namespaces and CRDs to the front
INLINE = '\n---\n'.join(json.dumps(doc) for doc in (
    {'apiVersion': 'lab.example/v1', 'kind': 'Widget', 'metadata': {'name': 'w1', 'namespace': 'widgets'}, 'spec': {'size': 3}},
    WIDGET_CRD,
    {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'widgets'}},
))


@pytest.fixture(scope='module')
def cp(tmp_path_factory):
    # a short node lease and node monitor (a time scale, as tests/lab/test_k8s_upstream.py): a stopped kubelet shows in seconds
    plane = ControlPlane(str(tmp_path_factory.mktemp('controlplane')), nodes_wait_for_cni=True, node_lease_seconds=6,
                         node_monitor=('1s', '8s'))
    plane.start()
    yield plane
    plane.stop()


def _config(**cluster):
    secrets = testing.ClusterSecrets()
    return testing.render_config(secrets, 'controlplane', 'https://10.5.0.10:6443', hostname='cp-1', extra_cluster=cluster)


def _apply_until_done(applier, objects):
    """Passes until one has no errors, as the lab's World runs them; the errors of every pass."""
    seen = []

    def done():
        errors = applier.apply_pass(objects)
        seen.append(errors)
        return not errors, errors
    Lab.wait_until(done, WAIT, what='the Talos manifests applied')
    return seen


def test_talos_templates_render_what_talos_applies_and_proxy_disabled_leaves_kube_proxy_out():
    ids = [m['id'] for m in manifests.render(_config())['manifests']]
    assert ids == ['00-kubelet-bootstrapping-token', '01-csr-approver-role-binding', '01-csr-node-bootstrap',
                   '01-csr-renewal-role-binding', '10-kube-proxy', '11-core-dns', '11-core-dns-svc',
                   '11-kube-config-in-cluster', '11-talos-node-rbac-template']
    rendered = manifests.render(_config(proxy={'disabled': True}, inlineManifests=[{'name': 'widgets', 'contents': INLINE}]))
    ids = [m['id'] for m in rendered['manifests']]
    assert '10-kube-proxy' not in ids and ids[-1] == '99-widgets'
    order = [(o['kind'], o['metadata']['name']) for o in manifests.apply_order(rendered['manifests'])]
    assert order[:2] == [('Namespace', 'widgets'), ('CustomResourceDefinition', 'widgets.lab.example')]
    with pytest.raises(manifests.ManifestError, match='decoding the machine config'):
        manifests.render('version: v1alpha1\nmachine: {type: controlplane, unknownField: 1}\n')


def test_manifests_are_applied_as_talos_applies_them(cp):
    rendered = manifests.render(_config(inlineManifests=[{'name': 'widgets', 'contents': INLINE}]))
    applier = manifests.ManifestApplier(cp)
    _apply_until_done(applier, manifests.apply_order(rendered['manifests']))
    coredns = cp.api('GET', '/apis/apps/v1/namespaces/kube-system/deployments/coredns')
    assert coredns['spec']['template']['spec']['containers'][0]['image'].startswith('registry.k8s.io/coredns/coredns:')
    assert coredns['metadata']['annotations']['config.k8s.io/owning-inventory'] == 'talos-bootstrap-manifests-inventory'
    assert [(f['manager'], f['operation']) for f in coredns['metadata']['managedFields']][0] == ('talos', 'Apply')
    assert cp.api('GET', '/api/v1/namespaces/kube-system/services/kube-dns')['spec']['clusterIP'] == '10.96.0.10'
    assert cp.api('GET', '/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy')['metadata']['name'] == 'kube-proxy'
    widget = cp.api('GET', '/apis/lab.example/v1/namespaces/widgets/widgets/w1')
    assert widget['spec'] == {'size': 3}
    # Talos creates what is missing and never updates: a changed object stays as it is after another pass
    cp.api('PATCH', '/apis/lab.example/v1/namespaces/widgets/widgets/w1', {'spec': {'size': 5}},
           content_type='application/merge-patch+json')
    assert manifests.ManifestApplier(cp).apply_pass(manifests.apply_order(rendered['manifests'])) == []
    assert cp.api('GET', '/apis/lab.example/v1/namespaces/widgets/widgets/w1')['spec'] == {'size': 5}


def test_a_custom_resource_before_its_crd_fails_the_pass_and_is_applied_once_the_crd_is_served(cp):
    crd = json.loads(json.dumps(WIDGET_CRD).replace('widget', 'gadget').replace('Widget', 'Gadget'))
    gadget = {'apiVersion': 'lab.example/v1', 'kind': 'Gadget', 'metadata': {'name': 'g1'}, 'spec': {'size': 1}}
    applier = manifests.ManifestApplier(cp)
    errors = applier.apply_pass([gadget])
    assert errors == ['error creating mapping for object lab.example/v1/Gadget/g1: no matches for kind "Gadget" in version "lab.example/v1"']
    _apply_until_done(applier, [crd, gadget])
    # no namespace in the document: Talos puts a namespaced object in default
    assert cp.api('GET', '/apis/lab.example/v1/namespaces/default/gadgets/g1')['spec'] == {'size': 1}


def _ready(cp, name):
    return next(c for c in cp.api('GET', '/api/v1/nodes/' + name)['status'].get('conditions') or [{'type': 'Ready'}]
                if c['type'] == 'Ready')


def test_a_node_is_not_ready_for_its_network_until_a_cni_agent_runs_on_it(cp):
    cp.register_node('cni-1', addresses=['127.0.0.31'])
    cp.register_node('cni-2', addresses=['127.0.0.32'])
    for name in ('cni-1', 'cni-2'):
        Lab.wait_until(lambda name=name: (_ready(cp, name).get('status') == 'False', _ready(cp, name)), WAIT,
                       what='%s NotReady as kubelet reports it' % name)
    ready = _ready(cp, 'cni-1')
    assert (ready['reason'], ready['message']) == ('KubeletNotReady', kubelet.NETWORK_NOT_READY)
    # kube-controller-manager's own reaction to it: the not-ready NoSchedule taint
    Lab.wait_until(lambda: ('node.kubernetes.io/not-ready' in [t['key'] for t in cp.api('GET', '/api/v1/nodes/cni-1')['spec'].get('taints', [])],
                            cp.api('GET', '/api/v1/nodes/cni-1')['spec'].get('taints')), WAIT, what='the not-ready taint on cni-1')
    agent = {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'cilium-cni-1', 'labels': {'k8s-app': 'cilium'}},
             'spec': {'nodeName': 'cni-1', 'tolerations': [{'operator': 'Exists'}],
                      'containers': [{'name': 'cilium-agent', 'image': 'quay.io/cilium/cilium:v1.18.0'}]}}
    # a pod is refused until kube-controller-manager has made the namespace's default ServiceAccount
    Lab.wait_until(lambda: (any(sa['metadata']['name'] == 'default' for sa in cp.api('GET', '/api/v1/namespaces/kube-system/serviceaccounts')['items']),
                            'no kube-system/default yet'), WAIT, what='ServiceAccount kube-system/default')
    cp.api('POST', '/api/v1/namespaces/kube-system/pods', agent, expect=(201,))
    Lab.wait_until(lambda: (_ready(cp, 'cni-1').get('status') == 'True', _ready(cp, 'cni-1')), WAIT, what='cni-1 Ready once its agent is')
    assert (_ready(cp, 'cni-1')['reason'], _ready(cp, 'cni-1')['message']) == ('KubeletReady', 'kubelet is posting ready status')
    # the node without an agent stays NotReady
    assert _ready(cp, 'cni-2')['status'] == 'False'


def test_a_node_whose_agent_crash_loops_from_its_start_stays_not_ready_for_its_network(cp):
    """The crash-loop fault set before the agent's pod exists: kwok's pod-ready stage makes the pod Ready for a moment
    before CrashLoops reports the crash, and that moment must not make the Node Ready (kubelet.py CniReadiness: such an
    agent never wrote the CNI config). Cleared, the agent runs and the Node is Ready. (Whether the watchers meet that
    moment is a race; the test below takes it deterministically.)"""
    cp.crash_loop('cni-2', 'kube-system/lab-agent')
    daemonset = {'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'metadata': {'name': 'lab-agent', 'namespace': 'kube-system'},
                 'spec': {'selector': {'matchLabels': {'k8s-app': 'cilium', 'lab': 'agent'}},
                          'template': {'metadata': {'labels': {'k8s-app': 'cilium', 'lab': 'agent'}},
                                       'spec': {'nodeSelector': {'kubernetes.io/hostname': 'cni-2'}, 'tolerations': [{'operator': 'Exists'}],
                                                'containers': [{'name': 'cilium-agent', 'image': 'quay.io/cilium/cilium:v1.18.2'}]}}}}
    cp.api('POST', '/apis/apps/v1/namespaces/kube-system/daemonsets', daemonset, expect=(201,))

    def pod():
        found = cp.api('GET', '/api/v1/namespaces/kube-system/pods?labelSelector=lab%3Dagent')['items']
        return found[0] if found else None

    def crashing():
        found = pod()
        states = [s.get('state', {}).get('waiting', {}).get('reason') for s in ((found or {}).get('status') or {}).get('containerStatuses') or ()]
        return states == ['CrashLoopBackOff'], states
    try:
        Lab.wait_until(crashing, WAIT, what='the lab-agent pod on cni-2 in CrashLoopBackOff')
        assert cp.crash_looping(pod())
        # the crash is reported, and the watchers have seen every event up to it: the Node stayed NotReady
        ready = _ready(cp, 'cni-2')
        assert (ready['status'], ready['message']) == ('False', kubelet.NETWORK_NOT_READY)
        cp.clear_crash_loop('cni-2')
        assert not cp.crash_looping(pod())
        Lab.wait_until(lambda: (_ready(cp, 'cni-2').get('status') == 'True', _ready(cp, 'cni-2')), WAIT, what='cni-2 Ready once its agent runs')
    finally:
        cp.clear_crash_loop('cni-2')
        cp.api('DELETE', '/apis/apps/v1/namespaces/kube-system/daemonsets/lab-agent?propagationPolicy=Foreground', expect=(200, 202, 404))

    def gone():
        found = pod()  # one read: the pod may go between two
        return found is None, found and found['metadata']['name']
    Lab.wait_until(gone, WAIT, what='the lab-agent pod gone')


class _FakePlane:
    """What CniReadiness reads of a control plane: a Ready agent pod on a Node NotReady for its network."""

    def __init__(self, crash_looping):
        self.patches = []
        self._crash_looping = crash_looping
        self.pod = {'metadata': {'name': 'cilium-abcde', 'namespace': 'kube-system', 'labels': {'k8s-app': 'cilium'}},
                    'spec': {'nodeName': 'n1'},
                    'status': {'conditions': [{'type': 'Ready', 'status': 'True'}, {'type': 'ContainersReady', 'status': 'True'}]}}
        self.node = {'metadata': {'name': 'n1'}, 'status': {'conditions': [
            {'type': 'Ready', 'status': 'False', 'reason': 'KubeletNotReady', 'message': kubelet.NETWORK_NOT_READY}]}}

    def api(self, method, path, body=None, **_kwargs):
        if method == 'PATCH':
            self.patches.append((path, body))
            return {}
        return {'items': [self.node] if path.startswith('/api/v1/nodes') else [self.pod]}

    def crash_looping(self, pod):
        return self._crash_looping and pod is self.pod


def test_a_ready_agent_pod_under_the_crash_loop_fault_does_not_make_its_node_ready():
    """CniReadiness.reconcile, the moment taken deterministically: the agent pod still Ready (kwok's stage) but under the
    crash-loop fault leaves its Node NotReady; the same pod without the fault makes it Ready."""
    faulted = _FakePlane(crash_looping=True)
    kubelet.CniReadiness(faulted, ('kwok.x-k8s.io/node', 'fake')).reconcile()
    assert faulted.patches == []
    healthy = _FakePlane(crash_looping=False)
    kubelet.CniReadiness(healthy, ('kwok.x-k8s.io/node', 'fake')).reconcile()
    assert [(path, body['status']['conditions'][0]['reason']) for path, body in healthy.patches] == [('/api/v1/nodes/n1/status', 'KubeletReady')]


# the cni role's Cilium values (roles/cni/defaults/main.yml cni_cilium_values) for a cluster named lab, id 1
CILIUM_VALUES = {
    'cluster': {'name': 'lab', 'id': 1}, 'ipam': {'mode': 'kubernetes'}, 'kubeProxyReplacement': True,
    'k8sServiceHost': 'localhost', 'k8sServicePort': 7445, 'routingMode': 'native', 'autoDirectNodeRoutes': True,
    'ipv4NativeRoutingCIDR': '10.244.0.0/16', 'cgroup': {'autoMount': {'enabled': False}, 'hostRoot': '/sys/fs/cgroup'},
    'securityContext': {'capabilities': {
        'ciliumAgent': ['CHOWN', 'KILL', 'NET_ADMIN', 'NET_RAW', 'IPC_LOCK', 'SYS_ADMIN', 'SYS_RESOURCE', 'DAC_OVERRIDE',
                        'FOWNER', 'SETGID', 'SETUID'],
        'cleanCiliumState': ['NET_ADMIN', 'SYS_ADMIN', 'SYS_RESOURCE']}},
    'operator': {'replicas': 2},
}


def test_the_real_cilium_chart_inline_makes_every_node_ready(cp, tmp_path):
    """`helm template` of the upstream chart (the cilium-chart component) as a Talos inline manifest: the real DaemonSet
    controller makes an agent pod per node, kwok makes it Ready, and each Node's kubelet reports Ready."""
    import os  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    from lab import upstream  # pylint: disable=import-outside-toplevel
    helm = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), '.tools', 'bin', 'helm')
    if not os.access(helm, os.X_OK):
        pytest.skip('no helm in .tools/bin (make setup)')
    values = tmp_path / 'values.json'
    values.write_text(json.dumps(CILIUM_VALUES))
    rendered = subprocess.run([helm, 'template', 'cilium', upstream.chart('cilium-chart'), '--namespace', 'kube-system',
                               '-f', str(values)], capture_output=True, text=True, check=True, timeout=120).stdout
    cp.register_node('cni-3', addresses=['127.0.0.33'])
    objects = manifests.apply_order(manifests.render(_config(inlineManifests=[{'name': 'cilium', 'contents': rendered}]))['manifests'])
    assert ('DaemonSet', 'cilium') in [(o['kind'], o['metadata']['name']) for o in objects]
    _apply_until_done(manifests.ManifestApplier(cp), objects)
    nodes = [n['metadata']['name'] for n in cp.api('GET', '/api/v1/nodes')['items']]

    def every_node_ready():
        seen = {name: _ready(cp, name).get('status') for name in nodes}
        return set(seen.values()) == {'True'}, seen
    Lab.wait_until(every_node_ready, WAIT, what='every Node Ready once the chart\'s agents are')
    agents = cp.api('GET', '/api/v1/namespaces/kube-system/pods?labelSelector=k8s-app%3Dcilium')['items']
    assert {p['spec'].get('nodeName') for p in agents if p['metadata']['name'].startswith('cilium-')} >= set(nodes)
    daemonset = cp.api('GET', '/apis/apps/v1/namespaces/kube-system/daemonsets/cilium')
    Lab.wait_until(lambda: (cp.api('GET', '/apis/apps/v1/namespaces/kube-system/daemonsets/cilium')['status'].get('numberReady')
                            == len(nodes), daemonset['status']), WAIT, what='the cilium DaemonSet ready on every node')


def _agent_on(cp, node):
    return next(p for p in cp.api('GET', '/api/v1/namespaces/kube-system/pods?labelSelector=k8s-app%3Dcilium')['items']
                if p['spec'].get('nodeName') == node and any(r['kind'] == 'DaemonSet' for r in p['metadata'].get('ownerReferences') or ()))


def test_a_crash_looping_agent_is_reported_as_kubelet_reports_it_and_the_daemonset_counts_it_unready(cp):
    """Runs after the real chart made every node Ready: the agent on cni-1 crash-loops, then runs again."""
    ready_before = cp.api('GET', '/apis/apps/v1/namespaces/kube-system/daemonsets/cilium')['status']['numberReady']
    cp.crash_loop('cni-1')

    def crashing():
        agent = _agent_on(cp, 'cni-1')
        states = [s.get('state', {}).get('waiting', {}).get('reason') for s in agent['status'].get('containerStatuses') or ()]
        return bool(states) and set(states) == {'CrashLoopBackOff'}, agent['status']
    status = Lab.wait_until(crashing, WAIT, what='the agent on cni-1 in CrashLoopBackOff')
    agent = _agent_on(cp, 'cni-1')
    waiting = status['containerStatuses'][0]
    assert waiting['state']['waiting']['message'] == 'back-off 5m0s restarting failed container=%s pod=%s_kube-system(%s)' % (
        waiting['name'], agent['metadata']['name'], agent['metadata']['uid'])
    assert waiting['restartCount'] >= 1 and waiting['lastState']['terminated']['reason'] == 'Error'
    assert status['phase'] == 'Running'
    assert [c['status'] for c in status['conditions'] if c['type'] == 'Ready'] == ['False']
    # the real DaemonSet controller counts it
    Lab.wait_until(lambda: (cp.api('GET', '/apis/apps/v1/namespaces/kube-system/daemonsets/cilium')['status'].get('numberReady')
                            == ready_before - 1, ready_before), WAIT, what='numberReady one less')
    cp.clear_crash_loop('cni-1')
    Lab.wait_until(lambda: (cp.api('GET', '/apis/apps/v1/namespaces/kube-system/daemonsets/cilium')['status'].get('numberReady')
                            == ready_before, ready_before), WAIT, what='numberReady back once the agent runs')


def test_the_cilium_agents_and_operator_leave_a_ciliumnode_per_node(cp):
    """Runs after the real chart made every node Ready: the operator's CRD, and a CiliumNode per node with an agent."""
    crd = cp.api('GET', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions/ciliumnodes.cilium.io')
    assert crd['spec']['names']['kind'] == 'CiliumNode'
    nodes = {n['metadata']['name']: n for n in cp.api('GET', '/api/v1/nodes')['items']}

    def every_node():
        found = {c['metadata']['name']: c for c in cp.api('GET', '/apis/cilium.io/v2/ciliumnodes')['items']}
        return set(found) == set(nodes), sorted(found)
    Lab.wait_until(every_node, WAIT, what='a CiliumNode per Node')
    cilium_node = cp.api('GET', '/apis/cilium.io/v2/ciliumnodes/cni-1')
    assert cilium_node['metadata']['ownerReferences'][0]['uid'] == nodes['cni-1']['metadata']['uid']
    assert {'type': 'InternalIP', 'ip': '127.0.0.31'} in cilium_node['spec']['addresses']
    assert cilium_node['spec']['ipam']['podCIDRs'] == nodes['cni-1']['spec'].get('podCIDRs', [])


def test_a_kubelet_that_comes_back_reports_its_pods_ready_again_and_its_node_ready(cp):
    """Runs after the real chart made every node Ready: cni-2's kubelet stops (kube-controller-manager marks the Node
    Unknown and its pods not Ready), then runs again: its pods Ready again, the Node NotReady for its network, then Ready."""
    cp.stop_kubelet('cni-2')
    Lab.wait_until(lambda: (_ready(cp, 'cni-2').get('status') == 'Unknown', _ready(cp, 'cni-2')), WAIT, what='cni-2 Unknown')

    def agent_ready():
        conditions = {c['type']: c['status'] for c in _agent_on(cp, 'cni-2')['status'].get('conditions') or ()}
        return conditions.get('Ready'), conditions
    Lab.wait_until(lambda: (agent_ready()[0] == 'False', agent_ready()[1]), WAIT, what='the agent on cni-2 marked not Ready')
    cp.start_kubelet('cni-2')
    Lab.wait_until(lambda: (agent_ready()[0] == 'True', agent_ready()[1]), WAIT, what='the agent on cni-2 Ready again')
    Lab.wait_until(lambda: (_ready(cp, 'cni-2').get('status') == 'True', _ready(cp, 'cni-2')), WAIT, what='cni-2 Ready again')


def test_a_running_kubelet_puts_back_the_ready_of_a_pod_that_kube_controller_manager_took(tmp_path):
    """kube-controller-manager sets Ready False on a pod placed on a node its own node health cache does not yet see
    Ready (node_lifecycle_controller.go processPod, MarkPodsNotReady), which a Molecule run showed for a pod bound to a
    node that had just come back; the node's kubelet runs, so it writes its pod's Ready back (its status manager's
    reconcile). A control plane of its own with upstream's node lease and monitor timing, so that no Node event comes
    by to do it: a pod that is not a CNI agent and not on the host network (kwok's stages took a host-network pod up
    again in a try), brought back only by the watch on every pod."""
    with ControlPlane(str(tmp_path / 'controlplane'), nodes_wait_for_cni=True) as plane:
        plane.register_node('quiet-1', addresses=['127.0.0.41'])
        # kube-apiserver admits a pod only once kube-controller-manager has made its namespace's ServiceAccount
        Lab.wait_until(lambda: ('default' in [a['metadata']['name'] for a in plane.api(
            'GET', '/api/v1/namespaces/kube-system/serviceaccounts')['items']], 'no default ServiceAccount yet'), WAIT,
            what='the ServiceAccount kube-system/default')

        def create_pod(name, labels, host_network):
            plane.api('POST', '/api/v1/namespaces/kube-system/pods', {
                'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': name, 'namespace': 'kube-system', 'labels': labels},
                'spec': {'nodeName': 'quiet-1', 'hostNetwork': host_network, 'tolerations': [{'operator': 'Exists'}],
                         'containers': [{'name': 'app', 'image': 'registry.k8s.io/pause:3.10'}]}})

        def ready(name):
            pod = plane.api('GET', '/api/v1/namespaces/kube-system/pods/' + name)
            conditions = {c['type']: c['status'] for c in pod['status'].get('conditions') or ()}
            return conditions.get('Ready'), conditions
        create_pod('agent', {'k8s-app': 'cilium'}, True)  # a CNI agent: the Node turns Ready once it is
        Lab.wait_until(lambda: (_ready(plane, 'quiet-1').get('status') == 'True', _ready(plane, 'quiet-1')), WAIT,
                       what='quiet-1 Ready')
        # kube-controller-manager takes the not-ready taint away after the Node turned Ready: its last Node event
        Lab.wait_until(lambda: (not plane.api('GET', '/api/v1/nodes/quiet-1')['spec'].get('taints'),
                                plane.api('GET', '/api/v1/nodes/quiet-1')['spec'].get('taints')), WAIT, what='quiet-1 without taints')
        create_pod('app', {'app': 'ready-again'}, False)
        Lab.wait_until(lambda: (ready('app')[0] == 'True', ready('app')[1]), WAIT, what='the pod on quiet-1 Ready (kwok)')
        # what MarkPodsNotReady writes (pkg/controller/util/node/controller_utils.go:121): Ready False, the containers as they are
        plane.api('PATCH', '/api/v1/namespaces/kube-system/pods/app/status',
                  {'status': {'conditions': [{'type': 'Ready', 'status': 'False', 'lastTransitionTime': kubelet._now()}]}},
                  content_type='application/strategic-merge-patch+json')
        Lab.wait_until(lambda: (ready('app')[0] == 'True', ready('app')[1]), WAIT, what='the pod on quiet-1 Ready again (its kubelet runs)')
