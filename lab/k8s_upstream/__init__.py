"""Upstream Kubernetes for the lab: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok.

The binaries are the pinned upstream builds `make setup` caches (lab/upstream.py, docs/lab-kubernetes.md);
this package only configures and runs them on loopback, with the flags and files Talos gives its control
plane, and registers kwok-managed Nodes in place of kubelets.

    from lab.k8s_upstream import ControlPlane
    with ControlPlane(workdir) as cp:        # started; stopped at the end of the block
        cp.kubeconfig                         # admin kubeconfig (0600), CN admin, O system:masters
        cp.register_node('w1', labels={...}, addresses=['127.0.0.21'], pod_cidr='10.244.1.0/24')
        cp.status()                           # each process: pid, running, health, restarts
"""

from .controlplane import ControlPlane, ControlPlaneError, DEFAULT_ADMISSION_CONTROL  # noqa: F401
from .lab import install  # noqa: F401  (python -m lab up --extensions talos,k8s_upstream)
