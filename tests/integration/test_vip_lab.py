"""The control-plane VIP against a lab cluster of its own (3 control planes, no worker, time scale 0).

The lab answers the Kubernetes API on the cluster endpoint only while a control plane holds it as its Talos layer-2
VIP (on either world: lab/k8s serves it, lab/k8s_upstream forwards it to kube-apiserver). Machine configs without
the VIP (talos_machines_vip empty) fail the kubeconfig stage's readyz gate at the endpoint, as they would on real
hardware; the default (the endpoint's IP address, which no node has) brings the API up there once the configs carry
it, and the endpoint moves to another control plane when the one holding it goes down.
"""
import os

import pytest
import yaml

from k8s_stages_lab import PLAYBOOK_BIN, THROUGH_KUBECONFIG, StageCluster

from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait

pytestmark = [
    pytest.mark.lab, pytest.mark.slow,
    pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)'),
]
READYZ_GATE = 'Gate - the Kubernetes API server answers ready (/readyz)'


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    handle = StageCluster.start(str(tmp_path_factory.mktemp('vip')), control_planes=3, workers=0)
    try:
        yield handle
    finally:
        handle.stop()


def _vip_documents(path):
    with open(path, encoding='utf-8') as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc and doc.get('kind') == 'Layer2VIPConfig']


def _kubernetes(cluster):
    """The cluster's row of the lab status: lab/k8s's section, or lab/k8s_upstream's on the upstream world."""
    status = cluster.lab.status()
    return next(iter((status.get('k8s') or status['k8s_upstream']).values()))


def _served(cluster):
    return _kubernetes(cluster)['api']


def _vip(cluster):
    return _kubernetes(cluster)['vip'] or {}


def test_without_the_vip_the_kubeconfig_stage_fails_and_with_it_the_endpoint_answers_and_follows_the_holder(cluster):
    endpoint = next(iter(cluster.hosts.values()))['vars']['cluster_endpoint_host']
    no_vip = cluster.site('--tags', THROUGH_KUBECONFIG, '-e', 'talos_machines_vip=', '-e', 'talos_cluster_readyz_timeout=8')
    assert no_vip.rc != 0, 'the kubeconfig stage passed with no VIP in the configs'
    (task, dummy, message), = no_vip.failures()
    assert task.endswith(READYZ_GATE), no_vip.explain()
    assert endpoint in message, message
    for host in ('lab-cp-1', 'lab-cp-2', 'lab-cp-3'):
        assert _vip_documents(os.path.join(cluster.artifacts, '%s.yaml' % host)) == [], host
    assert '%s:6443' % endpoint not in _served(cluster)

    run = cluster.site('--tags', THROUGH_KUBECONFIG)
    assert run.rc == 0, run.explain()
    for host in ('lab-cp-1', 'lab-cp-2', 'lab-cp-3'):
        assert [(d['name'], d['link']) for d in _vip_documents(os.path.join(cluster.artifacts, '%s.yaml' % host))] == [
            (endpoint, 'ens18')], host
    assert '%s:6443' % endpoint in _served(cluster)

    # The holder goes down: another control plane (etcd healthy, the VIP in its config) takes the address over.
    holder = _vip(cluster)['holder']
    assert holder in ('lab-cp-1', 'lab-cp-2', 'lab-cp-3'), _vip(cluster)
    row = next(row for row in cluster.lab.vms() if row['name'] == holder)
    cluster.lab.proxmox().nodes(row['node']).qemu(row['vmid']).status.stop.post()
    moved = _wait.wait_for(lambda: (_vip(cluster)['holder'] not in (holder, None) and '%s:6443' % endpoint in _served(cluster),
                                    (_vip(cluster), _served(cluster))), 60, interval=0.2)
    assert moved.ok, 'the endpoint did not follow the VIP to another control plane: %r' % (moved.observation,)
    assert '%s:6443' % row['address'] not in _served(cluster)
