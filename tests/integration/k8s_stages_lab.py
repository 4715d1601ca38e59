"""Lab clusters for the tests of the Kubernetes-layer stages (cni, remediation, apps).

StageCluster: a lab of its own (started with lab.testing.start_lab: a free net, time scale 0) with an inventory folder
(the lab's hosts.yml, links to inventories/lab/group_vars and files, as `make demo` reads them), an artifacts folder,
and helpers to run site.yml or a few tasks against it, read through the ansible.posix.json callback:

    cluster = StageCluster.start(folder, control_planes=3, workers=3)
    run = cluster.site('--tags', THROUGH_CNI)          # -> Run: rc, stats, changed(), results(task part), failures()
    cluster.kubectl('get', 'pods', '-A')               # kubectl / helm from .tools/bin (the npm package's binaries)
    cluster.stick_kubelet('lab-w-2', p=1.0)            # a worker whose kubelet waits on its volume after a Talos reboot
    cluster.stop()

PATH gets .tools/bin first, so helm (kubernetes.core.helm, helm_template) is the helm 4 of the npm package.
"""

import json
import os
import subprocess

import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client as talos_client
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from lab.testing import start_lab

from json_run import JsonRun as Run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK_BIN = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
TOOLS = os.path.join(ROOT, '.tools', 'bin')
SITE = os.path.join(ROOT, 'site.yml')

THROUGH_KUBECONFIG = 'preflight,vms,secrets,apply,bootstrap,kubeconfig'
THROUGH_CNI = THROUGH_KUBECONFIG + ',cni'
THROUGH_APPS = THROUGH_CNI + ',apps'


def environment(folder=None):
    """ansible-playbook's environment: the repository's ansible.cfg, JSON output, helm/kubectl from .tools/bin, and
    (with a folder) temporary files of its own, away from ~/.ansible/tmp that other runs on the machine share."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_STDOUT_CALLBACK='ansible.posix.json',
               ANSIBLE_LOCALHOST_WARNING='false', ANSIBLE_INVENTORY_UNPARSED_WARNING='false',
               PATH=TOOLS + os.pathsep + os.environ.get('PATH', ''))
    if folder is not None:
        env['ANSIBLE_LOCAL_TEMP'] = os.path.join(folder, 'ansible-tmp', 'local')
        env['ANSIBLE_REMOTE_TEMP'] = os.path.join(folder, 'ansible-tmp', 'remote')
    return env


def render_cilium_manifest(cluster):
    """A lab on upstream Kubernetes names its inline Cilium manifest in the run dir (the upstream chart's `helm
    template` output, lab/world.py _inventory_vars); write it with the repository's render-cilium.yml (the cni role's
    render_manifest entry point), as a user does once (docs/stages/cni.md). A lab/k8s lab ships its manifest: nothing
    to do. `cluster`: a handle with the lab's hosts (hosts.yml read), a folder of its own and a playbook runner
    (StageCluster, gitops_lab's)."""
    manifest = (cluster.hosts['cluster'].get('vars') or {}).get('lab_cilium_manifest')
    if not manifest or os.path.exists(manifest):
        return
    run = cluster.playbook(os.path.join(ROOT, 'render-cilium.yml'), timeout=300)
    assert run.rc == 0 and os.path.exists(manifest), 'rendering %s: %s' % (manifest, run.explain())


def start_rendered_lab(run_dir, **options):
    """start_lab(run_dir, **options), then, on a lab of the upstream world, its inline Cilium manifest rendered once
    (render_cilium_manifest, from an inventory folder beside run_dir), as a user renders it before the first run."""
    lab = start_lab(run_dir, **options)
    try:
        StageCluster(lab, os.path.join(os.path.dirname(os.path.abspath(run_dir)), 'render-cilium')).render_cilium_manifest()
    except BaseException:
        lab.stop()
        raise
    return lab


class StageCluster(object):
    """A lab, its inventory folder and artifacts folder, and ways to run the collection against it."""

    def __init__(self, lab, folder):
        self.lab = lab
        self.folder = folder
        self.inventory = os.path.join(folder, 'inventory')
        self.artifacts = os.path.join(folder, 'artifacts')
        os.makedirs(self.inventory, exist_ok=True)
        with open(lab.inventory, encoding='utf-8') as source:
            text = source.read()
        with open(os.path.join(self.inventory, 'hosts.yml'), 'w', encoding='utf-8') as target:
            target.write(text)
        for name in ('group_vars', 'files'):
            link = os.path.join(self.inventory, name)
            if not os.path.lexists(link):
                os.symlink(os.path.join(ROOT, 'inventories', 'lab', name), link)
        self.hosts = yaml.safe_load(text)

    @classmethod
    def start(cls, folder, **options):
        handle = cls(start_lab(os.path.join(folder, 'lab'), **options), folder)
        try:
            handle.render_cilium_manifest()
        except BaseException:
            handle.stop()
            raise
        return handle

    def render_cilium_manifest(self):
        render_cilium_manifest(self)

    def stop(self):
        self.lab.stop()

    @classmethod
    def through_cni(cls, folder, **options):
        """A generator for a module fixture: a lab taken through the cni stage, yielded, then stopped."""
        handle = cls.start(folder, **options)
        try:
            first = handle.site('--tags', THROUGH_CNI)
            assert first.rc == 0, first.explain()
            yield handle
        finally:
            handle.stop()

    # ------------------------------------------------------------------ ansible

    def playbook(self, playbook, *args, timeout=900):
        command = [PLAYBOOK_BIN, playbook, '-i', self.inventory, '-e', 'proxtalos_artifacts_dir=%s' % self.artifacts]
        completed = subprocess.run(command + list(args), capture_output=True, text=True, env=environment(self.folder), cwd=ROOT,
                                   timeout=timeout, check=False)
        return Run(completed)

    def site(self, *args, timeout=900):
        return self.playbook(SITE, *args, timeout=timeout)

    def extra_vars(self, name, values):
        """Write values to a JSON file in the folder; returns the '-e @file' arguments."""
        path = os.path.join(self.folder, '%s.json' % name)
        with open(path, 'w', encoding='utf-8') as handle:
            json.dump(values, handle)
        return ['-e', '@%s' % path]

    # ------------------------------------------------------------------ clients

    @property
    def kubeconfig(self):
        return os.path.join(self.artifacts, 'kubeconfig')

    @property
    def talosconfig(self):
        return os.path.join(self.artifacts, 'talosconfig')

    def tool(self, name, *args, check=True):
        completed = subprocess.run([os.path.join(TOOLS, name), '--kubeconfig', self.kubeconfig] + list(args),
                                   capture_output=True, text=True, timeout=120, check=False, env=environment())
        if check and completed.returncode != 0:
            raise AssertionError('%s %s failed (%d): %s' % (name, ' '.join(args), completed.returncode, completed.stderr))
        return completed

    def kubectl(self, *args, check=True):
        return self.tool('kubectl', *args, check=check)

    def kubectl_json(self, *args):
        return json.loads(self.kubectl(*(list(args) + ['-o', 'json'])).stdout)

    def helm(self, *args, check=True):
        return self.tool('helm', *args, check=check)

    # ------------------------------------------------------------------ Talos

    def node_address(self, host):
        """The address of an inventory host: static node_ip, else the VM's address in the lab."""
        for group in self.hosts['cluster']['children'].values():
            values = (group.get('hosts') or {}).get(host)
            if values is not None and values.get('node_ip'):
                return values['node_ip']
        for vm in self.lab.vms():
            if vm['name'] == host:
                return vm['address']
        raise AssertionError('no address for %s' % host)

    def talos(self, host):
        with open(self.talosconfig, encoding='utf-8') as handle:
            credentials = talos_client.TalosCredentials.from_talosconfig(yaml.safe_load(handle))
        return talos_client.TalosClient(self.node_address(host), credentials=credentials, timeout=10)

    def kubelet(self, host):
        """The kubelet service dict of a node (None while the node does not answer)."""
        try:
            with self.talos(host) as talos:
                return next(service for service in talos.service_list() if service['id'] == 'kubelet')
        except talos_errors.TalosTransientError:
            return None

    def stick_kubelet(self, host, p):
        """Field scenario: a worker reboots and its kubelet then waits on its volume for good.

        The fault is set with p=0 so the Talos reboot that triggers it cannot clear it, then set to p, the chance
        that the next Talos reboot (the remediation's) clears it.
        """
        self.lab.fault('talos-kubelet-volume', host, p=0.0)
        with self.talos(host) as talos:
            talos.reboot()

        def stuck():
            kubelet = self.kubelet(host)
            events = (kubelet or {}).get('events') or []
            waiting = bool(events) and events[-1]['state'] == 'Waiting' and 'volume' in events[-1]['msg']
            return waiting, events[-1] if events else 'no answer'
        result = _wait.wait_for(stuck, 30, interval=0.05)
        assert result.ok, 'kubelet of %s did not get stuck on its volume: %r' % (host, result.observation)
        self.lab.fault('talos-kubelet-volume', host, p=p)
        return result.observation
