"""The GitOps hand-off on Flux's upstream controllers (python -m lab up --kubernetes upstream --flux upstream;
docs/lab-flux.md "In the World"): site.yml installs Flux's pinned install manifests, the lab runs source-,
kustomize- and helm-controller as processes once kwok runs their pods, the flux stage pushes the sealed Secrets over
smart HTTPS to the lab's Git server (a private CA, flux_git_ca_cert), source-controller fetches that commit and
kustomize-controller applies the lab's tree; every Kustomization is Ready at the pushed revision, and a second run
changes nothing. The sealed-secrets controller the tree deploys is the pinned upstream one, a process playing its pod
on the lab's pod network (lab/k8s_upstream/podnet.py): the gitops stage reads its certificate through kube-apiserver's
service proxy, and it unseals the SealedSecrets the collection sealed and committed into Secrets of its own.

Runs only on that world (make integration-upstream sets PROXTALOS_LAB_KUBERNETES and PROXTALOS_LAB_FLUX). It is the
collection's whole run."""

import os
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gitops_lab import GitopsCluster  # noqa: E402  pylint: disable=wrong-import-position,import-error

from lab.flux_upstream import FLUX_CONTROLLERS, SEALED_SECRETS  # noqa: E402  pylint: disable=wrong-import-position
from lab.flux_upstream.lab import LAB_REPO  # noqa: E402  pylint: disable=wrong-import-position
from lab.testing import start_lab  # noqa: E402  pylint: disable=wrong-import-position
from lab.world import FLUX_ENV, flux_world, kubernetes_world  # noqa: E402  pylint: disable=wrong-import-position

kubernetes = pytest.importorskip('kubernetes')
from kubernetes import client  # noqa: E402  pylint: disable=wrong-import-position

pytestmark = [pytest.mark.upstream, pytest.mark.skipif(
    kubernetes_world() != 'upstream' or flux_world(kubernetes=kubernetes_world()) != 'upstream',
    reason='the upstream Flux world only (%s=upstream with PROXTALOS_LAB_KUBERNETES=upstream; make integration-upstream)'
    % FLUX_ENV)]

CSI_FILE = 'infrastructure/proxmox-csi/proxmox-csi-plugin.sealedsecret.yaml'
TREE = ['apps', 'cert-manager', 'cert-manager-issuers', 'flux-credentials', 'flux-system', 'proxmox-ccm', 'proxmox-csi',
        'sealed-secrets']


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp('gitops-upstream-flux'))
    handle = GitopsCluster(start_lab(os.path.join(folder, 'lab')), folder)
    try:
        handle.render_cilium_manifest()
        handle.first = handle.site()
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
    assert running == sorted(FLUX_CONTROLLERS + (SEALED_SECRETS,)), clusters
    # the gitops stage read the controller's certificate through kube-apiserver's service proxy: the pod address kwok
    # gave the controller's pod, reached on the lab's pod network
    served = first.result_values('The sealed-secrets controller serves our certificate')[0]
    assert served['passed'] and served['url_path'].endswith('/services/http:sealed-secrets-controller:http/proxy/v1/cert.pem'), served
    pod_ip = [entry['pod_ip'] for entries in clusters.values() for entry in entries if entry['name'] == SEALED_SECRETS][0]
    assert pod_ip.startswith('10.244.'), pod_ip
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
    again = cluster.site()
    assert again.rc == 0, again.explain()
    assert again.changed() == dict((host, 0) for host in again.changed()), again.changed()
    assert _server_tip(cluster)[0] == tip   # nothing new pushed


def test_the_upstream_controller_unseals_what_the_collection_sealed_and_committed(cluster):
    """The SealedSecret of the CSI configuration, sealed by the flux stage with the kept key and committed: the upstream
    controller (judge) decrypted it into a Secret it owns, with the keys the sealed file holds, and marked it Synced."""
    assert cluster.first.rc == 0, cluster.first.explain()
    with open(os.path.join(cluster.lab.run_dir, 'gitops', CSI_FILE), encoding='utf-8') as handle:
        sealed = yaml.safe_load(handle)
    namespace, name = sealed['metadata']['namespace'], sealed['metadata']['name']
    custom = client.CustomObjectsApi(cluster.api())
    found = custom.get_namespaced_custom_object('bitnami.com', 'v1alpha1', namespace, 'sealedsecrets', name)
    synced = {c['type']: c for c in (found.get('status') or {}).get('conditions') or []}.get('Synced', {})
    assert synced.get('status') == 'True', found.get('status')
    secret = client.CoreV1Api(cluster.api()).read_namespaced_secret(name, namespace)
    assert sorted(secret.data) == sorted(sealed['spec']['encryptedData'])
    assert [(o.kind, o.name) for o in secret.metadata.owner_references] == [('SealedSecret', name)]
    assert all(value for value in secret.data.values())
