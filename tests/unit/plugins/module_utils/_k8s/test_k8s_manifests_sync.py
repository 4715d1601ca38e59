"""manifests_sync: the objects a config's images govern, the fields of manager talos as an applied configuration,
the dry run deciding changed, check mode applying nothing, a refusal naming the object."""

import copy
import json

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import manifests_sync as sync

OLD, NEW = 'registry.k8s.io/kube-proxy:v1.35.4', 'registry.k8s.io/kube-proxy:v1.36.3'
# what manager talos owns in a kube-proxy DaemonSet it created (FieldsV1), and a field of another manager
TALOS_FIELDS = {
    'f:metadata': {'f:labels': {'f:k8s-app': {}}, 'f:annotations': {'f:config.k8s.io/owning-inventory': {}}},
    'f:spec': {'f:selector': {}, 'f:template': {'f:metadata': {'f:labels': {'f:k8s-app': {}}}, 'f:spec': {
        'f:hostNetwork': {}, 'f:tolerations': {}, 'f:containers': {'k:{"name":"kube-proxy"}': {
            '.': {}, 'f:name': {}, 'f:image': {}, 'f:command': {}}}}}}}


def daemonset(image=OLD, managers=True):
    obj = {'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
           'metadata': {'name': 'kube-proxy', 'namespace': 'kube-system', 'uid': 'u1', 'resourceVersion': '7',
                        'generation': 1, 'labels': {'k8s-app': 'kube-proxy', 'owner': 'someone'},
                        'annotations': {'config.k8s.io/owning-inventory': 'talos-bootstrap-manifests-inventory'}},
           'spec': {'selector': {'matchLabels': {'k8s-app': 'kube-proxy'}}, 'revisionHistoryLimit': 10,
                    'template': {'metadata': {'labels': {'k8s-app': 'kube-proxy'}},
                                 'spec': {'hostNetwork': True, 'tolerations': [{'operator': 'Exists'}],
                                          'containers': [{'name': 'kube-proxy', 'image': image,
                                                          'command': ['/usr/local/bin/kube-proxy'],
                                                          'terminationMessagePath': '/dev/termination-log'}]}}},
           'status': {'numberAvailable': 3}}
    if managers:
        obj['metadata']['managedFields'] = [
            {'manager': 'talos', 'operation': 'Apply', 'apiVersion': 'apps/v1', 'fieldsType': 'FieldsV1',
             'fieldsV1': TALOS_FIELDS},
            {'manager': 'kubectl-label', 'operation': 'Update', 'apiVersion': 'apps/v1', 'fieldsType': 'FieldsV1',
             'fieldsV1': {'f:metadata': {'f:labels': {'f:owner': {}}}}}]
    return obj


class FakeKube(object):
    """get() the live objects; a PATCH answers with the live object whose kube-proxy image is the applied one (what
    an apiserver's apply of talos' own fields with a new image gives), or with `refuse` (an ApiError)."""

    def __init__(self, objects, refuse=None):
        self.objects = objects
        self.refuse = refuse
        self.patches = []

    def resource(self, api_version, kind):
        return {('apps/v1', 'DaemonSet'): ('daemonsets', True), ('apps/v1', 'Deployment'): ('deployments', True)}.get(
            (api_version, kind))

    def get(self, api_version, kind, name, namespace=None):
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    def send_json(self, method, path, obj=None, query=None, content_type='application/json'):
        self.patches.append((method, path, copy.deepcopy(obj), dict(query), content_type))
        if self.refuse is not None:
            raise self.refuse
        key = (obj['kind'], obj['metadata']['namespace'], obj['metadata']['name'])
        answer = copy.deepcopy(self.objects[key])
        image = obj['spec']['template']['spec']['containers'][0]['image']
        answer['spec']['template']['spec']['containers'][0]['image'] = image
        if image != self.objects[key]['spec']['template']['spec']['containers'][0]['image']:
            answer['metadata']['generation'] += 1
            answer['metadata']['resourceVersion'] = '8'
        if 'dryRun' not in query:
            self.objects[key] = copy.deepcopy(answer)
        return answer


def config(proxy=None, coredns=None):
    cluster = {'controlPlane': {'endpoint': 'https://10.0.0.10:6443'}}
    if proxy is not None:
        cluster['proxy'] = proxy
    if coredns is not None:
        cluster['coreDNS'] = coredns
    return [{'version': 'v1alpha1', 'machine': {'type': 'controlplane'}, 'cluster': cluster},
            {'apiVersion': 'v1alpha1', 'kind': 'HostnameConfig', 'hostname': 'cp-1'}]


def test_the_targets_are_the_parts_the_config_names_an_image_for():
    targets = sync.targets(config(proxy={'image': NEW}, coredns={'image': 'registry.k8s.io/coredns/coredns:v1.14.6'}))
    assert [(t.label, t.container, t.image, t.setting) for t in targets] == [
        ('DaemonSet kube-system/kube-proxy', 'kube-proxy', NEW, 'cluster.proxy.image'),
        ('Deployment kube-system/coredns', 'coredns', 'registry.k8s.io/coredns/coredns:v1.14.6', 'cluster.coreDNS.image')]
    assert sync.targets(config(proxy={'disabled': True, 'image': NEW})) == []
    assert sync.targets(config()) == []   # CoreDNS' default image follows the Talos release: not synced
    with pytest.raises(_errors.ValidationError, match='not a control plane config'):
        sync.targets([{'apiVersion': 'v1alpha1', 'kind': 'HostnameConfig'}])


def test_the_applied_configuration_is_talos_own_fields_with_the_new_image():
    target = sync.targets(config(proxy={'image': NEW}))[0]
    body = sync.applied_configuration(daemonset(), target)
    assert body == {
        'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
        'metadata': {'name': 'kube-proxy', 'namespace': 'kube-system', 'labels': {'k8s-app': 'kube-proxy'},
                     'annotations': {'config.k8s.io/owning-inventory': 'talos-bootstrap-manifests-inventory'}},
        'spec': {'selector': {'matchLabels': {'k8s-app': 'kube-proxy'}},
                 'template': {'metadata': {'labels': {'k8s-app': 'kube-proxy'}},
                              'spec': {'hostNetwork': True, 'tolerations': [{'operator': 'Exists'}],
                                       'containers': [{'name': 'kube-proxy', 'image': NEW,
                                                       'command': ['/usr/local/bin/kube-proxy']}]}}}}
    # the other manager's label, the defaulted fields and the status are not part of it
    assert 'owner' not in json.dumps(body) and 'revisionHistoryLimit' not in json.dumps(body)


def test_extract_reads_sets_and_indexes():
    assert sync.extract({'finalizers': ['a', 'b']}, {'f:finalizers': {'v:"b"': {}}}) == {'finalizers': ['b']}
    assert sync.extract({'args': ['x', 'y']}, {'f:args': {'i:1': {}}}) == {'args': ['y']}
    assert sync.extract({'ports': [{'containerPort': 53, 'protocol': 'UDP', 'name': 'dns'}]},
                        {'f:ports': {'k:{"containerPort":53,"protocol":"UDP"}': {'f:name': {}}}}) == \
        {'ports': [{'name': 'dns', 'containerPort': 53, 'protocol': 'UDP'}]}


def test_an_upgrade_applies_once_as_talos_forced_and_a_second_sync_changes_nothing():
    kube = FakeKube({('DaemonSet', 'kube-system', 'kube-proxy'): daemonset()})
    targets = sync.targets(config(proxy={'image': NEW}))
    first = sync.sync(kube, targets)
    assert [(e['action'], e['image_before'], e['image']) for e in first] == [('configured', OLD, NEW)]
    assert [(p[0], p[1], p[3], p[4]) for p in kube.patches] == [
        ('PATCH', '/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy',
         {'fieldManager': 'talos', 'force': 'true', 'dryRun': 'All'}, 'application/apply-patch+yaml'),
        ('PATCH', '/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy',
         {'fieldManager': 'talos', 'force': 'true'}, 'application/apply-patch+yaml')]
    assert kube.objects[('DaemonSet', 'kube-system', 'kube-proxy')]['spec']['template']['spec']['containers'][0]['image'] == NEW
    kube.patches = []
    again = sync.sync(kube, targets)
    assert [e['action'] for e in again] == ['unchanged'] and len(kube.patches) == 1 and 'dryRun' in kube.patches[0][3]


def test_check_mode_predicts_and_applies_nothing():
    kube = FakeKube({('DaemonSet', 'kube-system', 'kube-proxy'): daemonset()})
    result = sync.sync(kube, sync.targets(config(proxy={'image': NEW})), check_mode=True)
    assert [e['action'] for e in result] == ['configured']
    assert [p[3].get('dryRun') for p in kube.patches] == ['All']
    assert kube.objects[('DaemonSet', 'kube-system', 'kube-proxy')]['spec']['template']['spec']['containers'][0]['image'] == OLD


def test_a_missing_object_is_reported_not_created():
    kube = FakeKube({})
    assert [e['action'] for e in sync.sync(kube, sync.targets(config(proxy={'image': NEW})))] == ['missing']
    assert kube.patches == []


def test_a_refused_apply_names_the_object_and_the_api_reason():
    refusal = _errors.ApiError('Kubernetes API answered 422 for PATCH /apis/apps/v1/...: DaemonSet.apps "kube-proxy" is '
                               'invalid: spec.template.spec.containers[0].image: Required value', service='Kubernetes API',
                               status=422)
    kube = FakeKube({('DaemonSet', 'kube-system', 'kube-proxy'): daemonset()}, refuse=refusal)
    with pytest.raises(_errors.ApiError) as caught:
        sync.sync(kube, sync.targets(config(proxy={'image': NEW})))
    assert str(caught.value).startswith('DaemonSet kube-system/kube-proxy: the API refused the dry-run apply: ')
    assert 'Required value' in str(caught.value) and caught.value.status == 422
    assert caught.value.details['object'] == 'DaemonSet kube-system/kube-proxy'


def test_an_object_talos_did_not_create_is_refused_naming_it():
    kube = FakeKube({('DaemonSet', 'kube-system', 'kube-proxy'): daemonset(managers=False)})
    with pytest.raises(_errors.ApiError, match='DaemonSet kube-system/kube-proxy: field manager talos owns none'):
        sync.sync(kube, sync.targets(config(proxy={'image': NEW})))
    assert kube.patches == []
