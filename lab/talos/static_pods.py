"""The static pods a Talos control plane runs, and the mirror pods its kubelet posts for them (both Kubernetes worlds)."""

import hashlib

# The control-plane components Talos runs as static pods (their mirror pods: mirror_pod)
STATIC_PODS = ('kube-apiserver', 'kube-controller-manager', 'kube-scheduler')


def mirror_pod(component, node_name, image, address):
    """The mirror pod a control plane's kubelet posts for one of the static pods Talos writes.

    siderolabs/talos v1.13.9 internal/app/machined/pkg/controllers/k8s/control_plane_static_pod.go renders
    kube-apiserver (:344-485), kube-controller-manager (:569-670) and kube-scheduler (:749-865) as static pods in
    kube-system, labels tier=control-plane and k8s-app=<component>, the image of the component's config
    (cluster.<component>.image), hostNetwork. The kubelet posts a mirror pod `<pod>-<node>` for each
    (k8s.io/kubernetes@v1.36.3 pkg/kubelet/pod/mirror_client.go:69-113 CreateMirrorPod: annotation
    kubernetes.io/config.mirror, the static pod's hash; owned by its Node, :91-97). The lab leaves the pod's other
    fields out; its config.mirror value is a hash of the image (what changes between the lab's static pods)."""
    return {
        'apiVersion': 'v1', 'kind': 'Pod',
        'metadata': {'name': '%s-%s' % (component, node_name), 'namespace': 'kube-system',
                     'labels': {'k8s-app': component, 'tier': 'control-plane'},
                     'annotations': {'kubernetes.io/config.mirror': hashlib.sha256(image.encode()).hexdigest()[:32],
                                     'kubernetes.io/config.source': 'file'}},
        'spec': {'nodeName': node_name, 'hostNetwork': True, 'priorityClassName': 'system-cluster-critical',
                 'tolerations': [{'operator': 'Exists'}],
                 'containers': [{'name': component, 'image': image}]},
        'status': {'hostIP': address} if address else {}}
