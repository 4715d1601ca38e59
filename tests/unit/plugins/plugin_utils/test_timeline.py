"""The report's data model: conventions for gates and remediation, stages, masking, the HTML."""
import json
import os
import re

import jsonschema
import pytest

from ansible_collections.proxtalos.cluster.plugins.plugin_utils import _report_html, _timeline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
with open(os.path.join(ROOT, 'docs', 'report.schema.json')) as _stream:
    SCHEMA = json.load(_stream)

# A k8s_gate result as the module returns it (plugins/modules/k8s_gate.py RETURN).
K8S_GATE_FAILED = {
    'changed': False, 'failed': True, 'gate': 'nodes', 'target': 'nodes', 'passed': False,
    'summary': 'nodes Ready 2/3: w-2 NetworkPluginNotReady',
    'msg': 'nodes not reached after 10.0s (6 probes): nodes Ready 2/3: w-2 NetworkPluginNotReady\n- w-2: Ready=False',
    'details': [{'name': 'cp-1', 'ok': True, 'reason': None, 'kubelet_version': 'v1.33.4', 'os_image': 'Talos (v1.13.9)'},
                {'name': 'w-2', 'ok': False, 'reason': 'NetworkPluginNotReady'}],
    'diagnosis': ['- w-2: Ready=False KubeletNotReady'], 'elapsed': 10.02, 'attempts': 6, 'progress': [],
}


def test_stage_is_the_innermost_stage_tag():
    assert _timeline.stage_of(['remediate', 'cni']) == 'remediate'
    assert _timeline.stage_of(['my-own', 'cni']) == 'cni'
    assert _timeline.stage_of(['always']) is None
    assert _timeline.stage_of(['deploy'], stages=('deploy',)) == 'deploy'


def test_k8s_gate_result_is_a_gate():
    gate = _timeline.gate_from_result('Cilium agent Ready on every node', K8S_GATE_FAILED, 'failed')
    assert gate['name'] == 'nodes'
    assert _timeline.gate_from_result('cni : Gate - ALL nodes Ready', K8S_GATE_FAILED, 'failed')['name'] == 'ALL nodes Ready'
    assert gate['ok'] is False
    assert gate['observation'] == 'nodes Ready 2/3: w-2 NetworkPluginNotReady'
    assert (gate['elapsed'], gate['attempts'], gate['diagnosis']) == (10.02, 6, ['- w-2: Ready=False KubeletNotReady'])


def test_explicit_gate_dict_and_named_gate():
    explicit = {'gate': {'name': 'Talos API on 50000', 'ok': True, 'observation': 'apid answers', 'elapsed': '2.5', 'attempts': 2}}
    gate = _timeline.gate_from_result('whatever', explicit, 'ok')
    assert (gate['name'], gate['ok'], gate['observation'], gate['elapsed'], gate['attempts']) == \
        ('Talos API on 50000', True, 'apid answers', 2.5, 2)
    # an explicit ok gate whose task failed anyway is a failed gate
    assert _timeline.gate_from_result('x', explicit, 'failed')['ok'] is False
    named = _timeline.gate_from_result('Gate - the VM runs', {'msg': 'VM 811: not running after 60 s', 'elapsed': 60.1}, 'failed')
    assert (named['name'], named['ok'], named['observation'], named['elapsed']) == \
        ('the VM runs', False, 'VM 811: not running after 60 s', 60.1)
    assert _timeline.gate_from_result('Gate - skipped one', {}, 'skipped') is None
    assert _timeline.gate_from_result('Render the configs', {'gate': {'name': 'no ok key'}}, 'ok') is None
    assert _timeline.gate_from_result('Render the configs', {'changed': True}, 'changed') is None


def test_remediation_conventions():
    declared = {'remediation': [{'action': 'talos reboot', 'node': 'w-2', 'reason': 'kubelet volume', 'attempt': 1,
                                 'outcome': 'still NotReady'},
                                {'action': 'pve reset', 'target': 'w-2', 'attempt': 2}]}
    steps = _timeline.remediations_from_result('Remediate the worker', declared, 'changed', 'w-2')
    assert [(s['action'], s['target'], s['attempt'], s['outcome']) for s in steps] == [
        ('talos reboot', 'w-2', 1, 'still NotReady'), ('pve reset', 'w-2', 2, 'changed')]
    named = _timeline.remediations_from_result('Remediate - hard reset through PVE', {'msg': 'reset failed: VM locked'}, 'failed', 'w-3')
    assert named == [{'action': 'hard reset through PVE', 'target': 'w-3', 'reason': None, 'attempt': None,
                      'outcome': 'reset failed: VM locked'}]
    assert _timeline.remediations_from_result('Remediate - hard reset', {}, 'skipped', 'w-3') == []
    assert _timeline.remediations_from_result('Apply config', {'changed': True}, 'changed', 'w-3') == []


def test_masker_masks_registered_values_everywhere_and_ignores_short_ones():
    masker = _timeline.Masker()
    masker.register({'a': 'tok-123456', 'b': ['-----BEGIN KEY-----\nAAAABBBBCCCC\n-----END KEY-----'], 'c': 'ab'})
    masked = masker.tree({'msg': 'uses tok-123456', 'tok-123456': 1, 'lines': ['AAAABBBBCCCC at ab'], 'n': 3})
    assert masked == {'msg': 'uses $REDACTED$', '$REDACTED$': 1, 'lines': ['$REDACTED$ at ab'], 'n': 3}
    core = _timeline.Masker(extra=lambda text: text.replace('core-secret', '$REDACTED$'))
    assert core.text('a core-secret') == 'a $REDACTED$'


def _recorded():
    recorder = _timeline.Recorder(started=1000.0)
    recorder.playbook = 'site.yml'
    for host in ('cp-1', 'w-2'):
        recorder.set_cluster(host, 'lab')
    recorder.task_result('cp-1', 'Check every VM', ['preflight'], 'Stage preflight', 'proxtalos.cluster.proxmox_preflight',
                         1000.5, 1001.0, 'ok', {'changed': False})
    recorder.task_result('cp-1', 'Cilium agents', ['cni'], 'Stage cni', 'proxtalos.cluster.k8s_gate',
                         1010.0, 1020.0, 'failed', dict(K8S_GATE_FAILED))
    recorder.task_result('w-2', 'Remediate - Talos reboot', ['remediate', 'cni'], 'Stage cni', 'proxtalos.cluster.talos_reboot',
                         1021.0, 1030.0, 'changed', {'changed': True})
    recorder.task_result('w-2', 'Show token', ['cni'], 'Stage cni', 'ansible.builtin.debug', 1030.0, 1030.1, 'failed',
                         {'msg': 'never read'}, no_log=True)
    recorder.set_cluster_values('lab', {'cluster_name': 'lab', 'cluster_id': 3, 'talos_version': 'v1.13.9'})
    recorder.set_node('lab', 'w-2', {'role': 'worker', 'vm_id': 912, 'node_ip': '10.0.0.12', 'vm_pve_node': 'pve1'})
    recorder.host_stats('cp-1', {'ok': 1, 'changed': 0, 'failures': 1, 'unreachable': 0, 'skipped': 0})
    recorder.finished = 1031.0
    return recorder


def test_report_document():
    report = _recorded().build('lab')
    jsonschema.validate(report, SCHEMA)
    assert report['status'] == 'failed'
    assert report['duration'] == 31.0
    assert [(s['name'], s['status'], s['start'], s['end']) for s in report['stages']] == [
        ('preflight', 'ok', 0.5, 1.0), ('cni', 'failed', 10.0, 30.1), ('remediate', 'ok', 21.0, 30.0)]
    assert report['bootstrap_timeline'] == [{'stage': 'preflight', 'start_offset': '+0:00', 'status': 'ok'},
                                            {'stage': 'cni', 'start_offset': '+0:10', 'status': 'failed'},
                                            {'stage': 'remediate', 'start_offset': '+0:21', 'status': 'ok'}]
    assert [(g['name'], g['ok'], g['start'], g['end']) for g in report['gates']] == [('nodes', False, 10.0, 20.0)]
    assert report['remediations'][0]['action'] == 'Talos reboot'
    assert report['remediations'][0]['stage'] == 'remediate'
    messages = [f['message'] for f in report['failures']]
    assert messages[0].startswith('nodes Ready 2/3')
    assert messages[1] == _timeline.NO_LOG_TEXT
    nodes = dict((node['name'], node) for node in report['facts']['nodes'])
    # the nodes gate's details become observations per node
    assert nodes['w-2']['observed'] == {'kubernetes_ready': False, 'kubernetes_reason': 'NetworkPluginNotReady'}
    assert nodes['cp-1']['observed'] == {'kubernetes_ready': True, 'kubelet_version': 'v1.33.4', 'os_image': 'Talos (v1.13.9)'}
    assert nodes['w-2']['vm_id'] == 912


def test_hosts_of_no_cluster_are_left_out_when_several_clusters_ran():
    recorder = _timeline.Recorder(started=0.0)
    recorder.set_cluster('a-1', 'a')
    recorder.set_cluster('b-1', 'b')
    recorder.task_result('localhost', 'Gate - something', [], 'p', 'x', 1.0, 2.0, 'ok', {})
    assert recorder.clusters() == ['a', 'b']
    assert recorder.build('a')['gates'] == [] and recorder.build('b')['gates'] == []
    single = _timeline.Recorder(started=0.0)
    single.set_cluster('a-1', 'a')
    single.task_result('localhost', 'Gate - something', [], 'p', 'x', 1.0, 2.0, 'ok', {})
    assert [gate['host'] for gate in single.build('a')['gates']] == ['localhost']


@pytest.mark.parametrize('seconds, text', [(0, '+0:00'), (61.4, '+1:01'), (3725, '+1:02:05')])
def test_offset_text(seconds, text):
    assert _timeline.offset_text(seconds) == text


def test_html_escapes_and_is_self_contained():
    recorder = _recorded()
    recorder.task_result('cp-1', 'Gate - <script>alert(1)</script>', ['cni'], 'p', 'x', 1020.0, 1021.0, 'ok', {})
    page = _report_html.render(recorder.build('lab'))
    assert '<script>' not in page
    assert '&lt;script&gt;alert(1)&lt;/script&gt;' in page
    assert page.count('class="stage-bar"') == 3
    assert page.count('class="gate-bar"') == 2
    assert 'http://' not in page.replace('http://www.w3.org/2000/svg', '')
    assert 'no Flux graph in this run' in page


def test_conventions_see_through_the_role_prefix_of_task_names():
    gate = _timeline.gate_from_result('proxtalos.cluster.proxmox_vms : Gate - the VM runs', {'elapsed': 2.0, 'attempts': 3}, 'ok')
    assert (gate['name'], gate['elapsed'], gate['attempts']) == ('the VM runs', 2.0, 3)
    steps = _timeline.remediations_from_result('proxtalos.cluster.cni : Remediate - Talos reboot', {}, 'changed', 'w-1')
    assert [step['action'] for step in steps] == ['Talos reboot']


def test_role_argument_checks_do_not_make_a_stage_unless_they_fail():
    recorder = _timeline.Recorder(started=0.0)
    recorder.set_cluster('cp-1', 'lab')
    recorder.task_result('cp-1', "talos_machines : Validating arguments against arg spec 'apply'", ['apply'], 'p',
                         'ansible.builtin.validate_argument_spec', 1.0, 1.1, 'ok', {})
    recorder.task_result('cp-1', 'Cilium', ['cni'], 'p', 'proxtalos.cluster.k8s_gate', 2.0, 3.0, 'ok', {})
    assert [stage['name'] for stage in recorder.build('lab')['stages']] == ['cni']
    recorder.task_result('cp-1', "cni : Validating arguments against arg spec 'main'", ['cni'], 'p',
                         'ansible.builtin.validate_argument_spec', 4.0, 4.1, 'failed', {'msg': 'cni_mode: bad'})
    assert recorder.build('lab')['failures'][0]['message'] == 'cni_mode: bad'


def test_report_stage_facts_per_node_from_talos_info_and_a_registered_nodes_listing():
    recorder = _timeline.Recorder(started=0.0)
    for host in ('cp-1', 'w-2'):
        recorder.set_cluster(host, 'lab')
    recorder.set_node('lab', 'w-2', {'role': 'worker', 'node_hostname': 'worker-two'})
    talos_facts = {'talos_mode': 'configured', 'talos_stage': 'running', 'talos_version': 'v1.13.9',
                   'talos_services': 'apid Running, kubelet Running', 'talos_services_unhealthy': '', 'etcd_members': 3}
    recorder.task_result('cp-1', 'report : Read the Talos facts', ['report'], 'Stage report', 'proxtalos.cluster.talos_info',
                         1.0, 2.0, 'ok', {'changed': False, 'mode': 'configured', 'report_facts': talos_facts})
    recorder.task_result('w-2', 'report : Read the Talos facts', ['report'], 'Stage report', 'proxtalos.cluster.talos_info',
                         1.0, 2.0, 'ok', {'report_facts': dict(talos_facts, talos_services='apid Running, kubelet Waiting',
                                                               talos_services_unhealthy='kubelet', etcd_members=None)})
    # a registered-only listing passes while w-2 is NotReady: its item's `ready` tells, not its `ok`
    listing = {'changed': False, 'gate': 'nodes', 'target': 'nodes', 'passed': True, 'summary': 'nodes registered 2/2',
               'details': [{'name': 'cp-1', 'ok': True, 'ready': True, 'reason': None, 'kubelet_version': 'v1.33.4'},
                           {'name': 'worker-two', 'ok': True, 'ready': False, 'reason': 'NetworkPluginNotReady',
                            'kubelet_version': 'v1.33.4'}]}
    recorder.task_result('cp-1', 'report : Gate - every node registered', ['report'], 'Stage report',
                         'proxtalos.cluster.k8s_gate', 2.0, 3.0, 'ok', listing)
    report = recorder.build('lab')
    jsonschema.validate(report, SCHEMA)
    nodes = dict((node['name'], node) for node in report['facts']['nodes'])
    assert sorted(nodes) == ['cp-1', 'w-2']                 # worker-two is w-2's Kubernetes name
    assert nodes['cp-1']['observed'] == dict(talos_facts, kubernetes_ready=True, kubelet_version='v1.33.4')
    w2 = nodes['w-2']['observed']
    assert (w2['kubernetes_ready'], w2['kubernetes_reason'], w2['talos_services_unhealthy']) == \
        (False, 'NetworkPluginNotReady', 'kubelet')
    assert 'etcd_members' not in w2                          # only plain values are kept
    assert [stage['name'] for stage in report['stages']] == ['report']
    page = _report_html.render(report)
    assert '<td class="failed">apid Running, kubelet Waiting (not healthy: kubelet)</td>' in page
    assert '<td>v1.13.9, running</td>' in page and 'etcd_members=3' in page
    bad = json.loads(json.dumps(report))
    bad['facts']['nodes'][0]['observed']['talos_stage'] = 'sleeping'
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


def test_terminal_summary_counts_ready_nodes_and_names_the_ones_with_a_problem():
    report = {'cluster': 'lab', 'status': 'ok', 'duration': 10.0, 'stages': [], 'gates': [], 'remediations': [],
              'failures': [], 'facts': {'cluster': {}, 'nodes': [
                  {'name': 'cp-1', 'observed': {'kubernetes_ready': True, 'talos_version': 'v1.13.9', 'kubelet_version': 'v1.33.1',
                                                'talos_services_unhealthy': ''}},
                  {'name': 'w-2', 'observed': {'kubernetes_ready': False, 'kubernetes_reason': 'NetworkPluginNotReady',
                                               'talos_version': 'v1.13.9', 'talos_services_unhealthy': 'kubelet'}},
                  {'name': 'w-3', 'observed': {}}]}}
    lines = _timeline.terminal_summary(report, [])
    assert '  nodes: 1/2 Ready; Talos v1.13.9; kubelet v1.33.1' in lines
    assert '    w-2: NotReady (NetworkPluginNotReady); Talos services not healthy: kubelet' in lines
    assert not any(line.startswith('    cp-1') or 'w-3' in line for line in lines)
    report['facts']['nodes'] = [{'name': 'w-3', 'observed': {}}]
    assert not any('nodes:' in line for line in _timeline.terminal_summary(report, []))


def test_a_gates_list_gives_one_record_per_node_or_condition_under_its_own_host():
    recorder = _timeline.Recorder(started=0.0)
    for host in ('cp-1', 'w-1', 'w-2'):
        recorder.set_cluster(host, 'lab')
    result = {'changed': False, 'gates': [
        {'name': 'Talos API on port 50000', 'ok': True, 'host': 'cp-1', 'observation': 'apid answers', 'elapsed': 0.2},
        {'name': 'Talos API on port 50000', 'ok': True, 'host': 'w-1', 'attempts': 3},
        {'name': 'Talos API on port 50000', 'ok': False, 'host': 'w-2', 'observation': 'connection refused'},
        {'name': 'no ok flag: an outcome not said is a failure', 'host': 'w-2'},
        'not a dict: ignored',
    ]}
    recorder.task_result('cp-1', 'Gate - the Talos API answers', ['vms'], 'p', 'proxtalos.cluster.talos_info',
                         1.0, 2.0, 'failed', result)
    gates = recorder.build('lab')['gates']
    assert [(gate['host'], gate['ok']) for gate in gates] == [('cp-1', True), ('w-1', True), ('w-2', False), ('w-2', False)]
    assert gates[3]['name'] == 'no ok flag: an outcome not said is a failure' and gates[3]['observation'] == 'failed'
    assert gates[2]['observation'] == 'connection refused' and gates[1]['attempts'] == 3
    assert all(gate['stage'] == 'vms' and gate['task'] == 'Gate - the Talos API answers' for gate in gates)


def test_a_failed_task_whose_listed_gates_all_passed_fails_them_with_its_message():
    recorder = _timeline.Recorder(started=0.0)
    recorder.set_cluster('cp-1', 'lab')
    result = {'msg': 'the operator never became available', 'gates': [
        {'name': 'ALL nodes Ready', 'ok': True}, {'name': 'Cilium agents', 'ok': True}]}
    recorder.task_result('cp-1', 'Gate - Cilium', ['cni'], 'p', 'proxtalos.cluster.k8s_gate', 1.0, 2.0, 'failed', result)
    gates = recorder.build('lab')['gates']
    assert [(gate['name'], gate['host'], gate['ok']) for gate in gates] == [
        ('ALL nodes Ready', 'cp-1', False), ('Cilium agents', 'cp-1', False)]
    assert gates[0]['observation'] == 'the operator never became available'
    skipped = _timeline.Recorder(started=0.0)
    skipped.set_cluster('cp-1', 'lab')
    skipped.task_result('cp-1', 'Gate - Cilium', ['cni'], 'p', 'x', 1.0, 2.0, 'skipped', result)
    assert skipped.build('lab')['gates'] == []


def test_report_facts_by_host_from_one_run_once_task_reach_each_node():
    recorder = _timeline.Recorder(started=0.0)
    for host in ('cp-1', 'w-1'):
        recorder.set_cluster(host, 'lab')
        recorder.set_node('lab', host, {'node_ip': '10.0.0.%d' % (1 if host == 'cp-1' else 2)})
    recorder.task_result('cp-1', 'Read Talos', ['report'], 'p', 'proxtalos.cluster.talos_info', 1.0, 2.0, 'ok', {
        'report_facts_by_host': {'cp-1': {'talos_version': 'v1.13.9', 'nested': {'dropped': True}},
                                 'w-1': {'talos_stage': 'running'}, 'w-9': 'not a dict'}})
    nodes = dict((node['name'], node) for node in recorder.build('lab')['facts']['nodes'])
    assert nodes['cp-1']['observed'] == {'talos_version': 'v1.13.9'}
    assert nodes['w-1']['observed'] == {'talos_stage': 'running'}


def test_a_listed_gate_spans_its_own_check_inside_the_task():
    recorder = _timeline.Recorder(started=100.0)
    recorder.set_cluster('cp-1', 'lab')
    result = {'gates': [
        {'name': 'ALL nodes registered', 'ok': True, 'started_at': 101.2, 'ended_at': 101.5},
        {'name': 'ALL nodes Ready', 'ok': True, 'started_at': 101.5, 'ended_at': 109.0},
        {'name': 'operator', 'ok': True, 'started_at': 90.0, 'ended_at': 200.0},
        {'name': 'no clock', 'ok': True}]}
    recorder.task_result('cp-1', 'Gate - cni', ['cni'], 'p', 'proxtalos.cluster.k8s_gate', 101.0, 110.0, 'ok', result)
    spans = [(gate['name'], gate['start'], gate['end']) for gate in recorder.build('lab')['gates']]
    assert spans == [('ALL nodes registered', 1.2, 1.5), ('ALL nodes Ready', 1.5, 9.0), ('operator', 1.0, 10.0),
                     ('no clock', 1.0, 10.0)]
    assert all('started_at' not in gate and 'ended_at' not in gate for gate in recorder.build('lab')['gates'])


@pytest.mark.parametrize('task_name, expected', [
    ('cni : Gates - Kubernetes API ready, ALL nodes Ready', 'Kubernetes API ready, ALL nodes Ready'),
    ('bootstrap_apps : Gate - workloads of the release rolled out', 'workloads of the release rolled out'),
])
def test_a_gates_task_that_failed_before_any_gate_ran_is_still_a_failed_gate(task_name, expected):
    recorder = _timeline.Recorder(started=0.0)
    recorder.set_cluster('cp-1', 'lab')
    result = {'msg': 'kubeconfig /x/kubeconfig: no such file', 'gates': [], 'results': []}
    recorder.task_result('cp-1', task_name, ['cni'], 'p', 'proxtalos.cluster.k8s_gate', 1.0, 2.0, 'failed', result)
    gates = recorder.build('lab')['gates']
    assert [(gate['name'], gate['ok'], gate['observation']) for gate in gates] == [
        (expected, False, 'kubeconfig /x/kubeconfig: no such file')]
    # an empty list from a task that is no gate by name adds nothing
    other = _timeline.Recorder(started=0.0)
    other.set_cluster('cp-1', 'lab')
    other.task_result('cp-1', 'Read every node', ['report'], 'p', 'x', 1.0, 2.0, 'ok', {'gates': []})
    assert other.build('lab')['gates'] == []


# Plays of playbooks/site.yml in their order (docs/README.md, "Plays in execution order"), each a task's tags as
# ansible-core gives them (the task's own first, then its play's): the bootstrap stage's gates play runs after the
# kubeconfig, flux (components), sealed_secrets and flux (prepare) plays (ADR 0004, "The play order").
INTERLEAVED_PLAYS = (
    ('bootstrap_etcd', ['bootstrap', 'bootstrap_etcd'], 10.0, 14.0),
    ('kubeconfig_fetch', ['kubeconfig', 'kubeconfig_fetch'], 14.0, 16.0),
    ('flux_components', ['flux_install', 'flux_install', 'flux_components', 'flux'], 16.0, 20.0),
    ('sealed_secrets_key', ['sealed_secrets', 'sealed_secrets_key'], 20.0, 22.0),
    ('flux_prepare', ['flux_install', 'flux_install', 'flux_prepare', 'flux'], 22.0, 23.0),
    ('bootstrap_gates', ['bootstrap', 'bootstrap_gates'], 23.0, 30.0),
)


def _interleaved(plays=INTERLEAVED_PLAYS):
    recorder = _timeline.Recorder(started=0.0)
    recorder.set_cluster('cp-1', 'lab')
    recorder.task_result('cp-1', 'Node addresses', ['always'], 'Node addresses', 'ansible.builtin.add_host', 0.5, 1.0, 'ok', {})
    for part, tags, start, end in plays:
        # two tasks per play, with a moment between them
        middle = (start + end) / 2.0
        recorder.task_result('cp-1', '%s : first' % part, tags, 'Stage %s' % part, 'x', start, middle - 0.5, 'ok', {})
        recorder.task_result('cp-1', '%s : second' % part, tags, 'Stage %s' % part, 'x', middle, end, 'changed', {})
    return recorder


def test_a_stage_whose_plays_are_apart_has_a_part_per_play_with_its_own_span():
    report = _interleaved().build('lab')
    jsonschema.validate(report, SCHEMA)
    stages = dict((stage['name'], stage) for stage in report['stages'])
    assert [stage['name'] for stage in report['stages']] == ['bootstrap', 'kubeconfig', 'flux_install', 'sealed_secrets']
    # the stage still spans its first to its last task; its parts show the two stretches and the gap between them
    assert (stages['bootstrap']['start'], stages['bootstrap']['end']) == (10.0, 30.0)
    assert stages['bootstrap']['parts'] == [
        {'name': 'bootstrap_etcd', 'status': 'ok', 'start': 10.0, 'end': 14.0, 'duration': 4.0},
        {'name': 'bootstrap_gates', 'status': 'ok', 'start': 23.0, 'end': 30.0, 'duration': 7.0}]
    # flux (components) and flux (prepare) are the flux_install stage's (their innermost stage tag), around sealed_secrets
    assert [(part['name'], part['start'], part['end']) for part in stages['flux_install']['parts']] == [
        ('flux_components', 16.0, 20.0), ('flux_prepare', 22.0, 23.0)]
    assert stages['kubeconfig']['parts'] == [
        {'name': 'kubeconfig_fetch', 'status': 'ok', 'start': 14.0, 'end': 16.0, 'duration': 2.0}]


def test_the_summary_and_timeline_md_show_the_parts_of_a_stage_that_has_several_under_it():
    report = _interleaved().build('lab')
    lines = _timeline.terminal_summary(report, [])
    # the name column widens to the longest part shown (bootstrap_gates, 15 characters, indented two)
    assert lines[1:10] == [
        '  stage              start        duration   status',
        '  bootstrap          +0:10        20.0s      ok',
        '    bootstrap_etcd   +0:10        4.0s       ok',
        '    bootstrap_gates  +0:23        7.0s       ok',
        '  kubeconfig         +0:14        2.0s       ok',
        '  flux_install       +0:16        7.0s       ok',
        '    flux_components  +0:16        4.0s       ok',
        '    flux_prepare     +0:22        1.0s       ok',
        '  sealed_secrets     +0:20        2.0s       ok',
    ]
    markdown = _timeline.timeline_markdown(report)
    rows = [line for line in markdown.splitlines() if line.startswith('| ')]
    assert rows == ['| stage | start offset | status |',
                    '| bootstrap | +0:10 | ok |',
                    '| \u21b3 bootstrap_etcd | +0:10 | ok |',
                    '| \u21b3 bootstrap_gates | +0:23 | ok |',
                    '| kubeconfig | +0:14 | ok |',
                    '| flux_install | +0:16 | ok |',
                    '| \u21b3 flux_components | +0:16 | ok |',
                    '| \u21b3 flux_prepare | +0:22 | ok |',
                    '| sealed_secrets | +0:20 | ok |']


def test_the_gantt_chart_draws_each_part_of_a_stage_that_has_several_so_the_gap_shows():
    report = _interleaved().build('lab')
    svg = _report_html.gantt_svg(report)
    # one-part stages keep their one bar; bootstrap and flux_install get a bar per part on their row, a thin line of
    # their whole span, and a named row per part
    assert svg.count('class="stage-bar"') == 2
    assert svg.count('class="stage-span"') == 2
    assert svg.count('class="stage-part-bar"') == 4
    assert svg.count('class="part-bar"') == 4
    label_width, plot = 300, 980 - 300 - 20
    total = report['duration']
    bars = re.findall(r'<rect class="stage-part-bar" x="([0-9.]+)" y="[0-9]+" width="([0-9.]+)"[^>]*><title>([a-z_]+):', svg)
    spans = dict((name, (float(x), float(x) + float(width))) for x, width, name in bars)
    # the bootstrap row's two bars: etcd ends where kubeconfig starts, the gates start at +23 s, with nothing between
    assert spans['bootstrap_etcd'] == pytest.approx((label_width + plot * 10 / total, label_width + plot * 14 / total), abs=0.1)
    assert spans['bootstrap_gates'] == pytest.approx((label_width + plot * 23 / total, label_width + plot * 30 / total), abs=0.1)
    assert '\u21b3 bootstrap_gates</text>' in svg
    page = _report_html.render(report)
    assert '<td>\u21b3 flux_prepare</td><td class="num">+0:22</td>' in page


def test_with_only_the_bootstrap_gates_play_the_stage_shows_that_one_part_and_no_more():
    # --tags bootstrap_gates: the always plays and that play run
    report = _interleaved([play for play in INTERLEAVED_PLAYS if play[0] == 'bootstrap_gates']).build('lab')
    jsonschema.validate(report, SCHEMA)
    assert [(stage['name'], stage['start'], stage['end']) for stage in report['stages']] == [('bootstrap', 23.0, 30.0)]
    assert report['stages'][0]['parts'] == [
        {'name': 'bootstrap_gates', 'status': 'ok', 'start': 23.0, 'end': 30.0, 'duration': 7.0}]
    # a one-part stage looks as a stage did before parts
    lines = _timeline.terminal_summary(report, [])
    assert lines[1:3] == ['  stage            start        duration   status',
                          '  bootstrap        +0:23        7.0s       ok']
    assert [line for line in _timeline.timeline_markdown(report).splitlines() if line.startswith('| ')] == [
        '| stage | start offset | status |', '| bootstrap | +0:23 | ok |']
    svg = _report_html.gantt_svg(report)
    assert svg.count('class="stage-bar"') == 1 and 'part-bar' not in svg and 'stage-span' not in svg


def test_a_part_that_skipped_all_its_tasks_is_no_part_unless_the_whole_stage_skipped():
    recorder = _timeline.Recorder(started=0.0)
    recorder.set_cluster('cp-1', 'lab')
    # the flux stage: its play before the releases skips (the hand-off comes after them), the one after runs and fails
    recorder.task_result('cp-1', 'flux : handoff', ['flux', 'flux_before_apps'], 'p', 'x', 5.0, 5.1, 'skipped', {})
    recorder.task_result('cp-1', 'apps : release', ['apps', 'apps_releases'], 'p', 'x', 6.0, 9.0, 'ok', {})
    recorder.task_result('cp-1', 'flux : source', ['flux', 'flux_after_apps'], 'p', 'x', 10.0, 12.0, 'ok', {})
    recorder.task_result('cp-1', 'flux : gate', ['flux', 'flux_after_apps'], 'p', 'x', 12.0, 13.0, 'failed', {'msg': 'no'})
    # a stage that ran nothing lists its parts, skipped, on their skipped tasks' spans
    recorder.task_result('cp-1', 'gitops : a', ['gitops', 'gitops_gates'], 'p', 'x', 14.0, 14.5, 'skipped', {})
    recorder.task_result('cp-1', 'gitops : b', ['gitops', 'gitops_other'], 'p', 'x', 15.0, 15.5, 'skipped', {})
    # a task of a stage with no sub-stage tag (a playbook of one's own) belongs to no part
    recorder.task_result('cp-1', 'report : read', ['report'], 'p', 'x', 16.0, 17.0, 'ok', {})
    report = recorder.build('lab')
    jsonschema.validate(report, SCHEMA)
    stages = dict((stage['name'], stage) for stage in report['stages'])
    assert stages['flux']['parts'] == [
        {'name': 'flux_after_apps', 'status': 'failed', 'start': 10.0, 'end': 13.0, 'duration': 3.0}]
    assert (stages['flux']['start'], stages['flux']['status']) == (10.0, 'failed')
    assert [(part['name'], part['status'], part['start'], part['end']) for part in stages['gitops']['parts']] == [
        ('gitops_gates', 'skipped', 14.0, 14.5), ('gitops_other', 'skipped', 15.0, 15.5)]
    assert stages['report']['parts'] == []
    lines = _timeline.terminal_summary(report, [])
    assert '    gitops_gates   +0:14        0.5s       skipped' in lines
    assert not any('flux_after_apps' in line or 'flux_before_apps' in line for line in lines)
