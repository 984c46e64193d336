"""The SQLite backend (the embedded default): one file, WAL, `synchronous=FULL`.

Owns the schema, its migrations and the file's checks at start-up: a file this scheduler must
not touch (another program's database, a newer scheduler's, a corrupt one, one another
scheduler has open) is refused and left exactly as it was, and a row that cannot be read is
named. Writes come one group at a time (`writer.py`), a batch per transaction, one
statement per kind of change. Each transaction first makes sure the file it writes is still the
one at the path (not deleted or replaced under the daemon), so nothing is acknowledged into a
file that is gone. Output is read back by request threads, each on a read-only connection of
its own (WAL lets readers and the one writer pass each other).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..jobs import Output, job_id_of
from ..queues import QueueSettings
from . import rows
from .base import Batch, Loaded, OutboxEvent, StoreOpenError, judge_version
from .lockfile import LockFile
from .readers import ReaderPool

log = logging.getLogger(__name__)

SCHEMA_VERSION = 7

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

# Version 2 (placement and lifecycle, issue 13): there is no `cancelled` status any more. A
# cancelled job is `failed` with reason `cancelled`, exit -1 and stderr `job cancelled`, and
# every final failure says why (`reason`). Rows stored as `failed` by version 1 were final
# failures; their reason is read from the fixed texts the scheduler wrote for its own
# failures. A timed-out job of version 1 holds no slot: that scheduler never kept one.
_SCHEMA_V2 = """
ALTER TABLE jobs ADD COLUMN reason TEXT;
ALTER TABLE jobs ADD COLUMN holds_slot INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN moved_from TEXT NOT NULL DEFAULT '';
UPDATE jobs SET reason = CASE
        WHEN exit_code = -1 AND stderr = 'job timed out' THEN 'timeout'
        WHEN exit_code = -1 AND stderr = 'node lost' THEN 'node_lost'
        ELSE 'exit'
    END
    WHERE status = 'failed';
UPDATE jobs SET status = 'failed', reason = 'cancelled', exit_code = -1, stderr = 'job cancelled'
    WHERE status = 'cancelled';
"""

# The SNS outbox: events stored with the change that caused them, deleted once delivered.
_SCHEMA_V3 = """
CREATE TABLE outbox (
    id      INTEGER PRIMARY KEY,  -- delivery order: above every event still waiting
    seq     INTEGER NOT NULL,     -- N of the job-N it is about
    message TEXT NOT NULL         -- exactly what is published
);
"""

# Version 4: a job's output moves out of the jobs table into rows of its own, one per attempt
# that printed something, so that loading the jobs at start-up never reads it: the current
# attempt's from the stdout and stderr columns (which go), the earlier ones' from the attempts
# JSON (objects, or lists in the Attempt declaration's order in the oldest files), which keeps
# the rest of each attempt.
_OUTPUTS_V4 = """
CREATE TABLE outputs (
    seq     INTEGER NOT NULL,      -- the job (job-N)
    attempt INTEGER NOT NULL,      -- 0 for the first attempt, the job's retry_count for its last
    stdout  TEXT NOT NULL,
    stderr  TEXT NOT NULL,
    PRIMARY KEY (seq, attempt)
);
INSERT INTO outputs (seq, attempt, stdout, stderr)
    SELECT seq, retry_count, stdout, stderr FROM jobs WHERE stdout != '' OR stderr != '';
INSERT INTO outputs (seq, attempt, stdout, stderr)
    SELECT seq, attempt, coalesce(stdout, ''), coalesce(stderr, '') FROM (
        SELECT jobs.seq AS seq, item.key AS attempt,
            json_extract(item.value, iif(item.type = 'object', '$.stdout', '$[2]')) AS stdout,
            json_extract(item.value, iif(item.type = 'object', '$.stderr', '$[3]')) AS stderr
        FROM jobs, json_each(jobs.attempts) AS item
    ) WHERE coalesce(stdout, '') != '' OR coalesce(stderr, '') != '';
UPDATE jobs SET attempts = (
    SELECT json_group_array(json_object(
        'node_id', json_extract(item.value, iif(item.type = 'object', '$.node_id', '$[0]')),
        'exit_code', json_extract(item.value, iif(item.type = 'object', '$.exit_code', '$[1]')),
        'running_at', json_extract(item.value, iif(item.type = 'object', '$.running_at', '$[4]')),
        'finished_at', json_extract(item.value, iif(item.type = 'object', '$.finished_at', '$[5]'))
    )) FROM json_each(jobs.attempts) AS item
) WHERE attempts IS NOT NULL;
ALTER TABLE jobs DROP COLUMN stdout;
ALTER TABLE jobs DROP COLUMN stderr
"""

# Version 5: periodic and delayed jobs (issue 14). A job's not_before and the schedule that
# created it; the schedules. A fire's job carries the dedupe key `sched:<id>:<fire time>`, so
# the jobs table's UNIQUE dedupe_key is the record of fires: one job per schedule and fire
# time, whatever crashed between the fire and the schedule's own update.
_SCHEMA_V5 = """
ALTER TABLE jobs ADD COLUMN not_before INTEGER;
ALTER TABLE jobs ADD COLUMN schedule_id TEXT NOT NULL DEFAULT '';
CREATE TABLE schedules (
    seq          INTEGER PRIMARY KEY,  -- N of sched-N
    name         TEXT NOT NULL UNIQUE,
    cron         TEXT NOT NULL,
    timezone     TEXT NOT NULL,
    job          TEXT NOT NULL,        -- JSON object: the job request each fire submits
    overlap      TEXT NOT NULL,
    catch_up     INTEGER NOT NULL,
    paused       INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    next_run_at  INTEGER,              -- the oldest fire time not yet handled
    last_run_at  INTEGER,
    last_job_seq INTEGER
);
"""

# Version 6: queues' settings (issue 25), one row per queue an operator has set.
_SCHEMA_V6 = """
CREATE TABLE queues (
    name        TEXT PRIMARY KEY,
    max_running INTEGER,           -- NULL: no limit
    paused      INTEGER NOT NULL   -- 0 or 1
);
"""

# Version 7: workflows (issue 25). A job's dependencies (JSON array of job numbers, NULL when
# none), how they must end, its priority and its queue; rows written before read as the
# defaults.
_SCHEMA_V7 = """
ALTER TABLE jobs ADD COLUMN depends_on TEXT;
ALTER TABLE jobs ADD COLUMN dependency TEXT NOT NULL DEFAULT 'ok';
ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 50;
ALTER TABLE jobs ADD COLUMN queue TEXT NOT NULL DEFAULT 'default'
"""

MIGRATIONS: dict[int, str] = {
    1: _SCHEMA_V1,
    2: _SCHEMA_V2,
    3: _SCHEMA_V3,
    4: _OUTPUTS_V4,
    5: _SCHEMA_V5,
    6: _SCHEMA_V6,
    7: _SCHEMA_V7,
}
"""Each entry upgrades a file to version N from the one before it. A new schema version adds
one; a file is taken through every entry above its version, in order."""

_SELECT = f"SELECT {', '.join(rows.COLUMNS)} FROM jobs ORDER BY seq"
_UPSERT = "INSERT INTO jobs ({cols}) VALUES ({marks}) ON CONFLICT(seq) DO UPDATE SET {sets}".format(
    cols=", ".join(rows.COLUMNS),
    marks=", ".join("?" for _ in rows.COLUMNS),
    sets=", ".join(f"{c} = excluded.{c}" for c in rows.COLUMNS if c != "seq"),
)
_HIGH_WATER = (
    "INSERT INTO meta (key, value) VALUES (?, ?) "
    "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)"
)
_SELECT_SCHEDULES = f"SELECT {', '.join(rows.SCHEDULE_COLUMNS)} FROM schedules ORDER BY seq"
_UPSERT_SCHEDULE = (
    "INSERT INTO schedules ({cols}) VALUES ({marks}) ON CONFLICT(seq) DO UPDATE SET {sets}".format(
        cols=", ".join(rows.SCHEDULE_COLUMNS),
        marks=", ".join("?" for _ in rows.SCHEDULE_COLUMNS),
        sets=", ".join(f"{c} = excluded.{c}" for c in rows.SCHEDULE_COLUMNS if c != "seq"),
    )
)
_UPSERT_QUEUE = (
    "INSERT INTO queues (name, max_running, paused) VALUES (?, ?, ?) "
    "ON CONFLICT(name) DO UPDATE SET max_running = excluded.max_running, paused = excluded.paused"
)
_PROBE = (
    "INSERT INTO meta (key, value) VALUES ('probe', ?) "
    "ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)
_SAVE_OUTPUT = "INSERT OR REPLACE INTO outputs (seq, attempt, stdout, stderr) VALUES (?, ?, ?, ?)"
# One job's every output; no row at all when the job is not stored (deleted meanwhile).
_OUTPUTS_OF = (
    "SELECT o.attempt, o.stdout, o.stderr FROM jobs AS j "
    "LEFT JOIN outputs AS o ON o.seq = j.seq WHERE j.seq = ?"
)
# The latest attempt's output of some jobs (a NULL output: it printed nothing).
_LATEST_OUTPUTS = (
    "SELECT j.seq, o.stdout, o.stderr FROM jobs AS j "
    "LEFT JOIN outputs AS o ON o.seq = j.seq AND o.attempt = j.retry_count "
    "WHERE j.seq IN ({marks}) ORDER BY j.seq"
)
_READER_CACHE_KIB = 256
"""Page cache of each read connection, in KiB (SQLite's default is 2000)."""
_READ_BATCH = 256
"""Jobs per query when reading a listing's outputs (each query is a short read of its own)."""


class FileLost(Exception):
    """The database file (or its lock file) is no longer the one at its path: deleted or
    replaced while the daemon had it open. Nothing more can be acknowledged into it."""


class SqliteStore:
    """A `JobStore` in one SQLite file, held for as long as it is open (`lockfile.LockFile`)."""

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
            self._let_go_done = False
            self._readers = _Readers(path, self._lost)
        except BaseException:
            self._lock.release()
            raise

    def load(self) -> Loaded:
        # Building a million objects would trigger the cycle collector hundreds of times over
        # objects that cannot form cycles; pause it for the load.
        collecting = gc.isenabled()
        gc.disable()
        try:
            loaded = [rows.from_row(row) for row in self._conn.execute(_SELECT)]
        except Exception as exc:  # one bad row: name it, rather than a traceback
            raise self._unreadable(exc) from None
        finally:
            if collecting:
                gc.enable()
        marks = dict(self._conn.execute("SELECT key, value FROM meta"))
        events = self._conn.execute("SELECT count(*) FROM outbox").fetchone()[0]
        schedules = [rows.schedule_from_row(row) for row in self._conn.execute(_SELECT_SCHEDULES)]
        queues = [
            QueueSettings(name, max_running, bool(paused))
            for name, max_running, paused in self._conn.execute(
                "SELECT name, max_running, paused FROM queues ORDER BY name"
            )
        ]
        # The load filled SQLite's page cache with pages the writer will rarely touch again.
        self._conn.execute("PRAGMA shrink_memory")
        last_seq = max(marks.get("last_seq", 0), loaded[-1].seq if loaded else 0)
        if self._lock.last_seq > last_seq:
            log.warning(
                "job database %s knows ids up to %s, but ids up to %s were handed out from this "
                "path before (the file was deleted or replaced); new ids continue from there",
                self.location,
                job_id_of(last_seq),
                job_id_of(self._lock.last_seq),
            )
            last_seq = self._lock.last_seq
        last_schedule_seq = max(
            marks.get("last_schedule_seq", 0), schedules[-1].seq if schedules else 0
        )
        return Loaded(loaded, last_seq, events, schedules, last_schedule_seq, queues=queues)

    def outbox(self, limit: int) -> list[OutboxEvent]:
        found = self._conn.execute(
            "SELECT id, seq, message FROM outbox ORDER BY id LIMIT ?", (limit,)
        )
        return [OutboxEvent(seq, message, id_) for id_, seq, message in found]

    def write(self, batch: Batch) -> None:
        # One statement per kind of change: the writer gives up the GIL at every statement
        # and must win it back from the request threads, so fewer statements mean a shorter
        # commit under load.
        upserts = [rows.to_row(job) for job in batch.upserts]
        outputs = [row for job in batch.upserts for row in rows.output_rows(job)]
        newest = max((job.seq for job in batch.upserts), default=0)
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            if upserts:
                conn.executemany(_UPSERT, upserts)
            if outputs:
                conn.executemany(_SAVE_OUTPUT, outputs)
            if batch.deletes:
                deleted = [(s,) for s in batch.deletes]
                conn.executemany("DELETE FROM jobs WHERE seq = ?", deleted)
                conn.executemany("DELETE FROM outputs WHERE seq = ?", deleted)
                # Only a deleted job's id needs the mark: every other is in the rows, and the
                # load takes the larger of the two (one statement less per commit).
                conn.execute(_HIGH_WATER, ("last_seq", max(batch.deletes)))
            if batch.schedules:
                conn.executemany(
                    _UPSERT_SCHEDULE, [rows.schedule_to_row(s) for s in batch.schedules]
                )
                top = max(schedule.seq for schedule in batch.schedules)
                conn.execute(_HIGH_WATER, ("last_schedule_seq", top))
            if batch.schedule_deletes:
                conn.executemany(
                    "DELETE FROM schedules WHERE seq = ?", [(s,) for s in batch.schedule_deletes]
                )
            if batch.queue_settings:
                conn.executemany(
                    _UPSERT_QUEUE,
                    [(q.name, q.max_running, int(q.paused)) for q in batch.queue_settings],
                )
            if batch.events:
                conn.executemany(
                    "INSERT INTO outbox (seq, message) VALUES (?, ?)",
                    [(event.seq, event.message) for event in batch.events],
                )
            if batch.delivered:
                conn.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in batch.delivered])
            if batch.probe:
                # A fresh value each time: SQLite skips writing a row that does not change.
                conn.execute(_PROBE, (time.time_ns(),))
            # Last before the commit, so that nothing is acknowledged into a file that is gone.
            lost = self._lost()
            if lost:
                raise FileLost(lost)
            conn.execute("COMMIT")
        except Exception as exc:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    log.exception("rollback failed")
            if isinstance(exc, FileLost):
                self._let_go()
            raise
        if newest > self._lock.last_seq:
            self._lock.record(newest)

    def read_outputs(self, seq: int) -> dict[int, Output] | None:
        with self._readers.connection() as conn:
            found = conn.execute(_OUTPUTS_OF, (seq,)).fetchall()
        if not found:
            return None
        return {attempt: Output(out, err) for attempt, out, err in found if attempt is not None}

    def read_latest_outputs(self, seqs: Sequence[int]) -> Iterator[tuple[int, Output | None]]:
        with self._readers.connection() as conn:
            for first in range(0, len(seqs), _READ_BATCH):
                batch = seqs[first : first + _READ_BATCH]
                query = _LATEST_OUTPUTS.format(marks=", ".join("?" * len(batch)))
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
        return isinstance(error, (sqlite3.Error, FileLost, OSError))

    def close(self) -> None:
        try:
            self._readers.close()
            self._conn.close()
        finally:
            # Only now: another scheduler may open the file as soon as the lock is free.
            self._lock.release()

    def _lost(self) -> str | None:
        """Why the file at the path is no longer ours to write, or None."""
        try:
            now = _identity(os.stat(self._path))
        except FileNotFoundError:
            now = None
        if now != self._identity:
            how = "deleted" if now is None else "replaced by another file"
            return (
                f"the database file {self.location} was {how} while in use; restart the scheduler"
            )
        lost = self._lock.lost()
        if lost:
            return f"database {self.location}: {lost} while in use; restart the scheduler"
        return None

    def _let_go(self) -> None:
        """Once the file is lost: fold the write-ahead log into the file this connection has
        open (wherever it went) and empty the log. The log is found by the path's name, and
        SQLite leaves it behind at close when the file has moved; the next program to open the
        path would otherwise apply this file's changes to whatever file is there now."""
        if self._let_go_done:
            return
        self._let_go_done = True
        try:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            log.error("job database %s: cannot empty its write-ahead log: %s", self.location, exc)

    def _unreadable(self, error: Exception) -> StoreOpenError:
        """The first job that cannot be read, named with the reason (a second, slow pass that
        reads text undecoded), as the one line that stops start-up."""
        conn = self._conn
        conn.text_factory = bytes
        try:
            for row in conn.execute(_SELECT):
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
    cannot be used. The daemon calls this before starting its worker, so a corrupt file, one
    from a newer scheduler or one another scheduler has open stops start-up with one clear
    line. The lock is held only during the check (the worker takes it for good)."""
    lock = LockFile(path, wait_secs)
    try:
        conn = _open(path)
        try:
            row = conn.execute("PRAGMA quick_check").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StoreOpenError(f"job database {path!r} is corrupt: {exc}") from exc
        finally:
            conn.close()
    finally:
        lock.release()
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
    return judge_version(
        tables,
        lambda: (conn.execute("SELECT version FROM schema_version").fetchone() or (0,))[0],
        SCHEMA_VERSION,
        repr(path),
        f"{path!r} is a SQLite file but not a tiny-scheduler database",
    )


def _migrate(conn: sqlite3.Connection, path: str, version: int) -> None:
    if version == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        for step in sorted(step for step in MIGRATIONS if version < step <= SCHEMA_VERSION):
            log.info("migrating job database %s to schema version %d", path, step)
            for statement in MIGRATIONS[step].split(";"):
                if statement.strip():
                    conn.execute(statement)
        conn.execute("DELETE FROM schema_version")
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino
