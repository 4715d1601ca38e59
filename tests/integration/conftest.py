"""The lab fixtures, and fixtures of the reliability suites (test_fault_matrix, test_secrets_hygiene) that more than one module uses.

`converged_cluster` (session): a lab of its own (3 control planes + 3 workers, time scale 0) taken through the whole
of site.yml once at -vvv with the default stdout callback - the output a user sees - kept in its logs folder with
a copy of that run's report files. The fault matrix injects faults into it afterwards (each row restores it), and
the secrets hygiene test scans everything every run against it printed or wrote.

`lab` (session) and `lab_factory` are lab/testing.py's, started with k8s_stages_lab's start_rendered_lab: a lab of the
upstream world names an inline Cilium manifest in its run dir that preflight wants there (lab/world.py
_inventory_vars), so it is rendered once after the lab starts, as a user renders it (nothing to do on lab/k8s).
"""

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_lab import PLAYBOOK_BIN, Workspace  # noqa: E402  pylint: disable=wrong-import-position,import-error

from k8s_stages_lab import start_rendered_lab  # noqa: E402  pylint: disable=wrong-import-position,import-error
# clean_lab of lab/testing.py (it takes the `lab` below), and start_lab for the converged cluster below
from lab.testing import clean_lab, labs_stopped_at_the_end, start_lab  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import


@pytest.fixture(scope='session')
def lab(tmp_path_factory):
    """One lab for the test session (lab/testing.py's `lab`), its inline Cilium manifest rendered on upstream."""
    handle = start_rendered_lab(str(tmp_path_factory.mktemp('lab') / 'run'))
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def lab_factory(tmp_path_factory):
    """lab/testing.py's lab_factory: lab_factory(**start_lab options) starts a lab (its inline Cilium manifest rendered
    on upstream) that stops when the test ends."""
    yield from labs_stopped_at_the_end(lambda folder, **options: start_rendered_lab(os.path.join(folder, 'run'), **options),
                                       tmp_path_factory)


@pytest.fixture(scope='session')
def converged_cluster(tmp_path_factory):
    """A lab after one full site.yml run at -vvv; .first is that run, .first_report the folder with its report files."""
    if not os.access(PLAYBOOK_BIN, os.X_OK):
        pytest.skip('no ansible-playbook in .venv (make setup)')
    folder = str(tmp_path_factory.mktemp('converged'))
    lab = start_lab(os.path.join(folder, 'lab'))
    try:
        workspace = Workspace(lab, folder)
        workspace.render_cilium_manifest()
        workspace.first = workspace.run(label='site-vvv', verbosity=3, callback='ansible.builtin.default')
        workspace.first_report = os.path.join(folder, 'first-report')
        os.makedirs(workspace.first_report)
        for name in ('report.json', 'report.html', 'timeline.md'):
            if os.path.exists(os.path.join(workspace.artifacts, name)):
                shutil.copy2(os.path.join(workspace.artifacts, name), workspace.first_report)
        yield workspace
    finally:
        lab.stop()
