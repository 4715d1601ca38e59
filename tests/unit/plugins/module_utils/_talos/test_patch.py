"""Strategic merge and RFC 6902 patches with Talos's rules; errors name patch and path."""
import copy

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import patch, talosyaml

BASE = talosyaml.load_all("""
version: v1alpha1
machine:
  type: controlplane
  certSANs: [a.example]
  install:
    disk: /dev/sda
    wipe: true
  network:
    hostname: node1
    interfaces:
      - interface: eth0
        dhcp: true
        vlans:
          - vlanId: 10
            mtu: 1500
      - deviceSelector: {busPath: "0*"}
        addresses: [10.0.0.2/24]
  nodeLabels:
    zone: a
cluster:
  network:
    podSubnets: [10.244.0.0/16]
    serviceSubnets: [10.96.0.0/12]
  apiServer:
    admissionControl:
      - name: PodSecurity
        configuration:
          exemptions:
            namespaces: [kube-system]
    auditPolicy:
      apiVersion: audit.k8s.io/v1
      kind: Policy
      rules: [{level: Metadata}]
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
---
apiVersion: v1alpha1
kind: ExtensionServiceConfig
name: foo
configFiles:
  - content: hello
    mountPath: /etc/foo
""", 'base')


def apply(*patches, documents=None):
    parsed = [patch.parse_patch(value, 'patches.cluster[%d]' % index) for index, value in enumerate(patches)]
    return patch.apply_patches(BASE if documents is None else documents, parsed)


def v1(documents):
    return [doc for doc in documents if patch.is_v1alpha1(doc)][0]


def typed(documents, kind):
    return [doc for doc in documents if doc.get('kind') == kind]


def test_maps_merge_deeply_and_scalars_replace():
    out = v1(apply({'machine': {'install': {'disk': '/dev/vda', 'image': 'x'}, 'kubelet': {'nodeIP': {'validSubnets': ['10.0.0.0/8']}}}}))
    assert out['machine']['install'] == {'disk': '/dev/vda', 'wipe': True, 'image': 'x'}
    assert out['machine']['kubelet'] == {'nodeIP': {'validSubnets': ['10.0.0.0/8']}}
    assert out['machine']['type'] == 'controlplane'


def test_zero_values_do_not_override_but_false_does():
    out = v1(apply({'machine': {'install': {'disk': '', 'wipe': False}, 'network': {'hostname': None}}}))
    assert out['machine']['install']['disk'] == '/dev/sda'
    assert out['machine']['install']['wipe'] is False
    assert out['machine']['network']['hostname'] == 'node1'


def test_lists_are_appended():
    out = v1(apply({'machine': {'certSANs': ['b.example']}}))
    assert out['machine']['certSANs'] == ['a.example', 'b.example']


def test_subnets_and_audit_policy_are_replaced():
    out = v1(apply({'cluster': {'network': {'podSubnets': ['192.168.0.0/16'], 'serviceSubnets': ['192.0.0.0/12']},
                                'apiServer': {'auditPolicy': {'apiVersion': 'audit.k8s.io/v1', 'kind': 'Policy',
                                                              'rules': [{'level': 'None'}]}}}}))
    assert out['cluster']['network']['podSubnets'] == ['192.168.0.0/16']
    assert out['cluster']['network']['serviceSubnets'] == ['192.0.0.0/12']
    assert out['cluster']['apiServer']['auditPolicy']['rules'] == [{'level': 'None'}]


def test_interfaces_merge_by_interface_and_device_selector_vlans_by_id():
    out = v1(apply({'machine': {'network': {'interfaces': [
        {'interface': 'eth0', 'mtu': 9000, 'vlans': [{'vlanId': 10, 'mtu': 1400}, {'vlanId': 20}]},
        {'deviceSelector': {'busPath': '0*'}, 'addresses': ['10.0.0.3/24']},
        {'interface': 'eth1', 'dhcp': True},
    ]}}}))
    interfaces = out['machine']['network']['interfaces']
    assert [i.get('interface') for i in interfaces] == ['eth0', None, 'eth1']
    assert interfaces[0]['mtu'] == 9000 and interfaces[0]['dhcp'] is True
    assert interfaces[0]['vlans'] == [{'vlanId': 10, 'mtu': 1400}, {'vlanId': 20}]
    assert interfaces[1]['addresses'] == ['10.0.0.2/24', '10.0.0.3/24']


def test_admission_control_merges_by_name():
    out = v1(apply({'cluster': {'apiServer': {'admissionControl': [
        {'name': 'PodSecurity', 'configuration': {'exemptions': {'namespaces': ['rook-ceph']}}},
        {'name': 'Other', 'configuration': {}},
    ]}}}))
    plugins = out['cluster']['apiServer']['admissionControl']
    assert [p['name'] for p in plugins] == ['PodSecurity', 'Other']
    assert plugins[0]['configuration']['exemptions']['namespaces'] == ['kube-system', 'rook-ceph']


def test_extension_config_files_merge_by_mount_path():
    out = apply({'apiVersion': 'v1alpha1', 'kind': 'ExtensionServiceConfig', 'name': 'foo',
                 'configFiles': [{'content': 'new', 'mountPath': '/etc/foo'}, {'content': 'b', 'mountPath': '/etc/bar'}]})
    files = typed(out, 'ExtensionServiceConfig')[0]['configFiles']
    assert files == [{'content': 'new', 'mountPath': '/etc/foo'}, {'content': 'b', 'mountPath': '/etc/bar'}]


def test_delete_directives():
    out = apply("""
machine:
  network:
    hostname:
      $patch: delete
    interfaces:
      - interface: eth0
        $patch: delete
      - interface: eth0
        dhcp: false
  nodeLabels:
    zone:
      $patch: delete
cluster:
  apiServer:
    admissionControl:
      - name: PodSecurity
        $patch: delete
""")
    machine = v1(out)['machine']
    assert 'hostname' not in machine['network']
    assert [i.get('interface') for i in machine['network']['interfaces']] == [None, 'eth0']
    assert machine['network']['interfaces'][1] == {'interface': 'eth0', 'dhcp': False}
    assert machine['nodeLabels'] == {}
    assert v1(out)['cluster']['apiServer']['admissionControl'] == []


def test_delete_list_items_by_their_first_field():
    out = apply({'apiVersion': 'v1alpha1', 'kind': 'ExtensionServiceConfig', 'name': 'foo',
                 'configFiles': [{'content': 'hello', '$patch': 'delete'}, {'content': 'two', 'mountPath': '/etc/two'}]})
    assert typed(out, 'ExtensionServiceConfig')[0]['configFiles'] == [{'content': 'two', 'mountPath': '/etc/two'}]


# Audit finding 9, each rule as Talos v1.13.9's pkg/machinery/config has it.

def test_delete_selects_by_the_first_key_value_only_and_removes_the_first_match():
    # configloader/internal/decoder/delete.go:56-74 (first key:value), selector.go:222-285 (first match only)
    documents = talosyaml.load_all("""
version: v1alpha1
machine:
  type: worker
  certSANs: []
  network:
    interfaces:
      - interface: eth0
        mtu: 1400
      - interface: eth0
        mtu: 9000
""", 'base')
    out = apply("""
machine:
  network:
    interfaces:
      - interface: eth0
        mtu: 9000
        $patch: delete
""", documents=documents)
    assert v1(out)['machine']['network']['interfaces'] == [{'interface': 'eth0', 'mtu': 9000}]


def test_deleting_a_key_inside_a_list_item_is_refused():
    # decoder/delete.go:147-149, 207-213: "cannot delete an inner key"
    with pytest.raises(ValidationError) as info:
        apply("""
machine:
  network:
    interfaces:
      - interface: eth0
        dhcp:
          $patch: delete
""")
    assert 'cannot delete an inner key' in str(info.value)


def test_extra_args_take_each_key_of_the_patch_whole():
    # types/v1alpha1/v1alpha1_types.go:74-91 Args.Merge (maps.Copy)
    documents = talosyaml.load_all("""
version: v1alpha1
machine:
  type: controlplane
  kubelet:
    extraArgs:
      node-labels: [a=1]
      v: "2"
cluster:
  apiServer:
    extraArgs:
      feature-gates: [A=true]
""", 'base')
    out = apply("""
machine:
  kubelet:
    extraArgs:
      node-labels: [b=2]
cluster:
  apiServer:
    extraArgs:
      feature-gates: [B=true]
      audit-log-maxage: "30"
""", documents=documents)
    assert v1(out)['machine']['kubelet']['extraArgs'] == {'node-labels': ['b=2'], 'v': '2'}
    assert v1(out)['cluster']['apiServer']['extraArgs'] == {'feature-gates': ['B=true'], 'audit-log-maxage': '30'}


def test_network_rule_ingress_and_ports_are_replaced():
    # types/network/rule_config.go:65, 84 (merge:"replace")
    rule = talosyaml.load_all("""
apiVersion: v1alpha1
kind: NetworkRuleConfig
name: kubelet
portSelector:
  ports: [10250]
  protocol: tcp
ingress:
  - subnet: 10.0.0.0/8
""", 'base')
    out = apply({'apiVersion': 'v1alpha1', 'kind': 'NetworkRuleConfig', 'name': 'kubelet',
                 'portSelector': {'ports': [10250, 10255]}, 'ingress': [{'subnet': '192.168.0.0/16'}]},
                documents=BASE + rule)
    merged = typed(out, 'NetworkRuleConfig')[0]
    assert merged['portSelector'] == {'ports': [10250, 10255], 'protocol': 'tcp'}
    assert merged['ingress'] == [{'subnet': '192.168.0.0/16'}]


def test_image_verification_rules_merge_by_image_pattern():
    # types/security/image_verification.go:69-92: same pattern replaced whole, others appended
    config = talosyaml.load_all("""
apiVersion: v1alpha1
kind: ImageVerificationConfig
rules:
  - image: ghcr.io/siderolabs/*
    keyless: {issuer: https://accounts.google.com}
  - image: docker.io/*
    skip: true
""", 'base')
    out = apply({'apiVersion': 'v1alpha1', 'kind': 'ImageVerificationConfig',
                 'rules': [{'image': 'docker.io/*', 'deny': True}, {'image': 'quay.io/*', 'skip': True}]},
                documents=BASE + config)
    assert typed(out, 'ImageVerificationConfig')[0]['rules'] == [
        {'image': 'ghcr.io/siderolabs/*', 'keyless': {'issuer': 'https://accounts.google.com'}},
        {'image': 'docker.io/*', 'deny': True}, {'image': 'quay.io/*', 'skip': True}]


def test_multi_document_patch_merges_adds_and_deletes_documents():
    out = apply("""
apiVersion: v1alpha1
kind: HostnameConfig
auto: "off"
hostname: cp-1
---
apiVersion: v1alpha1
kind: Layer2VIPConfig
name: 10.0.0.10
link: ens18
---
apiVersion: v1alpha1
kind: ExtensionServiceConfig
name: foo
$patch: delete
---
machine:
  certSANs: [c.example]
""")
    assert typed(out, 'HostnameConfig') == [{'apiVersion': 'v1alpha1', 'kind': 'HostnameConfig', 'auto': 'off', 'hostname': 'cp-1'}]
    assert typed(out, 'Layer2VIPConfig') == [{'apiVersion': 'v1alpha1', 'kind': 'Layer2VIPConfig', 'name': '10.0.0.10', 'link': 'ens18'}]
    assert typed(out, 'ExtensionServiceConfig') == []
    assert v1(out)['machine']['certSANs'] == ['a.example', 'c.example']
    # Order: v1alpha1 first, existing documents keep their place, new ones are appended.
    assert [doc.get('kind') for doc in out] == [None, 'HostnameConfig', 'Layer2VIPConfig']


def test_named_documents_are_matched_by_name():
    docs = apply({'apiVersion': 'v1alpha1', 'kind': 'ExtensionServiceConfig', 'name': 'bar', 'environment': ['A=1']})
    assert [d['name'] for d in typed(docs, 'ExtensionServiceConfig')] == ['foo', 'bar']


def test_yaml_patch_uses_yaml_1_2_scalars():
    out = apply('apiVersion: v1alpha1\nkind: HostnameConfig\nauto: off\nhostname: n1\n')
    assert typed(out, 'HostnameConfig')[0]['auto'] == 'off'


def test_inputs_are_not_modified():
    before = copy.deepcopy(BASE)
    raw = {'machine': {'certSANs': ['x']}}
    apply(raw, [{'op': 'remove', 'path': '/machine/nodeLabels'}])
    assert BASE == before and raw == {'machine': {'certSANs': ['x']}}


# --- JSON patches ------------------------------------------------------------------------------

def test_json_patch_operations():
    ops = [
        {'op': 'add', 'path': '/machine/network/interfaces/0/vip', 'value': {'ip': '10.0.0.50'}},
        {'op': 'add', 'path': '/machine/network/interfaces/-', 'value': {'interface': 'eth1', 'dhcp': True}},
        {'op': 'add', 'path': '/machine/certSANs/0', 'value': 'first.example'},
        {'op': 'replace', 'path': '/cluster/network/podSubnets', 'value': ['192.168.0.0/16']},
        {'op': 'remove', 'path': '/machine/network/hostname'},
        {'op': 'copy', 'from': '/machine/install/disk', 'path': '/machine/install/copied'},
        {'op': 'move', 'from': '/machine/nodeLabels', 'path': '/machine/nodeAnnotations'},
        {'op': 'test', 'path': '/machine/install/wipe', 'value': True},
    ]
    out = apply(ops)
    machine = v1(out)['machine']
    assert machine['network']['interfaces'][0]['vip'] == {'ip': '10.0.0.50'}
    assert machine['network']['interfaces'][-1] == {'interface': 'eth1', 'dhcp': True}
    assert machine['certSANs'] == ['first.example', 'a.example']
    assert v1(out)['cluster']['network']['podSubnets'] == ['192.168.0.0/16']
    assert 'hostname' not in machine['network']
    assert machine['install']['copied'] == '/dev/sda'
    assert 'nodeLabels' not in machine and machine['nodeAnnotations'] == {'zone': 'a'}
    # Only the v1alpha1 document is touched.
    assert out[1:] == BASE[1:]


def test_json_pointer_escapes():
    docs = [{'version': 'v1alpha1', 'machine': {'nodeLabels': {'a/b': '1', 'c~d': '2'}}}]
    out = apply([{'op': 'replace', 'path': '/machine/nodeLabels/a~1b', 'value': 'x'},
                 {'op': 'remove', 'path': '/machine/nodeLabels/c~0d'},
                 {'op': 'add', 'path': '/machine/nodeLabels/e~01', 'value': 'y'}], documents=docs)
    assert out[0]['machine']['nodeLabels'] == {'a/b': 'x', 'e~1': 'y'}


def test_json_patch_as_yaml_text():
    out = apply('- op: add\n  path: /machine/network/hostname\n  value: worker1\n')
    assert v1(out)['machine']['network']['hostname'] == 'worker1'


@pytest.mark.parametrize('ops, reason', [
    ([{'op': 'replace', 'path': '/machine/nothere', 'value': 1}], 'operation 0 (replace /machine/nothere): path not found'),
    ([{'op': 'remove', 'path': '/machine/certSANs/5'}], 'operation 0 (remove /machine/certSANs/5): list index 5 out of range'),
    ([{'op': 'add', 'path': '/machine/certSANs/01', 'value': 'x'}], '"01" is not a list index'),
    ([{'op': 'add', 'path': '/nope/deeper', 'value': 1}], 'path not found'),
    ([{'op': 'test', 'path': '/machine/install/wipe', 'value': 1}], 'test failed'),
    ([{'op': 'move', 'from': '/machine', 'path': '/machine/x'}], 'cannot move a value into one of its own children'),
    ([{'op': 'remove', 'path': ''}], 'cannot remove the whole document'),
    ([{'op': 'add', 'path': 'machine', 'value': 1}], 'JSON pointer must be empty or start with "/"'),
    ([{'op': 'add', 'path': '/machine/a~2b', 'value': 1}], 'invalid "~" escape'),
    ([{'op': 'add', 'path': '/machine/type', 'value': 'x'}, {'op': 'remove', 'path': '/x'}], 'operation 1 (remove /x)'),
])
def test_json_patch_errors_name_patch_and_operation(ops, reason):
    before = copy.deepcopy(BASE)
    with pytest.raises(ValidationError) as err:
        apply({'machine': {'certSANs': ['ok']}}, ops)
    assert err.value.field == 'patches.cluster[1]'
    assert reason in str(err.value)
    assert BASE == before


def test_json_patch_test_op_is_type_strict():
    docs = [{'version': 'v1alpha1', 'a': 1, 'b': 1.0, 'c': True}]
    assert apply([{'op': 'test', 'path': '/a', 'value': 1.0}, {'op': 'test', 'path': '/b', 'value': 1}], documents=docs)
    with pytest.raises(ValidationError):
        apply([{'op': 'test', 'path': '/c', 'value': 1}], documents=docs)


def test_json_patch_with_secret_value_does_not_leak():
    with pytest.raises(ValidationError) as err:
        apply([{'op': 'test', 'path': '/machine/install/disk', 'value': 'sup3r-s3cret'}])
    assert 'sup3r-s3cret' not in str(err.value) and '/dev/sda' not in str(err.value)


# --- parse and strategic errors ------------------------------------------------------------------

@pytest.mark.parametrize('value, reason', [
    ('', 'empty patch'),
    ([], 'an empty list'),
    (42, 'got int'),
    ([{'op': 'add', 'path': '/a', 'value': 1}, {'machine': {}}], 'mixes RFC 6902 operations'),
    ([{'op': 'frobnicate', 'path': '/a'}], 'operation 0: op must be one of'),
    ([{'op': 'add', 'path': '/a'}], 'operation 0 (add /a): value is required'),
    ([{'op': 'copy', 'path': '/a'}], 'from must be a JSON pointer'),
    ({'kind': 'HostnameConfig'}, 'a typed document needs apiVersion and kind'),
    ({'apiVersion': 'v1alpha1'}, 'apiVersion without kind'),
    ({'version': 'v1alpha2'}, 'version must be v1alpha1'),
    ('machine: {}\n---\nmachine: {}\n', 'v1alpha1 appears twice'),
    ('a: [1\n', 'not valid YAML'),
    ('version: v1alpha1\n$patch: delete\n', 'the v1alpha1 document cannot be deleted'),
])
def test_parse_errors_name_the_patch(value, reason):
    with pytest.raises(ValidationError) as err:
        patch.parse_patch(value, 'patches.group[2]')
    assert err.value.field == 'patches.group[2]'
    assert reason in str(err.value)


@pytest.mark.parametrize('value, reason', [
    ({'machine': {'certSANs': {'a': 1}}}, 'at machine.certSANs: cannot merge a mapping into a list'),
    ({'machine': {'install': ['x']}}, 'at machine.install: cannot merge a list into a mapping'),
    ({'machine': {'nodeTaints': {'x': {'$patch': 'delete'}}}}, 'at machine.nodeTaints.x: nothing to delete'),
    ({'machine': {'certSANs': [{'name': 'x', '$patch': 'delete'}]}}, 'at machine.certSANs[0]: no list item matches'),
    ({'machine': {'install': {'$patch': 'replace'}}}, 'unknown $patch directive'),
    ({'machine': {'install': {'disk': {'$patch': 'delete'}, 'x': {'$patch': 'delete', 'y': 1}}}}, 'takes no other fields'),
    ({'apiVersion': 'v1alpha1', 'kind': 'LinkConfig', 'name': 'eth9', '$patch': 'delete'}, 'LinkConfig(eth9): nothing to delete'),
    ({'apiVersion': 'v1alpha1', 'kind': 'HostnameConfig', 'auto': ['x']}, 'at HostnameConfig.auto: cannot merge a list into a scalar'),
])
def test_merge_errors_name_patch_and_path(value, reason):
    with pytest.raises(ValidationError) as err:
        apply(value)
    assert err.value.field == 'patches.cluster[0]'
    assert reason in str(err.value)


def test_levels_apply_in_order_and_name_their_patches():
    parsed = patch.parse_patch_levels(
        cluster=[{'machine': {'install': {'disk': '/dev/cluster'}}}],
        group=[{'machine': {'install': {'disk': '/dev/group'}}}, {'machine': {'certSANs': ['group']}}],
        host=[[{'op': 'replace', 'path': '/machine/install/disk', 'value': '/dev/host'}]])
    assert [p.field for p in parsed] == ['patches.cluster[0]', 'patches.group[0]', 'patches.group[1]', 'patches.host[0]']
    out = v1(patch.apply_patches(BASE, parsed))
    assert out['machine']['install']['disk'] == '/dev/host'
    assert out['machine']['certSANs'] == ['a.example', 'group']
    with pytest.raises(ValidationError) as err:
        patch.parse_patch_levels(host={'machine': {}})
    assert str(err.value) == 'patches.host: must be a list of patches, got dict'
    with pytest.raises(ValidationError) as err:
        patch.apply_patches(BASE, patch.parse_patch_levels(group=[{}, {'machine': {'type': []}}]))
    assert err.value.field == 'patches.group[1]' and 'at machine.type' in str(err.value)
