"""What the collection hides, judged by Talos's own code (tools/talos-machinery, pkg/machinery v1.13.9).

- The table: for every document kind in Talos's config schema, the paths that Talos's own Redact methods
  replace (found by the tool on a document with every field filled) are exactly config.TALOS_REDACTED_PATHS
  for that kind: a path upstream adds at the pinned tag fails here.
- Per kind and path: a document with an old secret value and one with a new value. Talos's own dry-run
  diff of the two (configdiff.DiffConfigs, unredacted as a node sends it) is masked by redact.node_text
  so that neither value shows; the documents shown by redact.config_documents_text hold neither; and
  redact.config_secret_values finds the value (so it is registered no_log).
"""

import base64
import gzip
import json
import os
import subprocess

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import config, redact
from lab import upstream

pytestmark = pytest.mark.upstream

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = os.path.join(ROOT, 'lab', 'talos', 'schemas', 'talos-config-v1.13.9.schema.json.gz')

# Path segments before a '*' that are maps in the documents (the others are lists).
MAP_SEGMENTS = ('config',)


def machinery(*args, stdin=None):
    try:
        binary = upstream.binary('talos-machinery')
    except upstream.MissingBinary as exc:
        pytest.fail(str(exc))
    done = subprocess.run([binary] + list(args), input=stdin, capture_output=True, check=True)
    return json.loads(done.stdout)


def schema_kinds():
    """Every document kind of Talos's published config schema, 'v1alpha1' for the legacy document."""
    with gzip.open(SCHEMA, 'rt', encoding='utf-8') as stream:
        schema = json.load(stream)
    kinds = []
    for entry in schema['oneOf']:
        definition = schema['$defs'][entry['$ref'].rsplit('/', 1)[-1]]
        kind = definition.get('properties', {}).get('kind', {}).get('enum')
        kinds.append(kind[0] if kind else 'v1alpha1')
    return kinds


# Kinds the schema names wrongly: its enum for KubeSpanEndpointsConfig says "KubeSpanEndpoints"
# (config/schemas/config.schema.json), the kind registered is "KubeSpanEndpointsConfig"
# (config/types/network/kubespan_endpoints.go:19).
SCHEMA_MISNAMED = {'KubeSpanEndpoints': 'KubeSpanEndpointsConfig'}


@pytest.fixture(scope='module')
def upstream_paths():
    kinds = schema_kinds() + sorted(SCHEMA_MISNAMED.values())
    answer = machinery('redacted-paths', *kinds)
    assert sorted(answer['unknown']) == sorted(SCHEMA_MISNAMED), answer['unknown']
    return answer['paths']


def test_the_schema_lists_the_kinds_talos_redacts():
    kinds = schema_kinds()
    assert 'v1alpha1' in kinds and 'RegistryAuthConfig' in kinds and len(kinds) > 30


def test_every_kind_of_the_schema_is_looked_at(upstream_paths):
    assert set(upstream_paths) == (set(schema_kinds()) - set(SCHEMA_MISNAMED)) | set(SCHEMA_MISNAMED.values())


def test_the_collections_table_is_what_talos_redacts_for_every_kind(upstream_paths):
    redacting = dict((kind, sorted(paths)) for kind, paths in upstream_paths.items() if paths)
    ours = dict((kind, sorted(paths)) for kind, paths in config.TALOS_REDACTED_PATHS.items())
    assert ours == redacting
    # and the collection hides all of it (plus its own inline manifests)
    for kind, paths in redacting.items():
        assert set(paths) <= set(config.SECRET_PATHS[kind])


def _value(path, age, index):
    text = '%s-secret-%d-%s' % (age, index, path.rsplit('.', 1)[-1])
    if path == 'apiUrl':
        return 'https://siderolink.example.invalid/?jointoken=' + text, text
    if path.endswith('.key') or path == 'key':  # base64 of PEM in Talos's documents
        encoded = base64.b64encode(text.encode('ascii')).decode('ascii')
        return encoded, encoded
    return text, text


def _document(kind, path, value):
    node = value
    parts = path.split('.')
    for position in range(len(parts) - 1, -1, -1):
        part = parts[position]
        if part == '*':
            node = {'registry.example.internal': node} if parts[position - 1] in MAP_SEGMENTS else [node]
        else:
            node = {part: node}
    if kind == 'v1alpha1':
        return dict(node, version='v1alpha1')
    return dict(node, apiVersion='v1alpha1', kind=kind)


def _yaml(document):
    return json.dumps(document)  # JSON is YAML, and keeps the test free of the collection's YAML code


CASES = [(kind, path) for kind in sorted(config.TALOS_REDACTED_PATHS) for path in config.TALOS_REDACTED_PATHS[kind]]


@pytest.mark.parametrize('kind,path', CASES, ids=['%s:%s' % case for case in CASES])
def test_neither_the_old_nor_the_new_value_shows(kind, path):
    index = CASES.index((kind, path))
    old_value, old_needle = _value(path, 'old', index)
    new_value, new_needle = _value(path, 'new', index)
    before, after = _document(kind, path, old_value), _document(kind, path, new_value)

    talos_diff = machinery('diff', stdin=json.dumps({'old': _yaml(before), 'new': _yaml(after)}).encode('utf-8'))['diff']
    assert old_needle in talos_diff and new_needle in talos_diff, 'the diff as Talos sends it holds both values'
    shown = redact.node_text('Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\n'
                             'Config diff:\n\n' + talos_diff)
    assert old_needle not in shown and new_needle not in shown
    assert shown.count('<hidden>') >= 2

    for document, needle in ((before, old_needle), (after, new_needle)):
        text = redact.config_documents_text([document])
        assert needle not in text and '<hidden> hmac:' in text
        assert redact.config_secret_values([document]) == [old_value if document is before else new_value]


def _manifest_diff(old_data, new_data, header_lines=0):
    """Talos's diff of an inline manifest Secret whose data changes; header_lines of padding before its data
    push the `contents:` line out of the hunk."""
    manifest = ''.join('# line %d\n' % n for n in range(header_lines)) + 'data:\n%s\napiVersion: v1\nkind: Secret\n'
    before, after = ({'version': 'v1alpha1', 'cluster': {'inlineManifests': [{'name': 'cilium', 'contents': manifest % data}]}}
                     for data in (old_data, new_data))
    return machinery('diff', stdin=json.dumps({'old': _yaml(before), 'new': _yaml(after)}).encode('utf-8'))['diff']


def test_an_inline_manifest_is_masked_in_a_node_diff_when_its_contents_line_shows():
    talos_diff = _manifest_diff('  ca.crt: b2xk', '  ca.crt: bmV3')
    assert 'b2xk' in talos_diff and 'contents: |' in talos_diff
    shown = redact.node_text(talos_diff)
    assert 'b2xk' not in shown and 'bmV3' not in shown


def test_key_material_in_an_inline_manifest_is_masked_where_the_hunk_hides_the_contents_line():
    old_key, new_key = base64.b64encode(b'o' * 48).decode(), base64.b64encode(b'n' * 48).decode()
    for old, new in (('  tls.key: c2hvcnQ=', '  tls.key: bG9uZw=='), ('  other: ' + old_key, '  other: ' + new_key)):
        talos_diff = _manifest_diff(old, new, header_lines=6)
        assert 'contents: |' not in talos_diff and old.split()[-1] in talos_diff
        shown = redact.node_text(talos_diff)
        assert old.split()[-1] not in shown and new.split()[-1] not in shown


def test_what_is_not_secret_stays_readable():
    text = ('--- a\n+++ b\n@@ -1,4 +1,4 @@\n machine:\n-    type: worker\n+    type: controlplane\n'
            '     install:\n-        image: factory.talos.dev/installer/' + 'a' * 64 + ':v1.13.8\n'
            '+        image: factory.talos.dev/installer/' + 'a' * 64 + ':v1.13.9\n'
            '     kubelet:\n         extraMounts:\n-            - /var/lib/kubelet/seccomp/profiles\n'
            '+            - /var/lib/kubelet/seccomp/profiles-extended\n')
    assert redact.node_text(text) == text


def _rsa_key_pem():
    from cryptography.hazmat.primitives import serialization  # pylint: disable=import-outside-toplevel
    from cryptography.hazmat.primitives.asymmetric import rsa  # pylint: disable=import-outside-toplevel
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode('ascii')


def test_a_pem_key_whose_key_line_the_hunk_hides_is_masked_to_its_last_line():
    """RegistryTLSConfig.clientIdentity.key is PEM text (a `key: |` block): a change next to the key's end shows its
    last lines without the `key:` line."""
    key = _rsa_key_pem()
    before = {'apiVersion': 'v1alpha1', 'kind': 'RegistryTLSConfig', 'name': 'registry.example.internal',
              'clientIdentity': {'key': key}, 'insecureSkipVerify': False}
    after = dict(before, insecureSkipVerify=True)
    talos_diff = machinery('diff', stdin=json.dumps({'old': _yaml(before), 'new': _yaml(after)}).encode('utf-8'))['diff']
    body = [line for line in key.splitlines() if not line.startswith('-----')]
    shown_by_talos = [line for line in body if line in talos_diff]
    assert shown_by_talos and 'key: |' not in talos_diff, 'the hunk shows part of the key but not its key line'
    shown = redact.node_text(talos_diff)
    assert not [line for line in body if line in shown]
    assert 'insecureSkipVerify: true' in shown


def test_a_patchs_secret_values_are_found_in_every_form_a_patch_takes():
    patches = {'host': [
        {'machine': {'registries': {'config': {'r.example': {'auth': {'password': 'pw-one', 'username': 'u'}}}}}},
        {'apiVersion': 'v1alpha1', 'kind': 'RegistryAuthConfig', 'name': 'r.example', 'password': 'pw-two'},
        'apiVersion: v1alpha1\nkind: WireguardConfig\nname: wg0\nprivateKey: pk-three\n',
        [{'op': 'add', 'path': '/machine/registries/config/r.example/auth', 'value': {'identityToken': 'tok-four'}},
         {'op': 'replace', 'path': '/machine/token', 'value': 'tok-five'},
         {'op': 'replace', 'path': '/machine/nodeLabels', 'value': {'key': 'not-secret'}}],
    ]}
    found = redact.patch_secret_values([patches, None])
    assert sorted(found) == ['pk-three', 'pw-one', 'pw-two', 'tok-five', 'tok-four']
