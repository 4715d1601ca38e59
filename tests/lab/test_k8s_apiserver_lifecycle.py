"""The lab's API server under concurrent lifecycle calls, as VM events and a lab reset make them:
control planes joining and leaving at once, and a stop racing with them. A stopped server must
not listen again (the port is free for the cluster built next)."""

import asyncio
import socket

from lab.k8s import pki
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
