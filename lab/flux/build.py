"""A small `kustomize build` for the lab's kustomize-controller.

Builds a directory of an artifact (a Snapshot's files) into a list of objects:

- with a kustomization.yaml (or .yml, or Kustomization): its `resources` (files, and
  directories that have a kustomization of their own), then `namespace` (set on every namespaced
  object), `commonLabels`/`labels[].pairs` and `commonAnnotations`; any other field is refused,
  naming it, rather than silently ignored;
- without one: what Flux generates - every YAML manifest of the directory and its
  subdirectories (a subdirectory with a kustomization is taken as a whole).

Errors are BuildError with kustomize's wording where it has one (duplicate ids, a missing
resource, a directory without a kustomization).
"""

import posixpath

import yaml

CONFIG_NAMES = ('kustomization.yaml', 'kustomization.yml', 'Kustomization')
SUPPORTED_FIELDS = {'apiVersion', 'kind', 'metadata', 'resources', 'namespace', 'commonLabels', 'labels', 'commonAnnotations'}
# Kinds kustomize treats as cluster-scoped (it never sets a namespace on them).
CLUSTER_KINDS = {'Namespace', 'CustomResourceDefinition', 'ClusterRole', 'ClusterRoleBinding', 'StorageClass', 'CSIDriver',
                 'PriorityClass', 'PersistentVolume', 'Node', 'ValidatingWebhookConfiguration', 'MutatingWebhookConfiguration',
                 'APIService', 'IngressClass', 'ClusterIssuer', 'RuntimeClass', 'VolumeSnapshotClass', 'CiliumLoadBalancerIPPool',
                 'CiliumClusterwideNetworkPolicy', 'CiliumL2AnnouncementPolicy'}


class BuildError(Exception):
    """kustomize build failed; the message says why."""


class PathNotFound(BuildError):
    """spec.path names no directory of the artifact."""


def clean_path(path):
    """'./clusters/lab/' -> 'clusters/lab'; '', '.' or '/' -> ''. Refuses a path that leaves the artifact."""
    normal = posixpath.normpath((path or '').strip() or '.').lstrip('/') or '.'
    if normal == '..' or normal.startswith('../'):
        raise BuildError('path %r leaves the source artifact' % path)
    return '' if normal == '.' else normal


def _is_dir(files, path):
    prefix = path + '/' if path else ''
    return any(name.startswith(prefix) for name in files)


def _config(files, directory):
    for name in CONFIG_NAMES:
        candidate = posixpath.join(directory, name) if directory else name
        if candidate in files:
            return candidate
    return None


def _documents(files, path):
    try:
        docs = [d for d in yaml.safe_load_all(files[path]) if d is not None]
    except yaml.YAMLError as exc:
        raise BuildError('kustomize build failed: %s: %s' % (path, str(exc).replace('\n', ' '))) from None
    out = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get('kind', '').endswith('List') and isinstance(doc.get('items'), list):
            out.extend(doc['items'])
        else:
            out.append(doc)
    return out


def _check_object(doc, path):
    if not isinstance(doc, dict):
        raise BuildError('kustomize build failed: %s: a document is not an object' % path)
    meta = doc.get('metadata') or {}
    if not doc.get('apiVersion') or not doc.get('kind') or not meta.get('name'):
        raise BuildError('failed to decode Kubernetes apiVersion, kind and name from: %s (in %s)'
                         % (yaml.safe_dump(doc, default_flow_style=True).strip()[:200], path))


def object_id(obj):
    meta = obj.get('metadata') or {}
    group = obj['apiVersion'].rpartition('/')[0]
    return '%s|%s|%s|%s' % (group, obj['kind'], meta.get('namespace') or '', meta['name'])


def _build_dir(files, directory, namespaced, seen):
    config_path = _config(files, directory)
    if config_path is None:
        return _generated(files, directory, namespaced, seen)
    if config_path in seen:
        raise BuildError('kustomize build failed: cycle: %s is included again' % config_path)
    seen = seen | {config_path}
    try:
        config = yaml.safe_load(files[config_path]) or {}
    except yaml.YAMLError as exc:
        raise BuildError('kustomize build failed: %s: %s' % (config_path, str(exc).replace('\n', ' '))) from None
    if not isinstance(config, dict):
        raise BuildError('kustomize build failed: %s is not a mapping' % config_path)
    unsupported = sorted(set(config) - SUPPORTED_FIELDS)
    if unsupported:
        raise BuildError('kustomize build failed: %s: field(s) %s are not supported by the lab kustomize-controller '
                         '(it supports: resources, namespace, commonLabels, labels, commonAnnotations)'
                         % (config_path, ', '.join(unsupported)))
    objects = []
    for entry in config.get('resources') or ():
        if not isinstance(entry, str):
            raise BuildError('kustomize build failed: %s: resources entries must be strings' % config_path)
        if '://' in entry or entry.startswith('github.com/'):
            raise BuildError('kustomize build failed: %s: remote resource %s is not reachable from the lab' % (config_path, entry))
        target = posixpath.normpath(posixpath.join(directory, entry)) if directory else posixpath.normpath(entry)
        target = '' if target == '.' else target
        if target in files:
            docs = _documents(files, target)
            for doc in docs:
                _check_object(doc, target)
            objects.extend(docs)
        elif _is_dir(files, target):
            if _config(files, target) is None:
                raise BuildError("kustomize build failed: unable to find one of 'kustomization.yaml', 'kustomization.yml' or "
                                 "'Kustomization' in directory '%s'" % target)
            objects.extend(_build_dir(files, target, namespaced, seen))
        else:
            raise BuildError("kustomize build failed: accumulating resources: accumulation err='accumulating resources from '%s': "
                             "open %s: no such file or directory'" % (entry, target))
    return _transform(objects, config, namespaced)


def _generated(files, directory, namespaced, seen):
    """What Flux generates without a kustomization: every manifest below the directory."""
    prefix = directory + '/' if directory else ''
    objects = []
    taken = set()
    for name in sorted(files):
        if not name.startswith(prefix) or not name.endswith(('.yaml', '.yml')):
            continue
        relative = name[len(prefix):]
        parts = relative.split('/')
        if len(parts) > 1:
            sub = prefix + parts[0]
            if sub in taken:
                continue
            if _nested_config(files, prefix, parts):
                sub_dir = _nested_config(files, prefix, parts)
                if sub_dir not in taken:
                    taken.add(sub_dir)
                    objects.extend(_build_dir(files, sub_dir, namespaced, seen))
                continue
        for doc in _documents(files, name):
            if isinstance(doc, dict) and doc.get('apiVersion') and doc.get('kind'):
                _check_object(doc, name)
                objects.append(doc)
    return objects


def _nested_config(files, prefix, parts):
    """The shallowest directory between prefix and the file that has a kustomization, or None."""
    for depth in range(1, len(parts)):
        candidate = prefix + '/'.join(parts[:depth])
        if _config(files, candidate) is not None:
            return candidate
    return None


def _transform(objects, config, namespaced):
    namespace = config.get('namespace')
    labels = dict(config.get('commonLabels') or {})
    for entry in config.get('labels') or ():
        labels.update((entry or {}).get('pairs') or {})
    annotations = dict(config.get('commonAnnotations') or {})
    out = []
    for obj in objects:
        obj = _copy(obj)
        meta = obj.setdefault('metadata', {})
        if namespace and namespaced(obj['apiVersion'], obj['kind']):
            meta['namespace'] = namespace
        if labels:
            meta['labels'] = dict(meta.get('labels') or {}, **{k: str(v) for k, v in labels.items()})
        if annotations:
            meta['annotations'] = dict(meta.get('annotations') or {}, **{k: str(v) for k, v in annotations.items()})
        out.append(obj)
    return out


def _copy(value):
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def default_namespaced(api_version, kind):
    del api_version
    return kind not in CLUSTER_KINDS


def build(files, path, namespaced=default_namespaced):
    """The objects `kustomize build <path>` gives for an artifact's files; BuildError when it cannot."""
    directory = clean_path(path)
    if directory and not _is_dir(files, directory):
        raise PathNotFound('kustomization path not found: stat /tmp/kustomization/%s: no such file or directory' % directory)
    objects = _build_dir(files, directory, namespaced, frozenset())
    ids = {}
    for obj in objects:
        ident = object_id(obj)
        if ident in ids:
            meta = obj['metadata']
            raise BuildError('kustomize build failed: may not add resource with an already registered id: %s.%s/%s.%s'
                             % (obj['kind'], obj['apiVersion'].replace('/', '.'), meta['name'], meta.get('namespace') or '[noNs]'))
        ids[ident] = obj
    return objects
