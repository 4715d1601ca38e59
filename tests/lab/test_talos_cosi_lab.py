"""apid's COSI State List of the bootstrap manifests (the Manifest resources Talos' ManifestController keeps on a control
plane, which `talosctl upgrade-k8s` reads), read with the collection's client over mTLS from lab nodes in this process:
a control plane lists one resource per manifest, its spec's YAML the objects rendered from the config it runs (the
kube-proxy image of cluster.proxy.image); a worker lists none; another resource type is not served by the lab."""
import pytest
import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client, errors
from lab.k8s_upstream import manifests
from lab.talos import testing
from talos_lab_nodes import configure

MANIFESTS = ('controlplane', 'Manifests.kubernetes.talos.dev')
# what Talos v1.13.9's ManifestController renders for a control plane of this config: Talos's own templates
# (tools/talos-manifests, lab/k8s_upstream/manifests.py), kube-proxy and CoreDNS enabled
TALOS_MANIFEST_IDS = ['00-kubelet-bootstrapping-token', '01-csr-approver-role-binding', '01-csr-node-bootstrap',
                      '01-csr-renewal-role-binding', '10-kube-proxy', '11-core-dns', '11-core-dns-svc',
                      '11-kube-config-in-cluster', '11-talos-node-rbac-template']


def manifests_by_id(config):
    """[(id, objects)] of a control plane's config, as lab/k8s_upstream/lab.py gives the fleet."""
    return [(m['id'], m['objects']) for m in manifests.render(config.text())['manifests']]


@pytest.fixture(scope='module')
def lab():
    harness = testing.FleetHarness()
    harness.fleet.manifests = manifests_by_id
    yield harness
    harness.close()


@pytest.fixture(scope='module')
def secrets():
    return testing.ClusterSecrets(os_key_type='ecdsa')


def listed(node, secrets, namespace, resource_type):
    credentials = client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab'))
    with client.TalosClient(node.address, credentials=credentials, timeout=5) as talos:
        return talos.cosi_list(namespace, resource_type)


def test_a_control_plane_lists_its_manifests_with_the_config_images(lab, secrets):
    node = configure(lab, 'cp-1', secrets)
    node.disk.config.cluster['proxy'] = {'image': 'registry.k8s.io/kube-proxy:v1.36.3'}
    resources = listed(node, secrets, *MANIFESTS)
    assert [r['id'] for r in resources] == TALOS_MANIFEST_IDS
    assert [(r['version'], r['phase']) for r in resources] == [('1', 'running')] * len(TALOS_MANIFEST_IDS)
    proxy = yaml.safe_load(resources[TALOS_MANIFEST_IDS.index('10-kube-proxy')]['yaml_spec'])
    assert [(o['kind'], o['metadata']['name']) for o in proxy] == [
        ('DaemonSet', 'kube-proxy'), ('ServiceAccount', 'kube-proxy'), ('ClusterRoleBinding', 'kube-proxy')]
    assert proxy[0]['spec']['template']['spec']['containers'][0]['image'] == 'registry.k8s.io/kube-proxy:v1.36.3'
    assert listed(node, secrets, 'k8s', MANIFESTS[1]) == []


def test_a_worker_lists_none_and_other_types_are_not_served(lab, secrets):
    worker = configure(lab, 'w-1', secrets, machine_type='worker')
    assert listed(worker, secrets, *MANIFESTS) == []
    with pytest.raises(errors.TalosApiError, match='UNIMPLEMENTED|Unimplemented'):
        listed(worker, secrets, 'network', 'NodeAddresses.net.talos.dev')
