# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the Talos modules share: credentials from their options, one node, waits. PRIVATE.

- load_credentials(params, module): the talosconfig of O(talosconfig)/O(talosconfig_content)
  (TALOS_AUTH_SPEC) as client.TalosCredentials, its client key registered as a secret; None
  when neither is given (maintenance mode needs no credentials).
- NodeSession: one node's address with those credentials. client() gives a fresh synchronous
  TalosClient (mTLS, or insecure for maintenance mode); probe_mode() asks the node whether it
  is in maintenance mode (storage.StorageService/Disks without a client certificate).
- wait_until(probe, deadline, interval, what): _wait.wait_for with Talos' transient errors as
  "not yet", raising WaitTimeout that names the node, what was awaited and what was seen last.
  A session may carry the node's inventory host name (`label`): messages then name the node as
  "lab-w-1 (10.5.0.21:50000)" (`display`); `name` stays the address. Every wait takes a progress
  `progress` (_wait.wait_for's one progress hook), so a module that probes several nodes at once
  (_fanout.run_each) can send each node's waits to one progress line (_fanout.ItemsLine) that reports
  which nodes are still not ready.

A fresh client per probe: a node that reboots drops its connections, and a new TLS session is
what tells a maintenance node from a configured one.
"""

from __future__ import annotations

import os

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _secrets, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError, WaitTimeout
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client as talos_client
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import pki
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import talosconfig as talos_talosconfig
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import talosyaml

MAINTENANCE = 'maintenance'
CONFIGURED = 'configured'
TRANSIENT = (talos_errors.TalosTransientError,)


def missing_libraries():
    """[(package, traceback)] the Talos modules need and cannot import."""
    missing = list(talos_client.missing_libraries())
    if not talosyaml.HAS_YAML:
        missing.append(('PyYAML', str(talosyaml.YAML_IMPORT_ERROR)))
    return missing


def talosconfig_text(params):
    """The talosconfig YAML text from the options, or None when none is given."""
    content = params.get('talosconfig_content')
    if content not in (None, ''):
        if isinstance(content, dict):
            return talosyaml.dump(content)
        if isinstance(content, bytes):
            return content.decode('utf-8')
        if not isinstance(content, str):
            raise ValidationError('talosconfig_content', 'must be YAML text or a mapping, got %s' % type(content).__name__)
        return content
    path = params.get('talosconfig')
    if not path or not os.path.exists(path):
        # Not written yet (a first run, check mode): fine for nodes in maintenance mode;
        # NodeSession.require_credentials names the path when mTLS is needed.
        return None
    try:
        with open(path, 'r', encoding='utf-8') as handle:
            return handle.read()
    except (IOError, OSError) as exc:
        raise ValidationError('talosconfig', 'cannot read %s: %s' % (path, exc.strerror or exc))


def load_credentials(params, module=None):
    """client.TalosCredentials from the talosconfig options, or None; the key is masked in output."""
    text = talosconfig_text(params)
    if text is None:
        return None
    field = 'talosconfig_content' if params.get('talosconfig_content') not in (None, '') else 'talosconfig'
    parsed = talos_talosconfig.parse_talosconfig(text, context=params.get('context'), field=field)
    if module is not None:
        _secrets.register(module, parsed.key_pem_talos.decode('ascii', 'replace'), parsed.key_pem.decode('ascii', 'replace'),
                          pki.b64encode_pem(parsed.key_pem_talos))
    return talos_client.TalosCredentials(parsed.ca_pem, parsed.crt_pem, parsed.key_pem_talos)


class NodeSession(object):
    """One Talos node as a module talks to it."""

    def __init__(self, host, port=talos_client.DEFAULT_PORT, api_timeout=talos_client.DEFAULT_TIMEOUT, credentials=None,
                 field='node', talosconfig_path=None, label=None):
        if not host or not isinstance(host, str):
            raise ValidationError(field, 'the node address is required')
        if api_timeout is None or api_timeout <= 0:
            raise ValidationError('api_timeout', 'must be more than zero seconds, got %r' % (api_timeout,))
        self.host = host
        self.port = port
        self.api_timeout = api_timeout
        self.credentials = credentials
        self.field = field
        self.talosconfig_path = talosconfig_path
        self.name = '%s:%d' % (host, port)
        self.label = label
        self.display = '%s (%s)' % (label, self.name) if label else self.name

    @classmethod
    def from_params(cls, params, credentials, host=None, field='node', label=None):
        """A session for params[field] (or host) with the TALOS_AUTH_SPEC options; label: the inventory host."""
        return cls(host if host is not None else params[field], port=params['port'], api_timeout=params['api_timeout'],
                   credentials=credentials, field=field, talosconfig_path=params.get('talosconfig'), label=label)

    def require_credentials(self, why):
        if self.credentials is None:
            missing = ' (there is no file at %s yet)' % self.talosconfig_path if self.talosconfig_path else ''
            raise ValidationError('talosconfig', 'is required%s: talos node %s %s, and only mutual TLS with a talosconfig '
                                                 'client certificate reaches it' % (missing, self.display, why))

    def client(self, insecure=False):
        """A new TalosClient (use it as a context manager)."""
        if insecure:
            return talos_client.TalosClient(self.host, port=self.port, insecure=True, timeout=self.api_timeout)
        self.require_credentials('runs with a machine config')
        return talos_client.TalosClient(self.host, port=self.port, credentials=self.credentials, timeout=self.api_timeout)

    def probe_mode(self):
        """MAINTENANCE or CONFIGURED; raises TalosTransientError when the node does not answer."""
        maintenance = talos_client.probe_maintenance(self.host, port=self.port, timeout=self.api_timeout)
        return MAINTENANCE if maintenance else CONFIGURED

    def call(self, method, *args, **kwargs):
        """One RPC over mTLS on a fresh connection: session.call('service_list')."""
        with self.client() as connection:
            return getattr(connection, method)(*args, **kwargs)

    def call_within(self, seconds, method, *args, **kwargs):
        """One RPC over mTLS like call(), with a deadline of `seconds` instead of api_timeout."""
        quick = NodeSession(self.host, port=self.port, api_timeout=seconds, credentials=self.credentials, field=self.field,
                            talosconfig_path=self.talosconfig_path, label=self.label)
        return quick.call(method, *args, **kwargs)

    def call_insecure(self, method, *args, **kwargs):
        """One RPC without a client certificate (maintenance mode)."""
        with self.client(insecure=True) as connection:
            return getattr(connection, method)(*args, **kwargs)

    def wait_until(self, probe, deadline, interval, what, progress=_wait.FROM_ENVIRONMENT):
        """Poll probe() -> (done, observation) until done or the deadline; WaitTimeout names the node."""
        result = wait_until(probe, deadline, interval, progress=progress)
        if not result.ok:
            raise WaitTimeout('talos node %s: gave up after %gs waiting for %s; last seen: %s'
                              % (self.display, deadline.timeout, what, result.observation), result, node=self.name)
        return result

    def reach(self, deadline, interval, progress=_wait.FROM_ENVIRONMENT):
        """(mode, WaitResult) once the node answers at all (maintenance or configured); WaitTimeout otherwise."""
        seen = {}

        def probe():
            seen['mode'] = self.probe_mode()
            return True, 'answers (%s)' % seen['mode']
        result = self.wait_until(probe, deadline, interval, 'the Talos API answering on port %d' % self.port, progress=progress)
        return seen['mode'], result

    def wait_reachable(self, deadline, interval):
        """The node's mode once it answers at all (maintenance or configured); WaitTimeout otherwise."""
        return self.reach(deadline, interval)[0]


def wait_until(probe, deadline, interval, progress=_wait.FROM_ENVIRONMENT):
    """_wait.wait_for on the remaining time of a shared deadline; transient Talos errors = not yet."""
    return _wait.wait_for(probe, deadline.remaining(), interval=interval, transient=TRANSIENT, progress=progress)


def deadline_for(params):
    """(Deadline, interval) from WAIT_SPEC options; wait=false gives a single probe."""
    timeout, interval = _argspec.wait_params(params)
    return _wait.Deadline(timeout), interval
