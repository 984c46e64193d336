"""What a job used (`usage`), its own retry count (`max_retries`) and an out-of-memory end, as
the service keeps them: on the harness, with the agent's reports as the wire carries them."""

from __future__ import annotations

from harness import Harness

from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.jobs import Reason, Usage
from tiny_scheduler.domain.validation import JobUpdate

USED = Usage(cpu_secs=1.5, max_rss_mb=40.0, wall_secs=2.0)


def end(h: Harness, job_id: str, status: str, exit_code: int, **fields: object) -> jobs.Job:
    update = JobUpdate(status=status, exit_code=exit_code, **fields)  # type: ignore[arg-type]
    return h.service.jobs.update(job_id, update)


def test_a_final_report_s_usage_is_kept_and_a_retry_keeps_it_on_the_attempt() -> None:
    h = Harness()
    job = h.submit("make")
    h.claim(job.job_id)
    retried = end(h, job.job_id, jobs.FAILED, 2, usage=USED)
    assert retried.status == jobs.PENDING and retried.usage is None
    assert retried.attempts[-1].usage == USED
    h.claim(job.job_id)
    second = Usage(0.5, 10.0, 1.0)
    done = end(h, job.job_id, jobs.DONE, 0, usage=second)
    assert done.usage == second
    shown = h.job(job.job_id).to_wire(with_attempts=True)
    assert shown["usage"] == {"cpu_secs": 0.5, "max_rss_mb": 10.0, "wall_secs": 1.0}
    assert shown["attempts"][0]["usage"]["cpu_secs"] == 1.5
    # Stored, not only shown: a new scheduler on the same database reads it back.
    again = h.restart().job(job.job_id)
    assert again.usage == second and again.attempts[0].usage == USED


def test_an_out_of_memory_end_is_final_and_says_so() -> None:
    h = Harness(max_job_retries=3)
    job = h.submit("python -c 'x = bytearray(1 << 30)'", memory_mb=64)
    h.claim(job.job_id)
    ended = end(h, job.job_id, jobs.FAILED, -9, out_of_memory=True, stderr="Killed\n")
    assert (ended.status, ended.reason, ended.retry_count) == (jobs.FAILED, Reason.OUT_OF_MEMORY, 0)
    assert ended.stderr.endswith(jobs.OUT_OF_MEMORY_STDERR)


def test_a_job_s_own_max_retries_overrides_the_default() -> None:
    h = Harness(max_job_retries=1)
    never = h.submit("false", max_retries=0)
    h.claim(never.job_id)
    assert end(h, never.job_id, jobs.FAILED, 1).status == jobs.FAILED
    thrice = h.submit("false", max_retries=3)
    for attempt in range(3):
        h.claim(thrice.job_id)
        assert end(h, thrice.job_id, jobs.FAILED, 1).retry_count == attempt + 1
    h.claim(thrice.job_id)
    last = end(h, thrice.job_id, jobs.FAILED, 1)
    assert (last.status, last.retry_count) == (jobs.FAILED, 3)
