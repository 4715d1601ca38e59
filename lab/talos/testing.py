"""Test helpers for the Talos simulation: cluster secrets, machine configs, talosconfig, a fleet.

Until the collection's own renderer (plugins/module_utils/_talos/config.py) is wired in, tests
make their configs here, shaped like `talosctl gen config` output for v1.13 (facts 5.2):
an Ed25519 OS CA written with Talos' `ED25519 PRIVATE KEY` label, an ECDSA P-256 Kubernetes CA,
controlplane and worker documents plus a HostnameConfig document.
"""

import base64
import secrets as _secrets
import string

import yaml

from lab.talos import pki

ALPHABET = string.ascii_lowercase + string.digits


def _b64(data):
    return base64.b64encode(data).decode('ascii')


def _token(rng=_secrets):
    def chars(count):
        return ''.join(rng.choice(ALPHABET) for dummy in range(count))
    return '%s.%s' % (chars(6), chars(16))


class ClusterSecrets(object):
    """The CAs and tokens one cluster's configs share."""

    def __init__(self, os_key_type='ed25519'):
        self.os_ca, self.os_key = pki.make_ca('talos', key_type=os_key_type)
        self.k8s_ca, self.k8s_key = pki.make_ca('kubernetes', key_type='ecdsa')
        self.etcd_ca, self.etcd_key = pki.make_ca('etcd', key_type='ecdsa')
        self.aggregator_ca, self.aggregator_key = pki.make_ca('', key_type='ecdsa', common_name='front-proxy')
        self.cluster_id = base64.urlsafe_b64encode(_secrets.token_bytes(32)).decode('ascii')
        self.cluster_secret = _b64(_secrets.token_bytes(32))
        self.bootstrap_token = _token()
        self.trustd_token = _token()
        self.secretbox = _b64(_secrets.token_bytes(32))

    @property
    def os_crt_pem(self):
        return pki.cert_pem(self.os_ca)

    @property
    def os_key_pem(self):
        """The OS CA key as Talos writes it (Ed25519 keys labelled `ED25519 PRIVATE KEY`)."""
        return pki.key_pem(self.os_key, talos_label=True)

    def admin_client(self, organizations=('os:admin',), server_and_client=False):
        """(crt PEM, key PEM) of a talosctl-style client certificate from the OS CA."""
        key = pki.new_key_like(self.os_key)
        cert = pki.issue(self.os_ca, self.os_key, key, organizations=list(organizations), client=True,
                         server=server_and_client)
        return pki.cert_pem(cert), pki.key_pem(key, talos_label=True)

    def talosconfig(self, name, endpoints=(), organizations=('os:admin',)):
        """A talosconfig dict with one context `name` (every value base64 of PEM text)."""
        crt, key = self.admin_client(organizations)
        return {'context': name, 'contexts': {name: {
            'endpoints': list(endpoints), 'nodes': [], 'ca': _b64(self.os_crt_pem), 'crt': _b64(crt), 'key': _b64(key)}}}


def render_config(secrets, machine_type, endpoint, cluster_name='lab', install_disk='/dev/sda', hostname=None,
                  extra_machine=None, extra_cluster=None, vip=None):
    """A v1.13-style machine config (multi-document YAML bytes) for a controlplane or worker.

    vip: a control plane's layer-2 VIP (a Layer2VIPConfig on ens18), the endpoint's address as a rule.
    """
    control_plane = machine_type == 'controlplane'
    machine = {
        'type': machine_type,
        'token': secrets.trustd_token,
        'ca': {'crt': _b64(secrets.os_crt_pem), 'key': _b64(secrets.os_key_pem) if control_plane else ''},
        'certSANs': [],
        'kubelet': {'image': 'ghcr.io/siderolabs/kubelet:v1.36.3', 'defaultRuntimeSeccompProfileEnabled': True,
                    'disableManifestsDirectory': True},
        'install': {'disk': install_disk, 'image': 'ghcr.io/siderolabs/installer:v1.13.9', 'wipe': False,
                    'grubUseUKICmdline': True},
        'features': {'diskQuotaSupport': True, 'kubePrism': {'enabled': True, 'port': 7445},
                     'hostDNS': {'enabled': True, 'forwardKubeDNSToHost': True}},
    }
    if not install_disk:
        del machine['install']['disk']
    if control_plane:
        machine['nodeLabels'] = {'node.kubernetes.io/exclude-from-external-load-balancers': ''}
    machine.update(extra_machine or {})
    k8s_crt = _b64(pki.cert_pem(secrets.k8s_ca))
    cluster = {
        'id': secrets.cluster_id,
        'secret': secrets.cluster_secret,
        'controlPlane': {'endpoint': endpoint},
        'clusterName': cluster_name,
        'network': {'dnsDomain': 'cluster.local', 'podSubnets': ['10.244.0.0/16'], 'serviceSubnets': ['10.96.0.0/12'],
                    'cni': {'name': 'none'}},
        'token': secrets.bootstrap_token,
        'ca': {'crt': k8s_crt, 'key': ''},
        'discovery': {'enabled': True, 'registries': {'kubernetes': {'disabled': True}, 'service': {}}},
    }
    if control_plane:
        cluster['secretboxEncryptionSecret'] = secrets.secretbox
        cluster['ca'] = {'crt': k8s_crt, 'key': _b64(pki.key_pem(secrets.k8s_key))}
        cluster['aggregatorCA'] = {'crt': _b64(pki.cert_pem(secrets.aggregator_ca)),
                                   'key': _b64(pki.key_pem(secrets.aggregator_key))}
        cluster['etcd'] = {'ca': {'crt': _b64(pki.cert_pem(secrets.etcd_ca)), 'key': _b64(pki.key_pem(secrets.etcd_key))}}
        cluster['apiServer'] = {'image': 'registry.k8s.io/kube-apiserver:v1.36.3', 'certSANs': []}
    cluster.update(extra_cluster or {})
    v1alpha1 = {'version': 'v1alpha1', 'debug': False, 'persist': True, 'machine': machine, 'cluster': cluster}
    hostname_doc = {'apiVersion': 'v1alpha1', 'kind': 'HostnameConfig'}
    if hostname:
        hostname_doc['auto'] = 'off'
        hostname_doc['hostname'] = hostname
    else:
        hostname_doc['auto'] = 'stable'
    text = yaml.safe_dump(v1alpha1, sort_keys=False) + '---\n' + yaml.safe_dump(hostname_doc, sort_keys=False)
    if vip and control_plane:
        text += '---\n' + yaml.safe_dump({'apiVersion': 'v1alpha1', 'kind': 'Layer2VIPConfig', 'name': vip, 'link': 'ens18'},
                                         sort_keys=False)
    return text.encode('utf-8')


def session_net():
    """A loopback /24 for this test process: 127.200.0 - 127.254.255, picked from the process id.

    Away from the lab's default (127.0.10), the manual nets and the nets lab.testing gives whole
    labs (127.100 - 127.199), so parallel sessions and labs do not collide.
    """
    import os  # pylint: disable=import-outside-toplevel
    pid = os.getpid()
    return '127.%d.%d' % (200 + pid % 55, (pid // 55) % 256)


class LoopThread(object):
    """An asyncio loop on a thread of its own: the lab side of tests whose client is synchronous.

    run(coroutine, timeout) runs a coroutine there and returns its result; a timeout raises
    TimeoutError naming what was awaited.
    """

    def __init__(self):
        import asyncio  # pylint: disable=import-outside-toplevel
        import threading  # pylint: disable=import-outside-toplevel
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name='talos-lab-loop', daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout=30.0):
        import asyncio  # pylint: disable=import-outside-toplevel
        import concurrent.futures  # pylint: disable=import-outside-toplevel
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError('lab loop: %r did not finish within %ss' % (coroutine, timeout))

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class FleetHarness(object):
    """A TalosFleet on a LoopThread, for synchronous tests (instant timing unless profile/scale say).

    Nodes get addresses net.11, net.12, ... in the order they are started.
    """

    def __init__(self, net=None, seed=1, profile='instant', scale=0.0):
        from lab.faults import FaultRegistry  # pylint: disable=import-outside-toplevel
        from lab.timing import Timing  # pylint: disable=import-outside-toplevel
        from lab.talos.fleet import TalosFleet  # pylint: disable=import-outside-toplevel
        self.net = net or session_net()
        self.loop = LoopThread()
        self.faults = FaultRegistry()
        self.timing = Timing(profile=profile, scale=scale, seed=seed)

        async def make():
            return TalosFleet(self.timing, faults=self.faults, seed=seed)
        self.fleet = self.loop.run(make())
        self._next_host = 11

    def address(self, host):
        return '%s.%d' % (self.net, host)

    def start(self, name, host=None, media_version=None):
        """Power on a node (a new VM unless `name` is known), booting media_version's ISO when its disk has no Talos
        (None: the lab's default); returns the node."""
        existing = self.fleet.node(name)
        if existing is not None:
            address = existing.address
        else:
            if host is None:
                host = self._next_host
                self._next_host += 1
            address = self.address(host)
        return self.loop.run(self.fleet.start_node(name, name, address, media_version=media_version))

    def stop(self, name):
        self.loop.run(self.fleet.stop_node(self.fleet.node(name).key))

    def delete(self, name):
        self.loop.run(self.fleet.delete_node(self.fleet.node(name).key))

    def wait(self, predicate, timeout=20.0, what='condition'):
        """Block until predicate() holds in the lab (re-checked on every simulated change)."""
        import asyncio  # pylint: disable=import-outside-toplevel

        async def waiter():
            try:
                await asyncio.wait_for(self.fleet.wait_for(predicate), timeout)
            except asyncio.TimeoutError:
                raise TimeoutError('lab: %s not reached within %ss' % (what, timeout))
        self.loop.run(waiter(), timeout + 5)

    def fault(self, name, target, **params):
        return self.loop.run(self.faults.apply(name, target, params))

    def clear(self, name, target=None):
        return self.loop.run(self.faults.clear(name, target))

    def call(self, function, *args, **kwargs):
        """Run a plain function on the lab loop (to read or poke simulation state safely)."""
        async def call():
            return function(*args, **kwargs)
        return self.loop.run(call())

    def close(self):
        try:
            self.loop.run(self.fleet.close())
        finally:
            self.loop.close()
