"""site.yml on the oldest ansible-core the collection accepts (requirements.txt and meta/runtime.yml: 2.19), so that
"supported" means tested: a lab of one control plane and one worker built by the whole site.yml, then a re-run that
changes nothing.

`make oldest-core` runs it, with PROXTALOS_ANSIBLE_PLAYBOOK naming the ansible-playbook of a second venv that holds
ansible-core 2.19 and the `ansible` 12 package; without that variable the test is skipped. Every task of the
collection runs the same way on every core: its module's run(module) in the worker through the public facade of
AnsibleModule (the inventory's interpreter is that ansible-playbook's own; plugins/plugin_utils/_vault_inputs.py,
_action_module.py; docs/adr/0001-modules-in-the-worker-process.md), so 2.19 and 2.21 run the same path.

The `ansible` 12 package ships kubernetes.core 6.2.0, whose helm modules cannot run helm 4 (the helm `make setup`
installs); a user with helm 4 installs kubernetes.core 6.4.0 or later (requirements.yml), which the preflight checks.
The test does the same: the kubernetes.core of the main venv (the `ansible` 14 package) comes first on the
collections path.
"""
import importlib.util
import os
import subprocess

import pytest

from json_run import JsonRun
from k8s_stages_lab import ROOT, environment, start_rendered_lab

PLAYBOOK_ENV = 'PROXTALOS_ANSIBLE_PLAYBOOK'
OLDEST_CORE = '2.19.'

pytestmark = [pytest.mark.lab, pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get(PLAYBOOK_ENV), reason='make oldest-core sets %s' % PLAYBOOK_ENV)]


def _kubernetes_core_first(folder):
    """A collections folder whose kubernetes.core is the main venv's (6.4.0 or later)."""
    installed = list(importlib.util.find_spec('ansible_collections.kubernetes.core').submodule_search_locations)[0]
    target = os.path.join(folder, 'ansible_collections', 'kubernetes')
    os.makedirs(target)
    os.symlink(installed, os.path.join(target, 'core'))
    return os.pathsep.join([os.path.join(ROOT, '.collections'), folder])


def test_site_converges_on_the_oldest_core_and_a_rerun_changes_nothing(tmp_path):
    playbook = os.environ[PLAYBOOK_ENV]
    version = subprocess.run([os.path.join(os.path.dirname(playbook), 'ansible'), '--version'], capture_output=True,
                             text=True, check=True).stdout.splitlines()[0]
    assert ('[core %s' % OLDEST_CORE) in version, version
    lab = start_rendered_lab(str(tmp_path / 'lab'), control_planes=1, workers=1)
    try:
        env = environment(str(tmp_path))
        env['ANSIBLE_COLLECTIONS_PATH'] = _kubernetes_core_first(str(tmp_path / 'collections'))
        command = [playbook, os.path.join(ROOT, 'site.yml'), '-i', lab.inventory_dir,
                   '-e', 'proxtalos_artifacts_dir=%s' % (tmp_path / 'artifacts')]
        runs = []
        for attempt in ('first', 'again'):
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=False)
            run = JsonRun(done)
            assert run.rc == 0, '%s run failed (rc %d): %s\n%s' % (attempt, run.rc, run.stdout[-3000:], run.stderr[-2000:])
            runs.append(run)
        assert sum(runs[0].changed().values()) > 0, runs[0].changed()
        assert set(runs[1].changed().values()) == {0}, runs[1].changed()
    finally:
        lab.stop()
