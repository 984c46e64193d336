"""The OpenAPI description (tiny_scheduler/openapi.json, served at GET /openapi.json) is true.

- Every route the app serves is documented, with its methods, and nothing else is.
- The exact error messages of `errors` (and of placement) are the ones the document gives for
  the statuses that carry them, and every message the document promises is one the code has.
- schemathesis generates requests from the document, valid and invalid, sends them to a live
  scheduler under gunicorn, and checks every answer against the document: a documented status,
  a documented content type (text/plain for errors), a body and headers that match the schema.
- What generated requests do not reach is walked on purpose: a job through every state (with
  its attempts after a retry), a cancel, a schedule's life; each answer is held against the
  served document, and every documented success of the API must be met on the way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import requests
import schemathesis
from helpers import Agent, Api, compact, expect_error, expect_json, unique_node
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    ignored_auth,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)
from schemathesis.generation.modes import GenerationMode

from tiny_scheduler import Settings, create_app, errors, stop_background
from tiny_scheduler.api import events, output
from tiny_scheduler.cluster import node_requests
from tiny_scheduler.cluster.registry import DECODE_FAILED, INSTANCE_NOT_FOUND, REACH_FAILED
from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.domain import audit, roles, tokens, users
from tiny_scheduler.domain.placement import NO_HEALTHY_NODES
from tiny_scheduler.domain.validation import (
    ARRAY_ID_MESSAGE,
    MAX_PAGE,
    MAX_RUNNING_MESSAGE,
    MAX_TIMEOUT_SECS,
    PAUSED_MESSAGE,
    QUEUE_MESSAGE,
)
from tiny_scheduler.server.waiting import TOO_MANY_WAITERS
from tiny_scheduler.service.output_ops import ATTEMPT_NOT_FOUND

DOCUMENT: dict[str, Any] = json.loads(
    resources.files("tiny_scheduler").joinpath("openapi.json").read_text()
)
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
FLASK_IMPLIED = {"HEAD", "OPTIONS"}  # Flask adds these to every route by itself


def resolve(node: Any) -> Any:
    """Follow a local $ref."""
    while isinstance(node, dict) and "$ref" in node:
        target: Any = DOCUMENT
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def documented_operations() -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in DOCUMENT["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    folder = tmp_path_factory.mktemp("openapi")
    flask_app = create_app(Settings(db_path=str(folder / "scheduler.db"), api_key="sekrit"))
    yield flask_app
    stop_background(flask_app)


def test_every_route_is_documented_and_nothing_else(app: Any) -> None:
    served = set()
    for rule in app.url_map.iter_rules():
        path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule)
        served |= {(method, path) for method in rule.methods - FLASK_IMPLIED}
    documented = documented_operations()
    assert served - documented == set(), "served but not documented"
    assert documented - served == set(), "documented but not served"


def test_path_parameters_are_declared(app: Any) -> None:
    for path, item in DOCUMENT["paths"].items():
        names = set(re.findall(r"{([a-z_]+)}", path))
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            params = [
                resolve(p) for p in item.get("parameters", []) + operation.get("parameters", [])
            ]
            declared = {p["name"] for p in params if p["in"] == "path"}
            assert declared == names, (method, path)


def error_alternatives(response: Any) -> list[dict[str, Any]]:
    """The string schemas of a text/plain error response: enums and patterns."""
    schema = resolve(response)["content"]["text/plain"]["schema"]
    return schema.get("anyOf", [schema])


def messages_of(status: str, method: str, path: str) -> tuple[set[str], list[str]]:
    """The exact messages and the patterns the document gives for one answer."""
    response = DOCUMENT["paths"][path][method]["responses"][status]
    exact: set[str] = set()
    patterns: list[str] = []
    for alternative in error_alternatives(response):
        exact |= set(alternative.get("enum", ()))
        if "pattern" in alternative:
            patterns.append(alternative["pattern"])
    return exact, patterns


def documents(message: str, status: str, method: str, path: str) -> bool:
    exact, patterns = messages_of(status, method, path)
    text = message + "\n"
    return text in exact or any(re.fullmatch(p.removesuffix("$"), text) for p in patterns)


PLACEMENT_TEXTS = [REACH_FAILED, DECODE_FAILED, NO_HEALTHY_NODES, INSTANCE_NOT_FOUND]

NODE, OUTPUT = "/nodes/{node_id}", "/jobs/{job_id}/output"
RELEASE, RETRY = "/jobs/{job_id}/release", "/jobs/{job_id}/retry"

# Each message of `errors`, and of the other modules that refuse requests, with the answers
# (status, method, path) that carry it.
WHERE = {
    errors.DECODE_JOB: [("400", "post", "/jobs")],
    errors.COMMAND_REQUIRED: [
        ("400", "post", "/jobs"),
        ("400", "post", "/schedules"),
        ("400", "patch", "/schedules/{schedule_id}"),
    ],
    errors.NOT_BEFORE_OR_DELAY: [
        ("400", "post", "/jobs"),
        ("400", "post", "/schedules"),
        ("400", "patch", "/schedules/{schedule_id}"),
    ],
    errors.DECODE_SCHEDULE: [
        ("400", "post", "/schedules"),
        ("400", "patch", "/schedules/{schedule_id}"),
    ],
    errors.SCHEDULE_NOT_FOUND: [
        ("404", "get", "/schedules/{schedule_id}"),
        ("404", "patch", "/schedules/{schedule_id}"),
        ("404", "delete", "/schedules/{schedule_id}"),
    ],
    errors.DECODE_QUEUE: [("400", "put", "/queues/{name}")],
    MAX_RUNNING_MESSAGE: [("400", "put", "/queues/{name}"), ("400", "put", "/users/{name}")],
    errors.DECODE_USER: [("400", "put", "/users/{name}")],
    users.NAME_MESSAGE: [("400", "put", "/users/{name}"), ("400", "post", "/tokens")],
    PAUSED_MESSAGE: [("400", "put", "/queues/{name}")],
    QUEUE_MESSAGE: [("400", "put", "/queues/{name}")],
    node_requests.DECODE_HEARTBEAT: [("400", "put", NODE)],
    node_requests.CPU_COUNT_MESSAGE: [("400", "put", NODE)],
    node_requests.MEMORY_MB_MESSAGE: [("400", "put", NODE)],
    node_requests.GPUS_MESSAGE: [("400", "put", NODE)],
    node_requests.ENFORCEMENT_MESSAGE: [("400", "put", NODE)],
    node_requests.NODE_ID_MESSAGE: [("400", "put", NODE)],
    node_requests.RUNNING_MESSAGE: [("400", "put", NODE)],
    node_requests.VERSION_MESSAGE: [("400", "put", NODE)],
    node_requests.LABELS_MESSAGE: [("400", "put", NODE)],
    node_requests.FENCE_MESSAGE: [("400", "put", NODE)],
    node_requests.AGENT_ID_MESSAGE: [("400", "put", NODE)],
    node_requests.REFUSING_MESSAGE: [("400", "put", NODE)],
    node_requests.ATTEMPTS_MESSAGE: [("400", "put", NODE)],
    node_requests.WANT_MESSAGE: [("400", "put", NODE)],
    node_requests.DECODE_NODE_CHANGE: [("400", "patch", NODE)],
    node_requests.DRAIN_MESSAGE: [("400", "patch", NODE)],
    node_requests.NODE_NOT_FOUND: [("404", "get", NODE), ("404", "patch", NODE)],
    output.DECODE_OUTPUT: [("400", "post", OUTPUT)],
    output.STRINGS_MESSAGE: [("400", "post", OUTPUT)],
    output.STREAM_MESSAGE: [("400", "get", OUTPUT)],
    output.OFFSET_MESSAGE: [("400", "get", OUTPUT)],
    output.WAIT_MESSAGE: [("400", "get", OUTPUT)],
    output.ATTEMPT_MESSAGE: [("400", "get", OUTPUT)],
    ATTEMPT_NOT_FOUND: [("404", "get", OUTPUT)],
    events.LAST_EVENT_ID_MESSAGE: [("400", "get", "/events")],
    TOO_MANY_WAITERS: [("503", "get", OUTPUT), ("503", "get", "/events")],
    tokens.DECODE_TOKEN: [("400", "post", "/tokens")],
    tokens.NODE_ID_MESSAGE: [("400", "post", "/tokens")],
    tokens.NODE_MESSAGE: [("400", "post", "/tokens")],
    tokens.EXPIRES_MESSAGE: [("400", "post", "/tokens")],
    roles.ROLE_MESSAGE: [("400", "post", "/tokens")],
    tokens.AUTH_OFF: [("409", "post", "/tokens")],
    tokens.TOKEN_NOT_FOUND: [("404", "delete", "/tokens/{token_id}")],
    audit.SINCE_MESSAGE: [("400", "get", "/audit")],
    audit.AFTER_MESSAGE: [("400", "get", "/audit")],
    audit.LIMIT_MESSAGE: [("400", "get", "/audit")],
    errors.DECODE_UPDATE: [("400", "patch", "/jobs/{job_id}")],
    errors.INVALID_STATUS: [("400", "patch", "/jobs/{job_id}")],
    errors.NOT_PENDING: [("409", "post", "/jobs/{job_id}/hold"), ("409", "post", RELEASE)],
    errors.NOT_FINISHED: [("409", "post", RETRY)],
    errors.JOB_NOT_FOUND: [
        ("404", "get", "/jobs/{job_id}"),
        ("404", "patch", "/jobs/{job_id}"),
        ("404", "post", "/jobs/{job_id}/cancel"),
        ("404", "post", "/jobs/{job_id}/hold"),
        ("404", "post", RELEASE),
        ("404", "post", RETRY),
        ("404", "post", OUTPUT),
        ("404", "get", OUTPUT),
    ],
    errors.UNAUTHORIZED: [
        ("401", "get", "/jobs"),
        ("401", "post", "/jobs"),
        ("401", "get", "/jobs/{job_id}"),
        ("401", "patch", "/jobs/{job_id}"),
        ("401", "post", "/jobs/{job_id}/cancel"),
        ("401", "post", "/jobs/{job_id}/hold"),
        ("401", "post", RELEASE),
        ("401", "post", RETRY),
        ("401", "get", "/schedule"),
        ("401", "post", "/schedules"),
        ("401", "get", "/schedules"),
        ("401", "get", "/schedules/{schedule_id}"),
        ("401", "patch", "/schedules/{schedule_id}"),
        ("401", "delete", "/schedules/{schedule_id}"),
        ("401", "get", "/ui/"),
        ("401", "get", "/cluster"),
        ("401", "get", "/queues"),
        ("401", "put", "/queues/{name}"),
        ("401", "get", "/users"),
        ("401", "put", "/users/{name}"),
        ("401", "get", "/nodes"),
        ("401", "get", NODE),
        ("401", "put", NODE),
        ("401", "patch", NODE),
        ("401", "post", OUTPUT),
        ("401", "get", OUTPUT),
        ("401", "get", "/events"),
        ("401", "post", "/tokens"),
        ("401", "get", "/tokens"),
        ("401", "delete", "/tokens/{token_id}"),
        ("401", "get", "/audit"),
        ("401", "get", "/whoami"),
    ],
    errors.REQUEST_TOO_LARGE: [  # an update is never refused for it
        ("413", "post", "/jobs"),
        ("413", "put", "/queues/{name}"),
        ("413", "put", "/users/{name}"),
        ("413", "put", NODE),
        ("413", "patch", NODE),
        ("413", "post", OUTPUT),
    ],
    errors.STORE_UNAVAILABLE: [
        ("503", "get", "/jobs"),  # the output a listing or a job shows is read from disk
        ("503", "get", "/jobs/{job_id}"),
        ("503", "post", "/jobs"),
        ("503", "patch", "/jobs/{job_id}"),
        ("503", "post", "/jobs/{job_id}/cancel"),
        ("503", "post", "/jobs/{job_id}/hold"),
        ("503", "post", RELEASE),
        ("503", "post", RETRY),
        ("503", "put", "/queues/{name}"),
        ("503", "put", "/users/{name}"),
        ("503", "put", NODE),  # a node's changed facts are stored before the answer
        ("503", "patch", NODE),
        ("503", "post", OUTPUT),
        ("503", "get", OUTPUT),  # the output is read from disk
    ],
    errors.STORE_OUTCOME_UNKNOWN: [  # only a change: a read has no outcome to doubt
        ("503", "post", "/jobs"),
        ("503", "patch", "/jobs/{job_id}"),
        ("503", "post", "/jobs/{job_id}/cancel"),
        ("503", "post", "/jobs/{job_id}/hold"),
        ("503", "post", RELEASE),
        ("503", "post", RETRY),
        ("503", "put", NODE),  # a heartbeat may fail a job lost by its agent
        ("503", "post", OUTPUT),
    ],
}


def test_every_error_message_of_the_code_is_documented_where_it_occurs() -> None:
    constants = {
        value for name, value in vars(errors).items() if name.isupper() and isinstance(value, str)
    }
    assert constants - set(WHERE) == set(), "a message of errors.py is missing from this test"
    for message, places in WHERE.items():
        for status, method, path in places:
            assert documents(message, status, method, path), (message, status, method, path)
    for message in PLACEMENT_TEXTS:
        assert documents(message, "503", "post", "/jobs"), message
        assert documents(message, "503", "get", "/schedule"), message
    for message in (
        "instance i-1 not running (status=failed)",
        "node host-a for instance i-1 is not healthy",
    ):
        assert documents(message, "503", "post", "/jobs"), message
    # The heartbeat's refusals that name what was sent, as the parser words them.
    for beat in (
        {"cpu_count": 1, "running": ["job-0"]},
        {"cpu_count": 1, "running": [7]},
        {"cpu_count": 1, "running": [], "labels": {"rack": 1}},
    ):
        with pytest.raises(errors.BadRequest) as refused:
            node_requests.parse_heartbeat(json.dumps(beat).encode())
        assert documents(refused.value.message, "400", "put", NODE), refused.value.message
    for status in ("pending", "done", "failed"):
        conflict = f"job job-12 is {status}, not running: no output"
        assert documents(conflict, "409", "post", OUTPUT), conflict
    # Every refusal of the role table, wherever a credential is needed.
    forbidden = [
        "forbidden: viewer tokens may only read",
        "forbidden: only an admin may do this",
        "forbidden: job-7 belongs to bob",
        "forbidden: job-7 belongs to no user",
        "forbidden: this token is for node-a",
        "forbidden: priority above 50 needs an admin",
    ]
    for message in forbidden:
        for method, path in (("post", "/jobs"), ("post", "/jobs/{job_id}/cancel"), ("put", NODE)):
            assert documents(message, "403", method, path), (message, method, path)


def test_every_documented_message_is_one_the_code_has() -> None:
    known = {m + "\n" for m in [*WHERE, *PLACEMENT_TEXTS]} | {
        f"limit must be an integer between 1 and {MAX_PAGE}\n",
        "after must be a job id such as job-7\n",
        ARRAY_ID_MESSAGE + "\n",
    }
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            for status, response in operation["responses"].items():
                content = resolve(response).get("content", {})
                if "text/plain" not in content or int(status) < 400:
                    continue
                for alternative in error_alternatives(response):
                    unknown = set(alternative.get("enum", ())) - known
                    assert not unknown, (method, path, status, unknown)
    timeout = messages_of("400", "post", "/jobs")[1]
    assert any(str(MAX_TIMEOUT_SECS) in pattern for pattern in timeout)


def test_the_document_is_served_open_and_compact(app: Any) -> None:
    reply = app.test_client().get("/openapi.json")  # the app has a key; no header sent
    assert reply.status_code == 200
    assert reply.content_type == "application/json"
    assert reply.get_json() == DOCUMENT
    assert reply.data == compact(DOCUMENT)


# --- the live server against the document ------------------------------------------------

KEY = "conformance-key"
SCHEDULER_ENV = {"MAX_JOBS_PER_NODE": "4", "TINYAWS_API_KEY": KEY}


# What "matches the document" means here. Left out: positive_data_acceptance and
# negative_data_rejection, which would hold the server to what JSON Schema can say, and it
# cannot say "empty means absent" (limit=, after=); tests/test_hostile_input.py checks
# acceptance and rejection exactly, against the contract's own list of checks.
def no_undocumented_server_error(ctx: Any, response: Any, case: Any) -> None:
    """Like schemathesis's not_a_server_error, but a 503 the document gives for this operation
    (a job pinned to an instance the registry does not know) is the contract, not a failure."""
    path, method = case.operation.path, case.method.lower()
    documented = DOCUMENT["paths"][path][method]["responses"]
    status = response.status_code
    assert status < 500 or str(status) in documented, f"{method} {path}: {status}"
    assert status != 500, f"{method} {path}: internal error"


CHECKS = [
    no_undocumented_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    ignored_auth,  # a request with no key, or a wrong one, is refused where the document says
    unsupported_method,
]


def negative_cases_exist(method: str, path: str) -> bool:
    """Whether the operation has a body or a query or header parameter to break."""
    operation = DOCUMENT["paths"][path][method.lower()]
    params = [resolve(p) for p in operation.get("parameters", [])]
    return "requestBody" in operation or any(p["in"] in ("query", "header") for p in params)


def refused_by_gunicorn(response: Any) -> bool:
    """gunicorn's own refusal of a request over its HTTP limits (a request line over 4094
    bytes: 414; a header over 8190: 400 or 431): a bare `text/html` page, which nothing in the
    app sends (the dashboard's pages start with a doctype). Told apart by the page itself: a
    proxy-style charset on the header (seen once under heavy load) must not hide it."""
    if response.status_code in (414, 431):
        return True  # only gunicorn says these: the app has no limit of that kind to refuse
    content_type = response.headers.get("Content-Type", "").partition(";")[0].strip()
    refused = content_type == "text/html" and response.text.lstrip().startswith("<html>")
    if refused:
        assert response.status_code == 400, response.status_code
    return refused


CASES = [
    (method, path, mode)
    for method, path in sorted(documented_operations())
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode == GenerationMode.POSITIVE or negative_cases_exist(method, path)
]


@pytest.fixture(scope="module")
def live_schema(scheduler: SchedulerProcess, registry_server: FakeRegistry) -> Any:
    """The document as the live scheduler serves it, with a few jobs to find."""
    api = Api(scheduler.url, key=KEY)
    for command in ("echo one", "echo two"):
        api.submit(command=command)
    api.close()
    schema = schemathesis.openapi.from_url(scheduler.url + "/openapi.json")
    # An event stream never ends: an answer of GET /events is read up to its first event (the
    # retry hint and comments are not events), or until the call's timeout.
    schema.config.max_stream_events = 1
    return schema


CONFORMANCE = settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


# One test per operation and mode. (schemathesis's own pytest integration, from_fixture,
# does not work with this pytest, so the operations are driven through its Python API.)
@pytest.mark.parametrize("method,path,mode", CASES)
def test_every_answer_matches_the_document(
    live_schema: Any, method: str, path: str, mode: GenerationMode
) -> None:
    operation = live_schema[path][method]

    checks = CHECKS
    if (method, path) == ("GET", "/jobs"):
        # The key it needs depends on the query (the agent's poll is exempt), which the
        # document can only say in words; test_auth checks both sides.
        checks = [check for check in CHECKS if check is not ignored_auth]

    # A stream with no event to send (no Last-Event-ID to resume after) is read for a second:
    # its status, headers and first bytes go out at once; only an event would come later.
    timeout = 1 if path.endswith("/events") else 10  # the API's stream and the dashboard's

    @CONFORMANCE
    @given(case=operation.as_strategy(generation_mode=mode))
    def conforms(case: Any) -> None:
        response = case.call(headers={"Authorization": f"Bearer {KEY}"}, timeout=timeout)
        if refused_by_gunicorn(response):
            return  # never reached the API; the document's description says so
        case.validate_response(response, checks=checks, headers={"Authorization": f"Bearer {KEY}"})

    conforms()


# --- shapes a generated request does not reach: a retried job, every state of the lifecycle ---

AUTH = {"Authorization": f"Bearer {KEY}"}
ANSWER_CHECKS = [
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


def schema_errors(document: dict[str, Any], name: str, instance: Any) -> list[str]:
    """What the document's schema `name` (JSON Schema 2020-12, as OpenAPI 3.1 has it) finds
    wrong with `instance`; [] when it is valid."""
    schema = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    validator = jsonschema_rs.Draft202012Validator(schema)
    return [error.message for error in validator.iter_errors(instance)]


def served_document(scheduler: SchedulerProcess) -> dict[str, Any]:
    api = Api(scheduler.url)
    try:
        return expect_json(api.get("/openapi.json"), 200)
    finally:
        api.close()


class Walk:
    """Calls made as schemathesis cases of the served document, each answer checked against
    it, with the (method, path, status) of every answer kept in `seen`."""

    def __init__(self, live_schema: Any) -> None:
        self.schema = live_schema
        self.seen: set[tuple[str, str, str]] = set()

    def __call__(
        self, method: str, path: str, status: int, body: Any = None, **parts: Any
    ) -> requests.Response:
        operation = self.schema[path][method]
        if body is not None:
            parts.update(body=body, media_type="application/json")
        case = operation.Case(**parts)
        response = case.call(headers=AUTH, timeout=10)
        assert response.status_code == status, (method, path, response.text)
        case.validate_response(response, checks=ANSWER_CHECKS, headers=AUTH)
        self.seen.add((method, path, str(status)))
        return response


def test_a_retried_job_matches_the_served_schema(
    scheduler: SchedulerProcess, live_schema: Any, node: str
) -> None:
    api, agent = Api(scheduler.url, key=KEY), Agent(scheduler.url, node)
    try:
        job_id = api.submit(command="exit 3")["job_id"]
        assert agent.claim(job_id).status_code == 200
        retried = expect_json(agent.report(job_id, 3, stderr="boom"), 200)
    finally:
        api.close()
        agent.close()
    assert (retried["status"], retried["retry_count"]) == ("pending", 1)

    shown = Walk(live_schema)("GET", "/jobs/{job_id}", 200, path_parameters={"job_id": job_id})
    job = shown.json()
    assert [(a["node_id"], a["exit_code"], a["stderr"]) for a in job["attempts"]] == [
        (node, 3, "boom")
    ]
    document = served_document(scheduler)
    assert schema_errors(document, "JobWithAttempts", job) == []
    # Still closed: attempts only where GET /jobs/{job_id} shows them, and nothing unknown.
    assert schema_errors(document, "Job", job) != []
    assert schema_errors(document, "JobWithAttempts", {**job, "bogus": 1}) != []


def test_an_integer_written_with_a_zero_fraction_is_that_integer(
    scheduler: SchedulerProcess, node: str
) -> None:
    document = served_document(scheduler)
    api, agent = Api(scheduler.url, key=KEY), Agent(scheduler.url, node)
    try:
        sent = {"command": "x", "port": 8080.0, "timeout_secs": 60.0, "delay_secs": 0.0}
        assert schema_errors(document, "JobRequest", sent) == []  # JSON Schema's integer
        created = api.post("/jobs", sent)
        job = expect_json(created, 201)
        assert (job["port"], job["timeout_secs"]) == (8080, 60)
        assert b'"port":8080,' in created.content and b'"timeout_secs":60,' in created.content

        fraction = {"command": "x", "port": 80.5}
        assert schema_errors(document, "JobRequest", fraction) != []
        expect_error(
            api.post("/jobs", fraction), 400, "port must be an integer between 1 and 65535"
        )
        expect_error(
            api.post("/jobs", {"command": "x", "delay_secs": 1.5}),
            400,
            f"delay_secs must be an integer between 0 and {MAX_TIMEOUT_SECS}",
        )

        claimed = api.submit(command="y")["job_id"]
        assert agent.claim(claimed).status_code == 200
        report = {"status": "failed", "exit_code": 2.5, "stdout": "", "stderr": ""}
        expect_error(api.patch(f"/jobs/{claimed}", report), 400, errors.DECODE_UPDATE)
        report["exit_code"] = 3.0
        assert schema_errors(document, "JobUpdate", report) == []
        assert expect_json(api.patch(f"/jobs/{claimed}", report), 200)["retry_count"] == 1
        shown = api.get(f"/jobs/{claimed}")  # the failed attempt keeps its exit code
        assert expect_json(shown, 200)["attempts"][0]["exit_code"] == 3
        assert b'"exit_code":3,' in shown.content
    finally:
        api.close()
        agent.close()


def test_every_documented_answer_of_a_walk_through_the_states_matches(
    scheduler: SchedulerProcess, live_schema: Any, node: str
) -> None:
    """One job through pending, running, a failed attempt, pending again with attempts,
    running (with live output appended and read), done and a refused move; another cancelled;
    a schedule created, read, changed and deleted; a node's heartbeat, listing and drain; a
    queue set and listed; the cluster; an event stream. Each answer is checked against the
    document, and every documented success of the API (the dashboard's pages are
    tests/test_ui_*'s) must have been met."""
    call = Walk(live_schema)
    job_path, schedule_path = "/jobs/{job_id}", "/schedules/{schedule_id}"
    for path in ("/health", "/health/scheduler", "/leader", "/schedule", "/openapi.json"):
        call("GET", path, 200)
    call("GET", "/metrics", 200)

    job = call("POST", "/jobs", 201, {"command": "exit 3", "port": 8080}).json()
    ids = {"job_id": job["job_id"]}
    keyed = {"Idempotency-Key": f"walk-{node}"}
    first = call("POST", "/jobs", 201, {"command": "true"}, headers=keyed).json()
    assert call("POST", "/jobs", 200, {"command": "true"}, headers=keyed).json() == first
    batch, batch_key = (
        [{"command": "true"}, {"command": "true", "array": 2}],
        {"Idempotency-Key": f"walk-batch-{node}"},
    )
    made = call("POST", "/jobs/batch", 201, batch, headers=batch_key).json()
    assert call("POST", "/jobs/batch", 200, batch, headers=batch_key).json() == made
    call("GET", "/jobs", 200, query={"node_id": node, "status": "pending"})
    call("GET", "/jobs", 200, query={"node_id": node, "limit": 1})

    running = {"status": "running", "exit_code": None, "stdout": "", "stderr": ""}
    call("PATCH", job_path, 200, running, path_parameters=ids)
    output_path = "/jobs/{job_id}/output"
    call("POST", output_path, 204, {"stdout": "step 1\n", "stderr": None}, path_parameters=ids)
    read = call("GET", output_path, 200, path_parameters=ids, query={"offset": 5})
    # (schemathesis keeps headers by lower-case name, each with the list of its values)
    assert (read.text, read.headers["x-output-offset"]) == ("1\n", ["7"])
    assert read.headers["x-job-status"] == ["running"]
    failed = {"status": "failed", "exit_code": 3, "stdout": "", "stderr": "boom"}
    assert call("PATCH", job_path, 200, failed, path_parameters=ids).json()["retry_count"] == 1
    assert call("GET", job_path, 200, path_parameters=ids).json()["attempts"]
    call("PATCH", job_path, 200, running, path_parameters=ids)
    done = {"status": "done", "exit_code": 0, "stdout": "ok", "stderr": ""}
    call("PATCH", job_path, 200, done, path_parameters=ids)
    finished = call("GET", job_path, 200, path_parameters=ids).json()
    assert (finished["status"], len(finished["attempts"])) == ("done", 1)
    call("PATCH", job_path, 409, running, path_parameters=ids)
    call("POST", output_path, 409, {"stdout": "late"}, path_parameters=ids)

    cancel_ids = {"job_id": first["job_id"]}
    held = call("POST", "/jobs/{job_id}/hold", 200, path_parameters=cancel_ids).json()
    assert (held["held"], held["waiting_for"]) == (True, "held")
    listed = call("GET", "/jobs", 200, query={"node_id": node, "status": "pending", "limit": 9})
    assert {"job_id": first["job_id"], "waiting_for": "held"}.items() <= listed.json()[0].items()
    call("POST", RELEASE, 200, path_parameters=cancel_ids)
    call("POST", RETRY, 409, path_parameters=cancel_ids)
    call("POST", "/jobs/{job_id}/cancel", 200, path_parameters=cancel_ids)
    call("POST", "/jobs/{job_id}/cancel", 409, path_parameters=cancel_ids)
    call("POST", "/jobs/{job_id}/hold", 409, path_parameters=cancel_ids)
    again = call("POST", RETRY, 201, path_parameters=cancel_ids).json()
    assert again["retry_of"] == first["job_id"]
    swept = call("POST", "/jobs", 201, {"command": "true", "array": 3, "name": "walk"}).json()
    members = call("GET", "/jobs", 200, query={"array_id": swept["job_id"]}).json()
    assert [member["array_index"] for member in members] == [0, 1, 2]
    call("GET", job_path, 404, path_parameters={"job_id": "job-999999999999"})

    name = f"walk-{unique_node()}"
    request = {"name": name, "cron": "0 3 * * *", "job": {"command": "true", "port": 80}}
    schedule = call("POST", "/schedules", 201, request).json()
    schedule_ids = {"schedule_id": schedule["schedule_id"]}
    call("GET", "/schedules", 200)
    call("GET", schedule_path, 200, path_parameters=schedule_ids)
    call("PATCH", schedule_path, 200, {"paused": True}, path_parameters=schedule_ids)
    # Run now: the schedule's job once, as a fire would make it (a paused schedule too).
    ran = call("POST", schedule_path + "/run", 201, path_parameters=schedule_ids).json()
    assert ran["schedule_id"] == schedule["schedule_id"]
    call("DELETE", schedule_path, 204, path_parameters=schedule_ids)
    call("GET", schedule_path, 404, path_parameters=schedule_ids)

    beating = unique_node("beat")
    node_ids = {"node_id": beating}
    beat = {"cpu_count": 2, "running": [], "version": "walk", "labels": {"rack": "r1"}}
    orders = call("PUT", "/nodes/{node_id}", 200, beat, path_parameters=node_ids).json()
    assert (orders["node_id"], orders["drain"], orders["stop"]) == (beating, False, [])
    listed = {shown["node_id"]: shown for shown in call("GET", "/nodes", 200).json()}
    assert (listed[beating]["cpu_count"], listed[beating]["labels"]) == (2, {"rack": "r1"})
    assert call("GET", "/nodes/{node_id}", 200, path_parameters=node_ids).json() == listed[beating]
    for drain in (True, False):
        changed = call("PATCH", "/nodes/{node_id}", 200, {"drain": drain}, path_parameters=node_ids)
        assert changed.json()["drain"] is drain
    missing = {"node_id": unique_node("never")}
    call("GET", "/nodes/{node_id}", 404, path_parameters=missing)

    queue = f"walk-{unique_node()}"
    settings = {"max_running": 2, "paused": False}
    shown_queue = call("PUT", "/queues/{name}", 200, settings, path_parameters={"name": queue})
    assert shown_queue.json()["max_running"] == 2
    assert queue in {shown["queue"] for shown in call("GET", "/queues", 200).json()}
    person = f"walk-{unique_node()}"
    limited = call(
        "PUT", "/users/{name}", 200, {"max_running": 3}, path_parameters={"name": person}
    )
    assert limited.json()["max_running"] == 3
    assert person in {shown["user"] for shown in call("GET", "/users", 200).json()}
    assert call("GET", "/cluster", 200).json()["daemons"]

    # Tokens, who a credential is, and the audit trail of all the above.
    made = call("POST", "/tokens", 201, {"user": "walker", "role": "viewer"}).json()
    assert made["token_id"] in {t["token_id"] for t in call("GET", "/tokens", 200).json()}
    assert call("GET", "/whoami", 200).json() == {"role": "admin", "auth": True}
    call("DELETE", "/tokens/{token_id}", 204, path_parameters={"token_id": made["token_id"]})
    assert call("GET", "/audit", 200, query={"action": "token.revoke"}).json()

    # An event stream: open, it takes a change made after it began; resumed just before that
    # change's id, it starts with it.
    with requests.get(f"{scheduler.url}/events", headers=AUTH, stream=True, timeout=10) as stream:
        lines = stream.iter_lines(chunk_size=1)
        assert next(lines) == b"retry: 2000"  # the stream is open
        submitted = call("POST", "/jobs", 201, {"command": "true"}).json()
        event_id = next(line for line in lines if line.startswith(b"id: "))[4:].decode()
        assert json.loads(next(lines).removeprefix(b"data: "))["job_id"] == submitted["job_id"]
    resumed = str(int(event_id) - 1)
    sent = call("GET", "/events", 200, headers={"Last-Event-ID": resumed}).text
    assert f"event: job\nid: {event_id}\n" in sent and submitted["job_id"] in sent

    successes = {
        (method.upper(), path, status)
        for path, item in DOCUMENT["paths"].items()
        if not path.startswith("/ui/")
        for method, operation in item.items()
        if method in HTTP_METHODS
        for status in operation["responses"]
        if status.startswith("2")
    }
    assert successes - call.seen == set(), "documented but never met"


def test_zz_the_server_is_fine_afterwards(scheduler: SchedulerProcess) -> None:
    api = Api(scheduler.url, key=KEY)
    assert expect_json(api.get("/health"), 200)["status"] == "healthy"
    api.close()
    log = Path(scheduler.log_path or "").read_text(errors="replace")
    assert "Traceback" not in log
