"""The resource types the lab API serves: built-in kinds and the kinds of registered CRDs."""

import dataclasses

from . import schema

VERBS = ('create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch')


@dataclasses.dataclass
class ResourceType:  # pylint: disable=too-many-instance-attributes
    """One served resource (group, version, plural) and what the API knows about it."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    short_names: tuple = ()
    categories: tuple = ()
    subresources: tuple = ()
    definition: str = ''          # built-in: OpenAPI definition name
    crd_schema: dict = None       # custom resource: openAPIV3Schema of this version
    printer_columns: tuple = ()   # custom resource: additionalPrinterColumns
    storage: bool = True          # the CRD version objects are kept in
    selectable: tuple = ()        # extra field selectors (built-ins)

    @property
    def singular(self):
        return self.kind.lower()

    @property
    def api_version(self):
        return '%s/%s' % (self.group, self.version) if self.group else self.version

    @property
    def key(self):
        """The store key: one object space per (group, plural), whatever the version."""
        return (self.group, self.plural)

    @property
    def list_kind(self):
        return self.kind + 'List'

    @property
    def custom(self):
        return self.crd_schema is not None

    def has(self, subresource):
        return subresource in self.subresources


def _b(group, version, kind, plural, namespaced, short=(), cats=(), subs=(), definition='', selectable=()):
    return ResourceType(group, version, kind, plural, namespaced, tuple(short), tuple(cats), tuple(subs), definition, None, (), True,
                        tuple(selectable))


_POD_FIELDS = ('spec.nodeName', 'spec.restartPolicy', 'spec.schedulerName', 'spec.serviceAccountName', 'spec.hostNetwork',
               'status.phase', 'status.podIP', 'status.nominatedNodeName')
_EVENT_FIELDS = ('involvedObject.kind', 'involvedObject.namespace', 'involvedObject.name', 'involvedObject.uid',
                 'involvedObject.apiVersion', 'involvedObject.resourceVersion', 'involvedObject.fieldPath', 'reason',
                 'reportingComponent', 'source', 'type')

BUILTINS = (
    _b('', 'v1', 'Namespace', 'namespaces', False, ('ns',), (), ('status', 'finalize'), 'io.k8s.api.core.v1.Namespace', ('status.phase',)),
    _b('', 'v1', 'Node', 'nodes', False, ('no',), (), ('status',), 'io.k8s.api.core.v1.Node', ('spec.unschedulable',)),
    _b('', 'v1', 'Pod', 'pods', True, ('po',), ('all',), ('status', 'log'), 'io.k8s.api.core.v1.Pod', _POD_FIELDS),
    _b('', 'v1', 'Service', 'services', True, ('svc',), ('all',), ('status',), 'io.k8s.api.core.v1.Service'),
    _b('', 'v1', 'Endpoints', 'endpoints', True, ('ep',), (), (), 'io.k8s.api.core.v1.Endpoints'),
    _b('', 'v1', 'ConfigMap', 'configmaps', True, ('cm',), (), (), 'io.k8s.api.core.v1.ConfigMap'),
    _b('', 'v1', 'Secret', 'secrets', True, (), (), (), 'io.k8s.api.core.v1.Secret', ('type',)),
    _b('', 'v1', 'ServiceAccount', 'serviceaccounts', True, ('sa',), (), (), 'io.k8s.api.core.v1.ServiceAccount'),
    # stored, not enforced (Flux's distribution manifests ship one: critical-pods-flux-system)
    _b('', 'v1', 'ResourceQuota', 'resourcequotas', True, ('quota',), (), ('status',), 'io.k8s.api.core.v1.ResourceQuota'),
    _b('', 'v1', 'Event', 'events', True, ('ev',), (), (), 'io.k8s.api.core.v1.Event', _EVENT_FIELDS),
    _b('', 'v1', 'PersistentVolumeClaim', 'persistentvolumeclaims', True, ('pvc',), (), ('status',),
       'io.k8s.api.core.v1.PersistentVolumeClaim'),
    _b('', 'v1', 'PersistentVolume', 'persistentvolumes', False, ('pv',), (), ('status',), 'io.k8s.api.core.v1.PersistentVolume'),
    _b('apps', 'v1', 'Deployment', 'deployments', True, ('deploy',), ('all',), ('status', 'scale'), 'io.k8s.api.apps.v1.Deployment'),
    _b('apps', 'v1', 'DaemonSet', 'daemonsets', True, ('ds',), ('all',), ('status',), 'io.k8s.api.apps.v1.DaemonSet'),
    _b('apps', 'v1', 'ReplicaSet', 'replicasets', True, ('rs',), ('all',), ('status', 'scale'), 'io.k8s.api.apps.v1.ReplicaSet',
       ('status.replicas',)),
    _b('apps', 'v1', 'StatefulSet', 'statefulsets', True, ('sts',), ('all',), ('status', 'scale'), 'io.k8s.api.apps.v1.StatefulSet'),
    _b('apps', 'v1', 'ControllerRevision', 'controllerrevisions', True, (), (), (), 'io.k8s.api.apps.v1.ControllerRevision'),
    _b('batch', 'v1', 'Job', 'jobs', True, (), ('all',), ('status',), 'io.k8s.api.batch.v1.Job', ('status.successful',)),
    _b('batch', 'v1', 'CronJob', 'cronjobs', True, ('cj',), ('all',), ('status',), 'io.k8s.api.batch.v1.CronJob'),
    _b('apiextensions.k8s.io', 'v1', 'CustomResourceDefinition', 'customresourcedefinitions', False, ('crd', 'crds'), (),
       ('status',), 'io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition'),
    _b('apiregistration.k8s.io', 'v1', 'APIService', 'apiservices', False, (), (), ('status',),
       'io.k8s.kube-aggregator.pkg.apis.apiregistration.v1.APIService'),
    _b('rbac.authorization.k8s.io', 'v1', 'ClusterRole', 'clusterroles', False, (), (), (), 'io.k8s.api.rbac.v1.ClusterRole'),
    _b('rbac.authorization.k8s.io', 'v1', 'ClusterRoleBinding', 'clusterrolebindings', False, (), (), (),
       'io.k8s.api.rbac.v1.ClusterRoleBinding'),
    _b('rbac.authorization.k8s.io', 'v1', 'Role', 'roles', True, (), (), (), 'io.k8s.api.rbac.v1.Role'),
    _b('rbac.authorization.k8s.io', 'v1', 'RoleBinding', 'rolebindings', True, (), (), (), 'io.k8s.api.rbac.v1.RoleBinding'),
    _b('scheduling.k8s.io', 'v1', 'PriorityClass', 'priorityclasses', False, ('pc',), (), (), 'io.k8s.api.scheduling.v1.PriorityClass'),
    _b('storage.k8s.io', 'v1', 'StorageClass', 'storageclasses', False, ('sc',), (), (), 'io.k8s.api.storage.v1.StorageClass'),
    _b('storage.k8s.io', 'v1', 'CSIDriver', 'csidrivers', False, (), (), (), 'io.k8s.api.storage.v1.CSIDriver'),
    _b('storage.k8s.io', 'v1', 'CSINode', 'csinodes', False, (), (), (), 'io.k8s.api.storage.v1.CSINode'),
    _b('policy', 'v1', 'PodDisruptionBudget', 'poddisruptionbudgets', True, ('pdb',), (), ('status',),
       'io.k8s.api.policy.v1.PodDisruptionBudget'),
    _b('networking.k8s.io', 'v1', 'NetworkPolicy', 'networkpolicies', True, ('netpol',), (), (), 'io.k8s.api.networking.v1.NetworkPolicy'),
    _b('networking.k8s.io', 'v1', 'Ingress', 'ingresses', True, ('ing',), (), ('status',), 'io.k8s.api.networking.v1.Ingress'),
    _b('networking.k8s.io', 'v1', 'IngressClass', 'ingressclasses', False, (), (), (), 'io.k8s.api.networking.v1.IngressClass'),
    _b('discovery.k8s.io', 'v1', 'EndpointSlice', 'endpointslices', True, (), (), (), 'io.k8s.api.discovery.v1.EndpointSlice'),
    _b('coordination.k8s.io', 'v1', 'Lease', 'leases', True, (), (), (), 'io.k8s.api.coordination.v1.Lease'),
    _b('admissionregistration.k8s.io', 'v1', 'ValidatingWebhookConfiguration', 'validatingwebhookconfigurations', False, (), (), (),
       'io.k8s.api.admissionregistration.v1.ValidatingWebhookConfiguration'),
    _b('admissionregistration.k8s.io', 'v1', 'MutatingWebhookConfiguration', 'mutatingwebhookconfigurations', False, (), (), (),
       'io.k8s.api.admissionregistration.v1.MutatingWebhookConfiguration'),
)

CRD_KEY = ('apiextensions.k8s.io', 'customresourcedefinitions')


class Registry:
    """Lookup of served resource types; CRD kinds come and go as CRDs are written."""

    def __init__(self):
        self._by_gvr = {}
        self._crd_types = {}      # CRD name -> [ResourceType per served version]
        self.generation = 0       # bumped whenever the set of served types changes
        defs = schema.definitions()
        for rtype in BUILTINS:
            if rtype.definition not in defs:
                raise RuntimeError('no OpenAPI definition %s' % rtype.definition)
            self._by_gvr[(rtype.group, rtype.version, rtype.plural)] = rtype

    def get(self, group, version, plural):
        return self._by_gvr.get((group, version, plural))

    def by_key(self, key):
        """The storage (preferred) type for a store key."""
        for rtype in self._by_gvr.values():
            if rtype.key == key and rtype.storage:
                return rtype
        return None

    def all(self):
        return list(self._by_gvr.values())

    def groups(self):
        """[(group, [versions, preferred first])] in a stable order: core, built-ins, then CRD groups."""
        order = []
        versions = {}
        for rtype in self._by_gvr.values():
            if rtype.group not in versions:
                order.append(rtype.group)
                versions[rtype.group] = []
            if rtype.version not in versions[rtype.group]:
                versions[rtype.group].append(rtype.version)
        return [(group, _sort_versions(versions[group])) for group in order]

    def resources(self, group, version):
        return [rtype for rtype in self._by_gvr.values() if rtype.group == group and rtype.version == version]

    def has_group_version(self, group, version):
        return any(r.group == group and r.version == version for r in self._by_gvr.values())

    def find_kind(self, api_version, kind):
        group, dummy, version = api_version.rpartition('/')
        for rtype in self._by_gvr.values():
            if rtype.group == group and rtype.version == version and rtype.kind == kind:
                return rtype
        return None

    # --- CRDs -------------------------------------------------------------------------------

    def crd_conflict(self, crd):
        """A reason the CRD's names cannot be accepted, or ''."""
        spec = crd.get('spec') or {}
        names = spec.get('names') or {}
        for version in spec.get('versions') or ():
            existing = self._by_gvr.get((spec.get('group'), version.get('name'), names.get('plural')))
            if existing is not None and not existing.custom:
                return '%s is already served by a built-in type' % names.get('plural')
        return ''

    def set_crd(self, crd):
        """Serve (or re-serve) the kinds of one CRD; returns True when the served set changed."""
        name = crd['metadata']['name']
        spec = crd.get('spec') or {}
        names = spec.get('names') or {}
        new_types = []
        for version in spec.get('versions') or ():
            if not version.get('served', True):
                continue
            version_schema = ((version.get('schema') or {}).get('openAPIV3Schema')) or {'type': 'object',
                                                                                        'x-kubernetes-preserve-unknown-fields': True}
            subresources = version.get('subresources') or {}
            subs = tuple(s for s in ('status', 'scale') if s in subresources)
            new_types.append(ResourceType(
                spec.get('group', ''), version['name'], names.get('kind', ''), names.get('plural', ''),
                spec.get('scope', 'Namespaced') == 'Namespaced', tuple(names.get('shortNames') or ()),
                tuple(names.get('categories') or ()), subs, '', version_schema,
                tuple(version.get('additionalPrinterColumns') or ()), bool(version.get('storage')), ()))
        old = self._crd_types.get(name, [])
        if [dataclasses.astuple(t) for t in old] == [dataclasses.astuple(t) for t in new_types]:
            return False
        self._drop(name)
        self._crd_types[name] = new_types
        for rtype in new_types:
            self._by_gvr[(rtype.group, rtype.version, rtype.plural)] = rtype
        self.generation += 1
        return True

    def remove_crd(self, name):
        if name in self._crd_types:
            self._drop(name)
            del self._crd_types[name]
            self.generation += 1

    def _drop(self, name):
        for rtype in self._crd_types.get(name, []):
            self._by_gvr.pop((rtype.group, rtype.version, rtype.plural), None)


def _version_priority(version):
    """Kubernetes version priority: GA > beta > alpha, then by number (v2 > v1)."""
    import re  # pylint: disable=import-outside-toplevel
    match = re.match(r'^v(\d+)(?:(alpha|beta)(\d+))?$', version)
    if not match:
        return (0, 0, 0, version)
    major, stage, minor = match.groups()
    rank = {'alpha': 1, 'beta': 2, None: 3}[stage]
    return (rank, int(major), int(minor or 0), '')


def _sort_versions(versions):
    return sorted(versions, key=_version_priority, reverse=True)
