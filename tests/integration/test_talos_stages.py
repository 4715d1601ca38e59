"""The Talos stages (secrets, apply, bootstrap, kubeconfig) through site.yml against a lab of their own.

One lab (3 control planes + 3 workers, time scale 0) for the module; the tests run in order on it:
maintenance -> configured -> bootstrapped -> kubeconfig, a re-run with changed=0, a second bootstrap
reported ok, a changed host patch applied to exactly that node (diff shown), a patch that does not apply failing
the render naming the node (nothing written), a config with an unknown key refused naming the key, an unreachable
node failing after the deadline, and a reboot hang reported.
The secrets bundle is vault-encrypted (ANSIBLE_VAULT_PASSWORD_FILE, the role's default source).
"""

import os
import stat
import sys

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pve_playbook import PLAYBOOK_BIN, ROOT, run_playbook  # noqa: E402  pylint: disable=wrong-import-position,import-error

from ansible_collections.proxtalos.cluster.plugins.module_utils import _vault  # noqa: E402
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client as talos_client  # noqa: E402
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors  # noqa: E402
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import secrets, talosconfig  # noqa: E402
from k8s_stages_lab import start_rendered_lab  # noqa: E402  pylint: disable=wrong-import-position,import-error

pytestmark = [pytest.mark.lab, pytest.mark.slow]

STAGES = 'preflight,vms,secrets,apply,bootstrap,kubeconfig'
VAULT_PASSWORD = 'talos-stages-test-vault-password'
CONTROL_PLANES = ('lab-cp-1', 'lab-cp-2', 'lab-cp-3')
WORKERS = ('lab-w-1', 'lab-w-2', 'lab-w-3')


class TalosWorkspace(object):
    """The lab, an inventory folder for it (hosts.yml + the lab's group_vars and files, host_vars of our own),
    and the artifacts folder."""

    def __init__(self, lab, folder):
        self.lab = lab
        self.inventory = os.path.join(folder, 'inventory')
        self.artifacts = os.path.join(folder, 'artifacts')
        os.makedirs(os.path.join(self.inventory, 'host_vars'))
        with open(lab.inventory, encoding='utf-8') as source, open(os.path.join(self.inventory, 'hosts.yml'), 'w',
                                                                   encoding='utf-8') as target:
            target.write(source.read())
        for name in ('group_vars', 'files'):
            if os.path.exists(os.path.join(ROOT, 'inventories', 'lab', name)):
                os.symlink(os.path.join(ROOT, 'inventories', 'lab', name), os.path.join(self.inventory, name))
        self.vault_password_file = os.path.join(folder, 'vault-password')
        with open(self.vault_password_file, 'w', encoding='utf-8') as handle:
            handle.write(VAULT_PASSWORD + '\n')
        os.chmod(self.vault_password_file, 0o600)

    @property
    def secrets_path(self):
        return os.path.join(self.inventory, 'secrets', 'talos-secrets.yaml')

    @property
    def talosconfig_path(self):
        return os.path.join(self.artifacts, 'talosconfig')

    def run(self, *args, playbook=None, extra_vars=None):
        values = {'proxtalos_artifacts_dir': self.artifacts}
        values.update(extra_vars or {})
        options = {'extra_vars': values, 'timeout': 900}
        if playbook:
            options['playbook'] = playbook
        previous = os.environ.get('ANSIBLE_VAULT_PASSWORD_FILE')
        os.environ['ANSIBLE_VAULT_PASSWORD_FILE'] = self.vault_password_file
        try:
            return run_playbook(self.inventory, *args, **options)
        finally:
            if previous is None:
                del os.environ['ANSIBLE_VAULT_PASSWORD_FILE']
            else:
                os.environ['ANSIBLE_VAULT_PASSWORD_FILE'] = previous

    def host_patch(self, host, patches):
        path = os.path.join(self.inventory, 'host_vars', '%s.yml' % host)
        if patches is None:
            if os.path.exists(path):
                os.unlink(path)
            return
        with open(path, 'w', encoding='utf-8') as handle:
            yaml.safe_dump({'talos_host_patches': patches}, handle)

    def address(self, host):
        for row in self.lab.vms():
            if row['name'] == host:
                return row['address']
        raise AssertionError('no VM %s in the lab' % host)

    def talos_nodes(self):
        return dict((node['name'], node) for node in self.lab.status()['talos']['nodes'])

    def client(self, host):
        with open(self.talosconfig_path, encoding='utf-8') as handle:
            parsed = talosconfig.parse_talosconfig(handle.read())
        credentials = talos_client.TalosCredentials(parsed.ca_pem, parsed.crt_pem, parsed.key_pem_talos)
        return talos_client.TalosClient(self.address(host), credentials=credentials, timeout=10)

    def playbook(self, name, text):
        path = os.path.join(os.path.dirname(self.inventory), name)
        with open(path, 'w', encoding='utf-8') as handle:
            handle.write(text)
        return path


def results_by_host(run, task_part):
    return dict((host, result) for _name, host, result in run.results(task_part))


def changed_hosts(run):
    return sorted(host for host, stats in run.stats.items() if stats.get('changed'))


def apply_result(run):
    """(host that ran it, result) of the apply task: one talos_apply run (run_once) applies every node of the play."""
    applied = results_by_host(run, 'Apply the machine config')
    assert len(applied) == 1, applied
    return next(iter(applied.items()))


def applied_nodes(run):
    """Each node's own result in the apply task's one run, by inventory host."""
    return apply_result(run)[1]['nodes']


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    if not os.access(PLAYBOOK_BIN, os.X_OK):
        pytest.skip('no ansible-playbook in .venv (make setup)')
    folder = str(tmp_path_factory.mktemp('talos-stages'))
    lab = start_rendered_lab(os.path.join(folder, 'lab'))
    try:
        yield TalosWorkspace(lab, folder)
    finally:
        lab.stop()


@pytest.fixture(scope='module')
def converged(workspace):
    """The workspace after the first run of the stages preflight to kubeconfig (the run is workspace.first)."""
    workspace.first = workspace.run('--tags', STAGES)
    assert workspace.first.rc == 0, workspace.first.describe()
    return workspace


def test_maintenance_to_kubeconfig_then_rerun_unchanged(converged):
    workspace = converged
    first = workspace.first

    applied = applied_nodes(first)
    assert sorted(applied) == sorted(CONTROL_PLANES + WORKERS)
    for host, result in applied.items():
        assert result['changed'] is True, host
        assert result['node_mode'] == 'maintenance' and result['rebooted'] is True and result['verified'] is True, host
        assert result['node'] == '%s:50000' % workspace.address(host)
    # one module run applied every node; its gates list carries one passed gate per node, under the node's host
    assert sorted((gate['host'], gate['ok']) for gate in apply_result(first)[1]['gates']) == [
        (host, True) for host in sorted(CONTROL_PLANES + WORKERS)]
    nodes = workspace.talos_nodes()
    assert all(nodes[host]['mode'] == 'configured' for host in CONTROL_PLANES + WORKERS), nodes

    # etcd bootstrapped without waiting for the joins; the quorum is the gate of the stage's later play
    bootstrap = results_by_host(first, 'Bootstrap etcd once')
    assert list(bootstrap.values())[0]['outcome'] == 'bootstrapped' and list(bootstrap.values())[0]['quorum'] is False
    quorum = list(results_by_host(first, 'Gate - etcd quorum').values())
    assert len(quorum) == 1 and quorum[0]['outcome'] == 'already_bootstrapped' and quorum[0]['changed'] is False
    assert quorum[0]['quorum'] is True and len(quorum[0]['members']) == 3
    # one run_once task probes every node; its gates list carries one passed gate per node, under the node's host
    services_gate = list(results_by_host(first, 'Gate - Talos services Running and healthy').values())
    assert len(services_gate) == 1
    assert sorted((gate['host'], gate['ok']) for gate in services_gate[0]['gates']) == [
        (host, True) for host in sorted(CONTROL_PLANES + WORKERS)]
    assert all(gate['target'] == '%s:50000' % workspace.address(gate['host']) for gate in services_gate[0]['gates'])

    # Files: the vault-encrypted bundle, the configs, talosconfig and kubeconfig, all 0600.
    with open(workspace.secrets_path, 'rb') as handle:
        envelope = handle.read()
    assert _vault.is_encrypted(envelope)
    bundle = secrets.parse_bundle(_vault.decrypt(envelope, VAULT_PASSWORD).decode())
    for name in ['talosconfig', 'kubeconfig'] + ['%s.yaml' % host for host in CONTROL_PLANES + WORKERS]:
        assert stat.S_IMODE(os.stat(os.path.join(workspace.artifacts, name)).st_mode) == 0o600, name
    assert stat.S_IMODE(os.stat(workspace.secrets_path).st_mode) == 0o600
    with open(os.path.join(workspace.artifacts, 'kubeconfig'), encoding='utf-8') as handle:
        kubeconfig = yaml.safe_load(handle)
    assert kubeconfig['clusters'][0]['cluster']['server'] == 'https://%s:6443' % workspace.lab.cluster_endpoint
    # No secret of the bundle in anything the run printed.
    for value in bundle.secret_values():
        assert value not in first.stderr and value not in str(first.document)

    again = workspace.run('--tags', STAGES)
    assert again.rc == 0 and again.changed == 0, again.describe()
    checked = workspace.run('--tags', STAGES, '--check', '--diff')
    assert checked.rc == 0 and checked.changed == 0, checked.describe()
    with open(workspace.secrets_path, 'rb') as handle:
        assert handle.read() == envelope


def test_second_bootstrap_is_refused_by_talos_and_reported_ok(converged):
    workspace = converged
    since = workspace.lab.last_seq('requests')
    run = workspace.run('--tags', 'bootstrap')
    assert run.rc == 0 and run.changed == 0, run.describe()
    result = list(results_by_host(run, 'Bootstrap etcd once').values())[0]
    assert result['outcome'] == 'already_bootstrapped' and result['bootstrap_node'] == '' and result['quorum'] is False
    quorum = list(results_by_host(run, 'Gate - etcd quorum').values())[0]
    assert quorum['outcome'] == 'already_bootstrapped' and quorum['quorum'] is True
    bootstraps = [entry for entry in workspace.lab.requests(since=since) if entry.get('method', '').endswith('/Bootstrap')]
    assert bootstraps == []
    # What Talos itself says to a second bootstrap, on any control plane: AlreadyExists.
    for host in ('lab-cp-1', 'lab-cp-2'):
        with workspace.client(host) as connection:
            with pytest.raises(talos_errors.TalosApiError) as refused:
                connection.bootstrap()
        assert refused.value.already_exists


def test_a_sub_stage_tag_runs_its_one_play(converged):
    """--tags bootstrap_gates runs the bootstrap stage's gates play only (and the always plays): the quorum and
    services gates pass, etcd's bootstrap play and every other stage's play run no task but their roles' argument
    checks (tagged always by ansible-core)."""
    run = converged.run('--tags', 'bootstrap_gates')
    assert run.rc == 0 and run.changed == 0, run.describe()
    with_tasks = [play['play']['name'].split(' - ')[0] for play in run.document.get('plays', [])
                  if any(task.get('hosts') and 'Validating arguments' not in task['task']['name']
                         for task in play.get('tasks', []))]
    assert [name for name in with_tasks if name.startswith('Stage ')] == ['Stage bootstrap (gates)'], with_tasks
    quorum = list(results_by_host(run, 'Gate - etcd quorum').values())
    assert len(quorum) == 1 and quorum[0]['quorum'] is True, quorum
    assert not results_by_host(run, 'Bootstrap etcd once')


def test_a_changed_host_patch_applies_exactly_that_node_with_a_diff(converged):
    workspace = converged
    workspace.host_patch('lab-w-1', [{'machine': {'nodeLabels': {'zone': 'b'}}}])
    try:
        run = workspace.run('--tags', 'apply', '--diff')
        assert run.rc == 0, run.describe()
        # The render task runs once for every node: its change is counted on the host that ran it (run_once takes
        # the first host of the play: the plays after vms keep the inventory's order, so the first control plane).
        rendered = results_by_host(run, 'Machine config of every node')
        assert list(rendered) == [CONTROL_PLANES[0]], rendered
        render_host = CONTROL_PLANES[0]
        # the apply task, too, runs once for every node, on the same host: its change is counted there
        apply_host, applied_all = apply_result(run)
        assert apply_host == CONTROL_PLANES[0] and applied_all['changed'] is True
        assert changed_hosts(run) == sorted({render_host, apply_host})
        applied = applied_all['nodes']
        assert applied['lab-w-1']['changed'] is True and applied['lab-w-1']['applied_mode'] == 'no_reboot'
        assert all(result['changed'] is False for host, result in applied.items() if host != 'lab-w-1')
        # one diff, lab-w-1's own, headed by its name and address
        assert len(applied_all['diff']) == 1, applied_all['diff']
        assert applied_all['diff'][0]['prepared'].startswith('--- lab-w-1 (%s:50000) (running config)' % workspace.address('lab-w-1'))
        # the node's own diff (Talos's encoding: the label sits under machine.nodeLabels)
        assert any(line.startswith('+') and line[1:].strip() == 'zone: b' for line in applied_all['diff'][0]['prepared'].splitlines())
        rendered = rendered[render_host]
        assert sorted(rendered['nodes']) == sorted(CONTROL_PLANES + WORKERS)
        assert [host for host, node in rendered['nodes'].items() if node['config_changed']] == ['lab-w-1']
        assert rendered['talosconfig_changed'] is False
        assert [diff['after_header'] for diff in rendered['diff']] == [
            'lab-w-1: %s (this render)' % os.path.join(workspace.artifacts, 'lab-w-1.yaml')]
        diff = rendered['diff'][0]
        assert 'zone: b' in diff['after'] and 'zone: b' not in diff['before']

        again = workspace.run('--tags', 'apply')
        assert again.rc == 0 and again.changed == 0, again.describe()
    finally:
        workspace.host_patch('lab-w-1', None)
    restored = workspace.run('--tags', 'apply')
    render_host = next(iter(results_by_host(restored, 'Machine config of every node')))
    assert restored.rc == 0 and changed_hosts(restored) == sorted({render_host, apply_result(restored)[0]}), restored.describe()
    assert [host for host, result in applied_nodes(restored).items() if result['changed']] == ['lab-w-1']


def test_a_patch_that_does_not_apply_fails_naming_the_node_and_writes_nothing(converged):
    workspace = converged
    names = ['talosconfig'] + ['%s.yaml' % host for host in CONTROL_PLANES + WORKERS]

    def files():
        out = {}
        for name in names:
            with open(os.path.join(workspace.artifacts, name), 'rb') as handle:
                out[name] = handle.read()
        return out

    kept = files()
    workspace.host_patch('lab-w-2', [[{'op': 'replace', 'path': '/machine/nope', 'value': 1}]])
    try:
        run = workspace.run('--tags', 'secrets')
        assert run.rc != 0
        # One run renders every node: it fails on the host that ran it, naming the node and the patch.
        message = '\n'.join(run.failures().values())
        assert 'nodes[lab-w-2].patches.host[0]' in message and '/machine/nope' in message, message
        assert files() == kept
    finally:
        workspace.host_patch('lab-w-2', None)
    restored = workspace.run('--tags', 'secrets')
    assert restored.rc == 0 and restored.changed == 0, restored.describe()


def test_a_config_with_an_unknown_key_fails_naming_the_key(converged):
    workspace = converged
    workspace.host_patch('lab-w-2', [{'machine': {'kubelet': {'extraArgz': {'v': '2'}}}}])
    try:
        run = workspace.run('--tags', 'apply', '--limit', 'lab-w-2')
        assert run.rc != 0
        message = run.failures()['lab-w-2']
        assert 'extraArgz' in message and 'unknown keys' in message and workspace.address('lab-w-2') in message
    finally:
        workspace.host_patch('lab-w-2', None)
    restored = workspace.run('--tags', 'apply', '--limit', 'lab-w-2')
    assert restored.rc == 0, restored.describe()
    assert applied_nodes(restored)['lab-w-2']['changed'] is False


def test_an_unreachable_node_fails_naming_it_after_the_deadline(converged):
    workspace = converged
    workspace.lab.fault('talos-unreachable', 'lab-w-3')
    try:
        run = workspace.run('--tags', 'apply', '--limit', 'lab-w-3',
                            extra_vars={'talos_machines_apply_timeout': 3, 'talos_machines_call_timeout': 1,
                                        'talos_machines_wait_sleep': 0.5})
    finally:
        workspace.lab.clear('talos-unreachable', 'lab-w-3')
    assert run.rc != 0
    message = run.failures()['lab-w-3']
    assert '%s:50000' % workspace.address('lab-w-3') in message
    assert 'gave up after 3s waiting for the Talos API answering on port 50000' in message
    assert 'Disks got no answer within 1.0s' in message


def test_a_reboot_hang_is_reported_not_waited_on(converged):
    workspace = converged
    reboot = workspace.playbook('reboot.yml', """---
- name: Reboot one node (remediation)
  hosts: lab-w-3
  gather_facts: false
  tasks:
    - name: Reboot and wait until it is back
      proxtalos.cluster.talos_reboot:
        node: "{{ node_ip }}"
        talosconfig: "{{ proxtalos_artifacts_dir }}/talosconfig"
        healthy_services: [kubelet]
        api_timeout: 1
        wait_timeout: "{{ reboot_timeout }}"
        wait_sleep: 0.2
""")
    ok = workspace.run('--tags', 'all', playbook=reboot, extra_vars={'reboot_timeout': 120, 'node_ip': workspace.address('lab-w-3')})
    assert ok.rc == 0, ok.describe()
    result = results_by_host(ok, 'Reboot and wait')['lab-w-3']
    assert result['changed'] is True and result['boot_after'] and result['boot_after'] != result['boot_before']

    workspace.lab.fault('talos-reboot-hang', 'lab-w-3')
    try:
        hung = workspace.run('--tags', 'all', playbook=reboot, extra_vars={'reboot_timeout': 3, 'node_ip': workspace.address('lab-w-3')})
    finally:
        workspace.lab.clear('talos-reboot-hang', 'lab-w-3')
    assert hung.rc != 0
    message = hung.failures()['lab-w-3']
    assert 'gave up after 3s waiting for the node back after the reboot' in message
    assert workspace.address('lab-w-3') in message
    # A hung node comes back only with a VM reset (what remediation does next).
    vmid = next(row['vmid'] for row in workspace.lab.vms() if row['name'] == 'lab-w-3')
    pve_node = next(row['node'] for row in workspace.lab.vms() if row['name'] == 'lab-w-3')
    workspace.lab.proxmox().nodes(pve_node).qemu(vmid).status.reset.post()
    back = workspace.run('--tags', 'bootstrap', '--limit', 'lab-w-3')
    assert back.rc == 0, back.describe()
