# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Options of module_utils._argspec.K8S_AUTH_SPEC, named as in kubernetes.core. PRIVATE."""

from __future__ import annotations


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - Path to a kubeconfig file.
      - When neither O(kubeconfig) nor O(kubeconfig_content) is set, the default kubeconfig is
        used (the E(KUBECONFIG) environment variable, else C(~/.kube/config)).
      - Uses the E(K8S_AUTH_KUBECONFIG) environment variable if not set.
      - Mutually exclusive with O(kubeconfig_content).
    type: path
  kubeconfig_content:
    description:
      - The kubeconfig itself, as YAML text or as a dictionary, for example from a vault.
      - Never logged. The client key, tokens and passwords found in it are also masked
        in everything the module returns.
      - Mutually exclusive with O(kubeconfig).
    type: raw
  context:
    description:
      - The kubeconfig context to use; the kubeconfig's current context when not set.
      - Uses the E(K8S_AUTH_CONTEXT) environment variable if not set.
    type: str
  validate_certs:
    description:
      - Verify the API server certificate against the CA of the kubeconfig (or O(ca_path)).
      - This is on even when the kubeconfig says C(insecure-skip-tls-verify); turning it off
        must be explicit, and is reported as a warning.
      - Uses the E(K8S_AUTH_VALIDATE_CERTS) or E(K8S_AUTH_VERIFY_SSL) environment variable if not set.
    type: bool
    default: true
    aliases: [verify_ssl]
  ca_path:
    description:
      - PEM file with the CA that signed the API server certificate, instead of the
        kubeconfig's C(certificate-authority(-data)).
      - Uses the E(K8S_AUTH_CA_CERT) or E(K8S_AUTH_SSL_CA_CERT) environment variable if not set.
    type: path
    aliases: [ca_cert]
  api_timeout:
    description:
      - Seconds one HTTP request to the API may take. A wait's deadline also bounds each request.
    type: float
    default: 10.0
requirements:
  - kubernetes >= 30.0.0
  - PyYAML (for O(kubeconfig_content) given as text)
"""
