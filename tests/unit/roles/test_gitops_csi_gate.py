"""gitops role: the CSI gates as roles/gitops/tasks/main.yml defines them, run (one probe each) on worlds shaped like
the upstream Proxmox CSI chart deploys on Talos.

Upstream read: sergelogvinov/proxmox-csi-plugin a7c58ec6 (v0.19.1):
- charts/proxmox-csi-plugin/templates/node-deployment.yaml: DaemonSet `<fullname>-node` (line 2-4), the registrar
  registers `--kubelet-registration-path=<kubeletDir>/plugins/<provisionerName>/csi.sock` (line 85);
- charts/proxmox-csi-plugin/values.yaml:234-243: the node plugin tolerates karpenter.sh/disrupted, unschedulable and
  disk-pressure - not the control-plane taint, which Talos control planes carry unless scheduling is allowed on them;
- pkg/csi/driver.go:22: DriverName csi.proxmox.sinextra.dev.
CSINode shape: k8s.io/api v0.36.3 storage/v1 CSINodeSpec.Drivers (name, nodeID, topologyKeys), as the kubelet writes
it (kubernetes v1.36.3 pkg/volume/csi/nodeinfomanager/nodeinfomanager.go:502-525, 591-650).
The gates list is read from the role and its defaults, not restated here.
"""
import os
import sys

from jinja2 import StrictUndefined
from jinja2.nativetypes import NativeEnvironment
import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import steps

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, 'tests', 'unit', 'plugins', 'module_utils', '_k8s'))
from fake_kube import FakeKube  # noqa: E402  pylint: disable=wrong-import-position,import-error
ROLE = os.path.join(ROOT, 'roles', 'gitops')
DRIVER = 'csi.proxmox.sinextra.dev'
NODE_LABELS = {'app.kubernetes.io/name': 'proxmox-csi-plugin', 'app.kubernetes.io/instance': 'proxmox-csi-plugin',
               'app.kubernetes.io/component': 'node'}
CHART_TOLERATIONS = [{'key': 'karpenter.sh/disrupted', 'operator': 'Exists', 'effect': 'NoSchedule'},
                     {'key': 'node.kubernetes.io/unschedulable', 'operator': 'Exists', 'effect': 'NoSchedule'},
                     {'key': 'node.kubernetes.io/disk-pressure', 'operator': 'Exists', 'effect': 'NoSchedule'}]


def role_gates():
    """The CSI task's `gates`, rendered with the role's defaults (native types, as Ansible templates them)."""
    with open(os.path.join(ROLE, 'defaults', 'main.yml'), encoding='utf-8') as handle:
        defaults = yaml.safe_load(handle)
    with open(os.path.join(ROLE, 'tasks', 'main.yml'), encoding='utf-8') as handle:
        tasks = yaml.safe_load(handle)
    task = next(t for t in tasks if 'CSI' in t['name'])
    env = NativeEnvironment(undefined=StrictUndefined)  # a list default stays a list, as Ansible templates it

    def render(value):
        if isinstance(value, str):
            return env.from_string(value).render(**defaults)
        if isinstance(value, list):
            return [render(v) for v in value]
        if isinstance(value, dict):
            return dict((k, render(v)) for k, v in value.items())
        return value
    return render(task['proxtalos.cluster.k8s_gate']['gates'])


def node(name, control_plane=False):
    labels = {'kubernetes.io/hostname': name, 'kubernetes.io/os': 'linux'}
    taints = []
    if control_plane:
        labels['node-role.kubernetes.io/control-plane'] = ''
        taints.append({'key': 'node-role.kubernetes.io/control-plane', 'effect': 'NoSchedule'})
    return {'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': name, 'uid': 'uid-' + name, 'labels': labels},
            'spec': {'taints': taints}, 'status': {'conditions': [{'type': 'Ready', 'status': 'True', 'reason': 'KubeletReady'}]}}


def world(registered=('w-1', 'w-2')):
    kube = FakeKube()
    nodes = [node('cp-1', control_plane=True), node('w-1'), node('w-2')]
    controller = {'apiVersion': 'apps/v1', 'kind': 'Deployment',
                  'metadata': {'name': 'proxmox-csi-plugin-controller', 'namespace': 'csi-proxmox', 'generation': 1},
                  'spec': {'replicas': 1, 'selector': {'matchLabels': {'app.kubernetes.io/component': 'controller'}},
                           'template': {'metadata': {'labels': {'app.kubernetes.io/component': 'controller'}}, 'spec': {}}},
                  'status': {'observedGeneration': 1, 'replicas': 1, 'updatedReplicas': 1, 'readyReplicas': 1, 'availableReplicas': 1,
                             'conditions': [{'type': 'Available', 'status': 'True', 'reason': 'MinimumReplicasAvailable'},
                                            {'type': 'Progressing', 'status': 'True', 'reason': 'NewReplicaSetAvailable'}]}}
    daemonset = {'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
                 'metadata': {'name': 'proxmox-csi-plugin-node', 'namespace': 'csi-proxmox', 'uid': 'ds-uid', 'generation': 1},
                 'spec': {'selector': {'matchLabels': NODE_LABELS},
                          'updateStrategy': {'type': 'RollingUpdate', 'rollingUpdate': {'maxUnavailable': 1}},
                          'template': {'metadata': {'labels': NODE_LABELS},
                                       'spec': {'tolerations': CHART_TOLERATIONS, 'containers': [
                                           {'name': 'proxmox-csi-plugin-node'},
                                           {'name': 'csi-node-driver-registrar',
                                            'args': ['-v=5', '--csi-address=unix:///csi/csi.sock',
                                                     '--kubelet-registration-path=/var/lib/kubelet/plugins/%s/csi.sock' % DRIVER]}]}}},
                 # the DaemonSet controller counts the two workers only: the control plane's taint is not tolerated
                 'status': {'observedGeneration': 1, 'desiredNumberScheduled': 2, 'currentNumberScheduled': 2, 'updatedNumberScheduled': 2,
                            'numberReady': 2, 'numberAvailable': 2, 'numberMisscheduled': 0}}
    pods = [{'apiVersion': 'v1', 'kind': 'Pod',
             'metadata': {'name': 'proxmox-csi-plugin-node-%s' % name, 'namespace': 'csi-proxmox', 'labels': NODE_LABELS,
                          'ownerReferences': [{'kind': 'DaemonSet', 'name': 'proxmox-csi-plugin-node', 'uid': 'ds-uid', 'controller': True}]},
             'spec': {'nodeName': name}, 'status': {'phase': 'Running', 'conditions': [{'type': 'Ready', 'status': 'True'}],
                                                    'containerStatuses': [{'name': 'proxmox-csi-plugin-node', 'ready': True, 'state': {'running': {}}}]}}
            for name in ('w-1', 'w-2')]
    csinodes = [{'apiVersion': 'storage.k8s.io/v1', 'kind': 'CSINode',
                 'metadata': {'name': n['metadata']['name'], 'ownerReferences': [{'apiVersion': 'v1', 'kind': 'Node', 'name': n['metadata']['name']}]},
                 'spec': {'drivers': [{'name': DRIVER, 'nodeID': n['metadata']['name'],
                                       'topologyKeys': ['topology.kubernetes.io/region', 'topology.kubernetes.io/zone']}]
                          if n['metadata']['name'] in registered else []}}
                for n in nodes]
    kube.add(controller, daemonset, *nodes)
    kube.add(*pods)
    kube.add(*csinodes)
    return kube


def run(kube):
    built = steps.build_steps(role_gates(), 300, probe_once=True)
    outcomes = steps.run_steps(built, kube, 1)
    return built, outcomes


def test_a_tainted_control_plane_the_chart_does_not_tolerate_is_not_waited_for():
    built, outcomes = run(world())
    assert [o.passed for o in outcomes] == [True, True], steps.failure_message(built, outcomes)
    assert outcomes[1].result['summary'] == (
        'DaemonSet csi-proxmox/proxmox-csi-plugin-node Ready and %s registered on 2/2 eligible nodes' % DRIVER)
    assert any(note.startswith('not eligible: cp-1 (untolerated taint node-role.kubernetes.io/control-plane:NoSchedule')
               for note in outcomes[1].result['notes'])


def test_a_ready_node_pod_whose_driver_is_not_registered_fails_naming_the_node():
    built, outcomes = run(world(registered=('w-1',)))
    assert [o.passed for o in outcomes] == [True, False]
    message = steps.failure_message(built, outcomes)
    assert ('w-2 pod proxmox-csi-plugin-node-w-2 Ready, but CSI driver %s is not registered in CSINode w-2 (drivers: none)' % DRIVER
            in message), message
