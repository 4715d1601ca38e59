# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Flux dependency analysis of a GitOps repository. PRIVATE to the collection.

Pure: reads YAML files under a directory, never a cluster. Finds the Flux Kustomizations
(kustomize.toolkit.fluxcd.io) and HelmReleases (helm.toolkit.fluxcd.io), resolves their
spec.dependsOn (a Kustomization depends on Kustomizations, a HelmRelease on HelmReleases; the
namespace defaults to the dependant's own), and reports:

- tiers: longest-path levels (tier 0 depends on nothing; tier n on something in tier n-1);
- cycles: each strongly connected group, with one cycle through it in dependsOn order;
- dangling: dependsOn entries that name nothing in the repository;
- missing critical dependencies: rules (data) such as "proxmox-csi needs proxmox-ccm", checked
  on the effective order (dependsOn, plus the dependsOn of the Kustomization that applies an
  object), satisfied also by a release the bootstrap installs before Flux;
- counts per kind (total, with dependsOn, wait: true, healthChecks) and a Mermaid graph;
- the bootstrap releases' helmfile-style `needs` checked against Flux's order;
- whether the tree needs the bootstrap releases installed before Flux applies it
  (bootstrap_needs: their CRDs, APIServices, objects, Helm releases, webhooks), conservatively.

Also runnable for CI, with the same code:
  python -m ansible_collections.proxtalos.cluster.plugins.module_utils._flux_graph REPO [options]
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import json
import os
import re
import sys

from ansible_collections.proxtalos.cluster.plugins.module_utils import _graph
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError

try:
    import yaml
except ImportError as exc:  # pragma: no cover - reported by the module through missing_required_lib
    HAS_YAML = False
    YAML_IMPORT_ERROR = exc
else:
    HAS_YAML = True
    YAML_IMPORT_ERROR = None

KUSTOMIZATION = 'Kustomization'
HELMRELEASE = 'HelmRelease'
FLUX_GROUPS = {KUSTOMIZATION: 'kustomize.toolkit.fluxcd.io/', HELMRELEASE: 'helm.toolkit.fluxcd.io/'}
KUSTOMIZE_CONFIG_NAMES = ('kustomization.yaml', 'kustomization.yml', 'Kustomization')
FINDINGS = ('cycles', 'dangling', 'missing_critical', 'bootstrap_contradictions')
DEFAULT_FAIL_ON = ('cycles', 'dangling')
DEFAULT_NAMESPACE = 'flux-system'

_CSI = ['proxmox-csi*', 'csi-proxmox*']
_CCM = ['proxmox-ccm*', 'proxmox-cloud-controller-manager*']
_COREDNS = ['coredns*']
_CNI = ['cilium', 'cilium-*', 'calico*', 'tigera-operator*', 'flannel*', 'kube-router*', 'cni', 'cni-*']

# The defaults. A rule: subject and requires are name globs; a subject node must come
# (through the effective dependency order) after some node matching requires. Nodes matching
# requires are never subjects of the same rule; exclude removes further subjects.
DEFAULT_RULES = (
    {'name': 'proxmox-csi needs proxmox-ccm', 'subject': _CSI, 'requires': _CCM,
     'reason': 'the CSI reads region and zone from the node labels the CCM sets'},
    {'name': 'proxmox-csi needs coredns', 'subject': _CSI, 'requires': _COREDNS,
     'reason': 'the CSI controller reaches the Proxmox API and the API server by name'},
    {'name': 'cert-manager needs coredns', 'subject': ['cert-manager*'], 'requires': _COREDNS,
     'reason': 'ACME and webhook calls resolve names'},
    {'name': 'monitoring needs coredns', 'subject': ['monitoring*', 'kube-prometheus-stack*', 'prometheus*', 'grafana*', 'observability*'],
     'requires': _COREDNS, 'reason': 'scrape targets and alert receivers are found by name'},
    {'name': 'networked workloads need the CNI', 'subject': ['*'], 'requires': _CNI,
     'exclude': ['flux-system', '*-crds', 'crds', 'namespaces'],
     'reason': 'pods get no network until the CNI agent runs on their node'},
)


# --- reading the repository ------------------------------------------------------------------

def node_id(kind, namespace, name):
    return '%s/%s/%s' % (kind, namespace, name)


def _relative(root, path):
    return os.path.relpath(path, root).replace(os.sep, '/')


def _excluded(relpath, exclude):
    return any(fnmatch.fnmatch(relpath, pattern) or fnmatch.fnmatch(relpath + '/', pattern) for pattern in exclude)


def _yaml_files(root, exclude):
    for directory, dirnames, filenames in os.walk(root):
        reldir = _relative(root, directory)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith('.')
                             and not _excluded(_relative(root, os.path.join(directory, d)), exclude))
        for filename in sorted(filenames):
            if filename.endswith(('.yaml', '.yml')) or filename == 'Kustomization':
                relpath = filename if reldir == '.' else '%s/%s' % (reldir, filename)
                if not _excluded(relpath, exclude):
                    yield relpath


if HAS_YAML:
    class GoLikeLoader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
        """PyYAML's safe loader, made to take what Go's YAML reader (gopkg.in/yaml.v3 v3.0.1, under kyaml and
        sigs.k8s.io/yaml) takes:

        - an anchor defined again replaces the earlier one for the aliases after it (decode.go:140-145 stores it
          in the anchors map without a check); PyYAML stops with "found duplicate anchor";
        - `=` is a plain string: yaml.v3's resolve table knows `<<` (resolve.go:59) and no `=`, while PyYAML
          resolves `=` to tag:yaml.org,2002:value, which its safe constructor refuses;
        - a tag it does not know (`!vault`, `!reference`) leaves the value as it is written: resolve() returns a
          tag that is not resolvable unchanged with the text (resolve.go:116-130); PyYAML stops with "could not
          determine a constructor". The value is read as if untagged.
        """

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                return super().compose_node(parent, index)
            anchor = getattr(self.peek_event(), 'anchor', None)
            if anchor is not None and anchor in self.anchors:
                del self.anchors[anchor]
            return super().compose_node(parent, index)

    GoLikeLoader.yaml_implicit_resolvers = dict(
        (first, [(tag, regexp) for tag, regexp in resolvers if tag != 'tag:yaml.org,2002:value'])
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items())

    def _construct_untagged(loader, node):
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)

    GoLikeLoader.add_constructor(None, _construct_untagged)


def _load_documents(path):
    with open(path, 'rb') as handle:
        return list(yaml.load_all(handle, Loader=GoLikeLoader))  # nosec B506 - a SafeLoader subclass


def _yaml_error(exc):
    """A one-line description of a YAML error, with line and column, without the file name."""
    problem = getattr(exc, 'problem', None)
    mark = getattr(exc, 'problem_mark', None)
    if problem and mark is not None:
        return '%s (line %d, column %d)' % (problem, mark.line + 1, mark.column + 1)
    return ' '.join(str(exc).split())[:300]


def _is_kustomize_config(filename, doc):
    api_version = str(doc.get('apiVersion') or '')
    if api_version.startswith('kustomize.config.k8s.io/'):
        return True
    return os.path.basename(filename) in KUSTOMIZE_CONFIG_NAMES and not api_version and 'spec' not in doc


def _flux_kind(doc):
    kind = doc.get('kind')
    group = FLUX_GROUPS.get(kind)
    if group and str(doc.get('apiVersion') or '').startswith(group):
        return kind
    return None


def _patch_paths(config):
    """Relative paths of the patch files a kustomization.yaml names."""
    paths = []
    for entry in config.get('patches') or []:
        if isinstance(entry, dict) and isinstance(entry.get('path'), str):
            paths.append(entry['path'])
    for entry in config.get('patchesStrategicMerge') or []:
        if isinstance(entry, str) and '\n' not in entry:
            paths.append(entry)
    for entry in config.get('patchesJson6902') or []:
        if isinstance(entry, dict) and isinstance(entry.get('path'), str):
            paths.append(entry['path'])
    return paths


class Repo(object):
    """What was read from a repository tree: Flux objects, kustomize configs and what was skipped."""

    def __init__(self, root):
        self.root = root
        self.nodes = {}
        self.configs = {}            # directory (relative) -> kustomization.yaml content
        self.files = []
        self.skipped = []
        self.parse_errors = []
        self.duplicates = []
        self.patch_files = set()
        self.exclude = []
        self.objects = []            # every object document (see _object_record), in file order
        self.file_set = set()        # repo.files, for lookups
        self.variable_sources = []   # (file, ConfigMap or Secret document): what postBuild.substituteFrom can name
        self.unresolved = []         # {node, file, text}: ${VAR} references no variable of the tree resolves


def _partial_reason(kind, doc):
    metadata = doc.get('metadata')
    spec = doc.get('spec')
    if '$patch' in doc or (isinstance(spec, dict) and '$patch' in spec):
        return 'a strategic-merge patch ($patch)'
    if not isinstance(metadata, dict) or not metadata.get('name'):
        return 'no metadata.name (a patch or a template?)'
    if not isinstance(spec, dict):
        return 'no spec (a patch?)'
    if kind == KUSTOMIZATION and not spec.get('sourceRef'):
        return 'no spec.sourceRef (a patch?)'
    if kind == HELMRELEASE and not spec.get('chart') and not spec.get('chartRef'):
        return 'no spec.chart or spec.chartRef (a patch?)'
    return None


def _namespace_for(repo, relpath, default_namespace):
    """The namespace kustomize would give an object without one: the nearest kustomization.yaml's."""
    directory = os.path.dirname(relpath)
    while True:
        config = repo.configs.get(directory or '.')
        if config and isinstance(config.get('namespace'), str) and config['namespace']:
            return config['namespace']
        if not directory:
            return default_namespace
        directory = os.path.dirname(directory)


def _depends_on(kind, doc, namespace, relpath, index):
    entries = []
    raw = (doc.get('spec') or {}).get('dependsOn') or []
    if not isinstance(raw, list):
        return entries, ['%s#%d: spec.dependsOn must be a list' % (relpath, index)]
    problems = []
    for position, entry in enumerate(raw):
        if not isinstance(entry, dict) or not entry.get('name'):
            problems.append('%s#%d: spec.dependsOn[%d] has no name' % (relpath, index, position))
            continue
        entries.append(node_id(kind, entry.get('namespace') or namespace, str(entry['name'])))
    return entries, problems


def load_repo(root, exclude=(), default_namespace=DEFAULT_NAMESPACE):
    """Read every YAML file under root (hidden directories and `exclude` globs left out)."""
    if not HAS_YAML:
        raise ValidationError('path', 'the Python library PyYAML is required to read the repository: %s' % YAML_IMPORT_ERROR)
    if not os.path.isdir(root):
        raise ValidationError('path', '%s is not a directory' % root)
    repo = Repo(os.path.abspath(root))
    repo.exclude = list(exclude)
    documents = []
    pending = []
    for relpath in _yaml_files(repo.root, list(exclude)):
        repo.files.append(relpath)
        repo.file_set.add(relpath)
        try:
            docs = _load_documents(os.path.join(repo.root, relpath))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            repo.parse_errors.append({'file': relpath, 'error': _yaml_error(exc) if isinstance(exc, yaml.YAMLError) else str(exc)})
            continue
        for index, doc in enumerate(docs):
            if isinstance(doc, dict):
                documents.append((relpath, index, doc))
    # kustomize configs first: they give namespaces and name the patch files.
    for relpath, index, doc in documents:
        if _is_kustomize_config(relpath, doc):
            directory = os.path.dirname(relpath) or '.'
            repo.configs[directory] = doc
            for patch in _patch_paths(doc):
                repo.patch_files.add(os.path.normpath(os.path.join(os.path.dirname(relpath), patch)).replace(os.sep, '/'))
    for relpath, index, doc in documents:
        kind = _flux_kind(doc)
        if kind is None:
            continue
        if relpath in repo.patch_files:
            repo.skipped.append({'file': relpath, 'document': index, 'reason': 'a kustomize patch file'})
            continue
        reason = _partial_reason(kind, doc)
        if reason:
            repo.skipped.append({'file': relpath, 'document': index, 'reason': reason})
            continue
        metadata = doc['metadata']
        namespace = metadata.get('namespace') or _namespace_for(repo, relpath, default_namespace)
        name = str(metadata['name'])
        identifier = node_id(kind, namespace, name)
        depends_on, problems = _depends_on(kind, doc, namespace, relpath, index)
        spec = doc['spec']
        node = {
            'id': identifier, 'kind': kind, 'name': name, 'namespace': namespace, 'doc': doc,
            'explicit_namespace': metadata.get('namespace') or None,
            'api_version': doc.get('apiVersion'), 'file': relpath, 'document': index,
            'depends_on': depends_on, 'problems': problems,
            'wait': bool(spec.get('wait')) if kind == KUSTOMIZATION else None,
            'health_checks': len(spec.get('healthChecks') or []) if kind == KUSTOMIZATION else None,
            'path': spec.get('path') if kind == KUSTOMIZATION else None,
            'source_ref': spec.get('sourceRef') if kind == KUSTOMIZATION else None,
            'target_namespace': spec.get('targetNamespace') if kind == KUSTOMIZATION else None,
        }
        pending.append(node)
    for relpath, index, doc in documents:
        if doc.get('kind') in ('ConfigMap', 'Secret') and doc.get('apiVersion') == 'v1' and isinstance(doc.get('metadata'), dict):
            repo.variable_sources.append((relpath, doc))
    _resolve_nodes(repo, pending, default_namespace)
    for relpath, index, doc in documents:
        record = _object_record(repo, relpath, index, doc, default_namespace)
        if record is not None:
            repo.objects.append(record)
    return repo


# --- what kustomize-controller does to the objects it applies: namespaces, targetNamespace, substitution -----

SUBSTITUTE_DISABLED_KEY = 'kustomize.toolkit.fluxcd.io/substitute'
DISABLED = 'disabled'
_VAR_NAME = re.compile(r'^[_a-zA-Z][_a-zA-Z0-9]*$')
_VAR_REFERENCE = re.compile(r'\$\{([_a-zA-Z][_a-zA-Z0-9]*)(?:(:?[-=])([^}]*))?\}')


def _chain_namespaces(repo, directory, seen, outer):
    """{file: namespace kustomize gives its objects} for the files built from directory (as _files_under), where the
    namespace is the one of the outermost kustomization.yaml of the inclusion chain that sets one (its namespace
    transformer runs last and sets every object's namespace), or None."""
    result = {}
    if directory in seen:
        return result
    seen.add(directory)
    config = repo.configs.get(directory)
    own = config.get('namespace') if config and isinstance(config.get('namespace'), str) and config.get('namespace') else None
    namespace = outer or own
    prefix = '' if directory == '.' else directory + '/'
    if config is None:
        for relpath in _files_under(repo, directory, set()):
            result[relpath] = namespace
        # a sub-directory taken whole through its own kustomization: its chain continues there
        for sub in sorted(d for d in repo.configs if d != directory and d.startswith(prefix)):
            if any(relpath.startswith(sub + '/') for relpath in result):
                result.update(_chain_namespaces(repo, sub, seen, namespace))
        return result
    for entry in list(config.get('resources') or []) + list(config.get('components') or []):
        if not isinstance(entry, str) or '://' in entry or entry.startswith(('github.com/', 'git@')):
            continue
        target = os.path.normpath(os.path.join(directory, entry)).replace(os.sep, '/')
        if target in repo.file_set:
            result[target] = namespace
        elif target == '.' or any(f.startswith(target + '/') for f in repo.files):
            result.update(_chain_namespaces(repo, target, seen, namespace))
    return result


def substitution_variables(repo, kustomization, namespace):
    """(variables, unresolvable refs) of a Kustomization's spec.postBuild, as kustomize-controller loads them (fluxcd/pkg
    kustomize v1.18.0 kustomize/kustomize_varsub.go): substituteFrom ConfigMaps and Secrets of the Kustomization's
    namespace in order (:142-178; Secret data base64-decoded, stringData as written), then spec.postBuild.substitute over
    them (:111-123); newlines removed from values. Only what the tree holds can be read; others are named."""
    post_build = (kustomization.get('spec') or {}).get('postBuild') or {}
    variables, missing = {}, []
    for ref in post_build.get('substituteFrom') or []:
        if not isinstance(ref, dict) or ref.get('kind') not in ('ConfigMap', 'Secret') or not ref.get('name'):
            continue
        found = None
        for relpath, doc in repo.variable_sources:
            meta = doc['metadata']
            if doc['kind'] == ref['kind'] and str(meta.get('name')) == str(ref['name']) \
                    and (meta.get('namespace') or _namespace_for(repo, relpath, namespace)) == namespace:
                found = doc
                break
        if found is None:
            if not ref.get('optional'):
                missing.append('%s/%s' % (ref['kind'], ref['name']))
            continue
        data = dict((str(k), '' if v is None else str(v)) for k, v in (found.get('data') or {}).items())
        if found['kind'] == 'Secret':
            decoded = {}
            for key, value in data.items():
                try:
                    decoded[key] = base64.b64decode(value).decode('utf-8')
                except (ValueError, UnicodeDecodeError):
                    decoded[key] = value
            data = decoded
            data.update((str(k), '' if v is None else str(v)) for k, v in (found.get('stringData') or {}).items())
        variables.update((k, v.replace('\n', '')) for k, v in data.items())
    for key, value in (post_build.get('substitute') or {}).items():
        variables[str(key)] = ('' if value is None else str(value)).replace('\n', '')
    return variables, missing


def substitute_text(text, variables):
    """(text with ${VAR}, ${VAR:=default}, ${VAR:-default}, ${VAR=default}, ${VAR-default} replaced, names left unresolved).

    What envsubst does in kustomize-controller's non-strict mode (kustomize_varsub.go:180-194): a variable not given is
    empty, or its default; nothing is substituted at all when the Kustomization gives no variable (:126). A reference
    that no variable and no default resolves is returned in the second value."""
    if not isinstance(text, str) or '${' not in text or not variables:
        unresolved = _VAR_REFERENCE.findall(text) if isinstance(text, str) else []
        return text, [name for name, operator, _default in unresolved if not operator]
    unresolved = []

    def replace(match):
        name, operator, default = match.group(1), match.group(2), match.group(3)
        value = variables.get(name)
        if operator in (':-', ':='):
            return value if value else default
        if operator in ('-', '='):
            return default if value is None else value
        if value is None:
            unresolved.append(name)
            return ''
        return value
    return _VAR_REFERENCE.sub(replace, text), unresolved


def _substitution_disabled(doc):
    """Labelled or annotated kustomize.toolkit.fluxcd.io/substitute: disabled (kustomize_varsub.go:96-98)."""
    meta = doc.get('metadata') or {}
    return DISABLED in ((meta.get('labels') or {}).get(SUBSTITUTE_DISABLED_KEY), (meta.get('annotations') or {}).get(SUBSTITUTE_DISABLED_KEY))


def _resolve_nodes(repo, pending, default_namespace):
    """Give each Flux object its name, namespace and dependsOn as the Kustomization that applies it makes them: the
    namespace from its targetNamespace, else from the kustomize inclusion chain, else the object's own, else the
    nearest kustomization.yaml's (the directory fallback, for objects no Kustomization of the tree applies); ${VAR}s
    substituted with its postBuild variables. Applied over the tree twice, so that a Kustomization resolved in the
    first pass resolves what it applies in the second."""
    by_file = {}
    for node in pending:
        by_file.setdefault(node['file'], []).append(node)
    applied = {}
    for _round in range(2):
        applied = {}
        for owner in pending:
            if owner['kind'] != KUSTOMIZATION:
                continue
            directory = _kustomization_directory(owner['path'])
            if directory != '.' and directory not in repo.configs and not any(f.startswith(directory + '/') for f in repo.files):
                continue
            target = owner.get('target_namespace')
            variables, _missing = substitution_variables(repo, owner['doc'], owner['namespace'])
            for relpath, chain_ns in sorted(_chain_namespaces(repo, directory, set(), None).items()):
                for node in by_file.get(relpath, ()):
                    if node is not owner and id(node) not in applied:
                        applied[id(node)] = (owner, target or chain_ns, variables)
        for node in pending:
            owner, namespace_rule, variables = applied.get(id(node), (None, None, {}))
            doc = node['doc']
            if _substitution_disabled(doc):
                variables = {}
            name, unresolved = substitute_text(str(doc['metadata']['name']), variables)
            namespace = namespace_rule or node['explicit_namespace'] or _namespace_for(repo, node['file'], default_namespace)
            namespace, more = substitute_text(namespace, variables)
            unresolved += more
            node['name'], node['namespace'] = name, namespace
            node['id'] = node_id(node['kind'], namespace, name)
            node['applied_with'] = owner['id'] if owner is not None and 'id' in owner else None
            depends_on, problems = [], []
            raw = (doc.get('spec') or {}).get('dependsOn') or []
            if not isinstance(raw, list):
                problems.append('%s#%d: spec.dependsOn must be a list' % (node['file'], node['document']))
                raw = []
            for position, entry in enumerate(raw):
                if not isinstance(entry, dict) or not entry.get('name'):
                    problems.append('%s#%d: spec.dependsOn[%d] has no name' % (node['file'], node['document'], position))
                    continue
                dep_name, left = substitute_text(str(entry['name']), variables)
                dep_ns, left_ns = substitute_text(str(entry.get('namespace') or namespace), variables)
                if left or left_ns or '${' in dep_name + dep_ns:
                    # a name Flux resolves with a variable the tree does not hold: not a dangling reference
                    unresolved += left + left_ns
                    continue
                ident = node_id(node['kind'], dep_ns, dep_name)
                if ident not in depends_on:
                    depends_on.append(ident)
            node['depends_on'], node['problems'] = depends_on, problems
            node['unresolved'] = sorted(set(unresolved))
    for node in pending:
        if node['unresolved']:
            repo.unresolved.append({'node': node['id'], 'file': node['file'], 'variables': node['unresolved']})
        if node['id'] in repo.nodes:
            repo.duplicates.append({'id': node['id'], 'file': node['file'], 'first_file': repo.nodes[node['id']]['file']})
            continue
        repo.nodes[node['id']] = node


def _api_group(api_version):
    """The API group of an apiVersion: 'apps/v1' -> 'apps', 'v1' -> '' (core)."""
    text = str(api_version or '')
    return text.rsplit('/', 1)[0] if '/' in text else ''


def _is_object(doc):
    """A real object: apiVersion, kind and metadata.name, and not a strategic-merge patch."""
    metadata = doc.get('metadata')
    spec = doc.get('spec')
    if not isinstance(doc.get('apiVersion'), str) or not doc['apiVersion'] or not isinstance(doc.get('kind'), str) or not doc['kind']:
        return False
    if not isinstance(metadata, dict) or not metadata.get('name'):
        return False
    return '$patch' not in doc and not (isinstance(spec, dict) and '$patch' in spec)


def _object_record(repo, relpath, index, doc, default_namespace):
    """What bootstrap_needs reads of a tree document, or None when it is not an object that gets applied
    (kustomize configs, patch files, partial documents, Flux objects load_repo skipped as partial). Its namespace:
    metadata.namespace, else the nearest kustomization.yaml's, else default_namespace for Flux's Kustomizations and
    HelmReleases (as their nodes) and None (not known) for the others."""
    if _is_kustomize_config(relpath, doc) or relpath in repo.patch_files or not _is_object(doc):
        return None
    kind = _flux_kind(doc)
    if kind is not None and _partial_reason(kind, doc):
        return None
    metadata = doc['metadata']
    spec = doc.get('spec') if isinstance(doc.get('spec'), dict) else {}
    explicit = metadata.get('namespace')
    record = {'file': relpath, 'document': index, 'api_version': doc['apiVersion'], 'group': _api_group(doc['apiVersion']),
              'kind': doc['kind'], 'name': str(metadata['name']),
              'namespace': str(explicit) if explicit else _namespace_for(repo, relpath, default_namespace if kind else None)}
    if kind == HELMRELEASE:
        record['release_name'] = spec.get('releaseName')
        record['target_namespace'] = spec.get('targetNamespace')
        record['storage_namespace'] = spec.get('storageNamespace')
    if doc['kind'] == 'CustomResourceDefinition':
        record['crd'] = _crd_of(doc)
    return record


# --- which objects a Kustomization applies ----------------------------------------------------

def _has_kustomize_file(repo, directory):
    """Does directory hold a file kustomize recognises as its kustomization (whatever it contains)?"""
    prefix = '' if directory == '.' else directory + '/'
    return any(prefix + name in repo.file_set for name in KUSTOMIZE_CONFIG_NAMES)


def _files_under(repo, directory, seen):
    """The YAML files kustomize would build from directory: through its kustomization.yaml, or without one as
    kustomize-controller generates it - every YAML file below, except that a sub-directory holding its own
    kustomization file is taken whole, through that file, and not descended into (fluxcd/pkg kustomize v1.18.0, the
    version kustomize-controller v1.6.1 uses: kustomize/kustomize_generator.go:531-539, scanManifests)."""
    if directory in seen:
        return set()
    seen.add(directory)
    prefix = '' if directory == '.' else directory + '/'
    config = repo.configs.get(directory)
    if config is None:
        found = set()
        taken_whole = set()
        for relpath in sorted(repo.files):
            if not relpath.startswith(prefix):
                continue
            parts = relpath[len(prefix):].split('/')
            below = None
            for depth in range(1, len(parts)):
                candidate = prefix + '/'.join(parts[:depth])
                if candidate in taken_whole or _has_kustomize_file(repo, candidate):
                    below = candidate
                    break
            if below is None:
                found.add(relpath)
            elif below not in taken_whole:
                taken_whole.add(below)
                found |= _files_under(repo, below, seen)
        return found
    found = set()
    for entry in list(config.get('resources') or []) + list(config.get('components') or []):
        if not isinstance(entry, str) or '://' in entry or entry.startswith(('github.com/', 'git@')):
            continue
        target = os.path.normpath(os.path.join(directory, entry)).replace(os.sep, '/')
        if target in repo.files:
            found.add(target)
        elif target == '.' or any(f.startswith(target + '/') for f in repo.files):
            found |= _files_under(repo, target, seen)
    return found


def ownership(repo):
    """(owners, warnings): node id -> ids of the Kustomizations whose spec.path applies it."""
    owners = {}
    warnings = []
    nodes_by_file = {}
    for other in repo.nodes.values():
        nodes_by_file.setdefault(other['file'], []).append(other['id'])
    for node in repo.nodes.values():
        if node['kind'] != KUSTOMIZATION:
            continue
        path = str(node['path'] or '.').strip()
        directory = os.path.normpath(path.lstrip('/')).replace(os.sep, '/') if path not in ('', './', '.') else '.'
        if directory != '.' and directory not in repo.configs and not any(f.startswith(directory + '/') for f in repo.files):
            warnings.append('%s (%s): spec.path %s is not a directory of this repository (another source?)'
                            % (node['id'], node['file'], path))
            continue
        for relpath in _files_under(repo, directory, set()):
            for other in nodes_by_file.get(relpath, ()):
                if other != node['id']:
                    owners.setdefault(other, []).append(node['id'])
    return dict((key, sorted(value)) for key, value in owners.items()), warnings


def _closure(edges, start):
    seen = set()
    frontier = list(edges.get(start, ()))
    while frontier:
        vertex = frontier.pop()
        if vertex in seen:
            continue
        seen.add(vertex)
        frontier.extend(edges.get(vertex, ()))
    seen.discard(start)
    return seen


def _path(edges, start, goal):
    parents = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for vertex in frontier:
            for successor in sorted(edges.get(vertex, ())):
                if successor in parents:
                    continue
                parents[successor] = vertex
                if successor == goal:
                    path = [goal]
                    while parents[path[-1]] is not None:
                        path.append(parents[path[-1]])
                    return list(reversed(path))
                following.append(successor)
        frontier = following
    return None


# --- rules and bootstrap input ---------------------------------------------------------------

def _glob_list(value, field):
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(item, str) and item for item in value):
        raise ValidationError(field, 'must be a non-empty list of name patterns (globs)')
    return list(value)


def check_rules(rules):
    """Validated copies of critical-dependency rules; errors name the rule and the field."""
    if not isinstance(rules, (list, tuple)):
        raise ValidationError('rules', 'must be a list of rules')
    checked = []
    for position, rule in enumerate(rules):
        field = 'rules[%d]' % position
        if not isinstance(rule, dict):
            raise ValidationError(field, 'must be a mapping with subject and requires')
        unknown = sorted(set(rule) - set(('name', 'subject', 'requires', 'exclude', 'reason')))
        if unknown:
            raise ValidationError(field, 'unknown keys %s (allowed: name, subject, requires, exclude, reason)' % ', '.join(unknown))
        subject = _glob_list(rule.get('subject'), field + '.subject')
        requires = _glob_list(rule.get('requires'), field + '.requires')
        exclude = _glob_list(rule['exclude'], field + '.exclude') if rule.get('exclude') else []
        name = rule.get('name') or '%s needs %s' % ('/'.join(subject), '/'.join(requires))
        checked.append({'name': str(name), 'subject': subject, 'requires': requires, 'exclude': exclude,
                        'reason': str(rule.get('reason') or '')})
    return checked


def _matches(name, patterns):
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _parse_need(text, default_namespace):
    parts = str(text).strip().split('/')
    if len(parts) == 1:
        return default_namespace, parts[0]
    return parts[-2], parts[-1]


def check_bootstrap(releases):
    """Validated bootstrap releases: [{name, namespace, needs: [(namespace, name)]}]."""
    if releases is None:
        return []
    if not isinstance(releases, (list, tuple)):
        raise ValidationError('bootstrap_releases', 'must be a list of releases (name, namespace, needs)')
    checked = []
    for position, release in enumerate(releases):
        field = 'bootstrap_releases[%d]' % position
        if not isinstance(release, dict) or not release.get('name'):
            raise ValidationError(field, 'must be a mapping with at least a name')
        namespace = str(release.get('namespace') or 'default')
        needs = release.get('needs') or []
        if not isinstance(needs, (list, tuple)) or not all(isinstance(need, str) and need for need in needs):
            raise ValidationError(field + '.needs', 'must be a list of "namespace/name" strings')
        checked.append({'name': str(release['name']), 'namespace': namespace,
                        'needs': [_parse_need(need, namespace) for need in needs]})
    return checked


def releases_from_file(path):
    """Bootstrap releases from a file: a YAML list of releases, or a helmfile (every document's `releases`)."""
    if not HAS_YAML:
        raise ValidationError('bootstrap_helmfile', 'the Python library PyYAML is required')
    try:
        documents = _load_documents(path)
    except (OSError, IOError) as exc:
        raise ValidationError('bootstrap_helmfile', 'cannot read %s: %s' % (path, exc)) from None
    except yaml.YAMLError as exc:
        raise ValidationError('bootstrap_helmfile', '%s is not plain YAML (render it with `helmfile build` first?): %s'
                              % (path, _yaml_error(exc))) from None
    documents = [doc for doc in documents if doc is not None]
    if len(documents) == 1 and isinstance(documents[0], list):
        return documents[0]
    releases = []
    for doc in documents:
        if isinstance(doc, dict) and isinstance(doc.get('releases'), list):
            for release in doc['releases']:
                if isinstance(release, dict):
                    releases.append(dict((k, release.get(k)) for k in ('name', 'namespace', 'needs') if release.get(k) is not None))
    return releases


# --- the analysis ----------------------------------------------------------------------------

def _effective_edges(repo, owners, resolved):
    """x -> y when y is ready before x: dependsOn, the dependsOn of x's Kustomization, and a
    Kustomization after what it applies (it is Ready only once those are applied)."""
    edges = dict((identifier, set(deps)) for identifier, deps in resolved.items())
    for identifier, owner_ids in owners.items():
        for owner in owner_ids:
            edges[identifier] |= set(resolved.get(owner, ()))
            edges.setdefault(owner, set()).add(identifier)
    return edges


def _rule_subjects(repo, rule):
    """The nodes a rule is about (in id order): they match its subject, and neither its requires nor its exclude."""
    return [node for node in sorted(repo.nodes.values(), key=lambda n: n['id'])
            if _matches(node['name'], rule['subject']) and not _matches(node['name'], rule['requires'])
            and not _matches(node['name'], rule['exclude'])]


def _repo_edges(repo):
    """The effective order of a loaded repository (dependsOn within it, plus the owning Kustomization's)."""
    resolved = dict((identifier, [ref for ref in node['depends_on'] if ref in repo.nodes]) for identifier, node in repo.nodes.items())
    owners, _ownership_warnings = ownership(repo)
    return _effective_edges(repo, owners, resolved)


def _rule_findings(repo, rules, edges, bootstrap):
    missing = []
    not_found = []
    bootstrap_names = set(release['name'] for release in bootstrap)
    for rule in rules:
        providers = [node for node in repo.nodes.values() if _matches(node['name'], rule['requires'])]
        from_bootstrap = sorted(name for name in bootstrap_names if _matches(name, rule['requires']))
        subjects = _rule_subjects(repo, rule)
        if not subjects:
            continue
        if from_bootstrap:
            continue
        if not providers:
            not_found.append({'rule': rule['name'], 'requires': rule['requires'],
                              'subjects': [node['id'] for node in subjects],
                              'message': '%s: nothing named %s in the repository or the bootstrap releases (installed some other way?)'
                                         % (rule['name'], ' or '.join(rule['requires']))})
            continue
        provider_ids = set(node['id'] for node in providers)
        for node in subjects:
            before = _closure(edges, node['id'])
            if before & provider_ids:
                continue
            missing.append({'rule': rule['name'], 'node': node['id'], 'file': node['file'],
                            'requires': sorted(provider_ids),
                            'message': '%s (%s) is not ordered after %s: %s%s' % (
                                node['id'], node['file'], ' or '.join(sorted(provider_ids)), rule['name'],
                                ' (%s)' % rule['reason'] if rule['reason'] else '')})
    return missing, not_found


def _flux_nodes_for(repo, namespace, name):
    exact = repo.nodes.get(node_id(HELMRELEASE, namespace, name))
    if exact:
        return [exact['id']]
    return sorted(node['id'] for node in repo.nodes.values() if node['name'] == name)


def _bootstrap_findings(repo, bootstrap, edges):
    findings = []
    known = set((release['namespace'], release['name']) for release in bootstrap)
    for release in bootstrap:
        label = '%s/%s' % (release['namespace'], release['name'])
        for need_namespace, need_name in release['needs']:
            need = '%s/%s' % (need_namespace, need_name)
            if (need_namespace, need_name) not in known:
                findings.append({'type': 'unknown_need', 'release': label, 'needs': need,
                                 'message': 'bootstrap release %s needs %s, which is not a bootstrap release' % (label, need)})
                continue
            dependants = _flux_nodes_for(repo, release['namespace'], release['name'])
            dependencies = _flux_nodes_for(repo, need_namespace, need_name)
            if not dependants or not dependencies:
                continue
            reversed_path = None
            for dependency in dependencies:
                for dependant in dependants:
                    reversed_path = reversed_path or _path(edges, dependency, dependant)
            if reversed_path:
                findings.append({'type': 'reversed', 'release': label, 'needs': need, 'path': reversed_path,
                                 'message': 'bootstrap installs %s before %s (%s needs %s), but in Flux %s depends on %s: %s'
                                            % (need, label, label, need, reversed_path[0], reversed_path[-1], ' -> '.join(reversed_path))})
            elif not any(_path(edges, dependant, dependency) for dependant in dependants for dependency in dependencies):
                findings.append({'type': 'order_not_kept', 'release': label, 'needs': need,
                                 'message': 'bootstrap installs %s before %s, but Flux does not order %s after %s '
                                            '(add a dependsOn to keep the order on re-installs)'
                                            % (need, label, ' / '.join(dependants), ' / '.join(dependencies))})
    return findings


def counts_of(repo):
    counts = {}
    for kind in (KUSTOMIZATION, HELMRELEASE):
        nodes = [node for node in repo.nodes.values() if node['kind'] == kind]
        counts[kind] = {
            'total': len(nodes),
            'with_depends_on': sum(1 for node in nodes if node['depends_on']),
            'wait_true': sum(1 for node in nodes if node['wait']) if kind == KUSTOMIZATION else None,
            'with_health_checks': sum(1 for node in nodes if node['health_checks']) if kind == KUSTOMIZATION else None,
        }
    return counts


def summary_table(counts):
    lines = ['| kind | total | with dependsOn | wait: true | healthChecks |', '|---|---|---|---|---|']
    for kind in (KUSTOMIZATION, HELMRELEASE):
        row = counts[kind]
        cells = [row['total'], row['with_depends_on'], row['wait_true'], row['with_health_checks']]
        lines.append('| %s | %s |' % (kind, ' | '.join('-' if cell is None else str(cell) for cell in cells)))
    return '\n'.join(lines)


def _mermaid_label(text):
    return text.replace('"', '#quot;')


def mermaid(repo, resolved, dangling, tiers, cycle_members, owners):
    """A Mermaid flowchart in apply order: dependency --> dependant; missing targets dashed;
    a dotted "applies" link from a Kustomization to each HelmRelease in its path."""
    lines = ['flowchart LR']
    ids = {}
    for position, identifier in enumerate(sorted(repo.nodes)):
        ids[identifier] = 'n%d' % position
        node = repo.nodes[identifier]
        tier = tiers.get(identifier)
        tier_text = 'tier %d' % tier if tier is not None else 'no tier'
        label = '%s %s/%s<br/>%s' % ('ks' if node['kind'] == KUSTOMIZATION else 'hr', node['namespace'], node['name'], tier_text)
        shape = '["%s"]' if node['kind'] == KUSTOMIZATION else '("%s")'
        lines.append('  %s%s%s' % (ids[identifier], shape % _mermaid_label(label), ':::cycle' if identifier in cycle_members else ''))
    missing_ids = {}
    for finding in dangling:
        if finding['ref'] not in missing_ids:
            missing_ids[finding['ref']] = 'm%d' % len(missing_ids)
            lines.append('  %s["missing: %s"]:::missing' % (missing_ids[finding['ref']], _mermaid_label(finding['ref'])))
    for identifier in sorted(resolved):
        for dependency in sorted(resolved[identifier]):
            lines.append('  %s --> %s' % (ids[dependency], ids[identifier]))
    for finding in dangling:
        lines.append('  %s -.-> %s' % (missing_ids[finding['ref']], ids[finding['node']]))
    for identifier in sorted(owners):
        if repo.nodes[identifier]['kind'] == HELMRELEASE:
            for owner in owners[identifier]:
                lines.append('  %s -. applies .-> %s' % (ids[owner], ids[identifier]))
    lines.append('  classDef missing stroke-dasharray: 5 5,stroke:#c00,color:#c00')
    lines.append('  classDef cycle stroke:#c00,stroke-width:3px')
    return '\n'.join(lines) + '\n'


def analyze(repo, rules=DEFAULT_RULES, bootstrap_releases=None, fail_on=DEFAULT_FAIL_ON, bootstrap_rendered=None,
            bootstrap_source=None, tree_objects=None):
    """The report (a dict of plain data) for a loaded repository. With bootstrap_rendered (see
    check_bootstrap_rendered), also `tree_needs_bootstrap` (see bootstrap_needs, which also takes bootstrap_source
    and tree_objects); without it the key is absent."""
    rules = check_rules(rules)
    bootstrap = check_bootstrap(bootstrap_releases)
    rendered = None if bootstrap_rendered is None else check_bootstrap_rendered(bootstrap_rendered)
    check_bootstrap_source(bootstrap_source)     # bad input fails even without bootstrap_rendered
    check_tree_objects(tree_objects)
    unknown = sorted(set(fail_on) - set(FINDINGS))
    if unknown:
        raise ValidationError('fail_on', 'unknown findings %s (choose from %s)' % (', '.join(unknown), ', '.join(FINDINGS)))

    resolved = {}
    dangling = []
    for identifier, node in sorted(repo.nodes.items()):
        resolved[identifier] = []
        for ref in node['depends_on']:
            if ref in repo.nodes:
                resolved[identifier].append(ref)
                continue
            kind, namespace, name = ref.split('/', 2)
            hints = [other['id'] for other in repo.nodes.values() if other['name'] == name and other['id'] != identifier]
            hint = ''
            if hints:
                hint = ' (found %s; %s dependsOn names only %ss, in the dependant\'s namespace unless one is given)' % (
                    ', '.join(sorted(hints)), kind, kind)
            dangling.append({'node': identifier, 'file': node['file'], 'ref': ref,
                             'message': '%s (%s) depends on %s, which is not in the repository%s' % (identifier, node['file'], ref, hint)})

    cycles = []
    cycle_members = set()
    ordered = _graph.sorted_graph(resolved)
    for component in _graph.cyclic_components(ordered):
        path = _graph.cycle_through(ordered, component)
        cycle_members.update(component)
        cycles.append({'members': component, 'path': path,
                       'message': 'dependsOn cycle: %s (Flux waits forever: each one is DependencyNotReady)' % ' -> '.join(path)})

    tiers = _graph.levels(ordered)
    tier_list, untiered = _graph.tiers(ordered)

    owners, ownership_warnings = ownership(repo)
    edges = _effective_edges(repo, owners, resolved)
    missing, not_found = _rule_findings(repo, rules, edges, bootstrap)
    bootstrap_findings = _bootstrap_findings(repo, bootstrap, edges)
    contradictions = [finding for finding in bootstrap_findings if finding['type'] == 'reversed']
    counts = counts_of(repo)

    warnings = []
    warnings.extend('%s: cannot be parsed as YAML, skipped: %s' % (item['file'], item['error']) for item in repo.parse_errors)
    warnings.extend('%s is defined again in %s (first in %s); the first is used'
                    % (item['id'], item['file'], item['first_file']) for item in repo.duplicates)
    for node in repo.nodes.values():
        warnings.extend(node['problems'])
    warnings.extend('%s (%s): ${%s} is substituted by Flux from variables this tree does not hold (a dependsOn using it is '
                    'not checked)' % (item['node'], item['file'], '}, ${'.join(item['variables'])) for item in repo.unresolved)
    warnings.extend(ownership_warnings)
    warnings.extend(item['message'] for item in not_found)
    warnings.extend(item['message'] for item in bootstrap_findings if item['type'] != 'reversed')

    findings = {'cycles': cycles, 'dangling': dangling, 'missing_critical': missing, 'bootstrap_contradictions': contradictions}
    errors = []
    for finding in FINDINGS:
        if finding in fail_on:
            errors.extend(item['message'] for item in findings[finding])
        else:
            warnings.extend(item['message'] for item in findings[finding])

    nodes = []
    for identifier in sorted(repo.nodes):
        node = repo.nodes[identifier]
        nodes.append({'id': identifier, 'kind': node['kind'], 'name': node['name'], 'namespace': node['namespace'],
                      'file': node['file'], 'depends_on': node['depends_on'], 'tier': tiers.get(identifier),
                      'applied_by': owners.get(identifier, []), 'wait': node['wait'], 'health_checks': node['health_checks']})
    report = {
        'root': repo.root,
        'files_scanned': len(repo.files),
        'nodes': nodes,
        'tiers': tier_list,
        'untiered': untiered,
        'cycles': cycles,
        'dangling': dangling,
        'missing_critical': missing,
        'components_not_found': not_found,
        'bootstrap_findings': bootstrap_findings,
        'bootstrap_contradictions': contradictions,
        'counts': counts,
        'summary_table': summary_table(counts),
        'skipped': repo.skipped,
        'parse_errors': repo.parse_errors,
        'duplicates': repo.duplicates,
        'mermaid': mermaid(repo, resolved, dangling, tiers, cycle_members, owners),
        'warnings': warnings,
        'errors': errors,
        'failed': bool(errors),
    }
    if rendered is not None:
        # An ordering choice, not a defect: never in warnings, errors or fail_on.
        report['tree_needs_bootstrap'] = bootstrap_needs(repo, rendered, rules, bootstrap, bootstrap_source, tree_objects, edges)
    return report


def analyze_path(path, rules=DEFAULT_RULES, bootstrap_releases=None, fail_on=DEFAULT_FAIL_ON, exclude=(),
                 default_namespace=DEFAULT_NAMESPACE, bootstrap_rendered=None, bootstrap_source=None, tree_objects=None):
    """load_repo + analyze."""
    return analyze(load_repo(path, exclude, default_namespace), rules, bootstrap_releases, fail_on, bootstrap_rendered,
                   bootstrap_source, tree_objects)


# --- does the tree need the bootstrap releases? ----------------------------------------------

NEEDS_REASONS = ('uses_crd', 'uses_api_service', 'same_object', 'takes_over_release', 'unreadable_helmrelease',
                 'unreadable_source', 'webhook', 'critical_rule', 'cluster_infrastructure', 'unknown_api')
FLUX_TOOLKIT_SUFFIX = 'toolkit.fluxcd.io'
FLUX_OPERATOR_GROUP = 'fluxcd.controlplane.io'
WEBHOOK_KINDS = ('ValidatingWebhookConfiguration', 'MutatingWebhookConfiguration')
ADMISSION_GROUP = 'admissionregistration.k8s.io'
ADMISSION_POLICY_KINDS = ('ValidatingAdmissionPolicy', 'ValidatingAdmissionPolicyBinding', 'MutatingAdmissionPolicy',
                          'MutatingAdmissionPolicyBinding')
WEBHOOK_RESOURCES = ('validatingwebhookconfigurations', 'mutatingwebhookconfigurations')
WRITE_VERBS = ('create', 'update', 'patch', '*')
WORKLOAD_KINDS = ('Deployment', 'DaemonSet', 'StatefulSet')
# The API groups every Kubernetes API server serves (kubernetes.io/docs/reference/kubernetes-api/group-versions/);
# '' is the core group. An object of any other group needs a CRD or an APIService from somewhere.
BUILTIN_API_GROUPS = frozenset((
    '', 'admissionregistration.k8s.io', 'apiextensions.k8s.io', 'apiregistration.k8s.io', 'apps', 'authentication.k8s.io',
    'authorization.k8s.io', 'autoscaling', 'batch', 'certificates.k8s.io', 'coordination.k8s.io', 'discovery.k8s.io',
    'events.k8s.io', 'flowcontrol.apiserver.k8s.io', 'internal.apiserver.k8s.io', 'networking.k8s.io', 'node.k8s.io',
    'policy', 'rbac.authorization.k8s.io', 'resource.k8s.io', 'scheduling.k8s.io', 'storage.k8s.io',
    'storagemigration.k8s.io',
))
# Built-in kinds without a namespace. A kind a CRD defines gets its scope from that CRD's spec.scope;
# any other kind is taken as namespaced.
CLUSTER_SCOPED_KINDS = frozenset((
    'Namespace', 'Node', 'PersistentVolume', 'ClusterRole', 'ClusterRoleBinding', 'CustomResourceDefinition',
    'APIService', 'ValidatingWebhookConfiguration', 'MutatingWebhookConfiguration', 'ValidatingAdmissionPolicy',
    'ValidatingAdmissionPolicyBinding', 'MutatingAdmissionPolicy', 'MutatingAdmissionPolicyBinding', 'StorageClass',
    'CSIDriver', 'CSINode', 'VolumeAttachment', 'PriorityClass', 'RuntimeClass', 'IngressClass',
    'CertificateSigningRequest', 'FlowSchema', 'PriorityLevelConfiguration', 'VolumeAttributesClass',
    'DeviceClass', 'ResourceSlice', 'IPAddress', 'ServiceCIDR',
))


def _crd_of(doc):
    """(group, kind, scope) of a CustomResourceDefinition document (missing parts are '')."""
    spec = doc.get('spec') if isinstance(doc.get('spec'), dict) else {}
    names = spec.get('names') if isinstance(spec.get('names'), dict) else {}
    return {'group': str(spec.get('group') or ''), 'kind': str(names.get('kind') or ''), 'scope': str(spec.get('scope') or '')}


def _split_release_id(key):
    parts = key.split('/') if isinstance(key, str) else []
    if len(parts) != 2 or not parts[0] or not parts[1]:
        return None
    return parts[0], parts[1]


def check_bootstrap_rendered(rendered):
    """Validated bootstrap_rendered (the fact bootstrap_apps_rendered of roles/bootstrap_apps/tasks/render.yml):
    {"<namespace>/<name>": {"crds": [mapping, ...], "objects": [mapping, ...]}}. Returns
    [{'id', 'namespace', 'name', 'documents': [(list name, position, document)]}] sorted by id."""
    field = 'bootstrap_rendered'
    if not isinstance(rendered, dict):
        raise ValidationError(field, 'must be a mapping of "namespace/name" to {crds: [...], objects: [...]}, got %s'
                              % type(rendered).__name__)
    releases = []
    for key in sorted(rendered, key=str):
        label = '%s[%s]' % (field, json.dumps(key) if isinstance(key, str) else repr(key))
        identity = _split_release_id(key)
        if identity is None:
            raise ValidationError(label, 'the key must be a release as "namespace/name"')
        value = rendered[key]
        if not isinstance(value, dict):
            raise ValidationError(label, 'must be a mapping with lists crds and objects, got %s' % type(value).__name__)
        documents = []
        for part in ('crds', 'objects'):
            items = value.get(part)
            if not isinstance(items, list):
                raise ValidationError('%s.%s' % (label, part), 'must be a list of documents (mappings), got %s'
                                      % ('nothing' if items is None else type(items).__name__))
            for position, item in enumerate(items):
                if not isinstance(item, dict):
                    raise ValidationError('%s.%s[%d]' % (label, part, position), 'must be a document (a mapping), got %s'
                                          % type(item).__name__)
                documents.append((part, position, item))
        releases.append({'id': key, 'namespace': identity[0], 'name': identity[1], 'documents': documents})
    return releases


def check_bootstrap_source(source):
    """(namespace, name) of the GitRepository Flux syncs from, from "namespace/name"; None when not given."""
    if source is None:
        return None
    identity = _split_release_id(source)
    if identity is None:
        raise ValidationError('bootstrap_source', 'must be the GitRepository Flux syncs from as "namespace/name", got %s'
                              % (json.dumps(source) if isinstance(source, str) else 'a %s' % type(source).__name__))
    return identity


def check_tree_objects(objects):
    """Validated tree_objects - objects the run adds to the tree before Flux fetches it - as object records (see
    _object_record; `file` is the given file or None). Each needs apiVersion, kind and metadata.name (strings);
    metadata.namespace and file are optional strings; other keys are read only for a CustomResourceDefinition."""
    if objects is None:
        return []
    if not isinstance(objects, (list, tuple)):
        raise ValidationError('tree_objects', 'must be a list of objects (apiVersion, kind, metadata {name, namespace}, file), got %s'
                              % type(objects).__name__)
    records = []
    for position, item in enumerate(objects):
        field = 'tree_objects[%d]' % position
        if not isinstance(item, dict):
            raise ValidationError(field, 'must be a mapping with apiVersion, kind and metadata, got %s' % type(item).__name__)
        for key in ('apiVersion', 'kind'):
            if not isinstance(item.get(key), str) or not item[key].strip():
                raise ValidationError('%s.%s' % (field, key), 'must be a non-empty string')
        metadata = item.get('metadata')
        if not isinstance(metadata, dict):
            raise ValidationError(field + '.metadata', 'must be a mapping with name (and namespace when namespaced)')
        if not isinstance(metadata.get('name'), str) or not metadata['name'].strip():
            raise ValidationError(field + '.metadata.name', 'must be a non-empty string')
        namespace = metadata.get('namespace')
        if namespace is not None and not isinstance(namespace, str):
            raise ValidationError(field + '.metadata.namespace', 'must be a string when given')
        relpath = item.get('file')
        if relpath is not None and (not isinstance(relpath, str) or not relpath.strip()):
            raise ValidationError(field + '.file', 'must be a non-empty repository-relative path when given')
        record = {'file': relpath, 'document': None, 'api_version': item['apiVersion'], 'group': _api_group(item['apiVersion']),
                  'kind': item['kind'], 'name': metadata['name'], 'namespace': namespace or None, 'added': True}
        if item['kind'] == 'CustomResourceDefinition':
            record['crd'] = _crd_of(item)
        records.append(record)
    return records


def _object_label(kind, namespace, name):
    return '%s %s/%s' % (kind, namespace, name) if namespace else '%s %s' % (kind, name)


def _is_flux_group(group):
    return group == FLUX_TOOLKIT_SUFFIX or group.endswith('.' + FLUX_TOOLKIT_SUFFIX)


def _cluster_scoped(group, kind, crd_scopes):
    scope = crd_scopes.get((group, kind))
    if scope:
        return scope == 'Cluster'
    return kind in CLUSTER_SCOPED_KINDS


def _release_view(release):
    """What a release brings: CRD groups, APIService groups, objects (kind, name, namespace or None), webhooks."""
    view = {'crd_groups': set(), 'crds': [], 'api_services': [], 'objects': [], 'webhooks': []}
    for _part, _position, doc in release['documents']:
        if not _is_object(doc):
            continue
        kind = doc['kind']
        metadata = doc['metadata']
        entry = {'group': _api_group(doc['apiVersion']), 'kind': kind, 'name': str(metadata['name']),
                 'namespace': str(metadata.get('namespace') or release['namespace']), 'doc': doc}
        if kind == 'CustomResourceDefinition':   # from crds, or among the objects (a chart's templates/)
            entry['crd'] = _crd_of(doc)
            if entry['crd']['group']:
                view['crd_groups'].add(entry['crd']['group'])
            view['crds'].append(entry)
        if kind == 'APIService' and entry['group'] == 'apiregistration.k8s.io':
            spec = doc.get('spec') if isinstance(doc.get('spec'), dict) else {}
            if spec.get('group') is not None:
                view['api_services'].append(dict(entry, served_group=str(spec['group'])))
        if kind in WEBHOOK_KINDS:
            view['webhooks'].append(entry)
        view['objects'].append(entry)
    return view


def _webhook_groups(doc):
    """The apiGroups of every rule of every webhook in a webhook configuration ('' for a rule without any)."""
    groups = set()
    for webhook in doc.get('webhooks') or []:
        if not isinstance(webhook, dict):
            continue
        for rule in webhook.get('rules') or []:
            if not isinstance(rule, dict):
                continue
            api_groups = rule.get('apiGroups')
            if not isinstance(api_groups, list) or not api_groups:
                groups.add('')
                continue
            groups.update(str(group) for group in api_groups)
    return groups


def _target_namespaces(repo):
    """file -> spec.targetNamespace of the Flux Kustomizations whose spec.path applies it."""
    targets = {}
    for node_key in sorted(repo.nodes):
        node = repo.nodes[node_key]
        if node['kind'] != KUSTOMIZATION or not node.get('target_namespace'):
            continue
        directory = _kustomization_directory(node['path'])
        for relpath in _files_under(repo, directory, set()):
            targets.setdefault(relpath, set()).add(node['target_namespace'])
    return targets


def _kustomization_directory(path):
    path = str(path or '.').strip()
    if path in ('', './', '.', '/'):
        return '.'
    return os.path.normpath(path.lstrip('/')).replace(os.sep, '/')


def _helm_release_identity(record):
    """(Helm release name, namespaces): spec.releaseName, else [targetNamespace-]name as Flux composes it; the
    namespaces are where Flux keeps the Helm release (spec.storageNamespace, else the HelmRelease's namespace) and
    where it installs (spec.targetNamespace) - a bootstrap release in either is taken over or collides."""
    target = record.get('target_namespace')
    name = record.get('release_name') or ('%s-%s' % (target, record['name']) if target else record['name'])
    namespaces = set()
    namespaces.add(record.get('storage_namespace') or record['namespace'])
    if target:
        namespaces.add(target)
    namespaces.discard(None)
    return str(name), sorted(str(namespace) for namespace in namespaces)


def _unreadable_sources(repo, source=None):
    """What the tree applies that cannot be read in this checkout; source: (namespace, name) of the GitRepository
    Flux syncs from, when known - a Kustomization of another GitRepository applies another checkout."""
    findings = []
    for item in repo.parse_errors:
        findings.append({'release': None, 'object': None, 'file': item['file'], 'reason': 'unreadable_source',
                         'message': '%s cannot be parsed as YAML (%s), so what it applies cannot be read ahead: it may need the '
                                    'bootstrap releases' % (item['file'], item['error'])})
    for directory in sorted(repo.configs):
        config = repo.configs[directory]
        remote = [entry for entry in list(config.get('resources') or []) + list(config.get('components') or [])
                  if isinstance(entry, str) and ('://' in entry or entry.startswith(('github.com/', 'git@')))]
        relpath = next((f for f in repo.files if os.path.dirname(f) == ('' if directory == '.' else directory)
                        and os.path.basename(f) in KUSTOMIZE_CONFIG_NAMES), directory)
        if remote:
            findings.append({'release': None, 'object': None, 'file': relpath, 'reason': 'unreadable_source',
                             'message': '%s includes remote resources (%s), which cannot be read ahead: they may need the '
                                        'bootstrap releases' % (relpath, ', '.join(str(entry) for entry in remote))})
        if config.get('helmCharts'):
            findings.append({'release': None, 'object': None, 'file': relpath, 'reason': 'unreadable_source',
                             'message': '%s inflates Helm charts (helmCharts), whose objects cannot be read ahead: they may '
                                        'need the bootstrap releases' % relpath})
    for node_key in sorted(repo.nodes):
        node = repo.nodes[node_key]
        if node['kind'] != KUSTOMIZATION:
            continue
        label = _object_label(KUSTOMIZATION, node['namespace'], node['name'])
        source_ref = node['source_ref'] if isinstance(node['source_ref'], dict) else {}
        source_kind = source_ref.get('kind')
        if source_kind != 'GitRepository':
            findings.append({'release': None, 'object': label, 'file': node['file'], 'reason': 'unreadable_source',
                             'message': '%s (%s) applies from %s %s, not from this Git repository, so what it applies cannot '
                                        'be read ahead: it may need the bootstrap releases'
                                        % (label, node['file'], source_kind or 'a source of no kind', source_ref.get('name') or '')})
            continue
        reference = (str(source_ref.get('namespace') or node['namespace']), str(source_ref.get('name') or ''))
        if source is not None and reference != tuple(source):
            findings.append({'release': None, 'object': label, 'file': node['file'], 'reason': 'unreadable_source',
                             'message': '%s (%s) applies from GitRepository %s/%s, not from %s/%s that Flux syncs (bootstrap_source), '
                                        'so its objects are not in this checkout and cannot be read ahead: it may need the '
                                        'bootstrap releases' % ((label, node['file']) + reference + tuple(source))})
            continue
        directory = _kustomization_directory(node['path'])
        on_disk = os.path.isdir(os.path.join(repo.root, directory))
        if not on_disk or (directory != '.' and _excluded(directory, repo.exclude)):
            findings.append({'release': None, 'object': label, 'file': node['file'], 'reason': 'unreadable_source',
                             'message': '%s (%s) applies spec.path %s, which is %s, so what it applies cannot be read ahead: '
                                        'it may need the bootstrap releases'
                                        % (label, node['file'], node['path'],
                                           'not a directory of this repository' if not on_disk else 'left out by exclude')})
    return findings


def _where(label, record):
    """'Kind ns/name (file)' for a tree object; objects the run adds may have no file."""
    return '%s (%s)' % (label, record['file'] if record.get('file') else 'added to the tree by the run')


def _tree_records(repo, tree_objects):
    """The tree's objects and the run's additions (an addition already in the tree - a re-run - is left out)."""
    records = list(repo.objects)
    seen = set((r['group'], r['kind'], r['namespace'], r['name']) for r in records)
    for record in check_tree_objects(tree_objects):
        key = (record['group'], record['kind'], record['namespace'], record['name'])
        if key not in seen:
            seen.add(key)
            records.append(record)
    return records


def _release_names(releases, bootstrap):
    """[(release id, release name)] of the rendered releases and of bootstrap_releases / the helmfile."""
    names = dict((release['id'], release['name']) for release in releases)
    for release in bootstrap or ():
        names.setdefault('%s/%s' % (release.get('namespace') or 'default', release['name']), str(release['name']))
    return sorted(names.items())


def _critical_rule_needs(repo, rules, release_names, edges):
    """A rule's subject in the tree that comes after no tree node matching the rule's requires, while a bootstrap
    release matches it: only that release satisfies the rule, so the subject needs it installed first."""
    findings = []
    for rule in rules:
        from_bootstrap = [release_id for release_id, name in release_names if _matches(name, rule['requires'])]
        if not from_bootstrap:
            continue
        providers = set(node['id'] for node in repo.nodes.values() if _matches(node['name'], rule['requires']))
        for node in _rule_subjects(repo, rule):
            if _closure(edges, node['id']) & providers:
                continue
            label = _object_label(node['kind'], node['namespace'], node['name'])
            findings.append({'release': from_bootstrap[0], 'object': label, 'file': node['file'], 'reason': 'critical_rule',
                             'message': '%s (%s) is a subject of rule "%s"%s and comes after nothing in the tree named %s: '
                                        'only bootstrap release %s provides it, so it must come after that release'
                                        % (label, node['file'], rule['name'], ' (%s)' % rule['reason'] if rule['reason'] else '',
                                           ' or '.join(rule['requires']), ' or '.join(from_bootstrap))})
    return findings


def _pod_spec(doc):
    spec = doc.get('spec') if isinstance(doc.get('spec'), dict) else {}
    template = spec.get('template') if isinstance(spec.get('template'), dict) else {}
    return template.get('spec') if isinstance(template.get('spec'), dict) else {}


def _uses_host_ports(pod_spec):
    for key in ('containers', 'initContainers'):
        for container in pod_spec.get(key) or []:
            if isinstance(container, dict) and any(isinstance(port, dict) and port.get('hostPort')
                                                   for port in container.get('ports') or []):
                return True
    return False


def _infrastructure_role(entry):
    """Why a release's object may be what Flux's own controllers need (DNS, networking, image pulls), or None."""
    if entry['group'] == 'apps' and entry['kind'] in WORKLOAD_KINDS and entry['namespace'] == 'kube-system':
        return 'a workload in kube-system'
    if entry['group'] == '' and entry['kind'] == 'Service' and entry['name'] == 'kube-dns':
        return 'the cluster DNS Service'
    if entry['group'] == 'apps' and entry['kind'] == 'DaemonSet':
        pod_spec = _pod_spec(entry['doc'])
        if pod_spec.get('hostNetwork') is True:
            return 'a DaemonSet on the host network (a CNI, a registry mirror?)'
        if _uses_host_ports(pod_spec):
            return 'a DaemonSet with host ports (a CNI, a registry mirror?)'
    return None


def _writes_webhook_configurations(rule):
    """An RBAC rule that lets its holder create, update or patch webhook configurations."""
    if not isinstance(rule, dict):
        return False
    groups = [str(group) for group in rule.get('apiGroups') or []]
    resources = [str(resource) for resource in rule.get('resources') or []]
    verbs = [str(verb) for verb in rule.get('verbs') or []]
    return (any(group in (ADMISSION_GROUP, '*') for group in groups)
            and any(resource in WEBHOOK_RESOURCES + ('*',) for resource in resources)
            and any(verb in WRITE_VERBS for verb in verbs))


def _webhook_needs(release, view):
    """A release's admission webhooks reaching beyond its own CRD groups, its admission policies, and the roles that
    let it register or patch webhooks at run time - any object in the tree may go through them."""
    findings = []
    own = view['crd_groups']
    hooks = [entry for entry in view['webhooks']
             if any(group in ('*', '') or group not in own for group in _webhook_groups(entry['doc']))]
    if hooks:
        first = hooks[0]
        groups = sorted(set().union(*[_webhook_groups(entry['doc']) for entry in hooks]) - own)
        findings.append({'release': release['id'], 'object': _object_label(first['kind'], None, first['name']), 'file': None,
                         'reason': 'webhook',
                         'message': 'bootstrap release %s installs %s, an admission webhook for API groups %s beyond its own '
                                    'CRDs: any object in the tree may go through it, so the tree must come after that release'
                                    % (release['id'], ', '.join(_object_label(e['kind'], None, e['name']) for e in hooks),
                                       ', '.join('"%s" (core)' % g if g == '' else g for g in groups))})
    policies = [entry for entry in view['objects'] if entry['group'] == ADMISSION_GROUP and entry['kind'] in ADMISSION_POLICY_KINDS]
    if policies:
        findings.append({'release': release['id'], 'object': _object_label(policies[0]['kind'], None, policies[0]['name']),
                         'file': None, 'reason': 'webhook',
                         'message': 'bootstrap release %s installs %s, admission policy: any object in the tree may be checked '
                                    'or changed by it, so the tree must come after that release'
                                    % (release['id'], ', '.join(_object_label(e['kind'], None, e['name']) for e in policies))})
    roles = [entry for entry in view['objects']
             if entry['group'] == 'rbac.authorization.k8s.io' and entry['kind'] in ('ClusterRole', 'Role')
             and any(_writes_webhook_configurations(rule) for rule in entry['doc'].get('rules') or [])]
    if roles:
        labels = [_object_label(e['kind'], None if e['kind'] == 'ClusterRole' else e['namespace'], e['name']) for e in roles]
        findings.append({'release': release['id'], 'object': labels[0], 'file': None, 'reason': 'webhook',
                         'message': 'bootstrap release %s installs %s, which may create, update or patch admission webhook '
                                    'configurations: it registers webhooks at run time that any object in the tree may go '
                                    'through, so the tree must come after that release' % (release['id'], ', '.join(labels))})
    return findings


def bootstrap_needs(repo, releases, rules=(), bootstrap=None, bootstrap_source=None, tree_objects=None, edges=None):
    """Whether the tree (a loaded repository) needs the bootstrap releases installed before Flux applies it.

    releases: check_bootstrap_rendered's result. rules: check_rules' result (the critical-dependency rules the
    analysis uses). bootstrap: check_bootstrap's result (more releases, by name, for the rules). bootstrap_source:
    "namespace/name" of the GitRepository Flux syncs from, or None. tree_objects: objects the run adds to the tree
    before Flux fetches it (see check_tree_objects). Returns findings, each {release ("ns/name" or None), object
    ("Kind ns/name", "Kind name" when cluster-scoped, or None), file (repository-relative or None), reason (one of
    NEEDS_REASONS), message}; [] when nothing in the tree needs them. Conservative: what cannot be read ahead
    (HelmReleases' charts, other sources, unparsable files, remote kustomize resources, API groups nothing here
    defines) counts as needing them. edges: the repository's effective order when the caller has it (analyze does).
    """
    source = check_bootstrap_source(bootstrap_source)
    records = _tree_records(repo, tree_objects)
    if not releases:
        return []
    views = [(release, _release_view(release)) for release in releases]
    crd_scopes = {}
    tree_crd_groups = set()
    for record in records:
        if record.get('crd'):
            crd_scopes[(record['crd']['group'], record['crd']['kind'])] = record['crd']['scope']
            tree_crd_groups.add(record['crd']['group'])
    for _release, view in views:
        for entry in view['crds']:
            crd_scopes[(entry['crd']['group'], entry['crd']['kind'])] = entry['crd']['scope']
    crd_group_owner = {}
    api_service_owner = {}
    release_objects = {}
    for release, view in views:
        for group in sorted(view['crd_groups']):
            crd_group_owner.setdefault(group, []).append((release, [e for e in view['crds'] if e['crd']['group'] == group]))
        for entry in view['api_services']:
            api_service_owner.setdefault(entry['served_group'], []).append((release, entry))
        for entry in view['objects']:
            if entry['kind'] == 'Namespace' or _is_flux_group(entry['group']):
                continue
            scoped = _cluster_scoped(entry['group'], entry['kind'], crd_scopes)
            release_objects.setdefault((entry['kind'], entry['name']), []).append(
                (release, None if scoped else entry['namespace'], entry))
    by_helm_release = dict(((release['name'], release['namespace']), release) for release in releases)
    targets = _target_namespaces(repo)

    findings = []
    unknown_apis = {}
    for record in records:
        scoped = _cluster_scoped(record['group'], record['kind'], crd_scopes)
        namespace = None if scoped else record['namespace']
        label = _object_label(record['kind'], namespace, record['name'])
        where = _where(label, record)
        if record['kind'] == HELMRELEASE and record['group'] == FLUX_GROUPS[HELMRELEASE].rstrip('/'):
            name, namespaces = _helm_release_identity(record)
            taken = [by_helm_release[(name, ns)] for ns in namespaces if (name, ns) in by_helm_release]
            for release in taken:
                findings.append({'release': release['id'], 'object': label, 'file': record['file'], 'reason': 'takes_over_release',
                                 'message': '%s manages Helm release %s in namespace %s, which is bootstrap release %s: Flux '
                                            'would take it over, so it must come after that release'
                                            % (where, name, release['namespace'], release['id'])})
            if not taken:
                findings.append({'release': None, 'object': label, 'file': record['file'], 'reason': 'unreadable_helmrelease',
                                 'message': '%s installs a chart whose objects cannot be read ahead: they may use what the '
                                            'bootstrap releases bring' % where})
            continue
        if _is_flux_group(record['group']):
            continue
        for release, crds in crd_group_owner.get(record['group'], ()):
            crd = next((e for e in crds if e['crd']['kind'] == record['kind']), crds[0])
            findings.append({'release': release['id'], 'object': label, 'file': record['file'], 'reason': 'uses_crd',
                             'message': '%s is of API group %s, whose CustomResourceDefinition %s bootstrap release %s brings: '
                                        'it cannot be applied before that release' % (where, record['group'], crd['name'], release['id'])})
        for release, service in api_service_owner.get(record['group'], ()):
            findings.append({'release': release['id'], 'object': label, 'file': record['file'], 'reason': 'uses_api_service',
                             'message': '%s is of API group %s, which APIService %s of bootstrap release %s serves: it cannot '
                                        'be applied before that release' % (where, record['group'], service['name'], release['id'])})
        if (record['group'] not in BUILTIN_API_GROUPS and record['group'] != FLUX_OPERATOR_GROUP and record['group'] not in tree_crd_groups
                and record['group'] not in crd_group_owner and record['group'] not in api_service_owner):
            unknown_apis.setdefault((record['group'], record['kind']), (label, record))
        if record['kind'] == 'Namespace':
            continue
        # The namespaces the object may land in: its own (or its kustomization.yaml's) and the targetNamespace of
        # the Flux Kustomizations applying it; none known matches any namespace.
        tree_namespaces = set([namespace] if namespace else []) | targets.get(record['file'], set())
        for release, release_namespace, entry in release_objects.get((record['kind'], record['name']), ()):
            if not scoped and release_namespace is not None and tree_namespaces and release_namespace not in tree_namespaces:
                continue
            findings.append({'release': release['id'], 'object': label, 'file': record['file'], 'reason': 'same_object',
                             'message': '%s is the same object as the %s that bootstrap release %s installs: Flux and the '
                                        'release would both manage it' % (where, _object_label(entry['kind'], release_namespace, entry['name']),
                                                                          release['id'])})
    for (group, kind), (label, record) in sorted(unknown_apis.items()):
        findings.append({'release': None, 'object': label, 'file': record['file'], 'reason': 'unknown_api',
                         'message': '%s is of kind %s in API group %s, which no Kubernetes built-in API, no CRD in the tree and '
                                    'no bootstrap release defines: something installed at run time must create it (an operator, a '
                                    'CNI - maybe a bootstrap release), so it may need the bootstrap releases'
                                    % (_where(label, record), kind, group)})
    findings.extend(_unreadable_sources(repo, source))
    findings.extend(_critical_rule_needs(repo, rules or (), _release_names(releases, bootstrap),
                                         _repo_edges(repo) if edges is None else edges))
    for release, view in views:
        findings.extend(_webhook_needs(release, view))
        infrastructure = [(entry, _infrastructure_role(entry)) for entry in view['objects']]
        infrastructure = [(entry, role) for entry, role in infrastructure if role]
        if infrastructure:
            entry, role = infrastructure[0]
            scoped = _cluster_scoped(entry['group'], entry['kind'], crd_scopes)
            label = _object_label(entry['kind'], None if scoped else entry['namespace'], entry['name'])
            findings.append({'release': release['id'], 'object': label, 'file': None, 'reason': 'cluster_infrastructure',
                             'message': "bootstrap release %s installs %s, %s: Flux's own controllers may need it to resolve "
                                        'names, reach the network or pull images before they can fetch the tree, so Flux must '
                                        'come after that release' % (release['id'], label, role)})
    return findings


# --- command line ----------------------------------------------------------------------------

def format_text(report):
    lines = ['Flux dependency graph of %s (%d files)' % (report['root'], report['files_scanned']), '', report['summary_table'], '']
    for tier, members in enumerate(report['tiers']):
        lines.append('tier %d: %s' % (tier, ', '.join(members)))
    if report['untiered']:
        lines.append('no tier (in or behind a cycle): %s' % ', '.join(report['untiered']))
    for title, items in (('ERROR', report['errors']), ('warning', report['warnings'])):
        for item in items:
            lines.append('%s: %s' % (title, item))
    if 'tree_needs_bootstrap' in report:
        needs = report['tree_needs_bootstrap']
        lines.append('the tree needs the bootstrap releases: %s' % ('yes (%d findings)' % len(needs) if needs else 'no'))
        lines.extend('needs (%s): %s' % (item['reason'], item['message']) for item in needs)
    lines.append('')
    lines.append('result: %s (%d errors, %d warnings)' % ('FAILED' if report['failed'] else 'ok', len(report['errors']), len(report['warnings'])))
    return '\n'.join(lines) + '\n'


def _load_yaml_file(path, field):
    try:
        with open(path, 'rb') as handle:
            return yaml.safe_load(handle)
    except (OSError, IOError, yaml.YAMLError) as exc:
        raise ValidationError(field, 'cannot read %s: %s' % (path, _yaml_error(exc) if isinstance(exc, yaml.YAMLError) else exc)) from None


def main(argv=None, stdout=None):
    """CLI: exit 0 when nothing fails, 1 on failing findings, 2 on bad input."""
    stdout = stdout or sys.stdout
    parser = argparse.ArgumentParser(prog='flux_graph', description='Lint the Flux dependsOn graph of a GitOps repository.')
    parser.add_argument('path', help='root of the GitOps repository')
    parser.add_argument('--rules', help='YAML file with a list of critical-dependency rules')
    parser.add_argument('--no-default-rules', action='store_true', help='use only the rules from --rules')
    parser.add_argument('--bootstrap', help='helmfile (or YAML list of releases with needs) installed before Flux')
    parser.add_argument('--bootstrap-rendered', help='YAML/JSON file: what the bootstrap releases install ({"ns/name": {crds, objects}}); '
                                                     'prints whether the tree needs them')
    parser.add_argument('--bootstrap-source', help='namespace/name of the GitRepository Flux syncs from (with --bootstrap-rendered)')
    parser.add_argument('--tree-objects', help='YAML/JSON file: a list of objects the run adds to the tree before Flux fetches it '
                                               '(with --bootstrap-rendered)')
    parser.add_argument('--exclude', action='append', default=[], help='glob of repository paths to leave out (repeatable)')
    parser.add_argument('--default-namespace', default=DEFAULT_NAMESPACE)
    parser.add_argument('--fail-on', default=','.join(DEFAULT_FAIL_ON), help='comma-separated: %s' % ', '.join(FINDINGS))
    parser.add_argument('--format', choices=('text', 'json', 'mermaid'), default='text')
    args = parser.parse_args(argv)
    try:
        rules = [] if args.no_default_rules else list(DEFAULT_RULES)
        if args.rules:
            rules.extend(_load_yaml_file(args.rules, '--rules') or [])
        bootstrap = None
        if args.bootstrap:
            bootstrap = releases_from_file(args.bootstrap)
        rendered = None
        if args.bootstrap_rendered:
            rendered = _load_yaml_file(args.bootstrap_rendered, '--bootstrap-rendered')
            if rendered is None:
                rendered = {}
        tree_objects = _load_yaml_file(args.tree_objects, '--tree-objects') if args.tree_objects else None
        fail_on = [item.strip() for item in args.fail_on.split(',') if item.strip()]
        report = analyze_path(args.path, rules, bootstrap, fail_on, args.exclude, args.default_namespace, rendered,
                              args.bootstrap_source, tree_objects)
    except ValidationError as exc:
        sys.stderr.write('flux_graph: %s\n' % exc)
        return 2
    if args.format == 'json':
        stdout.write(json.dumps(report, indent=2, sort_keys=True) + '\n')
    elif args.format == 'mermaid':
        stdout.write(report['mermaid'])
    else:
        stdout.write(format_text(report))
    return 1 if report['failed'] else 0


if __name__ == '__main__':
    raise SystemExit(main())
