#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: talos_node_diagnosis
short_description: Tell why a Talos node's service (kubelet) does not run, from the node's own service events
version_added: 0.1.0
description:
  - Reads one node's C(MachineService/ServiceList) over mutual TLS and classifies the state of one service
    (default V(kubelet)) from its state, health and last event - the evidence the cni stage's remediation acts on.
  - V(running) - the last event is C(Running) and the health check passes (Talos' own rule).
  - V(waiting_on_volume) - the service is C(Waiting) and its last event names a volume, such as
    C(Waiting for volume "/var/lib/kubelet" to be mounted). A kubelet stuck like this never registers its Node (or
    leaves it NotReady); a Talos reboot may clear it, a hard reset of the VM does. RV(remediable) is true only for
    this class.
  - V(not_running) - any other state (C(Preparing), C(Failed), C(Waiting) for something else...).
  - V(missing) - the node does not list the service at all.
  - V(maintenance) - the node answers only in maintenance mode (it has no config).
  - V(unreachable) - the node does not answer (powered off, rebooting, network).
  - With O(wait_for=running) it polls until the service runs, and fails after O(wait_timeout) with the last
    classification and evidence in the result, so the caller can act on them.
author:
  - proxtalos.cluster contributors (@proxtalos)
options:
  node:
    description:
      - Address of the node.
    type: str
    required: true
  service:
    description:
      - Talos service id to diagnose (as C(talosctl services) lists them).
    type: str
    default: kubelet
  wait_for:
    description:
      - V(none) - read once and report, never fail for the node's state.
      - V(running) - wait until the service is Running and healthy; fail on timeout (the result still carries the
        classification, evidence and events seen last).
    type: str
    choices: [none, running]
    default: none
  events:
    description:
      - How many of the service's newest events to return in RV(events).
    type: int
    default: 5
extends_documentation_fragment:
  - proxtalos.cluster._talos_auth
  - proxtalos.cluster._wait
  - proxtalos.cluster._attributes
  - proxtalos.cluster._attributes.INFO_MODULE
attributes:
  check_mode:
    details:
      - Read-only. In check mode it reads once instead of waiting.
notes:
  - The result is never C(changed).
  - O(wait), O(wait_timeout) and O(wait_sleep) apply to O(wait_for=running) only; O(wait_for=none) reads once.
  - While waiting, a node that does not answer (a reboot in progress) counts as "not yet".
seealso:
  - module: proxtalos.cluster.talos_info
  - module: proxtalos.cluster.talos_reboot
"""

EXAMPLES = r"""
- name: Why does kubelet not run on this worker?
  proxtalos.cluster.talos_node_diagnosis:
    node: "{{ node_ip }}"
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
  register: kubelet_diagnosis

- name: Wait (at most 10 minutes) for kubelet after a reboot, keeping the evidence when it does not come
  proxtalos.cluster.talos_node_diagnosis:
    node: "{{ node_ip }}"
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
    wait_for: running
    wait_timeout: 600
  register: after_reboot
  failed_when: false
"""

RETURN = r"""
node:
  description: The node as reached (address:port).
  type: str
  returned: always
  sample: 10.5.0.21:50000
service:
  description: The service diagnosed.
  type: str
  returned: always
  sample: kubelet
classification:
  description: One of V(running), V(waiting_on_volume), V(not_running), V(missing), V(maintenance), V(unreachable).
  type: str
  returned: always
  sample: waiting_on_volume
remediable:
  description: True for V(waiting_on_volume), the known failure a reboot or a hard reset clears.
  type: bool
  returned: always
running:
  description: The service is Running and healthy.
  type: bool
  returned: always
state:
  description: The service's state as Talos reports it (empty when the node did not answer).
  type: str
  returned: always
  sample: Waiting
healthy:
  description: Talos' health verdict for the service.
  type: bool
  returned: always
last_event:
  description: The service's newest event (C(state), C(msg), C(ts)); empty when there is none.
  type: dict
  returned: always
  sample: {state: Waiting, msg: 'Waiting for volume "/var/lib/kubelet" to be mounted', ts: '2026-11-25T21:14:03Z'}
volume:
  description: The volume the service waits for (from the last event), else empty.
  type: str
  returned: always
  sample: /var/lib/kubelet
evidence:
  description: The diagnosis in one line, naming the node, the service, its state and last event.
  type: str
  returned: always
  sample: 'talos node 10.5.0.21:50000: kubelet is Waiting: Waiting for volume "/var/lib/kubelet" to be mounted (since 2026-11-25T21:14:03Z)'
events:
  description: The service's newest events, oldest first (at most O(events)).
  type: list
  elements: dict
  returned: always
timeline:
  description: Each change of classification while waiting (C(elapsed), C(classification), C(evidence)); at most 50.
  type: list
  elements: dict
  returned: always
elapsed:
  description: Seconds spent.
  type: float
  returned: always
attempts:
  description: Number of reads of the service list.
  type: int
  returned: always
"""

import re
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import session

RUNNING = 'running'
WAITING_ON_VOLUME = 'waiting_on_volume'
NOT_RUNNING = 'not_running'
MISSING = 'missing'
MAINTENANCE = 'maintenance'
UNREACHABLE = 'unreachable'
CLASSES = (RUNNING, WAITING_ON_VOLUME, NOT_RUNNING, MISSING, MAINTENANCE, UNREACHABLE)

# 'Waiting for volume "/var/lib/kubelet" to be mounted', 'Waiting for volume EPHEMERAL to be mounted'...
VOLUME_PATTERN = re.compile(r'\bvolumes?\s+"?([^"\s,;]+)"?', re.IGNORECASE)
MAX_TIMELINE = 50


def argument_spec():
    return _argspec.spec(
        _argspec.TALOS_AUTH_SPEC, _argspec.WAIT_SPEC,
        node=dict(type='str', required=True),
        service=dict(type='str', default='kubelet'),
        wait_for=dict(type='str', default='none', choices=['none', 'running']),
        events=dict(type='int', default=5),
    )


def _diagnosis(node_name, service_id, classification, evidence, state='', healthy=False, events=(), volume=''):
    events = list(events)
    return {
        'classification': classification,
        'remediable': classification == WAITING_ON_VOLUME,
        'running': classification == RUNNING,
        'state': state,
        'healthy': bool(healthy),
        'last_event': dict(events[-1]) if events else {},
        'volume': volume,
        'evidence': 'talos node %s: %s' % (node_name, evidence),
        'events': events,
        'service': service_id,
    }


def classify(services, service_id, node_name, keep_events=5):
    """The diagnosis of service_id from a ServiceList answer (the client's list of service dicts)."""
    service = next((item for item in services or [] if item.get('id') == service_id), None)
    if service is None:
        listed = ', '.join(sorted(str(item.get('id')) for item in services or [])) or 'none'
        return _diagnosis(node_name, service_id, MISSING, '%s is not among its services (%s)' % (service_id, listed))
    events = list(service.get('events') or [])
    last = events[-1] if events else {}
    state = last.get('state') or service.get('state') or 'Unknown'
    health = service.get('health') or {}
    healthy = service.get('healthy')
    if healthy is None:
        healthy = state == 'Running' and bool(health.get('healthy'))
    recent = events[-keep_events:] if keep_events > 0 else []
    message = last.get('msg') or ''
    since = ' (since %s)' % last['ts'] if last.get('ts') else ''
    if healthy:
        return _diagnosis(node_name, service_id, RUNNING, '%s is Running and healthy' % service_id, state, True, recent)
    match = VOLUME_PATTERN.search(message)
    if state == 'Waiting' and match:
        return _diagnosis(node_name, service_id, WAITING_ON_VOLUME, '%s is Waiting: %s%s' % (service_id, message, since),
                          state, False, recent, volume=match.group(1))
    text = '%s is %s' % (service_id, state)
    if state == 'Running':
        text += ' but not healthy'
        if health.get('last_message'):
            text += ' (%s)' % health['last_message']
    if message:
        text += ': %s%s' % (message, since)
    return _diagnosis(node_name, service_id, NOT_RUNNING, text, state, False, recent)


class Diagnoser(object):
    """Reads and classifies one node's service; remembers the last diagnosis and its changes."""

    def __init__(self, node_session, service_id, keep_events):
        self.session = node_session
        self.service_id = service_id
        self.keep_events = keep_events
        self.last = None
        self.timeline = []
        self.started = None

    def read(self):
        try:
            services = self.session.call('service_list')
        except talos_errors.TalosTransientError as exc:
            return _diagnosis(self.session.name, self.service_id, UNREACHABLE, 'does not answer: %s' % exc)
        except talos_errors.TalosTlsError as exc:
            if exc.reason != 'server_certificate_untrusted':
                raise
            return _diagnosis(self.session.name, self.service_id, MAINTENANCE,
                              'answers only in maintenance mode (it has no machine config; %s cannot run)' % self.service_id)
        return classify(services, self.service_id, self.session.name, self.keep_events)

    def probe(self, elapsed):
        diagnosis = self.read()
        seen = (diagnosis['classification'], diagnosis['evidence'])
        changed = self.last is None or (self.last['classification'], self.last['evidence']) != seen
        if changed and len(self.timeline) < MAX_TIMELINE:
            self.timeline.append({'elapsed': round(elapsed, 3), 'classification': diagnosis['classification'],
                                  'evidence': diagnosis['evidence']})
        self.last = diagnosis
        return diagnosis['running'], diagnosis['evidence']


def run(params, credentials, check_mode=False, clock=time.monotonic, sleep=time.sleep):
    """(result dict, failure message or None) for the module's params."""
    if params['events'] < 0:
        raise ValidationError('events', 'must be zero or more, got %d' % params['events'])
    node_session = session.NodeSession(params['node'], port=params['port'], api_timeout=params['api_timeout'],
                                       credentials=credentials)
    node_session.require_credentials('reports its services only over mutual TLS')
    timeout, interval = _argspec.wait_params(params)
    if params['wait_for'] == 'none' or check_mode:
        timeout = 0.0
    diagnoser = Diagnoser(node_session, params['service'], params['events'])
    deadline = _wait.Deadline(timeout, clock)
    outcome = _wait.wait_for(lambda: diagnoser.probe(deadline.elapsed()), timeout, interval=interval, clock=clock, sleep=sleep)
    result = dict(diagnoser.last, node=node_session.name, timeline=diagnoser.timeline, elapsed=round(outcome.elapsed, 3),
                  attempts=outcome.attempts, changed=False)
    failure = None
    if params['wait_for'] == 'running' and not outcome.ok:
        prefix = 'talos node %s: ' % node_session.name
        seen = result['evidence'][len(prefix):] if result['evidence'].startswith(prefix) else result['evidence']
        failure = '%s%s did not run within %.0fs; last seen: %s' % (prefix, params['service'], timeout, seen)
    return result, failure


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True,
                           mutually_exclusive=_argspec.TALOS_AUTH_CONSTRAINTS['mutually_exclusive'])
    missing = session.missing_libraries()
    if missing:
        module.fail_json(msg=missing_required_lib(missing[0][0]), exception=missing[0][1])
    try:
        credentials = session.load_credentials(module.params, module)
        result, failure = run(module.params, credentials, check_mode=module.check_mode)
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), changed=False, **exc.details)
    if failure:
        module.fail_json(msg=failure, **result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
