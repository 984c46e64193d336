"""Dependencies between jobs: the pure rules, apart from committing.

A job that names `depends_on` is due only once they have ended as its `dependency` asks: all
`done` (`ok`, Slurm's afterok) or all ended whatever the status (`any`, afterany). The job
table keeps such a job out of the agents' sight until then (`table.JobTable`).

With `ok`, a dependency that ends `failed` for good (not retried: the retry is a new chance
to succeed) means the dependent can never run: it ends at once, `failed` with reason
`dependency_failed`, exit -1 and stderr `dependency job-N failed`, and so do its own `ok`
dependents, transitively (`cascade`). A job submitted after its `ok` dependency failed ends
the same way at once (`doomed`), as Slurm users expect of afterok on a failed job: it never
runs. An `any` dependent of a failure becomes due as for any other end.

Nothing here touches the table, the store or a clock: each function is given the jobs and the
time it needs.

Tests: `tests/test_workflow_dependencies.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ..domain import jobs
from ..domain.jobs import Dependency, Job, Reason


def dependency_failed_stderr(seq: int) -> str:
    return f"dependency {jobs.job_id_of(seq)} failed"


def fail(job: Job, dependency_seq: int, now: int) -> Job:
    """The pending job ended because its `ok` dependency `dependency_seq` failed for good.
    Like a cancel of a pending job: final at once, never retried, no slot held."""
    return job.evolve(
        status=jobs.FAILED,
        reason=Reason.DEPENDENCY_FAILED,
        exit_code=-1,
        stderr=dependency_failed_stderr(dependency_seq),
        finished_at=now,
    )


def cascade(failed: Job, dependents: Callable[[int], Sequence[Job]], now: int) -> list[Job]:
    """The jobs that end because `failed` ended `failed` for good: its pending `ok`
    dependents, and theirs in turn, as their failed versions, in id order. `dependents(seq)`
    gives the pending jobs that still wait for job `seq`."""
    if failed.status != jobs.FAILED:
        return []
    ended: dict[int, Job] = {}
    causes = [failed]
    while causes:
        cause = causes.pop()
        for dependent in dependents(cause.seq):
            if (
                dependent.seq in ended
                or dependent.status != jobs.PENDING
                or dependent.dependency != Dependency.OK
            ):
                continue
            ended[dependent.seq] = fail(dependent, cause.seq, now)
            causes.append(ended[dependent.seq])
    return [ended[seq] for seq in sorted(ended)]


def missing(depends_on: Sequence[int], found: Mapping[int, Job | None]) -> int | None:
    """The first dependency of a new job that names no job (`found`: the jobs by seq)."""
    for seq in depends_on:
        if found.get(seq) is None:
            return seq
    return None


def doomed(job: Job, found: Mapping[int, Job | None]) -> int | None:
    """For a new `ok` job: the first of its dependencies that already failed for good, or
    None. (An `any` job is never doomed: every end counts.)"""
    if job.dependency != Dependency.OK:
        return None
    for seq in job.depends_on:
        dependency = found.get(seq)
        if dependency is not None and dependency.status == jobs.FAILED:
            return seq
    return None


def unmet(job: Job, found: Mapping[int, Job | None]) -> list[int]:
    """The dependencies a pending job still waits for, in the order it named them. One no
    longer found counts as ended (only ended jobs are ever removed)."""
    need_done = job.dependency == Dependency.OK
    waiting = []
    for seq in job.depends_on:
        dependency = found.get(seq)
        if dependency is None:
            continue
        if dependency.status != jobs.DONE if need_done else not dependency.is_final:
            waiting.append(seq)
    return waiting
