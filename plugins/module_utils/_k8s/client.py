# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kubernetes client factory and a narrow read-only client over plain JSON. PRIVATE.

build_client() resolves a kubeconfig (a file, or its content passed as a string or dict) and a
context with the official `kubernetes` package, then KubeClient does plain GETs through the
package's TLS-configured connection pool and returns dicts. The gates want plain JSON (their
predicates are pure functions over dicts), not generated model objects, and this way one pool
serves every probe of a module run.

Loading is cheap for the common kubeconfigs: when the selected user has static credentials (client
certificate and key, a token or token file, basic auth) and the cluster no proxy, the kubeconfig is read
here and urllib3 is set up directly, without importing the `kubernetes` package (importing it costs about
0.3 s of CPU, more than the rest of a gate's run; every gate task is a new process). Any other kubeconfig
(exec or auth-provider credentials, impersonation, proxy-url, several files in KUBECONFIG) is loaded by the
package, as before. Either way KubeClient.configuration gives a `kubernetes` Configuration for callers that
need the full client (it is built on first use).

Errors: connection refused/reset, timeouts, HTTP 429 and 5xx raise TransientApiError (a wait
treats them as "not yet"); TLS verification failures, 401/403 and other 4xx raise ApiError
(waiting does not fix them). 404 on a GET is "absent" (None), not an error.

Waking early: the client remembers the resourceVersion of every collection a probe read.
sleep_until_change(seconds) then watches those collections from those versions and returns as
soon as one of them changes (or when the seconds are up), so a gate sees a change within a few
milliseconds instead of at its next poll. Watching is an optimisation only: when a watch cannot
be opened (old resourceVersion, connection refused, a server without watch) the call just
waits the full interval, as a plain sleep would.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import shutil
import ssl
import tempfile
import threading
import time
import warnings
from urllib.parse import quote, urlencode

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils import _secrets

try:
    import yaml
    HAS_YAML = True
except ImportError:
    HAS_YAML = False

try:
    import urllib3
    HAS_URLLIB3 = True
    URLLIB3_IMPORT_ERROR = None
except ImportError as exc:
    HAS_URLLIB3 = False
    URLLIB3_IMPORT_ERROR = exc

try:
    # Only to know whether it is there: the package itself is imported when a kubeconfig needs it.
    import importlib.util
    HAS_KUBERNETES = importlib.util.find_spec('kubernetes') is not None
except (ImportError, ValueError):
    HAS_KUBERNETES = False
KUBERNETES_IMPORT_ERROR = None if HAS_KUBERNETES else 'No module named kubernetes'

k8s_client = None  # pylint: disable=invalid-name
k8s_config = None  # pylint: disable=invalid-name


class ConfigException(Exception):
    """Stand-in until the package is imported; _load_kubernetes() replaces it with the package's own."""


def _load_kubernetes():
    """Import the `kubernetes` package on first need (its import is slow)."""
    global k8s_client, k8s_config, ConfigException  # pylint: disable=global-statement,invalid-name
    if k8s_client is None:
        try:
            from kubernetes import client as package_client  # pylint: disable=import-outside-toplevel
            from kubernetes import config as package_config  # pylint: disable=import-outside-toplevel
            from kubernetes.config.config_exception import ConfigException as package_error  # pylint: disable=import-outside-toplevel
        except ImportError as exc:
            raise _errors.ValidationError('kubernetes', 'the kubernetes Python package is required (%s)' % exc)
        k8s_client, k8s_config, ConfigException = package_client, package_config, package_error
    return k8s_client, k8s_config


SERVICE = 'Kubernetes API'

# Kinds the gates read, so they need no discovery: (apiVersion, kind) -> (plural, namespaced).
KNOWN_RESOURCES = {
    ('v1', 'Node'): ('nodes', False),
    ('v1', 'Pod'): ('pods', True),
    ('v1', 'Namespace'): ('namespaces', False),
    ('v1', 'Secret'): ('secrets', True),
    ('v1', 'Event'): ('events', True),
    ('storage.k8s.io/v1', 'CSINode'): ('csinodes', False),
    ('apps/v1', 'DaemonSet'): ('daemonsets', True),
    ('apps/v1', 'Deployment'): ('deployments', True),
    ('apps/v1', 'StatefulSet'): ('statefulsets', True),
    ('apiextensions.k8s.io/v1', 'CustomResourceDefinition'): ('customresourcedefinitions', False),
}

# Secret-bearing keys of a kubeconfig's users[].user (and auth-provider config).
KUBECONFIG_SECRET_KEYS = ('client-key-data', 'token', 'password', 'id-token', 'refresh-token',
                          'client-secret', 'access-token')


def api_path(api_version, plural, namespace=None, name=None):
    """/api/v1/... for the core group, /apis/<group>/<version>/... otherwise."""
    base = '/api/%s' % api_version if '/' not in api_version else '/apis/%s' % api_version
    if namespace:
        base += '/namespaces/%s' % quote(namespace, safe='')
    base += '/%s' % plural
    if name:
        base += '/%s' % quote(name, safe='')
    return base


def kubeconfig_secrets(config_dict):
    """Secret strings of a kubeconfig dict: client keys (base64 and decoded), tokens, passwords."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in KUBECONFIG_SECRET_KEYS and isinstance(value, str):
                    found.append(value)
                    if key == 'client-key-data':
                        found.append(_b64_text(value))
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for user in (config_dict or {}).get('users') or []:
        walk(user)
    return [value for value in found if value]


def _b64_text(value):
    try:
        return base64.b64decode(value).decode('utf-8')
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None


def parse_kubeconfig_content(content):
    """kubeconfig_content (YAML text or a dict) -> dict, or ValidationError naming the field."""
    if isinstance(content, dict):
        data = content
    else:
        if not HAS_YAML:
            raise _errors.ValidationError('kubeconfig_content', 'PyYAML is needed to read kubeconfig content')
        try:
            data = yaml.safe_load(content)
        except yaml.YAMLError as exc:
            raise _errors.ValidationError('kubeconfig_content', 'not valid YAML (%s)' % exc.__class__.__name__)
    if not isinstance(data, dict) or not data.get('clusters'):
        raise _errors.ValidationError('kubeconfig_content', 'not a kubeconfig: no clusters list')
    return data


# What a kubeconfig may hold for the loader here; anything else goes to the kubernetes package.
STATIC_USER_KEYS = frozenset(('client-certificate', 'client-certificate-data', 'client-key', 'client-key-data', 'token',
                              'tokenFile', 'username', 'password'))
STATIC_CLUSTER_KEYS = frozenset(('server', 'certificate-authority', 'certificate-authority-data', 'insecure-skip-tls-verify',
                                 'tls-server-name', 'extensions'))


def _named(entries, name, what):
    for entry in entries or ():
        if isinstance(entry, dict) and entry.get('name') == name:
            return entry.get(what) if isinstance(entry.get(what), dict) else {}
    return None


class StaticConfiguration(object):
    """A kubeconfig with static credentials, read without the kubernetes package.

    host, verify_ssl, ssl_ca_cert (a path) or ca_data (PEM text), cert/key (a path or PEM bytes each),
    tls_server_name, and the Authorization header. kubernetes() gives the package's Configuration for the
    same kubeconfig (for callers that need the full client).
    """

    def __init__(self, host, package_loader):
        self.host = host
        self.verify_ssl = True
        self.ssl_ca_cert = None
        self.ca_data = None
        self.cert = None
        self.key = None
        self.tls_server_name = None
        self.authorization = None
        self._package_loader = package_loader
        self._package = None

    def auth_settings(self):
        """As the package's Configuration.auth_settings(): what goes in the request headers."""
        if not self.authorization:
            return {}
        return {'Authorization': {'in': 'header', 'key': 'authorization', 'value': self.authorization}}

    def kubernetes(self):
        """The kubernetes package's Configuration for the same kubeconfig and options."""
        if self._package is None:
            self._package = self._package_loader()
        return self._package

    def ssl_context(self):
        """An SSLContext with the CA, verification and client certificate of this configuration. A kubeconfig's CA
        is the only one trusted (as kubectl does); the system's CAs are loaded only when it names none (loading them
        takes longer than the rest of a client's setup)."""
        if self.verify_ssl and self.ssl_ca_cert:
            context = ssl.create_default_context(cafile=self.ssl_ca_cert)
        elif self.verify_ssl and self.ca_data:
            context = ssl.create_default_context(cadata=self.ca_data)
        elif self.verify_ssl:
            context = ssl.create_default_context()
        else:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert and self.key:
            _load_cert_chain(context, self.cert, self.key)
        return context

    def pool_manager(self):
        if not self.host.startswith('https://'):
            return urllib3.PoolManager()
        options = {'ssl_context': self.ssl_context()}
        if self.tls_server_name:
            options.update(server_hostname=self.tls_server_name, assert_hostname=self.tls_server_name)
        return urllib3.PoolManager(**options)


def _load_cert_chain(context, cert, key):
    """Load a client certificate and key given as paths or PEM bytes (bytes go through a private temp file that is
    removed at once: ssl loads keys from files only)."""
    folder = None
    try:
        if isinstance(cert, bytes) or isinstance(key, bytes):
            folder = tempfile.mkdtemp(prefix='proxtalos-k8s-')
            os.chmod(folder, 0o700)
        paths = []
        for name, value in (('client.crt', cert), ('client.key', key)):
            if isinstance(value, bytes):
                path = os.path.join(folder, name)
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(descriptor, 'wb') as handle:
                    handle.write(value)
                value = path
            paths.append(value)
        context.load_cert_chain(paths[0], paths[1])
    except (ssl.SSLError, OSError) as exc:
        raise _errors.ValidationError('kubeconfig', 'cannot load the client certificate and key of the kubeconfig user: %s'
                                      % (exc.__class__.__name__,))
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _decode_data(value, field):
    try:
        return base64.b64decode(value, validate=False)
    except (binascii.Error, ValueError, TypeError):
        raise _errors.ValidationError(field, 'not valid base64')


def static_configuration(data, base_dir, context, package_loader, field):
    """A StaticConfiguration for the kubeconfig dict, or None when the kubernetes package must load it."""
    contexts = data.get('contexts') or []
    name = context or data.get('current-context')
    selected = _named(contexts, name, 'context') if name else None
    if not selected:
        return None   # the package explains a missing context in its own words
    cluster = _named(data.get('clusters'), selected.get('cluster'), 'cluster')
    user = _named(data.get('users'), selected.get('user'), 'user') if selected.get('user') else {}
    if not cluster or user is None or not cluster.get('server'):
        return None
    if set(cluster) - STATIC_CLUSTER_KEYS or set(user) - STATIC_USER_KEYS:
        return None   # exec, auth-provider, impersonation, proxy-url ...

    def path_of(value):
        value = os.path.expanduser(str(value))
        return value if os.path.isabs(value) or not base_dir else os.path.join(base_dir, value)
    config = StaticConfiguration(str(cluster['server']).rstrip('/'), package_loader)
    config.tls_server_name = cluster.get('tls-server-name')
    if cluster.get('certificate-authority-data'):
        config.ca_data = _decode_data(cluster['certificate-authority-data'], field).decode('ascii', 'replace')
    elif cluster.get('certificate-authority'):
        config.ssl_ca_cert = path_of(cluster['certificate-authority'])
    if user.get('client-certificate-data'):
        config.cert = _decode_data(user['client-certificate-data'], field)
    elif user.get('client-certificate'):
        config.cert = path_of(user['client-certificate'])
    if user.get('client-key-data'):
        config.key = _decode_data(user['client-key-data'], field)
    elif user.get('client-key'):
        config.key = path_of(user['client-key'])
    token = user.get('token')
    if not token and user.get('tokenFile'):
        try:
            with open(path_of(user['tokenFile']), encoding='utf-8') as handle:
                token = handle.read().strip()
        except OSError as exc:
            raise _errors.ValidationError(field, 'cannot read the tokenFile of the kubeconfig user: %s' % exc.strerror)
    if token:
        config.authorization = 'Bearer %s' % token
    elif user.get('username') and user.get('password'):
        pair = ('%s:%s' % (user['username'], user['password'])).encode('utf-8')
        config.authorization = 'Basic %s' % base64.b64encode(pair).decode('ascii')
    return config


def _package_configuration(data, path, context):
    """The kubernetes package's Configuration for a kubeconfig dict (data) or file (path)."""
    client_module, config_module = _load_kubernetes()
    configuration = client_module.Configuration()
    if data is not None:
        config_module.load_kube_config_from_dict(data, context=context, client_configuration=configuration, persist_config=False)
    else:
        config_module.load_kube_config(config_file=path, context=context, client_configuration=configuration, persist_config=False)
    return configuration


def _kubeconfig_file(path):
    """The one kubeconfig file to read (path, or $KUBECONFIG, or ~/.kube/config), or None when KUBECONFIG names
    several files (the package merges them)."""
    if path:
        return path
    listed = [p for p in os.environ.get('KUBECONFIG', '').split(os.pathsep) if p]
    if len(listed) > 1:
        return None
    return os.path.expanduser(listed[0] if listed else '~/.kube/config')


def build_client(params, module=None, warn=None):
    """A KubeClient from K8S_AUTH_SPEC parameters.

    params: kubeconfig (path), kubeconfig_content (str or dict), context, validate_certs,
    ca_path, api_timeout. module: used to register secrets found in kubeconfig content.
    warn: callable(text) for the TLS-verification-off warning (module.warn).
    """
    if not HAS_URLLIB3:
        raise _errors.ValidationError('kubernetes', 'the urllib3 Python package is required (%s)' % URLLIB3_IMPORT_ERROR)
    path = params.get('kubeconfig')
    content = params.get('kubeconfig_content')
    context = params.get('context')
    if path and content:
        raise _errors.ValidationError('kubeconfig', 'give either kubeconfig (a path) or kubeconfig_content, not both')
    field = 'kubeconfig_content' if content else 'kubeconfig'
    ca_path = params.get('ca_path')
    if ca_path:
        ca_path = os.path.expanduser(ca_path)
        if not os.path.isfile(ca_path):
            raise _errors.ValidationError('ca_path', 'no such file: %s' % ca_path)
    validate = bool(params.get('validate_certs', True))

    data, file_path, base_dir = None, None, None
    if content:
        data = parse_kubeconfig_content(content)
        if module is not None:
            _secrets.register(module, *kubeconfig_secrets(data))
    else:
        if path:
            path = os.path.expanduser(path)
            if not os.path.isfile(path):
                raise _errors.ValidationError('kubeconfig', 'no such file: %s' % path)
        file_path = _kubeconfig_file(path)

    def package_loader():
        try:
            configuration = _package_configuration(data, path if data is None else None, context)
        except ConfigException as exc:
            text = str(exc)
            raise _errors.ValidationError('context' if context and 'context' in text.lower() else field, text)
        except (OSError, ValueError, TypeError) as exc:
            raise _errors.ValidationError(field, 'cannot load: %s' % (exc.__class__.__name__ if content else exc))
        if ca_path:
            configuration.ssl_ca_cert = ca_path
        configuration.verify_ssl = validate
        configuration.retries = False
        return configuration

    configuration = None
    if file_path is not None and HAS_YAML and os.path.isfile(file_path):
        base_dir = os.path.dirname(os.path.abspath(file_path))
        try:
            with open(file_path, encoding='utf-8') as handle:
                data_from_file = yaml.safe_load(handle) if HAS_YAML else None
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise _errors.ValidationError('kubeconfig', 'cannot load: %s' % exc.__class__.__name__)
        if isinstance(data_from_file, dict):
            configuration = static_configuration(data_from_file, base_dir, context, package_loader, field)
    elif data is not None:
        configuration = static_configuration(data, None, context, package_loader, field)
    if configuration is not None:
        if ca_path:
            configuration.ssl_ca_cert, configuration.ca_data = ca_path, None
        configuration.verify_ssl = validate
    else:
        if not HAS_KUBERNETES:
            raise _errors.ValidationError('kubernetes', 'the kubernetes Python package is required to load this kubeconfig (%s)'
                                          % KUBERNETES_IMPORT_ERROR)
        configuration = package_loader()
    if not validate:
        if warn is not None:
            warn('validate_certs=false: the certificate of the Kubernetes API at %s is not verified' % configuration.host)
        warnings.filterwarnings('ignore', category=urllib3.exceptions.InsecureRequestWarning)
    return KubeClient(configuration, timeout=params.get('api_timeout') or 10.0)


class KubeClient(object):
    """GETs (reads, watches) returning JSON dicts, and the few writes the collection makes itself (send_json), over
    one connection pool."""

    def __init__(self, configuration, timeout=10.0, clock=time.monotonic):
        self._configuration = configuration
        self.host = configuration.host.rstrip('/')
        self.timeout = float(timeout)
        self.deadline = None  # an _wait.Deadline; requests never outlive it by more than 1 s
        self.clock = clock
        self.requests = 0
        if isinstance(configuration, StaticConfiguration):
            self._pool = configuration.pool_manager()
        else:
            client_module = _load_kubernetes()[0]
            self._pool = client_module.ApiClient(configuration).rest_client.pool_manager
        self._resources = dict(KNOWN_RESOURCES)
        self._reads = {}  # (collection path, label selector, field selector) -> resourceVersion
        # A wake-up never comes sooner than max(min_pause, seconds / 10) after the sleep starts,
        # so a busy collection (heartbeats, restart counters) cannot turn the wait into a busy loop.
        self.min_pause = 0.02
        self.wakeups = 0

    @property
    def configuration(self):
        """The kubernetes package's Configuration (imports the package when the kubeconfig was read here)."""
        if isinstance(self._configuration, StaticConfiguration):
            return self._configuration.kubernetes()
        return self._configuration

    # --- transport ------------------------------------------------------------------------

    def _headers(self):
        headers = {'Accept': 'application/json', 'User-Agent': 'proxtalos.cluster/k8s_gate'}
        for setting in self._configuration.auth_settings().values():
            if setting.get('in') == 'header' and setting.get('value'):
                headers[setting['key']] = setting['value']
        return headers

    def _request_timeout(self):
        limit = self.timeout
        if self.deadline is not None:
            limit = min(limit, max(self.deadline.remaining(), 1.0))
        return limit

    def request(self, path, query=None, method='GET', body=None, content_type='application/json'):
        """method path (GET unless told; body bytes with its content_type) -> (status, body bytes). Connection
        problems raise TransientApiError."""
        url = self.host + path
        if query:
            url += '?' + urlencode([(k, v) for k, v in query.items() if v not in (None, '')])
        headers = self._headers()
        if body is not None:
            headers['Content-Type'] = content_type
        self.requests += 1
        try:
            response = self._pool.request(method, url, body=body, headers=headers, retries=False,
                                          timeout=urllib3.Timeout(total=self._request_timeout()))
        except urllib3.exceptions.SSLError as exc:
            raise _errors.ApiError('TLS with %s failed: %s (check ca_path, or the kubeconfig certificate-authority)'
                                   % (self.host, exc), service=SERVICE)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _errors.TransientApiError('%s at %s unreachable: %s' % (SERVICE, self.host, _short(exc)),
                                            service=SERVICE)
        return response.status, response.data

    def get_json(self, path, query=None):
        """GET returning the decoded JSON, or None for 404."""
        status, body = self.request(path, query)
        if status == 404:
            return None
        return _decoded(status, body, 'GET', path)

    def send_json(self, method, path, obj=None, query=None, content_type='application/json'):
        """A write (POST, PUT, PATCH with content_type, DELETE) of obj as JSON; returns the decoded answer.
        Any status from 400 up raises (ApiError; TransientApiError for 429 and 5xx) with the API's message, never
        the request body. Not retried here: the caller knows whether a write may be sent again."""
        body = json.dumps(obj).encode('utf-8') if obj is not None else None
        status, answer = self.request(path, query, method=method, body=body, content_type=content_type)
        return _decoded(status, answer, method, path)

    # --- resources -----------------------------------------------------------------------------

    def resource(self, api_version, kind):
        """(plural, namespaced) for a kind, from discovery of its group-version; None if not served."""
        key = (api_version, kind)
        if key not in self._resources:
            # Discover again while the kind is missing: a CRD may add it during the wait.
            base = '/api/%s' % api_version if '/' not in api_version else '/apis/%s' % api_version
            listing = self.get_json(base)
            if listing is None:
                return None
            for entry in listing.get('resources') or []:
                if '/' in entry.get('name', ''):
                    continue  # subresources such as deployments/status
                self._resources[(api_version, entry.get('kind'))] = (entry['name'], bool(entry.get('namespaced')))
        return self._resources.get(key)

    def _plural(self, api_version, kind):
        found = self.resource(api_version, kind)
        if found is None:
            raise NotServed(api_version, kind)
        return found

    def list(self, api_version, kind, namespace=None, label_selector=None, field_selector=None):
        """Items of a kind (all namespaces when namespace is None for namespaced kinds)."""
        plural, namespaced = self._plural(api_version, kind)
        path = api_path(api_version, plural, namespace if namespaced else None)
        data = self.get_json(path, {'labelSelector': label_selector, 'fieldSelector': field_selector})
        if data is None:
            raise NotServed(api_version, kind)
        self._remember(path, label_selector, field_selector, (data.get('metadata') or {}).get('resourceVersion'))
        items = data.get('items') or []
        for item in items:  # list items carry no kind; the predicates like to know it
            item.setdefault('kind', kind)
            item.setdefault('apiVersion', api_version)
        return items

    def get(self, api_version, kind, name, namespace=None):
        """One object as a dict, or None when it does not exist."""
        plural, namespaced = self._plural(api_version, kind)
        collection = api_path(api_version, plural, namespace if namespaced else None)
        obj = self.get_json('%s/%s' % (collection, quote(name, safe='')))
        if obj is not None:
            self._remember(collection, None, 'metadata.name=%s' % name, (obj.get('metadata') or {}).get('resourceVersion'))
        return obj

    # --- waking on change --------------------------------------------------------------------

    def _remember(self, path, label_selector, field_selector, resource_version):
        if resource_version:
            self._reads[(path, label_selector or None, field_selector or None)] = resource_version

    def forget_reads(self):
        """Start a new probe: only what it reads will be watched afterwards."""
        self._reads = {}

    def sleep_until_change(self, seconds, sleep=time.sleep):
        """Wait up to `seconds`; return early when a collection the last probe read changes."""
        targets = list(self._reads.items())
        if not targets or seconds <= 0:
            sleep(max(seconds, 0))
            return False
        changed = threading.Event()
        responses = []
        lock = threading.Lock()
        started = self.clock()
        for (path, label_selector, field_selector), version in targets:
            thread = threading.Thread(target=self._watch_one, name='k8s-gate-watch',
                                      args=(path, label_selector, field_selector, version, seconds, changed, responses, lock))
            thread.daemon = True
            thread.start()
        woke = changed.wait(seconds)
        if woke:
            self.wakeups += 1
            rest = min(seconds, max(self.min_pause, seconds / 10.0)) - (self.clock() - started)
            if rest > 0:
                sleep(rest)
        with lock:
            for response in responses:
                _abort(response)
            del responses[:]
        return woke

    def _watch_one(self, path, label_selector, field_selector, version, seconds, changed, responses, lock):  # pylint: disable=too-many-arguments
        """Stream one watch; set `changed` on the first real event (ADDED, MODIFIED, DELETED)."""
        query = {'watch': '1', 'resourceVersion': version, 'timeoutSeconds': str(max(1, int(math.ceil(seconds)))),
                 'labelSelector': label_selector, 'fieldSelector': field_selector}
        url = self.host + path + '?' + urlencode([(k, v) for k, v in query.items() if v])
        response = None
        try:
            response = self._pool.request('GET', url, headers=self._headers(), retries=False, preload_content=False,
                                          timeout=urllib3.Timeout(connect=min(self.timeout, seconds + 1), read=seconds + 1))
            with lock:
                if changed.is_set():
                    _abort(response)
                    return
                responses.append(response)
            if response.status != 200:
                return
            pending = b''
            for chunk in response.stream(amt=None, decode_content=True):
                pending += chunk
                while b'\n' in pending:
                    line, pending = pending.split(b'\n', 1)
                    if _is_change(line):
                        changed.set()
                        return
        except Exception:  # pylint: disable=broad-exception-caught
            # A watch is only a hint: any failure means "no early wake-up", never an error.
            return
        finally:
            if response is not None:
                response.release_conn()

    def readyz(self, verbose=False):
        """(HTTP status, body text) of /readyz; a 500 is an answer here, not an error."""
        status, body = self.request('/readyz', {'verbose': 'true'} if verbose else None)
        return status, body.decode('utf-8', 'replace')


def _decoded(status, body, method, path):
    """The JSON of an answer below 400; otherwise the error for its status, naming the request and the API's message."""
    what = path if method == 'GET' else '%s %s' % (method, path)
    if status == 429 or status >= 500:
        raise _errors.TransientApiError('%s answered %d for %s: %s' % (SERVICE, status, what, _status_message(body)),
                                        service=SERVICE, status=status)
    if status >= 400:
        hint = ' (credentials in the kubeconfig rejected)' if status == 401 else (
            ' (the kubeconfig user may not %s this)' % ('read' if method == 'GET' else 'write') if status == 403 else '')
        raise _errors.ApiError('%s answered %d for %s: %s%s' % (SERVICE, status, what, _status_message(body), hint),
                               service=SERVICE, status=status)
    try:
        return json.loads(body.decode('utf-8'))
    except (ValueError, UnicodeDecodeError):
        raise _errors.ApiError('%s sent a body that is not JSON for %s' % (SERVICE, what), service=SERVICE, status=status)


class NotServed(_errors.ProxtalosError):
    """The API does not serve this apiVersion/kind (yet): a CRD not installed, or a typo."""

    def __init__(self, api_version, kind):
        super().__init__('%s does not serve kind %s in %s (yet)' % (SERVICE, kind, api_version),
                         api_version=api_version, kind=kind)
        self.api_version = api_version
        self.kind = kind


def _status_message(body):
    try:
        data = json.loads(body.decode('utf-8'))
        if isinstance(data, dict) and data.get('message'):
            return data['message']
    except (ValueError, UnicodeDecodeError, AttributeError):
        pass
    text = body.decode('utf-8', 'replace').strip() if isinstance(body, bytes) else str(body)
    return text[:200] or '(empty body)'


def _short(exc):
    reason = getattr(exc, 'reason', None)
    text = str(reason or exc)
    return text if len(text) < 300 else text[:297] + '...'


def _is_change(line):
    """A watch line reporting a change (not a BOOKMARK, not an ERROR such as 410 Gone)."""
    try:
        event = json.loads(line.decode('utf-8'))
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(event, dict) and event.get('type') in ('ADDED', 'MODIFIED', 'DELETED')


def _abort(response):
    """Unblock a thread reading a streaming response (urllib3 >= 2.3 has shutdown())."""
    shutdown = getattr(response, 'shutdown', None)
    try:
        if shutdown is not None:
            shutdown()
        else:
            response.close()
    except Exception:  # pylint: disable=broad-exception-caught
        pass
