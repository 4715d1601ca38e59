"""One simulated Talos node: what it keeps on its disk, what it runs, and how it answers RPCs.

The node exists while its VM runs. Its "disk" (NodeDisk) survives power cycles and is lost only
when the VM is deleted: the applied machine config, a staged config, whether Talos is installed,
and whether etcd has data. Everything else (services, the apid listener, running tasks) is
process state: a VM stop or reset ends it like a power cut.

Apply modes as Talos v1.13 handles them (v1alpha1_server.go ApplyConfiguration): NO_REBOOT and
REBOOT persist the config (REBOOT then reboots), STAGED only persists it (the running config is
unchanged until the next boot), TRY only sets the running config - it is never persisted, so
the next boot runs the persisted one - and starts a timer that sets back the config that ran
before after the try timeout (the client's, in real seconds: not scaled by the lab's time
scale). Every ApplyConfiguration whose mode is not TRY, dry runs and refused ones included,
first cancels a pending revert, as Talos does; the tried config then runs until the next boot.
A change that needs a reboot is refused in NO_REBOOT and TRY mode with INVALID_ARGUMENT.

Life cycle (each delay from the lab's timing, kinds in brackets):

    power on -[vm_boot]-> maintenance (no installed config)      server-only TLS, self-signed Ed25519
                       -> configured  (installed config)         mTLS against machine.ca
    maintenance + ApplyConfiguration -> reply NO_REBOOT, apid turns to mTLS with the new config -[talos_install]->
                                        port closes -[talos_install_reboot]-> configured
    Reboot RPC / apply that needs a reboot -> port closes -[talos_reboot]-> configured (staged config applied)
    Reset RPC -> (graceful control plane: leaves etcd) port closes -[talos_reset]-> maintenance (reboot=true) or halted
    Upgrade RPC -> kubelet, etcd stop -[talos_upgrade]-> port closes -[talos_reboot]-> configured, the image's version
    Shutdown RPC -> port closes -[talos_shutdown]-> halted (the VM itself keeps running in the lab)

Configured boot: control planes issue apid's certificate from machine.ca (they hold its key).
Workers only hold the CA certificate: in Talos they get their certificate from trustd on a
control plane. The lab does the same: a worker's apid comes up only once a control plane of the
lab, configured and up, holds the key of the worker's OS CA (then [talos_apid_cert]); until then
its port stays closed.

Services (ServiceList): machined, udevd, containerd, apid, cri, trustd (control planes), etcd
(control planes: Preparing until the cluster is bootstrapped or this node joined, then Running
and healthy), kubelet (Running and healthy once configured; on control planes after etcd runs).

RPC handlers raise RpcError(code, message); lab/talos/apid.py turns it into a gRPC status.
"""

import asyncio
import base64
import hashlib
import io
import logging
import re
import tarfile
import time

import yaml

from lab.talos import machineconfig, pki, versions
from lab.talos.services import Service

LOG = logging.getLogger('lab.talos')

TALOS_VERSION = versions.DEFAULT_VERSION
GO_VERSION = 'go1.24.11'

KUBELET_VOLUME_MESSAGE = 'Waiting for volume "/var/lib/kubelet" to be mounted'


class RpcError(Exception):
    """An RPC answered with a gRPC status: code is the status name ('INVALID_ARGUMENT')."""

    def __init__(self, code, message):
        super().__init__('%s: %s' % (code, message))
        self.code = code
        self.message = message


class NodeDisk(object):
    """What survives a power cycle."""

    def __init__(self):
        self.config = None          # machineconfig.MachineConfig the node runs
        self.config_bytes = None
        self.staged = None          # (MachineConfig, bytes) persisted by STAGED: the next boot runs it
        self.persisted = None       # (MachineConfig, bytes) the next boot runs while a TRY config (not persisted) runs
        self.installed = False
        # the Talos the disk boots: the installer image's tag at the install or an upgrade (lab.talos.versions)
        self.installed_version = None
        self.etcd_data = False
        # This node bootstrapped an etcd cluster of its own while another control plane of the same cluster had
        # bootstrapped one already: a split etcd (Talos' Bootstrap looks only at the node's own data directory,
        # siderolabs/talos v1.13.9 internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:457-459).
        self.etcd_split = False

    def boot_config(self):
        """At boot: the persisted config becomes the running one (a staged one first, else the one a try hid)."""
        if self.staged is not None:
            self.config, self.config_bytes = self.staged
        elif self.persisted is not None:
            self.config, self.config_bytes = self.persisted
        self.staged = None
        self.persisted = None

    def persist(self, config, data):
        """NO_REBOOT / REBOOT: the config runs (or will after the reboot) and is what the next boot loads."""
        self.config, self.config_bytes = config, data
        self.staged = None
        self.persisted = None

    def run_unpersisted(self, config, data):
        """TRY: the config runs, the next boot still loads what was persisted."""
        if self.persisted is None:
            self.persisted = (self.config, self.config_bytes)
        self.config, self.config_bytes = config, data

    def set_running(self, config, data):
        """A try reverted: `config` runs again; nothing is hidden any more once it is the persisted one."""
        self.config, self.config_bytes = config, data
        if self.persisted is not None and self.persisted[1] == data:
            self.persisted = None

    def wipe(self, state=True, ephemeral=True):
        if state:
            self.config = None
            self.config_bytes = None
            self.staged = None
            self.persisted = None
        if ephemeral:
            self.etcd_data = False
            self.etcd_split = False


class TalosNode(object):
    """A Talos node bound to one VM. Driven by its TalosFleet."""

    def __init__(self, fleet, key, name, address=None, disk_size=32 * 1024 ** 3):
        self.fleet = fleet
        self.key = key
        self.name = name
        self.address = address
        self.disk_size = disk_size
        self.disk = NodeDisk()
        self.powered = False
        self.phase = 'off'           # off, booting, maintenance, installing, running, rebooting, resetting, halted, hung
        self.services = {}
        self.identity = None
        self.server = None
        self.boot_count = 0
        self.booted_at = None
        self.hostname_value = None
        self.reboot_pending = False
        self.bootstrap_requested = False
        self.kubelet_volume_stuck = False
        self.try_revert = None
        self.media_version = None    # the Talos of the ISO the VM boots from when the disk has none (fleet)
        self.running_version = versions.DEFAULT_VERSION   # what booted (lab.talos.versions)
        self.last_sequence_error = None   # a reset/upgrade sequence that stopped after its reply (logged by Talos)
        self._tasks = set()

    # ------------------------------------------------------------------ state as others see it

    @property
    def mode(self):
        """maintenance, configured, booting (installing, rebooting, waiting for its certificate), halted, off."""
        if self.phase == 'maintenance':
            return 'maintenance'
        if self.phase == 'running' and self.server is not None:
            return 'configured'
        if self.phase in ('off', 'halted'):
            return self.phase
        return 'booting'

    @property
    def config(self):
        return self.disk.config

    @property
    def maintenance_server(self):
        """v1.12: maintenance mode is a separate server, not apid (lab.talos.versions)."""
        return self.phase == 'maintenance' and versions.release(self.running_version)['maintenance_server']

    @property
    def machine_type(self):
        return self.disk.config.machine_type if self.disk.config is not None else None

    @property
    def control_plane(self):
        return self.disk.config is not None and self.disk.config.control_plane

    @property
    def cluster_id(self):
        return self.disk.config.cluster_id if self.disk.config is not None else None

    @property
    def hostname(self):
        if self.disk.config is not None and self.phase != 'maintenance' and self.disk.config.hostname:
            return self.disk.config.hostname
        if self.hostname_value is None:
            digest = hashlib.sha256(('%s' % (self.key,)).encode('utf-8')).hexdigest()
            self.hostname_value = 'talos-%s-%s' % (digest[:3], digest[3:6])
        return self.hostname_value

    @property
    def api_up(self):
        return self.server is not None

    def service(self, service_id):
        return self.services.get(service_id)

    def issues_worker_certs_for(self, ca_crt, token):
        """True if this node, configured and up, holds the key of the OS CA `ca_crt` and takes `token` (trustd).

        trustd authenticates the caller by its token against the control plane's own machine.token
        (siderolabs/talos v1.13.9 internal/app/trustd/main.go:92, 138-147; OSRoot.Token from machine.token,
        internal/app/machined/pkg/controllers/secrets/root.go:194); a worker sends its machine.token
        (controllers/secrets/api.go:353).
        """
        if self.phase != 'running' or not self.control_plane:
            return False
        crt, key = self.disk.config.os_ca
        return bool(key) and crt == ca_crt and bool(token) and self.disk.config.machine.get('token') == token

    # ------------------------------------------------------------------ tasks

    def _spawn(self, coroutine, name):
        task = asyncio.ensure_future(coroutine)
        task.lab_name = '%s:%s' % (self.name, name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task):
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            LOG.error('talos node %s: task %s failed: %r', self.name, getattr(task, 'lab_name', '?'), exc, exc_info=exc)

    async def _cancel_tasks(self):
        current = asyncio.current_task()
        tasks = [task for task in self._tasks if task is not current]
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):  # pylint: disable=broad-except
                pass

    # ------------------------------------------------------------------ power

    async def power_on(self, address):
        """The VM started: boot after the VM boot delay."""
        if self.powered:
            await self.power_off()
        self.address = address
        self.powered = True
        self.phase = 'booting'
        self._spawn(self._boot(first_delay='vm_boot'), 'boot')

    async def power_off(self):
        """The VM stopped: the OS is gone at once (a power cut)."""
        self.powered = False
        await self._cancel_tasks()
        await self._stop_api()
        self._forget_process_state()
        self.phase = 'off'
        self.fleet.changed()

    def _forget_process_state(self):
        if self.bootstrap_requested and self.cluster_id and not self.disk.etcd_data:
            if self.disk.etcd_split:
                self.disk.etcd_split = False   # the second bootstrap died with the process: no second etcd formed
                self.fleet.forget_split(self.cluster_id, self.key)
            else:
                cluster = self.fleet.etcd_cluster(self.cluster_id)
                if not cluster.bootstrapped:
                    cluster.bootstrapping = False  # the request died with the process: etcd never formed
        self.services = {}
        self.identity = None
        self.reboot_pending = False
        self.bootstrap_requested = False
        self.try_revert = None

    # ------------------------------------------------------------------ boot

    async def _boot(self, first_delay):
        """Boot from the disk: after first_delay, maintenance or configured."""
        self.phase = 'booting'
        self.fleet.changed()
        await self.fleet.delay(first_delay, self.name)
        self.boot_count += 1
        self.booted_at = time.time()
        self.disk.boot_config()
        self.kubelet_volume_stuck = self.fleet.kubelet_volume_fault(self) is not None
        if self.disk.config is None or not self.disk.installed:
            self.running_version = self.media_version or versions.DEFAULT_VERSION
            await self._enter_maintenance()
        else:
            self.running_version = self.disk.installed_version or versions.DEFAULT_VERSION
            await self._enter_configured()

    def _base_services(self, ids):
        self.services = {}
        for service_id in ids:
            self.services[service_id] = Service(service_id)

    def _run(self, service_id, message='Service started as goroutine', healthy=True):
        service = self.services[service_id]
        service.event('Starting', 'Starting service')
        service.event('Running', message)
        if healthy is not None:
            service.set_health(healthy, '' if healthy else 'not healthy')

    async def _enter_maintenance(self):
        self._base_services(('machined', 'udevd', 'apid'))
        self._run('machined')
        self._run('udevd', 'Started task udevd (PID 1402) for container udevd', healthy=None)
        self.identity = pki.maintenance_identity([self.address], self.hostname)
        await self._start_api(client_cas=None)
        self._run('apid', 'Started task apid (PID 1571) for container apid')
        self.phase = 'maintenance'
        self.fleet.notify('on_talos_mode', self)
        LOG.info('talos node %s (%s): maintenance mode, server certificate fingerprint %s', self.name, self.address,
                 self.identity.fingerprint)
        self.fleet.changed()

    async def _enter_configured(self):
        config = self.disk.config
        ids = ['machined', 'udevd', 'containerd', 'apid', 'cri']
        if config.control_plane:
            ids += ['trustd', 'etcd']
        ids.append('kubelet')
        self._base_services(ids)
        self._run('machined')
        self._run('udevd', 'Started task udevd (PID 1402) for container udevd', healthy=None)
        self._run('containerd', 'Started task containerd (PID 1766) for container containerd')
        self._run('cri', 'Started task cri (PID 1873) for container cri')
        apid = self.services['apid']
        apid.event('Waiting', 'Waiting for service "containerd" to be "up", api certificates')
        kubelet = self.services['kubelet']
        kubelet.event('Waiting', 'Waiting for service "cri" to be "up", time sync, network')
        self.phase = 'running'
        self.fleet.notify('on_talos_mode', self)
        if config.control_plane:
            self._run('trustd', 'Started task trustd (PID 1998) for container trustd')
            etcd = self.services['etcd']
            etcd.event('Waiting', 'Waiting for service "cri" to be "up", time sync, network, etcd spec')
            ca_crt, ca_key = config.os_ca
            self.identity = pki.apid_identity(pki.load_certificate(ca_crt), pki.load_private_key(ca_key), [self.address],
                                              self.hostname, config.cert_sans)
        else:
            self.fleet.changed()
            ca_crt, dummy_key = config.os_ca
            token = config.machine.get('token')
            await self.fleet.wait_for(lambda: self.fleet.find_cert_issuer(ca_crt, token) is not None)
            issuer = self.fleet.find_cert_issuer(ca_crt, token)
            await self.fleet.delay('talos_apid_cert', self.name)
            issuer_crt, issuer_key = issuer.disk.config.os_ca
            self.identity = pki.apid_identity(pki.load_certificate(issuer_crt), pki.load_private_key(issuer_key),
                                              [self.address], self.hostname, config.cert_sans, worker=True)
        client_cas = b''.join(pem for pem in [config.os_ca[0]] + config.accepted_cas if pem)
        await self._start_api(client_cas=client_cas)
        self._run('apid', 'Started task apid (PID 2105) for container apid')
        self.fleet.changed()
        if config.control_plane:
            self._spawn(self._run_etcd(), 'etcd')
        self._spawn(self._run_kubelet(), 'kubelet')

    # ------------------------------------------------------------------ etcd and kubelet

    def own_etcd_cluster(self):
        """The etcd cluster this node's data belongs to: its cluster's, or the split one its own bootstrap formed."""
        if self.disk.etcd_split:
            return self.fleet.split_cluster(self.cluster_id, self.key)
        return self.fleet.etcd_cluster(self.cluster_id)

    async def _run_etcd(self):
        etcd = self.services['etcd']
        cluster = self.fleet.etcd_cluster(self.cluster_id)
        promote = False
        # siderolabs/talos v1.13.9 internal/app/machined/pkg/system/service_runner.go:271: "Running pre state"
        etcd.event('Preparing', 'Running pre state')
        if self.disk.etcd_data and self.own_etcd_cluster().member_for(self.key) is not None:
            await self.fleet.delay('etcd_start', self.name)
            cluster = self.own_etcd_cluster()
        else:
            # PreFunc with an empty data directory (services/etcd.go:517-543): wait until this node is told to
            # bootstrap, or join the cluster bootstrapped elsewhere, retrying for EtcdJoinTimeout (etcd.go:333).
            joining = await self._wait_bootstrap_or_join(etcd, cluster)
            cluster = self.own_etcd_cluster()
            if not joining:
                await self.fleet.delay('etcd_bootstrap', self.name)
                cluster.bootstrap(self.key, self.hostname, self.address)
                if not self.disk.etcd_split:
                    self.fleet.notify('on_etcd_bootstrapped', self.cluster_id, self)
            else:
                # addMember (siderolabs/talos v1.13.9 services/etcd.go:286-325): MemberAddAsLearner; etcd names the
                # member only once it starts, so the list shows it with an empty name until then (etcd.go:378-381)
                cluster.add(self.key, '', self.address, learner=True)
                self.fleet.changed()
                await self.fleet.delay('etcd_join', self.name)
                promote = True
            self.disk.etcd_data = True
        cluster.add(self.key, self.hostname, self.address)
        etcd.event('Preparing', 'Creating service runner')
        etcd.event('Running', 'Started task etcd (PID 2467) for container etcd')
        unhealthy = self.fleet.etcd_health_message(self)
        etcd.set_health(unhealthy is None, unhealthy or '')
        self.fleet.changed()
        if promote:
            # Runner (etcd.go:205-216) starts promoteMember (:604-647): MemberPromote retried every 15 s until the
            # learner caught up with the leader. Only the boot that joined does it (PreFunc clears the learner id, :120).
            await self.fleet.delay('etcd_promote', self.name)
            cluster.promote(self.key)
            self.fleet.changed()

    async def _wait_bootstrap_or_join(self, etcd, cluster):
        """False once this node is told to bootstrap, True once it can join; etcd Failed after the join timeout.

        The join retries for constants.EtcdJoinTimeout = 30m (siderolabs/talos v1.13.9
        pkg/machinery/constants/constants.go:926, used at internal/app/machined/pkg/system/services/etcd.go:333);
        when it runs out, PreFunc fails and the service runner records Failed with the error, capitalised
        (service_runner.go:279 "failed to run pre stage: %w", system.go:195-200), and nothing restarts it
        (BootTimeout 70m, constants.go:915). A Bootstrap call still works then: BootstrapEtcd stops and
        reloads the service (etcd.go:682-717). The lab's timeout is the fault talos-etcd-join-timeout, or
        30 minutes times the time scale in the realistic profile (none with the instant profile or scale 0).
        """
        def decided():
            return self.bootstrap_requested or cluster.bootstrapped or self.fleet.etcd_join_timed_out(self)
        timeout = self.fleet.etcd_join_timeout_seconds()
        try:
            await asyncio.wait_for(self.fleet.wait_for(decided), timeout)
        except asyncio.TimeoutError:
            pass
        if not self.bootstrap_requested and not cluster.bootstrapped:
            # The wording after "failed to build cluster arguments: " is go-retry v0.3.3's ErrorSet of TimeoutError
            # (retry/retry.go:51-61, 126-131): the attempts' text is modelled, not observed on a node.
            etcd.event('Failed', 'Failed to run pre stage: failed to build initial etcd cluster: failed to build '
                                 'cluster arguments: 1 error(s) occurred:\n\ttimeout')
            self.fleet.changed()
            LOG.info('talos node %s: etcd join timed out, etcd Failed until a Bootstrap call or a reboot', self.name)
            await self.fleet.wait_for(lambda: self.bootstrap_requested)
        return not self.bootstrap_requested

    async def _run_kubelet(self):
        kubelet = self.services['kubelet']
        if self.control_plane:
            await self.fleet.wait_for(lambda: self.services.get('etcd') is not None and self.services['etcd'].is_healthy)
        if self.kubelet_volume_stuck:
            kubelet.event('Waiting', KUBELET_VOLUME_MESSAGE)
            self.fleet.changed()
            await self.fleet.wait_for(lambda: not self.kubelet_volume_stuck)
        kubelet.event('Preparing', 'Running pre state')
        await self.fleet.delay('kubelet_start', self.name)
        kubelet.event('Preparing', 'Creating service runner')
        kubelet.event('Running', 'Started task kubelet (PID 2601) for container kubelet')
        kubelet.set_health(True)
        self.fleet.changed()
        self.fleet.notify('on_kubelet_running', self)

    def _live_change(self, before):
        """A config now runs without a reboot (NO_REBOOT, TRY, a try revert): Talos' controllers follow it.

        siderolabs/talos v1.13.9: the KubeletSpec takes machine.kubelet.image (controllers/k8s/kubelet_spec.go:221),
        and KubeletServiceController stops the kubelet service and starts it again on every change of its inputs
        (controllers/k8s/kubelet_service.go:154-219): a new kubelet image restarts kubelet, its Node goes NotReady
        and comes back with the image's version. The static pods of a control plane follow the cluster section
        (controllers/k8s/control_plane_static_pod.go: the image of each component's config); the lab's Kubernetes
        listens (on_config_live).
        """
        after = self.disk.config
        if before is None or after is None or self.phase != 'running':
            return
        self.fleet.notify('on_config_live', self)
        kubelet = self.services.get('kubelet')
        if before.kubelet_image != after.kubelet_image and kubelet is not None and kubelet.state == 'Running':
            LOG.info('talos node %s: kubelet image %s -> %s, kubelet restarts', self.name, before.kubelet_image,
                     after.kubelet_image)
            self._spawn(self._restart_kubelet(), 'kubelet')

    async def _restart_kubelet(self):
        kubelet = self.services['kubelet']
        kubelet.event('Stopping', 'Sending SIGTERM to task kubelet (PID 2601, container kubelet)')
        kubelet.clear_health()
        # only kubelet stops: the node, its static pods (kube-apiserver...) and etcd keep running
        self.fleet.notify('on_kubelet_restarting', self)
        kubelet.event('Finished', 'Service finished successfully')
        self.fleet.changed()
        await self._run_kubelet()

    # ------------------------------------------------------------------ apid listener

    async def _start_api(self, client_cas):
        if self.fleet.is_unreachable(self):
            server = self.fleet.blackhole_server(self)
            await server.start(self.address, self.fleet.port)
            self.server = server
            return
        context = pki.server_ssl_context(self.identity, client_cas)
        server = self.fleet.apid_server(self)
        await server.start(self.address, self.fleet.port, ssl=context)
        self.server = server   # only now: `mode` says configured/maintenance once the port answers
        self.fleet.api_listening(self, True)

    async def _stop_api(self, graceful=False):
        """Close the listener and its connections: graceful flushes what was sent, else a power cut."""
        server, self.server = self.server, None
        if server is not None:
            self.fleet.api_listening(self, False)
            await server.stop(graceful=graceful)

    async def restart_api(self):
        """Close and reopen the listener (the unreachable fault is applied or cleared)."""
        if self.server is None or self.identity is None:
            return
        client_cas = None
        if self.phase in ('running', 'installing'):
            config = self.disk.config
            client_cas = b''.join(pem for pem in [config.os_ca[0]] + config.accepted_cas if pem)
        await self._stop_api()
        await self._start_api(client_cas)

    async def _go_down(self, phase):
        """The OS stops serving: listener closed, services and tasks gone (except the caller)."""
        kubelet = self.services.get('kubelet')
        kubelet_was_running = kubelet is not None and kubelet.state == 'Running'
        await self._stop_api(graceful=True)
        await self._cancel_tasks()
        if kubelet_was_running:
            self.fleet.notify('on_kubelet_stopped', self)
        self._forget_process_state()
        self.phase = phase
        self.fleet.changed()

    def after_reply(self, coroutine_function, name):
        """Run what an RPC set in motion once its reply went out (apid calls this after the trailers)."""
        self._spawn(coroutine_function(), name)

    # ------------------------------------------------------------------ RPCs

    def version(self):
        """The version the node booted; the commit only for the tags the lab read (else unknown, empty)."""
        release = versions.release(self.running_version)
        return {'tag': self.running_version, 'sha': release['sha'] if self.running_version == release['tag'] else '',
                'built': '', 'go_version': GO_VERSION, 'os': 'linux', 'arch': 'amd64', 'platform': 'metal',
                'platform_mode': 'metal', 'rbac': True}

    def disks(self):
        return [
            {'device_name': '/dev/sda', 'name': 'sda', 'size': self.disk_size, 'model': 'QEMU HARDDISK',
             'serial': '', 'type': 'HDD', 'bus_path': '/pci0000:00/0000:00:05.0/virtio2/host2/target2:0:0/2:0:0:0',
             'system_disk': self.disk.installed and self.phase != 'maintenance', 'subsystem': '/sys/class/block',
             'readonly': False},
            {'device_name': '/dev/sr0', 'name': 'sr0', 'size': 104857600, 'model': 'QEMU DVD-ROM', 'serial': '',
             'type': 'CD', 'bus_path': '/pci0000:00/0000:00:01.1/ata2/host1/target1:0:0/1:0:0:0',
             'system_disk': False, 'subsystem': '/sys/class/block', 'readonly': True},
        ]

    def service_list(self):
        return list(self.services.values())

    def apply_configuration(self, data, mode, dry_run, try_timeout, defer):
        """ApplyConfiguration as Talos v1.13 handles it: (mode name, mode_details, warnings).

        defer(coroutine_function, name): what to run once the reply is out (install, reboot).
        The lab handles one apply at a time, start to end, so Talos' "another apply configuration
        is already in progress" cannot happen here.
        """
        if mode != 'TRY':
            self.cancel_try_revert()
        if self.reboot_pending:
            raise RpcError('FAILED_PRECONDITION', 'configuration was already applied and node is rebooting, '
                                                  'please wait for the reboot to complete')
        rejection = self.fleet.take_apply_reject(self)
        if rejection is not None:
            raise RpcError('INVALID_ARGUMENT', rejection)
        if self.maintenance_server:
            return self._apply_in_v112_maintenance(data, mode, dry_run, defer)
        maintenance = self.phase == 'maintenance'
        try:
            # Talos validates with modeWrapper{installed: Machine().Installed()} (v1alpha1_server.go:219-222), which is
            # whether the META partition exists (runtime/v1alpha1/v1alpha1_state.go:226-262), in maintenance mode too
            new, warnings = machineconfig.parse(data, installed=self.disk.installed)
        except machineconfig.ConfigError as exc:
            raise RpcError('INVALID_ARGUMENT', str(exc))
        old = None if maintenance else self.disk.config
        refusal = None

        if maintenance:
            # v1.13 takes every mode in maintenance: REBOOT becomes NO_REBOOT (v1alpha1_server.go:236-238), AUTO
            # resolves to NO_REBOOT and CanApplyImmediate's answer is ignored there (:247, :257-264)
            resolved, details = self._resolve_mode('NO_REBOOT' if mode in ('REBOOT', 'AUTO') else mode, None, try_timeout)
        else:
            refusal = machineconfig.immediate_refusal(old, new)
            resolved, details = self._resolve_mode(mode, refusal, try_timeout)

        if dry_run:
            # v1alpha1_server.go:269-284: the summary names modeDetails without CanApplyImmediate's error (modeErr)
            head = details[:-len(': ' + refusal)] if mode == 'AUTO' and not maintenance and refusal else details
            summary = 'Dry run summary:\n%s (skipped in dry-run).\nConfig diff:\n\n%s' % (
                head.split('\n', 1)[0], machineconfig.diff(old, new))
            return resolved, summary, []

        if maintenance and resolved == 'STAGED':
            # STAGED only persists (v1alpha1_server.go:317-320): no active config, so the node stays in maintenance
            # mode (controllers/config/acquire.go:735-741). What a later boot does with it is not modelled (guess: the
            # lab forgets it, the node boots into maintenance mode again).
            pass
        elif maintenance:
            # NO_REBOOT and TRY set the active config (:304-315), which completes the maintenance wait
            # (acquire.go:746-752); TRY's revert timer is not modelled in maintenance mode (guess)
            self.disk.persist(new, bytes(data))
            defer(self._install_and_reboot, 'install')
        elif resolved == 'STAGED':
            self.disk.staged = (new, bytes(data))
        elif resolved == 'REBOOT':
            self.disk.persist(new, bytes(data))
            self.reboot_pending = True
            defer(self._reboot, 'reboot-after-apply')
        elif resolved == 'TRY':
            # Talos' RollbackToConfigAfter: the revert sets back the config running now (after a
            # cancelled earlier timer), and the tried config is never persisted.
            self.cancel_try_revert()
            previous = (self.disk.config, self.disk.config_bytes)
            self.disk.run_unpersisted(new, bytes(data))
            self.try_revert = self._spawn(self._revert_after(previous, try_timeout), 'try-revert')
            self._live_change(old)
        else:
            self.disk.persist(new, bytes(data))
            self._live_change(old)
        self.fleet.changed()
        return resolved, details, warnings

    def _apply_in_v112_maintenance(self, data, mode, dry_run, defer):
        """ApplyConfiguration of v1.12's maintenance server (siderolabs/talos v1.12.11
        internal/app/maintenance/server.go:85-135): TRY, REBOOT and AUTO only (else Unimplemented); a config it
        cannot decode is a plain error (codes.Unknown) "failed to parse config: ...", one that does not validate
        InvalidArgument "configuration validation failed: ..."; the reply has only the warnings (so mode REBOOT, the
        enum's zero, and no mode_details), a dry run a fixed summary. The config then goes to the install."""
        if mode not in ('TRY', 'REBOOT', 'AUTO'):
            raise RpcError('UNIMPLEMENTED', "apply configuration --mode='%s' is not supported in maintenance mode"
                           % mode.lower().replace('_', '-'))
        try:
            new, warnings = machineconfig.parse(data, installed=self.disk.installed)
        except machineconfig.ConfigError as exc:
            if exc.stage == 'decode':
                raise RpcError('UNKNOWN', 'failed to parse config: %s' % exc) from None
            raise RpcError('INVALID_ARGUMENT', 'configuration validation failed: %s' % exc) from None
        if dry_run:
            return 'REBOOT', 'Dry run summary:\nNode is running in maintenance mode and does not have a config yet.', \
                warnings
        self.disk.persist(new, bytes(data))
        defer(self._install_and_reboot, 'install')
        self.fleet.changed()
        return 'REBOOT', '', warnings

    def cancel_try_revert(self):
        """Talos' CancelConfigRollbackTimeout: a pending try revert does not happen (the tried config keeps running)."""
        if self.try_revert is not None:
            self.try_revert.cancel()
            self.try_revert = None
            LOG.info('talos node %s: try-mode revert cancelled', self.name)

    @staticmethod
    def _resolve_mode(mode, refusal, try_timeout):
        """(mode, mode_details) as v1alpha1_server.go:199-267 (siderolabs/talos v1.13.9) resolves them.

        refusal: CanApplyImmediate's error text, None when the change applies live. AUTO turns into REBOOT with
        ": <refusal>" after the details (:257-260, :345); NO_REBOOT and TRY answer it as InvalidArgument (:246-249).
        """
        if mode == 'AUTO':
            if refusal:
                return 'REBOOT', 'Applied configuration with a reboot: %s' % refusal
            return 'NO_REBOOT', 'Applied configuration without a reboot'
        if mode == 'REBOOT':
            return 'REBOOT', 'Applied configuration with a reboot'
        if mode == 'STAGED':
            return 'STAGED', 'Staged configuration to be applied after the next reboot'
        if refusal:
            raise RpcError('INVALID_ARGUMENT', refusal)
        if mode == 'TRY':
            # v1alpha1_server.go:298: the timeout as Go's Duration.String() writes it
            return 'TRY', ('Applied configuration without a reboot\nThe config is applied in \'try\' mode and will be '
                           'automatically reverted back in %s' % _duration_text(try_timeout))
        return 'NO_REBOOT', 'Applied configuration without a reboot'

    async def _revert_after(self, previous, seconds):
        """Talos' rollback timer (time.AfterFunc): after the client's try timeout, the earlier config runs again."""
        await asyncio.sleep(seconds)
        self.try_revert = None
        before = self.disk.config
        self.disk.set_running(*previous)
        self._live_change(before)
        LOG.info('talos node %s: try-mode config reverted after %s', self.name, _duration_text(seconds))
        self.fleet.changed()

    async def _install_and_reboot(self):
        """Maintenance apply on v1.13: apid switches to mTLS with the new config, Talos installs, then reboots.

        siderolabs/talos v1.13.9: apid is an early service of the boot (v1alpha1_sequencer.go:89-96), not the
        maintenance server's; once the config is complete the maintenance request is torn down
        (controllers/config/acquire.go:764-787) and APIServiceConfig turns to mTLS on :50000
        (controllers/runtime/api_service_config.go:126-139). The Install sequence then runs install ... reboot
        (v1alpha1_sequencer.go:152-185). So for `talos_install` the node answers over mTLS with the applied
        config, on the boot it had in maintenance mode (same machined events), before its port closes for the
        reboot (`talos_install_reboot`). A worker answers in that window only when a control plane can issue
        its certificate (trustd); else its port stays closed until after the reboot.
        """
        v112 = self.maintenance_server
        self.phase = 'installing'
        if v112:
            # v1.12: apid is not an early service (v1.12.11 v1alpha1_sequencer.go:88-94 earlyServices: udevd,
            # machined, auditd, syslogd, containerd) and the maintenance server stops gracefully once its request is
            # torn down (controllers/runtime/maintenance_service.go:96-113, :182-190): no API until after the reboot
            await self._stop_api(graceful=True)
        else:
            await self._serve_applied_config()
        self.fleet.changed()
        await self.fleet.delay('talos_install', self.name)
        self.disk.installed = True
        # the installer image of the config installs its own Talos (v1alpha1_sequencer_tasks.go:1505)
        self.disk.installed_version = (versions.from_installer_image(self.disk.config.install_image)
                                       or self.running_version)
        self.reboot_pending = True
        await self._go_down('installing')
        await self.fleet.delay('talos_install_reboot', self.name)
        await self._boot(first_delay=None)

    async def _serve_applied_config(self):
        config = self.disk.config
        ca_crt, ca_key = config.os_ca
        if config.control_plane:
            issuer_crt, issuer_key = ca_crt, ca_key
        else:
            issuer = self.fleet.find_cert_issuer(ca_crt, config.machine.get('token'))
            if issuer is None:
                await self._stop_api(graceful=True)
                return
            issuer_crt, issuer_key = issuer.disk.config.os_ca
        identity = pki.apid_identity(pki.load_certificate(issuer_crt), pki.load_private_key(issuer_key), [self.address],
                                     self.hostname, config.cert_sans, worker=not config.control_plane)
        await self._stop_api(graceful=True)
        self.identity = identity
        await self._start_api(client_cas=b''.join(pem for pem in [ca_crt] + config.accepted_cas if pem))

    async def _reboot(self):
        await self._go_down('rebooting')
        self.fleet.talos_rebooted(self)
        if self.fleet.reboot_hangs(self):
            self.phase = 'hung'
            self.fleet.changed()
            LOG.info('talos node %s: reboot hangs (fault talos-reboot-hang)', self.name)
            return
        await self.fleet.delay('talos_reboot', self.name)
        await self._boot(first_delay=None)

    def bootstrap(self):
        """Talos' Bootstrap handler, in its order (siderolabs/talos v1.13.9 v1alpha1_server.go:439-472)."""
        if self.phase != 'running' or self.disk.config is None:
            # v1alpha1_server.go:442-443 (IsBootstrapAllowed)
            raise RpcError('FAILED_PRECONDITION', 'bootstrap is not available yet')
        if not self.control_plane:
            if versions.line(self.running_version) == 'v1.12':
                # siderolabs/talos v1.12.11 v1alpha1_server.go:452-454
                raise RpcError('FAILED_PRECONDITION', 'bootstrap can only be performed on a control plane node')
            # internal/app/internal/machinehelper/machinehelper.go:34-36 (CheckControlplane)
            raise RpcError('UNIMPLEMENTED', 'bootstrap is only available on control plane nodes')
        if self.disk.etcd_data:
            # v1alpha1_server.go:457-459: only this node's own /var/lib/etcd is looked at
            raise RpcError('ALREADY_EXISTS', 'etcd data directory is not empty')
        cluster = self.fleet.etcd_cluster(self.cluster_id)
        if cluster.bootstrapped or cluster.bootstrapping:
            # Another control plane bootstrapped already and this node's data directory is empty: Talos starts a
            # second etcd cluster here (a split), as nothing in the handler looks further than this node.
            self.disk.etcd_split = True
            LOG.warning('talos node %s: Bootstrap with an empty data directory while %s is bootstrapped: a second, '
                        'split etcd cluster forms', self.name, self.cluster_id)
        else:
            cluster.bootstrapping = True
        etcd = self.services.get('etcd')
        if etcd is not None:
            # BootstrapEtcd (internal/app/machined/pkg/system/services/etcd.go:682-717): the waiting etcd is stopped,
            # marked Finished "Bootstrap requested" (:691) and started again in bootstrap mode.
            etcd.event('Finished', 'Bootstrap requested')
            etcd.event('Preparing', 'Running pre state')
        self.bootstrap_requested = True
        self.fleet.changed()

    def reboot(self, mode, defer):
        """Talos' Reboot answers at once with a new actor id and runs the reboot sequence in the background
        (siderolabs/talos v1.13.9 v1alpha1_server.go:365-393); a reboot already under way holds the sequence lock, so
        a second one is not started ("sequence not started: locked", only logged: v1alpha1_controller.go:112-135)."""
        if not self.reboot_pending:
            self.reboot_pending = True
            defer(self._reboot, 'reboot')
        return self._actor_id()

    # System volumes a ResetPartitionSpec may name (the labels Talos' VolumeStatus resources carry on a VM's disk).
    SYSTEM_VOLUMES = ('EFI', 'BOOT', 'META', 'STATE', 'EPHEMERAL')

    def reset(self, graceful, reboot, partitions, user_disks, wipe_mode, defer):
        """Reset's checks in its order (siderolabs/talos v1.13.9 v1alpha1_server.go:654-750); the sequence runs after the reply.

        Plain Go errors reach the caller as UNKNOWN (grpc-go status.FromError). Nothing here refuses a reset of
        the last etcd member: that fails later, in the sequence's leave phase (see _reset).
        """
        if user_disks:
            if wipe_mode == 'SYSTEM_DISK':
                # :677-680
                raise RpcError('UNKNOWN', "reset failed: invalid input, wipe mode SYSTEM_DISK doesn't support "
                                          'UserDisksToWipe parameter')
            known = dict((disk['device_name'], disk) for disk in self.disks())
            for device in user_disks:
                # :694-706, in this order: unknown, read-only, the system disk
                if device not in known:
                    raise RpcError('UNKNOWN', "reset user disk failed: device %s wasn't found" % device)
                if known[device]['readonly']:
                    raise RpcError('UNKNOWN', 'reset user disk failed: device %s is readonly' % device)
                if known[device]['system_disk']:
                    raise RpcError('UNKNOWN', 'reset user disk failed: device %s is the system disk' % device)
        if partitions:
            if wipe_mode == 'USER_DISKS':
                # :710-712
                raise RpcError('UNKNOWN', "reset failed: invalid input, wipe mode USER_DISKS doesn't support "
                                          'SystemPartitionsToWipe parameter')
            for label, dummy_wipe in partitions:
                if label not in self.SYSTEM_VOLUMES:
                    # :714-718; the text after the colon is COSI's not-found error: guess
                    raise RpcError('UNKNOWN', 'failed to get volume status with label %r: resource '
                                              'VolumeStatuses.block.talos.dev(runtime/%s) doesn\'t exist' % (label, label))
        # Sequencer.Reset (runtime/v1alpha1/v1alpha1_sequencer.go:260-330): a whole-system-disk wipe unless
        # partitions are named or the mode is USER_DISKS; named partitions are wiped only when `wipe` is set.
        labels = set(label for label, wipe in partitions if wipe)
        wipe_disk = not partitions and wipe_mode != 'USER_DISKS'
        self.reboot_pending = True
        defer(lambda: self._reset(graceful, reboot, wipe_disk, labels), 'reset')
        return self._actor_id()

    async def _reset(self, graceful, reboot, wipe_disk, labels):
        """The reset sequence (v1alpha1_sequencer.go:260-330): drain and pod cleanup, then on a graceful reset of a
        control plane the leave phase (LeaveEtcd, v1alpha1_sequencer_tasks.go:901-954), then the services stop and the
        disk is wiped, then reboot or shutdown.

        The leave phase has no error handler: when etcd refuses to let the member go, the sequence stops there and
        the node keeps running (its pods were removed; the lab does not model pods: kubelet keeps running).
        """
        if graceful and self.control_plane:
            error = await self._leave_etcd(retry_seconds=self._scaled(300.0))
            if error is not None:
                self.reboot_pending = False
                self.last_sequence_error = 'reset failed: leave: failed to leave cluster: %s' % error
                LOG.info('talos node %s: %s', self.name, self.last_sequence_error)
                self.fleet.changed()
                return
        await self._go_down('resetting')
        if wipe_disk:
            # ResetSystemDisk: the whole system disk, META included, so Talos is no longer installed there
            self.disk.wipe(state=True, ephemeral=True)
            self.disk.installed = False
        else:
            self.disk.wipe(state='STATE' in labels, ephemeral='EPHEMERAL' in labels)
        await self.fleet.delay('talos_reset', self.name)
        if reboot:
            await self._boot(first_delay=None)
        else:
            self.phase = 'halted'
            self.fleet.changed()

    def _scaled(self, seconds):
        """Talos' own wait of `seconds` in the lab's real seconds (the time scale of the realistic profile, else 0)."""
        scale = getattr(self.fleet.timing, 'scale', 0.0) or 0.0
        return seconds * scale if getattr(self.fleet.timing, 'profile', 'instant') == 'realistic' else 0.0

    def _running_etcd_keys(self):
        return set(node.key for node in self.fleet.nodes.values()
                   if node.service('etcd') is not None and node.service('etcd').state == 'Running')

    async def _leave_etcd(self, retry_seconds):
        """Client.LeaveCluster (siderolabs/talos v1.13.9 internal/pkg/etcd/etcd.go:154-196): remove this node's own
        member, retrying `etcdserver: unhealthy cluster` (every 10 s for 5 minutes; other refusals at once, a member
        already gone is fine), then stop etcd and remove its data directory. None, or the error text.

        LeaveEtcd (v1alpha1_sequencer_tasks.go:901-937) does nothing when there is no etcd data or etcd is not
        Running, Stopping or Failed.
        """
        from lab.talos import etcd as etcd_model  # pylint: disable=import-outside-toplevel
        etcd = self.services.get('etcd')
        if not self.disk.etcd_data or etcd is None or etcd.state not in ('Running', 'Stopping', 'Failed'):
            return None
        cluster = self.own_etcd_cluster()
        member = cluster.member_for(self.key)
        if member is not None:
            def refusal():
                return cluster.removal_refusal(member.id, self._running_etcd_keys(), self.key)
            if refusal() == etcd_model.UNHEALTHY_CLUSTER:
                try:
                    await asyncio.wait_for(self.fleet.wait_for(lambda: refusal() != etcd_model.UNHEALTHY_CLUSTER),
                                           retry_seconds or 0.001)
                except asyncio.TimeoutError:
                    pass
            error = refusal()
            if error not in (None, etcd_model.MEMBER_NOT_FOUND):
                return 'failed to remove member %d: %s' % (member.id, error)
            cluster.remove_by_id(member.id)
        # etcd stopped (system.go:191: Finished "Service finished successfully"), data directory removed (:188-193)
        etcd.event('Finished', 'Service finished successfully')
        etcd.clear_health()
        self.disk.etcd_data = False
        self.disk.etcd_split = False
        self.fleet.changed()
        return None

    async def etcd_leave_cluster(self):
        """EtcdLeaveCluster (siderolabs/talos v1.13.9 v1alpha1_server.go:1895-1919): control planes only (:1897,
        "etcd leave"); an etcd client on the control-plane endpoints (:1901-1904); then Client.LeaveCluster, whose
        failure is "failed to leave cluster: ..." (:1910-1912), UNKNOWN. Its member id is the local etcd.Member
        resource (internal/pkg/etcd/local.go:19-34), which the node has once its etcd ran: until then the call waits
        (the lab: until the caller's deadline)."""
        self._check_control_plane('etcd leave')
        if self.fleet.etcd_endpoints_unknown(self):
            raise RpcError('UNKNOWN', 'failed to create etcd client: no controlplane endpoints discovered yet')
        await self.fleet.wait_for(lambda: self.phase != 'running' or (
            self.disk.etcd_data and self.services.get('etcd') is not None
            and self.services['etcd'].state in ('Running', 'Finished', 'Failed')))
        if self.phase != 'running':
            raise RpcError('UNAVAILABLE', 'the node is going down')
        # the caller's deadline bounds LeaveCluster's 5-minute retry
        error = await self._leave_etcd(retry_seconds=3600.0)
        if error is not None:
            raise RpcError('UNKNOWN', 'failed to leave cluster: %s' % error)

    async def etcd_remove_member_by_id(self, member_id):
        """EtcdRemoveMemberByID (siderolabs/talos v1.13.9 v1alpha1_server.go:1865-1892): control planes only (:1867,
        "etcd remove member"); an etcd client on the control-plane endpoints (:1871-1874), which waits for a member to
        answer (as EtcdMemberList); MemberRemove (internal/pkg/etcd/etcd.go:209-216: "failed to remove member %d: %w");
        etcd's "member not found" is NOT_FOUND with that text (:1879-1881), any other refusal UNKNOWN
        "failed to remove member: ..." (:1883). Whether etcd lets the member go: EtcdCluster.removal_refusal.

        A removed member whose node still runs etcd is not modelled further (etcd on that node would stop on its own).
        """
        self._check_control_plane('etcd remove member')
        if self.fleet.etcd_endpoints_unknown(self):
            raise RpcError('UNKNOWN', 'failed to create etcd client: no controlplane endpoints discovered yet')
        await self.fleet.wait_for(lambda: self._answering_etcd() is not None or self.phase != 'running')
        cluster = self._answering_etcd()
        if cluster is None:
            raise RpcError('UNAVAILABLE', 'the node is going down')
        from lab.talos import etcd as etcd_model  # pylint: disable=import-outside-toplevel
        local = self.key if cluster.member_for(self.key) is not None else None
        refusal = cluster.removal_refusal(member_id, self._running_etcd_keys(), local)
        inner = 'failed to remove member %d: %s' % (member_id, refusal)
        if refusal == etcd_model.MEMBER_NOT_FOUND:
            raise RpcError('NOT_FOUND', inner)
        if refusal is not None:
            raise RpcError('UNKNOWN', 'failed to remove member: %s' % inner)
        cluster.remove_by_id(member_id)
        self.fleet.changed()

    async def etcd_snapshot(self):
        """EtcdSnapshot (siderolabs/talos v1.13.9 v1alpha1_server.go:1955-1992): control planes only (:1957,
        "etcd snapshot"); the snapshot of the node's local etcd (:1964-1975, NewLocalClient: this node's member), sent
        in common.Data chunks of 1024 bytes (the stream chunker's default size, pkg/chunker/stream/stream.go:51).
        The local client waits for etcd to answer (WaitForReady, as EtcdMemberList): before this node's etcd runs the
        call waits until the caller's deadline. The content is the lab's own format (etcd.EtcdCluster.snapshot)."""
        self._check_control_plane('etcd snapshot')
        await self.fleet.wait_for(lambda: self.phase != 'running' or (
            self.services.get('etcd') is not None and self.services['etcd'].state == 'Running'))
        if self.phase != 'running':
            raise RpcError('UNAVAILABLE', 'the node is going down')
        data = self.own_etcd_cluster().snapshot(self.hostname)
        return [data[offset:offset + 1024] for offset in range(0, len(data), 1024)]

    def upgrade(self, image, preserve, stage, force, reboot_mode, defer):
        """Upgrade's checks (siderolabs/talos v1.13.9 v1alpha1_server.go:508-612), then its sequence after the reply."""
        if not self.disk.installed:
            # :523-525
            raise RpcError('FAILED_PRECONDITION', 'Talos is not installed')
        tag = versions.from_installer_image(image)
        if tag is None:
            # :529-536; the lab "pulls" any reference whose tag is a Talos version (vX.Y.Z[-pre]); the reason after the
            # colon is the lab's own (guess)
            raise RpcError('UNKNOWN', 'error validating installer image %s: the lab has no installer image for this '
                                      'reference (its tag must be a Talos version)' % _go_quote(image))
        if self.phase == 'running' and self.control_plane and not force and not preserve:
            # :539-558: the upgrade mutex (held only during these checks, never contended in the lab: a check is
            # synchronous here), then Client.ValidateForUpgrade
            problem = self._etcd_upgrade_problem()
            if problem is not None:
                raise RpcError('UNKNOWN', 'error validating etcd for upgrade: %s' % problem)
        if self.reboot_pending:
            # The sequence runs in a goroutine (:562-601); another sequence in progress makes it fail there, logged
            # only: the reply is still the acknowledgement.
            LOG.info('talos node %s: upgrade to %s not started, another sequence runs', self.name, image)
            return self._actor_id()
        self.reboot_pending = True
        defer(lambda: self._upgrade(tag, stage), 'upgrade')
        return self._actor_id()

    def _etcd_upgrade_problem(self):
        """Client.ValidateForUpgrade (internal/pkg/etcd/etcd.go:95-121): None, or its error text.

        Two members refuse; a member without a name is not started; a member whose etcd does not answer its
        quorum check is unhealthy (the lab: its node's etcd is not Running and healthy; the text after the colon,
        Go's context deadline error, is a guess)."""
        cluster = self._answering_etcd()
        if cluster is None:
            return 'context deadline exceeded'
        members = list(cluster.members)
        if len(members) == 2:
            return 'etcd member count(2) is insufficient to maintain quorum if upgrade commences'
        for member in members:
            if not member.hostname:
                return 'etcd member %016x is not started, all members must be running to perform an upgrade' % member.id
            node = self.fleet.nodes.get(member.node_key)
            etcd = node.service('etcd') if node is not None else None
            if etcd is None or not etcd.is_healthy:
                return ('etcd member %016x is not healthy; all members must be healthy to perform an upgrade: '
                        'context deadline exceeded' % member.id)
        return None

    async def _upgrade(self, tag, stage):
        """Sequencer.Upgrade (runtime/v1alpha1/v1alpha1_sequencer.go:425-470): drain, pods and the services on
        EPHEMERAL stop (kubelet, etcd), the installer runs, then reboot; apid answers until the reboot. Staged
        (StageUpgrade, :370-392): the node reboots first; the boot finds the staged image in META
        (v1alpha1_state.go:204-222) and runs the install sequence with it (v1alpha1_sequencer.go:160-185,
        v1alpha1_sequencer_tasks.go:1590-1620), which reboots again into the new version. Cordon and drain of the
        Kubernetes Node are not modelled by the Talos node."""
        if stage:
            await self._go_down('rebooting')
            await self.fleet.delay('talos_reboot', self.name)
            self.phase = 'upgrading'
            self.fleet.changed()
            await self.fleet.delay('talos_upgrade', self.name)
            self.disk.installed_version = tag
            await self.fleet.delay('talos_reboot', self.name)
            await self._boot(first_delay=None)
            return
        self.phase = 'upgrading'
        for service_id in ('kubelet', 'etcd'):
            service = self.services.get(service_id)
            if service is not None and service.state == 'Running':
                if service_id == 'kubelet':
                    self.fleet.notify('on_kubelet_stopped', self)
                service.event('Finished', 'Service finished successfully')
                service.clear_health()
        for task in [task for task in self._tasks if getattr(task, 'lab_name', '').endswith((':etcd', ':kubelet'))]:
            task.cancel()
        self.fleet.changed()
        await self.fleet.delay('talos_upgrade', self.name)
        self.disk.installed_version = tag
        await self._reboot()

    def shutdown(self, defer):
        self.reboot_pending = True
        defer(self._shutdown, 'shutdown')
        return self._actor_id()

    async def _shutdown(self):
        await self._go_down('halted')
        await self.fleet.delay('talos_shutdown', self.name)
        self.fleet.notify('on_node_shutdown', self)

    def _check_control_plane(self, api_name):
        """machinehelper.CheckControlplane (siderolabs/talos v1.13.9 internal/app/internal/machinehelper/machinehelper.go:23-38)."""
        if self.phase == 'maintenance' or self.disk.config is None:
            raise RpcError('UNIMPLEMENTED', 'machine type is not set, cannot use %s API' % api_name)
        if not self.control_plane:
            raise RpcError('UNIMPLEMENTED', '%s is only available on control plane nodes' % api_name)

    def _answering_etcd(self):
        """The etcd cluster an etcd client of this node reaches, or None while no member of it runs."""
        cluster = self.own_etcd_cluster()
        if not cluster.bootstrapped:
            return None
        for node in self.fleet.nodes.values():
            etcd = node.service('etcd')
            if etcd is not None and etcd.state == 'Running' and cluster.member_for(node.key) is not None:
                return cluster
        return None

    async def etcd_members(self):
        """EtcdMemberList (siderolabs/talos v1.13.9 v1alpha1_server.go:1817-1860).

        The handler checks the machine type (:1818), builds an etcd client on the control-plane endpoints
        (:1830; internal/pkg/etcd/etcd.go:81-91) and calls MemberList (:1842). With no endpoint known the
        client is not built: UNKNOWN "no controlplane endpoints discovered yet" (internal/pkg/etcd/endpoints.go:36-38;
        a plain Go error reaches the caller as UNKNOWN). Otherwise the etcd client (go.etcd.io/etcd/client/v3
        v3.6.12: every call WaitForReady, client/v3/options.go defaultCallOpts; no blocking dial) waits until a
        member answers: before any etcd runs the call blocks until the caller's deadline, which grpclib's server
        turns into DEADLINE_EXCEEDED; with no deadline it blocks as long as the caller waits.
        """
        self._check_control_plane('member list')
        if self.fleet.etcd_endpoints_unknown(self):
            raise RpcError('UNKNOWN', 'no controlplane endpoints discovered yet')
        await self.fleet.wait_for(lambda: self._answering_etcd() is not None or self.phase != 'running')
        cluster = self._answering_etcd()
        if cluster is None:
            raise RpcError('UNAVAILABLE', 'the node is going down')
        return cluster.members

    def etcd_status(self):
        etcd = self.services.get('etcd')
        if not self.control_plane:
            raise RpcError('UNIMPLEMENTED', 'etcd status is only available on control plane nodes')
        if etcd is None or not etcd.is_healthy:
            raise RpcError('UNAVAILABLE', 'etcd is not running on this node')
        cluster = self.own_etcd_cluster()
        member = cluster.member_for(self.key)
        cluster.tick()
        return {'member_id': member.id, 'leader': cluster.leader or 0, 'raft_index': cluster.raft_index,
                'raft_term': cluster.raft_term, 'raft_applied_index': cluster.raft_index,
                'db_size': cluster.db_size(), 'db_size_in_use': 16384 + 2048 * cluster.raft_index,
                'protocol_version': '3.6.0', 'storage_version': '3.6.0'}

    def kubeconfig_archive(self):
        """The gzip tar Talos streams: one `kubeconfig` file, mode 0600, no end-of-archive blocks.

        siderolabs/talos v1.13.9 v1alpha1_server.go:1260-1301: after the control-plane check (:1261) the admin
        kubeconfig is generated from the machine config alone, bootstrapped or not (pkg/kubeconfig/generate.go:35-57):
        certificate-authority-data holds cluster.acceptedCAs first, then the issuing CA (generate.go:36-40, 101).
        """
        self._check_control_plane('kubeconfig')
        config = self.disk.config
        k8s_crt, k8s_key = config.k8s_ca
        if not k8s_crt or not k8s_key:
            raise RpcError('FAILED_PRECONDITION', 'the machine config has no Kubernetes CA (cluster.ca)')
        client_crt, client_key = pki.kube_admin_certificate(pki.load_certificate(k8s_crt), pki.load_private_key(k8s_key))
        name = config.cluster_name
        user = 'admin@%s' % name
        document = {
            'apiVersion': 'v1',
            'kind': 'Config',
            'clusters': [{'name': name, 'cluster': {
                'server': config.endpoint,
                'certificate-authority-data': base64.b64encode(b''.join(config.k8s_accepted_cas + [k8s_crt])).decode('ascii')}}],
            'users': [{'name': user, 'user': {
                'client-certificate-data': base64.b64encode(client_crt).decode('ascii'),
                'client-key-data': base64.b64encode(client_key).decode('ascii')}}],
            'contexts': [{'name': user, 'context': {'cluster': name, 'namespace': 'default', 'user': user}}],
            'current-context': user,
        }
        content = yaml.safe_dump(document, default_flow_style=False, sort_keys=False).encode('utf-8')
        raw = io.BytesIO()
        tar = tarfile.open(fileobj=raw, mode='w', format=tarfile.PAX_FORMAT)
        info = tarfile.TarInfo('kubeconfig')
        info.size = len(content)
        info.mode = 0o600
        info.mtime = int(time.time())
        tar.addfile(info, io.BytesIO(content))
        # Talos does not close its tar writer: no end-of-archive blocks (tar.close() would add them).
        import gzip  # pylint: disable=import-outside-toplevel
        return gzip.compress(raw.getvalue())

    def _actor_id(self):
        return '%s-%d' % (re.sub(r'[^a-z0-9]', '', str(self.key).lower()) or 'node', int(time.time() * 1000))

    # ------------------------------------------------------------------ faults

    async def clear_kubelet_volume(self):
        self.kubelet_volume_stuck = False
        self.fleet.changed()

    def status(self):
        """The node's section of `lab status`."""
        services = dict((service_id, service.summary()) for service_id, service in sorted(self.services.items()))
        member = None
        if self.cluster_id:
            found = self.own_etcd_cluster().member_for(self.key)
            member = found.as_dict() if found is not None else None
            if member is not None and self.disk.etcd_split:
                member['split'] = True
        return {
            'name': self.name, 'address': self.address, 'mode': self.mode, 'phase': self.phase,
            'version': self.running_version if self.powered else None, 'machine_type': self.machine_type,
            'hostname': self.hostname if self.powered else None,
            'installed': self.disk.installed, 'staged_config': self.disk.staged is not None,
            'try_revert_pending': self.try_revert is not None,
            'running_config_persisted': self.disk.persisted is None,
            'services': services, 'etcd_member': member, 'boot_count': self.boot_count,
            'talos_version': self.disk.installed_version, 'last_sequence_error': self.last_sequence_error,
            'fingerprint': self.identity.fingerprint if self.identity is not None and self.phase == 'maintenance' else None,
        }


def _go_quote(text):
    """Go's %q of a plain printable string."""
    return '"%s"' % text.replace('\\', '\\\\').replace('"', '\\"')


def _duration_text(seconds):
    """A duration as Go's time.Duration.String() writes it: 1m0s, 30s, 1.5s, 500ms, 1h0m0s."""
    nanos = int(round(float(seconds) * 1e9))
    if nanos == 0:
        return '0s'
    if nanos < 1000000000:
        for unit, size in (('ms', 1000000), ('\u00b5s', 1000), ('ns', 1)):
            if nanos >= size:
                return '%s%s' % (_trim(nanos / float(size)), unit)
    hours, rest = divmod(nanos, 3600 * 1000000000)
    minutes, rest = divmod(rest, 60 * 1000000000)
    text = '%ss' % _trim(rest / 1e9)
    if hours or minutes:
        text = '%dm%s' % (minutes, text)
    if hours:
        text = '%dh%s' % (hours, text)
    return text


def _trim(number):
    return ('%.9f' % number).rstrip('0').rstrip('.')
