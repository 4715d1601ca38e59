"""python -m bench [NAME ...] [--list] [--time-scale S] [--no-write]"""

import argparse
import datetime
import sys

from bench.common import discover, markdown, write_results


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m bench', description='Benchmarks against the lab.')
    parser.add_argument('names', nargs='*', help='benchmarks to run (default: all)')
    parser.add_argument('--list', action='store_true', help='list the benchmarks and exit')
    parser.add_argument('--time-scale', type=float, default=None,
                        help='lab time scale (real seconds per simulated second); each benchmark has its default')
    parser.add_argument('--no-write', action='store_true', help='do not write bench/results/<date>.json')
    options = parser.parse_args(argv)
    benchmarks = discover()
    if options.list:
        for name, benchmark in benchmarks.items():
            print('%-20s %s' % (name, benchmark.title))
        return 0
    unknown = [n for n in options.names if n not in benchmarks]
    if unknown:
        parser.error('unknown benchmark(s) %s; known: %s' % (', '.join(unknown), ', '.join(benchmarks)))
    selected = [benchmarks[n] for n in (options.names or list(benchmarks))]
    entries = {}
    for benchmark in selected:
        print('== %s: %s' % (benchmark.name, benchmark.title), flush=True)
        started = datetime.datetime.now(datetime.timezone.utc)
        metrics = benchmark.run(options)
        entries[benchmark.name] = {'title': benchmark.title, 'description': benchmark.description,
                                   'started': started.isoformat(timespec='seconds'),
                                   'metrics': [m.as_dict() for m in metrics]}
    print()
    print(markdown(entries))
    if not options.no_write:
        print('\nwritten to %s' % write_results(entries))
    return 0


if __name__ == '__main__':
    sys.exit(main())
