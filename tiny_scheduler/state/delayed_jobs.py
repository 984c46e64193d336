"""Pending jobs before their time (`not_before`): per node, and in one heap of due times, so
that the jobs whose time has come are found in O(those jobs) and the poll never walks the
others.

`due(now)` pops what has come due since the last call; the table then moves each into its
node's queue. A job that left meanwhile (claimed, cancelled, moved, removed) keeps its heap
entry until it comes up, and is skipped then: cheaper than searching the heap on every
change. Not thread-safe by itself: the job table calls it under its lock. Tests:
`tests/test_delayed_jobs.py`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from ..domain.jobs import Job
from .jobs_by_node import JobsByNode


class DelayedJobs:
    """The pending jobs that are not due yet."""

    def __init__(self) -> None:
        self.by_node = JobsByNode()
        self._heap: list[tuple[int, int]] = []  # (not_before, seq)
        self.due_until = 0  # every job with not_before at or before this has come due

    def is_delayed(self, job: Job) -> bool:
        """Whether a pending job is still before its time (as of the last `due`)."""
        return not job.is_due(self.due_until)

    def add(self, job: Job) -> None:
        self.by_node.add(job)
        heapq.heappush(self._heap, (job.not_before, job.seq))

    def __contains__(self, job: Job) -> bool:
        return job in self.by_node

    def discard(self, job: Job) -> bool:
        """Forget a delayed job (its heap entry is skipped later); False when it was not."""
        return self.by_node.discard(job)

    def next_after(self, node_id: str, now: int) -> int | None:
        """The earliest `not_before` after `now` among the node's delayed jobs, or None."""
        waiting = self.by_node.get(node_id)
        if not waiting:
            return None
        later = [job.not_before for job in waiting.values() if job.not_before > now]
        return min(later) if later else None

    def due(self, now: int, lookup: Callable[[int], Job | None]) -> list[Job]:
        """Take out and return the delayed jobs whose time has come by `now` (`lookup` gives
        a job's current version): O(those), nothing at all when none is due."""
        if now <= self.due_until:
            return []
        found = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, seq = heapq.heappop(heap)
            job = lookup(seq)
            if job is not None and self.discard(job):
                found.append(job)
        self.due_until = now
        return found
