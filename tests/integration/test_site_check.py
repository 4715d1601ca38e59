"""`ansible-playbook site.yml --check` with no tags, on a fresh lab: the whole run predicts and writes nothing.

On a fresh lab no VM exists, so check mode predicts the VM creations (the vms stage) and stops there for every
node: playbooks/site.yml puts a node whose VM does not exist yet into group proxtalos_unavailable, says so, and
the plays of the later stages (secrets ... gitops), which run on group proxtalos_nodes (the cluster-level ones on its
first node, group proxtalos_cluster_lead, which no node joins then), have no host. The lab's
request log shows that only reads reached PVE and that nothing reached Talos or Kubernetes.
"""
import os

import pytest

from ansible_collections.proxtalos.cluster.tests.integration.pve_playbook import PLAYBOOK_BIN, run_playbook

pytestmark = [pytest.mark.lab,
              pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')]

VMIDS = {'lab-cp-1': 1011, 'lab-cp-2': 1012, 'lab-cp-3': 1013, 'lab-w-1': 1021, 'lab-w-2': 1022, 'lab-w-3': 1023}
# The plays that run on hosts in check mode on a fresh lab; every later play (group proxtalos_nodes or
# proxtalos_cluster_lead) has none.
PREDICTING_PLAYS = ('Stage preflight', 'Stage vms (Proxmox)', 'Node addresses for the stages after vms', 'Nodes without an address')


def plays_by_name(run):
    return dict((play['play']['name'], play) for play in run.document.get('plays', []))


def hosts_of(play):
    return set(host for task in play.get('tasks', []) for host in task.get('hosts', {}))


def test_check_mode_of_the_whole_site_on_a_fresh_lab_predicts_the_vms_and_writes_nothing(clean_lab):
    since = clean_lab.last_seq('requests')
    run = run_playbook(clean_lab.inventory_dir, '--check')
    assert run.rc == 0 and run.failed == 0, run.describe()
    assert set(run.stats) == set(VMIDS)

    # The vms stage: each VM's creation (and start) predicted, the image download too.
    # One module run (run_once) for every VM: each VM's prediction is under its host in the result's `vms`.
    vm_task = run.results('Create or update the VM')
    assert len(vm_task) == 1 and vm_task[0][2]['changed'] is True, run.describe()
    predicted = vm_task[0][2]['vms']
    assert sorted(predicted) == sorted(VMIDS)
    for host, result in predicted.items():
        assert result['changed'] is True and result['actions'] == ['create', 'start'], (host, result)
    image = run.results('Make sure the Talos image')[0][2]['results'][0]
    assert image['changed'] is True and image['present'] is False
    # The address gate is not run in check mode (no VM runs).
    assert all(result.get('skipped') for _name, _host, result in run.results('Gate - the VM runs'))

    # Every node is left out of the later stages, with the message site.yml prints.
    said = dict((host, result['msg']) for _name, host, result in run.results('Check mode - say where the prediction stops'))
    assert sorted(said) == sorted(VMIDS)
    for host, vmid in VMIDS.items():
        assert said[host] == ('%s: VM %d does not exist or has no address yet; check mode predicts it up to the vms '
                              'stage only' % (host, vmid))
    # One task (run_once, a loop over the nodes) put every node into proxtalos_unavailable.
    grouping = run.results('Nodes the stages after vms run on')
    assert len(grouping) == 1 and grouping[0][2]['changed'] is False, grouping
    grouped = dict((item['item']['name'], item) for item in grouping[0][2]['results'])
    assert sorted(grouped) == sorted(VMIDS)
    assert all(item['add_host']['groups'] == ['proxtalos_unavailable'] and item['changed'] is False
               for item in grouped.values()), grouped
    assert all(result.get('skipped') for _name, _host, result in run.results('Every node has an address'))
    lead = run.results('The node the cluster-level stages run on')
    assert len(lead) == 1 and lead[0][2].get('skipped') is True, lead   # no node to lead the cluster-level stages

    plays = plays_by_name(run)
    later = [name for name in plays if not name.startswith(PREDICTING_PLAYS)]
    assert any(name.startswith('Stage secrets') for name in later) and any(name.startswith('Stage gitops') for name in later)
    for name in later:
        assert hosts_of(plays[name]) == set(), '%s ran tasks on %s' % (name, sorted(hosts_of(plays[name])))

    # Nothing but reads reached PVE; nothing at all reached Talos or Kubernetes (no VM runs, so no node exists).
    requests = clean_lab.requests(since=since)
    assert requests, 'the run made no request at all'
    assert set(entry['source'] for entry in requests) == {'pve'}
    assert [(e['method'], e['path']) for e in requests if e['method'] not in ('GET', 'HEAD')] == []
    assert clean_lab.vms() == []


def test_a_later_stage_fails_each_node_without_an_address_by_name_and_goes_on_for_the_others(clean_lab, tmp_path):
    """--tags secrets before any VM exists: the control planes have a static node_ip, the workers get theirs from the
    guest agent and have none. Each worker fails with its own message; the secrets stage runs for the control planes
    (bundle and artifacts in the test's own folder)."""
    since = clean_lab.last_seq('requests')
    run = run_playbook(clean_lab.inventory_dir, '--tags', 'secrets',
                       extra_vars={'talos_machines_secrets_path': str(tmp_path / 'secrets' / 'talos-secrets.yaml'),
                                   'proxtalos_artifacts_dir': str(tmp_path / 'artifacts')})
    assert run.rc != 0, run.describe()
    failures = run.failures()
    assert sorted(failures) == ['lab-w-1', 'lab-w-2', 'lab-w-3'], failures
    for host in failures:
        assert failures[host] == ('%s: no node_ip - VM %d on pve1 reports no address through its guest agent (not created '
                                  'or not started yet?). Run the vms stage first (--tags vms), or set node_ip.'
                                  % (host, VMIDS[host])), failures
    # that play runs on the nodes without an address and the cluster-level node (skipped there, so that the run goes on)
    without = [play for name, play in plays_by_name(run).items() if name.startswith('Nodes without an address')]
    assert len(without) == 1 and hosts_of(without[0]) == {'lab-w-1', 'lab-w-2', 'lab-w-3', 'lab-cp-1'}
    assert all(result.get('skipped') for _name, host, result in run.results('Every node has an address') if host == 'lab-cp-1')
    for host in ('lab-cp-1', 'lab-cp-2', 'lab-cp-3'):
        assert (tmp_path / 'artifacts' / ('%s.yaml' % host)).exists(), host
    assert not (tmp_path / 'artifacts' / 'lab-w-1.yaml').exists()
    requests = clean_lab.requests(since=since)
    assert [(e['method'], e['path']) for e in requests if e['method'] not in ('GET', 'HEAD')] == []
