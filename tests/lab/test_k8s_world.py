"""The Kubernetes API inside the World: no API before etcd is bootstrapped, then the kubeconfig
from the Talos Kubeconfig RPC works unchanged; kubelets register their Nodes, NotReady until a
Cilium agent is Ready; the k8s faults go through the lab's fault registry."""

import os
import socket

import pytest
from proxmoxer import ProxmoxAPI
from proxmoxer.tools import Tasks

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client as talos_client, errors
from ansible_collections.proxtalos.cluster.tests import helpers
from lab.talos import testing
from lab.talos.node import TALOS_VERSION
from lab.testing import free_net, world_in_thread

kubernetes = pytest.importorskip('kubernetes')
from kubernetes import client as kube_client, config as kube_config  # noqa: E402  pylint: disable=wrong-import-position


@pytest.fixture
def running(tmp_path):
    with world_in_thread(tmp_path / 'run', free_net(), extensions=('lab.talos', 'lab.k8s'), profile='instant') as world:
        yield world


def wait_until(probe, what, timeout=30, interval=0.05):
    """tests/helpers.py wait_until with this file's defaults (30 s, probed every 50 ms)."""
    return helpers.wait_until(probe, what, timeout=timeout, interval=interval)


def _ok(api, upid):
    status = Tasks.blocking_status(api, upid, timeout=10, polling_interval=0.01)
    assert status['exitstatus'] == 'OK', status


def _vm(running, api, vmid, index):
    net = running.world.net
    address = net.static_host(index)
    _ok(api, api.nodes('pve1').qemu.post(vmid=vmid, name='talos-%d' % vmid, net0='virtio,bridge=vmbr0', agent=1, scsi0='local-lvm:32',
                                         ide0='local-lvm:cloudinit', ipconfig0='ip=%s/24,gw=%s' % (address, net.gateway)))
    qemu = api.nodes('pve1').qemu(vmid)
    _ok(api, qemu.status.start.post())
    return qemu, address


def _port_open(host, port):
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _maintenance(address):
    def check():
        try:
            return True, talos_client.probe_maintenance(address, timeout=2)
        except errors.TalosTransientError as exc:
            return False, str(exc)
    return check


def _cluster_up(running, api, tmp_path, cp_vmid=401, worker_vmid=402, vip=True, keep=None):
    """One control plane and one worker from maintenance mode to registered Nodes; returns (core API, CP VM, addresses).

    vip: the control plane's config carries the endpoint's address as its layer-2 VIP (else the endpoint never answers,
    and the Nodes are read through the control plane's own address). keep: a dict that gets the secrets and endpoint.
    """
    world = running.world
    secrets = testing.ClusterSecrets()
    if keep is not None:
        keep.update(secrets=secrets, endpoint='https://%s:6443' % world.net.endpoint_host)
    endpoint_host = world.net.endpoint_host
    endpoint = 'https://%s:6443' % endpoint_host
    cp_vm, cp_address = _vm(running, api, cp_vmid, 3)
    worker_address = _vm(running, api, worker_vmid, 4)[1]
    for address, kind in ((cp_address, 'controlplane'), (worker_address, 'worker')):
        wait_until(_maintenance(address), 'maintenance mode on %s' % address)
        with talos_client.TalosClient(address, insecure=True, timeout=5) as talos:
            talos.apply_configuration(testing.render_config(secrets, kind, endpoint, hostname='cp-1' if kind == 'controlplane' else 'worker-1',
                                                            vip=endpoint_host if vip else None))
    credentials = talos_client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab'))

    def configured():
        try:
            with talos_client.TalosClient(cp_address, credentials=credentials, timeout=2) as talos:
                return True, talos.service_list()
        except (errors.TalosTransientError, errors.TalosTlsError) as exc:
            return False, str(exc)
    wait_until(configured, 'the control plane answering over mTLS')
    assert not _port_open(endpoint_host, 6443), 'a Kubernetes API answers before etcd is bootstrapped'
    with talos_client.TalosClient(cp_address, credentials=credentials, timeout=5) as talos:
        talos.bootstrap()
    wait_until(lambda: (_port_open(endpoint_host if vip else cp_address, 6443), 'closed'), 'the API after bootstrap')
    with talos_client.TalosClient(cp_address, credentials=credentials, timeout=5) as talos:
        kubeconfig_text = talos.kubeconfig()
    if not isinstance(kubeconfig_text, str):
        kubeconfig_text = kubeconfig_text.decode()
    if not vip:
        kubeconfig_text = kubeconfig_text.replace(endpoint, 'https://%s:6443' % cp_address)
    path = tmp_path / ('kubeconfig-%d' % cp_vmid)
    path.write_text(kubeconfig_text)
    os.chmod(path, 0o600)
    core = kube_client.CoreV1Api(kube_config.new_client_from_config(config_file=str(path)))
    wait_until(_nodes_are(core, {'cp-1', 'worker-1'}), 'both Nodes registered')
    return core, cp_vm, cp_address, worker_address


def _nodes_are(core, names):
    def nodes():
        try:
            found = {n.metadata.name: n for n in core.list_node().items}
        except Exception as exc:  # pylint: disable=broad-except
            return False, repr(exc)
        return set(found) == names, sorted(found)
    return nodes


def test_api_comes_up_with_etcd_and_nodes_register(running, tmp_path):
    world = running.world
    api = ProxmoxAPI(world.net.pve_host, user='proxtalos@pve', token_name='proxtalos', token_value=world.token_secret, verify_ssl=world.ca_path)
    endpoint_host = world.net.endpoint_host
    core, cp_vm, cp_address, worker_address = _cluster_up(running, api, tmp_path)
    nodes = _nodes_are(core, {'cp-1', 'worker-1'})
    worker = core.read_node('worker-1')
    ready = next(c for c in worker.status.conditions if c.type == 'Ready')
    assert ready.status == 'False' and ready.reason == 'KubeletNotReady' and 'NetworkPluginNotReady' in ready.message
    cp = core.read_node('cp-1')
    assert {'key': 'node-role.kubernetes.io/control-plane', 'effect': 'NoSchedule'} in [
        {'key': t.key, 'effect': t.effect} for t in cp.spec.taints]
    assert [a.address for a in worker.status.addresses if a.type == 'InternalIP'] == [worker_address]
    # the kubelet reports the Talos the node runs, as its Talos API does
    assert worker.status.node_info.os_image == 'Talos (%s)' % TALOS_VERSION
    # Talos' own manifests: CoreDNS waits (Pending) for a Ready node; kube-proxy runs on the host network
    apps = kube_client.AppsV1Api(core.api_client)
    assert apps.read_namespaced_deployment('coredns', 'kube-system').spec.replicas == 2
    assert apps.read_namespaced_daemon_set('kube-proxy', 'kube-system').metadata.managed_fields[0].manager == 'talos'
    # the control plane's own address serves the API too
    assert _port_open(cp_address, 6443)
    # a lab fault through the World's registry
    record = running.call(world.control({'op': 'fault', 'name': 'k8s-crashloop', 'target': 'worker-1', 'params': {}}))
    assert record['target'] == 'worker-1'
    record = running.call(world.control({'op': 'fault', 'name': 'k8s-image-pull', 'target': 'kube-system/coredns', 'params': {}}))
    assert record['params']['message'].endswith(': not found')
    with pytest.raises(Exception, match='target must be NAMESPACE/WORKLOAD'):
        running.call(world.control({'op': 'fault', 'name': 'k8s-image-pull', 'target': 'coredns', 'params': {}}))
    status = running.call(world.status())
    k8s = status['k8s']
    cluster = next(iter(k8s.values()))
    assert {n['name'] for n in cluster['nodes']} == {'cp-1', 'worker-1'}
    # the only control plane powered off: no API anywhere; powered on again: the API is back with its objects
    _ok(api, cp_vm.status.stop.post())
    wait_until(lambda: (not _port_open(endpoint_host, 6443) and not _port_open(cp_address, 6443), 'open'), 'the API down with its CP')
    _ok(api, cp_vm.status.start.post())
    wait_until(lambda: (_port_open(endpoint_host, 6443), 'closed'), 'the API back after the CP boots')
    wait_until(nodes, 'both Nodes still there after the restart')


def test_the_endpoint_answers_only_where_a_control_plane_holds_it_as_its_vip(running, tmp_path):
    """A control plane whose config has no VIP serves the API on its own address only: the endpoint address (which no
    node has) stays silent, as on real hardware, where nothing would answer ARP for it."""
    world = running.world
    api = ProxmoxAPI(world.net.pve_host, user='proxtalos@pve', token_name='proxtalos', token_value=world.token_secret, verify_ssl=world.ca_path)
    core, dummy, cp_address, dummy = _cluster_up(running, api, tmp_path, vip=False)
    # both Nodes registered: the control plane's kubelet runs, so it would have won the VIP's election by now
    assert {n.metadata.name for n in core.list_node().items} == {'cp-1', 'worker-1'}
    assert _port_open(cp_address, 6443)
    assert not _port_open(world.net.endpoint_host, 6443), 'the endpoint answers though no control plane has the VIP'
    served = next(iter(running.call(world.status())['k8s'].values()))['api']
    assert served == ['%s:6443' % cp_address]


def test_a_cluster_rebuilt_after_a_lab_reset_gets_a_working_api(running, tmp_path):
    """A lab reset deletes the VMs (their hooks remove API hosts) while it closes the clusters: the old API
    server must not come back on 6443, so the cluster built next serves with its own CA."""
    world = running.world
    api = ProxmoxAPI(world.net.pve_host, user='proxtalos@pve', token_name='proxtalos', token_value=world.token_secret, verify_ssl=world.ca_path)
    _cluster_up(running, api, tmp_path, 401, 402)
    running.call(world.control({'op': 'reset'}))
    wait_until(lambda: (not _port_open(world.net.endpoint_host, 6443), 'open'), 'no API after the reset')
    core = _cluster_up(running, api, tmp_path, 403, 404)[0]
    assert {n.metadata.name for n in core.list_node().items} == {'cp-1', 'worker-1'}


def test_talos_manifests_coredns_kube_proxy_and_inline(tmp_path):
    """What Talos' manifest controller applies: CoreDNS, kube-proxy unless disabled, inline manifests (a CR waits for its CRD)."""
    from lab.k8s.manifests import ManifestApplier, talos_documents  # pylint: disable=import-outside-toplevel
    from lab.k8s.testing import ClusterThread  # pylint: disable=import-outside-toplevel

    class Config:  # the two values of a parsed machine config the applier reads
        cluster = {'proxy': {'disabled': True}, 'inlineManifests': [
            {'name': 'widget', 'contents': 'apiVersion: lab.example.com/v1\nkind: Widget\nmetadata: {name: w1, namespace: default}\n'
                                           'spec: {size: 3}\n'},
            {'name': 'crd', 'contents': 'apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n'
                                        'metadata: {name: widgets.lab.example.com}\nspec:\n  group: lab.example.com\n'
                                        '  scope: Namespaced\n  names: {plural: widgets, singular: widget, kind: Widget}\n'
                                        '  versions:\n  - name: v1\n    served: true\n    storage: true\n'
                                        '    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}\n'}]}

    with ClusterThread(workdir=str(tmp_path)) as api:
        store = api.cluster.store

        def apply():
            applier = ManifestApplier(store)
            waiting = applier.apply(talos_documents(Config))
            applier.retry()
            return waiting, [d['kind'] for d in applier.waiting]
        waiting, still = api.call(apply)
        assert waiting == 1 and still == []
        assert api.call(store.peek, ('apps', 'deployments'), 'kube-system', 'coredns') is not None
        assert api.call(store.peek, ('apps', 'daemonsets'), 'kube-system', 'kube-proxy') is None
        widget = api.call(store.peek, ('lab.example.com', 'widgets'), 'default', 'w1')
        assert widget['spec'] == {'size': 3} and widget['metadata']['managedFields'][0]['manager'] == 'talos'


def _boot_count(running, hostname):
    return next(node['boot_count'] for node in running.call(running.world.status())['talos']['nodes']
                if node['hostname'] == hostname)


def _static_pod_images(core, node):
    return dict((pod.metadata.labels['k8s-app'], pod.spec.containers[0].image)
                for pod in core.list_namespaced_pod('kube-system', label_selector='tier=control-plane').items
                if pod.spec.node_name == node)


def _worker_kubelet_to_v1_36_4(running, core, kept, worker_address):
    """Apply worker-1 a config naming kubelet v1.36.4 (kept: _cluster_up's secrets and endpoint): Talos applies it
    without a reboot and restarts kubelet alone, whose Node then reports v1.36.4. Returns the talosconfig credentials."""
    secrets, endpoint = kept['secrets'], kept['endpoint']
    credentials = talos_client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab'))
    kubelet = {'image': 'ghcr.io/siderolabs/kubelet:v1.36.4', 'defaultRuntimeSeccompProfileEnabled': True,
               'disableManifestsDirectory': True}
    boots = _boot_count(running, 'worker-1')
    with talos_client.TalosClient(worker_address, credentials=credentials, timeout=5) as talos:
        reply = talos.apply_configuration(testing.render_config(secrets, 'worker', endpoint, hostname='worker-1',
                                                                extra_machine={'kubelet': kubelet}))
    assert 'without a reboot' in str(reply), reply
    wait_until(lambda: (core.read_node('worker-1').status.node_info.kubelet_version == 'v1.36.4',
                        core.read_node('worker-1').status.node_info.kubelet_version), "the worker's kubelet on v1.36.4")
    assert _boot_count(running, 'worker-1') == boots   # no reboot: kubelet alone restarted
    return credentials


def _api_server_image_to_v1_36_4(running, core, kept, cp_address, credentials, old):
    """Apply cp-1 a config naming kube-apiserver v1.36.4 (old: the mirror pods' images before): its mirror pod
    kube-apiserver-cp-1 takes the new image, the others keep theirs."""
    new_api = {'image': 'registry.k8s.io/kube-apiserver:v1.36.4', 'certSANs': []}
    with talos_client.TalosClient(cp_address, credentials=credentials, timeout=5) as talos:
        talos.apply_configuration(testing.render_config(kept['secrets'], 'controlplane', kept['endpoint'], hostname='cp-1',
                                                        extra_cluster={'apiServer': new_api}, vip=running.world.net.endpoint_host))
    wait_until(lambda: (_static_pod_images(core, 'cp-1') == dict(old, **{'kube-apiserver': new_api['image']}),
                        _static_pod_images(core, 'cp-1')), 'kube-apiserver-cp-1 on the new image')


def test_a_config_applied_live_moves_the_kubelet_and_the_static_pods_to_its_images(running, tmp_path):
    """The kubelet reports the version of machine.kubelet.image and restarts when a config applied without a reboot
    changes it; a control plane's kube-apiserver, kube-controller-manager and kube-scheduler are mirror pods with the
    images of its config, replaced when the config names another image, while the API keeps answering."""
    world = running.world
    api = ProxmoxAPI(world.net.pve_host, user='proxtalos@pve', token_name='proxtalos', token_value=world.token_secret, verify_ssl=world.ca_path)
    kept = {}
    core, _cp_vm, cp_address, worker_address = _cluster_up(running, api, tmp_path, keep=kept)
    assert core.read_node('worker-1').status.node_info.kubelet_version == 'v1.36.3'
    old = {'kube-apiserver': 'registry.k8s.io/kube-apiserver:v1.36.3',
           'kube-controller-manager': 'registry.k8s.io/kube-controller-manager:v1.36.3',
           'kube-scheduler': 'registry.k8s.io/kube-scheduler:v1.36.3'}
    wait_until(lambda: (_static_pod_images(core, 'cp-1') == old, _static_pod_images(core, 'cp-1')), 'the mirror pods of cp-1')
    mirror = core.read_namespaced_pod('kube-apiserver-cp-1', 'kube-system')
    assert 'kubernetes.io/config.mirror' in mirror.metadata.annotations and mirror.spec.host_network

    credentials = _worker_kubelet_to_v1_36_4(running, core, kept, worker_address)
    _api_server_image_to_v1_36_4(running, core, kept, cp_address, credentials, old)
    assert core.read_node('cp-1').status.node_info.kubelet_version == 'v1.36.3'
    assert _port_open(cp_address, 6443)


def test_talos_manifests_follow_the_config_images_and_are_created_never_updated(tmp_path):
    """kube-proxy's image is the config's cluster.proxy.image (Talos' control_plane.go:346-347); an existing object is
    left as it is when a later config names another image (manifest_apply.go:335-346), annotated with Talos'
    inventory when created (353-368)."""
    from lab.k8s.manifests import ManifestApplier, talos_documents  # pylint: disable=import-outside-toplevel
    from lab.k8s.testing import ClusterThread  # pylint: disable=import-outside-toplevel

    class Old:
        cluster = {'proxy': {'image': 'registry.k8s.io/kube-proxy:v1.35.4'}}

    class New:
        cluster = {'proxy': {'image': 'registry.k8s.io/kube-proxy:v1.36.3'}}

    with ClusterThread(workdir=str(tmp_path)) as api:
        store = api.cluster.store

        def image():
            proxy = store.peek(('apps', 'daemonsets'), 'kube-system', 'kube-proxy')
            return proxy['spec']['template']['spec']['containers'][0]['image'], proxy['metadata'].get('annotations')
        api.call(lambda: ManifestApplier(store).apply(talos_documents(Old)))
        assert api.call(image) == ('registry.k8s.io/kube-proxy:v1.35.4',
                                   {'config.k8s.io/owning-inventory': 'talos-bootstrap-manifests-inventory'})
        api.call(lambda: ManifestApplier(store).apply(talos_documents(New)))
        assert api.call(image)[0] == 'registry.k8s.io/kube-proxy:v1.35.4'
