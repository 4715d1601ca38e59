# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of proxtalos.cluster.k8s_manifests_sync: the module runs in Ansible's worker process when it can."""

from __future__ import annotations

from ansible_collections.proxtalos.cluster.plugins.modules import k8s_manifests_sync
from ansible_collections.proxtalos.cluster.plugins.plugin_utils._in_process import InProcessModuleAction


class ActionModule(InProcessModuleAction):
    """proxtalos.cluster.k8s_manifests_sync, in the worker process where it can be (plugin_utils/_in_process.py)."""

    collection_module = k8s_manifests_sync
