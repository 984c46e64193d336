"""Jobs grouped by node, each node's by id: the shape of most of the table's indexes (due,
running, delayed, waiting for dependencies, timed-out). A node's entry exists only while it
has jobs, so nodes that come and go leave nothing behind.

Tests: `tests/test_table.py`, `tests/test_delayed_jobs.py`, `tests/test_dependency_waits.py`.
"""

from __future__ import annotations

from sortedcontainers import SortedDict

from ..domain.jobs import Job


class JobsByNode(dict[str, SortedDict]):
    """node id -> its jobs in this index, by seq."""

    def add(self, job: Job) -> None:
        jobs = self.get(job.node_id)
        if jobs is None:
            # Made only when missing (not on every call, as setdefault's argument would be):
            # a SortedDict costs microseconds to build.
            jobs = self[job.node_id] = SortedDict()
        jobs[job.seq] = job

    def __contains__(self, job: object) -> bool:
        if not isinstance(job, Job):
            return super().__contains__(job)
        jobs = self.get(job.node_id)
        return jobs is not None and job.seq in jobs

    def discard(self, job: Job) -> bool:
        """Take the job out; False when it was not in."""
        jobs = self.get(job.node_id)
        if jobs is None or job.seq not in jobs:
            return False
        del jobs[job.seq]
        if not jobs:
            del self[job.node_id]
        return True
