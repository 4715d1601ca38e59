"""The lab's Kubernetes layer: API server, object store and simulated controllers.

Entry point for the rest of the lab: `KubeCluster` (lab/k8s/cluster.py). See
docs/lab-kubernetes.md.
"""

from .cluster import KubeCluster
from .lab import LabKubernetes, install

__all__ = ['KubeCluster', 'LabKubernetes', 'install']
