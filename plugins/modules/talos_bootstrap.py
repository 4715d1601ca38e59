#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: talos_bootstrap
short_description: Bootstrap etcd on the first Talos control plane, once, and wait for quorum
version_added: 0.1.0
description:
  - Bootstraps the cluster's etcd like C(talosctl bootstrap), on the first control plane of O(nodes) and never on
    another one.
  - Asks the cluster first. Every control plane of O(nodes) must answer C(ServiceList) over mutual TLS (waiting for
    them up to O(wait_timeout)), and each is asked C(EtcdMemberList) with a 5 second deadline. Before bootstrap real
    Talos answers that question only at the caller's deadline (C(DEADLINE_EXCEEDED)), or with C(UNKNOWN) "no
    controlplane endpoints discovered yet", or C(UNAVAILABLE); each of these means "no member list", not an error.
  - The cluster is already bootstrapped, and nothing is called (C(changed=false)), when any control plane lists etcd
    members, runs etcd (C(Running), C(Stopping)), shows in its service events that etcd ran since it booted, or shows
    etcd C(Finished) (Talos marks a waiting etcd so when a bootstrap starts).
  - An etcd C(Failed) in its pre stage (the 30 minute join timeout, or an image pull that failed) never held data, so
    it does not count. Any other C(Failed) etcd cannot be told apart from a bootstrapped one that crashed, so the task
    fails naming it instead of risking a second etcd cluster.
  - Otherwise calls C(MachineService/Bootstrap) on the first control plane. A node that answers C(AlreadyExists)
    ("etcd data directory is not empty") was bootstrapped before; that is reported as done, C(changed=false).
  - RV(decision) says what the decision rested on.
  - Then waits until etcd has full quorum - every control plane runs a healthy etcd, and each lists the same members,
    one per control plane, none a learner, each peer URL on a control-plane address - unless O(wait_for_quorum=false).
  - Run it once for the cluster (C(run_once)), with all control planes in O(nodes), in inventory order.
attributes:
  check_mode:
    support: full
    details:
      - Asks the cluster and predicts; never calls Bootstrap and does not wait for quorum.
  diff_mode:
    support: none
author:
  - proxtalos.cluster contributors (@proxtalos)
extends_documentation_fragment:
  - proxtalos.cluster._attributes
  - proxtalos.cluster._talos_auth
  - proxtalos.cluster._wait
options:
  nodes:
    description:
      - Addresses of every control plane of the cluster, in inventory order. The first one is bootstrapped.
    type: list
    elements: str
    required: true
  wait_for_quorum:
    description:
      - Whether to wait for full quorum after the decision (and the Bootstrap call).
      - V(false) returns once the first control plane is bootstrapped (or found bootstrapped), so that what needs only
        the API can start while the other control planes join; a later run with V(true) on the same cluster calls
        nothing and is the quorum gate (the role proxtalos.cluster.talos_cluster, entry points C(etcd) and
        C(quorum)). The wait for every control plane to answer before deciding happens either way.
    type: bool
    default: true
notes:
  - "Idempotence limits: the decision rests on what the control planes report. If a control plane of the cluster is
    missing from O(nodes), its etcd is not seen; if it holds the only etcd member, a bootstrap of the first node
    would start a second etcd cluster. Talos itself refuses a second bootstrap only on a node whose own etcd data
    directory is not empty. Keep O(nodes) complete."
  - A control plane that does not answer fails the task (naming it) instead of being skipped, for the same reason.
  - "Service events start afresh at every boot: if every control plane of a bootstrapped cluster rebooted at once and
    none has etcd running yet, only Bootstrap's C(AlreadyExists) on the first control plane stands between the task
    and a second etcd cluster. Run it when the control planes are up, not in the middle of a rolling reboot."
seealso:
  - module: proxtalos.cluster.talos_info
  - module: proxtalos.cluster.talos_kubeconfig
"""

EXAMPLES = r"""
- name: Bootstrap etcd once, on the first control plane
  proxtalos.cluster.talos_bootstrap:
    nodes: "{{ groups['controlplane'] | map('extract', hostvars, 'node_ip') | list }}"
    talosconfig: "artifacts/{{ cluster_name }}/talosconfig"
    wait_timeout: 900
  run_once: true
"""

RETURN = r"""
outcome:
  description: V(bootstrapped) (Bootstrap was called and accepted), V(already_bootstrapped) (the cluster reported etcd
    members, or an etcd that runs or ran; nothing called), V(already_exists) (the node answered AlreadyExists), or
    V(would_bootstrap) in check mode.
  returned: always
  type: str
decision:
  description: How the module decided - what showed etcd data or members, or that no control plane showed any (and
    whether Bootstrap answered AlreadyExists).
  returned: always
  type: str
bootstrap_node:
  description: The control plane that was (or would be) bootstrapped; empty when nothing was called.
  returned: always
  type: str
details:
  description: What the control planes reported before the decision, one line per node.
  returned: always
  type: list
  elements: str
members:
  description: The etcd members after the wait (id as hex, hostname, peer and client URLs, learner flag).
  returned: always
  type: list
  elements: dict
quorum:
  description: Whether full quorum was seen (every control plane a healthy member); false when not waited for.
  returned: always
  type: bool
elapsed:
  description: Seconds spent, waiting included.
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.proxtalos.cluster.plugins.module_utils import _argspec, _fanout, _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError, WaitTimeout
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import errors as talos_errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import health, session
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import nodes as nodes_util

# Seconds one EtcdMemberList may take. Before bootstrap, real Talos answers it only at the caller's deadline (its etcd
# client waits for a member to connect to); a short deadline keeps the question cheap.
MEMBER_LIST_TIMEOUT = 5.0

# A service runner that fails in PreFunc records this (Talos service_runner.go "failed to run pre stage", capitalised
# by system.go): for etcd, the join timeout or an image pull that failed before any data was written.
PRE_STAGE_FAILURE = 'Failed to run pre stage'


def argument_spec():
    return _argspec.spec(
        _argspec.TALOS_AUTH_SPEC, _argspec.WAIT_SPEC,
        nodes=dict(type='list', elements='str', required=True),
        wait_for_quorum=dict(type='bool', default=True),
    )


def member_list(node_session):
    """(members or None, why none): EtcdMemberList within MEMBER_LIST_TIMEOUT seconds.

    No member list is a normal answer before bootstrap: DEADLINE_EXCEEDED (the node's etcd client found no member
    to ask within the deadline), UNKNOWN "no controlplane endpoints discovered yet", UNAVAILABLE, or
    FAILED_PRECONDITION / NOT_FOUND. Other errors (PERMISSION_DENIED, UNIMPLEMENTED on a worker) are raised.
    """
    try:
        return node_session.call_within(min(MEMBER_LIST_TIMEOUT, node_session.api_timeout), 'etcd_member_list'), ''
    except talos_errors.TalosTransientError as exc:
        if exc.code in ('UNAVAILABLE', 'DEADLINE_EXCEEDED'):
            return None, exc.code
        raise
    except talos_errors.TalosApiError as exc:
        if exc.code in ('UNKNOWN', 'FAILED_PRECONDITION', 'NOT_FOUND'):
            return None, '%s %s' % (exc.code, exc.talos_message or '')
        raise


def observe(node_session):
    """{'etcd_service': dict or None, 'members': list or None, 'no_members': why, 'error': None} of one control plane."""
    services = node_session.call('service_list')
    etcd_service = next((service for service in services if service.get('id') == 'etcd'), None)
    members, why = member_list(node_session)
    return {'etcd_service': etcd_service, 'members': members, 'no_members': why, 'error': None}


def describe(address, seen):
    service = seen.get('etcd_service')
    state = service.get('state') if service else 'not listed'
    members = seen.get('members')
    if members is not None:
        listed = '%d etcd members' % len(members)
    else:
        listed = 'no member list (%s)' % (seen.get('no_members') or 'etcd not running').strip()
    return '%s: etcd %s, %s' % (address, state, listed)


def _ran(service):
    """True when the service's kept events show it Running at some point of this boot."""
    return any(event.get('state') == 'Running' for event in (service.get('events') or []))


def etcd_evidence(address, seen):
    """('data', why) when this control plane shows etcd data or members, ('none', why) when it shows none,
    ('unclear', why) when its etcd state says neither."""
    members = seen.get('members')
    if members:
        return 'data', '%s lists %d etcd members' % (address, len(members))
    service = seen.get('etcd_service')
    if not service:
        return 'none', '%s lists no etcd service' % address
    state = service.get('state')
    message = service.get('message') or (service.get('events') or [{}])[-1].get('msg') or ''
    if state in ('Running', 'Stopping') or _ran(service):
        return 'data', '%s runs etcd (%s)' % (address, state)
    if state == 'Finished':
        # Talos' BootstrapEtcd marks the waiting etcd Finished "Bootstrap requested" before it starts it again.
        return 'data', '%s: etcd Finished (%s): a bootstrap is under way there' % (address, message)
    if state == 'Failed':
        if message.startswith(PRE_STAGE_FAILURE):
            return 'none', '%s: etcd Failed before it ever ran (%s)' % (address, message.split('\n', 1)[0])
        return 'unclear', '%s: etcd Failed (%s)' % (address, message.split('\n', 1)[0])
    return 'none', '%s: etcd %s, never ran this boot' % (address, state)


def decide(observations):
    """('bootstrapped', why) / ('fresh', why): what the control planes show; ProxtalosError when they cannot tell."""
    evidence = [etcd_evidence(address, seen) for address, seen in observations.items()]
    data = [why for kind, why in evidence if kind == 'data']
    if data:
        return 'bootstrapped', 'etcd found: %s' % '; '.join(data)
    unclear = [why for kind, why in evidence if kind == 'unclear']
    if unclear:
        raise ProxtalosError('cannot tell whether etcd was bootstrapped, so Bootstrap is not called (a second bootstrap '
                             'would split etcd): %s; see the etcd logs of those nodes (talosctl logs etcd)'
                             % '; '.join(unclear))
    return 'fresh', 'no control plane runs etcd, ran it this boot or lists members (%s)' % '; '.join(why for dummy, why in evidence)


def observe_when_answering(node_session, deadline, interval):
    """observe() of one control plane, waiting (within the deadline) until it answers over mTLS."""
    seen = {}

    def probe():
        seen.update(observe(node_session))
        return True, 'answered'
    node_session.wait_until(probe, deadline, interval, 'the control plane answering over mTLS (before deciding to bootstrap)')
    return seen


def ask_cluster(sessions, deadline, interval):
    """Every control plane's observation, asked at the same time (a member list may take MEMBER_LIST_TIMEOUT); each must
    answer: the first failure (in the order of nodes) is raised."""
    fanout = _fanout.run_each(sessions, lambda pair: observe_when_answering(pair[1], deadline, interval), deadline,
                              max_workers=nodes_util.MAX_NODES_AT_ONCE, name=lambda pair: pair[0])
    for outcome in fanout:
        if outcome.error is not None:
            raise outcome.error
    return dict((outcome.item[0], outcome.value) for outcome in fanout)


def bootstrap(node_session, deadline, interval):
    """Call Bootstrap; 'bootstrapped' or 'already_exists'. 'not available yet' is retried within the deadline."""
    outcome = {}

    def call():
        try:
            node_session.call('bootstrap')
            outcome['action'] = 'bootstrapped'
        except talos_errors.TalosApiError as exc:
            if exc.already_exists:
                outcome['action'] = 'already_exists'
                outcome['message'] = exc.talos_message
            elif exc.failed_precondition:
                raise talos_errors.TalosTransientError(str(exc), node=exc.node, method=exc.method, code=exc.code,
                                                       talos_message=exc.talos_message)
            else:
                raise
    try:
        _wait.retry(call, deadline.remaining(), interval=interval, transient=session.TRANSIENT, backoff=1.0,
                    max_interval=interval)
    except talos_errors.TalosTransientError as exc:
        raise ProxtalosError('talos node %s: Bootstrap not accepted within %gs: %s' % (node_session.name, deadline.timeout, exc),
                             node=node_session.name)
    return outcome


def wait_quorum(sessions, deadline, interval):
    """Until etcd_problems() is empty for all control planes; returns the members seen."""
    addresses = [address for address, dummy in sessions]
    seen = {'observations': {}}

    def probe():
        observations = {}
        for address, node_session in sessions:
            try:
                observations[address] = observe(node_session)
            except (talos_errors.TalosTransientError, talos_errors.TalosTlsError) as exc:
                observations[address] = {'error': str(exc)}
        seen['observations'] = observations
        problems = health.etcd_problems(observations, addresses)
        if not problems:
            return True, 'etcd members == control planes (%d), all healthy' % len(addresses)
        return False, '; '.join(problems)

    result = session.wait_until(probe, deadline, interval)
    if not result.ok:
        raise WaitTimeout('etcd quorum not reached within %gs: %s' % (deadline.timeout, result.observation), result)
    first = seen['observations'][addresses[0]]
    return [health.member_summary(member) for member in first.get('members') or []]


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
    result = dict(changed=False, outcome='', bootstrap_node='', decision='', details=[], members=[], quorum=False, elapsed=0.0)
    try:
        nodes = [node for node in params['nodes'] if node]
        if not nodes:
            raise ValidationError('nodes', 'must list the control planes (at least one address)')
        if len(set(nodes)) != len(nodes):
            raise ValidationError('nodes', 'lists an address twice')
        credentials = session.load_credentials(params, module)
        sessions = [(node, session.NodeSession.from_params(params, credentials, host=node, field='nodes')) for node in nodes]
        sessions[0][1].require_credentials('is asked about etcd and bootstrapped with os:admin rights')
        deadline, interval = session.deadline_for(params)

        observations = ask_cluster(sessions, deadline, interval)
        result['details'] = [describe(address, observations[address]) for address in nodes]
        state, result['decision'] = decide(observations)
        if state == 'bootstrapped':
            result['outcome'] = 'already_bootstrapped'
        elif module.check_mode:
            result.update(outcome='would_bootstrap', bootstrap_node=sessions[0][1].name, changed=True)
        else:
            outcome = bootstrap(sessions[0][1], deadline, interval)
            result['outcome'] = outcome['action']
            result['bootstrap_node'] = sessions[0][1].name
            result['changed'] = outcome['action'] == 'bootstrapped'
            if outcome['action'] == 'already_exists':
                result['details'].append('%s answered AlreadyExists: %s' % (sessions[0][1].name, outcome.get('message') or ''))
                result['decision'] += '; Bootstrap on %s answered AlreadyExists (its etcd data directory is not empty)' % sessions[0][1].name
        if not module.check_mode and params['wait'] and params['wait_for_quorum']:
            result['members'] = wait_quorum(sessions, deadline, interval)
            result['quorum'] = True
        result['elapsed'] = round(deadline.elapsed(), 3)
    except ProxtalosError as exc:
        module.fail_json(msg=str(exc), **dict(exc.details, outcome=result['outcome'], decision=result['decision'], details=result['details']))
    module.exit_json(**result)


def main():
    run(AnsibleModule(**module_kwargs()))


if __name__ == '__main__':
    main()
