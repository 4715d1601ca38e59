"""Interrupted runs: for every stage, ansible-playbook is killed (SIGKILL) in the middle of it, the run is started
again, and it must converge, change only what the killed run left undone, and regenerate no secret.

One lab of its own (3 control planes + 3 workers, time scale 0) goes through the stages as a chain: run k is
`--tags <stage k-1>,<stage k>`; it first finishes stage k-1, which run k-1 was killed in, and is killed in the
middle of stage k. The kill is SIGKILL to ansible-playbook's whole process session (its forks and the modules they
run die with it, as when a CI runner or a laptop goes away), at a point the lab observes, so that it lands in the
middle of the stage's work rather than between stages:

  preflight       its first check reported
  vms             PVE received the first VM create (the others are being created or not yet: this run has
                  --forks 2, with the default every VM would be created at the same moment)
  secrets         the secrets bundle was written (the talosconfig and machine configs not necessarily)
  apply           the first node left maintenance mode with its config (one module run applies every node at once;
                  at time scale 0 all six would take their configs at the same moment, so lab-w-3 is made
                  unreachable for this run - fault talos-unreachable, cleared after the kill - and is still to be
                  applied)
  bootstrap       the stage's gates play started (the Bootstrap call made in its first play, the quorum gate
                  waiting; at time scale 0 the quorum would be there at once, so lab-cp-3's etcd reports unhealthy
                  for this run - fault talos-etcd-unhealthy, armed before lab-cp-3 has its config if the apply kill
                  left it without, cleared after the kill - and the quorum wait holds the run in the stage). The
                  first play of the stage ends a few tenths of a second after the Bootstrap call, and the plays that
                  follow it belong to other stages: a kill on the call itself could land in one of them
  kubeconfig      the Kubeconfig call reached the control plane (file maybe written, readyz gate not run)
  flux_install    its first task result (Flux's components not applied yet)
  sealed_secrets  the keypair was written (the key Secret not necessarily applied)
  cni             its kubelet check of the workers reported (the gates - one k8s_gate run - not run)
  flux            the first write into flux-system of the flux stage's play (the flux_install play, tag flux
                  too, writes there before it)
  apps            the first write of the stage reached the API server (CRDs first, then the releases); writes
                  count from the start of the stage's play, since the run (--tags flux,apps) finishes the flux
                  plays first
  gitops          its first gate reported
  (any other)     the first task result of the stage

Right after each kill, what the lab holds is recorded (VMs, Talos nodes' modes, etcd, files). The next run must:
pass the stage's gates; report no change for a (task, host) the killed run had already reported changed; report no
change where the lab already had the result (an existing VM is not created again, a configured node is not applied
again, etcd is not bootstrapped again, a kept kubeconfig or keypair is kept); and leave every kept file (secrets
bundle, sealed-secrets keypair, talosconfig, kubeconfig) byte-identical. After the chain, the whole site.yml runs
once more: changed=0, with the files that were first written still byte-identical, and no temporary file of an
interrupted write, nor a module file holding arguments (ansible.cfg: pipelining), left behind.
"""

import base64
import json
import os
import sys

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ansible_collections.proxtalos.cluster.tests import helpers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_lab import PLAYBOOK_BIN, Workspace, play_stage, stages, task_results  # noqa: E402  pylint: disable=wrong-import-position,import-error

from lab.testing import start_lab  # noqa: E402  pylint: disable=wrong-import-position

pytestmark = [pytest.mark.lab, pytest.mark.slow,
              pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')]

KILL_TIMEOUT = 300
HOSTS = ('lab-cp-1', 'lab-cp-2', 'lab-cp-3', 'lab-w-1', 'lab-w-2', 'lab-w-3')
VM_TASK = 'Create or update the VM'
APPLY_TASK = 'Apply the machine config'
BOOTSTRAP_TASK = 'Bootstrap etcd once'
KUBECONFIG_TASK = 'Admin kubeconfig from the first control plane'
SECRETS_TASK = 'Secrets bundle'
KEYPAIR_TASK = 'Keep the sealed-secrets keypair'
# The vms and apply stages are one module run for every VM / node (forks do not matter), at time scale 0 all at the
# same moment: a lab fault keeps one of them from finishing in the killed run (lab-w-3's VM start answers 503, which
# proxmox_vm retries; lab-w-3's Talos node does not answer), so the kill finds some done and others not. The
# bootstrap stage is killed in its gates play: an unhealthy etcd member on lab-cp-3 keeps its quorum wait going. The
# fault is cleared right after the kill.
# (name, target, params)
KILL_ARGS = {}
# The killed runs name the venv's python by its other name (from when the collection's modules ran in the worker
# process unless the interpreter was another: a stage at time scale 0 then moved on from its kill point in less time
# than the observer takes to notice it). Every module task is a module process now (docs/adr/0001-...); the
# argument is kept so that the killed runs stay as they were measured. The runs that resume use the default.
KILLED_RUN_ARGS = ('-e', 'ansible_python_interpreter=%s' % os.path.join(os.path.dirname(os.path.realpath(PLAYBOOK_BIN)), 'python3'))
KILL_FAULTS = {'vms': ('pve-5xx', None, {'times': 0, 'status': 503, 'method': 'POST', 'path': '/qemu/1023/status/start'}),
               'apply': ('talos-unreachable', 'lab-w-3', {}),
               'bootstrap': ('talos-etcd-unhealthy', 'lab-cp-3', {})}


class RequestTail(object):
    """New lines of the lab's requests.log since the run started."""

    def __init__(self, lab):
        self.path = os.path.join(lab.run_dir, 'requests.log')
        self.offset = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        self.seen = []
        self.stage_start = None   # len(seen) when the killed stage's play was first seen started

    def read(self):
        if os.path.exists(self.path):
            with open(self.path, encoding='utf-8') as handle:
                handle.seek(self.offset)
                chunk = handle.read()
            complete, _sep, _partial = chunk.rpartition('\n')
            if complete:
                self.offset += len(complete.encode('utf-8')) + 1
                self.seen += [json.loads(line) for line in complete.splitlines() if line.strip()]
        return self.seen


def stage_results(events, stage):
    return [r for r in task_results(events) if r[0] == stage and 'Validating arguments' not in r[1]]


def api_writes_in_stage(stage, running, requests, into=''):
    """Writes to the API server (whose path contains `into`) since the play of `stage` started: a stage whose
    run also runs another that writes (the flux_install play and the flux play before the releases, with --tags flux)."""
    seen = requests.read()
    if requests.stage_start is None:
        started = [e for e in running.events() if e.get('_event') == 'v2_playbook_on_play_start'
                   and play_stage(e['play']['name']) == stage]
        if not started:
            return []
        requests.stage_start = len(seen)
    return [r for r in seen[requests.stage_start:] if r['source'] == 'k8s' and r['method'] != 'GET' and into in r['path']]


def played_stages(events):
    """The stage of every play started, in order, repeats kept (a stage such as bootstrap has plays apart)."""
    return [play_stage(e['play']['name']) for e in events if e.get('_event') == 'v2_playbook_on_play_start']


def talos_nodes(lab):
    return lab.status().get('talos', {}).get('nodes', [])


def trigger(stage, workspace, running, requests):
    """Has the killed run reached the middle of stage? (done, what was seen)"""
    if stage == 'vms':
        hits = [r for r in requests.read() if r['source'] == 'pve' and r['method'] == 'POST' and r['path'].endswith('/qemu')]
        return bool(hits), 'PVE VM creates: %d' % len(hits)
    if stage == 'secrets':
        return os.path.exists(workspace.bundle), 'bundle written: %s' % os.path.exists(workspace.bundle)
    if stage == 'apply':
        left = [n['name'] for n in talos_nodes(workspace.lab) if n['phase'] != 'maintenance']
        return bool(left), 'nodes out of maintenance: %s' % left
    if stage == 'bootstrap':
        calls = [r for r in requests.read() if r['source'] == 'talos' and r['path'] == '/machine.MachineService/Bootstrap']
        plays = played_stages(running.events())
        gates = bool(calls) and plays.count('bootstrap') >= 2 and plays[-1] == 'bootstrap'
        return gates, 'Bootstrap calls: %d; plays started: %s' % (len(calls), plays)
    if stage == 'kubeconfig':
        method = '/machine.MachineService/%s' % stage.capitalize()
        hits = [r for r in requests.read() if r['source'] == 'talos' and r['path'] == method]
        return bool(hits), '%s calls: %d' % (method, len(hits))
    if stage == 'apps':
        # the run is --tags flux,apps: the apps stage's first write (CRDs, then the releases), after the flux plays'
        hits = api_writes_in_stage(stage, running, requests)
        return bool(hits), 'writes to the API server in the apps stage: %d' % len(hits)
    if stage == 'sealed_secrets':
        return os.path.exists(workspace.sealed_key), 'keypair written: %s' % os.path.exists(workspace.sealed_key)
    if stage == 'flux':
        # the run is --tags cni,flux: the flux_install play (tag flux too) writes into flux-system first
        hits = api_writes_in_stage(stage, running, requests, into='flux-system')
        return bool(hits), 'writes into flux-system in the flux stage: %d' % len(hits)
    results = stage_results(running.events(), stage)
    if stage == 'cni':
        # the workers' settings check: the kubelet check of every worker (a module run over the Talos API) still
        # follows in this play; after the kubelet check the play ends and the flux play starts at once
        results = [r for r in results if "Check each worker's settings" in r[1]]
    return bool(results), 'results of stage %s: %d' % (stage, len(results))


def snapshot(workspace):
    """What the lab and the files hold right after a kill."""
    lab = workspace.lab
    status = lab.status()
    etcd = status.get('talos', {}).get('etcd', {})
    return {'vms': dict((vm['name'], vm['status']) for vm in status['pve']['vms']),
            'talos': dict((n['name'], n['mode']) for n in status.get('talos', {}).get('nodes', [])),
            'bootstrapped': any(cluster.get('bootstrapped') for cluster in etcd.values()),
            'kept': workspace.kept_files()}


def run_killed_in(workspace, stage, previous):
    """Run --tags previous,stage and SIGKILL it in the middle of stage; returns (the killed run, what the lab held)."""
    tags = ','.join([t for t in (previous, stage) if t])
    requests = RequestTail(workspace.lab)
    fault = KILL_FAULTS.get(stage)
    if fault:
        workspace.lab.fault(fault[0], fault[1], **fault[2])
    try:
        running = workspace.start('--tags', tags, *(KILLED_RUN_ARGS + KILL_ARGS.get(stage, ())), label='%s-killed' % stage)

        def reached():
            if not running.running():
                return True, 'ended by itself'
            return trigger(stage, workspace, running, requests)
        try:
            # a fixed short poll: a stage at time scale 0 can be over a second after its kill point (report, gitops)
            seen = helpers.wait_until(reached, 'stage %s reached its kill point' % stage, timeout=KILL_TIMEOUT, interval=0.02)
        finally:
            running.kill()
    finally:
        if fault:
            workspace.lab.clear(fault[0], fault[1])
    killed = running.result()
    assert killed.killed, 'the run of %s ended before its kill point (%s): %s' % (tags, seen, killed.explain())
    plays = killed.stages_run()
    if stage == 'bootstrap':   # killed in its gates play, after plays of later stages: the last play started is the gates'
        plays = played_stages(killed.events)
    assert plays and plays[-1] == stage, 'killed outside stage %s (plays started: %s; %s)' % (stage, plays, seen)
    assert not any(e.get('_event') == 'v2_playbook_on_stats' for e in killed.events), 'killed after the run ended'
    return killed, snapshot(workspace)


def changed_pairs(run, stage):
    return set((task, host) for _s, task, host, result, _e in run.results(stage) if result.get('changed'))


def result_of(run, stage, task_part, host=None):
    found = [(h, r) for _s, t, h, r, _e in run.results(stage, task_part) if host is None or h == host]
    return found


def check_resumed(stage, killed, before, run, kept_at_first):
    """The run that finished `stage` after it was killed in it: only what was left undone changed."""
    failed = [f for f in run.failures() if f[0] == stage]
    plays = run.stages_run()
    # a run killed later (in the next stage) must have gone past this one; the last run must have ended well
    finished = run.ok if not run.killed else (stage in plays and plays[-1] != stage)
    assert finished and not failed, 'the re-run did not converge stage %s (plays %s): %s' % (stage, plays, run.explain())
    redone = changed_pairs(killed, stage) & changed_pairs(run, stage)
    assert not redone, 'stage %s: done before the kill and changed again: %s' % (stage, sorted(redone))
    if stage == 'vms':
        assert sorted(h for h, status in before['vms'].items() if status == 'running') != sorted(HOSTS), \
            'the kill left no VM to create or start: %s' % before['vms']
        # One run_once module run for every VM: each VM's part is under its host in `vms`.
        vm_parts = [item for _h, result in result_of(run, stage, VM_TASK) for item in (result.get('vms') or {}).items()]
        assert sorted(host for host, _r in vm_parts) == sorted(HOSTS), 'the VM task did not report every VM: %s' % vm_parts
        for host, result in vm_parts:
            if host in before['vms']:
                assert 'create' not in (result.get('actions') or []), (host, result.get('actions'))
            if before['vms'].get(host) == 'running':
                assert not result.get('changed'), (host, result.get('actions'))
        # the VM the fault kept from starting in the killed run is started now
        assert before['vms'].get('lab-w-3') != 'running' and dict(vm_parts)['lab-w-3'].get('changed'), (before['vms'], vm_parts)
    if stage == 'apply':
        assert any(mode == 'maintenance' for mode in before['talos'].values()), 'the kill left no node to apply: %s' % before
        # one module run (run_once) applied every node: each node's own result is under its name
        applied = dict((host, node_result) for _h, result in result_of(run, stage, APPLY_TASK)
                       for host, node_result in (result.get('nodes') or {}).items())
        assert sorted(applied) == sorted(HOSTS), applied
        for host, node_result in applied.items():
            if before['talos'].get(host) == 'configured':
                assert not node_result.get('changed'), 'node %s was configured before the re-run and applied again' % host
        # the node the fault kept from its config in the killed run is applied now
        fault_host = KILL_FAULTS['apply'][1]
        assert before['talos'].get(fault_host) == 'maintenance' and applied[fault_host].get('changed'), (before['talos'], applied)
    if stage == 'bootstrap' and before['bootstrapped']:
        assert [r.get('changed') for _h, r in result_of(run, stage, BOOTSTRAP_TASK)] == [False]
    if stage == 'secrets':
        assert [r.get('changed') for _h, r in result_of(run, stage, SECRETS_TASK)] == [False]
    if stage == 'kubeconfig' and 'kubeconfig' in before['kept']:
        assert [r.get('changed') for _h, r in result_of(run, stage, KUBECONFIG_TASK)] == [False]
    if stage == 'sealed_secrets':
        # both files there at the kill: kept as they are; only the key (killed between the two writes): the key kept and
        # its certificate made again (the module's `action` result is not readable here: the jsonl callback overwrites
        # that key with the task's module name)
        whole_pair = 'sealed-secrets.crt' in before['kept']
        assert [r.get('changed') for _h, r in result_of(run, stage, KEYPAIR_TASK)] == [not whole_pair], before['kept']
    for name, digest in kept_at_first.items():
        assert before['kept'].get(name, digest) == digest, '%s changed while stage %s was interrupted' % (name, stage)


@pytest.fixture(scope='module')
def chain_workspace(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp('interrupted'))
    lab = start_lab(os.path.join(folder, 'lab'))
    try:
        space = Workspace(lab, folder)
        space.render_cilium_manifest()
        yield space
    finally:
        lab.stop()


def test_every_stage_killed_in_the_middle_then_resumed(chain_workspace):
    workspace = chain_workspace
    order = stages()
    assert order[:3] == ['preflight', 'vms', 'secrets'] and 'gitops' in order, order
    kept_at_first = {}
    previous = None
    killed = before = None
    for stage in order:
        killed_now, before_now = run_killed_in(workspace, stage, previous)
        if previous is not None:
            # run k finished stage k-1 before it reached stage k and was killed there
            check_resumed(previous, killed, before, killed_now, kept_at_first)
        for name, digest in before_now['kept'].items():
            kept_at_first.setdefault(name, digest)
        previous, killed, before = stage, killed_now, before_now
    last = workspace.run('--tags', previous, label='%s-resumed' % previous)
    check_resumed(previous, killed, before, last, kept_at_first)
    assert set(kept_at_first) >= {'talos-secrets.yaml', 'sealed-secrets.key', 'talosconfig', 'kubeconfig'}, kept_at_first

    whole = workspace.run(label='site-after-the-chain')
    assert whole.ok, whole.explain()
    assert whole.changed() == [], 'a whole run after the interrupted chain still changes: %s' % whole.changed()
    assert workspace.kept_files() == dict((name, kept_at_first[name]) for name in workspace.kept_files())
    leftovers = [name for folder in (workspace.secrets_dir, workspace.artifacts) for name in os.listdir(folder) if name.startswith('.')]
    assert leftovers == [], 'temporary files left behind by the kills: %s' % leftovers
    # Without pipelining, each module runs from an AnsiballZ_*.py file that holds its arguments (the PVE token secret,
    # key material); a module killed mid-way leaves it behind. ansible.cfg turns pipelining on: nothing is written.
    modules = [os.path.join(d, f) for d, _dirs, files in os.walk(workspace.ansible_tmp) for f in files]
    assert modules == [], 'module files (with their arguments) left behind by the kills: %s' % modules[:5]


def test_a_run_killed_between_the_key_and_the_certificate_writes_is_completed_with_the_same_key(chain_workspace):
    """The keypair is two files, the key written first; a kill between the two writes (a window of a few
    milliseconds, which the chain's kill point can hit but not reliably) leaves the key alone. That state is made here
    directly: the next run keeps the key and makes its certificate again, the cluster's key Secret holds the same key."""
    workspace = chain_workspace
    certificate = os.path.join(workspace.secrets_dir, 'sealed-secrets.crt')
    with open(workspace.sealed_key, 'rb') as handle:
        key = handle.read()
    os.unlink(certificate)
    run = workspace.run('--tags', 'sealed_secrets', label='sealed-key-without-certificate')
    assert run.ok, run.explain()
    with open(workspace.sealed_key, 'rb') as handle:
        assert handle.read() == key
    with open(certificate, 'rb') as handle:
        public = x509.load_pem_x509_certificate(handle.read()).public_key()
    private = serialization.load_pem_private_key(key, password=None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    assert public.public_bytes(serialization.Encoding.PEM, spki) == private.public_key().public_bytes(serialization.Encoding.PEM, spki)
    assert oct(os.stat(certificate).st_mode & 0o777) == '0o600'
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    secret = client.CoreV1Api(workspace.k8s()).read_namespaced_secret('sealed-secrets-key', 'kube-system')
    assert base64.b64decode(secret.data['tls.key']) == key
    again = workspace.run('--tags', 'sealed_secrets', label='sealed-key-again')
    assert again.ok and again.changed() == [], again.explain()
