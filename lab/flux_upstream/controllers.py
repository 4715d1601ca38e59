"""Flux's controllers and the sealed-secrets controller, the pinned upstream builds, as processes against a lab
ControlPlane (lab/k8s_upstream).

What is upstream's, unchanged:
- the binaries: source-controller, kustomize-controller, helm-controller and sealed-secrets-controller, built from
  their Go modules by scripts/upstream_binaries.py (upstream/<name>.json);
- the CRDs: each Flux controller module's config/crd/bases/*.yaml, and the sealed-secrets chart's
  crds/bitnami.com_sealedsecrets.yaml, applied as they are;
- the RBAC: Flux's own, manifests/rbac/controller.yaml (ClusterRole crd-controller) and reconciler.yaml
  (cluster-admin for kustomize-controller and helm-controller, which apply whatever a repository holds) of
  github.com/fluxcd/flux2/v2 at FLUX_DISTRIBUTION; sealed-secrets' as its Helm chart (the module's helm/sealed-secrets)
  renders it with its default values, rendered by `helm template`;
- the Deployments and ServiceAccounts: each module's config/manager/deployment.yaml with the serviceAccountName that
  flux2's manifests/bases/<controller>/patch.yaml gives it, flux2's manifests/bases/<controller>/account.yaml, and
  the chart's Deployment; their pods are scheduled onto kwok Nodes and made Ready by kwok (the ControlPlane's);
- each controller's command line: the args of its Deployment, with the in-cluster addresses replaced (below).

What the lab changes, because the controllers run as processes on this machine, not in their pods:
- identity: each controller runs as its pod's container would, with a real token of its ServiceAccount: client-go's
  rest.InClusterConfig() reads /var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt} and
  KUBERNETES_SERVICE_HOST/PORT (k8s.io/client-go rest/config.go), and controller-runtime takes the leader-election
  namespace from .../namespace (the sealed-secrets controller knows nothing else: v0.40.0 pkg/controller/main.go:188;
  Flux's controllers have no leader-election namespace flag). Each runs in its own mount namespace (unshare) with a
  tmpfs on /run that only it sees, holding those files: a token from the TokenRequest API, the cluster CA, the
  namespace;
- addresses: every listener is on 127.0.0.1 at a free port: --metrics-addr, --health-addr, and source-controller's
  artifact server --storage-addr, advertised with --storage-adv-addr (the other controllers download artifacts from
  the URL it advertises); --storage-path is a directory of the work directory (the pod's emptyDir /data) and TMPDIR
  another (its emptyDir /tmp);
- the pod network: kube-apiserver reaches the sealed-secrets controller through its service proxy (as kubeseal and
  the collection's sealed_cert_gate do), which dials the pod's address kwok gave it; the lab exposes that address and
  the container's ports (the ones --listen-addr and --listen-metrics-addr of its Deployment name) on the control
  plane's pod network (lab/k8s_upstream/podnet.py), to the loopback ports the process listens on;
- no notification-controller (its module is not served by the Go module proxy here), so no --events-addr: the
  controllers record Kubernetes Events only;
- the kubelet's part: kwok runs no container, so each process follows the pods of its Deployment (sync): it runs
  while the pod it plays is Running, stops when that pod goes, and starts again, with the new pod's args, on a new
  one (a rollout, a replaced pod, a scale from 0).
"""

import base64
import glob
import os
import subprocess
import threading
import time
from urllib.parse import quote

import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait

from lab import upstream
from lab.cli import log_tail
from lab.k8s_upstream.controlplane import HOST, ControlPlaneError, free_port

# The Flux release whose controller versions upstream/{source,kustomize,helm}-controller.json pin: its go.mod requires
# the controllers' api modules at those versions and its manifests/bases/<controller>/kustomization.yaml names them.
FLUX_DISTRIBUTION = ('github.com/fluxcd/flux2/v2', 'v2.9.5')
FLUX_CONTROLLERS = ('source-controller', 'kustomize-controller', 'helm-controller')
SEALED_SECRETS = 'sealed-secrets-controller'
SEALED_SECRETS_CHART = 'helm/sealed-secrets'
FLUX_NAMESPACE = 'flux-system'
FLUX_OPERATOR = 'flux-operator'
SEALED_NAMESPACE = 'kube-system'
START_TIMEOUT, STOP_TIMEOUT = 120.0, 20.0
FIELD_MANAGER = 'proxtalos-lab'

# sealed-secrets v0.40.0 pkg/controller/server.go:21-22: the defaults of --listen-addr and --listen-metrics-addr
SEALED_LISTEN_DEFAULTS = {'--listen-addr': ':8080', '--listen-metrics-addr': ':8081'}
# How often kustomize-controller and helm-controller look again at an object whose dependency (spec.dependsOn) is not
# Ready: their flag --requeue-dependency, default 30 s (kustomize-controller v1.9.5 main.go:116, used at
# kustomization_controller.go:258-262; helm-controller v1.6.4 main.go:122). Nothing wakes a waiting object when its
# dependency turns Ready, so each level of a tree waits up to that long. A user may set the flag (a kustomize patch of
# the controller's args); the lab sets this shorter value when the Deployment does not set one, so a three-level tree
# is not a minute and a half of every test that builds a cluster. The gates' deadlines stay sized for the default.
LAB_REQUEUE_DEPENDENCY = '5s'

# kind -> (API path prefix, plural, namespaced) of the objects the lab applies
RESOURCES = {
    'Namespace': ('/api/v1', 'namespaces', False),
    'Pod': ('/api/v1', 'pods', True),
    'ServiceAccount': ('/api/v1', 'serviceaccounts', True),
    'Secret': ('/api/v1', 'secrets', True),
    'ConfigMap': ('/api/v1', 'configmaps', True),
    'Service': ('/api/v1', 'services', True),
    'CustomResourceDefinition': ('/apis/apiextensions.k8s.io/v1', 'customresourcedefinitions', False),
    'ClusterRole': ('/apis/rbac.authorization.k8s.io/v1', 'clusterroles', False),
    'ClusterRoleBinding': ('/apis/rbac.authorization.k8s.io/v1', 'clusterrolebindings', False),
    'Role': ('/apis/rbac.authorization.k8s.io/v1', 'roles', True),
    'RoleBinding': ('/apis/rbac.authorization.k8s.io/v1', 'rolebindings', True),
    'Deployment': ('/apis/apps/v1', 'deployments', True),
    'GitRepository': ('/apis/source.toolkit.fluxcd.io/v1', 'gitrepositories', True),
    'Kustomization': ('/apis/kustomize.toolkit.fluxcd.io/v1', 'kustomizations', True),
    'HelmRelease': ('/apis/helm.toolkit.fluxcd.io/v2', 'helmreleases', True),
    'SealedSecret': ('/apis/bitnami.com/v1alpha1', 'sealedsecrets', True),
    'FluxInstance': ('/apis/fluxcd.controlplane.io/v1', 'fluxinstances', True),
}


class FluxError(ControlPlaneError):
    """A controller did not start, or an object could not be applied."""


def go_module_dir(module, version):
    """The Go module cache directory of module@version (lab.upstream.go_module_dir), a FluxError when Go cannot get it."""
    try:
        return upstream.go_module_dir(module, version)
    except upstream.UpstreamError as exc:
        raise FluxError(str(exc)) from exc


def documents(text):
    return [doc for doc in yaml.safe_load_all(text) if doc]


def read_documents(path):
    with open(path, encoding='utf-8') as handle:
        return documents(handle.read())


def object_path(obj, namespace=None):
    """The API path of obj (its collection when it has no name)."""
    kind = obj.get('kind')
    if kind not in RESOURCES:
        raise FluxError('the lab does not know the resource of kind %r (known: %s)' % (kind, ', '.join(sorted(RESOURCES))))
    prefix, plural, namespaced = RESOURCES[kind]
    meta = obj.get('metadata') or {}
    path = prefix
    if namespaced:
        path += '/namespaces/%s' % (meta.get('namespace') or namespace or 'default')
    path += '/' + plural
    if meta.get('name'):
        path += '/' + meta['name']
    return path


def apply(cp, obj):
    """Server-side apply of obj as the lab's field manager (force: the lab owns what it applies)."""
    return cp.api('PATCH', object_path(obj) + '?fieldManager=%s&force=true' % FIELD_MANAGER, obj,
                  content_type='application/apply-patch+yaml')


def annotate(cp, kind, name, namespace, annotations):
    """Merge-patch annotations onto an object (a reconcile request: reconcile.fluxcd.io/requestedAt), leaving the
    fields a server-side apply owns alone."""
    path = object_path({'kind': kind, 'metadata': {'name': name, 'namespace': namespace}})
    return cp.api('PATCH', path, {'metadata': {'annotations': annotations}}, content_type='application/merge-patch+json')


def get(cp, kind, name, namespace=None):
    """The object, or None when it does not exist."""
    try:
        return cp.api('GET', object_path({'kind': kind, 'metadata': {'name': name, 'namespace': namespace}}))
    except ControlPlaneError as exc:
        if 'HTTP 404' in str(exc):
            return None
        raise


def conditions(obj):
    return {c.get('type'): c for c in ((obj or {}).get('status') or {}).get('conditions') or []}


def wait_for(probe, timeout, what):
    """probe() -> (done, observation) until done; FluxError with what it last saw at the deadline."""
    result = _wait.wait_for(probe, timeout, interval=0.1, backoff=1.5, max_interval=1.0, progress=None)
    if not result.ok:
        raise FluxError('%s: not within %.0f s; last seen: %s' % (what, timeout, result.observation))
    return result.observation


def wait_established(cp, names, timeout):
    def probe():
        missing = {}
        for name in names:
            found = conditions(get(cp, 'CustomResourceDefinition', name))
            if found.get('Established', {}).get('status') != 'True' or found.get('NamesAccepted', {}).get('status') == 'False':
                missing[name] = {k: v.get('status') for k, v in found.items()}
        return not missing, missing
    wait_for(probe, timeout, 'CRDs Established')


def flag_value(args, flag, default=None):
    """The value of flag in args, written --flag=value or --flag value (the last one given), else default."""
    value = default
    for index, arg in enumerate(args):
        if arg.startswith(flag + '='):
            value = arg.split('=', 1)[1]
        elif arg == flag and index + 1 < len(args) and not args[index + 1].startswith('-'):
            value = args[index + 1]
    return value


def without_flags(args, flags):
    """args less each of flags, written --flag=value or --flag value."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
            if not arg.startswith('-'):
                continue
        name = arg.split('=', 1)[0]
        if name in flags:
            skip = '=' not in arg
            continue
        kept.append(arg)
    return kept


class _Process:
    def __init__(self, name, args, env, log_path, health_url):
        self.name, self.args, self.env, self.log_path, self.health_url = name, args, env, log_path, health_url
        self.popen = None

    @property
    def running(self):
        return self.popen is not None and self.popen.poll() is None


class FluxControllers:  # pylint: disable=too-many-instance-attributes
    """Flux's controllers (and sealed-secrets') for one ControlPlane, their files under workdir."""

    def __init__(self, cp, workdir, controllers=FLUX_CONTROLLERS, sealed_secrets=True, installed=False,  # pylint: disable=too-many-arguments
                 operator=False):
        unknown = set(controllers) - set(FLUX_CONTROLLERS)
        if unknown:
            raise FluxError('unknown Flux controller(s) %s (known: %s)' % (', '.join(sorted(unknown)), ', '.join(FLUX_CONTROLLERS)))
        self.cp = cp
        # True: someone else (the collection's flux stage: Flux's install manifests) has applied the CRDs, RBAC and
        # Deployments; each controller runs with the args and ServiceAccount of its Deployment as it is in the cluster
        self.installed = installed
        self.workdir = os.path.abspath(workdir)
        self.controllers = tuple(controllers)
        self.sealed_secrets = sealed_secrets
        # True: flux-operator, as the collection's operator method installs it (only with installed=True)
        self.operator = operator
        if operator and not installed:
            raise FluxError('flux-operator runs only where its install manifests are applied (installed=True)')
        self.processes = {}
        self.ports = {}
        self.pod_ports = {}  # controller -> {container port: (host, port) where the process listens}
        self.pod_ips = {}    # controller -> the address of the pod it plays, exposed on the pod network
        self.pods = {}       # controller -> (namespace, name) of the pod its process plays
        self.pod_uids = {}   # controller -> the UID of that pod (a new pod of the same name is another pod)
        self.deployments = {}  # controller -> its Deployment, whose pods the process follows (sync)
        self.stopping = False
        self._lock = threading.Lock()  # starting a process against stop()
        self.log_dir = os.path.join(self.workdir, 'logs')

    # ------------------------------------------------------------------ manifests

    @staticmethod
    def module(name):
        """The Go module cache directory of a component's module; where upstream/<name>.json replaces the module by
        another path (sealed-secrets: published under github.com/bitnami-labs, named github.com/bitnami in its go.mod),
        the replacement's."""
        spec = upstream.components()[name]['go_module']
        target = (spec.get('replace') or {}).get(spec['module'], '').split()
        if len(target) == 2:
            return go_module_dir(*target)
        return upstream.module_dir(name)

    def crds(self, name):
        """The CRD documents a controller's module ships."""
        if name == SEALED_SECRETS:
            paths = sorted(glob.glob(os.path.join(self.module(name), SEALED_SECRETS_CHART, 'crds', '*.yaml')))
        elif name == FLUX_OPERATOR:
            paths = sorted(glob.glob(os.path.join(upstream.module_dir(name), 'config', 'crd', 'bases', '*.yaml')))
        else:
            paths = sorted(glob.glob(os.path.join(self.module(name), 'config', 'crd', 'bases', '*.yaml')))
        if not paths:
            raise FluxError('%s: its module has no CRDs where the lab looks for them' % name)
        return [doc for path in paths for doc in read_documents(path)]

    def flux_manifests(self):
        """Namespace, ServiceAccounts, RBAC and Deployments of the Flux controllers, from flux2 and the modules."""
        flux2 = go_module_dir(*FLUX_DISTRIBUTION)
        objects = [{'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': FLUX_NAMESPACE}}]
        for name in self.controllers:
            for doc in read_documents(os.path.join(flux2, 'manifests', 'bases', name, 'account.yaml')):
                doc.setdefault('metadata', {})['namespace'] = FLUX_NAMESPACE
                objects.append(doc)
        for rel in ('controller.yaml', 'reconciler.yaml'):
            objects += read_documents(os.path.join(flux2, 'manifests', 'rbac', rel))
        for name in self.controllers:
            deployment = self.deployment(name)
            deployment['metadata']['namespace'] = FLUX_NAMESPACE
            # flux2 manifests/bases/<name>/patch.yaml: the pod runs as the controller's ServiceAccount
            deployment['spec']['template']['spec']['serviceAccountName'] = name
            objects.append(deployment)
        return objects

    def deployment(self, name):
        if self.installed:
            namespace = SEALED_NAMESPACE if name == SEALED_SECRETS else FLUX_NAMESPACE
            found = get(self.cp, 'Deployment', name, namespace)
            if found is None:
                raise FluxError('%s: no Deployment %s/%s in the cluster' % (name, namespace, name))
            return found
        found = [doc for doc in read_documents(os.path.join(self.module(name), 'config', 'manager', 'deployment.yaml'))
                 if doc.get('kind') == 'Deployment']
        if len(found) != 1:
            raise FluxError('%s: config/manager/deployment.yaml holds %d Deployments, not one' % (name, len(found)))
        return found[0]

    def sealed_secrets_manifests(self):
        """The sealed-secrets chart of the module rendered by helm with its defaults, in kube-system."""
        helm = os.path.join(upstream.ROOT, '.tools', 'bin', 'helm')
        chart = os.path.join(self.module(SEALED_SECRETS), SEALED_SECRETS_CHART)
        done = subprocess.run([helm, 'template', SEALED_SECRETS, chart, '--namespace', SEALED_NAMESPACE],
                              capture_output=True, text=True, check=False, timeout=120)
        if done.returncode != 0:
            raise FluxError('helm template %s: %s' % (chart, done.stderr.strip()[-500:]))
        return documents(done.stdout)

    # ------------------------------------------------------------------ identities

    def _service_account_files(self, name, namespace):
        """A directory laid out as a pod's /var/run/secrets/kubernetes.io/serviceaccount: a bound token of the
        ServiceAccount (TokenRequest), the cluster CA, the namespace."""
        request = {'apiVersion': 'authentication.k8s.io/v1', 'kind': 'TokenRequest', 'spec': {'expirationSeconds': 86400}}
        token = self.cp.api('POST', '/api/v1/namespaces/%s/serviceaccounts/%s/token' % (namespace, name), request,
                            expect=(201,))['status']['token']
        directory = os.path.join(self.workdir, 'serviceaccount', name)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        for file_name, text in (('token', token), ('ca.crt', self.cp.ca[0]), ('namespace', namespace)):
            fd = os.open(os.path.join(directory, file_name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, 'w', encoding='utf-8') as handle:
                handle.write(text)
        return directory

    def _service_account_kubeconfig(self, name, namespace):
        """A kubeconfig (0600) for the API server as the ServiceAccount namespace/name: its token from the TokenRequest
        API and the cluster CA, what a pod of that ServiceAccount authenticates with."""
        files = self._service_account_files(name, namespace)
        with open(os.path.join(files, 'token'), encoding='utf-8') as handle:
            token = handle.read()
        config = {'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'lab',
                  'clusters': [{'name': 'lab', 'cluster': {
                      'server': self.cp.api_url,
                      'certificate-authority-data': base64.b64encode(self.cp.ca[0].encode()).decode()}}],
                  'users': [{'name': name, 'user': {'token': token}}],
                  'contexts': [{'name': 'lab', 'context': {'cluster': 'lab', 'user': name, 'namespace': namespace}}]}
        path = os.path.join(files, 'kubeconfig')
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, 'w', encoding='utf-8') as handle:
            yaml.safe_dump(config, handle)
        return path

    # ------------------------------------------------------------------ commands

    @property
    def artifact_address(self):
        return '%s:%d' % (HOST, self.ports['source-controller-storage'])

    def _as_pod(self, account, namespace, binary, args, env):
        """The command that runs binary as a container of a pod whose ServiceAccount is namespace/account would: in
        its own mount namespace (unshare), a tmpfs on /run that only it sees, and there, at
        /var/run/secrets/kubernetes.io/serviceaccount, a real token of the ServiceAccount (TokenRequest), the cluster
        CA and the namespace; KUBERNETES_SERVICE_HOST/PORT name the API server. What client-go's
        rest.InClusterConfig() (k8s.io/client-go rest/config.go) and controller-runtime's in-cluster namespace lookup
        (leader election) read."""
        files = self._service_account_files(account, namespace)
        mount = '/var/run/secrets/kubernetes.io/serviceaccount'
        shell = 'mount -t tmpfs lab-run /run && mkdir -p %s && mount --bind "$1" %s && shift && exec "$@"' % (mount, mount)
        host, port = self.cp.api_url.rsplit('//', 1)[1].rsplit(':', 1)
        env = dict(env, PATH=os.environ.get('PATH', '/usr/bin:/bin'), KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port)
        return ['unshare', '--mount', '--propagation', 'private', '--', 'sh', '-c', shell, 'sh', files, binary] + list(args), env

    def _flux_command(self, name, spec):
        args = list(spec['containers'][0].get('args') or [])
        kept = without_flags(args, ('--storage-path', '--storage-adv-addr', '--events-addr'))  # in-cluster; set below
        if name != 'source-controller' and not any(arg.startswith('--requeue-dependency') for arg in kept):
            kept.append('--requeue-dependency=' + LAB_REQUEUE_DEPENDENCY)
        self.ports[name + '-health'] = free_port()
        self.ports[name + '-metrics'] = free_port()
        kept += ['--health-addr=%s:%d' % (HOST, self.ports[name + '-health']),
                 '--metrics-addr=%s:%d' % (HOST, self.ports[name + '-metrics'])]
        tmp = os.path.join(self.workdir, 'tmp', name)
        os.makedirs(tmp, exist_ok=True)
        if name == 'source-controller':
            storage = os.path.join(self.workdir, 'storage')
            os.makedirs(storage, exist_ok=True)
            kept += ['--storage-path=' + storage, '--storage-addr=' + self.artifact_address,
                     '--storage-adv-addr=' + self.artifact_address]
        env = {'HOME': tmp, 'TMPDIR': tmp, 'RUNTIME_NAMESPACE': FLUX_NAMESPACE, 'TUF_ROOT': os.path.join(tmp, '.sigstore')}
        # flux2 manifests/bases/<name>/patch.yaml: the pod's ServiceAccount is the controller's name
        account = spec.get('serviceAccountName') or name
        command, env = self._as_pod(account, FLUX_NAMESPACE, upstream.binary(name), kept, env)
        # controller-runtime's probes: /readyz on --health-addr (each main.go AddReadyzCheck)
        return command, env, 'http://%s:%d/readyz' % (HOST, self.ports[name + '-health'])

    def _operator_command(self, spec):
        """flux-operator as its upstream Makefile runs it locally (`make run`: out of the cluster, a kubeconfig,
        --enable-leader-election=false), here with a kubeconfig of its Deployment's ServiceAccount. Its distribution
        manifests are the module's config/data, what its Dockerfile copies to /data (COPY config/data/ /data/), given as
        --storage-path (cmd/operator/main.go: default /data). No KUBERNETES_SERVICE_HOST: the image check
        entitlement.PreflightChecks (internal/entitlement/preflight.go line 54) runs only in a cluster's pod and reads the
        container's /etc/os-release, which a process on this machine does not have. --web-server-port=0: no web UI server
        (main.go line 386; the build embeds no UI, upstream/flux-operator.json)."""
        container = spec['containers'][0]
        args = without_flags(list(container.get('args') or []),
                             ('--storage-path', '--health-addr', '--metrics-addr', '--web-server-port', '--enable-leader-election'))
        self.ports[FLUX_OPERATOR + '-health'] = free_port()
        self.ports[FLUX_OPERATOR + '-metrics'] = free_port()
        storage = os.path.join(upstream.module_dir(FLUX_OPERATOR), 'config', 'data')
        if not os.path.isfile(os.path.join(storage, 'flux-images', 'VERSION')):
            raise FluxError('flux-operator: its module has no config/data/flux-images/VERSION (%s)' % storage)
        args += ['--storage-path=' + storage, '--web-server-port=0', '--enable-leader-election=false',
                 '--health-addr=%s:%d' % (HOST, self.ports[FLUX_OPERATOR + '-health']),
                 '--metrics-addr=%s:%d' % (HOST, self.ports[FLUX_OPERATOR + '-metrics'])]
        tmp = os.path.join(self.workdir, 'tmp', FLUX_OPERATOR)
        os.makedirs(tmp, exist_ok=True)
        namespace = FLUX_NAMESPACE
        account = spec.get('serviceAccountName') or FLUX_OPERATOR
        env = {'HOME': tmp, 'TMPDIR': tmp, 'PATH': os.environ.get('PATH', '/usr/bin:/bin'),
               'KUBECONFIG': self._service_account_kubeconfig(account, namespace),
               # its Deployment sets RUNTIME_NAMESPACE from the pod's namespace (config/manager/deployment.yaml)
               'RUNTIME_NAMESPACE': namespace}
        # controller-runtime's probes: /readyz on --health-addr (its Deployment's readinessProbe)
        return [upstream.binary(FLUX_OPERATOR)] + args, env, 'http://%s:%d/readyz' % (HOST, self.ports[FLUX_OPERATOR + '-health'])

    def _sealed_command(self, spec):
        container = spec['containers'][0]
        args = list(container.get('command') or [])[1:] + list(container.get('args') or [])
        self.ports[SEALED_SECRETS] = free_port()
        self.ports[SEALED_SECRETS + '-metrics'] = free_port()
        # the ports the container listens on in its pod, taken to the process's loopback ones on the pod network
        self.pod_ports[SEALED_SECRETS] = {
            int(flag_value(args, flag, default).rsplit(':', 1)[1]): (HOST, self.ports[name])
            for flag, default, name in (('--listen-addr', SEALED_LISTEN_DEFAULTS['--listen-addr'], SEALED_SECRETS),
                                        ('--listen-metrics-addr', SEALED_LISTEN_DEFAULTS['--listen-metrics-addr'],
                                         SEALED_SECRETS + '-metrics'))}
        args = without_flags(args, ('--listen-addr', '--listen-metrics-addr'))
        args += ['--listen-addr=%s:%d' % (HOST, self.ports[SEALED_SECRETS]),
                 '--listen-metrics-addr=%s:%d' % (HOST, self.ports[SEALED_SECRETS + '-metrics'])]
        account = spec.get('serviceAccountName') or SEALED_SECRETS
        command, env = self._as_pod(account, SEALED_NAMESPACE, upstream.binary(SEALED_SECRETS), args,
                                    {'POD_NAMESPACE': SEALED_NAMESPACE})
        # its HTTP server's health endpoint (pkg/controller/server.go: /healthz)
        return command, env, 'http://%s:%d/healthz' % (HOST, self.ports[SEALED_SECRETS])

    # ------------------------------------------------------------------ lifecycle

    def install(self, timeout=START_TIMEOUT):
        """CRDs (waited Established), namespace, ServiceAccounts, RBAC and Deployments. Installed already: only the
        wait for the controllers' CRDs (the names their modules ship) to be Established."""
        deadline = time.monotonic() + timeout
        crds = [crd for name in self.controllers for crd in self.crds(name)]
        if self.sealed_secrets:
            crds += self.crds(SEALED_SECRETS)
        if self.operator:
            crds += self.crds(FLUX_OPERATOR)
        if self.installed:
            wait_established(self.cp, [crd['metadata']['name'] for crd in crds], max(1.0, deadline - time.monotonic()))
            return []
        for crd in crds:
            apply(self.cp, crd)
        objects = self.flux_manifests() if self.controllers else []
        sealed = self.sealed_secrets_manifests() if self.sealed_secrets else []
        for obj in objects + sealed:
            apply(self.cp, obj)
        wait_established(self.cp, [crd['metadata']['name'] for crd in crds], max(1.0, deadline - time.monotonic()))
        return sealed

    def names(self):
        """The controllers of this set, in the order they start."""
        return (list(self.controllers) + ([FLUX_OPERATOR] if self.operator else [])
                + ([SEALED_SECRETS] if self.sealed_secrets else []))

    def start(self, timeout=START_TIMEOUT):
        """Install the manifests, then start each controller on a Running pod of its Deployment (kwok's) and wait for
        its health endpoint. Returns self. From then on sync() follows those pods."""
        if self.processes:
            raise FluxError('already started')
        os.makedirs(self.log_dir, exist_ok=True)
        deadline = time.monotonic() + timeout
        # kept across restarts of source-controller: the artifacts' URLs in the sources' status name it
        self.ports['source-controller-storage'] = free_port()
        self.install(timeout)
        try:
            for name in self.names():
                namespace = SEALED_NAMESPACE if name == SEALED_SECRETS else FLUX_NAMESPACE
                deployment = get(self.cp, 'Deployment', name, namespace)
                if deployment is None:
                    raise FluxError('%s: no Deployment %s/%s in the cluster' % (name, namespace, name))
                self.deployments[name] = deployment
                self._start_on(name, self._wait_pod(name, deadline), deadline)
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _probe_health(proc):
        """(healthy, what the health endpoint said) of one controller: its readiness (Flux) or health (sealed-secrets)
        endpoint answering 200."""
        import requests  # pylint: disable=import-outside-toplevel
        if not proc.running:
            code = proc.popen.returncode if proc.popen is not None else None
            return False, 'not running (exit code %s)' % code
        try:
            response = requests.get(proc.health_url, timeout=2)
        except requests.RequestException as exc:
            return False, str(exc)[-200:]
        return response.status_code == 200, 'HTTP %d %s' % (response.status_code, response.text.strip()[:200])

    def _start_one(self, name, args, env, health_url, deadline):
        log_path = os.path.join(self.log_dir, name + '.log')
        proc = _Process(name, args, env, log_path, health_url)
        with self._lock, open(log_path, 'ab') as log:
            # under the lock: stop() sees every process started before it, and none starts after it
            if self.stopping:
                raise FluxError('%s: the controllers are stopping' % name)
            proc.popen = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,  # pylint: disable=consider-using-with
                                          start_new_session=True, cwd=self.workdir)
            self.processes[name] = proc

        def probe():
            if not proc.running:
                raise FluxError('%s exited (code %s) while starting; its log ends:\n%s'
                                % (name, proc.popen.returncode, log_tail(log_path)))
            return self._probe_health(proc)

        result = _wait.wait_for(probe, max(0.0, deadline - time.monotonic()), interval=0.1, backoff=1.3, max_interval=1.0,
                                progress=None)
        if not result.ok:
            raise FluxError('%s not ready within the start deadline; last probe of %s: %s; its log ends:\n%s'
                            % (name, health_url, result.observation, log_tail(log_path)))

    def _running_pods(self, name):
        """The pods of name's Deployment whose containers a kubelet runs: not being deleted, phase Running, with an
        address (kwok's); the newest last."""
        deployment = self.deployments[name]
        meta, selector = deployment['metadata'], deployment['spec']['selector'].get('matchLabels') or {}
        query = ','.join('%s=%s' % item for item in sorted(selector.items()))
        namespace = meta.get('namespace') or SEALED_NAMESPACE
        pods = self.cp.api('GET', '/api/v1/namespaces/%s/pods?labelSelector=%s' % (namespace, quote(query, safe='')))['items']
        running = [p for p in pods if not p['metadata'].get('deletionTimestamp')
                   and (p.get('status') or {}).get('phase') == 'Running' and p['status'].get('podIP')]
        return sorted(running, key=lambda p: (p['metadata'].get('creationTimestamp') or '', p['metadata']['name']))

    def _wait_pod(self, name, deadline):
        """The newest Running pod of name's Deployment with an address, waited for until deadline."""
        def probe():
            pods = self._running_pods(name)
            return bool(pods), pods[-1] if pods else None
        return wait_for(probe, max(1.0, deadline - time.monotonic()), 'a Running pod of Deployment %s with an address' % name)

    def _command(self, name, spec):
        """(command, env, health URL) of name's container as the pod spec gives it."""
        if name == FLUX_OPERATOR:
            return self._operator_command(spec)
        if name == SEALED_SECRETS:
            return self._sealed_command(spec)
        return self._flux_command(name, spec)

    def _start_on(self, name, pod, deadline):
        """The kubelet starts the container of a new pod: the process, with the args and ServiceAccount of that pod's
        spec (kubelet v1.36.3 pkg/kubelet/kuberuntime/kuberuntime_container.go:359, generateContainerConfig takes
        command and args from the pod's container), waited for on its health endpoint, then playing the pod: its
        address and container ports lead to the process on the control plane's pod network (a controller with no
        ports there, flux-operator, is followed, not exposed). A process still running for another pod stops first."""
        self.stop_one(name)
        self.pods.pop(name, None)
        self.pod_uids.pop(name, None)
        args, env, health = self._command(name, pod['spec'])
        self._start_one(name, args, env, health, deadline)
        meta = pod['metadata']
        if self.pod_ports.get(name):
            self.cp.expose_pod(meta['namespace'], meta['name'], self.pod_ports[name])
            self.pod_ips[name] = pod['status']['podIP']
        self.pods[name] = (meta['namespace'], meta['name'])
        self.pod_uids[name] = meta['uid']

    def sync(self, name, timeout=START_TIMEOUT):
        """One pass of the kubelet over the pods of name's Deployment, for the one container the lab runs of it. The
        kubelet keeps a worker per pod UID (v1.36.3 pkg/kubelet/pod_workers.go:159-165): a pod deleted, being deleted
        (pod_workers.go:881) or no longer Running has its container stopped, and a new pod - a new UID, though it may
        come from the same template - gets a new sandbox and its containers started (kuberuntime_manager.go:1179-1182,
        computePodActions: CreateSandbox for a pod with none). So: the pod the process plays is still Running -> nothing;
        it is gone -> the process stops (its address leads nowhere); a Running pod and no process -> the process starts
        on it with the command of its spec. Returns what it did (a sentence), or None when nothing changed."""
        pods = self._running_pods(name)
        played = self.pod_uids.get(name)
        if played is not None and any(p['metadata']['uid'] == played for p in pods):
            return None
        did = []
        if played is not None:
            gone = self.pods.pop(name)
            self.pod_uids.pop(name)
            self.stop_one(name)
            did.append('pod %s/%s gone: the process stopped' % gone)
        if pods:
            self._start_on(name, pods[-1], time.monotonic() + timeout)
            did.append('the process started on pod %s/%s (pid %d)' % (self.pods[name] + (self.processes[name].popen.pid,)))
        return '; '.join(did) or None

    def stop_one(self, name, timeout=STOP_TIMEOUT):
        """The container of the played pod stops: the process ends and the pod's address leads nowhere."""
        ip = self.pod_ips.pop(name, None)
        if ip is not None:
            self.cp.pod_network.forget(ip)
        proc = self.processes.get(name)
        if proc is None or not proc.running:
            return
        upstream.end_process_group(proc.popen, timeout)

    def stop(self, timeout=STOP_TIMEOUT):
        """SIGTERM each controller (the reverse order), wait with a deadline, SIGKILL what is left."""
        with self._lock:
            self.stopping = True
        for name, ip in list(self.pod_ips.items()):
            self.cp.pod_network.forget(ip)
            del self.pod_ips[name]
        for name in reversed(list(self.processes)):
            proc = self.processes[name]
            if not proc.running:
                continue
            upstream.end_process_group(proc.popen, timeout)

    def status(self):
        """Each controller: name, pid, running, healthy and what its health endpoint said (a request each: call it off the
        lab's loop), the endpoint, its log and its pod's address."""
        out = []
        for name, proc in self.processes.items():
            healthy, seen = self._probe_health(proc)
            out.append(dict({'name': name, 'pid': proc.popen.pid, 'running': proc.running, 'healthy': healthy, 'health': seen,
                             'url': proc.health_url, 'log': proc.log_path,
                             'pod': '%s/%s' % self.pods[name] if name in self.pods else None},
                            **({'pod_ip': self.pod_ips[name]} if name in self.pod_ips else {})))
        return out

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def secret_data(secret):
    """A Secret's data decoded to str."""
    return {key: base64.b64decode(value).decode() for key, value in ((secret or {}).get('data') or {}).items()}
