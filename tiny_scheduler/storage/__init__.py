"""Where jobs are kept durably: one storage contract (`base.JobStore`), its backends, and the
group-committing writer above them (`writer.Writer`).

`open_store(SCHEDULER_DB)` chooses the backend by the value's form: a `postgresql://` URL
names a PostgreSQL database, anything else is a SQLite file path.
"""

from __future__ import annotations

from .base import Batch, JobStore, Loaded, StoreOpenError
from .writer import Writer

__all__ = ["Batch", "JobStore", "Loaded", "StoreOpenError", "Writer", "check", "open_store"]


def open_store(db: str) -> JobStore:
    """The backend for a SCHEDULER_DB value, opened (and migrated when needed)."""
    from .sqlite import SqliteStore

    return SqliteStore(db)


def check(db: str) -> None:
    """Open the database once to find out whether it can be used (StoreOpenError if not)."""
    from . import sqlite

    sqlite.check(db)
