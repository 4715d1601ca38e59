"""The lab Kubernetes API through the official Python client and raw HTTPS (Part 1)."""

import base64
import json
import ssl
import threading
import urllib.error
import urllib.request

import pytest

kubernetes = pytest.importorskip('kubernetes')
from kubernetes import client, config, watch  # noqa: E402  pylint: disable=wrong-import-position
from kubernetes.client.rest import ApiException  # noqa: E402  pylint: disable=wrong-import-position

from lab import pki  # noqa: E402  pylint: disable=wrong-import-position
from lab.k8s.testing import ClusterThread  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.proxtalos.cluster.tests.helpers import wait_until  # noqa: E402  pylint: disable=wrong-import-position


@pytest.fixture(scope='module')
def api():
    with ClusterThread() as server:
        yield server


@pytest.fixture(scope='module')
def kube(api):
    return config.new_client_from_config(config_file=api.kubeconfig)


@pytest.fixture()
def namespace(kube, request):
    name = 'ns-%s' % request.node.name.replace('_', '-')[5:40].strip('-').lower()
    client.CoreV1Api(kube).create_namespace({'metadata': {'name': name}})
    yield name
    client.CoreV1Api(kube).delete_namespace(name)


def _status(exc):
    return json.loads(exc.body)


def raw(api, method, path, body=None, headers=None, cert=True):
    """One HTTPS request with the admin cert (or none); returns (status, headers, body bytes)."""
    context = ssl.create_default_context(cadata=api.ca_pem)
    if cert:
        cert_pem, key_pem = pki.admin_cert(api.ca_pem, api.ca_key_pem) if cert is True else cert
        path_c, path_k = api.workdir + '/c.pem', api.workdir + '/k.pem'
        with open(path_c, 'w', encoding='utf-8') as handle:
            handle.write(cert_pem)
        with open(path_k, 'w', encoding='utf-8') as handle:
            handle.write(key_pem)
        context.load_cert_chain(path_c, path_k)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    headers = dict(headers or {})
    if data is not None and not any(k.lower() == 'content-type' for k in headers):
        headers['Content-Type'] = 'application/json'
    request = urllib.request.Request(api.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


# --- server basics ---------------------------------------------------------------------------

def test_version_and_health(api, kube):
    assert client.VersionApi(kube).get_code().git_version == 'v1.33.1'
    status, dummy, body = raw(api, 'GET', '/readyz?verbose')
    assert status == 200 and b'[+]etcd ok' in body and body.strip().endswith(b'readyz check passed')
    assert raw(api, 'GET', '/livez')[2] == b'ok'


def test_unauthenticated_is_401_but_health_is_public(api):
    status, dummy, body = raw(api, 'GET', '/api/v1/namespaces', cert=False)
    assert status == 401 and json.loads(body)['reason'] == 'Unauthorized'
    assert raw(api, 'GET', '/healthz', cert=False)[0] == 200


def test_client_outside_system_masters_is_403(api):
    cert = pki.admin_cert(api.ca_pem, api.ca_key_pem, 'viewer', ('developers',))
    status, dummy, body = raw(api, 'GET', '/api/v1/namespaces', cert=cert)
    assert status == 403 and json.loads(body)['reason'] == 'Forbidden'


def test_certificate_from_another_ca_is_not_trusted(api):
    other_ca, other_key = pki.make_ca('other')
    cert = pki.admin_cert(other_ca, other_key)
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        raw(api, 'GET', '/api/v1/namespaces', cert=cert)


def test_discovery_legacy_and_aggregated(api):
    status, dummy, body = raw(api, 'GET', '/apis')
    groups = {g['name']: g for g in json.loads(body)['groups']}
    assert groups['apps']['preferredVersion']['groupVersion'] == 'apps/v1'
    status, headers, body = raw(api, 'GET', '/apis', headers={
        'Accept': 'application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json'})
    assert status == 200 and 'as=APIGroupDiscoveryList' in headers['Content-Type']
    apps = next(i for i in json.loads(body)['items'] if i['metadata']['name'] == 'apps')
    deploy = next(r for r in apps['versions'][0]['resources'] if r['resource'] == 'deployments')
    assert deploy['scope'] == 'Namespaced' and 'deploy' in deploy['shortNames'] and 'all' in deploy['categories']
    assert {s['subresource'] for s in deploy['subresources']} == {'status', 'scale'}
    resources = json.loads(raw(api, 'GET', '/api/v1')[2])['resources']
    pods = next(r for r in resources if r['name'] == 'pods')
    assert pods['namespaced'] and 'watch' in pods['verbs'] and pods['shortNames'] == ['po']
    assert raw(api, 'GET', '/apis/nosuch.example.com/v1/things')[0] == 404


def test_openapi_v2_and_v3(api):
    doc = json.loads(raw(api, 'GET', '/openapi/v2', headers={'Accept': 'application/json'})[2])
    deployment = doc['definitions']['io.k8s.api.apps.v1.Deployment']
    assert deployment['x-kubernetes-group-version-kind'] == [{'group': 'apps', 'kind': 'Deployment', 'version': 'v1'}]
    containers = doc['definitions']['io.k8s.api.core.v1.PodSpec']['properties']['containers']
    assert containers['x-kubernetes-patch-merge-key'] == 'name'
    index = json.loads(raw(api, 'GET', '/openapi/v3')[2])
    url = index['paths']['apis/apps/v1']['serverRelativeURL']
    v3 = json.loads(raw(api, 'GET', url)[2])
    patch = v3['paths']['/apis/apps/v1/namespaces/{namespace}/deployments/{name}']['patch']
    assert patch['x-kubernetes-group-version-kind']['kind'] == 'Deployment'
    assert 'fieldValidation' in {p['name'] for p in patch['parameters']}
    assert 'io.k8s.api.apps.v1.Deployment' in v3['components']['schemas']


# --- objects ---------------------------------------------------------------------------------

def test_crud_resource_version_and_conflict(kube, namespace):
    core = client.CoreV1Api(kube)
    created = core.create_namespaced_config_map(namespace, {'metadata': {'name': 'cfg'}, 'data': {'a': '1'}})
    assert created.metadata.uid and created.metadata.creation_timestamp and int(created.metadata.resource_version) > 0
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map(namespace, {'metadata': {'name': 'cfg'}, 'data': {'a': '1'}})
    assert exc.value.status == 409 and _status(exc.value)['reason'] == 'AlreadyExists'
    stale = created.metadata.resource_version
    created.data = {'a': '2'}
    updated = core.replace_namespaced_config_map('cfg', namespace, created)
    assert updated.data == {'a': '2'} and int(updated.metadata.resource_version) > int(stale)
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_config_map('cfg', namespace, {'metadata': {'name': 'cfg', 'resourceVersion': stale}, 'data': {}})
    assert exc.value.status == 409 and _status(exc.value)['reason'] == 'Conflict'
    core.delete_namespaced_config_map('cfg', namespace)
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map('cfg', namespace)
    assert exc.value.status == 404 and _status(exc.value)['message'] == 'configmaps "cfg" not found'


def test_object_in_missing_namespace_is_404(kube):
    with pytest.raises(ApiException) as exc:
        client.CoreV1Api(kube).create_namespaced_config_map('nowhere', {'metadata': {'name': 'x'}})
    assert exc.value.status == 404 and 'namespaces "nowhere" not found' in _status(exc.value)['message']


def test_type_error_is_422_with_field_path(api, namespace):
    body = {'apiVersion': 'apps/v1', 'kind': 'Deployment', 'metadata': {'name': 'bad'},
            'spec': {'replicas': 'three', 'selector': {'matchLabels': {'a': 'b'}},
                     'template': {'metadata': {'labels': {'a': 'b'}}, 'spec': {'containers': [{'name': 'c', 'image': 'x'}]}}}}
    status, dummy, data = raw(api, 'POST', '/apis/apps/v1/namespaces/%s/deployments' % namespace, body)
    result = json.loads(data)
    assert status == 422 and result['reason'] == 'Invalid'
    assert result['details']['causes'][0]['field'] == 'spec.replicas'
    body['spec']['replicas'] = 1
    del body['spec']['template']['spec']['containers'][0]['image']
    result = json.loads(raw(api, 'POST', '/apis/apps/v1/namespaces/%s/deployments' % namespace, body)[2])
    assert result['details']['causes'][0] == {'reason': 'FieldValueRequired', 'message': 'Required value',
                                              'field': 'spec.template.spec.containers[0].image'}


def test_unknown_fields_strict_warn_and_pruned(api, namespace):
    body = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'u'}, 'data': {'a': '1'}, 'spek': {'x': 1}}
    path = '/api/v1/namespaces/%s/configmaps' % namespace
    status, dummy, data = raw(api, 'POST', path + '?fieldValidation=Strict', body)
    assert status == 400 and 'strict decoding error: unknown field "spek"' in json.loads(data)['message']
    status, headers, data = raw(api, 'POST', path + '?fieldValidation=Warn', body)
    assert status == 201 and 'unknown field \\"spek\\"' in headers['Warning'] and 'spek' not in json.loads(data)


def test_label_and_field_selectors(kube, namespace):
    core = client.CoreV1Api(kube)
    for name, labels in (('a', {'tier': 'web', 'env': 'prod'}), ('b', {'tier': 'db', 'env': 'prod'}), ('c', {'tier': 'web'})):
        core.create_namespaced_config_map(namespace, {'metadata': {'name': name, 'labels': labels}})

    def names(**kwargs):
        return sorted(i.metadata.name for i in core.list_namespaced_config_map(namespace, **kwargs).items)
    assert names(label_selector='tier=web') == ['a', 'c']
    assert names(label_selector='tier in (web,db),env') == ['a', 'b']
    assert names(label_selector='tier,!env') == ['c']
    assert names(label_selector='tier notin (web),tier') == ['b']
    assert names(field_selector='metadata.name=b') == ['b']
    assert names(field_selector='metadata.name!=b', label_selector='tier=web') == ['a', 'c']
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_config_map(namespace, field_selector='data.a=1')
    assert exc.value.status == 400 and 'field label not supported' in _status(exc.value)['message']
    page = core.list_namespaced_config_map(namespace, limit=2, label_selector='tier')
    assert len(page.items) == 2 and page.metadata._continue
    rest = core.list_namespaced_config_map(namespace, limit=2, label_selector='tier', _continue=page.metadata._continue)
    assert [i.metadata.name for i in rest.items] == ['c']


def test_namespaces_get_default_service_account_and_root_ca(api, kube, namespace):
    core = client.CoreV1Api(kube)
    wait_until(lambda: (len(core.list_namespaced_config_map(namespace, field_selector='metadata.name=kube-root-ca.crt').items) == 1,
                        'not yet'), what='kube-root-ca.crt')
    assert core.read_namespaced_config_map('kube-root-ca.crt', namespace).data['ca.crt'] == api.ca_pem
    assert core.read_namespaced_service_account('default', namespace).metadata.name == 'default'


def test_watch_from_resource_version(kube, namespace):
    core = client.CoreV1Api(kube)
    listed = core.list_namespaced_config_map(namespace)
    core.create_namespaced_config_map(namespace, {'metadata': {'name': 'w1'}})
    core.patch_namespaced_config_map('w1', namespace, {'data': {'k': 'v'}})
    core.delete_namespaced_config_map('w1', namespace)
    seen = []
    stream = watch.Watch()
    for event in stream.stream(core.list_namespaced_config_map, namespace, resource_version=listed.metadata.resource_version,
                               timeout_seconds=2):
        seen.append((event['type'], event['object'].metadata.name))
        if len(seen) == 3:
            stream.stop()
    assert seen == [('ADDED', 'w1'), ('MODIFIED', 'w1'), ('DELETED', 'w1')]


def test_watch_live_events_and_selector_transitions(api, kube, namespace):
    core = client.CoreV1Api(kube)
    subscribers = api.call(lambda: len(api.cluster.store._subscribers))  # pylint: disable=protected-access
    core.create_namespaced_config_map(namespace, {'metadata': {'name': 'sel', 'labels': {'on': 'no'}}})
    seen = []
    started = threading.Event()

    def consume():
        stream = watch.Watch()
        for event in stream.stream(core.list_namespaced_config_map, namespace, label_selector='on=yes', timeout_seconds=5,
                                   resource_version=core.list_namespaced_config_map(namespace).metadata.resource_version):
            seen.append(event['type'])
            if len(seen) == 2:
                stream.stop()
        started.set()

    worker = threading.Thread(target=consume)
    worker.start()
    wait_until(lambda: (api.call(lambda: len(api.cluster.store._subscribers)) > subscribers, 'watch not open yet'),  # pylint: disable=protected-access
               'the watch to be open', timeout=10)
    core.patch_namespaced_config_map('sel', namespace, {'metadata': {'labels': {'on': 'yes'}}})
    core.patch_namespaced_config_map('sel', namespace, {'metadata': {'labels': {'on': 'no'}}})
    worker.join(10)
    assert seen == ['ADDED', 'DELETED']


def test_watch_too_old_resource_version_is_410(api, kube):
    store = api.cluster.store
    api.call(store._history.clear)  # pylint: disable=protected-access
    client.CoreV1Api(kube).patch_namespace('default', {'metadata': {'labels': {'touched': 'yes'}}})
    status, dummy, body = raw(api, 'GET', '/api/v1/namespaces?watch=1&resourceVersion=1&timeoutSeconds=1')
    event = json.loads(body.splitlines()[0])
    assert status == 200 and event['type'] == 'ERROR' and event['object']['code'] == 410


def test_send_initial_events_ends_with_bookmark(api, namespace):
    raw(api, 'POST', '/api/v1/namespaces/%s/configmaps' % namespace, {'metadata': {'name': 'i1', 'labels': {'initial': 'yes'}}})
    status, dummy, body = raw(api, 'GET', '/api/v1/namespaces/%s/configmaps?watch=1&sendInitialEvents=true&allowWatchBookmarks=true'
                              '&resourceVersionMatch=NotOlderThan&timeoutSeconds=1&labelSelector=initial' % namespace)
    events = [json.loads(line) for line in body.splitlines()]
    assert status == 200 and [e['type'] for e in events[:2]] == ['ADDED', 'BOOKMARK']
    assert events[0]['object']['metadata']['name'] == 'i1'
    assert events[1]['object']['metadata']['annotations'] == {'k8s.io/initial-events-end': 'true'}


def test_patch_flavours(kube, namespace):
    apps = client.AppsV1Api(kube)
    apps.create_namespaced_deployment(namespace, {
        'metadata': {'name': 'p'},
        'spec': {'selector': {'matchLabels': {'a': 'p'}}, 'template': {'metadata': {'labels': {'a': 'p'}}, 'spec': {'containers': [
            {'name': 'one', 'image': 'x:1', 'env': [{'name': 'A', 'value': '1'}]}, {'name': 'two', 'image': 'y:1'}]}}}})
    # strategic merge: containers merge by name, env by name
    patched = apps.patch_namespaced_deployment('p', namespace, {'spec': {'template': {'spec': {'containers': [
        {'name': 'one', 'env': [{'name': 'B', 'value': '2'}]}]}}}})
    containers = {c.name: c for c in patched.spec.template.spec.containers}
    assert set(containers) == {'one', 'two'} and [e.name for e in containers['one'].env] == ['A', 'B']
    assert patched.metadata.generation == 2
    # $patch: delete removes one item by merge key
    patched = apps.patch_namespaced_deployment('p', namespace, {'spec': {'template': {'spec': {'containers': [
        {'name': 'two', '$patch': 'delete'}]}}}})
    assert [c.name for c in patched.spec.template.spec.containers] == ['one']
    # JSON patch
    patched = apps.patch_namespaced_deployment('p', namespace, [{'op': 'replace', 'path': '/spec/replicas', 'value': 3}])
    assert patched.spec.replicas == 3
    # merge patch: maps merge, the rest replaces


def test_merge_patch(api, namespace):
    raw(api, 'POST', '/api/v1/namespaces/%s/configmaps' % namespace, {'metadata': {'name': 'mp', 'labels': {'a': '1'}}, 'data': {'x': '1'}})
    status, dummy, body = raw(api, 'PATCH', '/api/v1/namespaces/%s/configmaps/mp' % namespace,
                              {'metadata': {'labels': {'b': '2'}}, 'data': {'x': None, 'y': '2'}}, {'Content-Type': 'application/merge-patch+json'})
    result = json.loads(body)
    assert status == 200 and result['metadata']['labels'] == {'a': '1', 'b': '2'} and result['data'] == {'y': '2'}


def test_server_side_apply_conflicts_force_and_removal(api, namespace):
    path = '/api/v1/namespaces/%s/configmaps/ssa' % namespace
    headers = {'Content-Type': 'application/apply-patch+yaml'}
    first = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'ssa'}, 'data': {'a': '1', 'b': '2'}}
    status, dummy, body = raw(api, 'PATCH', path + '?fieldManager=one', first, headers)
    assert status == 201 or status == 200
    managed = json.loads(body)['metadata']['managedFields']
    assert managed[0]['manager'] == 'one' and managed[0]['operation'] == 'Apply'
    assert managed[0]['fieldsV1'] == {'f:data': {'f:a': {}, 'f:b': {}}}
    other = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'ssa'}, 'data': {'a': 'other'}}
    status, dummy, body = raw(api, 'PATCH', path + '?fieldManager=two', other, headers)
    result = json.loads(body)
    assert status == 409 and result['reason'] == 'Conflict'
    assert result['details']['causes'] == [{'type': 'FieldManagerConflict', 'message': 'conflict with "one" using v1', 'field': '.data.a'}]
    status, dummy, body = raw(api, 'PATCH', path + '?fieldManager=two&force=true', other, headers)
    assert status == 200 and json.loads(body)['data'] == {'a': 'other', 'b': '2'}
    # manager one drops b: nobody else owns it, so it goes; a now belongs to two and stays
    status, dummy, body = raw(api, 'PATCH', path + '?fieldManager=one', {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'ssa'}},
                              headers)
    assert status == 200 and json.loads(body)['data'] == {'a': 'other'}
    # apply without a field manager is rejected
    status, dummy, body = raw(api, 'PATCH', path, first, headers)
    assert status == 422


def test_a_second_apply_of_a_name_only_object_is_a_no_op(api):
    """An apply of only the name (a Namespace as a manifests release creates it) creates the object; the same apply
    again changes nothing, not even its resourceVersion (what kubernetes.core compares to report changed)."""
    path = '/api/v1/namespaces/name-only-apply?fieldManager=one'
    headers = {'Content-Type': 'application/apply-patch+yaml'}
    body = {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'name-only-apply'}}
    status, dummy, first = raw(api, 'PATCH', path, body, headers)
    assert status in (200, 201), first
    status, dummy, second = raw(api, 'PATCH', path, body, headers)
    assert status == 200, second
    first, second = json.loads(first), json.loads(second)
    assert second['metadata']['resourceVersion'] == first['metadata']['resourceVersion']
    assert second['metadata'].get('managedFields') == first['metadata'].get('managedFields')


def test_dry_run_changes_nothing(api, kube, namespace):
    core = client.CoreV1Api(kube)
    core.create_namespaced_config_map(namespace, {'metadata': {'name': 'dry'}}, dry_run='All')
    with pytest.raises(ApiException):
        core.read_namespaced_config_map('dry', namespace)
    core.create_namespaced_config_map(namespace, {'metadata': {'name': 'dry'}, 'data': {'a': '1'}})
    result = core.patch_namespaced_config_map('dry', namespace, {'data': {'a': '2'}}, dry_run='All')
    assert result.data == {'a': '2'} and core.read_namespaced_config_map('dry', namespace).data == {'a': '1'}


def test_status_subresource_is_separate(kube, namespace):
    apps = client.AppsV1Api(kube)
    apps.create_namespaced_stateful_set(namespace, {'metadata': {'name': 's'}, 'spec': {
        'serviceName': 's', 'replicas': 0, 'selector': {'matchLabels': {'a': 's'}},
        'template': {'metadata': {'labels': {'a': 's'}}, 'spec': {'containers': [{'name': 'c', 'image': 'x'}]}}}})
    sts = apps.patch_namespaced_stateful_set('s', namespace, {'status': {'replicas': 7}, 'metadata': {'labels': {'x': 'y'}}})
    assert (sts.status.replicas or 0) != 7 and sts.metadata.labels == {'x': 'y'}
    sts = apps.patch_namespaced_stateful_set_status('s', namespace, {'status': {'replicas': 7}, 'spec': {'replicas': 5}})
    assert sts.status.replicas == 7 and sts.spec.replicas == 0


def test_scale_subresource(kube, namespace):
    apps = client.AppsV1Api(kube)
    apps.create_namespaced_deployment(namespace, {'metadata': {'name': 'sc'}, 'spec': {
        'replicas': 1, 'selector': {'matchLabels': {'a': 'sc'}},
        'template': {'metadata': {'labels': {'a': 'sc'}}, 'spec': {'containers': [{'name': 'c', 'image': 'x'}]}}}})
    scale = apps.patch_namespaced_deployment_scale('sc', namespace, {'spec': {'replicas': 4}})
    assert scale.spec.replicas == 4 and apps.read_namespaced_deployment('sc', namespace).spec.replicas == 4
    assert apps.read_namespaced_deployment_scale('sc', namespace).status.selector == 'a=sc'


def test_crd_established_and_custom_resources_served(api, kube):
    ext = client.ApiextensionsV1Api(kube)
    ext.create_custom_resource_definition({
        'metadata': {'name': 'widgets.lab.example.com'},
        'spec': {'group': 'lab.example.com', 'scope': 'Namespaced',
                 'names': {'plural': 'widgets', 'singular': 'widget', 'kind': 'Widget', 'shortNames': ['wg']},
                 'versions': [{'name': 'v1', 'served': True, 'storage': True, 'subresources': {'status': {}},
                               'additionalPrinterColumns': [{'name': 'Ready', 'type': 'string',
                                                             'jsonPath': '.status.conditions[?(@.type=="Ready")].status'}],
                               'schema': {'openAPIV3Schema': {'type': 'object', 'properties': {
                                   'spec': {'type': 'object', 'properties': {'size': {'type': 'integer', 'default': 1},
                                                                             'color': {'type': 'string'}}},
                                   'status': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}}}}}]}})
    crd = ext.read_custom_resource_definition('widgets.lab.example.com')
    conditions = {c.type: c.status for c in crd.status.conditions}
    assert conditions == {'NamesAccepted': 'True', 'Established': 'True'} and crd.status.stored_versions == ['v1']
    custom = client.CustomObjectsApi(kube)
    made = custom.create_namespaced_custom_object('lab.example.com', 'v1', 'default', 'widgets', {
        'apiVersion': 'lab.example.com/v1', 'kind': 'Widget', 'metadata': {'name': 'w'}, 'spec': {'color': 'red', 'junk': 1}})
    assert made['spec'] == {'color': 'red', 'size': 1} and made['metadata']['generation'] == 1
    with pytest.raises(ApiException) as exc:
        custom.create_namespaced_custom_object('lab.example.com', 'v1', 'default', 'widgets', {
            'apiVersion': 'lab.example.com/v1', 'kind': 'Widget', 'metadata': {'name': 'bad'}, 'spec': {'size': 'big'}})
    assert exc.value.status == 422 and _status(exc.value)['details']['causes'][0]['field'] == 'spec.size'
    status, dummy, body = raw(api, 'GET', '/apis/lab.example.com/v1/namespaces/default/widgets',
                              headers={'Accept': 'application/json;as=Table;v=v1;g=meta.k8s.io'})
    table = json.loads(body)
    assert [c['name'] for c in table['columnDefinitions']] == ['Name', 'Ready', 'Age'] and table['rows'][0]['cells'][0] == 'w'
    ext.delete_custom_resource_definition('widgets.lab.example.com')
    assert raw(api, 'GET', '/apis/lab.example.com/v1/namespaces/default/widgets')[0] == 404


def test_namespace_deletion_removes_its_objects(api, kube):
    core = client.CoreV1Api(kube)
    core.create_namespace({'metadata': {'name': 'doomed'}})
    core.create_namespaced_config_map('doomed', {'metadata': {'name': 'x'}})
    core.delete_namespace('doomed')
    assert api.call(lambda: api.cluster.store.items(('', 'configmaps'), 'doomed')) == []
    with pytest.raises(ApiException) as exc:
        core.delete_namespace('kube-system')
    assert exc.value.status == 403 and 'may not be deleted' in _status(exc.value)['message']


def test_table_output_for_kubectl(api):
    status, dummy, body = raw(api, 'GET', '/api/v1/namespaces', headers={
        'Accept': 'application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json'})
    table = json.loads(body)
    assert status == 200 and table['kind'] == 'Table'
    assert [c['name'] for c in table['columnDefinitions']] == ['Name', 'Status', 'Age']
    assert ['default', 'Active'] == table['rows'][0]['cells'][:2] and table['rows'][0]['object']['kind'] == 'PartialObjectMetadata'


def test_service_gets_cluster_ip(kube, namespace):
    svc = client.CoreV1Api(kube).create_namespaced_service(namespace, {'metadata': {'name': 's'}, 'spec': {'ports': [{'port': 80}]}})
    assert svc.spec.cluster_ip.startswith('10.96.') and svc.spec.ports[0].target_port == 80 and svc.spec.type == 'ClusterIP'


def _varint(value):
    out = b''
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def _field(number, payload):
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_protobuf_secret_body_is_decoded(api, namespace):
    meta = _field(1, b'pb') + _field(11, _field(1, b'owner') + _field(2, b'helm'))
    secret = _field(1, meta) + _field(2, _field(1, b'release') + _field(2, b'\x00\x01binary')) + _field(3, b'helm.sh/release.v1')
    envelope = b'k8s\x00' + _field(1, _field(1, b'v1') + _field(2, b'Secret')) + _field(2, secret)
    status, dummy, body = raw(api, 'POST', '/api/v1/namespaces/%s/secrets' % namespace, envelope,
                              {'Content-Type': 'application/vnd.kubernetes.protobuf'})
    made = json.loads(body)
    assert status == 201 and made['metadata']['labels'] == {'owner': 'helm'} and made['type'] == 'helm.sh/release.v1'
    assert base64.b64decode(made['data']['release']) == b'\x00\x01binary'


def test_service_proxy_reaches_a_registered_handler(api, kube, namespace):
    service = {'metadata': {'name': 'sealed'}, 'spec': {'ports': [{'name': 'http', 'port': 8080}]}}
    client.CoreV1Api(kube).create_namespaced_service(namespace, service)
    path = '/api/v1/namespaces/%s/services/http:sealed:http/proxy/v1/cert.pem' % namespace
    status, dummy, body = raw(api, 'GET', path)
    assert status == 503 and 'no endpoints available' in json.loads(body)['message']
    api.call(api.cluster.register_service_proxy, namespace, 'sealed',
             lambda method, sub, query, data: (200, 'application/x-pem-file', ('%s %s' % (method, sub)).encode()))
    status, headers, body = raw(api, 'GET', path)
    assert status == 200 and body == b'GET /v1/cert.pem' and headers['Content-Type'].startswith('application/x-pem-file')
    assert raw(api, 'GET', '/api/v1/namespaces/%s/services/missing/proxy/' % namespace)[0] == 404
