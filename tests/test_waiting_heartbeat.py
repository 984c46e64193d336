"""Heartbeats that wait for work (spec, "Waiting for work") on a real daemon under gunicorn:
the answer comes when a job is placed on the node, a stop order or a drain change arrives, or
the wait ends; it hands out what the poll would; bad `wait_secs` and `want` are refused by name;
the plain heartbeat's answer is as it was.

Every wait here may last a minute (NODE_HEARTBEAT_SECS=60): an answer that comes within the
test's deadline came because something woke it, not because its wait ran out."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from conftest import SchedulerFactory
from helpers import Api, expect_error, expect_json, wait_for
from prometheus_client.parser import text_string_to_metric_families

KEY = "wait-key"
WAIT = 60
WOKEN_WITHIN = 20.0
"""Seconds the test waits for a woken answer: a third of the wait it asked for."""


@pytest.fixture
def api(scheduler_factory: SchedulerFactory) -> Iterator[Api]:
    proc = scheduler_factory(
        {"REGISTRY_URL": "builtin", "TINYAWS_API_KEY": KEY, "NODE_HEARTBEAT_SECS": str(WAIT)}
    )
    api = Api(proc.url, key=KEY)
    yield api
    api.close()


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        yield pool


def beat(api: Api, node: str, **fields: Any) -> Any:
    body = {"cpu_count": 2, "running": [], "version": "1.0", **fields}
    return api.request("PUT", f"/nodes/{node}", data=orjson.dumps(body), timeout=WAIT + 10)


def waiting(
    pool: concurrent.futures.ThreadPoolExecutor, api: Api, node: str, **fields: Any
) -> concurrent.futures.Future:
    """A heartbeat that waits for work, sent from another thread once the node's last beat
    is known (so the answer is parked by the time the test acts, or woken at once)."""
    seen = expect_json(api.get(f"/nodes/{node}"), 200)["last_heartbeat_at"]
    fields = {"wait_secs": WAIT, "want": 2, **fields}
    answer = pool.submit(lambda: expect_json(beat(api, node, **fields), 200))
    wait_for(lambda: expect_json(api.get(f"/nodes/{node}"), 200)["last_heartbeat_at"] != seen)
    return answer


def test_a_job_submitted_to_an_idle_node_is_handed_in_its_waiting_heartbeat(
    api: Api, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    expect_json(beat(api, "n1"), 200)
    answer = waiting(pool, api, "n1")
    job = api.submit(command="echo hi")
    orders = answer.result(WOKEN_WITHIN)
    polled = expect_json(api.get("/jobs", params={"node_id": "n1", "status": "pending"}), 200)
    assert orders["jobs"] == polled  # exactly as the poll hands it out
    assert [handed["job_id"] for handed in orders["jobs"]] == [job["job_id"]]
    assert (orders["stop"], orders["drain"]) == ([], False)


def test_work_already_waiting_is_handed_at_once_capped_by_want(api: Api) -> None:
    expect_json(beat(api, "n1", cpu_count=4), 200)
    submitted = [api.submit(command=f"echo {i}")["job_id"] for i in range(3)]
    orders = expect_json(beat(api, "n1", cpu_count=4, wait_secs=WAIT, want=2), 200)
    assert [job["job_id"] for job in orders["jobs"]] == submitted[:2]
    orders = expect_json(beat(api, "n1", cpu_count=4, wait_secs=0, want=0), 200)
    assert orders["jobs"] == []


def test_a_stop_order_wakes_the_wait(api: Api, pool: concurrent.futures.ThreadPoolExecutor) -> None:
    expect_json(beat(api, "n1"), 200)
    job_id = api.submit(command="sleep 600")["job_id"]
    running = {"status": "running", "exit_code": None, "stdout": "", "stderr": ""}
    expect_json(api.patch(f"/jobs/{job_id}", running), 200)
    answer = waiting(pool, api, "n1", running=[job_id], want=1)
    expect_json(api.post(f"/jobs/{job_id}/cancel"), 200)
    assert answer.result(WOKEN_WITHIN)["stop"] == [job_id]


def test_a_drain_and_an_undrain_wake_the_wait(
    api: Api, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    expect_json(beat(api, "n1"), 200)
    answer = waiting(pool, api, "n1")
    expect_json(api.patch("/nodes/n1", {"drain": True}), 200)
    assert answer.result(WOKEN_WITHIN)["drain"] is True
    answer = waiting(pool, api, "n1")
    expect_json(api.patch("/nodes/n1", {"drain": False}), 200)
    orders = answer.result(WOKEN_WITHIN)
    assert (orders["drain"], orders["jobs"]) == (False, [])


def test_a_job_for_another_node_does_not_end_the_wait(
    api: Api, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    expect_json(beat(api, "n1"), 200)
    expect_json(beat(api, "n2"), 200)
    answer = waiting(pool, api, "n1")
    job = api.submit(command="true", node_ids=["n2"])
    assert job["node_id"] == "n2"
    # n2's own poll sees it while n1's heartbeat still waits (then ends it: a drain).
    polled = expect_json(api.get("/jobs", params={"node_id": "n2", "status": "pending"}), 200)
    assert [found["job_id"] for found in polled] == [job["job_id"]]
    assert not answer.done()
    expect_json(api.patch("/nodes/n1", {"drain": True}), 200)
    orders = answer.result(WOKEN_WITHIN)
    assert (orders["jobs"], orders["drain"]) == ([], True)


def test_the_plain_heartbeat_answers_as_before(api: Api) -> None:
    orders = expect_json(beat(api, "n1"), 200)
    assert "jobs" not in orders
    assert sorted(orders) == [
        "drain",
        "heartbeat_secs",
        "job_timeout_secs",
        "node_id",
        "node_lost_secs",
        "stop",
    ]


@pytest.mark.parametrize("wait_secs", [-1, WAIT + 1, "5", True, None])
def test_bad_wait_secs_are_refused_by_name(api: Api, wait_secs: object) -> None:
    body = {"cpu_count": 2, "running": [], "wait_secs": wait_secs}
    if wait_secs is None:
        assert api.request("PUT", "/nodes/n1", data=orjson.dumps(body)).status_code == 200
        return
    expect_error(
        api.request("PUT", "/nodes/n1", data=orjson.dumps(body)),
        400,
        f"wait_secs must be a number of seconds from 0 to {WAIT} (heartbeat_secs)",
    )


@pytest.mark.parametrize("want", [-1, 1025, 1.5, "2", False])
def test_bad_want_is_refused_by_name(api: Api, want: object) -> None:
    body = {"cpu_count": 2, "running": [], "wait_secs": 0, "want": want}
    expect_error(
        api.request("PUT", "/nodes/n1", data=orjson.dumps(body)),
        400,
        "want must be an integer between 0 and 1024",
    )


def test_a_wait_that_nothing_ends_answers_its_orders_and_no_jobs(api: Api) -> None:
    expect_json(beat(api, "n1"), 200)
    first = expect_json(beat(api, "n1", wait_secs=0.3, want=2), 200)
    again = expect_json(beat(api, "n1", wait_secs=0.3, want=2), 200)
    assert (
        first
        == again
        == {
            "node_id": "n1",
            "heartbeat_secs": WAIT,
            "drain": False,
            "stop": [],
            "node_lost_secs": 60,
            "job_timeout_secs": 3600,
            "jobs": [],
        }
    )
    # The connection serves the next request as usual (the answer was framed whole).
    assert expect_json(api.get("/nodes/n1"), 200)["node_id"] == "n1"


STANDBY_WAIT = 12
"""The period through a standby: beyond its forward's usual 10 s to the leader's first byte
(`forward.HEAD_SECS`), which a heartbeat's forward adds the period to."""


def test_a_waiting_heartbeat_through_a_standby_is_woken_by_the_leaders_job(
    ha: Any, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    env = {"REGISTRY_URL": "builtin", "NODE_HEARTBEAT_SECS": str(STANDBY_WAIT)}
    first, second = ha.start(env=env), ha.start(env=env)
    leader = ha.wait_leader()
    standby = Api((second if leader is first else first).url)
    try:
        wait_for(lambda: beat(standby, "n1").status_code == 200, message="a forwarded heartbeat")
        seen = expect_json(standby.get("/nodes/n1"), 200)["last_heartbeat_at"]
        answer = pool.submit(
            lambda: expect_json(beat(standby, "n1", wait_secs=STANDBY_WAIT, want=1), 200)
        )
        wait_for(lambda: expect_json(standby.get("/nodes/n1"), 200)["last_heartbeat_at"] != seen)
        direct = Api(leader.url)
        job = direct.submit(command="echo via the standby")
        direct.close()
        orders = answer.result(STANDBY_WAIT - 1)  # woken, not run out
        assert [handed["job_id"] for handed in orders["jobs"]] == [job["job_id"]]
        # A wait that nothing ends comes back through the standby as well, however long.
        quiet = expect_json(beat(standby, "n1", wait_secs=STANDBY_WAIT, want=0), 200)
        assert quiet["jobs"] == []
    finally:
        standby.close()


def test_a_full_nodes_wait_woken_by_its_jobs_end_hands_the_next_job_at_once(
    api: Api, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    # Both slots busy, a third job waiting: the agent waits with `want: 0`. The end of one
    # of its jobs frees a slot, and the answer it wakes hands the third job out: the agent
    # need not ask again for the slot (one heartbeat less on every job's path).
    expect_json(beat(api, "n1"), 200)
    first, second, third = (api.submit(command="true")["job_id"] for _ in range(3))
    running = {"status": "running", "exit_code": None, "stdout": "", "stderr": ""}
    for job_id in (first, second):
        expect_json(api.patch(f"/jobs/{job_id}", running), 200)
    answer = waiting(pool, api, "n1", running=[first, second], want=0)
    done = {"status": "done", "exit_code": 0, "stdout": "", "stderr": ""}
    expect_json(api.patch(f"/jobs/{first}", done), 200)
    orders = answer.result(WOKEN_WITHIN)
    assert [job["job_id"] for job in orders["jobs"]] == [third]


def test_a_stop_order_for_a_job_its_own_report_ended_does_not_end_the_wait(
    api: Api, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    # The agent lists a job whose report the scheduler has taken but whose answer has not
    # reached the agent yet: its stop order is no news (nothing is left to stop), so the
    # wait goes on, and only the drain below answers it, the order going with it. Answered
    # at once, the answer would say `drain: false`.
    expect_json(beat(api, "n1"), 200)
    job_id = api.submit(command="true")["job_id"]
    running = {"status": "running", "exit_code": None, "stdout": "", "stderr": ""}
    expect_json(api.patch(f"/jobs/{job_id}", running), 200)
    done = {"status": "done", "exit_code": 0, "stdout": "", "stderr": ""}
    expect_json(api.patch(f"/jobs/{job_id}", done), 200)
    answer = waiting(pool, api, "n1", running=[job_id], want=1)
    expect_json(api.patch("/nodes/n1", {"drain": True}), 200)
    orders = answer.result(WOKEN_WITHIN)
    assert (orders["drain"], orders["stop"]) == (True, [job_id])


def heartbeats_timed(api: Api) -> float:
    """The daemon's count of timed heartbeat requests (`/metrics`)."""
    page = api.get("/metrics")
    assert page.status_code == 200
    return sum(
        sample.value
        for family in text_string_to_metric_families(page.text)
        for sample in family.samples
        if sample.name == "tiny_scheduler_http_request_duration_seconds_count"
        and sample.labels.get("endpoint") == "nodes.heartbeat"
    )


def test_a_woken_wait_is_one_request_in_the_metrics(
    api: Api, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    expect_json(beat(api, "n1"), 200)
    before = heartbeats_timed(api)
    answer = waiting(pool, api, "n1")
    api.submit(command="echo hi")
    assert len(answer.result(WOKEN_WITHIN)["jobs"]) == 1
    assert heartbeats_timed(api) == before + 1  # parked, then run again once woken: one request


def test_a_wait_ends_when_a_delayed_job_of_its_node_comes_due(
    api: Api, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    expect_json(beat(api, "n1"), 200)
    job = api.submit(command="echo later", delay_secs=3)
    answer = waiting(pool, api, "n1")
    # Answered at the job's not_before, not after the 60 s wait (with nothing yet, unless a
    # busy machine sent the wait after that time already)...
    handed = answer.result(WOKEN_WITHIN)["jobs"]
    if not handed:  # ...and then the renewal hands the job out at once.
        handed = expect_json(beat(api, "n1", wait_secs=WAIT, want=2), 200)["jobs"]
    assert [one["job_id"] for one in handed] == [job["job_id"]]
