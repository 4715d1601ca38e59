"""Run one upstream control plane by hand: `python -m lab.k8s_upstream [--nodes 3] [--workdir DIR]`.

Starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok on 127.0.0.1, registers
--nodes kwok Nodes (node-1 ... with InternalIPs 127.0.0.11 ...), prints the admin kubeconfig and each
process's status, then runs until Ctrl-C or SIGTERM and stops everything (and, without --workdir, removes
its temporary directory). --once prints the status as JSON and stops at once (a smoke check).
"""

import argparse
import json
import signal
import sys
import tempfile

from lab.upstream import UpstreamError

from .controlplane import ControlPlane, ControlPlaneError


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m lab.k8s_upstream', description=__doc__.splitlines()[0])
    parser.add_argument('--workdir', help='certificates, etcd data and logs (default: a new temporary directory)')
    parser.add_argument('--nodes', type=int, default=3, help='kwok Nodes to register (default 3)')
    parser.add_argument('--once', action='store_true', help='print the status as JSON and stop')
    args = parser.parse_args(argv)
    if args.nodes < 0:
        parser.error('--nodes: must be 0 or more')
    plane = ControlPlane(args.workdir or tempfile.mkdtemp(prefix='lab-k8s-upstream-'))
    # SIGTERM and SIGINT are taken by sigwait below; blocked before anything starts, so neither is lost meanwhile
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        plane.start()
        for index in range(args.nodes):
            plane.register_node('node-%d' % (index + 1), addresses=['127.0.0.%d' % (11 + index)])
        status = plane.status()
        if args.once:
            print(json.dumps({'kubeconfig': plane.kubeconfig, 'api': plane.api_url, 'processes': status}, indent=2))
            return 0 if all(entry['healthy'] for entry in status) else 1
        print('kubeconfig: %s (export KUBECONFIG=%s)' % (plane.kubeconfig, plane.kubeconfig))
        for entry in status:
            health = 'healthy' if entry['healthy'] else 'UNHEALTHY'
            print('%-24s pid %-7d %-8s %s  restarts %d (last exit %s)  log %s'
                  % (entry['name'], entry['pid'], health, entry['health'], entry['restarts'], entry['last_exit'], entry['log']))
        print('running; Ctrl-C stops it', flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
        return 0
    except (ControlPlaneError, UpstreamError) as exc:
        print('error: %s' % exc, file=sys.stderr)
        return 1
    finally:
        if args.workdir:
            plane.stop()
        else:
            plane.remove()  # a temporary directory of its own: the keys and etcd data go with it


if __name__ == '__main__':
    sys.exit(main())
