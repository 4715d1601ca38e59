"""talosconfig: talosctl's layout, round trip, relabelled key for Python, cert reuse."""
import base64
import datetime

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import pki, talosconfig, talosyaml

ENDPOINTS = ['127.0.10.11', '127.0.10.12', '127.0.10.13']


@pytest.fixture(scope='module')
def admin(bundle):
    crt, key, reused = talosconfig.admin_credentials(bundle)
    assert not reused
    return crt, key


def test_layout_is_talosctls(bundle, admin):
    crt, key = admin
    text = talosconfig.render_talosconfig('lab', ENDPOINTS, bundle.ca('os')[0], crt, key, nodes=['127.0.10.11'])
    data = talosyaml.load(text, 'talosconfig')
    assert list(data) == ['context', 'contexts']
    assert data['context'] == 'lab'
    entry = data['contexts']['lab']
    assert list(entry) == ['endpoints', 'nodes', 'ca', 'crt', 'key']
    assert entry['endpoints'] == ENDPOINTS and entry['nodes'] == ['127.0.10.11']
    assert base64.b64decode(entry['ca']) == bundle.ca('os')[0]
    assert base64.b64decode(entry['crt']) == crt
    key_pem = base64.b64decode(entry['key'])
    assert key_pem == key and pki.pem_label(key_pem) == 'ED25519 PRIVATE KEY'


def test_nodes_are_optional_and_endpoints_may_be_empty(bundle, admin):
    text = talosconfig.render_talosconfig('lab', [], bundle.ca('os')[0], *admin)
    entry = talosyaml.load(text, 't')['contexts']['lab']
    assert entry['endpoints'] == [] and 'nodes' not in entry


def test_round_trip_gives_what_the_client_needs(bundle, admin):
    crt, key = admin
    text = talosconfig.render_talosconfig('lab', ENDPOINTS + ['[fd00::1]:50001'], bundle.ca('os')[0], crt, key)
    parsed = talosconfig.parse_talosconfig(text)
    assert parsed.context == 'lab'
    assert parsed.endpoints == ENDPOINTS + ['[fd00::1]:50001']
    assert parsed.endpoint_addresses()[0] == ('127.0.10.11', 50000)
    assert parsed.endpoint_addresses()[-1] == ('fd00::1', 50001)
    assert parsed.ca_pem == bundle.ca('os')[0]
    assert parsed.crt_pem == crt
    assert parsed.key_pem_talos == key
    assert parsed.key_pem.startswith(b'-----BEGIN PRIVATE KEY-----')
    assert pki.key_matches_certificate(parsed.crt_pem, parsed.key_pem)
    assert 'PRIVATE' not in repr(parsed)


def test_rendering_is_deterministic(bundle, admin):
    first = talosconfig.render_talosconfig('lab', ENDPOINTS, bundle.ca('os')[0], *admin)
    assert first == talosconfig.render_talosconfig('lab', list(ENDPOINTS), bundle.ca('os')[0], *admin)


def test_parse_a_talosctl_written_file(bundle, admin):
    crt, key = admin
    text = ('context: other\n'
            'contexts:\n'
            '    other:\n'
            '        endpoints: []\n'
            '        ca: %s\n        crt: %s\n        key: %s\n'
            '    lab:\n'
            '        endpoints:\n            - 10.5.0.2\n'
            '        nodes:\n            - 10.5.0.3\n'
            '        ca: %s\n        crt: %s\n        key: %s\n') % (
        (pki.b64encode_pem(bundle.ca('os')[0]), pki.b64encode_pem(crt), pki.b64encode_pem(key)) * 2)
    assert talosconfig.parse_talosconfig(text).context == 'other'
    lab = talosconfig.parse_talosconfig(text, context='lab')
    assert lab.endpoints == ['10.5.0.2'] and lab.nodes == ['10.5.0.3']


def test_admin_credentials_are_reused_while_valid(bundle, admin):
    crt, key = admin
    text = talosconfig.render_talosconfig('lab', ENDPOINTS, bundle.ca('os')[0], crt, key)
    again_crt, again_key, reused = talosconfig.admin_credentials(bundle, text)
    assert reused and (again_crt, again_key) == (crt, key)
    # Re-rendering with reused credentials gives the same bytes: a re-run is unchanged.
    assert talosconfig.render_talosconfig('lab', ENDPOINTS, bundle.ca('os')[0], again_crt, again_key) == text


def test_admin_credentials_are_renewed_near_expiry(bundle, admin):
    crt, key = admin
    text = talosconfig.render_talosconfig('lab', ENDPOINTS, bundle.ca('os')[0], crt, key)
    late = pki.utcnow() + datetime.timedelta(days=340)
    new_crt, new_key, reused = talosconfig.admin_credentials(bundle, text, now=late)
    assert not reused and new_crt != crt
    assert pki.client_certificate_problems(new_crt, new_key, bundle.ca('os')[0], now=late) == []


def test_admin_credentials_replace_foreign_or_broken_files(bundle, ecdsa_bundle, admin):
    foreign_crt, foreign_key, dummy = talosconfig.admin_credentials(ecdsa_bundle)
    foreign = talosconfig.render_talosconfig('lab', ENDPOINTS, ecdsa_bundle.ca('os')[0], foreign_crt, foreign_key)
    crt, key, reused = talosconfig.admin_credentials(bundle, foreign)
    assert not reused and pki.client_certificate_problems(crt, key, bundle.ca('os')[0]) == []
    assert pki.pem_label(key) == 'ED25519 PRIVATE KEY'
    assert talosconfig.admin_credentials(bundle, 'context: [')[2] is False
    ecdsa_crt, ecdsa_key, dummy = talosconfig.admin_credentials(ecdsa_bundle)
    assert pki.pem_label(ecdsa_key) == 'EC PRIVATE KEY'


def test_render_refuses_mismatched_material(bundle, ecdsa_bundle, admin):
    crt, key = admin
    with pytest.raises(ValidationError) as err:
        talosconfig.render_talosconfig('lab', ENDPOINTS, ecdsa_bundle.ca('os')[0], crt, key)
    assert str(err.value) == 'client.crt: not signed by the given CA'
    other_key = talosconfig.admin_credentials(bundle)[1]
    with pytest.raises(ValidationError) as err:
        talosconfig.render_talosconfig('lab', ENDPOINTS, bundle.ca('os')[0], crt, other_key)
    assert err.value.field == 'client.key'
    with pytest.raises(ValidationError) as err:
        talosconfig.render_talosconfig('lab', '127.0.0.1', bundle.ca('os')[0], crt, key)
    assert str(err.value) == 'endpoints: must be a list, got str'
    with pytest.raises(ValidationError) as err:
        talosconfig.render_talosconfig('', ENDPOINTS, bundle.ca('os')[0], crt, key)
    assert err.value.field == 'context'


@pytest.mark.parametrize('mutate, field, reason', [
    (lambda d: d.pop('contexts'), 'talosconfig.contexts', 'missing'),
    (lambda d: d.update(context='nope'), 'talosconfig.contexts.nope', 'no such context (have: lab)'),
    (lambda d: d['contexts']['lab'].pop('key'), 'talosconfig.contexts.lab.key', 'missing'),
    (lambda d: d['contexts']['lab'].update(key='!!!'), 'talosconfig.contexts.lab.key', 'not valid base64'),
    (lambda d: d['contexts']['lab'].update(crt=d['contexts']['lab']['ca'], key=d['contexts']['lab']['key']),
     'talosconfig.contexts.lab.key', 'does not belong to the certificate'),
    (lambda d: d['contexts']['lab'].update(ca=d['contexts']['lab']['key']), 'talosconfig.contexts.lab.ca', 'not a PEM certificate'),
    (lambda d: d['contexts']['lab'].update(endpoints=['host:port']), 'endpoints', 'invalid port'),
])
def test_parse_errors_name_the_field_and_hide_keys(bundle, admin, mutate, field, reason):
    crt, key = admin
    data = talosyaml.load(talosconfig.render_talosconfig('lab', ENDPOINTS, bundle.ca('os')[0], crt, key), 't')
    mutate(data)
    with pytest.raises(ValidationError) as err:
        talosconfig.parse_talosconfig(talosyaml.dump(data))
    assert err.value.field == field and reason in str(err.value)
    assert pki.b64encode_pem(key) not in str(err.value)
    assert key.decode().splitlines()[1] not in str(err.value)
