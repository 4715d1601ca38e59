# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One way to replace a file the collection keeps on the controller (secrets, keys, configs, reports). PRIVATE.

write_atomically(path, data, mode): the bytes go to a temporary file in the same folder, created with `mode` from the
first byte, flushed to disk, then renamed over `path`, so a reader sees the old file or the new one, never half of one.

A writer killed between the create and the rename (SIGKILL, a lost machine) cannot remove its temporary file. So each
temporary name carries the writer's host and process id (`.<name>.<host>.<pid>.<8 random characters>`, the random part
as tempfile.mkstemp makes it), and the next write of the same path on the same host removes the temporaries whose
writer is gone. A temporary of a process that still runs, or of another host (a folder shared over NFS, where the pid
means nothing here), is left alone: it may be a concurrent writer about to rename it.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import tempfile


def _host():
    """This host's name as one word of a file name (dots and slashes would blur where it ends)."""
    return re.sub(r'[^A-Za-z0-9_-]', '-', socket.gethostname() or 'localhost')


def temporary_prefix(path, pid=None):
    """The prefix of the temporary files written for path on this host by process pid (default: this one)."""
    return '.%s.%s.%d.' % (os.path.basename(path), _host(), os.getpid() if pid is None else pid)


def _process_exists(pid):
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno != errno.ESRCH   # EPERM: it exists, owned by someone else
    return True


def stale_temporaries(path):
    """The temporary files of path left in its folder by writers that no longer run (full paths, sorted)."""
    directory = os.path.dirname(os.path.abspath(path))
    pattern = re.compile(r'^\.%s\.%s\.(\d+)\.[a-z0-9_]{8}$' % (re.escape(os.path.basename(path)), re.escape(_host())))
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    stale = []
    for name in names:
        match = pattern.match(name)
        if match and int(match.group(1)) != os.getpid() and not _process_exists(int(match.group(1))):
            stale.append(os.path.join(directory, name))
    return sorted(stale)


def remove_stale_temporaries(path):
    """Remove what stale_temporaries(path) finds; one already gone is not an error."""
    for stale in stale_temporaries(path):
        try:
            os.unlink(stale)
        except FileNotFoundError:
            pass


def write_atomically(path, data, mode=0o600, dir_mode=0o700):
    """Replace path with data (bytes, or text written as UTF-8) in one rename, the file `mode` from its first byte.

    A missing parent folder is made with dir_mode. Temporaries of earlier writers of path that were killed are removed
    first; this writer's own temporary is removed if the write fails."""
    if isinstance(data, str):
        data = data.encode('utf-8')
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, dir_mode)
        os.chmod(directory, dir_mode)  # makedirs' mode passes through the umask
    remove_stale_temporaries(path)
    handle_fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=temporary_prefix(path))
    try:
        with os.fdopen(handle_fd, 'wb') as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)
        raise
