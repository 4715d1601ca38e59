"""_talos/health.py: dry-run outcome, boot marker, service and etcd judgements on fixtures."""
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import health

DRY_NO_CHANGES = 'Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\n\nConfig diff:\n\nNo changes.'
# v1alpha1_server.go:279-281 (siderolabs/talos v1.13.9): modeDetails without CanApplyImmediate's error
DRY_CHANGES = ('Dry run summary:\nApplied configuration with a reboot (skipped in dry-run).\nConfig diff:\n\n'
               '--- a\n+++ b\n@@ -1 +1 @@\n-x: 1\n+x: 2')
DRY_112_MAINTENANCE = 'Dry run summary:\nNode is running in maintenance mode and does not have a config yet.'


def test_dry_run_outcome():
    assert health.dry_run_outcome(DRY_NO_CHANGES) == (True, 'Applied configuration without a reboot (skipped in dry-run).',
                                                      'No changes.')
    unchanged, summary, diff = health.dry_run_outcome(DRY_CHANGES)
    assert unchanged is False and summary.startswith('Applied configuration with a reboot') and diff.endswith('+x: 2')
    assert health.dry_run_outcome(DRY_112_MAINTENANCE)[0] is False
    assert health.dry_run_outcome('')[0] is False
    # "No changes." inside a diff is not "no changes".
    assert health.dry_run_outcome(DRY_CHANGES + '\n+note: No changes.')[0] is False


def svc(service_id, state='Running', healthy=True, first_ts='t1', last='ok'):
    return {'id': service_id, 'state': state, 'health': {'healthy': healthy, 'last_message': '' if healthy else 'down'},
            'events': [{'state': 'Starting', 'msg': 'start', 'ts': first_ts}, {'state': state, 'msg': last, 'ts': 't9'}]}


def test_boot_marker_follows_machined():
    assert health.boot_marker([svc('apid', first_ts='a'), svc('machined', first_ts='m')]) == 'machined@m'
    assert health.boot_marker([svc('apid', first_ts='a')]) == 'apid@a'
    assert health.boot_marker([svc('kubelet', first_ts='k2'), svc('udevd', first_ts='k1')]) == 'first-event@k1'
    assert health.boot_marker([]) is None


def test_boot_marker_skips_a_service_whose_64_event_buffer_is_full():
    # audit finding 18: Talos keeps 64 events per service (events.go:18); a full buffer's first event moves
    busy = {'id': 'machined', 'events': [{'msg': 'x', 'state': 'Running', 'ts': 'm%03d' % index} for index in range(64)]}
    assert health.boot_marker([busy, svc('apid', first_ts='a')]) == 'apid@a'
    assert health.boot_marker([busy]) is None


def test_service_problems_name_state_and_last_event():
    services = [svc('apid'), svc('kubelet', state='Waiting', healthy=False, last='Waiting for volume "/var/lib/kubelet"'),
                svc('etcd', healthy=False, last='Started')]
    problems = health.service_problems(services, ['apid', 'kubelet', 'etcd', 'trustd'])
    assert [p['service'] for p in problems] == ['kubelet', 'etcd', 'trustd']
    texts = [health.describe_service_problem(p) for p in problems]
    assert texts[0] == 'kubelet is Waiting (last event: Waiting: Waiting for volume "/var/lib/kubelet")'
    assert texts[1] == 'etcd is Running but not healthy (down) (last event: Running: Started)'
    assert texts[2].startswith('trustd is missing')
    assert health.service_problems(services, ['apid']) == []


def member(index, learner=False, host=None):
    return {'id': index, 'hostname': 'cp-%d' % index, 'peer_urls': ['https://%s:2380' % (host or '10.0.0.%d' % index)],
            'client_urls': [], 'is_learner': learner}


def test_etcd_problems():
    cps = ['10.0.0.1', '10.0.0.2']
    good = {'etcd_service': svc('etcd'), 'members': [member(1), member(2)]}
    assert health.etcd_problems({'10.0.0.1': good, '10.0.0.2': good}, cps) == []
    partial = {'etcd_service': svc('etcd', state='Preparing', healthy=False), 'members': None}
    problems = health.etcd_problems({'10.0.0.1': good, '10.0.0.2': partial}, cps)
    assert '10.0.0.2: etcd is Preparing' in problems[0] and problems[1] == '10.0.0.2: no etcd member list yet'
    learner = {'etcd_service': svc('etcd'), 'members': [member(1), member(2, learner=True)]}
    assert any('learners not yet promoted: cp-2' in p for p in health.etcd_problems({'10.0.0.1': learner, '10.0.0.2': good}, cps))
    stranger = {'etcd_service': svc('etcd'), 'members': [member(1), member(3, host='10.9.9.9')]}
    problems = health.etcd_problems({'10.0.0.1': stranger, '10.0.0.2': good}, cps)
    assert any('outside the control planes: 10.9.9.9' in p for p in problems)
    assert any('disagree' in p for p in problems)
    assert health.etcd_problems({'10.0.0.1': {'error': 'unreachable'}, '10.0.0.2': good}, cps)[0] == '10.0.0.1: unreachable'
