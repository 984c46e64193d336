"""Why a pending job waits (`service/why_waiting.py`), on the harness: the texts that need the
scheduler's own state to be right, here what backfill holds back (`fit.Picker.explain`), each
checked against what the node's poll really hands out at the same instant."""

from __future__ import annotations

from harness import Harness

from tiny_scheduler.domain import fit, jobs
from tiny_scheduler.domain.jobs import Job


def one_node(cpus: int = 2) -> Harness:
    """One agent's node, `n1`, with `cpus` CPUs (builtin registry: CPUs are its slots)."""
    h = Harness(builtin=True, max_jobs_per_node="auto")
    h.heartbeat("n1", cpu_count=cpus, memory_mb=4096)
    return h


def running(h: Harness, **fields: object) -> Job:
    """A job submitted, handed out and claimed on n1 now."""
    job = h.submit(**fields)
    assert h.poll("n1") == [job.job_id]
    return h.claim(job.job_id)


def test_a_job_backfill_holds_back_names_the_job_it_waits_behind() -> None:
    h = one_node()
    running(h, timeout_secs=60)  # one of the two CPUs, until T0 + 60 s at the latest
    h.advance(10)
    head = h.submit(cpus=2, timeout_secs=60)  # needs both: the head, expected to start at 60 s
    long = h.submit(timeout_secs=3600)  # fits the free CPU, but would outlast that start
    short = h.submit(timeout_secs=30)  # ends at 40 s, before the head can start: backfills

    # What the poll does now is what the texts say.
    assert h.poll("n1") == [short.job_id]
    why = h.service.reads.waiting_for
    assert why(h.job(head.job_id)) == "2 free cpus on n1"
    expected = f"behind {head.job_id} (backfill: its timeout ends after {head.job_id} can start)"
    assert why(h.job(long.job_id)) == expected
    # A listing says the same (one walk of the node's order for the whole page).
    listed = h.service.reads.waiting_for_each([h.job(long.job_id), h.job(head.job_id)])
    assert listed[long.seq] == expected

    # Once the head has started, the long job waits for a CPU like any other.
    h.claim(short.job_id)
    for job_id in (short.job_id, "job-1"):
        h.report(job_id)
    assert h.poll("n1") == [head.job_id]
    h.claim(head.job_id)
    assert why(h.job(long.job_id)) == "a free slot on n1"
    assert h.job(long.job_id).status == jobs.PENDING


def test_a_job_backfill_never_looked_at_still_says_what_it_waits_behind() -> None:
    """Past `fit.BACKFILL_DEPTH` jobs behind a blocked head the poll stops looking: a job
    there that would fit waits for the head to start, not for the agent."""
    h = one_node()
    running(h, timeout_secs=60)
    head = h.submit(cpus=2, timeout_secs=60)
    looked_at = [h.submit(timeout_secs=3600) for _ in range(fit.BACKFILL_DEPTH)]
    past = h.submit(timeout_secs=1)  # it would backfill, if the poll looked this far

    assert h.poll("n1") == []
    why = h.service.reads.waiting_for
    assert why(h.job(looked_at[-1].job_id)) == (
        f"behind {head.job_id} (backfill: its timeout ends after {head.job_id} can start)"
    )
    assert why(h.job(past.job_id)) == (
        f"behind {head.job_id} (backfill looks at most {fit.BACKFILL_DEPTH} jobs past it)"
    )


def test_a_job_that_fits_with_no_head_blocked_waits_for_the_agent() -> None:
    h = one_node()
    waiting = h.submit(timeout_secs=3600)
    assert h.service.reads.waiting_for(h.job(waiting.job_id)) == "the agent on n1 to take it"
