# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks across clusters that may one day be meshed. PRIVATE to the collection.

Input: one description per cluster (the values of its inventory): name, Cilium cluster id, pod
and service CIDRs, Cilium Helm values, LoadBalancer IP pools and requested LoadBalancer IPs
(declared in the inventory, or found in the cluster's GitOps manifests). Output: a list of
problems, each naming the cluster, the field, the value and, for a conflict, the other cluster's
value. Nothing here talks to a cluster.

What is checked (Cilium ClusterMesh and LB IPAM rules, docs/multicluster.md):
- names: unique, Cilium's form (at most 32 characters, lowercase alphanumerics and '-');
- ids: an integer 1-255, unique;
- pod and service CIDRs: valid networks, no overlap between any two of them across clusters,
  nor between a cluster's own pod and service CIDRs;
- Cilium's ipv4NativeRoutingCIDR equals the cluster's (Talos) pod subnet; native routing needs one;
- every requested LoadBalancer IP is inside an enabled pool of its cluster (and selected by the
  pool's serviceSelector when it has matchLabels); pools do not overlap, across clusters or
  within one, nor the cluster's pod or service CIDR.
"""

from __future__ import annotations

import ipaddress
import os
import re

try:
    import yaml
    HAS_YAML = True
    YAML_IMPORT_ERROR = None
except ImportError as _exc:  # pragma: no cover - PyYAML ships with ansible-core
    HAS_YAML = False
    YAML_IMPORT_ERROR = _exc

from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError

NAME_RE = re.compile(r'^[a-z0-9](?:[-a-z0-9]{0,30}[a-z0-9])?$')
LB_IP_ANNOTATIONS = ('lbipam.cilium.io/ips', 'io.cilium/lb-ipam-ips')
POOL_KIND = 'CiliumLoadBalancerIPPool'
SELECTOR_SPECIAL_KEYS = {'io.kubernetes.service.namespace': 'namespace', 'io.kubernetes.service.name': 'name'}
ID_MIN, ID_MAX = 1, 255


class Problem(dict):
    """One finding: cluster, check, field, value, conflict (the other side, or None), message."""

    def __init__(self, cluster, check, field, value, message, conflict=None):
        super().__init__(cluster=cluster, check=check, field=field, value=value, conflict=conflict, message=message)


def _label(cluster):
    """How a message names a cluster: its name, and where its values come from."""
    where = cluster.get('inventory')
    return '%s (%s)' % (cluster['name'], where) if where else str(cluster['name'])


def _network(text):
    return ipaddress.ip_network(str(text).strip(), strict=True)


def _range_of(block, field):
    """(first, last) addresses of a pool block: {cidr}, {start, stop} or a text CIDR / 'a-b'."""
    if isinstance(block, str):
        text = block.strip()
        if '-' in text:
            start, stop = text.split('-', 1)
            block = {'start': start.strip(), 'stop': stop.strip()}
        else:
            block = {'cidr': text}
    if not isinstance(block, dict):
        raise ValidationError(field, 'a block is a CIDR or a start/stop pair, got %r' % (block,))
    if block.get('cidr'):
        try:
            network = ipaddress.ip_network(str(block['cidr']).strip(), strict=False)
        except ValueError as exc:
            raise ValidationError(field, 'cidr %r is not a network: %s' % (block['cidr'], exc))
        return network.network_address, network.broadcast_address, str(network)
    if block.get('start'):
        try:
            start = ipaddress.ip_address(str(block['start']).strip())
            stop = ipaddress.ip_address(str(block.get('stop') or block['start']).strip())
        except ValueError as exc:
            raise ValidationError(field, 'start/stop %r: %s' % (block, exc))
        if start.version != stop.version or stop < start:
            raise ValidationError(field, 'stop %s is before start %s' % (stop, start))
        return start, stop, '%s-%s' % (start, stop)
    raise ValidationError(field, 'a block needs cidr, or start (and stop), got %r' % (block,))


def _overlap(first, second):
    return first[0].version == second[0].version and first[0] <= second[1] and second[0] <= first[1]


def _ips(value, field):
    if isinstance(value, str):
        value = value.split(',')
    if not isinstance(value, (list, tuple)):
        raise ValidationError(field, 'expected a list of IP addresses or a comma-separated text, got %r' % (value,))
    addresses = []
    for item in value:
        text = str(item).strip()
        if not text:
            continue
        try:
            addresses.append(ipaddress.ip_address(text))
        except ValueError:
            raise ValidationError(field, '%r is not an IP address' % text)
    return addresses


# -- reading manifests ------------------------------------------------------------------------------

def _documents(path):
    """Every mapping document of every *.yaml/*.yml under path (a file or a folder); unparsable files skipped."""
    files = []
    if os.path.isfile(path):
        files = [path]
    elif os.path.isdir(path):
        for directory, dirs, names in os.walk(path):
            dirs[:] = sorted(name for name in dirs if not name.startswith('.'))
            files.extend(os.path.join(directory, name) for name in sorted(names) if name.endswith(('.yaml', '.yml')))
    else:
        raise ValidationError('manifest_paths', '%s does not exist' % path)
    for filename in files:
        try:
            with open(filename, 'rb') as stream:
                documents = list(yaml.safe_load_all(stream))
        except (yaml.YAMLError, UnicodeDecodeError):
            continue   # Helm templates and the like are not manifests
        for document in documents:
            if isinstance(document, dict):
                yield filename, document


def from_manifests(paths):
    """(pools, requests) found in the manifests: CiliumLoadBalancerIPPool objects and annotated Services."""
    pools = []
    requests = []
    for path in paths:
        for filename, doc in _documents(path):
            kind = doc.get('kind')
            meta = doc.get('metadata') or {}
            spec = doc.get('spec') or {}
            if kind == POOL_KIND and str(doc.get('apiVersion', '')).startswith('cilium.io/'):
                blocks = spec.get('blocks') or spec.get('cidrs') or []
                pools.append({'name': meta.get('name'), 'blocks': blocks, 'disabled': bool(spec.get('disabled')),
                              'service_selector': spec.get('serviceSelector'), 'source': filename})
            elif kind == 'Service' and doc.get('apiVersion') == 'v1':
                annotations = meta.get('annotations') or {}
                wanted = [annotations[key] for key in LB_IP_ANNOTATIONS if annotations.get(key)]
                if spec.get('loadBalancerIP'):
                    wanted.append(spec['loadBalancerIP'])
                if wanted:
                    requests.append({'service': '%s/%s' % (meta.get('namespace') or 'default', meta.get('name')),
                                     'ips': ','.join(str(item) for item in wanted), 'labels': meta.get('labels') or {},
                                     'source': filename})
    return pools, requests


# -- one cluster ------------------------------------------------------------------------------------

def normalize(raw, index):
    """A cluster's checked values, and the problems found in it alone. Raises ValidationError on bad shapes."""
    field = 'clusters[%d]' % index
    if not isinstance(raw, dict):
        raise ValidationError(field, 'expected a dict of cluster values')
    name = raw.get('name')
    cluster = {'name': str(name) if name not in (None, '') else '#%d' % (index + 1), 'inventory': raw.get('inventory')}
    problems = []

    def problem(check, key, value, message, conflict=None):
        problems.append(Problem(cluster['name'], check, key, value, '%s: %s' % (_label(cluster), message), conflict))

    if name in (None, ''):
        problem('name', 'cluster_name', None, 'cluster_name is not set')
    elif not NAME_RE.match(str(name)):
        problem('name', 'cluster_name', name, 'cluster_name %r is not a Cilium cluster name (at most 32 characters: '
                'lowercase letters, digits and "-", starting and ending with a letter or digit)' % name)

    cilium = raw.get('cilium_values') or {}
    if not isinstance(cilium, dict):
        raise ValidationError(field + '.cilium_values', 'expected the Cilium Helm values as a dict')
    cilium_cluster = cilium.get('cluster') if isinstance(cilium.get('cluster'), dict) else {}
    raw_id = raw.get('id')
    if cilium_cluster.get('id') is not None:
        if raw_id is not None and str(cilium_cluster['id']) != str(raw_id):
            problem('id', 'cilium_values.cluster.id', cilium_cluster['id'],
                    'Cilium values set cluster.id %s but cluster_id is %s' % (cilium_cluster['id'], raw_id), raw_id)
        raw_id = cilium_cluster['id'] if raw_id is None else raw_id
    if cilium_cluster.get('name') and name and str(cilium_cluster['name']) != str(name):
        problem('name', 'cilium_values.cluster.name', cilium_cluster['name'],
                'Cilium values set cluster.name %r but cluster_name is %r' % (cilium_cluster['name'], name), name)
    cluster['id'] = None
    if raw_id is None or raw_id == '':
        problem('id', 'cluster_id', None, 'cluster_id (the Cilium cluster.id) is not set')
    else:
        try:
            if isinstance(raw_id, bool):
                raise ValueError
            number = int(str(raw_id).strip())
        except ValueError:
            problem('id', 'cluster_id', raw_id, 'cluster_id %r is not an integer' % (raw_id,))
        else:
            cluster['id'] = number
            if not ID_MIN <= number <= ID_MAX:
                problem('id', 'cluster_id', number, 'cluster_id %d is outside %d-%d (Cilium cluster.id of a meshable cluster)'
                        % (number, ID_MIN, ID_MAX))

    for key, label in (('pod_cidr', 'cluster_pod_cidr'), ('service_cidr', 'cluster_service_cidr')):
        cluster[key] = None
        value = raw.get(key)
        if value in (None, ''):
            problem('cidr', label, None, '%s is not set' % label)
            continue
        try:
            cluster[key] = _network(value)
        except ValueError as exc:
            problem('cidr', label, value, '%s %r is not a network: %s' % (label, value, exc))
    if cluster['pod_cidr'] is not None and cluster['service_cidr'] is not None and \
            cluster['pod_cidr'].overlaps(cluster['service_cidr']):
        problem('cidr', 'cluster_service_cidr', str(cluster['service_cidr']), 'cluster_service_cidr %s overlaps its own '
                'cluster_pod_cidr %s' % (cluster['service_cidr'], cluster['pod_cidr']), str(cluster['pod_cidr']))

    routing_mode = str(cilium.get('routingMode') or ('native' if cilium.get('tunnel') == 'disabled' else 'tunnel'))
    native = cilium.get('ipv4NativeRoutingCIDR')
    cluster['routing_mode'] = routing_mode
    cluster['native_routing_cidr'] = native
    if native not in (None, ''):
        try:
            native_network = _network(native)
        except ValueError as exc:
            problem('native_routing', 'cilium_values.ipv4NativeRoutingCIDR', native,
                    'ipv4NativeRoutingCIDR %r is not a network: %s' % (native, exc))
        else:
            if cluster['pod_cidr'] is not None and native_network != cluster['pod_cidr']:
                problem('native_routing', 'cilium_values.ipv4NativeRoutingCIDR', str(native_network),
                        'Cilium ipv4NativeRoutingCIDR %s is not the Talos pod subnet cluster_pod_cidr %s'
                        % (native_network, cluster['pod_cidr']), str(cluster['pod_cidr']))
    elif routing_mode == 'native':
        problem('native_routing', 'cilium_values.ipv4NativeRoutingCIDR', None,
                'Cilium routingMode is native but ipv4NativeRoutingCIDR is not set (Cilium does not start); '
                'set it to the pod subnet %s' % (cluster['pod_cidr'] or 'cluster_pod_cidr'))

    pools = []
    declared = list(raw.get('lb_pools') or [])
    manifest_pools, manifest_requests = from_manifests(list(raw.get('manifest_paths') or []))
    for number, pool in enumerate(declared + manifest_pools):
        pool_field = '%s.lb_pools[%d]' % (field, number)
        if isinstance(pool, str):
            pool = {'name': 'cluster_lb_pool', 'blocks': [pool]}
        if not isinstance(pool, dict):
            raise ValidationError(pool_field, 'a pool is a CIDR text or a dict with name and blocks')
        blocks = pool.get('blocks')
        if isinstance(blocks, str) or isinstance(blocks, dict):
            blocks = [blocks]
        entry = {'name': str(pool.get('name') or 'pool %d' % (number + 1)), 'disabled': bool(pool.get('disabled')),
                 'selector': pool.get('service_selector') or pool.get('serviceSelector'), 'source': pool.get('source'),
                 'ranges': [_range_of(block, pool_field) for block in blocks or []]}
        if not entry['ranges']:
            problem('lb_pool', 'lb_pools', entry['name'], 'LoadBalancer IP pool %s has no blocks' % entry['name'])
        for block in blocks or []:
            text = block if isinstance(block, str) else (block.get('cidr') if isinstance(block, dict) else None)
            if text and '/' in str(text) and '-' not in str(text):
                try:
                    _network(text)
                except ValueError:
                    network = ipaddress.ip_network(str(text).strip(), strict=False)
                    problem('lb_pool', 'lb_pools', str(text).strip(), 'LoadBalancer IP pool %s block %s has host bits set: '
                            'as a CIDR it is %s (%s-%s); write that, or a start-stop range' % (
                                entry['name'], str(text).strip(), network, network.network_address,
                                network.broadcast_address), str(network))
        pools.append(entry)
    cluster['lb_pools'] = pools

    requests = []
    for number, request in enumerate(list(raw.get('lb_ips') or []) + manifest_requests):
        request_field = '%s.lb_ips[%d]' % (field, number)
        if not isinstance(request, dict) or not request.get('service'):
            raise ValidationError(request_field, 'expected a dict with service and ips')
        requests.append({'service': str(request['service']), 'labels': request.get('labels') or {},
                         'ips': _ips(request.get('ips'), request_field), 'source': request.get('source')})
    cluster['lb_ips'] = requests
    _lb_problems(cluster, problem)
    return cluster, problems


def _selects(selector, request):
    """Whether a pool's serviceSelector selects the Service (matchLabels only; None when it cannot tell)."""
    if not selector:
        return True
    if selector.get('matchExpressions'):
        return None
    namespace, _slash, name = request['service'].partition('/')
    facts = {'namespace': namespace, 'name': name}
    for key, wanted in (selector.get('matchLabels') or {}).items():
        actual = facts[SELECTOR_SPECIAL_KEYS[key]] if key in SELECTOR_SPECIAL_KEYS else request['labels'].get(key)
        if str(actual) != str(wanted):
            return False
    return True


def _lb_problems(cluster, problem):
    """Report (through problem()) requested IPs outside the pools, and overlapping pools, of one cluster."""
    pools = cluster['lb_pools']
    enabled = [pool for pool in pools if not pool['disabled']]
    for request in cluster['lb_ips']:
        for address in request['ips']:
            inside = [pool for pool in enabled
                      if any(low.version == address.version and low <= address <= high for low, high, _text in pool['ranges'])]
            if not inside:
                known = ', '.join('%s %s' % (pool['name'], ' '.join(text for _l, _h, text in pool['ranges'])) for pool in enabled)
                problem('lb_ip', 'lb_ips', str(address), 'LoadBalancer IP %s requested by Service %s%s is in no '
                        'CiliumLoadBalancerIPPool of the cluster (%s)' % (
                            address, request['service'], ' (%s)' % request['source'] if request['source'] else '',
                            known or 'no pool is declared'), known or None)
            elif all(_selects(pool['selector'], request) is False for pool in inside):
                problem('lb_ip', 'lb_ips', str(address), 'LoadBalancer IP %s of Service %s is inside pool %s, whose '
                        'serviceSelector does not select that Service' % (address, request['service'], inside[0]['name']),
                        inside[0]['name'])
    for first_index, first in enumerate(enabled):
        for second in enabled[first_index + 1:]:
            for one in first['ranges']:
                for other in second['ranges']:
                    if _overlap(one, other):
                        problem('lb_pool', 'lb_pools', one[2], 'LoadBalancer IP pool %s (%s) overlaps pool %s (%s) of '
                                'the same cluster' % (first['name'], one[2], second['name'], other[2]), other[2])
    for pool in enabled:
        for low, high, text in pool['ranges']:
            for key in ('pod_cidr', 'service_cidr'):
                network = cluster[key]
                if network is not None and _overlap((low, high), (network.network_address, network.broadcast_address)):
                    problem('lb_pool', 'lb_pools', text, 'LoadBalancer IP pool %s (%s) overlaps its own cluster_%s %s'
                            % (pool['name'], text, key, network), str(network))


# -- across clusters --------------------------------------------------------------------------------

def check(raw_clusters):
    """Normalized clusters and every problem found, in the order of the input."""
    if not isinstance(raw_clusters, (list, tuple)) or not raw_clusters:
        raise ValidationError('clusters', 'expected a non-empty list of cluster values')
    clusters = []
    problems = []
    for index, raw in enumerate(raw_clusters):
        cluster, own = normalize(raw, index)
        clusters.append(cluster)
        problems.extend(own)
    for index, cluster in enumerate(clusters):
        for other in clusters[:index]:
            problems.extend(_pair_problems(cluster, other))
    return clusters, problems


def _pair_problems(cluster, other):
    """Conflicts of a cluster with one listed before it; the later cluster carries the problem."""
    found = []

    def problem(check_name, field, value, message, conflict):
        found.append(Problem(cluster['name'], check_name, field, value, '%s: %s' % (_label(cluster), message), conflict))

    if cluster['name'] == other['name']:
        problem('name', 'cluster_name', cluster['name'], 'cluster_name %r is also the name of the cluster of %s'
                % (cluster['name'], other.get('inventory') or 'another entry'), other['name'])
    if cluster['id'] is not None and cluster['id'] == other['id']:
        problem('id', 'cluster_id', cluster['id'], 'cluster_id %d is also the id of cluster %s (Cilium cluster.id '
                'must be unique across clusters)' % (cluster['id'], _label(other)), other['id'])
    for key, label in (('pod_cidr', 'cluster_pod_cidr'), ('service_cidr', 'cluster_service_cidr')):
        mine = cluster[key]
        if mine is None:
            continue
        for other_key, other_label in (('pod_cidr', 'cluster_pod_cidr'), ('service_cidr', 'cluster_service_cidr')):
            theirs = other[other_key]
            if theirs is not None and mine.version == theirs.version and mine.overlaps(theirs):
                problem('cidr', label, str(mine), '%s %s overlaps %s %s of cluster %s'
                        % (label, mine, other_label, theirs, _label(other)), str(theirs))
    for pool in cluster['lb_pools']:
        if pool['disabled']:
            continue
        for other_pool in other['lb_pools']:
            if other_pool['disabled']:
                continue
            for one in pool['ranges']:
                for theirs in other_pool['ranges']:
                    if _overlap(one, theirs):
                        problem('lb_pool', 'lb_pools', one[2], 'LoadBalancer IP pool %s (%s) overlaps pool %s (%s) of '
                                'cluster %s' % (pool['name'], one[2], other_pool['name'], theirs[2], _label(other)), theirs[2])
    return found


def summary(cluster):
    """What the module returns about a cluster (plain values)."""
    return {
        'name': cluster['name'],
        'inventory': cluster.get('inventory'),
        'id': cluster['id'],
        'pod_cidr': None if cluster['pod_cidr'] is None else str(cluster['pod_cidr']),
        'service_cidr': None if cluster['service_cidr'] is None else str(cluster['service_cidr']),
        'routing_mode': cluster['routing_mode'],
        'native_routing_cidr': cluster['native_routing_cidr'],
        'lb_pools': [{'name': pool['name'], 'blocks': [text for _l, _h, text in pool['ranges']], 'disabled': pool['disabled'],
                      'source': pool['source']} for pool in cluster['lb_pools']],
        'lb_ips': [{'service': request['service'], 'ips': [str(ip) for ip in request['ips']], 'source': request['source']}
                   for request in cluster['lb_ips']],
    }
