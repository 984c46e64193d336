"""Workflows over HTTP on a real daemon (issue 25): what crosses the process boundary. Bad
input is refused with 400 and a text starting with the field's name, queue settings need the
key, a claim past a queue's limit is 409 naming the queue, an old client sees the wire it
always saw, and settings and dependencies survive a restart. The rules themselves are tested
on the in-memory harness (test_workflow_*.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import SchedulerFactory
from helpers import ALWAYS_PRESENT, Agent, Api, expect_error, expect_json

from tiny_scheduler.dev.daemon import SchedulerProcess

KEY = "workflow-test-key"
SCHEDULER_ENV = {"TINYAWS_API_KEY": KEY, "MAX_JOBS_PER_NODE": "4"}


@pytest.fixture
def api(scheduler: SchedulerProcess) -> Iterator[Api]:
    client = Api(scheduler.url, key=KEY)
    yield client
    client.close()


QUEUE_MESSAGE = "queue must be 1 to 64 characters of A-Za-z0-9._-, not . or .."


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"depends_on": "job-1"}, "depends_on must be a list of job ids such as job-7"),
        ({"depends_on": ["job-x"]}, "depends_on must be a list of job ids such as job-7"),
        ({"depends_on": ["job-999999"]}, "depends_on: job-999999 not found"),
        ({"dependency": "afterok"}, "dependency must be ok or any"),
        ({"priority": 101}, "priority must be an integer between 0 and 100"),
        ({"priority": "high"}, "priority must be an integer between 0 and 100"),
        ({"queue": "no spaces"}, QUEUE_MESSAGE),
        ({"queue": ""}, QUEUE_MESSAGE),
        # Dot segments: a URL-normalising client could never address PUT /queues/.. again.
        ({"queue": "."}, QUEUE_MESSAGE),
        ({"queue": ".."}, QUEUE_MESSAGE),
    ],
)
def test_bad_workflow_fields_are_400_naming_the_field(
    api: Api, node: str, fields: dict[str, object], message: str
) -> None:
    expect_error(api.post("/jobs", {"command": "true", **fields}), 400, message)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max_running": 0}, "max_running must be an integer of at least 1, or null"),
        ({"max_running": -2}, "max_running must be an integer of at least 1, or null"),
        ({"max_running": "4"}, "max_running must be an integer of at least 1, or null"),
        ({"max_running": 1.5}, "max_running must be an integer of at least 1, or null"),
        ({"paused": "yes"}, "paused must be true or false"),
        ([], "failed to decode queue settings"),
    ],
)
def test_bad_queue_settings_are_400(api: Api, body: object, message: str) -> None:
    expect_error(api.request("PUT", "/queues/x", json=body), 400, message)


def test_queue_settings_need_the_key(scheduler: SchedulerProcess) -> None:
    anonymous = Api(scheduler.url)
    try:
        expect_error(
            anonymous.request("PUT", "/queues/x", json={"paused": True}), 401, "unauthorized"
        )
        expect_error(anonymous.get("/queues"), 401, "unauthorized")
    finally:
        anonymous.close()


def test_a_claim_past_the_limit_is_409_naming_the_queue_and_the_job_stays_pending(
    api: Api, agent: Agent
) -> None:
    queue = f"limited-{agent.node_id}"
    view = expect_json(api.request("PUT", f"/queues/{queue}", json={"max_running": 1}), 200)
    assert view == {"queue": queue, "pending": 0, "running": 0, "max_running": 1, "paused": False}
    first = api.submit(queue=queue)
    second = api.submit(queue=queue)
    assert [job.job_id for job in agent.poll()] == [first["job_id"]]
    assert agent.claim(first["job_id"]).status_code == 200
    expect_error(
        agent.claim(second["job_id"]),
        409,
        f"job {second['job_id']} cannot start: queue {queue} at its limit (1 running)",
    )
    waiting = api.job(second["job_id"])
    assert (waiting["status"], waiting["waiting_for"]) == (
        "pending",
        f"queue {queue} at its limit (1 running)",
    )
    listed = {view["queue"]: view for view in expect_json(api.get("/queues"), 200)}
    assert listed[queue] == {
        "queue": queue,
        "pending": 1,
        "running": 1,
        "max_running": 1,
        "paused": False,
    }
    assert [job["job_id"] for job in api.jobs(queue=queue)] == [first["job_id"], second["job_id"]]
    assert agent.report(first["job_id"], 0).status_code == 200
    assert [job.job_id for job in agent.poll()] == [second["job_id"]]


def test_an_old_client_sees_exactly_the_wire_it_saw(api: Api, agent: Agent) -> None:
    old = set(ALWAYS_PRESENT)
    created = api.submit(command="echo hi")
    assert set(created) == old
    polled = agent.api.get("/jobs", params={"node_id": agent.node_id, "status": "pending"})
    assert [set(job) for job in expect_json(polled, 200)] == [old]
    # While it waits the job page and listings also say why: the one key added for a pending
    # job (never in the agent's poll).
    assert set(api.job(created["job_id"])) == old | {"waiting_for"}
    assert set(api.jobs(node_id=agent.node_id)[0]) == old | {"waiting_for"}
    claimed = expect_json(agent.claim(created["job_id"]), 200)
    assert set(claimed) == old | {"running_at"}
    assert set(api.job(created["job_id"])) == old | {"running_at"}
    done = expect_json(agent.report(created["job_id"], 0, stdout="hi\n"), 200)
    assert set(done) == old | {"running_at", "exit_code", "stdout", "finished_at"}


def test_settings_and_dependencies_survive_a_restart(
    scheduler_factory: SchedulerFactory, node: str
) -> None:
    env = {"TINYAWS_API_KEY": KEY}
    first = scheduler_factory(env)
    api = Api(first.url, key=KEY)
    try:
        before = api.submit(command="first")
        after = api.submit(command="then", depends_on=[before["job_id"]], priority=80)
        expect_json(api.request("PUT", "/queues/nightly", json={"paused": True}), 200)
    finally:
        api.close()
    assert first.stop() == 0
    api = Api(scheduler_factory(env).url, key=KEY)
    agent = Agent(api.base_url, node)
    try:
        assert [(v["queue"], v["paused"]) for v in expect_json(api.get("/queues"), 200)] == [
            ("default", False),
            ("nightly", True),
        ]
        waiting = api.job(after["job_id"])
        assert waiting["depends_on"] == [before["job_id"]] and waiting["priority"] == 80
        assert waiting["waiting_for"] == f"dependencies: {before['job_id']}"
        assert [job.job_id for job in agent.poll()] == [before["job_id"]]
    finally:
        agent.close()
        api.close()


def test_metrics_count_pending_and_running_jobs_per_queue(api: Api, agent: Agent) -> None:
    queue = f"metered-{agent.node_id}"
    running = api.submit(queue=queue)
    api.submit(queue=queue)
    assert agent.claim(running["job_id"]).status_code == 200
    text = api.get("/metrics").text
    assert f'tiny_scheduler_queue_jobs{{queue="{queue}",status="pending"}} 1.0\n' in text
    assert f'tiny_scheduler_queue_jobs{{queue="{queue}",status="running"}} 1.0\n' in text
