# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Make a wait's progress visible while it runs and afterwards. PRIVATE.

An Ansible module cannot stream output to the play: its result is printed when it returns.
So progress goes two ways:

- a timeline in the module result (`progress`): one entry each time the one-line summary
  changed ("nodes Ready 4/6: w-2 NetworkPluginNotReady" -> "nodes Ready 5/6: ..."), with the
  elapsed seconds and probe number, so a finished or failed task shows how it got there;
- optionally, the same lines appended as they happen to a JSON-lines file (`progress_file`,
  or the PROXTALOS_PROGRESS_FILE environment variable), which a callback plugin or
  `tail -f` can follow live. Each line is one JSON object:
  {"time": ISO-8601 UTC, "event": "start"|"progress"|"end", "label": ..., "elapsed": s,
   "attempt": n, "summary": text, "ok": bool (end only)}.
  While the summary does not change, a line is still written every `heartbeat` seconds so a
  follower can tell a slow wait from a hung one.
"""

from __future__ import annotations

import datetime
import json
import os
import time

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors


def summary_of(observation):
    """The one-line text of an observation: a Verdict's summary, or the text of an API error."""
    summary = getattr(observation, 'summary', None)
    return summary if summary is not None else str(observation)


class Progress(object):
    """Record (and optionally stream to a file) what a wait observed."""

    def __init__(self, label, path=None, heartbeat=30.0, max_entries=100, clock=time.monotonic,
                 wall_clock=time.time):
        self.label = label
        self.path = path
        self.heartbeat = heartbeat
        self.max_entries = max_entries
        self.clock = clock
        self.wall_clock = wall_clock
        self.timeline = []
        self.dropped = 0
        self._last_summary = None
        self._last_write = None
        if path:
            directory = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(directory):
                raise _errors.ValidationError('progress_file', 'directory does not exist: %s' % directory)
            self._write({'event': 'start', 'elapsed': 0.0, 'attempt': 0, 'summary': 'waiting for %s' % label})

    def _write(self, entry):
        if not self.path:
            return
        line = dict(entry)
        line['time'] = datetime.datetime.fromtimestamp(self.wall_clock(), datetime.timezone.utc).isoformat()
        line['label'] = self.label
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(line, sort_keys=True) + '\n').encode('utf-8'))
        finally:
            os.close(fd)
        self._last_write = self.clock()

    def _append(self, entry):
        if len(self.timeline) >= self.max_entries:
            # keep the first entry (where the wait started) and the most recent ones
            del self.timeline[1]
            self.dropped += 1
        self.timeline.append(entry)

    def record(self, observation, elapsed, attempts):
        """on_progress for _wait.wait_for: note the observation if it says something new."""
        summary = summary_of(observation)
        entry = {'elapsed': round(elapsed, 3), 'attempt': attempts, 'summary': summary}
        if summary != self._last_summary:
            self._last_summary = summary
            self._append(entry)
            self._write(dict(entry, event='progress'))
        elif self.path and self._last_write is not None and self.clock() - self._last_write >= self.heartbeat:
            self._write(dict(entry, event='progress'))

    def finish(self, observation, elapsed, attempts, ok):
        """The final observation always ends the timeline."""
        summary = summary_of(observation)
        entry = {'elapsed': round(elapsed, 3), 'attempt': attempts, 'summary': summary}
        if summary != self._last_summary or not self.timeline or self.timeline[-1]['attempt'] != attempts:
            self._append(entry)
        self._last_summary = summary
        self._write(dict(entry, event='end', ok=bool(ok)))
