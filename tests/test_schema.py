"""The schema of both SQL backends: databases written by older versions keep opening with every
job intact (the checked-in fixtures of `tests/fixtures/`, see `make_fixtures.py`).

Real PostgreSQL for its half; skipped (visibly) without a server.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from conftest import PostgresDatabases
from fixtures import make_fixtures

from tiny_scheduler.domain.jobs import Job
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


def assert_holds_the_fixture(found: dict[str, Any]) -> None:
    """`found` (`make_fixtures.read_back`) is what the fixtures were made with; a job field
    added since reads as its declared default."""
    defaults = {
        f.name: make_fixtures.plain(f.default)
        for f in dataclasses.fields(Job)
        if f.default is not dataclasses.MISSING
    }
    jobs = found.pop("jobs")
    expected_jobs = EXPECTED["jobs"]
    assert [job["seq"] for job in jobs] == [job["seq"] for job in expected_jobs]
    for job, expected in zip(jobs, expected_jobs, strict=True):
        assert {name: job[name] for name in expected} == expected
        newer = {name: value for name, value in job.items() if name not in expected}
        assert newer == {name: defaults[name] for name in newer}, f"job-{job['seq']}"
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
