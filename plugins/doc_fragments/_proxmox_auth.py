# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Options of module_utils._argspec.PROXMOX_AUTH_SPEC, named as in community.proxmox. PRIVATE."""

from __future__ import annotations


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options:
  api_host:
    description:
      - Host name or address of the Proxmox VE API.
      - Uses the E(PROXMOX_HOST) environment variable if not set.
    type: str
    required: true
  api_port:
    description:
      - Port of the Proxmox VE API; PVE's default V(8006) when not set.
      - Uses the E(PROXMOX_PORT) environment variable if not set.
    type: int
  api_user:
    description:
      - User to authenticate as, for example V(root@pam) or V(automation@pve).
      - Uses the E(PROXMOX_USER) environment variable if not set.
    type: str
    required: true
  api_password:
    description:
      - Password of O(api_user). One of O(api_password) and O(api_token_id) is required.
      - Uses the E(PROXMOX_PASSWORD) environment variable if not set.
    type: str
  api_token_id:
    description:
      - API token id (the part after C(!)), used with O(api_token_secret).
      - Uses the E(PROXMOX_TOKEN_ID) environment variable if not set.
    type: str
  api_token_secret:
    description:
      - Secret of the API token O(api_token_id).
      - Uses the E(PROXMOX_TOKEN_SECRET) environment variable if not set.
    type: str
  ca_path:
    description:
      - PEM file with the CA that signed the PVE API certificate.
      - Ignored when O(validate_certs=false).
      - Uses the E(PROXMOX_CA_PATH) environment variable if not set.
    type: path
  validate_certs:
    description:
      - Verify the PVE API certificate. Turning this off is reported as a warning.
      - Uses the E(PROXMOX_VALIDATE_CERTS) environment variable if not set.
    type: bool
    default: true
  api_timeout:
    description:
      - Seconds one HTTP request to the PVE API may take.
      - Uses the E(PROXMOX_API_TIMEOUT) environment variable if not set.
    type: int
    default: 10
requirements:
  - proxmoxer >= 2.0
  - requests
"""
