"""The admission policies the lab's workload faults put in an upstream cluster: kube-apiserver's own
MutatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA and on by default in v1.36:
k8s.io/kubernetes@v1.36.3 pkg/features/kube_features.go:2270-2274; its admission plugin is in the default set,
pkg/kubeapiserver/options/plugins.go:193) changes the new pods of one workload as they are created.

- k8s-image-pull: the pods get the label IMAGE_PULL_LABEL. kwok's pod-ready stage, as the lab writes it, leaves such
  a pod alone (lab/k8s_upstream/kubelet.py pod_ready_stage), and the lab's kubelet stand-in reports its image pull
  failing (kubelet.py ImagePulls).
- k8s-pending: the pods get the label PENDING_LABEL and a pod-level cpu request (spec.resources, PodLevelResources,
  beta and on by default since v1.34: kube_features.go:1780-1783) larger than any lab Node's allocatable cpu, so the
  real kube-scheduler finds no node for them (noderesources fit, `Insufficient cpu`).

A pod belongs to the workload NAMESPACE/NAME when it is created in NAMESPACE and owned by the DaemonSet or StatefulSet
NAME, or by a ReplicaSet of the Deployment NAME: the Deployment controller names its ReplicaSets
`<deployment>-<pod-template-hash>` and gives their pods that label (k8s.io/kubernetes@v1.36.3
pkg/controller/deployment/sync.go:199, 207), which the policy's match condition checks.

Pods created before the policy took effect, and the workload's own object, are not changed. The probe
(ControlPlane._wait_policy) creates a pod with dryRun=All until the policy changes it, so that a fault is in force
when the fault command returns.
"""

import hashlib
import re

IMAGE_PULL_LABEL = 'lab.proxtalos.io/image-pull'
PENDING_LABEL = 'lab.proxtalos.io/pending'
# more cpu than any lab Node has (ControlPlane.register_node gives each 4): no node fits it
PENDING_CPU = '1000'
API = '/apis/admissionregistration.k8s.io/v1/'
NAME = re.compile(r'^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')
PROBE_HASH = 'labprobe'


def parse_workload(text, kinds):
    """(namespace, name) of NAMESPACE/NAME; ValueError naming what is wrong."""
    namespace, slash, name = (text or '').partition('/')
    if not slash or not NAME.match(namespace) or not NAME.match(name) or len(name) > 253:
        raise ValueError('workload must be NAMESPACE/NAME of a %s, got %r' % (kinds, text))
    return namespace, name


def policy_name(kind, namespace, name):
    """A name for the policy of fault kind on NAMESPACE/NAME (short whatever the names' length)."""
    return 'lab-%s-%s' % (kind, hashlib.sha256(('%s/%s' % (namespace, name)).encode()).hexdigest()[:12])


def _owned_by(name):
    """A CEL condition: the pod is one of workload name's (see the module's docstring)."""
    return ("has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, "
            "((r.kind == 'DaemonSet' || r.kind == 'StatefulSet') && r.name == '{name}') || "
            "(r.kind == 'ReplicaSet' && has(object.metadata.labels) && 'pod-template-hash' in object.metadata.labels && "
            "r.name == '{name}-' + object.metadata.labels['pod-template-hash']))").format(name=name)


def image_pull_mutation():
    return "Object{metadata: Object.metadata{labels: {'%s': 'true'}}}" % IMAGE_PULL_LABEL


def pending_mutation():
    return ("Object{metadata: Object.metadata{labels: {'%s': 'true'}}, "
            "spec: Object.spec{resources: Object.spec.resources{requests: {'cpu': '%s'}}}}" % (PENDING_LABEL, PENDING_CPU))


def policy(kind, namespace, name, mutation):
    """(MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding) that apply mutation (a CEL apply configuration) to the
    pods workload NAMESPACE/NAME's controllers create."""
    pname = policy_name(kind, namespace, name)
    labels = {'app.kubernetes.io/managed-by': 'proxtalos-lab'}
    spec = {
        'matchConstraints': {'resourceRules': [{'apiGroups': [''], 'apiVersions': ['v1'], 'operations': ['CREATE'],
                                                'resources': ['pods']}]},
        'matchConditions': [{'name': 'namespace', 'expression': "request.namespace == '%s'" % namespace},
                            {'name': 'workload', 'expression': _owned_by(name)}],
        'mutations': [{'patchType': 'ApplyConfiguration', 'applyConfiguration': {'expression': mutation}}],
        'failurePolicy': 'Fail',
        'reinvocationPolicy': 'Never',
    }
    body = {'apiVersion': 'admissionregistration.k8s.io/v1', 'kind': 'MutatingAdmissionPolicy',
            'metadata': {'name': pname, 'labels': labels}, 'spec': spec}
    binding = {'apiVersion': 'admissionregistration.k8s.io/v1', 'kind': 'MutatingAdmissionPolicyBinding',
               'metadata': {'name': pname, 'labels': labels}, 'spec': {'policyName': pname}}
    return body, binding


def probe_pod(name):
    """A pod as the DaemonSet name's controller would create it (for a dryRun=All create): the policy's conditions hold
    for it. Its security context passes every Pod Security level, so the namespace's own admission admits it."""
    return {
        'apiVersion': 'v1', 'kind': 'Pod',
        'metadata': {'generateName': 'lab-policy-probe-', 'labels': {'pod-template-hash': PROBE_HASH},
                     'ownerReferences': [{'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'name': name,
                                          'uid': '00000000-0000-0000-0000-000000000000'}]},
        'spec': {'automountServiceAccountToken': False,
                 'securityContext': {'runAsNonRoot': True, 'runAsUser': 65532, 'seccompProfile': {'type': 'RuntimeDefault'}},
                 'containers': [{'name': 'probe', 'image': 'registry.k8s.io/pause:3.10',
                                 'securityContext': {'allowPrivilegeEscalation': False, 'capabilities': {'drop': ['ALL']}}}]},
    }
