"""Unit tests of the lab API's pure parts: selectors, patches, server-side apply, validation, tables, protobuf."""

import pytest

from lab.k8s import patch, schema, ssa, tables
from lab.k8s.errors import ApiError
from lab.k8s.protobuf import decode
from lab.k8s.resources import Registry
from lab.k8s.selectors import FieldSelector, LabelSelector, match_label_selector

DEFS = schema.definitions()
DEPLOYMENT = {'$ref': schema.REF_PREFIX + 'io.k8s.api.apps.v1.Deployment'}
POD_SPEC = {'$ref': schema.REF_PREFIX + 'io.k8s.api.core.v1.PodSpec'}


@pytest.mark.parametrize('text, labels, expected', [
    ('a=b', {'a': 'b'}, True), ('a==b', {'a': 'c'}, False), ('a!=b', {}, True), ('a in (x, y)', {'a': 'y'}, True),
    ('a notin (x)', {'a': 'x'}, False), ('a', {'a': ''}, True), ('!a', {'a': ''}, False), ('a=b,c', {'a': 'b'}, False),
])
def test_label_selector(text, labels, expected):
    assert LabelSelector(text).matches(labels) is expected


def test_bad_selectors_are_400():
    with pytest.raises(ApiError) as exc:
        LabelSelector('a in x')
    assert exc.value.code == 400
    pods = Registry().get('', 'v1', 'pods')
    assert FieldSelector('spec.nodeName=n1,status.phase!=Failed', pods).matches({'spec': {'nodeName': 'n1'}, 'status': {'phase': 'Running'}})
    with pytest.raises(ApiError) as exc:
        FieldSelector('spec.foo=1', pods)
    assert exc.value.message == 'field label not supported: spec.foo'


def test_match_label_selector_expressions():
    expressions = [{'key': 'b', 'operator': 'NotIn', 'values': ['2']}, {'key': 'c', 'operator': 'Exists'}]
    selector = {'matchLabels': {'a': '1'}, 'matchExpressions': expressions}
    assert match_label_selector(selector, {'a': '1', 'c': ''})
    assert not match_label_selector(selector, {'a': '1', 'b': '2', 'c': ''})


def test_json_patch_ops_and_failed_test():
    doc = {'a': [1, 2], 'b': {'c': 1}}
    out = patch.json_patch(doc, [{'op': 'add', 'path': '/a/-', 'value': 3}, {'op': 'remove', 'path': '/b/c'},
                                 {'op': 'copy', 'from': '/a', 'path': '/d'}, {'op': 'move', 'from': '/d', 'path': '/e'},
                                 {'op': 'replace', 'path': '/a/0', 'value': 9}])
    assert out == {'a': [9, 2, 3], 'b': {}, 'e': [1, 2, 3]} and doc == {'a': [1, 2], 'b': {'c': 1}}
    with pytest.raises(ApiError) as exc:
        patch.json_patch(doc, [{'op': 'test', 'path': '/b/c', 'value': 2}])
    assert exc.value.code == 422


def test_strategic_merge_patch_merge_keys_and_directives():
    spec = {'containers': [{'name': 'a', 'image': 'a:1', 'ports': [{'containerPort': 80}], 'env': [{'name': 'X', 'value': '1'}]},
                           {'name': 'b', 'image': 'b:1'}], 'nodeSelector': {'k': 'v'}}
    out = patch.strategic_merge_patch(spec, {
        'containers': [{'name': 'a', 'env': [{'name': 'Y', 'value': '2'}], 'ports': [{'containerPort': 81}]},
                       {'name': 'b', '$patch': 'delete'}],
        'nodeSelector': {'other': 'x'},
        '$setElementOrder/containers': [{'name': 'a'}]}, POD_SPEC, DEFS)
    assert [c['name'] for c in out['containers']] == ['a']
    assert [e['name'] for e in out['containers'][0]['env']] == ['X', 'Y']
    assert [p['containerPort'] for p in out['containers'][0]['ports']] == [80, 81]
    assert out['nodeSelector'] == {'other': 'x'}, 'nodeSelector is an atomic map: replaced, not merged'
    replaced = patch.strategic_merge_patch(spec, {'containers': [{'$patch': 'replace'}, {'name': 'z', 'image': 'z'}]}, POD_SPEC, DEFS)
    assert replaced['containers'] == [{'name': 'z', 'image': 'z'}]


def test_merge_patch_null_deletes():
    assert patch.merge_patch({'a': {'b': 1, 'c': 2}, 'l': [1]}, {'a': {'b': None}, 'l': [2]}) == {'a': {'c': 2}, 'l': [2]}


def _deployment(replicas=1, image='x:1', **extra):
    spec = {'replicas': replicas, 'selector': {'matchLabels': {'a': 'b'}},
            'template': {'metadata': {'labels': {'a': 'b'}}, 'spec': {'containers': [{'name': 'c', 'image': image}]}}}
    spec.update(extra)
    return {'apiVersion': 'apps/v1', 'kind': 'Deployment', 'metadata': {'name': 'd', 'namespace': 'ns'}, 'spec': spec}


def test_fieldset_uses_list_map_keys():
    fields = ssa.fieldset(_deployment(), DEPLOYMENT, DEFS, 'main')
    assert ('f:spec', 'f:template', 'f:spec', 'f:containers', 'k:{"name":"c"}', 'f:image') in fields
    assert ('f:spec', 'f:selector') in fields, 'a LabelSelector is atomic'
    trie = ssa.to_fields_v1(fields)
    assert trie['f:spec']['f:template']['f:spec']['f:containers']['k:{"name":"c"}']['.'] == {}
    assert ssa.from_fields_v1(trie) == fields


def test_apply_conflict_force_and_release():
    live = ssa.apply(None, _deployment(replicas=2), 'one', False, 'apps/v1', DEPLOYMENT, DEFS)
    with pytest.raises(ApiError) as exc:
        ssa.apply(live, _deployment(replicas=3), 'two', False, 'apps/v1', DEPLOYMENT, DEFS)
    assert exc.value.code == 409 and [c['field'] for c in exc.value.details['causes']] == ['.spec.replicas']
    shared = ssa.apply(live, _deployment(replicas=2), 'two', False, 'apps/v1', DEPLOYMENT, DEFS)
    assert [m['manager'] for m in shared['metadata']['managedFields']] == ['one', 'two'], 'same value: shared, no conflict'
    forced = ssa.apply(live, _deployment(replicas=3), 'two', True, 'apps/v1', DEPLOYMENT, DEFS)
    assert forced['spec']['replicas'] == 3
    one = next(m for m in forced['metadata']['managedFields'] if m['manager'] == 'one')
    assert 'f:replicas' not in one['fieldsV1']['f:spec']
    dropped = _deployment()
    del dropped['spec']['replicas']
    released = ssa.apply(forced, dropped, 'one', False, 'apps/v1', DEPLOYMENT, DEFS)
    assert released['spec']['replicas'] == 3, 'replicas belongs to "two" now: kept'
    mine = _deployment(minReadySeconds=5)
    with_field = ssa.apply(released, mine, 'one', True, 'apps/v1', DEPLOYMENT, DEFS)
    assert with_field['spec']['minReadySeconds'] == 5
    without = ssa.apply(with_field, _deployment(), 'one', True, 'apps/v1', DEPLOYMENT, DEFS)
    assert 'minReadySeconds' not in without['spec'], 'a field only "one" applied goes when "one" stops applying it'


def test_record_update_moves_ownership():
    live = ssa.apply(None, _deployment(replicas=2), 'applier', False, 'apps/v1', DEPLOYMENT, DEFS)
    new = patch.clone(live)
    new['spec']['replicas'] = 5
    ssa.record_update(live, new, 'kubectl-scale', 'apps/v1', DEPLOYMENT, DEFS)
    managers = {m['manager']: m for m in new['metadata']['managedFields']}
    assert managers['kubectl-scale']['operation'] == 'Update' and managers['kubectl-scale']['fieldsV1'] == {'f:spec': {'f:replicas': {}}}
    assert 'f:replicas' not in managers['applier']['fieldsV1']['f:spec']


def test_validator_prunes_and_reports():
    validator = schema.Validator(DEFS)
    body = _deployment()
    body['spec']['bogus'] = 1
    body['spec']['template']['spec']['containers'][0]['ports'] = [{'containerPort': '80'}]
    pruned, errors, unknown = validator.check(body, DEPLOYMENT)
    assert unknown == ['spec.bogus'] and 'bogus' not in pruned['spec']
    fields = {(p.reason, p.field) for p in errors}
    assert fields == {('FieldValueTypeInvalid', 'spec.template.spec.containers[0].ports[0].containerPort')}
    ok, errors, unknown = validator.check(_deployment(strategy={'rollingUpdate': {'maxSurge': '25%', 'maxUnavailable': 1}}), DEPLOYMENT)
    assert errors == [] and unknown == [] and ok['spec']['strategy']['rollingUpdate']['maxUnavailable'] == 1


def test_go_validation_enums():
    from lab.k8s.defaults import check_pod_spec  # pylint: disable=import-outside-toplevel
    problems = check_pod_spec({'restartPolicy': 'Sometimes', 'containers': [{'name': 'c', 'image': 'x', 'imagePullPolicy': 'Maybe'}]},
                              'spec')
    assert [(p.reason, p.field) for p in problems] == [('FieldValueNotSupported', 'spec.containers[0].imagePullPolicy'),
                                                       ('FieldValueNotSupported', 'spec.restartPolicy')]


def test_structural_schema_defaults_and_preserve():
    crd_schema = {'type': 'object', 'properties': {'spec': {'type': 'object', 'properties': {
        'interval': {'type': 'string', 'default': '10m'}, 'free': {'type': 'object', 'x-kubernetes-preserve-unknown-fields': True},
        'port': {'x-kubernetes-int-or-string': True}}}}}
    out, errors, unknown = schema.Validator(DEFS, structural=True).check(
        {'spec': {'free': {'anything': [1]}, 'port': 'http', 'junk': 1}}, crd_schema)
    assert out == {'spec': {'free': {'anything': [1]}, 'port': 'http', 'interval': '10m'}} and errors == [] and unknown == ['spec.junk']


def test_human_duration_like_kubectl():
    assert [tables.human_duration(s) for s in (5, 119, 125, 700, 3 * 3600 + 120, 30 * 3600, 3 * 86400, 400 * 86400, 800 * 86400)] == \
        ['5s', '119s', '2m5s', '11m', '3h2m', '30h', '3d', '400d', '2y']


def test_jsonpath_filter_for_printer_columns():
    obj = {'status': {'conditions': [{'type': 'Other', 'status': 'False'}, {'type': 'Ready', 'status': 'True'}]}}
    assert tables.jsonpath(obj, '.status.conditions[?(@.type=="Ready")].status') == ['True']
    assert tables.jsonpath(obj, '.status.conditions[0].type') == ['Other']


def _field(number, payload):
    def varint(value):
        out = b''
        while True:
            byte, value = value & 0x7F, value >> 7
            out += bytes([byte | (0x80 if value else 0)])
            if not value:
                return out
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def test_protobuf_delete_options_and_unknown_kind():
    options = _field(4, b'Foreground') + _field(5, b'All')
    envelope = b'k8s\x00' + _field(1, _field(1, b'meta.k8s.io/v1') + _field(2, b'DeleteOptions')) + _field(2, options)
    assert decode(envelope) == {'propagationPolicy': 'Foreground', 'dryRun': ['All']}
    with pytest.raises(ApiError) as exc:
        decode(b'k8s\x00' + _field(1, _field(1, b'apps/v1') + _field(2, b'Deployment')) + _field(2, b''))
    assert exc.value.code == 415


def test_quantities_accept_numbers_and_are_written_as_strings():
    body = _deployment()
    body['spec']['template']['spec']['containers'][0]['resources'] = {'limits': {'cpu': 1, 'memory': '1Gi'}, 'requests': {'cpu': 0.25}}
    out, errors, dummy = schema.Validator(DEFS).check(body, DEPLOYMENT)
    assert errors == [] and out['spec']['template']['spec']['containers'][0]['resources'] == {
        'limits': {'cpu': '1', 'memory': '1Gi'}, 'requests': {'cpu': '250m'}}


def test_store_delivers_events_in_order_when_a_subscriber_writes():
    from lab.k8s.store import Store  # pylint: disable=import-outside-toplevel
    registry = Registry()
    store = Store(registry)
    ns_type, cm_type = registry.get('', 'v1', 'namespaces'), registry.get('', 'v1', 'configmaps')
    store.create(ns_type, None, {'metadata': {'name': 'n'}}, 'test')
    seen = []

    def writer(event):
        if event.key == ('', 'configmaps') and event.obj['metadata']['name'] == 'first':
            store.create(cm_type, 'n', {'metadata': {'name': 'second'}}, 'writer')

    def broken(event):
        raise RuntimeError('a broken subscriber must not break writes (%s)' % event.type)
    store.subscribe(writer)
    store.subscribe(broken)
    store.subscribe(lambda event: seen.append((event.rv, event.obj['metadata']['name'])))
    store.create(cm_type, 'n', {'metadata': {'name': 'first'}}, 'test')
    assert [name for dummy, name in seen] == ['first', 'second'] and seen[0][0] < seen[1][0]
