# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""flux_artifact_with_image: the documents of an upstream manifest file with one image reference set.

Upstream's own kustomization names the image that its manifest only names by a placeholder (flux-operator's
config/manager/kustomization.yaml: `images: [{name: flux-operator, newName: ..., newTag: ...}]`, while
config/manager/deployment.yaml says `image: flux-operator:latest`). This sets that one field, in every container and
init container of a workload's pod template whose image name (the reference without its tag or digest) is the
placeholder, and leaves every other byte's meaning alone. A file in which no container has the placeholder is an
error: the pin and the file disagree.
"""

from __future__ import annotations

import yaml

from ansible.errors import AnsibleFilterError


def _image_name(reference):
    name = reference.split('@', 1)[0]
    slash = name.rfind('/')
    colon = name.rfind(':')
    return name[:colon] if colon > slash else name


def _pod_spec(doc):
    spec = doc.get('spec') if isinstance(doc, dict) else None
    if not isinstance(spec, dict):
        return None
    if doc.get('kind') == 'CronJob':
        spec = ((spec.get('jobTemplate') or {}).get('spec') or {})
    template = spec.get('template')
    if not isinstance(template, dict):
        return None
    return template.get('spec') if isinstance(template.get('spec'), dict) else None


def flux_artifact_with_image(text, image_name, image):
    """The YAML documents of text (empty ones dropped), with image set where a container's image name is image_name."""
    if not isinstance(text, str):
        raise AnsibleFilterError('flux_artifact_with_image: expected the text of a manifest file, got %s' % type(text).__name__)
    if not image_name or not image:
        raise AnsibleFilterError('flux_artifact_with_image: image_name and image must both be set (got %r, %r)' % (image_name, image))
    try:
        docs = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise AnsibleFilterError('flux_artifact_with_image: the manifest is not YAML: %s' % exc) from None
    found = 0
    for doc in docs:
        pod = _pod_spec(doc)
        if pod is None:
            continue
        for key in ('initContainers', 'containers'):
            for container in pod.get(key) or ():
                if isinstance(container, dict) and _image_name(str(container.get('image') or '')) == image_name:
                    container['image'] = image
                    found += 1
    if not found:
        raise AnsibleFilterError('flux_artifact_with_image: no container in the manifest has the image %s to set to %s'
                                 % (image_name, image))
    return docs


class FilterModule(object):
    def filters(self):
        return {'flux_artifact_with_image': flux_artifact_with_image}
