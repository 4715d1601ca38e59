"""How a simulated Talos node reads a machine config: strict decoding, schema, Talos' own rules.

Talos decodes the multi-document YAML strictly (an unknown key is an error that quotes the key
path), checks each document, then runs the v1alpha1 validation rules. The lab does the same:

1. YAML -> documents. Loaded the way Go's yaml.v3 reads it (YAML 1.2 booleans only: `off` stays
   the string "off"; duplicate keys are an error).
2. Each document is matched to its schema definition in
   lab/talos/schemas/talos-config-v1.13.9.schema.json.gz: the legacy v1alpha1 document (no
   apiVersion/kind, `version: v1alpha1`) to `v1alpha1.Config`, others by apiVersion + kind.
   Keys the schema does not know -> "unknown keys found during decoding:" followed by the key
   path as YAML, as Talos prints it. Fields Talos accepts but leaves out of its schema
   (docgen:nodoc: persist, machine.network, machine.features.rbac, apidCheckExtKeyUsage,
   stableHostname) are accepted.
3. Type/enum/pattern errors from the schema -> "failed to parse config: <path>: <reason>".
4. The required-field rules of v1alpha1_validation.go that the schema cannot express (facts 5.2),
   with Talos' wording, collected multierror-style ("N errors occurred:\\n\\t* ...").

Every failure is a ConfigError; the node answers it with InvalidArgument.
"""

import copy
import difflib
import hashlib
import gzip
import json
import os
import re
from urllib.parse import urlparse

import jsonschema
import yaml

SCHEMA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'schemas')
SCHEMA_FILE = 'talos-config-v1.13.9.schema.json.gz'

# Accepted by Talos although its JSON schema leaves them out (docgen:nodoc).
NODOC_PATHS = (
    ('persist',),
    ('machine', 'network'),
    ('machine', 'features', 'rbac'),
    ('machine', 'features', 'apidCheckExtKeyUsage'),
    ('machine', 'features', 'stableHostname'),
)

_DNS_NAME = re.compile(r'^([a-zA-Z0-9_][a-zA-Z0-9_-]{0,62})(\.[a-zA-Z0-9_][a-zA-Z0-9_-]{0,62})*[._]?$')


class ConfigError(Exception):
    """The config was refused; the message is what Talos would say."""


class _GoYamlLoader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
    """SafeLoader with YAML 1.2 booleans, no timestamps, and duplicate keys refused (like yaml.v3)."""


_GoYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in ('tag:yaml.org,2002:bool', 'tag:yaml.org,2002:timestamp')]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_GoYamlLoader.add_implicit_resolver('tag:yaml.org,2002:bool', re.compile(r'^(?:true|True|TRUE|false|False|FALSE)$'),
                                    list('tTfF'))


def _construct_mapping(loader, node):
    loader.flatten_mapping(node)
    seen = {}
    for key_node, dummy_value in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise ConfigError('failed to parse config: yaml: line %d: mapping key %r already defined at line %d'
                              % (key_node.start_mark.line + 1, key, seen[key] + 1))
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=True)


_GoYamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_documents(data):
    """The non-empty YAML documents of a config, as Python objects."""
    if isinstance(data, bytes):
        try:
            data = data.decode('utf-8')
        except UnicodeDecodeError:
            raise ConfigError('failed to parse config: config is not valid UTF-8 text')
    try:
        documents = [doc for doc in yaml.load_all(data, Loader=_GoYamlLoader) if doc is not None]
    except yaml.YAMLError as exc:
        raise ConfigError('failed to parse config: %s' % (str(exc).replace('\n', ' '),))
    if not documents:
        raise ConfigError('failed to parse config: the config is empty')
    for index, document in enumerate(documents):
        if not isinstance(document, dict):
            raise ConfigError('failed to parse config: document %d is not a mapping' % (index + 1))
    return documents


class _Schema(object):
    """The Talos JSON schema, its definitions by document kind, and a resolver for walking it."""

    def __init__(self, path):
        with gzip.open(path, 'rt', encoding='utf-8') as handle:
            self.schema = json.load(handle)
        self.defs = self.schema['$defs']
        self.by_kind = {}
        for entry in self.schema.get('oneOf', []):
            name = entry['$ref'].rsplit('/', 1)[-1]
            props = self.defs[name].get('properties', {})
            kinds = props.get('kind', {}).get('enum', [])
            versions = props.get('apiVersion', {}).get('enum', [])
            for kind in kinds:
                for version in versions:
                    self.by_kind[(version, kind)] = name

    def definition_for(self, document, index):
        if 'kind' not in document and 'apiVersion' not in document:
            if document.get('version') != 'v1alpha1':
                raise ConfigError('failed to parse config: document %d: missing kind (and it is not a v1alpha1 '
                                  'machine config: version is %r)' % (index + 1, document.get('version')))
            return 'v1alpha1.Config'
        if 'kind' not in document:
            raise ConfigError('failed to parse config: document %d: missing kind' % (index + 1))
        key = (document.get('apiVersion'), document.get('kind'))
        if key not in self.by_kind:
            raise ConfigError('failed to parse config: unknown document type %s/%s' % key)
        return self.by_kind[key]

    def resolve(self, node):
        while isinstance(node, dict) and '$ref' in node:
            node = self.defs[node['$ref'].rsplit('/', 1)[-1]]
        return node

    def validator(self, name):
        return jsonschema.Draft202012Validator({'$defs': self.defs, '$ref': '#/$defs/%s' % name})


_SCHEMA = None


def schema():
    global _SCHEMA  # pylint: disable=global-statement
    if _SCHEMA is None:
        _SCHEMA = _Schema(os.path.join(SCHEMA_DIR, SCHEMA_FILE))
    return _SCHEMA


def _is_nodoc(path):
    return tuple(path) in NODOC_PATHS


def _unknown_keys(sch, node, value, path, found):
    """Collect (path, value) of keys the schema does not declare, walking value alongside node."""
    node = sch.resolve(node)
    if not isinstance(node, dict):
        return
    if isinstance(value, dict):
        properties = node.get('properties')
        patterns = node.get('patternProperties') or {}
        extra = node.get('additionalProperties')
        for key, item in value.items():
            child_path = path + [key]
            if properties is not None and key in properties:
                _unknown_keys(sch, properties[key], item, child_path, found)
            elif any(re.search(pattern, str(key)) for pattern in patterns):
                pattern = next(p for p in patterns if re.search(p, str(key)))
                _unknown_keys(sch, patterns[pattern], item, child_path, found)
            elif isinstance(extra, dict):
                _unknown_keys(sch, extra, item, child_path, found)
            elif extra is False or properties is not None:
                if not _is_nodoc(child_path):
                    found.append((child_path, item))
    elif isinstance(value, list) and isinstance(node.get('items'), dict):
        for index, item in enumerate(value):
            _unknown_keys(sch, node['items'], item, path + [index], found)


def _strip_nodoc(document):
    clean = copy.deepcopy(document)
    for path in NODOC_PATHS:
        parent = clean
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
    return clean


def _unknown_keys_text(found):
    """The YAML snippet Talos prints after "unknown keys found during decoding:"."""
    tree = {}
    for path, value in found:
        cursor = tree
        for key in path[:-1]:
            cursor = cursor.setdefault(key, {})
        cursor[path[-1]] = value
    return yaml.safe_dump(tree, default_flow_style=False, sort_keys=False, indent=4)


def _check_schema(document, name, index):
    sch = schema()
    found = []
    _unknown_keys(sch, sch.defs[name], document, [], found)
    if found:
        raise ConfigError('failed to parse config: unknown keys found during decoding:\n%s' % _unknown_keys_text(found))
    errors = sorted(sch.validator(name).iter_errors(_strip_nodoc(document)), key=lambda err: list(err.absolute_path))
    if errors:
        first = errors[0]
        where = '.'.join(str(part) for part in first.absolute_path) or '(document %d)' % (index + 1)
        raise ConfigError('failed to parse config: %s: %s' % (where, first.message))


def _get(tree, *path):
    for key in path:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return tree


def _multierror(problems):
    if len(problems) == 1:
        head = '1 error occurred:'
    else:
        head = '%d errors occurred:' % len(problems)
    return head + ''.join('\n\t* %s' % problem for problem in problems) + '\n\n'


def validate_rules(config, installed):
    """Talos' v1alpha1 rules that the schema cannot express; returns warnings, raises ConfigError."""
    problems = []
    warnings = []
    machine = config.get('machine')
    if not isinstance(machine, dict):
        raise ConfigError(_multierror(['machine instructions are required']))
    cluster = config.get('cluster')
    machine_type = machine.get('type')
    control_plane = machine_type in ('controlplane', 'init')
    if not isinstance(cluster, dict):
        problems.append('cluster instructions are required')
    else:
        endpoint = _get(cluster, 'controlPlane', 'endpoint')
        if _get(cluster, 'controlPlane') is not None and not endpoint:
            problems.append('cluster controlplane endpoint is required')
        elif endpoint is not None:
            parsed = urlparse(str(endpoint))
            if parsed.scheme not in ('http', 'https') or not parsed.hostname:
                problems.append('invalid controlplane endpoint: "%s" is not a valid endpoint URL' % (endpoint,))
        elif _get(cluster, 'controlPlane') is None:
            problems.append('cluster controlplane endpoint is required')
        dns_domain = _get(cluster, 'network', 'dnsDomain')
        if dns_domain and not _DNS_NAME.match(str(dns_domain)):
            problems.append('"%s" is not a valid DNS name' % dns_domain)
        if cluster.get('etcd') is not None and not control_plane:
            problems.append('etcd config is only allowed on control plane machines')
        if _get(cluster, 'ca', 'key') and not control_plane:
            problems.append('cluster CA key is not allowed on non-controlplane nodes (.cluster.ca)')
        names = []
        for manifest in cluster.get('inlineManifests') or []:
            name = (manifest or {}).get('name') or ''
            if not name.strip():
                problems.append("inline manifest name can't be empty")
            elif name in names:
                problems.append('inline manifest name "%s" is duplicate' % name)
            names.append(name)
        discovery = cluster.get('discovery') or {}
        if discovery.get('enabled') and not _get(discovery, 'registries', 'service', 'disabled'):
            if not cluster.get('id'):
                problems.append('cluster discovery service requires .cluster.id')
            if not cluster.get('secret'):
                problems.append('cluster discovery service requires .cluster.secret')
        cni = _get(cluster, 'network', 'cni')
        if control_plane and isinstance(cni, dict):
            name = cni.get('name')
            urls = cni.get('urls') or []
            if name in ('flannel', 'none') and urls:
                problems.append('"urls" field should be empty for "%s" CNI' % name)
            elif name == 'custom' and not urls:
                warnings.append('"urls" field should not be empty for "custom" CNI')
            elif name not in ('flannel', 'none', 'custom'):
                problems.append('cni name should be one of ["flannel", "custom", "none"]')

    if not installed:
        install = machine.get('install') or {}
        if not install.get('disk') and not install.get('diskSelector'):
            problems.append('either install disk or diskSelector should be defined')

    ca = machine.get('ca')
    if not ca and not machine.get('acceptedCAs'):
        problems.append('issuing CA or some accepted CAs are required (.machine.ca, machine.acceptedCAs)')
    if control_plane:
        if not ca:
            problems.append('issuing CA is required (.machine.ca)')
        elif not ca.get('key'):
            problems.append('issuing CA key is required for controlplane nodes (.machine.ca.key)')
    elif machine_type == 'worker':
        if ca and ca.get('key'):
            problems.append('issuing Talos API CA key is not allowed on non-controlplane nodes (.machine.ca)')
        if ca and not ca.get('crt') and not machine.get('acceptedCAs'):
            problems.append('trusted CA certificates are required on non-controlplane nodes (.machine.ca.crt, .machine.acceptedCAs)')
        if isinstance(cluster, dict) and _get(cluster, 'ca', 'key'):
            problems.append('issuing Kubernetes API CA key is not allowed on non-controlplane nodes (.cluster.ca)')
    else:
        problems.append('unknown machine type "%s"' % (machine_type or ''))
    if config.get('persist') is False:
        problems.append('.persist should be enabled')
    if problems:
        raise ConfigError(_multierror(problems))
    return warnings


class MachineConfig(object):
    """A parsed, validated config: its documents and the values the simulated node uses."""

    def __init__(self, documents):
        self.documents = documents
        self.v1alpha1 = next((doc for doc in documents if 'kind' not in doc), None)

    @property
    def machine(self):
        return self.v1alpha1.get('machine') or {}

    @property
    def cluster(self):
        return self.v1alpha1.get('cluster') or {}

    @property
    def machine_type(self):
        return 'controlplane' if self.machine.get('type') == 'init' else self.machine.get('type')

    @property
    def control_plane(self):
        return self.machine_type == 'controlplane'

    @property
    def cluster_id(self):
        return self.cluster.get('id') or ''

    @property
    def cluster_name(self):
        return self.cluster.get('clusterName') or ''

    @property
    def endpoint(self):
        return _get(self.cluster, 'controlPlane', 'endpoint') or ''

    @property
    def os_ca(self):
        """(crt PEM, key PEM or None) of machine.ca, base64-decoded."""
        return _b64_pem(_get(self.machine, 'ca', 'crt')), _b64_pem(_get(self.machine, 'ca', 'key'))

    @property
    def accepted_cas(self):
        return [_b64_pem(entry.get('crt')) for entry in self.machine.get('acceptedCAs') or [] if entry.get('crt')]

    @property
    def k8s_accepted_cas(self):
        """cluster.acceptedCAs: the Kubernetes CA certificates trusted besides the issuing one."""
        return [_b64_pem(entry.get('crt')) for entry in self.cluster.get('acceptedCAs') or [] if entry.get('crt')]

    @property
    def k8s_ca(self):
        return _b64_pem(_get(self.cluster, 'ca', 'crt')), _b64_pem(_get(self.cluster, 'ca', 'key'))

    @property
    def cert_sans(self):
        return list(self.machine.get('certSANs') or [])

    @property
    def install_disk(self):
        return _get(self.machine, 'install', 'disk') or ''

    @property
    def hostname(self):
        """An explicit hostname (HostnameConfig.hostname or legacy machine.network.hostname), or None."""
        for doc in self.documents:
            if doc.get('kind') == 'HostnameConfig' and doc.get('hostname'):
                return doc['hostname']
        return _get(self.machine, 'network', 'hostname') or None

    def canonical_text(self, redact=False):
        """The documents re-encoded the same way every time: what dry-run diffs compare.

        redact: replace secret values (keys, tokens, secrets) with a fixed marker, as Talos does
        when it shows a config; a change of a secret still shows as a changed line.
        """
        documents = [_redact(doc) for doc in self.documents] if redact else self.documents
        return '---\n'.join(yaml.safe_dump(doc, default_flow_style=False, sort_keys=False) for doc in documents)


SECRET_KEYS = ('key', 'token', 'secret', 'secretboxEncryptionSecret', 'aescbcEncryptionSecret', 'bootstrapToken')
REDACTED = '******'


def _redact(value, parent=None):
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in SECRET_KEYS and isinstance(item, str) and item:
                out[key] = '%s (sha256:%s)' % (REDACTED, hashlib.sha256(item.encode('utf-8')).hexdigest()[:8])
            else:
                out[key] = _redact(item, key)
        return out
    if isinstance(value, list):
        return [_redact(item, parent) for item in value]
    return value


def _b64_pem(value):
    import base64  # pylint: disable=import-outside-toplevel
    if not value:
        return None
    try:
        return base64.b64decode(value)
    except (ValueError, TypeError):
        return None


def parse(data, installed):
    """Decode and validate a config as Talos would: (MachineConfig, warnings) or ConfigError.

    installed: the node already has Talos on its disk (then machine.install is not required).
    """
    documents = load_documents(data)
    v1alpha1_docs = 0
    for index, document in enumerate(documents):
        name = schema().definition_for(document, index)
        if name == 'v1alpha1.Config':
            v1alpha1_docs += 1
        _check_schema(document, name, index)
    if v1alpha1_docs == 0:
        raise ConfigError('the v1alpha1 machine config document is required (version: v1alpha1)')
    if v1alpha1_docs > 1:
        raise ConfigError('failed to parse config: duplicate v1alpha1 config document')
    config = MachineConfig(documents)
    warnings = validate_rules(config.v1alpha1, installed)
    return config, warnings


# What a running node can take without a reboot: CanApplyImmediate (siderolabs/talos v1.13.9
# internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_runtime.go:130-217) copies these parts of the running v1alpha1
# document into the new one (:175-204) and refuses the change when the two still differ (:207-213). Everything else
# (machine.type, token, env, files, udev, disks, other features, persist...) needs a reboot; documents other than
# v1alpha1 are not compared.
IMMEDIATE_TOP = ('debug', 'cluster')
IMMEDIATE_MACHINE = ('ca', 'acceptedCAs', 'time', 'certSANs', 'install', 'network', 'sysfs', 'sysctls', 'logging',
                     'controlPlane', 'kubelet', 'kernel', 'registries', 'pods', 'seccompProfiles', 'nodeAnnotations',
                     'nodeLabels', 'nodeTaints')
# Copied only when both configs have machine.features (:198).
IMMEDIATE_FEATURES = ('kubernetesTalosAPIAccess', 'kubePrism', 'hostDNS', 'imageCache', 'nodeAddressSortAlgorithm')


def _take(source, target, key):
    if key in source:
        target[key] = copy.deepcopy(source[key])
    else:
        target.pop(key, None)


def _immediate_view(current, new):
    """The new v1alpha1 document with the live-changeable parts of the current one (the DeepCopy at :147)."""
    new = copy.deepcopy(new)
    for key in IMMEDIATE_TOP:
        _take(current, new, key)
    machine, running = new.get('machine'), current.get('machine')
    if isinstance(machine, dict) and isinstance(running, dict):
        for key in IMMEDIATE_MACHINE:
            _take(running, machine, key)
        if isinstance(machine.get('features'), dict) and isinstance(running.get('features'), dict):
            for key in IMMEDIATE_FEATURES:
                _take(running['features'], machine['features'], key)
    return new


def immediate_refusal(old, new):
    """None when CanApplyImmediate lets `new` apply to a node running `old`, else its error text (with the diff)."""
    if old is None:
        return None
    current = old.v1alpha1
    masked = _immediate_view(current, new.v1alpha1)
    if current == masked:
        return None
    return "this config change can't be applied in immediate mode\ndiff:\n%s" % _text_diff(
        MachineConfig([current]).canonical_text(redact=True), MachineConfig([masked]).canonical_text(redact=True))


def _text_diff(before, after):
    lines = difflib.unified_diff(before.splitlines(True), after.splitlines(True), 'a', 'b')
    return ''.join(lines).rstrip('\n')


def diff(old, new):
    """The config diff of a dry run: a unified diff of the re-encoded documents, or "No changes."."""
    before = old.canonical_text(redact=True) if old is not None else ''
    after = new.canonical_text(redact=True)
    if before == after:
        return 'No changes.'
    lines = difflib.unified_diff(before.splitlines(True), after.splitlines(True), 'a', 'b')
    return ''.join(lines).rstrip('\n')
