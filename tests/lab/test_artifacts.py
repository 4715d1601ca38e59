"""lab/artifacts.py: the lab's artifact cache is filled only with the pinned bytes. A module zip whose go.sum h1: hash
is not the pinned module_sum, or a file whose sha256 is not its pin, is refused naming what differs; the h1: hash is
the go command's (checked on the real module zips the pins name)."""

import json
import os
import stat
import zipfile

import pytest

from lab import artifacts


def fake_go(tmp_path, zips):
    """A `go` that answers `go mod download -json MODULE@VERSION` with the zip given for that module."""
    script = tmp_path / 'go'
    table = tmp_path / 'zips.json'
    table.write_text(json.dumps(zips))
    script.write_text('#!/usr/bin/env python3\nimport json, sys\nzips = json.load(open(%r))\nmodule, version = sys.argv[-1].split("@")\n'
                      'print(json.dumps({"Path": module, "Version": version, "Zip": zips[module]}))\n' % str(table))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def module_zip(path, module, version, files):
    with zipfile.ZipFile(path, 'w') as archive:
        for name, data in files.items():
            archive.writestr('%s@%s/%s' % (module, version, name), data)
    return str(path)


def pinned_modules():
    out = {}
    for entry in artifacts.files():
        out.setdefault(entry['module'], entry)
    return out


def test_the_h1_hash_is_the_go_commands_on_the_pinned_module_zips():
    for module, entry in pinned_modules().items():
        path = artifacts._module_zip(module, entry['module_version'], 'go', dict(os.environ, GOTOOLCHAIN='local'))  # pylint: disable=protected-access
        assert artifacts.module_h1(path) == entry['module_sum'], module


def test_a_zip_that_is_not_the_pinned_module_is_refused_and_nothing_is_written(tmp_path):
    zips = {}
    for module, entry in pinned_modules().items():
        files = {e['path']: b'x' for e in artifacts.files() if e['module'] == module}
        zips[module] = module_zip(tmp_path / (entry['repo'].replace('/', '_') + '.zip'), module, entry['module_version'], files)
    with pytest.raises(artifacts.ArtifactError, match=r'module .*: zip .* has hash h1:\S+, the pins say h1:'):
        artifacts.fill(fake_go(tmp_path, zips), dict(os.environ), say=lambda _m: None, base=tmp_path / 'cache')
    assert not (tmp_path / 'cache').exists()


def test_a_file_that_is_not_its_pin_is_refused_naming_it(tmp_path, monkeypatch):
    module, entry = next(iter(pinned_modules().items()))
    files = {e['path']: b'not upstream' for e in artifacts.files() if e['module'] == module}
    path = module_zip(tmp_path / 'm.zip', module, entry['module_version'], files)
    forged = artifacts.module_h1(path)
    real_files = artifacts.files
    monkeypatch.setattr(artifacts, 'files', lambda: [dict(e, module_sum=forged) for e in real_files() if e['module'] == module])
    with pytest.raises(artifacts.ArtifactError, match=r'artifact %s/%s/\S+: sha256 [0-9a-f]{64}, the pins say [0-9a-f]{64}'
                       % (entry['repo'], entry['ref'])):
        artifacts.fill(fake_go(tmp_path, {module: path}), dict(os.environ), say=lambda _m: None, base=tmp_path / 'cache')
