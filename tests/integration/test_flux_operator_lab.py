"""The flux stage's operator mode (flux_install_method=operator: flux-operator and a FluxInstance) on a lab of its own:
site.yml converges with the FluxInstance gate and the gitops gates passing, the FluxInstance made the sync objects, and
a second run of the flux and gitops stages changes nothing."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gitops_lab import PLAYBOOK_BIN, GitopsCluster  # noqa: E402  pylint: disable=wrong-import-position,import-error

from lab.testing import start_lab  # noqa: E402  pylint: disable=wrong-import-position

kubernetes = pytest.importorskip('kubernetes')
from kubernetes import client  # noqa: E402  pylint: disable=wrong-import-position

OPERATOR = ('-e', 'flux_install_method=operator')


def changed_tasks(run):
    """[(task name, host, the changed loop items' labels)] of every changed host result: what a re-run that should
    change nothing changed."""
    return [(task['task']['name'], host, [item.get('_ansible_item_label') or item.get('item') for item in result.get('results') or []
                                          if item.get('changed')])
            for play in run.data.get('plays') or [] for task in play.get('tasks') or []
            for host, result in task['hosts'].items() if result.get('changed')]


@pytest.fixture(scope='module')
def operator_cluster(tmp_path_factory):
    if not os.access(PLAYBOOK_BIN, os.X_OK):
        pytest.skip('no ansible-playbook in .venv (make setup)')
    folder = str(tmp_path_factory.mktemp('operator'))
    cluster = GitopsCluster(start_lab(os.path.join(folder, 'lab')), folder)
    try:
        cluster.render_cilium_manifest()  # a lab on upstream Kubernetes (nothing to do on lab/k8s)
        cluster.first = cluster.site(*OPERATOR)
        yield cluster
    finally:
        cluster.lab.stop()


def test_operator_mode_converges_with_its_gates_and_a_rerun_changes_nothing(operator_cluster):
    first = operator_cluster.first
    assert first.rc == 0, first.explain()
    # flux-operator applied right after the kubeconfig stage, not again in the flux stage
    applied = first.result_values("Apply Flux's components")
    assert applied[0]['changed'] is True and applied[1].get('skipped') is True, applied
    assert first.result_values('Install Flux with the components manifest') == [] or \
        all(r.get('skipped') for r in first.result_values('Install Flux with the components manifest'))
    # the stage's last gate run: the FluxInstance, each controller, then the GitRepository - in order, each passed
    final = first.result_values('Gate on Flux - the FluxInstance')[0]
    assert [(step['title'], step['passed']) for step in final['results']] == [
        ('FluxInstance flux-system/flux Ready', True),
        ('Flux controller source-controller available', True), ('Flux controller kustomize-controller available', True),
        ('Flux controller helm-controller available', True), ('Flux controller notification-controller available', True),
        ('GitRepository flux-system/flux-system Ready', True)], final
    assert first.result_values('Gate on flux-operator')[0]['results'][1]['summary'] == 'CRDs Established 1/1'
    tree = first.result_values('Gate on the Flux Kustomization tree')[0]
    assert tree['summary'] == 'Kustomizations Ready 8/8'

    custom = client.CustomObjectsApi(operator_cluster.api())
    instance = custom.get_namespaced_custom_object('fluxcd.controlplane.io', 'v1', 'flux-system', 'fluxinstances', 'flux')
    ready = next(c for c in instance['status']['conditions'] if c['type'] == 'Ready')
    assert ready['status'] == 'True' and ready['reason'] == 'ReconciliationSucceeded'
    # the lab's Git server: lab/flux's simulated one, or the smart-HTTPS one of a lab with Flux's upstream controllers,
    # which names its URL in hosts.yml (inventories/lab/group_vars/all/flux.yml takes it)
    git_url = (operator_cluster.hosts['cluster'].get('vars') or {}).get(
        'lab_git_url', 'https://git.lab.internal/proxtalos/lab-gitops.git')
    assert instance['spec']['sync'] == {'kind': 'GitRepository', 'url': git_url,
                                        'ref': 'refs/heads/main', 'path': './clusters/lab', 'interval': '1m',
                                        'name': 'flux-system', 'pullSecret': 'flux-system'}
    assert sorted(c['name'] for c in instance['status']['components']) == sorted(
        ['source-controller', 'kustomize-controller', 'helm-controller', 'notification-controller'])
    # the sync objects are the operator's (as flux-operator generates them), not the manifest method's
    source = custom.get_namespaced_custom_object('source.toolkit.fluxcd.io', 'v1', 'flux-system', 'gitrepositories', 'flux-system')
    assert source['spec']['ref'] == {'name': 'refs/heads/main'} and source['spec']['secretRef'] == {'name': 'flux-system'}
    apps = client.AppsV1Api(operator_cluster.api())
    assert apps.read_namespaced_deployment('flux-operator', 'flux-system').status.available_replicas == 1

    again = operator_cluster.site('--tags', 'flux,gitops', *OPERATOR)
    assert again.rc == 0, again.explain()
    assert set(again.changed().values()) == {0}, changed_tasks(again)
    assert again.result_values('Gate on Flux - the FluxInstance')[0]['results'][0]['passed'] is True
    checked = operator_cluster.site('--check', '--tags', 'flux,gitops', *OPERATOR)
    assert checked.rc == 0 and set(checked.changed().values()) == {0}, (checked.explain(), changed_tasks(checked))
