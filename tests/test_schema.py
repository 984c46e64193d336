"""The schema of both SQL backends (`storage/schema.py`): databases written by older versions
keep opening with every job intact (the checked-in fixtures of `tests/fixtures/`, see
`make_fixtures.py`), a field added to the declaration becomes a column on both with its
default, and a numbered step runs on both.

Real PostgreSQL for its half; skipped (visibly) without a server.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import PostgresDatabases
from fixtures import make_fixtures

from tiny_scheduler.domain.jobs import Attempt, Dependency, Job
from tiny_scheduler.domain.nodes import NodeRecord
from tiny_scheduler.domain.schedules import Schedule
from tiny_scheduler.domain.validation import JobRequest
from tiny_scheduler.storage import schema
from tiny_scheduler.storage.postgres import PostgresStore
from tiny_scheduler.storage.sqlite import SqliteStore

EXPECTED = json.loads(make_fixtures.EXPECTED.read_text())


def restore(dump: Path, url: str) -> None:
    """Replay a plain `pg_dump --inserts` into the (empty) database at `url`, through the
    driver: psql's own commands (`\\restrict`) are left out, the rest is plain SQL."""
    import psycopg

    script = "\n".join(line for line in dump.read_text().splitlines() if not line.startswith("\\"))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(script)


def drop_added_defaults(found: dict[str, Any], expected: dict[str, Any], cls: type) -> None:
    """Take out of `found` (one stored record, as JSON) the fields of `cls` added since the
    fixtures were made, each of which must read as its declared default."""
    defaults = {
        f.name: make_fixtures.plain(f.default)
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING
    }
    for name in set(found) - set(expected):
        assert found.pop(name) == defaults[name], f"{cls.__name__}.{name} in {expected}"


def assert_holds_the_fixture(found: dict[str, Any]) -> None:
    """`found` (`make_fixtures.read_back`) is what the fixtures were made with; a field added
    since (of a job, an attempt, a schedule or its job, a node) reads as its declared default."""
    jobs = found.pop("jobs")
    expected_jobs = EXPECTED["jobs"]
    assert [job["seq"] for job in jobs] == [job["seq"] for job in expected_jobs]
    for job, expected in zip(jobs, expected_jobs, strict=True):
        for attempt, expected_attempt in zip(job["attempts"], expected["attempts"], strict=True):
            drop_added_defaults(attempt, expected_attempt, Attempt)
        drop_added_defaults(job, expected, Job)
        assert job == expected
    for schedule, expected_schedule in zip(found["schedules"], EXPECTED["schedules"], strict=True):
        drop_added_defaults(schedule["job"], expected_schedule["job"], JobRequest)
        drop_added_defaults(schedule, expected_schedule, Schedule)
    for node, expected_node in zip(found["nodes"], EXPECTED["nodes"], strict=True):
        drop_added_defaults(node, expected_node, NodeRecord)
    assert found == {name: value for name, value in EXPECTED.items() if name != "jobs"}


def test_the_sqlite_fixture_opens_with_every_job_intact(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.db"
    shutil.copyfile(make_fixtures.SQLITE_FIXTURE, path)
    store = SqliteStore(str(path))
    try:
        found = make_fixtures.read_back(store)
    finally:
        store.close()
    assert_holds_the_fixture(found)


def test_the_postgres_fixture_opens_with_every_job_intact(
    postgres_database: PostgresDatabases,
) -> None:
    url = postgres_database.create()
    restore(make_fixtures.POSTGRES_FIXTURE, url)
    store = PostgresStore(url)
    try:
        found = make_fixtures.read_back(store)
    finally:
        store.close()
    assert_holds_the_fixture(found)


# --- both backends, one mechanism -------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class NextJob(Job):
    """A job as a later version might declare it: new fields of each kind, with defaults."""

    note: str = "none yet"
    weight: int = 7
    deadline: int | None = None
    pinned: bool = True
    mode: Dependency = Dependency.ANY
    tags: tuple[str, ...] = ()


NEW = {"note": "none yet", "weight": 7, "deadline": None, "pinned": 1, "mode": "any", "tags": None}
"""The new columns' values in rows written before them: each field's default, as stored."""


class Backend:
    """One backend's fixture database, opened with the code under test, and read with SQL."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        if kind == "sqlite":
            path = tmp_path / "scheduler.db"
            shutil.copyfile(make_fixtures.SQLITE_FIXTURE, path)
            self.location = str(path)
            self.open: Callable[[], Any] = lambda: SqliteStore(self.location)
        else:
            databases: PostgresDatabases = request.getfixturevalue("postgres_database")
            self.location = databases.create()
            restore(make_fixtures.POSTGRES_FIXTURE, self.location)
            self.open = lambda: PostgresStore(self.location)

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.location)
            try:
                return conn.execute(statement).fetchall()
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(self.location) as conn:
            return conn.execute(statement).fetchall()

    def read_back(self) -> dict[str, Any]:
        store = self.open()
        try:
            return make_fixtures.read_back(store)
        finally:
            store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return Backend(request.param, tmp_path, request)


def test_a_declared_field_becomes_a_column_with_its_default_on_both_backends(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one edit a new field takes is its declaration: a database of the previous version
    (the fixture) gets its column, every row already there holding the field's default."""
    monkeypatch.setitem(schema.DECLARED, "jobs", NextJob)
    assert_holds_the_fixture(backend.read_back())
    names = ", ".join(f'"{name}"' for name in NEW)
    found = backend.query(f"SELECT seq, {names} FROM jobs ORDER BY seq")
    seqs = [job["seq"] for job in EXPECTED["jobs"]]
    assert found == [(seq, *NEW.values()) for seq in seqs]
    assert backend.query("SELECT version FROM schema_version") == [(schema.SCHEMA_VERSION,)]
    # Opened again: nothing is missing any more, nothing changes.
    assert_holds_the_fixture(backend.read_back())
    assert backend.query(f"SELECT seq, {names} FROM jobs ORDER BY seq") == found


def test_a_numbered_step_written_once_runs_on_both_backends(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data change is a numbered step; one written for both dialects runs on each, once,
    before the declared columns are added (here a backfill of one)."""
    monkeypatch.setitem(schema.DECLARED, "jobs", NextJob)
    newer = schema.SCHEMA_VERSION + 1
    step = schema.Step(
        newer,
        **schema.both(
            "ALTER TABLE jobs ADD COLUMN note TEXT NOT NULL DEFAULT 'none yet'",
            "UPDATE jobs SET note = 'was ' || status WHERE status <> 'pending'",
        ),
    )
    monkeypatch.setattr(schema, "STEPS", (*schema.STEPS, step))
    monkeypatch.setattr(schema, "SCHEMA_VERSION", newer)
    found = backend.read_back()
    assert_holds_the_fixture(found)
    backend.read_back()  # the step does not run twice
    notes = backend.query("SELECT seq, note, weight FROM jobs ORDER BY seq")
    expected = [
        (job["seq"], "none yet" if job["status"] == "pending" else f"was {job['status']}", 7)
        for job in EXPECTED["jobs"]
    ]
    assert notes == expected
    assert backend.query("SELECT version FROM schema_version") == [(newer,)]


def test_a_sqlite_file_and_a_postgres_database_made_new_have_the_same_columns(
    tmp_path: Path, postgres_database: PostgresDatabases
) -> None:
    path = tmp_path / "new.db"
    SqliteStore(str(path)).close()
    url = postgres_database.create()
    PostgresStore(url).close()
    conn = sqlite3.connect(path)
    in_sqlite = {
        table: {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        for table in ("jobs", "schedules", "outputs", "outbox", "nodes", "queues", "meta")
    }
    conn.close()
    import psycopg

    with psycopg.connect(url) as pg:
        in_postgres = {
            table: {
                row[0]
                for row in pg.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = %s",
                    (table,),
                )
            }
            for table in in_sqlite
        }
    assert in_sqlite == in_postgres
    assert in_sqlite["jobs"] == {column.name for column in schema.columns("jobs")}
