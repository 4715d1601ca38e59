# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one deadline/poll/retry helper every waiting module uses. PRIVATE to the collection.

A wait is: a probe that returns (done, observation), a deadline on the monotonic clock, and an
interval between probes that may grow (backoff) up to a cap. Exceptions listed as transient
mean "not yet" and become the observation; any other exception ends the wait at once. The
result always says what was seen last, how long it took and how many probes ran, so a timeout
can be reported with the evidence. timeout=0 means "probe once".

`retry` is the same loop for actions: call until the call does not raise a transient error.

The clock and sleep functions can be injected, so tests run on a fake clock.

Progress: a wait can also report, while it runs, what it sees. An Ansible module cannot print
before it returns, so `wait_for` hands each "not yet" observation to its one progress hook, a
recorder (`Progress`): it keeps a timeline for the module result and appends the same lines to a
JSON-lines file. The default recorder writes to the file named by the PROXTALOS_PROGRESS_FILE
environment variable (the timeline callback sets it for each task and prints the lines as they
come; `tail -f` works too). Without that variable nothing is written and a wait behaves exactly as
before. One file line is a JSON object: {"time": ISO-8601 UTC, "event": "start"|"progress"|"end",
"label": text or null, "elapsed": s, "attempt": n, "summary": one-line text, "ok": bool (end
only)}. A line is written when the summary changes, and while it does not, at most every
`heartbeat` seconds (so a follower can tell a slow wait from a hung one). Writing progress never
fails a wait: a file that cannot be written is given up silently.
"""

from __future__ import annotations

import datetime
import json
import os
import time

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors

PROGRESS_FILE_ENV = 'PROXTALOS_PROGRESS_FILE'
FROM_ENVIRONMENT = 'environment'   # wait_for's default progress: a Progress for PROXTALOS_PROGRESS_FILE


class WaitResult(object):
    """What a wait saw: ok, the last observation, elapsed seconds and attempts."""

    __slots__ = ('ok', 'observation', 'elapsed', 'attempts')

    def __init__(self, ok, observation, elapsed, attempts):
        self.ok = ok
        self.observation = observation
        self.elapsed = elapsed
        self.attempts = attempts

    def as_dict(self):
        return {'ok': self.ok, 'observation': self.observation, 'elapsed': round(self.elapsed, 3),
                'attempts': self.attempts}

    def __repr__(self):
        return 'WaitResult(ok=%r, elapsed=%.3f, attempts=%d, observation=%r)' % (
            self.ok, self.elapsed, self.attempts, self.observation)


class Deadline(object):
    """A point on the monotonic clock; remaining() never goes below zero."""

    def __init__(self, timeout, clock=time.monotonic):
        if timeout is None or timeout < 0:
            raise ValueError('timeout must be zero or more seconds, got %r' % (timeout,))
        self.clock = clock
        self.start = clock()
        self.timeout = float(timeout)

    def elapsed(self):
        return self.clock() - self.start

    def remaining(self):
        return max(0.0, self.timeout - self.elapsed())

    def expired(self):
        return self.elapsed() >= self.timeout


def describe_exception(exc):
    """A short text for an exception seen while waiting."""
    text = str(exc) or exc.__class__.__name__
    return '%s: %s' % (exc.__class__.__name__, text) if text != exc.__class__.__name__ else text


def summary_of(observation):
    """The one-line text of an observation: its `summary` attribute (a gate verdict) or its text."""
    summary = getattr(observation, 'summary', None)
    text = summary if summary is not None else str(observation)
    return ' '.join(text.split())


class Progress(object):
    """The one progress recorder: what a wait saw, as a timeline and as lines of a progress file.

    timeline: one entry ({elapsed, attempt, summary}) each time the one-line summary changed, and the last
    observation at the end; at most max_entries (the first and the newest; `dropped` counts the others).
    path: the JSON-lines file (see the module docstring); None writes no file. update() writes a
    "progress" line when the summary differs from the last line written, or when `heartbeat` seconds passed
    since it; end() writes an "end" line after progress lines.
    label / step: the lines' label, and a step name that prefixes their summary ('<step>: <summary>').
    announce: the owner of the wait writes a "start" line at once and ends it with finish(), with its own
    verdict (a gate that failed for good ends the wait, but not as passed); the end wait_for reports is then
    not recorded. A path whose folder does not exist is refused (field progress_file).
    note(observation, elapsed, attempts): called for each probe that is not done (callers that record retries).
    elapsed / attempts: those of the last probe reported.
    """

    def __init__(self, path=None, label=None, step=None, announce=False, heartbeat=30.0, max_entries=100, note=None,
                 clock=time.monotonic, wall_clock=time.time):
        self.path = path
        self.label = label
        self.step = step
        self.announce = announce
        self.heartbeat = heartbeat
        self.max_entries = max_entries
        self.note = note
        self.clock = clock
        self.wall_clock = wall_clock
        self.timeline = []
        self.dropped = 0
        self.elapsed = 0.0
        self.attempts = 0
        self.broken = False
        self._last_summary = None  # of the timeline
        self._last = None          # (event, summary, attempt) of the last line written
        self._last_write = None
        self._open_progress = False
        self._ended = False
        if path and announce:
            directory = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(directory):
                raise _errors.ValidationError('progress_file', 'directory does not exist: %s' % directory)
            self.write('start', 'waiting for %s' % label, 0.0, 0)

    @classmethod
    def from_environment(cls, **options):
        """A recorder writing to the file of PROXTALOS_PROGRESS_FILE, or to no file when it is not set."""
        return cls(path=os.environ.get(PROGRESS_FILE_ENV) or None, **options)

    def write(self, event, summary, elapsed, attempt, ok=None):
        """Append one line; False (and no more writes) when there is no file or it cannot be written."""
        if not self.path or self.broken:
            return False
        line = {'time': datetime.datetime.fromtimestamp(self.wall_clock(), datetime.timezone.utc).isoformat(),
                'event': event, 'label': self.label, 'elapsed': round(float(elapsed), 3), 'attempt': attempt,
                'summary': summary}
        if ok is not None:
            line['ok'] = bool(ok)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (json.dumps(line, sort_keys=True) + '\n').encode('utf-8'))
            finally:
                os.close(fd)
        except (OSError, IOError):
            self.broken = True   # the follower went away (its folder removed): progress is best effort
            return False
        self._last = (event, summary, attempt)
        self._last_write = self.clock()
        self._open_progress = event == 'progress' or (event == 'start' and self._open_progress)
        return True

    def _append(self, summary, elapsed, attempts):
        if len(self.timeline) >= self.max_entries:
            # keep the first entry (where the wait started) and the most recent ones
            del self.timeline[1]
            self.dropped += 1
        self.timeline.append({'elapsed': round(elapsed, 3), 'attempt': attempts, 'summary': summary})

    def _file_text(self, summary):
        return '%s: %s' % (self.step, summary) if self.step else summary

    def update(self, observation, elapsed, attempts):
        """A probe that is not done: a timeline entry if it says something new; a file line if new or a heartbeat."""
        summary = summary_of(observation)
        self.elapsed, self.attempts = elapsed, attempts
        if self.note is not None:
            self.note(observation, elapsed, attempts)
        if summary != self._last_summary:
            self._last_summary = summary
            self._append(summary, elapsed, attempts)
        text = self._file_text(summary)
        if self._last is not None and self._last[0] == 'progress' and self._last[1] == text:
            if self.clock() - self._last_write < self.heartbeat:
                return False
        return self.write('progress', text, elapsed, attempts)

    def end(self, observation, elapsed, attempts, ok):
        """The wait is over, as wait_for reports it (after it reported progress): ignored when announced."""
        if not self.announce:
            self._close(observation, elapsed, attempts, ok, always=False)

    def finish(self, observation, elapsed, attempts, ok):
        """The owner's end of the wait: the final timeline entry, and an end line whatever came before."""
        self._close(observation, elapsed, attempts, ok, always=True)

    def _close(self, observation, elapsed, attempts, ok, always):
        if self._ended:
            return
        self._ended = True
        summary = summary_of(observation)
        if summary != self._last_summary or not self.timeline or self.timeline[-1]['attempt'] != attempts:
            self._append(summary, elapsed, attempts)
        self._last_summary = summary
        self.elapsed, self.attempts = elapsed, attempts
        if always or self._open_progress:
            self._open_progress = False
            self.write('end', self._file_text(summary), elapsed, attempts, ok=ok)


def _recorder(progress):
    """wait_for's progress argument: FROM_ENVIRONMENT is a recorder for PROXTALOS_PROGRESS_FILE."""
    return Progress.from_environment() if progress == FROM_ENVIRONMENT else progress


def wait_for(probe, timeout, interval=1.0, transient=(), backoff=1.0, max_interval=None,
             clock=time.monotonic, sleep=time.sleep, progress=FROM_ENVIRONMENT):
    """Call probe() until it reports done or the deadline passes.

    probe: callable returning (done, observation).
    timeout: seconds; 0 probes exactly once.
    interval: seconds between probes; multiplied by backoff after each probe, up to max_interval.
    transient: exception types that mean "not yet"; their text becomes the observation.
    progress: the one hook - an object with update(observation, elapsed, attempts), called after each probe
      that is not done, and end(observation, elapsed, attempts, ok), called when a wait that reported ends:
      a Progress, or _fanout.ItemsLine's sink of one item; the default is a Progress writing to the file of
      PROXTALOS_PROGRESS_FILE when that is set; None for none. It never changes the outcome.
    Returns a WaitResult; never raises for a timeout (callers decide how to report it).
    """
    if interval <= 0:
        raise ValueError('interval must be more than zero seconds, got %r' % (interval,))
    progress = _recorder(progress)
    deadline = Deadline(timeout, clock)
    attempts = 0
    observation = None
    pause = float(interval)
    reported = False
    while True:
        attempts += 1
        try:
            done, observation = probe()
        except transient as exc:  # pylint: disable=catching-non-exception
            done, observation = False, describe_exception(exc)
        if done:
            if reported:
                progress.end(observation, deadline.elapsed(), attempts, True)
            return WaitResult(True, observation, deadline.elapsed(), attempts)
        if progress is not None:
            progress.update(observation, deadline.elapsed(), attempts)
            reported = True
        remaining = deadline.remaining()
        if remaining <= 0:
            if reported:
                progress.end(observation, deadline.elapsed(), attempts, False)
            return WaitResult(False, observation, deadline.elapsed(), attempts)
        sleep(min(pause, remaining))
        pause = pause * backoff
        if max_interval is not None:
            pause = min(pause, max_interval)


def retry(call, timeout, interval=1.0, transient=(), backoff=2.0, max_interval=10.0,
          clock=time.monotonic, sleep=time.sleep, progress=FROM_ENVIRONMENT):
    """Run call() until it returns without a transient error; return its value.

    The last transient error is raised again when the deadline passes, so the caller reports
    the real cause. Non-transient errors are raised at once. progress: as for wait_for (a Progress
    with a `note` hears every retried error).
    """
    outcome = {}

    def probe():
        try:
            outcome['value'] = call()
        except transient as exc:  # pylint: disable=catching-non-exception
            outcome['error'] = exc
            return False, describe_exception(exc)
        return True, None

    result = wait_for(probe, timeout, interval=interval, backoff=backoff, max_interval=max_interval,
                      clock=clock, sleep=sleep, progress=progress)
    if result.ok:
        return outcome['value']
    raise outcome['error']
