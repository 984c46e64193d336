"""One owner per SQLite file: an exclusive `flock` on a lock file beside the database.

`<db>.lock` is held by the process that has the database open, for as long as it has it
open; a second scheduler on the same path is refused with the holder's pid (read from the
file). The kernel drops the lock when the holder dies, however it dies, so a crash never
leaves a stale lock behind.

Why a file of its own and not a `flock` on the database itself: the lock file also carries
the highest job id handed out from this path (`last_id`), which lets a scheduler started on a
fresh or replaced database continue the ids instead of counting from job-1 again; and no
descriptor of ours is ever opened on the database, whose closing would drop SQLite's own
POSIX locks on it (SQLite's documented "two descriptors on one file" pitfall).

`flock` locks belong to an open file description, not a process: gunicorn's master only
checks and lets go, and the worker takes the lock itself, so a worker that gunicorn starts
again after the old one died never finds its own master in the way. Nothing here writes to
the database.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time

from ..jobs import JOB_ID_PREFIX
from .base import StoreOpenError

SUFFIX = ".lock"
"""The lock file is the database's path plus this."""

RETRY_SECS = 0.05
"""How often a scheduler waiting for the previous owner to let go tries again."""


class LockFile:
    """The lock on one database path, held from construction until `release`."""

    def __init__(self, db_path: str, wait_secs: float = 0.0) -> None:
        """Take the lock, waiting up to `wait_secs` for another holder to let go;
        StoreOpenError naming the holder's pid when it does not."""
        self.db_path = db_path
        self.path = db_path + SUFFIX
        self._fd = self._acquire(wait_secs)
        self._identity = _identity(os.fstat(self._fd))
        self.last_seq = _read(self._fd).get("last_id", 0)
        """The highest id recorded as handed out from this path (0 when none is)."""
        self._length = os.fstat(self._fd).st_size
        self.record(self.last_seq)

    def record(self, last_seq: int) -> None:
        """Note that ids up to `last_seq` have been handed out. Best effort, and not fsynced:
        the database itself has the mark durably; this copy only has to outlive the database
        file being deleted or replaced, and the page cache outlives a crash of this process."""
        content = f"pid {os.getpid()}\nlast_id {JOB_ID_PREFIX}{last_seq}\n".encode()
        try:
            os.pwrite(self._fd, content, 0)
            if len(content) < self._length:  # only when the pid got shorter
                os.ftruncate(self._fd, len(content))
        except OSError:
            return  # a full or failing disk: the next write to the database says so
        self._length = len(content)
        self.last_seq = last_seq

    def lost(self) -> str | None:
        """Why the lock no longer protects the database (its file was removed or replaced,
        so another scheduler could take a new one), or None while it does."""
        try:
            now = _identity(os.stat(self.path))
        except FileNotFoundError:
            return f"its lock file {self.path} was removed"
        if now != self._identity:
            return f"its lock file {self.path} was replaced"
        return None

    def release(self) -> None:
        # The file stays: removing it would let a scheduler waiting on the old file and one
        # creating a new file both believe they hold the lock.
        if self._fd >= 0:
            os.close(self._fd)  # drops the flock
            self._fd = -1

    def _acquire(self, wait_secs: float) -> int:
        deadline = time.monotonic() + wait_secs
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise StoreOpenError(
                    f"cannot open job database {self.db_path!r}: cannot open its lock file "
                    f"{self.path!r}: {exc.strerror}"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read(fd).get("pid") if exc.errno == errno.EWOULDBLOCK else None
                os.close(fd)
                if exc.errno != errno.EWOULDBLOCK:
                    raise StoreOpenError(
                        f"cannot open job database {self.db_path!r}: cannot lock "
                        f"{self.path!r}: {exc.strerror}"
                    ) from None
                if time.monotonic() >= deadline:
                    raise StoreOpenError(in_use(self.db_path, holder)) from None
                time.sleep(RETRY_SECS)
                continue
            # Removed or replaced between our open and our lock: a lock on a file that is no
            # longer at the path protects nothing. Take the one that is there now.
            try:
                current = _identity(os.stat(self.path))
            except FileNotFoundError:
                current = None
            if current == _identity(os.fstat(fd)):
                return fd
            os.close(fd)


def in_use(db_path: str, pid: int | None) -> str:
    """The message for a database another scheduler holds."""
    holder = f" (pid {pid})" if pid else ""
    return f"database {db_path} is in use by another scheduler{holder}"


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino


def _read(fd: int) -> dict[str, int]:
    """The numbers the file holds (`pid N`, `last_id job-N`); what does not parse is left out:
    the file is only a hint, the lock itself is the truth."""
    try:
        text = os.pread(fd, 4096, 0).decode("ascii", "replace")
    except OSError:
        return {}
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        value = value.strip().removeprefix(JOB_ID_PREFIX)
        if key in ("pid", "last_id") and value.isdigit():
            found[key] = int(value)
    return found
