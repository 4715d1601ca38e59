"""Helpers shared by tests/unit, tests/lab and tests/integration (one copy of each).

Import it as `ansible_collections.proxtalos.cluster.tests.helpers` (conftest.py at the repository root puts
.collections on sys.path). Nothing here imports the lab package: tests/unit may use all of it.

- FakeClock: a monotonic clock that only sleep() moves; callable, or .clock, where code takes a clock function.
- wait_until: poll a probe -> (done, observation) with a deadline; on timeout fail naming what and the last
  observation.
- run_main / run_module: a module's main() in this process as Ansible starts it (arguments in, JSON out).
- apply_one_node: talos_apply on a one-element nodes list; the node's own result with the run's keys over it.
- assert_no_secret: no secret value, nor a long line of one, in a module's output.
- talos_admin_talosconfig: a talosconfig with an os:admin client certificate, made here with `cryptography`.
"""
import base64
import datetime
import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait


class FakeClock(object):
    """Time that passes only when sleep() is called; `listeners` hear the seconds since `start` after each sleep."""

    def __init__(self, start=100.0):
        self.now = start
        self.start = start
        self.sleeps = []
        self.listeners = []

    def __call__(self):
        return self.now

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds
        for listener in self.listeners:
            listener(self.now - self.start)


def wait_until(probe, what, timeout=20.0, interval=0.02, backoff=1.0, max_interval=None):
    """Poll probe() -> (done, observation) with _wait.wait_for until done and return the observation; raise
    AssertionError naming `what` and the last observation when `timeout` seconds pass first."""
    result = _wait.wait_for(probe, timeout, interval=interval, backoff=backoff,
                            max_interval=max_interval if max_interval is not None else max(interval, 1.0))
    if not result.ok:
        raise AssertionError('%s: not reached within %.1f s; last seen: %r' % (what, timeout, result.observation))
    return result.observation


def run_main(module, args, capsys, check_mode=False, diff=False):
    """(exit code, result dict, raw stdout) of module.main() with args (check mode and diff as Ansible passes them)."""
    args = dict(args)
    if check_mode:
        args['_ansible_check_mode'] = True
    if diff:
        args['_ansible_diff'] = True
    with patch_module_args(args):
        with pytest.raises(SystemExit) as caught:
            module.main()
    out = capsys.readouterr().out
    return caught.value.code, json.loads(out), out


def run_module(module, capsys, **args):
    """(result dict, raw stdout) of module.main() with args as keywords."""
    dummy, result, out = run_main(module, args, capsys)
    return result, out


def apply_one_node(module, capsys, address, config, name='n-1', **args):
    """Run talos_apply (`module`) on one node (a one-element nodes list; `config` is written to a 0600 file for its
    config_path). Returns (view, out): the node's own result (when the run got that far) with the run's keys over
    it (changed, failed, msg, diff, gates, failed_nodes), and the module's output."""
    import os  # pylint: disable=import-outside-toplevel
    import tempfile  # pylint: disable=import-outside-toplevel
    handle, path = tempfile.mkstemp(suffix='.yaml')
    try:
        os.fchmod(handle, 0o600)
        os.write(handle, config.encode('utf-8') if isinstance(config, str) else config)
        os.close(handle)
        result, out = run_module(module, capsys, nodes=[{'name': name, 'address': address, 'config_path': path}], **args)
    finally:
        os.unlink(path)
    view = dict(result.get('nodes', {}).get(name, {}))
    view.update((key, value) for key, value in result.items() if key != 'nodes')
    return view, out


def assert_no_secret(out, secret_values):
    """No secret value (nor a line of it longer than 20 characters, PEM armour aside) appears in `out`."""
    for value in secret_values:
        if not value:
            continue
        text = value.decode('ascii', 'replace') if isinstance(value, bytes) else str(value)
        assert text not in out
        for line in text.splitlines():
            if len(line) > 20 and not line.startswith('-----'):
                assert line not in out, 'a line of a secret value reached the module output'


def _b64(data):
    return base64.b64encode(data).decode('ascii')


def _talos_key_pem(key):
    """An Ed25519 key as Talos writes it: a PKCS#8 body labelled `ED25519 PRIVATE KEY` (the label
    tests/unit/plugins/module_utils/_talos/fixtures/README.md describes for talosctl's secrets)."""
    from cryptography.hazmat.primitives import serialization  # pylint: disable=import-outside-toplevel
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return pem.replace(b'PRIVATE KEY-----', b'ED25519 PRIVATE KEY-----')


def talos_admin_talosconfig(context='lab', endpoints=(), organizations=('os:admin',)):
    """(talosconfig dict, CA PEM, client certificate PEM, client key PEM) of a new Ed25519 OS CA (O=talos) and a
    client certificate it signed (O=os:admin, ExtKeyUsage clientAuth), as `talosctl gen config` makes them.

    The dict has the shape of a talosconfig file (siderolabs/talos pkg/machinery/client/config/config.go, v1.13.9:
    Config{context, contexts}; Context{endpoints, nodes, ca, crt, key}, the last three base64 of PEM text)."""
    # pylint: disable=import-outside-toplevel
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ed25519.Ed25519PrivateKey.generate()
    ca_name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, 'talos')])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=3650))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, None))
    key = ed25519.Ed25519PrivateKey.generate()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, name) for name in organizations]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, None))
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    crt_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = _talos_key_pem(key)
    config = {'context': context, 'contexts': {context: {
        'endpoints': list(endpoints), 'nodes': [], 'ca': _b64(ca_pem), 'crt': _b64(crt_pem), 'key': _b64(key_pem)}}}
    return config, ca_pem, crt_pem, key_pem
