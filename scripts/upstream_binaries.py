"""Build the upstream components declared in upstream/*.json into the per-machine cache (lab/upstream.py).

A warm run only checks that each binary is there. A component is built into a temporary directory
beside its cache entry and renamed into place, so an interrupted build leaves nothing half-written.
"""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab import upstream  # noqa: E402  pylint: disable=wrong-import-position

GO_FLAGS = ['-trimpath', '-ldflags=-s -w']


def build_go_source(spec, target):
    source = upstream.ROOT / spec['go_source']
    env = dict(os.environ, CGO_ENABLED='0', GOFLAGS='-mod=readonly')
    subprocess.run(['go', 'build'] + GO_FLAGS + ['-o', str(target), '.'], cwd=source, env=env, check=True)


def ensure(spec):
    path = upstream.binary_path(spec)
    label = '%s %s' % (spec['name'], spec['version'])
    if path.is_file():
        print('%s: cached (%s)' % (label, path), flush=True)
        return
    if shutil.which('go') is None:
        sys.exit('%s: building it needs Go (the `go` command) on PATH' % label)
    if 'go_source' not in spec:
        sys.exit('%s: this setup script builds go_source components only' % label)
    print('%s: building from %s with the Go module proxy ...' % (label, spec['go_source']), flush=True)
    started = time.monotonic()
    path.parent.parent.mkdir(parents=True, exist_ok=True)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix='.building-', dir=path.parent.parent))
    try:
        build_go_source(spec, scratch / spec['name'])
        try:
            scratch.rename(path.parent)
        except OSError:
            if not path.is_file():  # another setup won the race when the entry now exists
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print('%s: done in %.0f s' % (label, time.monotonic() - started), flush=True)


def main():
    for spec in upstream.components().values():
        ensure(spec)
    return 0


if __name__ == '__main__':
    sys.exit(main())
