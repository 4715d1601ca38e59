# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Live progress of waiting tasks, for the timeline callback. PRIVATE to the collection.

A module cannot print while it runs. The collection's waits (module_utils/_wait.py) append what
they see to the JSON-lines file named by PROXTALOS_PROGRESS_FILE. The callback gives every task
its own file in a private folder (it sets the variable in the controller's environment just before
Ansible forks the task's worker, which passes it on to the module) and a Follower reads the files
of the running tasks on a thread of its own and hands one line to `emit` each time a task's
summary changes:

    [lab-cp-1] Gate - ALL nodes Ready: nodes Ready 4/6: lab-w-2 NetworkPluginNotReady (12 s)

Rate limit: at most one line per task every `min_interval` seconds; a summary that arrives sooner
is held and shown when that time has passed, unless a newer one replaces it or the wait ended. A
wait that ended (an "end" line) shows nothing more, so no stale line follows the task's result.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
import threading
import time

PROGRESS_FILE_ENV = 'PROXTALOS_PROGRESS_FILE'
ROLE_PREFIX_SEPARATOR = ' : '
FOLDER_PREFIX = 'proxtalos-progress-'


def _process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True   # someone else's process
    return True


def remove_stale_folders(parent=None):
    """Remove the progress folders of runs that were killed (SIGKILL leaves no chance to clean up): folders named
    proxtalos-progress-<pid>-..., owned by this user, whose process is gone. Returns the paths removed."""
    parent = parent or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(FOLDER_PREFIX):
            continue
        pid_text = name[len(FOLDER_PREFIX):].split('-', 1)[0]
        path = os.path.join(parent, name)
        try:
            if not pid_text.isdigit() or os.stat(path).st_uid != os.getuid() or _process_alive(int(pid_text)):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _wall_time(text):
    """Seconds since the epoch of an ISO 8601 time written by _wait.Progress, or None."""
    try:
        moment = datetime.datetime.fromisoformat(str(text))
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def short_task_name(name):
    """The task name without a role's "namespace.collection.role : " prefix."""
    head, separator, rest = (name or '').partition(ROLE_PREFIX_SEPARATOR)
    if separator and rest and ' ' not in head:
        return rest
    return name or ''


def progress_line(host, task_name, summary, seconds):
    return '  [%s] %s: %s (%d s)' % (host, short_task_name(task_name), summary, int(round(max(0.0, seconds))))


class _Watched(object):
    """One running task on one host: its file, how far it was read, what was shown."""

    __slots__ = ('host', 'task_name', 'path', 'started', 'offset', 'partial', 'shown_at', 'pending', 'ended')

    def __init__(self, host, task_name, path, started):
        self.host = host
        self.task_name = task_name
        self.path = path
        self.started = started
        self.offset = 0
        self.partial = b''
        self.shown_at = None
        self.pending = None      # (summary, wall time of the line) not shown yet
        self.ended = False


class Follower(object):
    """Follows the progress files of running tasks; emit(text) gets each line to show.

    watch()/unwatch() come from the callback (the main thread); poll() runs on the follower's
    thread (start()/stop()), or directly in tests. One lock serialises them: once unwatch()
    returns, nothing more is emitted for that task.
    """

    def __init__(self, emit, min_interval=5.0, poll_interval=0.5, mask=None, directory=None,
                 clock=time.monotonic, wall_clock=time.time):
        if min_interval < 0 or poll_interval <= 0:
            raise ValueError('min_interval must be >= 0 and poll_interval > 0 seconds')
        self.emit = emit
        self.min_interval = float(min_interval)
        self.poll_interval = float(poll_interval)
        self.mask = mask
        self.clock = clock
        self.wall_clock = wall_clock
        self.owner_pid = os.getpid()
        if directory is None:
            remove_stale_folders()
            directory = tempfile.mkdtemp(prefix='%s%d-' % (FOLDER_PREFIX, self.owner_pid))
        self.directory = directory
        os.chmod(self.directory, 0o700)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._watched = {}
        self._serial = 0

    # -- the callback's side ----------------------------------------------------------------------

    def new_path(self):
        """A new file path (not created: the module creates it, 0600, when it has something to say)."""
        with self._lock:
            self._serial += 1
            return os.path.join(self.directory, 'task-%d.jsonl' % self._serial)

    def watch(self, key, host, task_name, path, started=None):
        with self._lock:
            self._watched[key] = _Watched(host, task_name, path, self.wall_clock() if started is None else started)

    def unwatch(self, key):
        """Stop following a task (its result is in) and remove its file."""
        with self._lock:
            watched = self._watched.pop(key, None)
        if watched is not None:
            try:
                os.unlink(watched.path)
            except OSError:
                pass   # the module never wrote to it

    def watching(self):
        with self._lock:
            return sorted(self._watched)

    # -- the follower's side ----------------------------------------------------------------------

    def _read_lines(self, watched):
        try:
            with open(watched.path, 'rb') as stream:
                stream.seek(watched.offset)
                data = stream.read()
        except (OSError, IOError):
            return []   # not written yet
        watched.offset += len(data)
        data = watched.partial + data
        complete, _newline, watched.partial = data.rpartition(b'\n')
        lines = []
        for raw in complete.split(b'\n') if complete else []:
            try:
                line = json.loads(raw.decode('utf-8'))
            except ValueError:
                continue
            if isinstance(line, dict):
                lines.append(line)
        return lines

    def _due(self, watched, now):
        return watched.shown_at is None or now - watched.shown_at >= self.min_interval

    def poll(self):
        """Read what every running task wrote since the last poll; emit what is due. Returns the lines emitted."""
        emitted = []
        with self._lock:
            now = self.clock()
            for key in sorted(self._watched):
                watched = self._watched[key]
                for line in self._read_lines(watched):
                    event = line.get('event')
                    if event == 'progress' and line.get('summary'):
                        watched.ended = False
                        watched.pending = (str(line['summary']), _wall_time(line.get('time')))
                    elif event == 'end':
                        watched.ended = True
                        watched.pending = None   # the wait is over: a held line would be stale
                if watched.pending is None or watched.ended or not self._due(watched, now):
                    continue
                summary, at = watched.pending
                watched.pending = None
                if self.mask is not None:
                    summary = self.mask(summary)
                seconds = (at if at is not None else self.wall_clock()) - watched.started
                text = progress_line(watched.host, watched.task_name, summary, seconds)
                watched.shown_at = now
                self.emit(text)
                emitted.append(text)
        return emitted

    def _run(self):
        while not self._stop.wait(self.poll_interval):
            try:
                self.poll()
            except Exception:  # pylint: disable=broad-except
                continue   # progress is best effort: a bad file or a display error never ends the run

    def start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name='proxtalos-progress', daemon=True)
            self._thread.start()

    def stop(self):
        """End the thread (joined) and remove the folder with every file left in it."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, 4 * self.poll_interval))
        self._thread = None
        with self._lock:
            self._watched.clear()
        if os.getpid() == self.owner_pid:   # never from a forked child that inherited this object
            shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def running(self):
        return self._thread is not None and self._thread.is_alive()
