"""Where the upstream binaries built by `make setup` (scripts/upstream_binaries.py) are.

Each component is declared by one JSON file in upstream/ at the repository root: `name`, `version` and
exactly one of
    "go_module": {"module", "version", "package", optional "replace", "ldflags", "tags", "go", "toolchain", "env",
                  "module_tree"}
        built in a scratch module from the Go module proxy; with "module_tree" ({"empty_files": [paths]}), built
        inside a copy of the module's own tree instead (its go.mod and go.sum the pins, "replace" added to that
        go.mod; each named file made empty, for a //go:embed whose files the release build generates). "toolchain"
        (e.g. go1.27.3) is the GOTOOLCHAIN of that build only (the go command fetches it from the Go module proxy),
        "env" more build environment (e.g. GOFIPS140);
    "go_source": "tools/<dir>"
        a Go main package kept in this repository (own go.mod and go.sum);
    "chart": {"module", "version", "path", "sum"}
        a Helm chart shipped inside a Go module (a directory of it), fetched with `go mod download` from the
        Go module proxy (which sum.golang.org verifies) and pinned by the module's go.sum hash `sum` (h1:...);
and optionally "download": {"url", "sha256", "member"}, the official release, tried first.
The binaries live in a per-machine cache outside the work tree:
    ${PROXTALOS_CACHE:-${XDG_CACHE_HOME:-~/.cache}/proxtalos}/bin/<name>/<version>[-<source hash>]/<name>
and the charts in .../charts/<name>/<version>/<the chart directory's name>.
A component built from Go source kept in this repository (`go_source`) has the sha256 of its files in
the key, so an edit of the source is a new key. Standard library only: the setup script imports it.
"""

import hashlib
import json
import os
import pathlib
import re
import signal
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
DECLARATIONS = ROOT / 'upstream'
_NAME_RE = re.compile(r'^[a-z0-9][a-z0-9._-]*$')
_SHA256_RE = re.compile(r'^[0-9a-f]{64}$')
_GO_SUM_RE = re.compile(r'^h1:[A-Za-z0-9+/]{43}=$')
_TOOLCHAIN_RE = re.compile(r'^go[0-9]+\.[0-9]+(\.[0-9]+)?$')
_ENV_RE = re.compile(r'^[A-Z][A-Z0-9_]*$')
SOURCES = ('go_module', 'go_source', 'chart')


class UpstreamError(Exception):
    """A declaration in upstream/ is wrong, or a component cannot be found."""


class MissingBinary(UpstreamError):
    """A component's binary is not in the cache."""


def cache_root():
    base = os.environ.get('PROXTALOS_CACHE')
    if base:
        return pathlib.Path(base)
    xdg = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return pathlib.Path(xdg) / 'proxtalos'


def _field(mapping, where, field, kind):
    value = mapping.get(field)
    if not isinstance(value, kind) or not value:
        raise UpstreamError('%s: field %s must be a non-empty %s' % (where, field, 'object' if kind is dict else 'string'))
    return value


def validate(spec, path):
    """Check one declaration (parsed JSON); returns it. Every error names the file and the field."""
    where = str(path)
    if not isinstance(spec, dict):
        raise UpstreamError('%s: must hold a JSON object' % where)
    name = _field(spec, where, 'name', str)
    if not _NAME_RE.match(name):
        raise UpstreamError('%s: field name: %r is not a plain file name' % (where, name))
    if pathlib.Path(path).stem != name:
        raise UpstreamError('%s: field name is %r but the file is named %s' % (where, name, pathlib.Path(path).name))
    _field(spec, where, 'version', str)
    sources = [key for key in SOURCES if key in spec]
    if len(sources) != 1:
        raise UpstreamError('%s: exactly one of the fields %s is needed (found: %s)'
                            % (where, ', '.join(SOURCES), ', '.join(sources) or 'none'))
    if 'chart' in spec:
        chart = _field(spec, where, 'chart', dict)
        for field in ('module', 'version', 'path', 'sum'):
            if not isinstance(chart.get(field), str) or not chart[field]:
                raise UpstreamError('%s: field chart.%s must be a non-empty string' % (where, field))
        if os.path.isabs(chart['path']) or '..' in chart['path'].split('/'):
            raise UpstreamError('%s: field chart.path must be a directory inside the module, not %r' % (where, chart['path']))
        if not _GO_SUM_RE.match(chart['sum']):
            raise UpstreamError('%s: field chart.sum must be the module\'s go.sum hash (h1: and 44 base64 characters)' % where)
    elif 'go_module' in spec:
        module = _field(spec, where, 'go_module', dict)
        for field in ('module', 'version', 'package'):
            if not isinstance(module.get(field), str) or not module[field]:
                raise UpstreamError('%s: field go_module.%s must be a non-empty string' % (where, field))
        replace = module.get('replace', {})
        if not isinstance(replace, dict) or not all(isinstance(v, str) and len(v.split()) in (1, 2) for v in replace.values()):
            raise UpstreamError('%s: field go_module.replace must map a module path to "path version" or a directory' % where)
        for field in ('ldflags', 'tags'):
            value = module.get(field, [])
            if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
                raise UpstreamError('%s: field go_module.%s must be a list of strings' % (where, field))
        _check_build_extras(module, where)
    else:
        source = _field(spec, where, 'go_source', str)
        if os.path.isabs(source) or '..' in source.split('/'):
            raise UpstreamError('%s: field go_source must be a directory inside the repository, not %r' % (where, source))
    if 'download' in spec:
        download = _field(spec, where, 'download', dict)
        if not isinstance(download.get('url'), str) or not download['url'].startswith('https://'):
            raise UpstreamError('%s: field download.url must be an https:// URL' % where)
        if not isinstance(download.get('sha256'), str) or not _SHA256_RE.match(download['sha256']):
            raise UpstreamError('%s: field download.sha256 must be 64 lower-case hex digits' % where)
        if not isinstance(download.get('member', ''), str):
            raise UpstreamError('%s: field download.member must be a string (the file inside the archive)' % where)
    return spec


def _check_build_extras(module, where):
    """go_module's toolchain, env and module_tree fields."""
    toolchain = module.get('toolchain')
    if toolchain is not None and (not isinstance(toolchain, str) or not _TOOLCHAIN_RE.match(toolchain)):
        raise UpstreamError('%s: field go_module.toolchain must name a Go release such as go1.27.3, not %r' % (where, toolchain))
    env = module.get('env', {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and _ENV_RE.match(k) and isinstance(v, str) for k, v in env.items()):
        raise UpstreamError('%s: field go_module.env must map environment variable names to strings' % where)
    if 'GOTOOLCHAIN' in env:
        raise UpstreamError('%s: field go_module.env: give the Go toolchain in go_module.toolchain, not GOTOOLCHAIN' % where)
    if 'module_tree' in module:
        tree = module['module_tree']
        files = tree.get('empty_files', []) if isinstance(tree, dict) else None
        if not isinstance(files, list) or not all(isinstance(f, str) and f for f in files):
            raise UpstreamError('%s: field go_module.module_tree must be {"empty_files": [paths inside the module]}' % where)
        for rel in files:
            if os.path.isabs(rel) or '..' in rel.split('/'):
                raise UpstreamError('%s: field go_module.module_tree.empty_files: %r is not a path inside the module' % (where, rel))
        if not module['package'].startswith(module['module'] + '/') and module['package'] != module['module']:
            raise UpstreamError('%s: field go_module.package must be a package of go_module.module when module_tree is set' % where)


def components(declarations=DECLARATIONS):
    """Every declared component, by name (each declaration checked)."""
    found = {}
    for path in sorted(pathlib.Path(declarations).glob('*.json')):
        with open(path, encoding='utf-8') as stream:
            try:
                spec = json.load(stream)
            except ValueError as exc:
                raise UpstreamError('%s: not valid JSON: %s' % (path, exc)) from exc
        found[validate(spec, path)['name']] = spec
    return found


def source_hash(directory, root=ROOT):
    """sha256 over a go_source directory's Go files, go.mod and go.sum (names and contents), 12 hex digits."""
    digest = hashlib.sha256()
    base = pathlib.Path(root) / directory
    if not base.is_dir():
        raise UpstreamError('go_source %s: no such directory under %s' % (directory, root))
    for path in sorted(p for p in base.rglob('*') if p.is_file() and (p.suffix == '.go' or p.name in ('go.mod', 'go.sum'))):
        digest.update(str(path.relative_to(base)).encode('utf-8') + b'\0')
        digest.update(path.read_bytes() + b'\0')
    return digest.hexdigest()[:12]


def binary_path(spec, root=ROOT):
    """Where a component's binary (a chart: its directory) is, or will be, in the cache."""
    if 'chart' in spec:
        return cache_root() / 'charts' / spec['name'] / spec['version'] / pathlib.PurePosixPath(spec['chart']['path']).name
    key = spec['version']
    if 'go_source' in spec:
        key += '-' + source_hash(spec['go_source'], root)
    return cache_root() / 'bin' / spec['name'] / key / spec['name']


def binary(name, declarations=DECLARATIONS):
    """The path of a built component's binary; MissingBinary (saying to run make setup) when it is absent."""
    found = components(declarations)
    spec = found.get(name)
    if spec is None:
        raise MissingBinary('%s: no upstream/%s.json declares it (declared: %s)' % (name, name, ', '.join(sorted(found)) or 'none'))
    path = binary_path(spec)
    if not path.is_file():
        raise MissingBinary('%s %s is not built (%s is missing): run `make setup`' % (name, spec['version'], path))
    return str(path)


def chart(name, declarations=DECLARATIONS):
    """The directory of a fetched chart component; MissingBinary (saying to run make setup) when it is absent."""
    spec = components(declarations).get(name)
    if spec is None or 'chart' not in spec:
        raise MissingBinary('%s: no upstream/%s.json declares it as a chart' % (name, name))
    path = binary_path(spec)
    if not (path / 'Chart.yaml').is_file():
        raise MissingBinary('chart %s %s is not fetched (%s is missing): run `make setup`' % (name, spec['version'], path))
    return str(path)


def module_dir(name, declarations=DECLARATIONS):
    """The Go module cache directory of a go_module or chart component's module, for files it ships (kwok's stages,
    Cilium's CRDs).

    `go mod download -json MODULE@VERSION`: instant when the setup build left the module in the module cache,
    else fetched from the Go module proxy.
    """
    spec = components(declarations).get(name)
    source = (spec or {}).get('go_module') or (spec or {}).get('chart')
    if source is None:
        raise UpstreamError('%s: not a go_module or chart component in upstream/' % name)
    return go_module_dir(source['module'], source['version'], toolchain=source.get('toolchain', 'local'))


def go_module_dir(module, version, toolchain='local', go='go', env=None):
    """The Go module cache directory of module@version (`go mod download -json`, which sum.golang.org verifies; instant
    once the module is cached). toolchain: the GOTOOLCHAIN (a module whose go.mod asks for a newer Go than the installed
    one needs that Go); go and env: the go command and its environment (default: `go` on PATH, this process's)."""
    ref = '%s@%s' % (module, version)
    env = dict(os.environ if env is None else env, GOTOOLCHAIN=toolchain, GOFLAGS='-mod=mod')
    try:
        done = subprocess.run([go, 'mod', 'download', '-json', ref], capture_output=True, text=True, check=False, timeout=300,
                              env=env, cwd=str(ROOT))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UpstreamError('go mod download %s: %s (Go is needed; run `make setup`)' % (ref, exc)) from exc
    try:
        directory = json.loads(done.stdout).get('Dir')
    except ValueError:
        directory = None
    if done.returncode != 0 or not directory:
        raise UpstreamError('go mod download %s failed: %s' % (ref, (done.stderr or done.stdout).strip()[-500:]))
    return directory


def end_process_group(popen, timeout, kill=False):
    """End a started upstream process and its group: SIGTERM (SIGKILL with kill=True), waited for within timeout, then
    SIGKILL and another wait. A group already gone is left as it is."""
    try:
        os.killpg(popen.pid, signal.SIGKILL if kill else signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(timeout=timeout)
