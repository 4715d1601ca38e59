#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: talos_kubeconfig
short_description: Fetch the cluster's admin kubeconfig from a Talos control plane
version_added: 0.1.0
description:
  - Fetches the admin kubeconfig like C(talosctl kubeconfig) - C(MachineService/Kubeconfig) streams a gzip tar archive
    holding one C(kubeconfig) file, which Talos fills with the cluster CAs (C(cluster.acceptedCAs) first, the issuing
    CA last) and a client certificate (C(admin), C(system:masters)) it issues at that moment, valid for a year.
  - Points every cluster entry at O(endpoint) and writes the file mode V(0600).
  - Talos issues a new client certificate on every fetch, so a fetch always differs. The module therefore keeps an
    existing file as long as it is still good - it names the same cluster CA as the one just fetched, points at
    O(endpoint), and its client certificate (with a key that matches it) is signed by one of those CAs and valid for more
    than O(renew_before_days) days. Only otherwise is the fetched kubeconfig written, so a re-run is unchanged.
  - Talos generates the kubeconfig from the machine config alone, before etcd is bootstrapped too. A control plane
    that cannot serve it yet (not answering, C(FailedPrecondition)) is asked again until O(wait_timeout).
  - The API server's readiness is not checked here; gate on it with P(proxtalos.cluster.k8s_gate#module)
    (O(proxtalos.cluster.k8s_gate#module:gate=api)) using the written file.
attributes:
  check_mode:
    support: full
    details:
      - Fetches (a read-only call that only issues a certificate) and compares; writes nothing.
  diff_mode:
    support: full
    details:
      - The diff names the reason and shows the file's server, cluster and certificate expiry, never a key.
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
  - proxtalos.cluster._talos_auth
  - proxtalos.cluster._wait
options:
  node:
    description:
      - Address of the control plane to ask (the first one, usually).
    type: str
    required: true
  dest:
    description:
      - Where to write the kubeconfig.
    type: path
    required: true
  endpoint:
    description:
      - The Kubernetes API URL to write as every cluster's C(server), for example V(https://10.5.0.10:6443). A bare host
        gets C(https://) and port 6443. When not set, the server Talos wrote (the config's cluster endpoint) is kept.
    type: str
  renew_before_days:
    description:
      - Replace a kept kubeconfig whose client certificate has fewer days left than this.
    type: int
    default: 30
  artifacts_vault_password:
    description:
      - When given, O(dest) is written as an Ansible Vault envelope encrypted with this password (the kubeconfig
        holds the admin client key); an existing O(dest) is read through the vault, and a kept kubeconfig that is in
        clear is rewritten encrypted (and the other way round without this option).
      - The roles of this collection pass the run's prompted vault password here unless C(proxtalos_artifacts_in_clear)
        is true (the collection's docs/stages/secrets.md). An encrypted O(talosconfig) is opened by the action plugin
        with the run's vault passwords.
    type: str
seealso:
  - module: proxtalos.cluster.k8s_gate
  - module: proxtalos.cluster.talos_bootstrap
"""

EXAMPLES = r"""
- name: Fetch the admin kubeconfig
  proxtalos.cluster.talos_kubeconfig:
    node: "{{ hostvars[groups['controlplane'][0]].node_ip }}"
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
    endpoint: "{{ cluster_endpoint }}"
    dest: "artifacts/{{ cluster_name }}/kubeconfig"
  run_once: true

- name: Gate - the API server is ready
  proxtalos.cluster.k8s_gate:
    gate: api
    kubeconfig: "artifacts/{{ cluster_name }}/kubeconfig"
  run_once: true
"""

RETURN = r"""
dest:
  description: The kubeconfig file.
  returned: always
  type: str
outcome:
  description: V(written) (a new file, or one replaced) or V(kept).
  returned: always
  type: str
reason:
  description: Why the file was (or would be) written, or kept.
  returned: always
  type: str
  sample: client certificate valid until 2027-11-25T10:00:00Z (more than 30 days left)
server:
  description: The API server URL in the file.
  returned: always
  type: str
context:
  description: The current context of the file.
  returned: always
  type: str
  sample: admin@demo
client_certificate_not_after:
  description: Expiry of the client certificate in the file (ISO 8601, UTC).
  returned: always
  type: str
elapsed:
  description: Seconds spent, waiting included.
  returned: always
  type: float
"""

import base64
import binascii
import datetime
import os
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _secrets, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._diff import make_diff
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import config as talos_config
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import files, pki, session, talosyaml


def argument_spec():
    return _argspec.spec(
        _argspec.TALOS_AUTH_SPEC, _argspec.WAIT_SPEC,
        node=dict(type='str', required=True),
        dest=dict(type='path', required=True),
        endpoint=dict(type='str'),
        renew_before_days=dict(type='int', default=30),
        artifacts_vault_password=dict(type='str', no_log=True),
    )


def _b64(value, field):
    try:
        return base64.b64decode(value or '', validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise ValidationError(field, 'is not valid base64')


class Kubeconfig(object):
    """The parts of an admin kubeconfig the module looks at (current context's cluster and user)."""

    def __init__(self, data, field):
        if not isinstance(data, dict):
            raise ValidationError(field, 'is not a kubeconfig (not a mapping)')
        self.data = data
        self.field = field
        self.context_name = data.get('current-context') or ''
        contexts = dict((item.get('name'), item.get('context') or {}) for item in data.get('contexts') or [] if isinstance(item, dict))
        context = contexts.get(self.context_name)
        if context is None:
            raise ValidationError(field, 'has no current context %r' % self.context_name)
        clusters = dict((item.get('name'), item.get('cluster') or {}) for item in data.get('clusters') or [] if isinstance(item, dict))
        users = dict((item.get('name'), item.get('user') or {}) for item in data.get('users') or [] if isinstance(item, dict))
        self.cluster = clusters.get(context.get('cluster'))
        self.user = users.get(context.get('user'))
        if self.cluster is None or self.user is None:
            raise ValidationError(field, 'current context %r names a cluster or user the file does not have' % self.context_name)
        self.server = self.cluster.get('server') or ''
        self.ca_pem = _b64(self.cluster.get('certificate-authority-data'), field + ' certificate-authority-data')
        self.crt_pem = _b64(self.user.get('client-certificate-data'), field + ' client-certificate-data')
        self.key_pem = _b64(self.user.get('client-key-data'), field + ' client-key-data')

    def secret_values(self):
        return [self.key_pem.decode('ascii', 'replace'), self.user.get('client-key-data'), self.user.get('token')]

    def with_server(self, endpoint):
        """The kubeconfig dict with every cluster's server set to endpoint."""
        for item in self.data.get('clusters') or []:
            if isinstance(item, dict) and isinstance(item.get('cluster'), dict):
                item['cluster']['server'] = endpoint
        self.server = endpoint
        return self.data

    def certificate_not_after(self):
        return pki.not_valid_after(pki.load_certificate(self.crt_pem, self.field + ' client-certificate-data'))


def why_not_keep(existing, fetched, endpoint, renew_before, now):
    """None when the existing kubeconfig is still good (see DOCUMENTATION), else the reason."""
    if existing.ca_pem.strip() != fetched.ca_pem.strip():
        return 'the cluster CA differs from the one the cluster serves'
    if existing.server != endpoint:
        return 'the server is %s, not %s' % (existing.server or 'not set', endpoint)
    try:
        cert, dummy = pki.check_key_pair(existing.crt_pem, existing.key_pem, 'client')
        # Talos writes cluster.acceptedCAs first and the issuing CA last (pkg/kubeconfig/generate.go): any of them
        ca_certs = pki.load_certificates(fetched.ca_pem, 'ca')
    except ValidationError as exc:
        return 'its client certificate or key is not usable (%s)' % exc.reason
    if not any(pki.is_signed_by(cert, ca_cert) for ca_cert in ca_certs):
        return 'its client certificate is not signed by the cluster CA'
    not_after = pki.not_valid_after(cert)
    if not_after - now <= renew_before:
        return 'its client certificate expires %s (less than %d days left)' % (not_after.isoformat(), renew_before.days)
    return None


def fetch(node_session, deadline, interval):
    """The kubeconfig bytes, asking again while the control plane cannot serve it yet."""
    def call():
        try:
            return node_session.call('kubeconfig')
        except talos_errors.TalosApiError as exc:
            if exc.failed_precondition:
                raise talos_errors.TalosTransientError(str(exc), node=exc.node, method=exc.method, code=exc.code,
                                                       talos_message=exc.talos_message)
            raise
    try:
        return _wait.retry(call, deadline.remaining(), interval=interval, transient=session.TRANSIENT, backoff=1.0,
                           max_interval=interval)
    except talos_errors.TalosTransientError as exc:
        raise ProxtalosError('talos node %s: no kubeconfig within %gs: %s' % (node_session.name, deadline.timeout, exc),
                             node=node_session.name, last_observation=str(exc))


def _state(kubeconfig, reason):
    if kubeconfig is None:
        return {}
    return {'server': kubeconfig.server, 'context': kubeconfig.context_name,
            'client_certificate_not_after': kubeconfig.certificate_not_after().isoformat(), 'reason': reason}


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True,
        mutually_exclusive=_argspec.TALOS_AUTH_CONSTRAINTS['mutually_exclusive'],
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    missing = session.missing_libraries()
    if missing:
        module.fail_json(msg=missing_required_lib(missing[0][0]), exception=missing[0][1])
    params = module.params
    result = dict(changed=False, dest=params['dest'], outcome='', reason='', server='', context='',
                  client_certificate_not_after='', elapsed=0.0)
    try:
        if params['renew_before_days'] < 0:
            raise ValidationError('renew_before_days', 'must be zero or more days')
        credentials = session.load_credentials(params, module)
        node_session = session.NodeSession.from_params(params, credentials)
        node_session.require_credentials('serves the kubeconfig to os:admin only')
        deadline, interval = session.deadline_for(params)

        raw = fetch(node_session, deadline, interval)
        fetched = Kubeconfig(talosyaml.load(raw.decode('utf-8'), 'kubeconfig from %s' % node_session.name), 'fetched kubeconfig')
        _secrets.register(module, *fetched.secret_values())
        endpoint = talos_config.normalize_endpoint(params['endpoint'], 'endpoint') if params['endpoint'] else fetched.server

        artifacts = files.Artifacts(params['artifacts_vault_password'])
        existing = None
        encrypted = False
        reason = 'no kubeconfig at %s yet' % params['dest']
        if os.path.exists(params['dest']):
            try:
                text, encrypted = artifacts.read(params['dest'])
                if text is None:
                    raise ValidationError('dest', 'is vault-encrypted and artifacts_vault_password does not open it'
                                          if encrypted else 'is not UTF-8 text')
                existing = Kubeconfig(talosyaml.load(text, 'dest'), 'dest')
                _secrets.register(module, *existing.secret_values())
                reason = why_not_keep(existing, fetched, endpoint, datetime.timedelta(days=params['renew_before_days']),
                                      pki.utcnow())
            except (ValidationError, UnicodeDecodeError) as exc:
                reason = 'the file is not a readable kubeconfig (%s)' % exc
                existing = None
        if reason is None:
            chosen = existing
            result.update(outcome='kept', reason='still good: same cluster CA and server, client certificate valid until %s'
                          % existing.certificate_not_after().isoformat())
            if encrypted != bool(artifacts.password):
                # the same kubeconfig, kept in the other form (vault-encrypted, or in clear as asked)
                result.update(changed=True, reason=result['reason'] + ('; vault-encrypted' if artifacts.password else '; written in clear'))
                if not module.check_mode:
                    files.write_private(params['dest'], artifacts.encode(talosyaml.dump(existing.data)))
            elif files.file_mode(params['dest']) != files.FILE_MODE:
                result.update(changed=True, reason=result['reason'] + '; mode set to 0600')
                if not module.check_mode:
                    os.chmod(params['dest'], files.FILE_MODE)
        else:
            chosen = fetched
            fetched.with_server(endpoint)
            result.update(outcome='written', reason=reason, changed=True)
            if not module.check_mode:
                files.write_private(params['dest'], artifacts.encode(talosyaml.dump(fetched.data)))
        result.update(server=chosen.server, context=chosen.context_name,
                      client_certificate_not_after=chosen.certificate_not_after().isoformat())
        if module._diff:
            result['diff'] = make_diff(_state(existing, 'kept' if reason is None else 'replaced'),
                                       _state(chosen, result['reason']), before_header=params['dest'], after_header=params['dest'])
        result['elapsed'] = round(deadline.elapsed(), 3)
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **exc.details)
    except (IOError, OSError) as exc:
        module.fail_json(msg='cannot write the kubeconfig %s: %s' % (params['dest'], exc), exception=traceback.format_exc())
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
