"""talos_cluster: the Talos services gate's node list gives each node its own services - a host_vars override on the
first host does not leak to the nodes without one (role defaults are not in hostvars), group vars apply to the group.

Runs the role's real task file and vars through ansible-playbook on local hosts (set_fact and one file write only,
no Talos node)."""
import json
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ANSIBLE_PLAYBOOK = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
DEFAULTS = yaml.safe_load(open(os.path.join(ROOT, 'roles', 'talos_cluster', 'defaults', 'main.yml'), encoding='utf-8'))

PLAYBOOK = """---
- name: The services gate's nodes, as the bootstrap stage builds them
  hosts: all
  gather_facts: false
  tasks:
    - name: Each node's own services (the role's task file)
      ansible.builtin.include_role:
        name: proxtalos.cluster.talos_cluster
        tasks_from: services_gate_inputs
        public: true
    - name: The gate's nodes option, as the run_once gate task gets it
      ansible.builtin.copy:
        content: "{{ talos_cluster_services_gate_nodes | to_json }}"
        dest: "{{ out }}"
        mode: "0600"
      run_once: true
"""


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_each_node_gets_its_own_services_and_a_first_host_override_does_not_leak(tmp_path):
    inventory = {'all': {
        'vars': {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable},
        'children': {
            'controlplane': {'hosts': {
                # The first host of the play overrides both lists (a worker list on a control plane is unused).
                'cp-1': {'node_ip': '10.5.0.11', 'talos_cluster_controlplane_services': ['apid'],
                         'talos_cluster_worker_services': ['apid']},
                'cp-2': {'node_ip': '10.5.0.12'}}},
            'worker': {
                'vars': {'talos_cluster_worker_services': ['apid', 'containerd', 'kubelet']},
                'hosts': {
                    'w-1': {'node_ip': '10.5.0.21', 'talos_cluster_worker_services': ['containerd']},
                    'w-2': {'node_ip': '10.5.0.22'}}},
            'other': {'hosts': {'x-1': {'node_ip': '10.5.0.31'}}}}}}
    (tmp_path / 'inventory.yml').write_text(yaml.safe_dump(inventory))
    (tmp_path / 'play.yml').write_text(PLAYBOOK)
    out = tmp_path / 'nodes.json'
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_LOCAL_TEMP=str(tmp_path / 'tmp'),
               PROXTALOS_REPORT_DIR=str(tmp_path / 'report'))
    run = subprocess.run([ANSIBLE_PLAYBOOK, '-i', str(tmp_path / 'inventory.yml'), str(tmp_path / 'play.yml'),
                          '-e', 'out=%s' % out], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
                         check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    nodes = dict((node['name'], node) for node in json.loads(out.read_text()))
    assert sorted(nodes) == ['cp-1', 'cp-2', 'w-1', 'w-2', 'x-1']
    assert nodes['cp-1']['healthy_services'] == ['apid']  # its own override
    assert nodes['cp-2']['healthy_services'] == DEFAULTS['talos_cluster_controlplane_services']  # not cp-1's
    assert nodes['w-1']['healthy_services'] == ['containerd']  # host vars over group vars
    assert nodes['w-2']['healthy_services'] == ['apid', 'containerd', 'kubelet']  # the worker group's
    assert nodes['x-1']['healthy_services'] == DEFAULTS['talos_cluster_worker_services']  # not cp-1's worker list
    assert nodes['cp-2']['address'] == '10.5.0.12'
