"""What the API server's registry strategies do on write: defaults, allocations, semantic checks.

Only the defaults and checks the lab's clients can observe are here (the ones kubectl, helm,
kstatus and the collection's gates read), each as the real strategy applies it.
"""

import ipaddress
import re

from .schema import Problem

_DNS1123_SUBDOMAIN = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')
_DNS1123_LABEL = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')
_LABEL_NAME_KINDS = {'namespaces', 'services'}
_PATH_SEGMENT_KINDS = {'clusterroles', 'clusterrolebindings', 'roles', 'rolebindings'}


def check_name(rtype, name):
    """Problems with metadata.name, as ValidateObjectMeta reports them."""
    if not name:
        return [Problem('FieldValueRequired', 'metadata.name', 'Required value: name or generateName is required')]
    if rtype.plural in _PATH_SEGMENT_KINDS:
        if name in ('.', '..') or '/' in name or '%' in name:
            return [Problem('FieldValueInvalid', 'metadata.name', 'Invalid value: "%s": may not contain \'/\' or \'%%\'' % name)]
        return []
    if rtype.plural in _LABEL_NAME_KINDS:
        if len(name) > 63 or not _DNS1123_LABEL.match(name):
            return [Problem('FieldValueInvalid', 'metadata.name',
                            'Invalid value: "%s": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \'-\', '
                            'and must start and end with an alphanumeric character (e.g. \'my-name\',  or \'123-abc\', regex used for '
                            'validation is \'[a-z0-9]([-a-z0-9]*[a-z0-9])?\')' % name)]
        return []
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        return [Problem('FieldValueInvalid', 'metadata.name',
                        'Invalid value: "%s": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \'-\' or '
                        '\'.\', and must start and end with an alphanumeric character (e.g. \'example.com\', regex used for validation is '
                        '\'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\')' % name)]
    return []


def _default_container(container):
    image = container.get('image') or ''
    tag = image.rsplit('/', 1)[-1]
    if 'imagePullPolicy' not in container:
        container['imagePullPolicy'] = 'Always' if (':' not in tag or tag.endswith(':latest')) and '@' not in image else 'IfNotPresent'
    container.setdefault('terminationMessagePath', '/dev/termination-log')
    container.setdefault('terminationMessagePolicy', 'File')
    container.setdefault('resources', {})
    for port in container.get('ports') or ():
        if isinstance(port, dict):
            port.setdefault('protocol', 'TCP')


def default_pod_spec(spec):
    if not isinstance(spec, dict):
        return
    spec.setdefault('restartPolicy', 'Always')
    spec.setdefault('dnsPolicy', 'ClusterFirst')
    spec.setdefault('schedulerName', 'default-scheduler')
    spec.setdefault('terminationGracePeriodSeconds', 30)
    spec.setdefault('securityContext', {})
    if spec.get('serviceAccountName') and 'serviceAccount' not in spec:
        spec['serviceAccount'] = spec['serviceAccountName']
    for field in ('containers', 'initContainers'):
        for container in spec.get(field) or ():
            if isinstance(container, dict):
                _default_container(container)


def check_pod_spec(spec, prefix):
    """What ValidatePodSpec reports that the schema cannot: containers and their images."""
    problems = []
    if not isinstance(spec, dict):
        return problems
    if not spec.get('containers'):
        problems.append(Problem('FieldValueRequired', prefix + '.containers', 'Required value'))
    for field in ('containers', 'initContainers'):
        for index, container in enumerate(spec.get(field) or ()):
            if isinstance(container, dict) and not container.get('image'):
                problems.append(Problem('FieldValueRequired', '%s.%s[%d].image' % (prefix, field, index), 'Required value'))
            if isinstance(container, dict):
                problems += _one_of(container.get('imagePullPolicy'), ('Always', 'IfNotPresent', 'Never'),
                                    '%s.%s[%d].imagePullPolicy' % (prefix, field, index))
    problems += _one_of(spec.get('restartPolicy'), ('Always', 'OnFailure', 'Never'), prefix + '.restartPolicy')
    problems += _one_of(spec.get('dnsPolicy'), ('ClusterFirstWithHostNet', 'ClusterFirst', 'Default', 'None'), prefix + '.dnsPolicy')
    return problems


def _one_of(value, allowed, field):
    """The enum checks of the Go validation (the published schema has no enum for these fields)."""
    if value is None or value in allowed:
        return []
    return [Problem('FieldValueNotSupported', field, 'Unsupported value: "%s": supported values: %s'
                    % (value, ', '.join('"%s"' % a for a in allowed)))]


def _template_spec(obj):
    template = (obj.get('spec') or {}).get('template')
    return template.get('spec') if isinstance(template, dict) else None


def _check_selector(obj):
    spec = obj.get('spec') or {}
    selector = spec.get('selector')
    labels = ((spec.get('template') or {}).get('metadata') or {}).get('labels') or {}
    if not selector or not (selector.get('matchLabels') or selector.get('matchExpressions')):
        return [Problem('FieldValueRequired', 'spec.selector', 'Required value')]
    from .selectors import match_label_selector  # pylint: disable=import-outside-toplevel
    if not match_label_selector(selector, labels):
        return [Problem('FieldValueInvalid', 'spec.template.metadata.labels',
                        'Invalid value: %s: `selector` does not match template `labels`' % _labels_text(labels))]
    return []


def _labels_text(labels):
    return 'map[string]string{%s}' % ', '.join('"%s":"%s"' % kv for kv in sorted(labels.items()))


def prepare(rtype, obj, old, allocator):  # pylint: disable=too-many-branches
    """Apply defaults and semantic checks for a main-resource write; returns problems."""
    problems = []
    kind = rtype.key
    spec = obj.get('spec')
    if kind == ('apps', 'deployments'):
        spec.setdefault('replicas', 1)
        spec.setdefault('revisionHistoryLimit', 10)
        spec.setdefault('progressDeadlineSeconds', 600)
        strategy = spec.setdefault('strategy', {})
        strategy.setdefault('type', 'RollingUpdate')
        if strategy['type'] == 'RollingUpdate':
            strategy.setdefault('rollingUpdate', {}).setdefault('maxUnavailable', '25%')
            strategy['rollingUpdate'].setdefault('maxSurge', '25%')
        problems += _check_selector(obj)
    elif kind == ('apps', 'daemonsets'):
        spec.setdefault('revisionHistoryLimit', 10)
        strategy = spec.setdefault('updateStrategy', {})
        strategy.setdefault('type', 'RollingUpdate')
        if strategy['type'] == 'RollingUpdate':
            strategy.setdefault('rollingUpdate', {}).setdefault('maxUnavailable', 1)
            strategy['rollingUpdate'].setdefault('maxSurge', 0)
        problems += _check_selector(obj)
    elif kind in (('apps', 'statefulsets'), ('apps', 'replicasets')):
        spec.setdefault('replicas', 1)
        if kind == ('apps', 'statefulsets'):
            spec.setdefault('podManagementPolicy', 'OrderedReady')
            spec.setdefault('revisionHistoryLimit', 10)
            spec.setdefault('updateStrategy', {'type': 'RollingUpdate', 'rollingUpdate': {'partition': 0}})
        problems += _check_selector(obj)
    elif kind == ('batch', 'jobs'):
        spec.setdefault('parallelism', 1)
        spec.setdefault('completions', 1)
        spec.setdefault('backoffLimit', 6)
        spec.setdefault('completionMode', 'NonIndexed')
        spec.setdefault('suspend', False)
        template_meta = spec.setdefault('template', {}).setdefault('metadata', {})
        if not spec.get('manualSelector') and old is None:
            uid = obj['metadata']['uid']
            labels = template_meta.setdefault('labels', {})
            labels.setdefault('batch.kubernetes.io/controller-uid', uid)
            labels.setdefault('batch.kubernetes.io/job-name', obj['metadata']['name'])
            labels.setdefault('controller-uid', uid)
            labels.setdefault('job-name', obj['metadata']['name'])
            spec.setdefault('selector', {'matchLabels': {'batch.kubernetes.io/controller-uid': uid}})
        restart = (spec.get('template', {}).get('spec') or {}).get('restartPolicy')
        if restart not in ('OnFailure', 'Never'):
            problems.append(Problem('FieldValueRequired' if not restart else 'FieldValueNotSupported', 'spec.template.spec.restartPolicy',
                                    'Required value: valid values: "OnFailure", "Never"' if not restart
                                    else 'Unsupported value: "%s": supported values: "OnFailure", "Never"' % restart))
    elif kind == ('', 'pods'):
        problems += check_pod_spec(spec, 'spec')
        default_pod_spec(spec)
        if old is None:
            obj['status'] = {'phase': 'Pending', 'qosClass': 'BestEffort'}
    elif kind == ('', 'services'):
        problems += _prepare_service(obj, old, allocator)
    elif kind == ('', 'namespaces'):
        obj.setdefault('spec', {}).setdefault('finalizers', ['kubernetes'])
        obj['status'] = (old or {}).get('status') or {'phase': 'Active'}
        obj['metadata'].setdefault('labels', {})['kubernetes.io/metadata.name'] = obj['metadata']['name']
    elif kind == ('', 'secrets'):
        obj.setdefault('type', 'Opaque')
        for key, value in (obj.pop('stringData', None) or {}).items():
            import base64  # pylint: disable=import-outside-toplevel
            obj.setdefault('data', {})[key] = base64.b64encode(str(value).encode()).decode()
    template_spec = _template_spec(obj)
    if template_spec is not None and kind[0] in ('apps', 'batch'):
        problems += check_pod_spec(template_spec, 'spec.template.spec')
        default_pod_spec(template_spec)
    if old is not None and kind in (('apps', 'deployments'), ('apps', 'daemonsets'), ('apps', 'statefulsets'), ('apps', 'replicasets'),
                                    ('batch', 'jobs')):
        if (old.get('spec') or {}).get('selector') != spec.get('selector'):
            problems.append(Problem('FieldValueInvalid', 'spec.selector', 'Invalid value: %s: field is immutable'
                                    % _labels_text((spec.get('selector') or {}).get('matchLabels') or {})))
    return problems


def _prepare_service(obj, old, allocator):
    spec = obj.setdefault('spec', {})
    spec.setdefault('type', 'ClusterIP')
    spec.setdefault('sessionAffinity', 'None')
    problems = _one_of(spec['type'], ('ClusterIP', 'ExternalName', 'LoadBalancer', 'NodePort'), 'spec.type')
    if problems:
        return problems
    if spec['type'] != 'ExternalName':
        old_spec = (old or {}).get('spec') or {}
        if old_spec.get('clusterIP') and spec.get('clusterIP') in (None, '', old_spec.get('clusterIP')):
            spec['clusterIP'] = old_spec['clusterIP']
        elif spec.get('clusterIP') in (None, ''):
            spec['clusterIP'] = allocator.cluster_ip()
        elif spec['clusterIP'] != 'None':
            try:
                ipaddress.ip_address(spec['clusterIP'])
            except ValueError:
                problems.append(Problem('FieldValueInvalid', 'spec.clusterIPs[0]', 'Invalid value: "%s": must be a valid IP address'
                                        % spec['clusterIP']))
        if old_spec.get('clusterIP') and spec['clusterIP'] != old_spec['clusterIP']:
            problems.append(Problem('FieldValueInvalid', 'spec.clusterIPs[0]', 'Invalid value: %s: may not change once set'
                                    % json_list([spec['clusterIP']])))
        spec['clusterIPs'] = [spec['clusterIP']]
        spec.setdefault('ipFamilies', ['IPv4'])
        spec.setdefault('ipFamilyPolicy', 'SingleStack')
        spec.setdefault('internalTrafficPolicy', 'Cluster')
    for index, port in enumerate(spec.get('ports') or ()):
        if not isinstance(port, dict):
            continue
        port.setdefault('protocol', 'TCP')
        if 'port' in port:
            port.setdefault('targetPort', port['port'])
        if spec['type'] in ('NodePort', 'LoadBalancer') and not port.get('nodePort'):
            old_ports = ((old or {}).get('spec') or {}).get('ports') or []
            previous = old_ports[index].get('nodePort') if index < len(old_ports) and isinstance(old_ports[index], dict) else None
            port['nodePort'] = previous or allocator.node_port()
    if spec['type'] == 'LoadBalancer':
        spec.setdefault('externalTrafficPolicy', 'Cluster')
        spec.setdefault('allocateLoadBalancerNodePorts', True)
    obj['status'] = (old or {}).get('status') or {'loadBalancer': {}}
    return problems


def json_list(values):
    return '[]string{%s}' % ', '.join('"%s"' % v for v in values)


class Allocator:
    """Service cluster IPs (10.96.0.0/12, .1 is the `kubernetes` Service) and node ports."""

    def __init__(self, service_cidr='10.96.0.0/12'):
        self._network = ipaddress.ip_network(service_cidr)
        self._next_ip = 1
        self._next_port = 30000
        self.used_ips = set()

    def cluster_ip(self):
        while True:
            address = str(self._network.network_address + self._next_ip)
            self._next_ip += 1
            if address not in self.used_ips:
                self.used_ips.add(address)
                return address

    def node_port(self):
        port = self._next_port
        self._next_port += 1
        return port
