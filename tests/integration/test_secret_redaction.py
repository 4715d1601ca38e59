"""The issue's scenario, as a user runs it: registry credentials and every other kind of secret that Talos
redacts, given as host patches (host_vars of one control plane), then changed, with `--tags secrets,apply --diff -vvv`.

Against the converged lab (whose Talos nodes decode, validate and diff with Talos's own code, and so send
their dry-run diff unredacted, as a real node does), each value, old and new, must be absent from
everything the two runs printed. One test per document kind and path; a last run without the patches puts
the cluster back for the other suites that share it.
"""

import base64
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_lab import RUN_TIMEOUT  # noqa: E402  pylint: disable=wrong-import-position,import-error

pytestmark = [pytest.mark.lab, pytest.mark.slow]

# The host given the patches (a control plane: the collection refuses a VIP document on a worker).
HOST = 'lab-cp-1'


def _key(seed):
    return base64.b64encode(bytes([seed]) * 32).decode('ascii')


def patches(age):
    """Host patches that set a value at every secret path a run can carry, in the generation `age`."""
    def value(name):
        return '%s-%s-value' % (age, name)
    selector = {'diskSelector': {'match': 'disk.transport == "virtio"'}, 'minSize': '1GiB'}

    def encryption(name):
        return {'provider': 'luks2', 'keys': [{'slot': 0, 'static': {'passphrase': value(name)}}]}
    seed = 1 if age == 'old' else 100
    return [
        # the legacy form of registry credentials (docgen:nodoc in v1.13, still decoded)
        {'machine': {'registries': {'config': {'legacy.example.internal': {
            'auth': {'username': 'puller', 'password': value('legacy-password'),
                     'auth': base64.b64encode(value('legacy-auth').encode()).decode(),
                     'identityToken': value('legacy-identity-token')}}}}}},
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
    ]


# (document kind, path, how the value is found in a patch list)
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
]


@pytest.fixture(scope='module')
def changed_runs(converged_cluster):
    """The two runs (the values set, then changed), their output as one text; the cluster put back after."""
    workspace = converged_cluster
    host_vars = os.path.join(workspace.inventory, 'host_vars', HOST + '.yml')
    os.makedirs(os.path.dirname(host_vars), exist_ok=True)
    runs = []
    try:
        for age in ('old', 'new'):
            with open(host_vars, 'w', encoding='utf-8') as stream:
                json.dump({'talos_host_patches': patches(age)}, stream)  # JSON is YAML
            run = workspace.run('--tags', 'secrets,apply', '--diff', label='redaction-%s' % age, verbosity=3,
                                callback='ansible.builtin.default', timeout=RUN_TIMEOUT)
            assert run.rc == 0, 'the %s run failed (rc %s); its output: %s' % (age, run.rc, run.stdout_path)
            runs.append(run)
    finally:
        if os.path.exists(host_vars):
            os.remove(host_vars)
        restore = workspace.run('--tags', 'secrets,apply', label='redaction-restore', timeout=RUN_TIMEOUT)
        assert restore.rc == 0, 'putting the cluster back failed; its output: %s' % restore.stdout_path
    return runs, ''.join(run.stdout + run.stderr for run in runs)


def test_the_changed_patches_were_applied_and_diffed(changed_runs):
    runs, output = changed_runs
    # the second run changed the nodes' configs, and its diff was shown with the secrets masked
    assert '<hidden> hmac:' in runs[1].stdout
    assert 'registry.example.internal' in output and 'puller' in output


@pytest.mark.parametrize('kind,path,find', CASES, ids=['%s:%s' % case[:2] for case in CASES])
def test_neither_value_is_printed(changed_runs, kind, path, find):
    dummy, output = changed_runs
    for age in ('old', 'new'):
        value = find(patches(age))
        assert value not in output, '%s %s (%s value) printed' % (kind, path, age)
