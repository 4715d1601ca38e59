"""`python -m lab`: start, stop, inspect and break the lab (see docs/lab.md)."""

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys

from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait

from lab import DEFAULT_RUN_DIR, ROOT
from lab.addresses import Net
from lab.control import ControlError, LabNotRunning, call
from lab.timing import PROFILES
from lab.world import LabError, LabOptions, RunPaths, World, extensions_for, flux_world, kubernetes_world

START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0
KILL_TIMEOUT = 5.0
LOG_TAIL_LINES = 40


class CliError(Exception):
    """A command failed; the message says why (exit code 1)."""


class LabExited(Exception):
    """The detached lab process ended while we waited for it."""

    def __init__(self, code):
        super().__init__('the lab process exited with code %s' % code)
        self.code = code


# ------------------------------------------------------------------------------ helpers

def read_state(paths):
    """state.json of a run dir, or None when there is none (or it cannot be read)."""
    try:
        with open(paths.state, encoding='utf-8') as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def process_alive(pid):
    """True while pid runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open('/proc/%d/stat' % pid, encoding='utf-8') as handle:
            return handle.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except (OSError, IndexError):
        return True


def is_lab_process(pid):
    """True when pid is a `python -m lab up` process (so a recycled pid is never signalled)."""
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as handle:
            argv = handle.read().split(b'\0')
    except OSError:
        return False
    return any(argv[i:i + 3] == [b'-m', b'lab', b'up'] for i in range(len(argv)))


def lab_running(state):
    """True when state.json names a live `python -m lab up` process."""
    pid = (state or {}).get('pid')
    return isinstance(pid, int) and process_alive(pid) and is_lab_process(pid)


def endpoint_problems(state):
    """What does not answer among the lab's listeners (empty when all do)."""
    problems = []
    for endpoint in state.get('endpoints') or []:
        try:
            with socket.create_connection((endpoint['host'], endpoint['port']), timeout=2):
                pass
        except OSError as exc:
            problems.append('%s %s:%s does not answer (%s)' % (endpoint['name'], endpoint['host'], endpoint['port'],
                                                               exc.strerror or exc))
    try:
        call(state['control_socket'], 'ping', timeout=5)
    except ControlError as exc:
        problems.append('control socket: %s' % exc)
    return problems


def log_tail(path, lines=LOG_TAIL_LINES):
    try:
        with open(path, encoding='utf-8', errors='replace') as handle:
            return ''.join(handle.readlines()[-lines:])
    except OSError as exc:
        return '(no log: %s)\n' % exc


def wait_gone(pid, timeout):
    result = _wait.wait_for(lambda: (not process_alive(pid), 'pid %d still running' % pid), timeout,
                            interval=0.05, backoff=1.5, max_interval=0.5)
    return result.ok


def options_from(args):
    extensions = None
    if args.extensions is not None:
        names = [n.strip() for n in args.extensions.split(',') if n.strip()]
        extensions = () if names == ['none'] else tuple(n if '.' in n else 'lab.' + n for n in names)
    kubernetes = kubernetes_world(getattr(args, 'kubernetes', None))
    flux = flux_world(getattr(args, 'flux', None), kubernetes)
    extensions = extensions_for(kubernetes, extensions, flux)
    options = LabOptions(net=args.net, run_dir=os.path.abspath(args.run_dir), control_planes=args.control_planes,
                         workers=args.workers, profile=args.profile, time_scale=args.time_scale,
                         pve_nodes=tuple(n.strip() for n in args.pve_nodes.split(',') if n.strip()),
                         pve_major=args.pve_major, seed=args.seed, extensions=extensions,
                         owner_pid=args.owner_pid)
    options.validate()
    return options


def summary(state):
    pve = state['pve']
    lines = ['lab up (pid %d): net %s, profile %s, time scale %s, run dir %s'
             % (state['pid'], state['net'], state['profile'], state['time_scale'], state['run_dir']),
             '  PVE API           %s  (nodes %s)' % (pve['url'], ', '.join(state['pve_nodes'])),
             '  PVE CA            %s' % pve['ca'],
             '  PVE token         %s  (secret in %s)' % (pve['token_id'], pve['token_file']),
             '  cluster endpoint  %s' % state['cluster_endpoint'],
             '  inventory         %s%s' % (state['inventory'],
                                           '  and %s' % state['repo_inventory'] if state.get('repo_inventory') else ''),
             '  control socket    %s' % state['control_socket'],
             '  log               %s' % state['log']]
    return '\n'.join(lines)


# ------------------------------------------------------------------------------ up / down

def setup_logging(paths):
    """Log to stderr and, unless stderr is lab.log already (a detached lab), to lab.log as well."""
    formatter = logging.Formatter('%(asctime)s %(levelname)s %(name)s: %(message)s')
    handlers = [logging.StreamHandler(sys.stderr)]
    os.makedirs(paths.run_dir, exist_ok=True)
    try:
        to_log = not os.path.samestat(os.fstat(sys.stderr.fileno()), os.stat(paths.log))
    except (OSError, ValueError):
        to_log = True
    if to_log:
        handlers.append(logging.FileHandler(paths.log, mode='w', encoding='utf-8'))
    for handler in handlers:
        handler.setFormatter(formatter)
    logging.basicConfig(level=logging.INFO, handlers=handlers)
    # requests.log has every request; the access log would repeat it.
    logging.getLogger('aiohttp.access').setLevel(logging.WARNING)


def cmd_up(args):
    try:
        options = options_from(args)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    paths = RunPaths(options.run_dir)
    state = read_state(paths)
    if lab_running(state):
        return reuse_running(args, options, state)
    if args.detach:
        return detach(args, options, paths)
    setup_logging(paths)
    world = World(options)

    def ready():
        print(summary(world.state()), flush=True)
    try:
        asyncio.run(world.run(on_ready=ready))
    except LabError as exc:
        raise CliError(str(exc)) from None
    return 0


def worlds_of(extensions):
    """(kubernetes, flux) of a lab with these extensions: 'upstream' or 'lab' each (--kubernetes, --flux)."""
    return ('upstream' if 'lab.k8s_upstream' in extensions else 'lab',
            'upstream' if 'lab.flux_upstream' in extensions else 'lab')


def reuse_running(args, options, state):
    where = '%s (pid %d, net %s)' % (options.run_dir, state['pid'], state['net'])
    if not args.reuse:
        raise CliError('a lab is already running in %s; stop it with `python -m lab down --run-dir %s`, or pass --reuse'
                       % (where, options.run_dir))
    wanted = {'net': str(Net(options.net)), 'control_planes': options.control_planes, 'workers': options.workers,
              'pve_major': options.pve_major, 'kubernetes': worlds_of(options.extensions)[0],
              'flux': worlds_of(options.extensions)[1]}
    running = dict(state, pve_major=state.get('pve_major', 9))
    running['kubernetes'], running['flux'] = worlds_of(state.get('extensions') or [])
    different = ['%s %s (asked for %s)' % (k, running.get(k), v) for k, v in wanted.items() if running.get(k) != v]
    if different:
        raise CliError('a lab is running in %s with %s; stop it first with `python -m lab down --run-dir %s`'
                       % (where, ', '.join(different), options.run_dir))
    problems = endpoint_problems(state)
    if problems:
        raise CliError('the lab in %s is not healthy: %s; stop it with `python -m lab down --run-dir %s`'
                       % (where, '; '.join(problems), options.run_dir))
    print('reusing the running lab')
    print(summary(state))
    return 0


def detach(args, options, paths):
    os.makedirs(paths.run_dir, exist_ok=True)
    command = [sys.executable, '-m', 'lab', 'up', '--net', options.net, '--run-dir', paths.run_dir,
               '--control-planes', str(options.control_planes), '--workers', str(options.workers),
               '--profile', options.profile, '--time-scale', repr(options.time_scale),
               '--pve-nodes', ','.join(options.pve_nodes), '--pve-major', str(options.pve_major),
               '--extensions', ','.join(options.extensions) or 'none',
               # the child must not read another Kubernetes from its environment than the one resolved here
               '--kubernetes', 'upstream' if 'lab.k8s_upstream' in options.extensions else 'lab']
    if 'lab.k8s_upstream' in options.extensions:
        command += ['--flux', 'upstream' if 'lab.flux_upstream' in options.extensions else 'lab']
    if options.seed is not None:
        command += ['--seed', str(options.seed)]
    if options.owner_pid is not None:
        command += ['--owner-pid', str(options.owner_pid)]
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    with open(paths.log, 'w', encoding='utf-8') as log:
        process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log,  # pylint: disable=consider-using-with
                                   stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def probe():
        code = process.poll()
        if code is not None:
            raise LabExited(code)
        state = read_state(paths)
        if state is None or state.get('pid') != process.pid:
            return False, 'state.json not written yet'
        problems = endpoint_problems(state)
        return (False, '; '.join(problems)) if problems else (True, state)
    try:
        result = _wait.wait_for(probe, args.start_timeout, interval=0.05, backoff=1.5, max_interval=1.0)
    except LabExited as exc:
        raise CliError('%s while starting; last lines of %s:\n%s' % (exc, paths.log, log_tail(paths.log))) from None
    if not result.ok:
        stop_process(process.pid)
        raise CliError('the lab did not come up within %.0f s (last seen: %s); last lines of %s:\n%s'
                       % (args.start_timeout, result.observation, paths.log, log_tail(paths.log)))
    print(summary(result.observation))
    return 0


def stop_process(pid):
    """SIGTERM, then SIGKILL after KILL_TIMEOUT; only for a lab process. Returns True when it is gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not process_alive(pid):
            return True
        if not is_lab_process(pid):
            return False
        os.kill(pid, sig)
        if wait_gone(pid, KILL_TIMEOUT):
            return True
    return not process_alive(pid)


def cmd_down(args):
    paths = RunPaths(args.run_dir)
    state = read_state(paths)
    pid = state.get('pid') if lab_running(state) else None
    asked = False
    try:
        answer = call(paths.control, 'shutdown', timeout=10)
        pid = answer.get('pid', pid)
        asked = True
    except LabNotRunning:
        pass
    except ControlError as exc:
        print('the lab did not take the shutdown request (%s); stopping it by signal' % exc, file=sys.stderr)
    if pid is None:
        for path in (paths.control, paths.state):
            if os.path.exists(path):
                os.unlink(path)
        print('no lab running in %s' % paths.run_dir)
        return 0
    if asked and not is_lab_process(pid):
        # A World run inside another process (lab.testing.world_in_thread): it stops, its process stays.
        print('asked the lab in %s to stop (it runs inside process %d)' % (paths.run_dir, pid))
        return 0
    if not (asked and wait_gone(pid, args.timeout)):
        if not stop_process(pid):
            raise CliError('the lab (pid %d) in %s did not stop' % (pid, paths.run_dir))
    for path in (paths.control, paths.state):
        if os.path.exists(path):
            os.unlink(path)
    print('lab stopped (pid %d, run dir %s)' % (pid, paths.run_dir))
    return 0


# ------------------------------------------------------------------------------ inspect

def control(args, op, **params):
    paths = RunPaths(args.run_dir)
    try:
        return call(paths.control, op, **params)
    except LabNotRunning:
        raise CliError('no lab running in %s (start one with `python -m lab up --detach`)' % paths.run_dir) from None
    except ControlError as exc:
        raise CliError(str(exc)) from None


def _cell(value):
    if value is None:
        return '-'
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(',', ':'), default=str)
    return str(value)


def table(rows, indent='  '):
    """A list of flat dicts as an aligned text table."""
    if not rows:
        return indent + '(none)'
    columns = []
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(key)
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = [indent + '  '.join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += [indent + '  '.join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    return '\n'.join(lines)


def _rows(value):
    """A non-empty list of dicts: shown as a table."""
    return isinstance(value, list) and value and all(isinstance(x, dict) for x in value)


def render_section(data, indent='  '):
    """Another simulation's status section, whatever its shape. A dict holding dicts or lists of dicts (the upstream
    control plane's and Flux's processes per cluster) is shown a level further in; a flat dict stays on one line."""
    if isinstance(data, list) and all(isinstance(x, dict) for x in data):
        return table(data, indent)
    if isinstance(data, dict):
        lines = []
        for key, value in data.items():
            if _rows(value):
                lines += ['%s%s:' % (indent, key), table(value, indent + '  ')]
            elif isinstance(value, dict) and any(isinstance(v, dict) or _rows(v) for v in value.values()):
                lines += ['%s%s:' % (indent, key), render_section(value, indent + '  ')]
            else:
                lines.append('%s%s: %s' % (indent, key, _cell(value)))
        return '\n'.join(lines) if lines else indent + '(empty)'
    return indent + _cell(data)


def render_status(status):
    lab, pve = status['lab'], status['pve']
    lines = ['lab %s: pid %d, up %ss, profile %s, time scale %s, run dir %s'
             % (lab['net'], lab['pid'], lab['uptime'], lab['profile'], lab['time_scale'], lab['run_dir']),
             'PVE %s: nodes %s' % (pve['url'], ', '.join(
                 '%s (%s)' % (n['name'], 'online' if n['online'] else 'OFFLINE') for n in pve['nodes'])),
             'endpoints: ' + (', '.join('%s %s:%s' % (e['name'], e['host'], e['port']) for e in lab['endpoints'])
                              or 'none'),
             'VMs:', table([dict((k, v) for k, v in vm.items() if k != 'mac') for vm in pve['vms']])]
    faults = lab['faults']
    lines.append('faults: ' + ('none' if not faults else ', '.join(
        f['name'] + (' ' + f['target'] if f['target'] else '') for f in faults)))
    for name, data in status.items():
        if name not in ('lab', 'pve'):
            lines += ['%s:' % name, render_section(data)]
    return '\n'.join(lines)


def cmd_status(args):
    status = control(args, 'status')
    print(json.dumps(status, indent=2, default=str) if args.json else render_status(status))
    return 0


def cmd_faults(args):
    faults = control(args, 'faults')
    if args.json:
        print(json.dumps(faults, indent=2, default=str))
        return 0
    for fault in faults:
        print(fault['usage'])
        print('    ' + fault['description'])
        for param in fault['params']:
            print('    %s (%s, default %s): %s' % (param['name'], param['type'], _cell(param['default']), param['help']))
        for active in fault['active']:
            print('    ACTIVE%s %s' % (' on ' + active['target'] if active['target'] else '', _cell(active['params'])))
    return 0


def parse_fault_words(name, words):
    target = None
    params = {}
    for word in words:
        key, sep, value = word.partition('=')
        if sep:
            if not key:
                raise CliError('fault %s: %r is not key=value' % (name, word))
            params[key] = value
        elif target is None:
            target = word
        else:
            raise CliError('fault %s: one target only, got %r and %r (parameters are key=value)' % (name, target, word))
    return target, params


def cmd_fault(args):
    target, params = parse_fault_words(args.name, args.words)
    record = control(args, 'fault', name=args.name, target=target, params=params)
    shown = ', '.join('%s=%s' % (k, v) for k, v in record['params'].items() if v is not None)
    print('fault %s%s active%s' % (record['name'], ' on ' + record['target'] if record['target'] else '',
                                   ' (%s)' % shown if shown else ''))
    return 0


def cmd_clear(args):
    cleared = control(args, 'clear', name=args.name, target=args.target)
    if not cleared:
        print('no active fault matched; nothing to clear')
    for record in cleared:
        print('cleared %s%s' % (record['name'], ' on ' + record['target'] if record['target'] else ''))
    return 0


def cmd_reset(args):
    result = control(args, 'reset', storage=not args.keep_storage)
    print('lab reset: %d VMs removed, %d faults cleared%s' % (
        len(result['vms_removed']), len(result['faults_cleared']), ', storages emptied' if result['storage_emptied'] else ''))
    return 0


def cmd_delays(args):
    records = control(args, 'delays', since=args.since, kind=args.kind)
    print(json.dumps(records, indent=2) if args.json else table(records, ''))
    return 0


def cmd_requests(args):
    entries = control(args, 'requests', since=args.since, source=args.source, limit=args.limit)
    if args.json:
        print(json.dumps(entries, indent=2))
    else:
        for entry in entries:
            print('%6d %s %-5s %-6s %s %s' % (
                entry['seq'], entry['time'], entry['source'], entry['method'], entry['status'], entry['path']))
    return 0


def cmd_events(args):
    print(table(control(args, 'events', since=args.since), ''))
    return 0


# ------------------------------------------------------------------------------ parser

def build_parser():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument('--run-dir', default=DEFAULT_RUN_DIR,
                        help='the lab\'s folder: state.json, control.sock, certificates, logs, hosts.yml '
                             '(default: lab/run in the checkout)')
    parser = argparse.ArgumentParser(prog='python -m lab', description='The simulated Proxmox + Talos + Kubernetes lab.')
    sub = parser.add_subparsers(dest='command', required=True, metavar='COMMAND')

    up = sub.add_parser('up', parents=[common], help='start a lab')
    up.add_argument('--control-planes', type=int, default=3, help='planned control planes (static addresses .11 up)')
    up.add_argument('--workers', type=int, default=3, help='planned workers (DHCP addresses .100 up)')
    up.add_argument('--time-scale', type=float, default=0.0,
                    help='real seconds per simulated second: 0 makes every delay instant (default 0)')
    up.add_argument('--profile', choices=PROFILES, default='realistic', help='delay profile (default realistic)')
    up.add_argument('--net', default='127.0.10', help='first three octets of the lab\'s loopback /24 (default 127.0.10)')
    up.add_argument('--pve-nodes', default='pve1', help='comma-separated PVE node names (default pve1)')
    up.add_argument('--pve-major', type=int, default=9, choices=(8, 9),
                    help='the PVE release the lab answers as: 9 (default) or 8 (privileges, guest agent, version)')
    up.add_argument('--seed', type=int, default=None, help='seed for the random delays and faults')
    up.add_argument('--extensions', default=None,
                    help='simulations to load: comma-separated (talos, k8s_upstream, flux_upstream, ...; k8s and '
                         'k8s_upstream stand for the Kubernetes --kubernetes chooses) or "none" (default: those of '
                         '--kubernetes and --flux)')
    up.add_argument('--kubernetes', choices=('lab', 'upstream'), default=None,
                    help='the lab\'s Kubernetes: upstream (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, '
                         'kwok; docs/lab-kubernetes.md) or lab (the hand-written lab/k8s, being retired; with the Flux '
                         'simulation); default $PROXTALOS_LAB_KUBERNETES, else upstream')
    up.add_argument('--flux', choices=('lab', 'upstream'), default=None,
                    help='upstream (Flux\'s controllers and the sealed-secrets controller as processes besides the lab\'s '
                         'Git server and artifact mirror; docs/lab-flux.md; needs --kubernetes upstream) or lab (on '
                         'upstream Kubernetes: no Flux controller, the Git server and artifact mirror only, '
                         'lab/flux_sources.py; on lab/k8s: the Flux simulation); default $PROXTALOS_LAB_FLUX, else '
                         'upstream on upstream Kubernetes and lab on lab/k8s')
    up.add_argument('--owner-pid', type=int, default=None,
                    help='stop the lab when this process ends (test sessions pass their own pid)')
    up.add_argument('--detach', action='store_true', help='run in the background; return once every listener answers')
    up.add_argument('--reuse', action='store_true',
                    help='if a healthy lab with the same net, node counts and PVE major runs in the run dir, use it')
    up.add_argument('--start-timeout', type=float, default=START_TIMEOUT, help='seconds --detach waits (default 60)')
    up.set_defaults(func=cmd_up)

    down = sub.add_parser('down', parents=[common], help='stop the lab')
    down.add_argument('--timeout', type=float, default=STOP_TIMEOUT, help='seconds to wait before killing it')
    down.set_defaults(func=cmd_down)

    status = sub.add_parser('status', parents=[common], help='VMs, addresses, nodes, faults')
    status.add_argument('--json', action='store_true')
    status.set_defaults(func=cmd_status)

    faults = sub.add_parser('faults', parents=[common], help='list the faults the lab can inject')
    faults.add_argument('--json', action='store_true')
    faults.set_defaults(func=cmd_faults)

    fault = sub.add_parser('fault', parents=[common], help='inject a fault: fault NAME [TARGET] [key=value ...]')
    fault.add_argument('name')
    fault.add_argument('words', nargs='*', metavar='TARGET|key=value')
    fault.set_defaults(func=cmd_fault)

    clear = sub.add_parser('clear', parents=[common], help='clear faults: all, one NAME, or NAME TARGET')
    clear.add_argument('name', nargs='?')
    clear.add_argument('target', nargs='?')
    clear.set_defaults(func=cmd_clear)

    reset = sub.add_parser('reset', parents=[common], help='delete every VM and clear every fault')
    reset.add_argument('--keep-storage', action='store_true', help='keep files on the storages (images, ISOs)')
    reset.set_defaults(func=cmd_reset)

    delays = sub.add_parser('delays', parents=[common], help='the delays the lab imposed')
    delays.add_argument('--since', type=int, default=0)
    delays.add_argument('--kind')
    delays.add_argument('--json', action='store_true')
    delays.set_defaults(func=cmd_delays)

    requests = sub.add_parser('requests', parents=[common], help='the requests the lab received')
    requests.add_argument('--since', type=int, default=0)
    requests.add_argument('--source')
    requests.add_argument('--limit', type=int, default=100)
    requests.add_argument('--json', action='store_true')
    requests.set_defaults(func=cmd_requests)

    events = sub.add_parser('events', parents=[common], help='VM power events')
    events.add_argument('--since', type=int, default=0)
    events.set_defaults(func=cmd_events)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CliError as exc:
        print('lab: %s' % exc, file=sys.stderr)
        return 1
