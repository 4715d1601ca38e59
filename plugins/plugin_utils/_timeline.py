# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run report's data: what happened in a run, per cluster. PRIVATE to the collection.

The timeline callback feeds a Recorder with plain values (task names, tags, result dicts, clock
readings); the Recorder knows nothing about Ansible's objects, so it is tested on its own. It
recognises gates, remediation steps and the Flux graph in task results by the conventions of
docs/report.md, and builds the report.json document (schema: docs/report.schema.json).

Nothing here decides what is secret. The callback hands every result through a Masker before it
reaches the Recorder, and the Recorder keeps only the listed keys of a result, never task
arguments.
"""

from __future__ import annotations

import datetime
import re

SCHEMA_VERSION = 1
GENERATOR = 'proxtalos.cluster.timeline'

# The stages of playbooks/site.yml, in run order (ARCHITECTURE.md). A task's stage is the innermost
# of its tags (its own, its blocks', its role's, its play's) that is one of these.
DEFAULT_STAGES = ('preflight', 'vms', 'secrets', 'apply', 'bootstrap', 'kubeconfig', 'flux_install', 'sealed_secrets', 'cni',
                  'remediate', 'flux', 'apps', 'gitops', 'report')

GATE_NAME_PREFIXES = ('Gate - ', 'Gate: ', 'Gates - ')
REMEDIATION_NAME_PREFIXES = ('Remediate - ', 'Remediate: ')
NO_LOG_TEXT = '(hidden: no_log task)'
MASK = '$REDACTED$'
MAX_TEXT = 2000
MAX_LIST = 50

# Host variables the report reads (never any other): cluster values and the VM/node description.
CLUSTER_VARS = ('cluster_name', 'cluster_id', 'cluster_endpoint', 'cluster_pod_cidr', 'cluster_service_cidr',
                'talos_version', 'kubernetes_version', 'cilium_version', 'flux_version')
NODE_VARS = ('node_ip', 'vm_id', 'vm_pve_node', 'node_hostname')

STATUS_ORDER = ('failed', 'unreachable', 'ignored', 'changed', 'ok', 'skipped')
FAILED_STATUSES = ('failed', 'unreachable', 'ignored')


def utc_iso(timestamp):
    """Seconds since the epoch as an ISO 8601 UTC text with a Z."""
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.timezone.utc)
    return moment.strftime('%Y-%m-%dT%H:%M:%S.') + '%03dZ' % (moment.microsecond // 1000)


def offset_text(seconds):
    """+M:SS (or +H:MM:SS) for a start offset in the bootstrap timeline table."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return '+%d:%02d:%02d' % (hours, minutes, secs)
    return '+%d:%02d' % (minutes, secs)


def clip(text, limit=MAX_TEXT):
    """A one-value text, cut to limit characters."""
    if text is None:
        return None
    text = str(text)
    return text if len(text) <= limit else text[:limit - 1] + '\u2026'


class Masker(object):
    """Replaces known secret values in what the report writes.

    `extra` is a callable (ansible-core 2.22's mask_secrets) applied to every text first, when the
    core has one. `register()` adds values this run knows to be secret (vault-encrypted variables,
    variables named like secrets); texts shorter than `min_length` are not registered, as a
    two-letter value would blank out every word that contains it.
    """

    def __init__(self, extra=None, min_length=4):
        self.extra = extra
        self.min_length = min_length
        self.values = set()
        self._pattern = None

    def register(self, value):
        if value is None or isinstance(value, bool):
            return
        if isinstance(value, bytes):
            value = value.decode('utf-8', 'replace')
        if isinstance(value, (list, tuple, set)):
            for item in value:
                self.register(item)
            return
        if isinstance(value, dict):
            for item in value.values():
                self.register(item)
            return
        text = str(value)
        candidates = [text] + [line.strip() for line in text.splitlines()]
        for candidate in candidates:
            if len(candidate) >= self.min_length and candidate not in self.values:
                self.values.add(candidate)
                self._pattern = None

    def text(self, value):
        if self.extra is not None:
            value = self.extra(value)
        if not self.values:
            return value
        if self._pattern is None:
            ordered = sorted(self.values, key=len, reverse=True)
            self._pattern = re.compile('|'.join(re.escape(item) for item in ordered))
        return self._pattern.sub(MASK, value)

    def tree(self, value):
        """A copy of value (dicts, lists, scalars) with every string masked, keys included."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return dict((self.tree(str(key)), self.tree(item)) for key, item in value.items())
        if isinstance(value, (list, tuple)):
            return [self.tree(item) for item in value]
        if value is None or isinstance(value, (bool, int, float)):
            return value
        return self.text(str(value))


def stage_of(task_tags, stages=DEFAULT_STAGES):
    """The innermost tag (Ansible lists a task's own tags first) that names a stage, or None."""
    for tag in task_tags or ():
        if tag in stages:
            return tag
    return None


def sub_stage_tags(task_tags, stages=DEFAULT_STAGES):
    """The task's tags that name a sub-stage, innermost first: each is no stage itself and is `<stage>_<rest>`, for a
    stage tag among the task's tags (a play of site.yml tagged [bootstrap, bootstrap_gates] gives bootstrap_gates)."""
    tags = [str(tag) for tag in task_tags or ()]
    present = [tag for tag in tags if tag in stages]
    found = []
    for tag in tags:
        if tag in stages or tag in found:
            continue
        if any(tag.startswith(stage + '_') and len(tag) > len(stage) + 1 for stage in present):
            found.append(tag)
    return found


def sub_stage_of(task_tags, stages=DEFAULT_STAGES):
    """The innermost of the task's sub-stage tags (sub_stage_tags), or None."""
    found = sub_stage_tags(task_tags, stages)
    return found[0] if found else None


ROLE_PREFIX = re.compile(r'^[A-Za-z0-9_.]+ : ')


def _strip_prefix(name, prefixes):
    """The name after a convention prefix (a role's "namespace.collection.role : " ahead of it is ignored), or None."""
    name = ROLE_PREFIX.sub('', name, count=1)
    for prefix in prefixes:
        if name.startswith(prefix):
            return name[len(prefix):].strip()
    return None


def _number(value):
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _lines(value):
    if value is None:
        return []
    if isinstance(value, str):
        return [clip(line) for line in value.splitlines() if line.strip()][:MAX_LIST]
    if isinstance(value, (list, tuple)):
        return [clip(item) for item in value][:MAX_LIST]
    return [clip(value)]


def result_message(result):
    """The one text that says what a result saw or why it failed."""
    for key in ('summary', 'observation', 'msg', 'message', 'stderr'):
        value = result.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
        if isinstance(value, list) and value:
            return '; '.join(str(item) for item in value)
    return None


def gate_from_result(task_name, result, status):
    """A gate record (name, ok, observation, elapsed, attempts, ...) or None when this is no gate.

    Conventions, in order (docs/report.md):
    1. result key `gate` is a dict with at least `name` and `ok`;
    2. result key `gate` is a text (the kind, as k8s_gate returns it) and `passed` a bool; named by the task's
       "Gate - " name if it has one, else by the result's `target`;
    3. the task name starts with "Gate - " (or "Gate: "): ok unless the task failed.
    """
    if status == 'skipped':
        return None
    explicit = result.get('gate')
    failed = status in FAILED_STATUSES
    if isinstance(explicit, dict) and explicit.get('name') and isinstance(explicit.get('ok'), bool):
        return {
            'name': clip(explicit['name'], 200),
            'ok': bool(explicit['ok']) and not failed,
            'observation': clip(explicit.get('observation') or result_message(result)),
            'elapsed': _number(explicit.get('elapsed', result.get('elapsed'))),
            'attempts': _number(explicit.get('attempts', result.get('attempts'))),
            'target': clip(explicit.get('target'), 300),
            'diagnosis': _lines(explicit.get('diagnosis', result.get('diagnosis'))),
        }
    named = _strip_prefix(task_name or '', GATE_NAME_PREFIXES)
    if isinstance(explicit, str) and isinstance(result.get('passed'), bool):
        target = result.get('target')
        return {
            'name': clip(named or target or explicit, 200),
            'ok': bool(result['passed']) and not failed,
            'observation': clip(result_message(result)),
            'elapsed': _number(result.get('elapsed')),
            'attempts': _number(result.get('attempts')),
            'target': clip(target, 300),
            'diagnosis': _lines(result.get('diagnosis')),
        }
    if named:
        return {
            'name': clip(named, 200),
            'ok': not failed,
            'observation': clip(result_message(result) or ('passed' if not failed else 'failed')),
            'elapsed': _number(result.get('elapsed')),
            'attempts': _number(result.get('attempts')),
            'target': None,
            'diagnosis': _lines(result.get('diagnosis')),
        }
    return None


def gates_from_result(task_name, result, status, host):
    """Gate records of one task result: a list of (host, record), empty when the task is no gate.

    Convention 0 (docs/report.md), for a module that checks several nodes or several conditions in one run:
    result key `gates` is a list of gate dicts (`name`, `ok`, optional `host` - the inventory host the gate is
    about, default the task's host -, `observation`, `elapsed`, `attempts`, `target`, `diagnosis`, and
    `started_at`/`ended_at`, the wall clock (seconds since the epoch) when the module began and finished
    checking it: the record's start and end, kept inside the task's); each becomes one record. A failed task
    whose listed gates all passed (it failed before or after them) marks them failed with the task's message;
    an item without a bool `ok` is a failed gate. Without a `gates` list, or with an empty one, the single-gate
    conventions apply (a "Gate - " or "Gates - " task that failed before any gate ran is a failed gate).
    """
    if status == 'skipped':
        return []
    listed = result.get('gates')
    single = None if isinstance(listed, list) and listed else gate_from_result(task_name, result, status)
    if not isinstance(listed, list) or (not listed and single is not None):
        # no list, or an empty one from a task that failed before any gate ran (a kubeconfig that does not
        # load): the single-gate conventions, so a failed "Gate - " task is still a failed gate
        return [] if single is None else [(host, single)]
    records = []
    fallback_name = _strip_prefix(task_name or '', GATE_NAME_PREFIXES) or task_name or 'gate'
    for item in listed[:1000]:
        if not isinstance(item, dict):
            continue
        # an item without a bool `ok` is a gate whose outcome the module did not say: failed, never dropped
        ok = item.get('ok') if isinstance(item.get('ok'), bool) else False
        records.append((str(item.get('host') or host), {
            'name': clip(item.get('name') or fallback_name, 200),
            'ok': ok,
            'observation': clip(item.get('observation') or ('passed' if ok else 'failed')),
            'elapsed': _number(item.get('elapsed')),
            'attempts': _number(item.get('attempts')),
            'target': clip(item.get('target'), 300),
            'diagnosis': _lines(item.get('diagnosis')),
            'started_at': _number(item.get('started_at')),
            'ended_at': _number(item.get('ended_at')),
        }))
    if status in FAILED_STATUSES and all(record['ok'] for _gate_host, record in records):
        message = clip(result_message(result) or 'failed')
        for _gate_host, record in records:
            record.update(ok=False, observation=message)
    return records


def remediations_from_result(task_name, result, status, host):
    """Remediation records, or [] when this task is no remediation step.

    Conventions (docs/report.md): result key `remediation`, a dict or a list of dicts, each with
    at least `action`; or a task name starting with "Remediate - " (or "Remediate: "). A skipped
    step did nothing and is not logged.
    """
    if status == 'skipped':
        return []
    declared = result.get('remediation')
    if isinstance(declared, dict):
        declared = [declared]
    failed = status in FAILED_STATUSES
    records = []
    if isinstance(declared, list):
        for step in declared:
            if not isinstance(step, dict) or not step.get('action'):
                continue
            records.append({
                'action': clip(step['action'], 200),
                'target': clip(step.get('target') or step.get('node') or host, 200),
                'reason': clip(step.get('reason')),
                'attempt': _number(step.get('attempt')),
                'outcome': clip(step.get('outcome') or ('failed' if failed else status), 500),
            })
        if records:
            return records
    named = _strip_prefix(task_name or '', REMEDIATION_NAME_PREFIXES)
    if named:
        records.append({
            'action': clip(named, 200),
            'target': host,
            'reason': clip(result.get('reason')),
            'attempt': _number(result.get('attempt')),
            'outcome': clip(result_message(result) if failed else status, 500) or status,
        })
    return records


def flux_graph_from_result(action, result):
    """The graph parts of a flux_graph result (nodes, edges, tiers, findings), or None."""
    if not (str(action or '').endswith('flux_graph') or ('tiers' in result and 'mermaid' in result)):
        return None
    nodes = result.get('nodes')
    if not isinstance(nodes, list):
        return None
    kept = []
    edges = []
    for node in nodes[:500]:
        if not isinstance(node, dict) or not node.get('id'):
            continue
        depends = [str(dep) for dep in node.get('depends_on') or [] if dep]
        kept.append({'id': clip(node['id'], 300), 'kind': clip(node.get('kind'), 50), 'tier': _number(node.get('tier')),
                     'file': clip(node.get('file'), 300), 'depends_on': depends})
        edges.extend([[dep, node['id']] for dep in depends])
    return {
        'nodes': kept,
        'edges': edges,
        'tiers': [[str(item) for item in tier] for tier in result.get('tiers') or []],
        'untiered': [str(item) for item in result.get('untiered') or []],
        'findings': [clip(item.get('message') if isinstance(item, dict) else item)
                     for key in ('cycles', 'dangling', 'missing_critical', 'bootstrap_contradictions')
                     for item in result.get(key) or []][:MAX_LIST],
    }


def _worst(statuses):
    for status in STATUS_ORDER:
        if status in statuses:
            return status
    return 'skipped'


class TaskEvent(object):
    """One task on one host: when it ran and how it ended."""

    __slots__ = ('cluster', 'host', 'task', 'stage', 'part', 'play', 'start', 'end', 'status', 'message')

    def __init__(self, cluster, host, task, stage, part, play, start, end, status, message):
        self.cluster = cluster
        self.host = host
        self.task = task
        self.stage = stage
        self.part = part
        self.play = play
        self.start = start
        self.end = end
        self.status = status
        self.message = message


class Recorder(object):
    """Collects a run and builds one report per cluster.

    Times are seconds since the epoch (wall clock, for the report's timestamps); offsets in the
    report are relative to the run's start.
    """

    def __init__(self, started, stages=DEFAULT_STAGES):
        self.started = started
        self.finished = None
        self.stages = tuple(stages)
        self.playbook = None
        self.check_mode = False
        self.host_cluster = {}
        self.events = []
        self.gates = []
        self.remediations = []
        self.flux_graphs = {}
        self.cluster_values = {}
        self.nodes = {}
        self.observed = {}
        self.stats = {}
        self.stage_order = []

    # -- what the callback tells ----------------------------------------------------------------

    def set_cluster(self, host, cluster):
        if cluster:
            self.host_cluster[host] = str(cluster)

    def set_cluster_values(self, cluster, values):
        known = self.cluster_values.setdefault(cluster, {})
        for key, value in values.items():
            if value is not None:
                known.setdefault(key, value)

    def set_node(self, cluster, host, values):
        self.nodes.setdefault(cluster, {}).setdefault(host, {'name': host}).update(
            dict((key, value) for key, value in values.items() if value is not None))

    def cluster_of(self, host):
        if host in self.host_cluster:
            return self.host_cluster[host]
        known = sorted(set(self.host_cluster.values()))
        if len(known) == 1:
            return known[0]
        return None

    def note_stage(self, stage):
        if stage and stage not in self.stage_order:
            self.stage_order.append(stage)

    def task_result(self, host, task_name, task_tags, play_name, action, start, end, status, result, no_log=False):
        """One finished task on one host; status is ok, changed, failed, ignored (failed, ignore_errors), unreachable or skipped."""
        cluster = self.cluster_of(host)
        if cluster is None:   # a host of no cluster (no cluster_name) in a run over several: not reported
            return
        if str(action or '').endswith('validate_argument_spec') and status not in FAILED_STATUSES:
            return   # a role's argument check runs with every tag selection: it is no sign that the stage ran
        stage = stage_of(task_tags, self.stages)
        self.note_stage(stage)
        if no_log:
            result = {}
        message = None if status in ('ok', 'changed', 'skipped') else clip(
            NO_LOG_TEXT if no_log else result_message(result))
        part = sub_stage_of(task_tags, self.stages) if stage is not None else None
        self.events.append(TaskEvent(cluster, host, clip(task_name, 300), stage, part, clip(play_name, 300),
                                     start, end, status, message))
        gates = gates_from_result(task_name, result, status, host)
        for gate_host, gate in gates:
            if no_log:
                gate['observation'] = NO_LOG_TEXT
                gate['diagnosis'] = []
            started_at, ended_at = gate.pop('started_at', None), gate.pop('ended_at', None)
            gate_start = min(max(started_at, start), end) if started_at is not None else start
            gate_end = min(max(ended_at, gate_start), end) if ended_at is not None else end
            gate.update(cluster=cluster, stage=stage, host=gate_host, task=clip(task_name, 300),
                        start=gate_start, end=gate_end)
            self.gates.append(gate)
        for step in remediations_from_result(task_name, result, status, host):
            if no_log:
                step['reason'] = None
                step['outcome'] = NO_LOG_TEXT if status == 'failed' else status
            step.update(cluster=cluster, stage=stage, host=host, task=clip(task_name, 300), start=start, end=end)
            self.remediations.append(step)
        if not no_log:
            graph = flux_graph_from_result(action, result)
            if graph is not None:
                self.flux_graphs[cluster] = graph
            facts = result.get('report_facts')
            if isinstance(facts, dict):
                self._observe(cluster, host, facts)
            by_host = result.get('report_facts_by_host')
            if isinstance(by_host, dict):
                for fact_host, host_facts in by_host.items():
                    if isinstance(host_facts, dict):
                        self._observe(cluster, str(fact_host), host_facts)
            if gates and result.get('gate') == 'nodes' and isinstance(result.get('details'), list):
                self._nodes_from_gate(cluster, result['details'])

    def _observe(self, cluster, host, facts):
        """Plain values a module reported of a host (`report_facts`), clipped."""
        self.observed.setdefault(cluster, {}).setdefault(host, {}).update(
            dict((clip(key, 100), clip(value, 500) if isinstance(value, str) else value)
                 for key, value in facts.items() if isinstance(value, (str, int, float, bool))))

    def _nodes_from_gate(self, cluster, details):
        for item in details:
            if not isinstance(item, dict) or not item.get('name'):
                continue
            observed = self.observed.setdefault(cluster, {}).setdefault(str(item['name']), {})
            # a registered-only gate passes NotReady nodes: its item's `ready` is the node's Ready condition
            ready = item['ready'] if isinstance(item.get('ready'), bool) else bool(item.get('ok'))
            observed['kubernetes_ready'] = ready
            if item.get('reason') and not ready:
                observed['kubernetes_reason'] = clip(item['reason'], 300)
            else:
                observed.pop('kubernetes_reason', None)
            for key in ('kubelet_version', 'os_image', 'kernel_version', 'container_runtime'):
                if item.get(key):
                    observed[key] = clip(item[key], 200)

    def _observed_by_host(self, cluster):
        """Observations per inventory host: a Kubernetes node name that is a host's node_hostname goes to that host."""
        known = self.nodes.get(cluster, {})
        by_hostname = dict((values['node_hostname'], host) for host, values in known.items() if values.get('node_hostname'))
        merged = {}
        for name, values in self.observed.get(cluster, {}).items():
            host = name if name in known else by_hostname.get(name, name)
            merged.setdefault(host, {}).update(values)
        return merged

    def host_stats(self, host, counts):
        self.stats[host] = dict((key, int(value)) for key, value in counts.items())

    # -- the report -----------------------------------------------------------------------------

    def clusters(self):
        names = set(event.cluster for event in self.events) | set(self.cluster_values) | set(self.host_cluster.values())
        return sorted(names)

    def _offset(self, moment):
        return round(max(0.0, moment - self.started), 3)

    def _span(self, events):
        """(status, start, end) of a stage's or a part's events, the clock readings still absolute.

        The span is that of the tasks that ran: a play whose tasks were all skipped (site.yml's flux play on the side
        Flux was not handed the repository) does not stretch it. Only events none of which ran span their skipped
        tasks. The status is failed when a task failed or was unreachable on some host, skipped when none ran."""
        statuses = set(event.status for event in events)
        ran = [event for event in events if event.status != 'skipped']
        start = min(event.start for event in ran or events)
        end = max(event.end for event in ran or events)
        status = 'failed' if statuses & {'failed', 'unreachable'} else ('skipped' if not ran else 'ok')
        return status, start, end

    def _parts(self, events):
        """A stage's sub-stages (the plays of site.yml it ran in), in the order they started.

        A part whose tasks were all skipped does not count, as for the stage's span; when no part ran anything (the
        stage was skipped) each is listed, skipped. Tasks with no sub-stage tag belong to no part."""
        names = []
        for event in events:
            if event.part is not None and event.part not in names:
                names.append(event.part)
        spans = []
        for name in names:
            status, start, end = self._span([event for event in events if event.part == name])
            spans.append((name, status, start, end))
        if any(status != 'skipped' for _name, status, _start, _end in spans):
            spans = [span for span in spans if span[1] != 'skipped']
        spans.sort(key=lambda span: span[2])
        return [{'name': name, 'status': status, 'start': self._offset(start), 'end': self._offset(end),
                 'duration': round(end - start, 3)} for name, status, start, end in spans]

    def _stages(self, events):
        rows = []
        order = [stage for stage in self.stages if stage in self.stage_order] + \
            [stage for stage in self.stage_order if stage not in self.stages]
        for stage in order:
            mine = [event for event in events if event.stage == stage]
            if not mine:
                continue
            # The flux stage has a play before the cni stage's gates and one after the apps stage, and one of them
            # skips all its tasks: it does not count (_span).
            status, start, end = self._span(mine)
            rows.append({
                'name': stage,
                'status': status,
                'start': self._offset(start),
                'end': self._offset(end),
                'duration': round(end - start, 3),
                'tasks': len(set(event.task for event in mine)),
                'results': dict((result, sum(1 for event in mine if event.status == result)) for result in STATUS_ORDER),
                'hosts': sorted(set(event.host for event in mine)),
                'parts': self._parts(mine),
            })
        # In the order they started (the flux stage comes before or after apps, by flux_handoff); a stage's place in
        # the configured list breaks ties.
        return sorted(rows, key=lambda row: row['start'])

    def build(self, cluster):
        """The report.json document for one cluster."""
        events = [event for event in self.events if event.cluster == cluster]
        finished = self.finished if self.finished is not None else max([e.end for e in events] or [self.started])
        stages = self._stages(events)
        gates = [dict((key, value) for key, value in gate.items() if key != 'cluster')
                 for gate in self.gates if gate['cluster'] == cluster]
        for gate in gates:
            gate['start'] = self._offset(gate['start'])
            gate['end'] = self._offset(gate['end'])
        remediations = [dict((key, value) for key, value in step.items() if key != 'cluster')
                        for step in self.remediations if step['cluster'] == cluster]
        for step in remediations:
            step['start'] = self._offset(step['start'])
            step['end'] = self._offset(step['end'])
        failures = [{'stage': e.stage, 'host': e.host, 'task': e.task, 'status': e.status,
                     'message': e.message, 'start': self._offset(e.start)}
                    for e in events if e.status in ('failed', 'unreachable')]
        hosts = sorted(set(event.host for event in events) | set(self.nodes.get(cluster, {})))
        stats = dict((host, self.stats[host]) for host in hosts if host in self.stats)
        failed = bool(failures) or any(counts.get('failures') or counts.get('unreachable') for counts in stats.values())
        nodes = []
        observed = self._observed_by_host(cluster)
        for host in sorted(set(self.nodes.get(cluster, {})) | set(observed)):
            node = dict(self.nodes.get(cluster, {}).get(host, {'name': host}))
            node.setdefault('name', host)
            node['observed'] = observed.get(host, {})
            nodes.append(node)
        return {
            'schema_version': SCHEMA_VERSION,
            'generator': GENERATOR,
            'cluster': cluster,
            'playbook': self.playbook,
            'check_mode': bool(self.check_mode),
            'started': utc_iso(self.started),
            'finished': utc_iso(finished),
            'duration': round(max(0.0, finished - self.started), 3),
            'status': 'failed' if failed else 'ok',
            'stages': stages,
            'bootstrap_timeline': [{'stage': row['name'], 'start_offset': offset_text(row['start']),
                                    'status': row['status']} for row in stages],
            'gates': gates,
            'remediations': remediations,
            'failures': failures,
            'flux_graph': self.flux_graphs.get(cluster),
            'facts': {'cluster': dict(self.cluster_values.get(cluster, {})), 'nodes': nodes},
            'hosts': stats,
        }


PART_MARK = '\u21b3 '   # "↳ ": a stage's part, under the stage, in timeline.md and report.html


def shown_parts(stage):
    """The parts of a stage row the summary, timeline.md and report.html show under it: none unless it has two or more."""
    parts = stage.get('parts') or []
    return parts if len(parts) > 1 else []


def timeline_markdown(report):
    """The bootstrap timeline as a Markdown table: stage, start offset, status; a stage's parts under it when it has several."""
    lines = ['# Bootstrap timeline: %s' % report['cluster'], '',
             'Run started %s, %s after %.1f s.' % (report['started'], report['status'], report['duration']), '',
             '| stage | start offset | status |', '|---|---|---|']
    stages = dict((stage['name'], stage) for stage in report.get('stages') or [])
    for row in report['bootstrap_timeline']:
        lines.append('| %s | %s | %s |' % (row['stage'], row['start_offset'], row['status']))
        for part in shown_parts(stages.get(row['stage']) or {}):
            lines.append('| %s%s | %s | %s |' % (PART_MARK, part['name'], offset_text(part['start']), part['status']))
    return '\n'.join(lines) + '\n'


def _node_summary(nodes):
    """Summary lines of what the run observed of the nodes: Ready count, versions, and each node with a problem."""
    observed = [(node['name'], node.get('observed') or {}) for node in nodes]
    seen = [(name, facts) for name, facts in observed if facts]
    if not seen:
        return []
    parts = []
    readiness = [facts['kubernetes_ready'] for _name, facts in seen if isinstance(facts.get('kubernetes_ready'), bool)]
    if readiness:
        parts.append('%d/%d Ready' % (sum(1 for ready in readiness if ready), len(readiness)))
    for key, label in (('talos_version', 'Talos'), ('kubelet_version', 'kubelet')):
        versions = sorted(set(str(facts[key]) for _name, facts in seen if facts.get(key)))
        if versions:
            parts.append('%s %s' % (label, ', '.join(versions)))
    lines = ['  nodes: %s' % '; '.join(parts)] if parts else []
    for name, facts in seen:
        problems = []
        if facts.get('kubernetes_ready') is False:
            problems.append('NotReady (%s)' % facts.get('kubernetes_reason', 'no reason given'))
        if facts.get('talos_services_unhealthy'):
            problems.append('Talos services not healthy: %s' % facts['talos_services_unhealthy'])
        if problems:
            lines.append('    %s: %s' % (name, '; '.join(problems)))
    return lines


def terminal_summary(report, paths):
    """Lines for the end of the run: the timeline, failed gates, remediation, where the files are."""
    lines = ['proxtalos run report: cluster %s, %s in %.1f s' % (report['cluster'], report['status'].upper(),
                                                                 report['duration'])]
    if report['stages']:
        # the name column fits the longest part name, indented two more (16 wide when no stage shows parts)
        width = max([16] + [len(part['name']) + 3 for stage in report['stages'] for part in shown_parts(stage)])
        lines.append('  %-*s %-12s %-10s %s' % (width, 'stage', 'start', 'duration', 'status'))
        for row in report['stages']:
            lines.append('  %-*s %-12s %-10s %s' % (width, row['name'], offset_text(row['start']),
                                                    '%.1fs' % row['duration'], row['status']))
            for part in shown_parts(row):
                lines.append('    %-*s %-12s %-10s %s' % (width - 2, part['name'], offset_text(part['start']),
                                                          '%.1fs' % part['duration'], part['status']))
    gates = report['gates']
    if gates:
        passed = sum(1 for gate in gates if gate['ok'])
        lines.append('  gates: %d passed, %d failed' % (passed, len(gates) - passed))
        for gate in gates:
            if not gate['ok']:
                lines.append('    FAILED %s on %s: %s' % (gate['name'], gate['host'], gate['observation']))
    lines.extend(_node_summary(report['facts']['nodes']))
    if report['remediations']:
        lines.append('  remediation steps: %d' % len(report['remediations']))
        for step in report['remediations']:
            lines.append('    %s %s: %s' % (step['action'], step['target'], step['outcome']))
    for failure in report['failures'][:10]:
        lines.append('  failed: [%s] %s: %s' % (failure['host'], failure['task'], failure['message']))
    for path in paths:
        lines.append('  report: %s' % path)
    return lines
