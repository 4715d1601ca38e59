"""The Talos simulation inside the World: VMs created and powered through the PVE API get a Talos
node on their address; status, faults, request log and power events behave as the lab contract says."""
import functools

import pytest
from proxmoxer.tools import Tasks

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client, errors
from ansible_collections.proxtalos.cluster.tests import helpers
from lab.testing import free_net, world_in_thread
from lab.talos import testing


@pytest.fixture
def running(tmp_path):
    with world_in_thread(tmp_path / 'run', free_net(), extensions=('lab.talos',), profile='instant') as world:
        yield world


def pve(running):
    from proxmoxer import ProxmoxAPI
    world = running.world
    return ProxmoxAPI(world.net.pve_host, user='proxtalos@pve', token_name='proxtalos', token_value=world.token_secret,
                      verify_ssl=world.ca_path)


def ok(api, upid):
    status = Tasks.blocking_status(api, upid, timeout=10, polling_interval=0.01)
    assert status['exitstatus'] == 'OK', status
    return status


def create_vm(running, vmid, index):
    api = pve(running)
    net = running.world.net
    address = net.static_host(index)
    ok(api, api.nodes('pve1').qemu.post(vmid=vmid, name='talos-%d' % vmid, net0='virtio,bridge=vmbr0', agent=1,
                                        scsi0='local-lvm:32', ide0='local-lvm:cloudinit', ipconfig0='ip=%s/24,gw=%s' % (address, net.gateway)))
    return api.nodes('pve1').qemu(vmid), address


wait_until = functools.partial(helpers.wait_until, timeout=20, interval=0.02)


def probe(address):
    def check():
        try:
            return True, client.probe_maintenance(address, timeout=2)
        except errors.TalosTransientError as exc:
            return False, str(exc)
    return check


def test_vm_power_events_drive_the_talos_node(running):
    qemu, address = create_vm(running, 301, 1)
    api = pve(running)
    with pytest.raises(errors.TalosTransientError):
        client.probe_maintenance(address, timeout=1)  # created, not started: no Talos API
    ok(api, qemu.status.start.post())
    assert wait_until(probe(address), 'maintenance mode after start') is True

    secrets = testing.ClusterSecrets()
    config = testing.render_config(secrets, 'controlplane', 'https://%s:6443' % running.world.net.endpoint_host)
    with client.TalosClient(address, insecure=True, timeout=5) as talos:
        talos.apply_configuration(config)
    credentials = client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab'))

    def mtls():
        try:
            with client.TalosClient(address, credentials=credentials, timeout=2) as talos:
                return True, talos.version()['tag']
        except (errors.TalosTransientError, errors.TalosTlsError) as exc:
            return False, str(exc)
    assert wait_until(mtls, 'mTLS after install') == 'v1.13.9'

    status = running.call(running.world.status())
    node = next(item for item in status['talos']['nodes'] if item['address'] == address)
    assert node['name'] == 'talos-301' and node['mode'] == 'configured' and node['machine_type'] == 'controlplane'
    assert any(e['name'] == 'talos:talos-301' and e['port'] == 50000 for e in status['lab']['endpoints'])
    logged = running.call(running.world.control({'op': 'requests', 'source': 'talos'}))
    assert any(r['path'] == '/machine.MachineService/ApplyConfiguration' for r in logged)

    # a stop is a power cut; the disk keeps the config: the node comes back configured
    ok(api, qemu.status.stop.post())
    running.call(running.world.drain_events())
    with pytest.raises(errors.TalosTransientError):
        client.probe_maintenance(address, timeout=1)
    ok(api, qemu.status.start.post())
    assert wait_until(mtls, 'configured again after a power cycle') == 'v1.13.9'

    # deleting the VM loses the disk: a new VM on that address boots into maintenance
    ok(api, qemu.status.stop.post())
    ok(api, qemu.delete())
    running.call(running.world.drain_events())
    qemu, address = create_vm(running, 302, 1)
    ok(api, qemu.status.start.post())
    assert wait_until(probe(address), 'a fresh VM is in maintenance mode') is True


def test_faults_are_registered_and_target_nodes_by_name(running):
    names = [fault['name'] for fault in running.call(running.world.control({'op': 'faults'}))]
    for name in ('talos-unreachable', 'talos-apply-reject', 'talos-reboot-hang', 'talos-kubelet-volume', 'talos-etcd-unhealthy'):
        assert name in names
    qemu, address = create_vm(running, 311, 2)
    ok(pve(running), qemu.status.start.post())
    wait_until(probe(address), 'maintenance')
    running.call(running.world.control({'op': 'fault', 'name': 'talos-unreachable', 'target': 'talos-311'}))
    with pytest.raises(errors.TalosTransientError) as info:
        client.probe_maintenance(address, timeout=0.5)
    assert info.value.code == 'DEADLINE_EXCEEDED'
    running.call(running.world.control({'op': 'clear', 'name': 'talos-unreachable', 'target': 'talos-311'}))
    assert wait_until(probe(address), 'answers again') is True
    with pytest.raises(Exception) as info:
        running.call(running.world.control({'op': 'fault', 'name': 'talos-reboot-hang', 'target': 'no-such-vm'}))
    assert 'no Talos node' in str(info.value)


def test_pve_reset_clears_the_kubelet_volume_fault(running):
    secrets = testing.ClusterSecrets()
    endpoint = 'https://%s:6443' % running.world.net.endpoint_host
    api = pve(running)
    cp, cp_address = create_vm(running, 321, 3)
    worker, worker_address = create_vm(running, 322, 4)
    for qemu in (cp, worker):
        ok(api, qemu.status.start.post())
    for address, kind in ((cp_address, 'controlplane'), (worker_address, 'worker')):
        wait_until(probe(address), 'maintenance')
        if kind == 'worker':
            running.call(running.world.control({'op': 'fault', 'name': 'talos-kubelet-volume', 'target': 'talos-322',
                                                'params': {'p': 0}}))
        with client.TalosClient(address, insecure=True, timeout=5) as talos:
            talos.apply_configuration(testing.render_config(secrets, kind, endpoint))
    credentials = client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab'))

    def kubelet():
        try:
            with client.TalosClient(worker_address, credentials=credentials, timeout=2) as talos:
                item = dict((s['id'], s) for s in talos.service_list())['kubelet']
        except (errors.TalosTransientError, errors.TalosTlsError) as exc:
            return None, str(exc)
        return item['state'], item['events'][-1]['msg']

    wait_until(lambda: (kubelet()[0] == 'Waiting' and 'volume' in kubelet()[1], kubelet()), 'kubelet stuck on its volume')
    with pytest.raises(Exception) as info:   # a configured worker runs no etcd: nothing to fault
        running.call(running.world.control({'op': 'fault', 'name': 'talos-etcd-unhealthy', 'target': 'talos-322'}))
    assert 'configured as a worker, which runs no etcd' in str(info.value)
    ok(api, worker.status.reset.post())
    wait_until(lambda: (kubelet()[0] == 'Running', kubelet()), 'kubelet running after the PVE reset')
    faults = running.call(running.world.control({'op': 'faults'}))
    assert not next(f for f in faults if f['name'] == 'talos-kubelet-volume')['active']


def test_etcd_unhealthy_fault_shows_in_service_list_across_a_power_cycle_until_cleared(running):
    secrets = testing.ClusterSecrets()
    api = pve(running)
    qemu, address = create_vm(running, 331, 5)
    ok(api, qemu.status.start.post())
    wait_until(probe(address), 'maintenance')
    # in maintenance mode the node has no config yet: the fault is armed for when it becomes a control plane
    record = running.call(running.world.control({'op': 'fault', 'name': 'talos-etcd-unhealthy', 'target': 'talos-331'}))
    assert 'if it is configured as a control plane' in record['detail']
    with client.TalosClient(address, insecure=True, timeout=5) as talos:
        talos.apply_configuration(testing.render_config(secrets, 'controlplane', 'https://%s:6443' % running.world.net.endpoint_host))
    credentials = client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab'))

    def etcd():
        try:
            with client.TalosClient(address, credentials=credentials, timeout=2) as talos:
                item = dict((s['id'], s) for s in talos.service_list()).get('etcd')
        except (errors.TalosTransientError, errors.TalosTlsError) as exc:
            return None, str(exc)
        return item and (item['state'], item['health']['healthy'], item['health']['last_message']), item

    def bootstrap():
        try:
            with client.TalosClient(address, credentials=credentials, timeout=2) as talos:
                talos.bootstrap()
        except (errors.TalosTransientError, errors.TalosTlsError) as exc:
            return False, str(exc)
        return True, 'bootstrapped'
    wait_until(bootstrap, 'the bootstrap call accepted')
    wait_until(lambda: (etcd()[0] == ('Running', False, 'context deadline exceeded'), etcd()), 'etcd running, unhealthy as armed')
    running.call(running.world.control({'op': 'clear', 'name': 'talos-etcd-unhealthy', 'target': 'talos-331'}))
    wait_until(lambda: (etcd()[0] == ('Running', True, ''), etcd()), 'etcd running and healthy')

    record = running.call(running.world.control({'op': 'fault', 'name': 'talos-etcd-unhealthy', 'target': 'talos-331',
                                                 'params': {'message': 'etcdserver: request timed out'}}))
    assert 'unhealthy' in record['detail']
    assert etcd()[0] == ('Running', False, 'etcdserver: request timed out')
    # a power cycle does not heal it (the cause is outside the service), only clearing the fault does
    ok(api, qemu.status.stop.post())
    ok(api, qemu.status.start.post())
    wait_until(lambda: (etcd()[0] == ('Running', False, 'etcdserver: request timed out'), etcd()), 'etcd running, still unhealthy')
    running.call(running.world.control({'op': 'clear', 'name': 'talos-etcd-unhealthy', 'target': 'talos-331'}))
    wait_until(lambda: (etcd()[0] == ('Running', True, ''), etcd()), 'etcd healthy again')
