"""The upstream Flux controllers inside the World (opt-in extension lab.flux_upstream, after lab.k8s_upstream): the
lab's Git server serves lab/gitops over HTTPS from `up`, a cluster's control plane gets source-, kustomize- and
helm-controller once Flux's install manifests are applied and kwok runs their pods, a GitRepository on the lab's
repository becomes Ready at its commit, `lab status` names the controllers with their health, and nothing of them is left when the lab
stops. Select with `-m upstream`."""

import json
import os
import subprocess

import pytest
from proxmoxer import ProxmoxAPI

from lab import ROOT, artifacts
from lab.cli import render_status
from lab.faults import FaultError
from lab.flux_upstream import FLUX_CONTROLLERS
from lab.flux_upstream.lab import LAB_REPO
from lab.testing import free_net, world_in_thread
# tests/lab is on sys.path under pytest (rootdir-less test modules): the same cluster bring-up as the lab.k8s tests
from test_k8s_world import _cluster_up, wait_until  # pylint: disable=import-error

pytestmark = pytest.mark.upstream
KUBECTL = os.path.join(ROOT, '.tools', 'bin', 'kubectl')
# Flux's install manifests for the three controllers the lab runs: the namespace, the RBAC and their components
FLUX_INSTALL_FILES = [str(artifacts.cached_path(entry)) for entry in artifacts.pins()['flux']['files']
                      if os.path.basename(entry['path']) in ('namespace.yaml', 'rbac.yaml') or
                      os.path.basename(entry['path']) in ['%s.yaml' % name for name in FLUX_CONTROLLERS]]
kubernetes = pytest.importorskip('kubernetes')
from kubernetes import client as kube_client  # noqa: E402  pylint: disable=wrong-import-position


def _conditions(obj):
    return {c['type']: c for c in (obj.get('status') or {}).get('conditions') or []}


def check_the_gitops_faults(running, custom, world):
    """The faults lab/flux_upstream/faults.py makes with real objects, judged by the upstream controllers: a Git server
    refusing the repository, and a commit whose kustomization.yaml lists a missing file; each cleared."""
    def repository():
        return custom.get_namespaced_custom_object('source.toolkit.fluxcd.io', 'v1', 'flux-system', 'gitrepositories', 'lab')

    # 503 for the repository: source-controller v1.9.5 internal/controller/gitrepository_controller.go:1066-1072
    running.call(world.faults.apply('flux-source-not-ready', 'flux-system/lab'))
    refused = wait_until(lambda: (_conditions(repository()).get('FetchFailed', {}).get('status') == 'True', _conditions(repository())),
                         'GitRepository flux-system/lab FetchFailed', timeout=60)
    assert refused['FetchFailed']['reason'] == 'GitOperationFailed' and '503' in refused['FetchFailed']['message'], refused
    assert refused['Ready']['status'] == 'False' and refused['Ready']['reason'] == 'GitOperationFailed', refused
    running.call(world.faults.clear('flux-source-not-ready', 'flux-system/lab'))
    wait_until(lambda: ('FetchFailed' not in _conditions(repository()) and _conditions(repository())['Ready']['status'] == 'True',
                        _conditions(repository())), 'GitRepository flux-system/lab fetching again', timeout=60)

    custom.create_namespaced_custom_object('kustomize.toolkit.fluxcd.io', 'v1', 'flux-system', 'kustomizations', {
        'apiVersion': 'kustomize.toolkit.fluxcd.io/v1', 'kind': 'Kustomization', 'metadata': {'name': 'lab-apps', 'namespace': 'flux-system'},
        'spec': {'interval': '10m', 'path': './apps/lab', 'prune': True, 'sourceRef': {'kind': 'GitRepository', 'name': 'lab'}}})

    def applied(reason):
        def probe():
            found = custom.get_namespaced_custom_object('kustomize.toolkit.fluxcd.io', 'v1', 'flux-system', 'kustomizations', 'lab-apps')
            source = (repository().get('status') or {}).get('artifact') or {}
            ready = _conditions(found).get('Ready', {})
            return ready.get('reason') == reason and (reason != 'ReconciliationSucceeded' or
                                                      found['status'].get('lastAppliedRevision') == source.get('revision')), (ready, source)
        return probe
    wait_until(applied('ReconciliationSucceeded'), 'Kustomization lab-apps Ready', timeout=120)
    server_repo = world.flux_upstream.git.repo_dir(LAB_REPO)
    before = subprocess.run(['git', '-C', server_repo, 'rev-parse', 'refs/heads/main'], capture_output=True, text=True, check=True).stdout.strip()
    # a commit pushed to the server whose kustomization.yaml lists missing.yaml: kustomize-controller v1.9.5
    # internal/controller/kustomization_controller.go:437-440 (BuildFailed) with kustomize's error (791)
    running.call(world.faults.apply('flux-build-fail', 'flux-system/lab-apps'))
    pushed = subprocess.run(['git', '-C', server_repo, 'log', '-1', '--format=%P %s', 'refs/heads/main'], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert pushed.startswith(before + ' lab fault flux-build-fail: apps/lab/kustomization.yaml lists missing.yaml'), pushed
    ready = wait_until(applied('BuildFailed'), 'Kustomization lab-apps BuildFailed', timeout=120)[0]
    assert ready['message'].startswith('kustomize build failed:') and "accumulating resources from 'missing.yaml'" in ready['message'], ready
    running.call(world.faults.clear('flux-build-fail', 'flux-system/lab-apps'))
    wait_until(applied('ReconciliationSucceeded'), 'Kustomization lab-apps Ready again after the revert', timeout=120)
    reverted = subprocess.run(['git', '-C', server_repo, 'diff', '--stat', before, 'refs/heads/main'], capture_output=True, text=True,
                              check=True).stdout.strip()
    assert reverted == '', reverted  # the revert brings the tree back
    with pytest.raises(FaultError, match='no cluster of the lab has Kustomization flux-system/nowhere'):
        running.call(world.faults.apply('flux-build-fail', 'flux-system/nowhere'))


def test_a_cluster_gets_the_flux_controllers_and_fetches_the_labs_repository(tmp_path):
    extensions = ('lab.talos', 'lab.k8s_upstream', 'lab.flux_upstream')
    with world_in_thread(tmp_path / 'run', free_net(), extensions=extensions, profile='instant') as running:
        world = running.world
        git = running.call(world.status())['flux_upstream']['git']
        with open(git['password_file'], encoding='utf-8') as handle:
            password = handle.read().strip()
        assert os.stat(git['password_file']).st_mode & 0o777 == 0o600
        commit = subprocess.run(['git', '-C', world.flux_upstream.git.repo_dir(LAB_REPO), 'rev-parse', 'refs/heads/main'],
                                capture_output=True, text=True, check=True).stdout.strip()
        api = ProxmoxAPI(world.net.pve_host, user='proxtalos@pve', token_name='proxtalos', token_value=world.token_secret,
                         verify_ssl=world.ca_path)
        core = _cluster_up(running, api, tmp_path)[0]
        # a Node is Ready only once a CNI agent runs on it (kubelet's NetworkPluginNotReady until then: docs/lab-kubernetes.md),
        # and nothing but kube-system's host-network pods schedules on a NotReady Node; the cni stage installs Cilium, this
        # test stands in a DaemonSet with Cilium's agent label for it
        kube_client.AppsV1Api(core.api_client).create_namespaced_daemon_set('kube-system', {
            'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'metadata': {'name': 'cilium', 'namespace': 'kube-system'},
            'spec': {'selector': {'matchLabels': {'k8s-app': 'cilium'}},
                     'template': {'metadata': {'labels': {'k8s-app': 'cilium'}},
                                  'spec': {'hostNetwork': True, 'tolerations': [{'operator': 'Exists'}],
                                           'containers': [{'name': 'cilium-agent', 'image': 'quay.io/cilium/cilium:v1.18.2'}]}}}})

        def nodes_ready():
            seen = dict((node.metadata.name, [c.status for c in node.status.conditions or [] if c.type == 'Ready'])
                        for node in core.list_node().items)
            return bool(seen) and all(value == ['True'] for value in seen.values()), seen
        wait_until(nodes_ready, 'every Node Ready once its CNI agent runs', timeout=120)
        # the lab runs Flux's controllers once someone installs them: here, as the collection's flux stage does, Flux's
        # pinned install manifests (the lab's artifact cache, the bytes the collection downloads), applied server-side
        # by kubectl; objects without a namespace go to flux-system (roles/flux/vars/artifacts.yml)
        for path in FLUX_INSTALL_FILES:
            subprocess.run([KUBECTL, '--kubeconfig', str(tmp_path / 'kubeconfig-401'), 'apply', '--server-side',
                            '--field-manager', 'lab-test', '-n', 'flux-system', '-f', path],
                           capture_output=True, text=True, check=True, timeout=120)

        def running_controllers():
            clusters = running.call(world.status())['flux_upstream']['clusters']
            names = [entry['name'] for cluster in clusters.values() for entry in cluster if entry['running'] and entry['healthy']]
            return sorted(names) == sorted(FLUX_CONTROLLERS), clusters
        clusters = wait_until(running_controllers, 'the Flux controllers of the cluster running and healthy', timeout=180)
        pids = [entry['pid'] for cluster in clusters.values() for entry in cluster]
        # `python -m lab status` shows each controller on a row of its own: name, pid, running, healthy, what its
        # readiness endpoint said
        rows = [line.split() for line in render_status(json.loads(json.dumps(running.call(world.status()), default=str))).splitlines()]
        for entry in (entry for cluster in clusters.values() for entry in cluster):
            assert [entry['name'], str(entry['pid']), 'True', 'True', 'HTTP', '200'] in [row[:6] for row in rows], rows

        with open(git['ca_file'], encoding='utf-8') as handle:
            ca_pem = handle.read()
        core.create_namespaced_secret('flux-system', kube_client.V1Secret(
            metadata=kube_client.V1ObjectMeta(name='lab-git'),
            string_data={'username': git['user'], 'password': password, 'ca.crt': ca_pem}))
        custom = kube_client.CustomObjectsApi(core.api_client)
        custom.create_namespaced_custom_object('source.toolkit.fluxcd.io', 'v1', 'flux-system', 'gitrepositories', {
            'apiVersion': 'source.toolkit.fluxcd.io/v1', 'kind': 'GitRepository',
            'metadata': {'name': 'lab', 'namespace': 'flux-system'},
            'spec': {'url': git['url'], 'ref': {'branch': 'main'}, 'interval': '1m', 'secretRef': {'name': 'lab-git'}}})

        def fetched():
            found = custom.get_namespaced_custom_object('source.toolkit.fluxcd.io', 'v1', 'flux-system', 'gitrepositories', 'lab')
            status = found.get('status') or {}
            ready = {c['type']: c for c in status.get('conditions') or []}.get('Ready', {})
            artifact = status.get('artifact') or {}
            # Ready and the artifact: Flux's patch helper writes the conditions before the rest of the status
            # (github.com/fluxcd/pkg/runtime v0.110.3 patch/patch.go:223-235), so Ready=True can be read without it
            return ready.get('status') == 'True' and bool(artifact), (ready, artifact)
        ready, artifact = wait_until(fetched, 'GitRepository flux-system/lab Ready with its artifact', timeout=120)
        assert artifact['revision'] == 'main@sha1:' + commit, (ready, artifact)
        check_the_gitops_faults(running, custom, world)

        # the lab follows each controller's pods (lab.py _follow_pods): helm-controller's pod deleted, the ReplicaSet's
        # new one running (kwok), a new process plays it and the old one is gone
        def entries():
            clusters = running.call(world.status())['flux_upstream']['clusters']
            return {entry['name']: entry for cluster in clusters.values() for entry in cluster}
        old = entries()['helm-controller']
        namespace, pod = old['pod'].split('/')
        core.delete_namespaced_pod(pod, namespace)

        def restarted():
            new = entries()['helm-controller']
            return new['pod'] not in (None, old['pod']) and new['running'] and new['healthy'], new
        new = wait_until(restarted, 'helm-controller running again, on the new pod', timeout=120)
        assert new['pid'] != old['pid']
        with pytest.raises(ProcessLookupError):
            os.kill(old['pid'], 0)
        pids.append(new['pid'])
        apps = kube_client.AppsV1Api(core.api_client)
        wait_until(lambda: (all((apps.read_namespaced_deployment(name, 'flux-system').status.available_replicas or 0) == 1
                                for name in FLUX_CONTROLLERS), None), 'the Flux Deployments available through kwok', timeout=120)
    # the lab stopped: no controller is left running
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
