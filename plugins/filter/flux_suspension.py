# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""flux_suspension: which Flux objects a maintenance suspends, which the user suspended, which this collection did.

The roles/flux tasks suspend.yml and resume.yml read every Kustomization and HelmRelease and hand them here. An object
with spec.suspend true and no proxtalos.cluster/suspended-by annotation is the user's own (`flux suspend`, or the
GitOps repository says so): `kept`, never touched. One with the annotation was suspended by this collection (this run,
or an earlier one that stopped before resuming it): `ours`, what resume.yml resumes. Every other object is
`to_suspend`. Objects outside the given namespaces (when any are given) are left out.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

ANNOTATION = 'proxtalos.cluster/suspended-by'


def _ref(obj):
    meta = obj.get('metadata') or {}
    return {'api_version': obj.get('apiVersion'), 'kind': obj.get('kind'), 'namespace': meta.get('namespace'),
            'name': meta.get('name')}


def flux_suspension(objects, namespaces=None):
    """A dict of lists of {api_version, kind, namespace, name}: to_suspend, kept (the user's), ours (annotated)."""
    if not isinstance(objects, list) or not all(isinstance(obj, dict) for obj in objects):
        raise AnsibleFilterError('flux_suspension: expected a list of Kubernetes objects, got %r' % (objects,))
    if namespaces is not None and not isinstance(namespaces, list):
        raise AnsibleFilterError('flux_suspension: namespaces must be a list of names, got %r' % (namespaces,))
    out = {'to_suspend': [], 'kept': [], 'ours': []}
    for obj in objects:
        meta = obj.get('metadata') or {}
        if namespaces and meta.get('namespace') not in namespaces:
            continue
        if meta.get('deletionTimestamp'):
            continue   # going away: nothing to suspend or resume
        ours = ANNOTATION in (meta.get('annotations') or {})
        suspended = (obj.get('spec') or {}).get('suspend') is True
        if ours:
            out['ours'].append(_ref(obj))
        elif suspended:
            out['kept'].append(_ref(obj))
        else:
            out['to_suspend'].append(_ref(obj))
    for key in out:
        out[key].sort(key=lambda ref: (ref['kind'] or '', ref['namespace'] or '', ref['name'] or ''))
    return out


class FilterModule(object):
    def filters(self):
        return {'flux_suspension': flux_suspension}
