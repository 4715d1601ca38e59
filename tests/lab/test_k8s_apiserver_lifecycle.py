"""The lab's API server under concurrent lifecycle calls, as VM events and a lab reset make them:
control planes joining and leaving at once, and a stop racing with them. A stopped server must
not listen again (the port is free for the cluster built next)."""

import asyncio
import socket

from lab import pki
from lab.k8s.cluster import KubeCluster
from lab.testing import free_net


def _port_open(host, port):
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def test_concurrent_host_changes_and_stop_leave_the_port_free(tmp_path):
    net = free_net()
    endpoint, cps = '%s.10' % net, ['%s.%d' % (net, 11 + index) for index in range(3)]

    async def scenario():
        ca_pem, ca_key_pem = pki.make_ca()
        cluster = KubeCluster(ca_pem, ca_key_pem, state_dir=str(tmp_path / 'pki'))
        server = await cluster.start_api([endpoint], 6443)
        # three control planes' kubelets come up at once: each adds its address (a restart each)
        await asyncio.gather(*(cluster.add_api_host(cp) for cp in cps))
        assert sorted(server.hosts) == sorted([endpoint] + cps) and server.running
        listening = [_port_open(host, 6443) for host in [endpoint] + cps]
        # a lab reset: the VMs go (hosts removed) while the cluster is closed
        results = await asyncio.gather(*(cluster.remove_api_host(cp) for cp in cps), cluster.stop(), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        open_after = [host for host in [endpoint] + cps if _port_open(host, 6443)]
        # the next cluster on the same addresses binds fine
        ca2, key2 = pki.make_ca()
        rebuilt = KubeCluster(ca2, key2, state_dir=str(tmp_path / 'pki2'))
        await rebuilt.start_api([endpoint], 6443)
        rebuilt_open = _port_open(endpoint, 6443)
        await rebuilt.stop()
        return listening, errors, open_after, rebuilt_open

    listening, errors, open_after, rebuilt_open = asyncio.run(scenario())
    assert listening == [True] * 4
    assert errors == []
    assert open_after == []
    assert rebuilt_open


def test_a_control_plane_joining_leaves_the_served_addresses_and_their_connections_alone(tmp_path):
    """kube-apiserver on the first control plane (and the cluster endpoint in front of it) keeps serving while another
    control plane joins: a connection open before the join still answers after it, and the new address serves with a
    certificate that names it."""
    import http.client   # pylint: disable=import-outside-toplevel
    import ssl   # pylint: disable=import-outside-toplevel

    net = free_net()
    endpoint, joining = '%s.10' % net, '%s.12' % net

    def client_context(ca_pem):
        context = ssl.create_default_context(cadata=ca_pem if isinstance(ca_pem, str) else ca_pem.decode())
        return context

    def version(connection):
        connection.request('GET', '/version')
        response = connection.getresponse()
        response.read()
        return response.status

    async def scenario():
        ca_pem, ca_key_pem = pki.make_ca()
        cluster = KubeCluster(ca_pem, ca_key_pem, state_dir=str(tmp_path / 'pki'))
        await cluster.start_api([endpoint], 6443)
        before = http.client.HTTPSConnection(endpoint, 6443, context=client_context(ca_pem), timeout=5)
        first = await asyncio.to_thread(version, before)
        sock = before.sock
        await cluster.add_api_host(joining)
        again = await asyncio.to_thread(version, before)   # same connection: http.client does not reconnect
        same_socket = before.sock is sock
        joined = http.client.HTTPSConnection(joining, 6443, context=client_context(ca_pem), timeout=5)
        new_address = await asyncio.to_thread(version, joined)
        before.close()
        joined.close()
        await cluster.stop()
        return first, again, same_socket, new_address

    first, again, same_socket, new_address = asyncio.run(scenario())
    assert (first, again, new_address) == (200, 200, 200)
    assert same_socket
