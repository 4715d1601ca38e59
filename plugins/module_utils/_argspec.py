# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Shared argument specs. PRIVATE to the collection.

Each constant has a doc fragment of the same name in plugins/doc_fragments (lower case, with a
leading underscore): _wait for WAIT_SPEC, _proxmox_auth for PROXMOX_AUTH_SPEC, _k8s_auth for
K8S_AUTH_SPEC, _talos_auth for TALOS_AUTH_SPEC. Keep each pair in
step; validate-modules checks the modules that use them.
"""

from __future__ import annotations

import copy

from ansible.module_utils.basic import env_fallback

WAIT_SPEC = dict(
    wait=dict(type='bool', default=True),
    wait_timeout=dict(type='float', default=300.0),
    wait_sleep=dict(type='float', default=2.0),
)

PROXMOX_AUTH_SPEC = dict(
    api_host=dict(type='str', required=True, fallback=(env_fallback, ['PROXMOX_HOST'])),
    api_port=dict(type='int', fallback=(env_fallback, ['PROXMOX_PORT'])),
    api_user=dict(type='str', required=True, fallback=(env_fallback, ['PROXMOX_USER'])),
    api_password=dict(type='str', no_log=True, fallback=(env_fallback, ['PROXMOX_PASSWORD'])),
    api_token_id=dict(type='str', no_log=False, fallback=(env_fallback, ['PROXMOX_TOKEN_ID'])),
    api_token_secret=dict(type='str', no_log=True, fallback=(env_fallback, ['PROXMOX_TOKEN_SECRET'])),
    ca_path=dict(type='path', fallback=(env_fallback, ['PROXMOX_CA_PATH'])),
    validate_certs=dict(type='bool', default=True, fallback=(env_fallback, ['PROXMOX_VALIDATE_CERTS'])),
    api_timeout=dict(type='int', default=10, fallback=(env_fallback, ['PROXMOX_API_TIMEOUT'])),
)

PROXMOX_AUTH_CONSTRAINTS = dict(
    required_one_of=[('api_password', 'api_token_id')],
    required_together=[('api_token_id', 'api_token_secret')],
)

# Names follow kubernetes.core where they mean the same (kubeconfig, context, validate_certs;
# ca_path is this collection's name for kubernetes.core's ca_cert, which stays as an alias).
K8S_AUTH_SPEC = dict(
    kubeconfig=dict(type='path', fallback=(env_fallback, ['K8S_AUTH_KUBECONFIG'])),
    kubeconfig_content=dict(type='raw', no_log=True),
    context=dict(type='str', fallback=(env_fallback, ['K8S_AUTH_CONTEXT'])),
    validate_certs=dict(type='bool', default=True, aliases=['verify_ssl'],
                        fallback=(env_fallback, ['K8S_AUTH_VALIDATE_CERTS', 'K8S_AUTH_VERIFY_SSL'])),
    ca_path=dict(type='path', aliases=['ca_cert'], fallback=(env_fallback, ['K8S_AUTH_CA_CERT', 'K8S_AUTH_SSL_CA_CERT'])),
    api_timeout=dict(type='float', default=10.0),
)

K8S_AUTH_CONSTRAINTS = dict(
    mutually_exclusive=[('kubeconfig', 'kubeconfig_content')],
)

# How a module reaches one Talos node's apid: credentials from a talosconfig (file or content,
# named as talosctl names them), the port, and the deadline of each call. The node address is
# each module's own option (one node, or a list for talos_bootstrap).
TALOS_AUTH_SPEC = dict(
    talosconfig=dict(type='path', fallback=(env_fallback, ['TALOSCONFIG'])),
    talosconfig_content=dict(type='raw', no_log=True),
    context=dict(type='str'),
    port=dict(type='int', default=50000),
    api_timeout=dict(type='float', default=15.0),
)

TALOS_AUTH_CONSTRAINTS = dict(
    mutually_exclusive=[('talosconfig', 'talosconfig_content')],
)


def spec(*parts, **own):
    """A fresh argument spec: deep copies of the shared parts, then the module's own options."""
    merged = {}
    for part in parts:
        merged.update(copy.deepcopy(part))
    merged.update(own)
    return merged


def wait_params(params):
    """(timeout, interval) from WAIT_SPEC options; wait=false means a single probe."""
    timeout = params['wait_timeout'] if params['wait'] else 0.0
    if timeout < 0:
        timeout = 0.0
    interval = params['wait_sleep'] if params['wait_sleep'] > 0 else 1.0
    return timeout, interval
