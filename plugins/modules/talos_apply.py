#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: talos_apply
short_description: Apply machine configs to Talos nodes and wait until they run them
version_added: 0.1.0
description:
  - Applies each node's machine config through the Talos API (C(MachineService/ApplyConfiguration)), like
    C(talosctl apply-config).
  - First asks the node whether it is in maintenance mode, by calling C(storage.StorageService/Disks) without a
    client certificate (only a node in maintenance mode answers that). A node in maintenance mode is reached over
    TLS without client certificate (C(talosctl --insecure)); a configured node only over mutual TLS with the
    talosconfig's client certificate.
  - A dry run on the node decides C(changed). A configured node whose dry run says C(No changes.) is left alone;
    otherwise the config is applied with O(mode). In maintenance mode everything is a change, and the node's dry
    run still checks the config first, so a config Talos refuses (for example an unknown key from a patch) fails
    before anything is applied, with Talos' message naming the key.
  - After a real apply, waits until the node answers over mutual TLS and a dry run of the same config says
    C(No changes.) - that is how "runs the applied config" is verified. When the apply made the node reboot
    (maintenance mode installs and reboots; O(mode=reboot), or O(mode=auto) when Talos decides a reboot is needed),
    the node must also report a new boot (the first event of its machined service changed), so the answer of the
    node before it went down does not count.
  - In maintenance mode that boot is read before the apply, by C(ServiceList) without a client certificate, which
    Talos v1.13 serves. v1.13 answers over mutual TLS with the new config already before it installs and reboots, so
    only a changed boot shows the install done. Talos v1.12 does not serve it (C(Unimplemented)); its API answers
    over mutual TLS only after the install reboot, so there the answer itself is the sign.
  - A node that does not answer, or does not come back, fails the task after O(wait_timeout) naming the node and
    what was seen last.
  - One run applies every node of O(nodes) (a C(run_once) task over the play's hosts; a single node is a
    one-element list). Each node goes through the steps above (reach, dry run, apply, wait until it runs the
    config), on a thread of its own, all at the same time, under the one deadline of the run (O(wait_timeout) from
    its start); a slow or silent node does not hold up the others. The result has each node's result under its
    inventory name (RV(nodes)), one gate per node (RV(gates)), and C(changed) when any node changed (or, in check
    mode, would change). When any node fails, the
    task fails naming every failing node by inventory name and address with its reason; the other nodes are still
    applied and verified, and their results are in RV(nodes).
attributes:
  check_mode:
    support: full
    details:
      - Runs the dry run (which validates the config on the node) and reports its outcome; never applies.
  diff_mode:
    support: full
    details:
      - The diff is the node's own config diff from the dry run. Talos sends it unredacted, old and new values
        alike; the module masks it line by line before showing it (a value under any key that holds a secret in a
        Talos document, block scalars under such a key, and values that are nothing but 32 or more base64
        characters), and masks the mode details and Talos's error texts the same way. Every secret value of the
        config being applied is also registered no_log.
      - In maintenance mode the node has no config yet; the diff shows the whole config with its secrets hidden.
      - One diff per node that changes (or would change), each headed by the node's inventory name and
        address; nodes without a change have none.
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
  - proxtalos.cluster._talos_auth
  - proxtalos.cluster._wait
options:
  nodes:
    description:
      - The nodes to apply in one run, each by its inventory host name, its address and its rendered config. Names
        must be unique. One node is a one-element list. O(talosconfig), O(mode), O(try_timeout), O(api_timeout) and the wait
        options are shared by every node.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description:
          - The node's inventory host name; keys RV(nodes) and RV(failed_nodes), the RV(gates) item's C(host), and
            names the node in messages and diffs.
        type: str
        required: true
      address:
        description:
          - Address of the node (its apid is reached on O(port)).
        type: str
        required: true
      config_path:
        description:
          - The node's machine config file (as P(proxtalos.cluster.talos_config#module) renders it).
        type: path
        required: true
  mode:
    description:
      - How the config is applied, as C(talosctl apply-config --mode).
      - V(auto) - Talos applies without a reboot when it can, with a reboot otherwise.
      - V(no_reboot) - fail rather than reboot. V(reboot) - always reboot.
      - V(staged) - stored, used from the next reboot; not verified (the node keeps running the old config). Talos'
        dry run compares with the running config, so a re-run reports the change again (and stages the same config
        again) until the node rebooted.
      - V(try) - applied without a reboot and never persisted; Talos sets back the config that ran before after
        O(try_timeout), and a reboot before then boots the persisted config. A change that needs a reboot is refused
        by the node (the dry run fails with Talos' message, nothing is applied). The wait after the apply verifies
        with dry runs in try mode too, because Talos cancels a pending revert on every apply in another mode, dry
        runs included. While the tried config runs, a re-run with O(mode=try) finds no change; after the revert it
        applies it again.
      - To keep a tried config, apply it with V(no_reboot) or V(auto) after Talos reverted it. Within the try window
        the node already runs it, so the dry run of another mode finds no change (and cancels the revert); nothing
        persists it then, and the next reboot runs the config from before.
      - A node in maintenance mode is always sent V(auto) (Talos installs, then reboots into the config).
    type: str
    choices: [auto, no_reboot, reboot, staged, try]
    default: auto
  try_timeout:
    description:
      - With O(mode=try), seconds after which Talos reverts the config (sent as C(try_mode_timeout); Talos' default
        is 60).
    type: float
notes:
  - O(wait=false) still makes one attempt to reach the node and does not wait for it to come back after the apply.
  - The wait after the apply needs O(talosconfig) or O(talosconfig_content) (mutual TLS), also when the node was
    in maintenance mode.
  - The nodes are applied on up to 128 threads at once (more nodes take turns).
seealso:
  - module: proxtalos.cluster.talos_config
  - module: proxtalos.cluster.talos_info
"""

EXAMPLES = r"""
- name: Apply one node's config (a one-element list)
  proxtalos.cluster.talos_apply:
    nodes:
      - {name: cp-1, address: 10.5.0.11, config_path: "artifacts/{{ cluster_name }}/cp-1.yaml"}
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
    wait_timeout: 900

- name: Apply every node's config in one run (each node from its own host's values)
  proxtalos.cluster.talos_apply:
    nodes: "{{ ansible_play_hosts | map('extract', hostvars, 'apply_target') | list }}"
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
    wait_timeout: 900
  run_once: true
  register: applied
  # with, set on each host before: apply_target: {name: inventory_hostname, address: node_ip, config_path: its file}

- name: What happened on this node
  ansible.builtin.debug:
    msg: "{{ applied.nodes[inventory_hostname].applied_mode }}"

- name: Only show what would change
  proxtalos.cluster.talos_apply:
    nodes:
      - {name: cp-1, address: 10.5.0.11, config_path: "artifacts/{{ cluster_name }}/cp-1.yaml"}
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
  check_mode: true
  diff: true
"""

RETURN = r"""
elapsed:
  description: Seconds the whole run spent reaching, applying and waiting (each node's own in RV(nodes)).
  returned: always
  type: float
nodes:
  description:
    - Each node's result under its inventory name (the keys below), that node's own. A failed node's dict holds
      what was seen before it failed.
    - A per-host task after a C(run_once) task reads its node's part as C(result.nodes[inventory_hostname]).
    - Absent, like RV(gates) and RV(failed_nodes), when the run fails before any node is reached (a bad O(nodes)
      list, a config file that cannot be read, a talosconfig that does not load).
    - The keys of each entry follow.
    - C(changed) (bool) - Whether this node changed (in check mode, would change).
    - C(node) (str) - The node as reached (address:port).
    - C(node_mode) (str) - What the node was running before the apply - V(maintenance) (no config) or V(configured).
    - C(applied_mode) (str) - The mode Talos used (or would use) - V(auto) resolves to V(no_reboot) or V(reboot).
      Empty when nothing was applied.
    - C(summary) (str) - What Talos said the apply does (or would do), from its dry run or reply; with O(mode=try),
      when the config will be reverted.
    - C(rebooted) (bool) - Whether the node rebooted to take the config (and was seen back with a new boot).
    - C(verified) (bool) - Whether the node was seen answering over mutual TLS with the config applied.
    - C(warnings_from_talos) (list) - Config warnings Talos returned with the apply.
    - C(elapsed) (float) - Seconds spent on this node.
  returned: once the nodes are reached
  type: dict
  sample: {lab-w-1: {changed: true, node: 10.5.0.21:50000, node_mode: maintenance, applied_mode: auto, rebooted: true,
           verified: true, summary: Applied configuration without a reboot, warnings_from_talos: [], elapsed: 31.2}}
gates:
  description:
    - One gate record per node that was verified or failed, in the order of O(nodes) (the run
      report's convention 0) - C(name) (the node runs its machine config, over mTLS), C(ok), C(host) (the
      inventory name), C(observation), C(elapsed), C(attempts), C(target) (address:port), C(diagnosis),
      C(started_at), C(ended_at).
    - A node that was not verified has no record - in check mode a node with a change (nothing applied), and a node
      applied with O(mode=staged) or O(wait=false).
  returned: once the nodes are reached
  type: list
  elements: dict
failed_nodes:
  description:
    - Each node that failed, by its name - its name, address and port, and why, as in the message.
  returned: once the nodes are reached
  type: dict
  sample: {lab-w-3: "lab-w-3 (10.5.0.23:50000): gave up after 900s waiting for the Talos API answering on port 50000; ..."}
"""


from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _secrets, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import config as talos_config
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import files, health, redact, session
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import nodes as talos_nodes

MODES = {'auto': 'auto', 'no_reboot': 'no-reboot', 'reboot': 'reboot', 'staged': 'staged', 'try': 'try'}
# The name of each node's gate record: what the apply verified on that node.
GATE_NAME = 'the node runs its machine config, over mTLS'


def argument_spec():
    return _argspec.spec(
        _argspec.TALOS_AUTH_SPEC, _argspec.WAIT_SPEC,
        nodes=dict(type='list', elements='dict', required=True, options=dict(
            name=dict(type='str', required=True),
            address=dict(type='str', required=True),
            config_path=dict(type='path', required=True),
        )),
        mode=dict(type='str', choices=sorted(MODES), default='auto'),
        try_timeout=dict(type='float'),
    )


class MachineConfig(object):
    """One node's machine config: the bytes sent, the parsed documents, the secret values (to mask), its label."""

    def __init__(self, data, documents, secret_values, label):
        self.data = data
        self.documents = documents
        self.secret_values = secret_values
        self.label = label


def parse_config(data, field, label):
    if not data.strip():
        raise ValidationError(field, 'is empty; expected the machine config YAML')
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError:
        raise ValidationError(field, 'is not UTF-8 text')
    documents = talos_config.parse_machine_config(text, field)
    return MachineConfig(data, documents, redact.config_secret_values(documents), label)


def read_config_file(path, field):
    """The MachineConfig of the file at path; `field` names the option in errors."""
    try:
        data = files.read_bytes(path)
    except (IOError, OSError) as exc:
        raise ValidationError(field, 'cannot read %s: %s' % (path, exc.strerror or exc))
    return parse_config(data, field, path)


class ApplyOptions(object):
    """What every node of a run is applied with: the module's mode options, check and diff mode."""

    def __init__(self, params, check_mode, diff):
        self.mode = params['mode']
        self.try_timeout = params['try_timeout']
        self.wait = params['wait']
        self.check_mode = check_mode
        self.diff = diff


def masked_error(exc):
    """The error with its message and the texts among its details masked (redact.node_text)."""
    exc.message = redact.node_text(exc.message)
    exc.args = (exc.message,)
    for key, value in list(exc.details.items()):
        if isinstance(value, str):
            exc.details[key] = redact.node_text(value)
    if isinstance(getattr(exc, 'talos_message', None), str):
        exc.talos_message = redact.node_text(exc.talos_message)
    return exc


class Applier(object):
    """Observe, decide, apply and verify one node."""

    def __init__(self, node_session, data, deadline, interval, try_timeout=None, progress=_wait.FROM_ENVIRONMENT):
        self.session = node_session
        self.data = data
        self.deadline = deadline
        self.interval = interval
        self.try_timeout = try_timeout
        self.progress = progress

    # ---- calls with the shared deadline ----

    def _retry(self, call, what):
        """call() until it does not raise a transient Talos error, within the deadline."""
        try:
            return _wait.retry(call, self.deadline.remaining(), interval=self.interval, transient=session.TRANSIENT,
                               backoff=1.0, max_interval=self.interval, progress=self.progress)
        except talos_errors.TalosTransientError as exc:
            raise ProxtalosError('talos node %s: %s failed within %gs; last error: %s'
                                 % (self.session.display, what, self.deadline.timeout, exc), node=self.session.name,
                                 last_observation=str(exc))

    def _apply_call(self, maintenance, mode, what, dry_run=False):
        """ApplyConfiguration, its reply's mode details and any error text masked (redact.node_text): Talos
        sends the diff, and the reason an immediate apply is refused, with old and new secret values in clear."""
        def call():
            if maintenance:
                return self.session.call_insecure('apply_configuration', self.data, mode='auto', dry_run=dry_run)
            return self.session.call('apply_configuration', self.data, mode=mode, dry_run=dry_run,
                                     try_timeout=self.try_timeout if mode == 'try' else None)
        try:
            reply = self._retry(call, what)
        except ProxtalosError as exc:
            raise masked_error(exc)
        return dict(reply, mode_details=redact.node_text(reply['mode_details']))

    def dry_run(self, maintenance, mode):
        return self._apply_call(maintenance, mode, 'the dry run of the config', dry_run=True)

    def apply(self, maintenance, mode):
        return self._apply_call(maintenance, mode, 'applying the config')

    def boot_marker(self):
        return health.boot_marker(self._retry(lambda: self.session.call('service_list'), 'listing the services'))

    def maintenance_boot_marker(self):
        """The boot marker of a node in maintenance mode, or None where Talos does not serve it.

        Talos v1.13 answers ServiceList to anyone in maintenance mode (os:reader) and, after the apply, switches
        apid to mTLS with the new config on the same boot, before it installs and reboots: the marker tells that
        boot from the installed one. v1.12's maintenance server answers Unimplemented; its apid starts only after
        the install reboot, so mTLS alone shows the reboot there.
        """
        try:
            services = self._retry(lambda: self.session.call_insecure('service_list'), 'listing the services')
        except talos_errors.TalosApiError as exc:
            if exc.unimplemented:
                return None
            raise
        return health.boot_marker(services)

    # ---- the wait after an apply ----

    def wait_applied(self, previous_boot, verify_mode='auto'):
        """Until the node answers over mTLS, booted anew when previous_boot is set, and runs the config.

        verify_mode: the mode of the verifying dry runs - 'try' after a try apply, since Talos cancels a
        pending try revert on any ApplyConfiguration in another mode, dry runs included. Returns the WaitResult.
        """
        def probe():
            try:
                services = self.session.call('service_list')
            except talos_errors.TalosTlsError as exc:
                if exc.reason in ('server_certificate_untrusted', 'handshake_failed'):
                    return False, 'not answering over mTLS yet (%s)' % exc.reason.replace('_', ' ')
                raise
            marker = health.boot_marker(services)
            if previous_boot is not None and marker == previous_boot:
                return False, 'still the boot from before the apply (the reboot has not happened yet)'
            try:
                reply = self.session.call('apply_configuration', self.data, mode=verify_mode, dry_run=True)
            except talos_errors.TalosApiError as exc:
                masked_error(exc)
                if exc.failed_precondition:
                    return False, 'answers over mTLS but is busy: %s' % (exc.talos_message or exc)
                raise
            unchanged, summary, dummy = health.dry_run_outcome(redact.node_text(reply['mode_details']))
            if unchanged:
                return True, 'answers over mTLS and runs the applied config'
            return False, 'answers over mTLS but does not run the applied config yet (dry run: %s)' % summary
        try:
            return self.session.wait_until(probe, self.deadline, self.interval, 'the node back over mTLS with the applied config',
                                           progress=self.progress)
        except ProxtalosError as exc:
            raise masked_error(exc)


def empty_result():
    """One node's result keys, before anything was seen (filled as the apply goes)."""
    return dict(changed=False, node='', node_mode='', applied_mode='', summary='', rebooted=False, verified=False,
                warnings_from_talos=[], elapsed=0.0)


def node_diff(node_session, config, maintenance, changed, diff_text):
    """The diff of one node: the whole config (secrets hidden) in maintenance mode, else the node's own config diff."""
    if maintenance:
        return {'before': '', 'after': redact.config_documents_text(config.documents),
                'before_header': '%s (maintenance mode: no config)' % node_session.display, 'after_header': config.label}
    if changed:
        body = '\n'.join(line for line in diff_text.splitlines() if not line.startswith(('--- ', '+++ ')))
        return {'prepared': '--- %s (running config)\n+++ %s\n%s\n' % (node_session.display, config.label, body)}
    return {'before': '', 'after': ''}


def apply_node(node_session, config, options, deadline, interval, result, progress=_wait.FROM_ENVIRONMENT):
    """Reach one node, decide with its dry run, apply (unless check mode) and verify, filling `result` (empty_result())
    as it goes, so a failure leaves what was seen. `changed` is the prediction in check mode, else True once the
    node took the config. Returns the gate's (observation, attempts) when the node was seen running the config
    (unchanged, or applied and verified), None otherwise (check mode with a change, staged, wait=false).
    Raises ProxtalosError naming the node when a step fails."""
    result['node'] = node_session.name
    applier = Applier(node_session, config.data, deadline, interval, try_timeout=options.try_timeout, progress=progress)
    mode = MODES[options.mode]

    node_mode, reached = node_session.reach(deadline, interval, progress=progress)
    result['node_mode'] = node_mode
    maintenance = node_mode == session.MAINTENANCE
    if not maintenance:
        node_session.require_credentials('runs with a machine config')

    dry = applier.dry_run(maintenance, mode)
    unchanged, summary, diff_text = health.dry_run_outcome(dry['mode_details'])
    changed = maintenance or not unchanged
    result['changed'] = changed and options.check_mode
    result['summary'] = summary
    if changed:
        result['applied_mode'] = 'auto' if maintenance else dry['mode'].replace('-', '_')
    if options.diff:
        result['diff'] = node_diff(node_session, config, maintenance, changed, diff_text)

    if not changed:
        result['verified'] = True
        return 'answers over mTLS and runs this config (dry run: No changes.)', reached.attempts + 1
    if options.check_mode:
        return None
    if options.wait:
        # Checked before applying: verifying the node afterwards needs mTLS.
        node_session.require_credentials('is checked over mutual TLS after the apply')
    previous_boot = None
    if options.wait:
        previous_boot = applier.maintenance_boot_marker() if maintenance else applier.boot_marker()
    reply = applier.apply(maintenance, mode)
    result['changed'] = True
    applied = reply['mode'].replace('-', '_')
    result['applied_mode'] = 'auto' if maintenance else applied
    result['summary'] = ' '.join(line.strip() for line in reply['mode_details'].splitlines() if line.strip()) or summary
    result['warnings_from_talos'] = list(reply['warnings'])
    rebooting = maintenance or applied == 'reboot'
    if not options.wait or applied == 'staged':
        return None
    waited = applier.wait_applied(previous_boot if rebooting else None, verify_mode='try' if applied == 'try' else 'auto')
    result['verified'] = True
    result['rebooted'] = rebooting
    return waited.observation, reached.attempts + waited.attempts


def gate_of(name, node_session, ok, observation, attempts, node_result, span):
    return {'name': GATE_NAME, 'ok': ok, 'host': name, 'observation': observation, 'elapsed': node_result['elapsed'],
            'attempts': attempts, 'target': node_session.name, 'diagnosis': [],
            'started_at': round(span[0], 3), 'ended_at': round(span[1], 3)}


def apply_all(module, credentials, options):
    """Every node of option nodes applied and verified at once, one result; fails naming each failing node, the
    others' results kept."""
    params = module.params
    targets = talos_nodes.check_targets(params['nodes'])
    configs = {}
    for item in targets:
        config = read_config_file(item['config_path'], 'nodes[%s].config_path' % item['name'])
        _secrets.register(module, *config.secret_values)
        configs[item['name']] = config
    deadline, interval = session.deadline_for(params)
    run = talos_nodes.NodesRun(targets, lambda item: session.NodeSession.from_params(params, credentials, host=item['address'],
                                                                                     field='nodes', label=item['name']),
                               empty_result, deadline)

    def work(item, node_session, node_result, progress):
        try:
            return apply_node(node_session, configs[item['name']], options, deadline, interval, node_result, progress=progress)
        except (IOError, OSError) as exc:
            raise ProxtalosError('talos node %s: %s' % (node_session.display, exc), node=node_session.name)

    gates, failed, diffs = [], {}, []
    for item, verification, error, span in run.run(work):
        name, node_session, node_result = item['name'], run.sessions[item['name']], run.results[item['name']]
        node_result['node'] = node_session.name
        diff = node_result.pop('diff', None)
        if diff and any(diff.get(key) for key in ('prepared', 'before', 'after')):
            diffs.append(diff)
        if error is None:
            if verification is not None:
                gates.append(gate_of(name, node_session, True, verification[0], verification[1], node_result, span))
            continue
        failed[name] = talos_nodes.failure_line(name, node_session, error)
        gates.append(gate_of(name, node_session, False, str(error), error.details.get('attempts') or 0, node_result, span))
    outcome = dict(changed=any(node_result['changed'] for node_result in run.results.values()), nodes=run.results, gates=gates,
                   failed_nodes=failed, elapsed=round(deadline.elapsed(), 3))
    if options.diff:
        outcome['diff'] = diffs
    if failed:
        summary = run.failure_summary(failed)
        run.progress.finish(False, summary)
        module.fail_json(msg='talos_apply: ' + summary, **outcome)
    run.progress.finish(True, 'all %d nodes run their config' % len(targets))
    module.exit_json(**outcome)


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True,
        mutually_exclusive=_argspec.TALOS_AUTH_CONSTRAINTS['mutually_exclusive'],
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    missing = session.missing_libraries()
    if missing:
        module.fail_json(msg=missing_required_lib(missing[0][0]), exception=missing[0][1])
    params = module.params
    try:
        if params['try_timeout'] is not None and params['mode'] != 'try':
            raise ValidationError('try_timeout', 'is only used with mode=try')
        options = ApplyOptions(params, module.check_mode, module._diff)
        credentials = session.load_credentials(params, module)
        apply_all(module, credentials, options)
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **exc.details)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
