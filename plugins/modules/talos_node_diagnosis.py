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
  - With O(nodes) instead of O(node) it diagnoses several nodes in one run (for a C(run_once) task over every
    worker) - each node the same way, all at the same time. A round reads every node whose service does not run
    yet, concurrently; a node found running is not read again; the rounds repeat every O(wait_sleep) seconds
    until every node runs or O(wait_timeout) has passed, then each node is classified by what it showed last.
    RV(nodes) holds each node's diagnosis (the keys of the single form) under its inventory name. This form never
    fails because a service does not run (the caller decides); it fails, naming the node by inventory name and
    address, when a node cannot be diagnosed at all (its apid refuses the client certificate, an API error).
author:
  - proxtalos.cluster contributors (@proxtalos)
options:
  node:
    description:
      - Address of the node.
      - Exactly one of O(node) and O(nodes) is required.
    type: str
  nodes:
    description:
      - Several nodes, diagnosed in one run at the same time (see the description); mutually exclusive with O(node).
      - Each entry names the node by its inventory host, which keys its part of RV(nodes) and names it in messages.
    type: list
    elements: dict
    suboptions:
      name:
        description:
          - The node's inventory host name (unique in the list).
        type: str
        required: true
      address:
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
        classification, evidence and events seen last). With O(nodes), a timeout is no failure - RV(nodes) and
        RV(summary) say which nodes did not run, and why.
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
  - With O(nodes), one node that cannot be diagnosed ends the wait for all (the module fails anyway); the others'
    diagnoses so far are in the failed result.
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

- name: Kubelet on every worker, in one run (every worker read at the same time)
  proxtalos.cluster.talos_node_diagnosis:
    nodes:
      - {name: w-1, address: 10.5.0.21}
      - {name: w-2, address: 10.5.0.22}
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
    wait_for: running
    wait_timeout: 300
  register: kubelet_all
  run_once: true

- name: This worker's part
  ansible.builtin.debug:
    msg: "{{ kubelet_all.nodes[inventory_hostname].evidence }}"
"""

RETURN = r"""
node:
  description: The node as reached (address:port).
  type: str
  returned: with O(node) (the single form; with O(nodes), each entry of RV(nodes) has these keys)
  sample: 10.5.0.21:50000
service:
  description: The service diagnosed.
  type: str
  returned: with O(node) (the single form; with O(nodes), each entry of RV(nodes) has these keys)
  sample: kubelet
classification:
  description: One of V(running), V(waiting_on_volume), V(not_running), V(missing), V(maintenance), V(unreachable).
  type: str
  returned: with O(node) (the single form; with O(nodes), each entry of RV(nodes) has these keys)
  sample: waiting_on_volume
remediable:
  description: True for V(waiting_on_volume), the known failure a reboot or a hard reset clears.
  type: bool
  returned: with O(node) (the single form; with O(nodes), each entry of RV(nodes) has these keys)
running:
  description: The service is Running and healthy.
  type: bool
  returned: with O(node) (the single form; with O(nodes), each entry of RV(nodes) has these keys)
state:
  description: The service's state as Talos reports it (empty when the node did not answer).
  type: str
  returned: with O(node) (the single form; with O(nodes), each entry of RV(nodes) has these keys)
  sample: Waiting
healthy:
  description: Talos' health verdict for the service.
  type: bool
  returned: with O(node) (the single form; with O(nodes), each entry of RV(nodes) has these keys)
last_event:
  description: The service's newest event (C(state), C(msg), C(ts)); empty when there is none.
  type: dict
  returned: with O(node) (the single form; with O(nodes), each entry of RV(nodes) has these keys)
  sample: {state: Waiting, msg: 'Waiting for volume "/var/lib/kubelet" to be mounted', ts: '2026-11-25T21:14:03Z'}
volume:
  description: The volume the service waits for (from the last event), else empty.
  type: str
  returned: with O(node) (the single form; with O(nodes), each entry of RV(nodes) has these keys)
  sample: /var/lib/kubelet
evidence:
  description: The diagnosis in one line, naming the node, the service, its state and last event.
  type: str
  returned: with O(node) (the single form; with O(nodes), each entry of RV(nodes) has these keys)
  sample: 'talos node 10.5.0.21:50000: kubelet is Waiting: Waiting for volume "/var/lib/kubelet" to be mounted (since 2026-11-25T21:14:03Z)'
events:
  description: The service's newest events, oldest first (at most O(events)).
  type: list
  elements: dict
  returned: with O(node) (the single form; with O(nodes), each entry of RV(nodes) has these keys)
timeline:
  description: Each change of classification while waiting (C(elapsed), C(classification), C(evidence)); at most 50.
  type: list
  elements: dict
  returned: with O(node) (the single form; with O(nodes), each entry of RV(nodes) has these keys)
elapsed:
  description: Seconds spent (with O(node) until the last read ended).
  type: float
  returned: always
attempts:
  description: Number of reads of the service list (with O(nodes), the number of rounds).
  type: int
  returned: always
nodes:
  description:
    - With O(nodes), each node's diagnosis under its inventory name, with the keys of the single form (RV(node),
      RV(classification), RV(remediable), RV(running), RV(evidence), RV(timeline), RV(elapsed) - until its last read
      ended -, RV(attempts) - its reads -...) plus C(name), the inventory name.
    - A node that could not be diagnosed has C(error), the reason, and the keys of its last diagnosis if it had one.
  type: dict
  returned: with O(nodes)
  sample:
    lab-w-2:
      name: lab-w-2
      node: 10.5.0.22:50000
      service: kubelet
      classification: waiting_on_volume
      remediable: true
      running: false
      evidence: 'talos node 10.5.0.22:50000: kubelet is Waiting: Waiting for volume "/var/lib/kubelet" to be mounted'
      volume: /var/lib/kubelet
      attempts: 4
      elapsed: 12.0
nodes_running:
  description: With O(nodes), the inventory names of the nodes whose service runs, in the order of O(nodes).
  type: list
  elements: str
  returned: with O(nodes)
  sample: [lab-w-1, lab-w-3]
nodes_not_running:
  description: With O(nodes), the nodes (inventory names) whose service does not run (not counting nodes that could not be diagnosed).
  type: list
  elements: str
  returned: with O(nodes)
  sample: [lab-w-2]
nodes_remediable:
  description: With O(nodes), the nodes whose diagnosis is V(waiting_on_volume), the known failure a reboot or a hard reset clears.
  type: list
  elements: str
  returned: with O(nodes)
  sample: [lab-w-2]
summary:
  description: With O(nodes), one line - how many nodes run the service, then each one that does not, by inventory name and address, with its evidence.
  type: str
  returned: with O(nodes)
  sample: 'kubelet running on 2 of 3 nodes; lab-w-2 (10.5.0.22:50000): kubelet did not run within 300s; last seen: kubelet is Waiting: ...'
"""

import re
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _fanout, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import client as talos_client
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import nodes as nodes_util
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
        node=dict(type='str'),
        nodes=dict(type='list', elements='dict', options=dict(
            name=dict(type='str', required=True),
            address=dict(type='str', required=True),
        )),
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


async def read_service_list(node_session):
    """The node's ServiceList over mTLS, on a fresh connection (a rebooting node drops its connections)."""
    async with talos_client.AsyncTalosClient(node_session.host, port=node_session.port, credentials=node_session.credentials,
                                             timeout=node_session.api_timeout) as connection:
        return await connection.service_list()


class Diagnoser(object):
    """Reads and classifies one node's service; remembers the last diagnosis, its changes, and when it was seen.

    name: the inventory host of the node (multi-node form), or None (single form).
    A read that fails in a way no class covers (the node refuses our client certificate, an API error...) is kept
    in `error`: the node cannot be diagnosed at all.
    """

    def __init__(self, node_session, service_id, keep_events, name=None):
        self.session = node_session
        self.service_id = service_id
        self.keep_events = keep_events
        self.name = name
        self.last = None
        self.timeline = []
        self.attempts = 0
        self.elapsed = 0.0
        self.error = None

    @property
    def label(self):
        """How a message names the node: inventory host and address, or the address alone."""
        return '%s (%s)' % (self.name, self.session.name) if self.name else 'talos node %s' % self.session.name

    @property
    def finished(self):
        """Nothing left to wait for: the service runs, or the node cannot be diagnosed."""
        return self.error is not None or (self.last is not None and self.last['running'])

    async def read(self):
        try:
            services = await read_service_list(self.session)
        except talos_errors.TalosTransientError as exc:
            return _diagnosis(self.session.name, self.service_id, UNREACHABLE, 'does not answer: %s' % exc)
        except talos_errors.TalosTlsError as exc:
            if exc.reason != 'server_certificate_untrusted':
                raise
            return _diagnosis(self.session.name, self.service_id, MAINTENANCE,
                              'answers only in maintenance mode (it has no machine config; %s cannot run)' % self.service_id)
        return classify(services, self.service_id, self.session.name, self.keep_events)

    async def probe(self, deadline):
        """One read: update the last diagnosis, the timeline (on a change), attempts and elapsed."""
        started = deadline.elapsed()
        self.attempts += 1
        try:
            diagnosis = await self.read()
        except ProxtalosError as exc:
            self.error = exc
            self.elapsed = deadline.elapsed()
            return
        self.elapsed = deadline.elapsed()
        seen = (diagnosis['classification'], diagnosis['evidence'])
        changed = self.last is None or (self.last['classification'], self.last['evidence']) != seen
        if changed and len(self.timeline) < MAX_TIMELINE:
            self.timeline.append({'elapsed': round(started, 3), 'classification': diagnosis['classification'],
                                  'evidence': diagnosis['evidence']})
        self.last = diagnosis

    def result(self):
        """The single form's result for this node (plus `name` in the multi-node form)."""
        found = dict(self.last or {}, node=self.session.name, timeline=self.timeline, elapsed=round(self.elapsed, 3),
                     attempts=self.attempts)
        if self.name is not None:
            found['name'] = self.name
        if self.error is not None:
            found['error'] = str(self.error)
        return found

    def seen(self):
        """What the node showed last, without the 'talos node <address>: ' prefix of the evidence (or its error)."""
        if self.error is not None:
            return str(self.error)
        prefix = 'talos node %s: ' % self.session.name
        evidence = self.last['evidence']
        return evidence[len(prefix):] if evidence.startswith(prefix) else evidence

    def not_running_text(self, service_id, timeout):
        """'<node>: <service> did not run within <timeout>s; last seen: <what it showed last>'."""
        return '%s: %s did not run within %.0fs; last seen: %s' % (self.label, service_id, timeout, self.seen())


def progress_summary(diagnosers, service_id):
    """What a wait over several nodes sees now: how many run, and each node that does not yet, with what it showed."""
    if len(diagnosers) == 1:
        only = diagnosers[0]
        return str(only.error) if only.error is not None else only.last['evidence']
    waiting = [diagnoser for diagnoser in diagnosers if not (diagnoser.last is not None and diagnoser.last['running'])]
    text = '%s running on %d of %d nodes' % (service_id, len(diagnosers) - len(waiting), len(diagnosers))
    return text + ('; not yet: ' + '; '.join('%s: %s' % (diagnoser.label, diagnoser.seen()) for diagnoser in waiting)
                   if waiting else '')


def diagnose(diagnosers, service_id, timeout, interval, clock=time.monotonic, sleep=time.sleep):
    """Probe every node concurrently, round after round, until each runs, one cannot be diagnosed, or the deadline.

    A round reads every node whose service does not run yet, at the same time, through _fanout.run_each; nodes
    found running are not read again. The reads are coroutines (AsyncTalosClient), so they run as tasks of one
    event loop - no thread per node. Returns the WaitResult of the rounds (attempts = rounds).
    """
    deadline = _wait.Deadline(timeout, clock)

    async def probe(diagnoser):
        await diagnoser.probe(deadline)

    def probe_round():
        # No deadline for the round's reads: the rounds' wait bounds them, and each read has the API timeout.
        # Diagnoser.probe keeps a node's errors; anything else is a bug, raised again once the round has ended.
        _fanout.run_each([diagnoser for diagnoser in diagnosers if not diagnoser.finished], probe,
                         max_workers=nodes_util.MAX_NODES_AT_ONCE, name=lambda diagnoser: diagnoser.label)
        cannot = any(diagnoser.error is not None for diagnoser in diagnosers)
        done = cannot or all(diagnoser.finished for diagnoser in diagnosers)
        return done, progress_summary(diagnosers, service_id)

    return _wait.wait_for(probe_round, timeout, interval=interval, clock=clock, sleep=sleep)


def targets(params):
    """[(inventory host or None, address, field)] from O(node) or O(nodes); bad entries named by their field."""
    if params.get('nodes') is None:
        if not params.get('node'):
            raise ValidationError('node', 'one of node or nodes is required')
        return [(None, params['node'], 'node')]
    if params.get('node'):
        raise ValidationError('nodes', 'cannot be combined with node (one node, or the list)')
    if not params['nodes']:
        raise ValidationError('nodes', 'must list at least one node')
    found = []
    seen = {}
    for index, item in enumerate(params['nodes']):
        name = (item or {}).get('name')
        address = (item or {}).get('address')
        if not name or not isinstance(name, str):
            raise ValidationError('nodes[%d].name' % index, 'the inventory host name is required')
        if not address or not isinstance(address, str):
            raise ValidationError('nodes[%d].address' % index, 'the address of %s is required' % name)
        if name in seen:
            raise ValidationError('nodes[%d].name' % index, '%s is listed twice (also nodes[%d])' % (name, seen[name]))
        seen[name] = index
        found.append((name, address, 'nodes[%d].address' % index))
    return found


def diagnosis(params, credentials, check_mode=False, clock=time.monotonic, sleep=time.sleep):
    """(result dict, failure message or None) for the module's params.

    Single form (O(node)): the node's diagnosis; a failure when O(wait_for=running) ran out of time; a node that
    cannot be diagnosed raises its error. Multi-node form (O(nodes)): `nodes` {inventory host: the single form's
    result}, never a failure for a service that does not run, a failure naming each node that cannot be diagnosed.
    """
    if params['events'] < 0:
        raise ValidationError('events', 'must be zero or more, got %d' % params['events'])
    diagnosers = []
    for name, address, field in targets(params):
        node_session = session.NodeSession(address, port=params['port'], api_timeout=params['api_timeout'],
                                           credentials=credentials, field=field, talosconfig_path=params.get('talosconfig'))
        node_session.require_credentials('reports its services only over mutual TLS')
        diagnosers.append(Diagnoser(node_session, params['service'], params['events'], name=name))
    timeout, interval = _argspec.wait_params(params)
    if params['wait_for'] == 'none' or check_mode:
        timeout = 0.0
    outcome = diagnose(diagnosers, params['service'], timeout, interval, clock=clock, sleep=sleep)
    if params.get('nodes') is None:
        only = diagnosers[0]
        if only.error is not None:
            raise only.error
        result = dict(only.result(), changed=False)
        failure = only.not_running_text(params['service'], timeout) if params['wait_for'] == 'running' and not outcome.ok else None
        return result, failure
    waited = params['wait_for'] == 'running' and not check_mode
    return multi_result(diagnosers, params['service'], outcome, timeout if waited else None)


def multi_result(diagnosers, service_id, outcome, waited_timeout):
    """(result, failure) of the multi-node form."""
    running = [diagnoser.name for diagnoser in diagnosers if diagnoser.last is not None and diagnoser.last['running']]
    cannot = [diagnoser for diagnoser in diagnosers if diagnoser.error is not None]
    stopped = [diagnoser for diagnoser in diagnosers if diagnoser.error is None and not diagnoser.last['running']]
    lines = ['%s running on %d of %d nodes' % (service_id, len(running), len(diagnosers))]
    for diagnoser in stopped:
        if waited_timeout is not None and not cannot:
            lines.append(diagnoser.not_running_text(service_id, waited_timeout))
        else:
            lines.append('%s: %s' % (diagnoser.label, diagnoser.seen()))
    result = {
        'nodes': dict((diagnoser.name, diagnoser.result()) for diagnoser in diagnosers),
        'service': service_id,
        'nodes_running': running,
        'nodes_not_running': [diagnoser.name for diagnoser in stopped],
        'nodes_remediable': [diagnoser.name for diagnoser in stopped if diagnoser.last['remediable']],
        'summary': '; '.join(lines),
        'elapsed': round(outcome.elapsed, 3),
        'attempts': outcome.attempts,
        'changed': False,
    }
    failure = None
    if cannot:
        failure = 'cannot diagnose %s on %s: %s' % (
            service_id, ', '.join(diagnoser.label for diagnoser in cannot),
            '; '.join('%s: %s' % (diagnoser.name, diagnoser.error) for diagnoser in cannot))
    return result, failure


def module_kwargs():
    """The keyword arguments of AnsibleModule for this module (the worker-side facade validates with the same)."""
    return dict(
        argument_spec=argument_spec(), supports_check_mode=True,
        mutually_exclusive=_argspec.TALOS_AUTH_CONSTRAINTS['mutually_exclusive'] + [('node', 'nodes')],
        required_one_of=[('node', 'nodes')],
    )


def run(module):
    """The module's work on an AnsibleModule or on the worker's facade of one (plugin_utils/_action_module.py)."""
    missing = session.missing_libraries()
    if missing:
        module.fail_json(msg=missing_required_lib(missing[0][0]), exception=missing[0][1])
    try:
        credentials = session.load_credentials(module.params, module)
        result, failure = diagnosis(module.params, credentials, check_mode=module.check_mode)
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), changed=False, **exc.details)
    if failure:
        module.fail_json(msg=failure, **result)
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
