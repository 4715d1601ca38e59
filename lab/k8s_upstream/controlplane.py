"""One real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler (the pinned upstream binaries), and kwok in place of the kubelets.

Flags and files follow what Talos v1.13.9 gives its control plane, in
github.com/siderolabs/talos@v1.13.9 internal/app/machined/pkg/controllers/k8s/control_plane_static_pod.go
(kube-apiserver: manageAPIServer, lines 344-436; kube-controller-manager: manageControllerManager, 569-617;
kube-scheduler: manageScheduler, 749-777) and internal/app/machined/pkg/system/services/etcd.go (etcd, 404-421),
with loopback addresses and free ports in place of the node's. Where the lab differs it says so beside the flag.

Each process writes its log to <workdir>/logs/<name>.log; certificates, keys and kubeconfigs are 0600 files in
<workdir>/pki. Every start waits on the process's own health endpoint with a deadline (never a fixed sleep) and
on timeout raises ControlPlaneError naming the process, what the probe last saw and the tail of its log.
"""

import dataclasses
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import requests
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait

from lab import upstream
from lab.cli import log_tail
from lab import pki
from lab.kubeconfig import write_kubeconfig
from lab.kubelet_hooks import DEFAULT_PULL_ERROR

from . import kubelet, policies
from .podnet import UNIX_PATH_MAX, PodNetwork, egress_selector_configuration

HOST = '127.0.0.1'
# Talos's defaults for a cluster's networks: pkg/machinery@v1.13.9 constants/constants.go:894,897
# (DefaultIPv4PodNet, DefaultIPv4ServiceNet); the first service address is the apiserver's Service IP.
DEFAULT_POD_SUBNET = '10.244.0.0/16'
DEFAULT_SERVICE_SUBNET = '10.96.0.0/12'
KUBERNETES_SERVICE_IP = '10.96.0.1'
# The admission configuration Talos generates (pkg/machinery@v1.13.9 config/generate/init.go:104-130) and the
# collection renders into cluster.apiServer.admissionControl: PodSecurity, enforce baseline, kube-system exempt.
DEFAULT_ADMISSION_CONTROL = [{
    'name': 'PodSecurity',
    'configuration': {
        'apiVersion': 'pod-security.admission.config.k8s.io/v1alpha1',
        'kind': 'PodSecurityConfiguration',
        'defaults': {'enforce': 'baseline', 'enforce-version': 'latest', 'audit': 'restricted', 'audit-version': 'latest',
                     'warn': 'restricted', 'warn-version': 'latest'},
        'exemptions': {'usernames': [], 'runtimeClasses': [], 'namespaces': ['kube-system']},
    },
}]
# kwok acts as the kubelet of the Nodes that carry this label, and of no other. A label, not kwok's usual annotation:
# kwok watches Nodes with a label selector on the server, so taking the label away reaches it as the Node's deletion
# (sigs.k8s.io/kwok@v0.8.0 pkg/kwok/controllers/node_controller.go:215-230) and it stops renewing the node's Lease
# (onNodeUnmanaged -> ReleaseHold, controller.go:297-299): a kubelet that stopped. Putting it back starts it again.
KWOK_NODE_LABEL = ('kwok.x-k8s.io/node', 'fake')
# The stages kwokctl gives a kwok it runs when none are configured (sigs.k8s.io/kwok@v0.8.0
# pkg/kwokctl/runtime/cluster.go:185-209, getDefaultNodeStages/getDefaultPodStages 297-336), with the lease heartbeat
# (kubelet's own: a Lease renewed in kube-node-lease) and its 40 s lease; read from the kwok module itself.
KWOK_NODE_INITIALIZE = 'kustomize/stage/node/fast/node-initialize.yaml'
KWOK_POD_READY = 'kustomize/stage/pod/fast/pod-ready.yaml'
KWOK_STAGE_FILES = (KWOK_NODE_INITIALIZE,
                    'kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml',
                    KWOK_POD_READY,
                    'kustomize/stage/pod/fast/pod-complete.yaml',
                    'kustomize/stage/pod/fast/pod-delete.yaml')
# kubelet's default nodeLeaseDurationSeconds (k8s.io/kubernetes v1.36.3 pkg/kubelet/apis/config/v1beta1/defaults.go:151-153);
# kwok renews at a quarter of it as kubelet does (kwok pkg/kwok/controllers/controller.go:248-250)
KWOK_NODE_LEASE_SECONDS = 40
# The Kubernetes username of the admin kubeconfig Talos hands out (CN admin, O system:masters; lab/talos/pki.py
# kube_admin_certificate), which the collection and the tests use. The lab's own clients (the kubelet stand-in, Talos's
# manifest apply, the health probes) use LAB_USER, so that the request log shows what a client of the cluster asked.
ADMIN_USER = 'admin'
LAB_USER = 'lab:world'
# kube-apiserver's audit policy in the lab. Talos v1.13.9 passes --audit-policy-file and --audit-log-path (with
# maxage 30, maxbackup 10, maxsize 100: internal/app/machined/pkg/controllers/k8s/control_plane_static_pod.go:376-380)
# and its default policy logs every request at level Metadata (pkg/machinery/config/types/v1alpha1/
# v1alpha1_apiserverconfig.go:18-30). The lab logs only the admin user's requests (the controllers' and kwok's would
# be most of the file, and nothing reads them), one event each when its response is complete.
AUDIT_POLICY = {'apiVersion': 'audit.k8s.io/v1', 'kind': 'Policy', 'omitStages': ['RequestReceived', 'ResponseStarted'],
                'rules': [{'level': 'Metadata', 'users': [ADMIN_USER]}, {'level': 'None'}]}
# An audit event's verb back to the HTTP method of the request (k8s.io/apiserver v0.36.3
# pkg/endpoints/request/requestinfo.go: POST create, GET/HEAD get, PUT update, PATCH patch, DELETE delete :177-190; a get
# without a name is list or watch :223-245, a delete without one deletecollection :256-259; a non-resource request's
# verb is its method in lower case :134).
AUDIT_VERB_METHODS = {'create': 'POST', 'get': 'GET', 'list': 'GET', 'watch': 'GET', 'update': 'PUT', 'patch': 'PATCH',
                      'delete': 'DELETE', 'deletecollection': 'DELETE'}
START_TIMEOUT, STOP_TIMEOUT = 120.0, 20.0
POLICY_TIMEOUT = 30.0   # how long a workload fault waits for kube-apiserver to apply its admission policy
# Kubelet's crash-loop back-off for a static pod's container (kubernetes v1.36.3): the first delay is 10 s
# (pkg/kubelet/kubelet.go:173 initialCrashLoopBackOff), the cap 300 s (kubelet.go:166 MaxCrashLoopBackOff =
# pkg/kubelet/apis/config/v1beta1/defaults.go:47 MaxContainerBackOff), used at kubelet.go:1066-1068 without jitter
# (client-go v0.36.3 util/flowcontrol/backoff.go:55 NewBackOff).
RESTART_BACKOFF = (10.0, 300.0)
# The processes the lab restarts when they exit on their own, as kubelet restarts a Talos control plane's static pods
# (restartPolicy Always). etcd is a Talos service, not a static pod, and the lab's Talos nodes model its state
# themselves (lab/talos/node.py); kwok stands in for every node's kubelet at once and has no counterpart on a node,
# so its exit is a lab failure that status shows rather than hides.
SUPERVISED = ('kube-apiserver', 'kube-controller-manager', 'kube-scheduler')


class ControlPlaneError(Exception):
    """A process of the control plane did not start, or a request to it failed."""


def _is_ip(text):
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _zombie(pid):
    try:
        with open('/proc/%d/stat' % pid, encoding='utf-8') as handle:
            return handle.read().rsplit(')', 1)[1].split()[0] == 'Z'
    except (OSError, IndexError):
        return False


def free_port(host=HOST):
    """A TCP port nobody listens on at the moment (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _write_secret(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, 'w', encoding='utf-8') as handle:
        handle.write(text)
    return path


def admission_configuration(plugins):
    """The AdmissionConfiguration file Talos writes from cluster.apiServer.admissionControl.

    Talos v1.13.9 internal/app/machined/pkg/controllers/k8s/render_config_static_pods.go:239-265 (admissionControlConfig):
    apiserver.config.k8s.io/v1, one plugins[] entry per item, its configuration embedded as is.
    """
    if not isinstance(plugins, list):
        raise ControlPlaneError('admission_control: must be a list of {name, configuration}, got %s' % type(plugins).__name__)
    entries = []
    for index, plugin in enumerate(plugins):
        if not isinstance(plugin, dict) or not isinstance(plugin.get('name'), str) or not plugin['name']:
            raise ControlPlaneError('admission_control[%d].name: a plugin name is required' % index)
        if not isinstance(plugin.get('configuration'), dict):
            raise ControlPlaneError('admission_control[%d].configuration: must be a mapping' % index)
        entries.append({'name': plugin['name'], 'configuration': plugin['configuration']})
    return {'apiVersion': 'apiserver.config.k8s.io/v1', 'kind': 'AdmissionConfiguration', 'plugins': entries}


@dataclasses.dataclass
class _Process:
    """A started binary: its command, log and health URL."""

    name: str
    args: list
    log_path: str
    health_url: str
    popen: subprocess.Popen = None
    stopped: bool = False      # stopped by the lab (stop_process, stop): not restarted
    restarts: int = 0          # restarts after exits the lab did not cause
    last_exit: int = None      # the exit code of the last such exit
    backoff: float = None      # kubelet's back-off entry for the container: its current period, None: none yet
    backoff_updated: float = 0.0  # monotonic time the entry was last moved on (a restart)

    @property
    def running(self):
        return self.popen is not None and self.popen.poll() is None


class ControlPlane:  # pylint: disable=too-many-instance-attributes
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok on 127.0.0.1, free ports."""

    ORDER = ('etcd', 'kube-apiserver', 'kube-controller-manager', 'kube-scheduler', 'kwok')

    def __init__(self, workdir, admission_control=None, pod_subnet=DEFAULT_POD_SUBNET, service_subnet=DEFAULT_SERVICE_SUBNET,
                 ca=None, kwok=True, api_host=HOST, api_port=None, api_sans=(), node_lease_seconds=KWOK_NODE_LEASE_SECONDS,
                 node_monitor=None, nodes_wait_for_cni=False, restart_backoff=RESTART_BACKOFF):
        self.workdir = os.path.abspath(workdir)
        self.admission_control = DEFAULT_ADMISSION_CONTROL if admission_control is None else admission_control
        self.pod_subnet = pod_subnet
        self.service_subnet = service_subnet
        self.ca = ca  # (cert_pem, key_pem) of the cluster CA (the Talos secrets bundle's); None: a new one
        self.with_kwok = kwok
        # where kube-apiserver listens (a lab's control-plane endpoint, e.g. <net>.10:6443) and the further addresses or
        # names its serving certificate holds; the other processes stay on 127.0.0.1
        self.api_host = api_host
        self.api_port = api_port
        self.api_sans = tuple(api_sans)
        # how soon a stopped kubelet shows: its Lease's duration, and kube-controller-manager's node monitor
        # (period, grace period) - None keeps the upstream defaults (5s, 50s: pkg/controller/nodelifecycle/config/
        # v1alpha1/defaults.go:46); shorter ones are a time scale for tests, as the lab's profiles scale its delays
        self.node_lease_seconds = node_lease_seconds
        self.node_monitor = node_monitor
        # True: a Node is NotReady (NetworkPluginNotReady) until a Ready CNI agent pod runs on it, as on a Talos cluster
        # before its CNI (lab/k8s_upstream/kubelet.py); False: kwok's own node-initialize stage makes it Ready at once
        self.nodes_wait_for_cni = nodes_wait_for_cni
        # (initial, cap) seconds of the restart back-off of the SUPERVISED processes (RESTART_BACKOFF: kubelet's)
        self.restart_backoff = restart_backoff
        self._supervisor_lock = threading.Lock()
        self._supervisor_stop = threading.Event()
        self._cni = None
        self._crashloops = None  # lab/k8s_upstream/kubelet.py CrashLoops, started with the first crash-loop fault
        self._image_pulls = None  # lab/k8s_upstream/kubelet.py ImagePulls, started with the first image-pull fault
        self._cilium_nodes = None  # lab/k8s_upstream/kubelet.py CiliumNodes, with nodes_wait_for_cni
        self._csi = None  # lab/k8s_upstream/kubelet.py CsiRegistrations, with kwok
        self.pki_dir = os.path.join(self.workdir, 'pki')
        self.log_dir = os.path.join(self.workdir, 'logs')
        self.processes = {}
        self.ports = {}
        self.kubeconfig = os.path.join(self.pki_dir, 'admin.kubeconfig')
        # the pod network as kube-apiserver sees it: its `cluster` egress proxy (podnet.py); expose() pods the lab plays
        self.pod_network = PodNetwork(pod_subnet, os.path.join(self.workdir, 'pod-network.sock'),
                                      os.path.join(self.log_dir, 'pod-network.log'))
        self._admin_cert = None
        self._session = None
        self.audit_log = os.path.join(self.log_dir, 'kube-apiserver-audit.log')
        self._audit_offset = 0

    # ------------------------------------------------------------------ files

    def _path(self, name):
        return os.path.join(self.pki_dir, name)

    def pki_file(self, name):
        """The path of a file of <workdir>/pki: ca.crt, admin.crt, admin.key ..."""
        return self._path(name)

    @property
    def lab_client_cert(self):
        """(cert file, key file) of the lab's own client identity (LAB_USER), for requests the lab makes itself."""
        return self._path('lab-world.crt'), self._path('lab-world.key')

    def audit_requests(self):
        """The admin user's requests kube-apiserver completed since the last call, oldest first, from its audit log:
        [{'method', 'path', 'status', 'user', 'verb', 'time'}]. A line not yet complete is left for the next call."""
        try:
            with open(self.audit_log, 'rb') as handle:
                if os.fstat(handle.fileno()).st_size < self._audit_offset:
                    self._audit_offset = 0   # a new file (a restarted control plane's, or rotated)
                handle.seek(self._audit_offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        complete, newline, _rest = chunk.rpartition(b'\n')
        if not newline:
            return []
        self._audit_offset += len(complete) + 1
        found = []
        for line in complete.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            verb = event.get('verb') or ''
            found.append({'method': AUDIT_VERB_METHODS.get(verb, verb.upper()), 'path': event.get('requestURI') or '',
                          'status': (event.get('responseStatus') or {}).get('code'), 'verb': verb,
                          'user': (event.get('user') or {}).get('username'), 'time': event.get('stageTimestamp')})
        return found

    def _leaf(self, ca, name, common_name, organizations=(), server=False, ips=(), dns=()):
        cert, key = pki.issue(ca[0], ca[1], common_name, organizations, dns_names=dns, ip_addresses=ips, server=server)
        _write_secret(self._path(name + '.crt'), cert)
        _write_secret(self._path(name + '.key'), key)
        return cert, key

    def _kubeconfig(self, name, common_name, organizations=()):
        cert, key = pki.issue(self.ca[0], self.ca[1], common_name, organizations)
        return write_kubeconfig(self._path(name + '.kubeconfig'), self.api_url, self.ca[0], cert, key, name='lab')

    def _write_files(self):
        """CAs, certificates, the service-account key, kubeconfigs and the component configuration files."""
        os.makedirs(self.pki_dir, mode=0o700, exist_ok=True)
        os.makedirs(self.log_dir, exist_ok=True)
        if self.ca is None:
            self.ca = pki.make_ca('kubernetes')
        _write_secret(self._path('ca.crt'), self.ca[0])
        _write_secret(self._path('ca.key'), self.ca[1])
        # Talos keeps three CAs apart: the cluster CA, the aggregator (front-proxy) CA and the etcd CA.
        etcd_ca = pki.make_ca('etcd')
        _write_secret(self._path('etcd-ca.crt'), etcd_ca[0])
        self._leaf(etcd_ca, 'etcd-server', 'etcd', server=True, ips=(HOST,), dns=('localhost',))
        self._leaf(etcd_ca, 'etcd-client', 'kube-apiserver-etcd-client')
        aggregator_ca = pki.make_ca('front-proxy')
        _write_secret(self._path('aggregator-ca.crt'), aggregator_ca[0])
        self._leaf(aggregator_ca, 'front-proxy-client', 'front-proxy-client')
        ips = [h for h in (self.api_host,) + self.api_sans if _is_ip(h)]
        names = [h for h in self.api_sans if not _is_ip(h)]
        cert, key = pki.issue(self.ca[0], self.ca[1], 'kube-apiserver', (), list(pki.SERVICE_DNS) + names,
                              list(dict.fromkeys(ips + [HOST, KUBERNETES_SERVICE_IP])), server=True)
        _write_secret(self._path('apiserver.crt'), cert)
        _write_secret(self._path('apiserver.key'), key)
        self._leaf(self.ca, 'apiserver-kubelet-client', 'apiserver-kubelet-client', ('system:masters',))
        self._leaf(self.ca, 'controller-manager-serving', 'kube-controller-manager', server=True, ips=(HOST,), dns=('localhost',))
        self._leaf(self.ca, 'scheduler-serving', 'kube-scheduler', server=True, ips=(HOST,), dns=('localhost',))
        sa_key = ec.generate_private_key(ec.SECP256R1())
        _write_secret(self._path('service-account.key'), sa_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode())
        _write_secret(self._path('service-account.pub'), sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode())
        # The admin kubeconfig Talos hands out: CN admin, O system:masters (what talos_kubeconfig fetches).
        self._admin_cert = pki.admin_cert(self.ca[0], self.ca[1])
        write_kubeconfig(self.kubeconfig, self.api_url, self.ca[0], *self._admin_cert, name='lab')
        self._leaf(self.ca, 'lab-world', LAB_USER, ('system:masters',))
        _write_secret(self._path('audit-policy.yaml'), yaml.safe_dump(AUDIT_POLICY))
        self._kubeconfig('controller-manager', 'system:kube-controller-manager')
        self._kubeconfig('scheduler', 'system:kube-scheduler')
        # kwok acts as the kubelet of every node it manages; the Node authorizer and NodeRestriction only know a
        # kubelet per node (system:node:<name>), so one identity for all of them needs a wider grant: the lab's
        # kwok binds the ClusterRole the lab creates for it (see _grant_kwok), not system:masters.
        self._kubeconfig('kwok', 'lab:kwok', ('lab:kwok',))
        _write_secret(self._path('admission-control-config.yaml'),
                      json.dumps(admission_configuration(self.admission_control), indent=2) + '\n')
        scheduler_config = {
            'apiVersion': 'kubescheduler.config.k8s.io/v1', 'kind': 'KubeSchedulerConfiguration',
            'clientConnection': {'kubeconfig': self._path('scheduler.kubeconfig')},
            'leaderElection': {'leaderElect': True},
        }
        _write_secret(self._path('scheduler-config.yaml'), yaml.safe_dump(scheduler_config))
        # kube-apiserver runs in the work directory: a socket path too long for sun_path is given relative to it
        socket_path = self.pod_network.socket_path
        uds_name = socket_path if len(os.fsencode(socket_path)) <= UNIX_PATH_MAX else os.path.relpath(socket_path, self.workdir)
        _write_secret(self._path('egress-selector.yaml'), yaml.safe_dump(egress_selector_configuration(uds_name)))
        if self.with_kwok:
            self._write_kwok_stages()

    def _write_kwok_stages(self):
        module = upstream.module_dir('kwok')
        documents = []
        for rel in KWOK_STAGE_FILES:
            with open(os.path.join(module, rel), encoding='utf-8') as handle:
                text = handle.read()
            if self.nodes_wait_for_cni and rel == KWOK_NODE_INITIALIZE:
                text = kubelet.network_not_ready_stage(text)
            if rel == KWOK_POD_READY:
                text = kubelet.pod_ready_stage(text)   # a pod whose image cannot be pulled does not run
            documents.append(text.strip() + '\n')
        with open(self._path('kwok-stages.yaml'), 'w', encoding='utf-8') as handle:
            handle.write('---\n'.join(documents))

    # ------------------------------------------------------------------ commands

    @property
    def api_url(self):
        return 'https://%s:%d' % (self.api_host, self.ports['kube-apiserver'])

    def _commands(self):
        p = self._path
        ports = self.ports
        etcd_url = 'https://%s:%d' % (HOST, ports['etcd'])
        peer_url = 'http://%s:%d' % (HOST, ports['etcd-peer'])
        commands = {
            # services/etcd.go:404-421; one member, so its peer URL is plain HTTP on loopback (nothing else joins),
            # and --unsafe-no-fsync: the lab's etcd data is thrown away with the lab (a lab-only speed-up).
            'etcd': ([upstream.binary('etcd'),
                      '--name=lab', '--data-dir=' + os.path.join(self.workdir, 'etcd'),
                      '--listen-client-urls=' + etcd_url, '--advertise-client-urls=' + etcd_url,
                      '--listen-peer-urls=' + peer_url, '--initial-advertise-peer-urls=' + peer_url,
                      '--initial-cluster=lab=' + peer_url, '--initial-cluster-state=new',
                      '--client-cert-auth=true', '--cert-file=' + p('etcd-server.crt'), '--key-file=' + p('etcd-server.key'),
                      '--trusted-ca-file=' + p('etcd-ca.crt'), '--auto-tls=false', '--peer-auto-tls=false',
                      '--unsafe-no-fsync=true', '--log-level=warn'],
                     etcd_url + '/health'),
            # control_plane_static_pod.go:354-395 and handleKubeAPIServerAuthorizationFlags (947-977): Node,RBAC.
            # Left out: encryption-provider-config (nothing in the lab reads it); the audit log with the lab's policy
            # (AUDIT_POLICY above). The lab's addresses are
            # loopback ones, which Endpoints may not hold (k8s.io/kubernetes v1.36.3 pkg/apis/core/validation/validation.go:8434
            # ValidateNonSpecialIP), so the `kubernetes` Service gets no endpoints: --endpoint-reconciler-type=none.
            # Not Talos's: --egress-selector-config-file, the `cluster` egress over the lab's pod network proxy
            # (podnet.py), so that the service and pod proxy reach the processes the lab runs in place of pods.
            'kube-apiserver': ([upstream.binary('kube-apiserver'),
                                '--admission-control-config-file=' + p('admission-control-config.yaml'),
                                '--allow-privileged=true', '--anonymous-auth=false',
                                '--api-audiences=' + self.api_url, '--bind-address=' + self.api_host, '--advertise-address=' + self.api_host,
                                '--client-ca-file=' + p('ca.crt'), '--enable-admission-plugins=NodeRestriction',
                                '--authorization-mode=Node,RBAC',
                                '--requestheader-client-ca-file=' + p('aggregator-ca.crt'),
                                '--requestheader-allowed-names=front-proxy-client',
                                '--requestheader-extra-headers-prefix=X-Remote-Extra-',
                                '--requestheader-group-headers=X-Remote-Group', '--requestheader-username-headers=X-Remote-User',
                                '--proxy-client-cert-file=' + p('front-proxy-client.crt'),
                                '--proxy-client-key-file=' + p('front-proxy-client.key'),
                                '--enable-bootstrap-token-auth=true', '--tls-min-version=VersionTLS12', '--profiling=false',
                                '--etcd-cafile=' + p('etcd-ca.crt'), '--etcd-certfile=' + p('etcd-client.crt'),
                                '--etcd-keyfile=' + p('etcd-client.key'), '--etcd-servers=' + etcd_url,
                                '--kubelet-client-certificate=' + p('apiserver-kubelet-client.crt'),
                                '--kubelet-client-key=' + p('apiserver-kubelet-client.key'),
                                '--secure-port=%d' % ports['kube-apiserver'],
                                '--service-account-issuer=' + self.api_url,
                                '--service-account-key-file=' + p('service-account.pub'),
                                '--service-account-signing-key-file=' + p('service-account.key'),
                                '--service-cluster-ip-range=' + self.service_subnet,
                                '--tls-cert-file=' + p('apiserver.crt'), '--tls-private-key-file=' + p('apiserver.key'),
                                '--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname',
                                '--endpoint-reconciler-type=none',
                                '--egress-selector-config-file=' + p('egress-selector.yaml'),
                                '--audit-policy-file=' + p('audit-policy.yaml'), '--audit-log-path=' + self.audit_log,
                                '--audit-log-maxage=30', '--audit-log-maxbackup=10', '--audit-log-maxsize=100'],
                               self.api_url + '/readyz'),
            # control_plane_static_pod.go:584-599; the serving certificate is given (signed by the cluster CA) instead of
            # one the process makes itself, so that the health probe verifies it.
            'kube-controller-manager': ([upstream.binary('kube-controller-manager'),
                                         '--allocate-node-cidrs=true', '--bind-address=' + HOST,
                                         '--secure-port=%d' % ports['kube-controller-manager'],
                                         '--cluster-cidr=' + self.pod_subnet, '--service-cluster-ip-range=' + self.service_subnet,
                                         '--cluster-signing-cert-file=' + p('ca.crt'), '--cluster-signing-key-file=' + p('ca.key'),
                                         '--controllers=*,tokencleaner', '--configure-cloud-routes=false',
                                         '--kubeconfig=' + p('controller-manager.kubeconfig'),
                                         '--authentication-kubeconfig=' + p('controller-manager.kubeconfig'),
                                         '--authorization-kubeconfig=' + p('controller-manager.kubeconfig'),
                                         '--leader-elect=true', '--root-ca-file=' + p('ca.crt'),
                                         '--service-account-private-key-file=' + p('service-account.key'),
                                         '--use-service-account-credentials=true',
                                         '--profiling=false', '--tls-min-version=VersionTLS13',
                                         '--tls-cert-file=' + p('controller-manager-serving.crt'),
                                         '--tls-private-key-file=' + p('controller-manager-serving.key')]
                                        + (['--node-monitor-period=' + self.node_monitor[0],
                                            '--node-monitor-grace-period=' + self.node_monitor[1]] if self.node_monitor else []),
                                        'https://%s:%d/healthz' % (HOST, ports['kube-controller-manager'])),
            # control_plane_static_pod.go:763-770
            'kube-scheduler': ([upstream.binary('kube-scheduler'),
                                '--config=' + p('scheduler-config.yaml'),
                                '--authentication-tolerate-lookup-failure=false',
                                '--authentication-kubeconfig=' + p('scheduler.kubeconfig'),
                                '--authorization-kubeconfig=' + p('scheduler.kubeconfig'),
                                '--bind-address=' + HOST, '--secure-port=%d' % ports['kube-scheduler'],
                                '--profiling=false', '--tls-min-version=VersionTLS13',
                                '--tls-cert-file=' + p('scheduler-serving.crt'), '--tls-private-key-file=' + p('scheduler-serving.key')],
                               'https://%s:%d/healthz' % (HOST, ports['kube-scheduler'])),
        }
        if self.with_kwok:
            commands['kwok'] = ([upstream.binary('kwok'),
                                 '--kubeconfig=' + p('kwok.kubeconfig'),
                                 '--manage-all-nodes=false',
                                 '--manage-nodes-with-label-selector=%s=%s' % KWOK_NODE_LABEL,
                                 '--node-lease-duration-seconds=%d' % self.node_lease_seconds,
                                 '--config=' + p('kwok-stages.yaml'),
                                 '--server-address=%s:%d' % (HOST, ports['kwok'])],
                                'http://%s:%d/healthz' % (HOST, ports['kwok']))
        return commands

    # ------------------------------------------------------------------ lifecycle

    def _http(self):
        if self._session is None:
            # verify is passed with every request: requests lets REQUESTS_CA_BUNDLE override a session's own verify
            self._session = requests.Session()
        return self._session

    def _probe_health(self, name):
        """(healthy, what the health endpoint said) of one process."""
        proc = self.processes[name]
        if not proc.running:
            code = proc.popen.returncode if proc.popen is not None else None
            return False, 'not running (exit code %s)' % code
        kwargs = {'timeout': 2, 'verify': self._path('ca.crt')}
        if name == 'etcd':
            kwargs.update(cert=(self._path('etcd-client.crt'), self._path('etcd-client.key')), verify=self._path('etcd-ca.crt'))
        elif name == 'kube-apiserver':
            kwargs.update(cert=(self._path('lab-world.crt'), self._path('lab-world.key')))
        try:
            response = self._http().get(proc.health_url, **kwargs)
        except requests.RequestException as exc:
            return False, '%s: %s' % (proc.health_url, str(exc)[-300:])
        body = response.text.strip()
        if name == 'etcd':
            try:
                healthy = response.status_code == 200 and json.loads(body).get('health') == 'true'
            except ValueError:
                healthy = False
        else:
            healthy = response.status_code == 200 and body == 'ok'
        return healthy, 'HTTP %d %s' % (response.status_code, body[:200])

    def _start_one(self, name, args, health_url, deadline):
        log_path = os.path.join(self.log_dir, name + '.log')
        with self._supervisor_lock:  # a supervisor thread may be writing pids.json from self.processes
            proc = self.processes.get(name)
            if proc is None:
                proc = self.processes[name] = _Process(name, args, log_path, health_url)
            proc.stopped = False
            self._spawn(proc)
        remaining = max(0.0, deadline - time.monotonic())

        def probe():
            healthy, seen = self._probe_health(name)
            if not proc.running:
                raise ControlPlaneError('%s exited (code %s) while starting; its log ends:\n%s'
                                        % (name, proc.popen.returncode, log_tail(log_path)))
            return healthy, seen

        result = _wait.wait_for(probe, remaining, interval=0.1, backoff=1.3, max_interval=1.0, progress=None)
        if not result.ok:
            raise ControlPlaneError('%s not healthy within the start deadline; last probe: %s; its log ends:\n%s'
                                    % (name, result.observation, log_tail(log_path)))

    def _spawn(self, proc):
        """Start proc's command (the supervisor lock held); a SUPERVISED one gets a thread waiting for its exit."""
        with open(proc.log_path, 'ab') as log:
            popen = subprocess.Popen(proc.args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,  # pylint: disable=consider-using-with
                                     start_new_session=True, cwd=self.workdir)
        proc.popen = popen
        self._write_pids()
        if proc.name in SUPERVISED:
            threading.Thread(target=self._supervise, args=(proc, popen), name='supervise-' + proc.name, daemon=True).start()

    def _restart_delay(self, proc, finished):
        """(seconds to wait before the restart, the back-off period after it), as kubelet decides for an exited
        container (kubernetes v1.36.3 pkg/kubelet/kuberuntime/kuberuntime_manager.go:1908-1939 doBackOff, on
        client-go v0.36.3 util/flowcontrol/backoff.go): no entry yet, or the last restart more than twice the cap before
        this exit (backoff.go:180-186 hasExpired): restart at once, the period starts at the initial one (:100-102);
        otherwise wait out the current period from the exit (:119-130 IsInBackOffSince), then double it, capped
        (:104-106)."""
        initial, cap = self.restart_backoff
        if proc.backoff is None or finished - proc.backoff_updated > 2 * cap:
            return 0.0, initial
        return proc.backoff, min(proc.backoff * 2, cap)

    def _supervise(self, proc, popen):
        """Wait for popen to exit; unless the lab stopped it (or started another meanwhile), restart it after
        kubelet's back-off, as kubelet restarts a static pod's container (restartPolicy Always)."""
        code = popen.wait()
        finished = time.monotonic()
        with self._supervisor_lock:
            if proc.stopped or proc.popen is not popen or self._supervisor_stop.is_set():
                return
            proc.last_exit = code
            delay, backoff = self._restart_delay(proc, finished)
        with open(proc.log_path, 'ab') as log:
            log.write(b'--- lab: %s exited with code %d; restarting in %.1f s (kubelet back-off)\n'
                      % (proc.name.encode(), code, delay))
        if self._supervisor_stop.wait(delay):
            return
        with self._supervisor_lock:
            if proc.stopped or proc.popen is not popen or self._supervisor_stop.is_set():
                return  # stopped by the lab, or started again by start_process, during the back-off
            proc.backoff, proc.backoff_updated = backoff, time.monotonic()
            proc.restarts += 1
            self._spawn(proc)

    def start(self, timeout=START_TIMEOUT):
        """Write the files, start each process in order, each waited for on its health endpoint. Returns self."""
        if self.processes:
            raise ControlPlaneError('already started')
        self._supervisor_stop.clear()
        for name in ('etcd', 'etcd-peer', 'kube-controller-manager', 'kube-scheduler', 'kwok'):
            self.ports[name] = free_port()
        self.ports['kube-apiserver'] = self.api_port or free_port(self.api_host)
        commands = self._commands()  # the binaries are looked up first: a missing one fails before anything runs
        os.makedirs(self.workdir, exist_ok=True)
        self._reap_leftovers(commands)
        # a start is a new cluster: no objects of an earlier one (their tokens were signed with another key)
        shutil.rmtree(os.path.join(self.workdir, 'etcd'), ignore_errors=True)
        if os.path.exists(self.audit_log):
            os.unlink(self.audit_log)
        self._audit_offset = 0
        self._write_files()
        # the admin client certificate as files too (the admin kubeconfig's user), for clients that take files (tests)
        _write_secret(self._path('admin.crt'), self._admin_cert[0])
        _write_secret(self._path('admin.key'), self._admin_cert[1])
        deadline = time.monotonic() + timeout
        try:
            for name in self.ORDER:
                if name not in commands:
                    continue
                if name == 'kwok':
                    self._grant_kwok()
                if name == 'kube-apiserver':
                    self.pod_network.start()
                args, health_url = commands[name]
                self._start_one(name, args, health_url, deadline)
            if self.with_kwok and self.nodes_wait_for_cni:
                self._cni = kubelet.CniReadiness(self, KWOK_NODE_LABEL).start()
                self._cilium_nodes = kubelet.CiliumNodes(self).start()
            if self.with_kwok:
                self._csi = kubelet.CsiRegistrations(self, KWOK_NODE_LABEL).start()
        except BaseException:
            self.stop()
            raise
        return self

    def _write_pids(self):
        text = json.dumps({name: proc.popen.pid for name, proc in self.processes.items() if proc.popen is not None})
        with open(os.path.join(self.workdir, 'pids.json'), 'w', encoding='utf-8') as handle:
            handle.write(text + '\n')

    def _reap_leftovers(self, commands, timeout=STOP_TIMEOUT):
        """Stop what an earlier start in this directory left running when its owner died without stop() (SIGKILL):
        each pid of pids.json that still runs the same binary gets SIGTERM, then SIGKILL at the deadline."""
        try:
            with open(os.path.join(self.workdir, 'pids.json'), encoding='utf-8') as handle:
                recorded = json.load(handle)
        except (OSError, ValueError):
            return
        for name in reversed(self.ORDER):  # as stop() does: the API clients first, etcd last
            pid = recorded.get(name)
            try:
                running = os.readlink('/proc/%d/exe' % pid) if name in commands and pid else None
            except OSError:
                running = None
            if running is None or running != os.path.realpath(commands[name][0][0]):
                continue  # gone, or the pid is another program's now
            os.kill(pid, signal.SIGTERM)
            result = _wait.wait_for(lambda pid=pid: (not os.path.exists('/proc/%d' % pid) or _zombie(pid), pid), timeout,
                                    interval=0.05, backoff=1.5, max_interval=0.5, progress=None)
            if not result.ok:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def stop(self, timeout=STOP_TIMEOUT):
        """SIGTERM every process (the reverse order), wait for each with a deadline, SIGKILL what is left."""
        watchers = [w for w in (self._cni, self._crashloops, self._image_pulls, self._cilium_nodes, self._csi) if w is not None]
        for watcher in watchers:
            watcher.signal_stop()  # their open watches end when kube-apiserver does, below
        self._cni = self._crashloops = self._image_pulls = self._cilium_nodes = self._csi = None
        with self._supervisor_lock:
            self._supervisor_stop.set()  # nothing is restarted from here on
            for proc in self.processes.values():
                proc.stopped = True
        for name in reversed(self.ORDER):
            proc = self.processes.get(name)
            if proc is None or not proc.running:
                continue
            upstream.end_process_group(proc.popen, timeout)
        for watcher in watchers:
            watcher.stop()
        self.pod_network.stop()
        if self._session is not None:
            self._session.close()
            self._session = None

    def stop_process(self, name, kill=False, timeout=STOP_TIMEOUT):
        """One process stops while the others run on: for kube-apiserver, what its clients see when Talos restarts that
        static pod or the process dies - connections refused until start_process.

        kill=False: SIGTERM, SIGKILL at the deadline; kill=True: SIGKILL at once (a crash, the OOM killer). Its clients
        (kube-controller-manager, kube-scheduler) retry on their own only within their leader election's renew deadline
        (10 s, k8s.io/component-base@v0.36.3 config/v1alpha1/defaults.go:40-41); past it they exit, as on a real node,
        where kubelet restarts them, and so does the lab (SUPERVISED, with kubelet's back-off). A process stopped here
        stays down until start_process: the lab's own stop is never undone. A graceful stop of kube-apiserver takes
        longer than the renew deadline here (its SIGTERM was measured running into the 20 s deadline), so a short
        outage is kill=True."""
        with self._supervisor_lock:
            proc = self.processes.get(name)
            if proc is None or not proc.running:
                raise ControlPlaneError('%s is not running' % name)
            proc.stopped = True
            popen = proc.popen
        upstream.end_process_group(popen, timeout, kill=kill)

    def start_process(self, name, timeout=START_TIMEOUT):
        """Start again, with the same command, a process stop_process stopped (or one waiting out its restart back-off:
        it starts now); returns once its health endpoint answers healthy (ControlPlaneError with its log's tail
        otherwise)."""
        proc = self.processes.get(name)
        if proc is None:
            raise ControlPlaneError('%s was never started' % name)
        if proc.running:
            raise ControlPlaneError('%s is running' % name)
        self._start_one(name, proc.args, proc.health_url, time.monotonic() + timeout)

    def status(self):
        """Each process: name, pid, running, healthy, what its health endpoint said, and its restarts (after exits the
        lab did not cause) with the last such exit's code."""
        out = []
        for name in self.ORDER:
            proc = self.processes.get(name)
            if proc is None:
                continue
            healthy, seen = self._probe_health(name)
            out.append({'name': name, 'pid': proc.popen.pid, 'running': proc.running, 'healthy': healthy,
                        'health': seen, 'restarts': proc.restarts, 'last_exit': proc.last_exit, 'url': proc.health_url,
                        'log': proc.log_path})
        return out

    def remove(self):
        """Stop, then delete the work directory (certificates, etcd data, logs)."""
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------------ API

    def api(self, method, path, body=None, expect=(200, 201), content_type='application/json'):
        """One request as the lab (LAB_USER, in system:masters); the decoded JSON. ControlPlaneError with the status and
        message otherwise."""
        data = None if body is None else json.dumps(body)
        response = self._http().request(method, self.api_url + path, data=data, headers={'Content-Type': content_type},
                                        timeout=30, verify=self._path('ca.crt'), cert=self.lab_client_cert)
        if response.status_code not in expect:
            raise ControlPlaneError('%s %s: HTTP %d %s' % (method, path, response.status_code, response.text[:500]))
        return response.json()

    def _grant_kwok(self):
        """RBAC for kwok: what it needs to act as every managed node's kubelet (nodes, their leases, pods)."""
        role = {
            'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'ClusterRole', 'metadata': {'name': 'lab:kwok'},
            'rules': [
                {'apiGroups': [''], 'resources': ['nodes', 'nodes/status'], 'verbs': ['get', 'list', 'watch', 'update', 'patch']},
                {'apiGroups': [''], 'resources': ['pods'], 'verbs': ['get', 'list', 'watch', 'delete', 'patch', 'update']},
                {'apiGroups': [''], 'resources': ['pods/status'], 'verbs': ['get', 'patch', 'update']},
                {'apiGroups': [''], 'resources': ['events'], 'verbs': ['create', 'patch', 'update']},
                {'apiGroups': ['coordination.k8s.io'], 'resources': ['leases'],
                 'verbs': ['get', 'list', 'watch', 'create', 'update', 'patch', 'delete']},
            ],
        }
        binding = {
            'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'ClusterRoleBinding', 'metadata': {'name': 'lab:kwok'},
            'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'ClusterRole', 'name': 'lab:kwok'},
            'subjects': [{'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'Group', 'name': 'lab:kwok'}],
        }
        self.api('POST', '/apis/rbac.authorization.k8s.io/v1/clusterroles', role, expect=(201, 409))
        self.api('POST', '/apis/rbac.authorization.k8s.io/v1/clusterrolebindings', binding, expect=(201, 409))

    def register_node(self, name, labels=None, taints=(), addresses=(), pod_cidr=None, node_info=None):  # pylint: disable=too-many-arguments
        """Create a Node that kwok manages, as a node's kubelet registers itself.

        labels: extra labels on top of the ones kubelet sets (kubernetes.io/hostname, kubernetes.io/os and arch);
        taints: [{'key', 'value', 'effect'}] (Talos's control-plane taint is
        node-role.kubernetes.io/control-plane:NoSchedule); addresses: the node's InternalIPs; pod_cidr: spec.podCIDR
        (inside the cluster's pod subnet; None leaves it to kube-controller-manager's node IPAM, as Talos does);
        node_info: status.nodeInfo fields to report (osImage 'Talos (v1.13.9)', bootID ...).
        """
        all_labels = {'kubernetes.io/hostname': name, 'kubernetes.io/os': 'linux', 'kubernetes.io/arch': 'amd64',
                      'beta.kubernetes.io/os': 'linux', 'beta.kubernetes.io/arch': 'amd64'}
        all_labels.update(labels or {})
        all_labels[KWOK_NODE_LABEL[0]] = KWOK_NODE_LABEL[1]
        spec = {'taints': [dict(t) for t in taints]}
        if pod_cidr:
            spec['podCIDR'] = pod_cidr
            spec['podCIDRs'] = [pod_cidr]
        node = {
            'apiVersion': 'v1', 'kind': 'Node',
            'metadata': {'name': name, 'labels': all_labels},
            'spec': spec,
            'status': {
                'addresses': [{'type': 'InternalIP', 'address': a} for a in addresses] + [{'type': 'Hostname', 'address': name}],
                'allocatable': {'cpu': '4', 'memory': '8Gi', 'pods': '110'},
                'capacity': {'cpu': '4', 'memory': '8Gi', 'pods': '110'},
                # what the kubelet reports; kwok's node-initialize stage fills what is left out (kernel, runtime).
                # kubeletVersion: the kubelet's own version (pkg/kubelet/nodestatus/setters.go:361), by default the
                # lab's kube-apiserver's; a Talos node's is its kubelet image's (node_info)
                'nodeInfo': dict({'architecture': 'amd64', 'operatingSystem': 'linux',
                                  'kubeletVersion': 'v' + upstream.components()['kube-apiserver']['version']},
                                 **(node_info or {})),
            },
        }
        created = self.api('POST', '/api/v1/nodes', node, expect=(201, 409))
        if created.get('kind') == 'Status':  # registered before (kubelet ran on it earlier): its kubelet runs again
            # the kubelet that starts (perhaps another version) writes its nodeInfo on its first status update:
            # k8s.io/kubernetes@v1.36.3 pkg/kubelet/kubelet_node_status.go:585 setNodeStatus, :595 PatchNodeStatus, the
            # setters including nodestatus.VersionInfo (:689; setters.go:361 kubeletVersion from its own build version)
            self.api('PATCH', '/api/v1/nodes/%s/status' % name, {'status': {'nodeInfo': node['status']['nodeInfo']}},
                     content_type='application/strategic-merge-patch+json')
            return self.start_kubelet(name)
        return created

    def _kwok_label(self, name, value):
        patch = {'metadata': {'labels': {KWOK_NODE_LABEL[0]: value}}}
        return self.api('PATCH', '/api/v1/nodes/' + name, patch, content_type='application/merge-patch+json')

    def stop_kubelet(self, name):
        """The node's kubelet stops: kwok lets go of it, its Lease is no longer renewed, and kube-controller-manager's
        node lifecycle controller marks it Ready=Unknown (NodeStatusUnknown) with the unreachable taints after its
        grace period."""
        return self._kwok_label(name, None)

    def crash_loop(self, node, workload='kube-system/cilium'):
        """The pod of DaemonSet workload (NAMESPACE/NAME) on node crash-loops, as its kubelet reports it, until
        clear_crash_loop(node) (lab/k8s_upstream/kubelet.py CrashLoops)."""
        namespace, _slash, daemonset = workload.partition('/')
        if not namespace or not daemonset or '/' in daemonset:
            raise ControlPlaneError('workload must be NAMESPACE/DAEMONSET, got %r' % workload)
        if self._crashloops is None:
            self._crashloops = kubelet.CrashLoops(self).start()
        self._crashloops.set(node, namespace, daemonset)

    def crash_looping(self, pod):
        """Whether pod is one a crash_loop fault makes crash-loop (whatever its status says yet)."""
        return self._crashloops is not None and self._crashloops.targets(pod)

    def clear_crash_loop(self, node):
        if self._crashloops is not None:
            self._crashloops.clear(node)

    # ------------------------------------------------------------------ workload faults (lab/k8s_upstream/policies.py)

    def image_pull(self, workload, message=DEFAULT_PULL_ERROR, timeout=POLICY_TIMEOUT):
        """The pods workload's controller creates from now on (NAMESPACE/NAME of a Deployment, DaemonSet or
        StatefulSet) cannot pull their image, as their kubelet reports it, until clear_image_pull (kubelet.py
        ImagePulls); message: the registry's error, {image} standing for the container's image. Pods that run keep
        running."""
        namespace, name = self._workload(workload, 'Deployment, DaemonSet or StatefulSet')
        if self._image_pulls is None:
            self._image_pulls = kubelet.ImagePulls(self).start()
        self._image_pulls.set('%s/%s' % (namespace, name), message)
        self._put_policy('image-pull', namespace, name, policies.image_pull_mutation(), policies.IMAGE_PULL_LABEL, timeout)

    def clear_image_pull(self, workload):
        """New pods pull their image again; the ones waiting for it run (their kubelet's next pull succeeds)."""
        namespace, name = self._workload(workload, 'Deployment, DaemonSet or StatefulSet')
        self._delete_policy('image-pull', namespace, name, policies.IMAGE_PULL_LABEL)
        if self._image_pulls is not None:
            self._image_pulls.clear('%s/%s' % (namespace, name))

    def pending(self, workload, timeout=POLICY_TIMEOUT):
        """The pods workload's controller creates from now on (NAMESPACE/NAME of a Deployment or StatefulSet) ask for
        more cpu than any Node has, so kube-scheduler leaves them Pending, Unschedulable (`Insufficient cpu`), until
        clear_pending."""
        namespace, name = self._workload(workload, 'Deployment or StatefulSet')
        self._put_policy('pending', namespace, name, policies.pending_mutation(), policies.PENDING_LABEL, timeout)

    def clear_pending(self, workload):
        """New pods are created as their template says; the ones the fault left unscheduled are deleted, so that the
        workload's controller creates them anew (a pod's resources cannot be changed back)."""
        namespace, name = self._workload(workload, 'Deployment or StatefulSet')
        self._delete_policy('pending', namespace, name, policies.PENDING_LABEL)
        for pod in self.api('GET', '/api/v1/namespaces/%s/pods?labelSelector=%s' % (namespace, policies.PENDING_LABEL))['items']:
            if kubelet.workload_of(pod) == '%s/%s' % (namespace, name) and not pod['spec'].get('nodeName'):
                self.api('DELETE', '/api/v1/namespaces/%s/pods/%s' % (namespace, pod['metadata']['name']), expect=(200, 404))

    @staticmethod
    def _workload(text, kinds):
        try:
            return policies.parse_workload(text, kinds)
        except ValueError as exc:
            raise ControlPlaneError(str(exc)) from None

    def _put_policy(self, kind, namespace, name, mutation, label, timeout):
        """Create (or replace) the fault's MutatingAdmissionPolicy and its binding, then wait until kube-apiserver
        applies it: a dryRun=All create of a pod as the workload's controller makes one comes back with label."""
        for document, plural in zip(policies.policy(kind, namespace, name, mutation),
                                    ('mutatingadmissionpolicies', 'mutatingadmissionpolicybindings')):
            path = policies.API + plural
            found = self.api('GET', path + '/' + document['metadata']['name'], expect=(200, 404))
            if found.get('kind') == 'Status':
                self.api('POST', path, document, expect=(201,))
            else:
                document['metadata']['resourceVersion'] = found['metadata']['resourceVersion']
                self.api('PUT', path + '/' + document['metadata']['name'], document, expect=(200,))
        self._wait_policy(kind, namespace, name, label, True, timeout)

    def _wait_policy(self, kind, namespace, name, label, applied, timeout):
        """Wait until kube-apiserver applies the fault's policy (applied=True) or no longer does (its policy cache
        follows the objects through a watch): a dryRun=All create of a pod as the workload's controller makes one comes
        back with label, or without it."""
        def probe():
            answer = self.api('POST', '/api/v1/namespaces/%s/pods?dryRun=All' % namespace, policies.probe_pod(name),
                              expect=(201, 400, 403, 404, 422, 500))
            if answer.get('kind') == 'Status':
                # no such namespace: no pod can be created there, so the policy changes none
                return answer.get('code') == 404 and not applied, answer.get('message')
            labels = answer['metadata'].get('labels') or {}
            return (label in labels) == applied, 'the probe pod came back with labels %s' % labels
        result = _wait.wait_for(probe, timeout, interval=0.1, backoff=1.5, max_interval=1.0, progress=None)
        if not result.ok:
            raise ControlPlaneError('the admission policy of fault %s on %s/%s did not %s within %.0f s: %s'
                                    % (kind, namespace, name, 'take effect' if applied else 'end', timeout, result.observation))

    def _delete_policy(self, kind, namespace, name, label, timeout=POLICY_TIMEOUT):
        pname = policies.policy_name(kind, namespace, name)
        for plural in ('mutatingadmissionpolicybindings', 'mutatingadmissionpolicies'):
            self.api('DELETE', policies.API + plural + '/' + pname, expect=(200, 404))
        self._wait_policy(kind, namespace, name, label, False, timeout)

    def expose_pod(self, namespace, name, ports, timeout=60.0):
        """The process listening at ports {container port: (host, port)} plays pod namespace/name: once kwok has given
        the pod its address, kube-apiserver's connections to that address and container port reach it (podnet.py).
        Returns the pod's IP."""
        path = '/api/v1/namespaces/%s/pods/%s' % (namespace, name)

        def probe():
            pod = self.api('GET', path)
            return bool((pod.get('status') or {}).get('podIP')), (pod.get('status') or {}).get('podIP')
        result = _wait.wait_for(probe, timeout, interval=0.1, backoff=1.5, max_interval=1.0, progress=None)
        if not result.ok:
            raise ControlPlaneError('pod %s/%s has no address within %.0f s' % (namespace, name, timeout))
        for port, target in ports.items():
            self.pod_network.expose(result.observation, port, target)
        return result.observation

    def start_kubelet(self, name):
        """The node's kubelet runs again: kwok takes it back and reports it Ready."""
        return self._kwok_label(name, KWOK_NODE_LABEL[1])
