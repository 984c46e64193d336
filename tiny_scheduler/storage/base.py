"""The storage contract: what a backend must do to keep jobs durable, and nothing more.

A backend (`sqlite.py`, `postgres.py`) is a `JobStore`: it loads every job and schedule at
start-up and writes batches of changes, each batch in one transaction that either commits
durably or raises. The SQL backends apply a batch in one shared place (`sql.py`), each
supplying only its dialect. Writes, the load and the outbox reads come from one thread at a
time (the group commit's turn, `writer.py`, or the start-up code), so they need no locking of
their own. Group commit, health tracking and the waiting of request threads live above it,
written once in `writer.py`; the behavioural tests every backend must pass are in
`tests/test_storage_contract.py`.

A job's output is kept apart from the job: the load leaves it on disk, and request threads
read it back (`read_outputs`, `read_latest_outputs`) from any thread, at the same time as each
other and as a write. Those two must therefore not use the writer's connection, nor wait for
its commits.

Besides jobs a backend keeps an **outbox**: events (the SNS messages of final states) stored
in the same transaction as the change that caused them, read back oldest first, and removed
once they were delivered. A crash between the change and the delivery therefore loses no
event; one between the delivery and the removal sends it again (at-least-once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from ..domain.audit import AuditRecord
from ..domain.jobs import Job, Output
from ..domain.nodes import NodeRecord
from ..domain.queues import QueueSettings
from ..domain.schedules import Schedule
from ..domain.tokens import Token
from ..domain.users import UserSettings


class StoreOpenError(RuntimeError):
    """The database cannot be used: corrupt, not ours, from a newer scheduler, unreachable."""


class OutcomeUnknown(RuntimeError):
    """A write's COMMIT was sent, and whether it took effect cannot be found out: the
    connection died before the answer and no other could look, or the disk failed the flush
    of a commit that may reach it anyway. A fault of the store (`is_fault`); never answered as
    "nothing was changed"."""


@dataclasses.dataclass(frozen=True, slots=True)
class OutboxEvent:
    """An event waiting in the outbox to be delivered."""

    seq: int  # the job it is about
    message: str  # what is delivered, exactly
    id: int = 0  # given by the store when it is written; orders the outbox (0 until then)


@dataclasses.dataclass(frozen=True, slots=True)
class Loaded:
    """What a store holds at start-up."""

    jobs: list[Job]  # in id order, without their output (some `Ended`, loaded with `compact`)
    last_seq: int  # the highest id ever handed out, also of jobs since deleted
    events: int = 0  # events waiting in the outbox
    schedules: list[Schedule] = dataclasses.field(default_factory=list)  # in id order
    last_schedule_seq: int = 0  # the highest schedule id ever handed out
    nodes: list[NodeRecord] = dataclasses.field(default_factory=list)  # by node id
    queues: list[QueueSettings] = dataclasses.field(default_factory=list)  # by name
    users: list[UserSettings] = dataclasses.field(default_factory=list)  # by name
    tokens: list[Token] = dataclasses.field(default_factory=list)  # in id order
    last_token_seq: int = 0  # the highest token id ever handed out
    audit: list[AuditRecord] = dataclasses.field(default_factory=list)  # in id order
    last_audit_id: int = 0  # the highest audit record id ever written


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """The changes of one transaction."""

    upserts: Sequence[Job] = ()  # insert, or replace the stored version with the same seq
    deletes: Sequence[int] = ()  # seqs to remove; the id high-water mark stays
    probe: bool = False  # also write a fresh value somewhere, to prove the store can write
    events: Sequence[OutboxEvent] = ()  # add to the outbox, after every event already there
    delivered: Sequence[int] = ()  # ids of outbox events to remove (ids not there are ignored)
    # Schedules to insert or replace (by seq), and seqs of schedules to remove; a schedule's
    # fire commits its job and the schedule's new state in one batch.
    schedules: Sequence[Schedule] = ()
    schedule_deletes: Sequence[int] = ()
    nodes: Sequence[NodeRecord] = ()  # insert or replace (by node id)
    queue_settings: Sequence[QueueSettings] = ()  # insert or replace (by queue name)
    user_settings: Sequence[UserSettings] = ()  # insert or replace (by user name)
    tokens: Sequence[Token] = ()  # insert (a token is never changed, only revoked)
    token_deletes: Sequence[int] = ()  # seqs of revoked tokens; the id high-water mark stays
    audit: Sequence[AuditRecord] = ()  # records to add (by id)
    audit_deletes: Sequence[int] = ()  # ids of records past the retention; the mark stays


class JobStore(Protocol):
    """A durable home for jobs. Every method may raise; `is_fault` tells which errors mean
    the store itself cannot write (as opposed to one change it could not take)."""

    location: str
    """Where the data lives, for messages (a path, or a URL without its password)."""

    def load(self, compact: bool = False) -> Loaded:
        """Every stored job (without its output: `Job.without_output()`, the output is not
        even read) and schedule, the id high-water marks and the outbox's size. A job that
        cannot be read raises StoreOpenError naming it and why. With `compact` (the start-up,
        for the job table) a finished job of the common kind may come as its
        `domain.compact.Ended`; a backend may ignore it and hand out only `Job`s."""
        ...

    def outbox(self, limit: int) -> list[OutboxEvent]:
        """The oldest `limit` events of the outbox, in the order they were written, with
        their ids."""
        ...

    def write(self, batch: Batch) -> None:
        """Apply the batch in one transaction, durable when this returns; all or nothing.
        Raises `OutcomeUnknown` when it cannot tell whether the batch committed; any other
        error means it did not. Raises the first *upsert* it cannot store (e.g. a duplicate
        dedupe key) as an error for which `is_fault` is False. Schedule ids, like job ids,
        are never handed out twice: the high-water mark outlives a deleted schedule.

        An upserted job's output (`Job.outputs()`, by attempt) is stored apart from it. Once
        stored, an attempt's output stays until its job is deleted: a later version of the job
        that carries no output (as the job table keeps them) does not erase it."""
        ...

    def read_outputs(self, seq: int) -> dict[int, Output] | None:
        """Every stored output of job `seq`, by attempt number (attempts that printed nothing
        left out); None when the job is not stored. From any thread (see above)."""
        ...

    def read_latest_outputs(self, seqs: Sequence[int]) -> Iterator[tuple[int, Output | None]]:
        """For each of `seqs` (ascending) that is stored, in that order: its seq and the output
        of its latest attempt (attempt number `retry_count`), None when that printed nothing.
        One at a time, so that a listing holds one job's output in memory, not all; the caller
        may stop early. From any thread (see above)."""
        ...

    def read_token(self, digest: str) -> Token | None:
        """The stored token with this digest, read afresh (a standby checks what it answers
        itself this way: its memory holds no tokens). From any thread, like the outputs."""
        ...

    def is_fault(self, error: BaseException) -> bool:
        """Whether `error` (raised by `write`) says the store cannot write at all."""
        ...

    def close(self) -> None:
        """Release the database; no call follows."""
        ...


def judge_version(
    tables: set[str], read_version: Callable[[], int], newest: int, location: str, not_ours: str
) -> int:
    """The schema version of a database holding `tables` (0 for one without tables yet), read
    by `read_version` from its `schema_version` table. StoreOpenError, without touching it, for
    a database this scheduler must not use: `not_ours` when it has tables but not that one,
    and one written by a newer scheduler than one that knows versions up to `newest`."""
    if "schema_version" in tables:
        version = read_version()
    elif tables:
        raise StoreOpenError(not_ours)
    else:
        version = 0
    if version > newest:
        raise StoreOpenError(
            f"job database {location} has schema version {version}, newer than the {newest} "
            "this tiny-scheduler understands; run a newer tiny-scheduler"
        )
    return version
