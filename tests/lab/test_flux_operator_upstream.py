"""flux-operator, the pinned upstream build (upstream/flux-operator.json), against the lab's upstream control plane: its
install manifests (the pinned files of roles/flux/vars/artifacts.yml, flux_operator) applied, the operator run as the
lab runs it (lab/flux_upstream/controllers.py, operator=True), then a FluxInstance. The judges are flux-operator and
kube-apiserver: the operator builds Flux from the distribution manifests of its own module (config/data, the image's
/data) and reports the FluxInstance Ready once kwok runs the pods of the Deployments it applied; Flux's controllers then
start from those Deployments. Select with `-m upstream`."""

import os

import pytest

from lab import artifacts, upstream
from lab.flux_upstream import controllers as flux
from lab.k8s_upstream import ControlPlane
from lab.testing import Lab

pytestmark = pytest.mark.upstream

WAIT = 180.0
COMPONENTS = ['source-controller', 'kustomize-controller', 'helm-controller', 'notification-controller']


def _operator_objects():
    """The pinned flux-operator install files, each namespaced object in flux-system (as the install's kustomization
    config/default sets namespace: flux-system)."""
    entries = artifacts.pins()['flux_operator']['files']
    objects = []
    for entry in entries:
        path = artifacts.cached_path(entry)
        if not path.is_file():
            pytest.skip('%s is not in the artifact cache (make setup)' % path)
        for doc in flux.read_documents(str(path)):
            kind = doc.get('kind')
            if kind in flux.RESOURCES and flux.RESOURCES[kind][2]:
                doc['metadata']['namespace'] = flux.FLUX_NAMESPACE
            objects.append(doc)
    return objects


@pytest.fixture(scope='module')
def operator_world(tmp_path_factory):
    """(control plane, the running flux-operator)."""
    try:
        upstream.binary(flux.FLUX_OPERATOR)
    except upstream.MissingBinary as exc:
        pytest.skip(str(exc))
    base = tmp_path_factory.mktemp('flux-operator')
    plane = ControlPlane(str(base / 'controlplane'))
    plane.start()
    operator = None
    try:
        plane.register_node('worker-1', addresses=['127.0.0.21'])
        objects = _operator_objects()
        for obj in sorted(objects, key=lambda o: o['kind'] not in ('Namespace', 'CustomResourceDefinition')):
            flux.apply(plane, obj)

        def available():
            found = flux.get(plane, 'Deployment', flux.FLUX_OPERATOR, flux.FLUX_NAMESPACE) or {}
            replicas = (found.get('status') or {}).get('availableReplicas') or 0
            return replicas > 0, found.get('status')
        Lab.wait_until(available, WAIT, what='Deployment flux-system/flux-operator available (kwok)')
        operator = flux.FluxControllers(plane, str(base / 'operator'), controllers=(), sealed_secrets=False,
                                        installed=True, operator=True).start()
        yield plane, operator
    finally:
        if operator is not None:
            operator.stop()
        plane.stop()


def test_a_fluxinstance_is_made_ready_from_the_modules_own_distribution_manifests(operator_world, tmp_path):
    plane, operator = operator_world
    assert [entry['name'] for entry in operator.status() if entry['running'] and entry['healthy']] == [flux.FLUX_OPERATOR]
    flux.apply(plane, {'apiVersion': 'fluxcd.controlplane.io/v1', 'kind': 'FluxInstance',
                       'metadata': {'name': 'flux', 'namespace': flux.FLUX_NAMESPACE},
                       'spec': {'distribution': {'version': '2.9.x', 'registry': 'ghcr.io/fluxcd'},
                                'components': COMPONENTS, 'cluster': {'type': 'kubernetes'}}})

    def ready():
        found = flux.get(plane, 'FluxInstance', 'flux', flux.FLUX_NAMESPACE) or {}
        condition = flux.conditions(found).get('Ready', {})
        return condition.get('status') == 'True', {k: condition.get(k) for k in ('status', 'reason', 'message')}
    Lab.wait_until(ready, WAIT, what='FluxInstance flux-system/flux Ready')

    instance = flux.get(plane, 'FluxInstance', 'flux', flux.FLUX_NAMESPACE)
    assert instance['status']['lastAppliedRevision'].startswith('v2.9.')
    assert sorted(c['name'] for c in instance['status']['components']) == sorted(COMPONENTS)
    # the Deployments are the operator's (its field manager), with the images of its flux-images data for that version
    version = instance['status']['lastAppliedRevision'].split('@')[0]  # v2.9.5@sha256:<digest of the build>
    for name in COMPONENTS:
        deployment = flux.get(plane, 'Deployment', name, flux.FLUX_NAMESPACE)
        managers = {entry['manager'] for entry in deployment['metadata']['managedFields']}
        assert flux.FLUX_OPERATOR in managers, (name, managers)
        image = deployment['spec']['template']['spec']['containers'][0]['image']
        assert image.startswith('ghcr.io/fluxcd/%s:' % name), image
    with open(os.path.join(upstream.module_dir(flux.FLUX_OPERATOR), 'config', 'data', 'flux-images', version,
                           'upstream-alpine.yaml'), encoding='utf-8') as handle:
        pinned = handle.read()
    source_image = flux.get(plane, 'Deployment', 'source-controller', flux.FLUX_NAMESPACE)['spec']['template']['spec']['containers'][0]['image']
    assert source_image.split('@')[-1] in pinned, source_image

    # Flux's controllers run from the Deployments the operator applied, and reconcile what they own
    controllers = flux.FluxControllers(plane, str(tmp_path / 'flux'), sealed_secrets=False, installed=True).start()
    try:
        assert {entry['name'] for entry in controllers.status() if entry['healthy']} == set(flux.FLUX_CONTROLLERS)
    finally:
        controllers.stop()


def test_a_new_pod_of_flux_operator_starts_its_process_again(operator_world):
    """What the kubelet does when the ReplicaSet replaces a deleted pod: the new pod's container starts anew. The
    process plays the pod of its Deployment (followed, with no ports on the pod network); once the pod is gone and kwok
    runs the new one, sync (what the lab's follower calls at each poll) starts the process again, healthy, playing the
    new pod."""
    plane, operator = operator_world
    namespace, old_pod = operator.pods[flux.FLUX_OPERATOR]
    old_pid = operator.processes[flux.FLUX_OPERATOR].popen.pid
    assert flux.FLUX_OPERATOR not in operator.pod_ips
    assert operator.sync(flux.FLUX_OPERATOR) is None
    plane.api('DELETE', '/api/v1/namespaces/%s/pods/%s' % (namespace, old_pod))

    def restarted():
        did = operator.sync(flux.FLUX_OPERATOR)
        return operator.pods.get(flux.FLUX_OPERATOR, (None, old_pod))[1] != old_pod, did
    Lab.wait_until(restarted, WAIT, what='the process playing the new pod')
    assert operator.pods[flux.FLUX_OPERATOR][1] != old_pod
    process = operator.processes[flux.FLUX_OPERATOR]
    assert process.running and process.popen.pid != old_pid
    assert [entry['name'] for entry in operator.status() if entry['running'] and entry['healthy']] == [flux.FLUX_OPERATOR]
