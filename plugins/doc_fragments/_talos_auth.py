# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Options of module_utils._argspec.TALOS_AUTH_SPEC, named as talosctl names them. PRIVATE."""

from __future__ import annotations


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options:
  talosconfig:
    description:
      - Path to a talosconfig file (the one P(proxtalos.cluster.talos_config#module) writes, or talosctl's).
      - Its client certificate, key and OS CA are used for mutual TLS with the node's apid.
      - Not needed to talk to a node in maintenance mode, which serves TLS without client certificates. A path
        where no file exists yet counts as not set (the task fails naming it when mutual TLS is needed).
      - Uses the E(TALOSCONFIG) environment variable if not set.
      - Mutually exclusive with O(talosconfig_content).
    type: path
  talosconfig_content:
    description:
      - The talosconfig itself, as YAML text or as a dictionary, for example from a vault.
      - Never logged; the client key found in it is also masked in everything the module returns.
      - Mutually exclusive with O(talosconfig).
    type: raw
  context:
    description:
      - The talosconfig context to use; the file's current context when not set.
    type: str
  port:
    description:
      - TCP port of apid on the node.
    type: int
    default: 50000
  api_timeout:
    description:
      - Deadline, in seconds, of one call to the node (the TLS connection included).
      - A node that accepts TCP but does not answer in time counts as not answering yet; waiting modules retry
        it until their O(wait_timeout).
    type: float
    default: 15.0
requirements:
  - grpclib
  - protobuf
  - cryptography
  - PyYAML
"""
