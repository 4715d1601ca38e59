# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Several gates in one k8s_gate run (its `gates` option): each step checked, then run in order. PRIVATE.

A step is one item of the `gates` list: a `title` (its name in messages and in the run report), the
same gate options as the single form, and an optional `wait_timeout` (else the module's). Every item
is validated before anything runs, with the single form's rules; an error names the item by index and
title and the field. run_steps() runs the steps one after the other on one API client, each with its
own deadline, and stops at the first step that does not pass: the steps after it are not run.
"""

from __future__ import annotations

import copy
import time

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.errors import UnsupportedError

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import gates

NODE_INFO_KEYS = ('kubelet_version', 'os_image', 'kernel_version', 'container_runtime')


def step_spec():
    """The argument spec of one item of `gates`: title, gate, wait_timeout and the gate options."""
    spec = copy.deepcopy(gates.GATE_OPTION_SPEC)
    spec.update(
        title=dict(type='str', required=True),
        gate=dict(type='str', required=True, choices=list(gates.GATE_KINDS)),
        wait_timeout=dict(type='float'),
    )
    return spec


class Step(object):
    """One validated item of `gates`: its position, title, Gate and deadline (seconds)."""

    def __init__(self, index, title, gate, timeout):
        self.index = index
        self.title = title
        self.gate = gate
        self.timeout = timeout


def _validation_text(error):
    if isinstance(error, UnsupportedError):
        return 'unsupported option %s' % error.msg
    return error.msg


def build_steps(items, timeout, probe_once=False):
    """Steps from the `gates` list; raises ValidationError naming the item (index and title) and the field.

    timeout is the module's wait_timeout, for items without their own; probe_once (check mode,
    wait=false) makes every step probe once, whatever its wait_timeout.
    """
    if not isinstance(items, list) or not items:
        raise _errors.ValidationError('gates', 'give at least one gate (a list of dicts with title and gate)')
    validator = ArgumentSpecValidator(step_spec(), required_if=gates.GATE_REQUIRED_IF)
    steps = []
    titles = {}
    for index, item in enumerate(items):
        where = 'gates[%d]' % index
        if not isinstance(item, dict):
            raise _errors.ValidationError(where, 'must be a dict with title and gate, got %s' % type(item).__name__)
        title = item.get('title')
        if isinstance(title, str) and title.strip():
            where = '%s (%s)' % (where, title.strip())
        checked = validator.validate(item)
        if checked.errors.errors:
            raise _errors.ValidationError(where, '; '.join(_validation_text(error) for error in checked.errors.errors))
        params = checked.validated_parameters
        title = params['title'].strip()
        if not title:
            raise _errors.ValidationError('%s.title' % where, 'must not be empty: it names the gate in messages and in the run report')
        if title in titles:
            raise _errors.ValidationError('%s.title' % where, 'the same title as gates[%d]: each gate needs its own name' % titles[title])
        titles[title] = index
        try:
            gate = gates.build_gate(params)
        except _errors.ValidationError as exc:
            raise _errors.ValidationError('%s.%s' % (where, exc.field), exc.reason)
        own_timeout = params.get('wait_timeout')
        step_timeout = timeout if own_timeout is None else own_timeout
        if probe_once or step_timeout < 0:
            step_timeout = 0.0
        steps.append(Step(index, title, gate, step_timeout))
    return steps


def gate_result(gate, gate_run, timeline):
    """The result of one gate: the single form's keys (without changed and api_requests)."""
    verdict = gate_run.verdict if gate_run is not None else None
    return {
        'gate': gate.kind,
        'target': gate.target(),
        'passed': bool(gate_run is not None and gate_run.passed),
        'summary': gate_run.headline() if gate_run is not None else '',
        'details': verdict.items if verdict is not None else [],
        'problems': verdict.problems if verdict is not None else [],
        'notes': verdict.notes if verdict is not None else [],
        'replicas': verdict.replicas if verdict is not None else None,
        'elapsed': round(gate_run.result.elapsed, 3) if gate_run is not None else 0.0,
        'attempts': gate_run.result.attempts if gate_run is not None else 0,
        'progress': timeline.timeline if timeline is not None else [],
    }


class StepOutcome(object):
    """What one step did: its result dict (`results` item), and the failure text when it did not pass."""

    def __init__(self, step, result, failure=None, started_at=None, ended_at=None):
        self.step = step
        self.result = result
        self.failure = failure
        # wall clock (seconds since the epoch) when the gate began and finished: the run report places each
        # gate of the task at its own time (docs/report.md, convention 0)
        self.started_at = started_at
        self.ended_at = ended_at

    @property
    def passed(self):
        return self.failure is None and self.result['passed']

    def report_gate(self):
        """The run report's gate record of this step (docs/report.md, convention 0)."""
        return {
            'name': self.step.title,
            'ok': self.passed,
            'observation': self.result['summary'],
            'elapsed': self.result['elapsed'],
            'attempts': self.result['attempts'],
            'target': self.result['target'],
            'diagnosis': self.result.get('diagnosis', []),
            'started_at': self.started_at,
            'ended_at': self.ended_at,
        }


def _run_step(step, client, interval, progress_file, wall_clock):
    started_at = wall_clock()
    requests_before = client.requests
    # the progress file's lines are named by the step (its title before each summary)
    timeline = _wait.Progress(progress_file, label='k8s_gate %s (%s)' % (step.title, step.gate.target()), step=step.title,
                              announce=True)
    gate_run = None
    failure = None
    try:
        gate_run = gates.run(step.gate, client, step.timeout, interval, progress=timeline)
        timeline.finish(gate_run.result.observation, gate_run.result.elapsed, gate_run.result.attempts, gate_run.passed)
    except _errors.ProxtalosError as exc:
        # not "not yet" (that is a TransientApiError, waited on): an answer that will not change by waiting;
        # it came from the probe after the last one reported
        failure = str(exc)
        timeline.finish(failure, timeline.elapsed, timeline.attempts + 1, False)
    result = gate_result(step.gate, gate_run, timeline)
    result['title'] = step.title
    if failure is not None:
        result.update(summary=failure, diagnosis=[], elapsed=round(timeline.elapsed, 3), attempts=timeline.attempts)
    elif gate_run is not None and not gate_run.passed:
        failure = gates.explain(gate_run, client)
        result['diagnosis'] = failure.splitlines()[1:]
    result['api_requests'] = client.requests - requests_before
    return StepOutcome(step, result, failure, round(started_at, 3), round(wall_clock(), 3))


def run_steps(steps, client, interval, progress_file=None, wall_clock=time.time):
    """Run the steps in order on one client; stop after the first that does not pass. Returns the outcomes."""
    outcomes = []
    for step in steps:
        outcome = _run_step(step, client, interval, progress_file, wall_clock)
        outcomes.append(outcome)
        if not outcome.passed:
            break
    return outcomes


def failure_message(steps, outcomes):
    """The module's msg when a step failed: the step named first, what it saw, and the steps not run."""
    failed = outcomes[-1]
    lines = ['gate %r (step %d of %d) failed: %s' % (failed.step.title, failed.step.index + 1, len(steps), failed.failure)]
    passed = [outcome.step.title for outcome in outcomes[:-1]]
    if passed:
        lines.append('passed before it: %s' % ', '.join(passed))
    not_run = not_run_titles(steps, outcomes)
    if not_run:
        lines.append('not run: %s' % ', '.join(not_run))
    return '\n'.join(lines)


def not_run_titles(steps, outcomes):
    return [step.title for step in steps[len(outcomes):]]


def node_facts(outcomes):
    """What the `nodes` steps observed of each Node ({node name: facts}, the last step's word), for the report."""
    facts = {}
    for outcome in outcomes:
        if outcome.result['gate'] != 'nodes':
            continue
        for item in outcome.result['details']:
            if not isinstance(item, dict) or not item.get('name'):
                continue
            ready = item['ready'] if isinstance(item.get('ready'), bool) else bool(item.get('ok'))
            node = facts.setdefault(str(item['name']), {})
            node['kubernetes_ready'] = ready
            if ready or not item.get('reason'):
                node.pop('kubernetes_reason', None)
            else:
                node['kubernetes_reason'] = str(item['reason'])
            node.update((key, item[key]) for key in NODE_INFO_KEYS if item.get(key))
    return facts
