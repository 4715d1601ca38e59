"""Helpers for the Talos module tests: a fake Talos cluster and a talosconfig (running a module and checking its
output for secrets: tests/helpers.py)."""

# ---------------------------------------------------------------------------------------------------------
# A fake Talos cluster at the NodeSession seam (probe_mode / call / call_insecure), for module unit tests.
# It keeps the rules the modules rely on: maintenance nodes answer only without client certificates,
# configured ones only over mTLS; a dry run says "No changes." when the config is the running one; an
# apply that reboots makes the node unreachable for a few calls and then report a new boot. Apply modes
# follow Talos (facts 1.3): staged is kept for the next boot, try runs unpersisted until revert_try() (the
# try timeout passing) or a reboot, and any request in another mode cancels a pending revert; no-reboot and
# try refuse a change that needs a reboot. Every ApplyConfiguration is recorded in `applies`.

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import pki, session
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import talosconfig as talos_talosconfig


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
        self.etcd_events = None     # [(state, message)]: the etcd service's events this boot, instead of the default
        self.member_list_error = None   # (code number, message) EtcdMemberList answers instead of waiting
        self.members = None
        self.bootstrap_answer = None
        self.kubelet_waiting = False
        self.kubeconfig_data = None
        self.calls = []
        self.applies = []
        self.staged = None
        self.persisted = None
        self.try_previous = None
        self.try_pending = False
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
                self._boot_config()
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

    def _boot_config(self):
        """A new boot runs the persisted config: a staged one, else the one a try hid."""
        if self.staged is not None:
            self.config = self.staged
        elif self.persisted is not None:
            self.config = self.persisted
        self.staged = self.persisted = self.try_previous = None
        self.try_pending = False

    def revert_try(self):
        """The try timeout passed: Talos sets back the config that ran before the try apply."""
        assert self.try_pending, 'no try-mode apply is pending on %s' % self.name
        self.config, self.try_previous, self.try_pending = self.try_previous, None, False
        if self.persisted == self.config:
            self.persisted = None

    def apply_configuration(self, data, mode='auto', dry_run=False, try_timeout=None):
        self.applies.append({'mode': mode, 'dry_run': dry_run, 'try_timeout': try_timeout})
        if mode != 'try' and self.try_pending:
            self.try_pending = False  # Talos' CancelConfigRollbackTimeout: the tried config keeps running
            self.calls.append(('try-revert-cancelled', mode))
        if self.reject:
            raise talos_errors.from_status(self.name, '/machine.MachineService/ApplyConfiguration', 3, self.reject)
        same = self.mode == 'configured' and data == self.config
        needs_reboot = self.reboot_on_change and not same
        if self.mode == 'maintenance':
            resolved = 'no-reboot'
        elif mode == 'auto':
            resolved = 'reboot' if needs_reboot else 'no-reboot'
        elif mode in ('no-reboot', 'try') and needs_reboot:
            # CanApplyImmediate's error, answered as InvalidArgument (siderolabs/talos v1.13.9 v1alpha1_runtime.go:213,
            # v1alpha1_server.go:246-249)
            raise talos_errors.from_status(self.name, '/machine.MachineService/ApplyConfiguration', 3,
                                           "this config change can't be applied in immediate mode\ndiff:\n"
                                           "--- a\n+++ b\n@@ -1 +1 @@\n-machine: {}\n+machine: {udev: {}}")
        else:
            resolved = mode
        if resolved == 'reboot':
            summary = 'Applied configuration with a reboot'
        elif resolved == 'staged':
            summary = 'Staged configuration to be applied after the next reboot'
        else:
            summary = 'Applied configuration without a reboot'
        if dry_run:
            if same:
                diff = 'No changes.'
            else:
                old = (self.config or b'').decode().splitlines()
                diff = '--- a\n+++ b\n' + '\n'.join('+' + line for line in data.decode().splitlines() if line not in old)
            return {'mode': resolved, 'mode_details': 'Dry run summary:\n%s (skipped in dry-run).\n\nConfig diff:\n\n%s'
                    % (summary, diff), 'warnings': []}
        self.calls.append(('apply-for-real', mode))
        if resolved == 'staged':
            self.staged = data
        elif resolved == 'try':
            self.persisted = self.persisted or self.config
            self.try_previous, self.config, self.try_pending = self.config, data, True
            summary += ("\nThe config is applied in 'try' mode and will be automatically reverted back in %gs"
                        % (try_timeout or 60))
        else:
            self.config = data
            self.staged = self.persisted = None
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
                etcd = service('etcd', state='Running' if self.etcd_running else 'Preparing', boot=self.boot,
                               message=None if self.etcd_running else 'Running pre state')
                if self.etcd_events:
                    etcd['events'] = [{'msg': msg, 'state': state, 'ts': 'boot-%d-%d' % (self.boot, index)}
                                      for index, (state, msg) in enumerate(self.etcd_events)]
                    etcd['state'] = self.etcd_events[-1][0]
                    etcd['healthy'] = False
                services.append(etcd)
        return services

    def version(self):
        return {'tag': 'v1.13.9', 'arch': 'amd64', 'platform': {'name': 'metal', 'mode': 'metal'}}

    def etcd_member_list(self):
        if self.member_list_error is not None:
            raise talos_errors.from_status(self.name, '/machine.MachineService/EtcdMemberList', *self.member_list_error)
        if not self.etcd_running or self.members is None:
            # Before any etcd answers, Talos' etcd client waits (WaitForReady) until the caller's deadline: the caller
            # sees DEADLINE_EXCEEDED (siderolabs/talos v1.13.9 v1alpha1_server.go:1830-1845, etcd client/v3 v3.6.12
            # options.go defaultCallOpts).
            raise talos_errors.deadline_exceeded(self.name, '/machine.MachineService/EtcdMemberList', 5.0)
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


def apply_over_the_wire(node, data, mode='auto', dry_run=False, try_timeout=None):
    """ApplyConfiguration through the real client code down to the protobuf request, answered by `node`.

    The client's AsyncTalosClient builds the ApplyConfigurationRequest and decodes the reply as it does
    against a node; only its transport (_invoke) is replaced. Each request message lands in node.wire.
    """
    import asyncio  # pylint: disable=import-outside-toplevel
    import types  # pylint: disable=import-outside-toplevel
    from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import api, client  # pylint: disable=import-outside-toplevel
    mode_enum = api.machine.ApplyConfigurationRequest.Mode
    talosctl_mode = dict((value, key) for key, value in client.APPLY_MODES.items())

    async def invoke(self, method, request):
        assert method.path == '/machine.MachineService/ApplyConfiguration'
        node.wire.append(request)
        timeout = request.try_mode_timeout.ToTimedelta().total_seconds() if request.HasField('try_mode_timeout') else None
        answer = node.apply_configuration(request.data, mode=talosctl_mode[mode_enum.Name(request.mode)],
                                          dry_run=request.dry_run, try_timeout=timeout)
        reply = api.machine.ApplyConfigurationResponse()
        reply.messages.add(mode=mode_enum.Value(client.APPLY_MODES[answer['mode']]), mode_details=answer['mode_details'],
                           warnings=answer['warnings'])
        return reply

    talos = client.AsyncTalosClient(node.host, insecure=True)
    talos._invoke = types.MethodType(invoke, talos)  # pylint: disable=protected-access
    return asyncio.run(talos.apply_configuration(data, mode=mode, dry_run=dry_run, try_timeout=try_timeout))


class FakeCluster(object):
    """Nodes by address; install(monkeypatch) routes NodeSession to them.

    wire=True sends ApplyConfiguration through apply_over_the_wire (the protobuf requests in node.wire).
    """

    def __init__(self, *nodes):
        self.nodes = dict((node.host, node) for node in nodes)

    def install(self, monkeypatch, wire=False):
        cluster = self
        for node in self.nodes.values():
            node.wire = []

        def dispatch(node, method, args, kwargs):
            if wire and method == 'apply_configuration':
                return apply_over_the_wire(node, *args, **kwargs)
            return getattr(node, method)(*args, **kwargs)

        def probe_mode(node_session):
            return cluster.nodes[node_session.host].probe_mode()

        def call(node_session, method, *args, **kwargs):
            node = cluster.nodes[node_session.host]
            node._reach(method, True)  # pylint: disable=protected-access
            return dispatch(node, method, args, kwargs)

        def call_insecure(node_session, method, *args, **kwargs):
            node = cluster.nodes[node_session.host]
            node._reach(method, False)  # pylint: disable=protected-access
            return dispatch(node, method, args, kwargs)
        monkeypatch.setattr(session.NodeSession, 'probe_mode', probe_mode)
        monkeypatch.setattr(session.NodeSession, 'call', call)
        monkeypatch.setattr(session.NodeSession, 'call_insecure', call_insecure)
        return self
