"""How the jobs of each array stand: per array (by the seq of its first job), how many of its
jobs are in each state people read (`jobs.state_of`: `cancelled` and `timed out` apart from
`failed`). The dashboard shows it on an array's row and page; kept up to date at each change,
it costs O(1) a change and a read, never a walk over the array (which may hold 10,000 jobs).

Not thread-safe by itself: the job table keeps it in step under its lock.

Tests: `tests/test_array_counts.py`.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from ..domain import jobs
from ..domain.jobs import Job


class ArrayCounts:
    """Counts of each array's jobs by state."""

    def __init__(self) -> None:
        self._counts: dict[int, collections.Counter[str]] = {}

    def add(self, job: Job) -> None:
        """A version of an array's job comes (no-op for a job of no array)."""
        if job.array_id:
            counts = self._counts.setdefault(job.array_id, collections.Counter())
            counts[jobs.state_of(job.status, job.reason)] += 1

    def discard(self, job: Job) -> None:
        """A version of an array's job goes (replaced, or the job removed)."""
        if not job.array_id:
            return
        counts = self._counts[job.array_id]
        counts[jobs.state_of(job.status, job.reason)] -= 1
        if not +counts:  # no job of the array is left
            del self._counts[job.array_id]

    def load(self, loaded: Iterable[Job]) -> None:
        for job in loaded:
            self.add(job)

    def of(self, array_id: int) -> dict[str, int]:
        """How many of the array's jobs are in each state (jobs.STATES' order, zeros left
        out); {} for an array none of whose jobs is left."""
        counts = self._counts.get(array_id)
        if counts is None:
            return {}
        return {state: counts[state] for state in jobs.STATES if counts[state] > 0}
