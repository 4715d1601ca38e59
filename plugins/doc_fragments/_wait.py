# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Options of module_utils._argspec.WAIT_SPEC. PRIVATE to the collection."""

from __future__ import annotations


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options:
  wait:
    description:
      - Wait until the observed state is reached.
      - When V(false), the state is probed once and the module fails if it is not reached yet.
    type: bool
    default: true
  wait_timeout:
    description:
      - How long to wait, in seconds, before failing with what was last observed.
      - V(0) probes once.
    type: float
    default: 300.0
  wait_sleep:
    description:
      - Seconds between two probes while waiting.
    type: float
    default: 2.0
"""
