"""The lab fixtures, and fixtures of the reliability suites (test_fault_matrix, test_secrets_hygiene) that more than one module uses.

`converged_cluster` (session): a lab of its own (3 control planes + 3 workers, time scale 0) taken through the whole
of site.yml once at -vvv with the default stdout callback - the output a user sees - kept in its logs folder with
a copy of that run's report files. The fault matrix injects faults into it afterwards (each row restores it), and
the secrets hygiene test scans everything every run against it printed or wrote.
"""

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_lab import PLAYBOOK_BIN, Workspace  # noqa: E402  pylint: disable=wrong-import-position,import-error

# the lab fixtures (lab, clean_lab, lab_factory) of lab/testing.py, and start_lab for the converged cluster below
from lab.testing import clean_lab, lab, lab_factory, start_lab  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import


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
