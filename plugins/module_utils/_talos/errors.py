# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Errors of the Talos API client, and how gRPC statuses and TLS failures map onto them. PRIVATE.

Every error names the node (`host:port`) and the RPC. Callers tell them apart by class and by
`code` (the gRPC status name), never by parsing text:

- TalosTransientError (a TransientApiError): the node did not answer - connection refused or
  reset, deadline exceeded, gRPC UNAVAILABLE / DEADLINE_EXCEEDED / RESOURCE_EXHAUSTED /
  ABORTED. Worth retrying with `_wait.retry`.
- TalosApiError (an ApiError): the node answered with an error status. `code` is e.g.
  'INVALID_ARGUMENT' (with Talos' own message in `talos_message`), 'ALREADY_EXISTS' (bootstrap
  treats it as done), 'FAILED_PRECONDITION', 'PERMISSION_DENIED', 'UNIMPLEMENTED', 'NOT_FOUND'.
  Boolean helpers (`already_exists`, `unimplemented`...) read the same attribute.
- TalosTlsError (an ApiError): the TLS handshake failed, and `reason` says which way:
  'client_certificate_required', 'client_certificate_rejected', 'client_certificate_expired',
  'server_certificate_untrusted', 'fingerprint_mismatch', 'handshake_failed'.

This module imports nothing outside the standard library and _errors.
"""

from __future__ import annotations

from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ApiError, TransientApiError

SERVICE = 'talos'

# gRPC status codes by number (grpc/grpc doc/statuscodes.md); Talos sends these names too.
STATUS_NAMES = {
    0: 'OK',
    1: 'CANCELLED',
    2: 'UNKNOWN',
    3: 'INVALID_ARGUMENT',
    4: 'DEADLINE_EXCEEDED',
    5: 'NOT_FOUND',
    6: 'ALREADY_EXISTS',
    7: 'PERMISSION_DENIED',
    8: 'RESOURCE_EXHAUSTED',
    9: 'FAILED_PRECONDITION',
    10: 'ABORTED',
    11: 'OUT_OF_RANGE',
    12: 'UNIMPLEMENTED',
    13: 'INTERNAL',
    14: 'UNAVAILABLE',
    15: 'DATA_LOSS',
    16: 'UNAUTHENTICATED',
}

# Statuses that mean "the node could not serve this right now": retry.
TRANSIENT_CODES = frozenset(['UNAVAILABLE', 'DEADLINE_EXCEEDED', 'RESOURCE_EXHAUSTED', 'ABORTED'])

TLS_REASONS = {
    'client_certificate_required': 'the node requires a client certificate: it is configured (not in maintenance mode), '
                                   'so connect with talosconfig credentials (mTLS)',
    'client_certificate_rejected': 'the node rejected our client certificate: it is not signed by the OS CA this node '
                                   'trusts (a talosconfig from another cluster or secrets bundle?)',
    'server_certificate_untrusted': 'the node\'s server certificate is not signed by the talosconfig CA: the node is in '
                                    'maintenance mode (self-signed certificate) or belongs to another cluster',
    'fingerprint_mismatch': 'the node\'s server certificate does not match the pinned SPKI SHA-256 fingerprint',
    'handshake_failed': 'the TLS handshake failed',
    'client_certificate_expired': 'the node refused our client certificate as expired: renew the talosconfig '
                                  '(proxtalos.cluster.talos_config writes a new one from the secrets bundle)',
}


def status_name(code):
    """'ALREADY_EXISTS' for 6 or for a grpclib Status enum member; 'UNKNOWN' for anything else."""
    name = getattr(code, 'name', None)
    if name is not None:
        return name
    try:
        return STATUS_NAMES.get(int(code), 'UNKNOWN')
    except (TypeError, ValueError):
        return 'UNKNOWN'


class _TalosErrorMixin(object):
    """Attributes shared by the Talos error types."""

    node = None
    method = None
    code = None
    talos_message = None

    @property
    def already_exists(self):
        return self.code == 'ALREADY_EXISTS'

    @property
    def failed_precondition(self):
        return self.code == 'FAILED_PRECONDITION'

    @property
    def permission_denied(self):
        return self.code == 'PERMISSION_DENIED'

    @property
    def unimplemented(self):
        return self.code == 'UNIMPLEMENTED'

    @property
    def invalid_argument(self):
        return self.code == 'INVALID_ARGUMENT'


class TalosApiError(_TalosErrorMixin, ApiError):
    """The node answered the RPC with an error status."""

    def __init__(self, message, node=None, method=None, code=None, talos_message=None, **details):
        ApiError.__init__(self, message, service=SERVICE, status=code, node=node, method=method,
                          talos_message=talos_message, **details)
        self.node = node
        self.method = method
        self.code = code
        self.talos_message = talos_message


class TalosTransientError(_TalosErrorMixin, TransientApiError):
    """The node could not be reached or did not answer in time; retrying may help."""

    def __init__(self, message, node=None, method=None, code=None, talos_message=None, **details):
        TransientApiError.__init__(self, message, service=SERVICE, status=code, node=node, method=method,
                                   talos_message=talos_message, **details)
        self.node = node
        self.method = method
        self.code = code
        self.talos_message = talos_message


class TalosTlsError(_TalosErrorMixin, ApiError):
    """The TLS handshake with the node failed; `reason` is one of TLS_REASONS."""

    def __init__(self, node, reason, method=None, detail=None, **details):
        text = 'talos node %s: %s' % (node, TLS_REASONS.get(reason, reason))
        if detail:
            text += ' (%s)' % detail
        ApiError.__init__(self, text, service=SERVICE, status='TLS', node=node, method=method, reason=reason,
                          tls_detail=detail, **details)
        self.node = node
        self.method = method
        self.code = 'TLS'
        self.reason = reason
        self.detail = detail


def _rpc_label(method):
    return method.rsplit('/', 1)[-1] if method else 'call'


def from_status(node, method, code, message):
    """The error for a gRPC status (number, name or grpclib Status) answered by `node`."""
    name = code if isinstance(code, str) else status_name(code)
    message = (message or '').strip()
    text = 'talos node %s: %s failed: %s' % (node, _rpc_label(method), name)
    if message:
        text += ': %s' % message
    cls = TalosTransientError if name in TRANSIENT_CODES else TalosApiError
    return cls(text, node=node, method=method, code=name, talos_message=message)


def unreachable(node, method, cause):
    """The node did not accept the connection or went away: retry later."""
    return TalosTransientError('talos node %s unreachable (%s): %s' % (node, _rpc_label(method), cause), node=node,
                               method=method, code='UNAVAILABLE', talos_message=None)


def deadline_exceeded(node, method, timeout):
    return TalosTransientError('talos node %s: %s got no answer within %ss' % (node, _rpc_label(method), timeout),
                               node=node, method=method, code='DEADLINE_EXCEEDED', talos_message=None)


def from_metadata(node, method, metadata):
    """The error carried in a reply message's common.Metadata, or None if it carries none.

    Talos fills `metadata.error` (text) and `metadata.status` (google.rpc.Status) only when apid
    proxies to several nodes; a direct call gets an empty Metadata. Decoded defensively: any of
    the fields may be missing.
    """
    if metadata is None:
        return None
    error_text = getattr(metadata, 'error', '') or ''
    status = getattr(metadata, 'status', None)
    code = getattr(status, 'code', 0) if status is not None else 0
    status_message = getattr(status, 'message', '') if status is not None else ''
    if not error_text and not code:
        return None
    target = getattr(metadata, 'hostname', '') or node
    return from_status(target, method, code or 2, status_message or error_text)
