"""The OpenAPI description (tiny_scheduler/openapi.json, served at GET /openapi.json) is true.

- Every route the app serves is documented, with its methods, and nothing else is.
- The exact error messages of `errors` (and of placement) are the ones the document gives for
  the statuses that carry them, and every message the document promises is one the code has.
- schemathesis generates requests from the document, valid and invalid, sends them to a live
  scheduler under gunicorn, and checks every answer against the document: a documented status,
  a documented content type (text/plain for errors), a body and headers that match the schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from helpers import Api, compact, expect_json
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
from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.placement import NO_HEALTHY_NODES
from tiny_scheduler.registry import DECODE_FAILED, INSTANCE_NOT_FOUND, REACH_FAILED
from tiny_scheduler.validation import MAX_PAGE, MAX_TIMEOUT_SECS

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

# Each message of `errors`, with the answers (status, method, path) that carry it.
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
    errors.DECODE_UPDATE: [("400", "patch", "/jobs/{job_id}")],
    errors.INVALID_STATUS: [("400", "patch", "/jobs/{job_id}")],
    errors.JOB_NOT_FOUND: [
        ("404", "get", "/jobs/{job_id}"),
        ("404", "patch", "/jobs/{job_id}"),
        ("404", "post", "/jobs/{job_id}/cancel"),
    ],
    errors.UNAUTHORIZED: [
        ("401", "get", "/jobs"),
        ("401", "post", "/jobs"),
        ("401", "get", "/jobs/{job_id}"),
        ("401", "patch", "/jobs/{job_id}"),
        ("401", "post", "/jobs/{job_id}/cancel"),
        ("401", "get", "/schedule"),
        ("401", "post", "/schedules"),
        ("401", "get", "/schedules"),
        ("401", "get", "/schedules/{schedule_id}"),
        ("401", "patch", "/schedules/{schedule_id}"),
        ("401", "delete", "/schedules/{schedule_id}"),
        ("401", "get", "/ui/"),
    ],
    errors.REQUEST_TOO_LARGE: [("413", "post", "/jobs")],  # an update is never refused for it
    errors.STORE_UNAVAILABLE: [
        ("503", "get", "/jobs"),  # the output a listing or a job shows is read from disk
        ("503", "get", "/jobs/{job_id}"),
        ("503", "post", "/jobs"),
        ("503", "patch", "/jobs/{job_id}"),
        ("503", "post", "/jobs/{job_id}/cancel"),
    ],
    errors.STORE_OUTCOME_UNKNOWN: [  # only a change: a read has no outcome to doubt
        ("503", "post", "/jobs"),
        ("503", "patch", "/jobs/{job_id}"),
        ("503", "post", "/jobs/{job_id}/cancel"),
    ],
}


def test_every_error_message_of_the_code_is_documented_where_it_occurs() -> None:
    constants = {
        value for name, value in vars(errors).items() if name.isupper() and isinstance(value, str)
    }
    assert constants == set(WHERE), "a message of errors.py is missing from this test"
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


def test_every_documented_message_is_one_the_code_has() -> None:
    known = {m + "\n" for m in [*WHERE, *PLACEMENT_TEXTS]} | {
        f"limit must be an integer between 1 and {MAX_PAGE}\n",
        "after must be a job id such as job-7\n",
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
# cannot say "an integer, but not 5.0" (the API refuses 5.0 as Go's decoder did) or "empty
# means absent" (limit=, after=); tests/test_hostile_input.py checks acceptance and rejection
# exactly, against the contract's own list of checks.
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
    app sends (the dashboard's pages say their charset)."""
    refused = response.headers.get("Content-Type") == "text/html"
    if refused:
        assert response.status_code in (400, 414, 431), response.status_code
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
    return schemathesis.openapi.from_url(scheduler.url + "/openapi.json")


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

    @CONFORMANCE
    @given(case=operation.as_strategy(generation_mode=mode))
    def conforms(case: Any) -> None:
        response = case.call(headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        if refused_by_gunicorn(response):
            return  # never reached the API; the document's description says so
        case.validate_response(response, checks=checks, headers={"Authorization": f"Bearer {KEY}"})

    conforms()


def test_zz_the_server_is_fine_afterwards(scheduler: SchedulerProcess) -> None:
    api = Api(scheduler.url, key=KEY)
    assert expect_json(api.get("/health"), 200)["status"] == "healthy"
    api.close()
    log = Path(scheduler.log_path or "").read_text(errors="replace")
    assert "Traceback" not in log
