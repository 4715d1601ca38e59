# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one way a module works on many items (nodes, VMs) at the same time. PRIVATE to the collection.

A module that takes every node (or VM) at once runs one piece of work per item, concurrently, so a
slow or silent item does not delay the others:

- run_each(items, work, deadline, max_workers, name, progress): work(item) for every item on a
  bounded pool (at most max_workers at once; the others wait for a free worker, in order). Returns a
  Fanout: one Outcome per item in the items' order (its value, or the error it raised when that error
  is one of `expected`, ProxtalosError by default), and the largest number of items worked on at once.
  Any other exception is a bug: it is raised again once every started item has ended.
  Deadline, per item: an item that had to wait for a free worker (one after the first max_workers)
  and whose turn comes after the deadline has passed is not started; its outcome is a NotStarted
  error that carries its name (`item`). An item that started runs to its end (a thread cannot be
  stopped): every caller's work is bounded by the same deadline itself (its waits and API calls).
  work may be a coroutine function: then the items run as tasks of one event loop (no threads), at
  most max_workers at once, with the same outcomes (talos_node_diagnosis: its reads are coroutines
  of AsyncTalosClient, so a round needs no thread per node).
- ItemsLine: the progress of such a run as one line - the items still not done and what each was last
  seen doing - written through the one progress recorder (_wait.Progress), instead of the items'
  lines interleaved. Each item's waits report to ItemsLine.sink_for(name); run_each(progress=line)
  takes an item off the line when its work ends.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
import time

from concurrent.futures import ThreadPoolExecutor

from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError

MAX_WORKERS = 16            # items worked on at once unless the caller says otherwise
MAX_ITEM_SUMMARY = 160      # characters of one item's observation in a progress line


class NotStarted(ProxtalosError):
    """An item whose turn came after the deadline had passed: its work was not started.

    The message does not name the item (callers name every item's error in their own words, as for the errors
    of its work); `item` (also in the details) is its name.
    """

    def __init__(self, name, deadline):
        super(NotStarted, self).__init__('not started: the deadline of %.0f s passed while it waited for a free worker'
                                         % deadline.timeout, item=name)
        self.item = name


class Outcome(object):
    """How one item's work ended: its value, or the expected error it raised (then value is None).

    started_at / ended_at: wall-clock times (time.time()) of the work's start and end (None when not started).
    """

    __slots__ = ('item', 'value', 'error', 'started_at', 'ended_at')

    def __init__(self, item, value=None, error=None, started_at=None, ended_at=None):
        self.item = item
        self.value = value
        self.error = error
        self.started_at = started_at
        self.ended_at = ended_at

    def __repr__(self):
        return 'Outcome(item=%r, value=%r, error=%r)' % (self.item, self.value, self.error)


class Fanout(object):
    """run_each's answer: the outcomes in the items' order, and the most items that were worked on at once."""

    def __init__(self, outcomes, most_at_once):
        self.outcomes = outcomes
        self.most_at_once = most_at_once

    def __iter__(self):
        return iter(self.outcomes)

    def __len__(self):
        return len(self.outcomes)

    @property
    def failed(self):
        return [outcome for outcome in self.outcomes if outcome.error is not None]


class _Counter(object):
    """How many items are being worked on now, and the most at once (a lock: pool threads share it)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0

    def enter(self):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self):
        with self.lock:
            self.now -= 1


def run_each(items, work, deadline=None, max_workers=MAX_WORKERS, name=str, progress=None, expected=(ProxtalosError,)):
    """work(item) for every item at once, at most max_workers at a time; a Fanout (see the module docstring).

    deadline: a _wait.Deadline, or None for no deadline (the caller's own loop bounds the work).
    name(item): how messages and the progress line name an item.
    progress: an ItemsLine; each item leaves it when its work ends.
    """
    items = list(items)
    if max_workers < 1:
        raise ValueError('max_workers must be at least 1, got %r' % (max_workers,))
    outcomes = [None] * len(items)
    counter = _Counter()
    unexpected = []

    def begin(index, item):
        """True when the item may start; otherwise its outcome says why not."""
        # the first max_workers items never wait for a worker: they start even after a deadline of 0 (probe once)
        if deadline is not None and index >= max_workers and deadline.expired():
            outcomes[index] = Outcome(item, error=NotStarted(name(item), deadline))
            if progress is not None:
                progress.done(name(item))
            return False
        counter.enter()
        return True

    def end(index, item, started_at, value=None, error=None):
        outcomes[index] = Outcome(item, value, error, started_at, time.time())
        counter.leave()
        if progress is not None:
            progress.done(name(item))

    def run(index, item):
        if not begin(index, item):
            return
        started_at = time.time()
        try:
            value = work(item)
        except expected as exc:  # pylint: disable=catching-non-exception
            end(index, item, started_at, error=exc)
        except Exception:  # pylint: disable=broad-exception-caught
            unexpected.append(sys.exc_info())
            end(index, item, started_at)
        else:
            end(index, item, started_at, value=value)

    async def run_async(index, item, slots):
        async with slots:
            if not begin(index, item):
                return
            started_at = time.time()
            try:
                value = await work(item)
            except expected as exc:  # pylint: disable=catching-non-exception
                end(index, item, started_at, error=exc)
            except Exception:  # pylint: disable=broad-exception-caught
                unexpected.append(sys.exc_info())
                end(index, item, started_at)
            else:
                end(index, item, started_at, value=value)

    async def run_all_async():
        slots = asyncio.Semaphore(max_workers)
        await asyncio.gather(*(run_async(index, item, slots) for index, item in enumerate(items)))

    if items and inspect.iscoroutinefunction(work):
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(run_all_async())
        finally:
            loop.close()
    elif items:
        with ThreadPoolExecutor(max_workers=min(len(items), max_workers), thread_name_prefix='proxtalos-fanout') as pool:
            for index, item in enumerate(items):
                pool.submit(run, index, item)
    if unexpected:
        raise unexpected[0][1].with_traceback(unexpected[0][2])
    return Fanout(outcomes, counter.most)


def _clip(text, limit):
    return text if len(text) <= limit else text[:limit - 3] + '...'


class _ItemSink(object):
    """What one item's waits hand to _wait.wait_for as their progress: it feeds the item's part of the line."""

    def __init__(self, line, name):
        self.line = line
        self.name = name

    def update(self, observation, elapsed, attempts):  # pylint: disable=unused-argument
        self.line.note(self.name, observation)

    def end(self, observation, elapsed, attempts, ok):  # pylint: disable=unused-argument
        # One wait of the item ended; the item leaves the line only when all its work did (ItemsLine.done).
        return None


class ItemsLine(object):
    """One progress line for the waits of many items: which are still not done, and why.

    recorder: where the line goes - the one progress recorder, _wait.Progress (or None); the default writes to
    the file of PROXTALOS_PROGRESS_FILE when it is set (nothing is written otherwise). A line is written only once some
    item was seen not ready, as for a single wait. noun: what the items are, in the line ('nodes').
    """

    def __init__(self, names, recorder=_wait.FROM_ENVIRONMENT, deadline=None, noun='nodes'):
        self.recorder = _wait.Progress.from_environment() if recorder == _wait.FROM_ENVIRONMENT else recorder
        self.names = list(names)
        self.noun = noun
        self.deadline = deadline or _wait.Deadline(0)
        self.pending = dict((name, None) for name in self.names)   # name -> last observation (None: none yet)
        self.lock = threading.Lock()
        self.updates = 0
        self.reported = False

    def sink_for(self, name):
        return _ItemSink(self, name)

    def summary(self):
        """'waiting for 2 of 6 nodes: lab-w-1 (kubelet is Waiting ...), lab-w-2 (answering)'."""
        parts = []
        for name in self.names:
            if name in self.pending:
                seen = self.pending[name]
                parts.append('%s (%s)' % (name, _clip(seen, MAX_ITEM_SUMMARY)) if seen else name)
        return 'waiting for %d of %d %s: %s' % (len(parts), len(self.names), self.noun, ', '.join(parts))

    def note(self, name, observation):
        """A wait of item `name` saw it not ready yet."""
        with self.lock:
            if name not in self.pending:
                return
            self.pending[name] = _wait.summary_of(observation)
            self._write()

    def done(self, name):
        """Item `name`'s work ended: it is no longer waited for."""
        with self.lock:
            self.pending.pop(name, None)
            if self.reported and self.pending:
                self._write()

    def finish(self, ok, summary):
        """Every item is done: an end line (only after progress lines, as for a single wait)."""
        with self.lock:
            if self.recorder is not None and self.reported:
                self.recorder.end(summary, self.deadline.elapsed(), self.updates, ok)

    def _write(self):
        if self.recorder is None:
            return
        self.updates += 1
        self.reported = True
        self.recorder.update(self.summary(), self.deadline.elapsed(), self.updates)
