"""Packaging: the Galaxy tarball installs into an empty collections path and every plugin's documentation loads from
there with ansible-doc; the execution environment definition is a valid ansible-builder 3 file; the EE's Python
requirements match requirements.txt.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, '.venv', 'bin')
GALAXY = os.path.join(BIN, 'ansible-galaxy')
DOC = os.path.join(BIN, 'ansible-doc')
BUILDER = os.path.join(BIN, 'ansible-builder')

pytestmark = pytest.mark.skipif(not os.access(GALAXY, os.X_OK), reason='no ansible-galaxy in .venv (make setup)')

PLUGIN_DIRS = {'module': 'modules', 'callback': 'callback', 'lookup': 'lookup', 'filter': 'filter'}


def clean_env(tmp_path, collections):
    """An environment where only the installed copy (and the ansible bundle's collections) can be found."""
    config = tmp_path / 'ansible.cfg'
    config.write_text('[defaults]\ncollections_path = %s\n' % collections)
    env = dict((key, value) for key, value in os.environ.items() if not key.startswith('ANSIBLE_'))
    env.update(ANSIBLE_CONFIG=str(config), ANSIBLE_NOCOLOR='1', HOME=str(tmp_path))
    return env


@pytest.fixture(scope='module')
def built(tmp_path_factory):
    """(tarball, collections path with the tarball installed, scratch dir)."""
    scratch = tmp_path_factory.mktemp('packaging')
    env = clean_env(scratch, scratch / 'nowhere')
    subprocess.run([GALAXY, 'collection', 'build', ROOT, '--output-path', str(scratch)], check=True, cwd=str(scratch),
                   env=env, capture_output=True, text=True, timeout=300)
    tarballs = [name for name in os.listdir(str(scratch)) if name.endswith('.tar.gz')]
    assert len(tarballs) == 1, tarballs
    tarball = scratch / tarballs[0]
    collections = scratch / 'collections'
    collections.mkdir()
    assert os.listdir(str(collections)) == []
    # --no-deps: kubernetes.core comes from the ansible package (Galaxy is not reachable here)
    process = subprocess.run([GALAXY, 'collection', 'install', str(tarball), '-p', str(collections), '--no-deps'],
                             cwd=str(scratch), env=env, check=False, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stdout + process.stderr
    return tarball, collections, scratch


def test_tarball_ships_the_collection_and_nothing_of_the_workshop(built):
    tarball, _collections, _scratch = built
    with tarfile.open(str(tarball)) as archive:
        names = archive.getnames()
    for wanted in ('MANIFEST.json', 'FILES.json', 'meta/runtime.yml', 'site.yml', 'playbooks/site.yml', 'meta/execution-environment.yml',
                   'meta/ee-requirements.txt', 'meta/ee-bindep.txt', 'plugins/callback/timeline.py',
                   'plugins/plugin_utils/_timeline.py', 'docs/report.schema.json', 'roles/preflight/tasks/multicluster.yml'):
        assert wanted in names, wanted
    for unwanted in ('lab', 'tests', 'bench', '.venv', '.kube', '.collections', 'inventories', 'artifacts', 'scripts', 'build',
                     'Makefile', 'execution-environment.yml', 'requirements.txt', 'conftest.py', 'pytest.ini', 'ansible.cfg'):
        assert not any(name == unwanted or name.startswith(unwanted + '/') for name in names), unwanted


def test_every_plugin_documents_from_the_installed_copy(built):
    _tarball, collections, scratch = built
    installed = collections / 'ansible_collections' / 'proxtalos' / 'cluster'
    assert (installed / 'MANIFEST.json').is_file()
    env = clean_env(scratch, collections)
    checked = 0
    for plugin_type, folder in sorted(PLUGIN_DIRS.items()):
        directory = installed / 'plugins' / folder
        if not directory.is_dir():
            continue
        if plugin_type == 'filter':
            names = sorted(name[:-4] for name in os.listdir(str(directory)) if name.endswith('.yml'))
        else:
            names = sorted(name[:-3] for name in os.listdir(str(directory)) if name.endswith('.py') and not name.startswith('_'))
        if not names:
            continue
        fqcns = ['proxtalos.cluster.%s' % name for name in names]
        process = subprocess.run([DOC, '--json', '-t', plugin_type] + fqcns, cwd=str(scratch), env=env,
                                 check=False, capture_output=True, text=True, timeout=600)
        assert process.returncode == 0, process.stderr
        assert '[WARNING]' not in process.stderr, process.stderr
        docs = json.loads(process.stdout)
        assert sorted(docs) == fqcns
        for fqcn, entry in docs.items():
            doc = entry['doc']
            assert doc.get('short_description'), fqcn
            assert doc['filename'].startswith(str(installed)), (fqcn, doc['filename'])
            if plugin_type == 'module':
                assert entry.get('examples'), fqcn
            checked += 1
    modules = [name for name in os.listdir(str(installed / 'plugins' / 'modules')) if name.endswith('.py')]
    assert checked >= len(modules) + 2   # every module, the timeline callback and the inventory_vars lookup at least


def test_execution_environment_definition(built, tmp_path):
    with open(os.path.join(ROOT, 'execution-environment.yml')) as stream:
        definition = yaml.safe_load(stream)
    assert definition['version'] == 3
    names = [item['name'] for item in definition['dependencies']['galaxy']['collections']]
    assert '/build/collections/proxtalos-cluster.tar.gz' in names
    with open(os.path.join(ROOT, 'meta', 'execution-environment.yml')) as stream:
        meta = yaml.safe_load(stream)
    for path in meta['dependencies'].values():
        assert os.path.isfile(os.path.join(ROOT, path)), path
    if not os.access(BUILDER, os.X_OK):
        pytest.skip('ansible-builder is not installed (requirements-dev.txt)')
    # ansible-builder create validates the definition and writes the build context (no container runtime needed)
    workdir = tmp_path / 'ee'
    (workdir / 'build' / 'ee').mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, 'execution-environment.yml'), str(workdir))
    shutil.copy(str(built[0]), str(workdir / 'build' / 'ee' / 'proxtalos-cluster.tar.gz'))
    process = subprocess.run([BUILDER, 'create', '-f', 'execution-environment.yml', '-c', 'context'], cwd=str(workdir),
                             check=False, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stdout + process.stderr
    # Containerfile for podman, Dockerfile when ansible-builder picks docker
    build_files = [name for name in ('Containerfile', 'Dockerfile') if (workdir / 'context' / name).is_file()]
    assert len(build_files) == 1, os.listdir(str(workdir / 'context'))
    containerfile = (workdir / 'context' / build_files[0]).read_text()
    assert 'quay.io/centos/centos:stream9' in containerfile
    assert 'COPY _build /build' in containerfile   # so the tarball is at /build/collections/ for ansible-galaxy
    assert (workdir / 'context' / '_build' / 'collections' / 'proxtalos-cluster.tar.gz').is_file()
    requirements = yaml.safe_load((workdir / 'context' / '_build' / 'requirements.yml').read_text())
    assert {'name': '/build/collections/proxtalos-cluster.tar.gz', 'type': 'file'} in requirements['collections']


def _requirement_lines(path):
    with open(path) as stream:
        return dict((re.split(r'[<>=!~\[]', line, 1)[0].strip().lower(), line.strip()) for line in stream
                    if line.strip() and not line.startswith(('#', '-')))


def test_ee_python_requirements_match_requirements_txt():
    runtime = _requirement_lines(os.path.join(ROOT, 'requirements.txt'))
    ee = _requirement_lines(os.path.join(ROOT, 'meta', 'ee-requirements.txt'))
    expected = dict((name, line) for name, line in runtime.items() if name not in ('ansible', 'ansible-core'))
    assert ee == expected


FQCN = re.compile(r'\b([a-z][a-z0-9_]*)\.([a-z][a-z0-9_]*)\.[a-z][a-z0-9_]*\b')
USED_IN = ('roles', 'playbooks', 'site.yml')


def _collections_used():
    """Collections named by the FQCN of a task's module, a lookup, filter or role in the shipped YAML (comments left
    out), plus every ansible_collections.<ns>.<name> import of the plugins."""
    used = set()
    for top in USED_IN:
        path = os.path.join(ROOT, top)
        files = [path] if os.path.isfile(path) else [os.path.join(folder, name) for folder, _dirs, names in os.walk(path)
                                                     for name in names if name.endswith(('.yml', '.yaml'))]
        for name in files:
            if os.sep + 'files' + os.sep in name:
                continue    # manifests shipped as data (Kubernetes objects, not Ansible)
            with open(name, encoding='utf-8') as handle:
                for line in handle:
                    code = line.split('#', 1)[0]
                    used.update('%s.%s' % found for found in FQCN.findall(code))
    for folder, _dirs, names in os.walk(os.path.join(ROOT, 'plugins')):
        for name in names:
            if name.endswith('.py'):
                with open(os.path.join(folder, name), encoding='utf-8') as handle:
                    used.update('%s.%s' % found for found in re.findall(r'ansible_collections\.(\w+)\.(\w+)', handle.read()))
    return used


def test_the_declared_collection_dependencies_are_the_used_ones_in_every_list():
    """galaxy.yml's dependencies, requirements.yml and the execution environment's collections name exactly the
    collections the shipped roles, playbooks and plugins use (not ansible.builtin, not this one)."""
    used = set(name for name in _collections_used() if name.split('.')[0] not in ('ansible', 'proxtalos'))
    # a hostname or a dotted value can look like an FQCN: only names of installed collections (the ansible package's) count
    roots = [os.path.join(entry, 'ansible_collections') for entry in sys.path if os.path.isdir(os.path.join(entry, 'ansible_collections'))]
    installed = set(name for name in used if any(os.path.isfile(os.path.join(root, name.replace('.', os.sep), 'MANIFEST.json'))
                                                 for root in roots))
    assert installed, 'no collection dependency found (the scan is broken)'
    with open(os.path.join(ROOT, 'galaxy.yml'), encoding='utf-8') as handle:
        galaxy = yaml.safe_load(handle)['dependencies']
    with open(os.path.join(ROOT, 'requirements.yml'), encoding='utf-8') as handle:
        requirements = dict((item['name'], item['version']) for item in yaml.safe_load(handle)['collections'])
    with open(os.path.join(ROOT, 'execution-environment.yml'), encoding='utf-8') as handle:
        ee = dict((item['name'], item.get('version')) for item in yaml.safe_load(handle)['dependencies']['galaxy']['collections']
                  if item.get('type') != 'file')
    assert set(galaxy) == installed, 'galaxy.yml dependencies %s, used %s' % (sorted(galaxy), sorted(installed))
    assert requirements == galaxy, 'requirements.yml %s differs from galaxy.yml %s' % (requirements, galaxy)
    assert ee == galaxy, 'execution-environment.yml %s differs from galaxy.yml %s' % (ee, galaxy)
