"""flux_artifact_with_image: upstream's placeholder image set as its kustomization's images entry says, nothing else."""

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.proxtalos.cluster.plugins.filter.flux_artifact_with_image import flux_artifact_with_image

MANIFEST = """---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: flux-operator
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: flux-operator
spec:
  template:
    spec:
      initContainers:
      - name: init
        image: busybox:1.36
      containers:
      - name: manager
        image: flux-operator:latest
        securityContext:
          readOnlyRootFilesystem: true
      - name: sidecar
        image: registry.example:5000/flux-operator-sidecar@sha256:abc
      volumes:
      - name: temp
        emptyDir: {}
"""


def test_only_the_placeholder_image_is_set():
    docs = flux_artifact_with_image(MANIFEST, 'flux-operator', 'ghcr.io/controlplaneio-fluxcd/flux-operator:v0.59.0')
    assert [doc['kind'] for doc in docs] == ['ServiceAccount', 'Deployment']
    pod = docs[1]['spec']['template']['spec']
    assert [c['image'] for c in pod['containers']] == ['ghcr.io/controlplaneio-fluxcd/flux-operator:v0.59.0',
                                                       'registry.example:5000/flux-operator-sidecar@sha256:abc']
    assert pod['initContainers'][0]['image'] == 'busybox:1.36'
    assert pod['volumes'] == [{'name': 'temp', 'emptyDir': {}}]
    assert pod['containers'][0]['securityContext'] == {'readOnlyRootFilesystem': True}


def test_a_manifest_without_the_placeholder_is_an_error_naming_it():
    with pytest.raises(AnsibleFilterError, match='no container in the manifest has the image flux-operator'):
        flux_artifact_with_image(MANIFEST.replace('flux-operator:latest', 'other:latest'), 'flux-operator', 'x:v1')
