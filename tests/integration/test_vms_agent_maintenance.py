"""A static node whose QEMU guest agent does not run while Talos is in maintenance mode (the lab's fault
talos-agent-maintenance: siderolabs/talos issue 11651) is still found by the vms stage, by its inventory address and
its Talos API, and its agent is seen once Talos runs the installed config; without the fallback the address gate fails
naming the agent, as before. A lab of its own: one control plane (static node_ip), no worker (a DHCP worker has no
inventory address to fall back on).
"""
import os

import pytest

from k8s_stages_lab import PLAYBOOK_BIN, StageCluster

pytestmark = [pytest.mark.lab, pytest.mark.slow,
              pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')]

ADDRESS_GATE = 'Gate - the VM runs and its guest agent reports its address'


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    handle = StageCluster.start(str(tmp_path_factory.mktemp('agent-maintenance')), control_planes=1, workers=0)
    try:
        yield handle
    finally:
        handle.stop()


def _row(cluster, name):
    return next(row for row in cluster.lab.vms() if row['name'] == name)


def test_the_vms_stage_finds_a_static_node_by_its_talos_api_when_maintenance_mode_runs_no_agent(cluster):
    vmid = cluster.hosts['cluster']['children']['controlplane']['hosts']['lab-cp-1']['vm_id']
    address = cluster.node_address('lab-cp-1')
    cluster.lab.fault('talos-agent-maintenance', str(vmid))

    without = cluster.site('--tags', 'preflight,vms', '-e', 'proxmox_vms_talos_api_fallback=false',
                           '-e', 'proxmox_vms_address_timeout=4')
    assert without.rc != 0
    (task, host, message), = without.failures()
    assert task.endswith(ADDRESS_GATE) and 'QEMU guest agent is not running' in message, without.explain()
    assert _row(cluster, 'lab-cp-1')['agent'] == 'down (maintenance)', _row(cluster, 'lab-cp-1')

    run = cluster.site('--tags', 'preflight,vms,secrets,apply')
    assert run.rc == 0, run.explain()
    gate, = run.result_values(ADDRESS_GATE)
    part = gate['vms']['lab-cp-1']
    assert (part['address'], part['address_source']) == (address, 'talos_api'), part
    assert part['agent_error'] == 'QEMU guest agent is not running', part
    # once Talos runs the applied config, the agent answers
    cluster.lab.wait_until(lambda: (_row(cluster, 'lab-cp-1')['agent'] == 'running', _row(cluster, 'lab-cp-1')), timeout=60,
                           what='the guest agent of lab-cp-1 running after the apply')
