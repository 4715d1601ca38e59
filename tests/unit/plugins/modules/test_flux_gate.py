"""flux_gate as Ansible runs it: input refused before any API call (the gate against a Flux tree is
tests/lab/test_gitops_gates_lab.py)."""
import os

from ansible_collections.proxtalos.cluster.plugins.modules import flux_gate
from ansible_collections.proxtalos.cluster.tests.helpers import run_main as run


def test_flux_gate_refuses_a_name_without_namespace(capsys, tmp_path):
    kubeconfig = tmp_path / 'kubeconfig'
    kubeconfig.write_text('apiVersion: v1\nkind: Config\n')
    code, result, out = run(flux_gate, {'kubeconfig': str(kubeconfig), 'names': ['apps']}, capsys)
    assert code == 1 and result['field'] == 'names' and 'has no namespace' in result['msg']
    assert os.path.exists(str(kubeconfig))
