"""Authentication with TINYAWS_API_KEY set: which calls need the bearer, which are exempt for
the agent (and how AUTH_AGENT_EXEMPT=0 closes them), and that the key reaches the registry.

The exemption is only where it is needed (issue 33: with auth on, anyone who reached the port
read pending jobs' env_vars through the keyless poll, claimed jobs so that they failed as
node_lost, and ended attempts with forged output): on by default only with a registry, and
there only for the nodes it lists; a keyless PATCH is refused for an attempt claimed with the
key, also after a restart; with REGISTRY_URL=builtin it is off unless asked for."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest
from conftest import SchedulerFactory
from helpers import (
    Agent,
    Api,
    compact,
    expect_error,
    expect_json,
    set_nodes,
    unique_node,
    without_waiting_for,
)

from tiny_scheduler.agent.protocol import RUNNING_UPDATE, report_update
from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry

KEY = "s3cret-key"
# The module's registry wants the key too: a submission succeeds only if the scheduler
# passes it on.
REGISTRY_KEY = KEY
SCHEDULER_ENV = {"TINYAWS_API_KEY": KEY}

NOT_EXEMPT = [
    ("POST", "/jobs", {}),
    ("GET", "/jobs", {}),
    ("GET", "/jobs", {"status": "pending"}),
    ("GET", "/jobs", {"node_id": "node-a"}),
    ("GET", "/jobs", {"node_id": "node-a", "status": "running"}),
    ("GET", "/jobs/job-1", {}),
    ("POST", "/jobs/job-1/cancel", {}),
    ("GET", "/schedule", {}),
]
WRONG_HEADERS = [
    None,
    f"Bearer {KEY}x",
    f"Bearer {KEY[:-1]}",
    f"Bearer {KEY[:-1]}{chr(ord(KEY[-1]) + 1)}",  # the same length, only the last one differs
    "Bearer ",
    KEY,
    f"bearer{KEY}",
    f"Basic {KEY}",
    f"Bearer  {KEY}",
]


@pytest.fixture
def authed(scheduler: SchedulerProcess) -> Iterator[Api]:
    client = Api(scheduler.url, key=KEY)
    yield client
    client.close()


def send(api: Api, method: str, path: str, params: dict[str, str], header: str | None) -> Any:
    headers = {"Authorization": header} if header is not None else {}
    # The answer of the route itself: `/` redirects to the dashboard, which asks for the key.
    return api.request(
        method,
        path,
        params=params,
        data=b'{"command":"x"}',
        headers=headers,
        allow_redirects=False,
    )


@pytest.mark.parametrize("header", WRONG_HEADERS)
@pytest.mark.parametrize(("method", "path", "params"), NOT_EXEMPT)
def test_calls_without_the_right_key_are_unauthorized(
    api: Api, method: str, path: str, params: dict[str, str], header: str | None
) -> None:
    expect_error(send(api, method, path, params, header), 401, "unauthorized")


def test_with_the_key_every_call_works(authed: Api, node: str) -> None:
    job = authed.submit(command="echo authorized")
    assert job["node_id"] == node  # the registry (which wants the key too) was reached
    assert without_waiting_for(authed.job(job["job_id"])) == job
    assert [listed["job_id"] for listed in authed.jobs(node_id=node)] == [job["job_id"]]
    assert expect_json(authed.get("/schedule"), 200) == {"node_id": node}
    assert expect_json(authed.post(f"/jobs/{job['job_id']}/cancel"), 200)["reason"] == "cancelled"


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_the_scheme_name_is_case_insensitive(api: Api, node: str, scheme: str) -> None:
    headers = {"Authorization": f"{scheme} {KEY}"}
    job = expect_json(api.post("/jobs", {"command": "x"}, headers=headers), 201)
    read = expect_json(api.get(f"/jobs/{job['job_id']}", headers=headers), 200)
    assert without_waiting_for(read) == job
    # Only the scheme's case is free: the key itself is compared exactly.
    wrong = {"Authorization": f"{scheme} {KEY.upper()}"}
    expect_error(api.get(f"/jobs/{job['job_id']}", headers=wrong), 401, "unauthorized")


def test_health_and_the_agents_calls_are_exempt(
    api: Api, authed: Api, scheduler: SchedulerProcess, node: str
) -> None:
    assert expect_json(api.get("/health"), 200)["status"] == "healthy"
    job = authed.submit()
    agent = Agent(scheduler.url, node)  # sends no Authorization header, like the real one
    try:
        assert [polled.job_id for polled in agent.poll()] == [job["job_id"]]
        assert expect_json(agent.claim(job["job_id"]), 200)["status"] == "running"
        assert expect_json(agent.report(job["job_id"], 0), 200)["status"] == "done"
    finally:
        agent.close()


def test_health_says_the_agent_exemption_is_on(api: Api) -> None:
    assert expect_json(api.get("/health"), 200)["agent_exempt"] is True


def test_the_keyless_poll_answers_only_for_a_node_the_registry_lists(
    api: Api, authed: Api, registry: FakeRegistry, node: str
) -> None:
    authed.submit(command="echo secret", env_vars={"DB_PASSWORD": "hunter2"})
    unlisted = {"node_id": "node-nobody-runs", "status": "pending"}
    expect_error(api.get("/jobs", params=unlisted), 401, "unauthorized")
    assert expect_json(authed.get("/jobs", params=unlisted), 200) == []
    # A node the registry lists from now on is known at once, before any other fetch.
    fresh = unique_node("fresh")
    set_nodes(registry, [node, fresh])
    assert expect_json(api.get("/jobs", params={"node_id": fresh, "status": "pending"}), 200) == []
    assert len(expect_json(api.get("/jobs", params={"node_id": node, "status": "pending"}), 200))


def test_a_keyless_patch_is_refused_for_an_attempt_claimed_with_the_key(
    api: Api, authed: Api, node: str
) -> None:
    job_id = authed.submit(command="echo ours")["job_id"]
    assert expect_json(authed.patch(f"/jobs/{job_id}", compact(RUNNING_UPDATE)), 200)
    forged = report_update(0, "forged output", "")
    expect_error(api.patch(f"/jobs/{job_id}", forged), 401, "unauthorized")
    expect_error(api.patch(f"/jobs/{job_id}", report_update(1, "", "x")), 401, "unauthorized")
    assert authed.job(job_id)["status"] == "running"
    done = expect_json(authed.patch(f"/jobs/{job_id}", report_update(0, "real", "")), 200)
    assert (done["status"], done["stdout"]) == ("done", "real")
    # A job the tiny-aws agent claimed without the key takes its keyless report, as before.
    other = authed.submit(command="echo theirs")["job_id"]
    assert expect_json(api.patch(f"/jobs/{other}", compact(RUNNING_UPDATE)), 200)
    theirs = expect_json(api.patch(f"/jobs/{other}", report_update(0, "ok", "")), 200)
    assert theirs["stdout"] == "ok"


def test_a_keyed_claim_takes_no_keyless_report_after_a_restart_either(
    scheduler_factory: SchedulerFactory, node: str
) -> None:
    env = {"TINYAWS_API_KEY": KEY, "REGISTRY_CACHE_SECS": "0"}
    first = scheduler_factory(env)
    authed = Api(first.url, key=KEY)
    job_id = authed.submit()["job_id"]
    assert expect_json(authed.patch(f"/jobs/{job_id}", compact(RUNNING_UPDATE)), 200)
    authed.close()
    first.stop()
    again = scheduler_factory(env)
    anonymous, authed = Api(again.url), Api(again.url, key=KEY)
    try:
        expect_error(anonymous.patch(f"/jobs/{job_id}", report_update(0)), 401, "unauthorized")
        assert expect_json(authed.patch(f"/jobs/{job_id}", report_update(0)), 200)
    finally:
        anonymous.close()
        authed.close()


def test_with_the_builtin_registry_the_exemption_is_off_unless_asked_for(
    scheduler_factory: SchedulerFactory,
) -> None:
    """This project's agents always send the key: keyless polls, claims and reports are all
    refused, so nobody can read env_vars, claim or end work without it."""
    proc = scheduler_factory({"TINYAWS_API_KEY": KEY, "REGISTRY_URL": "builtin"})
    anonymous, authed = Api(proc.url), Api(proc.url, key=KEY)
    try:
        beat = {"cpu_count": 1, "running": []}
        expect_json(authed.request("PUT", "/nodes/n1", data=compact(beat)), 200)
        job_id = authed.submit(env_vars={"DB_PASSWORD": "hunter2"})["job_id"]
        poll = {"node_id": "n1", "status": "pending"}
        expect_error(anonymous.get("/jobs", params=poll), 401, "unauthorized")
        claim = compact(RUNNING_UPDATE)
        expect_error(anonymous.patch(f"/jobs/{job_id}", claim), 401, "unauthorized")
        assert "agent_exempt" not in expect_json(anonymous.get("/health"), 200)
        assert expect_json(authed.patch(f"/jobs/{job_id}", claim), 200)["status"] == "running"
        expect_error(anonymous.patch(f"/jobs/{job_id}", report_update(0)), 401, "unauthorized")
    finally:
        anonymous.close()
        authed.close()
    proc.stop()
    opened = scheduler_factory(
        {"TINYAWS_API_KEY": KEY, "REGISTRY_URL": "builtin", "AUTH_AGENT_EXEMPT": "1"}
    )
    anonymous = Api(opened.url)
    try:
        assert expect_json(anonymous.get("/health"), 200)["agent_exempt"] is True
    finally:
        anonymous.close()


def test_the_registry_gets_the_schedulers_key(authed: Api, registry: FakeRegistry) -> None:
    registry.key = "a-different-key"
    try:
        expect_error(authed.post("/jobs", {"command": "x"}), 503, "failed to reach registry")
        expect_error(authed.get("/schedule"), 503, "failed to reach registry")
    finally:
        registry.key = KEY
    assert authed.submit()["status"] == "pending"


def test_auth_agent_exempt_off_closes_the_agents_calls(
    scheduler_factory: SchedulerFactory, node: str
) -> None:
    closed = scheduler_factory({"TINYAWS_API_KEY": KEY, "AUTH_AGENT_EXEMPT": "0"})
    anonymous, authed = Api(closed.url), Api(closed.url, key=KEY)
    try:
        job_id = authed.submit()["job_id"]
        poll = {"node_id": node, "status": "pending"}
        expect_error(anonymous.get("/jobs", params=poll), 401, "unauthorized")
        expect_error(anonymous.patch(f"/jobs/{job_id}", {"status": "running"}), 401, "unauthorized")
        assert expect_json(anonymous.get("/health"), 200)["status"] == "healthy"
        # Agents that send the key get in.
        assert [job["job_id"] for job in expect_json(authed.get("/jobs", params=poll), 200)] == [
            job_id
        ]
        assert expect_json(authed.patch(f"/jobs/{job_id}", {"status": "running"}), 200)
    finally:
        anonymous.close()
        authed.close()


def documented_operations() -> list[tuple[str, str, list[dict[str, Any]]]]:
    """Every operation of the OpenAPI document (which test_openapi keeps equal to the routes),
    with its security requirements; a path parameter becomes job-1."""
    document = json.loads(resources.files("tiny_scheduler").joinpath("openapi.json").read_text())
    found = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in ("get", "post", "patch", "put", "delete"):
                security = operation.get("security", document["security"])
                concrete = path.replace("{job_id}", "job-1").replace("{filename}", "ui.css")
                found.append((method.upper(), concrete, security))
    return found


@pytest.mark.parametrize("header", [None, f"Bearer {KEY[:-1]}{chr(ord(KEY[-1]) + 1)}"])
def test_every_route_not_documented_as_open_needs_the_key(api: Api, header: str | None) -> None:
    """Derived from the document, so that a new route cannot be forgotten here: a route whose
    security does not allow "no key" refuses a request without it; one that does answers."""
    for method, path, security in documented_operations():
        reply = send(api, method, path, {}, header)
        if {} in security or not security:
            assert reply.status_code != 401, (method, path)
        else:
            expect_error(reply, 401, "unauthorized")
