"""Where jobs are kept durably: one storage contract (`base.JobStore`), its backends, and the
group-committing writer above them (`writer.Writer`).

`open_store(SCHEDULER_DB)` chooses the backend by the value's form: a `postgresql://` URL
names a PostgreSQL database, anything else is a SQLite file path.
"""

from __future__ import annotations

from .base import Batch, JobStore, Loaded, OutboxEvent, OutcomeUnknown, StoreOpenError
from .writer import Writer

__all__ = [
    "Batch",
    "JobStore",
    "Loaded",
    "OutboxEvent",
    "OutcomeUnknown",
    "StoreOpenError",
    "Writer",
    "check",
    "is_postgres",
    "open_store",
]


def is_postgres(db: str) -> bool:
    """Whether a SCHEDULER_DB value names a PostgreSQL database rather than a SQLite file."""
    return db.startswith(("postgresql://", "postgres://"))


def open_store(db: str, wait_secs: float = 0.0, lease_secs: float = 5.0) -> JobStore:
    """The backend for a SCHEDULER_DB value, opened (and migrated when needed). A SQLite file
    is this process's alone until the store is closed; another scheduler holding it is waited
    for up to `wait_secs`, then refused (StoreOpenError). A PostgreSQL database is shared by
    every daemon: its store is fenced, writing only once the leadership gave it an epoch."""
    if is_postgres(db):
        from .postgres import PostgresStore

        return PostgresStore(db, lease_secs=lease_secs, fenced=True)
    from .sqlite import SqliteStore

    return SqliteStore(db, wait_secs)


def check(db: str, wait_secs: float = 0.0) -> None:
    """Open the database once to find out whether it can be used (StoreOpenError if not)."""
    if is_postgres(db):
        from . import postgres

        postgres.check(db)
        return
    from . import sqlite

    sqlite.check(db, wait_secs)
