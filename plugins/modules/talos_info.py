#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: talos_info
short_description: Read Talos nodes' state, and gate on their services
version_added: 0.1.0
description:
  - Reads what the stage gates and the report need from a Talos node - whether it is in maintenance mode, its
    Talos version, its services (state, health, last event) and the etcd members it sees.
  - Waits (up to O(wait_timeout)) until the node's Talos API answers at all; with O(healthy_services), also until
    each of those services is Running and healthy (Talos' own rule - the last event is C(Running) and the health
    check passes). This is the collection's Talos service gate; when it times out, the task fails naming the node,
    each failing service, its state and its last event.
  - One run checks every node of O(nodes) (a C(run_once) task over the play's hosts; a single node is a
    one-element list). The nodes are probed at the same time, each on a thread of its own, under the one deadline
    of the run (O(wait_timeout) from the start of the run); a slow or silent node does not delay the others. The
    result has each node's result under its name (RV(nodes)), one gate per node (RV(gates), with O(gate_name)) and
    the report facts per host (RV(report_facts_by_host)). When any node does not pass by the deadline, the task
    fails naming every failing node by name and address with its reason; the nodes that passed are still in
    RV(nodes) and RV(gates).
  - Never changes anything.
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
  - proxtalos.cluster._attributes.INFO_MODULE
  - proxtalos.cluster._talos_auth
  - proxtalos.cluster._wait
options:
  nodes:
    description:
      - The nodes to probe in one run, each by its inventory host name and address. Names must be unique. One node
        is a one-element list.
      - O(gather) and O(healthy_services) apply to every node unless the node sets its own.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description:
          - The node's inventory host name; keys RV(nodes) and RV(report_facts_by_host), the RV(gates) item's C(host),
            and names the node in messages.
        type: str
        required: true
      address:
        description:
          - Address of the node (its Talos API).
        type: str
        required: true
      gather:
        description:
          - O(gather) for this node (for example C(etcd) only on control planes).
        type: list
        elements: str
        choices: [version, services, etcd]
      healthy_services:
        description:
          - O(healthy_services) for this node (control planes and workers run different services).
        type: list
        elements: str
  gate_name:
    description:
      - The name of each node's gate record in RV(gates) (the run report shows it per node, as a
        per-host C(Gate - <name>) task did). Without it RV(gates) is empty (a read that is no gate).
    type: str
  gather:
    description:
      - What to read besides the mode. V(version) - C(MachineService/Version). V(services) - C(ServiceList).
        V(etcd) - C(EtcdMemberList) (control planes).
      - A configured node answers only over mutual TLS, so everything but the mode needs O(talosconfig) or
        O(talosconfig_content) then; without them only its C(mode) is returned.
    type: list
    elements: str
    choices: [version, services, etcd]
    default: [version, services, etcd]
  healthy_services:
    description:
      - Service ids (for example V(etcd), V(apid), V(trustd), V(kubelet), V(containerd)) that must be Running and
        healthy; the module waits for them and fails with the failing ones when O(wait_timeout) passes.
    type: list
    elements: str
    default: []
notes:
  - A node's C(stage) is derived from the API (COSI C(MachineStatus) is not read) - V(maintenance) when the node serves
    its maintenance API, V(running) when it is configured and lists no service in a starting state (Starting,
    Preparing, Waiting, Initialized), V(booting) otherwise.
seealso:
  - module: proxtalos.cluster.talos_apply
  - module: proxtalos.cluster.talos_bootstrap
"""

EXAMPLES = r"""
- name: Facts for a report (one node is a one-element list)
  proxtalos.cluster.talos_info:
    nodes:
      - {name: cp-1, address: 10.5.0.11}
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
  register: talos_facts

- name: The node's Talos version
  ansible.builtin.debug:
    msg: "{{ talos_facts.nodes['cp-1'].version.tag }}"

- name: Gate - the Talos API answers on port 50000 (every node of the play in one run)
  proxtalos.cluster.talos_info:
    nodes: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'node_ip')))
               | dict2items(key_name='name', value_name='address') }}"
    gather: []
    gate_name: the Talos API answers on port 50000
  run_once: true

- name: Gate - Talos services Running and healthy on every node, each node its own services
  proxtalos.cluster.talos_info:
    nodes:
      - {name: cp-1, address: 10.5.0.11, healthy_services: [etcd, apid, trustd, kubelet, containerd]}
      - {name: w-1, address: 10.5.0.21, healthy_services: [apid, kubelet, containerd]}
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
    gather: [services]
    gate_name: Talos services Running and healthy
  run_once: true
  register: talos_services

- name: A per-host task takes its node's part of the run_once result
  ansible.builtin.debug:
    msg: "{{ talos_services.nodes[inventory_hostname].report_facts.talos_services }}"
"""

RETURN = r"""
elapsed:
  description: Seconds spent by the whole run, waiting included (each node's own in RV(nodes)).
  returned: always
  type: float
nodes:
  description:
    - Each node's result under its name (the keys below), also for a node that failed (what was seen until it
      failed; its C(report_facts) empty).
    - A per-host task after a C(run_once) task reads its node's part as C(result.nodes[inventory_hostname]).
    - Absent, like RV(gates), RV(report_facts_by_host) and RV(failed_nodes), when the run fails before any node is
      probed.
    - The keys of each entry follow.
    - C(node) (str) - The node as reached (address:port).
    - C(mode) (str) - V(maintenance) (no config; served without client certificates) or V(configured) (mutual TLS).
    - C(stage) (str) - Derived boot stage (see the notes) - V(maintenance), V(booting) or V(running); empty when the
      services were not read.
    - C(version) (dict) - Talos version of the node (tag, sha, arch, platform...); empty when not gathered or not
      readable.
    - C(services) (list) - Each service with its state, health and last event.
    - C(failing_services) (list) - The services of O(healthy_services) that are not Running and healthy (empty when
      the gate passed).
    - C(etcd) (dict) - The etcd members this node sees (id as hex, hostname, peer and client URLs, learner flag),
      and the error text when it could not tell (etcd not running yet, or not a control plane).
    - C(elapsed) (float) - Seconds spent on this node, waiting included.
    - C(report_facts) (dict) - What the run report (the C(proxtalos.cluster.timeline) callback) shows for this node
      - plain values only, each key present when it was read. Its keys - C(talos_mode) - The node's C(mode).;
      C(talos_stage) - The node's C(stage), when the services were read.; C(talos_version) - The Talos version tag,
      when the version was read.; C(talos_services) - Each service with its state, in one line (C(<id> <state>),
      C(unhealthy) added when a Running service fails its health check; a service without a health check, such as
      C(udevd), is not marked).; C(talos_services_unhealthy) - The services that are not Running, or Running with a
      failing health check, comma-separated (empty when none).; C(etcd_members) - The number of etcd members the
      node sees, when etcd was read without an error.
  returned: once the nodes are probed
  type: dict
  sample: {lab-w-1: {node: '10.5.0.21:50000', mode: configured, stage: running, failing_services: [], elapsed: 0.4}}
gates:
  description:
    - With O(gate_name), one gate per node, passed or failed, in the order of O(nodes) (the run
      report's convention 0) - C(name) (O(gate_name)), C(ok), C(host) (the node's name), C(observation) (what was
      seen last, or why it failed), C(elapsed), C(attempts) (probes), C(target) (address:port), C(diagnosis) (the
      failing services, one line each), C(started_at) and C(ended_at) (wall clock, seconds since the epoch - when
      the run began probing and when this node's checks ended, so the report places each node's gate inside the
      task).
  returned: once the nodes are probed
  type: list
  elements: dict
  sample: [{name: the Talos API answers on port 50000, ok: true, host: lab-w-1, observation: answers (configured),
            elapsed: 0.2, attempts: 1, target: '10.5.0.21:50000', diagnosis: [], started_at: 1796263200.101,
            ended_at: 1796263200.301}]
report_facts_by_host:
  description: The C(report_facts) of each node that passed, by its name.
  returned: once the nodes are probed
  type: dict
failed_nodes:
  description:
    - Each node that did not pass, by its name - its name, address and port, and why, as in the
      failure message; empty when all passed.
    - Absent when the run fails before any node is probed (a bad O(nodes) list, a talosconfig that does not load) -
      that failure names the option or file, no node.
  returned: once the nodes are probed
  type: dict
  sample: {lab-w-1: "lab-w-1 (10.5.0.21:50000): services not Running and healthy within 600s: kubelet is Waiting"}
"""


from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, WaitTimeout
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import health, nodes as talos_nodes, session

STARTING_STATES = ('Initialized', 'Starting', 'Preparing', 'Waiting')
GATHER_CHOICES = ['version', 'services', 'etcd']


def argument_spec():
    return _argspec.spec(
        _argspec.TALOS_AUTH_SPEC, _argspec.WAIT_SPEC,
        nodes=dict(type='list', elements='dict', required=True, options=dict(
            name=dict(type='str', required=True),
            address=dict(type='str', required=True),
            gather=dict(type='list', elements='str', choices=GATHER_CHOICES),
            healthy_services=dict(type='list', elements='str'),
        )),
        gate_name=dict(type='str'),
        gather=dict(type='list', elements='str', choices=GATHER_CHOICES, default=GATHER_CHOICES),
        healthy_services=dict(type='list', elements='str', default=[]),
    )


def service_unhealthy(service):
    """Not Running, or Running with a health check that fails (a service without one, such as udevd, is fine)."""
    health = service.get('health') or {}
    return service.get('state') != 'Running' or (not health.get('unknown') and not health.get('healthy'))


def report_facts(result, services):
    """The plain values the run report shows for the node, from this module's result and the raw service list."""
    facts = {'talos_mode': result['mode']}
    if result['stage']:
        facts['talos_stage'] = result['stage']
    if result['version'].get('tag'):
        facts['talos_version'] = result['version']['tag']
    if services:
        ordered = sorted(services, key=lambda service: service.get('id') or '')
        facts['talos_services'] = ', '.join(
            '%s %s%s' % (service.get('id'), service.get('state'),
                         ' unhealthy' if service.get('state') == 'Running' and service_unhealthy(service) else '')
            for service in ordered)
        facts['talos_services_unhealthy'] = ', '.join(service.get('id') or '' for service in ordered if service_unhealthy(service))
    if result['etcd']['members'] and result['etcd']['error'] is None:
        facts['etcd_members'] = len(result['etcd']['members'])
    return facts


def derive_stage(mode, services):
    if mode == session.MAINTENANCE:
        return 'maintenance'
    if services is None:
        return ''
    if any(service.get('state') in STARTING_STATES for service in services):
        return 'booting'
    return 'running'


def empty_result():
    """The per-node result keys, before anything was read."""
    return dict(node='', mode='', stage='', version={}, services=[], failing_services=[],
                etcd={'members': [], 'error': None}, elapsed=0.0, report_facts={})


class Reader(object):
    """The reads of one node, each retried on transient errors within the shared deadline."""

    def __init__(self, node_session, deadline, interval, progress=_wait.FROM_ENVIRONMENT):
        self.session = node_session
        self.deadline = deadline
        self.interval = interval
        self.progress = progress

    def call(self, maintenance, method):
        def attempt():
            if maintenance:
                return self.session.call_insecure(method)
            return self.session.call(method)
        try:
            return _wait.retry(attempt, self.deadline.remaining(), interval=self.interval, transient=session.TRANSIENT,
                               backoff=1.0, max_interval=self.interval, progress=self.progress)
        except talos_errors.TalosTransientError as exc:
            raise ProxtalosError('talos node %s: %s did not answer within %gs: %s'
                                 % (self.session.display, method, self.deadline.timeout, exc), node=self.session.name)

    def etcd(self):
        try:
            # Before bootstrap Talos answers only at the deadline (talos_bootstrap.MEMBER_LIST_TIMEOUT): a short one.
            members = self.session.call_within(min(5.0, self.session.api_timeout), 'etcd_member_list')
        except (talos_errors.TalosApiError, talos_errors.TalosTransientError) as exc:
            return {'members': [], 'error': exc.talos_message or str(exc)}
        return {'members': [health.member_summary(member) for member in members], 'error': None}


def wait_services(node_session, required, deadline, interval, progress=_wait.FROM_ENVIRONMENT):
    """Wait until the required services are Running and healthy; returns (service list, WaitResult)."""
    seen = {'services': None, 'problems': []}

    def probe():
        try:
            services = node_session.call('service_list')
        except talos_errors.TalosTlsError as exc:
            if exc.reason == 'server_certificate_untrusted':
                return False, 'the node is in maintenance mode (not configured)'
            raise
        seen['services'] = services
        seen['problems'] = health.service_problems(services, required)
        if not seen['problems']:
            return True, 'all of %s Running and healthy' % ', '.join(required)
        return False, '; '.join(health.describe_service_problem(problem) for problem in seen['problems'])

    result = session.wait_until(probe, deadline, interval, progress=progress)
    if not result.ok:
        raise WaitTimeout('talos node %s: services not Running and healthy within %gs: %s'
                          % (node_session.display, deadline.timeout, result.observation), result, node=node_session.name,
                          failing_services=seen['problems'])
    return seen['services'], result


def probe_node(node_session, credentials, gather, healthy_services, deadline, interval, result, progress=_wait.FROM_ENVIRONMENT):
    """The checks and reads of one node into `result` (empty_result(); filled as it goes, so a failure leaves
    what was seen). Returns the gate's (observation, attempts); raises ProxtalosError when a check fails."""
    result['node'] = node_session.name
    mode, reached = node_session.reach(deadline, interval, progress=progress)
    observation, attempts = reached.observation, reached.attempts
    result['mode'] = mode
    maintenance = mode == session.MAINTENANCE
    services = None
    if healthy_services:
        node_session.require_credentials('must report its services over mutual TLS')
        services, waited = wait_services(node_session, healthy_services, deadline, interval, progress=progress)
        observation, attempts = waited.observation, attempts + waited.attempts
    readable = maintenance or credentials is not None
    reader = Reader(node_session, deadline, interval, progress=progress)
    if readable and 'services' in gather and services is None:
        try:
            services = reader.call(maintenance, 'service_list')
        except talos_errors.TalosApiError as exc:
            # Talos 1.12's maintenance server implements no ServiceList (internal/app/maintenance/server.go)
            if not (maintenance and exc.unimplemented):
                raise
    if readable and 'version' in gather:
        try:
            result['version'] = reader.call(maintenance, 'version')
        except talos_errors.TalosApiError as exc:
            if not (maintenance and exc.unimplemented):  # Talos 1.12 serves no Version in maintenance mode
                raise
    if 'etcd' in gather and not maintenance and credentials is not None:
        result['etcd'] = reader.etcd()
    if services is not None:
        result['services'] = [health.describe_service(service) for service in services]
    result['stage'] = derive_stage(mode, services)
    result['elapsed'] = round(deadline.elapsed(), 3)
    result['report_facts'] = report_facts(result, services)
    return observation, attempts


def gate_of(gate_name, name, node_session, ok, observation, node_result, attempts, diagnosis, span):
    return {'name': gate_name, 'ok': ok, 'host': name, 'observation': observation, 'elapsed': node_result['elapsed'],
            'attempts': attempts, 'target': node_session.name, 'diagnosis': diagnosis,
            'started_at': round(span[0], 3), 'ended_at': round(span[1], 3)}


def probe_all(module, credentials):
    """Every node of option nodes probed at once, one result; fails naming each failing node."""
    params = module.params
    targets = talos_nodes.check_targets(params['nodes'])
    deadline, interval = session.deadline_for(params)
    run = talos_nodes.NodesRun(targets, lambda item: session.NodeSession.from_params(params, credentials, host=item['address'],
                                                                                     field='nodes', label=item['name']),
                               empty_result, deadline)

    def work(item, node_session, node_result, progress):
        gather = item['gather'] if item.get('gather') is not None else params['gather']
        required = item['healthy_services'] if item.get('healthy_services') is not None else params['healthy_services']
        return probe_node(node_session, credentials, gather, required, deadline, interval, node_result, progress=progress)

    gates, facts, failed = [], {}, {}
    for item, outcome, error, span in run.run(work):
        name, node_session, node_result = item['name'], run.sessions[item['name']], run.results[item['name']]
        node_result['node'] = node_session.name
        if error is None:
            facts[name] = node_result['report_facts']
            if params['gate_name']:
                gates.append(gate_of(params['gate_name'], name, node_session, True, outcome[0], node_result, outcome[1], [], span))
            continue
        failed[name] = talos_nodes.failure_line(name, node_session, error)
        node_result['failing_services'] = error.details.get('failing_services') or []
        node_result['report_facts'] = {}
        if params['gate_name']:
            gates.append(gate_of(params['gate_name'], name, node_session, False, str(error), node_result,
                                 error.details.get('attempts') or 0,
                                 [health.describe_service_problem(problem) for problem in node_result['failing_services']], span))
    outcome = dict(changed=False, nodes=run.results, gates=gates, report_facts_by_host=facts, failed_nodes=failed,
                   elapsed=round(deadline.elapsed(), 3))
    if failed:
        summary = run.failure_summary(failed)
        run.progress.finish(False, summary)
        module.fail_json(msg='talos_info: ' + summary, **outcome)
    run.progress.finish(True, 'all %d nodes passed' % len(targets))
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
    try:
        credentials = session.load_credentials(module.params, module)
        probe_all(module, credentials)
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **exc.details)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
