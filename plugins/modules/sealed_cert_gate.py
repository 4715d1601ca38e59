#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sealed_cert_gate
short_description: Wait until the sealed-secrets controller serves our certificate
version_added: 0.1.0
description:
  - Verifies that the running sealed-secrets controller seals with the keypair the collection manages. It fetches the
    certificate the controller serves at C(/v1/cert.pem) the way C(kubeseal --fetch-cert) does, through the API
    server's service proxy
    (C(/api/v1/namespaces/NS/services/http:NAME:PORT/proxy/v1/cert.pem), PORT being the name of the Service's first
    port unless O(port) is given), and compares its public key with the one of O(certificate_path).
  - Waits while the Service is missing or the controller does not answer yet (no endpoints, 503).
  - Fails at once when the controller serves another certificate - typically a key it generated itself because
    ours was not there (or not labelled C(active)) when it started, or because key renewal is left on and our
    certificate's NotBefore is older than the renewal period. The failure names the key Secret that holds the
    served certificate (names only; no key material is read out) and what to do.
  - Read-only; never changed.
author:
  - proxtalos.cluster contributors (@proxtalos)
options:
  certificate_path:
    description: The certificate the controller must serve (PEM), as kept by M(proxtalos.cluster.sealed_key).
    type: path
  certificate:
    description: The same as PEM text. Mutually exclusive with O(certificate_path).
    type: str
  controller_namespace:
    description: Namespace of the controller's Service and key Secrets.
    type: str
    default: kube-system
  controller_name:
    description: Name of the controller's Service (kubeseal's C(--controller-name)).
    type: str
    default: sealed-secrets-controller
  port:
    description: Service port name (or number) to reach; default the name of the Service's first port, as kubeseal does.
    type: str
extends_documentation_fragment:
  - proxtalos.cluster._k8s_auth
  - proxtalos.cluster._wait
  - proxtalos.cluster._attributes
  - proxtalos.cluster._attributes.INFO_MODULE
attributes:
  check_mode:
    details:
      - Read-only. In check mode the gate probes once instead of waiting.
seealso:
  - module: proxtalos.cluster.sealed_key
"""

EXAMPLES = r"""
- name: The sealed-secrets controller seals with our key
  proxtalos.cluster.sealed_cert_gate:
    kubeconfig: "{{ proxtalos_artifacts_dir }}/kubeconfig"
    certificate_path: "{{ inventory_dir }}/secrets/sealed-secrets.crt"
    wait_timeout: 300
"""

RETURN = r"""
passed:
  description: Whether the served certificate is ours.
  type: bool
  returned: always
summary:
  description: The last observation in one line.
  type: str
  returned: always
  sample: sealed-secrets controller kube-system/sealed-secrets-controller serves our certificate
url_path:
  description: The API path the certificate was fetched from.
  type: str
  returned: always
  sample: /api/v1/namespaces/kube-system/services/http:sealed-secrets-controller:http/proxy/v1/cert.pem
expected_public_key_sha256:
  description: SHA-256 of our certificate's public key (SubjectPublicKeyInfo DER).
  type: str
  returned: always
served_public_key_sha256:
  description: SHA-256 of the served certificate's public key; empty when nothing was served.
  type: str
  returned: always
served_subject:
  description: Subject of the served certificate.
  type: str
  returned: always
served_not_before:
  description: NotBefore of the served certificate (ISO 8601).
  type: str
  returned: always
served_by_secret:
  description: Name of the active key Secret whose certificate is the one served (when it could be found).
  type: str
  returned: always
diagnosis:
  description: On failure, the lines of the diagnosis (also in C(msg)).
  type: list
  elements: str
  returned: failure
elapsed:
  description: Seconds spent waiting.
  type: float
  returned: always
attempts:
  description: Number of probes.
  type: int
  returned: always
"""

import base64
import traceback
from urllib.parse import quote

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec
from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils import _sealed
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import client as k8s_client
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import diagnosis
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import gates
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import objects
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import predicates

KEY_LABEL = 'sealedsecrets.bitnami.com/sealed-secrets-key'


def argument_spec():
    return _argspec.spec(
        _argspec.K8S_AUTH_SPEC, _argspec.WAIT_SPEC,
        certificate_path=dict(type='path'),
        certificate=dict(type='str'),
        controller_namespace=dict(type='str', default='kube-system'),
        controller_name=dict(type='str', default='sealed-secrets-controller'),
        port=dict(type='str'),
    )


class CertGate(gates.Gate):
    """The controller's served certificate has our public key."""

    kind = 'sealed-cert'

    def __init__(self, params, expected):
        super().__init__(params)
        self.namespace = params['controller_namespace']
        self.name = params['controller_name']
        self.port = params.get('port')
        self.expected = expected
        self.expected_fp = _sealed.fingerprints(expected)['public_key_sha256']
        self.path = ''
        self.served = None

    def target(self):
        return 'sealed-secrets controller %s/%s' % (self.namespace, self.name)

    def observe(self, client):
        service = client.get_json('/api/v1/namespaces/%s/services/%s' % (quote(self.namespace, safe=''), quote(self.name, safe='')))
        if service is None:
            text = 'Service %s/%s not found (controller not installed yet?)' % (self.namespace, self.name)
            return predicates.Verdict(False, text, problems=[text])
        port = self.port
        if not port:
            ports = objects.spec(service).get('ports') or []
            port = str((ports[0].get('name') or ports[0].get('port')) if ports else '')
        self.path = '/api/v1/namespaces/%s/services/http:%s:%s/proxy/v1/cert.pem' % (quote(self.namespace, safe=''),
                                                                                     quote(self.name, safe=''), quote(port, safe=''))
        status, body = client.request(self.path)
        if status != 200:
            answer = diagnosis.clip(k8s_client._status_message(body), 300)  # pylint: disable=protected-access
            text = '%s: GET /v1/cert.pem answered %d: %s' % (self.target(), status, answer)
            return predicates.Verdict(False, text, [{'name': 'cert.pem', 'ok': False, 'reason': 'answered %d' % status}])
        try:
            served, dummy = _sealed.load_certificate(body, 'served certificate')
        except _errors.ValidationError as exc:
            text = '%s serves something that is not a usable certificate: %s' % (self.target(), exc.reason)
            return predicates.Verdict(False, text, [{'name': 'cert.pem', 'ok': False, 'reason': exc.reason}], failed=True)
        self.served = served
        served_fp = _sealed.fingerprints(served)['public_key_sha256']
        if served_fp == self.expected_fp:
            return predicates.Verdict(True, '%s serves our certificate' % self.target(), [{'name': 'cert.pem', 'ok': True, 'reason': None}])
        text = ('%s serves another certificate (public key sha256 %s, subject "%s", NotBefore %s), not ours (%s): it seals with a key '
                'it did not get from us' % (self.target(), served_fp[:16], served.subject.rfc4514_string(),
                                            served.not_valid_before_utc.isoformat(), self.expected_fp[:16]))
        return predicates.Verdict(False, text, [{'name': 'cert.pem', 'ok': False, 'reason': 'other certificate'}], failed=True)

    def served_by(self, client):
        """Name of the active key Secret holding the served certificate (only names leave this function)."""
        if self.served is None:
            return ''
        served_fp = _sealed.fingerprints(self.served)['public_key_sha256']
        for secret in client.list('v1', 'Secret', namespace=self.namespace, label_selector='%s=active' % KEY_LABEL):
            try:
                certificate, dummy = _sealed.load_certificate(base64.b64decode((secret.get('data') or {}).get('tls.crt') or ''))
            except (_errors.ProxtalosError, ValueError, TypeError):
                continue
            if _sealed.fingerprints(certificate)['public_key_sha256'] == served_fp:
                return objects.name(secret)
        return ''

    def diagnose(self, client, verdict):
        lines = list(verdict.problems)
        if self.served is None:
            lines.extend('%s: %s' % (item['name'], item['reason']) for item in verdict.failing())
            return lines
        holder = self.served_by(client)
        active = client.list('v1', 'Secret', namespace=self.namespace, label_selector='%s=active' % KEY_LABEL)
        names = sorted(objects.name(s) for s in active)
        lines.append('active key Secrets in %s: %s' % (self.namespace, ', '.join(names) or 'none'))
        if holder:
            lines.append('the served certificate is in Secret %s/%s' % (self.namespace, holder))
        lines.append('the controller uses the newest active key (by certificate NotBefore), loaded at its start: make sure our key Secret '
                     'existed with the active label before the controller started, run it with key renewal off '
                     '(--key-renew-period=0, Helm keyrenewperiod "0"), relabel or delete the other key Secrets, then restart the '
                     'controller (kubectl -n %s delete pod -l <its selector>)' % self.namespace)
        return lines


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True,
        mutually_exclusive=[('certificate', 'certificate_path')] + _argspec.K8S_AUTH_CONSTRAINTS['mutually_exclusive'],
        required_one_of=[('certificate', 'certificate_path')],
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    if not k8s_client.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib('kubernetes'), exception=str(k8s_client.KUBERNETES_IMPORT_ERROR))
    timeout, interval = _argspec.wait_params(module.params)
    if module.check_mode:
        timeout = 0.0
    gate = client = gate_run = None
    result = {'changed': False, 'passed': False, 'summary': '', 'url_path': '', 'expected_public_key_sha256': '',
              'served_public_key_sha256': '', 'served_subject': '', 'served_not_before': '', 'served_by_secret': '',
              'elapsed': 0.0, 'attempts': 0}
    try:
        if module.params['certificate_path']:
            try:
                with open(module.params['certificate_path'], 'rb') as handle:
                    pem = handle.read()
            except OSError as exc:
                raise _errors.ValidationError('certificate_path', 'cannot read: %s' % exc)
            field = 'certificate_path'
        else:
            pem, field = module.params['certificate'], 'certificate'
        expected, dummy = _sealed.load_certificate(pem, field)
        gate = CertGate(module.params, expected)
        result['expected_public_key_sha256'] = gate.expected_fp
        client = k8s_client.build_client(module.params, module=module, warn=module.warn)
        gate_run = gates.run(gate, client, timeout, interval)
    except _errors.ValidationError as exc:
        module.fail_json(msg=str(exc), field=exc.field, **result)
    except _errors.ProxtalosError as exc:
        result.update(exc.details)
        module.fail_json(msg=str(exc), exception=traceback.format_exc(), **result)
    result.update(passed=gate_run.passed, summary=gate_run.headline(), url_path=gate.path, elapsed=round(gate_run.result.elapsed, 3),
                  attempts=gate_run.result.attempts)
    if gate.served is not None:
        result.update(served_public_key_sha256=_sealed.fingerprints(gate.served)['public_key_sha256'],
                      served_subject=gate.served.subject.rfc4514_string(), served_not_before=gate.served.not_valid_before_utc.isoformat())
    if gate_run.passed:
        module.exit_json(**result)
    message = gates.explain(gate_run, client)
    try:
        result['served_by_secret'] = gate.served_by(client)
    except _errors.ProxtalosError:
        pass
    result['diagnosis'] = message.splitlines()[1:]
    module.fail_json(msg=message, **result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
