"""Hostile input against the live scheduler: random and malformed bodies, headers and query
strings at every endpoint, huge and deep values, broken encodings and framing, slow senders.

One scheduler under real gunicorn serves the whole module. Every answer must be one the
contract documents for that endpoint: never a 5xx (except a placement 503 for a job pinned to
an instance the registry does not know), error bodies `text/plain` with one of the documented
messages, and a 2xx that carries exactly what was sent. At the end the process is still the
one that started, /health is healthy and its log holds no traceback.

Four 30 MB token-dense reports at once (on a scheduler of their own) each get their answer
while /health answers.

Where the answer is decided by the body alone, the expected verdict is computed here from the
contract's own list of checks (`job_verdict`, `update_verdict`, `query_verdict`), so a check
that is skipped, reordered or worded differently fails the property.
"""

from __future__ import annotations

import http.client
import json
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_from_bytes

import pytest
import requests
from conftest import BASE_ENV, SchedulerFactory, log_tail
from helpers import (
    JSON_TYPE,
    TEXT_TYPE,
    Api,
    assert_no_nulls,
    compact,
    expect_json,
    wait_for,
    without_waiting_for,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiny_scheduler import errors
from tiny_scheduler.cluster.registry import DECODE_FAILED, INSTANCE_NOT_FOUND, REACH_FAILED
from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.validation import MAX_PAGE, MAX_TIMEOUT_SECS

LIMIT = 65536
SCHEDULER_ENV = {"MAX_REQUEST_BYTES": str(LIMIT), "MAX_JOBS_PER_NODE": "2"}

pytestmark = pytest.mark.filterwarnings(
    # Hypothesis warns that a failing example's repr is long: bodies near LIMIT are, by design.
    "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
)

PROPERTY = settings(
    max_examples=150,
    deadline=None,
    database=None,  # failures print their example; keep the work tree clean
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

INT64 = 2**63
JOB_FIELDS = (
    "command",
    "deploy_url",
    "instance_id",
    "job_type",
    "port",
    "env_vars",
    "timeout_secs",
)
PLACEMENT_TEXTS = (INSTANCE_NOT_FOUND, REACH_FAILED, DECODE_FAILED)
LIMIT_MESSAGE = f"limit must be an integer between 1 and {MAX_PAGE}"
AFTER_MESSAGE = "after must be a job id such as job-7"


# --- the module's scheduler and a few jobs in known states --------------------------------


class Fixture:
    """Known jobs: one left pending, one done (every update of it must be refused)."""

    def __init__(self, proc: SchedulerProcess) -> None:
        self.proc = proc
        self.api = Api(proc.url)
        self.pending = self.api.submit(command="stay pending", env_vars={"K": "v"})
        done = self.api.submit(command="will be done")
        expect_json(self.api.patch(f"/jobs/{done['job_id']}", {"status": "running"}), 200)
        self.done = expect_json(
            self.api.patch(f"/jobs/{done['job_id']}", {"status": "done", "exit_code": 0}), 200
        )

    @property
    def port(self) -> int:
        return self.proc.port


@pytest.fixture(scope="module")
def live(scheduler: SchedulerProcess) -> Iterator[Fixture]:
    fixture = Fixture(scheduler)
    yield fixture
    fixture.api.close()


# --- what an answer may be -------------------------------------------------------------------


def expect_error_in(response: Any, status: int, accept: Any) -> str:
    """A documented error: this status, text/plain, a message `accept` takes, a newline."""
    body = response.text
    assert response.status_code == status, (response.status_code, body)
    assert response.headers["Content-Type"] == TEXT_TYPE, response.headers
    assert body.endswith("\n") and body.count("\n") == 1, body
    message = body[:-1]
    assert accept(message), f"undocumented message for {status}: {message!r}"
    return message


def is_int(value: Any) -> bool:
    """A JSON integer as JSON Schema has it: a number with no fraction (3 and 3.0); as a float,
    only while floats hold every integer exactly (|x| <= 2**53): beyond, `6.7e16` may be the
    rounding of another integer, and the server refuses it as the wrong type (validation.py)."""
    if isinstance(value, float):
        return value.is_integer() and abs(value) <= 2**53
    return isinstance(value, int) and not isinstance(value, bool)


def job_verdict(body: Any) -> str | None:
    """The first complaint the contract's checks of a JobRequest make, as the start of the
    message; None when the body is a valid job."""
    if not isinstance(body, dict):
        return errors.DECODE_JOB
    for field in ("command", "deploy_url", "instance_id"):
        value = body.get(field)
        if value is not None and (not isinstance(value, str) or "\x00" in value):
            return field
    if body.get("job_type") not in (None, "", "run", "service"):
        return "job_type must be run or service"
    port = body.get("port")
    if port is not None and not (is_int(port) and 0 <= port <= 65535):
        return "port must be an integer between 1 and 65535"
    env = body.get("env_vars")
    if env is not None:
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            return "env_vars must map strings to strings"
        if any(not k or "=" in k or "\x00" in k + v for k, v in env.items()):
            return "env_vars"
    timeout = body.get("timeout_secs")
    if timeout is not None and not (is_int(timeout) and 0 <= timeout <= MAX_TIMEOUT_SECS):
        return "timeout_secs"
    if not body.get("command") and not body.get("deploy_url"):
        return errors.COMMAND_REQUIRED
    return None


def update_verdict(body: Any) -> str | None:
    """The contract's complaint about a PATCH body, or None when it is a valid update."""
    if not isinstance(body, dict):
        return errors.DECODE_UPDATE
    status, code = body.get("status"), body.get("exit_code")
    if (
        (status is not None and not isinstance(status, str))
        or (code is not None and not (is_int(code) and -INT64 <= code < INT64))
        or any(
            body.get(f) is not None and not isinstance(body.get(f), str)
            for f in ("stdout", "stderr")
        )
    ):
        return errors.DECODE_UPDATE
    if status not in ("running", "done", "failed"):
        return errors.INVALID_STATUS
    return None


def check_created(sent: dict[str, Any], job: dict[str, Any]) -> None:
    """A created job carries exactly what was sent (empty optional fields left out)."""
    assert_no_nulls(job)
    assert job["status"] == "pending" and job["retry_count"] == 0
    assert job["command"] == (sent.get("command") or "")
    assert job["job_type"] == (sent.get("job_type") or "run")
    for field in ("deploy_url", "instance_id", "port", "env_vars", "timeout_secs"):
        assert job.get(field) == (sent.get(field) or None), field


def check_submit(live: Fixture, raw: bytes, decoded: Any, response: Any) -> None:
    """Hold one POST /jobs answer against the contract."""
    if len(raw) > LIMIT:
        expect_error_in(response, 413, lambda m: m == errors.REQUEST_TOO_LARGE)
        return
    verdict = job_verdict(decoded)
    if verdict is not None:
        expect_error_in(response, 400, lambda m: m.startswith(verdict))
        return
    if decoded.get("instance_id") and response.status_code == 503:
        expect_error_in(response, 503, lambda m: m in PLACEMENT_TEXTS)
        return
    job = expect_json(response, 201)
    check_created(decoded, job)
    stored = without_waiting_for(live.api.job(job["job_id"]))
    assert stored == job, "the stored job differs from the reply"


# --- strategies ------------------------------------------------------------------------------

AWKWARD_CHARS = "\"'\\\n\r\t\x01\x7f\u00e9\u20ac\u2028\u2029\ufeff\U0001f680日本$`;|&<>{}[]"
any_char = st.characters(codec="utf-8")  # every code point but the surrogates
awkward_text = st.text(alphabet=st.sampled_from(AWKWARD_CHARS) | any_char, max_size=40)
big_text = st.integers(1, 40000).map(lambda n: "é" * n)  # up to ~80 KB: either side of LIMIT
huge_numbers = st.sampled_from(
    [2**31, 2**32, 2**53 + 1, INT64 - 1, INT64, -INT64, -INT64 - 1, 2**64, 10**30, -(10**30)]
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-70000, 70000)
    | huge_numbers
    | st.floats(allow_nan=False, allow_infinity=False)
    | awkward_text
    | st.text(max_size=10).map(lambda s: s + "\x00")
)
json_values = st.recursive(
    scalars,
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3)
    ),
    max_leaves=10,
)
plausible = {
    "command": awkward_text | big_text,
    "deploy_url": st.sampled_from(["", "http://objects/app.zip"]),
    "instance_id": st.sampled_from(["", "i-nowhere", "../nodes", "i-1?x=1#y", "日本"]),
    "job_type": st.sampled_from(["run", "service", "", "RUN", "batch", " run"]),
    "port": st.integers(-2, 65537) | st.booleans() | st.sampled_from(["80", 80.0, 1.5]),
    "env_vars": st.dictionaries(awkward_text, awkward_text, max_size=4)
    | st.dictionaries(st.text(max_size=5), json_values, max_size=3),
    "timeout_secs": st.integers(-2, MAX_TIMEOUT_SECS + 2)
    | huge_numbers
    | st.sampled_from([1.0, "60"]),
}
job_objects = st.fixed_dictionaries(
    {}, optional={field: plausible[field] | json_values for field in JOB_FIELDS}
).flatmap(
    lambda body: st.dictionaries(st.text(max_size=8), json_values, max_size=3).map(
        lambda extra: {**extra, **body}  # unknown fields are ignored
    )
)
job_bodies = job_objects | json_values


def encode(value: Any, ascii_only: bool) -> bytes:
    """JSON as a client might send it (the stdlib: big integers are fine)."""
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8")


def deep(depth: int, opener: str = "[", closer: str = "]") -> str:
    return opener * depth + closer * depth


# --- raw HTTP, for what requests will not send ---------------------------------------------


class RawResponse:
    """The parts of a `requests.Response` that the checks here read."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status_code = status
        self.headers = headers
        self.content = body
        self.text = body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


def read_response(sock: socket.socket) -> RawResponse:
    reply = http.client.HTTPResponse(sock)
    try:
        reply.begin()
        return RawResponse(reply.status, dict(reply.getheaders()), reply.read())
    finally:
        reply.close()


def raw_request(port: int, data: bytes, timeout: float = 10.0) -> RawResponse:
    """Send `data` as it is on a new connection, say that nothing more comes, and read the
    one answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        return read_response(sock)


def request_bytes(
    method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes | None
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    lines += [name + b": " + value for name, value in headers]
    if body is not None:
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")


# --- POST /jobs ------------------------------------------------------------------------------


@PROPERTY
@given(body=job_bodies, ascii_only=st.booleans())
def test_any_json_body_gets_its_documented_answer(
    live: Fixture, body: Any, ascii_only: bool
) -> None:
    raw = encode(body, ascii_only)
    response = live.api.post("/jobs", raw, headers={"Content-Type": "application/json"})
    check_submit(live, raw, body, response)


@PROPERTY
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_bytes_as_a_job_get_a_documented_answer(live: Fixture, raw: bytes) -> None:
    response = live.api.post("/jobs", raw)
    try:
        decoded = json.loads(raw.decode("utf-8"))
    except ValueError:
        expect_error_in(response, 400, lambda m: m == errors.DECODE_JOB)
        return
    check_submit(live, raw, decoded, response)


# Each of these is not JSON, or not JSON that any string can hold (a lone surrogate, a number
# too big for a double), so no job can come of it. Python's json module would read some of
# them; the contract's decoder is stricter, as Go's was.
MALFORMED_BODIES = [
    b'{"command":"\xff\xfe"}',  # not UTF-8
    b'{"command":"\xc3"}',  # a cut UTF-8 sequence
    b'{"command":"\\ud800"}',  # a lone surrogate
    b'{"command":"\\udc00x"}',
    b"\xef\xbb\xbf{}",  # a byte order mark
    b'{"command":"x",}',
    b'{"command":"x"} trailing',
    b'{"command":NaN}',
    b'{"command":Infinity}',
    b'{"port":1e999,"command":"x"}',
    b"{'command':'x'}",
    b'{"command":"x"',
    b"",
    b"null",
    b"\x00",
    deep(5000).encode(),
    ('{"command":"x","env_vars":' + deep(3000, "{", "}") + "}").encode(),
]


@pytest.mark.parametrize("raw", MALFORMED_BODIES, ids=range(len(MALFORMED_BODIES)))
def test_malformed_json_is_refused_as_undecodable(live: Fixture, raw: bytes) -> None:
    expect_error_in(live.api.post("/jobs", raw), 400, lambda m: m == errors.DECODE_JOB)
    path = f"/jobs/{live.pending['job_id']}"
    expect_error_in(live.api.patch(path, raw), 400, lambda m: m == errors.DECODE_UPDATE)


def test_nesting_inside_a_field_is_a_wrong_type(live: Fixture) -> None:
    body = ('{"command":' + deep(500) + "}").encode()
    expect_error_in(live.api.post("/jobs", body), 400, lambda m: m == "command must be a string")


def test_duplicate_keys_take_the_last_value_as_the_original_did(live: Fixture) -> None:
    reply = live.api.post("/jobs", b'{"command":"first","command":"last","port":1,"port":2}')
    job = expect_json(reply, 201)
    assert (job["command"], job["port"]) == ("last", 2)
    reply = live.api.post("/jobs", b'{"command":"x","port":80,"port":"80"}')
    expect_error_in(reply, 400, lambda m: m == "port must be an integer between 1 and 65535")


# Each oversized request goes on a connection of its own: gunicorn answers 413 with
# "Connection: keep-alive" but then closes the connection when it cannot drain the unread
# body (more than 64 KiB), and a client that reuses it fails its next request.
ONE_SHOT = {"Connection": "close"}


@pytest.mark.parametrize("size", [LIMIT + 1, 10 * LIMIT])
def test_a_body_over_the_limit_gets_413_but_an_update_is_read(live: Fixture, size: int) -> None:
    body = b'{"command":"' + b"x" * size + b'"}'
    response = live.api.post("/jobs", body, headers=ONE_SHOT)
    expect_error_in(response, 413, lambda m: m == errors.REQUEST_TOO_LARGE)
    # The agent never repeats a refused final report: an update is read whatever its size,
    # and answered for what it says.
    path = f"/jobs/{live.pending['job_id']}"
    response = live.api.patch(path, body)
    expect_error_in(response, 400, lambda m: m == errors.INVALID_STATUS)
    response = live.api.patch(path, b'{"status":"done","stdout":"' + b"x" * size + b'"')
    expect_error_in(response, 400, lambda m: m == errors.DECODE_UPDATE)
    response = live.api.patch(path, b'{"status":"done","stdout":"' + b"x" * size + b'"}')
    expect_error_in(response, 409, lambda m: m.endswith("is pending, cannot become done"))
    assert live.api.job(live.pending["job_id"])["status"] == "pending"


def test_a_chunked_body_over_the_limit_gets_413_but_an_update_is_read(live: Fixture) -> None:
    chunks = iter((b'{"command":"', b"x" * LIMIT, b'"}'))  # sent chunked: no length given
    response = live.api.request("POST", "/jobs", data=chunks, headers=ONE_SHOT)
    expect_error_in(response, 413, lambda m: m == errors.REQUEST_TOO_LARGE)
    chunks = iter((b'{"stdout":"', b"x" * LIMIT, b'","status":"nope"}'))
    response = live.api.request("PATCH", f"/jobs/{live.pending['job_id']}", data=chunks)
    expect_error_in(response, 400, lambda m: m == errors.INVALID_STATUS)


@pytest.mark.parametrize(
    "framing",
    [
        b"zz\r\n{}\r\n0\r\n\r\n",  # a chunk size that is not hex
        b"2\r\n{}XX0\r\n\r\n",  # a chunk without its CRLF
        b"5\r\n{}",  # the body ends inside a chunk
    ],
)
def test_broken_chunked_framing_is_a_bad_request(live: Fixture, framing: bytes) -> None:
    for method, path in (("POST", "/jobs"), ("PATCH", f"/jobs/{live.pending['job_id']}")):
        chunked = [(b"Transfer-Encoding", b"chunked")]
        response = raw_request(live.port, request_bytes(method, path, chunked, None) + framing)
        assert response.status_code == 400, (method, response.status_code, response.text)


# --- PATCH /jobs/{id} and cancel ----------------------------------------------------------------

update_bodies = (
    st.fixed_dictionaries(
        {},
        optional={
            "status": st.sampled_from(["running", "done", "failed", "pending", "cancelled", "DONE"])
            | json_values,
            "exit_code": st.integers(-300, 300) | huge_numbers | json_values,
            "stdout": awkward_text | json_values,
            "stderr": awkward_text | json_values,
        },
    )
    | json_values
)


@PROPERTY
@given(body=update_bodies, on=st.sampled_from(["done", "missing"]))
def test_any_update_gets_its_documented_answer(live: Fixture, body: Any, on: str) -> None:
    job_id = live.done["job_id"] if on == "done" else "job-999999999"
    response = live.api.patch(f"/jobs/{job_id}", encode(body, ascii_only=False))
    verdict = update_verdict(body)
    if verdict is not None:
        expect_error_in(response, 400, lambda m: m == verdict)
    elif on == "missing":
        expect_error_in(response, 404, lambda m: m == errors.JOB_NOT_FOUND)
    else:
        wanted = body["status"]
        expect_error_in(
            response, 409, lambda m: m == f"job {job_id} is done, cannot become {wanted}"
        )
    assert live.api.job(live.done["job_id"]) == live.done, "a finished job changed"


job_ids = (
    st.text(max_size=30).filter(lambda s: "/" not in s and s not in ("", ".", ".."))
    | st.integers(-5, 10**20).map(lambda n: f"job-{n}")
    | st.sampled_from(["job-0", "job-01", "job-\u0661", "job-1 ", "JOB-1", "job--1", "job-1e3"])
)


@PROPERTY
@given(job_id=job_ids, body=st.binary(max_size=50))
def test_unknown_or_malformed_ids_are_not_found(live: Fixture, job_id: str, body: bytes) -> None:
    seq = jobs.parse_job_id(job_id)
    if seq is not None and live.api.get(f"/jobs/{job_id}").status_code == 200:
        return  # an id that happens to exist
    path = "/jobs/" + quote(job_id, safe="")
    for response in (live.api.get(path), live.api.post(path + "/cancel", body)):
        expect_error_in(response, 404, lambda m: m == errors.JOB_NOT_FOUND)


def test_cancel_ignores_any_body_and_refuses_finished_jobs(live: Fixture) -> None:
    job_id = live.done["job_id"]
    for body in (b"\xff", deep(4000).encode(), b'{"status":"pending"}'):
        response = live.api.post(f"/jobs/{job_id}/cancel", body)
        expect_error_in(
            response, 409, lambda m: m == f"job {job_id} is done, cannot become cancelled"
        )


# --- GET /jobs query strings ----------------------------------------------------------------

query_values = (
    st.text(max_size=12)
    | st.integers(-3, 20000).map(str)
    | st.sampled_from(["pending", "running", "done", "run", "service", "node-a", "job-1", "0"])
    | st.sampled_from(["\uff11\uff12", "1e3", "+5", " 5", "0x10", "99999999999", "job-0", "job-01"])
)
query_keys = st.sampled_from(["node_id", "status", "job_type", "limit", "after", "x", "Limit"])
query_pairs = st.lists(st.tuples(query_keys, query_values), max_size=6)


def query_verdict(pairs: list[tuple[str, str]]) -> str | None:
    first = {}
    for key, value in pairs:
        first.setdefault(key, value)  # repeated parameters: the first counts
    limit = first.get("limit")
    digits = bool(limit) and limit.isascii() and limit.isdigit() and len(limit) <= 6
    if limit and not (digits and 1 <= int(limit) <= MAX_PAGE):
        return LIMIT_MESSAGE
    after = first.get("after")
    if after and jobs.parse_job_id(after) is None:
        return AFTER_MESSAGE
    return None


@PROPERTY
@given(pairs=query_pairs)
def test_any_query_string_gets_a_documented_answer(
    live: Fixture, pairs: list[tuple[str, str]]
) -> None:
    target = "/jobs?" + "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in pairs)
    response = live.api.get(target)
    verdict = query_verdict(pairs)
    if verdict is not None:
        expect_error_in(response, 400, lambda m: m == verdict)
        return
    listed = expect_json(response, 200)
    first: dict[str, str] = {}
    for key, value in pairs:
        first.setdefault(key, value)
    seqs = [jobs.parse_job_id(job["job_id"]) for job in listed]
    assert seqs == sorted(seqs), "not oldest first"
    after = jobs.parse_job_id(first["after"]) if first.get("after") else 0
    assert all(seq > after for seq in seqs)  # type: ignore[operator]
    assert len(listed) <= int(first.get("limit") or 1000)
    for field in ("node_id", "status", "job_type"):
        if first.get(field):
            assert all(job[field] == first[field] for job in listed), field


@PROPERTY
@given(raw=st.binary(min_size=1, max_size=40), key=query_keys)
def test_query_bytes_that_are_not_utf8_get_a_documented_answer(
    live: Fixture, raw: bytes, key: str
) -> None:
    response = live.api.get(f"/jobs?{key}={quote_from_bytes(raw, safe='')}")
    if response.status_code == 400:
        expect_error_in(response, 400, lambda m: m in (LIMIT_MESSAGE, AFTER_MESSAGE))
    else:
        expect_json(response, 200)


# --- headers -----------------------------------------------------------------------------------

header_names = st.sampled_from(
    [b"Idempotency-Key", b"Content-Type", b"Authorization", b"Accept", b"X-Whatever", b"Expect"]
) | st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=20).map(str.encode)
# Headers that change how the request is framed or routed are tested on their own.
FRAMING_HEADERS = {
    b"content-length",
    b"transfer-encoding",
    b"host",
    b"connection",
    b"expect",
    b"upgrade",
    b"te",
    b"trailer",
    b"keep-alive",
    b"http2-settings",
}
# Header values as HTTP allows them: visible characters, spaces, tabs and obs-text bytes.
header_values = st.binary(max_size=200).map(
    lambda b: bytes(c for c in b if c == 9 or 32 <= c != 127).strip()
)


@PROPERTY
@given(
    headers=st.lists(st.tuples(header_names, header_values), max_size=5),
    body=job_objects,
)
def test_any_headers_get_a_documented_answer(
    live: Fixture, headers: list[tuple[bytes, bytes]], body: dict[str, Any]
) -> None:
    headers = [
        (name, value + uuid.uuid4().hex.encode() if name == b"Idempotency-Key" else value)
        for name, value in headers
        if name.lower() not in FRAMING_HEADERS
    ]
    # A second Content-Type makes the message ambiguous (RFC 9110 5.3): gunicorn refuses it
    # before the app sees it, with its own HTML 400 (see test_ambiguous_http_is_refused).
    types = [i for i, (name, _) in enumerate(headers) if name.lower() == b"content-type"]
    headers = [pair for i, pair in enumerate(headers) if i not in types[1:]]
    raw = encode(body, ascii_only=False)
    response = raw_request(live.port, request_bytes("POST", "/jobs", headers, raw))
    check_submit(live, raw, body, response)


def test_an_idempotency_key_of_any_bytes_deduplicates(live: Fixture) -> None:
    for key in (b"\xff\xfe", "日本".encode(), b"a\tb", b"x" * 4000):
        data = request_bytes("POST", "/jobs", [(b"Idempotency-Key", key)], b'{"command":"k"}')
        first = raw_request(live.port, data)
        again = raw_request(live.port, data)
        assert (first.status_code, again.status_code) == (201, 200), (first.text, again.text)
        assert first.json()["job_id"] == again.json()["job_id"]


@pytest.mark.parametrize(
    "head",
    [
        [(b"Content-Type", b"application/json"), (b"Content-Type", b"text/plain")],
        [(b"Content-Length", b"5"), (b"Content-Length", b"6")],
        [(b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"5")],
        [(b"Bad Name", b"x")],
        [(b"X-Control", b"a\x01b")],
    ],
    ids=["two-types", "two-lengths", "chunked-and-length", "space-in-name", "control-char"],
)
def test_ambiguous_http_is_refused(live: Fixture, head: list[tuple[bytes, bytes]]) -> None:
    """Messages that two HTTP parsers could read differently never reach the app: gunicorn
    answers 400 itself (with its own HTML page, the one place an error is not text/plain)."""
    data = request_bytes("POST", "/jobs", head, None) + b'{"command":"smuggled"}'
    assert raw_request(live.port, data).status_code == 400
    assert not [job for job in live.api.jobs(limit=10000) if job["command"] == "smuggled"]


# --- every route, any method ------------------------------------------------------------------

# {done} is a finished job: no request here may change a job another test relies on.
API_ROUTES = [
    "/health",
    "/schedule",
    "/jobs",
    "/jobs/{done}",
    "/jobs/{done}/cancel",
    "/nowhere",
]
# Not JSON: the Prometheus text and the dashboard's HTML pages (errors there may be HTML),
# and `/`, which redirects to the dashboard.
OTHER_ROUTES = ["/metrics", "/ui/", "/ui/jobs", "/ui/jobs/{done}", "/ui/jobs/{done}/cancel", "/"]


@PROPERTY
@given(
    method=st.sampled_from(
        ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE", "FOO"]
    ),
    path=st.sampled_from(API_ROUTES + OTHER_ROUTES),
    query=st.sampled_from(["", "?limit=x", "?after=%ff", "?status=done&limit=1", "?x=%00"]),
    body=st.binary(max_size=100),
)
def test_every_route_and_method_answers_without_a_server_error(
    live: Fixture, method: str, path: str, query: str, body: bytes
) -> None:
    target = path.format(done=live.done["job_id"]) + query
    response = live.api.request(method, target, data=body)
    assert response.status_code < 500, (method, target, response.status_code, response.text)
    if path in OTHER_ROUTES:
        return
    if response.status_code >= 400 and method != "HEAD":
        assert response.headers["Content-Type"] == TEXT_TYPE, response.headers
        assert response.text.endswith("\n")
    elif response.content and method != "HEAD":
        assert response.headers["Content-Type"] == JSON_TYPE


# --- text round-trips, byte for byte ----------------------------------------------------------

round_trip_text = st.text(
    alphabet=st.sampled_from(AWKWARD_CHARS)
    | st.characters(codec="utf-8", exclude_characters="\x00"),
    min_size=1,
    max_size=200,
)
env_names = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="=\x00"), min_size=1, max_size=20
)


@PROPERTY
@given(command=round_trip_text, env=st.dictionaries(env_names, round_trip_text, max_size=5))
def test_commands_and_env_values_round_trip_byte_for_byte(
    live: Fixture, command: str, env: dict[str, str]
) -> None:
    job = live.api.submit(command=command, env_vars=env)
    got = live.api.get(f"/jobs/{job['job_id']}")
    stored = expect_json(got, 200)
    assert stored["command"] == command
    assert stored.get("env_vars", {}) == env
    # orjson writes UTF-8, not \u escapes: the bytes on the wire are the text's own bytes.
    assert json.dumps(command, ensure_ascii=False).encode() in got.content


# --- slow senders --------------------------------------------------------------------------------


class SlowSender(threading.Thread):
    """Sends a job's headers, then its body one byte at a time with pauses in between."""

    def __init__(self, port: int, command: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.body = compact({"command": command})
        self.stop = stop
        self.answer: RawResponse | None = None
        self.trickled = threading.Event()  # the first body byte is out

    def run(self) -> None:
        head = request_bytes("POST", "/jobs", [(b"Content-Type", b"application/json")], b"")
        head = head.replace(b"Content-Length: 0", b"Content-Length: %d" % len(self.body))
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
            sock.sendall(head)
            for index in range(len(self.body)):
                sock.sendall(self.body[index : index + 1])
                self.trickled.set()
                self.stop.wait(0.02)  # the trickle's pace, not a synchronization
            self.answer = read_response(sock)


def test_slow_senders_do_not_hold_up_other_clients(live: Fixture) -> None:
    stop = threading.Event()
    senders = [SlowSender(live.port, f"echo slow {n}", stop) for n in range(4)]
    for sender in senders:
        sender.start()
    for sender in senders:
        assert sender.trickled.wait(10)
    served = 0
    while any(sender.is_alive() for sender in senders) and served < 200:
        assert live.api.get("/health").status_code == 200  # answered while they trickle
        assert expect_json(live.api.post("/jobs", {"command": "fast"}), 201)
        served += 1
    assert served >= 3, "the slow senders finished before anyone else was served"
    for sender in senders:
        sender.join(30)
        assert sender.answer is not None
        assert sender.answer.status_code == 201, sender.answer.text
        assert sender.answer.json()["command"].startswith("echo slow")


def test_slow_header_senders_do_not_hold_up_other_clients(live: Fixture) -> None:
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        for _ in range(5):
            sock.sendall(b"a")
            assert live.api.get("/health").status_code == 200
        sock.sendall(b"\r\nConnection: close\r\n\r\n")
        assert read_response(sock).status_code == 200


def test_more_stalled_senders_than_threads_do_not_starve_the_server(live: Fixture) -> None:
    """Bodies announced and never sent wait in the worker's event loop, not in its threads
    (with gunicorn's own gthread worker this many froze the server)."""
    sockets = []
    try:
        for _ in range(4 * int(live_threads())):
            sock = socket.create_connection(("127.0.0.1", live.port), timeout=10)
            sock.sendall(b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
            sockets.append(sock)
        probe = Api(live.proc.url)
        try:
            assert probe.get("/health", timeout=3).status_code == 200
        finally:
            probe.close()
    finally:
        for sock in sockets:
            sock.close()


def live_threads() -> str:
    return {**BASE_ENV, **SCHEDULER_ENV}.get("SCHEDULER_THREADS", "32")


# --- token-dense reports ---------------------------------------------------------------------

DENSE_BYTES = 30 * 1024 * 1024
"""The issue's figure: 30 MB PATCH bodies, four at once."""

DENSE_REPORTS = {
    # name: the body's start, the token repeated to 30 MB, its end, and the answer's status.
    # Refused for their structure (400) ...
    "array": (b'{"status":"done","x":[', b"0,", b"0]}", 400),
    "members": (b"{", b'"":0,', b'"status":"done"}', 400),
    # ... valid reports, for a job that does not exist (404).
    "escaped quotes": (b'{"status":"done","stdout":"', b'\\"', b'"}', 404),
    "backslashes": (b'{"status":"done","stdout":"', b"\\\\", b'"}', 404),
}

DENSE_ANSWER_SECS = 30.0
"""Each of the four must be answered within this (a liveness bound: sent over loopback and
read in bounded CPU, each takes a second or two; read token by token in Python, the four
took over 40 s of the worker's CPU between them)."""

HEALTH_SAMPLES = 50
HEALTH_BOUND_SECS = 2.0
"""Each /health sampled meanwhile must be answered within this (generous: a shared machine)."""


def test_token_dense_reports_cost_bounded_cpu(scheduler_factory: SchedulerFactory) -> None:
    """Four 30 MB token-dense PATCH bodies at once each get their answer, and /health from
    a fresh client answers all along."""
    proc = scheduler_factory()
    answers: dict[str, tuple[int, str]] = {}

    def send(shape: str, body: bytes) -> None:
        reply = requests.patch(f"{proc.url}/jobs/job-999999", data=body, timeout=DENSE_ANSWER_SECS)
        answers[shape] = (reply.status_code, reply.text)

    senders = [
        threading.Thread(
            target=send, args=(shape, start + token * (DENSE_BYTES // len(token)) + end)
        )
        for shape, (start, token, end, _) in DENSE_REPORTS.items()
    ]
    for sender in senders:
        sender.start()
    latencies = []
    for _ in range(HEALTH_SAMPLES):
        started = time.perf_counter()
        reply = requests.get(proc.url + "/health", timeout=HEALTH_BOUND_SECS)
        latencies.append(time.perf_counter() - started)
        assert reply.status_code == 200
        time.sleep(0.02)  # spreads the samples over the load (a pace, not a synchronization)
    for sender in senders:
        sender.join(DENSE_ANSWER_SECS + 5)
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    print(f"/health under four 30 MB token-dense reports: p99 {cuts[98] * 1000:.1f} ms")
    message = {400: errors.DECODE_UPDATE + "\n", 404: errors.JOB_NOT_FOUND + "\n"}
    assert answers == {
        shape: (status, message[status]) for shape, (*_, status) in DENSE_REPORTS.items()
    }
    expect_json(requests.get(proc.url + "/health", timeout=HEALTH_BOUND_SECS), 200)


# --- and afterwards ------------------------------------------------------------------------------


def test_zz_the_server_is_still_healthy_after_all_of_it(live: Fixture) -> None:
    """Runs last in the module (pytest keeps file order): the same process, healthy, and no
    request ended in a traceback."""
    wait_for(lambda: live.api.get("/health").status_code == 200, timeout=20, message="health")
    assert expect_json(live.api.get("/health"), 200)["status"] == "healthy"
    assert live.proc.proc is not None and live.proc.proc.poll() is None
    log = Path(live.proc.log_path or "").read_text(errors="replace")
    assert "Traceback" not in log, log_tail(live.proc)
    assert log.count("Booting worker") == 1, "the worker died and was replaced"
