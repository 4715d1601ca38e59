"""The pinned upstream artifacts the collection installs (roles/flux/vars/artifacts.yml), in the per-machine cache.

The lab's artifact mirror (lab/artifact_mirror.py) serves them as its "internet". `make setup`
(scripts/upstream_binaries.py) fills the cache from the upstream Go modules: for each module the pins
name, `go mod download -json MODULE@VERSION` gets the module zip from the Go module proxy (the go
command checks it against sum.golang.org); this module checks the zip's h1: hash once more against the
pin's module_sum, then takes each pinned file out of the zip and checks its sha256 against the pin.
Nothing that fails a check is written. Layout, the same as a raw-file host's:

    <cache>/artifacts/<repo>/<ref>/<path>

The h1: hash is Go's dirhash.Hash1 (golang.org/x/mod sumdb/dirhash/hash.go, Hash1): the sha256 of the
lines "<sha256 hex of the file>  <name in the zip>\\n", sorted by name, base64-encoded.
"""

import base64
import hashlib
import json
import os
import pathlib
import subprocess
import tempfile
import zipfile

import yaml

from lab import upstream

ROOT = pathlib.Path(__file__).resolve().parent.parent
PINS_FILE = ROOT / 'roles' / 'flux' / 'vars' / 'artifacts.yml'


class ArtifactError(Exception):
    """A pinned artifact cannot be had, or its bytes are not the pinned ones."""


def pins(path=PINS_FILE):
    """{set name: {version, files: [...], ...}} as the role reads it."""
    with open(path, encoding='utf-8') as handle:
        data = yaml.safe_load(handle)
    return data['flux_artifact_pins']


def files(path=PINS_FILE):
    """Every pinned file once (the same repo, ref and path may be in several sets)."""
    seen = {}
    for artifact_set in pins(path).values():
        for entry in artifact_set['files']:
            seen.setdefault((entry['repo'], entry['ref'], entry['path']), entry)
    return list(seen.values())


def cache_dir():
    return upstream.cache_root() / 'artifacts'


def cached_path(entry, base=None):
    return (base or cache_dir()) / entry['repo'] / entry['ref'] / entry['path']


def url_path(entry):
    """The path part of the file's URL below a mirror's base URL (the raw-file host's layout)."""
    return '/%s/%s/%s' % (entry['repo'], entry['ref'], entry['path'])


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, 'rb') as handle:
        for block in iter(lambda: handle.read(1 << 16), b''):
            digest.update(block)
    return digest.hexdigest()


def module_h1(zip_path):
    """The go.sum h1: hash of a module zip (dirhash.Hash1 over the zip's files)."""
    lines = []
    with zipfile.ZipFile(zip_path) as archive:
        for name in sorted(archive.namelist()):
            lines.append('%s  %s\n' % (hashlib.sha256(archive.read(name)).hexdigest(), name))
    return 'h1:' + base64.b64encode(hashlib.sha256(''.join(lines).encode()).digest()).decode()


def missing(base=None):
    """The pinned files not in the cache, or there with other bytes."""
    out = []
    for entry in files():
        path = cached_path(entry, base)
        if not path.is_file() or sha256_file(path) != entry['sha256']:
            out.append(entry)
    return out


def _module_zip(module, version, go, env):
    """The module zip's path, from `go mod download -json` (its JSON names the zip even when the go command then
    complains about the module's go.mod, as for a module that needs a newer Go)."""
    result = subprocess.run([go, 'mod', 'download', '-json', '%s@%s' % (module, version)], capture_output=True,
                            text=True, env=env, timeout=600, check=False)
    try:
        info = json.loads(result.stdout)
    except ValueError:
        raise ArtifactError('go mod download %s@%s: %s' % (module, version, (result.stderr or result.stdout).strip()[:500])) from None
    if not info.get('Zip') or not os.path.isfile(info['Zip']):
        raise ArtifactError('go mod download %s@%s: no module zip (%s)' % (module, version, info.get('Error') or 'no error given'))
    return info['Zip']


def fill(go, env, say=print, base=None):
    """Put every pinned file that is missing into the cache; returns how many were written."""
    wanted = missing(base)
    modules = {}
    for entry in wanted:
        modules.setdefault((entry['module'], entry['module_version'], entry['module_sum']), []).append(entry)
    written = 0
    for (module, version, module_sum), entries in sorted(modules.items()):
        zip_path = _module_zip(module, version, go, env)
        actual = module_h1(zip_path)
        if actual != module_sum:
            raise ArtifactError('module %s@%s: zip %s has hash %s, the pins say %s' % (module, version, zip_path, actual, module_sum))
        with zipfile.ZipFile(zip_path) as archive:
            for entry in entries:
                member = '%s@%s/%s' % (module, version, entry['path'])
                try:
                    data = archive.read(member)
                except KeyError:
                    raise ArtifactError('module %s@%s has no file %s (pinned as %s/%s)'
                                        % (module, version, entry['path'], entry['repo'], entry['ref'])) from None
                digest = hashlib.sha256(data).hexdigest()
                if digest != entry['sha256']:
                    raise ArtifactError('artifact %s/%s/%s: sha256 %s, the pins say %s'
                                        % (entry['repo'], entry['ref'], entry['path'], digest, entry['sha256']))
                target = cached_path(entry, base)
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix='.tmp-', dir=str(target.parent))
                with os.fdopen(fd, 'wb') as handle:
                    handle.write(data)
                os.chmod(tmp, 0o644)
                os.replace(tmp, target)
                written += 1
        say('artifacts: %d file(s) of %s@%s' % (len(entries), module, version))
    return written
