"""A lab cluster taken through site.yml for the GitOps hand-off tests (shared by test_gitops_lab.py and test_sealed_lab.py).

`gitops_cluster` (session): a lab of its own (3 control planes + 3 workers, time scale 0) with an inventory folder
(the lab's hosts.yml, links to inventories/lab/group_vars and files), and site.yml run once over it, all stages.
Its handle runs further plays: handle.site('--tags', 'gitops', '-e', 'gitops_timeout=5') -> Run (rc, stats, failures).
"""

import os
import subprocess

import pytest
import yaml

from lab.testing import start_lab

from json_run import JsonRun as Run
from k8s_stages_lab import render_cilium_manifest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK_BIN = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
SITE = os.path.join(ROOT, 'site.yml')


class GitopsCluster(object):
    """The lab, its inventory folder, its artifacts folder and a kubernetes client."""

    def __init__(self, lab, folder):
        self.lab = lab
        self.folder = folder
        self.inventory = os.path.join(folder, 'inventory')
        self.artifacts = os.path.join(folder, 'artifacts')
        os.makedirs(self.inventory, exist_ok=True)
        self._write_hosts()
        for name in ('group_vars', 'files'):
            link = os.path.join(self.inventory, name)
            if os.path.isdir(os.path.join(ROOT, 'inventories', 'lab', name)) and not os.path.lexists(link):
                os.symlink(os.path.join(ROOT, 'inventories', 'lab', name), link)
        self.first = None
        self.rebuilds = 0

    def _write_hosts(self):
        with open(self.lab.inventory, encoding='utf-8') as source:
            text = source.read()
        with open(os.path.join(self.inventory, 'hosts.yml'), 'w', encoding='utf-8') as target:
            target.write(text)
        self.hosts = yaml.safe_load(text)

    def render_cilium_manifest(self):
        render_cilium_manifest(self)

    def rebuild(self):
        """Throw the lab away and start an empty one on the same net: the same inventory, a cluster built anew."""
        net = self.lab.net
        self.lab.stop()
        self.rebuilds += 1
        self.lab = start_lab(os.path.join(self.folder, 'lab-%d' % self.rebuilds), net=net)
        self._write_hosts()
        self.render_cilium_manifest()

    @property
    def kubeconfig(self):
        return os.path.join(self.artifacts, 'kubeconfig')

    @property
    def secrets(self):
        return os.path.join(self.inventory, 'secrets')

    def playbook(self, playbook, *args, timeout=900, env=None):
        tools = [os.path.join(ROOT, '.venv', 'bin'), os.path.join(ROOT, '.tools', 'bin')]  # as the Makefile runs them (helm, kubectl)
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_STDOUT_CALLBACK='ansible.posix.json',
                   ANSIBLE_LOCALHOST_WARNING='false', ANSIBLE_INVENTORY_UNPARSED_WARNING='false',
                   PATH=os.pathsep.join(tools + [os.environ.get('PATH', '')]),
                   # temp folders of our own: other ansible runs on the machine must not clean ours away
                   ANSIBLE_REMOTE_TMP=os.path.join(self.folder, 'ansible-remote-tmp'),
                   ANSIBLE_LOCAL_TEMP=os.path.join(self.folder, 'ansible-local-tmp'), **(env or {}))
        command = [PLAYBOOK_BIN, playbook, '-i', self.inventory, '-e', 'proxtalos_artifacts_dir=%s' % self.artifacts] + list(args)
        return Run(subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout, check=False))

    def site(self, *args, timeout=900, env=None):
        return self.playbook(SITE, *args, timeout=timeout, env=env)

    def tasks(self, name, tasks, *args):
        """Run a one-play playbook of tasks on localhost with this inventory's variables."""
        path = os.path.join(self.folder, '%s.yml' % name)
        with open(path, 'w', encoding='utf-8') as handle:
            yaml.safe_dump([{'name': name, 'hosts': 'lab-cp-1', 'gather_facts': False, 'tasks': tasks}], handle, sort_keys=False)
        return self.playbook(path, *args)

    def api(self):
        from kubernetes import config  # pylint: disable=import-outside-toplevel
        return config.new_client_from_config(config_file=self.kubeconfig)


@pytest.fixture(scope='session')
def gitops_cluster(tmp_path_factory):
    """A lab taken through the whole of site.yml once (every stage up to gitops)."""
    if not os.access(PLAYBOOK_BIN, os.X_OK):
        pytest.skip('no ansible-playbook in .venv (make setup)')
    folder = str(tmp_path_factory.mktemp('gitops'))
    cluster = GitopsCluster(start_lab(os.path.join(folder, 'lab')), folder)
    try:
        cluster.render_cilium_manifest()
        cluster.first = cluster.site()
        yield cluster
    finally:
        cluster.lab.stop()
