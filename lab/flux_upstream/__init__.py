"""Flux's controllers, flux-operator and the sealed-secrets controller in the lab: the upstream builds, run as processes.

The binaries are the pinned upstream builds scripts/upstream_binaries.py caches (upstream/<name>.json); this package
applies the controllers' own CRDs, RBAC and Deployments to a lab ControlPlane (lab/k8s_upstream), runs each controller
with its own identity, with the lab's Git server (lab/git_server.py: smart HTTP(S) on loopback, git http-backend).

    from lab.k8s_upstream import ControlPlane
    from lab.flux_upstream import FluxControllers, SmartGitServer
    with ControlPlane(workdir) as cp, SmartGitServer(gitdir) as git, FluxControllers(cp, fluxdir) as flux:
        git.create_repo('proxtalos/lab-gitops')   # push to git.url_for('proxtalos/lab-gitops')
        flux.status()                            # each controller: pid, running, health URL, log
"""

from .controllers import FLUX_CONTROLLERS, FLUX_DISTRIBUTION, SEALED_SECRETS, FluxControllers, FluxError  # noqa: F401
from lab.git_server import SmartGitServer, GitServerError  # noqa: F401
from .lab import install  # noqa: F401  (python -m lab up --extensions talos,k8s_upstream,flux_upstream)
