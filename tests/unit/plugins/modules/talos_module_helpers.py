"""Helpers for the Talos module tests: run a module's main() with arguments, read its JSON result."""
import json

import pytest
from ansible.module_utils.testing import patch_module_args


def run_module(module, capsys, **args):
    """Run module.main() with args; return (result dict, raw stdout)."""
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            module.main()
    out = capsys.readouterr().out
    return json.loads(out), out


def assert_no_secret(out, secret_values):
    """No secret value (nor its first line, for PEM) appears in the module's stdout."""
    for value in secret_values:
        if not value:
            continue
        text = value.decode('ascii', 'replace') if isinstance(value, bytes) else str(value)
        assert text not in out
        for line in text.splitlines():
            if len(line) > 20 and not line.startswith('-----'):
                assert line not in out, 'a line of a secret value reached the module output'


# ---------------------------------------------------------------------------------------------------------
# A fake Talos cluster at the NodeSession seam (probe_mode / call / call_insecure), for module unit tests.
# It keeps the rules the modules rely on: maintenance nodes answer only without client certificates,
# configured ones only over mTLS; a dry run says "No changes." when the config is the running one; an
# apply that reboots makes the node unreachable for a few calls and then report a new boot.

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors  # noqa: E402
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import pki, session  # noqa: E402
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import talosconfig as talos_talosconfig  # noqa: E402


def make_talosconfig(endpoints=('10.5.0.11',)):
    """A real talosconfig text (ECDSA OS CA, os:admin client certificate) and its key PEM."""
    ca_crt, ca_key = pki.new_talos_ca('ecdsa')
    crt, key = pki.new_client_certificate(ca_crt, ca_key)
    return talos_talosconfig.render_talosconfig('demo', list(endpoints), ca_crt, crt, key), key


def service(service_id, state='Running', healthy=True, boot=1, message=None):
    events = [{'msg': 'Starting service', 'state': 'Starting', 'ts': 'boot-%d' % boot},
              {'msg': message or 'Started task %s' % service_id, 'state': state, 'ts': 'boot-%d-later' % boot}]
    return {'id': service_id, 'state': state, 'healthy': state == 'Running' and healthy,
            'health': {'unknown': False, 'healthy': healthy, 'last_message': '' if healthy else 'probe failed',
                       'last_change': None},
            'events': events}


class FakeNode(object):
    """One node. down_calls: how many calls fail as unreachable after a reboot (hang: forever)."""

    def __init__(self, host, mode='configured', config=None, control_plane=True, reboot_on_change=False,
                 down_calls=2, linger_calls=0):
        self.host = host
        self.mode = mode
        self.config = config
        self.control_plane = control_plane
        self.reboot_on_change = reboot_on_change
        self.down_calls = down_calls
        self.linger_calls = linger_calls
        self.linger = 0
        self.down = 0
        self.hang = False
        self.unreachable = False
        self.boot = 1
        self.reject = None
        self.etcd_running = False
        self.members = None
        self.bootstrap_answer = None
        self.kubelet_waiting = False
        self.kubeconfig_data = None
        self.calls = []
        self.name = '%s:50000' % host

    # ---- transport rules ----

    def _reach(self, method, secure):
        self.calls.append((method, secure))
        if self.linger:
            # Still answering from the old boot: the reboot has not started yet.
            self.linger -= 1
            if self.linger == 0:
                self.down = self.down_calls
            return
        if self.unreachable or self.hang:
            raise talos_errors.unreachable(self.name, '/machine.MachineService/' + method, 'connection refused')
        if self.down:
            self.down -= 1
            if self.down == 0 and self.pending_mode is not None:
                self.mode, self.pending_mode = self.pending_mode, None
                self.boot += 1
            raise talos_errors.unreachable(self.name, '/machine.MachineService/' + method, 'connection refused')
        if secure and self.mode == 'maintenance':
            raise talos_errors.TalosTlsError(self.name, 'server_certificate_untrusted', method=method)
        if not secure and self.mode == 'configured':
            raise talos_errors.TalosTlsError(self.name, 'client_certificate_required', method=method)

    pending_mode = None

    def _go_down(self, next_mode, hang=False):
        self.pending_mode = next_mode
        self.hang = hang
        if self.linger_calls:
            self.linger = self.linger_calls
        else:
            self.down = self.down_calls

    # ---- RPCs ----

    def probe_mode(self):
        if self.unreachable or self.hang or self.down:
            self._reach('Disks', False)
        return self.mode

    def apply_configuration(self, data, mode='auto', dry_run=False, try_timeout=None):
        if self.reject:
            raise talos_errors.from_status(self.name, '/machine.MachineService/ApplyConfiguration', 3, self.reject)
        same = self.mode == 'configured' and data == self.config
        if self.mode == 'maintenance':
            resolved = 'no-reboot'
        elif mode == 'auto':
            resolved = 'reboot' if (self.reboot_on_change and not same) else 'no-reboot'
        else:
            resolved = mode
        summary = 'Applied configuration with a reboot' if resolved == 'reboot' else 'Applied configuration without a reboot'
        if dry_run:
            if same:
                diff = 'No changes.'
            else:
                old = (self.config or b'').decode().splitlines()
                diff = '--- a\n+++ b\n' + '\n'.join('+' + line for line in data.decode().splitlines() if line not in old)
            return {'mode': resolved, 'mode_details': 'Dry run summary:\n%s (skipped in dry-run).\n\nConfig diff:\n\n%s'
                    % (summary, diff), 'warnings': []}
        self.calls.append(('apply-for-real', mode))
        self.config = data
        if self.mode == 'maintenance' or resolved == 'reboot':
            self._go_down('configured', hang=self.hang_on_reboot)
        return {'mode': resolved, 'mode_details': summary, 'warnings': []}

    hang_on_reboot = False

    def service_list(self):
        services = [service('machined', boot=self.boot), service('apid', boot=self.boot),
                    service('containerd', boot=self.boot)]
        if self.mode == 'configured':
            services.append(service('kubelet', state='Waiting' if self.kubelet_waiting else 'Running', boot=self.boot,
                                    message='Waiting for volume "/var/lib/kubelet" to be mounted' if self.kubelet_waiting else None))
            if self.control_plane:
                services.append(service('trustd', boot=self.boot))
                services.append(service('etcd', state='Running' if self.etcd_running else 'Preparing', boot=self.boot,
                                        message=None if self.etcd_running else 'Running pre state'))
        return services

    def version(self):
        return {'tag': 'v1.13.9', 'arch': 'amd64', 'platform': {'name': 'metal', 'mode': 'metal'}}

    def etcd_member_list(self):
        if not self.etcd_running or self.members is None:
            raise talos_errors.from_status(self.name, '/machine.MachineService/EtcdMemberList', 14, 'etcd is not running')
        return list(self.members)

    def bootstrap(self):
        self.calls.append(('bootstrap-call', True))
        if self.bootstrap_answer == 'already_exists':
            raise talos_errors.from_status(self.name, '/machine.MachineService/Bootstrap', 6, 'etcd data directory is not empty')
        self.bootstrap_answer = 'already_exists'
        return {}

    def kubeconfig(self):
        return self.kubeconfig_data

    def reboot(self, mode='default'):
        self.calls.append(('reboot-call', mode))
        self._go_down('configured', hang=self.hang_on_reboot)
        return {'actor_id': 'a-1'}


class FakeCluster(object):
    """Nodes by address; install(monkeypatch) routes NodeSession to them."""

    def __init__(self, *nodes):
        self.nodes = dict((node.host, node) for node in nodes)

    def install(self, monkeypatch):
        cluster = self

        def probe_mode(node_session):
            return cluster.nodes[node_session.host].probe_mode()

        def call(node_session, method, *args, **kwargs):
            node = cluster.nodes[node_session.host]
            node._reach(method, True)  # pylint: disable=protected-access
            return getattr(node, method)(*args, **kwargs)

        def call_insecure(node_session, method, *args, **kwargs):
            node = cluster.nodes[node_session.host]
            node._reach(method, False)  # pylint: disable=protected-access
            return getattr(node, method)(*args, **kwargs)
        monkeypatch.setattr(session.NodeSession, 'probe_mode', probe_mode)
        monkeypatch.setattr(session.NodeSession, 'call', call)
        monkeypatch.setattr(session.NodeSession, 'call_insecure', call_insecure)
        return self
