"""Multi-cluster checks through the preflight role (roles/preflight/tasks/multicluster.yml), on fixture inventories.

Each case of tests/integration/fixtures/multicluster has two inventories, infra and apps. The play runs on
infra with preflight_peer_inventories naming apps, so the apps values come through the
proxtalos.cluster.inventory_vars lookup (templated in apps' own context) and the check through
proxtalos.cluster.multicluster_check. Each failure must name the cluster, the value and the conflicting one.
"""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, 'tests', 'integration', 'fixtures', 'multicluster')
PLAYBOOK_BIN = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')

pytestmark = pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')

PLAY = """---
- name: Multi-cluster preflight
  hosts: cluster
  gather_facts: false
  tasks:
    - name: The preflight role's multi-cluster checks
      ansible.builtin.import_role:
        name: proxtalos.cluster.preflight
        tasks_from: multicluster
"""


def run_case(tmp_path, case, peers=('apps',)):
    playbook = tmp_path / 'multicluster.yml'
    playbook.write_text(PLAY)
    extra = {'preflight_peer_inventories': [os.path.join(FIXTURES, case, peer) for peer in peers]}
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_STDOUT_CALLBACK='ansible.posix.json',
               PROXTALOS_REPORT_DIR=str(tmp_path / 'reports'), PROXTALOS_REPORT_SUMMARY='false', ANSIBLE_NOCOLOR='1')
    process = subprocess.run([PLAYBOOK_BIN, '-i', os.path.join(FIXTURES, case, 'infra'), str(playbook),
                              '-e', json.dumps(extra)], cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=300)
    output = json.loads(process.stdout)
    tasks = output['plays'][0]['tasks']
    check = [task for task in tasks if 'Check the cluster values' in task['task']['name']][0]
    result = list(check['hosts'].values())[0]
    return process.returncode, result


def test_valid_clusters_pass(tmp_path):
    rc, result = run_case(tmp_path, 'valid')
    assert rc == 0, result.get('msg')
    assert result['problems'] == []
    clusters = dict((cluster['name'], cluster) for cluster in result['clusters'])
    assert sorted(clusters) == ['apps', 'infra']
    assert clusters['apps']['inventory'].endswith('valid/apps')
    assert (clusters['infra']['id'], clusters['apps']['id']) == (1, 2)
    # infra's pool comes from cluster_lb_pool, its requested IP from a Service manifest in its GitOps folder
    assert clusters['infra']['lb_pools'][0]['blocks'] == ['10.20.0.192/28']
    assert clusters['infra']['lb_ips'][0]['service'] == 'network/dns'
    # apps' pool comes from a CiliumLoadBalancerIPPool manifest, templated path included
    assert clusters['apps']['lb_pools'][0]['name'] == 'apps-pool'
    assert clusters['apps']['lb_pools'][0]['blocks'] == ['10.30.0.200-10.30.0.231']


def only_problem(result):
    assert len(result['problems']) == 1, result['problems']
    return result['problems'][0]


def test_conflicting_cluster_id(tmp_path):
    rc, result = run_case(tmp_path, 'conflicting_id')
    assert rc == 2
    problem = only_problem(result)
    assert (problem['cluster'], problem['check'], problem['field'], problem['value'], problem['conflict']) == \
        ('apps', 'id', 'cluster_id', 1, 1)
    assert 'cluster_id 1 is also the id of cluster infra' in problem['message']
    assert problem['message'] in result['msg']


def test_overlapping_pod_cidr(tmp_path):
    rc, result = run_case(tmp_path, 'overlapping_cidr')
    assert rc == 2
    problem = only_problem(result)
    assert (problem['cluster'], problem['check'], problem['value'], problem['conflict']) == \
        ('apps', 'cidr', '10.100.128.0/17', '10.100.0.0/16')
    assert 'cluster_pod_cidr 10.100.128.0/17 overlaps cluster_pod_cidr 10.100.0.0/16 of cluster infra' in problem['message']


def test_native_routing_cidr_not_the_pod_subnet(tmp_path):
    rc, result = run_case(tmp_path, 'native_routing_mismatch')
    assert rc == 2
    # infra sets the whole cni_cilium_values; apps only overrides the CIDR in cni_cilium_values_extra
    infra, apps = result['problems']
    assert (infra['cluster'], infra['check'], infra['value'], infra['conflict']) == \
        ('infra', 'native_routing', '10.0.0.0/8', '10.100.0.0/16')
    assert 'ipv4NativeRoutingCIDR 10.0.0.0/8 is not the Talos pod subnet cluster_pod_cidr 10.100.0.0/16' in infra['message']
    assert (apps['cluster'], apps['check'], apps['value'], apps['conflict']) == \
        ('apps', 'native_routing', '10.110.0.0/17', '10.110.0.0/16')


def test_lb_ip_outside_the_pools(tmp_path):
    rc, result = run_case(tmp_path, 'lb_ip_outside_pools')
    assert rc == 2
    problem = only_problem(result)
    assert (problem['cluster'], problem['check'], problem['value']) == ('apps', 'lb_ip', '10.30.0.240')
    assert 'Service shop/web' in problem['message']
    assert 'apps-pool 10.30.0.200-10.30.0.231' in problem['conflict']


def test_without_peers_only_the_own_cluster_is_checked(tmp_path):
    rc, result = run_case(tmp_path, 'conflicting_id', peers=())
    assert rc == 0, result.get('msg')
    assert [cluster['name'] for cluster in result['clusters']] == ['infra']


def test_the_shipped_infra_and_apps_inventories_agree(tmp_path):
    """inventories/infra checked against inventories/apps, as docs/multicluster.md shows."""
    playbook = tmp_path / 'multicluster.yml'
    playbook.write_text(PLAY)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_STDOUT_CALLBACK='ansible.posix.json',
               PROXTALOS_REPORT_DIR=str(tmp_path / 'reports'), PROXTALOS_REPORT_SUMMARY='false', ANSIBLE_NOCOLOR='1')
    process = subprocess.run([PLAYBOOK_BIN, '-i', 'inventories/infra', str(playbook),
                              '-e', json.dumps({'preflight_peer_inventories': ['inventories/apps']})],
                             cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=300)
    tasks = json.loads(process.stdout)['plays'][0]['tasks']
    result = [list(task['hosts'].values())[0] for task in tasks if 'Check the cluster values' in task['task']['name']][0]
    assert process.returncode == 0, result.get('msg')
    assert [(cluster['name'], cluster['id']) for cluster in result['clusters']] == [('infra', 1), ('apps', 2)]
