"""A registry that is down, hung, failing or talking nonsense: the scheduler answers a clear
503 within its timeouts, never hangs, and an agent's final report is never lost to it."""

from __future__ import annotations

import pytest
from conftest import SchedulerFactory, log_tail
from helpers import Agent, Api, expect_error, expect_json, set_nodes, wait_for

from tiny_scheduler.dev.registry import FakeRegistry

REACH = "failed to reach registry"
DECODE = "failed to decode registry response"


def expect_placement_failures(api: Api, registry: FakeRegistry, message: str) -> None:
    """Submitting (plain and pinned) and /schedule all answer 503 `message`."""
    registry.set_instance("i-f", "node-a")
    expect_error(api.post("/jobs", {"command": "x"}), 503, message)
    expect_error(api.post("/jobs", {"command": "x", "instance_id": "i-f"}), 503, message)
    expect_error(api.get("/schedule"), 503, message)


@pytest.mark.parametrize(("fault", "message"), [("error", REACH), ("garbage", DECODE)])
def test_a_failing_registry_gives_a_clear_503(
    api: Api, registry: FakeRegistry, fault: str, message: str
) -> None:
    before = len(api.jobs(limit=10000))
    registry.fault = fault
    expect_placement_failures(api, registry, message)
    assert len(api.jobs(limit=10000)) == before  # nothing was created
    registry.fault = None
    assert api.submit()["status"] == "pending"  # and it recovers at once


def test_a_hung_registry_gives_503_instead_of_hanging(api: Api, registry: FakeRegistry) -> None:
    registry.fault = "hang"
    try:
        # The Api's 10 s request timeout is the bound: the scheduler gives up on the registry
        # long before and says so.
        expect_error(api.post("/jobs", {"command": "x"}), 503, REACH)
    finally:
        registry.fault = None
        registry.release()
    assert api.submit()["status"] == "pending"


def test_a_slow_but_answering_registry_is_waited_for(api: Api, registry: FakeRegistry) -> None:
    registry.fault, registry.slow_secs = "slow", 0.3
    assert api.submit()["status"] == "pending"


def test_a_final_report_with_retries_left_is_kept_when_the_registry_fails(
    api: Api, registry: FakeRegistry
) -> None:
    job = api.submit(command="flaky")
    agent = Agent(api.base_url, job["node_id"])
    try:
        assert agent.claim(job["job_id"]).status_code == 200
        registry.fault = "error"
        retried = expect_json(agent.report(job["job_id"], 1, stderr="boom"), 200)
    finally:
        agent.close()
    assert (retried["status"], retried["node_id"], retried["retry_count"]) == (
        "pending",
        job["node_id"],
        1,
    )
    assert api.job(job["job_id"])["attempts"][0]["stderr"] == "boom"


def test_a_registry_that_is_down(
    scheduler_factory: SchedulerFactory, node: str, unused_port: int
) -> None:
    # Jobs are made with a registry up; then the scheduler starts again on the same database
    # with a registry address where nothing listens (stopping the stand-in would not do: it
    # keeps serving connections that are already open).
    first = scheduler_factory()
    api = Api(first.url)
    job = api.submit(command="flaky")
    done = api.submit(command="fine")
    agent = Agent(first.url, node)
    assert agent.claim(job["job_id"]).status_code == 200
    assert agent.claim(done["job_id"]).status_code == 200
    api.close()
    agent.close()
    first.stop()

    down = scheduler_factory(registry_url=f"http://127.0.0.1:{unused_port}")
    api = Api(down.url)
    agent = Agent(down.url, node)
    try:
        expect_error(api.post("/jobs", {"command": "x"}), 503, REACH)
        expect_error(api.post("/jobs", {"command": "x", "instance_id": "i-f"}), 503, REACH)
        expect_error(api.get("/schedule"), 503, REACH)
        assert expect_json(agent.report(done["job_id"], 0), 200)["status"] == "done"
        # The agent never repeats its final report: with retries left the job goes back to
        # pending on its node rather than the report failing.
        retried = expect_json(agent.report(job["job_id"], 1, stderr="boom"), 200)
        assert (retried["status"], retried["node_id"], retried["retry_count"]) == (
            "pending",
            node,
            1,
        )
        assert api.job(job["job_id"])["attempts"][0]["stderr"] == "boom"
        assert [polled.job_id for polled in agent.poll()] == [job["job_id"]]
        assert expect_json(api.get("/health"), 200)["status"] == "healthy"
    finally:
        api.close()
        agent.close()


def test_node_ids_cannot_forge_log_lines_and_empty_ones_are_ignored(
    scheduler_factory: SchedulerFactory, registry: FakeRegistry
) -> None:
    """A node id is the registry's word: a newline in it is escaped in the log, and a node
    with an empty id (no agent could poll for it) gets no jobs."""
    forged = "node-x\n[2030-01-01 00:00:00 +0000] [1] [INFO] job job-999 done"
    set_nodes(registry, healthy=[forged, ""])
    proc = scheduler_factory()
    api = Api(proc.url)
    try:
        jobs = [api.submit() for _ in range(3)]
    finally:
        api.close()
    assert {job["node_id"] for job in jobs} == {forged}
    # Log lines are written a batch at a time: wait for the three jobs' lines.
    log = wait_for(lambda: (text := log_tail(proc, 100_000)).count("created on node") >= 3 and text)
    assert "job-999" not in "\n".join(line for line in log.splitlines() if "node-x" not in line)
    assert "node-x\\n[2030-01-01" in log


def test_credentials_in_peer_urls_stay_out_of_the_log(
    scheduler_factory: SchedulerFactory, node: str, unused_port: int
) -> None:
    """A daemon whose registry, SQS and SNS URLs carry a user and password, with none of
    them listening: its banner and each peer's "unreachable" warning show the URL with the
    password hidden, and the password is nowhere in its output."""
    first = scheduler_factory()  # a job to cancel, made while the registry answers
    api = Api(first.url)
    try:
        job_id = api.submit(command="true")["job_id"]
    finally:
        api.close()
    first.stop()

    nothing = f"127.0.0.1:{unused_port}"  # where nothing listens
    down = scheduler_factory(
        registry_url=f"http://registry-user:secret-r@{nothing}",
        env={
            "SQS_URL": f"http://sqs-user:secret-q@{nothing}",
            "SQS_POLL_INTERVAL_SECS": "0.5",
            "SNS_URL": f"http://sns-user:secret-n@{nothing}",
        },
    )
    api = Api(down.url)
    try:
        expect_error(api.post("/jobs", {"command": "x"}), 503, REACH)
        # A final state: its event goes to SNS, which cannot be reached either.
        assert expect_json(api.post(f"/jobs/{job_id}/cancel"), 200)["reason"] == "cancelled"
    finally:
        api.close()

    def warned(peer: str) -> bool:
        shown = f"[WARNING] {peer} "
        return any(
            shown in line and f"http://{peer}-user:***@{nothing}/" in line
            for line in log_tail(down, 1_000_000).splitlines()
        )

    for peer in ("registry", "sqs", "sns"):
        wait_for(lambda peer=peer: warned(peer), message=f"the {peer} warning")
    log = log_tail(down, 1_000_000)
    assert f"  registry       http://registry-user:***@{nothing}\n" in log
    assert "secret" not in log
