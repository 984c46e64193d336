"""What the SQL backends share: the statements, how a `Batch` is applied, and the reads.

A `Batch` is applied here, in one place (`SqlStore._apply`), one statement per kind of change
in a fixed order; a new stored field or kind of change is added to the declaration (`jobs.py`,
`base.Batch`) and here. Each backend is a `SqlStore` with a small dialect: its placeholder
(`MARK`), the name of its two-argument maximum, how it binds a list of ids (`_delete`), how it
runs a statement over many rows (`_many`), how a value is made storable (`_storable`), how a
transaction is opened and ended (`_transaction`), and what it checks last before each COMMIT
(`_guard`: SQLite that its file is still the one at the path, PostgreSQL the epoch fence).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import orjson

from ..domain.audit import AuditRecord
from ..domain.jobs import Job, Output
from ..domain.nodes import NodeRecord
from ..domain.queues import QueueSettings
from ..domain.roles import Role
from ..domain.schedules import Schedule
from ..domain.tokens import Token
from ..domain.users import UserSettings
from . import rows
from .base import Batch, Loaded, OutboxEvent

NODE_COLUMNS = (
    "node_id",
    "cpu_count",
    "labels",
    "version",
    "drain",
    "seen_at",
    "memory_mb",
    "gpus",
    "enforcement",
)
"""The `nodes` table: a node's facts from its last heartbeat that changed, and its drain."""


def node_row(record: NodeRecord) -> tuple[object, ...]:
    labels = orjson.dumps(dict(record.labels)).decode() if record.labels else ""
    return (
        record.node_id,
        record.cpu_count,
        labels,
        record.version,
        int(record.drain),
        record.seen_at,
        record.memory_mb,
        record.gpus,
        record.enforcement,
    )


def node_from_row(row: Sequence[Any]) -> NodeRecord:
    node_id, cpu_count, labels, version, drain, seen_at, memory_mb, gpus, enforcement = row
    pairs = tuple(sorted(orjson.loads(labels).items())) if labels else ()
    return NodeRecord(
        node_id, cpu_count, pairs, version, bool(drain), seen_at, memory_mb, gpus, enforcement
    )


QUEUE_COLUMNS = ("name", "max_running", "paused")
"""The `queues` table: the settings an operator gave a queue (max_running NULL: no limit)."""


def queue_row(settings: QueueSettings) -> tuple[object, ...]:
    return (settings.name, settings.max_running, int(settings.paused))


def queue_from_row(row: Sequence[Any]) -> QueueSettings:
    name, max_running, paused = row
    return QueueSettings(name, max_running, bool(paused))


USER_COLUMNS = ("name", "max_running")
"""The `users` table: the limit an admin gave a user (max_running NULL: no limit)."""


def user_row(settings: UserSettings) -> tuple[object, ...]:
    return (settings.name, settings.max_running)


def user_from_row(row: Sequence[Any]) -> UserSettings:
    name, max_running = row
    return UserSettings(name, max_running)


TOKEN_COLUMNS = ("seq", "user_name", "role", "digest", "created_at", "node_id", "expires_at")
"""The `tokens` table: a token as `tokens.Token` declares it (never its secret)."""


def token_row(token: Token) -> tuple[object, ...]:
    return (
        token.seq,
        token.user,
        token.role.value,
        token.digest,
        token.created_at,
        token.node_id,
        token.expires_at,
    )


def token_from_row(row: Sequence[Any]) -> Token:
    seq, user, role, digest, created_at, node_id, expires_at = row
    return Token(seq, user, Role(role), digest, created_at, node_id, expires_at)


AUDIT_COLUMNS = ("id", "at", "user_name", "role", "address", "action", "target", "status")
"""The `audit` table: one `audit.AuditRecord` per row."""


def audit_row(record: AuditRecord) -> tuple[object, ...]:
    return (
        record.id,
        record.at,
        record.user,
        record.role,
        record.address,
        record.action,
        record.target,
        record.status,
    )


def audit_from_row(row: Sequence[Any]) -> AuditRecord:
    return AuditRecord(*row)


def _names(columns: Iterable[str]) -> str:
    # Quoted: a declared field may one day be named like an SQL keyword in either dialect.
    return ", ".join(f'"{c}"' for c in columns)


def _literal(value: object) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, int):
        return str(value)
    raise TypeError(f"no SQL literal for {value!r}")


def select_packed_jobs(json_array: str) -> str:
    """Every job in seq order, as `rows.jobs_from_packed` reads them: the `LOAD_COLUMNS` (the
    status by its `rows.STATUS_CODES`), then the `RARE_COLUMNS` packed by the dialect's
    `json_array` function, or NULL when every one of them holds its default (most rows: the
    database does the test, in C)."""
    defaults = []
    for name in rows.RARE_COLUMNS:
        default = rows.stored_default(name)
        test = "IS NULL" if default is None else f"= {_literal(default)}"
        defaults.append(f'"{name}" {test}')
    packed = (
        f"CASE WHEN {' AND '.join(defaults)} THEN NULL "
        f"ELSE {json_array}({_names(rows.RARE_COLUMNS)}) END"
    )
    # The status as a small number (any other text as it is, for the load to refuse).
    codes = " ".join(f"WHEN {_literal(v)} THEN {code}" for v, code in rows.STATUS_CODES.items())
    loaded = [
        f'CASE "status" {codes} ELSE "status" END' if name == "status" else f'"{name}"'
        for name in rows.LOAD_COLUMNS
    ]
    return f"SELECT {', '.join(loaded)}, {packed} FROM jobs ORDER BY seq"


class Statements:
    """The statements of one dialect, written once with its placeholder and maximum."""

    def __init__(self, mark: str, greatest: str) -> None:
        def upsert(table: str, columns: Sequence[str], key: Sequence[str]) -> str:
            sets = ", ".join(f'"{c}" = excluded."{c}"' for c in columns if c not in key)
            marks = ", ".join([mark] * len(columns))
            return (
                f"INSERT INTO {table} ({_names(columns)}) VALUES ({marks}) "
                f"ON CONFLICT ({_names(key)}) DO UPDATE SET {sets}"
            )

        self.select_jobs = f"SELECT {_names(rows.COLUMNS)} FROM jobs ORDER BY seq"
        self.select_schedules = (
            f"SELECT {_names(rows.SCHEDULE_COLUMNS)} FROM schedules ORDER BY seq"
        )
        self.upsert_job = upsert("jobs", rows.COLUMNS, ("seq",))
        self.upsert_schedule = upsert("schedules", rows.SCHEDULE_COLUMNS, ("seq",))
        self.save_output = upsert(
            "outputs", ("seq", "attempt", "stdout", "stderr"), ("seq", "attempt")
        )
        self.high_water = (
            f"INSERT INTO meta (key, value) VALUES ({mark}, {mark}) "
            f"ON CONFLICT (key) DO UPDATE SET value = {greatest}(meta.value, excluded.value)"
        )
        self.probe = (
            f"INSERT INTO meta (key, value) VALUES ('probe', {mark}) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        )
        self.upsert_node = upsert("nodes", NODE_COLUMNS, ("node_id",))
        self.select_nodes = f"SELECT {_names(NODE_COLUMNS)} FROM nodes ORDER BY node_id"
        self.upsert_queue = upsert("queues", QUEUE_COLUMNS, ("name",))
        self.select_queues = f"SELECT {_names(QUEUE_COLUMNS)} FROM queues ORDER BY name"
        self.upsert_user = upsert("users", USER_COLUMNS, ("name",))
        self.select_users = f"SELECT {_names(USER_COLUMNS)} FROM users ORDER BY name"
        self.insert_token = upsert("tokens", TOKEN_COLUMNS, ("seq",))
        self.select_tokens = f"SELECT {_names(TOKEN_COLUMNS)} FROM tokens ORDER BY seq"
        self.token_by_digest = f"SELECT {_names(TOKEN_COLUMNS)} FROM tokens WHERE digest = {mark}"
        self.insert_audit = upsert("audit", AUDIT_COLUMNS, ("id",))
        self.select_audit = f"SELECT {_names(AUDIT_COLUMNS)} FROM audit ORDER BY id"
        self.add_event = f"INSERT INTO outbox (seq, message) VALUES ({mark}, {mark})"
        self.outbox = f"SELECT id, seq, message FROM outbox ORDER BY id LIMIT {mark}"
        # One job's every output; no row at all when the job is not stored (deleted meanwhile).
        self.outputs_of = (
            "SELECT o.attempt, o.stdout, o.stderr FROM jobs AS j "
            f"LEFT JOIN outputs AS o ON o.seq = j.seq WHERE j.seq = {mark}"
        )


class SqlStore:
    """The part of a `JobStore` that is the same in every SQL database; a backend subclasses
    it and supplies the dialect (see the module's docstring)."""

    location: str
    SQL: ClassVar[Statements]
    _readers: Any  # read connections for request threads, never the writer's (`readers.py`)

    # --- the dialect ------------------------------------------------------------------------

    def _transaction(self) -> contextlib.AbstractContextManager[Any]:
        """A write transaction on the writer's connection, yielding a cursor: committed when
        the block ends, rolled back (and the error raised) when it raises."""
        raise NotImplementedError

    def _guard(self, cursor: Any) -> None:
        """Last before the COMMIT: raise when this transaction must not commit."""

    def _many(self, cursor: Any, statement: str, values: Sequence[Sequence[object]]) -> None:
        cursor.executemany(statement, values)

    def _delete(self, cursor: Any, table: str, column: str, ids: Sequence[int]) -> None:
        """Remove the rows of `table` whose `column` is one of `ids`."""
        raise NotImplementedError

    def _storable(self, values: Sequence[object]) -> Sequence[object]:
        """Row values as the database can hold them (PostgreSQL's text has no NUL)."""
        return values

    def _readable(self, value: str) -> str:
        """A text value as it was before `_storable`."""
        return value

    # --- writes ----------------------------------------------------------------------------

    def _write(self, batch: Batch) -> None:
        """Apply `batch` in one transaction, guarded, durable when this returns."""
        # The rows are made before the transaction opens: it is held no longer than needed.
        upserts = [self._storable(rows.to_row(job)) for job in batch.upserts]
        outputs = [self._storable(row) for job in batch.upserts for row in rows.output_rows(job)]
        with self._transaction() as cursor:
            self._apply(cursor, batch, upserts, outputs)
            self._guard(cursor)

    def _apply(
        self,
        cursor: Any,
        batch: Batch,
        upserts: Sequence[Sequence[object]],
        outputs: Sequence[Sequence[object]],
    ) -> None:
        # One statement per kind of change: the writer gives up the GIL at every statement (or
        # round trip) and must win it back from the request threads, so fewer statements mean
        # a shorter commit under load.
        sql = self.SQL
        if upserts:
            self._many(cursor, sql.upsert_job, upserts)
        if outputs:
            self._many(cursor, sql.save_output, outputs)
        if batch.deletes:
            self._delete(cursor, "jobs", "seq", batch.deletes)
            self._delete(cursor, "outputs", "seq", batch.deletes)
            # Only a deleted job's id needs the mark: every other is in the rows, and the load
            # takes the larger of the two (one statement less per commit).
            cursor.execute(sql.high_water, ("last_seq", max(batch.deletes)))
        if batch.schedules:
            values = [self._storable(rows.schedule_to_row(s)) for s in batch.schedules]
            self._many(cursor, sql.upsert_schedule, values)
            top = max(schedule.seq for schedule in batch.schedules)
            cursor.execute(sql.high_water, ("last_schedule_seq", top))
        if batch.schedule_deletes:
            self._delete(cursor, "schedules", "seq", batch.schedule_deletes)
        if batch.events:
            events = [self._storable((event.seq, event.message)) for event in batch.events]
            self._many(cursor, sql.add_event, events)
        if batch.delivered:
            self._delete(cursor, "outbox", "id", batch.delivered)
        if batch.nodes:
            values = [self._storable(node_row(record)) for record in batch.nodes]
            self._many(cursor, sql.upsert_node, values)
        if batch.queue_settings:
            values = [self._storable(queue_row(q)) for q in batch.queue_settings]
            self._many(cursor, sql.upsert_queue, values)
        if batch.user_settings:
            values = [self._storable(user_row(u)) for u in batch.user_settings]
            self._many(cursor, sql.upsert_user, values)
        if batch.tokens:
            values = [self._storable(token_row(token)) for token in batch.tokens]
            self._many(cursor, sql.insert_token, values)
            top = max(token.seq for token in batch.tokens)
            cursor.execute(sql.high_water, ("last_token_seq", top))
        if batch.token_deletes:
            self._delete(cursor, "tokens", "seq", batch.token_deletes)
        if batch.audit:
            values = [self._storable(audit_row(record)) for record in batch.audit]
            self._many(cursor, sql.insert_audit, values)
        if batch.audit_deletes:
            self._delete(cursor, "audit", "id", batch.audit_deletes)
            cursor.execute(sql.high_water, ("last_audit_id", max(batch.audit_deletes)))
        if batch.probe:
            # A fresh value each time: SQLite skips writing a row that does not change.
            cursor.execute(sql.probe, (time.time_ns(),))

    # --- reads -----------------------------------------------------------------------------

    def _outbox(self, conn: Any, limit: int) -> list[OutboxEvent]:
        found = conn.execute(self.SQL.outbox, (limit,))
        return [OutboxEvent(seq, self._readable(message), id_) for id_, seq, message in found]

    def read_token(self, digest: str) -> Token | None:
        with self._readers.connection() as conn:
            row = conn.execute(self.SQL.token_by_digest, (digest,)).fetchone()
        return None if row is None else token_from_row([self._readable_any(v) for v in row])

    def _readable_any(self, value: Any) -> Any:
        return self._readable(value) if isinstance(value, str) else value

    def read_outputs(self, seq: int) -> dict[int, Output] | None:
        with self._readers.connection() as conn:
            found = conn.execute(self.SQL.outputs_of, (seq,)).fetchall()
        if not found:
            return None
        return {
            attempt: Output(self._readable(out), self._readable(err))
            for attempt, out, err in found
            if attempt is not None
        }


def loaded(
    jobs: list[Job],
    schedules: list[Schedule],
    marks: dict[str, int],
    events: int,
    nodes: list[NodeRecord],
    queues: list[QueueSettings],
    users: Sequence[UserSettings] = (),
    tokens: Sequence[Token] = (),
    audit: Sequence[AuditRecord] = (),
) -> Loaded:
    """What a store holds, from its rows (in seq order), its high-water marks (`meta`) and the
    outbox's size: an id high-water mark is the larger of the stored mark (kept for deleted
    rows) and the newest row."""
    last_seq = max(marks.get("last_seq", 0), jobs[-1].seq if jobs else 0)
    last_schedule_seq = max(
        marks.get("last_schedule_seq", 0), schedules[-1].seq if schedules else 0
    )
    return Loaded(
        jobs,
        last_seq,
        events,
        schedules,
        last_schedule_seq,
        nodes,
        queues,
        list(users),
        list(tokens),
        max(marks.get("last_token_seq", 0), tokens[-1].seq if tokens else 0),
        list(audit),
        max(marks.get("last_audit_id", 0), audit[-1].id if audit else 0),
    )
