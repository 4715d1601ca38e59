"""The proof behind the choice of grpclib: a grpcio client fails against the lab's maintenance-mode
node exactly as it fails against real Talos (no Ed25519 in grpcio's TLS), while grpclib succeeds.

Real Talos in maintenance mode presents a self-signed Ed25519 certificate; grpcio's ClientHello
offers no Ed25519 signature algorithm (grpc/grpc#24252), so the handshake cannot complete. The
lab's node is served by grpclib over Python's ssl with the same kind of certificate. As a control,
the same grpcio client talks fine to a lab node whose certificates are ECDSA: the key type is
the whole difference.
"""
import grpc
import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import api, client
from lab.talos import pki, testing

ENDPOINT = 'https://127.0.0.10:6443'


@pytest.fixture(scope='module')
def lab():
    harness = testing.FleetHarness()
    yield harness
    harness.close()


def grpcio_version(address, root_pem, client_pair=None, timeout=5):
    """Version through grpcio, trusting root_pem (and presenting client_pair=(crt, key) if given)."""
    kwargs = {'root_certificates': root_pem}
    if client_pair is not None:
        kwargs['certificate_chain'], kwargs['private_key'] = client_pair
    credentials = grpc.ssl_channel_credentials(**kwargs)
    with grpc.secure_channel('%s:50000' % address, credentials) as channel:
        call = channel.unary_unary(api.MachineService.Version.path,
                                   request_serializer=api.protobuf.Empty.SerializeToString,
                                   response_deserializer=api.machine.VersionResponse.FromString)
        return call(api.protobuf.Empty(), timeout=timeout)


def test_grpcio_cannot_handshake_with_a_maintenance_node_but_grpclib_can(lab):
    node = lab.start('proof-maintenance')
    lab.wait(lambda: node.mode == 'maintenance', what='maintenance mode')
    maintenance_ca = pki.cert_pem(lab.call(lambda: node.identity.ca_cert))
    assert lab.call(lambda: node.identity.cert.signature_algorithm_oid._name) == 'ed25519'

    with pytest.raises(grpc.RpcError) as info:
        grpcio_version(node.address, maintenance_ca)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert 'handshake' in info.value.details().lower()
    # the node saw a connection that never finished its handshake, and answered no RPC
    assert not [r for r in lab.fleet.requests if r['node'] == node.name]

    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        assert talos.version()['tag'] == 'v1.13.9'


def test_grpcio_works_when_the_certificates_are_ecdsa(lab):
    secrets = testing.ClusterSecrets(os_key_type='ecdsa')
    node = lab.start('proof-ecdsa')
    lab.wait(lambda: node.mode == 'maintenance', what='maintenance mode')
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        talos.apply_configuration(testing.render_config(secrets, 'controlplane', ENDPOINT))
    lab.wait(lambda: node.mode == 'configured', what='configured with an ECDSA OS CA')
    crt, key = secrets.admin_client()
    reply = grpcio_version(node.address, secrets.os_crt_pem, (crt, key))
    assert reply.messages[0].version.tag == 'v1.13.9'
