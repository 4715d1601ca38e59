from bench import common


def test_a_lab_gets_one_pve_node_per_eight_vms_so_every_node_has_storage_room():
    assert common.pve_nodes_for(1) == ['pve1']
    assert common.pve_nodes_for(6) == ['pve1']
    assert common.pve_nodes_for(8) == ['pve1']
    assert common.pve_nodes_for(9) == ['pve1', 'pve2']
    assert common.pve_nodes_for(24) == ['pve1', 'pve2', 'pve3']
    assert len(common.pve_nodes_for(96)) == 12
    # 8 VMs of 10 GiB (Talos' minimum disk) fit the 100 GiB a lab PVE node's storage holds
    assert common.VMS_PER_PVE_NODE * 10 <= 100
