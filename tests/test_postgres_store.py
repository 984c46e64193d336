"""The PostgreSQL backend's own duties: the schema follows the job declaration, databases it must
not touch are refused, the fence: a write under an epoch that is over never commits, and a
database from before the output moved out of the jobs table is migrated.

The behaviour every backend shares is in test_storage_contract.py. Real PostgreSQL; skipped
(visibly) without a server.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from conftest import PostgresDatabases
from helpers import wait_for

from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.jobs import Attempt, Job, Output
from tiny_scheduler.errors import StoreError
from tiny_scheduler.storage import StoreOpenError, Writer, rows, schema
from tiny_scheduler.storage.postgres import PostgresStore
from tiny_scheduler.storage.schema import SCHEMA_VERSION

T0 = 1_764_498_030_123_456


@pytest.fixture
def db_url(postgres_database: PostgresDatabases) -> str:
    return postgres_database.create()


@pytest.fixture
def sql(db_url: str) -> Iterator[psycopg.Connection]:
    """A connection of the test's own to the same database (autocommit)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def writer(db_url: str) -> Iterator[tuple[Writer, PostgresStore]]:
    """A fenced store (as the daemon opens it) behind the group-committing writer."""
    backend = PostgresStore(db_url, lease_secs=2.0, fenced=True)
    store = Writer(backend)
    store.start()
    yield store, backend
    store.close()


def job(seq: int) -> Job:
    return Job(seq=seq, node_id="n", command=f"echo {seq}", created_at=T0 + seq)


def stored_seqs(sql: psycopg.Connection) -> list[int]:
    return [row[0] for row in sql.execute("SELECT seq FROM jobs ORDER BY seq")]


def take_lease(sql: psycopg.Connection) -> int:
    """Raise the epoch as a takeover does; returns the new one."""
    return sql.execute("UPDATE leadership SET epoch = epoch + 1 RETURNING epoch").fetchone()[0]


def test_the_jobs_table_has_the_declared_columns_with_their_types(
    db_url: str, sql: psycopg.Connection
) -> None:
    PostgresStore(db_url).close()
    found = {
        name: (data_type, nullable == "YES")
        for name, data_type, nullable in sql.execute(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_name = 'jobs'"
        )
    }
    assert set(found) == set(rows.COLUMNS)
    assert found["seq"] == ("bigint", False)
    assert found["command"] == ("text", False)
    assert found["job_type"] == ("text", False)  # a str enum, stored as its value
    assert found["exit_code"] == ("bigint", True)
    assert found["env_vars"] == ("text", True)  # JSON, NULL when empty
    assert found["dedupe_key"] == ("text", True)
    schedule_columns = {
        row[0]
        for row in sql.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'schedules'"
        )
    }
    assert schedule_columns == set(rows.SCHEDULE_COLUMNS)


def test_a_field_added_to_the_declaration_becomes_a_column_with_its_default(
    db_url: str, sql: psycopg.Connection
) -> None:
    # What another branch's new field looks like to a database made before it: the column is
    # missing, and rows written before it must read as the field's default.
    store = Writer(PostgresStore(db_url))
    store.start()
    store.save(job(1))
    store.close()
    sql.execute("ALTER TABLE jobs DROP COLUMN deploy_url")
    sql.execute("ALTER TABLE jobs DROP COLUMN running_at")
    reopened = PostgresStore(db_url)
    try:
        assert reopened.load().jobs == [job(1)]
    finally:
        reopened.close()


def test_column_types_come_from_annotations() -> None:
    def column_type(hint: object) -> tuple[str, bool]:
        return schema.column_type(hint, schema.POSTGRES)

    assert column_type(int) == ("BIGINT", False)
    assert column_type(int | None) == ("BIGINT", True)
    assert column_type(str) == ("TEXT", False)
    assert column_type(bool) == ("BIGINT", False)  # 0 or 1, as the row codec writes flags
    assert column_type(dict[str, str] | None) == ("TEXT", True)
    assert column_type(tuple[int, ...]) == ("TEXT", True)  # e.g. the attempts: JSON text


def test_a_database_from_a_newer_scheduler_is_refused(db_url: str, sql: psycopg.Connection) -> None:
    PostgresStore(db_url).close()
    sql.execute("UPDATE schema_version SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreOpenError, match="newer"):
        PostgresStore(db_url)


def test_another_programs_database_is_refused_and_left_alone(
    db_url: str, sql: psycopg.Connection
) -> None:
    sql.execute("CREATE TABLE customers (name TEXT)")
    sql.execute("INSERT INTO customers VALUES ('ada')")
    with pytest.raises(StoreOpenError, match="not a tiny-scheduler one"):
        PostgresStore(db_url)
    tables = [
        row[0]
        for row in sql.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        )
    ]
    assert tables == ["customers"]


def test_an_unreachable_server_stops_start_up_without_the_password() -> None:
    url = "postgresql://someone:hunter2@127.0.0.1:1/nowhere?connect_timeout=2"
    with pytest.raises(StoreOpenError) as caught:
        PostgresStore(url)
    assert "hunter2" not in str(caught.value)
    assert "127.0.0.1:1" in str(caught.value)


def test_a_fenced_store_writes_nothing_before_it_has_an_epoch(
    writer: tuple[Writer, PostgresStore], sql: psycopg.Connection
) -> None:
    store, _ = writer
    with pytest.raises(StoreError):
        store.save(job(1))
    assert stored_seqs(sql) == []
    assert store.healthy  # not being the leader says nothing about the database


def test_a_write_under_an_epoch_that_is_over_rolls_back(
    writer: tuple[Writer, PostgresStore], sql: psycopg.Connection
) -> None:
    store, backend = writer
    told: list[int] = []
    backend.on_fenced = told.append
    backend.fence_with(take_lease(sql))
    store.save(job(1))
    mine = backend.epoch
    take_lease(sql)  # another scheduler takes over
    with pytest.raises(StoreError):
        store.save(job(2))
    assert told == [mine]
    assert backend.epoch is None
    with pytest.raises(StoreError):
        store.save(job(3))
    assert stored_seqs(sql) == [1]


def test_a_write_in_flight_during_a_takeover_never_commits(
    writer: tuple[Writer, PostgresStore], db_url: str, sql: psycopg.Connection
) -> None:
    # The leader's write is held up in the database (as by a pause or a slow disk) while a
    # standby takes the lease; when it goes on, it must roll back, not commit.
    store, backend = writer
    backend.fence_with(take_lease(sql))
    outcome: list[BaseException | None] = []

    def save() -> None:
        try:
            store.save(job(1))
            outcome.append(None)
        except StoreError as exc:
            outcome.append(exc)

    with psycopg.connect(db_url) as locker:
        locker.execute("LOCK TABLE jobs IN SHARE MODE")  # holds the write's INSERT back
        thread = threading.Thread(target=save)
        thread.start()
        wait_for(lambda: waiting_on_locks(sql), message="the write to wait on the lock")
        take_lease(sql)
        locker.rollback()
    thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], StoreError)
    assert stored_seqs(sql) == []


def test_interrupt_breaks_a_write_that_hangs_and_the_store_reconnects(
    writer: tuple[Writer, PostgresStore], db_url: str, sql: psycopg.Connection
) -> None:
    store, backend = writer
    backend.fence_with(take_lease(sql))
    failed = threading.Event()

    def save() -> None:
        with pytest.raises(StoreError):
            store.save(job(1))
        failed.set()

    with psycopg.connect(db_url) as locker:
        locker.execute("LOCK TABLE jobs IN SHARE MODE")
        thread = threading.Thread(target=save)
        thread.start()
        wait_for(lambda: waiting_on_locks(sql), message="the write to wait on the lock")
        backend.interrupt()
        # The lock is still held: only the interrupt can have ended the write.
        assert failed.wait(10), "the interrupted write did not fail"
        locker.rollback()
    thread.join(10)
    store.save(job(2))
    assert stored_seqs(sql) == [2]


def waiting_on_locks(sql: psycopg.Connection) -> bool:
    row = sql.execute(
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'jobs'::regclass"
    ).fetchone()
    return bool(row and row[0])


def test_a_version_1_database_is_migrated_cancelled_rows_become_failures_with_reasons(
    db_url: str, sql: psycopg.Connection
) -> None:
    """Version 1 had a `cancelled` status and no reasons (as test_sqlite_store checks for
    SQLite): its cancelled rows become failed with reason cancelled, its failures get theirs."""
    store = Writer(PostgresStore(db_url))
    store.start()
    store.save(*(job(seq) for seq in range(1, 6)))
    store.close()
    # Back to what a version-1 database held (the output still in the jobs table).
    for column in ("reason", "holds_slot", "moved_from"):
        sql.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
    sql.execute("DROP TABLE outputs")
    sql.execute("DROP TABLE nodes")
    sql.execute("DROP TABLE queues")
    sql.execute(
        "ALTER TABLE jobs ADD COLUMN stdout TEXT NOT NULL DEFAULT '', "
        "ADD COLUMN stderr TEXT NOT NULL DEFAULT ''"
    )
    sql.execute("UPDATE schema_version SET version = 1")
    sql.execute("UPDATE jobs SET status = 'cancelled', finished_at = 9 WHERE seq = 1")
    sql.execute("UPDATE jobs SET status = 'failed', exit_code = 3, stderr = 'boom' WHERE seq = 2")
    sql.execute(
        "UPDATE jobs SET status = 'failed', exit_code = -1, stderr = 'job timed out' WHERE seq = 3"
    )
    sql.execute(
        "UPDATE jobs SET status = 'failed', exit_code = -1, stderr = 'node lost' WHERE seq = 4"
    )

    reopened = PostgresStore(db_url)
    try:
        loaded = {found.seq: found for found in reopened.load().jobs}
        cancelled_output = reopened.read_outputs(1)  # kept apart from the job since version 3
    finally:
        reopened.close()
    cancelled = loaded[1]
    assert (cancelled.status, cancelled.reason, cancelled.exit_code) == ("failed", "cancelled", -1)
    assert cancelled_output == {0: Output("", "job cancelled")}
    assert cancelled.finished_at == 9
    assert {seq: (found.status, found.reason) for seq, found in loaded.items() if seq > 1} == {
        2: ("failed", "exit"),
        3: ("failed", "timeout"),
        4: ("failed", "node_lost"),
        5: ("pending", None),
    }
    assert not any(found.holds_slot or found.moved_from for found in loaded.values())
    assert sql.execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)


def test_a_version_1_database_is_migrated_with_its_output_moved_out(
    db_url: str, sql: psycopg.Connection
) -> None:
    """Before version 3 the output sat in the jobs table: the current attempt's in columns
    (NUL stored escaped, as U+FFFF '0'), the earlier ones' inside the attempts JSON."""
    for statement in schema.step(1).postgres:
        sql.execute(statement)  # version 1's statements are text
    sql.execute("INSERT INTO schema_version VALUES (1)")
    for column in schema.columns("jobs"):  # the jobs table as version 1 declared it
        if column.name != "seq":
            for statement in schema.add_column(column, schema.POSTGRES):
                sql.execute(statement)
    sql.execute(
        "ALTER TABLE jobs ADD COLUMN stdout TEXT NOT NULL DEFAULT '', "
        "ADD COLUMN stderr TEXT NOT NULL DEFAULT ''"
    )
    attempts = (
        '[{"node_id":"a","exit_code":1,"stdout":"o0 \\u0000","stderr":"","running_at":5,'
        '"finished_at":6},{"node_id":"b","exit_code":null,"stdout":"","stderr":"",'
        '"running_at":null,"finished_at":null}]'
    )
    sql.execute(
        "INSERT INTO jobs (seq, node_id, command, created_at, status, retry_count, exit_code, "
        "stdout, stderr, running_at, finished_at, attempts) VALUES "
        "(1, 'n', 'x', %s, 'done', 0, 0, 'out \uffff0 \uffff\uffff', '', 3, 4, NULL), "
        "(2, 'n', 'y', %s, 'failed', 2, 9, '', 'last', 7, 8, %s), "
        "(3, 'n', 'z', %s, 'pending', 0, NULL, '', '', NULL, NULL, NULL)",
        (T0, T0, attempts, T0),
    )

    store = PostgresStore(db_url)
    try:
        loaded = store.load().jobs
        outputs = [store.read_outputs(seq) for seq in (1, 2, 3)]
    finally:
        store.close()

    common = {"node_id": "n", "created_at": T0}
    assert loaded == [
        Job(seq=1, command="x", status=jobs.DONE, exit_code=0, running_at=3, finished_at=4,
            **common),
        Job(seq=2, command="y", status=jobs.FAILED, reason=jobs.Reason.EXIT, retry_count=2,
            exit_code=9, running_at=7, finished_at=8, **common, attempts=(
                Attempt("a", 1, "", "", 5, 6), Attempt("b", None, "", "", None, None),
            )),
        Job(seq=3, command="z", **common),
    ]  # fmt: skip
    assert outputs == [
        {0: Output("out \x00 \uffff", "")},
        {0: Output("o0 \x00", ""), 2: Output("", "last")},
        {},
    ]
    columns = {
        row[0]
        for row in sql.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs'"
        )
    }
    assert columns == set(rows.COLUMNS)
    stored = sql.execute("SELECT attempts FROM jobs WHERE seq = 2").fetchone()[0]
    assert "o0" not in stored and "stdout" not in stored
