"""The lab's Kubernetes API server: aiohttp over TLS with client-certificate authentication.

Serves discovery (legacy and aggregated v2), /openapi/v2 and /v3, /version and the health
endpoints, and the REST verbs (get, list, watch, create, update, patch in its four flavours,
delete, deletecollection, status and scale subresources) over a Store. Objects are JSON;
`kubectl get` gets Table output.
"""

import asyncio
import base64
import json
import os
import ssl
import tempfile
import time
import urllib.parse

import yaml
from aiohttp import web

from lab import pki

from . import protobuf, tables
from .errors import ApiError
from .openapi import OpenAPI
from .selectors import FieldSelector, LabelSelector
from .store import PATCH_TYPES

VERSION_INFO = {
    'major': '1', 'minor': '33', 'emulationMajor': '1', 'emulationMinor': '33', 'minCompatibilityMajor': '1',
    'minCompatibilityMinor': '32', 'gitVersion': 'v1.33.1', 'gitCommit': '8adc0f041b8e7ad1d30e29cc59c6ae7a15e19828',
    'gitTreeState': 'clean', 'buildDate': '2025-05-15T08:19:08Z', 'goVersion': 'go1.24.2', 'compiler': 'gc', 'platform': 'linux/amd64',
}
PUBLIC_PATHS = ('/healthz', '/livez', '/readyz', '/version')
HEALTH_CHECKS = ('ping', 'log', 'etcd', 'poststarthook/start-apiextensions-controllers', 'poststarthook/crd-informer-synced',
                 'poststarthook/bootstrap-controller', 'poststarthook/rbac/bootstrap-roles',
                 'poststarthook/scheduling/bootstrap-system-priority-classes')
DISCOVERY_V2 = 'application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList'
WATCH_BOOKMARK_SECONDS = 10
DEFAULT_WATCH_SECONDS = 1800


def _accepts(request):
    """The Accept header as [(mime, {params})]."""
    out = []
    for part in (request.headers.get('Accept') or '').split(','):
        pieces = [p.strip() for p in part.split(';') if p.strip()]
        if not pieces:
            continue
        params = {}
        for piece in pieces[1:]:
            key, dummy, value = piece.partition('=')
            params[key.strip()] = value.strip()
        out.append((pieces[0].lower(), params))
    return out


def _wants(request, as_kind):
    return any(params.get('as') == as_kind and params.get('g') == 'meta.k8s.io' for dummy, params in _accepts(request))


def _json_response(body, status=200, headers=None, content_type='application/json'):
    data = body if isinstance(body, bytes) else json.dumps(body, separators=(',', ':')).encode()
    return web.Response(body=data, status=status, headers=dict(headers or {}, **{'Content-Type': content_type}))


def _status_success(rtype, name, uid=None):
    details = {'name': name, 'group': rtype.group, 'kind': rtype.plural}
    if uid:
        details['uid'] = uid
    return {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Success', 'details': details}


def _bool(value):
    return str(value).lower() in ('1', 'true', 'yes')


class Flapping:
    """The k8s-api-flap fault: the API is down for the second half of every period."""

    def __init__(self, period, mode='503', clock=time.monotonic):
        self.period = max(0.05, float(period))
        self.mode = mode
        self.clock = clock
        self.start = clock()

    def down(self):
        return ((self.clock() - self.start) % self.period) >= self.period / 2


class ApiServer:  # pylint: disable=too-many-instance-attributes
    """One API server process: listens on each host:port with a serving cert from the CA."""

    def __init__(self, store, ca_cert_pem, ca_key_pem, hosts=('127.0.0.1',), port=6443, state_dir=None, request_log=None):  # pylint: disable=too-many-arguments
        self.store = store
        self.registry = store.registry
        self.ca_cert_pem = ca_cert_pem
        self.ca_key_pem = ca_key_pem
        self.hosts = list(hosts)
        self.port = port
        self.state_dir = state_dir
        self.request_log = request_log
        self.openapi = OpenAPI(self.registry, VERSION_INFO)
        self.flapping = None
        self.service_proxies = {}    # (namespace, service) -> handler(method, path, query, body) -> (status, content type, bytes)
        self._runner = None
        self._watches = set()
        self._tmp = None
        self._context = None
        # start/stop/add_host/remove_host run one at a time: VM events and a lab reset can ask at once.
        # A stopped server stays stopped (the cluster makes a new one when the API comes back).
        self._lifecycle = asyncio.Lock()
        self._closed = False

    # --- lifecycle ----------------------------------------------------------------------------

    def _serving_files(self):
        """The serving certificate for every address of self.hosts (and its key, 0600), written; their paths."""
        cert_pem, key_pem = pki.serving_cert(self.ca_cert_pem, self.ca_key_pem, self.hosts)
        if self.state_dir:
            os.makedirs(self.state_dir, exist_ok=True)
            directory = self.state_dir
        else:
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix='lab-kubeapi-')  # pylint: disable=consider-using-with
            directory = self._tmp.name
        cert_path = os.path.join(directory, 'apiserver.crt')
        key_path = os.path.join(directory, 'apiserver.key')
        with open(cert_path, 'w', encoding='utf-8') as handle:
            handle.write(cert_pem)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, 'w', encoding='utf-8') as handle:
            handle.write(key_pem)
        return cert_path, key_path

    def _ssl_context(self):
        cert_path, key_path = self._serving_files()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_path, key_path)
        context.load_verify_locations(cadata=self.ca_cert_pem if isinstance(self.ca_cert_pem, str) else self.ca_cert_pem.decode())
        context.verify_mode = ssl.CERT_OPTIONAL
        context.set_alpn_protocols(['http/1.1'])
        return context

    def app(self):
        application = web.Application(client_max_size=64 * 1024 * 1024)
        application.router.add_route('*', '/{tail:.*}', self.handle)
        return application

    async def start(self):
        async with self._lifecycle:
            if not self._closed and self._runner is None:
                await self._start()

    async def _start(self):
        self._context = self._ssl_context()
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        for host in self.hosts:
            await self._listen(host)

    async def _listen(self, host):
        site = web.TCPSite(self._runner, host, self.port, ssl_context=self._context, reuse_address=True)
        await site.start()
        if self.port == 0:
            self.port = site._server.sockets[0].getsockname()[1]  # pylint: disable=protected-access

    async def add_host(self, host):
        """Listen on one more address (a control plane that joined); its IP must be in the cert."""
        async with self._lifecycle:
            if host in self.hosts:
                return
            self.hosts.append(host)
            if self._runner is not None:
                # The serving certificate gets the new address in place (new handshakes use it), and only the new
                # address starts listening: the addresses that serve already - the cluster endpoint among them - keep
                # their connections and watches, as the API servers of a cluster do when a control plane joins.
                self._context.load_cert_chain(*self._serving_files())
                await self._listen(host)

    async def remove_host(self, host):
        """Stop listening on one address (its control plane went down); the others keep serving."""
        async with self._lifecycle:
            if host not in self.hosts:
                return
            self.hosts.remove(host)
            if self._runner is not None:
                await self._stop()
                if self.hosts:
                    await self._start()

    async def stop(self):
        """Stop for good: a later start, add_host or remove_host does not listen again."""
        async with self._lifecycle:
            self._closed = True
            await self._stop()

    async def _stop(self):
        for task in list(self._watches):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    @property
    def running(self):
        return self._runner is not None

    # --- request entry -----------------------------------------------------------------------------

    async def handle(self, request):
        started = time.monotonic()
        user = None
        try:
            if self.flapping is not None and self.flapping.down():
                if self.flapping.mode == 'refuse' and request.transport is not None:
                    request.transport.abort()
                    raise ApiError(503, 'ServiceUnavailable', 'connection refused')
                raise ApiError(503, 'ServiceUnavailable', 'the server is currently unable to handle the request')
            user, groups = self._authenticate(request)
            path = request.path.rstrip('/') or '/'
            if user is None and not any(path == p or path.startswith(p + '/') for p in PUBLIC_PATHS):
                raise ApiError(401, 'Unauthorized', 'Unauthorized')
            if user is not None and 'system:masters' not in groups and not any(path == p or path.startswith(p + '/')
                                                                               for p in PUBLIC_PATHS):
                raise ApiError(403, 'Forbidden', 'forbidden: User "%s" cannot %s path "%s"' % (user, request.method.lower(), path))
            response = await self._route(request, path)
        except ApiError as exc:
            response = _json_response(exc.status(), exc.code)
        except Exception as exc:  # pylint: disable=broad-except
            response = _json_response(ApiError(500, 'InternalError', 'Internal error occurred: %s: %s'
                                               % (type(exc).__name__, exc)).status(), 500)
        if self.request_log is not None:
            self.request_log({'method': request.method, 'path': request.path_qs, 'status': getattr(response, 'status', 0), 'user': user,
                              'ms': round((time.monotonic() - started) * 1000, 1)})
        return response

    def _authenticate(self, request):
        transport = request.transport
        cert = transport.get_extra_info('peercert') if transport is not None else None
        if not cert:
            return None, ()
        user, groups = None, []
        for rdn in cert.get('subject', ()):
            for key, value in rdn:
                if key == 'commonName':
                    user = value
                elif key == 'organizationName':
                    groups.append(value)
        return user or 'unknown', tuple(groups)

    async def _route(self, request, path):  # pylint: disable=too-many-return-statements
        parts = [urllib.parse.unquote(p) for p in path.strip('/').split('/')] if path != '/' else []
        if not parts:
            return _json_response({'paths': sorted(['/api', '/api/v1', '/apis', '/healthz', '/livez', '/readyz', '/version',
                                                    '/openapi/v2', '/openapi/v3'])})
        head = parts[0]
        if head in ('healthz', 'livez', 'readyz'):
            return self._health(request, parts)
        if head == 'version':
            return _json_response(VERSION_INFO)
        if head == 'openapi':
            return self._openapi(request, parts[1:])
        if head == 'api':
            if len(parts) == 1:
                return self._discovery_core(request)
            if parts[1] != 'v1':
                raise self._unknown()
            return await self._resource(request, '', 'v1', parts[2:])
        if head == 'apis':
            if len(parts) == 1:
                return self._discovery_groups(request)
            if len(parts) == 2:
                return self._group(parts[1])
            return await self._resource(request, parts[1], parts[2], parts[3:])
        raise self._unknown()

    @staticmethod
    def _unknown():
        return ApiError(404, 'NotFound', 'the server could not find the requested resource', {})

    # --- health, version, openapi ---------------------------------------------------------------

    def _health(self, request, parts):
        if request.method not in ('GET', 'HEAD'):
            raise ApiError(405, 'MethodNotAllowed', 'method not allowed')
        name = parts[0]
        if len(parts) > 1:
            check = '/'.join(parts[1:])
            if check not in HEALTH_CHECKS:
                raise ApiError(404, 'NotFound', 'the server could not find the requested resource')
            return web.Response(text='ok', content_type='text/plain')
        if 'verbose' in request.query:
            lines = ['[+]%s ok' % check for check in HEALTH_CHECKS] + ['%s check passed' % name]
            return web.Response(text='\n'.join(lines) + '\n', content_type='text/plain')
        return web.Response(text='ok', content_type='text/plain')

    def _openapi(self, request, parts):
        if parts == ['v2']:
            accepts = _accepts(request)
            if accepts and not any(mime in ('application/json', '*/*', 'application/*') for mime, dummy in accepts):
                raise ApiError(406, 'NotAcceptable', 'only application/json is served for /openapi/v2')
            return _json_response(self.openapi.v2())
        if parts == ['v3']:
            return _json_response(self.openapi.v3_index())
        if parts and parts[0] == 'v3':
            found = self.openapi.v3_doc('/'.join(parts[1:]))
            if found is None:
                raise ApiError(404, 'NotFound', 'the server could not find the requested resource')
            data, digest = found
            headers = {'Etag': '"%s"' % digest}
            if request.query.get('hash') == digest:
                headers['Cache-Control'] = 'public, immutable'
                headers['Expires'] = 'Thu, 01 Jan 2099 00:00:00 GMT'
            return _json_response(data, headers=headers)
        raise self._unknown()

    # --- discovery ------------------------------------------------------------------------------

    def _resource_list_entries(self, group, version):
        out = []
        for rtype in self.registry.resources(group, version):
            out.append({'name': rtype.plural, 'singularName': rtype.singular, 'namespaced': rtype.namespaced, 'kind': rtype.kind,
                        'verbs': list(('create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch')),
                        **({'shortNames': list(rtype.short_names)} if rtype.short_names else {}),
                        **({'categories': list(rtype.categories)} if rtype.categories else {})})
            for sub in rtype.subresources:
                if sub == 'scale':
                    out.append({'name': '%s/scale' % rtype.plural, 'singularName': '', 'namespaced': rtype.namespaced,
                                'group': 'autoscaling', 'version': 'v1', 'kind': 'Scale', 'verbs': ['get', 'patch', 'update']})
                elif sub == 'status':
                    out.append({'name': '%s/status' % rtype.plural, 'singularName': '', 'namespaced': rtype.namespaced,
                                'kind': rtype.kind, 'verbs': ['get', 'patch', 'update']})
                elif sub == 'finalize':
                    out.append({'name': '%s/finalize' % rtype.plural, 'singularName': '', 'namespaced': False,
                                'kind': rtype.kind, 'verbs': ['update']})
                elif sub == 'log':
                    out.append({'name': '%s/log' % rtype.plural, 'singularName': '', 'namespaced': True, 'kind': rtype.kind,
                                'verbs': ['get']})
        return out

    def _discovery_entry(self, rtype):
        entry = {'resource': rtype.plural, 'responseKind': {'group': rtype.group, 'version': rtype.version, 'kind': rtype.kind},
                 'scope': 'Namespaced' if rtype.namespaced else 'Cluster', 'singularResource': rtype.singular,
                 'verbs': ['create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch']}
        if rtype.short_names:
            entry['shortNames'] = list(rtype.short_names)
        if rtype.categories:
            entry['categories'] = list(rtype.categories)
        subs = []
        for sub in rtype.subresources:
            if sub == 'scale':
                subs.append({'subresource': 'scale', 'responseKind': {'group': 'autoscaling', 'version': 'v1', 'kind': 'Scale'},
                             'verbs': ['get', 'patch', 'update']})
            elif sub == 'status':
                subs.append({'subresource': 'status', 'responseKind': dict(entry['responseKind']), 'verbs': ['get', 'patch', 'update']})
        if subs:
            entry['subresources'] = subs
        return entry

    def _aggregated(self, groups):
        items = []
        for group, versions in groups:
            items.append({'metadata': {'name': group, 'creationTimestamp': None},
                          'versions': [{'version': v, 'resources': [self._discovery_entry(r) for r in self.registry.resources(group, v)],
                                        'freshness': 'Current'} for v in versions]})
        body = {'kind': 'APIGroupDiscoveryList', 'apiVersion': 'apidiscovery.k8s.io/v2', 'metadata': {}, 'items': items}
        return _json_response(body, headers={'Vary': 'Accept'}, content_type=DISCOVERY_V2)

    @staticmethod
    def _wants_aggregated(request):
        return any(p.get('as') == 'APIGroupDiscoveryList' and p.get('v') == 'v2' and p.get('g') == 'apidiscovery.k8s.io'
                   for dummy, p in _accepts(request))

    def _discovery_core(self, request):
        if self._wants_aggregated(request):
            return self._aggregated([g for g in self.registry.groups() if g[0] == ''])
        host = request.host or '%s:%d' % (self.hosts[0], self.port)
        return _json_response({'kind': 'APIVersions', 'versions': ['v1'],
                               'serverAddressByClientCIDRs': [{'clientCIDR': '0.0.0.0/0', 'serverAddress': host}]},
                              headers={'Vary': 'Accept'})

    def _group_doc(self, group, versions):
        gvs = [{'groupVersion': '%s/%s' % (group, v), 'version': v} for v in versions]
        return {'name': group, 'versions': gvs, 'preferredVersion': gvs[0]}

    def _discovery_groups(self, request):
        groups = [g for g in self.registry.groups() if g[0] != '']
        if self._wants_aggregated(request):
            return self._aggregated(groups)
        return _json_response({'kind': 'APIGroupList', 'apiVersion': 'v1', 'groups': [self._group_doc(g, v) for g, v in groups]},
                              headers={'Vary': 'Accept'})

    def _group(self, group):
        for name, versions in self.registry.groups():
            if name == group and name:
                return _json_response(dict(self._group_doc(name, versions), kind='APIGroup', apiVersion='v1'))
        raise self._unknown()

    # --- resources --------------------------------------------------------------------------------

    async def _resource(self, request, group, version, rest):  # pylint: disable=too-many-branches,too-many-return-statements
        if not self.registry.has_group_version(group, version):
            raise self._unknown()
        if not rest:
            if request.method != 'GET':
                raise ApiError(405, 'MethodNotAllowed', 'the server does not allow this method on the requested resource')
            return _json_response({'kind': 'APIResourceList', 'apiVersion': 'v1',
                                   'groupVersion': '%s/%s' % (group, version) if group else version,
                                   'resources': self._resource_list_entries(group, version)})
        namespace = None
        if rest[0] == 'namespaces' and len(rest) >= 3 and not (group == '' and rest[2] in ('status', 'finalize') and len(rest) == 3):
            namespace, rest = rest[1], rest[2:]
        rtype = self.registry.get(group, version, rest[0])
        if rtype is None:
            raise self._unknown()
        if namespace is not None and not rtype.namespaced:
            raise self._unknown()
        name = rest[1] if len(rest) > 1 else None
        sub = '/'.join(rest[2:]) if len(rest) > 2 else ''
        if rtype.key == ('', 'services') and len(rest) > 2 and rest[2] == 'proxy':
            return await self._service_proxy(request, namespace, name, '/' + '/'.join(rest[3:]))
        if sub and sub not in rtype.subresources:
            raise self._unknown()
        if rtype.namespaced and name is not None and namespace is None:
            raise self._unknown()
        method = request.method
        query = request.query
        if name is None:
            if method == 'GET':
                if _bool(query.get('watch', '')):
                    return await self._watch(request, rtype, namespace)
                return self._list(request, rtype, namespace)
            if method == 'POST':
                if rtype.namespaced and namespace is None:
                    raise ApiError(405, 'MethodNotAllowed', 'the server does not allow this method on the requested resource')
                body = await self._body(request)
                obj, warnings = self.store.create(rtype, namespace, body, self._manager(request), self._dry_run(request),
                                                  self._validation(request))
                return self._object_response(request, rtype, obj, 201, warnings)
            if method == 'DELETE':
                return await self._delete_collection(request, rtype, namespace)
            raise ApiError(405, 'MethodNotAllowed', 'the server does not allow this method on the requested resource')
        if sub == 'scale':
            return await self._scale(request, rtype, namespace, name)
        if sub == 'log':
            return self._pod_log(request, namespace, name)
        if method == 'GET':
            obj = self.store.get(rtype, namespace if rtype.namespaced else '', name)
            return self._object_response(request, rtype, obj)
        if method == 'PUT':
            body = await self._body(request)
            if sub == 'finalize':
                sub = ''
            obj, warnings = self.store.update(rtype, namespace, name, body, self._manager(request), sub, self._dry_run(request),
                                              self._validation(request))
            return self._object_response(request, rtype, obj, 200, warnings)
        if method == 'PATCH':
            content_type = (request.headers.get('Content-Type') or '').split(';')[0].strip().lower()
            patch_type = PATCH_TYPES.get(content_type)
            if patch_type is None:
                raise ApiError(415, 'UnsupportedMediaType', 'the body of the request was in an unknown format - accepted media types include: '
                               '%s' % ', '.join(PATCH_TYPES))
            raw = await request.read()
            obj, warnings = self.store.patch(rtype, namespace, name, patch_type, raw, self._manager(request, patch_type == 'apply'),
                                             _bool(query.get('force', '')), sub, self._dry_run(request), self._validation(request))
            return self._object_response(request, rtype, obj, 200, warnings)
        if method == 'DELETE':
            options = await self._delete_options(request)
            obj = self.store.delete(rtype, namespace, name, options.get('propagationPolicy'), self._dry_run(request, options),
                                    options.get('preconditions'))
            return self._object_response(request, rtype, obj)
        raise ApiError(405, 'MethodNotAllowed', 'the server does not allow this method on the requested resource')

    async def _body(self, request):
        raw = await request.read()
        content_type = (request.headers.get('Content-Type') or 'application/json').split(';')[0].strip().lower()
        if 'protobuf' in content_type:
            return protobuf.decode(raw)
        if 'cbor' in content_type:
            raise ApiError(415, 'UnsupportedMediaType', 'the body of the request was in an unknown format - accepted media types include: '
                           'application/json, application/yaml')
        try:
            return json.loads(raw) if content_type.endswith('json') else yaml.safe_load(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise ApiError(400, 'BadRequest', 'the body of the request could not be decoded: %s' % exc) from exc

    @staticmethod
    def _manager(request, required=False):
        manager = request.query.get('fieldManager')
        if manager or required:
            return manager or ''
        agent = request.headers.get('User-Agent') or 'unknown'
        return agent.split('/')[0]

    @staticmethod
    def _dry_run(request, options=None):
        values = request.query.getall('dryRun', [])
        if options and options.get('dryRun'):
            values = list(values) + list(options['dryRun'])
        for value in values:
            if value != 'All':
                raise ApiError(400, 'BadRequest', 'Invalid dry run value: %s' % value)
        return bool(values)

    @staticmethod
    def _validation(request):
        value = request.query.get('fieldValidation', 'Warn')
        if value not in ('Ignore', 'Warn', 'Strict'):
            raise ApiError(400, 'BadRequest', 'fieldValidation: Unsupported value: "%s": supported values: "Ignore", "Strict", "Warn"' % value)
        return value

    async def _delete_options(self, request):
        options = {}
        if request.can_read_body:
            raw = await request.read()
            if raw.startswith(protobuf.MAGIC):
                options = protobuf.decode(raw)
            elif raw.strip():
                try:
                    options = json.loads(raw)
                except ValueError as exc:
                    raise ApiError(400, 'BadRequest', 'invalid DeleteOptions: %s' % exc) from exc
        if request.query.get('propagationPolicy'):
            options['propagationPolicy'] = request.query['propagationPolicy']
        if options.get('orphanDependents') is True and 'propagationPolicy' not in options:
            options['propagationPolicy'] = 'Orphan'
        return options

    def _versioned(self, rtype, obj):
        if rtype.custom and obj.get('apiVersion') != rtype.api_version:
            return dict(obj, apiVersion=rtype.api_version)
        return obj

    def _object_response(self, request, rtype, obj, status=200, warnings=()):
        headers = {}
        if warnings:
            headers['Warning'] = ', '.join('299 - %s' % json.dumps(w) for w in warnings)
        obj = self._versioned(rtype, obj)
        if _wants(request, 'Table'):
            return _json_response(tables.table(rtype, [obj], obj['metadata'].get('resourceVersion', ''), request.query.get('includeObject',
                                                                                                                           'Metadata')),
                                  status, headers)
        if _wants(request, 'PartialObjectMetadata'):
            return _json_response({'kind': 'PartialObjectMetadata', 'apiVersion': 'meta.k8s.io/v1', 'metadata': obj['metadata']}, status,
                                  headers)
        return _json_response(obj, status, headers)

    def _select(self, request, rtype, namespace):
        labels = LabelSelector(request.query.get('labelSelector', ''))
        fields = FieldSelector(request.query.get('fieldSelector', ''), rtype)
        items = self.store.items(rtype.key, namespace if rtype.namespaced else None)
        return [o for o in items if (not labels or labels.matches(o['metadata'].get('labels'))) and (not fields or fields.matches(o))]

    def _list(self, request, rtype, namespace):
        items = sorted(self._select(request, rtype, namespace), key=lambda o: (o['metadata'].get('namespace', ''), o['metadata']['name']))
        rv = str(self.store.rv)
        meta = {'resourceVersion': rv}
        token = request.query.get('continue')
        if token:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
                start = int(state['offset'])
                rv = meta['resourceVersion'] = state['rv']
            except (ValueError, KeyError, TypeError) as exc:
                raise ApiError(400, 'BadRequest', 'continue key is not valid: %s' % exc) from exc
            items = items[start:]
        else:
            start = 0
        limit = int(request.query.get('limit') or 0)
        if limit > 0 and len(items) > limit:
            meta['continue'] = base64.urlsafe_b64encode(json.dumps({'rv': rv, 'offset': start + limit}).encode()).decode()
            meta['remainingItemCount'] = len(items) - limit
            items = items[:limit]
        items = [self._versioned(rtype, o) for o in items]
        if _wants(request, 'Table'):
            body = tables.table(rtype, items, rv, request.query.get('includeObject', 'Metadata'))
            body['metadata'].update({k: v for k, v in meta.items() if k != 'resourceVersion'})
            return _json_response(body)
        if _wants(request, 'PartialObjectMetadataList'):
            return _json_response({'kind': 'PartialObjectMetadataList', 'apiVersion': 'meta.k8s.io/v1', 'metadata': meta,
                                   'items': [{'kind': 'PartialObjectMetadata', 'apiVersion': 'meta.k8s.io/v1', 'metadata': o['metadata']}
                                             for o in items]})
        return _json_response({'kind': rtype.list_kind, 'apiVersion': rtype.api_version, 'metadata': meta, 'items': items})

    async def _delete_collection(self, request, rtype, namespace):
        options = await self._delete_options(request)
        dry_run = self._dry_run(request, options)
        deleted = []
        for obj in self._select(request, rtype, namespace):
            deleted.append(self.store.delete(rtype, obj['metadata'].get('namespace'), obj['metadata']['name'],
                                             options.get('propagationPolicy'), dry_run))
        return _json_response({'kind': rtype.list_kind, 'apiVersion': rtype.api_version, 'metadata': {'resourceVersion': str(self.store.rv)},
                               'items': [self._versioned(rtype, o) for o in deleted]})

    async def _scale(self, request, rtype, namespace, name):
        if request.method == 'GET':
            return _json_response(self.store.scale(rtype, namespace, name))
        if request.method == 'PUT':
            body = await self._body(request)
            return _json_response(self.store.scale(rtype, namespace, name, body, self._dry_run(request)))
        if request.method == 'PATCH':
            current = self.store.scale(rtype, namespace, name)
            content_type = (request.headers.get('Content-Type') or '').split(';')[0].strip().lower()
            raw = await request.read()
            from . import patch as patch_mod  # pylint: disable=import-outside-toplevel
            doc = yaml.safe_load(raw)
            if PATCH_TYPES.get(content_type) == 'json':
                wanted = patch_mod.json_patch(current, doc)
            else:
                wanted = patch_mod.merge_patch(current, doc)
            return _json_response(self.store.scale(rtype, namespace, name, wanted, self._dry_run(request)))
        raise ApiError(405, 'MethodNotAllowed', 'the server does not allow this method on the requested resource')

    # --- pod logs -----------------------------------------------------------------------------------

    def _pod_log(self, request, namespace, name):
        """GET pods/NAME/log: what the simulated container printed (a crash-looping one: its last error)."""
        if request.method != 'GET':
            raise ApiError(405, 'MethodNotAllowed', 'the server does not allow this method on the requested resource')
        pod = self.store.get(self.registry.get('', 'v1', 'pods'), namespace, name)
        containers = [c.get('name') for c in (pod.get('spec') or {}).get('containers') or ()]
        container = request.query.get('container') or (containers[0] if len(containers) == 1 else None)
        if container is None:
            raise ApiError(400, 'BadRequest', 'a container name must be specified for pod %s, choose one of: [%s]' % (name, ' '.join(containers)))
        if container not in containers:
            raise ApiError(400, 'BadRequest', 'container %s is not valid for pod %s' % (container, name))
        status = next((s for s in (pod.get('status') or {}).get('containerStatuses') or () if s.get('name') == container), {})
        state = status.get('state') or {}
        if 'waiting' in state and state['waiting'].get('reason') == 'ContainerCreating':
            raise ApiError(400, 'BadRequest', 'container "%s" in pod "%s" is waiting to start: ContainerCreating' % (container, name))
        stamp = (state.get('running') or {}).get('startedAt') or ((status.get('lastState') or {}).get('terminated') or {}).get('finishedAt', '')
        lines = ['%s level=info msg="Started %s (lab simulation)" container=%s' % (stamp, container, container)]
        if (state.get('waiting') or {}).get('reason') == 'CrashLoopBackOff' or _bool(request.query.get('previous', '')):
            lines.append('%s level=fatal msg="exiting with code 1 (lab fault k8s-crashloop)" container=%s restarts=%d'
                         % (stamp, container, status.get('restartCount', 0)))
        tail = request.query.get('tailLines')
        if tail and tail.isdigit():
            lines = lines[-int(tail):] if int(tail) else []
        return web.Response(text=''.join(line + '\n' for line in lines), content_type='text/plain')

    # --- service proxy --------------------------------------------------------------------------

    async def _service_proxy(self, request, namespace, name, path):
        """/api/v1/namespaces/NS/services/[scheme:]NAME[:port]/proxy/PATH, answered by a handler the lab registered."""
        parts = name.split(':')
        service = parts[1] if len(parts) > 1 and parts[0] in ('http', 'https') else parts[0]
        svc_type = self.registry.get('', 'v1', 'services')
        self.store.get(svc_type, namespace, service)
        handler = self.service_proxies.get((namespace, service))
        if handler is None:
            raise ApiError(503, 'ServiceUnavailable', 'no endpoints available for service "%s"' % name)
        body = await request.read()
        status, content_type, data = handler(request.method, path, dict(request.query), body)
        return web.Response(body=data, status=status, content_type=content_type.split(';')[0])

    # --- watch ----------------------------------------------------------------------------------

    async def _watch(self, request, rtype, namespace):  # pylint: disable=too-many-locals,too-many-branches,too-many-statements
        query = request.query
        labels = LabelSelector(query.get('labelSelector', ''))
        fields = FieldSelector(query.get('fieldSelector', ''), rtype)
        ns = namespace if rtype.namespaced else None
        as_table = _wants(request, 'Table')

        def matches(obj):
            if obj is None:
                return False
            if ns is not None and obj['metadata'].get('namespace') != ns:
                return False
            return (not labels or labels.matches(obj['metadata'].get('labels'))) and (not fields or fields.matches(obj))

        try:
            timeout = float(query.get('timeoutSeconds') or DEFAULT_WATCH_SECONDS)
        except ValueError as exc:
            raise ApiError(400, 'BadRequest', 'invalid timeoutSeconds') from exc
        bookmarks = _bool(query.get('allowWatchBookmarks', ''))
        send_initial = _bool(query.get('sendInitialEvents', ''))
        rv_text = query.get('resourceVersion', '')
        if send_initial and not bookmarks:
            raise ApiError(422, 'Invalid', 'ListOptions.meta.k8s.io "" is invalid: allowWatchBookmarks: Forbidden: sendInitialEvents '
                           'requires setting allowWatchBookmarks to true')
        queue = asyncio.Queue()

        def on_event(event):
            if event.key == rtype.key:
                queue.put_nowait(event)

        backlog = []
        initial = []
        self.store.subscribe(on_event)
        try:
            if send_initial or rv_text in ('', '0'):
                initial = [o for o in self.store.items(rtype.key, ns) if matches(o)]
            else:
                try:
                    since = int(rv_text)
                except ValueError as exc:
                    raise ApiError(400, 'BadRequest', 'invalid resource version: %s' % rv_text) from exc
                events = self.store.events_since(since)
                if events is None:
                    backlog = None
                else:
                    backlog = [e for e in events if e.key == rtype.key]
            start_rv = self.store.rv
            response = web.StreamResponse(status=200, headers={'Content-Type': 'application/json', 'Cache-Control': 'no-cache'})
            response.enable_chunked_encoding()
            await response.prepare(request)
            task = asyncio.current_task()
            self._watches.add(task)

            async def send(event_type, obj):
                obj = self._versioned(rtype, obj)
                if as_table and event_type != 'BOOKMARK' and event_type != 'ERROR':
                    obj = tables.table(rtype, [obj], obj['metadata'].get('resourceVersion', ''), query.get('includeObject', 'Metadata'))
                await response.write(json.dumps({'type': event_type, 'object': obj}, separators=(',', ':')).encode() + b'\n')

            async def bookmark(rv, initial_end=False):
                meta = {'resourceVersion': str(rv)}
                if initial_end:
                    meta['annotations'] = {'k8s.io/initial-events-end': 'true'}
                await response.write(json.dumps({'type': 'BOOKMARK', 'object': {'kind': rtype.kind, 'apiVersion': rtype.api_version,
                                                                                'metadata': meta}}).encode() + b'\n')

            try:
                if backlog is None:
                    gone = ApiError(410, 'Expired', 'too old resource version: %s (%s)' % (rv_text, self.store.rv))
                    await response.write(json.dumps({'type': 'ERROR', 'object': gone.status()}).encode() + b'\n')
                    return response
                for obj in initial:
                    await send('ADDED', obj)
                if send_initial:
                    await bookmark(start_rv, initial_end=True)
                for event in backlog:
                    await self._send_event(send, event, matches)
                deadline = time.monotonic() + timeout
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    try:
                        event = await asyncio.wait_for(queue.get(), min(remaining, WATCH_BOOKMARK_SECONDS))
                    except asyncio.TimeoutError:
                        if bookmarks and time.monotonic() < deadline:
                            await bookmark(self.store.rv)
                        continue
                    if self.flapping is not None and self.flapping.down():
                        break
                    await self._send_event(send, event, matches)
            except (ConnectionResetError, asyncio.CancelledError, RuntimeError):
                pass
            finally:
                self._watches.discard(task)
            return response
        finally:
            self.store.unsubscribe(on_event)

    @staticmethod
    async def _send_event(send, event, matches):
        if event.type == 'ADDED':
            if matches(event.obj):
                await send('ADDED', event.obj)
        elif event.type == 'DELETED':
            if matches(event.old) or matches(event.obj):
                await send('DELETED', event.obj)
        else:
            now_match, was_match = matches(event.obj), matches(event.old)
            if now_match and was_match:
                await send('MODIFIED', event.obj)
            elif now_match:
                await send('ADDED', event.obj)
            elif was_match:
                await send('DELETED', event.obj)
