"""Noticing at once that a file was deleted, moved or replaced: an inotify watch on the
directories that hold it, with a `stat` check every `STAT_SECS` where inotify cannot be had.

The SQLite store's files (the database, its `-wal` and `-shm`, the lock file) are only safe
while they are the ones at their paths. A `-wal` deleted under an idle daemon held every commit
since the last checkpoint in a file nobody could open again, and a SIGKILL within the next two
seconds (before the idle probe noticed) lost them all. What the daemon still holds open can be
saved, but only if it is noticed before the process ends: so the store is told at once,
from a thread of its own, and saves and refuses there (`sqlite.SqliteStore`).

inotify is Linux's, reached through the C library (no package): one instance per watch, one
watch per directory, events for the watched names only. Where it is missing or its limits are
reached (`fs.inotify.max_user_instances`), the thread looks at the files every `STAT_SECS`.

Tests: `tests/test_deleted_files.py`.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import struct
import threading
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

STAT_SECS = 0.25
"""Seconds between two looks at the files when there is no inotify."""

# From <sys/inotify.h>: what happens to a name in a watched directory, and to the directory.
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_MASK = IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then `len` bytes of name


def _inotify() -> tuple[int, Callable[[int, bytes, int], int]] | None:
    """A new inotify instance and the C library's add_watch; None where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        init, add = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError):
        return None
    add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
    fd = init(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        log.info(  # not a fault: the fallback does the job, a little later
            "no inotify watch (%s): deleted database files are looked for every %.2f s",
            os.strerror(ctypes.get_errno()),
            STAT_SECS,
        )
        return None
    return fd, add


class FileWatch:
    """Calls `changed()` (on its own thread) whenever one of `paths` may have been deleted,
    moved or replaced: at once through inotify, else within STAT_SECS by `stat`."""

    def __init__(self, paths: Iterable[str], changed: Callable[[], None]) -> None:
        self._paths = [os.path.abspath(path) for path in paths]
        self._changed = changed
        self._names: dict[int, set[bytes]] = {}  # watch descriptor -> names in its directory
        self._stop_read, self._stop_write = os.pipe()
        self._closed = False
        self._fd = -1
        made = _inotify()
        if made is not None:
            self._fd, add = made
            folders: dict[str, set[bytes]] = {}
            for path in self._paths:
                folders.setdefault(os.path.dirname(path), set()).add(
                    os.fsencode(os.path.basename(path))
                )
            for folder, names in folders.items():
                wd = add(self._fd, os.fsencode(folder), _MASK)
                if wd < 0:
                    log.info(
                        "no inotify watch on %s (%s): looking every %.2f s instead",
                        folder,
                        os.strerror(ctypes.get_errno()),
                        STAT_SECS,
                    )
                    os.close(self._fd)
                    self._fd = -1
                    self._names.clear()
                    break
                self._names[wd] = names
        self._identities = {path: _identity(path) for path in self._paths}
        self._thread = threading.Thread(target=self._run, name="file-watch", daemon=True)
        self._thread.start()

    @property
    def inotify(self) -> bool:
        """Whether the watch is inotify's (else `stat` every STAT_SECS)."""
        return self._fd >= 0

    def close(self) -> None:
        """Stop watching (once: a descriptor closed twice could be another file's by then)."""
        if self._closed:
            return
        self._closed = True
        os.write(self._stop_write, b"x")
        self._thread.join(timeout=5)
        for fd in (self._stop_read, self._stop_write, self._fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _run(self) -> None:
        watched = [self._stop_read] + ([self._fd] if self._fd >= 0 else [])
        timeout = None if self._fd >= 0 else STAT_SECS
        while True:
            ready, _, _ = select.select(watched, [], [], timeout)
            if self._stop_read in ready:
                return
            seen = self._read_events() if self._fd in ready else self._stat_changed()
            if seen:
                try:
                    self._changed()
                except Exception:  # the watch must outlive one bad look
                    log.exception("file watch: the store's look at its files failed")

    def _read_events(self) -> bool:
        """Whether an event named one of the files (or hit a watched directory itself)."""
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return False
        found = False
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
            offset += _EVENT.size + length
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF) or name in self._names.get(wd, ()):
                found = True
        return found

    def _stat_changed(self) -> bool:
        now = {path: _identity(path) for path in self._paths}
        changed = now != self._identities
        self._identities = now
        return changed


def _identity(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino
