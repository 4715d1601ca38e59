"""meta.k8s.io/v1 Table output (what `kubectl get` asks for), with per-kind columns."""

import datetime
import json
import re


def _col(name, kind='string', fmt='', priority=0, description=''):
    return {'name': name, 'type': kind, 'format': fmt, 'description': description or name, 'priority': priority}


NAME = _col('Name', fmt='name', description='Name must be unique within a namespace.')
AGE = _col('Age', description='CreationTimestamp is a timestamp representing the server time when this object was created.')


def human_duration(seconds):
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    seconds = max(0, int(seconds))
    if seconds < 60 * 2:
        return '%ds' % seconds
    minutes = seconds // 60
    if minutes < 10:
        return '%dm%ds' % (minutes, seconds % 60) if seconds % 60 else '%dm' % minutes
    if minutes < 60 * 3:
        return '%dm' % minutes
    hours = minutes // 60
    if hours < 8:
        return '%dh%dm' % (hours, minutes % 60) if minutes % 60 else '%dh' % hours
    if hours < 48:
        return '%dh' % hours
    if hours < 24 * 8:
        return '%dd%dh' % (hours // 24, hours % 24) if hours % 24 else '%dd' % (hours // 24)
    if hours < 24 * 365 * 2:
        return '%dd' % (hours // 24)
    return '%dy' % (hours // 24 // 365)


def age(obj, now=None):
    created = (obj.get('metadata') or {}).get('creationTimestamp')
    if not created:
        return '<unknown>'
    now = now or datetime.datetime.now(datetime.timezone.utc)
    when = datetime.datetime.strptime(created, '%Y-%m-%dT%H:%M:%SZ').replace(tzinfo=datetime.timezone.utc)
    return human_duration((now - when).total_seconds())


def _status(obj):
    return obj.get('status') or {}


def _spec(obj):
    return obj.get('spec') or {}


def _pod_cells(pod):
    status = _status(pod)
    statuses = status.get('containerStatuses') or []
    total = len(_spec(pod).get('containers') or [])
    ready = sum(1 for s in statuses if s.get('ready'))
    restarts = sum(s.get('restartCount', 0) for s in statuses)
    reason = status.get('reason') or status.get('phase') or 'Unknown'
    for container in statuses:
        waiting = (container.get('state') or {}).get('waiting')
        terminated = (container.get('state') or {}).get('terminated')
        if waiting and waiting.get('reason'):
            reason = waiting['reason']
        elif terminated and terminated.get('reason'):
            reason = terminated['reason']
    if pod['metadata'].get('deletionTimestamp'):
        reason = 'Terminating'
    return ['%d/%d' % (ready, total), reason, restarts, status.get('podIP') or '<none>', _spec(pod).get('nodeName') or '<none>',
            status.get('nominatedNodeName') or '<none>', '<none>']


def _node_cells(node):
    conditions = {c.get('type'): c.get('status') for c in _status(node).get('conditions') or ()}
    state = {'True': 'Ready', 'False': 'NotReady'}.get(conditions.get('Ready'), 'Unknown')
    if _spec(node).get('unschedulable'):
        state += ',SchedulingDisabled'
    labels = node['metadata'].get('labels') or {}
    roles = sorted(k.split('/', 1)[1] for k in labels if k.startswith('node-role.kubernetes.io/') and '/' in k)
    info = _status(node).get('nodeInfo') or {}
    addresses = {a.get('type'): a.get('address') for a in _status(node).get('addresses') or ()}
    return [state, ','.join(roles) or '<none>', info.get('kubeletVersion', ''), addresses.get('InternalIP', '<none>'),
            addresses.get('ExternalIP', '<none>'), info.get('osImage', '<unknown>'), info.get('kernelVersion', '<unknown>'),
            info.get('containerRuntimeVersion', '<unknown>')]


def _service_ports(svc):
    ports = []
    for port in _spec(svc).get('ports') or ():
        text = '%s' % port.get('port')
        if port.get('nodePort'):
            text += ':%s' % port['nodePort']
        ports.append('%s/%s' % (text, port.get('protocol', 'TCP')))
    return ','.join(ports) or '<none>'


def _external_ip(svc):
    ingress = (_status(svc).get('loadBalancer') or {}).get('ingress') or []
    ips = [i.get('ip') or i.get('hostname') for i in ingress] + list(_spec(svc).get('externalIPs') or [])
    if ips:
        return ','.join(ips)
    return '<pending>' if _spec(svc).get('type') == 'LoadBalancer' else '<none>'


def _containers(obj):
    template = (_spec(obj).get('template') or {}).get('spec') or {}
    containers = template.get('containers') or []
    return ','.join(c.get('name', '') for c in containers), ','.join(c.get('image', '') for c in containers)


def _selector(obj):
    selector = _spec(obj).get('selector') or {}
    return ','.join('%s=%s' % kv for kv in sorted((selector.get('matchLabels') or {}).items())) or '<none>'


def _builtin_columns():
    integer = 'integer'
    return {
        ('', 'pods'): ([_col('Ready'), _col('Status'), _col('Restarts', integer), _col('IP', priority=1), _col('Node', priority=1),
                        _col('Nominated Node', priority=1), _col('Readiness Gates', priority=1)], _pod_cells, [0, 1, 2, AGE, 3, 4, 5, 6]),
        ('', 'nodes'): ([_col('Status'), _col('Roles'), _col('Version'), _col('Internal-IP', priority=1),
                         _col('External-IP', priority=1), _col('OS-Image', priority=1), _col('Kernel-Version', priority=1),
                         _col('Container-Runtime', priority=1)], _node_cells, [0, 1, AGE, 2, 3, 4, 5, 6, 7]),
        ('', 'namespaces'): ([_col('Status')], lambda o: [_status(o).get('phase', '')], [0, AGE]),
        ('', 'services'): ([_col('Type'), _col('Cluster-IP'), _col('External-IP'), _col('Port(s)'), _col('Selector', priority=1)],
                           lambda o: [_spec(o).get('type', ''), _spec(o).get('clusterIP') or '<none>', _external_ip(o), _service_ports(o),
                                      ','.join('%s=%s' % kv for kv in sorted((_spec(o).get('selector') or {}).items())) or '<none>'],
                           [0, 1, 2, 3, AGE, 4]),
        ('', 'configmaps'): ([_col('Data', integer)], lambda o: [len(o.get('data') or {}) + len(o.get('binaryData') or {})], [0, AGE]),
        ('', 'secrets'): ([_col('Type'), _col('Data', integer)], lambda o: [o.get('type', ''), len(o.get('data') or {})], [0, 1, AGE]),
        ('', 'serviceaccounts'): ([_col('Secrets', integer)], lambda o: [len(o.get('secrets') or [])], [0, AGE]),
        ('', 'events'): ([_col('Last Seen'), _col('Type'), _col('Reason'), _col('Object'), _col('Message')],
                         lambda o: [o.get('lastTimestamp') or '', o.get('type', ''), o.get('reason', ''),
                                    '%s/%s' % ((o.get('involvedObject') or {}).get('kind', '').lower(),
                                               (o.get('involvedObject') or {}).get('name', '')), o.get('message', '')], [0, 1, 2, 3, 4]),
        ('apps', 'deployments'): ([_col('Ready'), _col('Up-to-date', integer), _col('Available', integer), _col('Containers', priority=1),
                                   _col('Images', priority=1), _col('Selector', priority=1)],
                                  lambda o: ['%d/%d' % (_status(o).get('readyReplicas', 0), _spec(o).get('replicas', 0)),
                                             _status(o).get('updatedReplicas', 0), _status(o).get('availableReplicas', 0)]
                                  + list(_containers(o)) + [_selector(o)], [0, 1, 2, AGE, 3, 4, 5]),
        ('apps', 'daemonsets'): ([_col('Desired', integer), _col('Current', integer), _col('Ready', integer), _col('Up-to-date', integer),
                                  _col('Available', integer), _col('Node Selector'), _col('Containers', priority=1), _col('Images', priority=1),
                                  _col('Selector', priority=1)],
                                 lambda o: [_status(o).get('desiredNumberScheduled', 0), _status(o).get('currentNumberScheduled', 0),
                                            _status(o).get('numberReady', 0), _status(o).get('updatedNumberScheduled', 0),
                                            _status(o).get('numberAvailable', 0),
                                            ','.join('%s=%s' % kv for kv in sorted(((_spec(o).get('template') or {}).get('spec') or {})
                                                                                   .get('nodeSelector', {}).items())) or '<none>']
                                 + list(_containers(o)) + [_selector(o)], [0, 1, 2, 3, 4, 5, AGE, 6, 7, 8]),
        ('apps', 'replicasets'): ([_col('Desired', integer), _col('Current', integer), _col('Ready', integer)],
                                  lambda o: [_spec(o).get('replicas', 0), _status(o).get('replicas', 0), _status(o).get('readyReplicas', 0)],
                                  [0, 1, 2, AGE]),
        ('apps', 'statefulsets'): ([_col('Ready')], lambda o: ['%d/%d' % (_status(o).get('readyReplicas', 0), _spec(o).get('replicas', 0))],
                                   [0, AGE]),
        ('batch', 'jobs'): ([_col('Status'), _col('Completions')],
                            lambda o: [_job_status(o), '%d/%d' % (_status(o).get('succeeded', 0), _spec(o).get('completions', 1))],
                            [0, 1, AGE]),
        ('apiextensions.k8s.io', 'customresourcedefinitions'): ([_col('Created At', 'date')],
                                                                lambda o: [o['metadata'].get('creationTimestamp', '')], [0]),
    }


def _job_status(job):
    for condition in _status(job).get('conditions') or ():
        if condition.get('status') == 'True' and condition.get('type') in ('Complete', 'Failed', 'Suspended'):
            return condition['type']
    return 'Running'


_COLUMNS = _builtin_columns()


def jsonpath(obj, path):
    """The small JSONPath subset additionalPrinterColumns use: .a.b, [n], [?(@.k=="v")], [*]."""
    values = [obj]
    for token in re.findall(r'\.([A-Za-z0-9_\-]+)|\[(\d+|\*|\?\(@\.[^\]]+\))\]', path):
        name, index = token
        found = []
        for value in values:
            if name:
                if isinstance(value, dict) and name in value:
                    found.append(value[name])
            elif index == '*':
                found.extend(value if isinstance(value, list) else (value.values() if isinstance(value, dict) else []))
            elif index.isdigit():
                if isinstance(value, list) and int(index) < len(value):
                    found.append(value[int(index)])
            else:
                match = re.match(r'\?\(@\.([A-Za-z0-9_\-.]+)\s*==\s*["\']([^"\']*)["\']\)', index)
                if match and isinstance(value, list):
                    field, want = match.groups()
                    for item in value:
                        current = item
                        for part in field.split('.'):
                            current = current.get(part) if isinstance(current, dict) else None
                        if current == want:
                            found.append(item)
        values = found
    return values


def _format_custom(values, kind):
    if not values:
        return None
    value = values[0]
    if kind == 'date' and isinstance(value, str):
        try:
            when = datetime.datetime.strptime(value, '%Y-%m-%dT%H:%M:%SZ').replace(tzinfo=datetime.timezone.utc)
            return human_duration((datetime.datetime.now(datetime.timezone.utc) - when).total_seconds())
        except ValueError:
            return value
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return value


def table(rtype, objects, resource_version, include_object='Metadata'):
    """A Table for a list of objects (or one object) of rtype."""
    custom_columns = None
    if rtype.custom:
        definitions = [NAME]
        printer = list(rtype.printer_columns)
        for column in printer:
            definitions.append(_col(column.get('name', ''), column.get('type', 'string'), column.get('format', ''),
                                    column.get('priority', 0), column.get('description', '')))
        if not any(c.get('jsonPath') == '.metadata.creationTimestamp' for c in printer):
            definitions.append(AGE)
        custom_columns = printer
    elif rtype.key in _COLUMNS:
        extra, dummy, order = _COLUMNS[rtype.key]
        definitions = [NAME] + [AGE if i is AGE else extra[i] for i in order]
    else:
        definitions = [NAME, AGE]
    rows = []
    for obj in objects:
        if custom_columns is not None:
            cells = [obj['metadata']['name']]
            for column in custom_columns:
                cells.append(_format_custom(jsonpath(obj, column.get('jsonPath', '')), column.get('type')))
            if len(cells) < len(definitions):
                cells.append(age(obj))
        elif rtype.key in _COLUMNS:
            dummy, fn, order = _COLUMNS[rtype.key]
            values = fn(obj)
            cells = [obj['metadata']['name']] + [age(obj) if i is AGE else values[i] for i in order]
        else:
            cells = [obj['metadata']['name'], age(obj)]
        row = {'cells': cells}
        if include_object == 'Object':
            row['object'] = obj
        elif include_object != 'None':
            row['object'] = {'kind': 'PartialObjectMetadata', 'apiVersion': 'meta.k8s.io/v1', 'metadata': obj['metadata']}
        rows.append(row)
    return {'kind': 'Table', 'apiVersion': 'meta.k8s.io/v1', 'metadata': {'resourceVersion': str(resource_version)},
            'columnDefinitions': definitions, 'rows': rows}
