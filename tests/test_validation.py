"""Request parsing: the JobRequest, the JobUpdate and the GET /jobs query, with the spec's
exact error messages and the order the checks run in."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tiny_scheduler import errors
from tiny_scheduler.domain import validation
from tiny_scheduler.domain.validation import JobQuery, JobRequest, JobUpdate

PORT = "port must be an integer between 1 and 65535"
JOB_TYPE = "job_type must be run or service"
ENV_VARS = "env_vars must map strings to strings"
LIMIT = "limit must be an integer between 1 and 10000"
AFTER = "after must be a job id such as job-7"


def request_error(body: bytes | dict[str, Any]) -> str:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(errors.BadRequest) as caught:
        validation.parse_job_request(raw)
    assert caught.value.status == 400
    return caught.value.message


def update_error(body: bytes | dict[str, Any]) -> str:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(errors.BadRequest) as caught:
        validation.parse_update(raw)
    return caught.value.message


# --- POST /jobs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[]", b'[{"command":"x"}]', b"null", b'"echo"', b"1", b"\xff\xfe", b"{"],
)
def test_a_body_that_is_not_a_json_object(body: bytes) -> None:
    assert request_error(body) == "failed to decode job"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"command": 1}, "command must be a string"),
        ({"command": ["ls"]}, "command must be a string"),
        ({"deploy_url": {}}, "deploy_url must be a string"),
        ({"instance_id": 7}, "instance_id must be a string"),
        ({"job_type": "batch"}, JOB_TYPE),
        ({"job_type": "RUN"}, JOB_TYPE),
        ({"job_type": 1}, JOB_TYPE),
        ({"job_type": False}, JOB_TYPE),
        ({"job_type": []}, JOB_TYPE),
        ({"port": "80"}, PORT),
        ({"port": 80.5}, PORT),
        ({"port": 65536.0}, PORT),
        ({"port": True}, PORT),
        ({"port": -1}, PORT),
        ({"port": 65536}, PORT),
        ({"port": [80]}, PORT),
        ({"env_vars": []}, ENV_VARS),
        ({"env_vars": "A=1"}, ENV_VARS),
        ({"env_vars": {"A": 1}}, ENV_VARS),
        ({"env_vars": {"A": None}}, ENV_VARS),
        ({"env_vars": {"A": "1", "B": True}}, ENV_VARS),
    ],
)
def test_a_field_of_the_wrong_type_or_range_is_named(fields: dict[str, Any], message: str) -> None:
    assert request_error({"command": "echo", **fields}) == message


@pytest.mark.parametrize(
    "fields",
    [
        {"timeout_secs": "5"},
        {"timeout_secs": -1},
        {"timeout_secs": 1.5},
        {"timeout_secs": True},
        {"timeout_secs": 10**12},
        {"command": "a\x00b"},
        {"env_vars": {"A=B": "1"}},
        {"env_vars": {"": "1"}},
        {"env_vars": {"A": "x\x00"}},
    ],
)
def test_other_fields_messages_start_with_the_field_name(fields: dict[str, Any]) -> None:
    name = next(iter(fields))
    assert request_error({"command": "echo", **fields}).startswith(f"{name} ")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"command": ""},
        {"command": "", "deploy_url": ""},
        {"command": None, "deploy_url": None},
        {"env_vars": {"A": "1"}, "job_type": "service", "port": 80},
    ],
)
def test_command_or_deploy_url_is_required(body: dict[str, Any]) -> None:
    assert request_error(body) == "command or deploy_url is required"


def test_field_checks_come_before_the_required_check() -> None:
    # Step 3 (field types) before step 4 (command or deploy_url): the spec's order.
    assert request_error({"port": "x"}) == PORT
    assert request_error({"job_type": "x"}) == JOB_TYPE
    assert request_error({"env_vars": 1}) == ENV_VARS


def test_a_valid_request_with_every_field() -> None:
    body = {
        "command": "echo $A",
        "deploy_url": "http://store/app.zip",
        "instance_id": "i-1",
        "job_type": "service",
        "port": 8080,
        "env_vars": {"A": "1"},
        "timeout_secs": 30,
        "unknown": {"is": "ignored"},
    }
    assert validation.parse_job_request(json.dumps(body).encode()) == JobRequest(
        command="echo $A",
        deploy_url="http://store/app.zip",
        instance_id="i-1",
        job_type="service",
        port=8080,
        env_vars={"A": "1"},
        timeout_secs=30,
    )


@pytest.mark.parametrize(
    "body",
    [
        {"command": "ls", "port": None, "env_vars": None, "job_type": None, "timeout_secs": None},
        {"command": "ls", "port": 0, "env_vars": {}, "job_type": "", "timeout_secs": 0},
    ],
)
def test_null_and_empty_values_mean_absent(body: dict[str, Any]) -> None:
    assert validation.parse_job_request(json.dumps(body).encode()) == JobRequest(command="ls")


def test_deploy_url_alone_is_enough() -> None:
    parsed = validation.parse_job_request(b'{"deploy_url":"http://s/a.zip"}')
    assert (parsed.command, parsed.deploy_url) == ("", "http://s/a.zip")


def test_port_bounds_are_accepted() -> None:
    for port in (1, 65535):
        assert validation.parse_job_request(json.dumps({"command": "x", "port": port}).encode())


# --- PATCH /jobs/{id} -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"nope",
        b"[]",
        b"null",
        {"status": 1},
        {"status": "done", "exit_code": "0"},
        {"status": "done", "exit_code": 1.5},
        {"status": "done", "exit_code": True},
        {"status": "done", "exit_code": 2**63},
        {"status": "done", "exit_code": 0, "stdout": 5},
        {"status": "done", "exit_code": 0, "stderr": ["x"]},
        # wrong types are found before the status is checked
        {"status": "bogus", "exit_code": "x"},
    ],
)
def test_update_that_does_not_decode(body: bytes | dict[str, Any]) -> None:
    assert update_error(body) == "failed to decode update"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"status": None},
        {"status": ""},
        {"status": "pending"},
        {"status": "cancelled"},
        {"status": "RUNNING"},
        {"exit_code": 0},
    ],
)
def test_update_with_an_invalid_status(body: dict[str, Any]) -> None:
    assert update_error(body) == "invalid status"


def test_the_agents_exact_updates_parse() -> None:
    claim = b'{"status":"running","exit_code":null,"stdout":"","stderr":""}'
    assert validation.parse_update(claim) == JobUpdate(status="running")
    final = b'{"status":"failed","exit_code":-1,"stdout":"o","stderr":"download error: x"}'
    assert validation.parse_update(final) == JobUpdate("failed", -1, "o", "download error: x")
    assert validation.parse_update(b'{"status":"done","exit_code":-9223372036854775808}')


def test_an_integer_may_be_written_with_a_zero_fraction() -> None:
    # JSON Schema's integer, which /openapi.json states: 3.0 is the number 3.
    body = b'{"command":"x","port":8080.0,"timeout_secs":3e1,"delay_secs":0.0}'
    request = validation.parse_job_request(body)
    assert (request.port, request.timeout_secs, request.delay_secs) == (8080, 30, 0)
    assert all(type(v) is int for v in (request.port, request.timeout_secs, request.delay_secs))
    update = validation.parse_update(b'{"status":"failed","exit_code":-1.0}')
    assert update.exit_code == -1 and type(update.exit_code) is int


@pytest.mark.parametrize("code", [b"-9223372036854775809", b"9223372036854775808", b"1e19"])
def test_an_exit_code_beyond_64_bits_is_the_wrong_type_however_it_is_written(code: bytes) -> None:
    # Read as a float, such a number would round to an in-range neighbour.
    with pytest.raises(errors.BadRequest) as caught:
        validation.parse_update(b'{"status":"failed","exit_code":' + code + b"}")
    assert caught.value.message == errors.DECODE_UPDATE


# --- GET /jobs query ------------------------------------------------------------------------


def test_query_defaults() -> None:
    assert validation.parse_query({}) == JobQuery(limit=1000)
    empty = {"node_id": "", "status": "", "job_type": "", "limit": "", "after": ""}
    assert validation.parse_query(empty) == JobQuery()


def test_query_filters_and_paging() -> None:
    args = {"node_id": "n", "status": "done", "job_type": "run", "limit": "10000", "after": "job-7"}
    assert validation.parse_query(args) == JobQuery("n", "done", "run", after=7, limit=10000)
    assert validation.parse_query({"limit": "1"}).limit == 1


@pytest.mark.parametrize("limit", ["0", "10001", "-1", "abc", "1.5", " 5", "\u0665", "9" * 30])
def test_query_limit_out_of_range(limit: str) -> None:
    with pytest.raises(errors.BadRequest) as caught:
        validation.parse_query({"limit": limit})
    assert caught.value.message == LIMIT


@pytest.mark.parametrize("after", ["7", "job-0", "job-x", "job-07", "x"])
def test_query_after_must_be_a_job_id(after: str) -> None:
    with pytest.raises(errors.BadRequest) as caught:
        validation.parse_query({"after": after})
    assert caught.value.message == AFTER


def test_agent_poll_is_node_and_pending() -> None:
    assert validation.agent_poll_node({"node_id": "n", "status": "pending"}) == "n"
    assert validation.agent_poll_node({"status": "pending"}) is None
    assert validation.agent_poll_node({"node_id": "n", "status": "running"}) is None
    assert validation.agent_poll_node({"node_id": "", "status": "pending"}) is None
    # With anything more it is a listing, not the poll (and not exempt from the key).
    for extra in ("after", "limit", "job_type", "x"):
        assert validation.agent_poll_node({"node_id": "n", "status": "pending", extra: "1"}) is None


# --- round four: what a job needs, and the batch comforts ------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cpus": 0}, validation.CPUS_MESSAGE),
        ({"cpus": 1025}, validation.CPUS_MESSAGE),
        ({"cpus": "4"}, validation.CPUS_MESSAGE),
        ({"cpus": 1.5}, validation.CPUS_MESSAGE),
        ({"cpus": True}, validation.CPUS_MESSAGE),
        ({"memory_mb": -1}, validation.MEMORY_MESSAGE),
        ({"memory_mb": 16_777_217}, validation.MEMORY_MESSAGE),
        ({"gpus": 65}, validation.GPUS_MESSAGE),
        ({"gpus": -1}, validation.GPUS_MESSAGE),
        ({"node_selector": ["gpu"]}, validation.NODE_SELECTOR_MESSAGE),
        ({"node_selector": {"gpu": 1}}, validation.NODE_SELECTOR_MESSAGE),
        ({"node_selector": {f"k{i}": "v" for i in range(21)}}, validation.NODE_SELECTOR_MESSAGE),
        ({"node_ids": "node-a"}, validation.NODE_IDS_MESSAGE),
        ({"node_ids": ["node a"]}, validation.NODE_IDS_MESSAGE),
        ({"node_ids": [""]}, validation.NODE_IDS_MESSAGE),
        ({"node_ids": ["x" * 254]}, validation.NODE_IDS_MESSAGE),
        ({"node_ids": [f"n{i}" for i in range(101)]}, validation.NODE_IDS_MESSAGE),
        ({"name": ""}, validation.NAME_MESSAGE),
        ({"name": "x" * 201}, validation.NAME_MESSAGE),
        ({"name": "two\nlines"}, validation.NAME_MESSAGE),
        ({"name": 7}, validation.NAME_MESSAGE),
        ({"max_retries": 11}, validation.MAX_RETRIES_MESSAGE),
        ({"max_retries": -1}, validation.MAX_RETRIES_MESSAGE),
        ({"array": 0}, validation.ARRAY_MESSAGE),
        ({"array": 10_001}, validation.ARRAY_MESSAGE),
    ],
)
def test_round_four_fields_out_of_range_are_named(fields: dict[str, Any], message: str) -> None:
    assert request_error({"command": "x", **fields}) == message
    assert message.startswith(next(iter(fields)))


def test_a_long_selector_label_is_refused_naming_the_bounds() -> None:
    message = request_error({"command": "x", "node_selector": {"k" * 64: "v"}})
    assert message.startswith("node_selector names must be 1 to 63 characters")


def test_round_four_fields_are_read_and_absent_ones_keep_their_defaults() -> None:
    body = {
        "command": "x",
        "cpus": 4,
        "memory_mb": 8192,
        "gpus": 1,
        "node_selector": {"zone": "b", "gpu": "a100"},
        "node_ids": ["node-c", "node-a", "node-c"],
        "name": "nightly sweep ✓",
        "max_retries": 0,
        "array": 100,
    }
    parsed = validation.parse_job_request(json.dumps(body).encode())
    assert (parsed.cpus, parsed.memory_mb, parsed.gpus) == (4, 8192, 1)
    assert parsed.node_selector == {"gpu": "a100", "zone": "b"}
    assert parsed.node_ids == ("node-c", "node-a")  # each once, in the order given
    assert (parsed.name, parsed.max_retries, parsed.array) == ("nightly sweep ✓", 0, 100)
    plain = validation.parse_job_request(b'{"command":"x","cpus":null,"max_retries":null}')
    assert (plain.cpus, plain.max_retries, plain.array, plain.node_ids) == (0, None, 0, ())
    # A schedule stores its job as the wire form, which reads back to the same request.
    again = validation.job_request_from(
        json.loads(json.dumps(validation.job_request_to_wire(parsed)))
    )
    assert again == parsed


def test_a_report_carries_its_usage_and_out_of_memory_and_a_bad_usage_is_dropped() -> None:
    usage = {"cpu_secs": 1.25, "max_rss_mb": 30, "wall_secs": 2}
    body = {"status": "failed", "exit_code": 137, "reason": "out_of_memory", "usage": usage}
    update = validation.parse_update(json.dumps(body).encode())
    assert update.out_of_memory and not update.timed_out
    assert update.usage == validation.jobs.Usage(1.25, 30.0, 2.0)
    for bad in ({"cpu_secs": "1"}, [1, 2, 3], {"cpu_secs": -1, "max_rss_mb": 1, "wall_secs": 1}):
        dropped = validation.parse_update(json.dumps({"status": "done", "usage": bad}).encode())
        assert dropped.usage is None
    # A report of any size keeps it too (read as a stream past the first piece).
    big = {"status": "done", "exit_code": 0, "stdout": "x" * 300_000, "usage": usage}
    data = json.dumps(big).encode()
    pieces = [data[i : i + 65536] for i in range(0, len(data), 65536)] + [b""]
    streamed = validation.read_update(lambda _size: pieces.pop(0), 1024)
    assert streamed.usage == validation.jobs.Usage(1.25, 30.0, 2.0)
