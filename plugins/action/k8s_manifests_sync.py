# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of proxtalos.cluster.k8s_manifests_sync: in the worker process where it can be, else the module process (vault inputs opened)."""

from __future__ import annotations

from ansible_collections.proxtalos.cluster.plugins.modules import k8s_manifests_sync
from ansible_collections.proxtalos.cluster.plugins.plugin_utils._vault_inputs import VaultInputsAction


class ActionModule(VaultInputsAction):
    """proxtalos.cluster.k8s_manifests_sync (plugin_utils/_vault_inputs.py)."""

    collection_module = k8s_manifests_sync
