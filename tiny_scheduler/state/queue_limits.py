"""Queue limits: per queue, how many of its jobs exist in each status, how many of its `run`
jobs run and are being claimed, and whether one more may start (`queues.room`, the rule).

The job table tells it of every job version it adds or drops (`add`, `discard`) and asks it
how much room a queue has when it hands jobs out; the claim of a job reserves its place
(`reserve`) for as long as its commit takes, so two nodes claiming at once can never both
pass the last free place. Not thread-safe by itself: the table calls it under its lock.
Tests: `tests/test_queue_limits.py`.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from .. import errors
from ..domain import jobs, queues
from ..domain.jobs import Job
from ..domain.queues import QueueSettings
from .node_queues import decrement


class QueueLimits:
    """Every queue's settings and counts."""

    def __init__(self, settings: Iterable[QueueSettings] = ()) -> None:
        self._settings: dict[str, QueueSettings] = {q.name: q for q in settings}
        self._running: collections.Counter[str] = collections.Counter()  # `run` jobs
        self._starting: collections.Counter[str] = collections.Counter()  # claims under way
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()

    # --- kept in step with the table ---------------------------------------------------------

    def add(self, job: Job) -> None:
        self._counts[(job.queue, job.status)] += 1
        if job.status == jobs.RUNNING and job.takes_slot:
            self._running[job.queue] += 1

    def discard(self, job: Job) -> None:
        decrement(self._counts, (job.queue, job.status))
        if job.status == jobs.RUNNING and job.takes_slot:
            decrement(self._running, job.queue)

    def add_counts(self, counts: Iterable[tuple[tuple[str, str], int]]) -> None:
        """Count many finished jobs at once (start-up): only their status counts change."""
        for key, count in counts:
            self._counts[key] += count

    # --- the rule, applied ---------------------------------------------------------------------

    def room(self, name: str) -> int | None:
        """How many more of the queue's jobs may start now; None: no limit."""
        settings = self._settings.get(name)
        if settings is None:
            return None
        return queues.room(settings, self._running[name] + self._starting[name])

    def held_back(self) -> list[str]:
        """The queues that hand nothing out now (paused, or running their limit)."""
        return [name for name in self._settings if self.room(name) == 0]

    def reserve(self, job: Job) -> bool:
        """A claim of `job` begins: raise Conflict (naming the queue) when its queue is paused
        or runs its limit; otherwise count the claim under way when it takes a place. True
        when a place was reserved (`release` it when the claim's commit is over)."""
        settings = self._settings.get(job.queue)
        if settings is None or not settings.holds_back:
            return False
        room = queues.room(settings, self._running[job.queue] + self._starting[job.queue])
        if settings.paused or (job.takes_slot and room == 0):
            why = queues.refusal(settings, self._running[job.queue])
            raise errors.Conflict(f"job {job.job_id} cannot start: {why}")
        if not job.takes_slot:
            return False
        self._starting[job.queue] += 1
        return True

    def release(self, job: Job) -> None:
        """The claim `reserve` counted is over (committed or not)."""
        decrement(self._starting, job.queue)

    # --- reads ------------------------------------------------------------------------------

    def settings(self) -> dict[str, QueueSettings]:
        return dict(self._settings)

    def set(self, settings: QueueSettings) -> None:
        """Apply a queue's committed settings (the next poll goes by them)."""
        self._settings[settings.name] = settings

    def state(self, name: str) -> tuple[QueueSettings | None, int]:
        """A queue's settings (None when never set) and its running `run` jobs."""
        return self._settings.get(name), self._running[name]

    def counts(self) -> dict[str, tuple[int, int]]:
        """(pending, running) jobs of every queue that has jobs of any status, by name."""
        found: dict[str, tuple[int, int]] = {}
        for (name, status), count in self._counts.items():
            if count:
                pending, running = found.get(name, (0, 0))
                if status == jobs.PENDING:
                    pending += count
                elif status == jobs.RUNNING:
                    running += count
                found[name] = (pending, running)
        return found
