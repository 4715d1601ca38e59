# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every call the collection makes to the Proxmox VE API goes through here. PRIVATE to the collection.

- connect(): the proxmoxer client from the PROXMOX_AUTH_SPEC options (API token or password, CA file or
  system trust, a warning when verification is off). No I/O happens when the client is built.
- PveClient: reads retried on transient errors within the module's deadline; writes done once (the
  caller re-observes and decides, so a lost answer never creates or starts something twice);
  wait_task() awaits a UPID on the deadline clock and turns `TASK ERROR` into TaskFailed naming the
  subject (VM, file), the PVE node, the operation and PVE's own message with the tail of the task log.
- classify(): proxmoxer/requests exceptions to _errors types. Transient: HTTP 502/503/504, the proxy's
  595/596, connection resets and timeouts, and the 500s PVE returns for things that pass (lock
  timeouts, lost quorum, locked VMs). Everything else is permanent and fails at once.
- Parsers for PVE property strings ('virtio=BC:24:11:..,bridge=vmbr0'), sizes ('32G') and UPIDs.
"""

from __future__ import annotations

import re
import threading
import time
import traceback

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils import _proxmox_privileges as _privileges

PROXMOXER_IMPORT_ERROR = None
try:
    import requests
    from proxmoxer import ProxmoxAPI
    from proxmoxer.core import AuthenticationError, ResourceException
    HAS_PROXMOXER = True
except ImportError:  # pragma: no cover - the sanity import test runs without them
    HAS_PROXMOXER = False
    PROXMOXER_IMPORT_ERROR = traceback.format_exc()
    ProxmoxAPI = None

    class ResourceException(Exception):  # type: ignore[no-redef]
        """Stand-in so that isinstance() checks work without proxmoxer."""

    class AuthenticationError(Exception):  # type: ignore[no-redef]
        """Stand-in so that isinstance() checks work without proxmoxer."""

SERVICE = 'Proxmox VE'
DEFAULT_PORT = 8006

# HTTP statuses worth another try: gateway trouble and pveproxy's own 595/596 (no route, broken pipe,
# connection refused to the target node). 599 is proxmoxer's "garbled URL", not transient.
TRANSIENT_STATUS = frozenset((502, 503, 504, 595, 596))
# Words in a PVE error (HTTP 500 or a task's exit status) for conditions that pass on their own:
# config and storage lock timeouts, a VM locked by a backup or migration, lost quorum, a busy node.
TRANSIENT_MESSAGES = (
    'got timeout',
    'no quorum',
    'cluster not ready',
    'vm is locked',
    'ct is locked',
    'resource temporarily unavailable',
    'try again',
    'connection refused',
    'connection timed out',
    'broken pipe',
)

# Task type (from the UPID) -> what the user asked for.
TASK_OPERATIONS = {
    'qmcreate': 'create', 'qmdestroy': 'delete', 'qmstart': 'start', 'qmstop': 'stop',
    'qmshutdown': 'shutdown', 'qmreboot': 'reboot', 'qmreset': 'reset', 'qmconfig': 'update config',
    'resize': 'resize disk', 'download': 'download', 'imgcopy': 'upload', 'qmclone': 'clone',
}
LOG_TAIL_LINES = 10
# Connections the HTTPS pool of requests keeps per host unless told otherwise.
POOL_SIZE = 10
# Seconds before the first retry of a transient error; each retry waits twice as long, up to 10 s.
FIRST_RETRY = 0.5


class TransientTaskFailed(_errors.TaskFailed, _errors.TransientApiError):
    """A task that ended in an error worth retrying (a lock timeout, a locked VM)."""


class PermissionDenied(_errors.ApiError):
    """PVE answered 403: the credentials lack a privilege. Never retried, never taken as "not ready yet"."""


def permission_denied(error, method, path):
    """The 403 error with the API call and the privilege the table (_proxmox_privileges) says it needs."""
    call = '%s /%s' % (method.upper(), path.strip('/'))
    if call in error.message:
        return error
    needs = _privileges.explain_403(method, path, refused=error.details.get('pve_message'))
    message = '%s [%s]%s' % (error.message, call, '; ' + needs if needs else '')
    details = dict(error.details)
    details.update(call=call)
    return PermissionDenied(message, **details)


# --------------------------------------------------------------------------------------- client


def connect(params, warn=None, connections=None):
    """A proxmoxer ProxmoxAPI from the PROXMOX_AUTH_SPEC options; nothing is sent yet with a token.

    warn: callable taking a message, told when certificate verification is off.
    connections: how many requests may run at the same time (threads sharing the client); the HTTPS
      connection pool keeps that many connections open (requests keeps 10 by default and drops the rest).
    With a password, proxmoxer logs in at once; PveClient builds the client lazily inside its retry.
    """
    if not HAS_PROXMOXER:
        raise _errors.ProxtalosError('proxmoxer and requests are required on the controller (pip install proxmoxer requests)')
    if params.get('validate_certs', True):
        verify = params.get('ca_path') or True
    else:
        verify = False
        if warn is not None:
            warn('validate_certs is false: the %s API certificate at %s is not verified, so the API token or '
                 'password can be intercepted. Set ca_path to the PVE CA instead.' % (SERVICE, params['api_host']))
        try:
            import urllib3  # pylint: disable=import-outside-toplevel
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        except ImportError:  # pragma: no cover
            pass
    kwargs = dict(user=params['api_user'], verify_ssl=verify, timeout=params.get('api_timeout') or 10)
    if params.get('api_port'):
        kwargs['port'] = params['api_port']
    if params.get('api_token_id'):
        token = params['api_token_id']
        # Accept the full form user@realm!tokenid as well as the id after '!'.
        if '!' in token:
            user, token = token.split('!', 1)
            kwargs['user'] = user
        kwargs['token_name'] = token
        kwargs['token_value'] = params.get('api_token_secret')
    else:
        kwargs['password'] = params.get('api_password')
    api = ProxmoxAPI(params['api_host'], **kwargs)
    if connections and connections > POOL_SIZE:
        proxmoxer_session(api).mount('https://', requests.adapters.HTTPAdapter(pool_maxsize=connections))
    return api


def proxmoxer_session(api):
    """The requests.Session a ProxmoxAPI (https backend) sends every request through.

    proxmoxer 2.x (requirements.txt: proxmoxer>=2.0.0,<3.0.0; read in 2.3.0: core.py ProxmoxAPI.__init__ keeps it in
    its private `_store['session']`, made by backends/https.py Backend.get_session) offers no public way to it, nor
    a way to hand it a session or a pool size: connect() needs it to give the connection pool as many connections as
    threads share the client. tests/unit/plugins/module_utils/test_proxmox.py fails if proxmoxer changes this shape."""
    return api._store['session']  # pylint: disable=protected-access


class SharedApi(object):
    """One ProxmoxAPI for several PveClients on several threads: built once, at the first request of any of them.

    factory: a callable returning a ProxmoxAPI (connect() with `connections` set to the number of threads).
    A factory that raises is tried again by the next caller (PveClient classifies and retries the error).
    """

    def __init__(self, factory):
        self._factory = factory
        self._api = None
        self._lock = threading.Lock()

    def __call__(self):
        with self._lock:
            if self._api is None:
                self._api = self._factory()
            return self._api


def endpoint(params):
    """host:port of the API, for messages."""
    return '%s:%s' % (params.get('api_host'), params.get('api_port') or DEFAULT_PORT)


def _exception_text(exc):
    if isinstance(exc, ResourceException):
        content = getattr(exc, 'content', '') or ''
        text = str(content).strip() or str(getattr(exc, 'status_message', '') or '')
        errors = getattr(exc, 'errors', None)
        if errors:
            if isinstance(errors, dict):
                text = '%s %s' % (text, '; '.join('%s: %s' % (k, str(v).strip()) for k, v in sorted(errors.items())))
            else:
                text = '%s %s' % (text, errors)
        return text.strip()
    return str(exc) or exc.__class__.__name__


def is_hostname_mismatch(text):
    """Whether a TLS error says the certificate does not name the host (OpenSSL and urllib3 wordings)."""
    lowered = (text or '').lower()
    return 'hostname mismatch' in lowered or "doesn't match" in lowered or 'does not match' in lowered \
        or 'ip address mismatch' in lowered


def is_transient_message(text):
    lowered = (text or '').lower()
    return any(word in lowered for word in TRANSIENT_MESSAGES)


def classify(exc, what, subject=None):
    """The _errors type for an exception raised by proxmoxer or requests.

    what: the operation, for the message ('read config', 'create').
    subject: who it is about ('VM 101 (talos-cp-1) on node pve1').
    """
    if isinstance(exc, _errors.ProxtalosError):
        return exc
    prefix = '%s: %s' % (subject, what) if subject else what
    if isinstance(exc, ResourceException):
        status = getattr(exc, 'status_code', None)
        text = _exception_text(exc)
        message = '%s failed: %s API answered %s %s' % (prefix, SERVICE, status, text)
        details = dict(service=SERVICE, status=status, pve_message=text)
        errors = getattr(exc, 'errors', None)
        if isinstance(errors, dict):
            details['pve_errors'] = dict((k, str(v).strip()) for k, v in errors.items())
        if status in TRANSIENT_STATUS or (status == 500 and is_transient_message(text)):
            return _errors.TransientApiError(message, **details)
        if status == 401:
            return _errors.ApiError('%s failed: %s API refused the credentials (401 %s)' % (prefix, SERVICE, text),
                                    **details)
        if status == 403:
            return PermissionDenied('%s failed: permission denied (403 %s)' % (prefix, text), **details)
        return _errors.ApiError(message, **details)
    if isinstance(exc, AuthenticationError):
        return _errors.ApiError('%s failed: %s login refused: %s' % (prefix, SERVICE, exc), service=SERVICE, status=401)
    if HAS_PROXMOXER and isinstance(exc, requests.exceptions.SSLError):
        if is_hostname_mismatch(str(exc)):
            # A CA file cannot help: the certificate does not carry the name or address connected to. A node's
            # default certificate names 127.0.0.1, ::1, localhost, the node's IP, its name and FQDN (pve-cluster
            # src/PVE/Cluster/Setup.pm:497-504), not a VIP, a DNS alias or another node.
            return _errors.ApiError('%s failed: TLS verification of the %s API failed: the certificate does not name '
                                    'the host connected to (%s); set api_host to a name or address the certificate '
                                    'carries (a node\'s default certificate: its IP, its name or FQDN), or give PVE a '
                                    'certificate for that name' % (prefix, SERVICE, exc), service=SERVICE, tls='hostname')
        return _errors.ApiError('%s failed: TLS verification of the %s API failed (%s); set ca_path to the CA that '
                                'signed the PVE certificate (/etc/pve/pve-root-ca.pem for the default certificate; the '
                                'issuer of an ACME or custom certificate, which the system trust may already hold)'
                                % (prefix, SERVICE, exc), service=SERVICE, tls='ca')
    if HAS_PROXMOXER and isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                                          requests.exceptions.ChunkedEncodingError)):
        return _errors.TransientApiError('%s failed: %s API not reachable: %s' % (prefix, SERVICE, exc),
                                         service=SERVICE)
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return _errors.TransientApiError('%s failed: %s API not reachable: %s' % (prefix, SERVICE, exc),
                                         service=SERVICE)
    return None


class PveClient(object):
    """The PVE API with retries of transient errors, all on one deadline.

    factory: a callable returning a ProxmoxAPI, called at the first request (inside the retry, so a
    password login that meets a flaky network is retried too).
    deadline: a _wait.Deadline shared by everything the module does; retries stop when it passes.
    """

    def __init__(self, factory, deadline, interval=FIRST_RETRY, max_interval=10.0, clock=time.monotonic,
                 sleep=time.sleep):
        self._factory = factory
        self._api = None
        self.deadline = deadline
        self.interval = interval
        self.max_interval = max(max_interval, interval)
        self.clock = clock
        self.sleep = sleep
        # Transient errors met and retried: (what, message). Returned by modules so recoveries show.
        self.retried = []

    @property
    def api(self):
        if self._api is None:
            try:
                self._api = self._factory()
            except Exception as exc:  # pylint: disable=broad-exception-caught
                error = classify(exc, 'log in')
                if error is None:
                    raise
                raise error from exc
        return self._api

    def _note(self, what):
        """The progress recorder's note of a request: each retried error goes to `retried`."""
        def note_retry(observation, elapsed, attempts):
            self.retried.append({'what': what, 'error': observation, 'elapsed': round(elapsed, 3), 'attempt': attempts})
        return note_retry

    def request(self, method, path, what, subject=None, retry=True, **params):
        """One API request; with retry, transient errors are retried with backoff until the deadline.

        method: get, post, put or delete. path: 'nodes/pve1/qemu/101/config'.
        Writes that are not idempotent must pass retry=False and re-observe after a TransientApiError.
        """
        def once():
            try:
                return getattr(self.api(path), method)(**params)
            except _errors.ProxtalosError:
                raise
            except Exception as exc:  # pylint: disable=broad-exception-caught
                error = classify(exc, what, subject)
                if error is None:
                    raise
                if isinstance(error, PermissionDenied):
                    error = permission_denied(error, method, path)
                raise error from exc
        if not retry:
            return once()
        return _wait.retry(once, timeout=self.deadline.remaining(), interval=self.interval, backoff=2.0,
                           max_interval=self.max_interval, transient=(_errors.TransientApiError,),
                           progress=_wait.Progress.from_environment(note=self._note(what)), clock=self.clock,
                           sleep=self.sleep)

    def get(self, path, what, subject=None, **params):
        return self.request('get', path, what, subject, **params)

    def wait_task(self, node, upid, timeout, interval, subject=None, operation=None):
        """Wait for a task on the deadline clock; returns the final task status.

        Raises TaskFailed (TransientTaskFailed for lock timeouts) when it ends in an error, and
        WaitTimeout with the last status seen when it is still running at the deadline.
        """
        operation = operation or upid_operation(upid)
        label = '%s: %s' % (subject, operation) if subject else operation
        status = {}

        def probe():
            status.clear()
            status.update(self.request('get', 'nodes/%s/tasks/%s/status' % (node, upid),
                                       'read status of %s task' % operation, subject, retry=False))
            return status.get('status') == 'stopped', 'task %s' % status.get('status', 'unknown')

        # Tasks are often done in well under a second: poll fast at first, then back off to `interval`.
        first = min(0.2, interval)
        result = _wait.wait_for(probe, timeout=min(timeout, self.deadline.remaining()), interval=first, backoff=1.6,
                                max_interval=interval, transient=(_errors.TransientApiError,),
                                clock=self.clock, sleep=self.sleep)
        if not result.ok:
            raise _errors.WaitTimeout('%s: the PVE task on node %s did not finish within %.0f s (last seen: %s; %s)'
                                      % (label, node, result.elapsed, result.observation, upid),
                                      result, upid=upid, node=node)
        exitstatus = status.get('exitstatus', '')
        if exitstatus == 'OK' or str(exitstatus).startswith('WARNINGS'):
            return dict(status)
        log_tail = self.task_log_tail(node, upid, subject, operation)
        message = '%s failed on PVE node %s: TASK ERROR: %s' % (label, node, exitstatus)
        details = dict(service=SERVICE, upid=upid, node=node, operation=operation, exitstatus=exitstatus,
                       task_log=log_tail)
        if is_transient_message(exitstatus):
            raise TransientTaskFailed(message, **details)
        raise _errors.TaskFailed(message, **details)

    def task_log_tail(self, node, upid, subject=None, operation=None):
        """The last lines of a task's log; empty when it cannot be read (the failure is reported anyway)."""
        try:
            lines = self.request('get', 'nodes/%s/tasks/%s/log' % (node, upid), 'read %s task log' % operation,
                                 subject, retry=False, start=0, limit=1000)
        except _errors.ApiError:
            return []
        texts = [str(item.get('t', '')) for item in (lines or []) if isinstance(item, dict)]
        return texts[-LOG_TAIL_LINES:]

    def run_task(self, method, path, node, operation, subject, timeout, interval, wait=True, params=None):
        """Start a task (one request, not retried) and, with wait, await it. Returns the UPID.

        params: the request's parameters (a dict: PVE's own `timeout` must not clash with ours).
        """
        upid = self.request(method, path, operation, subject, retry=False, **(params or {}))
        if wait and isinstance(upid, str) and upid.startswith('UPID:'):
            self.wait_task(upid_node(upid) or node, upid, timeout, interval, subject, operation)
        return upid


# -------------------------------------------------------------------------------------- lookups


def list_vms(client, subject=None):
    """The /cluster/resources entries of type vm (VMs and containers of every PVE node)."""
    return client.get('cluster/resources', 'list VMs', subject, type='vm') or []


def vm_in_resources(resources, vmid):
    """The entry of the VM with this id in a list_vms() answer, or None."""
    for item in resources:
        if str(item.get('vmid')) == str(vmid) and item.get('type', 'qemu') == 'qemu':
            return item
        if str(item.get('vmid')) == str(vmid):
            raise _errors.ValidationError('vmid', 'id %s is taken by a container (%s) on node %s, not a VM'
                                          % (vmid, item.get('name'), item.get('node')))
    return None


def find_vm(client, vmid, subject=None):
    """The /cluster/resources entry of the VM with this id, or None."""
    return vm_in_resources(list_vms(client, subject), vmid)


def read_config_and_pending(client, node, vmid, subject=None, retry=True):
    """(config, pending) of a VM from GET .../pending: pending maps key -> new value, or None for a delete.

    retry: as for PveClient.request (False: a transient error is raised at once).
    """
    config, pending = {}, {}
    for item in client.request('get', 'nodes/%s/qemu/%s/pending' % (node, vmid), 'read config', subject,
                               retry=retry) or []:
        key = item.get('key')
        if key is None:
            continue
        if 'value' in item:
            config[key] = item['value']
        if item.get('delete'):
            pending[key] = None
        elif 'pending' in item:
            pending[key] = item['pending']
    return config, pending


def agent_ipv4_addresses(client, node, vmid, subject=None):
    """IPv4 addresses the guest agent reports; the loopback interface and link-local addresses are left out.

    Raises ApiError (PVE answers 500 'QEMU guest agent is not running' until the agent runs), PermissionDenied
    when the credentials lack the agent privilege (VM.GuestAgent.Audit on PVE 9, VM.Monitor on PVE 8).
    """
    data = client.request('get', 'nodes/%s/qemu/%s/agent/network-get-interfaces' % (node, vmid),
                          'read guest agent addresses', subject, retry=False) or {}
    interfaces = data.get('result', data) if isinstance(data, dict) else data
    found = []
    for iface in interfaces or []:
        if iface.get('name') == 'lo':
            continue
        for addr in iface.get('ip-addresses') or []:
            ip = addr.get('ip-address', '')
            if addr.get('ip-address-type') != 'ipv4' or ip.startswith('169.254.') or ip == '127.0.0.1':
                continue
            found.append({'interface': iface.get('name'), 'address': ip, 'prefix': addr.get('prefix')})
    return found


# -------------------------------------------------------------------------------------- parsing

SIZE_UNITS = {'': 1, 'K': 1024, 'M': 1024 ** 2, 'G': 1024 ** 3, 'T': 1024 ** 4}
NET_MODELS = ('e1000', 'e1000-82540em', 'e1000-82544gc', 'e1000-82545em', 'e1000e', 'i82551', 'i82557b',
              'i82559er', 'ne2k_isa', 'ne2k_pci', 'pcnet', 'rtl8139', 'virtio', 'vmxnet3')


def parse_props(text, first_key=None):
    """A PVE property string as a dict. The first item without '=' goes under first_key.

    parse_props('local-lvm:vm-101-disk-0,size=32G', 'volume') -> {'volume': 'local-lvm:vm-101-disk-0', 'size': '32G'}
    """
    out = {}
    for index, part in enumerate(str(text or '').split(',')):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition('=')
        if not sep:
            if index == 0 and first_key:
                out[first_key] = key
            else:
                out[key] = None
        else:
            out[key] = value
    return out


def parse_size(text):
    """Bytes of a PVE disk size ('32G', '512M', '1.5T', '1073741824'); None when it does not parse."""
    match = re.match(r'^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$', str(text or ''), re.I)
    if not match:
        return None
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2).upper()])


def format_size(size_bytes):
    """The shortest exact PVE size for a byte count: 34359738368 -> '32G'."""
    for unit in ('T', 'G', 'M', 'K'):
        if size_bytes and size_bytes % SIZE_UNITS[unit] == 0:
            return '%d%s' % (size_bytes // SIZE_UNITS[unit], unit)
    return str(size_bytes)


def parse_net(text):
    """A netN value: {'model': 'virtio', 'macaddr': 'BC:24:..', 'bridge': 'vmbr0', ...}."""
    props = parse_props(text)
    out = {}
    for key, value in props.items():
        if key in NET_MODELS:
            out['model'] = key
            if value:
                out['macaddr'] = value.upper()
        elif key == 'macaddr' and value:
            out['macaddr'] = value.upper()
        else:
            out[key] = value
    return out


def upid_parts(upid):
    """node, type and id of a UPID ('UPID:pve1:...:qmstart:101:root@pam!tok:'), or {} when it does not parse."""
    parts = str(upid or '').split(':')
    if len(parts) < 9 or parts[0] != 'UPID':
        return {}
    return {'node': parts[1], 'type': parts[5], 'id': parts[6], 'user': parts[7]}


def upid_node(upid):
    return upid_parts(upid).get('node')


def upid_operation(upid):
    kind = upid_parts(upid).get('type', '')
    return TASK_OPERATIONS.get(kind, kind or 'task')
