"""A `JobStore` in memory, for the decision tests' harness: the same contract as the SQL
backends (`tests/test_storage_contract.py` runs it too), nothing durable.

It records every batch it commits (`batches`), so a test can say not only what the jobs are
after an operation but what the operation committed, and in how many transactions. It can be
told to fail (`fail_with`), as a disk that filled would. Its data lives in a `MemoryDatabase`
that outlives the store, so a test can "restart" by opening a new store on the same one.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Sequence

from ..domain.audit import AuditRecord
from ..domain.jobs import Job, Output
from ..domain.nodes import NodeRecord
from ..domain.queues import QueueSettings
from ..domain.schedules import Schedule
from ..domain.tokens import Token
from ..domain.users import UserSettings
from .base import Batch, Loaded, OutboxEvent


class DuplicateKey(ValueError):
    """An upsert whose dedupe key another stored job has (a UNIQUE constraint, in SQL)."""


class MemoryFault(OSError):
    """The store cannot write (set by `fail_with`)."""


@dataclasses.dataclass
class MemoryDatabase:
    """What a `MemoryStore` keeps; shared by the stores opened on it, one after the other."""

    jobs: dict[int, Job] = dataclasses.field(default_factory=dict)  # without output
    outputs: dict[int, dict[int, Output]] = dataclasses.field(default_factory=dict)
    schedules: dict[int, Schedule] = dataclasses.field(default_factory=dict)
    outbox: list[OutboxEvent] = dataclasses.field(default_factory=list)
    last_seq: int = 0
    last_schedule_seq: int = 0
    last_event_id: int = 0
    nodes: dict[str, NodeRecord] = dataclasses.field(default_factory=dict)
    queues: dict[str, QueueSettings] = dataclasses.field(default_factory=dict)
    users: dict[str, UserSettings] = dataclasses.field(default_factory=dict)
    tokens: dict[int, Token] = dataclasses.field(default_factory=dict)
    last_token_seq: int = 0
    audit: dict[int, AuditRecord] = dataclasses.field(default_factory=dict)
    last_audit_id: int = 0


class MemoryStore:
    """The storage contract, kept in a `MemoryDatabase`."""

    location = "memory"

    def __init__(self, database: MemoryDatabase | None = None) -> None:
        self.database = database if database is not None else MemoryDatabase()
        self.batches: list[Batch] = []
        """Every batch committed, in order (probes and reads' empty batches left out)."""
        self.fault: str | None = None
        self._lock = threading.Lock()  # reads come from any thread, beside the writer

    def fail_with(self, fault: str | None) -> None:
        """From now on every write raises MemoryFault(fault); None heals the store."""
        self.fault = fault

    def load(self, compact: bool = False) -> Loaded:
        db = self.database  # only `Job`s: they are in memory already
        with self._lock:
            return Loaded(
                jobs=[db.jobs[seq] for seq in sorted(db.jobs)],
                last_seq=db.last_seq,
                events=len(db.outbox),
                schedules=[db.schedules[seq] for seq in sorted(db.schedules)],
                last_schedule_seq=db.last_schedule_seq,
                nodes=[db.nodes[node] for node in sorted(db.nodes)],
                queues=[db.queues[name] for name in sorted(db.queues)],
                users=[db.users[name] for name in sorted(db.users)],
                tokens=[db.tokens[seq] for seq in sorted(db.tokens)],
                last_token_seq=db.last_token_seq,
                audit=[db.audit[id_] for id_ in sorted(db.audit)],
                last_audit_id=db.last_audit_id,
            )

    def outbox(self, limit: int) -> list[OutboxEvent]:
        with self._lock:
            return list(self.database.outbox[:limit])

    def write(self, batch: Batch) -> None:
        if self.fault is not None:
            raise MemoryFault(self.fault)
        db = self.database
        with self._lock:
            keys = {job.dedupe_key: seq for seq, job in db.jobs.items() if job.dedupe_key}
            for job in batch.upserts:
                owner = keys.get(job.dedupe_key) if job.dedupe_key else None
                if owner is not None and owner != job.seq:
                    raise DuplicateKey(f"dedupe key {job.dedupe_key} is taken")
                keys[job.dedupe_key or ""] = job.seq
            # All checks passed: apply everything (all or nothing).
            for job in batch.upserts:
                db.jobs[job.seq] = job.without_output()
                db.outputs.setdefault(job.seq, {}).update(job.outputs())
                db.last_seq = max(db.last_seq, job.seq)
            for seq in batch.deletes:
                db.jobs.pop(seq, None)
                db.outputs.pop(seq, None)
            for event in batch.events:
                db.last_event_id += 1
                db.outbox.append(dataclasses.replace(event, id=db.last_event_id))
            if batch.delivered:
                gone = set(batch.delivered)
                db.outbox = [event for event in db.outbox if event.id not in gone]
            for schedule in batch.schedules:
                db.schedules[schedule.seq] = schedule
                db.last_schedule_seq = max(db.last_schedule_seq, schedule.seq)
            for seq in batch.schedule_deletes:
                db.schedules.pop(seq, None)
            for record in batch.nodes:
                db.nodes[record.node_id] = record
            for settings in batch.queue_settings:
                db.queues[settings.name] = settings
            for user in batch.user_settings:
                db.users[user.name] = user
            for token in batch.tokens:
                db.tokens[token.seq] = token
                db.last_token_seq = max(db.last_token_seq, token.seq)
            for seq in batch.token_deletes:
                db.tokens.pop(seq, None)
            for record in batch.audit:
                db.audit[record.id] = record
                db.last_audit_id = max(db.last_audit_id, record.id)
            for id_ in batch.audit_deletes:
                db.audit.pop(id_, None)
        if _changes(batch):
            self.batches.append(batch)

    def read_outputs(self, seq: int) -> dict[int, Output] | None:
        with self._lock:
            if seq not in self.database.jobs:
                return None
            return dict(self.database.outputs.get(seq, {}))

    def read_latest_outputs(self, seqs: Sequence[int]) -> Iterator[tuple[int, Output | None]]:
        for seq in seqs:
            with self._lock:
                job = self.database.jobs.get(seq)
                if job is None:
                    continue
                output = self.database.outputs.get(seq, {}).get(job.retry_count)
            yield seq, output

    def read_token(self, digest: str) -> Token | None:
        with self._lock:
            return next((t for t in self.database.tokens.values() if t.digest == digest), None)

    def is_fault(self, error: BaseException) -> bool:
        # As the SQL backends judge their own errors: a write that failed marks the store
        # unhealthy until one succeeds (the contract).
        return isinstance(error, (MemoryFault, DuplicateKey))

    def close(self) -> None:
        pass


def _changes(batch: Batch) -> bool:
    return bool(
        batch.upserts
        or batch.deletes
        or batch.events
        or batch.delivered
        or batch.schedules
        or batch.schedule_deletes
        or batch.nodes
        or batch.queue_settings
        or batch.user_settings
        or batch.tokens
        or batch.token_deletes
        or batch.audit
        or batch.audit_deletes
    )
