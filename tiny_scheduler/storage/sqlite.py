"""The SQLite backend (the embedded default): one file, WAL, `synchronous=FULL`.

Owns the file's checks at start-up, and runs its migration (`schema.py`) in one transaction:
a file this scheduler must not touch (another program's database, a newer scheduler's, a
corrupt one, one another scheduler has open) is refused and left exactly as it was, and a row
that cannot be read is named. Writes come one group at a time (`writer.py`), a batch per
transaction, one statement per kind of change (`sql.py`). Output is read back by request
threads, each on a read-only connection of its own (WAL lets readers and the one writer pass
each other). A COMMIT whose flush of the log failed may be on disk all the same
(`_maybe_committed`): it is reported as `OutcomeUnknown`, never as a change that was not made.

Each transaction first makes sure that the files it writes are still the ones at their paths,
so nothing is acknowledged into a file that is gone: the database (not deleted or replaced
under the daemon), its lock file, its write-ahead log `<db>-wal` and the log's index
`<db>-shm`. The log matters as much as the database: a commit is durable once it is in the
log, and stays there until a checkpoint copies it into the database; a log deleted under the
daemon takes every commit since the last checkpoint with it when the process ends (the
connection still writes into the unlinked file, which looks like success). Once any of them
is lost, the store refuses every write and read (503, unhealthy) until a restart, and first
saves what the files it still has open hold (`_let_go`), from the one connection that has
them, before any other opens: it folds the log into the database file it has open (for a
deleted log or index, that file is the one at the path, which then holds every commit
acknowledged), and a database file deleted from its path is written back there, as long as
the path stays empty (`_write_back`); a file put in its place is never overwritten: the
daemon's copy is then saved beside it, and `/health` and the log name where.

The loss is noticed at once, not at the next write: the store watches its files
(`file_watch.FileWatch`: inotify on their directories, else a `stat` every 0.25 s) and has
the writer commit a probe when one of them changes (`watch_files`), which finds the loss and
saves. What is left is the moment between the deletion and the save (a few milliseconds): a
SIGKILL inside it still loses the commits since the last checkpoint. Closing it with a
checkpoint after every commit was measured at about three times the cost of a commit (2000
single-job writes in process, medians of six runs on a disk shared with other work: 0.2-8 ms
plain, 2-22 ms with `wal_checkpoint(PASSIVE)` after each), on the hottest path, against an
operator's mistake: not taken. Checking the files' identity is three `stat`s, lost in the
noise of the same measurement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..domain.jobs import Output, job_id_of
from . import rows, schema, sql
from .base import Batch, Loaded, OutboxEvent, OutcomeUnknown, StoreOpenError, judge_version
from .file_watch import FileWatch
from .lockfile import LockFile
from .readers import ReaderPool

log = logging.getLogger(__name__)


class _Statements(sql.Statements):
    """SQLite's statements: `?` and its two-argument `max`."""

    def __init__(self) -> None:
        super().__init__(mark="?", greatest="max")
        self.load_jobs = sql.select_packed_jobs("json_array")
        # The latest attempt's output of some jobs (a NULL output: it printed nothing).
        self.latest_outputs = (
            "SELECT j.seq, o.stdout, o.stderr FROM jobs AS j "
            "LEFT JOIN outputs AS o ON o.seq = j.seq AND o.attempt = j.retry_count "
            "WHERE j.seq IN ({marks}) ORDER BY j.seq"
        )


_READER_CACHE_KIB = 256
"""Page cache of each read connection, in KiB (SQLite's default is 2000)."""
_CHECK_CACHE_KIB = 64
"""Page cache of the start-up's quick check, in KiB."""
_READ_BATCH = 256
"""Jobs per query when reading a listing's outputs (each query is a short read of its own)."""


class FileLost(Exception):
    """The database file (or its lock file) is no longer the one at its path: deleted or
    replaced while the daemon had it open. Nothing more can be acknowledged into it."""


class SqliteStore(sql.SqlStore):
    """A `JobStore` in one SQLite file, held for as long as it is open (`lockfile.LockFile`)."""

    SQL = _Statements()

    def __init__(self, path: str, wait_secs: float = 0.0) -> None:
        """Open the file for this process alone, waiting up to `wait_secs` for another
        scheduler that has it open to let go."""
        self.location = path
        self._lock = LockFile(path, wait_secs)
        try:
            self._conn = _open(path)
            # Absolute, so that a change of working directory cannot make the check look at
            # another file; the file as SQLite opened it, to compare with the path later.
            self._path = os.path.abspath(path)
            self._identity = _identity(os.stat(self._path))
            # SQLite names the log after the path with symbolic links resolved; `_open` read
            # the file, which opened (or created) the log.
            self._wal = os.path.realpath(self._path) + "-wal"
            self._wal_identity = _identity(os.stat(self._wal))
            self._shm = os.path.realpath(self._path) + "-shm"
            self._shm_identity = _identity(os.stat(self._shm))
            self._let_go_done = False
            self._saved = ""  # what `_let_go` did with what the lost files held
            self._first_loss: str | None = None  # the loss as `_let_go` found it
            self._watch: FileWatch | None = None
            self._readers = _Readers(path, self._lost)
        except BaseException:
            self._lock.release()
            raise

    def load(self, compact: bool = False) -> Loaded:
        # The whole file is checked while the jobs are read: SQLite does the check without
        # the GIL, on another core, so a million-job start-up does not wait for it.
        checking = _QuickCheck(self._path, self.location)
        # Building a million objects would trigger the cycle collector hundreds of times over
        # objects that cannot form cycles; pause it for the load.
        collecting = gc.isenabled()
        gc.disable()
        try:
            loaded = rows.jobs_from_packed(self._conn.execute(self.SQL.load_jobs), compact)
        except Exception as exc:  # one bad row: name it, rather than a traceback
            unreadable = self._unreadable(exc)
            # A damaged page is named as what it is, not as the row it broke.
            raise checking.corruption() or unreadable from None
        finally:
            if collecting:
                gc.enable()
        corrupt = checking.corruption()
        if corrupt is not None:
            raise corrupt
        marks = dict(self._conn.execute("SELECT key, value FROM meta"))
        events = self._conn.execute("SELECT count(*) FROM outbox").fetchone()[0]
        schedules = [
            rows.schedule_from_row(row) for row in self._conn.execute(self.SQL.select_schedules)
        ]
        # The load filled SQLite's page cache with pages the writer will rarely touch again.
        self._conn.execute("PRAGMA shrink_memory")
        nodes = [sql.node_from_row(row) for row in self._conn.execute(self.SQL.select_nodes)]
        queues = [sql.queue_from_row(row) for row in self._conn.execute(self.SQL.select_queues)]
        users = [sql.user_from_row(row) for row in self._conn.execute(self.SQL.select_users)]
        tokens = [sql.token_from_row(row) for row in self._conn.execute(self.SQL.select_tokens)]
        audit = [sql.audit_from_row(row) for row in self._conn.execute(self.SQL.select_audit)]
        found = sql.loaded(loaded, schedules, marks, events, nodes, queues, users, tokens, audit)
        last_seq = found.last_seq
        if self._lock.last_seq > last_seq:
            log.warning(
                "job database %s knows ids up to %s, but ids up to %s were handed out from this "
                "path before (the file was deleted or replaced); new ids continue from there",
                self.location,
                job_id_of(last_seq),
                job_id_of(self._lock.last_seq),
            )
            found = dataclasses.replace(found, last_seq=self._lock.last_seq)
        return found

    def outbox(self, limit: int) -> list[OutboxEvent]:
        return self._outbox(self._conn, limit)

    def write(self, batch: Batch) -> None:
        newest = max((job.seq for job in batch.upserts), default=0)
        self._write(batch)
        if newest > self._lock.last_seq:
            self._lock.record(newest)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield conn
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if _maybe_committed(exc):
                    raise OutcomeUnknown(
                        f"job database {self.location}: committing failed, and the commit may "
                        f"still be on disk: {exc}"
                    ) from exc
                raise
        except Exception as exc:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    log.exception("rollback failed")
            if isinstance(exc, FileLost):
                self._let_go()
                raise FileLost(self._lost() or str(exc)) from None  # with what was saved
            raise

    def _guard(self, cursor: sqlite3.Connection) -> None:
        # Nothing is acknowledged into a file that is gone.
        lost = self._lost()
        if lost:
            raise FileLost(lost)

    def _delete(
        self, cursor: sqlite3.Connection, table: str, column: str, ids: Sequence[int]
    ) -> None:
        # SQLite binds no list: one execution per id, prepared once.
        cursor.executemany(f"DELETE FROM {table} WHERE {column} = ?", [(i,) for i in ids])

    def read_latest_outputs(self, seqs: Sequence[int]) -> Iterator[tuple[int, Output | None]]:
        with self._readers.connection() as conn:
            for first in range(0, len(seqs), _READ_BATCH):
                batch = seqs[first : first + _READ_BATCH]
                query = self.SQL.latest_outputs.format(marks=", ".join("?" * len(batch)))
                cursor = conn.execute(query, batch)
                try:
                    # Row by row: one job's output in memory at a time, however long the list.
                    for seq, out, err in cursor:
                        yield seq, Output(out, err) if out is not None else None
                finally:
                    cursor.close()  # also when the caller stops early: end the read

    def is_fault(self, error: BaseException) -> bool:
        # A value SQLite cannot bind (text that is not valid Unicode) raises something else,
        # and says nothing about the disk.
        return isinstance(error, (sqlite3.Error, FileLost, OSError, OutcomeUnknown))

    def watch_files(self, changed: Callable[[], None]) -> None:
        """From now on call `changed()` (on a thread of its own) as soon as one of the store's
        files may have left its path: the writer then commits a probe, whose check finds the
        loss and saves what can be saved (`_let_go`) before anything else happens."""
        paths = {self._path, os.path.realpath(self._path), self._wal, self._shm, self._lock.path}
        if self._watch is not None:
            self._watch.close()
        self._watch = FileWatch(sorted(paths), changed)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()  # first: SQLite removes the log at its close
        try:
            self._readers.close()
            self._conn.close()
        finally:
            # Only now: another scheduler may open the file as soon as the lock is free.
            self._lock.release()

    def _lost(self) -> str | None:
        """Why the file at the path (or its log, or the log's index) is no longer ours to
        write, or None; with what was saved of it once that is done."""
        # The loss as it was first found: the file written back is another file at the path.
        why = self._first_loss or self._why_lost()
        return None if why is None else why + self._saved

    def _why_lost(self) -> str | None:
        how = _gone(self._path, self._identity)
        if how:
            return (
                f"the database file {self.location} was {how} while in use; restart the scheduler"
            )
        for what, path, identity in (
            ("write-ahead log", self._wal, self._wal_identity),
            ("write-ahead log's index", self._shm, self._shm_identity),
        ):
            how = _gone(path, identity)
            if how:
                return (
                    f"database {self.location}: the {what} {path} was {how} while in use; "
                    "restart the scheduler"
                )
        lost = self._lock.lost()
        if lost:
            return f"database {self.location}: {lost} while in use; restart the scheduler"
        return None

    def _let_go(self) -> None:
        """Once a file is lost, save what this connection still holds, before anything else
        opens the path: fold the write-ahead log it has open (even when its name is gone) into
        the database file it has open (wherever that went), and empty the log; then, when
        that database file is no longer at the path, write it back there if the path is empty
        (`_write_back`). A deleted log's commits are thereby kept in the database. A moved
        database's log is found by the path's name, and SQLite leaves it behind at close; the
        next program to open the path would otherwise apply this file's changes to whatever
        file is there now."""
        if self._let_go_done:
            return
        self._let_go_done = True
        self._first_loss = self._why_lost()
        try:
            busy, frames, copied = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as exc:
            log.error("job database %s: cannot empty its write-ahead log: %s", self.location, exc)
            self._saved = "; its write-ahead log could not be saved into it"
            return
        if busy or frames != copied:
            log.error(
                "job database %s: only %d of %d frames of its write-ahead log were saved",
                self.location,
                copied,
                frames,
            )
        if _gone(self._path, self._identity):
            self._saved = self._write_back()
        else:
            self._saved = f"; everything acknowledged is saved in {self.location}"
        log.error("%s%s", self._first_loss, self._saved)

    def _write_back(self) -> str:
        """Copy the database file this connection has open (deleted or moved away from its
        path) to the path, but only while the path is empty: never over a file put there
        (a restored backup); then the copy stays beside it. What the refusal says of it."""
        folder = os.path.dirname(self._path)
        copy = f"{self._path}.saving-{os.getpid()}"
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(copy)
            target = sqlite3.connect(copy)
            try:
                self._conn.backup(target)  # reads the file this connection has open
            finally:
                target.close()
            _fsync(copy)
            try:
                os.link(copy, self._path)  # fails if anything is at the path by now
            except FileExistsError:
                kept = f"{self._path}.saved-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
                os.link(copy, kept)
                os.unlink(copy)
                _fsync(folder)
                return (
                    f"; another file is at {self.location} now: what this scheduler held is "
                    f"saved in {kept}"
                )
            os.unlink(copy)
            _fsync(folder)
        except (OSError, sqlite3.Error) as exc:
            return f"; what this scheduler held could not be written back: {exc}"
        return f"; everything acknowledged was written back to {self.location}"

    def _unreadable(self, error: Exception) -> StoreOpenError:
        """The first job that cannot be read, named with the reason (a second, slow pass that
        reads text undecoded), as the one line that stops start-up."""
        conn = self._conn
        conn.text_factory = bytes
        try:
            for row in conn.execute(self.SQL.select_jobs):
                reason = rows.problem(row)
                if reason is not None:
                    return StoreOpenError(
                        f"job database {self.location!r}: job {job_id_of(row[0])} cannot be "
                        f"read: {reason}"
                    )
        except sqlite3.Error as exc:
            error = exc
        finally:
            conn.text_factory = str
        return StoreOpenError(f"job database {self.location!r}: jobs cannot be read: {error}")


class _Readers:
    """Read-only connections for request threads (`readers.ReaderPool`), never the writer's
    (a read does not wait for a commit), and no read at all once the file is lost."""

    def __init__(self, path: str, lost: Callable[[], str | None]) -> None:
        # Read-only: a reader must never create a file that is not there.
        self._uri = Path(path).absolute().as_uri() + "?mode=ro"
        self._lost = lost
        self._pool: ReaderPool[sqlite3.Connection] = ReaderPool(self._open)

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._uri, uri=True, isolation_level=None, check_same_thread=False)
        # Output is read once per reply: caching its pages here only holds memory (the
        # operating system caches the file anyway).
        conn.execute(f"PRAGMA cache_size = -{_READER_CACHE_KIB}")
        return conn

    @contextlib.contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        # Once the file at the path is not the daemon's any more, no read: a new connection
        # would open whatever file now has the name, and an old one, the file that went, is
        # left to the operator's restart like the writes (a 503, the same every time).
        lost = self._lost()
        if lost is not None:
            raise FileLost(lost)
        with self._pool.connection() as conn:
            yield conn

    def close(self) -> None:
        self._pool.close()


def check(path: str, wait_secs: float = 0.0) -> None:
    """Open (creating or migrating) the database once and close it; StoreOpenError when it
    cannot be used. The daemon calls this before starting its worker, so a file that is not a
    database, one from a newer scheduler or one another scheduler has open stops start-up with
    one clear line. The lock is held only during the check (the worker takes it for good).

    Damaged pages are found by the worker's load (`PRAGMA quick_check`, `_QuickCheck`), run
    beside the reading of the jobs instead of before it: on a million jobs the check scans
    200 MB (0.2-0.5 s), which here would delay the whole start-up."""
    lock = LockFile(path, wait_secs)
    try:
        _open(path).close()
    finally:
        lock.release()


class _QuickCheck:
    """`PRAGMA quick_check` of the whole file (every page, table and index, the output and the
    outbox too, which the load never reads) on a read-only connection of its own, in a thread:
    SQLite runs it without holding the GIL, so it overlaps the load of the jobs."""

    def __init__(self, path: str, location: str) -> None:
        self._uri = Path(path).absolute().as_uri() + "?mode=ro"
        self._location = location
        self._found: StoreOpenError | None = None
        self._thread = threading.Thread(target=self._run, name="quick-check", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self._uri, uri=True, isolation_level=None)
            try:
                # It reads every page once: a cache would only leave the worker bigger (the
                # thread's memory stays with the process), a few MB at 100k jobs.
                conn.execute(f"PRAGMA cache_size = -{_CHECK_CACHE_KIB}")
                row = conn.execute("PRAGMA quick_check").fetchone()
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            self._found = self._corrupt(str(exc))
            return
        if row is None or row[0] != "ok":
            self._found = self._corrupt(row[0] if row else "no answer")

    def _corrupt(self, why: str) -> StoreOpenError:
        return StoreOpenError(f"job database {self._location!r} is corrupt: {why}")

    def corruption(self) -> StoreOpenError | None:
        """Once the check is over: what it found wrong with the file, or None."""
        self._thread.join()
        return self._found


def _open(path: str) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.DatabaseError as exc:
        raise StoreOpenError(f"cannot open job database {path!r}: {exc}") from exc
    try:
        # Look before writing anything: switching to WAL is written into the file's header,
        # and a file we refuse (another program's database, a newer scheduler's) must be left
        # exactly as it was.
        version = _version(conn, path)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        _migrate(conn, path, version)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreOpenError(f"cannot open job database {path!r}: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _version(conn: sqlite3.Connection, path: str) -> int:
    """The file's schema version (0 for a file without tables); StoreOpenError for a file
    this scheduler must not touch."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    return judge_version(
        tables,
        lambda: (conn.execute("SELECT version FROM schema_version").fetchone() or (0,))[0],
        schema.SCHEMA_VERSION,
        repr(path),
        f"{path!r} is a SQLite file but not a tiny-scheduler database",
    )


def _migrate(conn: sqlite3.Connection, path: str, version: int) -> None:
    """Bring the file to the schema (`schema.upgrade`) in one transaction: a migration that
    fails leaves it as it was. The lock file keeps other schedulers out meanwhile."""
    if version == schema.SCHEMA_VERSION and not schema.missing_columns(conn, schema.SQLITE):
        return  # the usual start: nothing is written
    conn.execute("BEGIN IMMEDIATE")
    try:
        schema.upgrade(conn, schema.SQLITE, version, path)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _maybe_committed(error: sqlite3.Error) -> bool:
    """Whether a failed COMMIT may have taken effect all the same: when the flush of the log
    failed. The commit's frames were written whole into the log by then, and the disk may
    still have them (a failed fsync does not say the data is not there), in which case the
    next start-up's recovery applies them. Any other failure (a full disk, a file system
    turned read-only, a write refused, a lock) came before the commit frame was written, and
    recovery ignores frames without one: nothing was changed."""
    code = getattr(error, "sqlite_errorcode", None)
    return code in (sqlite3.SQLITE_IOERR_FSYNC, sqlite3.SQLITE_IOERR_DIR_FSYNC)


def _gone(path: str, identity: tuple[int, int]) -> str | None:
    """How the file with `identity` left `path` ("deleted", "replaced by another file"), or
    None while it is still there."""
    try:
        now = _identity(os.stat(path))
    except FileNotFoundError:
        return "deleted"
    return None if now == identity else "replaced by another file"


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino


def _fsync(path: str) -> None:
    """Flush a file, or a directory's entries, to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
