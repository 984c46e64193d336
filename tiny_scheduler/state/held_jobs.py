"""Pending jobs a person holds (`POST /jobs/{id}/hold`, Slurm's `scontrol hold`), per node.

A held job is pending, but it is not due: it is in no node's queue, so the poll never hands it
out, an idle node never takes it over and placement never counts it as load. Listings still
show it among the pending jobs (`by_node`), and so does its node's page. Its release enters it
again wherever a pending job belongs (its node's queue, the delayed jobs). A held job that
still waits for its dependencies stays with `DependencyWaits` instead, so that a failed
dependency still ends it; it comes here once they are met, if it is still held then.

Not thread-safe by itself: the job table keeps it in step under its lock.

Tests: `tests/test_held_jobs.py`.
"""

from __future__ import annotations

from ..domain.jobs import Job
from .jobs_by_node import JobsByNode


class HeldJobs:
    """The pending jobs on hold."""

    def __init__(self) -> None:
        self.by_node = JobsByNode()

    def belongs(self, job: Job) -> bool:
        """Whether a pending job (its dependencies met) waits here: it is held."""
        return job.held

    def add(self, job: Job) -> None:
        self.by_node.add(job)

    def __contains__(self, job: Job) -> bool:
        return job in self.by_node

    def __len__(self) -> int:
        return sum(len(jobs) for jobs in self.by_node.values())

    def discard(self, job: Job) -> bool:
        """Forget a held job; False when it was not held here."""
        return self.by_node.discard(job)
