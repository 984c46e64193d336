"""Group commit above any backend, and the health of the store.

Durability rule: `save()` and `delete()` return only after the backend committed the change,
and raise `StoreError` when it could not. Callers apply a change to memory only after it is
durable, so memory never runs ahead of the database.

Changes are committed in groups: eight requests arriving together cost one fsync, not eight.
There is no writer thread to hand each change to and wait on (two thread switches per commit,
on the hottest path): the caller that finds nobody committing commits itself, taking in
whatever has queued since; callers arriving meanwhile queue, and when a commit ends the turn
passes to the first of them, which commits the next group. So only one thread at a time
uses the backend. Under concurrent load (the last commit carried several callers) a commit
first waits up to a millisecond for as many changes to queue (`_gather`): bigger groups, fewer
fsyncs and wake-ups per change; a lone caller never waits.

When a batch fails, each change is retried alone, so one change the backend cannot take (a
value it cannot bind) fails only its own request. A batch whose outcome the backend cannot
tell (`OutcomeUnknown`) may be stored: a change whose retry fails too is answered with that
doubt (`STORE_OUTCOME_UNKNOWN`), never with "nothing was changed". (Retrying is safe: every
change is keyed, a job or schedule by its seq, so applying it twice stores it once; only an
outbox event may be stored twice, and events are delivered at least once anyway.) Whether the
store is healthy is judged from the backend's own faults, never from one bad change. Nothing
here knows which database it is.

Health is never stale: when nothing has been written for `STORE_PROBE_INTERVAL_SECS`, a
prober thread commits a tiny probe, so a disk that filled, a file system that turned
read-only or a database file that was deleted while the daemon was idle is found within a
few seconds, and reading the verdict (`health`) costs no I/O. A write that has hung for
`STORE_STALL_SECS` (a disk that stopped answering) also counts as unhealthy.

A change that need not be durable before its caller goes on (an audit record: `save_soon`)
*rides* with the next commit instead of costing one of its own; the prober commits it within
`RIDE_SECS` when nothing else is written. A crash in between loses it, and nothing else.

Reads other than the start-up load (the outbox) take their turn like commits, so the backend
is only ever used by one thread at a time; except the reads of output, which pass straight
through to the backend in the reader's own thread (the contract has the backend take them
beside its writes).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any

from ..config import STORE_PROBE_INTERVAL_SECS, STORE_STALL_SECS
from ..domain.audit import AuditRecord
from ..domain.jobs import Job, Output
from ..domain.nodes import NodeRecord
from ..domain.queues import QueueSettings
from ..domain.schedules import Schedule
from ..domain.tokens import Token
from ..domain.users import UserSettings
from ..errors import STORE_OUTCOME_UNKNOWN, StoreError
from .base import Batch, JobStore, Loaded, OutboxEvent, OutcomeUnknown

log = logging.getLogger(__name__)

GATHER_SECS = 0.001
"""Under concurrent load, a commit waits up to this long for the changes on their way."""

_GATHER_STEP_SECS = 0.0002

RIDE_SECS = 0.2
"""A change saved with `save_soon` is committed within this long, with the next commit or by
the prober."""

CommitObserver = Callable[[float, int], None]
"""Called after each group commit with (seconds it took, number of callers it carried)."""


class _Ticket:
    """One caller's changes (or read), and the answer; or the turn to commit, passed on."""

    __slots__ = ("batch", "done", "error", "probe", "read", "result", "turn")

    def __init__(
        self, batch: Batch, read: Callable[[JobStore], Any] | None = None, probe: bool = False
    ) -> None:
        self.batch = batch
        self.read = read
        # The prober's own, or a rider nobody waits for: the commit metrics leave it out.
        self.probe = probe
        self.result: Any = None
        self.done = threading.Event()  # answered, or given the turn
        self.turn = False
        self.error: BaseException | None = None


class Writer:
    """A `JobStore` behind group commit; safe to call from any thread."""

    def __init__(self, backend: JobStore) -> None:
        self._backend = backend
        self._queue: collections.deque[_Ticket] = collections.deque()
        self._idle = threading.Condition()  # guards the queue and the turn
        self._committing = False  # a caller has the turn: the others queue behind it
        self._closing = False
        self._prober: threading.Thread | None = None
        self._stopping = threading.Event()  # tells the prober to end
        self.healthy = True
        self.last_error: str | None = None
        self.commit_observers: list[CommitObserver] = []
        self.events_waiting = 0
        """Events in the outbox, kept up to date by whoever commits (cheap to read)."""
        self._last_group = 0  # callers the last commit carried
        self.gathered = 0
        """Commits that waited for more changes to join them (see `_gather`)."""
        self._last_attempt = 0.0  # monotonic time the last commit ended (0: probe at once)
        self._busy_since: float | None = None  # when the commit under way began
        self._riders: list[_Ticket] = []  # `save_soon`'s: committed with the next group
        self._riding_since: float | None = None  # when the oldest rider came
        self._wake = threading.Event()  # the prober: stop, or a rider came
        self._prober_until = 0.0  # when the prober wakes by itself next (monotonic)

    @property
    def location(self) -> str:
        return self._backend.location

    def load(self, compact: bool = False) -> Loaded:
        """Every stored job, without its output (start-up only, before `start`); see
        `JobStore.load` for `compact`."""
        loaded = self._backend.load(compact)
        self.events_waiting = loaded.events
        return loaded

    def reload(self) -> Loaded:
        """Every stored job and schedule again, read in a turn between commits (a
        new leader's term, PostgreSQL), so the backend stays one thread's at a time."""
        loaded: Loaded = self._submit(Batch(), read=lambda backend: backend.load())
        self.events_waiting = loaded.events
        return loaded

    def health(self) -> tuple[bool, str | None]:
        """Whether the store can be written, as found by the latest write or probe (at most
        `STORE_PROBE_INTERVAL_SECS` old while the writer runs), and the error when not."""
        busy_since = self._busy_since
        if busy_since is not None:
            waited = time.monotonic() - busy_since
            if waited > STORE_STALL_SECS:
                return False, f"a write has waited {waited:.0f}s for the disk"
        return self.healthy, self.last_error

    def read_outputs(self, seq: int) -> dict[int, Output] | None:
        """Job `seq`'s stored output by attempt; None when it is not stored. Read in the
        calling thread, beside the writer: committed data only, never waiting on a commit.
        Raises StoreError when the store cannot be read."""
        try:
            return self._backend.read_outputs(seq)
        except Exception as exc:
            log.error("job store read failed: %s", exc)
            raise StoreError() from exc

    def read_latest_outputs(
        self, seqs: Sequence[int]
    ) -> Generator[tuple[int, Output | None], None, None]:
        """The latest attempt's output of each stored job of `seqs`, one at a time (see
        `JobStore.read_latest_outputs`); in the calling thread, like `read_outputs`."""
        try:
            yield from self._backend.read_latest_outputs(seqs)
        except Exception as exc:
            log.error("job store read failed: %s", exc)
            raise StoreError() from exc

    def start(self) -> None:
        """Start probing the store while nothing is written, and at once whenever the backend
        sees its files change (SQLite: one deleted under the daemon must be found, and what it
        held saved, before the process can end)."""
        self._prober = threading.Thread(target=self._probe_loop, name="store-prober", daemon=True)
        self._prober.start()
        watch = getattr(self._backend, "watch_files", None)
        if watch is not None:
            watch(self.probe)

    def save(self, *changed: Job, events: Sequence[OutboxEvent] = ()) -> None:
        """Insert or replace these jobs, and add `events` to the outbox, in one transaction;
        returns once committed, else raises StoreError (and none of it was stored)."""
        self._submit(Batch(upserts=changed, events=events))

    def outbox(self, limit: int) -> list[OutboxEvent]:
        """The oldest events of the outbox (at most `limit`), oldest first; StoreError when
        they cannot be read."""
        result: list[OutboxEvent] = self._submit(
            Batch(), read=lambda backend: backend.outbox(limit)
        )
        return result

    def delivered(self, ids: Iterable[int]) -> None:
        """Remove these events from the outbox: they were delivered."""
        self._submit(Batch(delivered=tuple(ids)))

    def save_schedule(self, schedule: Schedule, *changed: Job) -> None:
        """Insert or replace a schedule, together with these jobs (a fire), in one
        transaction; returns once committed, else raises StoreError."""
        self._submit(Batch(upserts=changed, schedules=(schedule,)))

    def save_nodes(self, *records: NodeRecord) -> None:
        """Insert or replace these nodes' records; returns once committed."""
        self._submit(Batch(nodes=records))

    def save_queue(self, settings: QueueSettings) -> None:
        """Insert or replace a queue's settings; returns once committed."""
        self._submit(Batch(queue_settings=(settings,)))

    def save_user(self, settings: UserSettings) -> None:
        """Insert or replace a user's settings; returns once committed."""
        self._submit(Batch(user_settings=(settings,)))

    def save_token(self, token: Token) -> None:
        """Insert a token; returns once committed."""
        self._submit(Batch(tokens=(token,)))

    def delete_token(self, seq: int) -> None:
        """Remove a token (a revoke); its id is never handed out again."""
        self._submit(Batch(token_deletes=(seq,)))

    def save_audit(self, *records: AuditRecord) -> None:
        """Add audit records; returns once committed."""
        self._submit(Batch(audit=records))

    def save_soon(self, batch: Batch) -> None:
        """Commit `batch` with the next group, or within `RIDE_SECS` (the prober's), without
        waiting for it: for a change that need not be durable before the caller goes on (an
        audit record). A failure is logged (the store's health says it too)."""
        with self._idle:
            if self._closing:
                raise StoreError("scheduler is shutting down; nothing was changed")
            self._riders.append(_Ticket(batch, probe=True))
            first = self._riding_since is None
            if first:
                self._riding_since = time.monotonic()
            # Woken only when it would sleep past this rider's deadline: under a steady flow
            # of changes each carries the last one's rider, and waking the prober for every
            # one (a thread switch per submission) cost more than the record itself.
            wake = first and self._prober_until > self._riding_since + RIDE_SECS
        if wake:
            self._wake.set()

    def delete_audit(self, ids: Iterable[int]) -> None:
        """Remove audit records past the retention; their ids are never used again."""
        self._submit(Batch(audit_deletes=tuple(ids)))

    def read_token(self, digest: str) -> Token | None:
        """The stored token with this digest, read in the calling thread beside the writer
        (committed data only); StoreError when the store cannot be read."""
        try:
            return self._backend.read_token(digest)
        except Exception as exc:
            log.error("job store read failed: %s", exc)
            raise StoreError() from exc

    def delete_schedule(self, seq: int) -> None:
        """Remove a schedule; its id is never handed out again."""
        self._submit(Batch(schedule_deletes=(seq,)))

    def delete(self, seqs: Iterable[int]) -> None:
        """Remove these jobs; the id high-water mark stays, so ids are never reused."""
        self._submit(Batch(deletes=tuple(seqs)))

    def probe(self) -> bool:
        """Try a tiny write: whether the store can write right now."""
        try:
            self._submit(Batch(probe=True))
        except StoreError:
            return False
        return True

    def close(self) -> None:
        """Commit what is queued (riders too), stop probing and close the backend."""
        if self._riders:
            self.probe()  # takes the riders along (a failure is logged, and counted there)
        self._stopping.set()
        self._wake.set()
        with self._idle:
            self._closing = True
            self._idle.wait_for(lambda: not self._committing, timeout=10)
        if self._prober is not None:
            self._prober.join(timeout=10)
        self._backend.close()

    def _submit(self, batch: Batch, read: Callable[[JobStore], Any] | None = None) -> Any:
        ticket = self._queued(_Ticket(batch, read))
        if isinstance(ticket.error, OutcomeUnknown):
            raise StoreError(STORE_OUTCOME_UNKNOWN) from ticket.error
        if ticket.error is not None:
            raise StoreError() from ticket.error
        return ticket.result

    def _queued(self, ticket: _Ticket) -> _Ticket:
        """Queue the ticket and return it answered. The caller that finds nobody committing
        takes the turn and commits itself, with whatever queues meanwhile; the others wait
        for their answer, or for the turn, passed to the first of them still queued."""
        with self._idle:
            if self._closing:
                raise StoreError("scheduler is shutting down; nothing was changed")
            self._queue.append(ticket)
            ticket.turn = not self._committing
            self._committing = True
        if not ticket.turn:
            ticket.done.wait()
        if ticket.turn:
            self._take_turn()
        return ticket

    def _take_turn(self) -> None:
        """Commit every queued change in one transaction, run the queued reads, then pass the
        turn on. Only the turn's holder uses the backend, so it is one thread's at a time."""
        self._gather()
        with self._idle:
            tickets = list(self._queue) + self._riders
            self._queue.clear()
            self._riders, self._riding_since = [], None
        try:
            reads = [ticket for ticket in tickets if ticket.read is not None]
            writes = [ticket for ticket in tickets if ticket.read is None]
            if writes:
                self._commit(writes)
            for ticket in reads:
                self._read(ticket)
        except Exception as exc:  # a bug here must not leave a caller waiting forever
            log.exception("job store writer: unexpected error")
            for ticket in tickets:
                if not ticket.done.is_set():
                    ticket.error = exc
                    ticket.done.set()
        finally:
            with self._idle:
                following = self._queue[0] if self._queue else None
                if following is None:
                    self._committing = False
                    self._idle.notify_all()
            if following is not None:
                following.turn = True
                following.done.set()

    def _gather(self) -> None:
        """When the last commit carried several callers, changes are arriving concurrently:
        wait up to `GATHER_SECS` for as many to queue before committing. Each commit costs an
        fsync and wakes every caller it carried, so under load bigger groups cost less per
        change (and serve more of them); a lone caller (the last group was one) never waits."""
        expected = self._last_group
        if expected <= 1 or len(self._queue) >= expected:
            return
        self.gathered += 1
        deadline = time.monotonic() + GATHER_SECS
        while len(self._queue) < expected and time.monotonic() < deadline:
            time.sleep(_GATHER_STEP_SECS)  # lets the request threads on their way run

    def _probe_loop(self) -> None:
        """While nothing is written, commit a tiny probe every `STORE_PROBE_INTERVAL_SECS`, so
        that `health` is never older than that; and riders no commit took within
        `RIDE_SECS`."""
        while True:
            with self._idle:  # beside `save_soon`, which wakes it only if it sleeps too long
                now = time.monotonic()
                due = self._last_attempt + STORE_PROBE_INTERVAL_SECS - now
                riding = self._riding_since
                if riding is not None:
                    due = min(due, riding + RIDE_SECS - now)
                self._prober_until = now + max(due, 0.0)
            if due > 0:
                self._wake.wait(due)
                self._wake.clear()
                if self._stopping.is_set():
                    return
                continue  # a commit (or a rider) may have come meanwhile: look again
            try:
                self._queued(_Ticket(Batch(probe=True), probe=True))
            except StoreError:
                return  # closing

    def _read(self, ticket: _Ticket) -> None:
        assert ticket.read is not None
        try:
            ticket.result = ticket.read(self._backend)
        except Exception as exc:
            ticket.error = exc
        finally:
            ticket.done.set()

    def _commit(self, tickets: list[_Ticket]) -> None:
        started = time.perf_counter()
        self._busy_since = time.monotonic()
        try:
            self._write(tickets)
            self._judge_health(tickets)
            for ticket in tickets:
                if ticket.error is not None and ticket.probe and not ticket.batch.probe:
                    log.error("job store: a change saved soon was lost: %s", ticket.error)
            for ticket in tickets:
                if ticket.error is None:
                    batch = ticket.batch
                    self.events_waiting += len(batch.events) - len(batch.delivered)
            elapsed = time.perf_counter() - started
            callers = sum(not ticket.probe for ticket in tickets)
            self._last_group = callers
            for observe in self.commit_observers if callers else ():
                observe(elapsed, callers)
        finally:
            self._busy_since = None
            self._last_attempt = time.monotonic()
            for ticket in tickets:
                ticket.done.set()

    def _write(self, tickets: list[_Ticket]) -> None:
        """Commit the tickets together, recording on each whether its change made it."""
        try:
            self._backend.write(_merged(tickets))
        except Exception as exc:
            if len(tickets) == 1:
                tickets[0].error = exc
                return
            # One bad change must not sink its neighbours: give each its own transaction.
            for ticket in tickets:
                try:
                    self._backend.write(ticket.batch)
                except Exception as single:
                    # The group may have committed: a retry that failed for sure does not
                    # make the change's own outcome any surer.
                    ticket.error = exc if isinstance(exc, OutcomeUnknown) else single

    def _judge_health(self, tickets: list[_Ticket]) -> None:
        """Only the backend's own faults say that the store cannot write; a change it could
        not take says nothing about the disk, and leaves the verdict as it was."""
        faults = [t.error for t in tickets if t.error and self._backend.is_fault(t.error)]
        if faults:
            self._note_health(faults[-1])
        elif any(ticket.error is None for ticket in tickets):
            self._note_health(None)

    def _note_health(self, error: BaseException | None) -> None:
        if error is None:
            if not self.healthy:
                log.warning("job store writable again")
            self.healthy, self.last_error = True, None
        else:
            if self.healthy:
                log.error("job store write failed: %s", error)
            self.healthy, self.last_error = False, str(error)


def _merged(tickets: list[_Ticket]) -> Batch:
    """One batch doing what the tickets' batches do, in their order (field by field, so a
    field added to `Batch` merges without a change here)."""
    if len(tickets) == 1:
        return tickets[0].batch
    merged: dict[str, Any] = {}
    for field in _BATCH_FIELDS:
        parts = [getattr(ticket.batch, field) for ticket in tickets]
        merged[field] = any(parts) if field == "probe" else [x for part in parts for x in part]
    return Batch(**merged)


_BATCH_FIELDS = tuple(field.name for field in dataclasses.fields(Batch))
