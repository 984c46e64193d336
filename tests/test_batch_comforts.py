"""The batch comforts on the harness (api.md, "Batch comforts"): arrays, hold and release,
retry as a new job, per-job retries, the filters by name, owner and array, and why a pending
job waits, in listings too. Each rule at its boundary, on the real service, no port."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from harness import Harness

from tiny_scheduler import errors
from tiny_scheduler.domain import jobs, schedules, validation
from tiny_scheduler.domain.queues import QueueSettings
from tiny_scheduler.domain.validation import JobQuery
from tiny_scheduler.service import Event


def listing(h: Harness, **filters: Any) -> list[str]:
    return [job.job_id for job in h.service.reads.list_jobs(JobQuery(**filters)).jobs]


def committed_jobs(h: Harness) -> list[list[str]]:
    """The job ids of each batch committed that saved jobs, in order."""
    return [[job.job_id for job in batch.upserts] for batch in h.commits if batch.upserts]


# --- arrays ----------------------------------------------------------------------------------


def test_an_array_is_n_copies_in_one_transaction_with_consecutive_ids() -> None:
    h = Harness()
    h.submit("before")
    h.cancel("job-1")
    first = h.submit("run.sh $TINY_ARRAY_INDEX", array=5, name="sweep", env_vars={"K": "v"})
    assert committed_jobs(h)[-1] == ["job-2", "job-3", "job-4", "job-5", "job-6"]
    assert first.job_id == "job-2"
    made = [h.job(f"job-{seq}") for seq in range(2, 7)]
    assert [job.array_index for job in made] == [0, 1, 2, 3, 4]
    assert {job.to_wire()["array_id"] for job in made} == {"job-2"}
    assert [job.env_vars for job in made] == [
        {"K": "v", "TINY_ARRAY_INDEX": str(index)} for index in range(5)
    ]
    assert {job.name for job in made} == {"sweep"}
    # Each placed by the rule as a submission would be: the rotation goes on from job-1's.
    assert [job.node_id for job in made] == ["node-b", "node-c", "node-a", "node-b", "node-c"]
    assert h.submit("after").node_id == "node-a"  # the least loaded
    submitted = [job_id for event, job_id, _ in h.events if event == Event.SUBMITTED]
    assert submitted == [f"job-{seq}" for seq in range(1, 8)]


def test_an_arrays_jobs_are_listed_by_array_id_and_stop_at_its_end() -> None:
    h = Harness()
    h.submit("before")
    sweep = h.submit("x", array=3)
    h.submit("after")
    other = h.submit("y", array=2)
    assert listing(h, array_id=sweep.seq) == ["job-2", "job-3", "job-4"]
    assert listing(h, array_id=other.seq) == ["job-6", "job-7"]
    assert listing(h, array_id=3) == []  # not the first job of an array
    assert listing(h, array_id=sweep.seq, status="pending", limit=2) == ["job-2", "job-3"]
    assert listing(h, array_id=sweep.seq, status="pending", after=3) == ["job-4"]
    h.claim("job-3")
    assert listing(h, array_id=sweep.seq, status="running") == ["job-3"]
    assert listing(h, array_id=sweep.seq, status="pending") == ["job-2", "job-4"]
    assert [job.seq for job in h.service.reads.array_jobs(sweep.seq)] == [2, 3, 4]


def test_an_idempotency_key_on_an_array_answers_its_first_job() -> None:
    h = Harness()
    first = h.submit("x", key="http:k1", array=4)
    again, created = h.submit_request(first_request(array=4), "http:k1")
    assert (again.job_id, created) == (first.job_id, False)
    assert len(h.service.reads.list_jobs(JobQuery()).jobs) == 4
    assert [h.stored(f"job-{seq}").dedupe_key for seq in range(1, 5)] == [
        "http:k1",
        None,
        None,
        None,
    ]
    # The key survives a restart, on the first job.
    after = h.restart()
    assert after.submit_request(first_request(array=4), "http:k1") == (after.job("job-1"), False)


def first_request(**fields: Any) -> validation.JobRequest:
    return validation.parse_job_request(orjson.dumps({"command": "x", **fields}))


def test_depends_on_an_arrays_first_job_means_that_one_job() -> None:
    h = Harness()
    sweep = h.submit("x", array=3)
    after = h.submit("summary", depends_on=[sweep.job_id])
    h.claim("job-1")
    h.report("job-1", 0)
    assert h.service.reads.waiting_for(h.job(after.job_id)) != "dependencies: job-1"
    assert h.job(after.job_id).status == jobs.PENDING
    assert h.service.reads.waiting_for(h.job(after.job_id)).startswith(("a free", "the agent"))


def test_an_array_whose_dependency_failed_ends_at_once_every_copy_in_one_commit() -> None:
    h = Harness(max_job_retries=0)
    failing = h.submit("false")
    h.claim(failing.job_id)
    h.report(failing.job_id, 1)
    h.service.reads.keep_final_events(lambda job: job.job_id)  # what the SNS loop does
    h.submit("x", array=3, depends_on=[failing.job_id])
    assert committed_jobs(h)[-1] == ["job-2", "job-3", "job-4"]
    assert [event.message for event in h.commits[-1].events] == ["job-2", "job-3", "job-4"]
    ended = [h.job(f"job-{seq}") for seq in range(2, 5)]
    assert {(job.status, job.reason) for job in ended} == {
        (jobs.FAILED, jobs.Reason.DEPENDENCY_FAILED)
    }
    finished = [job_id for event, job_id, _ in h.events if event == Event.FINISHED]
    assert finished[-3:] == ["job-2", "job-3", "job-4"]


def test_an_array_survives_a_restart() -> None:
    h = Harness()
    h.submit("x", array=3, name="n")
    after = h.restart()
    assert listing(after, array_id=1) == ["job-1", "job-2", "job-3"]
    assert after.job("job-3").to_wire()["array_id"] == "job-1"
    assert after.job("job-3").array_index == 2
    assert after.submit("next").job_id == "job-4"


# --- hold and release ------------------------------------------------------------------------


def test_a_held_job_is_not_handed_out_until_released() -> None:
    h = Harness(max_jobs_per_node=2)
    held = h.submit_on("node-a", "first")
    waiting = h.submit_on("node-a", "second")
    h.events.clear()
    answer = h.service.jobs.hold(held.job_id)
    assert (answer.status, answer.held) == (jobs.PENDING, True)
    assert answer.to_wire()["held"] is True
    assert h.stored(held.job_id).held
    assert h.events == [(Event.HELD, held.job_id, "")]
    assert h.poll("node-a") == [waiting.job_id]
    assert h.service.reads.waiting_for(h.job(held.job_id)) == "held"
    released = h.service.jobs.release(held.job_id)
    assert not released.held and "held" not in released.to_wire()
    assert h.events[-1] == (Event.RELEASED, held.job_id, "")
    assert h.poll("node-a") == [held.job_id, waiting.job_id]


def test_holding_twice_or_releasing_a_job_not_held_changes_nothing() -> None:
    h = Harness()
    job = h.submit("x")
    h.service.jobs.hold(job.job_id)
    commits = len(h.commits)
    assert h.service.jobs.hold(job.job_id).held
    h.service.jobs.release(job.job_id)
    assert not h.service.jobs.release(job.job_id).held
    assert len(h.commits) == commits + 1  # only the release was a change


@pytest.mark.parametrize("how", ["running", "done", "cancelled"])
def test_only_a_pending_job_is_held_or_released(how: str) -> None:
    h = Harness()
    job = h.submit("x")
    h.claim(job.job_id)
    if how == "done":
        h.report(job.job_id, 0)
    elif how == "cancelled":
        h.cancel(job.job_id)
    for change in (h.service.jobs.hold, h.service.jobs.release):
        with pytest.raises(errors.Conflict) as refused:
            change(job.job_id)
        assert refused.value.message == "job is not pending"
    with pytest.raises(errors.NotFound):
        h.service.jobs.hold("job-99")


def test_a_claim_of_a_held_job_is_refused() -> None:
    h = Harness()
    job = h.submit("x")
    assert h.poll(job.node_id) == [job.job_id]  # its agent was handed it before the hold
    h.service.jobs.hold(job.job_id)
    with pytest.raises(errors.Conflict) as refused:
        h.claim(job.job_id)
    assert refused.value.message == f"job {job.job_id} is held, cannot become running"
    assert h.job(job.job_id).status == jobs.PENDING


def test_a_held_job_counts_as_no_load() -> None:
    h = Harness(max_jobs_per_node=1)
    job = h.submit_on("node-a", "x")
    assert h.service.reads.next_node() == "node-b"  # node-a has a job waiting
    h.service.jobs.hold(job.job_id)
    loads = h.service.reads.node_loads(["node-a"], None)
    assert (loads[0].queued, loads[0].used) == (0, 0)


def test_a_held_job_is_not_taken_over_by_an_idle_node() -> None:
    h = Harness(job_stealing=True, max_jobs_per_node=1)
    busy = h.submit_on("node-a", "long")
    h.claim(busy.job_id)
    held = h.submit_on("node-a", "held")
    free = h.submit_on("node-a", "free")
    h.service.jobs.hold(held.job_id)
    assert h.poll("node-b") == [free.job_id]  # moved; the held one stays where it is
    assert h.job(held.job_id).node_id == "node-a"


def test_a_hold_survives_a_restart_and_a_held_job_can_be_cancelled() -> None:
    h = Harness()
    job = h.submit("x")
    h.service.jobs.hold(job.job_id)
    after = h.restart()
    assert after.job(job.job_id).held and after.poll(job.node_id) == []
    assert after.cancel(job.job_id).reason == jobs.Reason.CANCELLED


def test_a_held_job_waiting_for_a_dependency_still_fails_with_it() -> None:
    h = Harness(max_job_retries=0)
    first = h.submit("false")
    waiting = h.submit("next", depends_on=[first.job_id])
    h.service.jobs.hold(waiting.job_id)
    assert h.service.reads.waiting_for(h.job(waiting.job_id)) == "held"
    h.claim(first.job_id)
    h.report(first.job_id, 1)
    assert h.job(waiting.job_id).reason == jobs.Reason.DEPENDENCY_FAILED


# --- retry as a new job ----------------------------------------------------------------------


def test_retry_submits_the_same_request_as_a_new_job_naming_the_old() -> None:
    h = Harness(max_job_retries=0)
    old = h.submit(
        "false", name="nightly", env_vars={"A": "1"}, priority=70, queue="q", max_retries=2
    )
    h.claim(old.job_id)
    h.cancel(old.job_id)
    new = h.service.jobs.retry_as_new(old.job_id)
    assert new.job_id != old.job_id and new.status == jobs.PENDING
    assert new.to_wire()["retry_of"] == old.job_id
    same = ("command", "name", "env_vars", "priority", "queue", "max_retries")
    assert [getattr(new, name) for name in same] == [getattr(old, name) for name in same]
    assert new.retry_count == 0 and new.attempts == ()
    assert h.stored(new.job_id).retry_of == old.seq


def test_retry_does_not_repeat_a_time_and_drops_dependencies_retention_removed() -> None:
    h = Harness(max_job_retries=0)
    dependency = h.submit("true")
    h.claim(dependency.job_id)
    h.report(dependency.job_id, 0)
    old = h.submit("x", delay_secs=60, depends_on=[dependency.job_id])
    h.cancel(old.job_id)
    h.advance(10)
    h.service.jobs.expire(h.clock.now_us(), limit=1)  # the dependency goes
    new = h.service.jobs.retry_as_new(old.job_id)
    assert new.not_before is None and new.depends_on == ()
    assert h.poll(new.node_id) == [new.job_id]


def test_retry_of_an_arrays_copy_is_one_job_that_keeps_its_index() -> None:
    h = Harness()
    h.submit("x", array=3)
    h.cancel("job-2")
    new = h.service.jobs.retry_as_new("job-2")
    assert new.array_id == 0 and new.array_index is None
    assert new.env_vars == {"TINY_ARRAY_INDEX": "1"}


def test_only_a_finished_job_is_retried_as_a_new_one() -> None:
    h = Harness()
    job = h.submit("x")
    with pytest.raises(errors.Conflict) as refused:
        h.service.jobs.retry_as_new(job.job_id)
    assert refused.value.message == "job is not finished"
    with pytest.raises(errors.NotFound):
        h.service.jobs.retry_as_new("job-99")


# --- per-job retries -------------------------------------------------------------------------


@pytest.mark.parametrize(("max_retries", "attempts"), [(0, 1), (3, 4), (None, 2)])
def test_a_jobs_own_max_retries_decides_how_often_it_runs(
    max_retries: int | None, attempts: int
) -> None:
    h = Harness(max_job_retries=1)
    fields = {} if max_retries is None else {"max_retries": max_retries}
    job = h.submit("false", **fields)
    for _ in range(10):
        current = h.job(job.job_id)
        if current.is_final:
            break
        h.claim(job.job_id)
        h.report(job.job_id, 1)
    ended = h.job(job.job_id)
    assert (ended.status, ended.retry_count + 1) == (jobs.FAILED, attempts)


# --- filters ---------------------------------------------------------------------------------


def test_name_and_owner_filter_exactly_and_combine_with_status_and_paging() -> None:
    h = Harness()
    h.submit("a", name="nightly")
    h.submit("b", name="nightly-2")
    h.submit("c", name="nightly")
    h.submit("d", name="nightly", queue="q")
    h.claim("job-3")
    assert listing(h, name="nightly") == ["job-1", "job-3", "job-4"]
    assert listing(h, name="nightly", status="pending") == ["job-1", "job-4"]
    assert listing(h, name="nightly", queue="q", status="pending") == ["job-4"]
    page = h.service.reads.list_jobs(JobQuery(name="nightly", limit=1, after=1))
    assert ([job.job_id for job in page.jobs], page.next_after) == (["job-3"], 3)
    assert listing(h, owner="alice") == []
    assert listing(h, owner="") == listing(h)  # an empty filter is no filter


# --- why a pending job waits, in listings ----------------------------------------------------


def test_a_listing_says_why_each_pending_job_waits_and_the_poll_never_does() -> None:
    h = Harness(max_jobs_per_node=1)
    client = h.app().test_client()
    first = h.submit_on("node-a", "first")
    h.submit_on("node-a", "after", depends_on=[first.job_id])
    h.service.queues.update(QueueSettings("q", None, True))
    h.submit_on("node-a", "paused", queue="q")
    held = h.submit_on("node-a", "held")
    h.service.jobs.hold(held.job_id)
    listed = orjson.loads(client.get("/jobs?status=pending").data)
    assert {job["job_id"]: job.get("waiting_for") for job in listed} == {
        "job-1": "the agent on node-a to take it",
        "job-2": "dependencies: job-1",
        "job-3": "queue q paused",
        "job-4": "held",
    }
    assert list(listed[3])[-1] == "waiting_for"  # after every field of the job
    polled = orjson.loads(client.get("/jobs?node_id=node-a&status=pending").data)
    assert [job["job_id"] for job in polled] == ["job-1"]
    assert all("waiting_for" not in job for job in polled)
    h.claim("job-1")
    running = orjson.loads(client.get("/jobs?status=running").data)
    assert "waiting_for" not in running[0]


def test_failures_are_counted_by_reason() -> None:
    h = Harness(max_job_retries=0)
    for _ in range(2):
        job = h.submit("x")
        h.cancel(job.job_id)
    failing = h.submit("false")
    h.claim(failing.job_id)
    h.report(failing.job_id, 3)
    counts = h.service.reads.reason_counts()
    assert (counts["cancelled"], counts["exit"], counts["timeout"]) == (2, 1, 0)
    assert h.restart().service.reads.reason_counts() == counts


def test_a_schedules_job_may_be_named_and_retried_but_not_an_array() -> None:
    body: dict[str, Any] = {"name": "n", "cron": "* * * * *", "job": {"command": "x"}}
    body["job"].update(name="nightly", max_retries=3)
    change = schedules.parse_schedule_request(orjson.dumps(body), partial=False)
    assert change.job is not None and (change.job.name, change.job.max_retries) == ("nightly", 3)
    body["job"]["array"] = 10
    with pytest.raises(errors.BadRequest) as refused:
        schedules.parse_schedule_request(orjson.dumps(body), partial=False)
    assert refused.value.message == "job.array is not allowed in a schedule's job"
