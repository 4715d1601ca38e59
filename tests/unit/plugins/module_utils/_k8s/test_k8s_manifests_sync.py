"""manifests_sync: the objects of Talos' Manifest resources in upgrade-k8s' order, each applied as field manager talos
(forced, Talos' inventory annotation) after a dry run that decides its action; check mode applies nothing; a refusal
names the object."""

import copy

import pytest
import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import manifests_sync as sync

OLD, NEW = 'registry.k8s.io/kube-proxy:v1.35.4', 'registry.k8s.io/kube-proxy:v1.36.3'
INVENTORY = {'config.k8s.io/owning-inventory': 'talos-bootstrap-manifests-inventory'}


def daemonset(image):
    return {'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'metadata': {'name': 'kube-proxy', 'namespace': 'kube-system'},
            'spec': {'template': {'spec': {'containers': [{'name': 'kube-proxy', 'image': image}]}}}}


def merged(live, applied):
    out = copy.deepcopy(live)
    for key, value in applied.items():
        out[key] = merged(out.get(key) or {}, value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else copy.deepcopy(value)
    return out


class FakeKube(object):
    """Objects by (kind, namespace, name); an apply answers the live object with the applied fields merged in (and
    the server's metadata moved), stored unless dryRun; `refuse` raises instead."""

    SERVED = {('apps/v1', 'DaemonSet'): ('daemonsets', True), ('v1', 'Namespace'): ('namespaces', False),
              ('v1', 'ConfigMap'): ('configmaps', True), ('storage.k8s.io/v1', 'StorageClass'): ('storageclasses', False),
              ('rbac.authorization.k8s.io/v1', 'ClusterRole'): ('clusterroles', False)}

    def __init__(self, objects=None, refuse=None):
        self.objects = objects or {}
        self.refuse = refuse
        self.patches = []

    def resource(self, api_version, kind):
        return self.SERVED.get((api_version, kind))

    def get(self, api_version, kind, name, namespace=None):
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    def send_json(self, method, path, obj=None, query=None, content_type='application/json'):
        self.patches.append((method, path, copy.deepcopy(obj), dict(query), content_type))
        if self.refuse is not None:
            raise self.refuse
        key = (obj['kind'], obj['metadata'].get('namespace'), obj['metadata']['name'])
        live = self.objects.get(key)
        answer = merged(live or {}, obj)
        answer['metadata']['resourceVersion'] = str(int((live or {}).get('metadata', {}).get('resourceVersion', '0')) + 1)
        answer['metadata']['managedFields'] = [{'manager': 'talos', 'operation': 'Apply'}]
        if 'dryRun' not in query:
            self.objects[key] = copy.deepcopy(answer)
        return answer


def test_the_objects_are_read_by_resource_id_then_in_order():
    resources = [{'id': '11-core-dns', 'yaml_spec': '- {kind: Deployment}\n- {kind: Service}\n'},
                 {'id': '10-kube-proxy', 'yaml_spec': '- {kind: DaemonSet}\n'}, {'id': '99-empty', 'yaml_spec': ''}]
    assert [o['kind'] for o in sync.objects_from_resources(resources, yaml.safe_load)] == ['DaemonSet', 'Deployment', 'Service']
    with pytest.raises(_errors.ApiError, match='Manifest 12-x: its spec is not a list of Kubernetes objects'):
        sync.objects_from_resources([{'id': '12-x', 'yaml_spec': 'kind: Deployment\n'}], yaml.safe_load)


def test_cluster_definitions_then_classes_then_the_rest_each_in_its_order():
    objects = [{'apiVersion': 'v1', 'kind': 'ConfigMap', 'n': 1},
               {'apiVersion': 'storage.k8s.io/v1', 'kind': 'StorageClass', 'n': 2},
               {'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'ClusterRole', 'n': 3},
               {'apiVersion': 'v1', 'kind': 'Namespace', 'n': 4},
               {'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition', 'n': 5},
               {'apiVersion': 'v1', 'kind': 'Secret', 'n': 6}]
    assert [o['n'] for o in sync.staged(objects)] == [3, 4, 5, 2, 1, 6]


def test_prepared_sets_the_inventory_and_the_namespace_and_refuses_a_foreign_inventory():
    body = sync.prepared({'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'a'}}, namespaced=True)
    assert body['metadata'] == {'name': 'a', 'namespace': 'default', 'annotations': INVENTORY}
    body = sync.prepared({'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'x', 'namespace': 'y'}},
                         namespaced=False)
    assert 'namespace' not in body['metadata']
    with pytest.raises(_errors.ApiError, match='ConfigMap kube-system/a already has an inventory annotation'):
        sync.prepared({'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {
            'name': 'a', 'namespace': 'kube-system', 'annotations': {'config.k8s.io/owning-inventory': 'other'}}}, True)


def test_an_upgrade_configures_the_changed_object_once_as_talos_forced_and_a_second_sync_changes_nothing():
    live = sync.prepared(daemonset(OLD), True)
    live['metadata']['resourceVersion'] = '5'
    kube = FakeKube({('DaemonSet', 'kube-system', 'kube-proxy'): live})
    assert sync.sync(kube, [daemonset(NEW)]) == [
        {'kind': 'DaemonSet', 'namespace': 'kube-system', 'name': 'kube-proxy', 'action': 'configured'}]
    path = '/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy'
    assert [(p[0], p[1], p[3], p[4]) for p in kube.patches] == [
        ('PATCH', path, {'fieldManager': 'talos', 'force': 'true', 'dryRun': 'All'}, 'application/apply-patch+yaml'),
        ('PATCH', path, {'fieldManager': 'talos', 'force': 'true'}, 'application/apply-patch+yaml')]
    assert kube.patches[1][2]['metadata']['annotations'] == INVENTORY
    stored = kube.objects[('DaemonSet', 'kube-system', 'kube-proxy')]
    assert stored['spec']['template']['spec']['containers'][0]['image'] == NEW
    kube.patches = []
    assert [e['action'] for e in sync.sync(kube, [daemonset(NEW)])] == ['unchanged']
    assert [p[3].get('dryRun') for p in kube.patches] == ['All']


def test_a_missing_object_is_created_and_check_mode_applies_nothing():
    kube = FakeKube()
    namespace = {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'extra'}}
    assert sync.sync(kube, [daemonset(NEW), namespace], check_mode=True) == [
        {'kind': 'Namespace', 'namespace': '', 'name': 'extra', 'action': 'created'},
        {'kind': 'DaemonSet', 'namespace': 'kube-system', 'name': 'kube-proxy', 'action': 'created'}]
    assert [p[3].get('dryRun') for p in kube.patches] == ['All', 'All'] and kube.objects == {}
    assert [e['action'] for e in sync.sync(kube, [namespace])] == ['created'] and len(kube.objects) == 1


def test_a_refused_apply_names_the_object_and_the_api_reason():
    refusal = _errors.ApiError('Kubernetes API answered 422 for PATCH /apis/apps/v1/...: DaemonSet.apps "kube-proxy" is '
                               'invalid: spec.selector: Required value', service='Kubernetes API', status=422)
    kube = FakeKube(refuse=refusal)
    with pytest.raises(_errors.ApiError) as caught:
        sync.sync(kube, [daemonset(NEW)])
    assert str(caught.value).startswith('DaemonSet kube-system/kube-proxy: the API refused the dry-run apply: ')
    assert 'spec.selector: Required value' in str(caught.value) and caught.value.status == 422
    assert caught.value.details['object'] == 'DaemonSet kube-system/kube-proxy'


def test_a_kind_the_api_does_not_serve_names_the_object():
    widget = {'apiVersion': 'lab.example.com/v1', 'kind': 'Widget', 'metadata': {'name': 'w1', 'namespace': 'default'}}
    with pytest.raises(_errors.ApiError, match='Widget default/w1: the API does not serve kind Widget in lab.example.com/v1'):
        sync.sync(FakeKube(), [widget])
