"""python -m bench [NAME ...] [--only P1,P3] [--list] [--scale S] [--p2-workers 21,93] [--kubernetes lab|upstream]
[--flux lab|upstream] [--no-write]"""

import argparse
import datetime
import sys
import traceback

from bench.common import Metric, choose_world, discover, expected_world, load_average, markdown, world_tag, write_results


def _workers(text):
    try:
        values = tuple(int(x) for x in text.split(',') if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError('--p2-workers: comma-separated worker counts, got %r' % text) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError('--p2-workers: at least one worker count, each 1 or more, got %r' % text)
    return values


def select(benchmarks, names, only):
    """Benchmarks by full name (p1_bootstrap_ratio) or short name (P1, p1); all when none are named."""
    wanted = list(names) + [n.strip() for n in (only or '').split(',') if n.strip()]
    if not wanted:
        return list(benchmarks.values()), []
    chosen, unknown = [], []
    for name in wanted:
        match = [b for full, b in benchmarks.items() if full == name or full.split('_')[0] == name.lower()]
        if not match:
            unknown.append(name)
        for benchmark in match:
            if benchmark not in chosen:
                chosen.append(benchmark)
    order = list(benchmarks.values())
    return sorted(chosen, key=order.index), unknown


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m bench', description='Benchmarks against the lab.')
    parser.add_argument('names', nargs='*', help='benchmarks to run, by name or short name (P1 ...); default: all')
    parser.add_argument('--only', help='comma-separated benchmarks to run, e.g. P1,P3 (same as naming them)')
    parser.add_argument('--list', action='store_true', help='list the benchmarks and exit')
    parser.add_argument('--scale', '--time-scale', dest='time_scale', type=float, default=None,
                        help='lab time scale (real seconds per simulated second); each benchmark has its default '
                             '(P1, P2, P4, P6: 0.5; P3: always 0; P5: 1.0)')
    parser.add_argument('--p2-workers', type=_workers, default=None,
                        help='worker counts of P2 (and the largest for P6), with 3 control planes; default 21,93')
    parser.add_argument('--kubernetes', choices=('lab', 'upstream'), default=None,
                        help='the labs\' Kubernetes (python -m lab up --kubernetes); default: the lab\'s choice '
                             '($PROXTALOS_LAB_KUBERNETES, else its default)')
    parser.add_argument('--flux', choices=('lab', 'upstream'), default=None,
                        help='the labs\' Flux (python -m lab up --flux; upstream needs upstream Kubernetes); default: the '
                             'lab\'s choice ($PROXTALOS_LAB_FLUX, else its default)')
    parser.add_argument('--no-write', action='store_true', help='do not write bench/results/<date>.json')
    options = parser.parse_args(argv)
    if options.time_scale is not None and options.time_scale < 0:
        parser.error('--scale must be zero or more, got %s' % options.time_scale)
    choose_world(options.kubernetes, options.flux)
    try:
        world = expected_world()
    except ValueError as exc:
        parser.error(str(exc))
    benchmarks = discover()
    if options.list:
        for name, benchmark in benchmarks.items():
            print('%-20s %s' % (name, benchmark.title))
        return 0
    selected, unknown = select(benchmarks, options.names, options.only)
    if unknown:
        parser.error('unknown benchmark(s) %s; known: %s' % (', '.join(unknown), ', '.join(benchmarks)))
    entries = {}
    failed = False
    print('world: Kubernetes %s, Flux %s' % (world['kubernetes'], world['flux']), flush=True)
    for benchmark in selected:
        print('== %s: %s' % (benchmark.name, benchmark.title), flush=True)
        started = datetime.datetime.now(datetime.timezone.utc)
        load = load_average()
        try:
            metrics = benchmark.run(options)
        except Exception as exc:  # pylint: disable=broad-except
            failed = True
            traceback.print_exc()
            metrics = [Metric('failed', None, detail={'error': '%s: %s' % (exc.__class__.__name__, exc)})]
        entries[benchmark.name] = {'title': benchmark.title, 'description': benchmark.description,
                                   'started': started.isoformat(timespec='seconds'),
                                   'finished': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
                                   'load_average_at_start': load, 'world': world,
                                   'metrics': [m.as_dict() for m in metrics]}
        if not options.no_write:   # after each benchmark: a later one that is stopped loses only its own results
            path = write_results({benchmark.name: entries[benchmark.name]}, world)
    print()
    print('world %s' % world_tag(world))
    print(markdown(entries))
    if not options.no_write and entries:
        print('\nwritten to %s' % path)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
