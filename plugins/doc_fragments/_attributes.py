# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Attribute fragments shared by the modules. PRIVATE to the collection."""

from __future__ import annotations


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in C(check_mode) and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in C(check_mode)), when in diff mode.
"""

    INFO_MODULE = r"""
options: {}
attributes:
  check_mode:
    support: full
    details:
      - This action does not modify state.
    description: Can run in C(check_mode) and return changed status prediction without modifying target.
  diff_mode:
    support: N/A
    details:
      - This action does not modify state.
    description: Will return details on what has changed (or possibly needs changing in C(check_mode)), when in diff mode.
"""
