"""The SQLite backend's own duties: files it cannot understand are refused, not damaged, and
the columns it stores are the ones the job declaration names; one store per file at a time; a
file deleted or replaced under it is written no more, and ids go on above those handed out
from the path; a row that cannot be read is named; the output stays out of the jobs table (and
out of the load), and older files are migrated."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.jobs import Attempt, Job, Output
from tiny_scheduler.storage import Batch, OutboxEvent, StoreOpenError, Writer, rows, schema, sqlite
from tiny_scheduler.storage.schema import SCHEMA_VERSION
from tiny_scheduler.storage.sqlite import SqliteStore


def test_the_table_has_exactly_the_declared_columns(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    SqliteStore(str(path)).close()
    with sqlite3.connect(path) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
    conn.close()
    assert columns == set(rows.COLUMNS)


def test_a_file_from_a_newer_scheduler_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    SqliteStore(str(path)).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    conn.close()
    with pytest.raises(StoreOpenError, match="newer"):
        SqliteStore(str(path))


def test_a_foreign_sqlite_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (name TEXT)")
        conn.execute("INSERT INTO customers VALUES ('ada')")
    conn.close()
    with pytest.raises(StoreOpenError, match="not a tiny-scheduler database"):
        SqliteStore(str(path))
    with sqlite3.connect(path) as conn:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master")]
        rows = conn.execute("SELECT name FROM customers").fetchall()
    conn.close()
    assert (tables, rows) == (["customers"], [("ada",)])


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    path.write_bytes(b"this is not a database, just some text " * 100)
    with pytest.raises(StoreOpenError):
        SqliteStore(str(path))


# --- one owner per file -----------------------------------------------------------------------


def test_a_second_store_on_the_same_file_is_refused_naming_the_owner(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    first = SqliteStore(str(path))
    try:
        with pytest.raises(StoreOpenError) as refused:
            SqliteStore(str(path))
        assert str(refused.value) == (
            f"database {path} is in use by another scheduler (pid {os.getpid()})"
        )
        # The daemon's start-up check is refused the same way.
        with pytest.raises(StoreOpenError, match="is in use by another scheduler"):
            sqlite.check(str(path))
    finally:
        first.close()
    SqliteStore(str(path)).close()  # closing lets go
    sqlite.check(str(path))


def test_the_check_lets_go_of_the_file(tmp_path: Path) -> None:
    """The master checks, then its worker opens: the check must not keep the file."""
    path = tmp_path / "jobs.db"
    sqlite.check(str(path))
    SqliteStore(str(path)).close()


# --- a file deleted or replaced under the store ------------------------------------------


def save(store: SqliteStore, seq: int) -> None:
    store.write(Batch(upserts=[Job(seq=seq, node_id="n", command="x", created_at=1)]))


def test_a_deleted_file_is_written_no_more(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(str(path))
    try:
        save(store, 1)
        path.unlink()
        with pytest.raises(sqlite.FileLost, match="was deleted while in use") as lost:
            save(store, 2)
        assert store.is_fault(lost.value)
        with pytest.raises(sqlite.FileLost):
            store.write(Batch(probe=True))
    finally:
        store.close()


def test_a_replaced_file_is_written_no_more_nor_given_the_old_files_changes(
    tmp_path: Path,
) -> None:
    """A backup restored over the live file: the store stops writing, and the changes made
    since the backup (in the old file's write-ahead log, which SQLite finds by the path's name)
    do not leak into the restored file."""
    path = tmp_path / "jobs.db"
    store = SqliteStore(str(path))
    try:
        save(store, 1)
        backup(path, tmp_path / "backup.db")
        save(store, 2)
        os.replace(tmp_path / "backup.db", path)
        with pytest.raises(sqlite.FileLost, match="was replaced by another file"):
            save(store, 3)
    finally:
        store.close()
    assert [job.seq for job in load(path)] == [1]


def test_a_file_moved_away_keeps_everything_that_was_committed(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(str(path))
    try:
        save(store, 1)
        save(store, 2)
        path.rename(tmp_path / "moved.db")
        with pytest.raises(sqlite.FileLost, match="was deleted while in use"):
            save(store, 3)
    finally:
        store.close()
    assert [job.seq for job in load(tmp_path / "moved.db")] == [1, 2]


def backup(source: Path, target: Path) -> None:
    """A consistent copy, as `sqlite3 .backup` takes it."""
    with sqlite3.connect(source) as live, sqlite3.connect(target) as copy:
        live.backup(copy)
    live.close()
    copy.close()


def test_a_removed_lock_file_stops_writes(tmp_path: Path) -> None:
    """Without its lock file, another scheduler could take the database: stop acknowledging."""
    path = tmp_path / "jobs.db"
    store = SqliteStore(str(path))
    try:
        Path(f"{path}.lock").unlink()
        with pytest.raises(sqlite.FileLost, match=r"lock file .* was removed"):
            save(store, 1)
    finally:
        store.close()


def load(path: Path) -> list[Job]:
    store = SqliteStore(str(path))
    try:
        return store.load().jobs
    finally:
        store.close()


def test_ids_go_on_after_the_file_was_deleted(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(str(path))
    save(store, 41)
    store.close()
    for leftover in tmp_path.glob("jobs.db*"):
        if leftover.name != "jobs.db.lock":
            leftover.unlink()
    store = SqliteStore(str(path))
    try:
        loaded = store.load()
    finally:
        store.close()
    assert (loaded.jobs, loaded.last_seq) == ([], 41)


# --- rows that cannot be read ---------------------------------------------------------------


BROKEN_ROWS = {
    "invalid UTF-8": (
        "UPDATE jobs SET command = CAST(x'6563686fff' AS TEXT) WHERE seq = 2",
        "job job-2 cannot be read: command is not valid UTF-8",
    ),
    "broken JSON": (
        """UPDATE jobs SET env_vars = '{"A":' WHERE seq = 2""",
        "job job-2 cannot be read: env_vars is not valid JSON",
    ),
    "attempts of the wrong shape": (
        "UPDATE jobs SET attempts = '[1]' WHERE seq = 2",
        "job job-2 cannot be read: its values do not make a job (TypeError",
    ),
    "an unknown status": (
        "UPDATE jobs SET status = 'lost' WHERE seq = 2",
        "job job-2 cannot be read: status 'lost' is none of pending, running,",
    ),
}


@pytest.mark.parametrize("broken", sorted(BROKEN_ROWS))
def test_a_row_that_cannot_be_read_is_named(tmp_path: Path, broken: str) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(str(path))
    for seq in (1, 2, 3):
        save(store, seq)
    store.close()
    statement, expected = BROKEN_ROWS[broken]
    with sqlite3.connect(path) as conn:
        conn.execute(statement)
    conn.close()
    store = SqliteStore(str(path))
    try:
        with pytest.raises(StoreOpenError) as refused:
            store.load()
    finally:
        store.close()
    assert str(refused.value).startswith(f"job database {str(path)!r}: {expected}"), refused.value


def test_a_file_of_schema_version_1_gets_the_outbox_and_keeps_its_jobs(tmp_path: Path) -> None:
    """Files written before the outbox (schema version 1) are migrated in place."""
    path = tmp_path / "jobs.db"
    job = Job(seq=7, node_id="n", command="echo kept", created_at=1, env_vars={"A": "1"})
    with sqlite3.connect(path) as conn:
        for statement in schema.step(1).sqlite:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_version (version) VALUES (1)")
        # Only the columns version 1 had: later versions add theirs with their defaults.
        v1 = {column[1] for column in conn.execute("PRAGMA table_info(jobs)")}
        values = dict(zip(rows.COLUMNS, rows.to_row(job), strict=True))
        values.update(stdout="", stderr="")  # version 1 kept the output in the jobs table
        names = [name for name in values if name in v1]
        marks = ", ".join("?" for _ in names)
        conn.execute(
            f"INSERT INTO jobs ({', '.join(names)}) VALUES ({marks})", [values[n] for n in names]
        )
    conn.close()
    store = SqliteStore(str(path))
    try:
        loaded = store.load()
        assert (loaded.jobs, loaded.last_seq, loaded.events) == ([job], 7, 0)
        store.write(Batch(events=[OutboxEvent(7, "done")]))
        assert store.outbox(10) == [OutboxEvent(7, "done", 1)]
    finally:
        store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


# --- version 2: reasons, no `cancelled` status --------------------------------------------------

_V1_COLUMNS = (
    "seq, node_id, command, created_at, instance_id, deploy_url, job_type, port, env_vars, "
    "timeout_secs, status, retry_count, exit_code, stdout, stderr, running_at, finished_at, "
    "attempts, dedupe_key"
)


def _v1_row(seq: int, status: str, exit_code: int | None, stderr: str) -> tuple[object, ...]:
    finished = 3_000 if status in ("done", "failed", "cancelled") else None
    running = None if status in ("pending", "cancelled") else 2_000
    head = (seq, "node-a", f"cmd {seq}", 1_000, "", "", "run", 0, None, 0, status, 0)
    return (*head, exit_code, "", stderr, running, finished, None, None)


def test_a_version_1_file_is_migrated_cancelled_rows_become_failures_with_reasons(
    tmp_path: Path,
) -> None:
    """Version 1 had a `cancelled` status and no reasons. Its cancelled rows become the form
    every client understands, and each stored failure (final, in version 1) gets its reason
    from the fixed texts the scheduler wrote for its own failures."""
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:
        for statement in schema.step(1).sqlite:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_version (version) VALUES (1)")
        rows_v1 = [
            _v1_row(1, "cancelled", None, ""),
            _v1_row(2, "failed", 3, "boom"),
            _v1_row(3, "failed", -1, "job timed out"),
            _v1_row(4, "failed", -1, "node lost"),
            _v1_row(5, "failed", -1, "download error: 404"),  # the agent's -1: an exit
            _v1_row(6, "done", 0, ""),
            _v1_row(7, "pending", None, ""),
            _v1_row(8, "running", None, ""),
        ]
        conn.executemany(
            f"INSERT INTO jobs ({_V1_COLUMNS}) VALUES ({', '.join('?' * 19)})", rows_v1
        )
    conn.close()

    store = SqliteStore(str(path))
    try:
        loaded = {job.seq: job for job in store.load().jobs}
        cancelled_output = store.read_outputs(1)  # kept apart from the job since version 4
    finally:
        store.close()
    cancelled = loaded[1]
    assert (cancelled.status, cancelled.reason, cancelled.exit_code) == ("failed", "cancelled", -1)
    assert cancelled_output == {0: Output("", "job cancelled")}
    assert cancelled.finished_at == 3_000, "it keeps when it was cancelled"
    assert {seq: (job.status, job.reason) for seq, job in loaded.items() if seq > 1} == {
        2: ("failed", "exit"),
        3: ("failed", "timeout"),
        4: ("failed", "node_lost"),
        5: ("failed", "exit"),
        6: ("done", None),
        7: ("pending", None),
        8: ("running", None),
    }
    assert not any(job.holds_slot or job.moved_from for job in loaded.values())
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        assert conn.execute("SELECT count(*) FROM jobs WHERE status = 'cancelled'").fetchone() == (
            0,
        )
    conn.close()


# --- output, kept apart from the jobs ------------------------------------------------------------

T0 = 1_764_498_030_123_456


def finished(seq: int, stdout: str = "out", stderr: str = "err") -> Job:
    job = Job(seq=seq, node_id="n", command="x", created_at=T0)
    return jobs.finish(jobs.start(job, T0 + 1), jobs.DONE, 0, stdout, stderr, T0 + 2)


def saved_store(path: Path, *saved: Job) -> None:
    store = Writer(SqliteStore(str(path)))
    store.start()
    store.save(*saved)
    store.close()


def test_loading_never_reads_the_output(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    retried = jobs.retry(finished(2).evolve(status=jobs.FAILED), "m")
    saved_store(path, finished(1, "x" * 100_000), retried)
    store = SqliteStore(str(path))
    read: set[tuple[str, str]] = set()

    def watch(action: int, table: str | None, column: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_READ:
            read.add((table or "", column or ""))
        return sqlite3.SQLITE_OK

    store._conn.set_authorizer(watch)  # the backend's own connection, as load() uses it
    loaded = store.load().jobs
    store.close()
    assert loaded == [finished(1).without_output(), retried.without_output()]
    tables = {table for table, _ in read}
    assert "jobs" in tables, "the authorizer saw no read of the jobs: the check proves nothing"
    assert "outputs" not in tables


# Each column the load reads packed (`rows.RARE_COLUMNS`), off its default.
OFF_DEFAULT: dict[str, object] = {
    "instance_id": "i-1",
    "deploy_url": "http://deploy",
    "job_type": jobs.JobType.SERVICE,
    "port": 8080,
    "env_vars": {"A": "1"},
    "timeout_secs": 5,
    "not_before": 7,
    "schedule_id": "sched-1",
    "depends_on": (1,),
    "dependency": jobs.Dependency.ANY,
    "priority": 0,
    "queue": "nightly",
    "reason": jobs.Reason.EXIT,
    "dedupe_key": "http:k",
    "holds_slot": True,
    "moved_from": "node-z",
    "named_claim": True,
    "keyed_claim": True,
    "name": "nightly-report",
    "owner": "alice",
    "cpus": 4,
    "memory_mb": 512,
    "gpus": 1,
    "node_selector": {"gpu": "a100"},
    "node_ids": ("node-a",),
    "max_retries": 0,
    "array_id": 3,
    "array_index": 0,
    "held": True,
    "retry_of": 2,
    "usage": jobs.Usage(1.5, 20.0, 2.25),
}


def typed(job: Job) -> list[tuple[type, object]]:
    """A job's values with their types: equal is not enough ("run" == JobType.RUN, 1 == True)."""
    return [(type(value), value) for value in jobs._FIELD_VALUES(job)]


def test_the_packed_load_reads_each_rarely_set_field_as_saved(tmp_path: Path) -> None:
    """The load reads the rarely set columns packed into one value, NULL when all hold their
    defaults: a job setting any one of them loads as saved, and so does one setting none,
    value for value and type for type, exactly as the full row reads."""
    assert set(OFF_DEFAULT) == set(rows.RARE_COLUMNS)
    path = tmp_path / "jobs.db"
    plain = finished(1)
    saved = [plain, jobs.retry(finished(2).evolve(status=jobs.FAILED), "m")]
    for seq, (name, value) in enumerate(sorted(OFF_DEFAULT.items()), start=3):
        saved.append(finished(seq).evolve(**{name: value}))
    saved_store(path, *saved)
    store = SqliteStore(str(path))
    loaded = store.load().jobs
    full_rows = [rows.from_row(row) for row in store._conn.execute(store.SQL.select_jobs)]
    store.close()
    assert [typed(job) for job in loaded] == [typed(job.without_output()) for job in saved]
    assert [typed(job) for job in loaded] == [typed(job) for job in full_rows]


@pytest.mark.parametrize("damaged", ["outputs", "jobs"])
def test_the_load_checks_the_whole_file_naming_a_damaged_page(tmp_path: Path, damaged: str) -> None:
    """The quick check runs beside the load: a damaged page is found where the load reads
    (the jobs) and where it never does (the outputs), and named as corruption."""
    path = tmp_path / "jobs.db"
    saved_store(path, *(finished(seq, "x" * 1000) for seq in range(1, 50)))
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    query = "SELECT rootpage FROM sqlite_master WHERE name = ?"
    root = conn.execute(query, (damaged,)).fetchone()[0]
    conn.close()
    with open(path, "r+b") as f:  # scribble over the header of the table's root page
        f.seek((root - 1) * page_size)
        f.write(b"\x00" * 16)
    sqlite.check(str(path))  # the master's check opens it: the pages are the load's to find
    store = SqliteStore(str(path))
    try:
        with pytest.raises(StoreOpenError, match=f"^job database '{path}' is corrupt: "):
            store.load()
    finally:
        store.close()


def test_a_read_stopped_early_leaves_no_snapshot_behind(tmp_path: Path) -> None:
    """A listing whose client went away must not keep the write-ahead log from being folded
    back into the file (it would grow without end)."""
    path = tmp_path / "jobs.db"
    saved_store(path, *(finished(seq) for seq in range(1, 600)))
    store = SqliteStore(str(path))
    store.write(Batch(upserts=[finished(600)]))  # something in the log to fold back
    other = sqlite3.connect(path, isolation_level=None)
    reading = store.read_latest_outputs(range(1, 601))
    next(reading)
    store.write(Batch(upserts=[finished(601)]))
    busy, _, _ = other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    assert busy == 1, "the open read should hold the log: the check proves nothing"
    reading.close()
    busy, _, _ = other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    other.close()
    store.close()
    assert busy == 0


def test_a_version_3_file_is_migrated_with_its_output_moved_out(tmp_path: Path) -> None:
    """Before version 4 the output sat in the jobs table: the current attempt's in columns,
    the earlier ones' inside the attempts JSON (as objects, or as lists in the oldest files)."""
    path = tmp_path / "jobs.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for step in schema.STEPS[:3]:  # what version 3 files had (but their added columns)
        for statement in step.sqlite:
            conn.execute(statement)
    conn.execute("INSERT INTO schema_version (version) VALUES (3)")
    columns = (
        "seq, node_id, command, created_at, instance_id, deploy_url, job_type, port, env_vars, "
        "timeout_secs, status, retry_count, exit_code, stdout, stderr, running_at, "
        "finished_at, attempts, dedupe_key"
    )
    attempts = [
        {"node_id": "a", "exit_code": 1, "stdout": "o0", "stderr": "", "running_at": 5,
         "finished_at": 6},
        ["b", None, "", "", None, None],
        ["c", 2, "o2", "e2 ✗", 7, 8],
    ]  # fmt: skip
    rows_v3 = [
        (1, "n", "x", T0, "", "", "run", 0, None, 0, "done", 0, 0, "out ✓", "", 3, 4, None, "k"),
        (2, "n", "y", T0, "", "", "run", 0, '{"A":"1"}', 0, "failed", 3, 9, "", "last", 9, 10,
         json.dumps(attempts), None),
        (3, "n", "z", T0, "", "", "run", 0, None, 0, "pending", 0, None, "", "", None, None,
         None, None),
    ]  # fmt: skip
    conn.executemany(f"INSERT INTO jobs ({columns}) VALUES ({', '.join('?' * 19)})", rows_v3)
    conn.close()

    store = SqliteStore(str(path))
    loaded = store.load().jobs
    outputs = [store.read_outputs(seq) for seq in (1, 2, 3)]
    store.close()

    common = {"node_id": "n", "created_at": T0}
    assert loaded == [
        Job(seq=1, command="x", status=jobs.DONE, exit_code=0, running_at=3, finished_at=4,
            dedupe_key="k", **common),
        Job(seq=2, command="y", env_vars={"A": "1"}, status=jobs.FAILED, retry_count=3,
            exit_code=9, running_at=9, finished_at=10, **common, attempts=(
                Attempt("a", 1, "", "", 5, 6),
                Attempt("b", None, "", "", None, None),
                Attempt("c", 2, "", "", 7, 8),
            )),
        Job(seq=3, command="z", **common),
    ]  # fmt: skip
    assert outputs == [
        {0: Output("out ✓", "")},
        {0: Output("o0", ""), 2: Output("o2", "e2 ✗"), 3: Output("", "last")},
        {},
    ]
    with sqlite3.connect(path) as conn:
        columns_now = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        stored = conn.execute("SELECT attempts FROM jobs WHERE seq = 2").fetchone()[0]
    conn.close()
    assert columns_now == set(rows.COLUMNS)
    assert "o2" not in stored and "stdout" not in stored
