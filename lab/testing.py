"""Fixtures for tests against the lab (tests/lab/conftest.py and tests/integration/conftest.py import them).

Fixtures:
    lab          one lab for the session (3 control planes, 3 workers, time scale 0), started with
                 `python -m lab up --detach` on a net and run dir of its own, stopped at the end; its world is
                 python -m lab up's default (upstream Kubernetes and Flux) unless $PROXTALOS_LAB_KUBERNETES and
                 $PROXTALOS_LAB_FLUX say otherwise, and `extra_args` of start_lab can name one
    clean_lab    the session lab, reset (VMs deleted, faults cleared, storages emptied) before the test
    lab_factory  start further labs in a test: lab_factory(workers=1, time_scale=0.02, ...); stopped after it

A Lab handle has .net, .run_dir, .inventory (its hosts.yml), .inventory_dir (a folder with that
hosts.yml and links group_vars and files to inventories/lab/, for `ansible-playbook -i`),
.pve_host/.pve_port/.pve_url/.ca_path/.token_id/.token_secret, and .status(), .fault(name,
target, **params), .clear(name, target), .reset(), .control(op, **kw), .delays(), .requests(),
.events(), .proxmox() (a proxmoxer client with the token and TLS verification on),
.wait_until(probe, timeout).

world_in_thread(run_dir, net, **options) runs a World in this process on a thread of its own, for
tests that register listeners or drive the World's Python API directly.
"""

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from ansible_collections.proxtalos.cluster.tests import helpers

from lab import ROOT
from lab.control import call
from lab.pve import PVE_PORT, PVE_USER, ROOT_USER, TOKEN_ID, TOKEN_NAME
from lab.world import LabOptions, RunPaths, World

START_ATTEMPTS = 5
COMMAND_TIMEOUT = 120
# A Cilium agent DaemonSet as tests create it: a pod on every node (host network, tolerates every taint); the lab's
# kubelets count a Ready pod labelled k8s-app=cilium as the node's network (lab/k8s_upstream/kubelet.py).
CILIUM_DAEMONSET = {
    'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
    'metadata': {'name': 'cilium', 'namespace': 'kube-system', 'labels': {'k8s-app': 'cilium'}},
    'spec': {'selector': {'matchLabels': {'k8s-app': 'cilium'}},
             'template': {'metadata': {'labels': {'k8s-app': 'cilium'}},
                          'spec': {'hostNetwork': True, 'tolerations': [{'operator': 'Exists'}],
                                   'containers': [{'name': 'cilium-agent', 'image': 'quay.io/cilium/cilium:v1.18.2'}]}}},
}


class LabStartError(Exception):
    """`python -m lab up --detach` failed; the message has its output."""


def _candidate_nets(seed, count):
    """Nets 127.100.0 - 127.199.255 picked from seed, away from the default (127.0.10) and manual ones."""
    for attempt in range(count):
        number = (seed * 7919 + attempt * 104729) % (100 * 256)
        yield '127.%d.%d' % (100 + number // 256, number % 256)


def _address_free(host, port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def run_lab_command(*args, timeout=COMMAND_TIMEOUT):
    """Run `python -m lab ARGS` from the checkout; returns the CompletedProcess."""
    return subprocess.run([sys.executable, '-m', 'lab'] + [str(a) for a in args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)


class Lab(object):
    """A running lab, reached through its run dir."""

    def __init__(self, run_dir):
        self.paths = RunPaths(run_dir)
        self.run_dir = self.paths.run_dir
        with open(self.paths.state, encoding='utf-8') as handle:
            self.state = json.load(handle)
        self.net = self.state['net']
        self.pid = self.state['pid']
        self.inventory = self.state['inventory']
        self.pve_host = self.state['pve']['host']
        self.pve_port = self.state['pve']['port']
        self.pve_url = self.state['pve']['url']
        self.ca_path = self.state['pve']['ca']
        self.user = PVE_USER
        self.token_id = TOKEN_ID
        self.token_name = TOKEN_NAME
        self.cluster_endpoint = self.state['cluster_endpoint']
        self.inventory_dir = self._inventory_dir()

    def __repr__(self):
        return 'Lab(net=%s, run_dir=%s)' % (self.net, self.run_dir)

    def _inventory_dir(self):
        folder = os.path.join(self.run_dir, 'inventory')
        os.makedirs(folder, exist_ok=True)
        with open(self.inventory, encoding='utf-8') as source:
            text = source.read()
        with open(os.path.join(folder, 'hosts.yml'), 'w', encoding='utf-8') as target:
            target.write(text)
        # group_vars hold the cluster values; files/ what they point at ({{ inventory_dir }}/files/...:
        # the Cilium manifest, local charts, bootstrap app manifests).
        for name in ('group_vars', 'files'):
            source = os.path.join(ROOT, 'inventories', 'lab', name)
            link = os.path.join(folder, name)
            if os.path.isdir(source) and not os.path.lexists(link):
                os.symlink(source, link)
        return folder

    @property
    def token_secret(self):
        with open(self.paths.token, encoding='utf-8') as handle:
            return handle.read().strip()

    @property
    def password(self):
        with open(self.paths.password, encoding='utf-8') as handle:
            return handle.read().strip()

    # ---------------------------------------------------------------- control

    def control(self, op, **params):
        """One control request; returns its result, raises lab.control.ControlError when the lab refuses."""
        return call(self.paths.control, op, **params)

    def status(self):
        return self.control('status')

    def vms(self):
        """The VM rows of the status: vmid, name, node, status, lock, address, address_source, mac, agent."""
        return self.status()['pve']['vms']

    def fault(self, name, target=None, **params):
        return self.control('fault', name=name, target=target, params=params)

    def clear(self, name=None, target=None):
        return self.control('clear', name=name, target=target)

    def reset(self, storage=True):
        return self.control('reset', storage=storage)

    def delays(self, since=0, kind=None, target=None):
        return self.control('delays', since=since, kind=kind, target=target)

    def requests(self, since=0, source=None, limit=0):
        return self.control('requests', since=since, source=source, limit=limit)

    def events(self, since=0):
        return self.control('events', since=since)

    def last_seq(self, what):
        """The newest seq of 'requests', 'delays' or 'events' (pass it as since= to see only what follows)."""
        entries = self.control(what) if what != 'requests' else self.requests(limit=1)
        return entries[-1]['seq'] if entries else 0

    # ----------------------------------------------------------------- clients

    def proxmox(self, root=False, **kwargs):
        """A proxmoxer client, TLS verified with the lab's CA: the collection's API token (the documented
        least-privilege role), or with root=True root@pam by password (a test playing the PVE admin)."""
        from proxmoxer import ProxmoxAPI  # pylint: disable=import-outside-toplevel
        if root:
            options = dict(user=ROOT_USER, password=self.password)
        else:
            options = dict(user=self.user, token_name=self.token_name, token_value=self.token_secret)
        options.update(verify_ssl=self.ca_path, port=self.pve_port, timeout=30)
        options.update(kwargs)
        return ProxmoxAPI(self.pve_host, **options)

    @staticmethod
    def wait_until(probe, timeout=10.0, interval=0.02, what='the condition'):
        """tests/helpers.py's wait_until with the timeout second, from every `interval` s growing by 1.5 up to 0.5 s."""
        return helpers.wait_until(probe, what, timeout=timeout, interval=interval, backoff=1.5, max_interval=0.5)

    # ----------------------------------------------------------------- stop

    def stop(self):
        done = run_lab_command('down', '--run-dir', self.run_dir)
        if done.returncode != 0:
            raise RuntimeError('python -m lab down failed (%d): %s%s' % (done.returncode, done.stdout, done.stderr))


def start_lab(run_dir, net=None, control_planes=3, workers=3, time_scale=0.0, profile='realistic', seed=None,
              extra_args=()):
    """Start a lab with `python -m lab up --detach` and return its Lab handle.

    Without net, a free net is picked from the process id (tries a few when one is taken). The lab stops by
    itself when this process ends, so a test session that dies leaves no lab behind.
    """
    nets = [net] if net else list(_candidate_nets(os.getpid(), START_ATTEMPTS * 4))
    failures = []
    for candidate in nets:
        if len(failures) >= START_ATTEMPTS:
            break
        if not net and not _address_free(candidate + '.2', PVE_PORT):
            continue
        args = ['up', '--detach', '--net', candidate, '--run-dir', run_dir, '--control-planes', control_planes,
                '--workers', workers, '--time-scale', time_scale, '--profile', profile, '--owner-pid', os.getpid()]
        if seed is not None:
            args += ['--seed', seed]
        done = run_lab_command(*(args + list(extra_args)))
        if done.returncode == 0:
            return Lab(run_dir)
        failures.append('net %s: exit %d\n%s%s' % (candidate, done.returncode, done.stdout, done.stderr))
        if 'address already in use' not in (done.stdout + done.stderr).lower():
            break
    raise LabStartError('the lab did not start:\n' + '\n'.join(failures))


# ------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope='session')
def lab(tmp_path_factory):
    """One lab for the test session: 3 control planes, 3 workers, time scale 0, a net of its own."""
    handle = start_lab(str(tmp_path_factory.mktemp('lab')))
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def clean_lab(lab):  # pylint: disable=redefined-outer-name
    """The session lab after a reset: no VMs, no faults, empty storages."""
    lab.reset()
    return lab


def labs_stopped_at_the_end(start, tmp_path_factory):
    """The body of a lab_factory fixture (`yield from` it): yields make(**options), which starts a lab with
    start(a new temporary folder, **options); every lab it started stops when the test ends, and the errors of
    those stops are raised together."""
    started = []

    def make(**options):
        handle = start(str(tmp_path_factory.mktemp('lab')), **options)
        started.append(handle)
        return handle
    try:
        yield make
    finally:
        errors = []
        for handle in started:
            try:
                handle.stop()
            except RuntimeError as exc:
                errors.append(str(exc))
        if errors:
            raise RuntimeError('; '.join(errors))


@pytest.fixture
def lab_factory(tmp_path_factory):
    """Start extra labs inside a test: lab_factory(**start_lab options); they stop when the test ends."""
    yield from labs_stopped_at_the_end(start_lab, tmp_path_factory)


# ------------------------------------------------------------------------ in-process world

class WorldThread(object):
    """A World on an event loop in a daemon thread; call(coroutine or function) runs on that loop."""

    def __init__(self, options, timeout=30):
        self.timeout = timeout
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name='lab-world', daemon=True)
        self.thread.start()
        try:
            self.world = self.call(self._make(options))
        except BaseException:
            self._halt()
            raise

    @staticmethod
    async def _make(options):
        world = World(options)
        await world.start()
        return world

    def call(self, what):
        """Run a coroutine (or a plain function) on the World's loop and return its result."""
        if asyncio.iscoroutine(what):
            return asyncio.run_coroutine_threadsafe(what, self.loop).result(self.timeout)

        async def wrapped():
            return what()
        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(self.timeout)

    def _halt(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(self.timeout)
        if not self.thread.is_alive():
            self.loop.close()

    def close(self):
        try:
            self.call(self.world.stop())
        finally:
            self._halt()


@contextlib.contextmanager
def world_in_thread(run_dir, net, **options):
    """A started World in this process (LabOptions as keywords; extensions none unless given)."""
    options.setdefault('extensions', ())
    running = WorldThread(LabOptions(net=net, run_dir=str(run_dir), **options))
    try:
        yield running
    finally:
        running.close()


def free_net():
    """A net whose PVE address is free now, picked from the process id."""
    for candidate in _candidate_nets(os.getpid() + 1, 50):
        if _address_free(candidate + '.2', PVE_PORT):
            return candidate
    raise LabStartError('no free lab net found')
