"""The cluster-level stages (bootstrap, kubeconfig, cni, apps, sealed_secrets, flux, gitops, report) run their plays on
one host, the first
node in inventory order (playbooks/site.yml, group proxtalos_cluster_lead), against a lab taken through site.yml:
the per-node stages' plays still run on every node (their tasks all run once: no node but the first has a result);
with --limit and without the first node, the first node of the limited
set runs them, in check mode too, and every gate still passes with changed=0."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gitops_lab import gitops_cluster  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import,import-error

NODES = ['lab-cp-1', 'lab-cp-2', 'lab-cp-3', 'lab-w-1', 'lab-w-2', 'lab-w-3']
CLUSTER_LEVEL = ('bootstrap', 'kubeconfig', 'cni', 'apps', 'sealed_secrets', 'flux', 'gitops', 'report')
# The per-node stages' plays run on every node, but every task once (secrets: each node's machine config inputs are
# read in the node's own context for every node in one task, host_values): only the first node has results.
PER_NODE_PLAYS = ('secrets',)


def hosts_by_stage(run):
    """{stage: sorted hosts with a task result} of the plays named 'Stage <stage> - ...'."""
    found = {}
    for play in run.data.get('plays') or []:
        name = play['play']['name']
        if not name.startswith('Stage '):
            continue
        stage = name[len('Stage '):].split(' ')[0]
        hosts = found.setdefault(stage, set())
        for task in play.get('tasks') or []:
            hosts.update(task['hosts'])
    return dict((stage, sorted(hosts)) for stage, hosts in found.items())


def test_the_cluster_level_stages_ran_on_the_first_node_only(gitops_cluster):
    first = gitops_cluster.first
    assert first.rc == 0, first.explain()
    ran = hosts_by_stage(first)
    for stage in CLUSTER_LEVEL:
        assert ran[stage] == ['lab-cp-1'], (stage, ran[stage])
    for stage in PER_NODE_PLAYS:
        assert ran[stage] == ['lab-cp-1'], (stage, ran[stage])
    rendered = first.result_values('Machine config of every node and the talosconfig')
    assert len(rendered) == 1 and sorted(rendered[0]['nodes']) == NODES, rendered
    # the services gate and the report read every node all the same, from the lead
    gate = first.result_values('Gate - Talos services Running and healthy')
    assert len(gate) == 1 and sorted(item['host'] for item in gate[0]['gates']) == NODES, gate
    read = first.result_values("Read every node's Talos version")
    assert len(read) == 1 and sorted(read[0]['report_facts_by_host']) == NODES, read
    # no task ran on every node: the recap has the first node only (each node's results are in the tasks' results)
    assert sorted(first.stats) == ['lab-cp-1']


def test_a_limit_without_the_first_node_runs_them_on_the_first_node_of_the_limit(gitops_cluster):
    tags = ','.join(CLUSTER_LEVEL)
    limited = gitops_cluster.site('--limit', 'lab-w-3,lab-w-2', '--tags', tags)
    assert limited.rc == 0, limited.explain()
    # only the lead ran tasks: none of these stages has a task on every node (the recap has a line for lab-w-2 alone)
    assert limited.changed() == {'lab-w-2': 0}, [
        (play['play']['name'], task['task']['name'], host) for play in limited.data['plays'] for task in play['tasks']
        for host, result in task['hosts'].items() if result.get('changed')]
    ran = hosts_by_stage(limited)
    for stage in CLUSTER_LEVEL:
        assert ran[stage] == ['lab-w-2'], (stage, ran[stage])   # inventory order, not the order of --limit
    # the services gate and the report: the nodes of the limit only
    gate = limited.result_values('Gate - Talos services Running and healthy')
    assert len(gate) == 1 and sorted(item['host'] for item in gate[0]['gates']) == ['lab-w-2', 'lab-w-3'], gate
    read = limited.result_values("Read every node's Talos version")
    assert len(read) == 1 and sorted(read[0]['report_facts_by_host']) == ['lab-w-2', 'lab-w-3'], read
    # the gates ran there and passed: the API, the Flux tree, the CSI plugin on every node, our sealing key
    assert [host for host, _result in limited.results('Gate - the Kubernetes API server answers ready')] == ['lab-w-2']
    tree = limited.results('Gate on the Flux Kustomization tree')
    assert [host for host, _result in tree] == ['lab-w-2'] and tree[0][1]['summary'] == 'Kustomizations Ready 8/8'
    csi = limited.result_values('Gate on the CSI controller')
    assert len(csi) == 1 and csi[0]['passed'] is True and csi[0]['changed'] is False, csi
    served = limited.result_values('The sealed-secrets controller serves our certificate')
    assert len(served) == 1 and served[0]['passed'], served

    checked = gitops_cluster.site('--check', '--limit', 'lab-w-3', '--tags', tags)
    assert checked.rc == 0 and checked.changed() == {'lab-w-3': 0}, checked.explain()
    ran = hosts_by_stage(checked)
    for stage in CLUSTER_LEVEL:
        assert ran[stage] == ['lab-w-3'], (stage, ran[stage])
