"""The audit trail one daemon holds: every record within the retention, in id order.

Loaded at start-up and at each term's start; a record is added once the store committed it,
and dropped by the retention scan once the store deleted it. Thread-safe (its own lock).

Tests: `tests/test_audit.py`.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable

from ..domain.audit import AuditQuery, AuditRecord


class AuditLog:
    """Audit records in id order (which is also time order: one writer, the leader)."""

    def __init__(self, records: Iterable[AuditRecord] = (), last_id: int = 0) -> None:
        self._lock = threading.Lock()
        self._records: list[AuditRecord] = sorted(records, key=lambda record: record.id)
        self._ids: list[int] = [record.id for record in self._records]
        self._last_id = max([last_id, *self._ids[-1:]])

    def new_id(self) -> int:
        with self._lock:
            self._last_id += 1
            return self._last_id

    def add(self, record: AuditRecord) -> None:
        with self._lock:
            at = bisect.bisect(self._ids, record.id)
            self._ids.insert(at, record.id)
            self._records.insert(at, record)

    def page(self, query: AuditQuery) -> tuple[list[AuditRecord], int | None]:
        """The records matching `query` after `query.after`, oldest first, at most its
        limit, and the `after` of the next page (None when this was the last)."""
        with self._lock:
            start = bisect.bisect(self._ids, query.after)
            found: list[AuditRecord] = []
            for record in self._records[start:]:
                if not query.matches(record):
                    continue
                if len(found) == query.limit:
                    return found, found[-1].id
                found.append(record)
            return found, None

    def older_than(self, cutoff: int) -> list[int]:
        """Ids of the records from before `cutoff` (the oldest first)."""
        with self._lock:
            return [record.id for record in self._records if record.at < cutoff]

    def drop(self, ids: Iterable[int]) -> None:
        gone = set(ids)
        with self._lock:
            kept = [record for record in self._records if record.id not in gone]
            self._records = kept
            self._ids = [record.id for record in kept]

    def __len__(self) -> int:
        return len(self._records)
