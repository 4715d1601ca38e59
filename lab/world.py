"""The World: one asyncio loop holding the whole lab.

It runs fakepve (lab/pve.py) on `<net>.2:8006`, turns VM power changes into events for the
other simulations, hands out addresses, keeps the fault registry, the delay record and the
request log, serves the control socket and writes the run dir's files.

Other simulations (lab/talos, lab/k8s_upstream, lab/flux_upstream, ...) plug in through `install(world)` in their package, which
the World calls at start (a plain function or a coroutine). There they use:

    world.add_listener(obj)              VM power events, per VM in order (see VmListener)
    world.add_status_section(name, fn)   fn() -> JSON-able data for `lab status` (may be async)
    world.faults.register(...)           their faults (lab/faults.py)
    world.timing.register(kind, secs)    their delay kinds; await world.timing.sleep(kind, target)
    world.log_request(source, method, path, status, **extra)
    world.add_endpoint(name, host, port) a listener `lab status` shows (remove_endpoint when it goes)
    world.add_inventory_vars(values)     vars of the cluster group in the hosts.yml the lab writes
    world.add_shutdown_hook(fn)          called (awaited) when the lab stops
    world.net, world.run_dir, world.vm_address(vm), world.pve (the LabPve), world.vms()
"""

import asyncio
import collections
import dataclasses
import datetime
import errno
import fcntl
import functools
import importlib
import inspect
import json
import logging
import os
import secrets
import signal
import uuid

from lab import DEFAULT_RUN_DIR, REPO_INVENTORY
from lab import inventory
from lab.addresses import Net
from lab.control import ControlError, ControlServer
from lab.faults import FaultError, FaultRegistry
from lab.pve import (PVE_PORT, PVE_RELEASES, PVE_USER, TOKEN_ID, GuestNetwork, LabPve, PowerEvents, PveFaults,
                     write_file, write_tls)
from lab.timing import PROFILES, Timing

LOG = logging.getLogger('lab')

# The retiring world: the hand-written lab/k8s with the Flux simulation (`--kubernetes lab --flux lab`).
EXTENSIONS = ('lab.talos', 'lab.k8s', 'lab.flux')
# Which Kubernetes a lab runs: the upstream control plane of lab/k8s_upstream (the default; docs/lab-kubernetes.md) or
# the hand-written lab/k8s, which is being retired (the Flux simulation needs it). `python -m lab up --kubernetes NAME`,
# else this variable.
KUBERNETES_ENV = 'PROXTALOS_LAB_KUBERNETES'
KUBERNETES_WORLDS = {'lab': 'lab.k8s', 'upstream': 'lab.k8s_upstream'}
# Upstream Kubernetes without Flux's controllers (`--flux lab`): lab.flux_sources gives the lab's Git server with the
# GitOps repository (the working copy the preflight reads and the flux stage pushes from) and the artifact mirror, no Flux
UPSTREAM_EXTENSIONS = ('lab.talos', 'lab.k8s_upstream', 'lab.flux_sources')
# Which Flux a lab runs: Flux's upstream controllers ('upstream', the default on upstream Kubernetes; lab.flux_upstream:
# source-, kustomize- and helm-controller as processes against the lab's kube-apiserver, the same Git server and mirror;
# docs/lab-flux.md) or 'lab' (the default on lab/k8s: there the Flux simulation; on upstream Kubernetes no Flux, the Git
# server and mirror only). `python -m lab up --flux NAME`, else this variable. Upstream Flux needs upstream Kubernetes.
FLUX_ENV = 'PROXTALOS_LAB_FLUX'
FLUX_WORLDS = ('lab', 'upstream')
UPSTREAM_FLUX_EXTENSIONS = ('lab.talos', 'lab.k8s_upstream', 'lab.flux_upstream')


def kubernetes_world(name=None, environ=None):
    """The Kubernetes a lab runs: name (from --kubernetes), else $PROXTALOS_LAB_KUBERNETES, else 'upstream'.

    ValueError naming where a wrong value came from."""
    return _chosen_world(name, '--kubernetes', KUBERNETES_ENV, KUBERNETES_WORLDS, environ, 'upstream')[0]


def _chosen_world(name, option, variable, choices, environ, default):
    """(name, where): name (from the command-line option), else the environment variable, else default; where names
    the source. ValueError naming that source when the name is not one of choices."""
    where = option
    if name is None:
        name = (os.environ if environ is None else environ).get(variable) or default
        where = variable
    if name not in choices:
        raise ValueError('%s must be one of %s, got %r' % (where, ', '.join(choices), name))
    return name, where


def flux_world(name=None, kubernetes=None, environ=None):
    """The Flux a lab on `kubernetes` runs (None: the one kubernetes_world chooses from the same environ): name (from
    --flux), else $PROXTALOS_LAB_FLUX, else 'upstream' on upstream Kubernetes and 'lab' on lab/k8s. ValueError naming
    where a wrong value came from, or when upstream Flux is asked for without upstream Kubernetes."""
    if kubernetes is None:
        kubernetes = kubernetes_world(environ=environ)
    name, where = _chosen_world(name, '--flux', FLUX_ENV, FLUX_WORLDS, environ,
                                'upstream' if kubernetes == 'upstream' else 'lab')
    if name == 'upstream' and kubernetes != 'upstream':
        raise ValueError('%s upstream needs upstream Kubernetes (--kubernetes upstream or %s=upstream): the Flux '
                         'controllers run against kube-apiserver' % (where, KUBERNETES_ENV))
    return name


def extensions_for(kubernetes, extensions=None, flux='lab'):
    """The extensions of a lab running `kubernetes` ('lab' or 'upstream') and `flux` ('lab' or 'upstream'; as
    flux_world chose it): the default set for them, or the given ones with its Kubernetes extension in place of the
    other's."""
    if extensions is None:
        if kubernetes == 'lab':
            return EXTENSIONS
        return UPSTREAM_FLUX_EXTENSIONS if flux == 'upstream' else UPSTREAM_EXTENSIONS
    other = {v for k, v in KUBERNETES_WORLDS.items() if k != kubernetes}
    return tuple(KUBERNETES_WORLDS[kubernetes] if name in other else name for name in extensions)


MAX_EVENTS = 10000
MAX_REQUESTS_KEPT = 20000


class LabError(Exception):
    """The lab cannot do what was asked (start in a busy run dir, bind a used address, ...)."""


@dataclasses.dataclass
class LabOptions(object):
    """What `python -m lab up` takes."""

    net: str = '127.0.10'
    run_dir: str = DEFAULT_RUN_DIR
    control_planes: int = 3
    workers: int = 3
    profile: str = 'realistic'
    time_scale: float = 0.0
    pve_nodes: tuple = ('pve1',)
    pve_port: int = PVE_PORT
    pve_major: int = 9   # the PVE release the lab's PVE answers as: 9 or 8 (lab.pve.PVE_RELEASES)
    seed: int = None
    extensions: tuple = UPSTREAM_FLUX_EXTENSIONS  # the default world; EXTENSIONS for the retiring lab/k8s one
    owner_pid: int = None  # stop when this process ends (a test session that started the lab)
    repo_inventory: bool = None  # None: write inventories/lab/hosts.yml when run_dir is the default

    def validate(self):
        """Raise ValueError naming the first option that is wrong."""
        try:
            Net(self.net)
        except ValueError as exc:
            raise ValueError('--net: %s' % exc) from None
        if self.profile not in PROFILES:
            raise ValueError('--profile must be one of %s, got %r' % (', '.join(PROFILES), self.profile))
        if not isinstance(self.time_scale, (int, float)) or self.time_scale < 0:
            raise ValueError('--time-scale must be a number, 0 or more, got %r' % (self.time_scale,))
        for name in ('control_planes', 'workers'):
            if not isinstance(getattr(self, name), int):
                raise ValueError('--%s must be a whole number, got %r' % (name.replace('_', '-'), getattr(self, name)))
        try:
            inventory.plan_nodes(Net(self.net), self.control_planes, self.workers, list(self.pve_nodes))
        except ValueError as exc:
            raise ValueError('--%s' % str(exc).replace('_', '-', 1)) from None
        for node in self.pve_nodes:
            if not node or not all(c.isalnum() or c == '-' for c in node):
                raise ValueError('--pve-nodes: %r is not a valid node name (letters, digits, -)' % (node,))
        if self.owner_pid is not None and (not isinstance(self.owner_pid, int) or self.owner_pid < 1):
            raise ValueError('--owner-pid must be a process id, got %r' % (self.owner_pid,))
        if len(set(self.pve_nodes)) != len(self.pve_nodes):
            raise ValueError('--pve-nodes: names must be unique, got %s' % ', '.join(self.pve_nodes))
        if self.pve_major not in PVE_RELEASES:
            majors = ', '.join(str(major) for major in sorted(PVE_RELEASES))
            raise ValueError('--pve-major must be one of %s, got %r' % (majors, self.pve_major))

    @property
    def writes_repo_inventory(self):
        if self.repo_inventory is not None:
            return self.repo_inventory
        return os.path.realpath(self.run_dir) == os.path.realpath(DEFAULT_RUN_DIR)


class RunPaths(object):
    """The files of a run dir."""

    def __init__(self, run_dir):
        self.run_dir = os.path.abspath(run_dir)
        join = functools.partial(os.path.join, self.run_dir)
        self.state = join('state.json')
        self.lock = join('lab.lock')
        self.control = join('control.sock')
        self.log = join('lab.log')
        self.requests = join('requests.log')
        self.hosts = join('hosts.yml')
        self.token = join('pve-token')
        self.password = join('pve-password')


class RequestLog(object):
    """Every request the lab received: appended as JSON lines to requests.log and kept for queries."""

    def __init__(self, path, clock):
        self.path = path
        self.clock = clock
        self.entries = collections.deque(maxlen=MAX_REQUESTS_KEPT)
        self.seq = 0
        self._file = None
        self._sources = []   # functions that add the requests another process logged (kube-apiserver's audit log)

    def open(self):
        self._file = open(self.path, 'a', encoding='utf-8', buffering=1)  # pylint: disable=consider-using-with

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None

    def add(self, source, method, path, status, **extra):
        self.seq += 1
        entry = {'seq': self.seq, 'time': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='milliseconds'),
                 'lab_time': round(self.clock(), 6), 'source': source, 'method': method, 'path': path, 'status': status}
        entry.update(extra)
        self.entries.append(entry)
        if self._file is not None:
            self._file.write(json.dumps(entry, default=str) + '\n')
        return entry

    def add_source(self, drain):
        """drain() adds, with add(), the requests a process outside the lab received and logged since its last call; every
        query calls it first, so that a query sees every request completed before it."""
        self._sources.append(drain)

    def drain(self):
        for drain in self._sources:
            drain()

    def query(self, since=0, source=None, limit=1000):
        self.drain()
        found = [dict(e) for e in self.entries if e['seq'] > since and (source is None or e['source'] == source)]
        return found[-limit:] if limit else found


class VmListener(object):
    """What a listener may implement (every method is optional; all are coroutines).

    Hooks for one VM are called in order, one after the other; hooks of different VMs may run
    at the same time. A hook that waits only delays that VM's later events.
    """

    async def on_vm_started(self, vm, address):
        """The VM was powered on (start, or the start half of a reboot); address may be None."""

    async def on_vm_stopped(self, vm):
        """The VM lost power (stop, shutdown, the stop half of a reboot)."""

    async def on_vm_reset(self, vm, address):
        """The VM was hard reset while running (PVE status/reset): a power cut and a boot at once."""

    async def on_vm_deleted(self, vm):
        """The VM was destroyed (its disks are gone)."""

    async def on_lab_reset(self):
        """`lab reset` removed every VM and cleared every fault."""

    async def on_lab_stop(self):
        """The lab is stopping."""


async def _maybe_await(value):
    if inspect.isawaitable(value):
        value = await value
    return value


class World(object):
    """The lab process's state: see the module docstring."""

    def __init__(self, options):
        options.validate()
        self.options = options
        self.net = Net(options.net)
        self.paths = RunPaths(options.run_dir)
        self.run_dir = self.paths.run_dir
        self.timing = Timing(options.profile, options.time_scale, options.seed)
        self.faults = FaultRegistry(clock=self.timing.now)
        self.requests = RequestLog(self.paths.requests, self.timing.now)
        self.pve = None
        self.network = None
        self.token_secret = None
        self.ca_path = None
        self.loop = None
        self.extensions = []
        self.started = None
        self.events = collections.deque(maxlen=MAX_EVENTS)
        self._event_seq = 0
        self._listeners = []
        self._status_sections = {}
        self._endpoints = {}
        self._shutdown_hooks = []
        self._deliveries = {}
        self._lock_fd = None
        self._control = None
        self._stop_requested = None
        self._inventory_extra = {}

    # ----------------------------------------------------------- for extensions

    def add_inventory_vars(self, values):
        """Vars (name -> value) an extension adds to the cluster group of the hosts.yml the lab writes (written after
        every extension is installed)."""
        self._inventory_extra.update(values)

    def add_listener(self, listener):
        """Register an object with VmListener's hooks (any subset)."""
        self._listeners.append(listener)

    def remove_listener(self, listener):
        self._listeners.remove(listener)

    def add_status_section(self, name, provider):
        """`lab status` shows provider()'s result (JSON-able; may be a coroutine) under `name`."""
        if name in ('lab', 'pve') or name in self._status_sections:
            raise ValueError('status section %r exists already' % name)
        self._status_sections[name] = provider

    def add_endpoint(self, name, host, port, kind='tcp'):
        """A listener of the lab (shown by status; those present at start are checked by `up --detach`)."""
        self._endpoints[name] = {'name': name, 'host': host, 'port': port, 'kind': kind}

    def remove_endpoint(self, name):
        self._endpoints.pop(name, None)

    def add_shutdown_hook(self, hook):
        """hook() (may be a coroutine) runs when the lab stops, before fakepve stops; last added runs first."""
        self._shutdown_hooks.append(hook)

    def log_request(self, source, method, path, status, **extra):
        """Add a request to the request log (source: pve, talos, k8s, ...)."""
        return self.requests.add(source, method, path, status, **extra)

    def vms(self):
        """The VMs fakepve holds now (LabVm objects)."""
        return list(self.pve.vms)

    def vm_address(self, vm):
        """The VM's address now: the one it booted with while it runs, else what it would get (or None)."""
        current = self.network.current.get(vm)
        if current is not None:
            return current['address']
        return self.network.plan(vm)['address']

    # ---------------------------------------------------------------- lifecycle

    async def start(self):
        """Start everything and write state.json last; raises LabError when the lab cannot start."""
        self.loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        os.makedirs(self.run_dir, exist_ok=True)
        self._take_lock()
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self):
        for path in (self.paths.state, self.paths.control):
            if os.path.exists(path):
                os.unlink(path)
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.requests.open()
        self.ca_path, cert_path, key_path = write_tls(self.run_dir, self.net.pve_host)
        self.token_secret = str(uuid.uuid4())
        password = secrets.token_urlsafe(24)
        write_file(self.paths.token, self.token_secret + '\n', 0o600)
        write_file(self.paths.password, password + '\n', 0o600)
        power = PowerEvents(self._power_event, self.loop)
        self.pve = LabPve(self.net.pve_host, list(self.options.pve_nodes), self.net, self.timing, power,
                          on_request=self.log_request, port=self.options.pve_port, password=password,
                          token_secret=self.token_secret, major=self.options.pve_major)
        self.network = GuestNetwork(self.net, self.pve, self.timing)
        try:
            await self.pve.start(cert_path, key_path)
        except OSError as exc:
            self.pve = None
            raise LabError('cannot listen on %s:%d for the PVE API: %s%s' % (
                self.net.pve_host, self.options.pve_port, exc.strerror or exc,
                ' (another lab on net %s?)' % self.net if exc.errno == errno.EADDRINUSE else '')) from None
        self.add_endpoint('pve', self.net.pve_host, self.pve.port, 'https')
        PveFaults(self.pve, self.faults, self.loop, network=self.network).register()
        for name in self.options.extensions:
            await self._install(name)
        self._control = ControlServer(self.paths.control, self.control, errors=(ValueError, KeyError, FaultError, LabError))
        await self._control.start()
        text = inventory.render(self.net, self.run_dir, self.options.control_planes, self.options.workers,
                                list(self.options.pve_nodes), extra_vars=self._inventory_vars())
        inventory.write(self.paths.hosts, text)
        if self.options.writes_repo_inventory:
            inventory.write(REPO_INVENTORY, text)
        write_file(self.paths.state, json.dumps(self.state(), indent=2) + '\n', 0o644)
        LOG.info('lab up: net %s, PVE %s, pid %d', self.net, self.pve.url, os.getpid())

    def _inventory_vars(self):
        """Vars of the cluster group that depend on the lab's Kubernetes. On upstream Kubernetes the cni stage uses the
        upstream Cilium chart (`make setup` fetches it: lab.upstream.chart): Helm mode installs it, and inline mode reads
        its `helm template` output from <run dir>/cilium-manifest.yaml, which the cni role's render_manifest entry point
        writes (docs/lab-kubernetes.md). The lab/k8s world keeps the stand-in chart of inventories/lab/files."""
        if 'lab.k8s_upstream' not in self.options.extensions:
            return dict(self._inventory_extra)
        from lab import upstream  # pylint: disable=import-outside-toplevel
        try:
            chart = upstream.chart('cilium-chart')
        except upstream.UpstreamError as exc:
            raise LabError('--kubernetes upstream: %s' % exc) from None
        # inventories/lab/group_vars/all/cni.yml takes these over its stand-in files
        return dict({'lab_cilium_chart': chart, 'lab_cilium_manifest': os.path.join(self.run_dir, 'cilium-manifest.yaml')},
                    **self._inventory_extra)

    async def _install(self, name):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                LOG.info('simulation %s is not there; skipped', name)
                return
            raise
        install = getattr(module, 'install', None)
        if install is None:
            LOG.info('simulation %s has no install(world) yet; skipped', name)
            return
        await _maybe_await(install(self))
        self.extensions.append(name)
        LOG.info('simulation %s installed', name)

    def _take_lock(self):
        fd = os.open(self.paths.lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors='replace').strip() or 'unknown'
            os.close(fd)
            raise LabError('another lab (pid %s) is running in %s; stop it with `python -m lab down --run-dir %s`'
                           % (holder, self.run_dir, self.run_dir)) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def state(self):
        """What state.json holds: how to reach this lab."""
        pve_url = 'https://%s:%d' % (self.net.pve_host, self.options.pve_port)
        return {
            'pid': os.getpid(), 'net': str(self.net), 'run_dir': self.run_dir, 'started': self.started.isoformat(),
            'profile': self.timing.profile, 'time_scale': self.timing.scale, 'seed': self.timing.seed,
            'control_planes': self.options.control_planes, 'workers': self.options.workers,
            'pve_nodes': list(self.options.pve_nodes), 'pve_major': self.options.pve_major,
            'pve': {'host': self.net.pve_host, 'port': self.options.pve_port, 'url': pve_url, 'user': PVE_USER,
                    'token_id': TOKEN_ID, 'token_file': self.paths.token, 'password_file': self.paths.password,
                    'ca': self.ca_path},
            'cluster_endpoint': self.net.endpoint_host,
            'endpoints': list(self._endpoints.values()),
            'extensions': list(self.extensions),
            'control_socket': self.paths.control, 'log': self.paths.log, 'requests_log': self.paths.requests,
            'inventory': self.paths.hosts,
            'repo_inventory': REPO_INVENTORY if self.options.writes_repo_inventory else None,
        }

    def request_stop(self):
        if self._stop_requested is not None:
            self._stop_requested.set()

    async def run(self, handle_signals=True, on_ready=None):
        """Start, call on_ready(), serve until request_stop() (control op shutdown, SIGTERM, SIGINT), then stop."""
        await self.start()
        if on_ready is not None:
            on_ready()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.loop.add_signal_handler(sig, self.request_stop)
        owner = self._watch_owner()
        try:
            await self._stop_requested.wait()
        finally:
            if owner is not None:
                self.loop.remove_reader(owner)
                os.close(owner)
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self.loop.remove_signal_handler(sig)
            await self.stop()

    def _watch_owner(self):
        """Stop when options.owner_pid ends: a pidfd becomes readable when its process exits."""
        pid = self.options.owner_pid
        if not pid:
            return None
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            LOG.warning('owner process %d is gone already; stopping', pid)
            self.request_stop()
            return None

        def owner_gone():
            LOG.warning('owner process %d ended; stopping', pid)
            self.request_stop()
        self.loop.add_reader(fd, owner_gone)
        return fd

    async def stop(self):
        """Stop everything this lab started and remove state.json and the control socket."""
        if os.path.exists(self.paths.state):
            os.unlink(self.paths.state)
        if self._control is not None:
            await self._control.close()
            self._control = None
        await self.drain_events()
        for listener in list(self._listeners):
            await self._call_hook(listener, 'on_lab_stop')
        for hook in reversed(self._shutdown_hooks):
            try:
                await _maybe_await(hook())
            except Exception:  # pylint: disable=broad-except
                LOG.exception('shutdown hook %r failed', hook)
        self._shutdown_hooks = []
        if self.network is not None:
            self.network.clear()
        await self.drain_events()
        if self.pve is not None:
            await self.pve.stop()
            self.pve = None
        self.requests.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        LOG.info('lab stopped')

    # ----------------------------------------------------------------- events

    def _power_event(self, kind, vm):
        """From PowerEvents, on the loop, inside fakepve's request handling: never blocks."""
        address = None
        if kind in ('started', 'reset'):
            address = self.network.power_on(vm)
        elif kind == 'stopped':
            self.network.power_off(vm)
        elif kind == 'deleted':
            self.network.forget(vm)
        self._event_seq += 1
        self.events.append({'seq': self._event_seq, 'lab_time': round(self.timing.now(), 6), 'event': kind,
                            'vmid': vm.vmid, 'name': vm.name, 'node': vm.node, 'address': address})
        LOG.info('VM %s (%s) %s%s', vm.vmid, vm.name, kind, ' at %s' % address if address else '')
        previous = self._deliveries.get(vm.vmid)
        task = self.loop.create_task(self._deliver(previous, kind, vm, address))
        self._deliveries[vm.vmid] = task
        task.add_done_callback(lambda done, key=vm.vmid: self._delivered(key, done))

    def _delivered(self, key, task):
        if self._deliveries.get(key) is task:
            del self._deliveries[key]

    async def _deliver(self, previous, kind, vm, address):
        if previous is not None:
            await asyncio.wait([previous])
        args = (vm, address) if kind in ('started', 'reset') else (vm,)
        for listener in list(self._listeners):
            await self._call_hook(listener, 'on_vm_' + kind, *args)

    @staticmethod
    async def _call_hook(listener, name, *args):
        hook = getattr(listener, name, None)
        if hook is None:
            return
        try:
            await _maybe_await(hook(*args))
        except Exception:  # pylint: disable=broad-except
            LOG.exception('listener %r failed in %s', listener, name)

    async def drain_events(self):
        """Wait until every listener has seen every event so far."""
        while self._deliveries:
            await asyncio.wait(list(self._deliveries.values()))

    # ------------------------------------------------------------------ reset

    async def reset(self, storage=True):
        """A clean world: every fault cleared, every VM powered off and deleted, leases forgotten,
        storages emptied (unless storage=False), PVE's task list emptied, PVE's users and ACLs as at start. Listeners see the events."""
        cleared = await self.faults.clear()
        removed = []
        for vm in list(self.pve.vms):
            if vm.lock_holder is not None:
                self.pve.release(vm, vm.lock_holder)
            vm.status = vm.qmpstatus = 'stopped'
            self.pve.vms.remove(vm)
            removed.append(vm.vmid)
        if storage:
            self.pve.reset_storages()
        self.pve.tasks = {}
        self.pve.tasklog = []
        self.pve.reset_access()     # ACL entries an admin added through PUT /access/acl go
        self.network.clear()
        await self.drain_events()
        for listener in list(self._listeners):
            await self._call_hook(listener, 'on_lab_reset')
        LOG.info('lab reset: %d VMs removed, %d faults cleared', len(removed), len(cleared))
        return {'vms_removed': removed, 'faults_cleared': cleared, 'storage_emptied': bool(storage)}

    # ----------------------------------------------------------------- status

    def vm_rows(self):
        rows = []
        for vm in sorted(self.pve.vms, key=lambda v: v.vmid):
            current = self.network.current.get(vm)
            plan = current if current is not None else self.network.plan(vm)
            rows.append({'vmid': vm.vmid, 'name': vm.name, 'node': vm.node, 'status': vm.status, 'lock': vm.lock,
                         'address': plan['address'], 'address_source': plan['source'], 'mac': plan['mac'],
                         'agent': self.network.agent_state(vm)})
        return rows

    async def status(self):
        uptime = (datetime.datetime.now(datetime.timezone.utc) - self.started).total_seconds()
        out = {
            'lab': {'pid': os.getpid(), 'net': str(self.net), 'run_dir': self.run_dir, 'uptime': round(uptime, 1),
                    'profile': self.timing.profile, 'time_scale': self.timing.scale, 'seed': self.timing.seed,
                    'endpoints': list(self._endpoints.values()), 'extensions': list(self.extensions),
                    'faults': [dict(a) for a in self.faults.active.values()]},
            'pve': {'url': self.pve.url, 'token_id': TOKEN_ID, 'ca': self.ca_path,
                    'nodes': [{'name': n, 'online': s.get('online', True)} for n, s in sorted(self.pve.nodes.items())],
                    'storages': [{'name': n, 'type': s.get('type'), 'content': s.get('content')}
                                 for n, s in sorted(self.pve.storages.items())],
                    'vms': self.vm_rows()},
        }
        for name, provider in self._status_sections.items():
            try:
                out[name] = await _maybe_await(provider())
            except Exception as exc:  # pylint: disable=broad-except
                LOG.exception('status section %s failed', name)
                out[name] = {'error': '%s: %s' % (exc.__class__.__name__, exc)}
        return out

    # ---------------------------------------------------------------- control

    async def control(self, request):
        """One control request (a dict with 'op') -> its result. Raises ValueError/FaultError for bad requests."""
        op = request.get('op')
        handler = getattr(self, '_op_' + str(op), None)
        if handler is None:
            raise ControlError('unknown op %r; ops: %s' % (op, ', '.join(sorted(
                n[4:] for n in dir(self) if n.startswith('_op_')))))
        return await _maybe_await(handler(request))

    def _op_ping(self, request):
        return {'pid': os.getpid(), 'net': str(self.net)}

    async def _op_status(self, request):
        return await self.status()

    def _op_faults(self, request):
        return self.faults.describe()

    async def _op_fault(self, request):
        if not request.get('name'):
            raise FaultError('op fault needs "name"')
        params = request.get('params') or {}
        if not isinstance(params, dict):
            raise FaultError('op fault: "params" must be an object of name: value')
        return await self.faults.apply(request['name'], request.get('target'), params)

    async def _op_clear(self, request):
        return await self.faults.clear(request.get('name'), request.get('target'))

    def _op_delays(self, request):
        return self.timing.query(int(request.get('since') or 0), request.get('kind'), request.get('target'))

    def _op_timing(self, request):
        return {'profile': self.timing.profile, 'time_scale': self.timing.scale, 'kinds': self.timing.describe()}

    def _op_requests(self, request):
        return self.requests.query(int(request.get('since') or 0), request.get('source'), int(request.get('limit') or 0))

    def _op_events(self, request):
        since = int(request.get('since') or 0)
        return [dict(e) for e in self.events if e['seq'] > since]

    async def _op_reset(self, request):
        return await self.reset(storage=request.get('storage', True) is not False)

    def _op_shutdown(self, request):
        # Answer first; the stop begins once the answer is on its way.
        self.loop.call_soon(self.request_stop)
        return {'stopping': True, 'pid': os.getpid()}
