"""The sealed-secrets controller (bitnami-labs/sealed-secrets) of one lab cluster.

It "runs" while Deployment kube-system/sealed-secrets-controller has a Ready pod, and, like the
real controller (pkg/controller/main.go, keys.go, keyregistry.go, server.go):

- at start (each time a new pod becomes Ready) it loads the Secrets of its namespace labelled
  `sealedsecrets.bitnami.com/sealed-secrets-key=active` (and the legacy Secret named exactly
  like the key prefix); if there is none, or renewal is on and the newest key is older than the
  renewal period (flag --key-renew-period / --rotate-period or env
  SEALED_SECRETS_KEY_RENEW_PERIOD; default 720h, 0 turns it off), it generates a key (RSA 4096,
  self-signed certificate, NotBefore now) and stores it as a new active Secret
  `sealed-secrets-key<random>` - which is what a check of the served certificate must catch;
- a key Secret it cannot parse makes it refuse to start (the real one panics): it serves
  nothing and `lab status` shows the reason;
- it serves, through the API server's service proxy of Service sealed-secrets-controller,
  GET /healthz, GET /v1/cert.pem (the certificate of the newest key, by NotBefore) and
  POST /v1/verify;
- it unseals every SealedSecret (bitnami.com/v1alpha1) with all its keys (the collection's
  _sealed.unseal: OAEP label from the SealedSecret's own metadata and scope annotations) into a
  Secret owned by it, and sets condition Synced True, or False with the reason.
"""

import asyncio
import base64
import datetime
import logging
import secrets
import string

from ansible_collections.proxtalos.cluster.plugins.module_utils import _sealed
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError

from lab.k8s.errors import ApiError
from lab.k8s.store import timestamp

from . import durations

LOG = logging.getLogger('lab.flux.sealed')

KEY_LABEL = 'sealedsecrets.bitnami.com/sealed-secrets-key'
SEALED_KEY = ('bitnami.com', 'sealedsecrets')
SECRET_KEY = ('', 'secrets')
DEFAULT_RENEW_PERIOD = 720 * 3600.0
_SUFFIX = string.ascii_lowercase + string.digits


def _same_secret(existing, wanted):
    """Whether the Secret already holds what the SealedSecret says (so nothing is written)."""
    meta, want_meta = existing['metadata'], wanted['metadata']
    return (existing.get('type') == wanted.get('type') and (existing.get('data') or {}) == wanted.get('data')
            and existing.get('immutable') == wanted.get('immutable')
            and all((meta.get(f) or {}) == (want_meta.get(f) or {}) for f in ('labels', 'annotations'))
            and any(r.get('uid') == want_meta['ownerReferences'][0]['uid'] for r in meta.get('ownerReferences') or ()))


class KeyProblem(Exception):
    """A key Secret the controller cannot load."""


class SealedSecretsController(object):  # pylint: disable=too-many-instance-attributes
    """One cluster's sealed-secrets controller (store = lab.k8s.store.Store)."""

    def __init__(self, store, namespace='kube-system', name='sealed-secrets-controller', key_size=4096, clock=None):
        self.store = store
        self.registry = store.registry
        self.namespace = namespace
        self.name = name
        self.key_size = key_size
        self.clock = clock or (lambda: datetime.datetime.now(datetime.timezone.utc))
        self.keys = []               # [(secret name, private key, certificate, cert PEM bytes)]
        self.started_pods = set()    # uids of the pods this controller has started in
        self.running = False
        self.problem = ''
        self.generated = []          # names of key Secrets this controller generated
        self._dirty = set()
        self._wake = None
        self._task = None
        self._starting = None
        store.subscribe(self._on_event)

    # --- plumbing ---------------------------------------------------------------------------

    def start(self):
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())
            self._kick('deployment')

    def stop(self):
        self.store.unsubscribe(self._on_event)
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _kick(self, item):
        self._dirty.add(item)
        if self._wake is not None:
            self._wake.set()

    def _on_event(self, event):
        meta = event.obj['metadata']
        if event.key == SEALED_KEY:
            self._kick(('sealed', meta.get('namespace'), meta['name']))
        elif event.key in (('apps', 'deployments'), ('', 'pods')) and meta.get('namespace') == self.namespace:
            self._kick('deployment')
        elif event.key == SECRET_KEY:
            for ref in meta.get('ownerReferences') or ():
                if ref.get('kind') == 'SealedSecret':
                    self._kick(('sealed', meta.get('namespace'), ref.get('name')))

    async def _run(self):
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._dirty:
                item = self._dirty.pop()
                try:
                    if item == 'deployment':
                        await self._check_pods()
                    elif self.running:
                        self.unseal_one(item[1], item[2])
                except asyncio.CancelledError:
                    raise
                except Exception:  # pylint: disable=broad-except
                    LOG.exception('sealed-secrets controller: %s failed', item)

    # --- start and keys -------------------------------------------------------------------------

    def deployment(self):
        return self.store.peek(('apps', 'deployments'), self.namespace, self.name)

    def _ready_pods(self, deployment):
        selector = ((deployment.get('spec') or {}).get('selector') or {}).get('matchLabels') or {}
        pods = []
        for pod in self.store.items(('', 'pods'), self.namespace):
            labels = pod['metadata'].get('labels') or {}
            if selector and all(labels.get(k) == v for k, v in selector.items()):
                ready = any(c.get('type') == 'Ready' and c.get('status') == 'True' for c in (pod.get('status') or {}).get('conditions') or ())
                if ready and not pod['metadata'].get('deletionTimestamp'):
                    pods.append(pod)
        return pods

    async def _check_pods(self):
        deployment = self.deployment()
        pods = self._ready_pods(deployment) if deployment is not None else []
        if not pods:
            if self.running:
                LOG.info('sealed-secrets controller stopped (no Ready pod)')
            self.running = False
            return
        new = [p for p in pods if p['metadata']['uid'] not in self.started_pods]
        if not new and self.running:
            return
        for pod in new:
            self.started_pods.add(pod['metadata']['uid'])
        await self._start(deployment)

    def settings(self, deployment):
        """(renew period seconds, key prefix) from the controller's args and env, as its flags parse them."""
        renew = DEFAULT_RENEW_PERIOD
        prefix = 'sealed-secrets-key'
        containers = ((((deployment.get('spec') or {}).get('template') or {}).get('spec') or {}).get('containers')) or []
        for container in containers[:1]:
            for env in container.get('env') or ():
                if env.get('name') == 'SEALED_SECRETS_KEY_RENEW_PERIOD' and env.get('value') is not None:
                    renew = durations.parse(env['value'], renew)
                if env.get('name') == 'SEALED_SECRETS_KEY_PREFIX' and env.get('value'):
                    prefix = env['value']
            args = list(container.get('args') or []) + list(container.get('command') or [])[1:]
            for index, arg in enumerate(args):
                flag, has_value, value = arg.partition('=')
                if not has_value and index + 1 < len(args) and not args[index + 1].startswith('-'):
                    value = args[index + 1]
                if flag in ('--key-renew-period', '--rotate-period'):
                    renew = durations.parse(value.strip('"'), renew)
                elif flag == '--key-prefix' and value:
                    prefix = value
        return renew, prefix

    def _load(self, prefix):
        keys = []
        secrets_seen = []
        for secret in self.store.items(SECRET_KEY, self.namespace):
            labels = secret['metadata'].get('labels') or {}
            if labels.get(KEY_LABEL) == 'active' or secret['metadata']['name'] == prefix:
                secrets_seen.append(secret)
        for secret in sorted(secrets_seen, key=lambda s: s['metadata']['name']):
            data = secret.get('data') or {}
            name = secret['metadata']['name']
            try:
                key_pem = base64.b64decode(data.get('tls.key') or '')
                cert_pem = base64.b64decode(data.get('tls.crt') or '')
                key = _sealed.load_private_key(key_pem, 'Secret %s tls.key' % name)
                certificate, dummy = _sealed.load_certificate(cert_pem, 'Secret %s tls.crt' % name)
            except (ProxtalosError, ValueError, TypeError) as exc:
                raise KeyProblem('panic: %s' % exc) from None
            keys.append((name, key, certificate, cert_pem))
        return keys

    async def _start(self, deployment):
        renew, prefix = self.settings(deployment)
        try:
            keys = self._load(prefix)
        except KeyProblem as exc:
            self.running, self.keys, self.problem = False, [], str(exc)
            LOG.warning('sealed-secrets controller does not start: %s', exc)
            return
        newest = max(keys, key=lambda k: k[2].not_valid_before_utc) if keys else None
        now = self.clock()
        if newest is None or (renew > 0 and (now - newest[2].not_valid_before_utc).total_seconds() >= renew):
            keys.append(await self._generate(prefix))
        self.keys, self.running, self.problem = keys, True, ''
        LOG.info('sealed-secrets controller started with %d key(s); sealing key %s', len(keys), self.sealing_key()[0])
        for sealed in self.store.items(SEALED_KEY):
            self._kick(('sealed', sealed['metadata']['namespace'], sealed['metadata']['name']))

    async def _generate(self, prefix):
        loop = asyncio.get_running_loop()
        key_pem, cert_pem = await loop.run_in_executor(None, _sealed.generate_keypair, self.key_size, '')
        name = prefix + ''.join(secrets.choice(_SUFFIX) for dummy in range(5))
        rtype = self.registry.by_key(SECRET_KEY)
        self.store.internal_create(rtype, {
            'apiVersion': 'v1', 'kind': 'Secret', 'type': 'kubernetes.io/tls',
            'metadata': {'name': name, 'namespace': self.namespace, 'labels': {KEY_LABEL: 'active'}},
            'data': {'tls.crt': base64.b64encode(cert_pem).decode(), 'tls.key': base64.b64encode(key_pem).decode()}})
        self.generated.append(name)
        certificate, dummy = _sealed.load_certificate(cert_pem)
        return name, _sealed.load_private_key(key_pem), certificate, cert_pem

    def sealing_key(self):
        """The key the controller seals with: the newest certificate (NotBefore), as --key-order-priority CertNotBefore."""
        if not self.keys:
            return None
        return max(self.keys, key=lambda k: k[2].not_valid_before_utc)

    # --- HTTP (through the API server's service proxy) -------------------------------------------

    def serve(self, method, path, body=b''):
        """(status, content type, body bytes) for one request to the controller's port 8080."""
        if not self.running:
            return 503, 'text/plain', b'the sealed-secrets controller is not running' + (
                (': ' + self.problem).encode() if self.problem else b'')
        path = '/' + path.lstrip('/')
        if method == 'GET' and path == '/healthz':
            return 200, 'text/plain', b'ok'
        if method == 'GET' and path == '/v1/cert.pem':
            return 200, 'application/x-pem-file', self.sealing_key()[3]
        if method == 'POST' and path == '/v1/verify':
            import json  # pylint: disable=import-outside-toplevel
            try:
                sealed = json.loads(body or b'{}')
                _sealed.unseal(sealed, [k[1] for k in self.keys])
            except (ValueError, ProxtalosError) as exc:
                return 409, 'text/plain', str(exc).encode()
            return 200, 'text/plain', b''
        return 404, 'text/plain', b'404 page not found\n'

    # --- unsealing ---------------------------------------------------------------------------

    def unseal_one(self, namespace, name):  # pylint: disable=too-many-locals
        sealed = self.store.peek(SEALED_KEY, namespace, name)
        if sealed is None or not self.keys:
            return
        generation = sealed['metadata'].get('generation', 1)
        template = (sealed.get('spec') or {}).get('template') or {}
        try:
            values = _sealed.unseal(sealed, [k[1] for k in self.keys])
            error = ''
        except ProxtalosError as exc:
            values, error = None, 'no key could decrypt secret (%s)' % exc
        secret_type = self.registry.by_key(SECRET_KEY)
        existing = self.store.peek(SECRET_KEY, namespace, name)
        owner = {'apiVersion': 'bitnami.com/v1alpha1', 'kind': 'SealedSecret', 'name': name, 'uid': sealed['metadata']['uid'],
                 'controller': True}
        if not error and existing is not None and not any(r.get('uid') == owner['uid'] for r in existing['metadata'].get('ownerReferences') or ()) \
                and (existing['metadata'].get('annotations') or {}).get('sealedsecrets.bitnami.com/managed') != 'true':
            error = 'Resource "%s" already exists and is not managed by SealedSecret' % name
        if not error:
            meta = template.get('metadata') or {}
            secret = {'apiVersion': 'v1', 'kind': 'Secret', 'type': template.get('type') or 'Opaque',
                      'metadata': {'name': name, 'namespace': namespace, 'ownerReferences': [owner]},
                      'data': {k: base64.b64encode(v).decode() for k, v in sorted(values.items())}}
            for field in ('labels', 'annotations'):
                if meta.get(field):
                    secret['metadata'][field] = dict(meta[field])
            if template.get('immutable') is not None:
                secret['immutable'] = template['immutable']
            try:
                if existing is None:
                    self.store.create(secret_type, namespace, secret, 'controller')
                elif not _same_secret(existing, secret):
                    body = dict(secret, metadata=dict(existing['metadata'], **secret['metadata']))
                    body['metadata']['resourceVersion'] = existing['metadata']['resourceVersion']
                    self.store.update(secret_type, namespace, name, body, 'controller')
            except ApiError as exc:
                error = exc.message
        status = dict(sealed.get('status') or {})
        now = timestamp()
        old = next((c for c in status.get('conditions') or () if c.get('type') == 'Synced'), {})
        wanted = 'False' if error else 'True'
        condition = {'type': 'Synced', 'status': wanted, 'lastUpdateTime': now,
                     'lastTransitionTime': old.get('lastTransitionTime', now) if old.get('status') == wanted else now}
        if error:
            condition['reason'] = 'ErrUnsealFailed' if values is None else 'ErrUpdateFailed'
            condition['message'] = error
        status['conditions'] = [condition]
        status['observedGeneration'] = generation
        if {k: v for k, v in (old or {}).items() if k not in ('lastUpdateTime',)} == \
                {k: v for k, v in condition.items() if k not in ('lastUpdateTime',)} and \
                (sealed.get('status') or {}).get('observedGeneration') == generation:
            return
        rtype = self.registry.by_key(SEALED_KEY)
        try:
            self.store.update(rtype, namespace, name, dict(sealed, status=status), 'controller', subresource='status')
        except ApiError as exc:
            LOG.warning('SealedSecret %s/%s status not written: %s', namespace, name, exc.message)

    def status(self):
        key = self.sealing_key()
        return {'running': self.running, 'problem': self.problem, 'keys': [k[0] for k in self.keys],
                'sealing_key': key[0] if key else None, 'generated': list(self.generated)}
