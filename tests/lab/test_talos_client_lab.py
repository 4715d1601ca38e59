"""The Talos client against the lab's simulated nodes, served in-process on loopback addresses.

The lab side runs on its own event loop thread (lab.talos.testing.FleetHarness) with instant
timing; the client side is the synchronous TalosClient the modules use. Every wait is a
_wait.wait_for on observed state with a deadline.
"""
import asyncio
import base64
import datetime
import io
import tarfile

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpclib.client import Channel

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client, errors, redact
from ansible_collections.proxtalos.cluster.tests.helpers import wait_until
from lab.talos import pki, testing
from talos_lab_nodes import ENDPOINT, configure, start_maintenance

# A change CanApplyImmediate does not let apply live (v1alpha1_runtime.go:149-204): it needs a reboot.
UDEV_RULE = 'SUBSYSTEM=="drm", KERNEL=="renderD*", GROUP="44", MODE="0660"'


@pytest.fixture(scope='module')
def lab():
    harness = testing.FleetHarness()
    yield harness
    harness.close()


@pytest.fixture
def secrets():
    return testing.ClusterSecrets()


def credentials_for(secrets, organizations=('os:admin',)):
    return client.TalosCredentials.from_talosconfig(secrets.talosconfig('lab', organizations=organizations))


def mtls_version(node, credentials):
    """Probe: the node answers Version over mTLS (not yet: port closed, or still the maintenance certificate)."""
    def probe():
        try:
            with client.TalosClient(node.address, credentials=credentials, timeout=2) as talos:
                return True, talos.version()
        except errors.TalosTransientError as exc:
            return False, str(exc)
        except errors.TalosTlsError as exc:
            if exc.reason != 'server_certificate_untrusted':
                raise
            return False, str(exc)
    return wait_until(probe, 'mTLS to %s' % node.name)


def services(node, credentials):
    with client.TalosClient(node.address, credentials=credentials, timeout=5) as talos:
        return dict((service['id'], service) for service in talos.service_list())


# ------------------------------------------------------------------ maintenance -> configured


def test_maintenance_apply_reboot_then_mtls(lab, secrets):
    node = start_maintenance(lab, 'm-flow')
    assert client.probe_maintenance(node.address) is True
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        assert talos.version()['tag'] == 'v1.13.9'
        disks = talos.disks()
        assert disks[0]['device_name'] == '/dev/sda' and disks[0]['type'] == 'HDD' and not disks[0]['system_disk']
        result = talos.apply_configuration(testing.render_config(secrets, 'controlplane', ENDPOINT), mode='auto')
    # Talos v1.13 in maintenance: AUTO resolves to NO_REBOOT, then the node installs and reboots itself.
    assert result == {'mode': 'no-reboot', 'mode_details': 'Applied configuration without a reboot', 'warnings': []}
    version = mtls_version(node, credentials_for(secrets))
    assert version['platform'] == {'name': 'metal', 'mode': 'metal'}
    assert client.probe_maintenance(node.address) is False
    assert node.disk.installed and node.boot_count == 2


def test_fingerprint_pinning(lab):
    node = start_maintenance(lab, 'm-pin')
    fingerprint = lab.call(lambda: node.identity.fingerprint)
    with client.TalosClient(node.address, insecure=True, fingerprint=fingerprint, timeout=5) as talos:
        assert talos.hostname() == node.hostname
    with client.TalosClient(node.address, insecure=True, fingerprint='AAAA' + fingerprint[4:], timeout=5) as talos:
        with pytest.raises(errors.TalosTlsError) as info:
            talos.version()
    assert info.value.reason == 'fingerprint_mismatch' and fingerprint in str(info.value)


def test_grpclib_still_gives_the_servers_certificate_of_a_connection(lab):
    # grpclib_peer_certificate reads grpclib's internals (Channel.__connect__, Connection._transport): this fails
    # when a grpclib release changes them, before fingerprint pinning breaks in a run
    node = start_maintenance(lab, 'm-shape')
    fingerprint = lab.call(lambda: node.identity.fingerprint)

    async def certificate():
        channel = Channel(node.address, client.DEFAULT_PORT, ssl=client.insecure_ssl_context())
        try:
            protocol = await channel.__connect__()
            return client.grpclib_peer_certificate(protocol)
        finally:
            channel.close()
    found = asyncio.run(certificate())
    assert isinstance(found, bytes) and client.spki_fingerprint(found) == fingerprint


def test_mtls_client_against_maintenance_node_says_so(lab, secrets):
    node = start_maintenance(lab, 'm-untrusted')
    with client.TalosClient(node.address, credentials=credentials_for(secrets), timeout=5) as talos:
        with pytest.raises(errors.TalosTlsError) as info:
            talos.version()
    assert info.value.reason == 'server_certificate_untrusted'
    assert 'maintenance mode' in str(info.value) and node.address in str(info.value)


def test_tls_refusals_on_a_configured_node(lab, secrets):
    node = configure(lab, 'c-tls', secrets)
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        with pytest.raises(errors.TalosTlsError) as info:
            talos.version()
    assert info.value.reason == 'client_certificate_required' and 'certificate required' in info.value.detail

    stranger = credentials_for(testing.ClusterSecrets())
    with client.TalosClient(node.address, credentials=stranger, timeout=5) as talos:
        with pytest.raises(errors.TalosTlsError) as info:
            talos.version()
    # our client does not trust the node's CA either; both sides refuse, the client notices first
    assert info.value.reason == 'server_certificate_untrusted'

    # right CA pinned on our side, wrong client certificate: the node refuses it (unknown CA)
    foreign = testing.ClusterSecrets()
    crt, key = foreign.admin_client()
    mixed = client.TalosCredentials(secrets.os_crt_pem, crt, key)
    with client.TalosClient(node.address, credentials=mixed, timeout=5) as talos:
        with pytest.raises(errors.TalosTlsError) as info:
            talos.version()
    assert info.value.reason == 'client_certificate_rejected'


def test_an_expired_client_certificate_is_named_as_such(lab, secrets):
    # audit finding 11: Go's TLS server sends certificate_expired for an expired client certificate
    # (crypto/tls handshake_server.go processCertsFromClient, go1.26); the lab's Python TLS server does the same
    node = configure(lab, 'c-expired', secrets)
    key = pki.new_key_like(secrets.os_key)
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, 'os:admin')]))
            .issuer_name(secrets.os_ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=400)).not_valid_after(now - datetime.timedelta(days=35))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(secrets.os_key, None))
    expired = client.TalosCredentials(secrets.os_crt_pem, pki.cert_pem(cert), pki.key_pem(key, talos_label=True))
    with client.TalosClient(node.address, credentials=expired, timeout=5) as talos:
        with pytest.raises(errors.TalosTlsError) as info:
            talos.version()
    assert info.value.reason == 'client_certificate_expired' and 'expired' in str(info.value)


def test_roles_and_ext_key_usage(lab, secrets):
    node = configure(lab, 'c-roles', secrets)
    reader = credentials_for(secrets, organizations=('os:reader',))
    config = testing.render_config(secrets, 'controlplane', ENDPOINT)
    with client.TalosClient(node.address, credentials=reader, timeout=5) as talos:
        assert talos.version()['tag'] == 'v1.13.9'
        with pytest.raises(errors.TalosApiError) as info:
            talos.apply_configuration(config, dry_run=True)
        assert info.value.permission_denied and info.value.talos_message == 'not authorized'
        with pytest.raises(errors.TalosApiError) as info:
            talos.reboot()
        assert info.value.permission_denied

    # apid refuses client certificates whose EKU is not exactly [clientAuth]
    crt, key = secrets.admin_client(server_and_client=True)
    with client.TalosClient(node.address, credentials=client.TalosCredentials(secrets.os_crt_pem, crt, key),
                            timeout=5) as talos:
        with pytest.raises(errors.TalosTlsError) as info:
            talos.version()
    assert info.value.reason == 'client_certificate_rejected' and node.address in str(info.value)


def test_admin_only_calls_are_refused_in_maintenance(lab):
    node = start_maintenance(lab, 'm-admin')
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        for call in (talos.bootstrap, talos.kubeconfig, talos.reset, talos.reboot):
            with pytest.raises(errors.TalosApiError) as info:
                call()
            assert info.value.permission_denied, call


# ------------------------------------------------------------------ apply: validation, dry run, modes


def test_unknown_key_is_invalid_argument_naming_the_key(lab, secrets):
    node = start_maintenance(lab, 'm-unknown')
    config = testing.render_config(secrets, 'controlplane', ENDPOINT, extra_machine={'kubelet': {'imagee': 'x'}})
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        with pytest.raises(errors.TalosApiError) as info:
            talos.apply_configuration(config)
    error = info.value
    assert error.invalid_argument and not isinstance(error, _errors.TransientApiError)
    # Talos's decoder names the document and line (configloader/internal/decoder, pkg/machinery v1.13.9)
    assert error.talos_message.startswith('error decoding document /v1alpha1/ (line 1): unknown keys found during decoding:')
    assert 'machine:\n    kubelet:\n        imagee: x' in error.talos_message
    assert node.mode == 'maintenance' and node.disk.config is None


def test_nodoc_fields_talos_accepts_are_accepted(lab, secrets):
    node = start_maintenance(lab, 'm-nodoc')
    # machine.registries is the legacy form of registry settings, docgen:nodoc in v1.13 but still decoded
    # (pkg/machinery v1.13.9 config/types/v1alpha1/v1alpha1_types.go RegistriesConfig)
    config = testing.render_config(secrets, 'controlplane', ENDPOINT, extra_machine={
        'registries': {'config': {'registry.example.internal': {'auth': {'username': 'puller', 'password': 'pw'}}}},
        'features': {'rbac': True, 'apidCheckExtKeyUsage': True}})
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        assert talos.apply_configuration(config, dry_run=True)['mode'] == 'no-reboot'


@pytest.mark.parametrize('machine_type, render, message', [
    ('worker', {'extra_machine': {'ca': {'crt': 'eA==', 'key': 'eA=='}}},
     'issuing Talos API CA key is not allowed on non-controlplane nodes (.machine.ca)'),
    ('controlplane', {'extra_machine': {'ca': {'crt': 'eA==', 'key': ''}}},
     'issuing CA key is required for controlplane nodes (.machine.ca.key)'),
    ('controlplane', {'install_disk': ''}, 'either install disk or diskSelector should be defined'),
    ('worker', {'extra_cluster': {'etcd': {'advertisedSubnets': ['10.0.0.0/8']}}},
     'etcd config is only allowed on control plane machines'),
    ('controlplane', {'extra_cluster': {'controlPlane': {'endpoint': 'https://'}}}, 'invalid controlplane endpoint'),
    ('worker', {'extra_machine': {'type': 'router'}}, 'unknown machine type "router"'),
    ('controlplane', {'extra_machine': {'certSANs': 'one'}}, 'cannot construct !!str `one` into []string'),
])
def test_validation_rules(lab, secrets, machine_type, render, message):
    node = lab.start('m-rules-%s-%d' % (machine_type, len(message)))
    lab.wait(lambda: node.mode == 'maintenance', what='maintenance')
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        with pytest.raises(errors.TalosApiError) as info:
            talos.apply_configuration(testing.render_config(secrets, machine_type, ENDPOINT, **render), dry_run=True)
    assert info.value.invalid_argument and message in info.value.talos_message
    lab.delete(node.name)


def test_dry_run_diff_and_auto_mode(lab, secrets):
    node = configure(lab, 'c-dry', secrets)
    credentials = credentials_for(secrets)
    same = testing.render_config(secrets, 'controlplane', ENDPOINT)
    live = testing.render_config(secrets, 'controlplane', ENDPOINT, extra_machine={'certSANs': ['cp.example.org']})
    # CanApplyImmediate (v1alpha1_runtime.go:130-217): machine.install applies live, machine.udev needs a reboot
    install = testing.render_config(secrets, 'controlplane', ENDPOINT, install_disk='/dev/vdb')
    udev = testing.render_config(secrets, 'controlplane', ENDPOINT, install_disk='/dev/vdb',
                                 extra_machine={'udev': {'rules': [UDEV_RULE]}})
    with client.TalosClient(node.address, credentials=credentials, timeout=5) as talos:
        unchanged = talos.apply_configuration(same, dry_run=True)
        assert unchanged['mode_details'].startswith('Dry run summary:\n')
        assert unchanged['mode_details'].endswith('Config diff:\n\nNo changes.')

        preview = talos.apply_configuration(live, dry_run=True)
        assert preview['mode'] == 'no-reboot'
        # Talos's own diff text (configdiff.DiffConfigs: the documents as Talos encodes them, 4-space indents)
        assert '-    certSANs: []' in preview['mode_details'] and '+        - cp.example.org' in preview['mode_details']
        details = preview['mode_details']
        # Talos does not redact it: a secret in the hunk's context shows in clear, as on a real node ...
        os_key = base64.b64encode(secrets.os_key_pem).decode()
        assert os_key in details
        # ... and the collection masks it before showing it
        assert os_key not in redact.node_text(details) and 'cp.example.org' in redact.node_text(details)
        assert node.disk.config.cert_sans == []  # a dry run changes nothing

        assert talos.apply_configuration(install, dry_run=True)['mode'] == 'no-reboot'
        reboot = talos.apply_configuration(udev, dry_run=True)
        assert reboot['mode'] == 'reboot'
        assert reboot['mode_details'].startswith('Dry run summary:\nApplied configuration with a reboot (skipped in dry-run).\n')

        applied = talos.apply_configuration(live)
        assert applied['mode'] == 'no-reboot' and applied['mode_details'] == 'Applied configuration without a reboot'
    assert node.disk.config.cert_sans == ['cp.example.org'] and node.mode == 'configured'

    with client.TalosClient(node.address, credentials=credentials, timeout=5) as talos:
        assert talos.apply_configuration(live, dry_run=True)['mode_details'].endswith('No changes.')
        applied = talos.apply_configuration(install, mode='no-reboot')
        assert applied['mode'] == 'no-reboot' and node.disk.config.install_disk == '/dev/vdb'
        with pytest.raises(errors.TalosApiError) as info:
            talos.apply_configuration(udev, mode='no-reboot')
        assert info.value.invalid_argument
        assert info.value.talos_message.startswith("this config change can't be applied in immediate mode\ndiff:\n")
        assert '+    udev:' in info.value.talos_message and UDEV_RULE in info.value.talos_message
        auto = talos.apply_configuration(udev, mode='auto')
        assert auto['mode'] == 'reboot'
        assert auto['mode_details'].startswith("Applied configuration with a reboot: this config change can't be applied")
    lab.wait(lambda: node.boot_count == 3 and node.mode == 'configured', what='reboot after apply')
    assert node.disk.config.machine['udev'] == {'rules': [UDEV_RULE]}


def test_staged_config_waits_for_the_next_reboot(lab, secrets):
    node = configure(lab, 'c-staged', secrets)
    staged = testing.render_config(secrets, 'controlplane', ENDPOINT, extra_machine={'certSANs': ['staged.example']})
    credentials = credentials_for(secrets)
    with client.TalosClient(node.address, credentials=credentials, timeout=5) as talos:
        result = talos.apply_configuration(staged, mode='staged')
        assert result == {'mode': 'staged', 'mode_details': 'Staged configuration to be applied after the next reboot',
                          'warnings': []}
        assert node.disk.config.cert_sans == []
        talos.reboot()
    lab.wait(lambda: node.boot_count == 3 and node.mode == 'configured', what='reboot')
    assert node.disk.config.cert_sans == ['staged.example'] and node.disk.staged is None


def test_apply_reject_fault(lab, secrets):
    node = start_maintenance(lab, 'm-reject')
    lab.fault('talos-apply-reject', node.name, message='machine.install.disk: no such disk /dev/sda')
    config = testing.render_config(secrets, 'controlplane', ENDPOINT)
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        with pytest.raises(errors.TalosApiError) as info:
            talos.apply_configuration(config)
        assert info.value.invalid_argument and info.value.talos_message == 'machine.install.disk: no such disk /dev/sda'
        assert not lab.faults.is_active('talos-apply-reject', node.name)  # one apply only
        assert talos.apply_configuration(config, dry_run=True)['mode'] == 'no-reboot'


# ------------------------------------------------------------------ bootstrap, etcd, kubeconfig


def test_bootstrap_etcd_and_second_bootstrap(lab, secrets):
    first = configure(lab, 'c-boot-1', secrets)
    credentials = credentials_for(secrets)
    assert services(first, credentials)['etcd']['state'] == 'Preparing'
    with client.TalosClient(first.address, credentials=credentials, timeout=1) as talos:
        with pytest.raises(errors.TalosTransientError) as waited:
            talos.etcd_member_list()  # no etcd yet: Talos' etcd client waits until the caller's deadline
        assert waited.value.code == 'DEADLINE_EXCEEDED'
    with client.TalosClient(first.address, credentials=credentials, timeout=5) as talos:
        assert talos.bootstrap() == {}

    def etcd_and_kubelet_healthy():
        current = services(first, credentials)
        return current['etcd']['healthy'] and current['kubelet']['healthy'], dict(
            (name, (item['state'], item['healthy'])) for name, item in current.items())
    wait_until(etcd_and_kubelet_healthy, 'etcd and kubelet healthy on %s' % first.name)

    # once etcd runs, its data directory is not empty: a second Bootstrap is refused (v1alpha1_server.go:457-459).
    # Asked right after the first, it raced the lab's etcd start, which writes the directory.
    with client.TalosClient(first.address, credentials=credentials, timeout=5) as talos:
        with pytest.raises(errors.TalosApiError) as info:
            talos.bootstrap()
        assert info.value.already_exists and info.value.talos_message == 'etcd data directory is not empty'

    second = configure(lab, 'c-boot-2', secrets)
    third = configure(lab, 'c-boot-3', secrets)

    def three_members():
        with client.TalosClient(first.address, credentials=credentials, timeout=5) as talos:
            members = talos.etcd_member_list()
        return len(members) == 3, members
    members = wait_until(three_members, 'three etcd members')
    assert sorted(m['peer_urls'][0] for m in members) == sorted(
        'https://%s:2380' % n.address for n in (first, second, third))
    assert sorted(m['hostname'] for m in members) == sorted(n.hostname for n in (first, second, third))

    with client.TalosClient(third.address, credentials=credentials, timeout=5) as talos:
        with pytest.raises(errors.TalosApiError) as info:
            talos.bootstrap()  # third joined: its own etcd data directory is not empty
        assert info.value.already_exists
        wait_until(lambda: (talos.etcd_status()['leader'] == members[0]['id'], 'leader'), 'etcd status on third')
        status = talos.etcd_status()
        assert status['member_id'] in [m['id'] for m in members] and status['raft_index'] > 0

    worker = configure(lab, 'c-boot-w', secrets, machine_type='worker')
    with client.TalosClient(worker.address, credentials=credentials, timeout=5) as talos:
        with pytest.raises(errors.TalosApiError) as info:
            talos.bootstrap()
        assert info.value.unimplemented
        with pytest.raises(errors.TalosApiError) as info:
            talos.kubeconfig()
        assert info.value.unimplemented and 'control plane' in info.value.talos_message
        with pytest.raises(errors.TalosApiError) as info:
            talos.etcd_member_list()  # CheckControlplane (v1alpha1_server.go:1818)
        assert info.value.unimplemented and info.value.talos_message == 'member list is only available on control plane nodes'
        assert 'etcd' not in dict((s['id'], s) for s in talos.service_list())


def test_kubeconfig_is_decoded_from_the_tar_stream(lab, secrets):
    # cluster.acceptedCAs go first in certificate-authority-data, the issuing CA last (pkg/kubeconfig/generate.go:36-40,
    # 101), and the kubeconfig is served from the config alone, before any bootstrap (v1alpha1_server.go:1260-1301)
    other_ca, dummy_key = pki.make_ca('kubernetes', key_type='ecdsa')
    node = configure(lab, 'c-kube', secrets, cluster_name='lab-kube',
                     extra_cluster={'acceptedCAs': [{'crt': base64.b64encode(pki.cert_pem(other_ca)).decode()}]})
    credentials = credentials_for(secrets)
    assert services(node, credentials)['etcd']['state'] == 'Preparing'
    with client.TalosClient(node.address, credentials=credentials, timeout=5) as talos:
        text = talos.kubeconfig()
    config = yaml.safe_load(text)
    bundle = base64.b64decode(config['clusters'][0]['cluster']['certificate-authority-data'])
    assert x509.load_pem_x509_certificates(bundle) == [other_ca, secrets.k8s_ca]
    assert config['current-context'] == 'admin@lab-kube'
    assert config['clusters'][0]['cluster']['server'] == ENDPOINT
    assert config['contexts'][0] == {'name': 'admin@lab-kube', 'context': {
        'cluster': 'lab-kube', 'namespace': 'default', 'user': 'admin@lab-kube'}}
    cert = x509.load_pem_x509_certificate(base64.b64decode(config['users'][0]['user']['client-certificate-data']))
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == 'admin'
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == 'system:masters'
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    cert.verify_directly_issued_by(secrets.k8s_ca)

    archive = lab.call(node.kubeconfig_archive)
    with tarfile.open(fileobj=io.BytesIO(archive), mode='r:gz') as tar:
        member = tar.getmember('kubeconfig')
    assert member.mode == 0o600
    assert not archive.endswith(b'\0' * 1024)  # as Talos: no end-of-archive blocks (inside the gzip)


def test_workers_get_their_certificate_from_a_control_plane(lab):
    secrets = testing.ClusterSecrets()
    worker = start_maintenance(lab, 'w-early')
    # trustd authenticates a worker by machine.token (internal/app/trustd/main.go:92, 138-147): a worker whose token
    # is not the control plane's never gets its apid certificate (audit finding 15)
    stranger = start_maintenance(lab, 'w-wrong-token')
    with client.TalosClient(worker.address, insecure=True, timeout=5) as talos:
        talos.apply_configuration(testing.render_config(secrets, 'worker', ENDPOINT))
    with client.TalosClient(stranger.address, insecure=True, timeout=5) as talos:
        talos.apply_configuration(testing.render_config(secrets, 'worker', ENDPOINT,
                                                        extra_machine={'token': 'abcdef.0123456789abcdef'}))
    lab.wait(lambda: worker.phase == 'running' and stranger.phase == 'running', what='workers booted')
    assert worker.mode == 'booting' and worker.server is None  # no control plane holds the CA key yet
    with client.TalosClient(worker.address, credentials=credentials_for(secrets), timeout=2) as talos:
        with pytest.raises(errors.TalosTransientError) as info:
            talos.version()
    assert worker.address in str(info.value)
    configure(lab, 'w-early-cp', secrets)
    version = mtls_version(worker, credentials_for(secrets))
    assert version['tag'] == 'v1.13.9'
    kubelet = services(worker, credentials_for(secrets))['kubelet']
    assert kubelet['state'] == 'Running' and kubelet['healthy']
    assert stranger.mode == 'booting' and stranger.server is None


# ------------------------------------------------------------------ services, reboot, reset, faults


def test_service_events_are_plausible(lab, secrets):
    node = configure(lab, 'c-services', secrets)
    current = services(node, credentials_for(secrets))
    assert {'machined', 'apid', 'trustd', 'containerd', 'cri', 'udevd', 'etcd', 'kubelet'} <= set(current)
    apid = current['apid']
    assert apid['healthy'] and apid['events'][-1]['state'] == 'Running'
    assert [event['state'] for event in apid['events']][:1] == ['Waiting']
    stamps = [event['ts'] for event in apid['events']]
    assert stamps == sorted(stamps) and stamps[0].startswith('20')
    assert current['kubelet']['state'] == 'Waiting'  # control plane: after etcd
    assert current['etcd']['events'][-1]['msg'] == 'Running pre state'


def test_reboot_hang_is_observed(lab, secrets):
    node = configure(lab, 'c-hang', secrets)
    lab.fault('talos-reboot-hang', node.name)
    credentials = credentials_for(secrets)
    with client.TalosClient(node.address, credentials=credentials, timeout=5) as talos:
        assert talos.reboot()['actor_id']
    lab.wait(lambda: node.phase == 'hung', what='hung reboot')
    with client.TalosClient(node.address, credentials=credentials, timeout=2) as talos:
        with pytest.raises(errors.TalosTransientError) as info:
            talos.version()
    assert 'unreachable' in str(info.value) and node.address in str(info.value)
    # clearing the fault does not revive a hung machine; a power cycle does
    lab.clear('talos-reboot-hang', node.name)
    lab.stop(node.name)
    lab.start(node.name)
    assert mtls_version(node, credentials)['tag'] == 'v1.13.9'


def test_unreachable_node_runs_into_the_deadline_and_is_named(lab):
    node = start_maintenance(lab, 'm-unreach')
    lab.fault('talos-unreachable', node.name)
    with client.TalosClient(node.address, insecure=True, timeout=0.5) as talos:
        with pytest.raises(errors.TalosTransientError) as info:
            talos.version()
    assert info.value.code == 'DEADLINE_EXCEEDED' and node.address in str(info.value)
    lab.clear('talos-unreachable', node.name)
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        assert talos.version()['tag'] == 'v1.13.9'


def test_stopped_vm_is_connection_refused(lab):
    node = start_maintenance(lab, 'm-stopped')
    lab.stop(node.name)
    with pytest.raises(errors.TalosTransientError) as info:
        client.probe_maintenance(node.address, timeout=2)
    assert info.value.code == 'UNAVAILABLE' and '%s:50000' % node.address in str(info.value)


def test_power_cut_keeps_the_disk(lab, secrets):
    node = configure(lab, 'c-power', secrets)
    credentials = credentials_for(secrets)
    lab.stop(node.name)
    assert node.services == {} and node.disk.config is not None
    lab.start(node.name)
    assert mtls_version(node, credentials)['tag'] == 'v1.13.9'  # configured again, from its disk
    lab.delete(node.name)
    fresh = lab.start('c-power')
    lab.wait(lambda: fresh.mode == 'maintenance', what='a new VM boots into maintenance')
    assert fresh.disk.config is None


def test_reset_wipes_back_to_maintenance(lab, secrets):
    node = configure(lab, 'c-reset', secrets)
    with client.TalosClient(node.address, credentials=credentials_for(secrets), timeout=5) as talos:
        with pytest.raises(errors.TalosApiError) as info:
            talos.reset(wipe_mode='user-disks', system_partitions={'STATE': True})
        assert info.value.code == 'UNKNOWN'   # a plain Go error (v1alpha1_server.go:710-712)
        assert talos.reset(graceful=True, reboot=True)['actor_id']
    lab.wait(lambda: node.mode == 'maintenance', what='maintenance after reset')
    assert node.disk.config is None and client.probe_maintenance(node.address) is True


def test_kubelet_volume_fault(lab, secrets):
    node = start_maintenance(lab, 'w-volume')
    configure(lab, 'w-volume-cp', secrets)
    lab.fault('talos-kubelet-volume', node.name, p=0.0)
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        talos.apply_configuration(testing.render_config(secrets, 'worker', ENDPOINT))
    credentials = credentials_for(secrets)
    mtls_version(node, credentials)

    def kubelet():
        try:
            item = services(node, credentials)['kubelet']
        except errors.TalosTransientError as exc:  # rebooting or reset: the port is closed for a moment
            return False, str(exc)
        return True, (item['state'], item['events'][-1]['msg'], item['healthy'])
    stuck = ('Waiting', 'Waiting for volume "/var/lib/kubelet" to be mounted', False)
    assert wait_until(lambda: (kubelet()[1] == stuck, kubelet()[1]), 'kubelet waiting for its volume') == stuck

    with client.TalosClient(node.address, credentials=credentials, timeout=5) as talos:
        talos.reboot()  # p=0: a Talos reboot does not help
    lab.wait(lambda: node.boot_count == 3 and node.mode == 'configured', what='reboot')
    assert wait_until(lambda: (kubelet()[1] == stuck, kubelet()[1]), 'still waiting after a Talos reboot') == stuck

    lab.loop.run(lab.fleet.on_vm_reset(type('Vm', (), {'vmid': node.key, 'name': node.name})(), node.address))
    running = ('Running', 'Started task kubelet (PID 2601) for container kubelet', True)
    assert wait_until(lambda: (kubelet()[1] == running, kubelet()[1]), 'kubelet running after a PVE reset') == running
    assert not lab.faults.is_active('talos-kubelet-volume', node.name)


def test_kubelet_volume_fault_cleared_by_a_lucky_talos_reboot(lab, secrets):
    configure(lab, 'w-lucky-cp', secrets)
    node = start_maintenance(lab, 'w-lucky')
    lab.fault('talos-kubelet-volume', node.name, p=1.0)
    with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
        talos.apply_configuration(testing.render_config(secrets, 'worker', ENDPOINT))
    credentials = credentials_for(secrets)
    mtls_version(node, credentials)
    wait_until(lambda: (services(node, credentials)['kubelet']['state'] == 'Waiting', 'kubelet'), 'kubelet stuck')
    with client.TalosClient(node.address, credentials=credentials, timeout=5) as talos:
        talos.reboot()
    lab.wait(lambda: node.boot_count == 3 and node.mode == 'configured', what='reboot')
    wait_until(lambda: (services(node, credentials)['kubelet']['healthy'], 'kubelet'), 'kubelet healthy')


def test_status_section(lab, secrets):
    node = configure(lab, 'c-status', secrets)
    status = lab.call(lab.fleet.status)
    entry = next(item for item in status['nodes'] if item['name'] == node.name)
    assert entry['address'] == node.address and entry['mode'] == 'configured'
    assert entry['machine_type'] == 'controlplane' and entry['services']['apid'] == 'Running/healthy'
    assert any(request['node'] == node.name and request['method'] == '/machine.MachineService/ApplyConfiguration'
               for request in lab.fleet.requests)


# ------------------------------------------------------------------ with the collection's own renderer


def test_collection_rendered_configs_and_talosconfig_work_against_the_lab(lab):
    """config.render_machine_config + talosconfig.render_talosconfig (the collection's own code)."""
    from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import config as talos_config
    from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import secrets as talos_secrets
    from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import talosconfig

    bundle = talos_secrets.generate_bundle()
    cluster = {'name': 'rendered', 'endpoint': ENDPOINT}
    cp = start_maintenance(lab, 'r-cp')
    worker = start_maintenance(lab, 'r-worker')
    for node, machine_type in ((cp, 'controlplane'), (worker, 'worker')):
        text = talos_config.render_machine_config(bundle, machine_type, cluster, node={'ip': node.address, 'prefix': 24})
        with client.TalosClient(node.address, insecure=True, timeout=5) as talos:
            assert talos.apply_configuration(text)['mode'] == 'no-reboot'

    ca_crt, dummy = bundle.ca('os')
    crt, key, dummy = talosconfig.admin_credentials(bundle)
    text = talosconfig.render_talosconfig('rendered', [cp.address], ca_crt, crt, key)
    credentials = client.TalosCredentials.from_talosconfig(yaml.safe_load(text))
    assert mtls_version(cp, credentials)['tag'] == 'v1.13.9'
    assert mtls_version(worker, credentials)['tag'] == 'v1.13.9'
    with client.TalosClient(cp.address, credentials=credentials, timeout=5) as talos:
        talos.bootstrap()
    wait_until(lambda: (services(cp, credentials)['etcd']['healthy'], 'etcd'), 'etcd healthy')
    with client.TalosClient(cp.address, credentials=credentials, timeout=5) as talos:
        kubeconfig = yaml.safe_load(talos.kubeconfig())
    assert kubeconfig['current-context'] == 'admin@rendered'


def test_fleet_listeners_hear_etcd_and_kubelet(lab, secrets):
    heard = []

    class Listener(object):
        def on_etcd_bootstrapped(self, cluster_id, node):
            heard.append(('etcd', cluster_id, node.name))

        async def on_kubelet_running(self, node):
            heard.append(('kubelet running', node.name))

        def on_kubelet_stopped(self, node):
            heard.append(('kubelet stopped', node.name))

    lab.call(lab.fleet.add_listener, Listener())
    node = configure(lab, 'c-listen', secrets)
    credentials = credentials_for(secrets)
    with client.TalosClient(node.address, credentials=credentials, timeout=5) as talos:
        talos.bootstrap()
    wait_until(lambda: (('kubelet running', node.name) in heard, list(heard)), 'kubelet running heard')
    with client.TalosClient(node.address, credentials=credentials, timeout=5) as talos:
        talos.reboot()
    wait_until(lambda: (heard.count(('kubelet running', node.name)) == 2, list(heard)), 'kubelet running again')
    mine = [entry for entry in heard if entry[-1] == node.name]
    assert mine == [('etcd', secrets.cluster_id, node.name), ('kubelet running', node.name),
                    ('kubelet stopped', node.name), ('kubelet running', node.name)]
