"""Where the upstream binaries built by `make setup` (scripts/upstream_binaries.py) are.

Each component is declared by one JSON file in upstream/ at the repository root; the binaries live in a
per-machine cache outside the work tree:
    ${PROXTALOS_CACHE:-${XDG_CACHE_HOME:-~/.cache}/proxtalos}/bin/<name>/<version>[-<source hash>]/<name>
A component built from Go source kept in this repository (`go_source`) has the sha256 of its files in
the key, so an edit of the source is a new key.
"""

import hashlib
import json
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
DECLARATIONS = ROOT / 'upstream'


class MissingBinary(Exception):
    """A component's binary is not in the cache."""


def cache_root():
    base = os.environ.get('PROXTALOS_CACHE')
    if base:
        return pathlib.Path(base)
    xdg = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return pathlib.Path(xdg) / 'proxtalos'


def components():
    """Every declared component, by name."""
    found = {}
    for path in sorted(DECLARATIONS.glob('*.json')):
        with open(path, encoding='utf-8') as stream:
            spec = json.load(stream)
        found[spec['name']] = spec
    return found


def source_hash(directory):
    """sha256 over a go_source directory's Go files, go.mod and go.sum (names and contents), 12 hex digits."""
    digest = hashlib.sha256()
    base = ROOT / directory
    for path in sorted(p for p in base.rglob('*') if p.is_file() and (p.suffix == '.go' or p.name in ('go.mod', 'go.sum'))):
        digest.update(str(path.relative_to(base)).encode('utf-8') + b'\0')
        digest.update(path.read_bytes() + b'\0')
    return digest.hexdigest()[:12]


def binary_path(spec):
    """Where a component's binary is (or will be) in the cache."""
    key = spec['version']
    if 'go_source' in spec:
        key += '-' + source_hash(spec['go_source'])
    return cache_root() / 'bin' / spec['name'] / key / spec['name']


def binary(name):
    """The path of a built component's binary; MissingBinary (saying to run make setup) when it is absent."""
    spec = components().get(name)
    if spec is None:
        raise MissingBinary('%s: no upstream/%s.json declares it' % (name, name))
    path = binary_path(spec)
    if not path.is_file():
        raise MissingBinary('%s %s is not built (%s is missing): run `make setup`' % (name, spec['version'], path))
    return str(path)
