# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading Proxmox VE VMs and gating on them running with a guest agent address. PRIVATE to the collection.

Used by the module proxmox_vm_info (`probe_vms`, `vms_result`): the VMs of its `vms` list are read once, or
waited for (wait_for running/address) until each passes or the deadline passes. Every VM is probed concurrently by
_fanout.run_each (proxmoxer is synchronous), under one deadline and one poll interval; a round lists the VMs once (/cluster/resources) and probes
  every VM that has not passed yet; a VM that passed is not probed again. A probe reads its VM once, without
  retries: a transient error is "not yet" for that VM in that round (the next round reads it again), so one VM
  whose PVE answers keep failing cannot hold up a round. The progress sink sees one line per round naming the
  VMs still waiting, written by the main thread only. The outcome names, for every VM that did not pass, its
  inventory name, VM id, PVE node and what was seen last.

When the guest agent does not run (PVE answers it is not running) and the VM has an expected (static, inventory)
address, talos_api_port lets the probe look at that address instead: a TLS server answering there on the Talos API
port counts as the VM's address (address_source talos_api). Talos has been reported both with and without the guest
agent in maintenance mode (docs/stages/vms.md); the stage's next gate checks the Talos API itself.
"""

from __future__ import annotations

import socket
import ssl
import time

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _errors, _fanout, _proxmox, _wait

HIDDEN_CONFIG_KEYS = ('cipassword', 'sshkeys')
AGENT_HINT = ('Talos runs the QEMU guest agent only when its image has the siderolabs/qemu-guest-agent system '
              'extension (Image Factory schematic), and the VM needs agent enabled in PVE')
# Seconds one look at the Talos API port may take (connect and TLS handshake).
TALOS_API_PROBE_TIMEOUT = 2.0
# At most this many VMs are probed at the same time (threads, and HTTP connections to PVE).
MAX_WORKERS = 16
# wait_for=none: how long transient PVE errors are ridden out (probe_vms's rounds).
READ_RETRY_SECONDS = 30.0
# The report's gate name per wait_for (the role's gate task had this name when it ran once per VM).
GATE_NAMES = {
    'running': 'the VM runs',
    'address': 'the VM runs and its guest agent reports its address',
}


def talos_api_answers(address, port, timeout=None):
    """True when a TLS server completes a handshake at address:port - Talos' apid, in maintenance mode with a
    self-signed certificate, so the certificate is not verified here (the Talos API gate after this one verifies
    what answers). A port that refuses, or accepts without ever answering TLS, is False."""
    timeout = TALOS_API_PROBE_TIMEOUT if timeout is None else timeout
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((address, port), timeout=timeout) as raw:
            raw.settimeout(timeout)
            with context.wrap_socket(raw, server_hostname=None):
                return True
    except (OSError, ssl.SSLError, ValueError):
        return False


class VmProbe(object):
    """One look at one VM: status, config, agent addresses.

    params: vmid, node (optional), expected_address (optional), talos_api_port (optional: with an expected address,
    the Talos API there stands in for an agent that does not run).
    """

    def __init__(self, client, params):
        self.client = client
        self.params = params
        self.vmid = params['vmid']
        self.node = params.get('node')

    @property
    def subject(self):
        return 'VM %s%s' % (self.vmid, ' on node %s' % self.node if self.node else '')

    def read(self, with_agent, resources, retry=False):
        """The VM's state as a dict (one entry of the module's result `vms`).

        resources: the /cluster/resources VM list of the round (one list for every VM).
        retry: False (probe_vms) reads each item once - a transient error is raised at once instead of being
          retried until the module's deadline (the next round reads the VM again, and no pool thread retries, so
          none writes to the progress file or holds up the round).
        """
        entry = _proxmox.vm_in_resources(resources, self.vmid)
        info = dict(exists=entry is not None, vmid=self.vmid, node=self.node, status='absent', lock=None,
                    agent_addresses=[], agent_error=None, address=None, address_source=None)
        if entry is None:
            return info
        if self.node and entry.get('node') != self.node:
            raise _errors.ValidationError('node', 'VM %s (%s) is on PVE node %r, not %r'
                                          % (self.vmid, entry.get('name'), entry.get('node'), self.node))
        self.node = entry.get('node')
        config, pending = _proxmox.read_config_and_pending(self.client, self.node, self.vmid, self.subject,
                                                           retry=retry)
        status = self.client.request('get', 'nodes/%s/qemu/%s/status/current' % (self.node, self.vmid),
                                     'read status', self.subject, retry=retry) or {}
        for key in HIDDEN_CONFIG_KEYS:
            if config.get(key):
                config[key] = '<hidden>'
            if pending.get(key):
                pending[key] = '<hidden>'
        info.update(node=self.node, name=entry.get('name') or config.get('name'), status=status.get('status'),
                    lock=status.get('lock') or entry.get('lock'), config=config, pending=pending)
        if with_agent and info['status'] == 'running':
            try:
                info['agent_addresses'] = _proxmox.agent_ipv4_addresses(self.client, self.node, self.vmid,
                                                                        self.subject)
            except _proxmox.PermissionDenied:
                # A refused privilege never passes by waiting: fail now, naming the call and the privilege.
                raise
            except _errors.ApiError as exc:
                # 500 'QEMU guest agent is not running' until the guest's agent starts.
                info['agent_error'] = exc.details.get('pve_message') or str(exc)
        addresses = [a['address'] for a in info['agent_addresses']]
        expected = self.params.get('expected_address')
        if expected and expected in addresses:
            info['address'], info['address_source'] = expected, 'agent'
        elif addresses and not expected:
            info['address'], info['address_source'] = addresses[0], 'agent'
        elif expected and info['agent_error'] and self.params.get('talos_api_port') and \
                talos_api_answers(expected, self.params['talos_api_port']):
            # No agent (Talos in maintenance mode may run none): the inventory address answers as a Talos API.
            info['address'], info['address_source'] = expected, 'talos_api'
        return info


def describe(info):
    """What the gate saw, in words."""
    if not info['exists']:
        return 'VM does not exist'
    if info['status'] != 'running':
        return 'VM is %s%s' % (info['status'], ' (lock: %s)' % info['lock'] if info['lock'] else '')
    if info['agent_error'] and info.get('address_source') == 'talos_api':
        return 'VM is running; guest agent: %s; the Talos API answers at its inventory address %s' % (
            info['agent_error'], info['address'])
    if info['agent_error']:
        return 'VM is running; guest agent: %s' % info['agent_error']
    addresses = [a['address'] for a in info['agent_addresses']]
    if not addresses:
        return 'VM is running; its guest agent reports no IPv4 address yet'
    return 'VM is running; its guest agent reports %s' % ', '.join(addresses)


def verdict(info, vm, wait_for, field='vmid'):
    """(passed, observation) of one reading. A missing VM fails a wait at once (ValidationError on field)."""
    if wait_for == 'none':
        return True, describe(info)
    if not info['exists']:
        raise _errors.ValidationError(field, 'VM %s does not exist%s' % (
            vm['vmid'], ' on node %s' % vm['node'] if vm.get('node') else ''))
    if wait_for == 'running':
        return info['status'] == 'running', describe(info)
    return info['address'] is not None, describe(info)


def timeout_message(vm, wait_for, seen, elapsed, observation):
    """'VM 101 (cp-1) on node pve1: not running ... after 600 s (last seen: ...)' plus the agent hint when it applies."""
    subject = 'VM %s%s on node %s' % (vm['vmid'], ' (%s)' % seen['name'] if seen.get('name') else '',
                                      seen.get('node') or vm.get('node'))
    if wait_for == 'running':
        goal = 'running'
    elif vm.get('expected_address'):
        goal = 'running with its guest agent reporting %s' % vm['expected_address']
    else:
        goal = 'running with its guest agent reporting an IPv4 address'
    message = '%s: not %s after %.0f s (last seen: %s)' % (subject, goal, elapsed, observation)
    if wait_for == 'address' and seen.get('status') == 'running' and not seen.get('agent_addresses'):
        message += '. ' + AGENT_HINT
    return message


class VmWatch(object):
    """Where one VM of a several-VM gate stands: its last reading, probes, and how it ended."""

    def __init__(self, vm, probe):
        self.vm = vm                  # the entry of the `vms` option: name, vmid, node, expected_address
        self.probe = probe
        self.seen = {}
        self.observation = None
        self.attempts = 0
        self.passed = False
        self.error = None             # a ProxtalosError that ends this VM's wait (not transient)
        self.elapsed = None           # seconds from the start until it passed or failed

    @property
    def name(self):
        return self.vm['name']

    @property
    def waiting(self):
        return not self.passed and self.error is None

    def label(self):
        """'lab-w-1 (VM 1021 on PVE node pve1)'."""
        node = self.seen.get('node') or self.vm.get('node')
        return '%s (VM %s%s)' % (self.name, self.vm['vmid'], ' on PVE node %s' % node if node else '')


class VmsOutcome(object):
    """The outcome of probe_vms: each VM's watch, the rounds, elapsed seconds, the largest pool used."""

    def __init__(self, watches, wait_result, workers, started_at=None):
        self.watches = watches
        self.wait_result = wait_result
        self.workers = workers
        self.started_at = started_at  # wall clock (time.time()) when the first round began

    @property
    def failed(self):
        return [w for w in self.watches if not w.passed]


def check_vms(vms):
    """Raise ValidationError('vms') for an empty list or a name or VM id used twice."""
    if not vms:
        raise _errors.ValidationError('vms', 'the list is empty: give at least one VM (name, vmid, node)')
    names, vmids = set(), set()
    for index, vm in enumerate(vms):
        if vm['name'] in names:
            raise _errors.ValidationError('vms', 'item %d: name %r is listed twice' % (index, vm['name']))
        if vm['vmid'] in vmids:
            raise _errors.ValidationError('vms', 'item %d (%s): VM id %s is listed twice' % (index, vm['name'], vm['vmid']))
        names.add(vm['name'])
        vmids.add(vm['vmid'])


def round_summary(watches, wait_for):
    """One line for the progress sink: the VMs still waiting and what each shows."""
    waiting = [w for w in watches if w.waiting]
    goal = {'none': 'read', 'running': 'running'}.get(wait_for, 'running with an agent address')
    parts = ['%s: %s' % (w.label(), w.observation or 'not probed yet') for w in waiting]
    return 'VMs not %s yet %d/%d: %s' % (goal, len(waiting), len(watches), '; '.join(parts))


def probe_vms(client, vms, params, max_workers=MAX_WORKERS, clock=time.monotonic, sleep=time.sleep,
              make_probe=VmProbe):
    """The VMs in one process: read once or wait, one deadline.

    vms: list of dicts name, vmid, node, expected_address (checked by check_vms).
    make_probe(client, vm): the probe of one VM (VmProbe; tests inject others).
    Each VM is read once a round, without request retries (see VmProbe.read): a transient error is "not yet"
    for that VM until the next round; with wait_for=none rounds go on only for such VMs, up to READ_RETRY_SECONDS.
    Returns a VmsOutcome; never raises for a VM that did not pass (each watch says why). Errors that are
    about every VM (listing the VMs fails for good) are raised.
    """
    check_vms(vms)
    timeout, interval = _argspec.wait_params(params)
    wait_for = params['wait_for']
    watches = [VmWatch(vm, make_probe(client, dict(vm, talos_api_port=params.get('talos_api_port')))) for vm in vms]
    started_at = time.time()
    start = clock()
    most_at_once = {'workers': 0}

    def probe_one(watch, resources):
        watch.attempts += 1
        try:
            # Read once (no retry until the deadline): a VM whose reads keep failing is "not yet" for this
            # round and does not hold up the round, and pool threads never write to the progress file.
            info = watch.probe.read(with_agent=True, resources=resources, retry=False)
            watch.seen = info
            passed, watch.observation = verdict(info, watch.vm, wait_for, field='vms')
        except _errors.TransientApiError as exc:
            passed, watch.observation = False, _wait.describe_exception(exc)
        except _errors.ProxtalosError as exc:
            watch.error = exc
            watch.observation = str(exc)
            watch.elapsed = clock() - start
            return
        if passed:
            watch.passed = True
            watch.elapsed = clock() - start

    def one_round():
        resources = _proxmox.list_vms(client, 'VMs %s' % ', '.join(str(vm['vmid']) for vm in vms))
        waiting = [w for w in watches if w.waiting]
        # No deadline for the round's probes: wait_for's deadline bounds the rounds, and each probe reads once.
        # An exception a probe did not catch is raised again here, once every probe of the round has ended.
        fanout = _fanout.run_each(waiting, lambda watch: probe_one(watch, resources), max_workers=max_workers,
                                  name=lambda watch: watch.name)
        most_at_once['workers'] = max(most_at_once['workers'], fanout.most_at_once)
        done = not any(w.waiting for w in watches)
        return done, round_summary(watches, wait_for)

    # wait_for=none passes a VM at its first reading; only a VM whose reading met a transient error is read
    # again, in the next round, for up to READ_RETRY_SECONDS.
    result = _wait.wait_for(one_round, timeout=timeout if wait_for != 'none' else READ_RETRY_SECONDS, interval=interval,
                            backoff=1.0, transient=(_errors.TransientApiError,), clock=clock, sleep=sleep)
    for watch in watches:
        if watch.elapsed is None:
            watch.elapsed = result.elapsed
    return VmsOutcome(watches, result, most_at_once['workers'], started_at)


def failure_text(watch, wait_for):
    """Why one VM did not pass: its inventory name, then what was seen (timeout_message)."""
    if watch.error is not None:
        return '%s: %s' % (watch.label(), watch.error)
    if wait_for == 'none':
        return '%s: could not be read (%s)' % (watch.label(), watch.observation)
    return '%s: %s' % (watch.name, timeout_message(watch.vm, wait_for, watch.seen, watch.elapsed, watch.observation))


def vm_result(watch):
    """One VM's entry of the result (`vms`, `failed_vms`)."""
    out = dict(watch.seen) if watch.seen else dict(
        exists=False, vmid=watch.vm['vmid'], node=watch.vm.get('node'), status='absent', lock=None,
        agent_addresses=[], agent_error=None, address=None, address_source=None)
    out.update(elapsed=round(watch.elapsed, 3), attempts=watch.attempts)
    return out


def gate_records(outcome, wait_for):
    """Convention 0 of docs/report.md: one gate per VM, under its inventory host."""
    name = GATE_NAMES[wait_for]
    records = []
    for watch in outcome.watches:
        node = watch.seen.get('node') or watch.vm.get('node')
        records.append({
            'name': name, 'ok': watch.passed, 'host': watch.name,
            'observation': watch.observation if watch.passed else failure_text(watch, wait_for),
            'elapsed': round(watch.elapsed, 3), 'attempts': watch.attempts,
            'target': 'VM %s%s' % (watch.vm['vmid'], ' on PVE node %s' % node if node else ''),
            'diagnosis': [],
        })
        if outcome.started_at is not None:
            records[-1].update(started_at=round(outcome.started_at, 3),
                               ended_at=round(outcome.started_at + watch.elapsed, 3))
    return records


def vms_result(outcome, wait_for):
    """(ok, result dict, message) of probe_vms's outcome, for exit_json / fail_json."""
    result = dict(changed=False, vms=dict((w.name, vm_result(w)) for w in outcome.watches if w.passed),
                  elapsed=round(outcome.wait_result.elapsed, 3), attempts=outcome.wait_result.attempts,
                  workers=outcome.workers)
    if wait_for != 'none':
        result['gates'] = gate_records(outcome, wait_for)
    failed = outcome.failed
    if not failed:
        return True, result, None
    result['failed_vms'] = dict((w.name, vm_result(w)) for w in failed)
    reasons = '; '.join(failure_text(w, wait_for) for w in failed)
    message = '%d of %d VMs did not pass: %s' % (len(failed), len(outcome.watches), reasons)
    return False, result, message
