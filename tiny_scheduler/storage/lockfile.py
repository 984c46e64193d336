"""One owner per SQLite file, whatever name it is reached by: two exclusive `flock`s.

Ownership follows the file's identity, not the name it was given: a second scheduler given a
symbolic or a hard link to a database in use would otherwise take a lock of its own, write
the same file through another `-wal`, and hand out the same ids. So the process that has the
database open holds, for as long as it has it open:

- an exclusive `flock` on the database file itself (created empty when it is not there yet,
  which SQLite takes for a new database). Every name of the file, symbolic or hard, leads to
  this one lock; its holder's pid is found in `/proc/locks`.
- an exclusive `flock` on `<real path>.lock` beside it, named after the path with every
  symbolic link resolved. This file carries the holder's pid, for the refusal message, and
  the highest job id handed out from this path (`last_id`), which lets a scheduler started on
  a fresh or replaced database continue the ids instead of counting from job-1 again.

The kernel drops both locks when the holder dies, however it dies, so a crash never leaves a
stale lock behind. A second scheduler is refused with the holder's pid.

Our descriptor on the database is closed only by `release`, after the store has closed every
SQLite connection: closing any descriptor of a file drops the process's POSIX locks on it, so
closing ours while SQLite still had the file open would silently drop SQLite's own locks
(its documented "two descriptors on one file" pitfall). `flock` and SQLite's POSIX locks do
not otherwise meet: on Linux they are separate kinds.

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
from collections.abc import Callable

from ..domain.jobs import JOB_ID_PREFIX
from .base import StoreOpenError

SUFFIX = ".lock"
"""The lock file is the database's real path (symbolic links resolved) plus this."""

RETRY_SECS = 0.05
"""How often a scheduler waiting for the previous owner to let go tries again."""


class LockFile:
    """The lock on one database path, held from construction until `release`."""

    def __init__(self, db_path: str, wait_secs: float = 0.0) -> None:
        """Take the lock, waiting up to `wait_secs` for another holder to let go;
        StoreOpenError naming the holder's pid when it does not."""
        self.db_path = db_path
        real = os.path.realpath(db_path)
        self.path = real + SUFFIX
        deadline = time.monotonic() + wait_secs
        self._fd = self._acquire(self.path, os.O_RDWR, deadline, _pid_written)
        try:
            # Read-only: nothing of ours ever writes the database.
            self._db_fd = self._acquire(real, os.O_RDONLY, deadline, _pid_locking)
        except BaseException:
            os.close(self._fd)
            raise
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
        # The database's first: the store calls this only after closing its connections.
        for name in ("_db_fd", "_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)  # drops the flock
                setattr(self, name, -1)

    def _acquire(
        self, path: str, mode: int, deadline: float, holder_of: Callable[[int], int | None]
    ) -> int:
        """A descriptor of the file at `path` (opened with `mode`, created when missing)
        holding an exclusive flock on it, waiting until `deadline` for another holder, whose
        pid `holder_of` finds from a descriptor of the file, to let go."""
        while True:
            try:
                fd = os.open(path, mode | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise StoreOpenError(
                    f"cannot open job database {self.db_path!r}: cannot open {path!r}: "
                    f"{exc.strerror}"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = holder_of(fd) if exc.errno == errno.EWOULDBLOCK else None
                os.close(fd)
                if exc.errno != errno.EWOULDBLOCK:
                    raise StoreOpenError(
                        f"cannot open job database {self.db_path!r}: cannot lock "
                        f"{path!r}: {exc.strerror}"
                    ) from None
                if time.monotonic() >= deadline:
                    raise StoreOpenError(in_use(self.db_path, holder)) from None
                time.sleep(RETRY_SECS)
                continue
            # Removed or replaced between our open and our lock: a lock on a file that is no
            # longer at the path protects nothing. Take the one that is there now.
            try:
                current = _identity(os.stat(path))
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


def _pid_written(fd: int) -> int | None:
    """The pid a lock file's holder wrote into it."""
    return _read(fd).get("pid")


def _pid_locking(fd: int) -> int | None:
    """The pid of the process holding a flock on the file of `fd`, from the kernel's list of
    locks (Linux's `/proc/locks`: `N: FLOCK ADVISORY WRITE pid major:minor:inode ...`, the
    device numbers in hex); None where that list is not there or does not say."""
    stat = os.fstat(fd)
    wanted = (os.major(stat.st_dev), os.minor(stat.st_dev), stat.st_ino)
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            lines = locks.readlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        # A waiter's line has "->" after the number; only holders name the pid we want.
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            found = (int(major, 16), int(minor, 16), int(inode))
            pid = int(fields[4])
        except ValueError:
            continue
        if found == wanted and pid > 0:
            return pid
    return None


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
