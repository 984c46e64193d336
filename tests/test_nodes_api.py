"""The /nodes resource on a real daemon that is its own node registry (REGISTRY_URL=builtin):
heartbeats and their orders, the listing, drains, auth, and each bad input's answer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import SchedulerFactory
from helpers import Api, expect_error, expect_json

KEY = "node-key"


@pytest.fixture
def nodes_api(scheduler_factory: SchedulerFactory) -> Iterator[Api]:
    proc = scheduler_factory(
        {"REGISTRY_URL": "builtin", "TINYAWS_API_KEY": KEY, "NODE_HEARTBEAT_SECS": "5"}
    )
    api = Api(proc.url, key=KEY)
    yield api
    api.close()


def beat(api: Api, node: str, **fields: object) -> dict:
    body = {"cpu_count": 2, "running": [], "version": "1.0", **fields}
    return expect_json(api.request("PUT", f"/nodes/{node}", data=_json(body)), 200)


def _json(body: object) -> bytes:
    import orjson

    return orjson.dumps(body)


def test_a_heartbeat_makes_a_node_that_jobs_go_to(nodes_api: Api) -> None:
    orders = beat(nodes_api, "n1", labels={"zone": "a"})
    assert orders == {
        "node_id": "n1",
        "heartbeat_secs": 5,
        "drain": False,
        "stop": [],
        "node_lost_secs": 60,
        "job_timeout_secs": 3600,
    }
    job = nodes_api.submit(command="echo hi")
    assert job["node_id"] == "n1"
    listed = expect_json(nodes_api.get("/nodes"), 200)
    assert [node["node_id"] for node in listed] == ["n1"]
    (node,) = listed
    assert node["health"] == "healthy" and node["source"] == "heartbeat"
    assert node["cpu_count"] == 2 and node["labels"] == {"zone": "a"}
    assert node["version"] == "1.0" and node["pending"] == 1 and node["drain"] is False
    assert expect_json(nodes_api.get("/nodes/n1"), 200) == node


def test_a_cancelled_running_job_is_in_its_nodes_stop_orders(nodes_api: Api) -> None:
    beat(nodes_api, "n1")
    job_id = nodes_api.submit(command="sleep 600")["job_id"]
    running = {"status": "running", "exit_code": None, "stdout": "", "stderr": ""}
    expect_json(nodes_api.patch(f"/jobs/{job_id}", running), 200)
    cancelled = expect_json(nodes_api.post(f"/jobs/{job_id}/cancel"), 200)
    assert (cancelled["status"], cancelled["reason"]) == ("failed", "cancelled")
    assert beat(nodes_api, "n1", running=[job_id])["stop"] == [job_id]
    late = {"status": "failed", "exit_code": 143, "stdout": "", "stderr": "terminated"}
    assert expect_json(nodes_api.patch(f"/jobs/{job_id}", late), 200)["reason"] == "cancelled"
    assert beat(nodes_api, "n1")["stop"] == []


def test_drain_and_undrain(nodes_api: Api) -> None:
    beat(nodes_api, "n1")
    beat(nodes_api, "n2")
    waiting = [nodes_api.submit(command=f"echo {i}") for i in range(4)]
    on_n1 = [job["job_id"] for job in waiting if job["node_id"] == "n1"]
    assert on_n1
    drained = expect_json(nodes_api.patch("/nodes/n1", {"drain": True}), 200)
    assert drained["drain"] is True and drained["pending"] == 0
    assert {nodes_api.job(job_id)["node_id"] for job_id in on_n1} == {"n2"}
    assert {nodes_api.submit()["node_id"] for _ in range(3)} == {"n2"}
    assert beat(nodes_api, "n1")["drain"] is True
    assert expect_json(nodes_api.patch("/nodes/n1", {"drain": False}), 200)["drain"] is False


def test_nodes_and_drains_survive_a_restart(scheduler_factory: SchedulerFactory) -> None:
    env = {"REGISTRY_URL": "builtin", "NODE_HEARTBEAT_SECS": "5"}
    first = scheduler_factory(env)
    api = Api(first.url)
    beat(api, "n1", labels={"zone": "a"})
    beat(api, "n2")
    expect_json(api.patch("/nodes/n1", {"drain": True}), 200)
    api.close()
    first.stop()
    again = Api(scheduler_factory(env).url)
    try:
        # Seen at start-up: healthy until their heartbeats are missed again.
        listed = expect_json(again.get("/nodes"), 200)
        assert [(n["node_id"], n["health"], n["drain"]) for n in listed] == [
            ("n1", "healthy", True),
            ("n2", "healthy", False),
        ]
        assert listed[0]["labels"] == {"zone": "a"}
        assert again.submit()["node_id"] == "n2"
    finally:
        again.close()


def test_bad_heartbeats_and_changes_are_refused_by_name(nodes_api: Api) -> None:
    put = lambda body: nodes_api.request("PUT", "/nodes/n1", data=body)  # noqa: E731
    expect_error(put(b"not json"), 400, "failed to decode heartbeat")
    cpu_message = "cpu_count must be an integer between 1 and 1024"
    expect_error(put(_json({"running": []})), 400, cpu_message)
    expect_error(put(_json({"cpu_count": "2", "running": []})), 400, cpu_message)
    # The figures: that many slots, a node id nobody could type, a 1 MB label.
    expect_error(put(_json({"cpu_count": 100_000, "running": []})), 400, cpu_message)
    long_id = nodes_api.request("PUT", "/nodes/" + "n" * 4000, data=_json({"cpu_count": 1}))
    expect_error(long_id, 400, "node id must be 1 to 253 characters of A-Za-z0-9._-")
    big_label = _json({"cpu_count": 2, "running": [], "labels": {"zone": "x" * 1_000_000}})
    response = put(big_label)
    assert response.status_code == 400 and "at most 63 characters" in response.text
    expect_error(
        put(_json({"cpu_count": 2, "running": [], "gpus": 65})),
        400,
        "gpus must be an integer between 0 and 64",
    )
    response = put(_json({"cpu_count": 2, "running": "job-1"}))
    assert response.status_code == 400 and response.text.startswith("running must be")
    response = put(_json({"cpu_count": 2, "running": ["job-x"]}))
    assert response.status_code == 400 and response.text.startswith("running must")
    response = put(_json({"cpu_count": 2, "running": [], "labels": {"a": 1}}))
    assert response.status_code == 400 and response.text.startswith("labels must")
    expect_error(nodes_api.patch("/nodes/nosuch", {"drain": True}), 404, "node not found")
    expect_error(nodes_api.get("/nodes/nosuch"), 404, "node not found")
    beat(nodes_api, "n1")
    expect_error(nodes_api.patch("/nodes/n1", {"drain": "yes"}), 400, "drain must be true or false")


def test_nodes_need_the_key(nodes_api: Api) -> None:
    anonymous = Api(nodes_api.base_url)
    try:
        expect_error(anonymous.get("/nodes"), 401, "unauthorized")
        body = _json({"cpu_count": 1, "running": []})
        expect_error(anonymous.request("PUT", "/nodes/n1", data=body), 401, "unauthorized")
    finally:
        anonymous.close()
