"""Only upstream artifacts reach a user's cluster: nothing under roles/ is a Kubernetes manifest or a Helm chart unless it
is byte for byte an upstream file pinned in roles/flux/vars/artifacts.yml, and the pins are complete and well formed.

A manifest is any YAML or JSON document (also a template, .j2) with a top-level apiVersion and kind, or a List of them;
a chart is a Chart.yaml, a charts/ or crds/ folder, or a packaged chart (.tgz). Ansible's own files (tasks, defaults, vars,
meta) are lists or mappings without apiVersion/kind, and a task's inline `definition:` is not a file of its own."""

import hashlib
import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLES = os.path.join(ROOT, 'roles')
PINS = os.path.join(ROLES, 'flux', 'vars', 'artifacts.yml')
TOP_LEVEL = re.compile(r'^(apiVersion|kind)\s*:', re.MULTILINE)


def pinned_sha256():
    with open(PINS, encoding='utf-8') as handle:
        pins = yaml.safe_load(handle)['flux_artifact_pins']
    return {entry['sha256'] for artifact_set in pins.values() for entry in artifact_set['files']}


def is_manifest_text(text):
    """Whether a file's text holds a Kubernetes object: parsed when it is YAML, else (a Jinja template) by its lines."""
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError:
        found = set(match.group(1) for match in TOP_LEVEL.finditer(text))
        return found == {'apiVersion', 'kind'}
    for doc in docs:
        if isinstance(doc, dict) and 'apiVersion' in doc and 'kind' in doc:
            return True
    return False


def offending(root):
    pinned = pinned_sha256()
    out = []
    for directory, folders, files in os.walk(root):
        for folder in folders:
            if folder in ('charts', 'crds'):
                out.append(os.path.relpath(os.path.join(directory, folder), root) + '/ (a chart folder)')
        for name in files:
            path = os.path.join(directory, name)
            with open(path, 'rb') as handle:
                data = handle.read()
            if hashlib.sha256(data).hexdigest() in pinned:
                continue
            relative = os.path.relpath(path, root)
            if name == 'Chart.yaml' or name.endswith(('.tgz', '.tar.gz')):
                out.append(relative + ' (a Helm chart)')
            elif name.endswith(('.yml', '.yaml', '.json', '.j2')) and is_manifest_text(data.decode('utf-8', 'replace')):
                out.append(relative + ' (a Kubernetes manifest)')
    return sorted(out)


def test_no_file_under_roles_is_a_manifest_or_chart_that_is_not_a_pinned_upstream_artifact():
    assert offending(ROLES) == [], ('files under roles/ that would reach a cluster without being pinned upstream artifacts '
                                    '(pin the upstream file in roles/flux/vars/artifacts.yml and download it instead)')


@pytest.mark.parametrize('content,name,expected', [
    ('apiVersion: v1\nkind: List\nitems: []\n', 'x.yaml', True),
    ('---\n- name: a task\n  ansible.builtin.debug: {}\n', 'main.yml', False),
    ('apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: "{{ name }}"\n  labels: {{ labels }}\n', 'd.yaml.j2', True),
    ('{"apiVersion": "v1", "kind": "ConfigMap"}', 'cm.json', True),
])
def test_the_check_finds_manifests_and_charts(tmp_path, content, name, expected):
    (tmp_path / 'role' / 'files').mkdir(parents=True)
    (tmp_path / 'role' / 'files' / name).write_text(content)
    assert bool(offending(str(tmp_path))) is expected
    (tmp_path / 'role' / 'files' / 'Chart.yaml').write_text('apiVersion: v2\nname: x\nversion: 0.1.0\n')
    assert 'role/files/Chart.yaml (a Helm chart)' in offending(str(tmp_path))


def test_the_pins_are_complete():
    with open(PINS, encoding='utf-8') as handle:
        pins = yaml.safe_load(handle)['flux_artifact_pins']
    assert sorted(pins) == ['flux', 'flux_operator']
    for name, artifact_set in pins.items():
        assert re.match(r'^v\d+\.\d+\.\d+$', artifact_set['version']), name
        for entry in artifact_set['files']:
            where = '%s %s' % (name, entry.get('path'))
            assert re.match(r'^[0-9a-f]{64}$', entry['sha256']), where
            assert re.match(r'^h1:[A-Za-z0-9+/]{43}=$', entry['module_sum']), where
            assert re.match(r'^[\w.-]+/[\w.-]+$', entry['repo']) and entry['ref'].startswith('v'), where
            assert entry['module'].startswith('github.com/' + entry['repo'].split('/')[0] + '/'), where
            assert isinstance(entry['size'], int) and entry['size'] > 0, where
    components = [entry['component'] for entry in pins['flux']['files'] if 'component' in entry]
    for wanted in ('source-controller', 'kustomize-controller', 'helm-controller', 'notification-controller'):
        assert wanted in components
    operator_paths = [entry['path'] for entry in pins['flux_operator']['files']]
    # all four CRDs flux-operator registers controllers for (cmd/operator/main.go), and the Deployment the image is set in
    assert sum(1 for path in operator_paths if path.startswith('config/crd/bases/')) == 4
    assert 'config/manager/deployment.yaml' in operator_paths
    assert pins['flux_operator']['image'].endswith(':' + pins['flux_operator']['version'])
