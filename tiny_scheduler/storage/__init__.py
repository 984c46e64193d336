"""Where jobs are kept durably: one storage contract (`base.JobStore`), its backends, and the
group-committing writer above them (`writer.Writer`).

`open_store(SCHEDULER_DB)` chooses the backend by the value's form: a `postgresql://` URL
names a PostgreSQL database, anything else is a SQLite file path.
"""

from __future__ import annotations

from .base import Batch, JobStore, Loaded, OutboxEvent, StoreOpenError
from .writer import Writer

__all__ = [
    "Batch",
    "JobStore",
    "Loaded",
    "OutboxEvent",
    "StoreOpenError",
    "Writer",
    "check",
    "open_store",
]


def open_store(db: str, wait_secs: float = 0.0) -> JobStore:
    """The backend for a SCHEDULER_DB value, opened (and migrated when needed). A SQLite file
    is this process's alone until the store is closed; another scheduler holding it is waited
    for up to `wait_secs`, then refused (StoreOpenError)."""
    from .sqlite import SqliteStore

    return SqliteStore(db, wait_secs)


def check(db: str, wait_secs: float = 0.0) -> None:
    """Open the database once to find out whether it can be used (StoreOpenError if not)."""
    from . import sqlite

    sqlite.check(db, wait_secs)
