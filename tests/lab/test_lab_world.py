"""The World in-process: power events reach listeners in order; extensions plug in; status and faults."""
import asyncio
import sys
import types

import pytest
from proxmoxer.tools import Tasks

from lab.faults import Param
from lab.testing import free_net, world_in_thread


class RecordingListener(object):
    """Records every hook call, in order."""

    def __init__(self):
        self.calls = []

    async def on_vm_started(self, vm, address):
        self.calls.append(('started', vm.vmid, address))

    async def on_vm_stopped(self, vm):
        self.calls.append(('stopped', vm.vmid))

    async def on_vm_reset(self, vm, address):
        self.calls.append(('reset', vm.vmid, address))

    async def on_vm_deleted(self, vm):
        self.calls.append(('deleted', vm.vmid))

    async def on_lab_reset(self):
        self.calls.append(('lab_reset',))


def proxmox_of(running):
    from proxmoxer import ProxmoxAPI
    world = running.world
    return ProxmoxAPI(world.net.pve_host, user='proxtalos@pve', token_name='proxtalos', token_value=world.token_secret,
                      verify_ssl=world.ca_path)


def ok(api, upid):
    status = Tasks.blocking_status(api, upid, timeout=10, polling_interval=0.01)
    assert status['exitstatus'] == 'OK', status
    return status


@pytest.fixture
def running(tmp_path):
    with world_in_thread(tmp_path / 'run', free_net()) as world:
        yield world


def test_listener_sees_start_stop_reset_reboot_delete_in_order(running):
    listener = RecordingListener()
    running.call(lambda: running.world.add_listener(listener))
    api = proxmox_of(running)
    node = api.nodes('pve1')
    net = running.world.net
    ok(api, node.qemu.post(vmid=1011, name='cp', net0='virtio,bridge=vmbr0', agent=1, ide0='local-lvm:cloudinit',
                           ipconfig0='ip=%s/24,gw=%s' % (net.static_host(1), net.gateway)))
    qemu = node.qemu(1011)
    for action in ('start', 'reset', 'reboot', 'stop'):
        ok(api, getattr(qemu.status, action).post())
    ok(api, qemu.delete())
    running.call(running.world.drain_events())
    cp = net.static_host(1)
    assert listener.calls == [('started', 1011, cp), ('reset', 1011, cp), ('stopped', 1011), ('started', 1011, cp),
                              ('stopped', 1011), ('deleted', 1011)]
    events = [(e['event'], e['vmid']) for e in running.call(running.world.control({'op': 'events'}))]
    assert events == [(c[0], c[1]) for c in listener.calls]


def test_hooks_of_one_vm_do_not_hold_up_another(running):
    """VM 101's start hook waits until VM 102's start arrives: a single global queue would never get there."""
    second_started = asyncio.Event()
    seen = []

    class Waiting(object):
        async def on_vm_started(self, vm, address):
            if vm.vmid == 101:
                await asyncio.wait_for(second_started.wait(), 10)
            else:
                second_started.set()
            seen.append(vm.vmid)

    running.call(lambda: running.world.add_listener(Waiting()))
    api = proxmox_of(running)
    for vmid in (101, 102):
        ok(api, api.nodes('pve1').qemu.post(vmid=vmid, name='vm%d' % vmid, net0='virtio,bridge=vmbr0'))
        ok(api, api.nodes('pve1').qemu(vmid).status.start.post())
    running.call(running.world.drain_events())
    assert seen == [102, 101]


def test_a_failing_listener_does_not_stop_the_others(running):
    class Broken(object):
        async def on_vm_started(self, vm, address):
            raise RuntimeError('listener bug')
    listener = RecordingListener()
    running.call(lambda: running.world.add_listener(Broken()))
    running.call(lambda: running.world.add_listener(listener))
    api = proxmox_of(running)
    ok(api, api.nodes('pve1').qemu.post(vmid=200, name='vm', net0='virtio,bridge=vmbr0', start=1))
    running.call(running.world.drain_events())
    assert listener.calls == [('started', 200, running.world.net.host(100))]


def test_reset_deletes_vms_clears_faults_and_tells_listeners(running):
    listener = RecordingListener()
    world = running.world
    running.call(lambda: world.add_listener(listener))
    api = proxmox_of(running)
    ok(api, api.nodes('pve1').qemu.post(vmid=300, name='vm', net0='virtio,bridge=vmbr0', start=1))
    running.call(world.control({'op': 'fault', 'name': 'pve-node-offline'}))
    result = running.call(world.control({'op': 'reset'}))
    assert result['vms_removed'] == [300]
    assert [f['name'] for f in result['faults_cleared']] == ['pve-node-offline']
    assert listener.calls[-3:] == [('stopped', 300), ('deleted', 300), ('lab_reset',)]
    assert api.nodes('pve1').qemu.get() == []
    assert world.pve.nodes['pve1']['online'] is True


def test_extension_installs_status_section_fault_and_delay_kind(tmp_path):
    module = types.ModuleType('lab_test_extension')
    state = {'broken': set()}

    def install(world):
        world.timing.register('widget_warmup', 5, 'a widget warming up')
        world.add_status_section('widgets', lambda: [{'name': 'w1', 'broken': 'w1' in state['broken']}])
        world.faults.register('widget-broken', 'a widget breaks', 'widget',
                              apply=lambda target, loud=False: state['broken'].add(target),
                              clear=state['broken'].discard,
                              params=[Param('loud', bool, False, 'make noise')])
    module.install = install
    sys.modules[module.__name__] = module
    try:
        with world_in_thread(tmp_path / 'run', free_net(), extensions=(module.__name__,)) as running:
            world = running.world
            assert world.extensions == [module.__name__]
            running.call(world.control({'op': 'fault', 'name': 'widget-broken', 'target': 'w1', 'params': {'loud': 'on'}}))
            status = running.call(world.status())
            assert status['widgets'] == [{'name': 'w1', 'broken': True}]
            assert status['lab']['faults'][0]['params'] == {'loud': True}
            running.call(world.control({'op': 'clear', 'name': 'widget-broken'}))
            assert running.call(world.status())['widgets'] == [{'name': 'w1', 'broken': False}]
            record = running.call(world.timing.sleep('widget_warmup', 'w1'))
            assert running.call(world.control({'op': 'delays', 'kind': 'widget_warmup'})) == [record]
    finally:
        del sys.modules[module.__name__]


def test_missing_extension_is_skipped_but_a_broken_one_stops_the_start(tmp_path):
    with world_in_thread(tmp_path / 'a', free_net(), extensions=('lab.no_such_simulation',)) as running:
        assert running.world.extensions == []
    module = types.ModuleType('lab_test_broken_extension')

    def install(world):
        raise RuntimeError('extension bug')
    module.install = install
    sys.modules[module.__name__] = module
    try:
        with pytest.raises(RuntimeError, match='extension bug'):
            with world_in_thread(tmp_path / 'b', free_net(), extensions=(module.__name__,)):
                pass
    finally:
        del sys.modules[module.__name__]


def test_several_pve_nodes_each_with_a_bridge(tmp_path):
    with world_in_thread(tmp_path / 'run', free_net(), pve_nodes=('pve1', 'pve2')) as running:
        api = proxmox_of(running)
        net = running.world.net
        assert [n['node'] for n in api.nodes.get()] == ['pve1', 'pve2']
        assert [b['cidr'] for b in api.nodes('pve2').network.get(type='any_bridge')] == [net.host(3) + '/24']
        ok(api, api.nodes('pve2').qemu.post(vmid=1021, name='w', net0='virtio,bridge=vmbr0', agent=1, start=1))
        rows = running.call(running.world.vm_rows)
        assert [(r['vmid'], r['node'], r['address']) for r in rows] == [(1021, 'pve2', net.host(100))]


def test_a_new_mac_frees_the_old_lease(running):
    api = proxmox_of(running)
    net = running.world.net
    qemu = api.nodes('pve1').qemu
    ok(api, qemu.post(vmid=1021, name='w', net0='virtio=BC:24:11:00:00:01,bridge=vmbr0', start=1))
    ok(api, qemu(1021).status.stop.post())
    qemu(1021).config.put(net0='virtio=BC:24:11:00:00:02,bridge=vmbr0')
    ok(api, qemu(1021).status.start.post())
    ok(api, qemu.post(vmid=1022, name='x', net0='virtio=BC:24:11:00:00:03,bridge=vmbr0', start=1))
    rows = running.call(running.world.vm_rows)
    assert [(r['vmid'], r['mac'], r['address']) for r in rows] == [
        (1021, 'bc:24:11:00:00:02', net.host(100)), (1022, 'bc:24:11:00:00:03', net.host(101))]
