"""The flux role with a GitOps tree that manages flux-system itself (the layout `flux bootstrap` writes), run through
ansible-playbook against the Kubernetes API of the world PROXTALOS_LAB_KUBERNETES chooses (by default `upstream`:
kube-apiserver with etcd, lab/k8s_upstream, without kwok: no pod runs here; `lab`: lab/k8s's API): the tree's own gotk-components.yaml is installed while
the root Kustomization has applied no revision, and left to Flux afterwards - no forced re-apply that takes its
fields back from kustomize-controller.

Upstream rule read: flux2 v2.6.4 pkg/bootstrap/bootstrap.go:140-150 (mustInstallManifests: install only while the
Kustomization <ns>/<ns> is missing or has an empty status.lastAppliedRevision), the layout
pkg/manifestgen/install/install.go:87 and pkg/manifestgen/sync/sync.go:108 (<path>/<namespace>/gotk-*.yaml).
"""
import json
import os
import subprocess

import kubernetes
import pytest
import yaml

from lab.k8s_upstream import ControlPlane
from lab.world import kubernetes_world

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK_BIN = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
APPLY_TASK = "The GitOps tree's own Flux components (gotk-components.yaml) applied, until Flux has taken them over"

pytestmark = pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')

KUSTOMIZATION_CRD = {
    'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
    'metadata': {'name': 'kustomizations.kustomize.toolkit.fluxcd.io'},
    'spec': {'group': 'kustomize.toolkit.fluxcd.io', 'scope': 'Namespaced',
             'names': {'kind': 'Kustomization', 'listKind': 'KustomizationList', 'plural': 'kustomizations', 'singular': 'kustomization'},
             'versions': [{'name': 'v1', 'served': True, 'storage': True, 'subresources': {'status': {}},
                           'schema': {'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}}}]},
}
# what the tree's gotk-components.yaml holds here: the namespace, the Kustomization CRD and a marker only the tree has
TREE_COMPONENTS = [
    {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'flux-system'}},
    KUSTOMIZATION_CRD,
    {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'tree-components', 'namespace': 'flux-system'},
     'data': {'version': 'from-the-tree'}},
]


def api_server(tmp_path):
    """A context manager giving an object with .kubeconfig: kube-apiserver on the upstream world, lab/k8s's API otherwise."""
    if kubernetes_world() == 'upstream':
        return ControlPlane(str(tmp_path / 'controlplane'), kwok=False)
    # the lab/k8s world only
    from lab.k8s.testing import ClusterThread  # pylint: disable=import-outside-toplevel
    return ClusterThread()


def run_components(lab, tmp_path):
    book = tmp_path / 'components.yml'
    book.write_text(yaml.safe_dump([{
        'name': 'the flux role components entry point', 'hosts': 'localhost', 'connection': 'local', 'gather_facts': False,
        'vars': {'ansible_python_interpreter': '{{ ansible_playbook_python }}', 'cluster_name': 'lab',
                 'flux_kubeconfig': lab.kubeconfig, 'flux_artifacts_dir': str(tmp_path), 'flux_git_url': 'https://git.example/gitops.git',
                 'flux_repo_dir': str(tmp_path / 'repo'), 'flux_git_path': 'clusters/lab'},
        'tasks': [{'name': 'components', 'ansible.builtin.include_role': {'name': 'proxtalos.cluster.flux', 'tasks_from': 'components'}}],
    }], sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_STDOUT_CALLBACK='ansible.posix.json',
               ANSIBLE_LOCALHOST_WARNING='false', ANSIBLE_INVENTORY_UNPARSED_WARNING='false')
    done = subprocess.run([PLAYBOOK_BIN, str(book)], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    tasks = json.loads(done.stdout)['plays'][0]['tasks']
    found = dict((task["task"]["name"], task["hosts"]["localhost"]) for task in tasks)
    return dict((name.split(" : ", 1)[-1], result) for name, result in found.items())


def test_a_tree_that_manages_flux_system_is_installed_once_then_left_to_flux(tmp_path):
    own = tmp_path / 'repo' / 'clusters' / 'lab' / 'flux-system'
    own.mkdir(parents=True)
    (own / 'gotk-components.yaml').write_text(yaml.safe_dump_all(TREE_COMPONENTS))
    (own / 'gotk-sync.yaml').write_text('# the GitRepository and Kustomization flux bootstrap writes\n')
    (own / 'kustomization.yaml').write_text(yaml.safe_dump({'apiVersion': 'kustomize.config.k8s.io/v1beta1', 'kind': 'Kustomization',
                                                            'resources': ['gotk-components.yaml', 'gotk-sync.yaml']}))
    with api_server(tmp_path) as lab:
        kube = kubernetes.config.new_client_from_config(lab.kubeconfig)
        core = kubernetes.client.CoreV1Api(kube)
        custom = kubernetes.client.CustomObjectsApi(kube)

        first = run_components(lab, tmp_path)
        assert first[APPLY_TASK].get('changed') is True, first[APPLY_TASK]
        # the tree's own components were installed, not the role's manifest
        assert core.read_namespaced_config_map('tree-components', 'flux-system').data == {'version': 'from-the-tree'}

        # Flux runs: the root Kustomization has applied a revision, and kustomize-controller owns the components
        custom.create_namespaced_custom_object('kustomize.toolkit.fluxcd.io', 'v1', 'flux-system', 'kustomizations', {
            'apiVersion': 'kustomize.toolkit.fluxcd.io/v1', 'kind': 'Kustomization', 'metadata': {'name': 'flux-system', 'namespace': 'flux-system'},
            'spec': {'interval': '10m', 'path': './clusters/lab', 'prune': True, 'sourceRef': {'kind': 'GitRepository', 'name': 'flux-system'}}})
        custom.patch_namespaced_custom_object_status('kustomize.toolkit.fluxcd.io', 'v1', 'flux-system', 'kustomizations', 'flux-system', {
            'status': {'lastAppliedRevision': 'main@sha1:3333333333333333333333333333333333333333', 'observedGeneration': 1}})
        core.patch_namespaced_config_map('tree-components', 'flux-system', {
            'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'tree-components', 'namespace': 'flux-system'},
            'data': {'version': 'flux-upgraded-it'}},
            field_manager='kustomize-controller', force=True, _content_type='application/apply-patch+yaml')

        second = run_components(lab, tmp_path)
        assert second[APPLY_TASK].get('skipped') is True, second[APPLY_TASK]
        assert 'left to Flux' in second["Flux's components - what this run does with them"]['msg']
        # the collection took nothing back
        assert core.read_namespaced_config_map('tree-components', 'flux-system').data == {'version': 'flux-upgraded-it'}
