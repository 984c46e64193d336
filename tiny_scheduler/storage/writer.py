"""Group commit above any backend: the one writer thread, and the health of the store.

Durability rule: `save()` and `delete()` return only after the backend committed the change,
and raise `StoreError` when it could not. Callers apply a change to memory only after it is
durable, so memory never runs ahead of the database.

Every change goes through one writer thread that commits whatever has queued up since its last
commit in one transaction: eight requests arriving together cost one fsync, not eight. When a
batch fails, each change is retried alone, so one change the backend cannot take (a value it
cannot bind) fails only its own request. Whether the store is healthy is judged from the
backend's own faults, never from one bad change. Nothing here knows which database it is.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable

from ..errors import StoreError
from ..jobs import Job
from ..schedules import Schedule
from .base import Batch, JobStore, Loaded

log = logging.getLogger(__name__)

CommitObserver = Callable[[float, int], None]
"""Called after each group commit with (seconds it took, number of callers it carried)."""


class _Ticket:
    """One caller's changes, and the writer thread's answer."""

    __slots__ = ("batch", "done", "error")

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
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

    @property
    def location(self) -> str:
        return self._backend.location

    def load(self) -> Loaded:
        """Every stored job (start-up only, before `start`)."""
        return self._backend.load()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._write_loop, name="store-writer", daemon=True)
        self._thread.start()

    def save(self, *changed: Job) -> None:
        """Insert or replace these jobs; returns once committed, else raises StoreError."""
        self._submit(Batch(upserts=changed))

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

    def _submit(self, batch: Batch) -> None:
        ticket = _Ticket(batch)
        with self._wakeup:
            if self._closing:
                raise StoreError("scheduler is shutting down; nothing was changed")
            self._queue.append(ticket)
            self._wakeup.notify()
        ticket.done.wait()
        if ticket.error is not None:
            raise StoreError() from ticket.error

    def _write_loop(self) -> None:
        while True:
            with self._wakeup:
                while not self._queue and not self._closing:
                    self._wakeup.wait()
                if not self._queue:
                    return
                tickets = list(self._queue)
                self._queue.clear()
            try:
                self._commit(tickets)
            except Exception:  # every write waits on this thread: it must never die
                log.exception("job store writer: unexpected error")

    def _commit(self, tickets: list[_Ticket]) -> None:
        started = time.perf_counter()
        try:
            self._write(tickets)
            self._judge_health(tickets)
            elapsed = time.perf_counter() - started
            for observe in self.commit_observers:
                observe(elapsed, len(tickets))
        finally:
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
        schedules=[schedule for t in tickets for schedule in t.batch.schedules],
        schedule_deletes=[seq for t in tickets for seq in t.batch.schedule_deletes],
    )
