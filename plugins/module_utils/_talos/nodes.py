# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Several Talos nodes in one module run, probed at the same time. PRIVATE to the collection.

A per-host task starts one module process per node; a module that takes every node at once
(`run_once`) does the same checks in one process. The checks of one node stay the single-node
code (session.NodeSession, _wait): each node runs it on a thread of its own, under the one
deadline of the module run, so a slow or silent node does not delay the others' probes.
(The Talos client is synchronous over a private asyncio loop per call, so a thread per node
needs no second, asynchronous copy of the session code.)

- check_targets(items, field): the validated `nodes` option - names unique, addresses given.
- run_each(items, work): work(item) for every item at once, one thread each; returns
  [(item, value, error)] in the items' order, error a ProxtalosError (anything else is a bug
  and is raised again once every thread has ended).
- NodesProgress: the progress sink of such a run. Each node's waits report to
  NodesProgress.sink_for(name); the progress file then shows one line that names the nodes that
  are still not ready and what each was last seen doing, instead of the nodes' lines
  interleaved.
- failure_line(name, node_session, error): "lab-w-1 (10.5.0.21:50000): <why>" for a message
  that names every failing node.
- NodesRun: what a module's multi-node form keeps per node - its session, its result, its progress
  entry, its span - around run_each, and the "2 of 6 nodes failed: ..." summary.
"""

from __future__ import annotations

import sys
import threading
import time

from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError, ValidationError

MAX_THREADS = 128           # more nodes than this are probed in turns of this many
MAX_NODE_SUMMARY = 160      # characters of one node's observation in a progress line


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


def run_each(items, work, max_threads=MAX_THREADS):
    """work(item) for every item concurrently; [(item, value, error)] in order (see the module docstring)."""
    outcomes = [None] * len(items)
    unexpected = []
    slots = threading.BoundedSemaphore(max(1, max_threads))

    def run(index, item):
        with slots:
            try:
                outcomes[index] = (item, work(item), None)
            except ProxtalosError as exc:
                outcomes[index] = (item, None, exc)
            except Exception:  # pylint: disable=broad-exception-caught
                unexpected.append(sys.exc_info())
                outcomes[index] = (item, None, None)

    threads = [threading.Thread(target=run, args=(index, item), name='talos-node-%d' % index, daemon=True)
               for index, item in enumerate(items)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if unexpected:
        raise unexpected[0][1].with_traceback(unexpected[0][2])
    return outcomes


class NodesRun(object):
    """One module run over the nodes of `targets` (check_targets' list), under one deadline.

    sessions / results: {name: the node's session (make_session(item)) / its result dict (make_result())}.
    progress: the NodesProgress of the run.
    """

    def __init__(self, targets, make_session, make_result, deadline):
        self.targets = targets
        self.deadline = deadline
        self.sessions = dict((item['name'], make_session(item)) for item in targets)
        self.results = dict((item['name'], make_result()) for item in targets)
        self.progress = NodesProgress([item['name'] for item in targets], deadline=deadline)

    def run(self, work):
        """work(item, node_session, result, sink) for every node at once; [(item, value, error, span)] in order.

        Each node's result gets its `elapsed` (seconds of the run when its work ended) and span (the run's start,
        the end of its work: the times of its gate in the run report); it leaves the progress line when done.
        """
        started_at = time.time()
        ended_at = {}

        def timed(item):
            name = item['name']
            try:
                return work(item, self.sessions[name], self.results[name], self.progress.sink_for(name))
            finally:
                self.results[name]['elapsed'] = round(self.deadline.elapsed(), 3)
                ended_at[name] = time.time()
                self.progress.done(name)

        return [(item, value, error, (started_at, ended_at[item['name']])) for item, value, error in run_each(self.targets, timed)]

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


def _clip(text, limit):
    return text if len(text) <= limit else text[:limit - 3] + '...'


class _NodeSink(object):
    """What one node's waits hand to _wait.wait_for as their sink."""

    def __init__(self, progress, name):
        self.progress = progress
        self.name = name

    def update(self, observation, elapsed, attempts):  # pylint: disable=unused-argument
        self.progress.note(self.name, observation)

    def end(self, observation, elapsed, attempts, ok):  # pylint: disable=unused-argument
        # One wait of the node ended; the node is ready only when all its checks are (NodesProgress.done).
        return None


class NodesProgress(object):
    """One progress line for the waits of many nodes: which are still not ready, and why.

    sink: where the lines go - an object with update(observation, elapsed, attempts) and
    end(observation, elapsed, attempts, ok) such as _wait.ProgressFile; the default is the file of
    PROXTALOS_PROGRESS_FILE when it is set (nothing is written otherwise). A line is written only
    once some node was seen not ready, as for a single wait.
    """

    def __init__(self, names, sink=_wait.FROM_ENVIRONMENT, deadline=None):
        self.sink = _wait.environment_progress_file() if sink == _wait.FROM_ENVIRONMENT else sink
        self.names = list(names)
        self.deadline = deadline or _wait.Deadline(0)
        self.pending = dict((name, None) for name in self.names)   # name -> last observation (None: none yet)
        self.lock = threading.Lock()
        self.updates = 0
        self.reported = False

    def sink_for(self, name):
        return _NodeSink(self, name)

    def summary(self):
        """'waiting for 2 of 6 nodes: lab-w-1 (kubelet is Waiting ...), lab-w-2 (answering)'."""
        parts = []
        for name in self.names:
            if name in self.pending:
                seen = self.pending[name]
                parts.append('%s (%s)' % (name, _clip(seen, MAX_NODE_SUMMARY)) if seen else name)
        return 'waiting for %d of %d nodes: %s' % (len(parts), len(self.names), ', '.join(parts))

    def note(self, name, observation):
        """A wait of node `name` saw it not ready yet."""
        with self.lock:
            if name not in self.pending:
                return
            self.pending[name] = _wait.summary_of(observation)
            self._write()

    def done(self, name):
        """Node `name` passed or failed all its checks: it is no longer waited for."""
        with self.lock:
            self.pending.pop(name, None)
            if self.reported and self.pending:
                self._write()

    def finish(self, ok, summary):
        """Every node is done: an end line (only after progress lines, as for a single wait)."""
        with self.lock:
            if self.sink is not None and self.reported:
                self.sink.end(summary, self.deadline.elapsed(), self.updates, ok)

    def _write(self):
        if self.sink is None:
            return
        self.updates += 1
        self.reported = True
        self.sink.update(self.summary(), self.deadline.elapsed(), self.updates)
