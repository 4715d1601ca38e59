# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Keep secrets found at run time out of module output. PRIVATE to the collection.

Options marked no_log are masked by Ansible. Secrets a module discovers itself (a key read
from a bundle, a token in a kubeconfig) must be registered: ansible-core 2.22+ has
register_secret; before that, adding the value to module.no_log_values masks it in the result.
"""

from __future__ import annotations

try:
    from ansible.module_utils.secrets import register_secret as _register_secret  # type: ignore
except ImportError:  # ansible-core < 2.22
    _register_secret = None


def register(module, *values):
    """Mask each non-empty string value in everything the module returns."""
    for value in values:
        if value is None:
            continue
        if isinstance(value, bytes):
            value = value.decode('utf-8', 'replace')
        value = str(value)
        if not value.strip():
            continue
        if _register_secret is not None:
            _register_secret(value)
        module.no_log_values.add(value)
