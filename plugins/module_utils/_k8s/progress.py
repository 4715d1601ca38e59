# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Make a wait's progress visible while it runs and afterwards. PRIVATE.

An Ansible module cannot stream output to the play: its result is printed when it returns.
So progress goes two ways:

- a timeline in the module result (`progress`): one entry each time the one-line summary
  changed ("nodes Ready 4/6: w-2 NetworkPluginNotReady" -> "nodes Ready 5/6: ..."), with the
  elapsed seconds and probe number, so a finished or failed task shows how it got there;
- the same lines appended as they happen to a JSON-lines file (`progress_file`, or the
  PROXTALOS_PROGRESS_FILE environment variable, which the timeline callback sets for each task
  and follows to print the lines live). The file is written by `_wait.ProgressFile` (the line
  format is in `_wait`'s docstring): a "start" line, a "progress" line whenever the summary
  changes (and every `heartbeat` seconds while it does not), an "end" line with `ok`.
"""

from __future__ import annotations

import os
import time

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils import _wait


def summary_of(observation):
    """The one-line text of an observation: a Verdict's summary, or the text of an API error."""
    return _wait.summary_of(observation)


class Progress(object):
    """Record (and optionally stream to a file) what a wait observed."""

    def __init__(self, label, path=None, heartbeat=30.0, max_entries=100, clock=time.monotonic,
                 wall_clock=time.time, step=None):
        self.label = label
        # one step of several gates in a run: the file's lines say which ("<step>: <summary>"), so a follower
        # that shows only the summary still names the gate being waited on
        self.step = step
        self.path = path
        self.max_entries = max_entries
        self.timeline = []
        self.dropped = 0
        self._last_summary = None
        self.file = None
        if path:
            directory = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(directory):
                raise _errors.ValidationError('progress_file', 'directory does not exist: %s' % directory)
            # the process's one writer for this path: when it is also PROXTALOS_PROGRESS_FILE, the lines
            # _wait.wait_for writes for the same probes are not repeated
            self.file = _wait.shared_progress_file(path)
            self.file.heartbeat = heartbeat
            self.file.clock = clock
            self.file.wall_clock = wall_clock
            self.file.write('start', 'waiting for %s' % label, 0.0, 0, label=label)

    def _append(self, entry):
        if len(self.timeline) >= self.max_entries:
            # keep the first entry (where the wait started) and the most recent ones
            del self.timeline[1]
            self.dropped += 1
        self.timeline.append(entry)

    def record(self, observation, elapsed, attempts):
        """on_progress for _wait.wait_for: note the observation if it says something new."""
        summary = summary_of(observation)
        if summary != self._last_summary:
            self._last_summary = summary
            self._append({'elapsed': round(elapsed, 3), 'attempt': attempts, 'summary': summary})
        if self.file is not None:
            self.file.update(self._file_text(summary), elapsed, attempts, label=self.label)

    def finish(self, observation, elapsed, attempts, ok):
        """The final observation always ends the timeline."""
        summary = summary_of(observation)
        entry = {'elapsed': round(elapsed, 3), 'attempt': attempts, 'summary': summary}
        if summary != self._last_summary or not self.timeline or self.timeline[-1]['attempt'] != attempts:
            self._append(entry)
        self._last_summary = summary
        if self.file is not None:
            self.file.end(self._file_text(summary), elapsed, attempts, ok, label=self.label, always=True)

    def _file_text(self, summary):
        return '%s: %s' % (self.step, summary) if self.step else summary
