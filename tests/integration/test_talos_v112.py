"""A cluster on Talos v1.12: the stages preflight to kubeconfig against lab nodes that boot a v1.12.11 ISO and
install v1.12.11, where the lab's node behaves as v1.12 does (a separate maintenance server: no ServiceList, Version
only for admins, apply modes TRY/REBOOT/AUTO with a bare reply, no API between the apply and the install reboot;
lab/talos/versions.py). The collection renders v1.12 configs (Kubernetes 1.35.4) and goes through as on v1.13."""
import os

import pytest

from ansible_collections.proxtalos.cluster.tests.integration.pve_playbook import PLAYBOOK_BIN
from test_talos_stages import STAGES, TalosWorkspace, applied_nodes  # pylint: disable=import-error

from k8s_stages_lab import start_rendered_lab  # pylint: disable=import-error

pytestmark = [pytest.mark.lab, pytest.mark.slow,
              pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')]

V112 = {'talos_version': 'v1.12.11'}


def test_a_v112_cluster_from_maintenance_to_kubeconfig_then_rerun_unchanged(tmp_path):
    lab = start_rendered_lab(str(tmp_path / 'lab'), control_planes=1, workers=1)
    try:
        workspace = TalosWorkspace(lab, str(tmp_path))
        first = workspace.run('--tags', STAGES, extra_vars=V112)
        assert first.rc == 0, first.describe()
        applied = applied_nodes(first)
        assert sorted(applied) == ['lab-cp-1', 'lab-w-1']
        assert all(result['node_mode'] == 'maintenance' and result['rebooted'] and result['verified']
                   for result in applied.values()), applied
        nodes = workspace.talos_nodes()
        assert [(nodes[host]['mode'], nodes[host]['version']) for host in ('lab-cp-1', 'lab-w-1')] == [
            ('configured', 'v1.12.11'), ('configured', 'v1.12.11')]
        with workspace.client('lab-cp-1') as talos:
            assert talos.version()['tag'] == 'v1.12.11'
        again = workspace.run('--tags', STAGES, extra_vars=V112)
        assert again.rc == 0 and again.changed == 0, again.describe()
    finally:
        lab.stop()
