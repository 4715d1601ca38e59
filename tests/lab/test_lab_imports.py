"""Every module of the lab imports on its own, in a fresh interpreter: an import cycle between the lab's packages
(lab.k8s importing lab.k8s_upstream, which imports lab.k8s's pki) shows only when its first import is the module
at the cycle's other end, which a test process that has already imported the others never does."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def lab_modules():
    names = []
    for folder, dummy, files in os.walk(os.path.join(ROOT, 'lab')):
        relative = os.path.relpath(folder, ROOT)
        if not os.path.exists(os.path.join(folder, '__init__.py')) or 'run' in relative.split(os.sep):
            continue
        package = relative.replace(os.sep, '.')
        names.append(package)
        names += ['%s.%s' % (package, name[:-3]) for name in sorted(files)
                  if name.endswith('.py') and name not in ('__init__.py', '__main__.py')]
    return sorted(names)


def test_the_lab_has_modules_to_check():
    assert {'lab.k8s', 'lab.k8s_upstream', 'lab.talos.static_pods', 'lab.world'} <= set(lab_modules())


@pytest.mark.parametrize('module', lab_modules())
def test_each_lab_module_imports_first_in_a_fresh_interpreter(module):
    done = subprocess.run([sys.executable, '-c', 'import %s' % module], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, '%s does not import on its own:\n%s' % (module, done.stderr[-2000:])
