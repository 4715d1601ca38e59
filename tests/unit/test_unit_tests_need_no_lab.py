"""Issue 21: unit tests need no lab. No file under tests/unit, nor a file pytest loads for them from above
(conftest.py at the root, tests/conftest.py, tests/helpers.py), imports the lab package (lab/): tests of the lab live
in tests/lab, tests that need lab servers in tests/lab or tests/integration.

Reading the lab's data files (lab/talos/schemas, lab/gitops) is allowed: they are files, not the simulator."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT = os.path.join(ROOT, 'tests', 'unit')
LOADED_FROM_ABOVE = ('conftest.py', os.path.join('tests', 'conftest.py'), os.path.join('tests', 'helpers.py'))


def is_lab(module_name):
    return module_name == 'lab' or module_name.startswith('lab.')


def lab_imports(source, filename='<source>'):
    """(line, text) of each way `source` imports the lab package: import and from-import statements, a
    pytest_plugins naming a lab module, importlib.import_module / __import__ of a lab module by literal name."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, 'import %s' % alias.name) for alias in node.names if is_lab(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and is_lab(node.module):
            found.append((node.lineno, 'from %s import ...' % node.module))
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == 'pytest_plugins' for t in node.targets):
            names = [c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            found += [(node.lineno, 'pytest_plugins %s' % name) for name in names if is_lab(name)]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, 'id', '')
            if function in ('import_module', '__import__') and isinstance(node.args[0].value, str) and is_lab(node.args[0].value):
                found.append((node.lineno, '%s(%r)' % (function, node.args[0].value)))
    return found


def unit_test_files():
    for folder, dirs, files in os.walk(UNIT):
        dirs[:] = [d for d in dirs if d != '__pycache__']
        for name in sorted(files):
            if name.endswith('.py'):
                yield os.path.join(folder, name)
    for relative in LOADED_FROM_ABOVE:
        if os.path.isfile(os.path.join(ROOT, relative)):
            yield os.path.join(ROOT, relative)


@pytest.mark.parametrize('source, expected', [
    ('import lab\n', [(1, 'import lab')]),
    ('import os, lab.talos.testing as t\n', [(1, 'import lab.talos.testing')]),
    ('from lab.flux.testing import FluxLab\n', [(1, 'from lab.flux.testing import ...')]),
    ('from lab import upstream\n', [(1, 'from lab import ...')]),
    ('def f():\n    from lab.k8s import pki\n', [(2, 'from lab.k8s import ...')]),
    ('pytest_plugins = ["lab.testing"]\n', [(1, 'pytest_plugins lab.testing')]),
    ('import importlib\nimportlib.import_module("lab.world")\n', [(2, "import_module('lab.world')")]),
    ('__import__("lab")\n', [(1, "__import__('lab')")]),
    # not the lab package: a relative import, other packages whose names start alike, the lab's data files by path
    ('from .lab import x\nimport labels\nfrom laboratory import y\nopen("lab/talos/schemas/a.json")\n', []),
])
def test_the_scan_finds_every_form_of_a_lab_import(source, expected):
    assert lab_imports(source) == expected


def test_the_scan_covers_the_unit_tests_and_what_they_load():
    files = [os.path.relpath(path, ROOT) for path in unit_test_files()]
    assert os.path.join('tests', 'unit', 'test_unit_tests_need_no_lab.py') in files
    assert os.path.join('tests', 'unit', 'plugins', 'modules', 'test_sealed_key_secret.py') in files
    assert os.path.join('tests', 'helpers.py') in files and 'conftest.py' in files
    assert len(files) > 50


def test_no_unit_test_imports_the_lab():
    offenders = []
    for path in unit_test_files():
        with open(path, encoding='utf-8') as handle:
            offenders += ['%s:%d: %s' % (os.path.relpath(path, ROOT), line, text) for line, text in lab_imports(handle.read(), path)]
    assert offenders == [], 'tests/unit must run without the lab; move these tests to tests/lab or tests/integration, ' \
                            'or test on fakes:\n' + '\n'.join(offenders)
