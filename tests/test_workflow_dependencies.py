"""Dependencies between jobs (issue 25) on the in-memory harness: chains and fans run in
order, a final failure ends its `ok` dependents in the same commit, `any` runs after any end,
and the state survives a restart. Every rule is checked at the instant it applies; no daemon,
no sleep."""

from __future__ import annotations

import pytest
from harness import Harness

from tiny_scheduler import errors
from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.jobs import Reason
from tiny_scheduler.domain.validation import JobQuery


def run(h: Harness, job_id: str, exit_code: int = 0) -> None:
    """The agent of the job's node takes it (it must be offered) and reports its end."""
    node = h.job(job_id).node_id
    assert job_id in h.poll(node), f"{job_id} is not offered to {node}"
    h.claim(job_id)
    h.report(job_id, exit_code)


def offered(h: Harness) -> set[str]:
    """Every job an agent would be handed now, over all nodes."""
    return {job_id for node in ("node-a", "node-b", "node-c") for job_id in h.poll(node)}


def test_a_chain_runs_in_order() -> None:
    h = Harness()
    a = h.submit("a")
    b = h.submit("b", depends_on=[a.job_id])
    c = h.submit("c", depends_on=[b.job_id])
    assert offered(h) == {a.job_id}
    run(h, a.job_id)
    assert offered(h) == {b.job_id}
    run(h, b.job_id)
    assert offered(h) == {c.job_id}
    run(h, c.job_id)
    assert [h.job(j.job_id).status for j in (a, b, c)] == [jobs.DONE] * 3


def test_a_fan_in_waits_for_every_dependency() -> None:
    h = Harness()
    a, b = h.submit("a"), h.submit("b")
    d = h.submit("d", depends_on=[a.job_id, b.job_id])
    run(h, a.job_id)
    assert d.job_id not in offered(h)
    run(h, b.job_id)
    assert d.job_id in offered(h)


def test_a_pending_dependent_is_listed_but_counts_as_no_load() -> None:
    h = Harness()
    a = h.submit("a")
    b = h.submit("b", depends_on=[a.job_id])
    page = h.service.reads.list_jobs(JobQuery(status="pending"))
    assert [job.job_id for job in page.jobs] == [a.job_id, b.job_id]
    assert h.service.reads.node_loads([b.node_id], None)[0].queued == 0


def test_a_final_failure_ends_its_ok_dependents_transitively_in_one_commit() -> None:
    h = Harness(max_job_retries=0)
    h.service.reads.keep_final_events(lambda job: f"{job.job_id} {job.status} {job.reason}")
    a = h.submit("a")
    b = h.submit("b", depends_on=[a.job_id])
    c = h.submit("c", depends_on=[b.job_id])
    other = h.submit("unrelated")
    before = len(h.commits)
    run(h, a.job_id, exit_code=3)
    failure = h.commits[-1]
    assert len(h.commits) == before + 2  # the claim, then the failure with its cascade
    assert [job.job_id for job in failure.upserts] == [a.job_id, b.job_id, c.job_id]
    assert [event.message for event in failure.events] == [
        f"{a.job_id} failed exit",
        f"{b.job_id} failed dependency_failed",
        f"{c.job_id} failed dependency_failed",
    ]
    for job_id, cause in ((b.job_id, a.job_id), (c.job_id, b.job_id)):
        ended = h.stored(job_id)
        assert (ended.status, ended.reason, ended.exit_code) == (
            jobs.FAILED,
            Reason.DEPENDENCY_FAILED,
            -1,
        )
        assert h.job(job_id).stderr == f"dependency {cause} failed"
        assert h.job(job_id).retry_count == 0  # never retried
    assert h.job(other.job_id).status == jobs.PENDING


def test_a_failure_that_is_retried_ends_nothing() -> None:
    h = Harness(max_job_retries=1)
    a = h.submit("a")
    b = h.submit("b", depends_on=[a.job_id])
    run(h, a.job_id, exit_code=1)
    assert h.job(a.job_id).status == jobs.PENDING  # retried
    assert h.job(b.job_id).status == jobs.PENDING
    run(h, a.job_id)
    assert b.job_id in offered(h)


def test_a_cancelled_dependency_ends_its_ok_dependents_too() -> None:
    h = Harness()
    a = h.submit("a")
    b = h.submit("b", depends_on=[a.job_id])
    h.cancel(a.job_id)
    assert (h.job(b.job_id).status, h.job(b.job_id).reason) == (
        jobs.FAILED,
        Reason.DEPENDENCY_FAILED,
    )


def test_an_any_dependent_runs_after_a_failure() -> None:
    h = Harness(max_job_retries=0)
    a = h.submit("a")
    b = h.submit("b", depends_on=[a.job_id], dependency="any")
    c = h.submit("c", depends_on=[b.job_id])  # ok, on the `any` job
    run(h, a.job_id, exit_code=2)
    assert h.job(b.job_id).status == jobs.PENDING
    assert offered(h) == {b.job_id}
    run(h, b.job_id)
    assert offered(h) == {c.job_id}


def test_a_dependent_on_a_done_job_is_due_at_once() -> None:
    h = Harness()
    a = h.submit("a")
    run(h, a.job_id)
    b = h.submit("b", depends_on=[a.job_id])
    assert b.status == jobs.PENDING
    assert b.job_id in h.poll(b.node_id)


def test_an_ok_dependent_on_a_failed_job_ends_at_once_and_any_does_not() -> None:
    h = Harness(max_job_retries=0)
    h.service.reads.keep_final_events(lambda job: job.job_id)
    a = h.submit("a")
    run(h, a.job_id, exit_code=1)
    b = h.submit("b", depends_on=[a.job_id])
    assert (b.status, b.reason, b.stderr) == (
        jobs.FAILED,
        Reason.DEPENDENCY_FAILED,
        f"dependency {a.job_id} failed",
    )
    assert [event.message for event in h.commits[-1].events] == [b.job_id]
    c = h.submit("c", depends_on=[a.job_id], dependency="any")
    assert c.job_id in h.poll(c.node_id)


def test_a_dependency_that_does_not_exist_is_refused() -> None:
    h = Harness()
    a = h.submit("a")
    before = len(h.commits)
    with pytest.raises(errors.BadRequest) as caught:
        h.submit("b", depends_on=[a.job_id, "job-99"])
    assert caught.value.message == "depends_on: job-99 not found"
    assert len(h.commits) == before


def test_retention_keeps_a_job_a_pending_job_still_waits_for() -> None:
    h = Harness(max_job_retries=0)
    a, b = h.submit("a"), h.submit("b")
    waiting = h.submit("waits", depends_on=[a.job_id, b.job_id])
    run(h, a.job_id)
    h.advance(10)
    assert h.service.jobs.expire(h.clock.now_us()) == 0  # a is kept: `waiting` still waits
    assert h.job(a.job_id).status == jobs.DONE
    run(h, b.job_id)
    h.advance(10)
    assert h.service.jobs.expire(h.clock.now_us()) == 2  # nobody waits any more
    assert waiting.job_id in h.poll(waiting.node_id)


def test_dependencies_hold_across_a_restart() -> None:
    h = Harness()
    a = h.submit("a")
    b = h.submit("b", depends_on=[a.job_id])
    h.claim(a.job_id)
    h = h.restart()
    assert offered(h) == set()  # a runs, b still waits for it
    h.report(a.job_id)
    assert offered(h) == {b.job_id}


def test_a_failure_after_a_restart_still_ends_its_dependents() -> None:
    h = Harness(max_job_retries=0)
    a = h.submit("a")
    b = h.submit("b", depends_on=[a.job_id])
    h.claim(a.job_id)
    h = h.restart()
    h.report(a.job_id, exit_code=1)
    assert h.job(b.job_id).reason == Reason.DEPENDENCY_FAILED


def test_a_job_waiting_for_dependencies_cannot_be_claimed_by_name() -> None:
    h = Harness()
    a = h.submit("a")
    b = h.submit("b", depends_on=[a.job_id])
    with pytest.raises(errors.Conflict) as caught:
        h.claim(b.job_id)
    assert caught.value.message == f"job {b.job_id} cannot start: its dependencies have not ended"
    assert h.job(b.job_id).status == jobs.PENDING
