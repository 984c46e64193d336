"""The schema of both SQL backends, and how a database of any older version is brought to it.

Owns (a) the columns of the tables that follow a declaration (`DECLARED`: the jobs table is
`jobs.Job`'s fields but its output, the schedules table `schedules.Schedule`'s), each
column's SQL type per dialect read from the field's annotation (`column_type`), and (b) one
ordered list of numbered steps (`STEPS`) for SQLite and PostgreSQL alike. `upgrade` runs, in
the caller's transaction, every step above the database's version, then adds every declared
column the table lacks, with the field's default: so a new field is one edit to its
declaration, and a numbered step is written only for what a new column cannot say by itself
(moving data, a backfill, a drop, a new table).

The backends own their connection, their transaction and its lock (`sqlite._migrate`,
`postgres._migrate`); this module owns what is run inside it.

Versions up to 9 were counted by each backend on its own (SQLite reached 9, PostgreSQL 6), so
those steps are per dialect and a PostgreSQL database at 6 is complete up to 9; from 10 on there
is one count. Old steps stay, so that old files keep opening (`tests/fixtures/`), but the
columns they once added by hand are left to the generic step.
"""

from __future__ import annotations

import dataclasses
import logging
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any, Literal

from ..domain.jobs import Job
from ..domain.schedules import Schedule

log = logging.getLogger(__name__)

Dialect = Literal["sqlite", "postgres"]
SQLITE: Dialect = "sqlite"
POSTGRES: Dialect = "postgres"


@dataclasses.dataclass(frozen=True)
class Routine:
    """A step's statement that is code of the backend's (data moved row by row, with the
    backend's own encoding), named here and passed to `upgrade` by the backend: this module
    imports no backend."""

    name: str


Statement = str | Routine
"""One statement of a step: SQL text, or a routine of the backend's."""

DECLARED: dict[str, type] = {"jobs": Job, "schedules": Schedule}
"""Each table whose columns follow a declaration (`dataclasses.fields`), by table name. A new
table of declared rows is a numbered step creating it with its key, and an entry here."""

FENCED_SQLSTATE = "TSF01"
"""The error PostgreSQL's `check_epoch` raises when the writer's epoch is over (`postgres`)."""

UNIQUE = frozenset({"jobs.dedupe_key", "schedules.name"})
"""Declared columns with a unique constraint: a dedupe key creates one job (and a schedule's
fire one job per fire time), also across leaders; a schedule's name is taken once."""


# --- the columns ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Column:
    """A column of a declared table, as its field declares it."""

    table: str
    name: str
    hint: Any  # the field's annotation
    default: object  # as stored (an enum by value, a flag 0 or 1); `dataclasses.MISSING`: none

    @property
    def unique(self) -> bool:
        return f"{self.table}.{self.name}" in UNIQUE


def columns(table: str) -> list[Column]:
    """The columns of a declared table, in the declaration's order: every field but a job's
    output, which lives in rows of its own (`rows`)."""
    cls = DECLARED[table]
    hints = typing.get_type_hints(cls)
    return [
        Column(table, field.name, hints[field.name], _stored_default(field))
        for field in dataclasses.fields(cls)
        if not field.metadata.get("output")
    ]


def column_type(hint: Any, dialect: Dialect) -> tuple[str, bool]:
    """The SQL type of a field's annotation in `dialect`, and whether the column takes NULL.
    What SQL has no type for (a dict, a tuple of attempts) is JSON text, NULL when empty (see
    `rows`)."""
    nullable = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        nullable = len(args) < len(typing.get_args(hint))
        hint = args[0] if len(args) == 1 else object
    integer = "INTEGER" if dialect == SQLITE else "BIGINT"
    if hint is bool:  # 0 or 1, as the row codecs write flags (SQLite has no boolean)
        return integer, nullable
    if isinstance(hint, type) and issubclass(hint, str):  # str enums too: stored as their value
        return "TEXT", nullable
    if isinstance(hint, type) and issubclass(hint, int):  # times are microseconds
        return integer, nullable
    if hint is float:
        return ("REAL" if dialect == SQLITE else "DOUBLE PRECISION"), nullable
    return "TEXT", True


def add_column(column: Column, dialect: Dialect) -> list[str]:
    """The statements that add `column` to its table, rows already there taking its default.

    A field without a default cannot be added to a table that has rows (nor, in SQLite, at
    all, when NOT NULL): such a field needs a numbered step that says what old rows hold."""
    sql_type, nullable = column_type(column.hint, dialect)
    table, name = _quoted(column.table), _quoted(column.name)
    parts = [f"ALTER TABLE {table} ADD COLUMN {name} {sql_type}"]
    if not nullable:
        parts.append("NOT NULL")
    if column.default is not dataclasses.MISSING and column.default is not None:
        parts.append(f"DEFAULT {_literal(column.default)}")
    statements = []
    if column.unique and dialect == SQLITE:
        # SQLite cannot add a UNIQUE column; an index makes the same constraint.
        statements.append(" ".join(parts))
        index = _quoted(f"{column.table}_{column.name}_unique")
        statements.append(f"CREATE UNIQUE INDEX {index} ON {table} ({name})")
    else:
        statements.append(" ".join(parts + (["UNIQUE"] if column.unique else [])))
    return statements


def missing_columns(conn: Any, dialect: Dialect) -> list[Column]:
    """Every declared column whose table has no such column yet. A table not made yet is made
    by a numbered step first (`upgrade` asks again afterwards)."""
    present = _present_columns(conn, dialect)
    return [
        column
        for table in DECLARED
        if table in present
        for column in columns(table)
        if column.name not in present[table]
    ]


def _present_columns(conn: Any, dialect: Dialect) -> dict[str, set[str]]:
    present: dict[str, set[str]] = {}
    if dialect == SQLITE:
        for table in DECLARED:
            found = {row[1] for row in conn.execute(f"PRAGMA table_info({_quoted(table)})")}
            if found:
                present[table] = found
        return present
    for table, column in conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = ANY(%s)",
        (list(DECLARED),),
    ):
        present.setdefault(table, set()).add(column)
    return present


def _stored_default(field: dataclasses.Field[Any]) -> object:
    """A field's default as the row codecs store it: an enum by its value, a flag as 0 or 1,
    an empty collection as NULL (JSON text, NULL when empty); MISSING when it has none."""
    default = field.default
    if default is dataclasses.MISSING:
        return dataclasses.MISSING if field.default_factory is dataclasses.MISSING else None
    if isinstance(default, Enum):
        return default.value
    if isinstance(default, bool):
        return int(default)
    if isinstance(default, (str, int, float)) or default is None:
        return default
    return None  # () or {}: stored as NULL


def _literal(value: object) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, (int, float)):
        return repr(value)
    raise TypeError(f"no SQL literal for the default {value!r}")


def _quoted(name: str) -> str:
    # A declared field may one day be named like an SQL keyword in either dialect.
    return f'"{name}"'


# --- the numbered steps -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Step:
    """What brings a database from version `version - 1` to `version`, per dialect (the same
    statements for both where they can be: `both`)."""

    version: int
    sqlite: tuple[Statement, ...] = ()
    postgres: tuple[Statement, ...] = ()

    def statements(self, dialect: Dialect) -> tuple[Statement, ...]:
        return self.sqlite if dialect == SQLITE else self.postgres


def step(version: int) -> Step:
    """The step that brings a database to `version`."""
    return next(step for step in STEPS if step.version == version)


def both(*statements: Statement) -> dict[str, tuple[Statement, ...]]:
    """A step's statements when they are the same in both dialects: `Step(N, **both(...))`."""
    return {SQLITE: statements, POSTGRES: statements}


def script(text: str) -> tuple[str, ...]:
    """The statements of a `;`-separated script (no `;` inside a statement)."""
    return tuple(part.strip() for part in text.split(";") if part.strip())


def upgrade(
    conn: Any,
    dialect: Dialect,
    version: int,
    location: str,
    routines: Mapping[str, Callable[[Any], None]] | None = None,
) -> None:
    """Bring the database at `version` to `SCHEMA_VERSION` and its declared tables to their
    declarations' columns, on `conn`, inside the caller's transaction (all or nothing). The
    backend's `routines` by name, for the steps' `Routine`s."""
    newest = SCHEMA_VERSION  # read now: tests pretend to be a newer scheduler
    for step in sorted(STEPS, key=lambda step: step.version):
        if not version < step.version <= newest:
            continue
        log.info("migrating job database %s to schema version %d", location, step.version)
        for statement in step.statements(dialect):
            if isinstance(statement, Routine):
                (routines or {})[statement.name](conn)
            else:
                conn.execute(statement)
    for column in missing_columns(conn, dialect):
        log.info("job database %s: adding column %s.%s", location, column.table, column.name)
        for statement in add_column(column, dialect):
            conn.execute(statement)
    if version != newest:
        conn.execute("DELETE FROM schema_version")
        conn.execute(f"INSERT INTO schema_version (version) VALUES ({int(newest)})")


_SQLITE_V1 = """
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
)
"""

_POSTGRES_V1 = (
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)",
    """CREATE TABLE leadership (
        id          INTEGER PRIMARY KEY CHECK (id = 1),
        epoch       BIGINT NOT NULL,      -- one more at every takeover: fences old leaders
        leader_url  TEXT,                 -- SCHEDULER_ADVERTISE_URL of the holder
        session_pid INTEGER,              -- backend pid of the holder's lease session
        expires_at  TIMESTAMPTZ NOT NULL  -- database clock
    )""",
    "INSERT INTO leadership VALUES (1, 0, NULL, NULL, '-infinity')",
    # The fence, as a function so that a write is one round trip: it fails the transaction
    # (and so its COMMIT) unless the lease row still holds the writer's epoch, and keeps a
    # share lock on the row until the transaction ends, so a takeover waits for the commit.
    f"""CREATE FUNCTION check_epoch(mine BIGINT) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM 1 FROM leadership WHERE id = 1 AND epoch = mine FOR SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'epoch % is over: another scheduler took the lease', mine
                USING ERRCODE = '{FENCED_SQLSTATE}';
        END IF;
    END
    $$""",
    # Every other column comes from the declarations of a job and a schedule.
    "CREATE TABLE jobs (seq BIGINT PRIMARY KEY)",
    "CREATE TABLE schedules (seq BIGINT PRIMARY KEY)",
    # The SNS outbox: events stored with the change that caused them, deleted once delivered.
    """CREATE TABLE outbox (
        id      BIGSERIAL PRIMARY KEY,  -- delivery order (one writer: the leader)
        seq     BIGINT NOT NULL,        -- N of the job-N it is about
        message TEXT NOT NULL           -- exactly what is published
    )""",
)

# Version 2 (placement and lifecycle, issue 13): there is no `cancelled` status any more. A
# cancelled job is `failed` with reason `cancelled`, exit -1 and stderr `job cancelled`, and
# every final failure says why (`reason`). Rows stored as `failed` by version 1 were final
# failures; their reason is read from the fixed texts the scheduler wrote for its own
# failures. The reason column is added here because these updates fill it; the step's other
# new columns (holds_slot, moved_from) come from the declaration.
_REASONS_V2 = """
UPDATE jobs SET reason = CASE
        WHEN exit_code = -1 AND stderr = 'job timed out' THEN 'timeout'
        WHEN exit_code = -1 AND stderr = 'node lost' THEN 'node_lost'
        ELSE 'exit'
    END
    WHERE status = 'failed' AND reason IS NULL;
UPDATE jobs SET status = 'failed', reason = 'cancelled', exit_code = -1, stderr = 'job cancelled'
    WHERE status = 'cancelled'
"""
# PostgreSQL's version 1 made a bare jobs table, given its columns after the steps: a fresh
# database has no rows (nor those columns yet), and skips this.
_POSTGRES_V2 = f"""DO $$ BEGIN
    IF EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = current_schema() AND table_name = 'jobs' AND column_name = 'status'
    ) THEN
        ALTER TABLE jobs ADD COLUMN IF NOT EXISTS reason TEXT;
        {";".join(script(_REASONS_V2))};
    END IF;
    END $$"""

# The SNS outbox (SQLite): events stored with the change that caused them, deleted once
# delivered.
_SQLITE_OUTBOX_V3 = """
CREATE TABLE outbox (
    id      INTEGER PRIMARY KEY,  -- delivery order: above every event still waiting
    seq     INTEGER NOT NULL,     -- N of the job-N it is about
    message TEXT NOT NULL         -- exactly what is published
)
"""

# A job's output moves out of the jobs table into rows of its own, one per attempt that
# printed something, so that loading the jobs at start-up never reads it: the current
# attempt's from the stdout and stderr columns (which go), the earlier ones' from the attempts
# JSON (objects, or lists in the Attempt declaration's order in the oldest files), which keeps
# the rest of each attempt. SQLite's version 4, PostgreSQL's 3 (`postgres.move_output`, row by
# row, for a database from before; a new one's jobs table never had the output).
_OUTPUTS_TABLE = """CREATE TABLE outputs (
    seq     {integer} NOT NULL,  -- the job (job-N)
    attempt INTEGER NOT NULL,    -- 0 for the first attempt, the job's retry_count for its last
    stdout  TEXT NOT NULL,
    stderr  TEXT NOT NULL,
    PRIMARY KEY (seq, attempt)
)"""
_SQLITE_MOVE_OUTPUT_V4 = """
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

# Periodic and delayed jobs (issue 14; SQLite's version 5, PostgreSQL's 1 made a bare table). A
# fire's job carries the dedupe key `sched:<id>:<fire time>`, so the jobs table's UNIQUE
# dedupe_key is the record of fires: one job per schedule and fire time, whatever crashed
# between the fire and the schedule's own update. The jobs' not_before and schedule_id, and
# the schedules' other columns, come from the declarations.
_SQLITE_SCHEDULES_V5 = """
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
)
"""

# The nodes the scheduler knows itself (issue 22): each node's facts from its last heartbeat
# that changed, and whether an operator drains it (`sql.NODE_COLUMNS`).
_NODES = """CREATE TABLE IF NOT EXISTS nodes (
    node_id   TEXT PRIMARY KEY,
    cpu_count INTEGER NOT NULL,
    labels    TEXT NOT NULL,     -- JSON object, '' when none
    version   TEXT NOT NULL,
    drain     INTEGER NOT NULL,
    seen_at   {integer} NOT NULL -- the heartbeat that changed the facts (microseconds)
)"""

# Queues' settings (issue 25), one row per queue an operator has set (`sql.QUEUE_COLUMNS`).
_QUEUES = """CREATE TABLE IF NOT EXISTS queues (
    name        TEXT PRIMARY KEY,
    max_running {integer},           -- NULL: no limit
    paused      {integer} NOT NULL   -- 0 or 1
)"""

# PostgreSQL's version 4: the write ids, by which a write whose COMMIT went unanswered is found
# out (`postgres._outcome`).
_POSTGRES_COMMITS_V4 = """CREATE TABLE IF NOT EXISTS commits (
    id BIGINT PRIMARY KEY,                  -- a write's random id, committed with it
    at TIMESTAMPTZ NOT NULL DEFAULT now()   -- rows left by a crash are pruned by age
)"""

# Version 10: what a node has beyond its CPUs, and how its agent enforces limits (issue 34).
_NODE_CAPACITY_V10 = (
    "ALTER TABLE nodes ADD COLUMN memory_mb {integer}",  # NULL: not reported
    "ALTER TABLE nodes ADD COLUMN gpus {integer} NOT NULL DEFAULT 0",
    "ALTER TABLE nodes ADD COLUMN enforcement TEXT NOT NULL DEFAULT ''",
)

# Version 11: users' limits (issue 35), one row per user an admin has set.
_USERS = """CREATE TABLE IF NOT EXISTS users (
    name        TEXT PRIMARY KEY,
    max_running {integer}            -- NULL: no limit
)"""

# Version 12 (issue 35): tokens (`sql.TOKEN_COLUMNS`: only each secret's SHA-256) and the
# audit trail (`sql.AUDIT_COLUMNS`). `user_name`: `user` is a keyword in PostgreSQL.
_TOKENS_AND_AUDIT = (
    """CREATE TABLE IF NOT EXISTS tokens (
    seq        {integer} PRIMARY KEY,  -- N of tok-N
    user_name  TEXT NOT NULL,
    role       TEXT NOT NULL,
    digest     TEXT NOT NULL UNIQUE,   -- SHA-256 of the secret, hex
    created_at {integer} NOT NULL,
    node_id    TEXT NOT NULL,          -- an agent token's node, '' for the other roles
    expires_at {integer}               -- NULL: never
)""",
    """CREATE TABLE IF NOT EXISTS audit (
    id        {integer} PRIMARY KEY,   -- the trail's order, never reused
    at        {integer} NOT NULL,
    user_name TEXT NOT NULL,
    role      TEXT NOT NULL,
    address   TEXT NOT NULL,
    action    TEXT NOT NULL,
    target    TEXT NOT NULL,
    status    INTEGER NOT NULL
)""",
)

STEPS: Sequence[Step] = (
    Step(1, sqlite=script(_SQLITE_V1), postgres=_POSTGRES_V1),
    Step(
        2,
        sqlite=("ALTER TABLE jobs ADD COLUMN reason TEXT", *script(_REASONS_V2)),
        postgres=(_POSTGRES_V2,),
    ),
    Step(
        3,
        sqlite=script(_SQLITE_OUTBOX_V3),
        postgres=(_OUTPUTS_TABLE.format(integer="BIGINT"), Routine("move_output")),
    ),
    Step(
        4,
        sqlite=(_OUTPUTS_TABLE.format(integer="INTEGER"), *script(_SQLITE_MOVE_OUTPUT_V4)),
        postgres=(_POSTGRES_COMMITS_V4,),
    ),
    Step(
        5,
        sqlite=script(_SQLITE_SCHEDULES_V5),
        postgres=(_NODES.format(integer="BIGINT"),),
    ),
    Step(
        6,
        sqlite=(_NODES.format(integer="INTEGER"),),
        postgres=(_QUEUES.format(integer="BIGINT"),),
    ),
    Step(7, sqlite=(_QUEUES.format(integer="INTEGER"),)),
    # SQLite's 8 (dependencies, priority, queue: issue 25) and 9 (named claims: issue 31) only
    # added columns, which now come from the declaration; the numbers stay taken.
    Step(8),
    Step(9),
    # From 10 on: one count, both dialects (`both`) unless they must differ.
    # 10 (issue 34): a node's memory and GPUs, and how its agent enforces jobs' limits, so
    # that a restarted leader places by them before the first heartbeat.
    Step(
        10,
        sqlite=tuple(statement.format(integer="INTEGER") for statement in _NODE_CAPACITY_V10),
        postgres=tuple(statement.format(integer="BIGINT") for statement in _NODE_CAPACITY_V10),
    ),
    # 11 (issue 35): the limits an admin gives users (`sql.USER_COLUMNS`).
    Step(
        11,
        sqlite=(_USERS.format(integer="INTEGER"),),
        postgres=(_USERS.format(integer="BIGINT"),),
    ),
    # 12 (issue 35): tokens and the audit trail.
    Step(
        12,
        sqlite=tuple(statement.format(integer="INTEGER") for statement in _TOKENS_AND_AUDIT),
        postgres=tuple(statement.format(integer="BIGINT") for statement in _TOKENS_AND_AUDIT),
    ),
)
"""Each step upgrades a database from the version before it; a database is taken through every
step above its version, in order, then given the declared columns it lacks."""

SCHEMA_VERSION = 12
"""The newest version `STEPS` reach: a database of a higher one is refused (a newer
scheduler's), one of a lower one upgraded."""
