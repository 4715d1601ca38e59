"""The fault matrix: every fault the lab offers, injected at the stage where it bites, with the expected outcome.

test_fault_matrix.py runs each row against the lab and records what it saw in docs/reliability-results.json;
docs/reliability.md shows the table and those results between two markers, rendered by this module:

    .venv/bin/python tests/integration/fault_matrix.py      # re-render docs/reliability.md from ROWS + results

and test_fault_matrix.py::test_the_document_shows_this_table_and_the_latest_results fails when the document and
the table differ, so neither can drift from the other.

A row:
  id         short name (the pytest id)
  layer      PVE, Talos, Kubernetes or Flux
  fault      lab fault name; target and params as `python -m lab fault NAME TARGET key=value`
  stage      the stage where it bites (a failure must come from a task of that stage's play)
  start      the lab state the row needs: `empty` (no VMs), `vms` (VMs running, Talos in maintenance mode),
             `converged` (site.yml done), `scaled` (a 1-node lab of its own at time scale 0.05: the fault needs time)
  before     steps before the fault: ('stop_vm', host)
  after      steps after the fault, before the run: ('power_cycle', host) (PVE stop + start: the node boots again),
             ('delete_pods', namespace, label selector) (the controller makes new ones), ('reconcile', kustomization),
             ('flux_reason', kustomization, reason): wait until the Kustomization's Ready condition has that reason, so
             that a gate with a short deadline judges the state the fault leads to (upstream kustomize-controller
             reconciles a dependent Kustomization of a new revision only after its dependencies did and its
             --requeue-dependency interval, 30 s by default, passed: v1.9.5 main.go:116,
             internal/controller/kustomization_controller.go:258-262)
  during     ('clear_after', source, path end, count): clear the fault once the lab has answered that many such
             requests in the run (count 2: the first attempt met the fault and was retried; what follows shows whether
             the run rides it out)
  playbook   the playbook the run uses, by its name under playbooks/ (default: site.yml at the repository's root);
             its plays' stage is their first play-level tag
  run        the tags of the run that meets the fault (plus short deadlines in extra_vars for failing rows, and
             environment variables in env: the PVE modules read PROXMOX_API_TIMEOUT)
  expect     `recovered` (the run converges, and the evidence shows the fault did bite) or `failed`
  names      for `failed`: what the failure message itself must name - the node or object, and the cause (the host
             Ansible puts before a failure does not count); `{addr:HOST}` stands for the address of HOST's Talos node in
             this run (a worker's comes from DHCP). For `recovered`: the evidence
  note       what the collection does about it, in a few words
  worlds     what differs on a world of the lab: {world: {'stage': ..., 'names': ..., 'note': ...}}, world one of WORLDS; a test run
             checks (and this page shows) the expectation of the world the row ran on. Only for what the world itself
             changes: e.g. on the upstream world the lab's Git server is real smart HTTP and the flux stage pushes to it
"""

import collections
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, 'docs', 'reliability.md')
RESULTS = os.path.join(ROOT, 'docs', 'reliability-results.json')
BEGIN = '<!-- fault-matrix:begin (rendered by tests/integration/fault_matrix.py; do not edit by hand) -->'
END = '<!-- fault-matrix:end -->'

Row = collections.namedtuple('Row', 'id layer fault target params stage start before after during run extra_vars env expect names note '
                                    'attempts playbook worlds')

# The worlds a row can run on (tests/integration/test_fault_matrix.py: current_world), as the results name them.
WORLDS = {
    'lab': 'the lab world (lab/k8s and lab/flux, being retired: `PROXTALOS_LAB_KUBERNETES=lab PROXTALOS_LAB_FLUX=lab`)',
    'upstream': 'the upstream world (`PROXTALOS_LAB_KUBERNETES=upstream PROXTALOS_LAB_FLUX=upstream`, the default: upstream '
                "Kubernetes and Flux's controllers, docs/lab-kubernetes.md)",
    'upstream-kubernetes': 'upstream Kubernetes without Flux, its Git server and artifact mirror only (lab/flux_sources.py, '
                           '`PROXTALOS_LAB_KUBERNETES=upstream PROXTALOS_LAB_FLUX=lab`)',
}
WORLD_OVERRIDES = ('stage', 'names', 'note')

# Short deadlines, so that a failing row fails in seconds (each stage's defaults are minutes).
VMS_SHORT = {'proxmox_vms_timeout': 4, 'proxmox_vms_address_timeout': 4, 'proxmox_vms_image_timeout': 4,
             'proxmox_vms_wait_sleep': 1, 'preflight_pve_timeout': 4}
TALOS_SHORT = {'talos_machines_api_timeout': 3, 'talos_machines_apply_timeout': 6, 'talos_machines_call_timeout': 2,
               'talos_machines_wait_sleep': 1, 'talos_cluster_services_timeout': 3, 'talos_cluster_bootstrap_timeout': 3,
               'talos_cluster_call_timeout': 2, 'talos_cluster_wait_sleep': 1}
CNI_SHORT = {'cni_api_timeout': 20, 'cni_nodes_registered_timeout': 4, 'cni_agents_timeout': 4, 'cni_nodes_ready_timeout': 4,
             'cni_operator_timeout': 4, 'cni_wait_sleep': 1, 'cni_remediate_detect_timeout': 3,
             'cni_remediate_wait_timeout': 10, 'cni_remediate_reboot_timeout': 5, 'cni_remediate_wait_sleep': 1}
GITOPS_SHORT = {'gitops_timeout': 4, 'gitops_csi_timeout': 4, 'gitops_wait_sleep': 1}
APPS_SHORT = {'bootstrap_apps_timeout': 4, 'bootstrap_apps_wait_sleep': 1}
FLUX_SHORT = {'flux_controllers_timeout': 20, 'flux_source_timeout': 4, 'flux_wait_sleep': 1}
# The remediation rows: the cni stage finds the stuck kubelet fast, and reboots/resets wait long enough.
REMEDIATE = {'cni_remediate_detect_timeout': 3, 'cni_remediate_wait_timeout': 10, 'cni_remediate_reboot_timeout': 5,
             'cni_remediate_wait_sleep': 1, 'cni_wait_sleep': 1}


def row(id, layer, fault, stage, start, run, expect, names, note, target=None, params=None, before=(), after=(),  # pylint: disable=redefined-builtin
        during=None, extra_vars=None, env=None, attempts=1, playbook=None, worlds=None):
    """attempts: for a fault that comes and goes on its own clock (a flap), how many runs may converge without
    meeting it before the row fails for showing no sign of it (the fault stays on between them). worlds: {world:
    {'stage': ..., 'names': [...], 'note': '...'}}, the expectation on that world where it differs."""
    worlds = dict(worlds or {})
    for world, overrides in worlds.items():
        if world not in WORLDS:
            raise ValueError('row %s: worlds: unknown world %r (one of %s)' % (id, world, ', '.join(WORLDS)))
        unknown = sorted(set(overrides) - set(WORLD_OVERRIDES))
        if unknown:
            raise ValueError('row %s: worlds[%s]: only %s may differ, got %s' % (id, world, ', '.join(WORLD_OVERRIDES), unknown))
        if 'names' in overrides:
            worlds[world] = dict(overrides, names=tuple(overrides['names']))
    return Row(id, layer, fault, target, params or {}, stage, start, tuple(before), tuple(after), during, run,
               extra_vars or {}, env or {}, expect, tuple(names), note, attempts, playbook, worlds)


def for_world(r, world):
    """The row as it is expected to go on world (its worlds entry applied), without its worlds."""
    if world is not None and world not in WORLDS:
        raise ValueError('row %s: unknown world %r (one of %s)' % (r.id, world, ', '.join(WORLDS)))
    return r._replace(worlds={}, **r.worlds.get(world, {}))


ROWS = [
    # ---------------------------------------------------------------- PVE
    row('pve-5xx-transient', 'PVE', 'pve-5xx', 'vms', 'empty', 'vms', 'recovered',
        ['retries', '503'], 'retried with backoff on the stage deadline', params={'times': 4, 'status': 503}),
    row('pve-5xx-persistent', 'PVE', 'pve-5xx', 'vms', 'empty', 'vms', 'failed',
        ['on node pve1', 'list iso content failed', '502 Bad Gateway'], 'retried until the deadline, then fails naming the node, the call and the answer',
        params={'times': 0, 'status': 502, 'message': 'Bad Gateway'}, extra_vars=VMS_SHORT),
    row('pve-flaky-drop', 'PVE', 'pve-flaky-network', 'vms', 'empty', 'vms', 'recovered',
        ['retries', 'Connection'], 'dropped connections are retried', params={'drop_rate': 0.2, 'seed': 7}),
    row('pve-flaky-hang', 'PVE', 'pve-flaky-network', 'vms', 'empty', 'vms', 'recovered',
        ['retries', 'timed out'], 'a hung request ends at the API timeout and is retried',
        params={'drop_rate': 0.0, 'hang_rate': 0.05, 'hang_secs': 30, 'seed': 11}, env={'PROXMOX_API_TIMEOUT': '2'}),
    row('pve-slow-network', 'PVE', 'pve-slow-network', 'vms', 'scaled', 'vms', 'recovered',
        ['fault active'], 'slow answers (0.2 s each) stay within the deadlines', params={'latency': 4}),
    row('pve-config-lock-released', 'PVE', 'pve-config-lock', 'vms', 'vms', 'vms', 'recovered',
        ['retries', "can't lock file"], 'the start meets the lock and is retried; once the lock is released, it starts',
        target='1013', before=[('stop_vm', 'lab-cp-3')], during=('clear_after', 'pve', '/qemu/1013/status/start', 2)),
    row('pve-config-lock-held', 'PVE', 'pve-config-lock', 'vms', 'vms', 'vms', 'failed',
        ['VM 1013 (lab-cp-3)', "can't lock file"], 'fails at the deadline naming the VM and the lock', target='1013',
        before=[('stop_vm', 'lab-cp-3')], extra_vars=VMS_SHORT),
    row('pve-task-error-create', 'PVE', 'pve-task-error', 'vms', 'empty', 'vms', 'failed',
        ['VM 1022 (lab-w-2)', 'create failed', 'unable to create VM 1022'], 'a failed task is not retried blindly: fails naming VM, '
        'operation and the task log', target='create', params={'vmid': '1022'}, extra_vars=VMS_SHORT),
    row('pve-task-error-start', 'PVE', 'pve-task-error', 'vms', 'empty', 'vms', 'failed',
        ['VM 1011 (lab-cp-1)', 'start failed', 'QEMU exited'], 'fails naming VM, operation and the task log',
        target='start', params={'vmid': '1011'}, extra_vars=VMS_SHORT),
    row('pve-task-error-download', 'PVE', 'pve-task-error', 'vms', 'empty', 'vms', 'failed',
        ['local:iso/talos-', 'on node pve1', 'download from https://factory.talos.dev', 'TASK ERROR: download failed'],
        'retried until the deadline (a download may be flaky), then fails naming the image, node, URL and task log',
        target='download-url', extra_vars=VMS_SHORT),
    row('pve-node-offline', 'PVE', 'pve-node-offline', 'preflight', 'empty', 'preflight,vms', 'failed',
        ['lab-cp-1', "PVE node 'pve1' is offline"], 'preflight stops before anything is created', target='pve1',
        extra_vars=VMS_SHORT),
    row('pve-storage-full', 'PVE', 'pve-storage-full', 'preflight', 'empty', 'preflight,vms', 'failed',
        ['lab-cp-1', "no room: storage 'local-lvm' on PVE node pve1 has 0.0 GiB free", 'need at least 60 GiB'],
        'preflight stops before anything is created, naming the storage, its free space and what the VMs need at least',
        target='local-lvm', extra_vars=VMS_SHORT),
    row('pve-agent-down', 'PVE', 'pve-agent-down', 'vms', 'vms', 'vms', 'failed',
        ['VM 1021 (lab-w-1)', 'guest agent: QEMU guest agent is not running', 'siderolabs/qemu-guest-agent'],
        'the address gate names the VM and what its '
        'guest agent answered, with a hint to check the image\'s qemu-guest-agent extension', target='1021', extra_vars=VMS_SHORT),
    row('talos-agent-maintenance', 'PVE', 'talos-agent-maintenance', 'vms', 'empty', 'vms', 'recovered', ['fault active'],
        'no guest agent while Talos is in maintenance mode: the address gate finds the static control plane by its '
        'inventory address and its Talos API, and the stage goes on', target='1011'),
    row('pve-privilege-agent', 'PVE', 'pve-privilege-revoked', 'vms', 'vms', 'vms', 'failed',
        ['VM 1011', 'permission denied', 'GET /nodes/pve1/qemu/1011/agent/network-get-interfaces',
         'VM.GuestAgent.Audit (or VM.GuestAgent.Unrestricted) on /vms/1011'],
        'a 403 fails the address gate at once, naming the call and the privilege (not "agent not up yet")',
        target='VM.GuestAgent.Audit', extra_vars=dict(VMS_SHORT, proxmox_vms_address_timeout=120)),
    row('pve-privilege-download', 'PVE', 'pve-privilege-revoked', 'preflight', 'empty', 'preflight,vms', 'failed',
        ['talos_image_url', 'may not download it', 'Sys.AccessNetwork on /nodes/pve1 (or Sys.Audit and Sys.Modify on /)'],
        'preflight names the missing download privilege and its alternative before anything is created',
        target='Sys.AccessNetwork', extra_vars=VMS_SHORT),
    row('pve-ha-managed', 'PVE', 'pve-ha-managed', 'vms', 'vms', 'vms', 'recovered',
        ['fault active'], 'the hastart task ends before the HA stack starts the VM: the stage waits on the observed power '
        'state, then on the address', target='1021', params={'delay': 2.0}, before=[('stop_vm', 'lab-w-1')]),
    # ---------------------------------------------------------------- Talos
    row('talos-unreachable-vms', 'Talos', 'talos-unreachable', 'vms', 'vms', 'vms', 'failed',
        ['{addr:lab-w-1}:50000', 'gave up', 'the Talos API answering on port 50000', 'got no answer'],
        'the API gate of the vms stage names the node that does not answer', target='lab-w-1',
        extra_vars=TALOS_SHORT),
    row('talos-apply-reject', 'Talos', 'talos-apply-reject', 'apply', 'vms', 'secrets,apply', 'failed',
        ['lab-cp-2 ({addr:lab-cp-2}:50000)', 'ApplyConfiguration failed', 'INVALID_ARGUMENT', 'configuration validation failed'],
        'fails naming the node and the validation error; the other nodes are applied',
        target='lab-cp-2', extra_vars=TALOS_SHORT),
    row('talos-unreachable-bootstrap', 'Talos', 'talos-unreachable', 'bootstrap', 'converged', 'bootstrap', 'failed',
        ['{addr:lab-cp-2}:50000', 'no answer'], 'the bootstrap step cannot see every control plane and names the silent one (by its '
        'address)', target='lab-cp-2',
        extra_vars=TALOS_SHORT),
    row('talos-kubelet-volume-reboot', 'Talos', 'talos-kubelet-volume', 'cni', 'converged', 'cni', 'recovered',
        ['talos reboot #1 (done) -> kubelet running'], 'remediated: a Talos reboot clears it',
        target='lab-w-1', params={'p': 1.0}, after=[('power_cycle', 'lab-w-1')], extra_vars=REMEDIATE),
    row('talos-kubelet-volume-reset', 'Talos', 'talos-kubelet-volume', 'cni', 'converged', 'cni', 'recovered',
        ['pve hard reset #1 (done) -> kubelet running'], 'remediated: the reboot does not clear it, the PVE hard reset does',
        target='lab-w-2', params={'p': 0.0}, after=[('power_cycle', 'lab-w-2')], extra_vars=REMEDIATE),
    row('talos-kubelet-volume-exhausted', 'Talos', 'talos-kubelet-volume', 'cni', 'converged', 'cni', 'failed',
        ['worker lab-w-3', 'kubelet still does not run', '/var/lib/kubelet'], 'remediation bounded: fails naming the node, '
        'the evidence and the steps tried', target='lab-w-3', params={'p': 0.0}, after=[('power_cycle', 'lab-w-3')],
        extra_vars=dict(REMEDIATE, cni_remediate_reset_attempts=0, **CNI_SHORT)),
    row('talos-reboot-hang', 'Talos', 'talos-reboot-hang', 'cni', 'converged', 'cni', 'recovered',
        ['talos reboot #1 (failed', 'pve hard reset #1 (done) -> kubelet running'], 'the reboot of the remediation hangs; '
        'the hard reset brings the node back (with talos-kubelet-volume p=1 on the node, so that it needs remediation)',
        target='lab-w-1', after=[('fault', 'talos-kubelet-volume', 'lab-w-1', {'p': 1.0}), ('power_cycle', 'lab-w-1')],
        extra_vars=REMEDIATE),
    row('talos-etcd-unhealthy', 'Talos', 'talos-etcd-unhealthy', 'bootstrap', 'converged', 'bootstrap', 'failed',
        ['{addr:lab-cp-2}', 'etcd is Running but not healthy', 'context deadline exceeded'], 'the quorum gate names the '
        'control plane whose etcd fails its health check, with the health message', target='lab-cp-2', extra_vars=TALOS_SHORT),
    row('talos-etcd-join-timeout', 'Talos', 'talos-etcd-join-timeout', 'bootstrap', 'vms', 'secrets,apply,bootstrap', 'failed',
        ['{addr:lab-cp-2}', 'etcd is Failed', 'Failed to run pre stage'], 'etcd on one control plane gave up joining before '
        'the bootstrap: the bootstrap still happens (an etcd Failed in its pre stage never held data), and the quorum '
        'gate names the node whose etcd stays Failed until it reboots', target='lab-cp-2', extra_vars=TALOS_SHORT),
    row('remove-node-quorum', 'Talos', 'talos-etcd-unhealthy', 'remove_node', 'converged', 'all', 'failed',
        ['refusing to remove the etcd member of lab-cp-1', 'would lose quorum', 'lab-cp-2 not healthy'],
        'remove_node of a control plane is refused before any change when the members that would stay have no healthy '
        'majority, naming each member and its state', target='lab-cp-2', playbook='remove_node',
        extra_vars={'remove_node': 'lab-cp-1', 'confirm_remove_node': 'lab-cp-1'}),
    row('upgrade-talos-refused', 'Talos', 'talos-etcd-unhealthy', 'upgrade_talos', 'converged', 'all', 'failed',
        ['lab-cp-1', 'error validating etcd for upgrade', 'all members must be healthy to perform an upgrade'],
        'Talos refuses the first control plane\'s upgrade while an etcd member is unhealthy: the run stops there naming '
        'the node and Talos\' reason, the drained Node is made schedulable again, Flux resumed, no node is upgraded',
        target='lab-cp-2', playbook='upgrade_talos', extra_vars={'talos_version': 'v1.13.10', 'upgrade_talos_timeout': 60}),
    row('rebuild-node-quorum', 'Talos', 'talos-etcd-unhealthy', 'remove_node', 'converged', 'all', 'failed',
        ['refusing to remove the etcd member of lab-cp-1', 'would lose quorum', 'lab-cp-2 not healthy'],
        'rebuild_node of a control plane stops at remove_node\'s quorum check, before any change, when the members '
        'that would stay have no healthy majority', target='lab-cp-2', playbook='rebuild_node',
        extra_vars={'rebuild_node': 'lab-cp-1', 'confirm_rebuild_node': 'lab-cp-1'}),
    row('upgrade-kubernetes-apply-reject', 'Talos', 'talos-apply-reject', 'upgrade_kubernetes', 'converged', 'all', 'failed',
        ['lab-cp-1 ({addr:lab-cp-1}:50000)', 'ApplyConfiguration failed', 'INVALID_ARGUMENT'],
        'Talos rejects the first control plane\'s new config (its kube-apiserver on the new version): upgrade_kubernetes '
        'stops at that node naming it and Talos\' error, no node is changed', target='lab-cp-1',
        playbook='upgrade_kubernetes', extra_vars={'kubernetes_version': '1.36.4', 'talos_machines_apply_timeout': 60}),
    row('talos-no-etcd-endpoints', 'Talos', 'talos-no-etcd-endpoints', 'bootstrap', 'converged', 'bootstrap', 'failed',
        ['{addr:lab-cp-2}', 'no controlplane endpoints discovered yet'], 'the quorum gate names the control plane that '
        'cannot list the etcd members, with Talos\' answer', target='lab-cp-2', extra_vars=TALOS_SHORT),
    # ---------------------------------------------------------------- Kubernetes
    row('k8s-crashloop-cilium', 'Kubernetes', 'k8s-crashloop', 'cni', 'converged', 'cni', 'failed',
        ['DaemonSet kube-system/cilium', 'lab-w-2: cilium-', 'CrashLoopBackOff'], 'the agents gate names the node and the container state',
        target='lab-w-2',
        extra_vars=CNI_SHORT),
    row('k8s-pending-operator', 'Kubernetes', 'k8s-pending', 'cni', 'converged', 'cni', 'failed',
        ['Deployment kube-system/cilium-operator', 'Unschedulable', 'Insufficient cpu'], 'the operator gate names the Deployment and the scheduler message',
        target='kube-system/cilium-operator', after=[('delete_pods', 'kube-system', 'io.cilium/app=operator')],
        extra_vars=CNI_SHORT),
    # The flap period is not a divisor of the gates' 2 s poll interval: with period 1.0 every probe of the readyz gate
    # landed in a down half and the gate waited 120 s (the polls have no jitter; a real outage is not that regular).
    # The run's requests to the API come in two short bursts (the readyz gate, the cni gates), so a run can fall between
    # the down halves: up to four runs, the fault still on, until one meets it (each must converge).
    row('k8s-api-flap-503', 'Kubernetes', 'k8s-api-flap', 'cni', 'converged', 'kubeconfig,cni', 'recovered',
        ['k8s 503'], 'gates treat 503 as not yet and poll on', params={'period': 1.3, 'mode': '503'}, attempts=4),
    row('k8s-api-flap-refuse', 'Kubernetes', 'k8s-api-flap', 'cni', 'converged', 'kubeconfig,cni', 'recovered',
        ['fault active'], 'refused connections are not yet, too', params={'period': 1.3, 'mode': 'refuse'}, attempts=4),
    row('k8s-crashloop-csi', 'Kubernetes', 'k8s-crashloop', 'gitops', 'converged', 'gitops', 'failed',
        ['proxmox-csi-plugin-node', 'lab-w-3: proxmox-csi-plugin-node-', 'CrashLoopBackOff'],
        'the CSI gate names the pod, its node and the container state', target='lab-w-3',
        params={'workload': 'csi-proxmox/proxmox-csi-plugin-node'}, extra_vars=GITOPS_SHORT),
    row('k8s-pending-ccm', 'Kubernetes', 'k8s-pending', 'gitops', 'converged', 'gitops', 'failed',
        ['flux-system/proxmox-ccm', 'Deployment kube-system/proxmox-cloud-controller-manager', 'Insufficient cpu'],
        'the gitops gate names the Kustomization that waits on it, the Deployment and the scheduler\'s reason',
        target='kube-system/proxmox-cloud-controller-manager',
        after=[('delete_pods', 'kube-system', 'app.kubernetes.io/name=proxmox-cloud-controller-manager'),
               ('reconcile', 'proxmox-ccm')], extra_vars=GITOPS_SHORT),
    row('k8s-image-pull-app', 'Kubernetes', 'k8s-image-pull', 'apps', 'converged', 'apps', 'failed',
        ['widget-demo-web', 'ImagePullBackOff', 'Back-off pulling image "nginx:1.27"', 'not found'], 'the release gate names '
        'the Deployment, its pods and the image the registry does not have', target='widgets/widget-demo-web',
        after=[('delete_pods', 'widgets', 'app.kubernetes.io/name=widget-demo-web')], extra_vars=APPS_SHORT),
    # ---------------------------------------------------------------- Flux
    row('flux-healthcheck-fail', 'Flux', 'flux-healthcheck-fail', 'gitops', 'converged', 'gitops', 'failed',
        ['flux-system/proxmox-csi', 'HealthCheckFailed', 'Deployment/csi-proxmox/'], 'names the blocker, its reason '
        'and the object its health check waits for', target='flux-system/proxmox-csi',
        after=[('reconcile', 'proxmox-csi'), ('flux_reason', 'proxmox-csi', 'HealthCheckFailed')], extra_vars=GITOPS_SHORT),
    row('flux-build-fail', 'Flux', 'flux-build-fail', 'gitops', 'converged', 'gitops', 'failed',
        ['flux-system/proxmox-csi', 'BuildFailed', "accumulating resources from 'missing.yaml'"], 'names the Kustomization '
        'and kustomize\'s error (the file the commit lacks); what it applied before stays', target='flux-system/proxmox-csi',
        after=[('flux_reason', 'proxmox-csi', 'BuildFailed')], extra_vars=GITOPS_SHORT),
    # The fault makes the lab's Git server answer 503 for the repository. On lab/flux nothing but the GitRepository
    # reads it (the lab inventory does not push: lab_git_push is unset), so the source gate meets it. On the upstream
    # world the inventory pushes the sealed Secrets to that server (lab/flux_upstream: lab_git_push), and gitops_commit
    # asks the remote (git ls-remote) on every run before it pushes: a Git server that is down fails that task first,
    # before the source gate - what a user whose server is down sees. That task is in the flux stage's prepare play,
    # whose first tag is flux_install (site.yml), so the failure's stage is that.
    row('flux-source-not-ready', 'Flux', 'flux-source-not-ready', 'flux', 'converged', 'flux', 'failed',
        ['GitRepository flux-system/flux-system', 'GitOperationFailed', 'status code: 503'],
        'the source gate names the GitRepository and the Git error (an inventory that pushes meets the 503 at the push '
        'first: the upstream world)', target='flux-system/flux-system', extra_vars=FLUX_SHORT,
        worlds={'upstream': {
            'stage': 'flux_install',
            'names': ['git ls-remote failed', '/proxtalos/lab-gitops.git', 'The requested URL returned error: 503'],
            'note': 'the push of the sealed Secrets meets the Git server first: the commit task names the remote and '
                    "git's error, before the source gate (lab/flux, which has no push, fails at the source gate)"}}),
]


# ------------------------------------------------------------------------------ results and the document

_VARIABLE = [
    (re.compile(r'127\.\d+\.\d+\.(1\d\d|2\d\d)\b'), '<net>.<dhcp>'),      # worker addresses: DHCP order varies
    (re.compile(r'127\.\d+\.\d+\.(\d+)'), r'<net>.\1'),
    (re.compile(r'/tmp/[^\s\'",)]+'), '<tmp>'),
    (re.compile(r'UPID:[^\s\'",)]+'), 'UPID:...'),
    (re.compile(r'\d{4}-\d\d-\d\d[T ][\d:.]+(Z|[+-]\d\d:\d\d)?'), '<time>'),
    (re.compile(r'\b\d+(\.\d+)? ?(s|ms|seconds)\b'), 'N s'),
    (re.compile(r'\b\d+ (probes|attempts)\b'), r'N \1'),
    (re.compile(r'\s+'), ' '),
]


def normalize(message, limit=300):
    """A message without what changes from run to run (lab net, temp paths, UPIDs, durations), on one line."""
    text = str(message or '')
    for pattern, replacement in _VARIABLE:
        text = pattern.sub(replacement, text)
    text = text.strip()
    return text if len(text) <= limit else text[:limit - 3] + '...'


def load_results(path=RESULTS):
    if not os.path.exists(path):
        return {}
    with open(path, encoding='utf-8') as handle:
        return json.load(handle)


def save_results(results, path=RESULTS):
    with open(path, 'w', encoding='utf-8') as handle:
        json.dump(dict(sorted(results.items())), handle, indent=2, sort_keys=True)
        handle.write('\n')


def _cell(text):
    return str(text).replace('|', '\\|').replace('\n', ' ')


def _fault_call(r):
    parts = [r.fault] + ([r.target] if r.target else []) + ['%s=%s' % item for item in sorted(r.params.items())]
    return '`%s`' % ' '.join(str(p) for p in parts)


def result_worlds(rows, results):
    """{world: [row ids]} of the rows that have a result, by the world the result was measured on (None: not recorded)."""
    worlds = collections.OrderedDict()
    for r in rows:
        if r.id in results:
            worlds.setdefault(results[r.id].get('world'), []).append(r.id)
    return worlds


def _world_text(world):
    return WORLDS.get(world, 'a world not recorded (results older than the record of worlds)') if world else \
        'a world not recorded (results older than the record of worlds)'


def render_table(rows=None, results=None):
    """The table of rows with their latest results; each row shows the expectation of the world its result was
    measured on, a result from a world other than most rows' says so, and the last line names the worlds."""
    rows = ROWS if rows is None else rows
    results = load_results() if results is None else results
    worlds = result_worlds(rows, results)
    main = max(worlds, key=lambda w: len(worlds[w])) if worlds else None
    lines = ['| # | layer | fault | stage | expected | result | what the run said (the failure message, or the evidence) |',
             '|---|---|---|---|---|---|---|']
    for number, base in enumerate(rows, 1):
        seen = results.get(base.id)
        world = seen.get('world') if seen else main
        r = for_world(base, world if world in WORLDS else None)
        if seen is None:
            status, said = 'not run yet', ''
        else:
            status = ('%s, as expected' % seen['outcome']) if seen['passed'] else ('**%s, expected %s**' % (seen['outcome'], r.expect))
            if world != main:
                status += ' (on %s)' % (world or 'a world not recorded')
            said = seen.get('message', '')
        expected = '%s: %s' % (r.expect, r.note)
        lines.append('| %d | %s | %s | %s | %s | %s | %s |' % (number, r.layer, _fault_call(r), r.stage, _cell(expected),
                                                               _cell(status), _cell(said)))
    faults = sorted(set(r.fault for r in rows))
    passed = sum(1 for r in rows if (results.get(r.id) or {}).get('passed'))
    lines.append('')
    lines.append('%d rows, %d distinct lab faults; latest results: %d of %d as expected.' % (len(rows), len(faults), passed, len(rows)))
    for world, ids in sorted(worlds.items(), key=lambda item: (item[0] != main, str(item[0]))):
        if world == main:
            lines.append('%s measured on %s.' % ('Every result was' if len(worlds) == 1 else '%d results were' % len(ids),
                                                 _world_text(world)))
        else:
            lines.append('%d measured on %s: %s.' % (len(ids), _world_text(world), ', '.join(ids)))
    return '\n'.join(lines)


def render_document(text, table):
    if BEGIN not in text or END not in text:
        raise ValueError('docs/reliability.md lacks the fault matrix markers')
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return head + BEGIN + '\n' + table + '\n' + END + tail


def write_document(results=None):
    with open(DOC, encoding='utf-8') as handle:
        text = handle.read()
    updated = render_document(text, render_table(results=results))
    if updated != text:
        with open(DOC, 'w', encoding='utf-8') as handle:
            handle.write(updated)
    return updated != text


if __name__ == '__main__':
    print('docs/reliability.md %s' % ('updated' if write_document() else 'unchanged'))
