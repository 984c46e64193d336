"""The overview chart's numbers (`ui/activity.py`): per-minute submissions, ends by state (done,
failed, cancelled, timed out), retried attempts, and the queue depth at each minute's end, from
the jobs' stamps. Hand-made histories for each
rule, and random ones checked against a direct count."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.jobs import Attempt, Job
from tiny_scheduler.ui.activity import activity, window_start

MIN = 60_000_000
NOW = 1_800_000_000_000_000 + 30 * 1_000_000  # half a minute into a minute
START = window_start(NOW)


def at(minute: int, seconds: int = 0) -> int:
    """A moment `seconds` into the window's bucket number `minute` (0 is the oldest)."""
    return START + minute * MIN + seconds * 1_000_000


def job(
    created: int,
    running: int | None = None,
    finished: int | None = None,
    status: str = jobs.PENDING,
    attempts: tuple[Attempt, ...] = (),
    reason: jobs.Reason | None = None,
) -> Job:
    return Job(
        reason=reason,
        seq=1,
        node_id="node-a",
        command="true",
        created_at=created,
        status=status,
        running_at=running,
        finished_at=finished,
        attempts=attempts,
    )


def failed_attempt(running: int, finished: int) -> Attempt:
    return Attempt("node-b", 1, "", "boom", running, finished)


def test_the_window_is_the_last_hour_in_whole_minutes() -> None:
    empty = activity([], NOW)
    assert empty.buckets == 60
    assert empty.start_us % MIN == 0
    assert empty.end_us == START + 60 * MIN
    assert empty.start_us <= NOW - 59 * MIN
    assert empty.bucket_start(59) <= NOW < empty.end_us  # the current minute is the last bar
    assert (empty.submitted, empty.done, empty.failed, empty.waiting) == ([0] * 60,) * 4
    assert (empty.busiest, empty.deepest) == (1, 1)


def test_a_minute_boundary_belongs_to_the_minute_it_starts() -> None:
    found = activity([job(at(30))], NOW)
    assert found.submitted[30] == 1
    # Depth is read at each minute's end, which is the next one's start: waiting from there.
    assert found.waiting[29] == 1 and found.waiting[28] == 0


def test_a_job_counts_when_submitted_and_when_done_and_waits_in_between() -> None:
    found = activity([job(at(10, 5), at(12, 1), at(20), jobs.DONE)], NOW)
    assert found.submitted[10] == 1 and sum(found.submitted) == 1
    assert found.done[20] == 1 and sum(found.done) == 1
    assert sum(found.failed) == 0
    # Waiting at the ends of minutes 10 and 11; claimed during minute 12.
    assert [i for i, depth in enumerate(found.waiting) if depth] == [10, 11]


def test_a_retried_job_is_retried_once_fails_never_and_waits_twice() -> None:
    retried = job(
        at(1, 10),
        running=at(6, 10),
        finished=at(7),
        status=jobs.DONE,
        attempts=(failed_attempt(at(2, 30), at(4, 10)),),
    )
    found = activity([retried], NOW)
    # Issue 36: an attempt is no failed job (the card counts jobs): it is a retry.
    assert found.retried[4] == 1 and sum(found.retried) == 1 and sum(found.failed) == 0
    assert found.done[7] == 1
    assert [i for i, depth in enumerate(found.waiting) if depth] == [1, 4, 5]


def test_a_failure_at_the_end_counts_as_failed() -> None:
    found = activity([job(at(3), at(3, 1), at(8), jobs.FAILED)], NOW)
    assert found.failed[8] == 1 and sum(found.done) == 0


def test_a_job_cancelled_while_pending_waited_until_cancelled() -> None:
    cancelled = job(at(30, 1), None, at(33, 20), jobs.FAILED, reason=jobs.Reason.CANCELLED)
    found = activity([cancelled], NOW)
    assert [i for i, depth in enumerate(found.waiting) if depth] == [30, 31, 32]
    assert found.cancelled[33] == 1 and sum(found.failed) == 0


def test_a_timed_out_job_counts_apart_from_failures() -> None:
    timed_out = job(at(3), at(3, 1), at(9), jobs.FAILED, reason=jobs.Reason.TIMEOUT)
    lost = job(at(3), at(3, 1), at(9), jobs.FAILED, reason=jobs.Reason.NODE_LOST)
    found = activity([timed_out, lost], NOW)
    assert (found.timed_out[9], found.failed[9], sum(found.cancelled)) == (1, 1, 0)


def test_a_job_pending_since_before_the_window_waits_all_along() -> None:
    found = activity([job(START - 5 * MIN), job(START - 1)], NOW)
    assert found.waiting == [2] * 60
    assert sum(found.submitted) == 0  # submitted before the window


def test_what_ended_before_the_window_counts_nowhere() -> None:
    old = job(START - 3 * MIN, START - 2 * MIN, START - MIN, jobs.DONE)
    found = activity([old], NOW)
    assert (sum(found.submitted), sum(found.done), sum(found.waiting)) == (0, 0, 0)


def test_the_current_minute_counts_up_to_now() -> None:
    found = activity([job(NOW), job(NOW - 1, NOW, None, jobs.RUNNING)], NOW)
    assert found.submitted[59] == 2
    assert found.waiting[59] == 1  # the current minute's depth is read at NOW


def test_the_scales_follow_the_busiest_minute_and_the_deepest_queue() -> None:
    found = activity(
        [job(at(5)) for _ in range(7)] + [job(at(9, 1), at(9, 2), None, jobs.RUNNING)], NOW
    )
    assert found.busiest == 7
    assert found.deepest == 7


@st.composite
def histories(draw: st.DrawFn) -> Job:
    """A job with a consistent history that may begin before the window."""
    moment = draw(st.integers(START - 90 * MIN, NOW))
    created = moment
    attempts = []
    for _ in range(draw(st.integers(0, 2))):
        running = moment = draw(st.integers(moment, NOW))
        finished = moment = draw(st.integers(moment, NOW))
        attempts.append(failed_attempt(running, finished))
    status = draw(st.sampled_from(jobs.STATUSES))
    running = finished = None
    if status in (jobs.RUNNING, jobs.DONE, jobs.FAILED):
        running = moment = draw(st.integers(moment, NOW))
    if status != jobs.PENDING and status != jobs.RUNNING:
        finished = draw(st.integers(moment, NOW))
    return job(created, running, finished, status, tuple(attempts))


@settings(max_examples=200, deadline=None)
@given(st.lists(histories(), max_size=20))
def test_random_histories_agree_with_a_direct_count(found: list[Job]) -> None:
    chart = activity(found, NOW)

    def within(us: int | None) -> bool:
        return us is not None and START <= us <= NOW

    assert sum(chart.submitted) == sum(within(j.created_at) for j in found)
    assert sum(chart.done) == sum(j.status == jobs.DONE and within(j.finished_at) for j in found)
    retries = [a.finished_at for j in found for a in j.attempts]
    assert sum(chart.retried) == sum(within(us) for us in retries)
    failures = [j.finished_at for j in found if j.is_final and j.status != jobs.DONE]
    assert sum(chart.failed) == sum(within(us) for us in failures)
    # Read at NOW, the last depth is exactly the jobs pending now.
    assert chart.waiting[-1] == sum(j.status == jobs.PENDING for j in found)
    assert all(depth >= 0 for depth in chart.waiting)
