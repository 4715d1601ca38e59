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

Progress sink: a wait can also report, while it runs, what it sees. An Ansible module cannot
print before it returns, so `wait_for` hands each "not yet" observation to a sink; the default
sink is the JSON-lines file named by the PROXTALOS_PROGRESS_FILE environment variable (the
timeline callback sets it for each task and prints the lines as they come; `tail -f` works too).
Without that variable there is no sink and a wait behaves exactly as before. One file line is a
JSON object: {"time": ISO-8601 UTC, "event": "start"|"progress"|"end", "label": text or null,
"elapsed": s, "attempt": n, "summary": one-line text, "ok": bool (end only)}. A line is written
when the summary changes, and while it does not, at most every `heartbeat` seconds (so a follower
can tell a slow wait from a hung one). Writing progress never fails a wait: a file that cannot be
written is given up silently.
"""

from __future__ import annotations

import datetime
import json
import os
import time

PROGRESS_FILE_ENV = 'PROXTALOS_PROGRESS_FILE'
FROM_ENVIRONMENT = 'environment'   # wait_for's default sink: the progress file of PROXTALOS_PROGRESS_FILE, if set


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


class ProgressFile(object):
    """Appends a wait's progress to a JSON-lines file (see the module docstring for the line format).

    update() writes a "progress" line when the summary differs from the last line written, or
    when `heartbeat` seconds passed since it; end() writes an "end" line after progress lines.
    One instance per path and process (shared_progress_file), so waits that follow each other in a
    module, or a caller and wait_for reporting the same probe, do not repeat a line.
    """

    def __init__(self, path, heartbeat=30.0, clock=time.monotonic, wall_clock=time.time):
        self.path = path
        self.heartbeat = heartbeat
        self.clock = clock
        self.wall_clock = wall_clock
        self.broken = False
        self._last = None          # (event, summary, attempt) of the last line written
        self._last_write = None
        self._open_progress = False

    def write(self, event, summary, elapsed, attempt, label=None, ok=None):
        """Append one line; False (and no more writes) when the file cannot be written."""
        if self.broken:
            return False
        line = {'time': datetime.datetime.fromtimestamp(self.wall_clock(), datetime.timezone.utc).isoformat(),
                'event': event, 'label': label, 'elapsed': round(float(elapsed), 3), 'attempt': attempt,
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

    def update(self, observation, elapsed, attempts, label=None):
        """A probe that is not done: write it if it says something new, or as a heartbeat."""
        summary = summary_of(observation)
        if self._last is not None and self._last[0] == 'progress' and self._last[1] == summary:
            if self.clock() - self._last_write < self.heartbeat:
                return False
        return self.write('progress', summary, elapsed, attempts, label=label)

    def end(self, observation, elapsed, attempts, ok, label=None, always=False):
        """The wait is over: an "end" line after its progress lines (or always), once."""
        summary = summary_of(observation)
        if self._last == ('end', summary, attempts):
            return False
        if not (always or self._open_progress):
            return False
        self._open_progress = False
        return self.write('end', summary, elapsed, attempts, label=label, ok=ok)


_PROGRESS_FILES = {}


def shared_progress_file(path):
    """The process's ProgressFile for path (one per path, so its change detection spans every wait)."""
    key = os.path.abspath(path)
    if key not in _PROGRESS_FILES:
        _PROGRESS_FILES[key] = ProgressFile(key)
    return _PROGRESS_FILES[key]


def environment_progress_file():
    """The ProgressFile named by PROXTALOS_PROGRESS_FILE, or None when it is not set."""
    path = os.environ.get(PROGRESS_FILE_ENV)
    return shared_progress_file(path) if path else None


def wait_for(probe, timeout, interval=1.0, transient=(), backoff=1.0, max_interval=None,
             on_progress=None, clock=time.monotonic, sleep=time.sleep, sink=FROM_ENVIRONMENT):
    """Call probe() until it reports done or the deadline passes.

    probe: callable returning (done, observation).
    timeout: seconds; 0 probes exactly once.
    interval: seconds between probes; multiplied by backoff after each probe, up to max_interval.
    transient: exception types that mean "not yet"; their text becomes the observation.
    on_progress: called with (observation, elapsed, attempts) after each probe that is not done.
    sink: where progress goes while waiting - an object with update(observation, elapsed, attempts)
      and end(observation, elapsed, attempts, ok) such as a ProgressFile; the default is the file of
      PROXTALOS_PROGRESS_FILE when that is set; None for none. It never changes the outcome.
    Returns a WaitResult; never raises for a timeout (callers decide how to report it).
    """
    if interval <= 0:
        raise ValueError('interval must be more than zero seconds, got %r' % (interval,))
    if sink == FROM_ENVIRONMENT:
        sink = environment_progress_file()
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
                sink.end(observation, deadline.elapsed(), attempts, True)
            return WaitResult(True, observation, deadline.elapsed(), attempts)
        if on_progress is not None:
            on_progress(observation, deadline.elapsed(), attempts)
        if sink is not None:
            sink.update(observation, deadline.elapsed(), attempts)
            reported = True
        remaining = deadline.remaining()
        if remaining <= 0:
            if reported:
                sink.end(observation, deadline.elapsed(), attempts, False)
            return WaitResult(False, observation, deadline.elapsed(), attempts)
        sleep(min(pause, remaining))
        pause = pause * backoff
        if max_interval is not None:
            pause = min(pause, max_interval)


def retry(call, timeout, interval=1.0, transient=(), backoff=2.0, max_interval=10.0,
          on_retry=None, clock=time.monotonic, sleep=time.sleep, sink=FROM_ENVIRONMENT):
    """Run call() until it returns without a transient error; return its value.

    The last transient error is raised again when the deadline passes, so the caller reports
    the real cause. Non-transient errors are raised at once. sink: as for wait_for.
    """
    outcome = {}

    def probe():
        try:
            outcome['value'] = call()
        except transient as exc:  # pylint: disable=catching-non-exception
            outcome['error'] = exc
            return False, describe_exception(exc)
        return True, None

    def progress(observation, elapsed, attempts):
        if on_retry is not None:
            on_retry(observation, elapsed, attempts)

    result = wait_for(probe, timeout, interval=interval, backoff=backoff, max_interval=max_interval,
                      on_progress=progress, clock=clock, sleep=sleep, sink=sink)
    if result.ok:
        return outcome['value']
    raise outcome['error']
