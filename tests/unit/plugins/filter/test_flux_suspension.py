"""The flux_suspension filter: the user's own suspended objects kept, the collection's (annotated) ones resumed."""
import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.proxtalos.cluster.plugins.filter.flux_suspension import ANNOTATION, flux_suspension


def obj(kind, namespace, name, suspend=None, annotations=None, deleting=False):
    meta = {'name': name, 'namespace': namespace}
    if annotations:
        meta['annotations'] = annotations
    if deleting:
        meta['deletionTimestamp'] = '2026-01-01T00:00:00Z'
    spec = {} if suspend is None else {'suspend': suspend}
    version = 'kustomize.toolkit.fluxcd.io/v1' if kind == 'Kustomization' else 'helm.toolkit.fluxcd.io/v2'
    return {'apiVersion': version, 'kind': kind, 'metadata': meta, 'spec': spec}


def names(refs):
    return ['%s %s/%s' % (ref['kind'], ref['namespace'], ref['name']) for ref in refs]


def test_sorts_into_to_suspend_kept_and_ours():
    objects = [obj('Kustomization', 'flux-system', 'apps'),
               obj('Kustomization', 'flux-system', 'infra', suspend=False),
               obj('HelmRelease', 'media', 'plex', suspend=True),                                   # the user's
               obj('Kustomization', 'flux-system', 'crds', suspend=True, annotations={ANNOTATION: 'upgrade_talos'}),
               obj('HelmRelease', 'db', 'pg', suspend=False, annotations={ANNOTATION: 'upgrade_talos'}),  # resumed by hand
               obj('Kustomization', 'flux-system', 'gone', deleting=True)]
    state = flux_suspension(objects)
    assert names(state['to_suspend']) == ['Kustomization flux-system/apps', 'Kustomization flux-system/infra']
    assert names(state['kept']) == ['HelmRelease media/plex']
    assert names(state['ours']) == ['HelmRelease db/pg', 'Kustomization flux-system/crds']
    assert state['to_suspend'][0] == {'api_version': 'kustomize.toolkit.fluxcd.io/v1', 'kind': 'Kustomization',
                                      'namespace': 'flux-system', 'name': 'apps'}


def test_namespaces_limit_what_is_touched():
    objects = [obj('Kustomization', 'flux-system', 'apps'), obj('HelmRelease', 'media', 'plex')]
    assert names(flux_suspension(objects, ['media'])['to_suspend']) == ['HelmRelease media/plex']
    assert names(flux_suspension(objects, [])['to_suspend']) == ['HelmRelease media/plex', 'Kustomization flux-system/apps']


def test_bad_input_is_named():
    with pytest.raises(AnsibleFilterError, match='list of Kubernetes objects'):
        flux_suspension({'items': []})
    with pytest.raises(AnsibleFilterError, match='namespaces must be a list'):
        flux_suspension([], 'flux-system')
