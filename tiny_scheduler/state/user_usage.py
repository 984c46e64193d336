"""Each user's fair-share usage as it stands: the decayed CPU time of its ended attempts, kept
as one number as of the last end, and its running jobs, whose part grows until they end
(`fair_share` has the rule and the arithmetic).

The job table tells it when a job starts running (`running`), stops running without an end to
charge (`not_running`: its version is replaced), and when an attempt ends (`ended`, with the
moment). What a user's usage is at an instant is read with `usage(owner, now)`; a read of many
(`snapshot`) is what the poll orders jobs by. Not thread-safe by itself: the table calls it
under its lock.

Tests: `tests/test_fair_share.py`.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..domain import fair_share
from ..domain.fit import need_of
from ..domain.jobs import FINAL_STATUSES, Job


class UserUsage:
    """Per owner: (decayed usage, as of when) and its running jobs' (cpus, start)."""

    def __init__(self, half_life_secs: float) -> None:
        self._rate = fair_share.rate(half_life_secs)
        self._horizon_us = int(40 * half_life_secs * fair_share.US)  # 2**-40: nothing left
        self._charged: dict[str, tuple[float, int]] = {}
        self._running: dict[str, dict[int, tuple[int, int]]] = {}

    def running(self, job: Job) -> None:
        """The job runs (its attempt started at its `running_at`)."""
        cpus = need_of(job).cpus
        if cpus and job.running_at is not None:
            self._running.setdefault(job.owner, {})[job.seq] = (cpus, job.running_at)

    def not_running(self, job: Job) -> None:
        jobs_of = self._running.get(job.owner)
        if jobs_of is not None:
            jobs_of.pop(job.seq, None)
            if not jobs_of:
                del self._running[job.owner]

    def ended(self, owner: str, cpus: int, start_us: int, end_us: int) -> None:
        """An attempt of `cpus` that ran from `start_us` ended at `end_us`: charge it."""
        amount = fair_share.charge(cpus, start_us, end_us, self._rate)
        if amount <= 0:
            return
        value, at = self._charged.get(owner, (0.0, end_us))
        if end_us >= at:
            value, at = fair_share.decayed(value, end_us - at, self._rate) + amount, end_us
        else:  # an older end (the start-up's load): decayed to the later moment
            value += fair_share.decayed(amount, at - end_us, self._rate)
        self._charged[owner] = (value, at)

    def load(self, loaded: Iterable[Job]) -> None:
        """Start-up: charge what the stored jobs' ended attempts used, those that still count.

        What `ended` would make of them one by one, summed in bulk (`fair_share.charged_at`):
        each owner's runs decayed to its latest end (the moment `ended` keeps). At a hundred
        thousand finished jobs a call of `ended` and a `Resources` per job cost a start-up a
        third of a second."""
        cpus_of: dict[tuple[object, int], int] = {}  # need_of's CPUs by (job_type, cpus)
        runs: dict[tuple[str, int], list[tuple[int, int]]] = {}  # by (owner, cpus)
        for job in loaded:
            shape = (job.job_type, job.cpus)
            cpus = cpus_of.get(shape)
            if cpus is None:
                cpus = cpus_of[shape] = need_of(job).cpus
            times = _attempt_times(job) if cpus else None
            if times:
                key = (job.owner, cpus)
                if key in runs:
                    runs[key] += times
                else:
                    runs[key] = times
        oldest = max((end for times in runs.values() for _, end in times), default=0)
        oldest -= self._horizon_us
        counted = {
            key: [(start, end) for start, end in times if end > oldest and end > start]
            for key, times in runs.items()
        }
        last_end: dict[str, int] = {}
        for (owner, _), times in counted.items():
            if times:
                last_end[owner] = max(last_end.get(owner, 0), max(end for _, end in times))
        for (owner, cpus), times in counted.items():
            if times:
                value, at = self._charged.get(owner, (0.0, last_end[owner]))
                value += fair_share.charged_at(cpus, times, at, self._rate)
                self._charged[owner] = (value, at)

    def usage(self, owner: str, now_us: int) -> float:
        """The owner's usage at `now_us`, in decayed CPU seconds."""
        value, at = self._charged.get(owner, (0.0, now_us))
        total = fair_share.decayed(value, now_us - at, self._rate)
        for cpus, start in self._running.get(owner, {}).values():
            total += fair_share.charge(cpus, start, now_us, self._rate)
        return total

    def owners(self) -> set[str]:
        return set(self._charged) | set(self._running)


def _attempt_times(job: Job) -> list[tuple[int, int]]:
    """(start, end) of each ended attempt of a stored job: its earlier attempts, and its
    latest when it is final."""
    times = (
        [
            (attempt.running_at, attempt.finished_at)
            for attempt in job.attempts
            if attempt.running_at is not None and attempt.finished_at is not None
        ]
        if job.attempts
        else []  # most jobs: no list comprehension to run (a start-up makes 100k of them)
    )
    if job.status in FINAL_STATUSES and job.running_at is not None and job.finished_at is not None:
        times.append((job.running_at, job.finished_at))
    return times
