"""The audit trail: recording each change asked for through the API, reading the trail
(`GET /audit`), and dropping what is older than the retention.

A record is written to the store before the answer it describes leaves (the API records it
once the answer's status is known, right after the change itself committed), then kept in
memory for reading.

Tests: `tests/test_audit.py`.
"""

from __future__ import annotations

import logging

from ..domain.audit import AuditQuery, AuditRecord
from ..domain.roles import Principal
from ..storage import Batch
from .core import Core

log = logging.getLogger("tiny_scheduler.service")


class AuditOps:
    """Recording and reading the audit trail."""

    def __init__(self, core: Core) -> None:
        self._core = core

    def record(
        self, who: Principal, address: str, action: str, target: str, status: int
    ) -> AuditRecord:
        """Keep one record: shown at once, committed with the next commit (at most
        `writer.RIDE_SECS` later), not waited for: the change it records is durable already,
        and a second commit per request would cost every change a second fsync."""
        core = self._core
        record = AuditRecord(
            id=core.audit.new_id(),
            at=core.now(),
            user=who.user,
            role=who.role.value,
            address=address,
            action=action,
            target=target,
            status=status,
        )
        core.store.save_soon(Batch(audit=(record,)))
        core.audit.add(record)
        return record

    def page(self, query: AuditQuery) -> tuple[list[AuditRecord], int | None]:
        return self._core.audit.page(query)

    def expire(self, cutoff: int, limit: int = 10000) -> int:
        """Drop up to `limit` records from before `cutoff`; how many went."""
        core = self._core
        ids = core.audit.older_than(cutoff)[:limit]
        if ids:
            core.store.delete_audit(ids)
            core.audit.drop(ids)
            log.info("retention: %d audit records removed", len(ids))
        return len(ids)
