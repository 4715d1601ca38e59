"""The report stage of site.yml against a converged 3+3 lab (the session's `converged_cluster`, tests/integration/conftest.py).

The full run ends with the report stage: the run report then shows, per node, what the cluster itself says - the
Talos version, machine stage and services (talos_info's report_facts), the etcd members of each control plane, and the
Kubernetes node's Ready state and versions (the nodes listing). The stage changes nothing, and `--tags report` works
alone and in check mode, changed=0.
"""
import json
import os
import sys

import jsonschema
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_lab import ROOT, stages  # noqa: E402  pylint: disable=wrong-import-position,import-error

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SCHEMA = os.path.join(ROOT, 'docs', 'report.schema.json')


def load_report(folder):
    with open(os.path.join(folder, 'report.json'), encoding='utf-8') as stream:
        report = json.load(stream)
    with open(SCHEMA, encoding='utf-8') as stream:
        jsonschema.Draft202012Validator(json.load(stream)).validate(report)
    return report


def assert_node_facts(report, control_planes):
    nodes = dict((node['name'], node['observed']) for node in report['facts']['nodes'])
    assert sorted(nodes) == ['lab-cp-1', 'lab-cp-2', 'lab-cp-3', 'lab-w-1', 'lab-w-2', 'lab-w-3']
    for name, observed in nodes.items():
        assert observed['talos_mode'] == 'configured' and observed['talos_stage'] == 'running', (name, observed)
        assert observed['talos_version'].startswith('v1.'), (name, observed)
        services = observed['talos_services'].split(', ')
        assert 'kubelet Running' in services and 'apid Running' in services, (name, observed)
        assert observed['talos_services_unhealthy'] == '', (name, observed)
        assert observed['kubernetes_ready'] is True and 'kubernetes_reason' not in observed, (name, observed)
        assert observed['kubelet_version'].startswith('v1.') and observed['os_image'], (name, observed)
        if name in control_planes:
            assert observed['etcd_members'] == len(control_planes) and 'etcd Running' in services, (name, observed)
        else:
            assert 'etcd_members' not in observed, (name, observed)


def test_report_is_the_last_stage_of_site_yml():
    assert stages()[-1] == 'report'


def test_the_full_run_reports_every_node_as_the_cluster_sees_it(converged_cluster):
    run = converged_cluster.first
    assert run.rc == 0, run.stdout[-3000:]
    report = load_report(converged_cluster.first_report)
    assert report['stages'][-1]['name'] == 'report' and report['stages'][-1]['status'] == 'ok'
    assert report['stages'][-1]['results']['changed'] == 0
    assert_node_facts(report, ['lab-cp-1', 'lab-cp-2', 'lab-cp-3'])


@pytest.mark.parametrize('mode', [(), ('--check',)], ids=['run', 'check'])
def test_the_report_stage_alone_reads_and_changes_nothing(converged_cluster, mode):
    run = converged_cluster.run('--tags', 'report', *mode, label='report-alone' + ''.join(mode))
    assert run.ok, run.explain()
    # every play starts; outside the report stage only the addresses play and the roles' argument checks ran
    assert [(stage, task) for stage, task, _host, _result, _event in run.results()
            if stage not in ('always', 'report') and 'Validating arguments' not in task] == []
    assert run.changed() == []
    # one talos_info run reads every node (run_once): one result, with every node's facts in report_facts_by_host
    talos = [result for _stage, task, _host, result, _event in run.results('report', task='Talos version')]
    nodes = [host for _stage, task, host, _result, _event in run.results('report', task='registered in Kubernetes')]
    assert len(talos) == 1 and len(nodes) == 1
    assert sorted(talos[0]['report_facts_by_host']) == ['lab-cp-1', 'lab-cp-2', 'lab-cp-3', 'lab-w-1', 'lab-w-2', 'lab-w-3']
    assert talos[0]['failed_nodes'] == {} and talos[0]['gates'] == []
    assert [host for _stage, task, host, _result, event in run.results('report', task='did not answer the read')
            if event != 'v2_runner_on_skipped'] == []
    report = load_report(converged_cluster.artifacts)
    assert report['check_mode'] is bool(mode)
    assert [stage['name'] for stage in report['stages']] == ['report']
    assert_node_facts(report, ['lab-cp-1', 'lab-cp-2', 'lab-cp-3'])


def test_a_node_that_does_not_answer_fails_its_own_host_and_the_others_are_reported(converged_cluster):
    lab = converged_cluster.lab
    address = next(row['address'] for row in lab.vms() if row['name'] == 'lab-w-2')
    lab.fault('talos-unreachable', 'lab-w-2')
    try:
        run = converged_cluster.run('--tags', 'report', label='report-unreachable',
                                    extra_vars={'report_wait_timeout': 2, 'report_call_timeout': 1, 'report_wait_sleep': 0.5})
    finally:
        lab.clear('talos-unreachable', 'lab-w-2')
    assert not run.ok
    failures = [(host, message) for stage, _task, host, message in run.failures() if stage == 'report']
    assert len(failures) == 1 and failures[0][0] == 'lab-w-2', run.explain()
    assert failures[0][1].startswith('lab-w-2 (%s:50000): gave up after 2s waiting for the Talos API answering on port '
                                     '50000' % address), failures[0][1]
    # the other nodes were read, and the Kubernetes nodes listing still ran on a host that did not fail
    talos = [result for _stage, _task, _host, result, _event in run.results('report', task='Talos version')]
    assert sorted(talos[0]['report_facts_by_host']) == ['lab-cp-1', 'lab-cp-2', 'lab-cp-3', 'lab-w-1', 'lab-w-3']
    assert [event for _stage, _task, _host, _result, event in run.results('report', task='registered in Kubernetes')] == [
        'v2_runner_on_ok']
    observed = dict((node['name'], node.get('observed') or {}) for node in load_report(converged_cluster.artifacts)['facts']['nodes'])
    assert observed['lab-w-1']['talos_stage'] == 'running' and 'talos_mode' not in observed['lab-w-2']
