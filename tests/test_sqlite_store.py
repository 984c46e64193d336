"""The SQLite backend's own duties: files it cannot understand are refused, not damaged, and
the columns it stores are the ones the job declaration names; one store per file at a time; a
file deleted or replaced under it is written no more, and ids go on above those handed out
from the path; a row that cannot be read is named."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from tiny_scheduler.jobs import Job
from tiny_scheduler.storage import Batch, OutboxEvent, StoreOpenError, rows, sqlite
from tiny_scheduler.storage.sqlite import MIGRATIONS, SCHEMA_VERSION, SqliteStore


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
        conn.executescript(sqlite.MIGRATIONS[1])
        conn.execute("INSERT INTO schema_version (version) VALUES (1)")
        # Only the columns version 1 had: later versions add theirs with their defaults.
        v1 = {column[1] for column in conn.execute("PRAGMA table_info(jobs)")}
        values = dict(zip(rows.COLUMNS, rows.to_row(job), strict=True))
        names = [name for name in rows.COLUMNS if name in v1]
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
        conn.executescript(MIGRATIONS[1])
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
    finally:
        store.close()
    cancelled = loaded[1]
    assert (cancelled.status, cancelled.reason, cancelled.exit_code, cancelled.stderr) == (
        "failed",
        "cancelled",
        -1,
        "job cancelled",
    )
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
