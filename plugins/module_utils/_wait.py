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
"""

from __future__ import annotations

import time


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


def wait_for(probe, timeout, interval=1.0, transient=(), backoff=1.0, max_interval=None,
             on_progress=None, clock=time.monotonic, sleep=time.sleep):
    """Call probe() until it reports done or the deadline passes.

    probe: callable returning (done, observation).
    timeout: seconds; 0 probes exactly once.
    interval: seconds between probes; multiplied by backoff after each probe, up to max_interval.
    transient: exception types that mean "not yet"; their text becomes the observation.
    on_progress: called with (observation, elapsed, attempts) after each probe that is not done.
    Returns a WaitResult; never raises for a timeout (callers decide how to report it).
    """
    if interval <= 0:
        raise ValueError('interval must be more than zero seconds, got %r' % (interval,))
    deadline = Deadline(timeout, clock)
    attempts = 0
    observation = None
    pause = float(interval)
    while True:
        attempts += 1
        try:
            done, observation = probe()
        except transient as exc:  # pylint: disable=catching-non-exception
            done, observation = False, describe_exception(exc)
        if done:
            return WaitResult(True, observation, deadline.elapsed(), attempts)
        if on_progress is not None:
            on_progress(observation, deadline.elapsed(), attempts)
        remaining = deadline.remaining()
        if remaining <= 0:
            return WaitResult(False, observation, deadline.elapsed(), attempts)
        sleep(min(pause, remaining))
        pause = pause * backoff
        if max_interval is not None:
            pause = min(pause, max_interval)


def retry(call, timeout, interval=1.0, transient=(), backoff=2.0, max_interval=10.0,
          on_retry=None, clock=time.monotonic, sleep=time.sleep):
    """Run call() until it returns without a transient error; return its value.

    The last transient error is raised again when the deadline passes, so the caller reports
    the real cause. Non-transient errors are raised at once.
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
                      on_progress=progress, clock=clock, sleep=sleep)
    if result.ok:
        return outcome['value']
    raise outcome['error']
