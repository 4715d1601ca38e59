"""`python -m lab` as users and the Makefile run it: up/down, reuse, status, faults, failures, several labs."""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import yaml
from proxmoxer.tools import Tasks

from lab.cli import process_alive, worlds_of
from lab.testing import Lab, free_net, run_lab_command, start_lab

pytestmark = pytest.mark.lab


def nothing_left(handle, pid):
    """(done, what is left) for Lab.wait_until: process gone, socket and state removed, PVE port free."""
    left = []
    if process_alive(pid):
        left.append('pid %d' % pid)
    for path in (handle.paths.control, handle.paths.state):
        if os.path.exists(path):
            left.append(path)
    with socket.socket() as probe:
        try:
            probe.bind((handle.pve_host, handle.pve_port))
        except OSError as exc:
            left.append('%s:%d still bound (%s)' % (handle.pve_host, handle.pve_port, exc))
    return not left, left


def test_up_detach_then_down_leaves_nothing_running(tmp_path):
    handle = start_lab(str(tmp_path / 'run'), control_planes=1, workers=2)
    pid = handle.pid
    assert process_alive(pid)
    with open(handle.inventory, encoding='utf-8') as text:
        hosts = yaml.safe_load(text)
    assert sorted(hosts['cluster']['children']['worker']['hosts']) == ['lab-w-1', 'lab-w-2']
    assert oct(os.stat(handle.paths.token).st_mode & 0o777) == '0o600'
    assert oct(os.stat(os.path.join(handle.run_dir, 'pve.key')).st_mode & 0o777) == '0o600'
    done = run_lab_command('down', '--run-dir', handle.run_dir)
    assert done.returncode == 0, done.stderr
    assert 'lab stopped (pid %d' % pid in done.stdout
    assert nothing_left(handle, pid) == (True, [])
    again = run_lab_command('down', '--run-dir', handle.run_dir)
    assert (again.returncode, again.stdout.strip()) == (0, 'no lab running in %s' % handle.run_dir)
    status = run_lab_command('status', '--run-dir', handle.run_dir)
    assert status.returncode == 1 and 'no lab running' in status.stderr


def test_sigterm_stops_the_lab_cleanly(tmp_path):
    handle = start_lab(str(tmp_path / 'run'), control_planes=1, workers=0)
    os.kill(handle.pid, signal.SIGTERM)
    handle.wait_until(lambda: nothing_left(handle, handle.pid), timeout=20, what='the lab stopping on SIGTERM')
    with open(handle.paths.log, encoding='utf-8') as log:
        assert log.read().rstrip().endswith('lab stopped')


def test_reuse_keeps_a_healthy_lab_and_refuses_a_different_one(lab):
    args = ['up', '--detach', '--run-dir', lab.run_dir, '--net', lab.net, '--control-planes', 3, '--workers', 3]
    reused = run_lab_command(*(args + ['--reuse']))
    assert reused.returncode == 0, reused.stderr
    assert 'reusing the running lab' in reused.stdout and 'pid %d' % lab.pid in reused.stdout
    refused = run_lab_command(*args)
    assert refused.returncode == 1 and 'already running' in refused.stderr and '--reuse' in refused.stderr
    other = run_lab_command(*(args[:-2] + ['--workers', 5, '--reuse']))
    assert other.returncode == 1 and 'workers 3 (asked for 5)' in other.stderr
    # a lab of the other world in the run dir is not what was asked for (`make demo` asks for upstream Kubernetes)
    running = worlds_of(lab.state['extensions'])
    wanted = ('lab', 'lab') if running[0] == 'upstream' else ('upstream', 'upstream')
    other_world = run_lab_command(*(args + ['--kubernetes', wanted[0], '--flux', wanted[1], '--reuse']))
    differences = ', '.join('%s %s (asked for %s)' % (name, have, want)
                            for name, have, want in zip(('kubernetes', 'flux'), running, wanted) if have != want)
    assert other_world.returncode == 1 and 'with %s;' % differences in other_world.stderr, other_world.stderr
    assert Lab(lab.run_dir).pid == lab.pid


@pytest.mark.parametrize('args, message', [
    (['--net', '10.1.2'], '--net: net must be inside the loopback range'),
    (['--control-planes', '0'], '--control-planes must be 1-89'),
    (['--time-scale', '-1'], '--time-scale must be a number, 0 or more'),
    (['--pve-nodes', 'pve1,pve1'], '--pve-nodes: names must be unique'),
])
def test_bad_options_are_refused_naming_the_option(tmp_path, args, message):
    done = run_lab_command('up', '--detach', '--run-dir', tmp_path / 'run', *args)
    assert done.returncode == 1
    assert message in done.stderr


def test_a_lab_that_cannot_start_shows_its_log(tmp_path):
    net = free_net()
    with socket.socket() as squatter:
        squatter.bind((net + '.2', 8006))
        squatter.listen()
        done = run_lab_command('up', '--detach', '--run-dir', tmp_path / 'run', '--net', net)
    assert done.returncode == 1
    assert 'exited with code 1 while starting' in done.stderr
    assert 'cannot listen on %s.2:8006 for the PVE API' % net in done.stderr
    assert not os.path.exists(tmp_path / 'run' / 'state.json')


def test_status_faults_fault_clear_from_the_command_line(clean_lab):
    run_dir = ['--run-dir', clean_lab.run_dir]
    api = clean_lab.proxmox()
    upid = api.nodes('pve1').qemu.post(vmid=1021, name='lab-w-1', net0='virtio,bridge=vmbr0', agent=1, start=1)
    Tasks.blocking_status(api, upid, polling_interval=0.01)
    text = run_lab_command('status', *run_dir)
    assert text.returncode == 0
    row = [line.split() for line in text.stdout.splitlines() if line.split()[:1] == ['1021']][0]
    assert row[:4] == ['1021', 'lab-w-1', 'pve1', 'running'] and clean_lab.net + '.100' in row
    status = json.loads(run_lab_command('status', '--json', *run_dir).stdout)
    assert status['pve']['vms'][0]['address_source'] == 'dhcp'
    listing = run_lab_command('faults', *run_dir).stdout
    for name in ('pve-task-error OPERATION', 'pve-config-lock VMID', 'pve-flaky-network', 'pve-5xx',
                 'pve-node-offline [NODE]'):
        assert name in listing
    applied = run_lab_command('fault', 'pve-task-error', 'start', 'vmid=1021', 'times=2', *run_dir)
    assert applied.returncode == 0 and 'fault pve-task-error on start active (vmid=1021, times=2)' in applied.stdout
    assert 'ACTIVE on start' in run_lab_command('faults', *run_dir).stdout
    bad = run_lab_command('fault', 'pve-task-error', 'start', 'stop', *run_dir)
    assert bad.returncode == 1 and 'one target only' in bad.stderr
    cleared = run_lab_command('clear', 'pve-task-error', *run_dir)
    assert cleared.stdout.strip() == 'cleared pve-task-error on start'
    assert run_lab_command('clear', *run_dir).stdout.strip() == 'no active fault matched; nothing to clear'


def test_two_labs_on_different_nets_at_once(lab, lab_factory):
    other = lab_factory(control_planes=1, workers=1)
    assert other.net != lab.net and other.pve_host != lab.pve_host
    for handle, vmid in ((lab, 1011), (other, 2011)):
        api = handle.proxmox()
        Tasks.blocking_status(api, api.nodes('pve1').qemu.post(vmid=vmid, name='vm', net0='virtio,bridge=vmbr0'),
                              polling_interval=0.01)
    assert 1011 in [vm['vmid'] for vm in lab.vms()] and [vm['vmid'] for vm in other.vms()] == [2011]
    lab.reset()


def test_down_and_up_over_a_stale_state_file(tmp_path):
    """A lab killed hard leaves state.json behind, naming a pid that is gone or reused."""
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'state.json').write_text(json.dumps({'pid': os.getpid(), 'net': '127.0.10'}))
    done = run_lab_command('down', '--run-dir', run)
    assert (done.returncode, done.stdout.strip()) == (0, 'no lab running in %s' % run)
    assert not (run / 'state.json').exists()
    (run / 'state.json').write_text(json.dumps({'pid': os.getpid(), 'net': '127.0.10'}))
    handle = start_lab(str(run), control_planes=1, workers=0)
    assert handle.pid != os.getpid()
    handle.stop()


def test_lab_stops_when_its_owner_process_ends(tmp_path):
    with subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'], stdin=subprocess.PIPE) as owner:
        done = run_lab_command('up', '--detach', '--run-dir', tmp_path / 'run', '--net', free_net(),
                               '--control-planes', 1, '--workers', 0, '--owner-pid', owner.pid)
        assert done.returncode == 0, done.stderr
        handle = Lab(str(tmp_path / 'run'))
        assert process_alive(handle.pid)
        owner.stdin.close()
        owner.wait(10)
    handle.wait_until(lambda: nothing_left(handle, handle.pid), timeout=20, what='the lab stopping after its owner')
    with open(handle.paths.log, encoding='utf-8') as log:
        assert 'owner process %d ended; stopping' % owner.pid in log.read()
