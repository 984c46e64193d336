"""Delayed jobs (`not_before` / `delay_secs`): the request checks, the job table's poll that
never hands a job out before its time, the service doing the same on the harness, and the
live daemon for what crosses processes (the 400 on the wire, SQS messages).

The table and the harness are given the time it should think it is, so their rules are
checked at exact moments; the live tests only wait on conditions, never on the clock.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import SchedulerFactory
from harness import Harness, table_poll
from helpers import Agent, Api, wait_for

from tiny_scheduler import errors
from tiny_scheduler.dev.sqs import FakeSqs
from tiny_scheduler.domain import jobs, validation
from tiny_scheduler.domain.jobs import Job
from tiny_scheduler.state.table import JobTable

T0 = 1_764_498_030_000_000
SECOND = 1_000_000
NOT_BEFORE = "not_before must be an RFC 3339 time such as 2026-11-30T10:20:30Z"
DELAY = f"delay_secs must be an integer between 0 and {validation.MAX_DELAY_SECS}"


def make(seq: int, node_id: str = "node-a", **fields: Any) -> Job:
    return Job(seq=seq, node_id=node_id, command=f"cmd {seq}", created_at=T0 + seq, **fields)


def seqs(found: list[Job]) -> list[int]:
    return [job.seq for job in found]


# --- the request --------------------------------------------------------------------------------


def request_error(body: dict[str, Any]) -> str:
    with pytest.raises(errors.BadRequest) as caught:
        validation.parse_job_request(json.dumps(body).encode())
    return caught.value.message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30T10:20:30Z", 1_796_034_030_000_000),
        ("2026-11-30T10:20:30.123456Z", 1_796_034_030_123_456),
        ("2026-11-30t10:20:30.5z", 1_796_034_030_500_000),
        ("2026-11-30T11:20:30+01:00", 1_796_034_030_000_000),
        ("2026-11-30T05:50:30-04:30", 1_796_034_030_000_000),
        # Go's RFC3339Nano: digits past the microsecond are dropped.
        ("2026-11-30T10:20:30.123456789Z", 1_796_034_030_123_456),
    ],
)
def test_not_before_takes_rfc3339_times(text: str, expected: int) -> None:
    request = validation.parse_job_request(
        json.dumps({"command": "x", "not_before": text}).encode()
    )
    assert (request.not_before, request.delay_secs) == (expected, None)


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-30",
        "2026-11-30T10:20:30",  # no offset: which zone?
        "2026-11-30 10:20:30Z",
        "2026-02-30T10:20:30Z",
        "2026-11-30T24:00:00Z",
        "2026-11-30T10:20:60Z",
        "2026-11-30T10:20:30+25:00",
        "1969-12-31T23:59:59Z",
        "2026-11-30T10:20:30.Z",
        "\uff12\uff10\uff12\uff16-11-30T10:20:30Z",  # full-width digits are not digits here
        "",
        1_796_034_030,
        True,
        ["2026-11-30T10:20:30Z"],
    ],
)
def test_not_before_that_is_not_a_time_is_refused(value: Any) -> None:
    assert request_error({"command": "x", "not_before": value}) == NOT_BEFORE


@pytest.mark.parametrize("value", [-1, 1.5, "10", True, validation.MAX_DELAY_SECS + 1, {}])
def test_delay_secs_must_be_a_whole_number_of_seconds_in_range(value: Any) -> None:
    assert request_error({"command": "x", "delay_secs": value}) == DELAY


def test_not_before_and_delay_secs_together_are_refused_before_either_is_read() -> None:
    both = {"command": "x", "not_before": "2026-11-30T10:20:30Z", "delay_secs": 5}
    assert request_error(both) == errors.NOT_BEFORE_OR_DELAY
    assert request_error({**both, "not_before": "garbage"}) == errors.NOT_BEFORE_OR_DELAY
    assert errors.NOT_BEFORE_OR_DELAY == "use not_before or delay_secs, not both"


def test_the_delay_checks_come_after_the_other_fields_and_before_the_required_check() -> None:
    assert request_error({"port": "x", "delay_secs": -1}).startswith("port")
    assert request_error({"delay_secs": -1}) == DELAY
    assert request_error({"delay_secs": 0}) == errors.COMMAND_REQUIRED


def test_null_counts_as_absent() -> None:
    body = {"command": "x", "not_before": None, "delay_secs": 3}
    request = validation.parse_job_request(json.dumps(body).encode())
    assert (request.not_before, request.delay_secs) == (None, 3)


# --- the job table ------------------------------------------------------------------------------


def test_a_delayed_job_is_not_polled_before_its_time_and_is_at_it() -> None:
    table = JobTable()
    table.put(make(1, not_before=T0 + 10 * SECOND))
    assert table_poll(table, "node-a", 5, T0) == []
    assert table_poll(table, "node-a", 5, T0 + 10 * SECOND - 1) == []
    assert seqs(table_poll(table, "node-a", 5, T0 + 10 * SECOND)) == [1]


def test_a_due_job_takes_its_place_among_the_nodes_jobs_by_id() -> None:
    table = JobTable()
    table.put(make(1))
    table.put(make(2, not_before=T0 + 5 * SECOND))
    table.put(make(3))
    table.put(make(4, not_before=T0 + 1))  # already due when it was made
    assert seqs(table_poll(table, "node-a", 10, T0 + SECOND)) == [1, 3, 4]
    assert seqs(table_poll(table, "node-a", 10, T0 + 5 * SECOND)) == [1, 2, 3, 4]
    assert seqs(table_poll(table, "node-a", 2, T0 + 5 * SECOND)) == [1, 2]


def test_jobs_waiting_for_their_time_do_not_hold_back_due_ones() -> None:
    table = JobTable()
    for seq in range(1, 1001):
        table.put(make(seq, not_before=T0 + 3600 * SECOND))
    table.put(make(1001))
    assert seqs(table_poll(table, "node-a", 1, T0)) == [1001]


def test_listings_and_the_node_view_show_delayed_jobs_as_pending() -> None:
    table = JobTable()
    table.put(make(1, not_before=T0 + 60 * SECOND))
    table.put(make(2))
    table.put(make(3, "node-b", not_before=T0 + 60 * SECOND))
    found, more = table.query(None, jobs.PENDING, None, 0, 10)
    assert (seqs(found), more) == ([1, 2, 3], False)
    found, _ = table.query("node-a", jobs.PENDING, None, 1, 10)
    assert seqs(found) == [2]
    assert seqs(table.on_node("node-a").pending) == [1, 2]
    assert table.busy_nodes() == {"node-a", "node-b"}
    assert table.counts()[jobs.PENDING] == 3


def test_a_delayed_job_moved_to_another_node_still_waits_and_is_polled_there() -> None:
    table = JobTable()
    table.put(make(1, not_before=T0 + 10 * SECOND))
    table.put(make(1, "node-b", not_before=T0 + 10 * SECOND))
    assert table_poll(table, "node-b", 5, T0) == []
    assert table_poll(table, "node-a", 5, T0 + 20 * SECOND) == []
    assert seqs(table_poll(table, "node-b", 5, T0 + 20 * SECOND)) == [1]


def test_a_delayed_job_cancelled_or_claimed_before_its_time_is_never_polled() -> None:
    table = JobTable()
    table.put(make(1, not_before=T0 + 10 * SECOND))
    table.put(make(2, not_before=T0 + 10 * SECOND))
    table.put(jobs.cancel(make(1, not_before=T0 + 10 * SECOND), T0))
    table.put(jobs.start(make(2, not_before=T0 + 10 * SECOND), T0))
    assert table_poll(table, "node-a", 5, T0 + 20 * SECOND) == []
    assert table.counts()[jobs.PENDING] == 0


def test_a_retried_delayed_job_is_due_at_once_on_its_new_node() -> None:
    table = JobTable()
    job = make(1, not_before=T0 + 10 * SECOND)
    table.put(job)
    assert seqs(table_poll(table, "node-a", 1, T0 + 10 * SECOND)) == [1]
    running = jobs.start(job, T0 + 11 * SECOND)
    failed = jobs.finish(running, jobs.FAILED, 1, "", "", T0 + 12 * SECOND)
    table.put(jobs.retry(failed, "node-b"))
    assert seqs(table_poll(table, "node-b", 1, T0 + 12 * SECOND)) == [1]


def test_delayed_jobs_loaded_at_start_up_wait_too() -> None:
    table = JobTable([make(1, not_before=T0 + 10 * SECOND), make(2)], last_seq=2)
    assert seqs(table_poll(table, "node-a", 5, T0)) == [2]
    assert seqs(table_poll(table, "node-a", 5, T0 + 10 * SECOND)) == [1, 2]


# --- the service, on the harness ----------------------------------------------------------

US = 0.000_001  # one microsecond, in seconds


def test_a_delayed_job_is_invisible_to_the_poll_until_its_time_then_handed_out() -> None:
    h = Harness(["node-a"])
    early = h.submit("early")
    delayed = h.submit("later", delay_secs=2)
    assert delayed.not_before == delayed.created_at + 2 * SECOND
    assert list(delayed.to_wire())[-3:] == ["status", "retry_count", "created_at"]
    # Before its time only the other job is handed out, and the listing shows both.
    assert h.poll("node-a") == [early.job_id]
    h.claim(early.job_id)
    h.report(early.job_id)
    query = validation.JobQuery(node_id="node-a", status=jobs.PENDING, limit=10)
    assert [job.job_id for job in h.service.reads.list_jobs(query).jobs] == [delayed.job_id]
    # Exactly at its time, and with no scan in between: the poll alone decides.
    h.advance(2 - US)
    assert h.poll("node-a") == []
    h.advance(US)
    assert h.poll("node-a") == [delayed.job_id]
    assert h.claim(delayed.job_id).status == jobs.RUNNING


def test_not_before_in_the_past_is_due_at_once_and_kept_as_given() -> None:
    h = Harness(["node-a"])
    job = h.submit("x", not_before="2020-01-01T00:00:00.5+01:00")
    assert job.to_wire()["not_before"] == "2019-12-31T23:00:00.500000Z"
    assert h.poll("node-a") == [job.job_id]


# --- the live daemon ----------------------------------------------------------------------------


def test_both_fields_get_the_spec_400(api: Api) -> None:
    reply = api.post("/jobs", {"command": "x", "delay_secs": 1, "not_before": "2030-01-01T00:00Z"})
    assert (reply.status_code, reply.text) == (400, errors.NOT_BEFORE_OR_DELAY + "\n")


def test_sqs_messages_may_carry_a_delay(
    scheduler_factory: SchedulerFactory, node: str, tmp_path: Path
) -> None:
    sqs = FakeSqs().start()
    try:
        proc = scheduler_factory({"SQS_URL": sqs.url, "SQS_POLL_INTERVAL_SECS": "0.1"})
        api, agent = Api(proc.url), Agent(proc.url, node)
        sqs.send("jobs", json.dumps({"command": "from sqs", "delay_secs": 3600}))
        sqs.send("jobs", json.dumps({"command": "bad", "delay_secs": 1, "not_before": "x"}))
        created = wait_for(lambda: api.jobs(node_id=node), message="the SQS job")
        assert [job["command"] for job in created] == ["from sqs"]
        job = created[0]
        assert jobs.parse_time(job["not_before"]) == jobs.parse_time(job["created_at"]) + 3600e6
        wait_for(lambda: not sqs.messages("jobs"), message="both messages deleted")
        assert agent.poll() == []
        api.close()
        agent.close()
    finally:
        sqs.stop()
