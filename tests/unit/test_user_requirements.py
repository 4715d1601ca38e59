"""The user setup installs no test stack: requirements.txt (what docs/first-cluster.md has a user install) holds
ansible / ansible-core and the Python libraries the collection's plugins import, and no test, lint or lab tool;
those are requirements-dev.txt's, which only working on the collection needs."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# distribution name -> the top-level import the collection's plugins use it by
IMPORT_NAMES = {'pyyaml': 'yaml', 'protobuf': 'google.protobuf'}
TEST_STACK = re.compile(r'^(pytest.*|molecule.*|.*lint.*|fakepve|antsibull.*|ansible-builder|ansible-test|tox|nox|coverage'
                        r'|mypy|flake8|black|grpcio|grpcio-tools|kubernetes-validate|jsonschema|aiohttp)$')


def _read(*path):
    with open(os.path.join(ROOT, *path), encoding='utf-8') as handle:
        return handle.read()


def _requirements(*path):
    lines = [line.split('#', 1)[0].strip() for line in _read(*path).splitlines()]
    return [line for line in lines if line]


def _name(line):
    return re.split(r'[<>=!~\[; ]', line, 1)[0].strip().lower()


def _plugin_sources():
    text = []
    for folder, dummy, names in os.walk(os.path.join(ROOT, 'plugins')):
        text.extend(_read(folder, name) for name in names if name.endswith('.py'))
    return '\n'.join(text)


def test_requirements_txt_lists_no_test_tool_and_includes_no_other_file():
    lines = _requirements('requirements.txt')
    assert not [line for line in lines if line.startswith('-')], 'requirements.txt must not pull in another file'
    names = [_name(line) for line in lines]
    assert not [name for name in names if TEST_STACK.match(name)], names
    # the deny list knows the test stack: every requirements-dev.txt line of its own is one of it
    dev_only = [_name(line) for line in _requirements('requirements-dev.txt') if not line.startswith('-')]
    assert dev_only and not [name for name in dev_only if name in names]
    assert [name for name in dev_only if TEST_STACK.match(name)] == dev_only, dev_only


def test_every_library_of_requirements_txt_is_imported_by_the_collections_plugins():
    sources = _plugin_sources()
    for name in (_name(line) for line in _requirements('requirements.txt')):
        if name in ('ansible', 'ansible-core'):
            continue
        module = IMPORT_NAMES.get(name, name)
        assert re.search(r'^\s*(from|import) %s\b' % re.escape(module), sources, re.M), \
            '%s is in requirements.txt but no plugin imports %s' % (name, module)


def test_the_user_guide_installs_requirements_txt_not_the_test_stack():
    guide = _read('docs', 'first-cluster.md')
    assert 'pip install -r requirements.txt' in guide
    assert 'pip install -r requirements-dev.txt' not in guide
