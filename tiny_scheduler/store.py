"""The SQLite store: schema, migrations, loading at start-up, and the one writer thread.

Durability rule: `save()` and `delete()` return only after the change is committed with
`synchronous=FULL` in WAL mode, and raise `StoreError` when it could not be. Callers apply a
change to memory only after it is on disk, so memory never runs ahead of the file.

All writes go through one writer thread that commits whatever has queued up since its last
commit in one transaction (group commit): eight requests arriving together cost one fsync,
not eight. Readers never touch the database; the job table serves them from memory.
"""

from __future__ import annotations

import collections
import gc
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from sys import intern

import orjson

from .errors import StoreError
from .jobs import Attempt, Job

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

_COLUMNS = (
    "seq",
    "node_id",
    "command",
    "created_at",
    "instance_id",
    "deploy_url",
    "job_type",
    "port",
    "env_vars",
    "timeout_secs",
    "status",
    "retry_count",
    "exit_code",
    "stdout",
    "stderr",
    "running_at",
    "finished_at",
    "attempts",
    "dedupe_key",
)

_SCHEMA_V1 = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE jobs (
    seq          INTEGER PRIMARY KEY,  -- N of job-N
    node_id      TEXT NOT NULL,
    command      TEXT NOT NULL,
    created_at   INTEGER NOT NULL,     -- microseconds since the epoch, UTC
    instance_id  TEXT NOT NULL,
    deploy_url   TEXT NOT NULL,
    job_type     TEXT NOT NULL,
    port         INTEGER NOT NULL,
    env_vars     TEXT,                 -- JSON object, NULL when empty
    timeout_secs INTEGER NOT NULL,
    status       TEXT NOT NULL,
    retry_count  INTEGER NOT NULL,
    exit_code    INTEGER,
    stdout       TEXT NOT NULL,
    stderr       TEXT NOT NULL,
    running_at   INTEGER,
    finished_at  INTEGER,
    attempts     TEXT,                 -- JSON array of earlier attempts, NULL when none
    dedupe_key   TEXT UNIQUE           -- Idempotency-Key or SQS message that created the job
);
"""

# Each entry upgrades a file from version N-1 to N. A new schema version appends one.
_MIGRATIONS: dict[int, str] = {1: _SCHEMA_V1}

_UPSERT = "INSERT INTO jobs ({cols}) VALUES ({marks}) ON CONFLICT(seq) DO UPDATE SET {sets}".format(
    cols=", ".join(_COLUMNS),
    marks=", ".join("?" for _ in _COLUMNS),
    sets=", ".join(f"{c} = excluded.{c}" for c in _COLUMNS[1:]),
)
_HIGH_WATER = (
    "INSERT INTO meta (key, value) VALUES ('last_seq', ?) "
    "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)"
)
_PROBE = (
    "INSERT INTO meta (key, value) VALUES ('probe', ?) "
    "ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)


class StoreOpenError(RuntimeError):
    """The database cannot be used: corrupt, not a database, or from a newer scheduler."""


class _Ticket:
    """One caller's writes (rows to upsert, ids to delete), and the writer thread's answer."""

    __slots__ = ("deletes", "done", "error", "probe", "upserts")

    def __init__(
        self, upserts: list[tuple[object, ...]], deletes: list[tuple[int]], probe: bool = False
    ) -> None:
        self.upserts = upserts
        self.deletes = deletes
        self.probe = probe
        self.done = threading.Event()
        self.error: BaseException | None = None


class Store:
    """A SQLite file holding every job, written by one group-committing thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn = _open(path)
        self._queue: collections.deque[_Ticket] = collections.deque()
        self._wakeup = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self.healthy = True
        self.last_error: str | None = None
        self.commit_observers: list[Callable[[float, int], None]] = []

    # --- reading, at start-up only ------------------------------------------------------

    def load(self) -> tuple[list[Job], int]:
        """Every job in id order, and the highest id ever handed out (0 for a new file)."""
        rows = self._conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs ORDER BY seq")
        # Building a million objects would trigger the cycle collector hundreds of times over
        # objects that cannot form cycles; pause it for the load.
        collecting = gc.isenabled()
        gc.disable()
        try:
            loaded = [_job_from_row(row) for row in rows]
        finally:
            if collecting:
                gc.enable()
        found = self._conn.execute("SELECT value FROM meta WHERE key = 'last_seq'").fetchone()
        # The load filled SQLite's page cache with pages the writer will rarely touch again.
        self._conn.execute("PRAGMA shrink_memory")
        last_seq = max(found[0] if found else 0, loaded[-1].seq if loaded else 0)
        return loaded, last_seq

    # --- writing ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._write_loop, name="store-writer", daemon=True)
        self._thread.start()

    def save(self, *changed: Job) -> None:
        """Insert or replace these jobs; returns once committed, else raises StoreError."""
        self._submit(_Ticket([_row_from_job(job) for job in changed], []))

    def delete(self, seqs: Iterable[int]) -> None:
        """Remove these jobs; the id high-water mark stays, so ids are never reused."""
        self._submit(_Ticket([], [(seq,) for seq in seqs]))

    def probe(self) -> bool:
        """Try a tiny write, to find out whether a store that failed can write again."""
        try:
            self._submit(_Ticket([], [], probe=True))
        except StoreError:
            return False
        return True

    def close(self) -> None:
        """Commit what is queued, stop the writer and close the file."""
        with self._wakeup:
            self._closing = True
            self._wakeup.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._conn.close()

    def _submit(self, ticket: _Ticket) -> None:
        with self._wakeup:
            if self._closing:
                raise StoreError("scheduler is shutting down; nothing was changed")
            self._queue.append(ticket)
            self._wakeup.notify()
        ticket.done.wait()
        if ticket.error is not None:
            raise StoreError() from ticket.error

    def _write_loop(self) -> None:
        while True:
            with self._wakeup:
                while not self._queue and not self._closing:
                    self._wakeup.wait()
                if not self._queue:
                    return
                batch = list(self._queue)
                self._queue.clear()
            try:
                self._commit(batch)
            except Exception:  # every write waits on this thread: it must never die
                log.exception("job store writer: unexpected error")

    def _commit(self, batch: list[_Ticket]) -> None:
        started = time.perf_counter()
        try:
            self._write(batch)
            self._judge_health(batch)
            elapsed = time.perf_counter() - started
            for observe in self.commit_observers:
                observe(elapsed, len(batch))
        finally:
            for ticket in batch:
                ticket.done.set()

    def _write(self, batch: list[_Ticket]) -> None:
        """Commit the batch, recording on each ticket whether its change made it. Not only
        sqlite3.Error counts: a value SQLite cannot bind (text that is not valid Unicode)
        raises something else, and must fail its own change, nothing more."""
        try:
            self._transaction(batch)
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
                return
            # One bad change must not sink its neighbours: give each its own transaction.
            for ticket in batch:
                try:
                    self._transaction([ticket])
                except Exception as single:
                    ticket.error = single

    def _judge_health(self, batch: list[_Ticket]) -> None:
        """Only the database's own errors say that the store cannot write; a change it could
        not take says nothing about the disk, and leaves the verdict as it was."""
        failures = [t.error for t in batch if isinstance(t.error, sqlite3.Error)]
        if failures:
            self._note_health(failures[-1])
        elif any(ticket.error is None for ticket in batch):
            self._note_health(None)

    def _transaction(self, batch: list[_Ticket]) -> None:
        """All the batch's writes in one transaction, one statement per kind: the writer
        gives up the GIL at every statement and must win it back from the request threads,
        so fewer statements mean a shorter commit under load."""
        upserts = [row for ticket in batch for row in ticket.upserts]
        deletes = [seq for ticket in batch for seq in ticket.deletes]
        high = max((row[0] for row in upserts), default=0)
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            if upserts:
                conn.executemany(_UPSERT, upserts)
            if deletes:
                conn.executemany("DELETE FROM jobs WHERE seq = ?", deletes)
            if high:
                conn.execute(_HIGH_WATER, (high,))
            if any(ticket.probe for ticket in batch):
                # A fresh value each time: SQLite skips writing a row that does not change.
                conn.execute(_PROBE, (time.time_ns(),))
            conn.execute("COMMIT")
        except Exception:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    log.exception("rollback failed")
            raise

    def _note_health(self, error: BaseException | None) -> None:
        if error is None:
            if not self.healthy:
                log.warning("job store writable again")
            self.healthy, self.last_error = True, None
        else:
            if self.healthy:
                log.error("job store write failed: %s", error)
            self.healthy, self.last_error = False, str(error)


# --- opening and migrating --------------------------------------------------------------------


def check(path: str) -> None:
    """Open (creating or migrating) the database once and close it; StoreOpenError when it
    cannot be used. The daemon calls this before starting its worker, so a corrupt file or
    one from a newer scheduler stops start-up with one clear line."""
    conn = _open(path)
    try:
        row = conn.execute("PRAGMA quick_check").fetchone()
    except sqlite3.DatabaseError as exc:
        raise StoreOpenError(f"job database {path!r} is corrupt: {exc}") from exc
    finally:
        conn.close()
    if row is None or row[0] != "ok":
        raise StoreOpenError(f"job database {path!r} is corrupt: {row[0] if row else 'no answer'}")


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
    if "schema_version" in tables:
        row = conn.execute("SELECT version FROM schema_version").fetchone()
        version = row[0] if row else 0
    elif tables:
        raise StoreOpenError(f"{path!r} is a SQLite file but not a tiny-scheduler database")
    else:
        version = 0
    if version > SCHEMA_VERSION:
        raise StoreOpenError(
            f"job database {path!r} has schema version {version}, newer than the {SCHEMA_VERSION} "
            "this tiny-scheduler understands; run a newer tiny-scheduler"
        )
    return version


def _migrate(conn: sqlite3.Connection, path: str, version: int) -> None:
    if version == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        for step in range(version + 1, SCHEMA_VERSION + 1):
            log.info("migrating job database %s to schema version %d", path, step)
            for statement in _MIGRATIONS[step].split(";"):
                if statement.strip():
                    conn.execute(statement)
        conn.execute("DELETE FROM schema_version")
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


# --- rows -------------------------------------------------------------------------------------


def _row_from_job(job: Job) -> tuple[object, ...]:
    attempts = None
    if job.attempts:
        attempts = orjson.dumps(
            [
                [a.node_id, a.exit_code, a.stdout, a.stderr, a.running_at, a.finished_at]
                for a in job.attempts
            ]
        ).decode()
    return (
        job.seq,
        job.node_id,
        job.command,
        job.created_at,
        job.instance_id,
        job.deploy_url,
        job.job_type,
        job.port,
        orjson.dumps(job.env_vars).decode() if job.env_vars else None,
        job.timeout_secs,
        job.status,
        job.retry_count,
        job.exit_code,
        job.stdout,
        job.stderr,
        job.running_at,
        job.finished_at,
        attempts,
        job.dedupe_key,
    )


def _job_from_row(row: tuple) -> Job:
    (seq, node_id, command, created_at, instance_id, deploy_url, job_type, port, env_vars,
     timeout_secs, status, retry_count, exit_code, stdout, stderr, running_at, finished_at,
     attempts, dedupe_key) = row  # fmt: skip
    # Interned: a million jobs share a handful of node ids, types and statuses, and each
    # row would otherwise bring its own copy of them into memory.
    return Job(
        seq,
        intern(node_id),
        command,
        created_at,
        intern(instance_id),
        deploy_url,
        intern(job_type),
        port,
        orjson.loads(env_vars) if env_vars else None,
        timeout_secs,
        intern(status),
        retry_count,
        exit_code,
        stdout,
        stderr,
        running_at,
        finished_at,
        tuple(Attempt(*a) for a in orjson.loads(attempts)) if attempts else (),
        dedupe_key,
    )
