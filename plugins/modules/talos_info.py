#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: talos_info
short_description: Read a Talos node's state, and gate on its services
version_added: 0.1.0
description:
  - Reads what the stage gates and the report need from one Talos node - whether it is in maintenance mode, its
    Talos version, its services (state, health, last event) and the etcd members it sees.
  - Waits (up to O(wait_timeout)) until the node's Talos API answers at all; with O(healthy_services), also until
    each of those services is Running and healthy (Talos' own rule - the last event is C(Running) and the health
    check passes). This is the collection's Talos service gate; when it times out, the task fails naming the node,
    each failing service, its state and its last event.
  - Never changes anything.
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
  - proxtalos.cluster._attributes.INFO_MODULE
  - proxtalos.cluster._talos_auth
  - proxtalos.cluster._wait
options:
  node:
    description:
      - Address of the node.
    type: str
    required: true
  gather:
    description:
      - What to read besides the mode. V(version) - C(MachineService/Version). V(services) - C(ServiceList).
        V(etcd) - C(EtcdMemberList) (control planes).
      - A configured node answers only over mutual TLS, so everything but the mode needs O(talosconfig) or
        O(talosconfig_content) then; without them only RV(mode) is returned for it.
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
  - RV(stage) is derived from the API (COSI C(MachineStatus) is not read) - V(maintenance) when the node serves
    its maintenance API, V(running) when it is configured and lists no service in a starting state (Starting,
    Preparing, Waiting, Initialized), V(booting) otherwise.
seealso:
  - module: proxtalos.cluster.talos_apply
  - module: proxtalos.cluster.talos_bootstrap
"""

EXAMPLES = r"""
- name: Gate - Talos services Running and healthy on every node
  proxtalos.cluster.talos_info:
    node: "{{ node_ip }}"
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
    gather: [services]
    healthy_services: "{{ ['etcd', 'apid', 'trustd', 'kubelet', 'containerd'] if inventory_hostname in groups['controlplane']
                          else ['apid', 'kubelet', 'containerd'] }}"
    wait_timeout: 600

- name: Facts for a report
  proxtalos.cluster.talos_info:
    node: "{{ node_ip }}"
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
  register: talos_facts
"""

RETURN = r"""
node:
  description: The node as reached (address:port).
  returned: always
  type: str
mode:
  description: V(maintenance) (no config; served without client certificates) or V(configured) (mutual TLS).
  returned: always
  type: str
stage:
  description: Derived boot stage (see the notes) - V(maintenance), V(booting) or V(running); empty when the services
    were not read.
  returned: always
  type: str
version:
  description: Talos version of the node (tag, sha, arch, platform...); empty when not gathered or not readable.
  returned: always
  type: dict
  sample: {tag: v1.13.9, arch: amd64, platform: {name: metal, mode: metal}}
services:
  description: Each service with its state, health and last event.
  returned: always
  type: list
  elements: dict
  sample: [{service: kubelet, state: Running, healthy: true, health_message: '', last_event: 'Running: Health check successful'}]
failing_services:
  description: The services of O(healthy_services) that are not Running and healthy (empty when the gate passed).
  returned: always
  type: list
  elements: dict
etcd:
  description: The etcd members this node sees (id as hex, hostname, peer and client URLs, learner flag), and the
    error text when it could not tell (etcd not running yet, or not a control plane).
  returned: always
  type: dict
  sample: {members: [{id: 3bd0c1a2f4e6d8b0, hostname: cp-1, peer_urls: ['https://10.5.0.11:2380'], is_learner: false}], error: null}
elapsed:
  description: Seconds spent, waiting included.
  returned: always
  type: float
report_facts:
  description:
    - What the run report (the C(proxtalos.cluster.timeline) callback) shows for this host's node - plain values
      only, each key present when it was read.
  returned: always
  type: dict
  sample: {talos_mode: configured, talos_stage: running, talos_version: v1.13.9,
           talos_services: 'apid Running, containerd Running, etcd Running, kubelet Running, trustd Running',
           talos_services_unhealthy: '', etcd_members: 3}
  contains:
    talos_mode:
      description: RV(mode).
      type: str
    talos_stage:
      description: RV(stage), when the services were read.
      type: str
    talos_version:
      description: The Talos version tag, when the version was read.
      type: str
    talos_services:
      description: Each service with its state, in one line (C(<id> <state>), C(unhealthy) added when a Running
        service fails its health check; a service without a health check, such as C(udevd), is not marked).
      type: str
    talos_services_unhealthy:
      description: The services that are not Running, or Running with a failing health check, comma-separated
        (empty when none).
      type: str
    etcd_members:
      description: The number of etcd members the node sees, when etcd was read without an error.
      type: int
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, WaitTimeout
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import health, session

STARTING_STATES = ('Initialized', 'Starting', 'Preparing', 'Waiting')


def argument_spec():
    return _argspec.spec(
        _argspec.TALOS_AUTH_SPEC, _argspec.WAIT_SPEC,
        node=dict(type='str', required=True),
        gather=dict(type='list', elements='str', choices=['version', 'services', 'etcd'],
                    default=['version', 'services', 'etcd']),
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


class Reader(object):
    """The reads of one node, each retried on transient errors within the shared deadline."""

    def __init__(self, node_session, deadline, interval):
        self.session = node_session
        self.deadline = deadline
        self.interval = interval

    def call(self, maintenance, method):
        def attempt():
            if maintenance:
                return self.session.call_insecure(method)
            return self.session.call(method)
        try:
            return _wait.retry(attempt, self.deadline.remaining(), interval=self.interval, transient=session.TRANSIENT,
                               backoff=1.0, max_interval=self.interval)
        except talos_errors.TalosTransientError as exc:
            raise ProxtalosError('talos node %s: %s did not answer within %gs: %s'
                                 % (self.session.name, method, self.deadline.timeout, exc), node=self.session.name)

    def etcd(self):
        try:
            members = self.session.call('etcd_member_list')
        except (talos_errors.TalosApiError, talos_errors.TalosTransientError) as exc:
            return {'members': [], 'error': exc.talos_message or str(exc)}
        return {'members': [health.member_summary(member) for member in members], 'error': None}


def wait_services(node_session, required, deadline, interval):
    """Wait until the required services are Running and healthy; returns the service list."""
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

    result = session.wait_until(probe, deadline, interval)
    if not result.ok:
        raise WaitTimeout('talos node %s: services not Running and healthy within %gs: %s'
                          % (node_session.name, deadline.timeout, result.observation), result, node=node_session.name,
                          failing_services=seen['problems'])
    return seen['services']


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True,
                           mutually_exclusive=_argspec.TALOS_AUTH_CONSTRAINTS['mutually_exclusive'])
    missing = session.missing_libraries()
    if missing:
        module.fail_json(msg=missing_required_lib(missing[0][0]), exception=missing[0][1])
    params = module.params
    result = dict(changed=False, node='', mode='', stage='', version={}, services=[], failing_services=[],
                  etcd={'members': [], 'error': None}, elapsed=0.0, report_facts={})
    try:
        credentials = session.load_credentials(params, module)
        node_session = session.NodeSession.from_params(params, credentials)
        result['node'] = node_session.name
        deadline, interval = session.deadline_for(params)
        mode = node_session.wait_reachable(deadline, interval)
        result['mode'] = mode
        maintenance = mode == session.MAINTENANCE
        services = None
        if params['healthy_services']:
            node_session.require_credentials('must report its services over mutual TLS')
            services = wait_services(node_session, params['healthy_services'], deadline, interval)
        readable = maintenance or credentials is not None
        reader = Reader(node_session, deadline, interval)
        if readable and 'services' in params['gather'] and services is None:
            services = reader.call(maintenance, 'service_list')
        if readable and 'version' in params['gather']:
            try:
                result['version'] = reader.call(maintenance, 'version')
            except talos_errors.TalosApiError as exc:
                if not (maintenance and exc.unimplemented):  # Talos 1.12 serves no Version in maintenance mode
                    raise
        if 'etcd' in params['gather'] and not maintenance and credentials is not None:
            result['etcd'] = reader.etcd()
        if services is not None:
            result['services'] = [health.describe_service(service) for service in services]
        result['stage'] = derive_stage(mode, services)
        result['elapsed'] = round(deadline.elapsed(), 3)
        result['report_facts'] = report_facts(result, services)
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **dict(exc.details, node=result['node'] or params['node']))
    module.exit_json(**result)


if __name__ == '__main__':
    main()
