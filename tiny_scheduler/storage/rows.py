"""Jobs and schedules as database rows, derived from the one declaration of their fields
(`jobs.Job`, `schedules.Schedule`).

The column list is the dataclass's field list, but for the output fields (`stdout`, `stderr`):
a job's output lives in rows of its own, one per attempt that printed something
(`output_rows`), so that loading the jobs never reads it. Values that SQL has no type for (the
environment, the earlier attempts without their output) are stored as JSON text, enums as
their plain values. Rows are read back by selecting the columns *by name* in the declaration's
order, so a column added anywhere in a table (by a migration) can never shift another. The
start-up load may read the columns most rows leave at their defaults packed into one value
(`jobs_from_packed`); `from_row` stays the one reading of a full row. Shared by every backend.
"""

from __future__ import annotations

import dataclasses
import operator
import typing
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from sys import intern
from typing import Any

import orjson

from ..domain import validation
from ..domain.compact import Ended
from ..domain.jobs import (
    FINAL_STATUSES,
    Attempt,
    Dependency,
    Job,
    JobType,
    Output,
    Reason,
    Status,
    Usage,
)
from ..domain.schedules import Overlap, Schedule

_FIELDS = dataclasses.fields(Job)

COLUMNS = tuple(field.name for field in _FIELDS if not field.metadata.get("output"))
"""Column names of the jobs table, in the declaration's order (the output is not there)."""

SCHEDULE_COLUMNS = tuple(field.name for field in dataclasses.fields(Schedule))
"""Column names of the schedules table, in the declaration's order."""

_OUTPUT = frozenset(Output._fields)  # an attempt's output fields, left out of its JSON
_ATTEMPT_FIELDS = tuple(field.name for field in dataclasses.fields(Attempt))
# Where the output fields go among Job's constructor arguments, and their (empty) defaults: a
# row fills the other places in order. Positional, because keywords cost a million-job load
# seconds.
_GAPS = tuple(
    (index, field.default) for index, field in enumerate(_FIELDS) if field.metadata.get("output")
)


def to_row(job: Job) -> tuple[object, ...]:
    """The job's column values in `COLUMNS` order (its output is in `output_rows`)."""
    values = list(_COLUMN_VALUES(job))
    for index, encode in _ENCODERS:
        values[index] = encode(values[index])
    return tuple(values)


def output_rows(job: Job) -> list[tuple[int, int, str, str]]:
    """(seq, attempt number, stdout, stderr) of each attempt whose output this version
    carries (see `Job.outputs`)."""
    return [(job.seq, number, *output) for number, output in job.outputs().items()]


# Enum members by stored value, per column: a dict lookup, where calling the enum class costs
# a start-up with a million jobs a second. An unknown value raises KeyError, which `problem`
# names.
_MEMBERS = {
    column: {member.value: member for member in enum}
    for column, enum in (
        ("job_type", JobType),
        ("status", Status),
        ("reason", Reason),
        ("dependency", Dependency),
    )
}
STATUS_CODES = {member.value: code for code, member in enumerate(Status)}
"""The small number the start-up load reads in place of each status's text (see
`sql.select_packed_jobs`): Python shares small ints, where each text would be a new object."""
_JOB_TYPES, _REASONS = _MEMBERS["job_type"], _MEMBERS["reason"]
# By stored value or by load code.
_STATUSES = {**_MEMBERS["status"], **{code: Status(v) for v, code in STATUS_CODES.items()}}
_DEPENDENCIES = _MEMBERS["dependency"]


def from_row(row: Sequence[Any]) -> Job:
    """A job without its output, from a row whose values come in `COLUMNS` order (select them
    by name)."""
    values = list(row)
    for index, default in _GAPS:
        values.insert(index, default)
    job = Job(*values)
    # Interned: a million jobs share a handful of node ids, types and statuses, and each row
    # would otherwise bring its own copy of them into memory.
    job.node_id = intern(job.node_id)
    job.instance_id = intern(job.instance_id)
    job.job_type = _JOB_TYPES[job.job_type]
    job.status = _STATUSES[job.status]
    if job.reason is not None:
        job.reason = _REASONS[job.reason]
    job.holds_slot = bool(job.holds_slot)
    job.named_claim = bool(job.named_claim)
    job.keyed_claim = bool(job.keyed_claim)
    job.moved_from = intern(job.moved_from)
    job.dependency = _DEPENDENCIES[job.dependency]
    job.queue = intern(job.queue)
    job.depends_on = tuple(orjson.loads(job.depends_on)) if job.depends_on is not None else ()
    if job.env_vars is not None:
        job.env_vars = orjson.loads(job.env_vars)
    job.attempts = () if job.attempts is None else _attempts(job.attempts)
    job.held = bool(job.held)
    job.owner = intern(job.owner)
    if job.node_selector is not None:
        job.node_selector = orjson.loads(job.node_selector)
    job.node_ids = tuple(orjson.loads(job.node_ids)) if job.node_ids is not None else ()
    if job.usage is not None:
        job.usage = Usage.from_wire(orjson.loads(job.usage))
    return job


# --- the start-up load: the columns every row sets, and the rest packed ----------------------

LOAD_COLUMNS = (
    "seq",
    "node_id",
    "command",
    "status",
    "retry_count",
    "exit_code",
    "created_at",
    "running_at",
    "finished_at",
    "attempts",
)
"""The columns the start-up load reads one by one: those most rows set."""

RARE_COLUMNS = tuple(name for name in COLUMNS if name not in LOAD_COLUMNS)
"""The columns most rows hold at their defaults (a node's instance, a queue, a priority, ...):
the load reads them packed into one JSON array, NULL when every one is at its default, because
each column a row brings costs a million-job start-up about 0.1 s in the sqlite3 module."""


def stored_default(name: str) -> object:
    """A column's value, as stored, in a job that never set its field."""
    field = next(field for field in _FIELDS if field.name == name)
    encode = _encoder(name, _DECLARED[name])
    return encode(field.default) if encode is not None else field.default


# A packed row's values in `COLUMNS` order: the loaded ones, then the rare ones.
_UNPACK = tuple((LOAD_COLUMNS + RARE_COLUMNS).index(name) for name in COLUMNS)


def _compile_load() -> Callable[[Iterable[Sequence[Any]]], list[Job]]:
    """`jobs_from_packed`, written out from the declaration once, at import: per row one
    `Job(...)` call with the loaded values and the defaults in place (as `jobs.Job.to_wire`
    is written out, and for the same reason: a loop over the fields costs a million-job load
    seconds)."""
    scope: dict[str, Any] = {
        "Job": Job,
        "intern": intern,
        "_STATUSES": _STATUSES,
        "_attempts": _attempts,
        "_unpacked": _unpacked,
        "Ended": Ended,
        "_FINAL_CODES": frozenset(STATUS_CODES[status.value] for status in FINAL_STATUSES),
    }
    # The fields a loaded column needs converted, and how (as `from_row` does).
    converted = {
        "node_id": "intern(node_id)",
        "status": "_STATUSES[status]",
        "attempts": "() if attempts is None else _attempts(attempts)",
    }
    arguments = []
    for field in _FIELDS:
        if field.name in LOAD_COLUMNS:
            arguments.append(converted.get(field.name, field.name))
        else:
            scope[f"_default_{field.name}"] = field.default
            arguments.append(f"_default_{field.name}")
    # What an `Ended` holds, converted the same way (the nine fields it has are loaded ones).
    ended = [converted.get(name, name) for name in Ended._fields]
    source = "\n".join(
        [
            "def jobs_from_packed(found, compact=False):",
            "    loaded = []",
            "    append = loaded.append",
            f"    for {', '.join(LOAD_COLUMNS)}, rare in found:",
            "        if rare is None:",
            "            if compact and attempts is None and status in _FINAL_CODES:",
            f"                append(Ended({', '.join(ended)}))",
            "            else:",
            f"                append(Job({', '.join(arguments)}))",
            "        else:",
            f"            append(_unpacked(({', '.join(LOAD_COLUMNS)}), rare))",
            "    return loaded",
        ]
    )
    exec(source, scope)  # our own text, made from the declaration
    return scope["jobs_from_packed"]  # type: ignore[no-any-return]


def _unpacked(loaded: tuple[Any, ...], rare: str) -> Job:
    # A row that sets a rare field: its whole row, through `from_row`.
    values = (*loaded, *orjson.loads(rare))
    return from_row([values[index] for index in _UNPACK])


def problem(row: Sequence[Any]) -> str | None:
    """Why `from_row` cannot make a job of this row (values in `COLUMNS` order; text may come
    as undecoded bytes), or None when it can. Slow, for naming the culprit once a load failed."""
    values = []
    for name, value in zip(COLUMNS, row, strict=True):
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as exc:
                return f"{name} is not valid UTF-8 (byte {exc.start} of {len(value)})"
        if name in _JSON and value is not None:
            try:
                orjson.loads(value)
            except orjson.JSONDecodeError as exc:
                return f"{name} is not valid JSON ({exc})"
        if name in _ENUMS and value is not None and value not in _ENUMS[name]:
            return f"{name} {_short(value)} is none of {', '.join(_ENUMS[name])}"
        values.append(value)
    try:
        from_row(values)
    except Exception as exc:
        return f"its values do not make a job ({type(exc).__name__}: {_short(str(exc))})"
    return None


_ENUMS = {column: tuple(members) for column, members in _MEMBERS.items()}  # reason: or NULL


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _env_vars_text(value: dict[str, str] | None) -> str | None:
    return orjson.dumps(value).decode() if value else None


def _attempts_text(value: Sequence[Attempt]) -> str | None:
    if not value:
        return None
    return orjson.dumps(
        [
            {key: v for key, v in dataclasses.asdict(attempt).items() if key not in _OUTPUT}
            for attempt in value
        ]
    ).decode()


def _list_text(value: Sequence[object]) -> str | None:
    return orjson.dumps(list(value)).decode() if value else None


def _usage_text(value: Usage | None) -> str | None:
    return orjson.dumps(value.to_wire()).decode() if value is not None else None


_JSON_TEXT: dict[str, Callable[[Any], str | None]] = {
    "env_vars": _env_vars_text,
    "attempts": _attempts_text,
    "depends_on": _list_text,
    "node_selector": _env_vars_text,  # a string map, as the environment
    "node_ids": _list_text,
    "usage": _usage_text,
}
"""The columns SQL has no type for, stored as JSON text (NULL when empty), and how."""
_JSON = frozenset(_JSON_TEXT)


def _enum_value(value: Enum | None) -> object:
    return value.value if value is not None else None


def _flag(value: bool) -> int:
    return int(value)  # a flag is 0 or 1: SQLite has no boolean, PostgreSQL's is BIGINT


def _encoder(name: str, declared: Any) -> Callable[[Any], object] | None:
    """How a column's value is stored, from its field's declared type; None: as it is."""
    if name in _JSON_TEXT:
        return _JSON_TEXT[name]
    kinds = typing.get_args(declared) or (declared,)
    if any(isinstance(kind, type) and issubclass(kind, Enum) for kind in kinds):
        return _enum_value
    if bool in kinds:
        return _flag
    return None


# Every submission and report writes a row: the plain values are read in one call, and only
# the few columns that need it are converted.
_COLUMN_VALUES = operator.attrgetter(*COLUMNS)
_DECLARED = typing.get_type_hints(Job)
_ENCODERS = tuple(
    (index, encode)
    for index, name in enumerate(COLUMNS)
    if (encode := _encoder(name, _DECLARED[name])) is not None
)


def _attempts(text: str) -> tuple[Attempt, ...]:
    return tuple(_attempt(item) for item in orjson.loads(text))


def _attempt(item: Any) -> Attempt:
    # Stored by name, without the output (schema version 4 moved it to rows of its own, and
    # rewrote the oldest files' attempts, lists in the declaration's order, as objects).
    if not isinstance(item, dict):
        raise TypeError(f"an attempt is stored as an object, not as {type(item).__name__}")
    fields = {name: item.get(name, "" if name in _OUTPUT else None) for name in _ATTEMPT_FIELDS}
    fields["usage"] = Usage.from_wire(fields["usage"])  # None for attempts stored before it
    return Attempt(**fields)


def schedule_to_row(schedule: Schedule) -> tuple[object, ...]:
    """The schedule's column values in `SCHEDULE_COLUMNS` order; its job is stored as the
    JSON object the API shows."""
    values = []
    for name in SCHEDULE_COLUMNS:
        value = getattr(schedule, name)
        if name == "job":
            value = orjson.dumps(validation.job_request_to_wire(value)).decode()
        elif isinstance(value, Enum):
            value = value.value
        elif isinstance(value, bool):
            value = int(value)
        values.append(value)
    return tuple(values)


def schedule_from_row(row: Sequence[Any]) -> Schedule:
    """A schedule from a row whose values come in `SCHEDULE_COLUMNS` order."""
    fields = dict(zip(SCHEDULE_COLUMNS, row, strict=True))
    # The job was checked when the schedule was made; reading it back checks it again, with
    # the same rules a POST /jobs body meets.
    fields["job"] = validation.job_request_from(orjson.loads(fields["job"]))
    fields["overlap"] = Overlap(fields["overlap"])
    fields["catch_up"] = bool(fields["catch_up"])
    fields["paused"] = bool(fields["paused"])
    return Schedule(**fields)


jobs_from_packed = _compile_load()
"""Jobs without their output from rows of `LOAD_COLUMNS` values followed by the
`RARE_COLUMNS` packed as a JSON array (NULL when all are at `stored_default`), in the rows'
order; exactly what `from_row` makes of the same jobs' full rows. With `compact`, a finished
job that sets none of the rare columns and has no earlier attempts comes as an `Ended`
(the start-up's: see `domain.compact`), whose `job()` is that Job."""
