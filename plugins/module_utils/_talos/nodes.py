# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Several Talos nodes in one module run, probed at the same time. PRIVATE to the collection.

A per-host task starts one module process per node; a module that takes every node at once
(`run_once`) does the same checks in one process. The checks of one node stay the single-node
code (session.NodeSession, _wait): each node runs it on a worker of _fanout.run_each, under the
one deadline of the module run, so a slow or silent node does not delay the others' probes.
(The Talos client is synchronous over a private asyncio loop per call, so a thread per node
needs no second, asynchronous copy of the session code.)

- check_targets(items, field): the validated `nodes` option - names unique, addresses given.
- failure_line(name, node_session, error): "lab-w-1 (10.5.0.21:50000): <why>" for a message
  that names every failing node.
- NodesRun: what a module's multi-node form keeps per node - its session, its result, its place on
  the progress line (_fanout.ItemsLine), its span - around _fanout.run_each, and the
  "2 of 6 nodes failed: ..." summary.
"""

from __future__ import annotations

import time

from ansible_collections.proxtalos.cluster.plugins.module_utils import _fanout
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError

MAX_NODES_AT_ONCE = 128     # more nodes than this are probed in turns of this many


def check_targets(items, field='nodes'):
    """The nodes option after AnsibleModule's checks: non-empty, each name given once, an address each."""
    if not items:
        raise ValidationError(field, 'is empty; give at least one node ({name: inventory host, address: node IP})')
    seen = set()
    for index, item in enumerate(items):
        name = item.get('name')
        if not name:
            raise ValidationError('%s[%d].name' % (field, index), 'is required (the inventory host of the node)')
        if not item.get('address'):
            raise ValidationError('%s[%d].address' % (field, index), 'is required (the address of node %s)' % name)
        if name in seen:
            raise ValidationError('%s[%d].name' % (field, index), 'node %s is listed twice' % name)
        seen.add(name)
    return items


class NodesRun(object):
    """One module run over the nodes of `targets` (check_targets' list), under one deadline.

    sessions / results: {name: the node's session (make_session(item)) / its result dict (make_result())}.
    progress: the run's progress line (_fanout.ItemsLine).
    """

    def __init__(self, targets, make_session, make_result, deadline):
        self.targets = targets
        self.deadline = deadline
        self.sessions = dict((item['name'], make_session(item)) for item in targets)
        self.results = dict((item['name'], make_result()) for item in targets)
        self.progress = _fanout.ItemsLine([item['name'] for item in targets], deadline=deadline)

    def run(self, work):
        """work(item, node_session, result, sink) for every node at once; [(item, value, error, span)] in order.

        Each node's result gets its `elapsed` (seconds of the run when its work ended) and span (the run's start,
        the end of its work: the times of its gate in the run report); it leaves the progress line when done.
        A node that could not start before the deadline (more than MAX_NODES_AT_ONCE nodes) ends with
        _fanout.NotStarted.
        """
        def timed(item):
            name = item['name']
            try:
                return work(item, self.sessions[name], self.results[name], self.progress.sink_for(name))
            finally:
                self.results[name]['elapsed'] = round(self.deadline.elapsed(), 3)

        started_at = time.time()
        fanout = _fanout.run_each(self.targets, timed, self.deadline, max_workers=MAX_NODES_AT_ONCE,
                                  name=lambda item: item['name'], progress=self.progress)
        for outcome in fanout:
            # a node not started (its turn came after the deadline) has the run's elapsed seconds too
            self.results[outcome.item['name']].setdefault('elapsed', round(self.deadline.elapsed(), 3))
        return [(outcome.item, outcome.value, outcome.error, (started_at, outcome.ended_at or time.time()))
                for outcome in fanout]

    def failure_summary(self, failed):
        """'2 of 6 nodes failed: <failure_line>; <failure_line>' in the order of the targets; failed: {name: line}."""
        lines = [failed[item['name']] for item in self.targets if item['name'] in failed]
        return '%d of %d nodes failed: %s' % (len(lines), len(self.targets), '; '.join(lines))


def failure_line(name, node_session, error):
    """'<name> (<address:port>): <message>' - the message without its own 'talos node <node>: ' prefix."""
    text = str(error)
    for prefix in ('talos node %s: ' % node_session.display, 'talos node %s: ' % node_session.name):
        if text.startswith(prefix):
            text = text[len(prefix):]
            break
    return '%s (%s): %s' % (name, node_session.name, text)
