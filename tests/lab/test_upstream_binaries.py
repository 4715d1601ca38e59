"""scripts/upstream_binaries.py without Go: the official-download path (checksum, archive member, fallback) and the
grouping of components that share one build."""

import hashlib
import http.server
import importlib.util
import io
import os
import re
import socket
import tarfile
import threading

import pytest

from lab import upstream

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_script():
    spec = importlib.util.spec_from_file_location('upstream_binaries', os.path.join(ROOT, 'scripts', 'upstream_binaries.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT = _load_script()


@pytest.fixture
def served(tmp_path):
    """A loopback HTTP server for the files put into the returned directory; yields (directory, base URL)."""
    root = tmp_path / 'www'
    root.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):  # pylint: disable=arguments-differ
            pass

    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, 'http://127.0.0.1:%d' % server.server_address[1]
    server.shutdown()
    server.server_close()


def _tarball(member, payload):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode='w:gz') as archive:
        info = tarfile.TarInfo(member)
        info.size = len(payload)
        archive.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def _spec(url, sha256, member=None):
    download = {'url': url, 'sha256': sha256}
    if member:
        download['member'] = member
    return {'name': 'thing', 'version': '1.0', 'go_module': {'module': 'example.invalid/thing', 'version': 'v1.0.0',
                                                             'package': 'example.invalid/thing'}, 'download': download}


def test_download_takes_the_member_checks_the_sha256_and_installs_atomically(served, tmp_path, monkeypatch):
    monkeypatch.setenv('PROXTALOS_CACHE', str(tmp_path / 'cache'))
    root, base = served
    archive = _tarball('thing-v1.0/bin/thing', b'#!/bin/sh\necho thing\n')
    (root / 'thing.tar.gz').write_bytes(archive)
    spec = _spec(base + '/thing.tar.gz', hashlib.sha256(archive).hexdigest(), 'thing-v1.0/bin/thing')
    assert SCRIPT.try_download(spec) is True
    path = upstream.binary_path(spec)
    assert path.read_bytes() == b'#!/bin/sh\necho thing\n' and os.access(path, os.X_OK)
    # nothing half-written beside it
    assert [p.name for p in path.parent.parent.iterdir()] == ['1.0']


def test_download_with_a_wrong_checksum_is_an_error_not_a_binary(served, tmp_path, monkeypatch):
    monkeypatch.setenv('PROXTALOS_CACHE', str(tmp_path / 'cache'))
    root, base = served
    (root / 'thing').write_bytes(b'not what was pinned')
    spec = _spec(base + '/thing', '0' * 64)
    with pytest.raises(SCRIPT.SetupError, match='has sha256 .* pins 0000'):
        SCRIPT.try_download(spec)
    assert not upstream.binary_path(spec).exists()


def test_unreachable_download_falls_back_to_the_build(tmp_path, monkeypatch):
    monkeypatch.setenv('PROXTALOS_CACHE', str(tmp_path / 'cache'))
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(('127.0.0.1', 0))
        port = probe.getsockname()[1]
    assert SCRIPT.try_download(_spec('http://127.0.0.1:%d/thing' % port, '0' * 64)) is False


def test_the_kubernetes_binaries_are_one_build_and_etcd_another():
    specs = upstream.components()
    groups = {}
    for name in ('kube-apiserver', 'kube-controller-manager', 'kube-scheduler', 'etcd', 'kwok'):
        groups.setdefault(SCRIPT._group_key(specs[name]), []).append(name)  # pylint: disable=protected-access
    assert sorted(groups.values()) == [['etcd'], ['kube-apiserver', 'kube-controller-manager', 'kube-scheduler'], ['kwok']]
    assert SCRIPT._binary_name('go.etcd.io/etcd/server/v3') == 'server'  # pylint: disable=protected-access
    assert SCRIPT._binary_name('k8s.io/kubernetes/cmd/kube-apiserver') == 'kube-apiserver'  # pylint: disable=protected-access


def test_flux_operator_builds_alone_in_its_module_tree_with_its_own_toolchain_and_fips_setting():
    specs = upstream.components()
    operator = specs['flux-operator']['go_module']
    # its Dockerfile: GOFIPS140=latest (the operator exits when FIPS 140-3 mode is off: cmd/operator/main.go)
    env = SCRIPT._go_env(operator)  # pylint: disable=protected-access
    assert env['GOTOOLCHAIN'] == 'go1.27.3' and env['GOFIPS140'] == 'latest'
    # every other build keeps the installed Go
    assert SCRIPT._go_env(specs['source-controller']['go_module'])['GOTOOLCHAIN'] == 'local'  # pylint: disable=protected-access
    assert SCRIPT._go_env(specs['source-controller']['go_module']).get('GOFIPS140') == os.environ.get('GOFIPS140')  # pylint: disable=protected-access
    assert operator['module_tree'] == {'empty_files': ['web/dist/index.html']}


def _operator_spec(**fields):
    module = dict(upstream.components()['flux-operator']['go_module'], **fields)
    return {'name': 'flux-operator', 'version': '0.59.0', 'go_module': module}


@pytest.mark.parametrize('fields, message', [
    ({'toolchain': 'latest'}, 'field go_module.toolchain must name a Go release such as go1.27.3'),
    ({'env': {'GOTOOLCHAIN': 'auto'}}, 'field go_module.env: give the Go toolchain in go_module.toolchain, not GOTOOLCHAIN'),
    ({'env': {'lower': 'x'}}, 'field go_module.env must map environment variable names to strings'),
    ({'module_tree': {'empty_files': ['../outside']}}, 'field go_module.module_tree.empty_files: \'../outside\' is not a path inside'),
    ({'module_tree': ['web/dist']}, 'field go_module.module_tree must be'),
    ({'package': 'example.com/other/cmd'}, 'field go_module.package must be a package of go_module.module'),
])
def test_the_build_extras_of_a_go_module_are_checked_field_by_field(fields, message):
    with pytest.raises(upstream.UpstreamError, match='flux-operator.json: ' + re.escape(message)):
        upstream.validate(_operator_spec(**fields), 'flux-operator.json')


# ---- charts out of Go modules -----------------------------------------------------------------------------------------

def _chart_spec(**chart):
    pin = {'module': 'sigs.k8s.io/kwok', 'version': 'v0.8.0', 'path': 'charts/kwok',
           'sum': 'h1:' + 'A' * 43 + '='}
    pin.update(chart)
    return {'name': 'kwok-chart', 'version': '0.8.0', 'chart': pin}


def test_a_chart_declaration_is_checked_field_by_field():
    assert upstream.validate(_chart_spec(), 'kwok-chart.json')['chart']['path'] == 'charts/kwok'
    with pytest.raises(upstream.UpstreamError, match=r'kwok-chart.json: field chart.sum must be the module\'s go.sum hash'):
        upstream.validate(_chart_spec(sum='sha256:abc'), 'kwok-chart.json')
    with pytest.raises(upstream.UpstreamError, match='field chart.path must be a directory inside the module'):
        upstream.validate(_chart_spec(path='../elsewhere'), 'kwok-chart.json')
    with pytest.raises(upstream.UpstreamError, match='exactly one of the fields go_module, go_source, chart is needed'):
        upstream.validate(dict(_chart_spec(), go_source='tools/x'), 'kwok-chart.json')


def test_a_chart_whose_module_hash_is_not_the_pin_is_refused_and_nothing_is_cached(tmp_path, monkeypatch):
    # kwok's module is what the lab's kwok stages come from (lab/k8s_upstream): on this machine already, or one download
    monkeypatch.setenv('PROXTALOS_CACHE', str(tmp_path / 'cache'))
    spec = _chart_spec()
    with pytest.raises(SCRIPT.SetupError, match=r'the module\'s hash is h1:\S+, the pin \(chart.sum\) says h1:AAAA'):
        SCRIPT.fetch_chart(spec)
    assert not os.path.exists(upstream.binary_path(spec))


def test_the_cilium_chart_is_pinned_to_the_module_and_fetched_as_the_module_has_it():
    spec = upstream.components()['cilium-chart']
    assert spec['chart']['module'] == 'github.com/cilium/cilium' and spec['chart']['version'] == 'v' + spec['version']
    path = upstream.chart('cilium-chart')
    with open(os.path.join(path, 'Chart.yaml'), encoding='utf-8') as handle:
        text = handle.read()
    assert 'name: cilium\n' in text and 'version: %s\n' % spec['version'] in text
