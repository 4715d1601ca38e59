"""The issue's scenario, as a user runs it: registry credentials and every other kind of secret that Talos
redacts, given as host patches (host_vars of two control planes), then changed, with `--tags secrets,apply --diff -vvv`.

Against the converged lab (whose Talos nodes decode, validate and diff with Talos's own code, and so send
their dry-run diff unredacted, as a real node does), each value, old and new, must be absent from
everything the two runs printed. One test per document kind and path; a last run without the patches puts
the cluster back for the other suites that share it.
"""

import base64
import datetime
import json
import os
import sys

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import NameOID

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_lab import RUN_TIMEOUT  # noqa: E402  pylint: disable=wrong-import-position,import-error

pytestmark = [pytest.mark.lab, pytest.mark.slow]

# The hosts given the patches (control planes: the collection refuses a VIP on a worker). The second carries
# the v1alpha1 paths that Talos refuses beside the first's documents (system disk encryption beside an
# EPHEMERAL VolumeConfig).
HOST = 'lab-cp-1'
SECOND_HOST = 'lab-cp-2'


def _key(seed):
    return base64.b64encode(bytes([seed]) * 32).decode('ascii')


_CLIENT_IDENTITIES = {}


def client_identity(age):
    """A registry client certificate and key (PEM) of the generation `age`, made once per test session."""
    if age not in _CLIENT_IDENTITIES:
        key = ed25519.Ed25519PrivateKey.generate()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'puller-%s' % age)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now)
                .not_valid_after(now + datetime.timedelta(days=1)).sign(key, None))
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode('ascii')
        _CLIENT_IDENTITIES[age] = (cert.public_bytes(serialization.Encoding.PEM).decode('ascii'), key_pem)
    return _CLIENT_IDENTITIES[age]


def _pem_body(pem):
    return ''.join(line for line in pem.splitlines() if not line.startswith('-----'))


def patches(age):
    """Host patches that set a value at every secret path a run can carry, in the generation `age`."""
    def value(name):
        return '%s-%s-value' % (age, name)
    selector = {'diskSelector': {'match': 'disk.transport == "virtio"'}, 'minSize': '1GiB'}

    def encryption(name):
        return {'provider': 'luks2', 'keys': [{'slot': 0, 'static': {'passphrase': value(name)}}]}
    seed = 1 if age == 'old' else 100
    cert, key = client_identity(age)
    return [
        # the legacy form of registry credentials (docgen:nodoc in v1.13, still decoded)
        {'machine': {'registries': {'config': {'legacy.example.internal': {
            'auth': {'username': 'puller', 'password': value('legacy-password'),
                     'auth': base64.b64encode(value('legacy-auth').encode()).decode(),
                     'identityToken': value('legacy-identity-token')},
            'tls': {'clientIdentity': {'crt': base64.b64encode(cert.encode()).decode(),
                                       'key': base64.b64encode(key.encode()).decode()}}}}}}},
        {'apiVersion': 'v1alpha1', 'kind': 'RegistryAuthConfig', 'name': 'registry.example.internal',
         'username': 'puller', 'password': value('typed-password')},
        {'apiVersion': 'v1alpha1', 'kind': 'RegistryAuthConfig', 'name': 'auth.example.internal',
         'auth': base64.b64encode(value('typed-auth').encode()).decode()},
        {'apiVersion': 'v1alpha1', 'kind': 'RegistryAuthConfig', 'name': 'token.example.internal',
         'identityToken': value('typed-identity-token')},
        {'apiVersion': 'v1alpha1', 'kind': 'WireguardConfig', 'name': 'wg0', 'privateKey': _key(seed),
         'peers': [{'publicKey': _key(seed + 1), 'presharedKey': _key(seed + 2), 'allowedIPs': ['10.9.0.0/24']}]},
        {'apiVersion': 'v1alpha1', 'kind': 'HCloudVIPConfig', 'name': '10.5.0.99', 'link': 'ens18',
         'apiToken': value('hcloud-api-token')},
        {'apiVersion': 'v1alpha1', 'kind': 'VolumeConfig', 'name': 'EPHEMERAL', 'encryption': encryption('ephemeral')},
        {'apiVersion': 'v1alpha1', 'kind': 'UserVolumeConfig', 'name': 'data', 'provisioning': selector,
         'encryption': encryption('user-volume')},
        {'apiVersion': 'v1alpha1', 'kind': 'RawVolumeConfig', 'name': 'raw1', 'provisioning': selector,
         'encryption': encryption('raw-volume')},
        {'apiVersion': 'v1alpha1', 'kind': 'SwapVolumeConfig', 'name': 'swap1', 'provisioning': selector,
         'encryption': encryption('swap-volume')},
        {'apiVersion': 'v1alpha1', 'kind': 'SideroLinkConfig',
         'apiUrl': 'https://siderolink.example.invalid:8099/?jointoken=%s' % value('join-token'),
         'uniqueToken': value('unique-token')},
        {'apiVersion': 'v1alpha1', 'kind': 'RegistryTLSConfig', 'name': 'registry.example.internal',
         'clientIdentity': {'cert': cert, 'key': key}},
    ]


def second_patches(age):
    """v1alpha1 patches of the second host: WireGuard and VIP provider tokens on interfaces and VLANs, and the
    system disk encryption passphrases, in the generation `age`."""
    def value(name):
        return '%s-%s-value' % (age, name)
    seed = 50 if age == 'old' else 150

    def encryption(name):
        return {'provider': 'luks2', 'keys': [{'slot': 0, 'static': {'passphrase': value(name)}}]}
    return [{'machine': {
        'network': {'interfaces': [
            {'interface': 'dummy0', 'dummy': True, 'addresses': ['198.51.100.1/24'],
             'wireguard': {'privateKey': _key(seed), 'listenPort': 51820},
             'vip': {'ip': '198.51.100.9', 'equinixMetal': {'apiToken': value('equinix-interface')}},
             'vlans': [{'vlanId': 10, 'addresses': ['198.51.101.1/24'],
                        'vip': {'ip': '198.51.101.9', 'hcloud': {'apiToken': value('hcloud-vlan')}}}]},
            {'interface': 'dummy1', 'dummy': True, 'addresses': ['198.51.102.1/24'],
             'vip': {'ip': '198.51.102.9', 'hcloud': {'apiToken': value('hcloud-interface')}},
             'vlans': [{'vlanId': 11, 'addresses': ['198.51.103.1/24'],
                        'vip': {'ip': '198.51.103.9', 'equinixMetal': {'apiToken': value('equinix-vlan')}}}]}]},
        'systemDiskEncryption': {'state': encryption('state'), 'ephemeral': encryption('ephemeral-v1alpha1')}}}]


def _interface(patch_list, index):
    return patch_list[0]['machine']['network']['interfaces'][index]


# (document kind, path, how the value is found in a patch list)
SECOND_CASES = [
    ('v1alpha1', 'machine.network.interfaces.*.wireguard.privateKey', lambda p: _interface(p, 0)['wireguard']['privateKey']),
    ('v1alpha1', 'machine.network.interfaces.*.vip.equinixMetal.apiToken', lambda p: _interface(p, 0)['vip']['equinixMetal']['apiToken']),
    ('v1alpha1', 'machine.network.interfaces.*.vip.hcloud.apiToken', lambda p: _interface(p, 1)['vip']['hcloud']['apiToken']),
    ('v1alpha1', 'machine.network.interfaces.*.vlans.*.vip.hcloud.apiToken',
     lambda p: _interface(p, 0)['vlans'][0]['vip']['hcloud']['apiToken']),
    ('v1alpha1', 'machine.network.interfaces.*.vlans.*.vip.equinixMetal.apiToken',
     lambda p: _interface(p, 1)['vlans'][0]['vip']['equinixMetal']['apiToken']),
    ('v1alpha1', 'machine.systemDiskEncryption.state.keys.*.static.passphrase',
     lambda p: p[0]['machine']['systemDiskEncryption']['state']['keys'][0]['static']['passphrase']),
    ('v1alpha1', 'machine.systemDiskEncryption.ephemeral.keys.*.static.passphrase',
     lambda p: p[0]['machine']['systemDiskEncryption']['ephemeral']['keys'][0]['static']['passphrase']),
]

CASES = [
    ('v1alpha1', 'machine.registries.config.*.auth.password', lambda p: p[0]['machine']['registries']['config']['legacy.example.internal']['auth']['password']),
    ('v1alpha1', 'machine.registries.config.*.auth.auth', lambda p: p[0]['machine']['registries']['config']['legacy.example.internal']['auth']['auth']),
    ('v1alpha1', 'machine.registries.config.*.auth.identityToken',
     lambda p: p[0]['machine']['registries']['config']['legacy.example.internal']['auth']['identityToken']),
    ('RegistryAuthConfig', 'password', lambda p: p[1]['password']),
    ('RegistryAuthConfig', 'auth', lambda p: p[2]['auth']),
    ('RegistryAuthConfig', 'identityToken', lambda p: p[3]['identityToken']),
    ('WireguardConfig', 'privateKey', lambda p: p[4]['privateKey']),
    ('WireguardConfig', 'peers.*.presharedKey', lambda p: p[4]['peers'][0]['presharedKey']),
    ('HCloudVIPConfig', 'apiToken', lambda p: p[5]['apiToken']),
    ('VolumeConfig', 'encryption.keys.*.static.passphrase', lambda p: p[6]['encryption']['keys'][0]['static']['passphrase']),
    ('UserVolumeConfig', 'encryption.keys.*.static.passphrase', lambda p: p[7]['encryption']['keys'][0]['static']['passphrase']),
    ('RawVolumeConfig', 'encryption.keys.*.static.passphrase', lambda p: p[8]['encryption']['keys'][0]['static']['passphrase']),
    ('SwapVolumeConfig', 'encryption.keys.*.static.passphrase', lambda p: p[9]['encryption']['keys'][0]['static']['passphrase']),
    ('SideroLinkConfig', 'apiUrl', lambda p: p[10]['apiUrl'].rsplit('=', 1)[-1]),
    ('SideroLinkConfig', 'uniqueToken', lambda p: p[10]['uniqueToken']),
    ('RegistryTLSConfig', 'clientIdentity.key', lambda p: _pem_body(p[11]['clientIdentity']['key'])),
    ('v1alpha1', 'machine.registries.config.*.tls.clientIdentity.key',
     lambda p: p[0]['machine']['registries']['config']['legacy.example.internal']['tls']['clientIdentity']['key']),
]


@pytest.fixture(scope='module')
def changed_runs(converged_cluster):
    """The two runs (the values set, then changed), their output as one text; the cluster put back after."""
    workspace = converged_cluster
    host_vars = dict((host, os.path.join(workspace.inventory, 'host_vars', host + '.yml')) for host in (HOST, SECOND_HOST))
    os.makedirs(os.path.dirname(host_vars[HOST]), exist_ok=True)
    runs = []
    try:
        for age in ('old', 'new'):
            for host, patch_list in ((HOST, patches(age)), (SECOND_HOST, second_patches(age))):
                with open(host_vars[host], 'w', encoding='utf-8') as stream:
                    json.dump({'talos_host_patches': patch_list}, stream)  # JSON is YAML
            run = workspace.run('--tags', 'secrets,apply', '--diff', label='redaction-%s' % age, verbosity=3,
                                callback='ansible.builtin.default', timeout=RUN_TIMEOUT)
            assert run.rc == 0, 'the %s run failed (rc %s); its output: %s' % (age, run.rc, run.stdout_path)
            runs.append(run)
    finally:
        for path in host_vars.values():
            if os.path.exists(path):
                os.remove(path)
        restore = workspace.run('--tags', 'secrets,apply', label='redaction-restore', timeout=RUN_TIMEOUT)
        assert restore.rc == 0, 'putting the cluster back failed; its output: %s' % restore.stdout_path
    return runs, ''.join(run.stdout + run.stderr for run in runs)


def test_the_changed_patches_were_applied_and_diffed(changed_runs):
    runs, output = changed_runs
    # the second run changed the nodes' configs, and its diff was shown with the secrets masked
    assert '<hidden> hmac:' in runs[1].stdout
    assert 'registry.example.internal' in output and 'puller' in output


ALL_CASES = [case + (patches,) for case in CASES] + [case + (second_patches,) for case in SECOND_CASES]


@pytest.mark.parametrize('kind,path,find,patch_list', ALL_CASES, ids=['%s:%s' % case[:2] for case in ALL_CASES])
def test_neither_value_is_printed(changed_runs, kind, path, find, patch_list):
    dummy, output = changed_runs
    for age in ('old', 'new'):
        value = find(patch_list(age))
        assert value not in output, '%s %s (%s value) printed' % (kind, path, age)


def test_every_path_talos_redacts_in_a_patchable_document_is_exercised():
    """Every entry of the collection's table of what Talos redacts is set and changed by a patch here, except the
    cluster secrets of the v1alpha1 document, which come from the secrets bundle (the hygiene suite scans for them)."""
    from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import config  # pylint: disable=import-outside-toplevel
    exercised = set(case[:2] for case in ALL_CASES)
    expected = set((kind, path) for kind, paths in config.TALOS_REDACTED_PATHS.items() for path in paths
                   if not path.startswith(('cluster.', 'machine.token', 'machine.ca.')))
    assert exercised == expected
