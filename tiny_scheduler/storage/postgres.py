"""The PostgreSQL backend: one database shared by every scheduler daemon, written by the leader.

Owns its migration's transaction and lock (the schema and its steps are `schema.py`'s, shared
with SQLite), the writer's connection and its session limits, and the fence: when the
store has been given an epoch (`fence_with`), every write transaction checks, last before its
COMMIT, that the lease row still carries that epoch, holding a share lock on the row until the
commit. A takeover (`leadership.py`) updates that row, so it waits for a write in flight to end
and every later write sees the new epoch and rolls back: a deposed leader can never commit.

A write whose connection dies after its COMMIT was sent may have committed or not. Each write
therefore records a random write id in a small `commits` table, in its own transaction; when
the connection fails while committing, `_outcome` claims that id on a new connection: finding
it taken means the write committed (success), claiming it means it did not and now never can
(its own insert of the id would conflict), and not being able to ask means the outcome is
unknown (`OutcomeUnknown`), which is never answered as "nothing was changed". The claim waits
for the old transaction if it is still ending, so the answer cannot change afterwards. Each
write also removes the ids whose outcome is settled, so the table stays a few rows long.

It does not elect anyone: `leadership.py` owns the lease row's protocol and tells this store
its epoch. Called from one thread at a time (the writer, or start-up code), except
`interrupt()`, which any thread may call to break a connection that hangs, and the reads of
output, which request threads make on connections of their own (`_Readers`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import orjson
import psycopg

from ..domain.jobs import Job, Output
from ..redaction import redacted
from . import rows, schema, sql
from .base import Batch, Loaded, OutboxEvent, OutcomeUnknown, StoreOpenError, judge_version
from .readers import ReaderPool

log = logging.getLogger(__name__)

FENCED_SQLSTATE = schema.FENCED_SQLSTATE
"""The error `check_epoch` raises when the writer's epoch is over."""

_MIGRATION_LOCK = 7_461_205_311
"""Advisory lock key: daemons starting together migrate one after the other."""

# Last before COMMIT, so the share lock on the lease row is held only for the commit itself.
_FENCE = "SELECT check_epoch(%s)"
# A write's id, stored with it; and the ids no write will ask about again (settled ones, and any
# a crashed daemon left behind).
_RECORD_WRITE = "INSERT INTO commits (id) VALUES (%s)"
_PRUNE_WRITES = "DELETE FROM commits WHERE id = ANY(%s) OR at < now() - interval '1 day'"
# On another connection: take the id of a write in doubt. Waits for that write's transaction
# when it holds the id uncommitted; no row back means the write committed it.
_CLAIM_WRITE = "INSERT INTO commits (id) VALUES (%s) ON CONFLICT (id) DO NOTHING RETURNING id"
# The latest attempt's output of some jobs (NULL: it printed nothing), and first its size
# (octet_length reads it from the stored value's header, without fetching the value).
_LATEST = (
    "FROM jobs AS j LEFT JOIN outputs AS o ON o.seq = j.seq AND o.attempt = j.retry_count "
    "WHERE j.seq = ANY(%s) ORDER BY j.seq"
)
_LATEST_SIZES = (
    "SELECT j.seq, coalesce(octet_length(o.stdout) + octet_length(o.stderr), 0) " + _LATEST
)
_LATEST_OUTPUTS = "SELECT j.seq, o.stdout, o.stderr " + _LATEST
_SQL = sql.Statements(mark="%s", greatest="greatest")
_READ_BATCH = 256
"""Jobs whose output sizes a listing asks for at once."""
_READ_BYTES = 4 * 1024 * 1024
"""Output fetched in one round trip, at most (one bigger job is fetched alone): the driver
holds a whole answer in memory."""

_OUTCOME_RETRY_SECS = 0.2
"""How often a write in doubt tries again to reach the database to find out its outcome."""

STATEMENT_TIMEOUT_SECS = 30.0
"""Seconds one statement of the writer may run (e.g. wait for a lock) before it fails."""


class NotLeader(RuntimeError):
    """A write was refused: this scheduler is not the leader (it holds no epoch)."""


class Fenced(NotLeader):
    """A write rolled back: another scheduler took the lease since this one's epoch."""


def application_name(purpose: str) -> str:
    """The application_name of this scheduler's connections for `purpose` (writer, lease)."""
    return f"tiny-scheduler {purpose}"


def connect(url: str, lease_secs: float, purpose: str) -> psycopg.Connection[Any]:
    """An autocommit connection whose death is noticed within the lease: TCP keepalives and a
    user timeout for a peer that vanished, a connect timeout for one that does not answer.
    Values given in the URL win over these defaults."""
    params = psycopg.conninfo.conninfo_to_dict(url)
    defaults = {
        "connect_timeout": max(2, round(lease_secs)),  # libpq's minimum is 2 s
        "keepalives": 1,
        "keepalives_idle": max(1, int(lease_secs / 4)),
        "keepalives_interval": 1,
        "keepalives_count": 2,
        "tcp_user_timeout": int(lease_secs * 1000),
    }
    for name, value in defaults.items():
        params.setdefault(name, value)
    # Always ours: a takeover finds the old leader's writer sessions by this name.
    params["application_name"] = application_name(purpose)
    try:
        return psycopg.connect(**params, autocommit=True)
    except psycopg.Error as exc:
        raise StoreOpenError(f"cannot connect to job database {redacted(url)}: {exc}") from exc


def interrupt(conn: psycopg.Connection[Any] | None) -> None:
    """Break `conn` from any thread: a thread blocked on it gets an error at once.

    Shutting the socket down wakes its waiter whatever the network does; this matters when
    the path to the server has gone silent (no reset, no answer), which keepalives behind a
    proxy that still acknowledges never notice.
    """
    if conn is None or conn.closed:
        return
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


class PostgresStore(sql.SqlStore):
    """A `JobStore` in a PostgreSQL database.

    Unfenced (`fenced=False`) it writes as the only writer (tests, tools). Fenced, it refuses
    every write until `fence_with(epoch)` and afterwards commits only while the lease row
    holds that epoch.
    """

    SQL = _SQL

    def __init__(
        self, url: str, lease_secs: float = 5.0, fenced: bool = False, migrate: bool = True
    ) -> None:
        self.location = redacted(url)
        self._url = url
        self._lease_secs = lease_secs
        self._fenced = fenced
        self._epoch: int | None = None
        self._writing_epoch: int | None = None  # the epoch the transaction under way writes in
        self._write_id = 0  # the id the transaction under way records
        self._settled: list[int] = []  # write ids whose outcome is known: removed next write
        self.on_fenced: Callable[[int], None] | None = None
        """Called (by the thread committing) when a write found its epoch gone."""
        self._conn_lock = threading.Lock()  # guards swapping the connection, not its use
        # One operation at a time on the connection: the writer's periodic probe may come
        # while a start-up load runs on another thread, and a transaction must not interleave.
        self._use = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._conn = self._connection()
        # Reads of output from request threads, never on the writer's connection (which runs
        # one transaction at a time, and must not wait behind a listing).
        self._readers: ReaderPool[psycopg.Connection[Any]] = ReaderPool(
            lambda: connect(url, lease_secs, "reader"),
            lambda conn: not (conn.closed or conn.broken),
        )
        if migrate:
            try:
                _migrate(self._conn, self.location)
            except BaseException:
                self._conn.close()
                raise

    # --- fencing ------------------------------------------------------------------------------

    def fence_with(self, epoch: int | None) -> None:
        """Write only under `epoch` from now on; None refuses every write."""
        self._epoch = epoch

    @property
    def epoch(self) -> int | None:
        return self._epoch

    def interrupt(self) -> None:
        """Break the connection (from any thread): a write hanging on it fails now."""
        with self._conn_lock:
            conn = self._conn
        interrupt(conn)

    # --- the JobStore protocol ----------------------------------------------------------------

    def load(self, compact: bool = False) -> Loaded:
        # Only `Job`s (compact is a start-up's saving, and this backend's start-ups are terms).
        with self._use:
            return self._load()

    def _load(self) -> Loaded:
        conn = self._connection()
        collecting = gc.isenabled()
        gc.disable()  # see SqliteStore.load: a million rows, no cycles among them
        try:
            with conn.transaction():
                # One snapshot for the jobs, the schedules, the outbox and the high-water marks.
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                loaded: list[Job] = []
                with conn.cursor(name="load_jobs") as cursor:
                    cursor.itersize = 10000
                    cursor.execute(self.SQL.select_jobs)
                    for row in cursor:
                        loaded.append(self._job(_unescaped(row)))
                schedules = [
                    rows.schedule_from_row(_unescaped(row))
                    for row in conn.execute(self.SQL.select_schedules)
                ]
                marks = dict(conn.execute("SELECT key, value FROM meta").fetchall())
                events = conn.execute("SELECT count(*) FROM outbox").fetchone()[0]
                nodes = [
                    sql.node_from_row(_unescaped(row))
                    for row in conn.execute(self.SQL.select_nodes)
                ]
                queues = [
                    sql.queue_from_row(_unescaped(row))
                    for row in conn.execute(self.SQL.select_queues)
                ]
                users = [
                    sql.user_from_row(_unescaped(row))
                    for row in conn.execute(self.SQL.select_users)
                ]
                tokens = [
                    sql.token_from_row(_unescaped(row))
                    for row in conn.execute(self.SQL.select_tokens)
                ]
                audit = [
                    sql.audit_from_row(_unescaped(row))
                    for row in conn.execute(self.SQL.select_audit)
                ]
        finally:
            if collecting:
                gc.enable()
        return sql.loaded(loaded, schedules, marks, events, nodes, queues, users, tokens, audit)

    def _job(self, row: Sequence[Any]) -> Job:
        try:
            return rows.from_row(row)
        except Exception:  # one bad row: name it, rather than a traceback
            raise StoreOpenError(
                f"job database {self.location}: job-{row[0]} cannot be read: {rows.problem(row)}"
            ) from None

    def outbox(self, limit: int) -> list[OutboxEvent]:
        with self._use:
            return self._outbox(self._connection(), limit)

    def write(self, batch: Batch) -> None:
        with self._use:
            self._write(batch)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[psycopg.Cursor[Any]]:
        epoch = self._epoch
        if self._fenced and epoch is None:
            raise NotLeader("this scheduler is not the leader")
        conn = self._connection()
        self._writing_epoch = epoch
        self._write_id = write_id = secrets.randbits(63)
        committing = False
        try:
            # One round trip for the whole transaction: the writer gives up the GIL at every
            # wait for the server and must win it back from the request threads.
            with conn.pipeline(), conn.transaction():
                yield conn.cursor()
                committing = True  # from here on the COMMIT is sent
        except psycopg.Error as exc:
            if epoch is not None and exc.sqlstate == FENCED_SQLSTATE:
                self._deposed(epoch)
                raise Fenced(f"epoch {epoch} is over: another scheduler took the lease") from exc
            if not committing or _rolled_back(exc, conn):
                raise
            committed = self._outcome(write_id)
            if committed is None:
                raise OutcomeUnknown(
                    f"the connection to {self.location} failed while committing and the "
                    f"outcome cannot be looked up: {exc}"
                ) from exc
            if not committed:
                raise
            log.warning("a commit whose connection failed (%s) had taken effect", exc)
        self._settled = [write_id]

    def _outcome(self, write_id: int) -> bool | None:
        """Whether the write that recorded `write_id` committed, asked on a new connection:
        None when that cannot be found out within the lease."""
        deadline = time.monotonic() + self._lease_secs
        while True:
            try:
                with connect(self._url, self._lease_secs, "write check") as conn:
                    conn.execute(f"SET statement_timeout = {int(self._lease_secs * 1000)}")
                    claimed = conn.execute(_CLAIM_WRITE, (write_id,)).fetchone()
            except (psycopg.Error, StoreOpenError) as exc:
                if time.monotonic() >= deadline:
                    log.error("cannot find out whether a commit took effect: %s", exc)
                    return None
                time.sleep(_OUTCOME_RETRY_SECS)  # the server may be restarting
                continue
            if claimed is not None:
                self._settled.append(write_id)  # ours now: removed with the next write
                return False
            return True

    def _guard(self, cursor: psycopg.Cursor[Any]) -> None:
        # The epoch as the transaction began, even if it was taken away since (then the fence
        # fails, as it must): a takeover since then fails the COMMIT.
        cursor.execute(_RECORD_WRITE, (self._write_id,))
        if self._settled:
            cursor.execute(_PRUNE_WRITES, (self._settled,))
        epoch = self._writing_epoch
        if epoch is not None and self._fenced:
            cursor.execute(_FENCE, (epoch,))

    def _delete(
        self, cursor: psycopg.Cursor[Any], table: str, column: str, ids: Sequence[int]
    ) -> None:
        cursor.execute(f"DELETE FROM {table} WHERE {column} = ANY(%s)", (list(ids),))

    def _storable(self, values: Sequence[object]) -> Sequence[object]:
        return _escaped(values)

    def _readable(self, value: str) -> str:
        return _text(value)

    def read_latest_outputs(self, seqs: Sequence[int]) -> Iterator[tuple[int, Output | None]]:
        with self._readers.connection() as conn:
            for first in range(0, len(seqs), _READ_BATCH):
                batch = list(seqs[first : first + _READ_BATCH])
                sizes = conn.execute(_LATEST_SIZES, (batch,)).fetchall()
                for group in _groups(sizes, _READ_BYTES):
                    for seq, out, err in conn.execute(_LATEST_OUTPUTS, (group,)).fetchall():
                        yield seq, Output(_text(out), _text(err)) if out is not None else None

    def is_fault(self, error: BaseException) -> bool:
        # Not being the leader says nothing about the database; text that cannot be encoded
        # (a lone surrogate) fails in the driver, before the database sees it.
        return isinstance(error, (psycopg.Error, OutcomeUnknown))

    def close(self) -> None:
        self._readers.close()
        with self._conn_lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # --- the connection -----------------------------------------------------------------------

    def _deposed(self, epoch: int) -> None:
        if self._epoch == epoch:
            self._epoch = None
        if self.on_fenced is not None:
            self.on_fenced(epoch)

    def _connection(self) -> psycopg.Connection[Any]:
        """The writer's connection, opened again after it broke (a restarted server, a cut)."""
        with self._conn_lock:
            conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        if conn is not None:
            conn.close()
        conn = connect(self._url, self._lease_secs, "writer")
        # A session stuck inside a transaction (its process paused, its network cut) holds the
        # share lock on the lease row; the server ends it well within the lease, so a takeover
        # never waits for it longer.
        idle_ms = max(500, int(self._lease_secs * 1000 / 2))
        conn.execute(f"SET idle_in_transaction_session_timeout = {idle_ms}")
        conn.execute(f"SET statement_timeout = {int(STATEMENT_TIMEOUT_SECS * 1000)}")
        with self._conn_lock:
            self._conn = conn
        return conn


def _rolled_back(error: psycopg.Error, conn: psycopg.Connection[Any]) -> bool:
    """Whether a write that failed while committing was certainly rolled back: the server
    answered with an ERROR (a constraint, a timeout, a failed COMMIT) on a connection that is
    still up. A session that ended (FATAL: terminated, the server shutting down) or a
    connection that broke may have committed first: that is looked up, not assumed."""
    if error.sqlstate is None or conn.broken or conn.closed:
        return False
    severity = error.diag.severity_nonlocalized or error.diag.severity
    return severity == "ERROR"


def _groups(sizes: Sequence[tuple[int, int]], limit: int) -> Iterator[list[int]]:
    """The seqs of (seq, size) in order, in groups of at most `limit` bytes in all (a bigger
    one alone)."""
    group: list[int] = []
    held = 0
    for seq, size in sizes:
        if group and held + size > limit:
            yield group
            group, held = [], 0
        group.append(seq)
        held += size
    if group:
        yield group


def check(url: str) -> None:
    """Connect once, creating or migrating the schema, and disconnect; StoreOpenError when the
    database cannot be used."""
    PostgresStore(url).close()


# --- text the database cannot hold ------------------------------------------------------------

_ESCAPE = "\uffff"
_ESCAPED = re.compile("\uffff(.)", re.DOTALL)


def _escape_text(value: str) -> str:
    # PostgreSQL text cannot hold NUL, which a job's output may contain. U+FFFF (a noncharacter)
    # is the escape: NUL is stored as U+FFFF '0', U+FFFF itself doubled. Only text containing
    # either is touched, so every other value reads plainly in SQL.
    return value.replace(_ESCAPE, _ESCAPE * 2).replace("\x00", _ESCAPE + "0")


def _unescape_text(value: str) -> str:
    return _ESCAPED.sub(lambda m: "\x00" if m.group(1) == "0" else m.group(1), value)


def _escaped(row: Sequence[object]) -> tuple[object, ...]:
    return tuple(
        _escape_text(v) if isinstance(v, str) and ("\x00" in v or _ESCAPE in v) else v for v in row
    )


def _text(value: str) -> str:
    """A text value as stored, unescaped (an output of megabytes is looked through once)."""
    return _unescape_text(value) if _ESCAPE in value else value


def _unescaped(row: Sequence[Any]) -> Sequence[Any]:
    if not any(isinstance(v, str) and _ESCAPE in v for v in row):
        return row
    return [_unescape_text(v) if isinstance(v, str) else v for v in row]


# --- the schema -------------------------------------------------------------------------------


def _migrate(conn: psycopg.Connection[Any], location: str) -> None:
    """Bring the database to the schema (`schema.upgrade`) in one transaction, one daemon at a
    time; StoreOpenError for a database this scheduler must not touch."""
    try:
        if _version(conn, location) == schema.SCHEMA_VERSION and not schema.missing_columns(
            conn, schema.POSTGRES
        ):
            return  # the usual start: nothing to lock
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            version = _version(conn, location)  # again: another daemon may have migrated
            schema.upgrade(conn, schema.POSTGRES, version, location, _ROUTINES)
    except psycopg.Error as exc:
        raise StoreOpenError(f"cannot prepare job database {location}: {exc}") from exc


def _version(conn: psycopg.Connection[Any], location: str) -> int:
    tables = {
        row[0]
        for row in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        )
    }
    return judge_version(
        tables,
        lambda: (conn.execute("SELECT version FROM schema_version").fetchone() or (0,))[0],
        schema.SCHEMA_VERSION,
        location,
        f"{location} is a PostgreSQL database but not a tiny-scheduler one",
    )


def move_output(conn: psycopg.Connection[Any]) -> None:
    """Schema version 3 (`schema.STEPS`), for a database whose jobs table still holds the
    output: the current attempt's in the stdout and stderr columns (which go), the earlier
    ones' inside the attempts JSON (which keeps the rest of each attempt). Row by row, in the
    migration's transaction."""
    found = conn.execute(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = 'jobs'"
    ).fetchall()
    if "stdout" not in {name for (name,) in found}:
        return  # a new database: its jobs table never had the output
    with conn.cursor(name="move_output") as cursor:
        cursor.itersize = 100
        cursor.execute(
            "SELECT seq, retry_count, stdout, stderr, attempts FROM jobs "
            "WHERE stdout <> '' OR stderr <> '' OR attempts IS NOT NULL"
        )
        for seq, retry_count, stdout, stderr, attempts in cursor:
            outputs = []
            if attempts is not None:
                earlier = orjson.loads(_text(attempts))
                for number, attempt in enumerate(earlier):
                    out, err = attempt.pop("stdout", ""), attempt.pop("stderr", "")
                    if out or err:
                        outputs.append((seq, number, _text(out), _text(err)))
                conn.execute(
                    "UPDATE jobs SET attempts = %s WHERE seq = %s",
                    (_escape_text(orjson.dumps(earlier).decode()), seq),
                )
            if stdout or stderr:
                outputs.append((seq, retry_count, _text(stdout), _text(stderr)))
            with conn.cursor() as writes:
                writes.executemany(_SQL.save_output, [_escaped(row) for row in outputs])
    conn.execute("ALTER TABLE jobs DROP COLUMN stdout, DROP COLUMN stderr")


_ROUTINES: dict[str, Callable[[psycopg.Connection[Any]], None]] = {"move_output": move_output}
"""The steps' `schema.Routine`s this backend runs, by name."""
