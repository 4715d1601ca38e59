"""site.yml's report stage: one read on the cluster lead for every node of proxtalos_nodes; a node whose Talos API
does not answer fails by its own name, with the reason, in the play after it (on those nodes only) - the lead's own
failure included, and the run report's report stage is failed with every such node named.

Runs site.yml's own plays (the grouping tasks of the addresses play, the report plays) through ansible-playbook on
local hosts whose addresses answer nothing (no lab): every read fails fast (connection refused, a 1 s deadline)."""
import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ANSIBLE_PLAYBOOK = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
SITE = os.path.join(ROOT, 'playbooks', 'site.yml')


def site_plays():
    with open(SITE, encoding='utf-8') as handle:
        return yaml.safe_load(handle)


def closed_address():
    """A loopback address whose port 50000 refuses connections (nothing listens there)."""
    for last in range(2, 250):
        address = '127.0.99.%d' % last
        probe = socket.socket()
        probe.settimeout(0.5)
        try:
            if probe.connect_ex((address, 50000)) != 0:
                return address
        finally:
            probe.close()
    pytest.skip('no closed loopback address found')
    return None


pytestmark = pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')


def test_each_node_that_does_not_answer_fails_by_its_own_name_and_the_run_goes_on(tmp_path):
    plays = site_plays()
    addresses = [play for play in plays if play['name'].startswith('Node addresses')][0]
    wanted = ('Nodes the stages after vms', 'The node the cluster-level')
    grouping = [task for task in addresses['tasks'] if task['name'].startswith(wanted)]
    assert len(grouping) == 2
    report_plays = [play for play in plays if play.get('tags')[0] == 'report']
    assert [play['hosts'] for play in report_plays] == [
        'cluster:&proxtalos_cluster_lead', "{{ groups['proxtalos_report_failed'] | default([]) }}"]
    assert plays[-1] is report_plays[-1] and not any(play.get('any_errors_fatal') for play in report_plays)
    playbook = [dict(addresses, tasks=grouping)] + report_plays
    address = closed_address()
    hosts = dict((name, {'node_ip': address}) for name in ('cp-1', 'w-1', 'w-2'))
    inventory = {'all': {
        'vars': {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable, 'cluster_name': 'unit',
                 'proxtalos_artifacts_dir': str(tmp_path / 'artifacts'), 'report_wait_timeout': 1,
                 'report_wait_sleep': 0.2, 'report_call_timeout': 1},
        'children': {'cluster': {'children': {
            'controlplane': {'hosts': {'cp-1': hosts['cp-1']}},
            'worker': {'hosts': {'w-1': hosts['w-1'], 'w-2': hosts['w-2']}}}}}}}
    (tmp_path / 'inventory.yml').write_text(yaml.safe_dump(inventory, sort_keys=False))
    (tmp_path / 'playbooks').mkdir()
    (tmp_path / 'playbooks' / 'site.yml').write_text(yaml.safe_dump(playbook, sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_LOCAL_TEMP=str(tmp_path / 'tmp'),
               ANSIBLE_STDOUT_CALLBACK='ansible.posix.json', PROXTALOS_REPORT_DIR=str(tmp_path / 'report'),
               ANSIBLE_LOCALHOST_WARNING='false')
    run = subprocess.run([ANSIBLE_PLAYBOOK, '-i', str(tmp_path / 'inventory.yml'), str(tmp_path / 'playbooks' / 'site.yml'),
                          '--tags', 'report'], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-2000:]
    document = json.loads(run.stdout[run.stdout.index('{'):])
    by_play = dict((play['play']['name'], play['tasks']) for play in document['plays'])
    read_play, fail_play = [by_play[play['name']] for play in report_plays]
    # the read: once, on the lead, for every node
    read = [task for task in read_play if 'Read every node' in task['task']['name']][0]
    assert list(read['hosts']) == ['cp-1']
    assert sorted(read['hosts']['cp-1']['failed_nodes']) == ['cp-1', 'w-1', 'w-2']
    # each node that did not answer fails by its own name, with its reason (the node and its address first)
    failed = fail_play[0]['hosts']
    assert sorted(failed) == ['cp-1', 'w-1', 'w-2']
    for host, result in failed.items():
        assert result['failed'] is True and result['msg'].startswith('%s (%s:50000): ' % (host, address)), result
    assert dict((host, stats['failures']) for host, stats in document['stats'].items()) == {'cp-1': 1, 'w-1': 1, 'w-2': 1}
    # the run report: the report stage failed, each node named in the failures
    report = json.loads((tmp_path / 'report' / 'unit' / 'report.json').read_text())
    assert [(stage['name'], stage['status']) for stage in report['stages']] == [('report', 'failed')]
    assert sorted(failure['host'] for failure in report['failures']) == ['cp-1', 'w-1', 'w-2']
    assert all(failure['stage'] == 'report' for failure in report['failures'])


def test_a_healthy_run_has_no_host_in_the_failure_play(tmp_path):
    """No node failed: the failure play's hosts template gives no host (the play costs nothing)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template
    hosts = [play for play in site_plays() if play.get('tags')[0] == 'report'][-1]['hosts']
    templar = Templar(loader=DataLoader(), variables={'groups': {'all': ['cp-1'], 'proxtalos_nodes': ['cp-1']}})
    assert templar.template(trust_as_template(hosts)) == []
    templar = Templar(loader=DataLoader(), variables={'groups': {'proxtalos_report_failed': ['w-2']}})
    assert templar.template(trust_as_template(hosts)) == ['w-2']
