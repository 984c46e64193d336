"""Finished jobs in the order they finished: retention takes the oldest from the front, the
dashboard's recent history reads the newest from the back. Ids only: the job table has the
jobs. Not thread-safe by itself: the table calls it under its lock.

Tests: `tests/test_table.py`, `tests/test_loops.py` (retention).
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Callable, Iterable, Iterator

from ..domain.jobs import Job

_FINISHED_AT = operator.attrgetter("finished_at")


def _finished_or_created(job: Job) -> int:
    """When a finished job ended (older files may lack the time: then when it was made)."""
    return job.finished_at or job.created_at


class FinishedJobs:
    """The ids of finished jobs, oldest end first."""

    def __init__(self) -> None:
        self._order: collections.deque[int] = collections.deque()

    def load(self, finished: Iterable[Job]) -> None:
        """Start-up: the stored finished jobs, in any order."""
        jobs = list(finished)
        # One key for all: a C attribute getter when every job has its end time (a Python
        # call per job otherwise), the same order either way.
        ended = all(map(_FINISHED_AT, jobs))
        jobs.sort(key=_FINISHED_AT if ended else _finished_or_created)
        self._order.extend(job.seq for job in jobs)

    def __iter__(self) -> Iterator[int]:
        return iter(self._order)

    def add(self, seq: int) -> None:
        self._order.append(seq)

    def discard(self, gone: set[int]) -> None:
        """Forget removed jobs (retention removes from the front: that is the cheap case)."""
        while self._order and self._order[0] in gone:
            self._order.popleft()
        if any(seq in gone for seq in self._order):
            self._order = collections.deque(s for s in self._order if s not in gone)

    def since(self, since: int, lookup: Callable[[int], Job | None]) -> list[Job]:
        """The jobs that finished at or after `since`, newest first."""
        found = []
        for seq in reversed(self._order):
            job = lookup(seq)
            if job is None:
                continue
            if _finished_or_created(job) < since:
                break
            found.append(job)
        return found

    def before(
        self,
        cutoff: int,
        limit: int,
        lookup: Callable[[int], Job | None],
        keep: Callable[[int], bool],
    ) -> list[int]:
        """Up to `limit` ids of jobs that finished before `cutoff`, oldest first, leaving
        out those `keep` says to keep."""
        found: list[int] = []
        for seq in self._order:
            job = lookup(seq)
            if job is not None and _finished_or_created(job) >= cutoff:
                break
            if keep(seq):
                continue
            found.append(seq)
            if len(found) == limit:
                break
        return found
