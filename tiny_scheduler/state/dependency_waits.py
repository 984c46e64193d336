"""Jobs waiting for their dependencies (`depends_on`): per node, and per dependency the jobs
that wait for it, so that a job's end releases exactly the jobs that waited for it.

The rule of when a wait is over (`dependencies_met`) is pure: every dependency ended as the
job's `dependency` asks, `done` (`ok`) or any final state (`any`). A dependency no longer in
the table counts as met: only final jobs are removed, and retention never removes one a job
still waits for (`is_awaited`). Not thread-safe by itself: the job table keeps it in step
under its lock. Tests: `tests/test_dependency_waits.py`.
"""

from __future__ import annotations

from collections.abc import Callable

from ..domain import jobs
from ..domain.jobs import Job
from .jobs_by_node import JobsByNode


def dependencies_met(job: Job, lookup: Callable[[int], Job | None]) -> bool:
    """Whether every job that `job` depends on ended as its `dependency` asks."""
    need_done = job.dependency == jobs.Dependency.OK
    for seq in job.depends_on:
        dependency = lookup(seq)
        if dependency is None:
            continue
        if dependency.status != jobs.DONE if need_done else not dependency.is_final:
            return False
    return True


class DependencyWaits:
    """The pending jobs whose dependencies have not all ended."""

    def __init__(self) -> None:
        self.by_node = JobsByNode()
        self._dependents: dict[int, set[int]] = {}  # dependency -> the jobs waiting for it

    def add(self, job: Job) -> None:
        self.by_node.add(job)
        for dependency in job.depends_on:
            self._dependents.setdefault(dependency, set()).add(job.seq)

    def __contains__(self, job: Job) -> bool:
        return job in self.by_node

    def discard(self, job: Job) -> bool:
        """Forget the job's wait; False when it was not waiting."""
        if not self.by_node.discard(job):
            return False
        for dependency in job.depends_on:
            waiting = self._dependents.get(dependency)
            if waiting is not None:
                waiting.discard(job.seq)
                if not waiting:
                    del self._dependents[dependency]
        return True

    def waiting_for(self, seq: int) -> list[int]:
        """The ids of the jobs that wait for job `seq`, in id order."""
        return sorted(self._dependents.get(seq, ()))

    def is_awaited(self, seq: int) -> bool:
        """Whether some job still waits for job `seq` (retention keeps it)."""
        return seq in self._dependents
