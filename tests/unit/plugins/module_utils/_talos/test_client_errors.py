"""The Talos client's pure parts: error mapping, credentials, kubeconfig archives, argument checks."""
import base64
import gzip
import io
import ssl
import tarfile
import threading

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import api, client, errors, pki
from ansible_collections.proxtalos.cluster.tests.helpers import talos_admin_talosconfig

NODE = '127.0.0.9:50000'
METHOD = '/machine.MachineService/Bootstrap'


@pytest.mark.parametrize('code, name, transient', [
    (3, 'INVALID_ARGUMENT', False),
    (4, 'DEADLINE_EXCEEDED', True),
    (5, 'NOT_FOUND', False),
    (6, 'ALREADY_EXISTS', False),
    (7, 'PERMISSION_DENIED', False),
    (8, 'RESOURCE_EXHAUSTED', True),
    (9, 'FAILED_PRECONDITION', False),
    (10, 'ABORTED', True),
    (12, 'UNIMPLEMENTED', False),
    (13, 'INTERNAL', False),
    (14, 'UNAVAILABLE', True),
    (16, 'UNAUTHENTICATED', False),
    (99, 'UNKNOWN', False),
])
def test_status_codes_map_to_error_types(code, name, transient):
    error = errors.from_status(NODE, METHOD, code, ' talos says why ')
    assert error.code == name and error.status == name
    assert isinstance(error, _errors.TransientApiError) is transient
    assert isinstance(error, _errors.ApiError)
    assert error.node == NODE and error.method == METHOD
    assert error.talos_message == 'talos says why'
    assert str(error) == 'talos node %s: Bootstrap failed: %s: talos says why' % (NODE, name)
    assert error.details['node'] == NODE and error.details['service'] == 'talos'


def test_grpclib_status_enum_is_understood():
    from grpclib.const import Status
    error = errors.from_status(NODE, METHOD, Status.ALREADY_EXISTS, 'etcd data directory is not empty')
    assert error.already_exists and not error.unimplemented


@pytest.mark.parametrize('code, flag', [
    ('ALREADY_EXISTS', 'already_exists'), ('FAILED_PRECONDITION', 'failed_precondition'),
    ('PERMISSION_DENIED', 'permission_denied'), ('UNIMPLEMENTED', 'unimplemented'), ('INVALID_ARGUMENT', 'invalid_argument'),
])
def test_callers_tell_errors_apart_by_attribute(code, flag):
    error = errors.from_status(NODE, METHOD, code, 'x')
    flags = ('already_exists', 'failed_precondition', 'permission_denied', 'unimplemented', 'invalid_argument')
    assert [getattr(error, name) for name in flags] == [name == flag for name in flags]


def test_unreachable_and_deadline_are_transient_and_name_the_node():
    refused = errors.unreachable(NODE, METHOD, 'Connect call failed')
    late = errors.deadline_exceeded(NODE, METHOD, 2.5)
    for error in (refused, late):
        assert isinstance(error, _errors.TransientApiError)
        assert NODE in str(error)
    assert late.code == 'DEADLINE_EXCEEDED' and '2.5s' in str(late)
    assert refused.code == 'UNAVAILABLE'


def test_tls_error_says_which_way_it_failed():
    error = errors.TalosTlsError(NODE, 'client_certificate_required', method=METHOD, detail='tlsv13 alert certificate required')
    assert error.reason == 'client_certificate_required'
    assert 'requires a client certificate' in str(error) and NODE in str(error)
    assert not isinstance(error, _errors.TransientApiError)


def test_metadata_error_is_decoded_defensively():
    assert errors.from_metadata(NODE, METHOD, None) is None
    assert errors.from_metadata(NODE, METHOD, api.common.Metadata()) is None
    only_text = errors.from_metadata(NODE, METHOD, api.common.Metadata(hostname='10.0.0.2', error='rpc error: boom'))
    assert only_text.code == 'UNKNOWN' and only_text.node == '10.0.0.2' and 'boom' in str(only_text)
    with_status = api.common.Metadata(hostname='10.0.0.3', error='ignored text')
    with_status.status.code = 14
    with_status.status.message = 'connection refused'
    error = errors.from_metadata(NODE, METHOD, with_status)
    assert isinstance(error, errors.TalosTransientError) and error.talos_message == 'connection refused'


@pytest.mark.parametrize('text, reason', [
    ('[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required', 'client_certificate_required'),
    ('[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca', 'client_certificate_rejected'),
    ('[SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate', 'client_certificate_rejected'),
    ('[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate', 'server_certificate_untrusted'),
    ('[SSL: WRONG_VERSION_NUMBER] wrong version number', None),
])
def test_openssl_reasons(text, reason):
    assert client._tls_reason(ssl.SSLError(1, text)) == reason


def tar_gz(members, end_blocks=True):
    raw = io.BytesIO()
    tar = tarfile.open(fileobj=raw, mode='w')
    for name, data in members:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o600
        tar.addfile(info, io.BytesIO(data))
    if end_blocks:
        tar.close()
    return gzip.compress(raw.getvalue())


def test_kubeconfig_archive_without_end_blocks_is_read():
    assert client.extract_kubeconfig(tar_gz([('kubeconfig', b'apiVersion: v1\n')], end_blocks=False)) == b'apiVersion: v1\n'


def test_kubeconfig_member_is_found_among_others():
    archive = tar_gz([('README', b'x'), ('./kubeconfig', b'kind: Config\n')])
    assert client.extract_kubeconfig(archive) == b'kind: Config\n'


@pytest.mark.parametrize('archive, text', [
    (b'', 'returned no data'),
    (b'not gzip at all', 'not a readable tar.gz'),
    (tar_gz([('other', b'x')]), 'has no kubeconfig file'),
], ids=['empty', 'not-gzip', 'no-kubeconfig-member'])
def test_bad_kubeconfig_archives_are_clear_errors(archive, text):
    with pytest.raises(errors.TalosApiError, match=text):
        client.extract_kubeconfig(archive, NODE)


def test_talos_ed25519_key_label_is_relabelled():
    talosconfig, dummy, crt, key = talos_admin_talosconfig('lab')
    assert b'ED25519 PRIVATE KEY' in key
    relabelled = pki.pem_for_python(key)
    assert b'-----BEGIN PRIVATE KEY-----' in relabelled and b'ED25519' not in relabelled
    assert pki.pem_for_python(b'-----BEGIN EC PRIVATE KEY-----\nx\n') == b'-----BEGIN EC PRIVATE KEY-----\nx\n'
    # and the relabelled key loads into an mTLS context
    credentials = client.TalosCredentials.from_talosconfig(talosconfig)
    assert isinstance(credentials.ssl_context(), ssl.SSLContext)


def test_one_mtls_context_per_credentials_shared_by_its_clients_and_threads():
    credentials = client.TalosCredentials.from_talosconfig(talos_admin_talosconfig('lab')[0])
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(credentials.ssl_context())) for dummy in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 8 and all(context is seen[0] for context in seen)
    assert seen[0].verify_mode == ssl.CERT_REQUIRED and seen[0].check_hostname
    assert client.AsyncTalosClient('10.5.0.11', credentials=credentials)._ssl is seen[0]
    # Other credentials, another context.
    other = client.TalosCredentials.from_talosconfig(talos_admin_talosconfig('lab')[0])
    assert other.ssl_context() is not seen[0]


def test_talosconfig_errors_name_the_field():
    config = talos_admin_talosconfig('prod')[0]
    with pytest.raises(_errors.ValidationError) as info:
        client.TalosCredentials.from_talosconfig(config, context='staging')
    assert info.value.field == 'talosconfig.contexts' and "'staging'" in str(info.value) and 'prod' in str(info.value)

    broken = dict(config['contexts']['prod'], crt='%%% not base64')
    with pytest.raises(_errors.ValidationError) as info:
        client.TalosCredentials.from_context(broken, field='talosconfig.contexts.prod')
    assert info.value.field == 'talosconfig.contexts.prod.crt' and 'base64' in info.value.reason

    not_pem = dict(config['contexts']['prod'], key=base64.b64encode(b'hello').decode())
    with pytest.raises(_errors.ValidationError) as info:
        client.TalosCredentials.from_context(not_pem)
    assert info.value.field.endswith('.key') and 'PEM' in info.value.reason

    with pytest.raises(_errors.ValidationError) as info:
        client.TalosCredentials.from_talosconfig({'contexts': {}})
    assert info.value.field == 'talosconfig.context'


def test_mismatched_key_and_certificate_is_a_validation_error():
    dummy, ca, crt, dummy = talos_admin_talosconfig()
    dummy, dummy, dummy, key = talos_admin_talosconfig()
    credentials = client.TalosCredentials(ca, crt, key)
    with pytest.raises(_errors.ValidationError) as info:
        credentials.ssl_context()
    assert 'do not load or do not match' in info.value.reason


@pytest.mark.parametrize('kwargs, field', [
    ({}, 'credentials'),
    ({'insecure': True, 'credentials': 'x'}, 'insecure'),
    ({'fingerprint': 'abc', 'credentials': None, 'insecure': False}, 'credentials'),
    ({'insecure': True, 'timeout': 0}, 'timeout'),
])
def test_client_arguments_are_checked(kwargs, field):
    with pytest.raises(_errors.ValidationError) as info:
        client.AsyncTalosClient('127.0.0.1', **kwargs)
    assert info.value.field == field


def test_fingerprint_needs_insecure():
    credentials = client.TalosCredentials.from_talosconfig(talos_admin_talosconfig('lab')[0])
    with pytest.raises(_errors.ValidationError) as info:
        client.AsyncTalosClient('127.0.0.1', credentials=credentials, fingerprint='abc')
    assert info.value.field == 'fingerprint'


@pytest.mark.parametrize('kwargs, field', [
    ({'mode': 'sometimes'}, 'mode'),
    ({'mode': 'auto', 'try_timeout': 5}, 'try_timeout'),
    ({'mode': 'try', 'try_timeout': -1}, 'try_timeout'),
])
def test_apply_arguments_are_checked_before_any_call(kwargs, field):
    talos = client.TalosClient('127.0.0.1', port=1, insecure=True, timeout=1)
    try:
        with pytest.raises(_errors.ValidationError) as info:
            talos.apply_configuration(b'version: v1alpha1\n', **kwargs)
        assert info.value.field == field
    finally:
        talos.close()


def test_missing_libraries_is_empty_here():
    assert client.missing_libraries() == []
