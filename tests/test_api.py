"""The HTTP contract under real gunicorn: every endpoint, reply shape and error string of the
spec. One scheduler serves the whole module; each test works on a node of its own."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import pytest
from conftest import SchedulerFactory
from helpers import (
    ALWAYS_PRESENT,
    Agent,
    Api,
    assert_no_nulls,
    expect_error,
    expect_json,
    in_wire_order,
    set_nodes,
    unique_node,
    without_waiting_for,
)

from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry

MAX_REQUEST_BYTES = 65536
SCHEDULER_ENV = {"MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES)}

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
JOB_ID = re.compile(r"^job-[1-9]\d*$")
LINK = re.compile(r'^<(/jobs\?[^>]+)>; rel="next"$')


def claim(api: Api, job_id: str) -> dict[str, Any]:
    return expect_json(api.patch(f"/jobs/{job_id}", {"status": "running"}), 200)


def finish(api: Api, job_id: str, status: str, exit_code: int = 0, **output: str) -> dict:
    body = {"status": status, "exit_code": exit_code, **output}
    return expect_json(api.patch(f"/jobs/{job_id}", body), 200)


def ids(jobs: list[dict[str, Any]]) -> list[str]:
    return [job["job_id"] for job in jobs]


# --- health and schedule --------------------------------------------------------------------


def test_health(api: Api) -> None:
    response = api.get("/health")
    body = expect_json(response, 200)
    assert response.content.startswith(b'{"service":"scheduler","status":"healthy"')
    assert (body["service"], body["status"]) == ("scheduler", "healthy")


def test_schedule_names_the_node_the_next_submission_gets_and_moves_nothing(
    api: Api, registry: FakeRegistry
) -> None:
    first, second = unique_node(), unique_node()
    set_nodes(registry, [second, first], unhealthy=[unique_node()])
    placed = []
    for _ in range(4):
        looks = [expect_json(api.get("/schedule"), 200) for _ in range(3)]
        assert all(list(body) == ["node_id"] for body in looks)
        assert len({body["node_id"] for body in looks}) == 1, "a GET has no side effects"
        placed.append(api.submit()["node_id"])
        assert placed[-1] == looks[0]["node_id"], "GET /schedule then POST /jobs: same node"
    assert sorted(placed) == sorted([first, second] * 2)


def test_schedule_without_healthy_nodes(api: Api, registry: FakeRegistry) -> None:
    set_nodes(registry, [], unhealthy=["node-a"])
    expect_error(api.get("/schedule"), 503, "no healthy compute nodes")


# --- POST /jobs -----------------------------------------------------------------------------


def test_submit_creates_a_pending_job(api: Api, node: str) -> None:
    response = api.post("/jobs", {"command": "echo hi"})
    job = expect_json(response, 201)
    assert list(job) == list(ALWAYS_PRESENT)
    assert JOB_ID.match(job["job_id"])
    assert TIME.match(job["created_at"])
    assert job == {
        "job_id": job["job_id"],
        "node_id": node,
        "command": "echo hi",
        "job_type": "run",
        "status": "pending",
        "retry_count": 0,
        "created_at": job["created_at"],
    }
    assert without_waiting_for(api.job(job["job_id"])) == job


def test_submit_with_every_field(api: Api, registry: FakeRegistry, node: str) -> None:
    registry.set_instance("i-api", node)
    request = {
        "command": "./serve --port 8080",
        "deploy_url": "http://objects/app.zip",
        "instance_id": "i-api",
        "job_type": "service",
        "port": 8080,
        "env_vars": {"GREETING": "grüß dich", "N": "1"},
        "timeout_secs": 30,
        "unknown_field": [1, 2, 3],
    }
    job = api.submit(**request)
    # Each field submitted, and no unknown one, with the ones every job has, in wire order.
    assert list(job) == in_wire_order([*ALWAYS_PRESENT, *request.keys() - {"unknown_field"}])
    del request["unknown_field"]
    assert {key: job[key] for key in request} == request
    assert job["node_id"] == node
    assert without_waiting_for(api.job(job["job_id"])) == job


def test_submit_reads_json_whatever_the_content_type(api: Api, node: str) -> None:
    # curl -d sends application/x-www-form-urlencoded; the original decoded the body anyway.
    for content_type in ("application/x-www-form-urlencoded", "text/plain", None):
        headers = {"Content-Type": content_type} if content_type else {}
        response = api.post("/jobs", b'{"command":"curl -d"}', headers=headers)
        assert expect_json(response, 201)["command"] == "curl -d"


def test_job_ids_count_up(api: Api, node: str) -> None:
    numbers = [int(api.submit()["job_id"][4:]) for _ in range(3)]
    assert numbers == [numbers[0], numbers[0] + 1, numbers[0] + 2]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "failed to decode job"),
        (b"echo hi", "failed to decode job"),
        (b'["echo hi"]', "failed to decode job"),
        (b"null", "failed to decode job"),
        (b'{"command": "x"', "failed to decode job"),
        (b'{"command":"\xff"}', "failed to decode job"),
        (b'{"command":1}', "command must be a string"),
        (b'{"command":"x","job_type":"batch"}', "job_type must be run or service"),
        (b'{"command":"x","port":"80"}', "port must be an integer between 1 and 65535"),
        (b'{"command":"x","port":80.5}', "port must be an integer between 1 and 65535"),
        (b'{"command":"x","port":true}', "port must be an integer between 1 and 65535"),
        (b'{"command":"x","port":70000}', "port must be an integer between 1 and 65535"),
        (b'{"command":"x","env_vars":{"A":1}}', "env_vars must map strings to strings"),
        (b'{"command":"x","env_vars":["A=1"]}', "env_vars must map strings to strings"),
        (b"{}", "command or deploy_url is required"),
        (b'{"command":"","deploy_url":""}', "command or deploy_url is required"),
        (b'{"port":"x"}', "port must be an integer between 1 and 65535"),
    ],
)
def test_submit_errors(api: Api, node: str, body: bytes, message: str) -> None:
    expect_error(api.post("/jobs", body), 400, message)
    assert api.jobs(node_id=node) == []


def test_submit_other_field_errors_name_the_field(api: Api, node: str) -> None:
    for field, value in (("timeout_secs", "5"), ("deploy_url", 5), ("instance_id", [])):
        response = api.post("/jobs", {"command": "x", field: value})
        assert response.status_code == 400
        assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
        assert response.text.startswith(f"{field} ") and response.text.endswith("\n")


def test_a_body_over_max_request_bytes_is_413(api: Api, node: str) -> None:
    # gunicorn answers "Connection: keep-alive" but closes the connection when more than
    # 64 KiB of the refused body are left unread, so these requests must not be reused.
    once = {"Connection": "close"}
    too_big = json.dumps({"command": "x" * MAX_REQUEST_BYTES}).encode()
    expect_error(api.post("/jobs", too_big, headers=once), 413, "request body too large")
    # The size check comes first: it holds for a body that is not even JSON.
    not_json = b"?" * (MAX_REQUEST_BYTES + 1)
    expect_error(api.post("/jobs", not_json, headers=once), 413, "request body too large")
    assert api.jobs(node_id=node) == []
    just_fits = json.dumps({"command": "x" * (MAX_REQUEST_BYTES - 100)}).encode()
    assert expect_json(api.post("/jobs", just_fits), 201)["node_id"] == node


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("no nodes", "no healthy compute nodes"),
        ("unknown instance", "instance not found"),
        ("stopped instance", "instance i-api not running (status=terminated)"),
        ("sick node", "node {node} for instance i-api is not healthy"),
    ],
)
def test_submit_placement_errors(
    api: Api, registry: FakeRegistry, node: str, setup: str, message: str
) -> None:
    body: dict[str, Any] = {"command": "x"}
    if setup == "no nodes":
        set_nodes(registry, [], unhealthy=[node])
    else:
        body["instance_id"] = "i-api"
    if setup == "stopped instance":
        registry.set_instance("i-api", node, status="terminated")
    if setup == "sick node":
        registry.set_instance("i-api", node)
        registry.set_node(node, status="unhealthy")
    expect_error(api.post("/jobs", body), 503, message.format(node=node))
    assert api.jobs(node_id=node) == []


def test_idempotency_key_returns_the_first_job(api: Api, node: str) -> None:
    key = {"Idempotency-Key": f"key-{node}"}
    first = expect_json(api.post("/jobs", {"command": "once"}, headers=key), 201)
    again = api.post("/jobs", {"command": "once"}, headers=key)
    assert expect_json(again, 200) == first
    # Even a different body: the key names the request, the first one wins.
    other = api.post("/jobs", {"command": "something else"}, headers=key)
    assert expect_json(other, 200) == first
    fresh = api.post("/jobs", {"command": "once"}, headers={"Idempotency-Key": f"new-{node}"})
    assert expect_json(fresh, 201)["job_id"] != first["job_id"]
    assert len(api.jobs(node_id=node)) == 2


def test_idempotency_key_still_finds_the_job_after_it_changed(api: Api, node: str) -> None:
    key = {"Idempotency-Key": f"key-{node}"}
    job = expect_json(api.post("/jobs", {"command": "x"}, headers=key), 201)
    claim(api, job["job_id"])
    again = expect_json(api.post("/jobs", {"command": "x"}, headers=key), 200)
    assert (again["job_id"], again["status"]) == (job["job_id"], "running")


# --- GET /jobs ------------------------------------------------------------------------------


def test_listing_is_oldest_first(api: Api, node: str) -> None:
    submitted = [api.submit(command=f"echo {n}")["job_id"] for n in range(6)]
    assert ids(api.jobs(node_id=node)) == submitted
    everything = ids(api.jobs(limit=10000))
    assert [job_id for job_id in everything if job_id in submitted] == submitted
    assert everything == sorted(everything, key=lambda job_id: int(job_id[4:]))


def test_an_empty_listing_is_an_empty_array(api: Api) -> None:
    response = api.get("/jobs", params={"node_id": unique_node()})
    assert expect_json(response, 200) == []
    assert response.content == b"[]"


def test_link_header_pages_through_every_job(api: Api, node: str) -> None:
    submitted = [api.submit(command=f"page {n}")["job_id"] for n in range(7)]
    pages: list[list[str]] = []
    response = api.get("/jobs", params={"node_id": node, "limit": 3})
    while True:
        pages.append(ids(expect_json(response, 200)))
        link = response.headers.get("Link")
        if link is None:
            break
        match = LINK.match(link)
        assert match, link
        response = api.get(match.group(1))
    assert pages == [submitted[0:3], submitted[3:6], submitted[6:7]]
    whole = api.get("/jobs", params={"node_id": node, "limit": 7})
    assert "Link" not in whole.headers
    assert ids(expect_json(whole, 200)) == submitted


def test_after_lists_the_jobs_created_after_a_job(api: Api, node: str) -> None:
    submitted = [api.submit()["job_id"] for _ in range(4)]
    assert ids(api.jobs(node_id=node, after=submitted[1])) == submitted[2:]
    assert api.jobs(node_id=node, after=submitted[3]) == []


def test_filters(api: Api, node: str) -> None:
    pending = api.submit(command="wait")
    service = api.submit(command="serve", job_type="service", port=80)
    done = api.submit(command="ok")
    failed = api.submit(command="bad")
    cancelled = api.submit(command="never")
    claim(api, done["job_id"])
    finish(api, done["job_id"], "done", 0)
    for _ in range(2):  # the first failure is retried (MAX_JOB_RETRIES=1), the second is final
        claim(api, failed["job_id"])
        finish(api, failed["job_id"], "failed", 1)
    expect_json(api.post(f"/jobs/{cancelled['job_id']}/cancel"), 200)
    claim(api, service["job_id"])

    def listed(**params: str) -> list[str]:
        return ids(api.jobs(node_id=node, **params))

    assert listed() == ids([pending, service, done, failed, cancelled])
    assert listed(status="pending") == ids([pending])
    assert listed(status="running") == ids([service])
    assert listed(status="done") == ids([done])
    assert listed(status="failed") == ids([failed, cancelled])
    assert listed(status="failed", reason="cancelled") == ids([cancelled])
    assert listed(reason="cancelled") == ids([cancelled])
    assert listed(reason="exit") == ids([failed])
    assert listed(status="pending", reason="exit") == []
    assert listed(reason="timeout") == listed(reason="bogus") == []
    assert listed(status="cancelled") == []  # not a status any more
    assert listed(job_type="service") == ids([service])
    assert listed(job_type="run") == ids([pending, done, failed, cancelled])
    assert listed(job_type="run", status="done") == ids([done])
    assert listed(status="bogus") == []
    assert ids(api.jobs(status="running", job_type="service", node_id=node)) == ids([service])


@pytest.mark.parametrize("limit", ["0", "10001", "-1", "ten", "1.5"])
def test_listing_limit_errors(api: Api, limit: str) -> None:
    expect_error(
        api.get("/jobs", params={"limit": limit}),
        400,
        "limit must be an integer between 1 and 10000",
    )


@pytest.mark.parametrize("after", ["7", "job-0", "job-x", "x"])
def test_listing_after_errors(api: Api, after: str) -> None:
    expect_error(
        api.get("/jobs", params={"after": after}), 400, "after must be a job id such as job-7"
    )


# --- the agent poll -------------------------------------------------------------------------


def test_poll_holds_no_more_jobs_than_free_slots(api: Api, agent: Agent) -> None:
    service = api.submit(command="serve", job_type="service", port=9000)
    first = api.submit(command="one")
    second = api.submit(command="two")
    assert [job.job_id for job in agent.poll()] == [service["job_id"]]  # one slot, FIFO
    assert agent.claim(service["job_id"]).status_code == 200
    # A running service takes no slot.
    assert [job.job_id for job in agent.poll()] == [first["job_id"]]
    assert agent.claim(first["job_id"]).status_code == 200
    assert agent.poll() == []
    # The capped answer has no Link header: the agent reads only the first element anyway.
    response = agent.api.get("/jobs", params={"node_id": agent.node_id, "status": "pending"})
    assert (response.content, response.headers.get("Link")) == (b"[]", None)
    assert agent.report(first["job_id"], 0).status_code == 200
    assert [job.job_id for job in agent.poll()] == [second["job_id"]]


def test_the_poll_query_with_after_is_an_ordinary_listing(api: Api, agent: Agent) -> None:
    """Only the agent's exact query is the poll; with `after` it lists, uncapped (spec)."""
    submitted = [api.submit()["job_id"] for _ in range(3)]
    response = agent.api.get(
        "/jobs", params={"node_id": agent.node_id, "status": "pending", "after": submitted[0]}
    )
    assert ids(expect_json(response, 200)) == submitted[1:]


def test_poll_reply_carries_what_the_agent_reads(
    api: Api, registry: FakeRegistry, agent: Agent
) -> None:
    registry.set_instance("i-poll", agent.node_id)
    api.submit(
        command="",
        deploy_url="http://objects/app.zip",
        instance_id="i-poll",
        job_type="service",
        port=8080,
        env_vars={"A": "1"},
    )
    response = agent.api.get("/jobs", params={"node_id": agent.node_id, "status": "pending"})
    assert_no_nulls(response.json())
    (polled,) = agent.poll()
    assert (polled.command, polled.deploy_url, polled.instance_id) == (
        "",
        "http://objects/app.zip",
        "i-poll",
    )
    assert (polled.job_type, polled.port, polled.env_vars) == ("service", 8080, {"A": "1"})


# --- GET /jobs/{id} -------------------------------------------------------------------------


@pytest.mark.parametrize("job_id", ["job-999999999", "job-0", "job-01", "nope", "job-1x"])
def test_get_unknown_job(api: Api, job_id: str) -> None:
    expect_error(api.get(f"/jobs/{job_id}"), 404, "job not found")


# --- PATCH /jobs/{id} -----------------------------------------------------------------------


def test_patch_running_then_done(api: Api, node: str) -> None:
    job = api.submit(command="echo ok")
    running = claim(api, job["job_id"])
    assert running["status"] == "running"
    assert TIME.match(running["running_at"])
    assert running["running_at"] >= running["created_at"]
    done = finish(api, job["job_id"], "done", 0, stdout="ok\n", stderr="")
    assert done["exit_code"] == 0
    assert (done["stdout"], done["status"]) == ("ok\n", "done")
    assert "stderr" not in done
    assert done["finished_at"] >= done["running_at"]
    assert api.job(job["job_id"]) == done
    assert b'"status":"done"' in api.get(f"/jobs/{job['job_id']}").content


def test_patch_reads_json_whatever_the_content_type(api: Api, node: str) -> None:
    job = api.submit()
    response = api.patch(
        f"/jobs/{job['job_id']}",
        b'{"status":"running","exit_code":null,"stdout":"","stderr":""}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert expect_json(response, 200)["status"] == "running"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "failed to decode update"),
        (b"running", "failed to decode update"),
        (b'["running"]', "failed to decode update"),
        (b'{"status":"done","exit_code":"0"}', "failed to decode update"),
        (b'{"status":"done","exit_code":0,"stdout":1}', "failed to decode update"),
        (b'{"status":7}', "failed to decode update"),
        (b"{}", "invalid status"),
        (b'{"status":"pending"}', "invalid status"),
        (b'{"status":"cancelled"}', "invalid status"),
        (b'{"status":"finished","exit_code":0}', "invalid status"),
    ],
)
def test_patch_errors_come_before_the_job_lookup(api: Api, body: bytes, message: str) -> None:
    # Checked in the spec's order: the body first, so an unknown id still gets the 400.
    expect_error(api.patch("/jobs/job-999999999", body), 400, message)


def test_patch_unknown_job(api: Api) -> None:
    expect_error(api.patch("/jobs/job-999999999", {"status": "running"}), 404, "job not found")
    expect_error(api.patch("/jobs/nope", {"status": "done", "exit_code": 0}), 404, "job not found")


def expect_conflict(response: Any, current: str) -> None:
    assert response.status_code == 409, response.text
    assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert response.text.endswith("\n")
    assert re.search(rf"\b{current}\b", response.text), response.text


def test_patch_forbidden_transitions_name_the_current_status(api: Api, node: str) -> None:
    job_id = api.submit()["job_id"]
    for wanted in ("done", "failed"):
        expect_conflict(api.patch(f"/jobs/{job_id}", {"status": wanted, "exit_code": 0}), "pending")
    claim(api, job_id)
    expect_conflict(api.patch(f"/jobs/{job_id}", {"status": "running"}), "running")
    finish(api, job_id, "done", 0)
    for wanted in ("running", "done", "failed"):
        expect_conflict(api.patch(f"/jobs/{job_id}", {"status": wanted, "exit_code": 1}), "done")
    assert api.job(job_id)["status"] == "done"

    cancelled = api.submit()["job_id"]
    expect_json(api.post(f"/jobs/{cancelled}/cancel"), 200)
    for wanted in ("running", "done", "failed"):
        # Only a timed-out attempt may end late (200); a cancelled job never ran at all.
        reply = api.patch(f"/jobs/{cancelled}", {"status": wanted, "exit_code": 0})
        expect_conflict(reply, "failed")

    final = api.submit()["job_id"]
    for _ in range(2):
        claim(api, final)
        finish(api, final, "failed", 3)
    expect_conflict(api.patch(f"/jobs/{final}", {"status": "running"}), "failed")


def test_a_job_is_claimed_once(api: Api, node: str) -> None:
    job_id = api.submit()["job_id"]
    claim(api, job_id)
    expect_conflict(api.patch(f"/jobs/{job_id}", {"status": "running"}), "running")


def test_empty_output_in_a_final_report_means_no_change(api: Api, node: str) -> None:
    job_id = api.submit()["job_id"]
    claim(api, job_id)
    done = finish(api, job_id, "done", 0, stdout="", stderr="")
    assert "stdout" not in done and "stderr" not in done
    assert done["exit_code"] == 0


# --- POST /jobs/{id}/cancel -----------------------------------------------------------------


def test_a_retry_goes_to_another_node_even_when_the_rotation_points_back(
    scheduler_factory: SchedulerFactory, registry: FakeRegistry
) -> None:
    """Two nodes: the first two jobs take one each, so the rotation's next turn is the node
    the first job fails on. The retry must still go to the other node."""
    nodes = sorted([unique_node(), unique_node()])
    set_nodes(registry, nodes)
    api = Api(scheduler_factory().url)
    try:
        first, second = api.submit(), api.submit()
        assert [first["node_id"], second["node_id"]] == nodes
        agent = Agent(api.base_url, nodes[0])
        assert agent.claim(first["job_id"]).status_code == 200
        retried = expect_json(agent.report(first["job_id"], exit_code=1), 200)
        agent.close()
        assert retried["status"] == "pending"
        assert retried["node_id"] == nodes[1]
    finally:
        api.close()


def test_cancel(api: Api, agent: Agent) -> None:
    job = api.submit()
    cancelled = expect_json(api.post(f"/jobs/{job['job_id']}/cancel"), 200)
    # The form every existing client understands: failed, and why.
    assert {**cancelled, "finished_at": "set"} == {
        **job,
        "status": "failed",
        "reason": "cancelled",
        "exit_code": -1,
        "stderr": "job cancelled",
        "finished_at": "set",
    }
    assert list(cancelled) == in_wire_order(cancelled)
    assert TIME.match(cancelled["finished_at"])
    assert api.job(job["job_id"]) == cancelled
    assert agent.poll() == []
    expect_conflict(api.post(f"/jobs/{job['job_id']}/cancel"), "failed")

    # A running job is cancelled too (its agent is told to stop it): at once, in the same form.
    running = api.submit()["job_id"]
    claim(api, running)
    stopped = expect_json(api.post(f"/jobs/{running}/cancel"), 200)
    assert (stopped["status"], stopped["reason"], stopped["exit_code"]) == (
        "failed",
        "cancelled",
        -1,
    )
    expect_conflict(api.post(f"/jobs/{running}/cancel"), "failed")
    expect_error(api.post("/jobs/job-999999999/cancel"), 404, "job not found")


TINYAWS_WAIT_SECS = 2.0
"""The tiny-aws CLI's `job status --wait` and the lambda runtime look at a job every 2 s."""


def test_the_tiny_aws_wait_loop_returns_on_a_cancelled_job(
    scheduler: SchedulerProcess, api: Api, node: str
) -> None:
    """The requests `tinyaws job status ID --wait` makes: `GET /jobs/{id}` every 2 s until
    the status is `done` or `failed`, the only ends it knows. A job cancelled while a client
    waits must end that loop (a `cancelled` status kept it printing forever)."""
    job_id = api.submit()["job_id"]
    seen: list[str] = []
    first_look = threading.Event()
    ended = threading.Event()

    def tinyaws_wait() -> None:
        client = Api(scheduler.url)
        try:
            for _ in range(5):  # the real client has no limit; five looks are plenty here
                status = expect_json(client.get(f"/jobs/{job_id}"), 200)["status"]
                seen.append(status)
                first_look.set()
                if status in ("done", "failed"):
                    ended.set()
                    return
                time.sleep(TINYAWS_WAIT_SECS)  # the client's own interval, as it waits
        finally:
            client.close()

    waiter = threading.Thread(target=tinyaws_wait, daemon=True)
    waiter.start()
    assert first_look.wait(10), "the waiting client never got an answer"
    expect_json(api.post(f"/jobs/{job_id}/cancel"), 200)
    waiter.join(5 * TINYAWS_WAIT_SECS + 10)
    assert ended.is_set(), f"the wait loop never ended; it saw {seen}"
    assert seen[0] == "pending" and seen[-1] == "failed"
    assert api.job(job_id)["reason"] == "cancelled"


# --- HTTP odds and ends ---------------------------------------------------------------------


def test_unknown_routes_and_methods_answer_in_plain_text(api: Api) -> None:
    missing = api.get("/nowhere")
    assert missing.status_code == 404
    assert missing.headers["Content-Type"] == "text/plain; charset=utf-8"
    wrong = api.request("DELETE", "/jobs")
    assert wrong.status_code == 405
    assert wrong.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert "POST" in wrong.headers["Allow"]
