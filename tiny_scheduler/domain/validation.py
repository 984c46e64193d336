"""Parsing and checking of request bodies: the JobRequest (HTTP and SQS) and the JobUpdate.

Both the HTTP API and the SQS loop call `parse_job_request`, so a job is accepted by exactly the
same rules whichever way it arrives. Checks run in the spec's order and raise `BadRequest` with
the spec's exact messages. A JSON `null` counts as an absent field, as it did in the original.

Tests: `tests/test_validation.py`.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from .. import errors, jsonstream
from . import jobs, queues, users
from .limits import DEFAULT_PAGE, MAX_ARRAY, MAX_BATCH, MAX_JOB_RETRIES_ASKED, MAX_PAGE

MAX_TIMEOUT_SECS = 10 * 365 * 24 * 3600
MAX_DELAY_SECS = MAX_TIMEOUT_SECS
"""The longest `delay_secs` a job may ask for (ten years, like the longest timeout)."""
_INT64 = 2**63
MAX_DEPENDENCIES = 100
DEPENDS_ON_MESSAGE = "depends_on must be a list of job ids such as job-7"
DEPENDENCY_MESSAGE = "dependency must be ok or any"
PRIORITY_MESSAGE = (
    f"priority must be an integer between {jobs.MIN_PRIORITY} and {jobs.MAX_PRIORITY}"
)
QUEUE_MESSAGE = f"queue must be 1 to {queues.MAX_NAME} characters of A-Za-z0-9._-, not . or .."

# Round four: what a job needs (Resources and fit) and the batch comforts.
MAX_CPUS = 1024
MAX_MEMORY_MB = 16_777_216
MAX_GPUS = 64
MAX_SELECTOR_LABELS = 20
MAX_NODE_IDS = 100
MAX_JOB_NAME = 200
CPUS_MESSAGE = f"cpus must be an integer between 1 and {MAX_CPUS}"
MEMORY_MESSAGE = f"memory_mb must be an integer between 0 and {MAX_MEMORY_MB}"
GPUS_MESSAGE = f"gpus must be an integer between 0 and {MAX_GPUS}"
NODE_SELECTOR_MESSAGE = (
    f"node_selector must map at most {MAX_SELECTOR_LABELS} label names to strings"
)
NODE_IDS_MESSAGE = f"node_ids must be a list of at most {MAX_NODE_IDS} node ids"
NAME_MESSAGE = f"name must be 1 to {MAX_JOB_NAME} printable characters"
MAX_RETRIES_MESSAGE = f"max_retries must be an integer between 0 and {MAX_JOB_RETRIES_ASKED}"
ARRAY_MESSAGE = f"array must be an integer between 1 and {MAX_ARRAY}"
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""What a name may not hold: control characters and line breaks (it is shown on one line)."""
MAX_NODE_ID = 253
NODE_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,253}")
"""A node id: 1-253 characters of A-Za-z0-9._- (a host name fits)."""


@dataclasses.dataclass(frozen=True, slots=True)
class JobRequest:
    """A valid request to create a job."""

    command: str = ""
    deploy_url: str = ""
    instance_id: str = ""
    job_type: str = jobs.RUN
    port: int = 0
    env_vars: dict[str, str] | None = None
    timeout_secs: int = 0
    not_before: int | None = None  # microseconds since the epoch, as given
    delay_secs: int | None = None  # counted from the submission (the service turns it into
    # not_before when it creates the job: a schedule's job is submitted at every fire)
    depends_on: tuple[int, ...] = ()  # job seqs; whether they exist is the service's check
    dependency: jobs.Dependency = jobs.Dependency.OK
    priority: int = jobs.DEFAULT_PRIORITY
    queue: str = queues.DEFAULT_QUEUE
    # Round four (Resources and fit; Batch comforts). `array` is not a field of the job it
    # makes: it is how many copies of it to make.
    cpus: int = 0  # 0: not asked, which counts as 1
    memory_mb: int = 0
    gpus: int = 0
    node_selector: dict[str, str] | None = None
    node_ids: tuple[str, ...] = ()
    name: str = ""
    max_retries: int | None = None
    array: int = 0  # 0: not an array


@dataclasses.dataclass(frozen=True, slots=True)
class JobUpdate:
    """A valid status report from an agent (PATCH /jobs/{id})."""

    status: str
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    # The attempt the report is about (this project's agent names it; see `fencing`).
    node_id: str | None = None
    attempt: int | None = None
    # `timeout`: the agent stopped the job at its timeout (a failure that is not retried).
    timed_out: bool = False
    # `out_of_memory`: the job was killed for its memory limit (final, as a timeout).
    out_of_memory: bool = False
    usage: jobs.Usage | None = None  # what the attempt used, as its agent measured it


@dataclasses.dataclass(frozen=True, slots=True)
class JobQuery:
    """Filters of GET /jobs."""

    node_id: str | None = None
    status: str | None = None
    job_type: str | None = None
    after: int = 0
    limit: int = DEFAULT_PAGE
    reason: str | None = None
    queue: str | None = None
    # History (round four): jobs that finished at or after / before these times, and
    # whether to leave their output out of the answer (`output=none`).
    finished_since: int | None = None
    finished_until: int | None = None
    with_output: bool = True
    # Batch comforts: a name, an array (the seq of its first job), an owner (exact matches).
    name: str | None = None
    array_id: int | None = None
    owner: str | None = None


ARRAY_ID_MESSAGE = "array_id must be a job id such as job-7"

_POLL_PARAMETERS = frozenset({"node_id", "status"})


def agent_poll_node(args: Mapping[str, str]) -> str | None:
    """The node of the agent's poll, exactly as the agent sends it (`node_id=N&status=pending`
    and no other parameter), or None for any other query. Only that query is capped at the
    node's free slots and, while AUTH_AGENT_EXEMPT is on, needs no key: with `after`, `limit`
    or anything else it is an ordinary listing."""
    if args.keys() != _POLL_PARAMETERS or args.get("status") != jobs.PENDING:
        return None
    return args.get("node_id") or None


def parse_query(args: Mapping[str, str]) -> JobQuery:
    """The filters of GET /jobs. Unknown status, type or reason values simply match nothing."""
    limit_text = args.get("limit")
    limit = DEFAULT_PAGE
    if limit_text:
        digits = limit_text.isascii() and limit_text.isdigit() and len(limit_text) <= 6
        if not digits or not 1 <= int(limit_text) <= MAX_PAGE:
            raise errors.BadRequest(f"limit must be an integer between 1 and {MAX_PAGE}")
        limit = int(limit_text)
    after = 0
    after_text = args.get("after")
    if after_text:
        seq = jobs.parse_job_id(after_text)
        if seq is None:
            raise errors.BadRequest("after must be a job id such as job-7")
        after = seq
    output = args.get("output") or ""
    if output not in ("", "none"):
        raise errors.BadRequest("output must be none, or left out")
    array_id = None
    array_text = args.get("array_id")
    if array_text:
        array_id = jobs.parse_job_id(array_text)
        if array_id is None:
            raise errors.BadRequest(ARRAY_ID_MESSAGE)
    return JobQuery(
        node_id=args.get("node_id") or None,
        status=args.get("status") or None,
        job_type=args.get("job_type") or None,
        after=after,
        limit=limit,
        reason=args.get("reason") or None,
        queue=args.get("queue") or None,
        finished_since=_query_time(args, "finished_since"),
        finished_until=_query_time(args, "finished_until"),
        with_output=output != "none",
        name=args.get("name") or None,
        array_id=array_id,
        owner=args.get("owner") or None,
    )


def _query_time(args: Mapping[str, str], name: str) -> int | None:
    text = args.get(name)
    if not text:
        return None
    us = parse_rfc3339(text)
    if us is None:
        raise errors.BadRequest(f"{name} must be an RFC 3339 time such as 2026-11-30T10:20:30Z")
    return us


def decode_object(body: bytes, message: str) -> dict[str, Any]:
    """The body as a JSON object, or BadRequest(message). Invalid UTF-8 is not JSON."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise errors.BadRequest(message) from None
    if not isinstance(data, dict):
        raise errors.BadRequest(message)
    return data


def parse_job_request(body: bytes) -> JobRequest:
    return job_request_from(decode_object(body, errors.DECODE_JOB))


BATCH_MESSAGE = f"a batch must be a JSON array of 1 to {MAX_BATCH} job objects"
BATCH_SIZE_MESSAGE = f"a batch makes at most {MAX_BATCH} jobs, the copies of its arrays counted"


def parse_batch(body: bytes) -> list[JobRequest]:
    """A batch submission's body: a JSON array of job requests, each checked exactly as the
    body of `POST /jobs` is, its errors prefixed with its index (`job 3: port must be …`)."""
    try:
        items = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise errors.BadRequest(BATCH_MESSAGE) from None
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        raise errors.BadRequest(BATCH_MESSAGE)
    made = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise errors.BadRequest(errors.DECODE_JOB).of_item(index)
        try:
            made.append(job_request_from(item))
        except errors.ServiceError as exc:
            raise exc.of_item(index) from None
    if sum(request.array or 1 for request in made) > MAX_BATCH:
        raise errors.BadRequest(BATCH_SIZE_MESSAGE)
    return made


def job_request_from(data: dict[str, Any]) -> JobRequest:
    """Check a decoded JobRequest object field by field, in the spec's order."""
    command = _text(data, "command")
    deploy_url = _text(data, "deploy_url")
    instance_id = _text(data, "instance_id")
    job_type = data.get("job_type")
    if job_type is None or job_type == "":
        job_type = jobs.RUN  # absent, null or "" (the original's zero value) mean the default
    elif job_type not in jobs.JOB_TYPES:  # false, 0 or [] are wrong types, not the default
        raise errors.BadRequest("job_type must be run or service")
    else:
        job_type = jobs.SERVICE if job_type == jobs.SERVICE else jobs.RUN  # shared constants
    port = data.get("port")
    if port is None:
        port = 0
    elif (port := _integer(port)) is None or not 0 <= port <= 65535:
        raise errors.BadRequest("port must be an integer between 1 and 65535")
    env_vars = _env_vars(data.get("env_vars"))
    timeout_secs = data.get("timeout_secs")
    if timeout_secs is None:
        timeout_secs = 0
    elif (timeout_secs := _integer(timeout_secs)) is None or not (
        0 <= timeout_secs <= MAX_TIMEOUT_SECS
    ):
        raise errors.BadRequest(
            f"timeout_secs must be an integer between 1 and {MAX_TIMEOUT_SECS} "
            "(0 means the default)"
        )
    not_before, delay_secs = _delay(data.get("not_before"), data.get("delay_secs"))
    depends_on = _depends_on(data.get("depends_on"))
    dependency = data.get("dependency")
    if dependency is None:
        dependency = jobs.Dependency.OK
    elif dependency not in (jobs.Dependency.OK.value, jobs.Dependency.ANY.value):
        raise errors.BadRequest(DEPENDENCY_MESSAGE)
    else:
        dependency = jobs.Dependency(dependency)
    priority = data.get("priority")
    if priority is None:
        priority = jobs.DEFAULT_PRIORITY
    elif (priority := _integer(priority)) is None or not (
        jobs.MIN_PRIORITY <= priority <= jobs.MAX_PRIORITY
    ):
        raise errors.BadRequest(PRIORITY_MESSAGE)
    queue = data.get("queue")
    if queue is None:
        queue = queues.DEFAULT_QUEUE
    elif not queues.is_valid_name(queue):
        raise errors.BadRequest(QUEUE_MESSAGE)
    cpus = _bounded(data.get("cpus"), 0, 1, MAX_CPUS, CPUS_MESSAGE)
    memory_mb = _bounded(data.get("memory_mb"), 0, 0, MAX_MEMORY_MB, MEMORY_MESSAGE)
    gpus = _bounded(data.get("gpus"), 0, 0, MAX_GPUS, GPUS_MESSAGE)
    node_selector = _node_selector(data.get("node_selector"))
    node_ids = _node_ids(data.get("node_ids"))
    name = data.get("name")
    if name is None:
        name = ""
    elif (
        not isinstance(name, str) or not 1 <= len(name) <= MAX_JOB_NAME or _UNPRINTABLE.search(name)
    ):
        raise errors.BadRequest(NAME_MESSAGE)
    max_retries = data.get("max_retries")
    if max_retries is not None:
        max_retries = _bounded(max_retries, None, 0, MAX_JOB_RETRIES_ASKED, MAX_RETRIES_MESSAGE)
    array = _bounded(data.get("array"), 0, 1, MAX_ARRAY, ARRAY_MESSAGE)
    if not command and not deploy_url:
        raise errors.BadRequest(errors.COMMAND_REQUIRED)
    return JobRequest(
        command=command,
        deploy_url=deploy_url,
        instance_id=instance_id,
        job_type=job_type,
        port=port,
        env_vars=env_vars,
        timeout_secs=timeout_secs,
        not_before=not_before,
        delay_secs=delay_secs,
        depends_on=depends_on,
        dependency=dependency,
        priority=priority,
        queue=queue,
        cpus=cpus,
        memory_mb=memory_mb,
        gpus=gpus,
        node_selector=node_selector,
        node_ids=node_ids,
        name=name,
        max_retries=max_retries,
        array=array,
    )


def _bounded(value: Any, absent: Any, low: int, high: int, message: str) -> Any:
    """An integer field between `low` and `high` (`absent` when the field is absent or
    null), else BadRequest(message)."""
    if value is None:
        return absent
    number = _integer(value)
    if number is None or not low <= number <= high:
        raise errors.BadRequest(message)
    return number


def _node_selector(value: Any) -> dict[str, str] | None:
    """Labels a node must have, each with exactly that value."""
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or len(value) > MAX_SELECTOR_LABELS
        or not all(isinstance(v, str) for v in value.values())
    ):
        raise errors.BadRequest(NODE_SELECTOR_MESSAGE)
    for key, text in value.items():
        if not 1 <= len(key) <= MAX_LABEL_NAME or len(text) > MAX_LABEL_VALUE:
            raise errors.BadRequest(
                f"node_selector names must be 1 to {MAX_LABEL_NAME} characters and values at "
                f"most {MAX_LABEL_VALUE}"
            )
    return dict(sorted(value.items())) or None


def _node_ids(value: Any) -> tuple[str, ...]:
    """The only nodes a job may run on, each once, in the order given."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_NODE_IDS:
        raise errors.BadRequest(NODE_IDS_MESSAGE)
    for item in value:
        if not isinstance(item, str) or not is_node_id(item):
            raise errors.BadRequest(NODE_IDS_MESSAGE)
    return tuple(dict.fromkeys(value))


MAX_LABEL_NAME = 63
MAX_LABEL_VALUE = 63
"""A label's name is 1-63 characters and its value at most 63 (as Kubernetes' label values)."""


def is_node_id(text: str) -> bool:
    """Whether `text` is a node id: 1-253 characters of A-Za-z0-9._-."""
    return NODE_ID_PATTERN.fullmatch(text) is not None


def _depends_on(value: Any) -> tuple[int, ...]:
    """The job numbers of a `depends_on` list, each once, in the order given. Whether they
    name jobs that exist is checked by the service, which knows the jobs."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise errors.BadRequest(DEPENDS_ON_MESSAGE)
    if len(value) > MAX_DEPENDENCIES:
        raise errors.BadRequest(f"depends_on must name at most {MAX_DEPENDENCIES} jobs")
    seqs: dict[int, None] = {}  # ordered, without repeats
    for item in value:
        seq = jobs.parse_job_id(item) if isinstance(item, str) else None
        if seq is None:
            raise errors.BadRequest(DEPENDS_ON_MESSAGE)
        seqs[seq] = None
    return tuple(seqs)


MAX_RUNNING_MESSAGE = "max_running must be an integer of at least 1, or null"
PAUSED_MESSAGE = "paused must be true or false"


def parse_queue_settings(name: str, body: bytes) -> queues.QueueSettings:
    """A PUT /queues/{name} body: `{"max_running": N|null, "paused": bool}`, each field
    absent or null meaning no limit and not paused (the body is the whole of the settings)."""
    if not queues.is_valid_name(name):
        raise errors.BadRequest(QUEUE_MESSAGE)
    data = decode_object(body, errors.DECODE_QUEUE)
    max_running = data.get("max_running")
    if max_running is not None and (
        (max_running := _integer(max_running)) is None or not 1 <= max_running < _INT64
    ):
        raise errors.BadRequest(MAX_RUNNING_MESSAGE)
    paused = data.get("paused")
    if paused is not None and not isinstance(paused, bool):
        raise errors.BadRequest(PAUSED_MESSAGE)
    return queues.QueueSettings(name, max_running, bool(paused))


def parse_user_settings(name: str, body: bytes) -> users.UserSettings:
    """A PUT /users/{name} body: `{"max_running": N|null}` (absent or null: no limit)."""
    if not users.is_valid_name(name):
        raise errors.BadRequest(users.NAME_MESSAGE)
    data = decode_object(body, errors.DECODE_USER)
    max_running = data.get("max_running")
    if max_running is not None and (
        (max_running := _integer(max_running)) is None or not 1 <= max_running < _INT64
    ):
        raise errors.BadRequest(users.MAX_RUNNING_MESSAGE)
    return users.UserSettings(name, max_running)


def job_request_to_wire(request: JobRequest) -> dict[str, object]:
    """A JobRequest as a JSON object that `job_request_from` reads back to the same request:
    `command` and `job_type` always, the other fields when they differ from their defaults
    (how a schedule shows and stores the job it submits)."""
    out: dict[str, object] = {}
    for field in dataclasses.fields(JobRequest):
        value = getattr(request, field.name)
        if field.name == "not_before" and value is not None:
            out["not_before"] = jobs.format_time(value)
        elif field.name == "depends_on":
            if value:
                out["depends_on"] = [jobs.job_id_of(seq) for seq in value]
        elif field.name in ("command", "job_type") or value != field.default:
            # delay_secs 0 differs from its default (None): asked for explicitly, it is kept.
            out[field.name] = value
    return out


_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})"
)


def parse_rfc3339(text: str) -> int | None:
    """An RFC 3339 time (`2026-11-30T10:20:30Z`, any offset, up to nanoseconds as Go's
    clients send them) in microseconds since the epoch; None when the text is not one, or
    is before 1970. Digits beyond the microsecond are dropped, the precision we keep."""
    found = _RFC3339.fullmatch(text) if text.isascii() else None
    if found is None:
        return None
    year, month, day, hour, minute, second = (int(part) for part in found.groups()[:6])
    fraction, offset = found.group(7) or "", found.group(8)
    try:
        zone = datetime.timezone.utc
        if offset not in ("Z", "z"):
            sign = -1 if offset[0] == "-" else 1
            zone = datetime.timezone(
                sign * datetime.timedelta(hours=int(offset[1:3]), minutes=int(offset[4:6]))
            )
        moment = datetime.datetime(
            year, month, day, hour, minute, second, int(fraction[:6].ljust(6, "0")), zone
        )
    except ValueError:  # a day, hour or offset out of range
        return None
    us = (moment - _EPOCH) // datetime.timedelta(microseconds=1)
    return us if us >= 0 else None


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _delay(not_before: Any, delay_secs: Any) -> tuple[int | None, int | None]:
    """A delayed job's `not_before` (a time) or `delay_secs` (from the submission)."""
    if not_before is not None and delay_secs is not None:
        raise errors.BadRequest(errors.NOT_BEFORE_OR_DELAY)
    if not_before is not None:
        us = parse_rfc3339(not_before) if isinstance(not_before, str) else None
        if us is None:
            raise errors.BadRequest(
                "not_before must be an RFC 3339 time such as 2026-11-30T10:20:30Z"
            )
        return us, None
    if delay_secs is None:
        return None, None
    delay = _integer(delay_secs)
    if delay is None or not 0 <= delay <= MAX_DELAY_SECS:
        raise errors.BadRequest(f"delay_secs must be an integer between 0 and {MAX_DELAY_SECS}")
    return None, delay


def parse_update(body: bytes) -> JobUpdate:
    """A whole PATCH body (the agent's report); its output is capped later, by the service."""
    return _update_from(decode_object(body, errors.DECODE_UPDATE), max_output_bytes=None)


def read_update(read: Callable[[int], bytes], max_output_bytes: int) -> JobUpdate:
    """A PATCH body of any size, read with `read(n)` in pieces (b"" at its end).

    The agent never repeats its final report, so no size is refused. A body that ends within
    the first piece is decoded whole, as `parse_update` does; a longer one is read as a stream
    (`jsonstream`) that keeps only the tails of stdout and stderr within `max_output_bytes`,
    so memory stays bounded whatever the size. Both give the same answer for the same body.
    """
    first = read(jsonstream.CHUNK_BYTES)
    second = read(jsonstream.CHUNK_BYTES) if first else b""
    if not second:
        return parse_update(first)
    pending = [first, second]

    def rest(size: int) -> bytes:
        return pending.pop(0) if pending else read(size)

    # The longest status is all a status value needs; exit_code only needs its type when it
    # is a string.
    keep = {
        "status": 16,
        "exit_code": 0,
        "stdout": max_output_bytes,
        "stderr": max_output_bytes,
        "node_id": _MAX_NAME_BYTES,
        "attempt": 0,
        "reason": 16,
        "usage": jsonstream.SMALL_OBJECT,
    }
    try:
        data = jsonstream.read_object(rest, keep)
    except jsonstream.DecodeError:
        raise errors.BadRequest(errors.DECODE_UPDATE) from None
    return _update_from(data, max_output_bytes)


def _update_from(data: Mapping[str, Any], max_output_bytes: int | None) -> JobUpdate:
    """Check a decoded update in the spec's order: types, then the status."""
    status = data.get("status")
    given = data.get("exit_code")
    exit_code = None if given is None else _integer(given)
    stdout = _output(data.get("stdout"), max_output_bytes)
    stderr = _output(data.get("stderr"), max_output_bytes)
    if (
        (status is not None and not isinstance(status, str | jsonstream.Tail))
        or (given is not None and (exit_code is None or not -_INT64 <= exit_code < _INT64))
        or (stdout is not None and not isinstance(stdout, str))
        or (stderr is not None and not isinstance(stderr, str))
    ):
        raise errors.BadRequest(errors.DECODE_UPDATE)
    node_id, number = report_names(data, errors.DECODE_UPDATE)
    reason = data.get("reason")
    if reason is not None and (not isinstance(reason, str) or reason not in _REPORTED_REASONS):
        raise errors.BadRequest(errors.DECODE_UPDATE)
    if status not in jobs.UPDATE_STATUSES:
        raise errors.BadRequest(errors.INVALID_STATUS)
    failed = status == jobs.FAILED
    return JobUpdate(
        status=jobs.Status(status),
        exit_code=exit_code,
        stdout=stdout or "",
        stderr=stderr or "",
        node_id=node_id,
        attempt=number,
        timed_out=reason == jobs.Reason.TIMEOUT and failed,
        out_of_memory=reason == jobs.Reason.OUT_OF_MEMORY and failed,
        usage=jobs.Usage.from_wire(data.get("usage")) if status != jobs.RUNNING else None,
    )


def report_names(data: Mapping[str, Any], message: str) -> tuple[str | None, int | None]:
    """The attempt a report or an output post names: (`node_id`, `attempt`), each None when
    not given; BadRequest(`message`) when one is of the wrong type."""
    node_id, attempt = data.get("node_id"), data.get("attempt")
    number = None if attempt is None else _integer(attempt)
    if (node_id is not None and (not isinstance(node_id, str) or not node_id)) or (
        attempt is not None and (number is None or not 0 <= number < _INT64)
    ):
        raise errors.BadRequest(message)
    return node_id, number


_REPORTED_REASONS = frozenset(
    (jobs.Reason.EXIT.value, jobs.Reason.TIMEOUT.value, jobs.Reason.OUT_OF_MEMORY.value)
)
"""The reasons an agent's final report may give: its own timeout, the job's memory limit,
or the command's exit."""
_MAX_NAME_BYTES = 256
"""A node id named in a report longer than this is not one (the stream keeps no more)."""


def _output(value: Any, max_bytes: int | None) -> Any:
    """An output value as text: a tail the stream kept becomes the capped text it stands for."""
    if isinstance(value, jsonstream.Tail) and max_bytes is not None:
        return jobs.cap_tail(value.data, value.total, max_bytes)
    return value


def _integer(value: Any) -> int | None:
    """A JSON number with no fraction as an int (`3` and `3.0` alike); None for anything else.

    JSON has one number type, and JSON Schema's `integer` (what /openapi.json says of these
    fields) is any number whose fraction is zero: a client whose encoder writes `3.0`
    (Python's float, a computed value) means 3, and a validator in front of us would pass it.
    So it is taken as 3, and the job shows `3`. A fraction (`3.5`), a boolean or a string is
    still the wrong type, with the field's usual message."""
    if isinstance(value, bool):
        return None  # True is an int in Python, but not a number in JSON
    if isinstance(value, int):
        return value
    # A float stands for the integer it was written as only while floats hold every integer
    # exactly (up to 2**53): an integer literal beyond 64 bits, which the parser reads as a
    # float, must not become a rounded neighbour that passes a range check.
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT_FLOAT_INTS:
        return int(value)
    return None


_EXACT_FLOAT_INTS = 2**53


def _text(data: dict[str, Any], field: str) -> str:
    value = data.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise errors.BadRequest(f"{field} must be a string")
    if "\x00" in value:
        # The agent hands these to exec and the kernel stops at a NUL: refuse, don't truncate.
        raise errors.BadRequest(f"{field} must not contain NUL characters")
    return value


def _env_vars(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise errors.BadRequest("env_vars must map strings to strings")
    for name, text in value.items():
        if not name or "=" in name or "\x00" in name or "\x00" in text:
            raise errors.BadRequest(
                "env_vars names must be non-empty without '=' or NUL, and values without NUL"
            )
    return value or None
