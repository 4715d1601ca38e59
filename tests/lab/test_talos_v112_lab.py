"""A lab node booted from a Talos v1.12 ISO behaves as v1.12.11 does where the two release lines differ (audit
findings 3, 8 and 14; lab/talos/versions.py, node.py _apply_in_v112_maintenance, apid.py V112_MAINTENANCE_METHODS).

v1.12's maintenance mode is a separate server: no ServiceList or Hostname, Version only for os:admin, apply modes TRY,
REBOOT and AUTO with a bare reply, and after an apply the port closes until the node has installed and rebooted (no
mTLS window as on v1.13). The node then runs the Talos of its config's installer image.
"""
import ssl

import pytest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Cardinality, Status

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client, errors
from ansible_collections.proxtalos.cluster.plugins.modules import talos_info
from ansible_collections.proxtalos.cluster.tests.helpers import run_module
from lab.talos import proto, testing, versions
from talos_lab_nodes import ENDPOINT

V112 = 'v1.12.11'


@pytest.fixture()
def lab():
    harness = testing.FleetHarness(profile='realistic', scale=0.05)
    yield harness
    harness.close()


class MaintenanceCall(object):
    """Raw unary calls with grpclib, as talosctl --insecure dials maintenance mode: TLS, no client certificate, no CA
    check (grpcio cannot take the node's Ed25519 certificate: test_talos_grpcio)."""

    def __init__(self, harness, address):
        self.harness = harness
        self.address = address

    def __call__(self, method, request, reply):
        return self.harness.loop.run(self._unary(method, request, reply))

    async def _unary(self, method, request, reply):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.set_alpn_protocols(['h2'])
        channel = Channel(self.address, 50000, ssl=context)
        try:
            async with channel.request('/machine.MachineService/%s' % method, Cardinality.UNARY_UNARY,
                                       type(request), reply, timeout=5) as stream:
                await stream.send_message(request, end=True)
                answer = await stream.recv_message()
                await stream.recv_trailing_metadata()
                return answer
        finally:
            channel.close()


def test_versions_from_what_the_node_boots():
    assert versions.from_image_url('https://factory.talos.dev/image/ce4c98/v1.12.11/nocloud-amd64.iso') == V112
    assert versions.from_image_url('https://example.org/talos.iso') is None
    assert versions.from_installer_image('factory.talos.dev/installer/ce4c98:v1.12.11') == V112
    assert versions.from_installer_image('ghcr.io/siderolabs/installer:v1.13.9@sha256:' + '0' * 64) == 'v1.13.9'
    assert versions.from_installer_image('registry:5000/installer') is None
    assert versions.line('v1.12.3') == 'v1.12' and versions.line('v1.13.9') == 'v1.13' and versions.line('') == 'v1.13'


def test_v112_maintenance_server(lab):
    node = lab.start('v112-a', media_version=V112)
    lab.wait(lambda: node.mode == 'maintenance', what='v112-a in maintenance mode')
    empty = proto.protobuf.Empty()
    call = MaintenanceCall(lab, node.address)
    with pytest.raises(GRPCError) as raised:
        call('ServiceList', empty, proto.machine.ServiceListResponse)
    assert (raised.value.status, raised.value.message) == (Status.UNIMPLEMENTED, 'method ServiceList not implemented')
    with pytest.raises(GRPCError) as raised:
        call('Version', empty, proto.machine.VersionResponse)
    assert (raised.value.status, raised.value.message) == (
        Status.UNIMPLEMENTED, 'API is not implemented in maintenance mode')

    secrets = testing.ClusterSecrets(os_key_type='ecdsa')
    config = testing.render_config(secrets, 'controlplane', ENDPOINT)
    request = proto.machine.ApplyConfigurationRequest
    response = proto.machine.ApplyConfigurationResponse
    with pytest.raises(GRPCError) as raised:
        call('ApplyConfiguration', request(data=config, mode=request.Mode.Value('NO_REBOOT')), response)
    assert (raised.value.status, raised.value.message) == (
        Status.UNIMPLEMENTED, "apply configuration --mode='no-reboot' is not supported in maintenance mode")
    with pytest.raises(GRPCError) as raised:
        call('ApplyConfiguration', request(data=b'machine: [', mode=request.Mode.Value('AUTO')), response)
    assert raised.value.status == Status.UNKNOWN and raised.value.message.startswith('failed to parse config: ')
    dry = call('ApplyConfiguration', request(data=config, mode=request.Mode.Value('AUTO'), dry_run=True),
               response).messages[0]
    assert dry.mode_details == 'Dry run summary:\nNode is running in maintenance mode and does not have a config yet.'
    applied = call('ApplyConfiguration', request(data=config, mode=request.Mode.Value('AUTO')), response).messages[0]
    assert applied.mode == request.Mode.Value('REBOOT') and applied.mode_details == ''

    # no API from the reply on until the node installed and rebooted (v1.13 answers over mTLS in between)
    lab.wait(lambda: node.phase == 'installing', what='v112-a installing')
    assert not node.api_up
    lab.wait(lambda: node.mode == 'configured', timeout=30, what='v112-a configured')
    assert node.boot_count == 2
    # the installer image of the config decides what runs now: v1.13.9 (testing.render_config)
    credentials = client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab'))
    with client.TalosClient(node.address, credentials=credentials, timeout=5) as talos:
        assert talos.version()['tag'] == 'v1.13.9'


def test_v112_installed_node_and_its_bootstrap_refusal_on_a_worker(lab):
    secrets = testing.ClusterSecrets(os_key_type='ecdsa')
    extra = {'install': {'disk': '/dev/sda', 'image': 'factory.talos.dev/installer/ce4c98:' + V112, 'wipe': False}}
    control_plane = lab.start('v112-cp', media_version=V112)
    worker = lab.start('v112-w', media_version=V112)
    lab.wait(lambda: control_plane.mode == 'maintenance' and worker.mode == 'maintenance', what='maintenance mode')
    for node, machine_type in ((control_plane, 'controlplane'), (worker, 'worker')):
        with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
            talos.apply_configuration(testing.render_config(secrets, machine_type, ENDPOINT, extra_machine=extra))
    lab.wait(lambda: control_plane.mode == 'configured' and worker.mode == 'configured', timeout=30,
             what='both configured')
    credentials = client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab'))
    with client.TalosClient(worker.address, credentials=credentials, timeout=5) as talos:
        assert talos.version()['tag'] == V112
        with pytest.raises(errors.TalosApiError) as raised:
            talos.bootstrap()
    assert raised.value.code == 'FAILED_PRECONDITION'
    assert 'bootstrap can only be performed on a control plane node' in str(raised.value)


def test_talos_info_reads_a_v112_maintenance_node(lab, capsys):
    # audit finding 8: the report's default gather reads services and version; on v1.12 maintenance mode both are
    # Unimplemented, which talos_info must take as "not served here", not as a failure.
    node = lab.start('v112-info', media_version=V112)
    lab.wait(lambda: node.mode == 'maintenance', what='v112-info in maintenance mode')
    result, dummy = run_module(talos_info, capsys, nodes=[{'name': 'v112-info', 'address': node.address}],
                               gather=['services', 'version'], wait_timeout=10, wait_sleep=0.05)
    assert 'failed' not in result, result.get('msg')
    assert result['nodes']['v112-info']['mode'] == 'maintenance'
    assert [r['method'].rsplit('/', 1)[1] + ':' + r['code'] for r in lab.fleet.requests
            if r['node'] == 'v112-info' and r['code'] != 'OK'] == ['ServiceList:UNIMPLEMENTED', 'Version:UNIMPLEMENTED']
