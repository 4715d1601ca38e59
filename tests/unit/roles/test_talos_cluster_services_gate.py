"""talos_cluster: the Talos services gate runs once, on one host (site.yml: the cluster lead), for every node of group
proxtalos_nodes; each node gets its own services - a host_vars override on the host the gate runs on does not leak to
the nodes without one (role defaults are not in hostvars), group vars apply to the group - and a wrong override on
any node fails naming that node and the variable.

Runs the role's real entry point `services` through ansible-playbook --check on local hosts (the gate itself is
skipped in check mode, no Talos node): its argument checks, then one file write of the gate's nodes option."""
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ANSIBLE_PLAYBOOK = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
DEFAULTS = yaml.safe_load(open(os.path.join(ROOT, 'roles', 'talos_cluster', 'defaults', 'main.yml'), encoding='utf-8'))
CONTROLPLANE_DEFAULT = DEFAULTS['__talos_cluster_controlplane_services_default']
WORKER_DEFAULT = DEFAULTS['__talos_cluster_worker_services_default']

PLAYBOOK = """---
- name: The services gate, as site.yml runs it - on the lead only
  hosts: cp-1
  gather_facts: false
  tasks:
    - name: The role's services entry point (its argument checks; the gate is skipped in check mode)
      ansible.builtin.include_role:
        name: proxtalos.cluster.talos_cluster
        tasks_from: services
        public: true
    - name: The gate's nodes option, as the run_once gate task gets it
      ansible.builtin.copy:
        content: "{{ talos_cluster_services_gate_nodes | to_json }}"
        dest: "{{ out }}"
        mode: "0600"
      check_mode: false
"""

NODES = {'cp-1': {'node_ip': '10.5.0.11'}, 'cp-2': {'node_ip': '10.5.0.12'},
         'w-1': {'node_ip': '10.5.0.21'}, 'w-2': {'node_ip': '10.5.0.22'}, 'x-1': {'node_ip': '10.5.0.31'}}


def run_gate(tmp_path, overrides=None, worker_group_vars=None, nodes=None):
    """ansible-playbook --check of PLAYBOOK; hosts get NODES plus `overrides` ({host: vars}); proxtalos_nodes holds
    `nodes` (default: every host, inventory order). Returns (run, the gate's nodes by name or None)."""
    overrides = overrides or {}

    def hosts(*names):
        return dict((name, dict(NODES[name], **overrides.get(name, {}))) for name in names)

    inventory = {'all': {
        'vars': {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable,
                 'cluster_name': 'unit', 'talos_cluster_artifacts_dir': str(tmp_path / 'artifacts')},
        'children': {
            'controlplane': {'hosts': hosts('cp-1', 'cp-2')},
            'worker': {'vars': worker_group_vars or {}, 'hosts': hosts('w-1', 'w-2')},
            'other': {'hosts': hosts('x-1')},
            'proxtalos_nodes': {'hosts': dict((name, {}) for name in (nodes or list(NODES)))}}}}
    (tmp_path / 'inventory.yml').write_text(yaml.safe_dump(inventory, sort_keys=False))
    (tmp_path / 'play.yml').write_text(PLAYBOOK)
    out = tmp_path / 'nodes.json'
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_LOCAL_TEMP=str(tmp_path / 'tmp'),
               PROXTALOS_REPORT_DIR=str(tmp_path / 'report'), ANSIBLE_LOCALHOST_WARNING='false')
    run = subprocess.run([ANSIBLE_PLAYBOOK, '--check', '-i', str(tmp_path / 'inventory.yml'), str(tmp_path / 'play.yml'),
                          '-e', 'out=%s' % out], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
                         check=False)
    nodes = dict((node['name'], node) for node in json.loads(out.read_text())) if out.exists() else None
    return run, nodes


pytestmark = pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')


def test_each_node_gets_its_own_services_and_the_lead_override_does_not_leak(tmp_path):
    # The host the gate runs on (cp-1) overrides both lists (a worker list on a control plane is unused).
    run, nodes = run_gate(tmp_path, overrides={
        'cp-1': {'talos_cluster_controlplane_services': ['apid'], 'talos_cluster_worker_services': ['apid']},
        'w-1': {'talos_cluster_worker_services': ['containerd']}},
        worker_group_vars={'talos_cluster_worker_services': ['apid', 'containerd', 'kubelet']})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert list(nodes) == ['cp-1', 'cp-2', 'w-1', 'w-2', 'x-1']   # every node of proxtalos_nodes, inventory order
    assert nodes['cp-1']['healthy_services'] == ['apid']  # its own override
    assert nodes['cp-2']['healthy_services'] == CONTROLPLANE_DEFAULT  # not cp-1's
    assert nodes['w-1']['healthy_services'] == ['containerd']  # host vars over group vars
    assert nodes['w-2']['healthy_services'] == ['apid', 'containerd', 'kubelet']  # the worker group's
    assert nodes['x-1']['healthy_services'] == WORKER_DEFAULT  # not cp-1's worker list
    assert nodes['cp-2']['address'] == '10.5.0.12'
    assert CONTROLPLANE_DEFAULT == ['etcd', 'apid', 'trustd', 'kubelet', 'containerd'] and WORKER_DEFAULT == ['apid', 'containerd']


def test_the_gate_covers_the_nodes_of_proxtalos_nodes_only(tmp_path):
    """--limit and the nodes without an address are left out of proxtalos_nodes by site.yml: the gate follows it."""
    run, nodes = run_gate(tmp_path, nodes=['cp-1', 'w-2'])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert list(nodes) == ['cp-1', 'w-2']
    assert nodes['w-2'] == {'name': 'w-2', 'address': '10.5.0.22', 'healthy_services': WORKER_DEFAULT}


@pytest.mark.parametrize('host, variable, value', [
    ('w-2', 'talos_cluster_worker_services', {'apid': True}),
    ('cp-2', 'talos_cluster_controlplane_services', {'etcd': 'apid'}),
], ids=['worker', 'controlplane'])
def test_a_wrong_override_on_another_node_fails_naming_the_node_and_the_variable(tmp_path, host, variable, value):
    """Not a list (the same check as the role's argument spec: a string, a number is taken as a list of one)."""
    run, nodes = run_gate(tmp_path, overrides={host: {variable: value}})
    assert run.returncode != 0 and nodes is None, run.stdout[-3000:]
    # the run report's failure: the check's message names the variable and the node it is set on
    report = json.loads((tmp_path / 'report' / 'unit' / 'report.json').read_text())
    assert [(failure['host'], failure['task']) for failure in report['failures']] == [
        ('cp-1', "proxtalos.cluster.talos_cluster : Each node's own services lists (host and group vars) are lists of "
                 "service names - a wrong one named by host")]
    message = report['failures'][0]['message']
    assert re.search(r"'%s'[^\n]* found in '%s'" % (variable, host), message), message
