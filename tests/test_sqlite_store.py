"""The SQLite backend's own duties: files it cannot understand are refused, not damaged, and
the columns it stores are the ones the job declaration names."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tiny_scheduler.storage import StoreOpenError, rows
from tiny_scheduler.storage.sqlite import SCHEMA_VERSION, SqliteStore


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
