# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure judgements over what Talos nodes report. PRIVATE to the collection.

Everything here takes the plain dicts and lists the Talos client returns (client.py) and
decides; nothing does I/O, so the Talos modules' gates are unit-tested on fixtures.

- dry_run_outcome(mode_details): did an ApplyConfiguration dry run find changes? Talos writes
  "Dry run summary:\\n<what would happen> (skipped in dry-run).\\n\\nConfig diff:\\n\\n<diff>",
  and the diff is exactly "No changes." when the node already runs that config.
- boot_marker(services): a value that changes when the node boots again (the timestamp of the
  first event of machined, which starts first and runs until the node goes down). Used to
  tell "back after the reboot" from "not gone down yet" without comparing clocks.
- service_problems(services, required): which required services are not Running and healthy
  (Talos' own rule: the last event is Running and health.healthy), each with its state and
  last event, for a message that names them.
- etcd_problems(observations, control_planes): why etcd has no full quorum yet - every
  control plane must run a healthy etcd, and each must list the same members, one per
  control plane, none a learner, each peer URL on a control-plane address.
"""

from __future__ import annotations

try:
    from urllib.parse import urlsplit
except ImportError:  # pragma: no cover - Python 2 is not supported by the collection
    from urlparse import urlsplit  # type: ignore

NO_CHANGES = 'No changes.'
CONFIG_DIFF_MARKER = 'Config diff:'

# Talos services per machine type that the post-bootstrap gate requires (trustd and etcd run
# on control planes only).
CONTROL_PLANE_SERVICES = ('etcd', 'apid', 'trustd', 'kubelet', 'containerd')
WORKER_SERVICES = ('apid', 'kubelet', 'containerd')


def dry_run_outcome(mode_details):
    """(unchanged, summary, diff_text) from the mode_details of an ApplyConfiguration dry run.

    summary is the "what would happen" line; diff_text is the config diff as Talos wrote it.
    A reply without a "Config diff:" section (Talos 1.12 in maintenance mode answers "Node is
    running in maintenance mode and does not have a config yet.") counts as changed.
    """
    text = (mode_details or '').replace('\r\n', '\n')
    head, marker, tail = text.partition(CONFIG_DIFF_MARKER)
    lines = [line.strip() for line in head.splitlines() if line.strip()]
    if lines and lines[0].lower().startswith('dry run summary'):
        lines = lines[1:]
    summary = ' '.join(lines)
    if not marker:
        return False, summary, ''
    diff_text = tail.strip('\n')
    return diff_text.strip() == NO_CHANGES, summary, diff_text


def last_event(service):
    """The newest event of a service dict as {'state', 'msg', 'ts'} (None when it has none)."""
    events = service.get('events') or []
    return dict(events[-1]) if events else None


# Talos keeps the last 64 events of a service (siderolabs/talos v1.13.9 internal/app/machined/pkg/system/events/events.go:18
# MaxEventsToKeep): a service with that many has lost its first events, and its oldest kept one moves without a reboot.
MAX_SERVICE_EVENTS = 64


def boot_marker(services):
    """A value unique to the node's current boot (see the module docstring); None if unknown.

    Only services whose event buffer is not full count: their first kept event is the first of this boot.
    """
    by_id = dict((service.get('id'), service) for service in services or [])

    def first_of_boot(service):
        events = (service or {}).get('events') or []
        if events and events[0].get('ts') and len(events) < MAX_SERVICE_EVENTS:
            return events[0]['ts']
        return None
    for service_id in ('machined', 'apid'):
        stamp = first_of_boot(by_id.get(service_id))
        if stamp:
            return '%s@%s' % (service_id, stamp)
    stamps = sorted(stamp for stamp in (first_of_boot(service) for service in services or []) if stamp)
    return 'first-event@%s' % stamps[0] if stamps else None


def is_healthy(service):
    """Talos' rule: the last event's state is Running and health.healthy is true."""
    if 'healthy' in service:
        return bool(service['healthy'])
    event = last_event(service)
    state = event['state'] if event else service.get('state')
    return state == 'Running' and bool((service.get('health') or {}).get('healthy'))


def describe_service(service):
    """{'service', 'state', 'healthy', 'health_message', 'last_event'} of one service dict."""
    event = last_event(service)
    health = service.get('health') or {}
    return {
        'service': service.get('id'),
        'state': service.get('state'),
        'healthy': is_healthy(service),
        'health_message': health.get('last_message') or '',
        'last_event': '%s: %s' % (event.get('state'), event.get('msg')) if event else '',
    }


def service_problems(services, required):
    """The required services that are missing, not Running or not healthy (list of dicts).

    Each item is describe_service() of the service, or {'service': id, 'state': 'missing', ...}
    when the node does not list it at all.
    """
    by_id = dict((service.get('id'), service) for service in services or [])
    problems = []
    for service_id in required:
        service = by_id.get(service_id)
        if service is None:
            problems.append({'service': service_id, 'state': 'missing', 'healthy': False, 'health_message': '',
                             'last_event': 'the node does not run this service'})
        elif not is_healthy(service):
            problems.append(describe_service(service))
    return problems


def describe_service_problem(problem):
    """'kubelet is Waiting (last event: Waiting: Waiting for volume ...)' for a message."""
    text = '%s is %s' % (problem['service'], problem['state'])
    if problem['state'] == 'Running' and not problem['healthy']:
        text += ' but not healthy'
        if problem.get('health_message'):
            text += ' (%s)' % problem['health_message']
    if problem.get('last_event'):
        text += ' (last event: %s)' % problem['last_event']
    return text


def _host_of(url):
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None


def member_summary(member):
    """A member dict as the modules return it: id as hex text (as talosctl prints it)."""
    member_id = member.get('id')
    return {
        'id': '%x' % member_id if isinstance(member_id, int) else str(member_id),
        'hostname': member.get('hostname'),
        'peer_urls': list(member.get('peer_urls') or []),
        'client_urls': list(member.get('client_urls') or []),
        'is_learner': bool(member.get('is_learner')),
    }


def etcd_problems(observations, control_planes):
    """Why etcd is not at full quorum on these control planes (empty list: it is).

    observations: {address: {'etcd_service': service dict or None, 'members': [member dicts] or
    None, 'no_members': why there is no list (optional), 'error': text or None}} for every
    control-plane address in control_planes.
    """
    problems = []
    member_sets = {}
    for address in control_planes:
        seen = observations.get(address) or {}
        if seen.get('error'):
            problems.append('%s: %s' % (address, seen['error']))
            continue
        service = seen.get('etcd_service')
        if service is None:
            problems.append('%s: etcd service not listed' % address)
        elif not is_healthy(service):
            problems.append('%s: %s' % (address, describe_service_problem(describe_service(service))))
        members = seen.get('members')
        if members is None:
            why = (seen.get('no_members') or '').strip()
            problems.append('%s: no etcd member list yet%s' % (address, ' (%s)' % why if why else ''))
            continue
        member_sets[address] = frozenset(member_summary(member)['id'] for member in members)
        if len(members) != len(control_planes):
            problems.append('%s: etcd has %d members, expected %d (one per control plane)'
                            % (address, len(members), len(control_planes)))
        learners = [member.get('hostname') or member_summary(member)['id'] for member in members if member.get('is_learner')]
        if learners:
            problems.append('%s: learners not yet promoted: %s' % (address, ', '.join(sorted(learners))))
        strangers = sorted(set(_host_of(url) for member in members for url in member.get('peer_urls') or [])
                           - set(control_planes))
        if strangers:
            problems.append('%s: etcd members with peer URLs outside the control planes: %s'
                            % (address, ', '.join(str(host) for host in strangers)))
    if len(set(member_sets.values())) > 1:
        problems.append('control planes disagree on the etcd member list: %s'
                        % '; '.join('%s sees %s' % (address, ', '.join(sorted(ids))) for address, ids in sorted(member_sets.items())))
    return problems
