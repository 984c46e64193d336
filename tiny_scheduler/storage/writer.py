"""Group commit above any backend: the one writer thread, and the health of the store.

Durability rule: `save()` and `delete()` return only after the backend committed the change,
and raise `StoreError` when it could not. Callers apply a change to memory only after it is
durable, so memory never runs ahead of the database.

Every change goes through one writer thread that commits whatever has queued up since its last
commit in one transaction: eight requests arriving together cost one fsync, not eight. When a
batch fails, each change is retried alone, so one change the backend cannot take (a value it
cannot bind) fails only its own request. Whether the store is healthy is judged from the
backend's own faults, never from one bad change. Nothing here knows which database it is.

Health is never stale: when nothing has been written for `STORE_PROBE_INTERVAL_SECS`, the
writer commits a tiny probe of its own, so a disk that filled, a file system that turned
read-only or a database file that was deleted while the daemon was idle is found within a
few seconds, and reading the verdict (`health`) costs no I/O. A write that has hung for
`STORE_STALL_SECS` (a disk that stopped answering) also counts as unhealthy.

Reads other than the start-up load (the outbox) run on the writer thread too, between
commits, so the backend is only ever used by one thread at a time; except the reads of
output, which pass straight through to the backend in the reader's own thread (the contract
has the backend take them beside its writer).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any

from ..config import STORE_PROBE_INTERVAL_SECS, STORE_STALL_SECS
from ..errors import StoreError
from ..jobs import Job, Output
from ..schedules import Schedule
from .base import Batch, JobStore, Loaded, OutboxEvent

log = logging.getLogger(__name__)

CommitObserver = Callable[[float, int], None]
"""Called after each group commit with (seconds it took, number of callers it carried)."""


class _Ticket:
    """One caller's changes (or read), and the writer thread's answer."""

    __slots__ = ("batch", "done", "error", "read", "result")

    def __init__(self, batch: Batch, read: Callable[[JobStore], Any] | None = None) -> None:
        self.batch = batch
        self.read = read
        self.result: Any = None
        self.done = threading.Event()
        self.error: BaseException | None = None


class Writer:
    """A `JobStore` behind one group-committing thread; safe to call from any thread."""

    def __init__(self, backend: JobStore) -> None:
        self._backend = backend
        self._queue: collections.deque[_Ticket] = collections.deque()
        self._wakeup = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self.healthy = True
        self.last_error: str | None = None
        self.commit_observers: list[CommitObserver] = []
        self.events_waiting = 0
        """Events in the outbox, kept up to date by the writer thread (cheap to read)."""
        self._last_attempt = 0.0  # monotonic time the last commit ended (0: probe at once)
        self._busy_since: float | None = None  # when the commit under way began

    @property
    def location(self) -> str:
        return self._backend.location

    def load(self) -> Loaded:
        """Every stored job, without its output (start-up only, before `start`)."""
        loaded = self._backend.load()
        self.events_waiting = loaded.events
        return loaded

    def reload(self) -> Loaded:
        """Every stored job and schedule again, read on the writer thread between commits (a
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
        self._thread = threading.Thread(target=self._write_loop, name="store-writer", daemon=True)
        self._thread.start()

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
        """Commit what is queued, stop the writer and close the backend."""
        with self._wakeup:
            self._closing = True
            self._wakeup.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._backend.close()

    def _submit(self, batch: Batch, read: Callable[[JobStore], Any] | None = None) -> Any:
        ticket = _Ticket(batch, read)
        with self._wakeup:
            if self._closing:
                raise StoreError("scheduler is shutting down; nothing was changed")
            self._queue.append(ticket)
            self._wakeup.notify()
        ticket.done.wait()
        if ticket.error is not None:
            raise StoreError() from ticket.error
        return ticket.result

    def _write_loop(self) -> None:
        while True:
            with self._wakeup:
                while not self._queue and not self._closing:
                    # Idle: wait for work, but no longer than until a probe is due.
                    due = self._last_attempt + STORE_PROBE_INTERVAL_SECS - time.monotonic()
                    if due <= 0:
                        break
                    self._wakeup.wait(due)
                if not self._queue and self._closing:
                    return
                # The probe's commit carries no caller: the commit metrics leave it out.
                probing = not self._queue
                tickets = [_Ticket(Batch(probe=True))] if probing else list(self._queue)
                self._queue.clear()
            try:
                reads = [ticket for ticket in tickets if ticket.read is not None]
                writes = [ticket for ticket in tickets if ticket.read is None]
                if writes:
                    self._commit(writes, observed=not probing)
                for ticket in reads:
                    self._read(ticket)
            except Exception:  # every write waits on this thread: it must never die
                log.exception("job store writer: unexpected error")

    def _read(self, ticket: _Ticket) -> None:
        assert ticket.read is not None
        try:
            ticket.result = ticket.read(self._backend)
        except Exception as exc:
            ticket.error = exc
        finally:
            ticket.done.set()

    def _commit(self, tickets: list[_Ticket], observed: bool = True) -> None:
        started = time.perf_counter()
        self._busy_since = time.monotonic()
        try:
            self._write(tickets)
            self._judge_health(tickets)
            for ticket in tickets:
                if ticket.error is None:
                    batch = ticket.batch
                    self.events_waiting += len(batch.events) - len(batch.delivered)
            elapsed = time.perf_counter() - started
            for observe in self.commit_observers if observed else ():
                observe(elapsed, len(tickets))
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
                    ticket.error = single

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
    if len(tickets) == 1:
        return tickets[0].batch
    return Batch(
        upserts=[job for t in tickets for job in t.batch.upserts],
        deletes=[seq for t in tickets for seq in t.batch.deletes],
        probe=any(t.batch.probe for t in tickets),
        events=[event for t in tickets for event in t.batch.events],
        delivered=[id_ for t in tickets for id_ in t.batch.delivered],
        schedules=[schedule for t in tickets for schedule in t.batch.schedules],
        schedule_deletes=[seq for t in tickets for seq in t.batch.schedule_deletes],
    )
