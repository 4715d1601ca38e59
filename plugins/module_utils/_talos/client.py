# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Talos API client: one node, grpclib over Python's ssl. PRIVATE to the collection.

Why grpclib: Talos certificates are Ed25519 (always in maintenance mode, and by default for the
OS CA), and grpcio's TLS stack does not offer Ed25519, so grpcio cannot even finish a handshake
with a Talos node in maintenance mode. Python's ssl (OpenSSL) can.

How it talks to Talos:

- One call per node, straight to that node's apid on `host:50000`; no `node`/`nodes` metadata,
  which gives apid's direct local route (apid still proxies `nodes` to other nodes for the
  machine, cluster, storage, time and inspect services; the collection does not use it). Replies
  still go through the defensive `metadata.error` check.
- Two ways to connect:
  * insecure (maintenance mode, like `talosctl --insecure`): TLS, no client certificate, no
    verification of the server; optionally pin the server certificate's SPKI SHA-256
    (standard base64, as Talos prints it on the console) - checked before any request is sent;
  * mTLS with talosconfig credentials (`TalosCredentials`): client certificate and key, the
    server verified against the OS CA, by the IP we connect to (it is in the apid certificate).
  Both offer ALPN h2 (apid refuses TLS without it) and TLS >= 1.2.
- A deadline on every call (`timeout`, seconds); the connection is made inside it.
- Errors: `_talos/errors.py` - TalosTransientError (unreachable, deadline, UNAVAILABLE: retry),
  TalosApiError with `code` (INVALID_ARGUMENT, ALREADY_EXISTS...), TalosTlsError with `reason`.
  The client never retries by itself; callers wrap calls in `_wait.retry`/`_wait.wait_for`.

`AsyncTalosClient` is the asyncio API; `TalosClient` is the same API for modules, synchronous,
running the coroutines on a private event loop. Results are plain dicts and lists, ready for a
module result.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import os
import shutil
import ssl
import tarfile
import tempfile
import threading
import traceback

from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import api
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import pki

try:
    from grpclib.client import Channel, UnaryStreamMethod, UnaryUnaryMethod
    from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
    HAS_GRPCLIB = True
    GRPCLIB_IMPORT_ERROR = None
except ImportError:
    HAS_GRPCLIB = False
    GRPCLIB_IMPORT_ERROR = traceback.format_exc()

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    HAS_CRYPTOGRAPHY = True
    CRYPTOGRAPHY_IMPORT_ERROR = None
except ImportError:
    HAS_CRYPTOGRAPHY = False
    CRYPTOGRAPHY_IMPORT_ERROR = traceback.format_exc()

HAS_PROTOBUF = api.HAS_PROTOBUF
PROTOBUF_IMPORT_ERROR = api.PROTOBUF_IMPORT_ERROR

DEFAULT_PORT = 50000
DEFAULT_TIMEOUT = 30.0

# talosctl --mode strings -> ApplyConfigurationRequest.Mode names.
APPLY_MODES = {
    'auto': 'AUTO',
    'no-reboot': 'NO_REBOOT',
    'reboot': 'REBOOT',
    'staged': 'STAGED',
    'try': 'TRY',
}
REBOOT_MODES = {'default': 'DEFAULT', 'powercycle': 'POWERCYCLE', 'force': 'FORCE'}
RESET_WIPE_MODES = {'all': 'ALL', 'system-disk': 'SYSTEM_DISK', 'user-disks': 'USER_DISKS'}
UPGRADE_REBOOT_MODES = {'default': 'DEFAULT', 'powercycle': 'POWERCYCLE'}

# OpenSSL reasons seen on a TLS connection, and what they mean for a Talos client.
_TLS_REASON_BY_OPENSSL = (
    # Go's TLS server (apid) answers an expired client certificate with the certificate_expired alert
    # (crypto/tls handshake_server.go processCertsFromClient, go1.26)
    ('ALERT_CERTIFICATE_EXPIRED', 'client_certificate_expired'),
    ('CERTIFICATE_REQUIRED', 'client_certificate_required'),
    ('SSLV3_ALERT_HANDSHAKE_FAILURE', 'client_certificate_required'),
    ('UNKNOWN_CA', 'client_certificate_rejected'),
    ('BAD_CERTIFICATE', 'client_certificate_rejected'),
    ('UNSUPPORTED_CERTIFICATE', 'client_certificate_rejected'),
    ('DECRYPT_ERROR', 'client_certificate_rejected'),
    ('CERTIFICATE_VERIFY_FAILED', 'server_certificate_untrusted'),
)


def missing_libraries():
    """[(package name, import traceback)] of the third-party libraries the client needs."""
    missing = []
    if not HAS_GRPCLIB:
        missing.append(('grpclib', GRPCLIB_IMPORT_ERROR))
    if not HAS_PROTOBUF:
        missing.append(('protobuf', PROTOBUF_IMPORT_ERROR))
    if not HAS_CRYPTOGRAPHY:
        missing.append(('cryptography', CRYPTOGRAPHY_IMPORT_ERROR))
    return missing


def spki_fingerprint(cert_der):
    """SHA-256 of a DER certificate's SubjectPublicKeyInfo, standard base64 (Talos' format)."""
    cert = x509.load_der_x509_certificate(cert_der)
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode('ascii')


def grpclib_peer_certificate(protocol):
    """The server's TLS certificate (DER bytes) on a grpclib connection (what Channel.__connect__ returns), or None.

    grpclib 0.4.x (requirements.txt: grpclib>=0.4.7,<0.5.0; read in 0.4.9) offers no public way to it: its public
    Peer (protocol.py, Connection.get_peer, Stream.peer) gives only ssl's getpeercert() dictionary, which is empty when
    the certificate is not verified - always the case with a pinned fingerprint (insecure) - and only once a request
    is on its way. The asyncio transport it reads is the connection's private `_transport` (protocol.py Connection);
    Channel.__connect__ (client.py), the method grpclib's own streams open the connection with, is not in grpclib's
    documentation either. tests/unit/plugins/module_utils/_talos/test_client_lab.py fails if grpclib changes them."""
    ssl_object = protocol.connection._transport.get_extra_info('ssl_object')  # pylint: disable=protected-access
    return ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None


def _decode_pem_field(value, field):
    """A talosconfig value (standard base64 of PEM text, or PEM text itself) -> PEM bytes."""
    if not value:
        raise ValidationError(field, 'is empty; expected base64-encoded PEM')
    if isinstance(value, bytes):
        value = value.decode('ascii', 'replace')
    text = value.strip()
    if text.startswith('-----BEGIN '):
        return text.encode('ascii') + b'\n'
    try:
        pem = base64.b64decode(''.join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError(field, 'is not valid base64')
    if not pem.lstrip().startswith(b'-----BEGIN '):
        raise ValidationError(field, 'does not decode to PEM text (expected "-----BEGIN ...")')
    return pem


class TalosCredentials(object):
    """The client side of Talos mTLS: OS CA certificate, client certificate and key, all PEM."""

    def __init__(self, ca_pem, crt_pem, key_pem):
        self.ca_pem = ca_pem
        self.crt_pem = crt_pem
        self.key_pem = pki.pem_for_python(key_pem)
        self._ssl_context = None
        self._ssl_context_lock = threading.Lock()

    @classmethod
    def from_context(cls, context, field='talosconfig context'):
        """From one talosconfig context (a dict with base64 `ca`, `crt`, `key`)."""
        if not isinstance(context, dict):
            raise ValidationError(field, 'must be a mapping with ca, crt and key')
        values = []
        for key in ('ca', 'crt', 'key'):
            values.append(_decode_pem_field(context.get(key), '%s.%s' % (field, key)))
        return cls(*values)

    @classmethod
    def from_talosconfig(cls, config, context=None):
        """From a parsed talosconfig (dict); `context` defaults to the file's current context."""
        if not isinstance(config, dict):
            raise ValidationError('talosconfig', 'must be a mapping (the parsed talosconfig YAML)')
        name = context or config.get('context')
        contexts = config.get('contexts') or {}
        if not name:
            raise ValidationError('talosconfig.context', 'no context given and the file has no current context')
        if name not in contexts:
            raise ValidationError('talosconfig.contexts', 'has no context %r (has: %s)' % (name, ', '.join(sorted(contexts)) or 'none'))
        return cls.from_context(contexts[name], field='talosconfig.contexts.%s' % name)

    def ssl_context(self):
        """SSLContext for mTLS: verify the node against the OS CA, present the client certificate.

        Made once per credentials and shared by every client that uses them (a multi-node run makes several clients a
        node, on a thread each; an SSLContext serves connections on any thread): loading the CA and the certificate
        chain - through a temporary directory, as ssl reads a chain only from files - is not repeated per client.
        """
        with self._ssl_context_lock:
            if self._ssl_context is None:
                self._ssl_context = self._new_ssl_context()
            return self._ssl_context

    def _new_ssl_context(self):
        context = _base_ssl_context()
        context.check_hostname = True
        context.verify_mode = ssl.CERT_REQUIRED
        try:
            context.load_verify_locations(cadata=self.ca_pem.decode('ascii'))
        except (ssl.SSLError, ValueError) as exc:
            raise ValidationError('talosconfig ca', 'is not a usable PEM certificate: %s' % exc)
        # ssl only loads a certificate chain from files: a private directory, 0600, removed at once.
        scratch = tempfile.mkdtemp(prefix='proxtalos-talos-')
        try:
            cert_path = os.path.join(scratch, 'client.crt')
            key_path = os.path.join(scratch, 'client.key')
            for path, data in ((cert_path, self.crt_pem), (key_path, self.key_pem)):
                with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), 'wb') as handle:
                    handle.write(data)
            try:
                context.load_cert_chain(cert_path, key_path)
            except ssl.SSLError as exc:
                raise ValidationError('talosconfig crt/key', 'client certificate and key do not load or do not match: %s' % exc)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return context


def _base_ssl_context():
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(['h2'])
    return context


def insecure_ssl_context():
    """SSLContext for maintenance mode: TLS without client certificate or server verification."""
    context = _base_ssl_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _tls_reason(exc):
    """The TLS_REASONS key for an ssl error, or None if it is not a TLS verification problem."""
    text = '%s %s' % (getattr(exc, 'reason', '') or '', exc)
    for marker, reason in _TLS_REASON_BY_OPENSSL:
        if marker in text:
            return reason
    return None


def _timestamp(value):
    """A protobuf Timestamp as ISO 8601 UTC text, or None when unset."""
    if value is None or (not value.seconds and not value.nanos):
        return None
    return value.ToDatetime().strftime('%Y-%m-%dT%H:%M:%S.%fZ')


def _enum_name(message, field, value):
    """The name of an enum value of message.field ('SSD'), or the number as text if unknown."""
    value_descriptor = message.DESCRIPTOR.fields_by_name[field].enum_type.values_by_number.get(value)
    return value_descriptor.name if value_descriptor is not None else str(value)


class AsyncTalosClient(object):
    """asyncio client for one Talos node.

    host: the node's address (connect by IP: it is in apid's certificate).
    credentials: TalosCredentials for mTLS, or None with insecure=True (maintenance mode).
    fingerprint: with insecure, the expected SPKI SHA-256 (base64) of the server certificate.
    timeout: seconds for each call, connection included.
    """

    def __init__(self, host, port=DEFAULT_PORT, credentials=None, insecure=False, fingerprint=None,
                 timeout=DEFAULT_TIMEOUT):
        if not host:
            raise ValidationError('host', 'is required (the node address)')
        if credentials is None and not insecure:
            raise ValidationError('credentials', 'are required unless insecure (maintenance mode) is set')
        if credentials is not None and insecure:
            raise ValidationError('insecure', 'cannot be combined with talosconfig credentials')
        if fingerprint and not insecure:
            raise ValidationError('fingerprint', 'is only used with insecure (maintenance mode) connections')
        if timeout is None or timeout <= 0:
            raise ValidationError('timeout', 'must be more than zero seconds, got %r' % (timeout,))
        self.host = host
        self.port = int(port)
        self.node = '%s:%d' % (host, self.port)
        self.insecure = insecure
        self.fingerprint = fingerprint
        self.timeout = float(timeout)
        self._ssl = insecure_ssl_context() if insecure else credentials.ssl_context()
        self._channel = None
        self._checked_protocol = None

    async def close(self):
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        await self.close()

    # ---- plumbing ----

    def _get_channel(self):
        if self._channel is None:
            self._channel = Channel(self.host, self.port, ssl=self._ssl)
        return self._channel

    async def _connect(self, method):
        """Open (or reuse) the connection; check the pinned fingerprint on a new one."""
        channel = self._get_channel()
        protocol = await channel.__connect__()   # grpclib's own way to a channel's connection (see grpclib_peer_certificate)
        if self.fingerprint and protocol is not self._checked_protocol:
            certificate = grpclib_peer_certificate(protocol)
            seen = spki_fingerprint(certificate) if certificate is not None else None
            if seen != self.fingerprint:
                channel.close()
                self._channel = None
                raise errors.TalosTlsError(self.node, 'fingerprint_mismatch', method=method.path,
                                           detail='expected %s, got %s' % (self.fingerprint, seen))
            self._checked_protocol = protocol

    async def _diagnose_tls(self):
        """After a connection died without a gRPC status: was it the server refusing our TLS?

        In TLS 1.3 the client finishes its handshake before the server has checked the client
        certificate, and grpclib reports the server's alert only as a lost connection. A fresh
        TLS connection that reads one record shows the alert itself. Returns (reason, detail) or
        (None, None).
        """
        writer = None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self._ssl), timeout=min(5.0, self.timeout))
            first = await asyncio.wait_for(reader.read(1), timeout=min(2.0, self.timeout))
        except ssl.SSLError as exc:
            return _tls_reason(exc) or 'handshake_failed', str(exc)
        except (OSError, asyncio.TimeoutError, EOFError):
            return None, None
        finally:
            if writer is not None:
                writer.close()
        if not first:
            # The server closed right after the handshake without a word of HTTP/2: it refused
            # us at the TLS level but sent no alert. Without a client certificate that means one
            # is required; with one, that it was not accepted.
            detail = 'the node closed the connection right after the TLS handshake, without an alert'
            return ('client_certificate_required' if self.insecure else 'client_certificate_rejected'), detail
        return None, None

    async def _invoke(self, method, request, sink=None):
        """One RPC with the deadline; gRPC/TLS/connection failures become _talos.errors types.

        sink: for a streaming reply, called with each message as it arrives (nothing is kept); the
        call then returns None.
        """
        if method.reply_stream:
            stub = UnaryStreamMethod(self._get_channel(), method.path, method.request, method.reply)
        else:
            stub = UnaryUnaryMethod(self._get_channel(), method.path, method.request, method.reply)

        async def call():
            await self._connect(method)
            if sink is None:
                return await stub(request, timeout=self.timeout)
            async with stub.open(timeout=self.timeout) as stream:
                await stream.send_message(request, end=True)
                async for message in stream:
                    sink(message)
            return None

        lost = None
        try:
            return await asyncio.wait_for(call(), timeout=self.timeout + 1.0)
        except GRPCError as exc:
            raise errors.from_status(self.node, method.path, exc.status, exc.message)
        except asyncio.TimeoutError:
            await self.close()
            raise errors.deadline_exceeded(self.node, method.path, self.timeout)
        except ssl.SSLError as exc:
            await self.close()
            reason = _tls_reason(exc) or 'handshake_failed'
            raise errors.TalosTlsError(self.node, reason, method=method.path, detail=getattr(exc, 'verify_message', None) or str(exc))
        except ConnectionRefusedError as exc:
            await self.close()
            raise errors.unreachable(self.node, method.path, 'connection refused (%s)' % (exc.strerror or exc))
        except (StreamTerminatedError, ProtocolError, ConnectionError, EOFError) as exc:
            lost = exc
        except OSError as exc:
            await self.close()
            raise errors.unreachable(self.node, method.path, exc.strerror or str(exc))
        await self.close()
        reason, detail = await self._diagnose_tls()
        if reason is not None:
            raise errors.TalosTlsError(self.node, reason, method=method.path, detail=detail)
        raise errors.unreachable(self.node, method.path, str(lost) or lost.__class__.__name__)

    def _first(self, method, response):
        """The single message of a direct-call reply, after the metadata.error check."""
        messages = list(response.messages)
        for message in messages:
            error = errors.from_metadata(self.node, method.path, message.metadata if message.HasField('metadata') else None)
            if error is not None:
                raise error
        if not messages:
            raise errors.TalosApiError('talos node %s: %s returned no messages' % (self.node, method.name), node=self.node,
                                       method=method.path, code='UNKNOWN')
        return messages[0]

    # ---- RPCs ----

    async def version(self):
        """Version: {tag, sha, built, go_version, os, arch, platform: {name, mode}, features: {rbac}}."""
        method = api.MachineService.Version
        reply = self._first(method, await self._invoke(method, api.protobuf.Empty()))
        info = reply.version
        return {
            'tag': info.tag, 'sha': info.sha, 'built': info.built, 'go_version': info.go_version,
            'os': info.os, 'arch': info.arch,
            'platform': {'name': reply.platform.name, 'mode': reply.platform.mode},
            'features': {'rbac': reply.features.rbac},
        }

    async def disks(self):
        """Disks: a list of {device_name, size, model, serial, type, system_disk, ...}."""
        method = api.StorageService.Disks
        reply = self._first(method, await self._invoke(method, api.protobuf.Empty()))
        result = []
        for disk in reply.disks:
            result.append({
                'device_name': disk.device_name, 'name': disk.name, 'size': disk.size, 'model': disk.model,
                'serial': disk.serial, 'modalias': disk.modalias, 'uuid': disk.uuid, 'wwid': disk.wwid,
                'type': _enum_name(disk, 'type', disk.type), 'bus_path': disk.bus_path,
                'system_disk': disk.system_disk, 'subsystem': disk.subsystem, 'readonly': disk.readonly,
            })
        return result

    async def apply_configuration(self, data, mode='auto', dry_run=False, try_timeout=None):
        """ApplyConfiguration: {mode, mode_details, warnings}; mode as talosctl spells it.

        data: the whole machine config, multi-document YAML (bytes or text).
        mode: auto | no-reboot | reboot | staged | try. Always sent explicitly (REBOOT is the proto
        default). try_timeout: seconds, only with mode=try (Talos defaults to 60).
        """
        if mode not in APPLY_MODES:
            raise ValidationError('mode', 'must be one of %s, got %r' % (', '.join(sorted(APPLY_MODES)), mode))
        if try_timeout is not None and mode != 'try':
            raise ValidationError('try_timeout', 'is only used with mode=try')
        if isinstance(data, str):
            data = data.encode('utf-8')
        if not data:
            raise ValidationError('data', 'is empty; expected the machine config YAML')
        request_class = api.machine.ApplyConfigurationRequest
        request = request_class(data=data, mode=request_class.Mode.Value(APPLY_MODES[mode]), dry_run=bool(dry_run))
        if try_timeout is not None:
            if try_timeout <= 0:
                raise ValidationError('try_timeout', 'must be more than zero seconds')
            request.try_mode_timeout.FromNanoseconds(int(try_timeout * 1e9))
        method = api.MachineService.ApplyConfiguration
        reply = self._first(method, await self._invoke(method, request))
        mode_name = request_class.Mode.Name(reply.mode) if reply.mode in request_class.Mode.values() else str(reply.mode)
        talosctl_mode = dict((value, key) for key, value in APPLY_MODES.items()).get(mode_name, mode_name)
        return {'mode': talosctl_mode, 'mode_details': reply.mode_details, 'warnings': list(reply.warnings)}

    async def bootstrap(self, recover_etcd=False, recover_skip_hash_check=False):
        """Bootstrap etcd on this control plane. ALREADY_EXISTS means it was done before."""
        method = api.MachineService.Bootstrap
        request = api.machine.BootstrapRequest(recover_etcd=recover_etcd, recover_skip_hash_check=recover_skip_hash_check)
        self._first(method, await self._invoke(method, request))
        return {}

    async def service_list(self):
        """ServiceList: [{id, state, healthy, health: {...}, events: [{msg, state, ts}]}].

        `healthy` is Talos' own test: the last event is Running and health.healthy is true.
        """
        method = api.MachineService.ServiceList
        reply = self._first(method, await self._invoke(method, api.protobuf.Empty()))
        services = []
        for info in reply.services:
            events = [{'msg': event.msg, 'state': event.state, 'ts': _timestamp(event.ts)} for event in info.events.events]
            last_state = events[-1]['state'] if events else info.state
            services.append({
                'id': info.id,
                'state': info.state,
                'health': {
                    'unknown': info.health.unknown, 'healthy': info.health.healthy,
                    'last_message': info.health.last_message, 'last_change': _timestamp(info.health.last_change),
                },
                'events': events,
                'healthy': last_state == 'Running' and info.health.healthy,
            })
        return services

    async def cosi_list(self, namespace, resource_type):
        """COSI State List (cosi.resource.State/List, a server stream): [{'id', 'version', 'phase', 'yaml_spec'}] of
        the resources of one namespace and type, in the order the node sends them. yaml_spec is the spec as the node
        marshals it to YAML (cosi-project/runtime v1.14.1 pkg/resource/protobuf/resource.go:83-102, 141-195, served by
        pkg/state/protobuf/server/server.go:64-115)."""
        method = api.State.List
        replies = await self._invoke(method, api.cosi_resource.ListRequest(namespace=namespace, type=resource_type))
        return [{'id': reply.resource.metadata.id, 'version': reply.resource.metadata.version,
                 'phase': reply.resource.metadata.phase, 'yaml_spec': reply.resource.spec.yaml_spec}
                for reply in replies or ()]

    async def reboot(self, mode='default'):
        """Reboot: {actor_id}. mode: default | powercycle | force. The reboot runs after the reply."""
        if mode not in REBOOT_MODES:
            raise ValidationError('mode', 'must be one of %s, got %r' % (', '.join(sorted(REBOOT_MODES)), mode))
        request_class = api.machine.RebootRequest
        method = api.MachineService.Reboot
        reply = self._first(method, await self._invoke(method, request_class(mode=request_class.Mode.Value(REBOOT_MODES[mode]))))
        return {'actor_id': reply.actor_id}

    async def reset(self, graceful=True, reboot=False, wipe_mode='all', system_partitions=None, user_disks=None):
        """Reset: {actor_id}. system_partitions: {label: wipe(bool)}; empty = wipe everything."""
        if wipe_mode not in RESET_WIPE_MODES:
            raise ValidationError('wipe_mode', 'must be one of %s, got %r' % (', '.join(sorted(RESET_WIPE_MODES)), wipe_mode))
        request_class = api.machine.ResetRequest
        request = request_class(graceful=graceful, reboot=reboot, mode=request_class.WipeMode.Value(RESET_WIPE_MODES[wipe_mode]))
        for label, wipe in sorted((system_partitions or {}).items()):
            request.system_partitions_to_wipe.add(label=label, wipe=bool(wipe))
        request.user_disks_to_wipe.extend(user_disks or [])
        method = api.MachineService.Reset
        reply = self._first(method, await self._invoke(method, request))
        return {'actor_id': reply.actor_id}

    async def shutdown(self, force=False):
        method = api.MachineService.Shutdown
        reply = self._first(method, await self._invoke(method, api.machine.ShutdownRequest(force=force)))
        return {'actor_id': reply.actor_id}

    async def etcd_member_list(self, query_local=False):
        """EtcdMemberList: [{id, hostname, peer_urls, client_urls, is_learner}]."""
        method = api.MachineService.EtcdMemberList
        reply = self._first(method, await self._invoke(method, api.machine.EtcdMemberListRequest(query_local=query_local)))
        return [{
            'id': member.id, 'hostname': member.hostname, 'peer_urls': list(member.peer_urls),
            'client_urls': list(member.client_urls), 'is_learner': member.is_learner,
        } for member in reply.members]

    async def etcd_status(self):
        """EtcdStatus of this member: {member_id, leader, raft_index, db_size, errors, ...}."""
        method = api.MachineService.EtcdStatus
        status = self._first(method, await self._invoke(method, api.protobuf.Empty())).member_status
        return {
            'member_id': status.member_id, 'leader': status.leader, 'protocol_version': status.protocol_version,
            'storage_version': status.storage_version, 'db_size': status.db_size, 'db_size_in_use': status.db_size_in_use,
            'raft_index': status.raft_index, 'raft_term': status.raft_term, 'raft_applied_index': status.raft_applied_index,
            'errors': list(status.errors), 'is_learner': status.is_learner,
        }

    async def etcd_remove_member_by_id(self, member_id):
        """EtcdRemoveMemberByID: removes the member `member_id` (an int) from the etcd cluster this node is in.

        NOT_FOUND when there is no such member. Meant for members whose node is gone; a node that still
        runs leaves with etcd_leave_cluster on itself.
        """
        if not isinstance(member_id, int) or isinstance(member_id, bool) or member_id <= 0:
            raise ValidationError('member_id', 'must be a positive integer, got %r' % (member_id,))
        method = api.MachineService.EtcdRemoveMemberByID
        self._first(method, await self._invoke(method, api.machine.EtcdRemoveMemberByIDRequest(member_id=member_id)))
        return {}

    async def etcd_leave_cluster(self):
        """EtcdLeaveCluster: this node's member leaves the etcd cluster; its etcd stops and its data is removed."""
        method = api.MachineService.EtcdLeaveCluster
        self._first(method, await self._invoke(method, api.machine.EtcdLeaveClusterRequest()))
        return {}

    async def etcd_snapshot(self, handle):
        """EtcdSnapshot: the node's etcd snapshot, written chunk by chunk to the binary file object `handle`.

        Returns {size, sha256} of what was written. An empty stream is an error (no snapshot).
        """
        method = api.MachineService.EtcdSnapshot
        digest = hashlib.sha256()
        written = [0]

        def sink(chunk):
            error = errors.from_metadata(self.node, method.path, chunk.metadata if chunk.HasField('metadata') else None)
            if error is not None:
                raise error
            handle.write(chunk.bytes)
            digest.update(chunk.bytes)
            written[0] += len(chunk.bytes)

        await self._invoke(method, api.machine.EtcdSnapshotRequest(), sink=sink)
        if not written[0]:
            raise errors.TalosApiError('talos node %s: EtcdSnapshot returned no data' % self.node, node=self.node,
                                       method=method.path, code='DATA_LOSS')
        return {'size': written[0], 'sha256': digest.hexdigest()}

    async def upgrade(self, image, stage=False, preserve=False, force=False, reboot_mode='default'):
        """Upgrade to the installer `image`: {ack, actor_id}. The node drains, installs and reboots after the reply."""
        if not image or not isinstance(image, str):
            raise ValidationError('image', 'must be an installer image reference, got %r' % (image,))
        if reboot_mode not in UPGRADE_REBOOT_MODES:
            choices = ', '.join(sorted(UPGRADE_REBOOT_MODES))
            raise ValidationError('reboot_mode', 'must be one of %s, got %r' % (choices, reboot_mode))
        request_class = api.machine.UpgradeRequest
        request = request_class(image=image, stage=bool(stage), preserve=bool(preserve), force=bool(force),
                                reboot_mode=request_class.RebootMode.Value(UPGRADE_REBOOT_MODES[reboot_mode]))
        method = api.MachineService.Upgrade
        reply = self._first(method, await self._invoke(method, request))
        return {'ack': reply.ack, 'actor_id': reply.actor_id}

    async def hostname(self):
        method = api.MachineService.Hostname
        return self._first(method, await self._invoke(method, api.protobuf.Empty())).hostname

    async def kubeconfig(self):
        """Kubeconfig: the admin kubeconfig (bytes), from the gzip tar the node streams."""
        method = api.MachineService.Kubeconfig
        chunks = await self._invoke(method, api.protobuf.Empty())
        for chunk in chunks:
            error = errors.from_metadata(self.node, method.path, chunk.metadata if chunk.HasField('metadata') else None)
            if error is not None:
                raise error
        return extract_kubeconfig(b''.join(chunk.bytes for chunk in chunks), self.node)


def extract_kubeconfig(archive, node='node'):
    """The `kubeconfig` member of the tar.gz Talos streams (it may lack end-of-archive blocks)."""
    if not archive:
        raise errors.TalosApiError('talos node %s: Kubeconfig returned no data' % node, node=node,
                                   method=api.MachineService.Kubeconfig.path, code='UNKNOWN')
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode='r:gz') as tar:
            for member in tar:
                if member.isfile() and member.name.lstrip('./') == 'kubeconfig':
                    return tar.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise errors.TalosApiError('talos node %s: Kubeconfig data is not a readable tar.gz: %s' % (node, exc), node=node,
                                   method=api.MachineService.Kubeconfig.path, code='DATA_LOSS')
    raise errors.TalosApiError('talos node %s: Kubeconfig archive has no kubeconfig file' % node, node=node,
                               method=api.MachineService.Kubeconfig.path, code='DATA_LOSS')


async def probe_maintenance_async(host, port=DEFAULT_PORT, timeout=10.0):
    """Is the node in maintenance mode? Decided by storage.StorageService/Disks without a client cert.

    - True: the TLS handshake succeeded without a client certificate (server not verified, as
      `talosctl --insecure`) and Disks answered OK: the node serves its API unauthenticated,
      which Talos does only in maintenance mode.
    - False: the node requires a client certificate (TLS alert certificate_required, or the
      handshake refused without one): it runs with a machine config (apid, mTLS).
    - Raises TalosTransientError when the node cannot be reached or does not answer in time
      (nothing can be decided), and TalosApiError/TalosTlsError for any other answer.
    """
    client = AsyncTalosClient(host, port=port, insecure=True, timeout=timeout)
    try:
        await client.disks()
    except errors.TalosTlsError as exc:
        if exc.reason == 'client_certificate_required':
            return False
        raise
    finally:
        await client.close()
    return True


class TalosClient(object):
    """Synchronous AsyncTalosClient for modules: same arguments, same methods, same results.

    Runs the coroutines on its own event loop; use as a context manager or call close().
    Do not use from inside a running event loop (use AsyncTalosClient there).
    """

    def __init__(self, host, port=DEFAULT_PORT, credentials=None, insecure=False, fingerprint=None,
                 timeout=DEFAULT_TIMEOUT):
        self._client = AsyncTalosClient(host, port=port, credentials=credentials, insecure=insecure,
                                        fingerprint=fingerprint, timeout=timeout)
        self._loop = asyncio.new_event_loop()

    @property
    def node(self):
        return self._client.node

    def _run(self, coroutine):
        return self._loop.run_until_complete(coroutine)

    def close(self):
        if self._loop is not None and not self._loop.is_closed():
            self._run(self._client.close())
            self._loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def version(self):
        return self._run(self._client.version())

    def disks(self):
        return self._run(self._client.disks())

    def apply_configuration(self, data, mode='auto', dry_run=False, try_timeout=None):
        return self._run(self._client.apply_configuration(data, mode=mode, dry_run=dry_run, try_timeout=try_timeout))

    def bootstrap(self, recover_etcd=False, recover_skip_hash_check=False):
        return self._run(self._client.bootstrap(recover_etcd=recover_etcd, recover_skip_hash_check=recover_skip_hash_check))

    def service_list(self):
        return self._run(self._client.service_list())

    def cosi_list(self, namespace, resource_type):
        return self._run(self._client.cosi_list(namespace, resource_type))

    def reboot(self, mode='default'):
        return self._run(self._client.reboot(mode=mode))

    def reset(self, graceful=True, reboot=False, wipe_mode='all', system_partitions=None, user_disks=None):
        return self._run(self._client.reset(graceful=graceful, reboot=reboot, wipe_mode=wipe_mode,
                                            system_partitions=system_partitions, user_disks=user_disks))

    def shutdown(self, force=False):
        return self._run(self._client.shutdown(force=force))

    def etcd_member_list(self, query_local=False):
        return self._run(self._client.etcd_member_list(query_local=query_local))

    def etcd_status(self):
        return self._run(self._client.etcd_status())

    def etcd_remove_member_by_id(self, member_id):
        return self._run(self._client.etcd_remove_member_by_id(member_id))

    def etcd_leave_cluster(self):
        return self._run(self._client.etcd_leave_cluster())

    def etcd_snapshot(self, handle):
        return self._run(self._client.etcd_snapshot(handle))

    def upgrade(self, image, stage=False, preserve=False, force=False, reboot_mode='default'):
        return self._run(self._client.upgrade(image, stage=stage, preserve=preserve, force=force, reboot_mode=reboot_mode))

    def hostname(self):
        return self._run(self._client.hostname())

    def kubeconfig(self):
        return self._run(self._client.kubeconfig())


def probe_maintenance(host, port=DEFAULT_PORT, timeout=10.0):
    """Synchronous probe_maintenance_async (see there for the exact rule)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(probe_maintenance_async(host, port=port, timeout=timeout))
    finally:
        loop.close()
