#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: talos_apply
short_description: Apply a machine config to a Talos node and wait until it runs it
version_added: 0.1.0
description:
  - Applies one node's machine config through the Talos API (C(MachineService/ApplyConfiguration)), like
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
  - A node that does not answer, or does not come back, fails the task after O(wait_timeout) naming the node and
    what was seen last.
attributes:
  check_mode:
    support: full
    details:
      - Runs the dry run (which validates the config on the node) and reports its outcome; never applies.
  diff_mode:
    support: full
    details:
      - The diff is the node's own config diff from the dry run; secret values are shown as placeholders by Talos,
        and every secret value of the config is also masked by the module.
      - In maintenance mode the node has no config yet; the diff shows the whole config with its secrets hidden.
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
  - proxtalos.cluster._talos_auth
  - proxtalos.cluster._wait
options:
  node:
    description:
      - Address of the node (its apid is reached on O(port)).
    type: str
    required: true
  config_path:
    description:
      - The machine config file (as P(proxtalos.cluster.talos_config#module) renders it).
      - Exactly one of O(config_path) and O(config) is required.
    type: path
  config:
    description:
      - The machine config itself (multi-document YAML text). Never logged.
    type: str
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
seealso:
  - module: proxtalos.cluster.talos_config
  - module: proxtalos.cluster.talos_info
"""

EXAMPLES = r"""
- name: Apply each node's config (every host at once)
  proxtalos.cluster.talos_apply:
    node: "{{ node_ip }}"
    config_path: "artifacts/{{ cluster_name }}/{{ inventory_hostname }}.yaml"
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
    wait_timeout: 900

- name: Only show what would change
  proxtalos.cluster.talos_apply:
    node: "{{ node_ip }}"
    config_path: "artifacts/{{ cluster_name }}/{{ inventory_hostname }}.yaml"
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
  check_mode: true
  diff: true
"""

RETURN = r"""
node:
  description: The node as reached (address:port).
  returned: always
  type: str
  sample: 10.5.0.11:50000
node_mode:
  description: What the node was running before the apply - V(maintenance) (no config) or V(configured).
  returned: always
  type: str
applied_mode:
  description: The mode Talos used (or would use) - V(auto) resolves to V(no_reboot) or V(reboot). Empty when nothing
    was applied.
  returned: always
  type: str
  sample: reboot
summary:
  description: What Talos said the apply does (or would do), from its dry run or reply; with O(mode=try), when the
    config will be reverted.
  returned: always
  type: str
  sample: Applied configuration with a reboot
rebooted:
  description: Whether the node rebooted to take the config (and was seen back with a new boot).
  returned: always
  type: bool
verified:
  description: Whether the node was seen answering over mutual TLS with the config applied.
  returned: always
  type: bool
warnings_from_talos:
  description: Config warnings Talos returned with the apply.
  returned: always
  type: list
  elements: str
elapsed:
  description: Seconds the module spent reaching, applying and waiting.
  returned: always
  type: float
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _secrets, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import config as talos_config
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import files, health, redact, session

MODES = {'auto': 'auto', 'no_reboot': 'no-reboot', 'reboot': 'reboot', 'staged': 'staged', 'try': 'try'}


def argument_spec():
    return _argspec.spec(
        _argspec.TALOS_AUTH_SPEC, _argspec.WAIT_SPEC,
        node=dict(type='str', required=True),
        config_path=dict(type='path'),
        config=dict(type='str', no_log=True),
        mode=dict(type='str', choices=sorted(MODES), default='auto'),
        try_timeout=dict(type='float'),
    )


def read_config(params):
    """The config bytes and their secret values (to mask)."""
    if params['config_path']:
        try:
            data = files.read_bytes(params['config_path'])
        except (IOError, OSError) as exc:
            raise ValidationError('config_path', 'cannot read %s: %s' % (params['config_path'], exc.strerror or exc))
        field = 'config_path'
    else:
        data = (params['config'] or '').encode('utf-8')
        field = 'config'
    if not data.strip():
        raise ValidationError(field, 'is empty; expected the machine config YAML')
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError:
        raise ValidationError(field, 'is not UTF-8 text')
    documents = talos_config.parse_machine_config(text, field)
    return data, documents, redact.config_secret_values(documents)


class Applier(object):
    """Observe, decide, apply and verify one node."""

    def __init__(self, module, node_session, data, deadline, interval):
        self.module = module
        self.session = node_session
        self.data = data
        self.deadline = deadline
        self.interval = interval
        self.params = module.params

    # ---- calls with the shared deadline ----

    def _retry(self, call, what):
        """call() until it does not raise a transient Talos error, within the deadline."""
        try:
            return _wait.retry(call, self.deadline.remaining(), interval=self.interval, transient=session.TRANSIENT,
                               backoff=1.0, max_interval=self.interval)
        except talos_errors.TalosTransientError as exc:
            raise ProxtalosError('talos node %s: %s failed within %gs; last error: %s'
                                 % (self.session.name, what, self.deadline.timeout, exc), node=self.session.name,
                                 last_observation=str(exc))

    def dry_run(self, maintenance, mode):
        def call():
            if maintenance:
                return self.session.call_insecure('apply_configuration', self.data, mode='auto', dry_run=True)
            return self.session.call('apply_configuration', self.data, mode=mode, dry_run=True,
                                     try_timeout=self.params['try_timeout'] if mode == 'try' else None)
        return self._retry(call, 'the dry run of the config')

    def apply(self, maintenance, mode):
        def call():
            if maintenance:
                return self.session.call_insecure('apply_configuration', self.data, mode='auto')
            return self.session.call('apply_configuration', self.data, mode=mode,
                                     try_timeout=self.params['try_timeout'] if mode == 'try' else None)
        return self._retry(call, 'applying the config')

    def boot_marker(self):
        return health.boot_marker(self._retry(lambda: self.session.call('service_list'), 'listing the services'))

    # ---- the wait after an apply ----

    def wait_applied(self, previous_boot, verify_mode='auto'):
        """Until the node answers over mTLS, booted anew when previous_boot is set, and runs the config.

        verify_mode: the mode of the verifying dry runs - 'try' after a try apply, since Talos cancels a
        pending try revert on any ApplyConfiguration in another mode, dry runs included.
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
                if exc.failed_precondition:
                    return False, 'answers over mTLS but is busy: %s' % (exc.talos_message or exc)
                raise
            unchanged, summary, dummy = health.dry_run_outcome(reply['mode_details'])
            if unchanged:
                return True, 'answers over mTLS and runs the applied config'
            return False, 'answers over mTLS but does not run the applied config yet (dry run: %s)' % summary
        return self.session.wait_until(probe, self.deadline, self.interval, 'the node back over mTLS with the applied config')


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True,
                           mutually_exclusive=[('config_path', 'config')] + _argspec.TALOS_AUTH_CONSTRAINTS['mutually_exclusive'],
                           required_one_of=[('config_path', 'config')])
    missing = session.missing_libraries()
    if missing:
        module.fail_json(msg=missing_required_lib(missing[0][0]), exception=missing[0][1])
    params = module.params
    result = dict(changed=False, node='', node_mode='', applied_mode='', summary='', rebooted=False, verified=False,
                  warnings_from_talos=[], elapsed=0.0)
    try:
        data, documents, secret_values = read_config(params)
        _secrets.register(module, *secret_values)
        if params['try_timeout'] is not None and params['mode'] != 'try':
            raise ValidationError('try_timeout', 'is only used with mode=try')
        credentials = session.load_credentials(params, module)
        node_session = session.NodeSession.from_params(params, credentials)
        result['node'] = node_session.name
        deadline, interval = session.deadline_for(params)
        applier = Applier(module, node_session, data, deadline, interval)
        mode = MODES[params['mode']]

        node_mode = node_session.wait_reachable(deadline, interval)
        result['node_mode'] = node_mode
        maintenance = node_mode == session.MAINTENANCE
        if not maintenance:
            node_session.require_credentials('runs with a machine config')

        dry = applier.dry_run(maintenance, mode)
        unchanged, summary, diff_text = health.dry_run_outcome(dry['mode_details'])
        changed = maintenance or not unchanged
        result['changed'] = changed
        result['summary'] = summary
        if changed:
            result['applied_mode'] = 'auto' if maintenance else dry['mode'].replace('-', '_')
        if module._diff:
            if maintenance:
                result['diff'] = {'before': '', 'after': redact.config_documents_text(documents),
                                  'before_header': '%s (maintenance mode: no config)' % node_session.name,
                                  'after_header': params['config_path'] or 'config'}
            elif changed:
                body = '\n'.join(line for line in diff_text.splitlines() if not line.startswith(('--- ', '+++ ')))
                result['diff'] = {'prepared': '--- %s (running config)\n+++ %s\n%s\n'
                                  % (node_session.name, params['config_path'] or 'config', body)}
            else:
                result['diff'] = {'before': '', 'after': ''}

        if changed and not module.check_mode:
            if params['wait']:
                # Checked before applying: verifying the node afterwards needs mTLS.
                node_session.require_credentials('is checked over mutual TLS after the apply')
            if not maintenance and params['wait']:
                previous_boot = applier.boot_marker()
            else:
                previous_boot = None
            reply = applier.apply(maintenance, mode)
            applied = reply['mode'].replace('-', '_')
            result['applied_mode'] = 'auto' if maintenance else applied
            result['summary'] = ' '.join(line.strip() for line in reply['mode_details'].splitlines() if line.strip()) or summary
            result['warnings_from_talos'] = list(reply['warnings'])
            rebooting = maintenance or applied == 'reboot'
            if params['wait'] and applied != 'staged':
                applier.wait_applied(previous_boot if rebooting else None, verify_mode='try' if applied == 'try' else 'auto')
                result['verified'] = True
                result['rebooted'] = rebooting
        elif not changed:
            result['verified'] = True
        result['elapsed'] = round(deadline.elapsed(), 3)
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **dict(exc.details, node=result['node'] or params['node']))
    except (IOError, OSError) as exc:
        module.fail_json(msg='talos node %s: %s' % (params['node'], exc), exception=traceback.format_exc())
    module.exit_json(**result)


if __name__ == '__main__':
    main()
