"""Put the pinned upstream binaries the lab runs into the per-machine cache (`make setup` runs this).

Reads upstream/<name>.json (see lab/upstream.py and docs/lab-kubernetes.md). For each component
whose binary is not cached yet: the official release download when the spec has one (short
timeout, sha256 checked), else a build with Go: `go_module` in a scratch module from the Go module
proxy, `go_source` from the repository's own directory; a `chart` is copied out of its Go module, which
`go mod download` fetches from the proxy (sum.golang.org verifying it), after its hash is checked against
the pinned go.sum hash. Components built from the same module at
the same version with the same settings share one scratch module and one `go build`. A binary
appears in the cache only complete (built into a temporary directory, then renamed).

    python scripts/upstream_binaries.py [--only NAME[,NAME]] [--list]
    python scripts/upstream_binaries.py --artifacts

With no --only, it also puts the pinned upstream artifacts (roles/flux/vars/artifacts.yml) into the
cache, from the same Go module proxy, each checked against its pin (lab/artifacts.py); --artifacts does
only that.
"""
import argparse
import hashlib
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab import artifacts, upstream  # noqa: E402  pylint: disable=wrong-import-position

DOWNLOAD_TIMEOUT = float(os.environ.get('PROXTALOS_DOWNLOAD_TIMEOUT', '10'))
HEARTBEAT = 60  # seconds between "still building" lines
SCRATCH_MODULE = 'proxtalos.invalid/upstream-build'
BUILD_FLAGS = ['-trimpath']
BASE_LDFLAGS = ['-s', '-w']


class SetupError(Exception):
    """A component could not be put into the cache."""


def say(message):
    print(message, flush=True)


def _final_dir(spec):
    return str(upstream.binary_path(spec).parent)


def _install(spec, produce):
    """Run produce(tmpdir) -> path of the new binary inside tmpdir; move it into the cache atomically."""
    final = _final_dir(spec)
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix='.tmp-', dir=parent)
    try:
        produced = produce(staging)
        wanted = os.path.join(staging, spec['name'])
        if produced != wanted:
            os.replace(produced, wanted)
        os.chmod(wanted, 0o755)
        os.chmod(staging, 0o755)  # mkdtemp made it 0700; the cache is shared by the machine's users of it
        try:
            os.rename(staging, final)
        except OSError:
            # another setup run finished the same binary first: keep theirs
            if not os.access(os.path.join(final, spec['name']), os.X_OK):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# ---- download ---------------------------------------------------------------------------------

def _extract(payload, member, url):
    if not member:
        return payload
    if url.endswith('.zip'):
        with zipfile.ZipFile(io.BytesIO(payload)) as archive:
            return archive.read(member)
    with tarfile.open(fileobj=io.BytesIO(payload)) as archive:
        handle = archive.extractfile(member)
        if handle is None:
            raise SetupError('%s has no file member %s' % (url, member))
        return handle.read()


def try_download(spec):
    """True when the official release was downloaded and verified; False to fall back to a build."""
    download = spec['download']
    url = download['url']
    say('%s %s: downloading %s' % (spec['name'], spec['version'], url))
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT) as response:  # noqa: S310 (pinned https URL)
            payload = response.read()
    except OSError as exc:
        elapsed = time.monotonic() - started
        say('%s %s: download failed after %.1f s (%s); building instead' % (spec['name'], spec['version'], elapsed, exc))
        return False
    digest = hashlib.sha256(payload).hexdigest()
    if digest != download['sha256']:
        raise SetupError('%s: %s has sha256 %s, upstream/%s.json pins %s'
                         % (spec['name'], url, digest, spec['name'], download['sha256']))

    def produce(staging):
        target = os.path.join(staging, spec['name'])
        with open(target, 'wb') as handle:
            handle.write(_extract(payload, download.get('member'), url))
        return target

    _install(spec, produce)
    say('%s %s: downloaded in %.1f s' % (spec['name'], spec['version'], time.monotonic() - started))
    return True


# ---- go build ---------------------------------------------------------------------------------

def _go():
    go = shutil.which('go')
    if go is None:
        raise SetupError('Go (1.26 or later) is needed to build the upstream binaries; install it or put it on PATH')
    return go


def _go_env(module=None):
    """The build environment: CGO off unless asked, the installed Go (GOTOOLCHAIN=local) unless the go_module
    declaration names its toolchain (that build only), then the declaration's own env."""
    module = module or {}
    env = dict(os.environ)
    env.setdefault('CGO_ENABLED', '0')
    env['GOTOOLCHAIN'] = module.get('toolchain', 'local')
    env['GOFLAGS'] = (env.get('GOFLAGS', '') + ' -buildvcs=false').strip()
    env.update(module.get('env', {}))
    return env


def _run_go(args, cwd, label, module=None):
    """Run a go command, a heartbeat line every minute; SetupError with its output on failure."""
    started = time.monotonic()
    with tempfile.TemporaryFile(mode='w+') as log:
        proc = subprocess.Popen(args, cwd=cwd, env=_go_env(module), stdout=log, stderr=subprocess.STDOUT, text=True)
        while True:
            try:
                proc.wait(timeout=HEARTBEAT)
                break
            except subprocess.TimeoutExpired:
                say('%s: still running go %s (%d s)' % (label, args[1], time.monotonic() - started))
            except BaseException:
                proc.kill()
                proc.wait()
                raise
        if proc.returncode != 0:
            log.seek(0)
            raise SetupError('%s: `%s` failed (exit %d):\n%s' % (label, ' '.join(args), proc.returncode, log.read()[-6000:]))


def _binary_name(package):
    parts = package.rstrip('/').split('/')
    if len(parts) > 1 and re.match(r'^v[0-9]+$', parts[-1]):
        return parts[-2]
    return parts[-1]


def _group_key(spec):
    module = dict(spec['go_module'])
    module.pop('package')
    return json.dumps(module, sort_keys=True)


def build_go_module(specs):
    """Build the specs (same module, version and settings) in one scratch module with one `go build`."""
    first = specs[0]['go_module']
    names = ', '.join(spec['name'] for spec in specs)
    label = '%s (%s@%s)' % (names, first['module'], first['version'])
    say('%s: building from the Go module proxy' % label)
    started = time.monotonic()
    go = _go()
    with tempfile.TemporaryDirectory(prefix='proxtalos-build-') as scratch:
        lines = ['module %s' % SCRATCH_MODULE, '', 'go %s' % first.get('go', '1.26'), '',
                 'require %s %s' % (first['module'], first['version'])]
        replace = first.get('replace', {})
        if replace:
            lines += ['', 'replace (']
            lines += ['\t%s => %s' % (old, new) for old, new in sorted(replace.items())]
            lines += [')']
        pathlib.Path(scratch, 'go.mod').write_text('\n'.join(lines) + '\n', encoding='utf-8')
        # a blank import of every package makes `go mod tidy` record exactly what the build needs
        imports = ''.join('\t_ "%s"\n' % spec['go_module']['package'] for spec in specs)
        pathlib.Path(scratch, 'tools.go').write_text('//go:build tools\n\npackage tools\n\nimport (\n%s)\n' % imports,
                                                     encoding='utf-8')
        _run_go([go, 'mod', 'tidy', '-e'], scratch, label, first)
        out = os.path.join(scratch, 'out')
        os.mkdir(out)
        ldflags = ' '.join(BASE_LDFLAGS + list(first.get('ldflags', [])))
        args = [go, 'build'] + BUILD_FLAGS + ['-ldflags=' + ldflags]
        if first.get('tags'):
            args.append('-tags=' + ','.join(first['tags']))
        if len(specs) == 1:
            args += ['-o', os.path.join(out, specs[0]['name']), specs[0]['go_module']['package']]
        else:
            args += ['-o', out + os.sep] + [spec['go_module']['package'] for spec in specs]
        _run_go(args, scratch, label, first)
        for spec in specs:
            built = os.path.join(out, spec['name'] if len(specs) == 1 else _binary_name(spec['go_module']['package']))
            if not os.path.isfile(built):
                raise SetupError('%s: go build left no %s' % (label, built))
            _install(spec, lambda staging, built=built: shutil.move(built, os.path.join(staging, os.path.basename(built))))
    say('%s: done in %d s' % (label, time.monotonic() - started))


def build_module_tree(spec):
    """A go_module with module_tree: built inside a copy of the module's own tree, as its release build does (a
    //go:embed of files that build generates cannot be satisfied from the read-only module cache). The module comes
    from `go mod download` (sum.golang.org verifies it); its go.mod and go.sum are the pins, the declaration's replace
    lines are added to that go.mod, and each of module_tree.empty_files is made empty."""
    module = spec['go_module']
    ref = '%s@%s' % (module['module'], module['version'])
    label = '%s %s (%s, Go %s)' % (spec['name'], spec['version'], ref, module.get('toolchain', 'local'))
    say('%s: building in a copy of the module from the Go module proxy' % label)
    started = time.monotonic()
    go = _go()
    try:
        source = upstream.go_module_dir(module['module'], module['version'], toolchain=module.get('toolchain', 'local'),
                                        go=go, env=_go_env(module))
    except upstream.UpstreamError as exc:
        raise SetupError('%s: %s' % (label, exc)) from None
    with tempfile.TemporaryDirectory(prefix='proxtalos-build-') as scratch:
        tree = os.path.join(scratch, 'module')
        # the module cache's files are read-only: copy the contents, not the modes
        shutil.copytree(source, tree, copy_function=shutil.copyfile)
        for rel in module['module_tree'].get('empty_files', []):
            path = os.path.join(tree, *rel.split('/'))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if not os.path.exists(path):
                open(path, 'w', encoding='utf-8').close()  # pylint: disable=consider-using-with
        for old, new in sorted(module.get('replace', {}).items()):
            _run_go([go, 'mod', 'edit', '-replace', '%s=%s' % (old, new.replace(' ', '@'))], tree, label, module)
        out = os.path.join(scratch, 'out', spec['name'])
        package = './' + module['package'][len(module['module']):].lstrip('/')
        args = [go, 'build', '-mod=mod'] + BUILD_FLAGS + ['-ldflags=' + ' '.join(BASE_LDFLAGS + list(module.get('ldflags', [])))]
        if module.get('tags'):
            args.append('-tags=' + ','.join(module['tags']))
        # -mod=mod: only for the go.sum lines of the replacements (checked by sum.golang.org); the rest is the module's
        _run_go(args + ['-o', out, package], tree, label, module)
        if not os.path.isfile(out):
            raise SetupError('%s: go build left no %s' % (label, out))
        _install(spec, lambda staging: shutil.move(out, os.path.join(staging, spec['name'])))
    say('%s: done in %d s' % (label, time.monotonic() - started))


def build_go_source(spec):
    label = '%s %s (%s)' % (spec['name'], spec['version'], spec['go_source'])
    say('%s: building from %s with the Go module proxy' % (label, spec['go_source']))
    started = time.monotonic()
    go = _go()
    source = str(ROOT / spec['go_source'])

    def produce(staging):
        target = os.path.join(staging, spec['name'])
        # -mod=readonly: the directory's go.mod and go.sum are the pins, a build never edits them
        _run_go([go, 'build', '-mod=readonly'] + BUILD_FLAGS + ['-ldflags=' + ' '.join(BASE_LDFLAGS), '-o', target, '.'], source, label)
        return target

    _install(spec, produce)
    say('%s: done in %d s' % (label, time.monotonic() - started))


def fetch_chart(spec):
    """A chart out of its Go module: `go mod download -json MODULE@VERSION`, its Sum checked against the pin, then the
    chart directory copied into the cache (through a temporary directory, renamed into place)."""
    pin = spec['chart']
    ref = '%s@%s' % (pin['module'], pin['version'])
    label = 'chart %s %s (%s %s)' % (spec['name'], spec['version'], ref, pin['path'])
    say('%s: fetching from the Go module proxy' % label)
    started = time.monotonic()
    done = subprocess.run([_go(), 'mod', 'download', '-json', ref], capture_output=True, text=True, check=False,
                          env=dict(os.environ, GOTOOLCHAIN='local', GOFLAGS='-mod=mod'), cwd=str(ROOT))
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        answer = {}
    if done.returncode != 0 or not answer.get('Dir'):
        raise SetupError('%s: go mod download failed: %s' % (label, (answer.get('Error') or done.stderr or done.stdout).strip()[-500:]))
    if answer.get('Sum') != pin['sum']:
        raise SetupError('%s: the module\'s hash is %s, the pin (chart.sum) says %s' % (label, answer.get('Sum'), pin['sum']))
    source = os.path.join(answer['Dir'], *pin['path'].split('/'))
    if not os.path.isfile(os.path.join(source, 'Chart.yaml')):
        raise SetupError('%s: %s has no Chart.yaml' % (label, pin['path']))
    final = str(upstream.binary_path(spec))
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix='.tmp-', dir=parent)
    try:
        # the module cache's files are read-only: copy the contents, not the modes
        shutil.copytree(source, os.path.join(staging, 'chart'), copy_function=shutil.copyfile)
        for folder, dirs, files in os.walk(os.path.join(staging, 'chart')):
            os.chmod(folder, 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)
        try:
            os.rename(os.path.join(staging, 'chart'), final)
        except OSError:
            if not os.path.isfile(os.path.join(final, 'Chart.yaml')):  # another setup run put it there first: keep it
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    say('%s: done in %d s' % (label, time.monotonic() - started))


# ---- main -------------------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description='Build or fetch the pinned upstream binaries into the cache.')
    parser.add_argument('--only', help='comma-separated component names (default: all)')
    parser.add_argument('--list', action='store_true', help='print each component, its version and cached path, then exit')
    parser.add_argument('--artifacts', action='store_true', help='only the pinned upstream artifacts (lab/artifacts.py)')
    args = parser.parse_args(argv)
    try:
        if args.artifacts or not (args.only or args.list):
            written = artifacts.fill(_go(), _go_env(), say=say)
            say('upstream artifacts: %d written (cache: %s)' % (written, artifacts.cache_dir()))
            if args.artifacts:
                return 0
        specs = upstream.components()
        if args.only:
            wanted = [name.strip() for name in args.only.split(',') if name.strip()]
            unknown = sorted(set(wanted) - set(specs))
            if unknown:
                raise SetupError('--only: unknown component(s) %s (known: %s)' % (', '.join(unknown), ', '.join(sorted(specs))))
            specs = {name: specs[name] for name in wanted}
        started = time.monotonic()
        missing = []
        for name, spec in sorted(specs.items()):
            path = upstream.binary_path(spec)
            present = (path / 'Chart.yaml').is_file() if 'chart' in spec else path.is_file()
            if args.list:
                say('%-26s %-10s %s%s' % (name, spec['version'], path, '' if present else ' (missing)'))
            elif present:
                say('%s %s: cached' % (name, spec['version']))
            else:
                missing.append(spec)
        if args.list:
            return 0
        pending = [spec for spec in missing if not ('download' in spec and try_download(spec))]
        groups = {}
        for spec in pending:
            if 'chart' in spec:
                fetch_chart(spec)
            elif 'module_tree' in spec.get('go_module', {}):
                build_module_tree(spec)
            elif 'go_module' in spec:
                groups.setdefault(_group_key(spec), []).append(spec)
            else:
                build_go_source(spec)
        for group in groups.values():
            build_go_module(group)
        if missing:
            say('upstream binaries: %d made in %d s (cache: %s)' % (len(missing), time.monotonic() - started,
                                                                    upstream.cache_root() / 'bin'))
    except (SetupError, upstream.UpstreamError, artifacts.ArtifactError) as exc:
        print('upstream binaries: %s' % exc, file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
