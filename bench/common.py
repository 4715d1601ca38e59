"""What every benchmark shares: the Benchmark and Metric records, discovery, labs, results."""

import datetime
import importlib
import json
import os
import pkgutil
import platform
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, 'bench', 'results')


class Metric(object):
    """One measured value: name, value, unit, and optionally the goal and whether it was met."""

    def __init__(self, name, value, unit='', goal=None, met=None, detail=None):
        self.name = name
        self.value = value
        self.unit = unit
        self.goal = goal
        self.met = met
        self.detail = detail or {}

    def as_dict(self):
        return {'name': self.name, 'value': self.value, 'unit': self.unit, 'goal': self.goal, 'met': self.met,
                'detail': self.detail}


class Benchmark(object):
    """A benchmark: run(options) -> [Metric]. options is the argparse namespace of `python -m bench`."""

    def __init__(self, name, title, description, run):
        self.name = name
        self.title = title
        self.description = description
        self.run = run


def discover():
    """Every BENCHMARK in the bench package, by name, in module order."""
    found = {}
    package_dir = os.path.dirname(os.path.abspath(__file__))
    for info in sorted(pkgutil.iter_modules([package_dir]), key=lambda m: m.name):
        if info.name in ('common', '__main__'):
            continue
        module = importlib.import_module('bench.' + info.name)
        benchmark = getattr(module, 'BENCHMARK', None)
        if isinstance(benchmark, Benchmark):
            found[benchmark.name] = benchmark
    return found


class Stopwatch(object):
    """Wall time of a block, on the monotonic clock."""

    def __enter__(self):
        self.start = time.monotonic()
        self.seconds = None
        return self

    def __exit__(self, *exc):
        self.seconds = time.monotonic() - self.start
        return False


def start_lab(control_planes, workers, time_scale, profile='realistic', seed=1):
    """A lab of its own (free net, temporary run dir) for one measurement; stop it with .stop()."""
    from lab.testing import start_lab as start  # pylint: disable=import-outside-toplevel
    run_dir = tempfile.mkdtemp(prefix='bench-lab-')
    return start(run_dir, control_planes=control_planes, workers=workers, time_scale=time_scale, profile=profile,
                 seed=seed)


def machine():
    """What the numbers were measured on."""
    return {'python': platform.python_version(), 'cpus': os.cpu_count(), 'platform': platform.platform()}


def write_results(entries, when=None):
    """Merge this run's entries into bench/results/<date>.json (same benchmark names are replaced)."""
    when = when or datetime.datetime.now(datetime.timezone.utc)
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, '%s.json' % when.strftime('%Y-%m-%d'))
    document = {'date': when.strftime('%Y-%m-%d'), 'machine': machine(), 'benchmarks': {}}
    if os.path.exists(path):
        with open(path, encoding='utf-8') as handle:
            document = json.load(handle)
    document['machine'] = machine()
    document['benchmarks'].update(entries)
    tmp = path + '.tmp'
    with open(tmp, 'w', encoding='utf-8') as handle:
        json.dump(document, handle, indent=2, sort_keys=True)
        handle.write('\n')
    os.replace(tmp, path)
    return path


def markdown(entries):
    """The results as a Markdown table."""
    lines = ['| benchmark | metric | value | goal | met |', '|---|---|---|---|---|']
    for name, entry in entries.items():
        for metric in entry['metrics']:
            value = metric['value']
            shown = ('%.2f' % value if isinstance(value, float) else str(value)) + (
                ' %s' % metric['unit'] if metric['unit'] else '')
            met = '' if metric['met'] is None else ('yes' if metric['met'] else 'no')
            lines.append('| %s | %s | %s | %s | %s |' % (name, metric['name'], shown, metric['goal'] or '', met))
    return '\n'.join(lines)
