"""The overview's picture of the last hour, computed from the jobs' own stamps: per minute, how
many jobs were submitted, how many ended in each state (done, failed, cancelled, timed out), how
many failed attempts were retried, and how many jobs were waiting (queue depth) at the end of
each minute.

Pure functions over a list of jobs (whatever the service hands over: every job not finished
before the window starts) and a clock reading; no I/O, no locks, no service. Minutes are
wall-clock minutes in UTC, the last one still running, so the bars stay put between refreshes.

A job waits from its creation until an agent claims it, and again from each failed attempt's
end until the next claim; a job cancelled while pending waits until it is cancelled. Jobs are
counted at their end, by the state people read (`jobs.state_of`), so the chart's `failed` is the
overview card's `failed`: jobs, not attempts, and neither a cancel nor a timeout (issue 36: the
chart said "failed 13" counting attempts while the card said 7). A failed attempt that was
retried counts in `retried`.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Iterator

from ..domain import jobs
from ..domain.jobs import Job

WINDOW_SECS = 3600
"""Seconds of history the overview's chart shows."""

BUCKET_SECS = 60
"""Seconds per bar of the chart."""

_US = 1_000_000


@dataclasses.dataclass(frozen=True, slots=True)
class Activity:
    """Per-bucket series over [start_us, end_us), oldest bucket first."""

    start_us: int
    bucket_us: int
    now_us: int
    submitted: list[int]
    done: list[int]
    failed: list[int]  # jobs that ended failed for good (not cancelled, not timed out)
    waiting: list[int]  # queue depth at each bucket's end (at `now_us` for the current one)
    cancelled: list[int] = dataclasses.field(default_factory=list)
    timed_out: list[int] = dataclasses.field(default_factory=list)
    retried: list[int] = dataclasses.field(default_factory=list)  # failed attempts retried

    @property
    def buckets(self) -> int:
        return len(self.submitted)

    @property
    def end_us(self) -> int:
        return self.start_us + self.buckets * self.bucket_us

    def bucket_start(self, index: int) -> int:
        return self.start_us + index * self.bucket_us

    @property
    def busiest(self) -> int:
        """The highest per-bucket count of the three rates (the rate chart's scale), at least 1."""
        return max(1, *self.submitted, *self.done, *self.failed)

    @property
    def deepest(self) -> int:
        """The highest queue depth in the window (the queue chart's scale), at least 1."""
        return max(1, *self.waiting)


def window_start(
    now_us: int, window_secs: int = WINDOW_SECS, bucket_secs: int = BUCKET_SECS
) -> int:
    """Where the window ending with the bucket that holds `now_us` starts: ask the service for
    the jobs not finished before this."""
    bucket_us = bucket_secs * _US
    return (now_us // bucket_us + 1) * bucket_us - window_secs * _US


def activity(
    found: Iterable[Job],
    now_us: int,
    window_secs: int = WINDOW_SECS,
    bucket_secs: int = BUCKET_SECS,
) -> Activity:
    """The series for the window that ends with the bucket holding `now_us`."""
    bucket_us = bucket_secs * _US
    count = window_secs // bucket_secs
    start = window_start(now_us, window_secs, bucket_secs)
    series = {name: [0] * count for name in _SERIES}
    # Depth is sampled at each bucket's end, the current bucket's at `now_us`: +1 from the
    # first sample a wait covers, -1 from the first it no longer does.
    samples = [start + (index + 1) * bucket_us for index in range(count)]
    samples[-1] = min(samples[-1], now_us)
    change = [0] * (count + 1)

    def bucket(us: int | None) -> int | None:
        if us is None or us < start or us > now_us:
            return None
        return min((us - start) // bucket_us, count - 1)

    for job in found:
        for name, moment in _events(job):
            index = bucket(moment)
            if index is not None:
                series[name][index] += 1
        for began, ended in _waits(job):
            if ended is not None and ended <= start:
                continue
            first = bisect.bisect_left(samples, began)
            last = count if ended is None else bisect.bisect_left(samples, ended)
            change[first] += 1
            change[last] -= 1
    waiting, depth = [], 0
    for index in range(count):
        depth += change[index]
        waiting.append(depth)
    return Activity(
        start,
        bucket_us,
        now_us,
        series["submitted"],
        series["done"],
        series["failed"],
        waiting,
        series["cancelled"],
        series["timed_out"],
        series["retried"],
    )


_SERIES = ("submitted", "done", "failed", "cancelled", "timed_out", "retried")
_ENDED = {jobs.DONE: "done", jobs.FAILED: "failed", jobs.CANCEL: "cancelled"}
_ENDED[jobs.TIMED_OUT] = "timed_out"


def _events(job: Job) -> Iterator[tuple[str, int | None]]:
    """The job's countable moments: its submission, each failed attempt that was retried, its
    end (in the series of the state it ended in)."""
    yield "submitted", job.created_at
    for attempt in job.attempts:
        yield "retried", attempt.finished_at
    if job.is_final:
        yield _ENDED[jobs.state_of(job.status, job.reason)], job.finished_at


def _waits(job: Job) -> Iterator[tuple[int, int | None]]:
    """The spans [began, ended) the job spent pending; `ended` None while it still waits."""
    began: int | None = job.created_at
    for attempt in job.attempts:
        ended = attempt.running_at or attempt.finished_at
        if began is not None and ended is not None:
            yield began, ended
        began = attempt.finished_at  # retried: pending again from the failed attempt's end
    if began is None:
        return
    if job.status == jobs.PENDING:
        yield began, None
    elif (ended := job.running_at or job.finished_at) is not None:
        yield began, ended
