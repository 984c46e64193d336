"""Jobs grouped by node, each node's by id: the shape of most of the table's indexes (due,
running, delayed, waiting for dependencies, timed-out). A node's entry exists only while it
has jobs, so nodes that come and go leave nothing behind; the emptied indexes of this and
the other per-node indexes are reused (`fresh_index`, `retire_index`), since a node's queue
empties and fills again with nearly every job on a cluster that keeps up.

Tests: `tests/test_table.py`, `tests/test_delayed_jobs.py`, `tests/test_dependency_waits.py`.
"""

from __future__ import annotations

from sortedcontainers import SortedDict

from ..domain.jobs import Job

SPARE_LIMIT = 1024
"""Emptied indexes kept for reuse: more than this many empty at once is a cluster that
shrank, whose memory goes back."""

_spare: list[SortedDict] = []
"""Emptied indexes, each taken by one caller (a list's pop and append are atomic): the job
tables of one process share them, harmlessly, since each is empty when taken."""


def fresh_index() -> SortedDict:
    """An empty index: an emptied one when there is one (a SortedDict costs microseconds to
    build), else a new one."""
    try:
        return _spare.pop()
    except IndexError:  # none spare, or another thread took the last one
        return SortedDict()


def retire_index(index: SortedDict) -> None:
    """Keep an emptied index for `fresh_index`; its owner must no longer hold it."""
    if len(_spare) < SPARE_LIMIT:
        _spare.append(index)


class JobsByNode(dict[str, SortedDict]):
    """node id -> its jobs in this index, by seq."""

    def add(self, job: Job) -> None:
        jobs = self.get(job.node_id)
        if jobs is None:
            # Made only when missing (not on every call, as setdefault's argument would be):
            # a SortedDict costs microseconds to build.
            jobs = self[job.node_id] = fresh_index()
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
            retire_index(jobs)
        return True
