"""The GitOps hand-off on Flux's upstream controllers (python -m lab up --kubernetes upstream --flux upstream;
docs/lab-flux.md "In the World"): site.yml installs Flux's pinned install manifests, the lab runs source-,
kustomize- and helm-controller as processes once kwok runs their pods, the flux stage pushes the sealed Secrets over
smart HTTPS to the lab's Git server (a private CA, flux_git_ca_cert), source-controller fetches that commit and
kustomize-controller applies the lab's tree; every Kustomization is Ready at the pushed revision, and a second run
changes nothing.

Runs only on that world (make integration-upstream sets PROXTALOS_LAB_KUBERNETES and PROXTALOS_LAB_FLUX). The
sealed-secrets check of the gitops stage is off here (gitops_sealed_secrets_verify=false): it reads the controller's
certificate through kube-apiserver's service proxy, which dials the pod address kwok made up, where no process
listens - the lab does not run the sealed-secrets controller yet (docs/lab-flux.md "Not yet"). Everything else is
the collection's whole run."""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gitops_lab import GitopsCluster  # noqa: E402  pylint: disable=wrong-import-position,import-error

from lab.flux_upstream import FLUX_CONTROLLERS  # noqa: E402  pylint: disable=wrong-import-position
from lab.flux_upstream.lab import LAB_REPO  # noqa: E402  pylint: disable=wrong-import-position
from lab.testing import start_lab  # noqa: E402  pylint: disable=wrong-import-position
from lab.world import FLUX_ENV, flux_world, kubernetes_world  # noqa: E402  pylint: disable=wrong-import-position

kubernetes = pytest.importorskip('kubernetes')
from kubernetes import client  # noqa: E402  pylint: disable=wrong-import-position

pytestmark = [pytest.mark.upstream, pytest.mark.skipif(
    kubernetes_world() != 'upstream' or flux_world(kubernetes=kubernetes_world()) != 'upstream',
    reason='the upstream Flux world only (%s=upstream with PROXTALOS_LAB_KUBERNETES=upstream; make integration-upstream)'
    % FLUX_ENV)]

NO_VERIFY = ('-e', 'gitops_sealed_secrets_verify=false')
TREE = ['apps', 'cert-manager', 'cert-manager-issuers', 'flux-credentials', 'flux-system', 'proxmox-ccm', 'proxmox-csi',
        'sealed-secrets']


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp('gitops-upstream-flux'))
    handle = GitopsCluster(start_lab(os.path.join(folder, 'lab')), folder)
    try:
        handle.render_cilium_manifest()
        handle.first = handle.site(*NO_VERIFY)
        yield handle
    finally:
        handle.lab.stop()


def _server_tip(cluster):
    """The commit main points at on the lab's Git server (its bare repository, read with git, not through the collection)."""
    git = cluster.lab.status()['flux_upstream']['git']
    bare = os.path.join(os.path.dirname(git['ca_file']), 'git', LAB_REPO + '.git')
    return subprocess.run(['git', '-C', bare, 'rev-parse', 'refs/heads/main'], capture_output=True, text=True,
                          check=True).stdout.strip(), bare


def test_the_tree_is_ready_at_the_pushed_revision_on_the_upstream_controllers_and_a_rerun_changes_nothing(cluster):
    first = cluster.first
    assert first.rc == 0, first.explain()
    gate = first.result_values('Gate on the Flux Kustomization tree')[0]
    assert gate['summary'] == 'Kustomizations Ready 8/8', gate
    # the controllers are the lab's processes, started from the Deployments the collection applied
    clusters = cluster.lab.status()['flux_upstream']['clusters']
    running = sorted(entry['name'] for entries in clusters.values() for entry in entries if entry['running'])
    assert running == sorted(FLUX_CONTROLLERS), clusters
    # the flux stage pushed a commit holding the sealed Secrets; source-controller fetched it and every Kustomization
    # applied it
    tip, bare = _server_tip(cluster)
    files = subprocess.run(['git', '-C', bare, 'show', '--name-only', '--format=', tip], capture_output=True, text=True,
                           check=True).stdout.split()
    assert 'infrastructure/flux-credentials/flux-system.sealedsecret.yaml' in files, files
    custom = client.CustomObjectsApi(cluster.api())
    source = custom.get_namespaced_custom_object('source.toolkit.fluxcd.io', 'v1', 'flux-system', 'gitrepositories', 'flux-system')
    assert source['status']['artifact']['revision'] == 'main@sha1:' + tip, source['status']
    applied = dict((item['metadata']['name'], item['status'].get('lastAppliedRevision'))
                   for item in custom.list_namespaced_custom_object('kustomize.toolkit.fluxcd.io', 'v1', 'flux-system',
                                                                    'kustomizations')['items'])
    assert applied == dict((name, 'main@sha1:' + tip) for name in TREE), applied
    # the credentials Secret carries the Git server's private CA (flux_git_ca_cert), which source-controller needs
    secret = client.CoreV1Api(cluster.api()).read_namespaced_secret('flux-system', 'flux-system')
    assert sorted(secret.data) == ['ca.crt', 'password', 'username']
    again = cluster.site(*NO_VERIFY)
    assert again.rc == 0, again.explain()
    assert again.changed() == dict((host, 0) for host in again.changed()), again.changed()
    assert _server_tip(cluster)[0] == tip   # nothing new pushed
