# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""talosconfig files: write one talosctl can use, read one back for our client. PRIVATE.

Layout (talosctl's pkg/machinery/client/config, facts/talos-api.md part 4):

    context: <cluster name>
    contexts:
      <cluster name>:
        endpoints: [<control-plane IPs>]   # host or host:port (port 50000 when absent)
        nodes: [...]                       # optional default targets
        ca:  <base64 of the PEM OS CA certificate>
        crt: <base64 of the PEM client certificate>
        key: <base64 of the PEM client key, label `ED25519 PRIVATE KEY` for Ed25519>

The client certificate is the os:admin certificate from pki.new_client_certificate. To keep
re-runs unchanged, `admin_credentials` reuses the certificate of an existing talosconfig
while it is still signed by the bundle's OS CA and has time left, and issues a new one
otherwise; `render_talosconfig` is deterministic for the same inputs.
"""

from __future__ import annotations

import datetime

from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import pki, talosyaml

APID_PORT = 50000
# Renew the admin certificate when less than this is left (it lasts one year).
DEFAULT_RENEW_BEFORE = datetime.timedelta(days=30)
SECRET_PATHS = ('contexts.*.key',)


class TalosClientConfig(object):
    """What a Talos API client needs from one talosconfig context.

    context: context name; endpoints: list of 'host' or 'host:port'; nodes: list;
    ca_pem, crt_pem: PEM bytes; key_pem: PEM bytes relabelled for Python (`PRIVATE KEY`
    instead of `ED25519 PRIVATE KEY`), ready for ssl.SSLContext.load_cert_chain;
    key_pem_talos: the key PEM as stored in the file.
    """

    def __init__(self, context, endpoints, nodes, ca_pem, crt_pem, key_pem_talos):
        self.context = context
        self.endpoints = endpoints
        self.nodes = nodes
        self.ca_pem = ca_pem
        self.crt_pem = crt_pem
        self.key_pem_talos = key_pem_talos
        self.key_pem = pki.pem_for_python(key_pem_talos)

    def __repr__(self):
        return 'TalosClientConfig(context=%r, endpoints=%r, nodes=%r)' % (self.context, self.endpoints, self.nodes)

    def endpoint_addresses(self):
        """Endpoints as (host, port) tuples, port 50000 when not given."""
        return [split_endpoint(endpoint) for endpoint in self.endpoints]


def split_endpoint(endpoint):
    """('host', port) from 'host', 'host:port', '[v6]' or '[v6]:port'."""
    if endpoint.startswith('['):
        host, _sep, rest = endpoint[1:].partition(']')
        port = rest[1:] if rest.startswith(':') else ''
    elif endpoint.count(':') == 1:
        host, port = endpoint.split(':')
    else:
        host, port = endpoint, ''
    if port and not port.isdigit():
        raise ValidationError('endpoints', 'invalid port in endpoint %r' % endpoint)
    return host, int(port) if port else APID_PORT


def _string_list(value, field):
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValidationError(field, 'must be a list, got %s' % type(value).__name__)
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise ValidationError('%s[%d]' % (field, index), 'must be non-empty text')
    return list(value)


def render_talosconfig(context, endpoints, ca_pem, crt_pem, key_pem, nodes=None):
    """talosconfig YAML text (deterministic) with one context named `context`.

    endpoints: control-plane addresses (list, may be empty as with talosctl gen config);
    ca_pem/crt_pem/key_pem: PEM bytes (the key keeps its Talos label); nodes: optional list.
    Checks that the key belongs to the certificate and that the CA signed it.
    """
    if not isinstance(context, str) or not context:
        raise ValidationError('context', 'missing')
    endpoints = _string_list(endpoints, 'endpoints')
    for endpoint in endpoints:
        split_endpoint(endpoint)
    nodes = _string_list(nodes, 'nodes')
    cert, dummy = pki.check_key_pair(crt_pem, key_pem, 'client')
    ca_cert = pki.load_certificate(ca_pem, 'ca')
    if not pki.is_signed_by(cert, ca_cert):
        raise ValidationError('client.crt', 'not signed by the given CA')
    entry = {'endpoints': endpoints}
    if nodes:
        entry['nodes'] = nodes
    entry['ca'] = pki.b64encode_pem(ca_pem)
    entry['crt'] = pki.b64encode_pem(crt_pem)
    entry['key'] = pki.b64encode_pem(key_pem)
    return talosyaml.dump({'context': context, 'contexts': {context: entry}})


def parse_talosconfig(text, context=None, field='talosconfig'):
    """TalosClientConfig of `context` (default: the file's active context).

    Raises ValidationError naming the field (`talosconfig.contexts.<name>.key` ...) when the
    file is not a talosconfig or the context lacks what mTLS needs; never quotes keys.
    """
    data = talosyaml.load(text, field)
    if not isinstance(data, dict):
        raise ValidationError(field, 'must be a mapping')
    contexts = data.get('contexts')
    if not isinstance(contexts, dict) or not contexts:
        raise ValidationError(field + '.contexts', 'missing')
    name = context or data.get('context')
    if not name:
        raise ValidationError(field + '.context', 'no active context and none was asked for')
    entry = contexts.get(name)
    where = '%s.contexts.%s' % (field, name)
    if not isinstance(entry, dict):
        raise ValidationError(where, 'no such context (have: %s)' % ', '.join(sorted(str(k) for k in contexts)))
    endpoints = _string_list(entry.get('endpoints'), where + '.endpoints')
    for endpoint in endpoints:
        split_endpoint(endpoint)
    nodes = _string_list(entry.get('nodes'), where + '.nodes')
    ca_pem = pki.b64decode_pem(entry.get('ca'), where + '.ca')
    crt_pem = pki.b64decode_pem(entry.get('crt'), where + '.crt')
    key_pem = pki.b64decode_pem(entry.get('key'), where + '.key')
    pki.load_certificate(ca_pem, where + '.ca')
    pki.check_key_pair(crt_pem, key_pem, where)
    return TalosClientConfig(name, endpoints, nodes, ca_pem, crt_pem, key_pem)


def admin_credentials(bundle, existing_text=None, now=None, renew_before=DEFAULT_RENEW_BEFORE):
    """(crt_pem, key_pem, reused) of an os:admin client certificate for the bundle's OS CA.

    Reuses the certificate in existing_text (a talosconfig, any context whose CA is the
    bundle's OS CA) when it is signed by that CA, has exactly the os:admin role and EKU
    clientAuth, and has more than `renew_before` left; otherwise issues a new one. A broken
    or foreign existing file is not an error: it is replaced.
    """
    ca_crt, ca_key = bundle.ca('os')
    if existing_text:
        try:
            current = parse_talosconfig(existing_text)
        except ValidationError:
            current = None
        if current is not None and current.ca_pem.strip() == ca_crt.strip():
            problems = pki.client_certificate_problems(current.crt_pem, current.key_pem_talos, ca_crt,
                                                       now=now, min_remaining=renew_before)
            if not problems:
                return current.crt_pem, current.key_pem_talos, True
    crt, key = pki.new_client_certificate(ca_crt, ca_key, now=now)
    return crt, key, False
