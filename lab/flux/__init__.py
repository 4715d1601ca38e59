"""The lab's Flux simulation: source-controller, kustomize-controller, flux-operator and the
sealed-secrets controller, as controllers on a lab Kubernetes cluster's store, and the lab's
Git server. See docs/lab-flux.md.

    from lab.flux import attach
    flux = attach(kube_cluster)          # on the cluster's loop; flux.flux, flux.sealed, flux.stop()
"""

from .lab import FluxCluster, LabFlux, attach, install

__all__ = ['FluxCluster', 'LabFlux', 'attach', 'install']
