# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Talos machine-config rendering and validation (no talosctl needed). PRIVATE.

`render_machine_config` builds what `talosctl gen config` would for a v1.12 or v1.13 contract
(facts/talos-api.md 5.2, Talos's stability test data) from a SecretsBundle, the cluster
values and a node's values, with Cilium-ready defaults (CNI none, kube-proxy disabled,
KubePrism on 7445), then applies the cluster, group and host patches (patch.py) and checks
the result with `validate_machine_config`. The same inputs always give the same text.

Documents, in order: the v1alpha1 document; HostnameConfig (`auto: stable`, or the node's
`hostname`); LinkConfig when the node has a static address; Layer2VIPConfig on control
planes when the cluster has a VIP; then whatever patches add.

Contract differences handled here: v1.12 still writes the legacy `machine.network: {}`;
default Kubernetes is 1.35.4 for 1.12 and 1.36.3 for 1.13; the installer tag follows the
Talos version. Everything else gen config writes is the same for both.

See docs/talos-config.md for the values and the patch rules.
"""

from __future__ import annotations

import base64
import binascii
import copy
import ipaddress
import re

from ansible_collections.proxtalos.cluster.plugins.module_utils._crypto import pem_blocks
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import patch as talos_patch
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import pki, talosyaml

try:
    from urllib.parse import urlsplit
except ImportError:  # pragma: no cover - Python 2 is not supported by the collection
    from urlparse import urlsplit  # type: ignore

# jsonschema (a test dependency) is imported by schema_problems() only: every module that renders or applies a
# config imports this file, and importing jsonschema costs more CPU than the rendering.


SUPPORTED_CONTRACTS = ('1.12', '1.13')
DEFAULT_TALOS_VERSION = 'v1.13.9'
DEFAULT_KUBERNETES_VERSIONS = {'1.12': '1.35.4', '1.13': '1.36.3'}
MACHINE_TYPES = ('controlplane', 'worker')
DEFAULT_INSTALL_DISK = '/dev/sda'
# First virtio NIC of a Proxmox VM (PCI slot 18) under Talos's predictable interface names.
DEFAULT_NETWORK_LINK = 'ens18'
DEFAULT_API_PORT = 6443
KUBEPRISM_PORT = 7445
CNI_NAMES = ('none', 'flannel', 'custom')

# What Talos itself hides when it shows a config (Container.RedactSecrets, which calls the Redact method of
# the v1alpha1 document and of every document kind that has one), as dotted paths per document kind
# ('*': any list item or map key), for _diff.hide and for the values to mask. Each entry names the
# method it mirrors in siderolabs/talos v1.13.9, pkg/machinery/config/types/; a test compares this table
# with what those methods replace, run by Talos's own code (tools/talos-machinery). The v1.12 documents
# redact a subset of these. Talos does NOT redact its dry-run diff (configdiff.DiffConfigs): the
# collection hides these paths itself, in the old value and the new.
TALOS_REDACTED_PATHS = {
    # v1alpha1/v1alpha1_provider.go Config.Redact, with redactDeviceSecrets and redactVIPSecrets
    'v1alpha1': (
        'machine.token', 'machine.ca.key',
        'machine.registries.config.*.auth.password', 'machine.registries.config.*.auth.auth',
        'machine.registries.config.*.auth.identityToken', 'machine.registries.config.*.tls.clientIdentity.key',
        'machine.network.interfaces.*.wireguard.privateKey',
        'machine.network.interfaces.*.vip.equinixMetal.apiToken', 'machine.network.interfaces.*.vip.hcloud.apiToken',
        'machine.network.interfaces.*.vlans.*.vip.equinixMetal.apiToken',
        'machine.network.interfaces.*.vlans.*.vip.hcloud.apiToken',
        'machine.systemDiskEncryption.state.keys.*.static.passphrase',
        'machine.systemDiskEncryption.ephemeral.keys.*.static.passphrase',
        'cluster.secret', 'cluster.token', 'cluster.aescbcEncryptionSecret', 'cluster.secretboxEncryptionSecret',
        'cluster.serviceAccount.key', 'cluster.ca.key', 'cluster.aggregatorCA.key', 'cluster.etcd.ca.key',
    ),
    'RegistryAuthConfig': ('password', 'auth', 'identityToken'),  # cri/registry_auth.go
    'RegistryTLSConfig': ('clientIdentity.key',),  # cri/registry_tls.go
    'WireguardConfig': ('privateKey', 'peers.*.presharedKey'),  # network/wireguard.go (config and WireguardPeer)
    'HCloudVIPConfig': ('apiToken',),  # network/hcloud_vip.go
    # block/encryption.go EncryptionSpec.Redact, called by the Redact of each volume document
    'VolumeConfig': ('encryption.keys.*.static.passphrase',),  # block/volume_config.go
    'UserVolumeConfig': ('encryption.keys.*.static.passphrase',),  # block/user_volume_config.go
    'RawVolumeConfig': ('encryption.keys.*.static.passphrase',),  # block/raw_volume_config.go
    'SwapVolumeConfig': ('encryption.keys.*.static.passphrase',),  # block/swap_volume_config.go
    # siderolink/siderolink.go: the jointoken query parameter of apiUrl (the whole URL is hidden here) and uniqueToken
    'SideroLinkConfig': ('apiUrl', 'uniqueToken'),
}

# Hidden by the collection although Talos shows them: an inline manifest (a `helm template` of Cilium) can
# carry TLS keys (Hubble, clustermesh).
COLLECTION_SECRET_PATHS = {
    'v1alpha1': ('cluster.inlineManifests.*.contents',),
}

# Everything hidden, per document kind: Talos's paths and the collection's.
SECRET_PATHS = dict(
    (kind, TALOS_REDACTED_PATHS.get(kind, ()) + COLLECTION_SECRET_PATHS.get(kind, ()))
    for kind in set(TALOS_REDACTED_PATHS) | set(COLLECTION_SECRET_PATHS))

# The v1alpha1 document's (the legacy name of that entry).
CONFIG_SECRET_PATHS = SECRET_PATHS['v1alpha1']

# The keys under which a secret value can stand in any document: what a text the collection cannot read as
# a config (a node's dry-run diff) is masked by, line by line.
SECRET_KEYS = frozenset(path.rsplit('.', 1)[-1] for paths in SECRET_PATHS.values() for path in paths)


def secret_paths_of(document):
    """The secret paths of one parsed document (or strategic-merge patch): by its kind, a mapping without kind
    (the legacy document, a patch of it) as 'v1alpha1'."""
    if not isinstance(document, dict):
        return ()
    if talos_patch.is_v1alpha1(document):
        return SECRET_PATHS['v1alpha1']
    return SECRET_PATHS.get(document.get('kind'), ())


# Keys Talos accepts but leaves out of its JSON schema (`docgen:nodoc`), per contract.
NODOC_PATHS = {
    '1.12': (('persist',), ('machine', 'features', 'rbac'), ('machine', 'features', 'apidCheckExtKeyUsage'),
             ('machine', 'features', 'stableHostname')),
    '1.13': (('persist',), ('machine', 'network'), ('machine', 'features', 'rbac'),
             ('machine', 'features', 'apidCheckExtKeyUsage'), ('machine', 'features', 'stableHostname')),
}

_CLUSTER_KEYS = (
    'name', 'endpoint', 'pod_subnets', 'service_subnets', 'dns_domain', 'cert_sans', 'cni', 'cni_urls',
    'proxy_disabled', 'allow_scheduling_on_control_planes', 'inline_manifests', 'extra_manifests', 'vip',
    'network_link', 'installer_image', 'installer_schematic', 'install_wipe', 'kubeprism_port',
    'forward_kube_dns_to_host', 'discovery',
)
_NODE_KEYS = ('hostname', 'install_disk', 'ip', 'prefix', 'gateway', 'link')

_TALOS_VERSION_RE = re.compile(r'^v(\d+)\.(\d+)\.(\d+)(?:-[0-9A-Za-z.-]+)?$')
_K8S_VERSION_RE = re.compile(r'^v?(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)$')
_LABEL_RE = re.compile(r'^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$')
_DNS_LABEL_RE = re.compile(r'^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$')
_SCHEMATIC_RE = re.compile(r'^[0-9a-f]{64}$')
_IMAGE_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._/:@-]*$')


# --- versions -----------------------------------------------------------------------------------

def contract_of(talos_version, field='talos_version'):
    """'1.12' or '1.13' from a Talos tag like 'v1.13.9'; ValidationError otherwise."""
    match = _TALOS_VERSION_RE.match(talos_version or '') if isinstance(talos_version, str) else None
    if not match:
        raise ValidationError(field, 'must be a Talos tag like v1.13.9, got %r' % (talos_version,))
    contract = '%s.%s' % (match.group(1), match.group(2))
    if contract not in SUPPORTED_CONTRACTS:
        raise ValidationError(field, 'Talos %s is not supported (supported: %s)'
                              % (contract, ', '.join('v%s.x' % c for c in SUPPORTED_CONTRACTS)))
    return contract


def normalize_kubernetes_version(kubernetes_version, contract, field='kubernetes_version'):
    """'1.36.3' (no leading v); the contract's default when None."""
    if kubernetes_version in (None, ''):
        return DEFAULT_KUBERNETES_VERSIONS[contract]
    match = _K8S_VERSION_RE.match(kubernetes_version) if isinstance(kubernetes_version, str) else None
    if not match:
        raise ValidationError(field, 'must be a Kubernetes version like 1.36.3, got %r' % (kubernetes_version,))
    return match.group(1)


# --- input values -------------------------------------------------------------------------------

def _reject_unknown(values, allowed, field):
    for key in values:
        if key not in allowed:
            raise ValidationError('%s.%s' % (field, key), 'unknown key (expected one of %s)' % ', '.join(allowed))


def _string(values, key, field, default=None, required=False):
    value = values.get(key)
    if value is None or value == '':
        if required:
            raise ValidationError(field, 'missing')
        return default
    if not isinstance(value, str):
        raise ValidationError(field, 'must be text, got %s' % type(value).__name__)
    return value


def _bool(values, key, field, default):
    value = values.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValidationError(field, 'must be true or false, got %s' % type(value).__name__)
    return value


def _string_list(values, key, field, default=()):
    value = values.get(key)
    if value is None:
        return list(default)
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValidationError(field, 'must be a list, got %s' % type(value).__name__)
    out = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise ValidationError('%s[%d]' % (field, index), 'must be non-empty text')
        out.append(item)
    return out


def _cidrs(values, key, field, default):
    subnets = _string_list(values, key, field, default)
    if not subnets:
        raise ValidationError(field, 'at least one subnet is required')
    for index, subnet in enumerate(subnets):
        try:
            ipaddress.ip_network(subnet, strict=True)
        except ValueError as exc:
            raise ValidationError('%s[%d]' % (field, index), 'not a CIDR subnet (%s)' % exc)
    return subnets


def is_dns_name(value):
    """True for a DNS name of labels [A-Za-z0-9-] (1-63 chars each), 253 chars at most."""
    if not isinstance(value, str) or not value or len(value) > 253:
        return False
    return all(_DNS_LABEL_RE.match(label) for label in value.rstrip('.').split('.'))


def _is_ip(value):
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def normalize_endpoint(endpoint, field='cluster.endpoint'):
    """Cluster endpoint as https://host:port; a bare host or host:port gets https and :6443."""
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise ValidationError(field, 'missing')
    endpoint = endpoint.strip()
    if '://' not in endpoint:
        host = endpoint
        if _is_ip(host) and ':' in host:
            host = '[%s]' % host
        endpoint = 'https://%s' % host
    parts = urlsplit(endpoint)
    try:
        port = parts.port
    except ValueError:
        raise ValidationError(field, 'has an invalid port')
    if parts.scheme != 'https':
        raise ValidationError(field, 'must be an https:// URL')
    if not parts.hostname or not (_is_ip(parts.hostname) or is_dns_name(parts.hostname)):
        raise ValidationError(field, 'needs a host name or IP address')
    if parts.path not in ('', '/') or parts.query or parts.fragment or parts.username:
        raise ValidationError(field, 'must be https://host[:port] without path, query or credentials')
    host = parts.hostname
    if ':' in host:
        host = '[%s]' % host
    return 'https://%s:%d' % (host, port or DEFAULT_API_PORT)


def endpoint_host(endpoint):
    """Host part of a normalized endpoint URL (no brackets)."""
    return urlsplit(endpoint).hostname


def _inline_manifests(values, field):
    value = values.get('inline_manifests')
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ValidationError(field, 'must be a list of {name, contents}, got %s' % type(value).__name__)
    names = set()
    out = []
    for index, item in enumerate(value):
        where = '%s[%d]' % (field, index)
        if not isinstance(item, dict):
            raise ValidationError(where, 'must be a mapping with name and contents')
        _reject_unknown(item, ('name', 'contents'), where)
        name = _string(item, 'name', where + '.name', required=True)
        contents = item.get('contents')
        if not isinstance(contents, str):
            raise ValidationError(where + '.contents', 'must be text (the manifest YAML)')
        if name in names:
            raise ValidationError(where + '.name', 'duplicate inline manifest name %r' % name)
        names.add(name)
        out.append({'name': name, 'contents': contents})
    return out


def normalize_cluster(cluster, field='cluster'):
    """Validated cluster values with defaults filled in (a new dict).

    Keys: name (required), endpoint (required; URL or host), pod_subnets [10.244.0.0/16],
    service_subnets [10.96.0.0/12], dns_domain cluster.local, cert_sans [], cni none
    (none|flannel|custom), cni_urls (custom only), proxy_disabled true,
    allow_scheduling_on_control_planes false, inline_manifests [] ({name, contents}),
    extra_manifests [] (URLs), vip (IP, control planes get a Layer2VIPConfig), network_link
    ens18, installer_image or installer_schematic (Image Factory id), install_wipe false,
    kubeprism_port 7445, forward_kube_dns_to_host true, discovery true.
    """
    if not isinstance(cluster, dict):
        raise ValidationError(field, 'must be a mapping, got %s' % type(cluster).__name__)
    _reject_unknown(cluster, _CLUSTER_KEYS, field)
    out = {}
    name = _string(cluster, 'name', field + '.name', required=True)
    if not _LABEL_RE.match(name):
        raise ValidationError(field + '.name', 'must be a DNS label: lower-case letters, digits and "-", at most 63')
    out['name'] = name
    out['endpoint'] = normalize_endpoint(cluster.get('endpoint'), field + '.endpoint')
    out['pod_subnets'] = _cidrs(cluster, 'pod_subnets', field + '.pod_subnets', ['10.244.0.0/16'])
    out['service_subnets'] = _cidrs(cluster, 'service_subnets', field + '.service_subnets', ['10.96.0.0/12'])
    out['dns_domain'] = _string(cluster, 'dns_domain', field + '.dns_domain', 'cluster.local')
    if not is_dns_name(out['dns_domain']):
        raise ValidationError(field + '.dns_domain', 'not a valid DNS name')
    out['cert_sans'] = _string_list(cluster, 'cert_sans', field + '.cert_sans')
    for index, san in enumerate(out['cert_sans']):
        if not (_is_ip(san) or is_dns_name(san.lstrip('*.'))):
            raise ValidationError('%s.cert_sans[%d]' % (field, index), 'not an IP address or DNS name')
    out['cni'] = _string(cluster, 'cni', field + '.cni', 'none')
    if out['cni'] not in CNI_NAMES:
        raise ValidationError(field + '.cni', 'must be one of %s' % ', '.join(CNI_NAMES))
    out['cni_urls'] = _string_list(cluster, 'cni_urls', field + '.cni_urls')
    if out['cni'] == 'custom' and not out['cni_urls']:
        raise ValidationError(field + '.cni_urls', 'required when cni is custom')
    if out['cni'] != 'custom' and out['cni_urls']:
        raise ValidationError(field + '.cni_urls', 'only allowed when cni is custom')
    out['proxy_disabled'] = _bool(cluster, 'proxy_disabled', field + '.proxy_disabled', True)
    out['allow_scheduling_on_control_planes'] = _bool(
        cluster, 'allow_scheduling_on_control_planes', field + '.allow_scheduling_on_control_planes', False)
    out['inline_manifests'] = _inline_manifests(cluster, field + '.inline_manifests')
    out['extra_manifests'] = _string_list(cluster, 'extra_manifests', field + '.extra_manifests')
    for index, url in enumerate(out['extra_manifests']):
        if urlsplit(url).scheme not in ('http', 'https') or not urlsplit(url).netloc:
            raise ValidationError('%s.extra_manifests[%d]' % (field, index), 'must be an http(s) URL')
    out['vip'] = _string(cluster, 'vip', field + '.vip')
    if out['vip'] is not None and not _is_ip(out['vip']):
        raise ValidationError(field + '.vip', 'must be an IP address')
    out['network_link'] = _string(cluster, 'network_link', field + '.network_link', DEFAULT_NETWORK_LINK)
    out['installer_image'] = _string(cluster, 'installer_image', field + '.installer_image')
    out['installer_schematic'] = _string(cluster, 'installer_schematic', field + '.installer_schematic')
    if out['installer_image'] and out['installer_schematic']:
        raise ValidationError(field + '.installer_schematic', 'give installer_image or installer_schematic, not both')
    if out['installer_image'] and not _IMAGE_RE.match(out['installer_image']):
        raise ValidationError(field + '.installer_image', 'not a container image reference')
    if out['installer_schematic'] and not _SCHEMATIC_RE.match(out['installer_schematic']):
        raise ValidationError(field + '.installer_schematic', 'must be an Image Factory schematic id (64 hex digits)')
    out['install_wipe'] = _bool(cluster, 'install_wipe', field + '.install_wipe', False)
    port = cluster.get('kubeprism_port', KUBEPRISM_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValidationError(field + '.kubeprism_port', 'must be a TCP port number')
    out['kubeprism_port'] = port
    out['forward_kube_dns_to_host'] = _bool(cluster, 'forward_kube_dns_to_host', field + '.forward_kube_dns_to_host', True)
    out['discovery'] = _bool(cluster, 'discovery', field + '.discovery', True)
    return out


def normalize_node(node, field='node'):
    """Validated node values with defaults (a new dict).

    Keys: hostname (optional; else Talos picks a stable one), install_disk (/dev/sda), ip +
    prefix (+ gateway) for a static address, link (defaults to the cluster's network_link).
    """
    node = {} if node is None else node
    if not isinstance(node, dict):
        raise ValidationError(field, 'must be a mapping, got %s' % type(node).__name__)
    _reject_unknown(node, _NODE_KEYS, field)
    out = {}
    hostname = _string(node, 'hostname', field + '.hostname')
    if hostname is not None and (len(hostname) > 253 or not all(_LABEL_RE.match(part) for part in hostname.split('.'))):
        raise ValidationError(field + '.hostname', 'must be lower-case DNS labels (letters, digits, "-")')
    out['hostname'] = hostname
    out['install_disk'] = _string(node, 'install_disk', field + '.install_disk', DEFAULT_INSTALL_DISK)
    if not out['install_disk'].startswith('/dev/'):
        raise ValidationError(field + '.install_disk', 'must be a device path under /dev/')
    out['ip'] = _string(node, 'ip', field + '.ip')
    out['prefix'] = node.get('prefix')
    out['gateway'] = _string(node, 'gateway', field + '.gateway')
    out['link'] = _string(node, 'link', field + '.link')
    if out['ip'] is not None:
        if not _is_ip(out['ip']):
            raise ValidationError(field + '.ip', 'must be an IP address')
        bits = ipaddress.ip_address(out['ip']).max_prefixlen
        prefix = out['prefix']
        if isinstance(prefix, str) and prefix.isdigit():
            prefix = int(prefix)
        if isinstance(prefix, bool) or not isinstance(prefix, int) or not 0 < prefix <= bits:
            raise ValidationError(field + '.prefix', 'required with ip: a prefix length 1-%d' % bits)
        out['prefix'] = prefix
        if out['gateway'] is not None:
            if not _is_ip(out['gateway']):
                raise ValidationError(field + '.gateway', 'must be an IP address')
            if ipaddress.ip_address(out['gateway']) not in ipaddress.ip_network('%s/%d' % (out['ip'], prefix), strict=False):
                raise ValidationError(field + '.gateway', 'is not inside %s/%d' % (out['ip'], prefix))
    elif out['prefix'] is not None or out['gateway'] is not None:
        raise ValidationError(field + '.ip', 'required when prefix or gateway is given')
    return out


# --- rendering ----------------------------------------------------------------------------------

def _pod_security_admission():
    return [{
        'name': 'PodSecurity',
        'configuration': {
            'apiVersion': 'pod-security.admission.config.k8s.io/v1alpha1',
            'defaults': {
                'audit': 'restricted', 'audit-version': 'latest',
                'enforce': 'baseline', 'enforce-version': 'latest',
                'warn': 'restricted', 'warn-version': 'latest',
            },
            'exemptions': {'namespaces': ['kube-system'], 'runtimeClasses': [], 'usernames': []},
            'kind': 'PodSecurityConfiguration',
        },
    }]


def _unique(items):
    seen = set()
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def installer_image(cluster, talos_version):
    """The install image: cluster.installer_image, an Image Factory image, or ghcr.io's."""
    if cluster.get('installer_image'):
        return cluster['installer_image']
    if cluster.get('installer_schematic'):
        return 'factory.talos.dev/installer/%s:%s' % (cluster['installer_schematic'], talos_version)
    return 'ghcr.io/siderolabs/installer:%s' % talos_version


def build_documents(bundle, machine_type, cluster, node=None, talos_version=DEFAULT_TALOS_VERSION,
                    kubernetes_version=None):
    """The unpatched config documents (list of dicts) for one node.

    bundle: secrets.SecretsBundle; machine_type: 'controlplane' or 'worker'; cluster/node:
    value dicts (see normalize_cluster / normalize_node); talos_version: Talos tag (contract
    1.12 or 1.13); kubernetes_version: defaults per contract.
    """
    if machine_type not in MACHINE_TYPES:
        raise ValidationError('machine_type', 'must be controlplane or worker, got %r' % (machine_type,))
    contract = contract_of(talos_version)
    k8s = normalize_kubernetes_version(kubernetes_version, contract)
    cluster = normalize_cluster(cluster)
    node = normalize_node(node)
    control_plane = machine_type == 'controlplane'

    os_crt, os_key = bundle.ca('os')
    k8s_crt, k8s_key = bundle.ca('k8s')
    b64 = pki.b64encode_pem

    machine = {
        'type': machine_type,
        'token': bundle.trustd_token,
        'ca': {'crt': b64(os_crt), 'key': b64(os_key) if control_plane else ''},
        'certSANs': list(cluster['cert_sans']),
        'kubelet': {
            'image': 'ghcr.io/siderolabs/kubelet:v%s' % k8s,
            'defaultRuntimeSeccompProfileEnabled': True,
            'disableManifestsDirectory': True,
        },
    }
    if contract == '1.12':
        # Contracts up to 1.12 still write the legacy (empty) network section.
        machine['network'] = {}
    machine['install'] = {
        'disk': node['install_disk'],
        'image': installer_image(cluster, talos_version),
        'wipe': cluster['install_wipe'],
        'grubUseUKICmdline': True,
    }
    machine['features'] = {
        'diskQuotaSupport': True,
        'kubePrism': {'enabled': True, 'port': cluster['kubeprism_port']},
        'hostDNS': {'enabled': True, 'forwardKubeDNSToHost': cluster['forward_kube_dns_to_host']},
    }
    if control_plane:
        machine['nodeLabels'] = {'node.kubernetes.io/exclude-from-external-load-balancers': ''}

    network = {}
    network['cni'] = {'name': cluster['cni']}
    if cluster['cni'] == 'custom':
        network['cni']['urls'] = list(cluster['cni_urls'])
    network['dnsDomain'] = cluster['dns_domain']
    network['podSubnets'] = list(cluster['pod_subnets'])
    network['serviceSubnets'] = list(cluster['service_subnets'])

    cluster_doc = {
        'id': bundle.cluster_id,
        'secret': bundle.cluster_secret,
        'controlPlane': {'endpoint': cluster['endpoint']},
        'clusterName': cluster['name'],
        'network': network,
        'token': bundle.bootstrap_token,
    }
    if control_plane:
        if bundle.aescbc_secret:
            cluster_doc['aescbcEncryptionSecret'] = bundle.aescbc_secret
        else:
            cluster_doc['secretboxEncryptionSecret'] = bundle.secretbox_secret
    cluster_doc['ca'] = {'crt': b64(k8s_crt), 'key': b64(k8s_key) if control_plane else ''}
    if control_plane:
        aggregator_crt, aggregator_key = bundle.ca('k8saggregator')
        etcd_crt, etcd_key = bundle.ca('etcd')
        cluster_doc['aggregatorCA'] = {'crt': b64(aggregator_crt), 'key': b64(aggregator_key)}
        cluster_doc['serviceAccount'] = {'key': b64(bundle.certs['k8sserviceaccount']['key'])}
        cluster_doc['apiServer'] = {
            'image': 'registry.k8s.io/kube-apiserver:v%s' % k8s,
            'certSANs': _unique([endpoint_host(cluster['endpoint'])] + list(cluster['cert_sans'])),
            'admissionControl': _pod_security_admission(),
            'auditPolicy': {'apiVersion': 'audit.k8s.io/v1', 'kind': 'Policy', 'rules': [{'level': 'Metadata'}]},
        }
        cluster_doc['controllerManager'] = {'image': 'registry.k8s.io/kube-controller-manager:v%s' % k8s}
        proxy = {}
        if cluster['proxy_disabled']:
            proxy['disabled'] = True
        proxy['image'] = 'registry.k8s.io/kube-proxy:v%s' % k8s
        cluster_doc['proxy'] = proxy
        cluster_doc['scheduler'] = {'image': 'registry.k8s.io/kube-scheduler:v%s' % k8s}
    cluster_doc['discovery'] = {
        'enabled': cluster['discovery'],
        'registries': {'kubernetes': {'disabled': True}, 'service': {}},
    }
    if control_plane:
        cluster_doc['etcd'] = {'ca': {'crt': b64(etcd_crt), 'key': b64(etcd_key)}}
        if cluster['extra_manifests']:
            cluster_doc['extraManifests'] = list(cluster['extra_manifests'])
        if cluster['inline_manifests']:
            cluster_doc['inlineManifests'] = copy.deepcopy(cluster['inline_manifests'])
        if cluster['allow_scheduling_on_control_planes']:
            cluster_doc['allowSchedulingOnControlPlanes'] = True

    documents = [{'version': 'v1alpha1', 'debug': False, 'persist': True, 'machine': machine, 'cluster': cluster_doc}]
    if node['hostname']:
        documents.append({'apiVersion': 'v1alpha1', 'kind': 'HostnameConfig', 'hostname': node['hostname']})
    else:
        documents.append({'apiVersion': 'v1alpha1', 'kind': 'HostnameConfig', 'auto': 'stable'})
    link = node['link'] or cluster['network_link']
    if node['ip']:
        link_config = {'apiVersion': 'v1alpha1', 'kind': 'LinkConfig', 'name': link,
                       'addresses': [{'address': '%s/%d' % (node['ip'], node['prefix'])}]}
        if node['gateway']:
            link_config['routes'] = [{'gateway': node['gateway']}]
        documents.append(link_config)
    if control_plane and cluster['vip']:
        # Both contracts register the document (siderolabs/talos v1.12.11 and v1.13.9
        # pkg/machinery/config/types/network/layer2_vip.go:21-32; name and link required, :109-117); the VIP
        # controller reads it next to the legacy interfaces[].vip (internal/app/machined/pkg/controllers/network/
        # operator_vip_config.go:150-158 at v1.13.9).
        documents.append({'apiVersion': 'v1alpha1', 'kind': 'Layer2VIPConfig', 'name': cluster['vip'], 'link': link})
    return documents


def render_machine_config(bundle, machine_type, cluster, node=None, patches=None,
                          talos_version=DEFAULT_TALOS_VERSION, kubernetes_version=None, requires_install=True):
    """The machine config text (multi-document YAML) for one node, patched and validated.

    patches: None or a dict with optional keys 'cluster', 'group', 'host', each a list of
    patch values (patch.parse_patch); they are applied in that order. Raises
    ValidationError naming the input field, the patch, or the config path that is wrong.
    Same inputs -> same text.
    """
    documents = build_documents(bundle, machine_type, cluster, node, talos_version, kubernetes_version)
    patches = patches or {}
    if not isinstance(patches, dict):
        raise ValidationError('patches', 'must be a mapping with cluster, group and host lists')
    for key in patches:
        if key not in talos_patch.LEVELS:
            raise ValidationError('patches.%s' % key, 'unknown patch level (expected cluster, group or host)')
    parsed = talos_patch.parse_patch_levels(patches.get('cluster'), patches.get('group'), patches.get('host'))
    documents = talos_patch.apply_patches(documents, parsed)
    validate_documents(documents, contract_of(talos_version), requires_install=requires_install)
    return talosyaml.dump_all(documents)


def parse_machine_config(text, field='machine_config'):
    """Documents (list of dicts) of a machine config text; ValidationError if not YAML mappings."""
    documents = talosyaml.load_all(text, field)
    for index, document in enumerate(documents):
        if not isinstance(document, dict):
            raise ValidationError(field, 'document %d is not a mapping' % index)
    return documents


# --- validation (Talos's own rules, v1alpha1_validation.go as summarized in facts 5.2) ----------

def _get(document, *path):
    node = document
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _pem_problem(value, expected_label):
    """Why a config field is not base64 of a PEM block with that label (None when fine)."""
    if not isinstance(value, str) or not value:
        return 'missing'
    try:
        pem = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return 'not valid base64'
    labels = [label for label, dummy in pem_blocks(pem)]
    if not labels:
        return 'not base64 of a PEM block'
    if expected_label == 'PRIVATE KEY':
        if not all(label.endswith('PRIVATE KEY') for label in labels):
            return 'not base64 of a PEM private key'
    elif not all(label == expected_label for label in labels):
        return 'not base64 of a PEM %s' % expected_label.lower()
    return None


def _check_url(value):
    if not isinstance(value, str):
        return False
    parts = urlsplit(value)
    try:
        parts.port
    except ValueError:
        return False
    return parts.scheme in ('http', 'https') and bool(parts.hostname)


def _has_vip(v1alpha1_document):
    interfaces = _get(v1alpha1_document, 'machine', 'network', 'interfaces') or []
    for interface in interfaces if isinstance(interfaces, list) else []:
        if not isinstance(interface, dict):
            continue
        if interface.get('vip'):
            return True
        for vlan in interface.get('vlans') or []:
            if isinstance(vlan, dict) and vlan.get('vip'):
                return True
    return False


def _v1alpha1_problems(document, add, requires_install):
    if document.get('version') != 'v1alpha1':
        add('version', 'must be v1alpha1')
    if document.get('persist') is False:
        add('persist', 'must not be false')
    machine = document.get('machine')
    cluster = document.get('cluster')
    if not isinstance(machine, dict):
        add('machine', 'missing')
        machine = {}
    if not isinstance(cluster, dict):
        add('cluster', 'missing')
        cluster = {}
    machine_type = machine.get('type')
    if machine_type not in ('controlplane', 'worker', 'init'):
        add('machine.type', 'must be controlplane, worker or init')
    endpoint = _get(cluster, 'controlPlane', 'endpoint')
    if not _check_url(endpoint):
        add('cluster.controlPlane.endpoint', 'must be a valid http(s) URL')

    ca = machine.get('ca') if isinstance(machine.get('ca'), dict) else {}
    accepted = machine.get('acceptedCAs')
    if not ca.get('crt') and not accepted:
        add('machine.ca', 'machine.ca or machine.acceptedCAs is required')
    elif ca.get('crt'):
        problem = _pem_problem(ca.get('crt'), 'CERTIFICATE')
        if problem:
            add('machine.ca.crt', problem)

    dns_domain = _get(cluster, 'network', 'dnsDomain')
    if dns_domain not in (None, '') and not is_dns_name(dns_domain):
        add('cluster.network.dnsDomain', 'not a valid DNS name')
    cni = _get(cluster, 'network', 'cni')
    if isinstance(cni, dict):
        urls = cni.get('urls') or []
        if cni.get('name') not in CNI_NAMES:
            add('cluster.network.cni.name', 'must be one of %s' % ', '.join(CNI_NAMES))
        elif cni.get('name') == 'custom' and not urls:
            add('cluster.network.cni.urls', 'required for the custom CNI')
        elif cni.get('name') != 'custom' and urls:
            add('cluster.network.cni.urls', 'must be empty for the %s CNI' % cni.get('name'))
    names = set()
    for index, manifest in enumerate(cluster.get('inlineManifests') or []):
        name = manifest.get('name') if isinstance(manifest, dict) else None
        if not name:
            add('cluster.inlineManifests[%d].name' % index, 'must not be empty')
        elif name in names:
            add('cluster.inlineManifests[%d].name' % index, 'duplicate name %r' % name)
        names.add(name)
    if _get(cluster, 'discovery', 'enabled'):
        if not cluster.get('id'):
            add('cluster.id', 'required when discovery is enabled')
        if not cluster.get('secret'):
            add('cluster.secret', 'required when discovery is enabled')

    if machine_type in ('controlplane', 'init'):
        if not ca.get('crt') or not ca.get('key'):
            add('machine.ca', 'a control plane needs both crt and key')
        elif _pem_problem(ca.get('key'), 'PRIVATE KEY'):
            add('machine.ca.key', _pem_problem(ca.get('key'), 'PRIVATE KEY'))
        for path in (('ca', 'crt'), ('ca', 'key'), ('aggregatorCA', 'crt'), ('aggregatorCA', 'key'),
                     ('serviceAccount', 'key'), ('etcd', 'ca', 'crt'), ('etcd', 'ca', 'key')):
            value = _get(cluster, *path)
            if value is None:
                continue
            problem = _pem_problem(value, 'CERTIFICATE' if path[-1] == 'crt' else 'PRIVATE KEY')
            if problem:
                add('cluster.' + '.'.join(path), problem)
    elif machine_type == 'worker':
        if ca.get('key'):
            add('machine.ca.key', 'must be empty on a worker')
        if _get(cluster, 'ca', 'key'):
            add('cluster.ca.key', 'must be empty on a worker')
        if cluster.get('etcd'):
            add('cluster.etcd', 'not allowed on a worker')
        if _has_vip(document):
            add('machine.network.interfaces', 'a worker cannot have a VIP')

    if requires_install:
        install = machine.get('install') if isinstance(machine.get('install'), dict) else {}
        if not install.get('disk') and not install.get('diskSelector'):
            add('machine.install', 'disk or diskSelector is required to install')


def _typed_problems(document, add, machine_type):
    kind = document.get('kind')
    if kind == 'HostnameConfig':
        auto = document.get('auto')
        hostname = document.get('hostname')
        if auto not in (None, 'off', 'stable'):
            add('auto', 'must be stable or off')
        if (auto in (None, 'off')) and not hostname:
            add('auto', "either 'auto' or 'hostname' must be set")
        if auto == 'stable' and hostname:
            add('hostname', "'auto' and 'hostname' cannot be set at the same time")
        if hostname and (not isinstance(hostname, str) or len(hostname) > 253
                         or not _DNS_LABEL_RE.match(hostname.split('.')[0])):
            add('hostname', 'not a valid host name')
    elif kind == 'Layer2VIPConfig':
        if not _is_ip(document.get('name')):
            add('name', 'must be an IP address')
        if not document.get('link'):
            add('link', 'required')
        if machine_type == 'worker':
            add('kind', 'a worker cannot have a VIP')
    elif kind == 'HCloudVIPConfig' and machine_type == 'worker':
        add('kind', 'a worker cannot have a VIP')
    elif kind == 'LinkConfig':
        if not document.get('name'):
            add('name', 'required')
        for index, address in enumerate(document.get('addresses') or []):
            value = address.get('address') if isinstance(address, dict) else None
            try:
                ipaddress.ip_interface(value)
                if '/' not in value:
                    raise ValueError(value)
            except (ValueError, TypeError):
                add('addresses[%d].address' % index, 'must be an address with prefix, like 10.0.0.2/24')


def config_problems(documents, contract, requires_install=True):
    """Every reason Talos would refuse these documents, as a list of (path, reason).

    documents: list of dicts (or the config text). contract: '1.12' or '1.13'. A path is
    dotted within the v1alpha1 document (`machine.ca.key`) or prefixed by the document
    (`HostnameConfig.hostname`). requires_install: the node still has to install (metal),
    so machine.install.disk or diskSelector is required.
    """
    if contract not in SUPPORTED_CONTRACTS:
        raise ValidationError('contract', 'must be one of %s' % ', '.join(SUPPORTED_CONTRACTS))
    if isinstance(documents, (str, bytes)):
        documents = parse_machine_config(documents)
    problems = []
    v1alpha1 = [doc for doc in documents if talos_patch.is_v1alpha1(doc)]
    if len(v1alpha1) != 1:
        problems.append(('v1alpha1', 'exactly one v1alpha1 document is required, found %d' % len(v1alpha1)))
    machine_type = _get(v1alpha1[0], 'machine', 'type') if v1alpha1 else None
    if v1alpha1:
        _v1alpha1_problems(v1alpha1[0], lambda path, reason: problems.append((path, reason)), requires_install)
    seen = set()
    hostname_documents = 0
    for index, document in enumerate(documents):
        if not isinstance(document, dict):
            problems.append(('document %d' % index, 'must be a mapping'))
            continue
        if talos_patch.is_v1alpha1(document):
            continue
        label = talos_patch.describe_document(document)
        if not isinstance(document.get('apiVersion'), str) or not isinstance(document.get('kind'), str):
            problems.append(('document %d' % index, 'a typed document needs apiVersion and kind'))
            continue
        identity = talos_patch.document_identity(document)
        if identity in seen:
            problems.append((label, 'duplicate document'))
        seen.add(identity)
        if document['kind'] == 'HostnameConfig':
            hostname_documents += 1
        _typed_problems(document, lambda path, reason, label=label: problems.append(('%s.%s' % (label, path), reason)),
                        machine_type)
    if hostname_documents > 1:
        problems.append(('HostnameConfig', 'only one HostnameConfig document is allowed'))
    return problems


def validate_documents(documents, contract, requires_install=True):
    """Raise ValidationError for the first problem (all of them in details['problems'])."""
    problems = config_problems(documents, contract, requires_install)
    if problems:
        path, reason = problems[0]
        more = ' (and %d more problems)' % (len(problems) - 1) if len(problems) > 1 else ''
        raise ValidationError('machine_config.' + path, reason + more,
                              problems=['%s: %s' % (p, r) for p, r in problems])
    return documents


def validate_machine_config(text, contract, requires_install=True):
    """Parse and check a machine config text against Talos's rules for `contract`.

    Returns the documents (list of dicts); raises ValidationError naming the first wrong
    field, with every problem listed in details['problems'].
    """
    return validate_documents(parse_machine_config(text), contract, requires_install)


# --- JSON schema (published by Talos; used by the tests and anyone who has jsonschema) ----------

def strip_nodoc(document, contract):
    """A copy of a v1alpha1 document without the keys the Talos schema leaves out (nodoc)."""
    document = copy.deepcopy(document)
    for path in NODOC_PATHS[contract]:
        node = document
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return document


def _schema_definition(schema, document):
    if talos_patch.is_v1alpha1(document):
        return 'v1alpha1.Config'
    for name, definition in schema.get('$defs', {}).items():
        kind = definition.get('properties', {}).get('kind', {})
        if document.get('kind') in kind.get('enum', []):
            return name
    return None


def schema_problems(documents, schema, contract):
    """Schema violations of each document as a list of (document, path, message).

    schema: the parsed Talos config.schema.json of the contract's release. The v1alpha1
    document is checked without its nodoc keys (see NODOC_PATHS). Needs jsonschema.
    """
    # Without jsonschema this raises ImportError, which says what is missing.
    import jsonschema  # pylint: disable=import-outside-toplevel
    if isinstance(documents, (str, bytes)):
        documents = parse_machine_config(documents)
    problems = []
    for document in documents:
        label = talos_patch.describe_document(document)
        name = _schema_definition(schema, document)
        if name is None:
            problems.append((label, '', 'no schema definition for kind %r' % document.get('kind')))
            continue
        if talos_patch.is_v1alpha1(document):
            document = strip_nodoc(document, contract)
        validator = jsonschema.Draft202012Validator({'$ref': '#/$defs/%s' % name, '$defs': schema['$defs']})
        for error in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path)):
            path = '.'.join(str(part) for part in error.absolute_path)
            problems.append((label, path, error.message))
    return problems
