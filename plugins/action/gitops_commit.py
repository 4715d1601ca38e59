# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of proxtalos.cluster.gitops_commit: the module process, with vault-encrypted input files opened for it."""

from __future__ import annotations

from ansible_collections.proxtalos.cluster.plugins.plugin_utils._vault_inputs import VaultInputsAction


class ActionModule(VaultInputsAction):
    """proxtalos.cluster.gitops_commit (plugin_utils/_vault_inputs.py)."""
