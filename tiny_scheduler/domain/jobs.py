"""The Job: its fields, its JSON shape on the wire, and the state machine it moves through.

Jobs are treated as immutable values: a change makes a new `Job` with `evolve()`, and the job
table swaps it in. A reader that holds a `Job` therefore always sees one consistent version
and can serialize it without a lock. No I/O here: the store and the table own that.

A job's output (stdout and stderr of each attempt) can be megabytes; the table keeps every job
`without_output()` and the store keeps the output apart (`outputs()`), to be put back with
`with_output()` when a reply shows it.

The state machine lives only in this module: `pending → running → done | failed`, a cancel
(`pending → failed` with reason `cancelled`), the scheduler's own failures (timeout, lost node),
the retry of a failed attempt back to `pending`, a person's hold on a pending job (`hold`,
`release`: it stays pending but is not handed out), and the slot a timed-out attempt keeps until
its agent's late report. There are exactly four statuses, because every existing client waits
for `done` or `failed`; *why* a job failed for good is its `reason`, and what people read as its
state (`state_of`: `cancelled` and `timed out` apart from `failed`) is made of both.

Tests: `tests/test_jobs_model.py` (the state machine and the wire shape).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import operator
import time
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, NamedTuple

from . import states
from .limits import MAX_PRIORITY as MAX_PRIORITY  # the bounds people write, kept with the others
from .limits import MIN_PRIORITY as MIN_PRIORITY
from .queues import DEFAULT_QUEUE
from .states import CANCEL, JOB_ID_PREFIX, TIMED_OUT
from .states import state_of as state_of  # the state people read: defined there, read here too


class WireEnum(str, Enum):
    """A string enum whose members print and format as their plain value (the wire form): the
    base of every enum that goes on the wire, the schedules' ones too."""

    __str__ = str.__str__
    __format__ = str.__format__


class Status(WireEnum):
    """A job's status. A typo in a member name is an AttributeError, not a silent miss."""

    PENDING = states.PENDING
    RUNNING = states.RUNNING
    DONE = states.DONE
    FAILED = states.FAILED


class Reason(WireEnum):
    """Why a job is `failed` for good (set only on a failure that will not be retried)."""

    EXIT = "exit"  # a non-zero exit, or an error the agent reported before the command ran
    TIMEOUT = states.TIMEOUT
    NODE_LOST = "node_lost"
    CANCELLED = states.CANCELLED
    DEPENDENCY_FAILED = "dependency_failed"  # a job it depends on (`ok`) failed for good
    OUT_OF_MEMORY = "out_of_memory"  # its node's agent saw it killed for its memory limit


class Dependency(WireEnum):
    """How a job's dependencies must end before it is due (Slurm's afterok / afterany)."""

    OK = "ok"  # every one of them `done`
    ANY = "any"  # every one of them ended, whatever the status


class JobType(WireEnum):
    RUN = states.RUN
    SERVICE = states.SERVICE


PENDING, RUNNING, DONE, FAILED = Status
STATUSES = tuple(status.value for status in Status)
"""The statuses' wire names, in lifecycle order (for choices, filters and counts)."""
FINAL_STATUSES = frozenset((DONE, FAILED))

REASONS = tuple(reason.value for reason in Reason)
"""The reasons' wire names (for filters and metric labels)."""

RUN, SERVICE = JobType
JOB_TYPES = tuple(job_type.value for job_type in JobType)

# The statuses an update (PATCH) may ask for, and from which status each is allowed.
UPDATE_STATUSES = (RUNNING, DONE, FAILED)
_ALLOWED_FROM = {RUNNING: PENDING, DONE: RUNNING, FAILED: RUNNING}

DEFAULT_PRIORITY = 50

TIMED_OUT_STDERR = "job timed out"
NODE_LOST_STDERR = "node lost"
CANCELLED_STDERR = "job cancelled"
OUT_OF_MEMORY_STDERR = "job killed: out of memory"
"""The last stderr line of an attempt its node killed for its memory limit."""
LOST_BY_AGENT = "lost by its agent"
"""The stderr of an attempt failed because its own agent's reports show it runs it no more."""

# The stderr the scheduler writes when it ends an attempt itself (exit code -1).
_SCHEDULER_STDERR = {
    Reason.TIMEOUT: TIMED_OUT_STDERR,
    Reason.NODE_LOST: NODE_LOST_STDERR,
    Reason.CANCELLED: CANCELLED_STDERR,
}

SCHEDULER_NOTES = frozenset((TIMED_OUT_STDERR, NODE_LOST_STDERR, CANCELLED_STDERR, LOST_BY_AGENT))
"""The lines the scheduler adds as the last of stderr when it ends an attempt itself."""

# How a field appears in the Job's JSON object (the `wire` metadata of each field below).
ALWAYS = "always"  # always present, even when empty
OPTIONAL = "optional"  # left out when empty (see _empty)
DETAIL = "detail"  # only in GET /jobs/{id}, and left out when empty
HIDDEN = "hidden"  # never on the wire


def _field(wire: str, default: Any = dataclasses.MISSING, **meta: Any) -> Any:
    return dataclasses.field(default=default, metadata={"wire": wire, **meta})


class Output(NamedTuple):
    """What one attempt printed."""

    stdout: str
    stderr: str


_NO_OUTPUT = Output("", "")


@dataclasses.dataclass(frozen=True, slots=True)
class Usage:
    """What one attempt used, as its agent measured it (Slurm's `sacct` TotalCPU, MaxRSS and
    Elapsed): CPU seconds (user + system), the peak resident memory in MiB, wall seconds."""

    cpu_secs: float
    max_rss_mb: float
    wall_secs: float

    def to_wire(self) -> dict[str, float]:
        return {
            "cpu_secs": self.cpu_secs,
            "max_rss_mb": self.max_rss_mb,
            "wall_secs": self.wall_secs,
        }

    @classmethod
    def from_wire(cls, value: Any) -> Usage | None:
        """The usage a report (or a stored attempt) carries; None for anything malformed (a
        bad `usage` is dropped, never a reason to refuse a final report)."""
        if not isinstance(value, dict):
            return None
        numbers = []
        for name in ("cpu_secs", "max_rss_mb", "wall_secs"):
            number = value.get(name)
            if isinstance(number, bool) or not isinstance(number, int | float):
                return None
            if not 0 <= number < 1e15:  # also refuses NaN
                return None
            numbers.append(round(float(number), 3))
        return cls(*numbers)


class TransitionError(Exception):
    """The job's current status does not allow the requested change (HTTP 409)."""

    def __init__(self, job: Job, wanted: str) -> None:
        self.current = job.status
        self.wanted = wanted
        # A held job is pending, but it is its hold that stops it: say so.
        state = "held" if job.held and job.status == PENDING else job.status
        super().__init__(f"job {job.job_id} is {state}, cannot become {wanted}")


@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    """One earlier failed attempt of a job that was retried."""

    node_id: str
    exit_code: int | None
    stdout: str
    stderr: str
    running_at: int | None
    finished_at: int | None
    usage: Usage | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node_id": self.node_id}
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        if self.stdout:
            out["stdout"] = self.stdout
        if self.stderr:
            out["stderr"] = self.stderr
        if self.running_at is not None:
            out["running_at"] = format_time(self.running_at)
        if self.finished_at is not None:
            out["finished_at"] = format_time(self.finished_at)
        if self.usage is not None:
            out["usage"] = self.usage.to_wire()
        return out

    def with_output(self, output: Output) -> Attempt:
        return dataclasses.replace(self, stdout=output.stdout, stderr=output.stderr)


@dataclasses.dataclass(slots=True)
class Job:
    """A job as the scheduler keeps it. Times are integer microseconds since the epoch.

    **The one declaration of a job's fields.** Their order is the spec's wire order; the
    `wire` metadata says how each appears in the JSON object (`to_wire`), and the store derives
    its columns and row mapping from the same list (`storage.rows`, `storage.schema`). Adding a
    field is this declaration (with a default) and its validation: both stores add its column.

    Treated as immutable (see the module docstring); not frozen only because a frozen
    dataclass is several times slower to build, which shows when a million jobs load.
    """

    seq: int = _field(ALWAYS, wire_name="job_id")  # N of job-N
    node_id: str = _field(ALWAYS)
    instance_id: str = _field(OPTIONAL, "")
    command: str = _field(ALWAYS, "")
    deploy_url: str = _field(OPTIONAL, "")
    job_type: JobType = _field(ALWAYS, RUN)
    port: int = _field(OPTIONAL, 0)
    env_vars: dict[str, str] | None = _field(OPTIONAL, None)
    timeout_secs: int = _field(OPTIONAL, 0)
    not_before: int | None = _field(OPTIONAL, None, time=True)  # a delayed job's due time
    schedule_id: str = _field(OPTIONAL, "")  # the schedule whose fire created the job
    # Workflows (issue 25): the jobs (by seq) that must end first and how, the priority among
    # due jobs (higher first) and the queue. Left out of the wire at their defaults, so a job
    # that uses none of them looks exactly as it did before.
    depends_on: tuple[int, ...] = _field(OPTIONAL, ())
    dependency: Dependency = _field(OPTIONAL, Dependency.OK)
    priority: int = _field(OPTIONAL, DEFAULT_PRIORITY)
    queue: str = _field(OPTIONAL, DEFAULT_QUEUE)
    status: Status = _field(ALWAYS, PENDING)
    reason: Reason | None = _field(OPTIONAL, None)  # only on a failure that is final
    retry_count: int = _field(ALWAYS, 0)
    exit_code: int | None = _field(OPTIONAL, None)
    stdout: str = _field(OPTIONAL, "", output=True)  # kept by the store apart from the job
    stderr: str = _field(OPTIONAL, "", output=True)
    created_at: int = _field(ALWAYS, 0, time=True)  # set by the service when it creates one
    running_at: int | None = _field(OPTIONAL, None, time=True)
    finished_at: int | None = _field(OPTIONAL, None, time=True)
    # Round four: fields after finished_at and before attempts (the spec's rule for new ones),
    # each left out of the wire while unset, so a job that uses none looks as it did before.
    name: str = _field(OPTIONAL, "")  # a name people give it (Slurm's -J)
    owner: str = _field(OPTIONAL, "")  # the user whose token submitted it ("" for the key)
    # What it needs (see `fit`): CPUs (0: unset, which counts as 1), memory (MiB, 0: none),
    # GPUs, the labels its node must have, and the only nodes it may run on.
    cpus: int = _field(OPTIONAL, 0)
    memory_mb: int = _field(OPTIONAL, 0)
    gpus: int = _field(OPTIONAL, 0)
    node_selector: dict[str, str] | None = _field(OPTIONAL, None)
    node_ids: tuple[str, ...] = _field(OPTIONAL, ())
    max_retries: int | None = _field(OPTIONAL, None)  # None: MAX_JOB_RETRIES
    array_id: int = _field(OPTIONAL, 0, job=True)  # seq of the array's first job (0: none)
    array_index: int | None = _field(OPTIONAL, None)  # its place in the array, from 0
    held: bool = _field(OPTIONAL, False)  # held by a person: pending, but not handed out
    retry_of: int = _field(OPTIONAL, 0, job=True)  # seq of the job it retries as a new job
    usage: Usage | None = _field(OPTIONAL, None)  # what its latest finished attempt used
    attempts: tuple[Attempt, ...] = _field(DETAIL, ())
    # Where the job came from, for deduplication (an Idempotency-Key or an SQS message).
    dedupe_key: str | None = _field(HIDDEN, None)
    # An attempt the scheduler ended while it ran (timed out, cancelled) whose process may
    # still be running on its node: it is in the node's stop orders, and a `run` job keeps
    # its slot, until the agent's late report arrives or the node counts as lost.
    holds_slot: bool = _field(HIDDEN, False)
    # The node the job was last moved away from while it waited (stolen by an idle node, or
    # taken off a lost one); cleared when it is placed afresh for a retry. For the job page.
    moved_from: str = _field(HIDDEN, "")
    # The current attempt was claimed by a report that named it (`node_id` and `attempt`, this
    # project's agent): it takes only reports that name it too (`fencing.stale_report`).
    named_claim: bool = _field(HIDDEN, False)
    # The current attempt was claimed by a request that carried a credential (with auth on):
    # a keyless report, which the agent exemption lets through, is then refused for it.
    keyed_claim: bool = _field(HIDDEN, False)

    @property
    def job_id(self) -> str:
        return job_id_of(self.seq)

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES

    def is_due(self, now: int) -> bool:
        """Whether an agent may be handed this job at `now` (a delayed job waits until its
        `not_before`)."""
        return self.not_before is None or self.not_before <= now

    @property
    def takes_slot(self) -> bool:
        """Whether this job, while running, counts against its node's MAX_JOBS_PER_NODE."""
        return self.job_type != SERVICE

    @property
    def uses_slot(self) -> bool:
        """Whether this job occupies one of its node's slots now: a running `run` job, or a
        timed-out one whose process may still be running there."""
        return self.takes_slot and (self.status == RUNNING or self.holds_slot)

    def evolve(self, **changes: Any) -> Job:
        """A new version of the job with `changes` (field names and values)."""
        # What dataclasses.replace does, without looking the fields up again on every change
        # of every job: each claim and report makes a version.
        values = list(_FIELD_VALUES(self))
        for name, value in changes.items():
            values[_FIELD_INDEX[name]] = value
        return Job(*values)

    def outputs(self) -> dict[int, Output]:
        """The output this version carries, by attempt number (0 for the first attempt,
        `retry_count` for the current one), attempts that printed nothing left out."""
        found = {
            number: Output(attempt.stdout, attempt.stderr)
            for number, attempt in enumerate(self.attempts)
            if attempt.stdout or attempt.stderr
        }
        if self.stdout or self.stderr:
            found[self.retry_count] = Output(self.stdout, self.stderr)
        return found

    def without_output(self) -> Job:
        """This version without any output, here or in its attempts: as the job table keeps
        it (the store has the output). The job itself when it carries none."""
        if not (self.stdout or self.stderr or any(a.stdout or a.stderr for a in self.attempts)):
            return self
        return self.evolve(
            stdout="",
            stderr="",
            attempts=tuple(attempt.with_output(_NO_OUTPUT) for attempt in self.attempts),
        )

    def with_output(self, outputs: Mapping[int, Output]) -> Job:
        """This version (without output) with its attempts' stored `outputs` put back, by
        attempt number. Only a finished attempt has output, so a job that is not final shows
        none of its own, even where the store is already a version ahead."""
        attempts = tuple(
            attempt.with_output(outputs[number]) if number in outputs else attempt
            for number, attempt in enumerate(self.attempts)
        )
        current = outputs.get(self.retry_count) if self.is_final else None
        if current is None:
            return self.evolve(attempts=attempts) if attempts != self.attempts else self
        return self.evolve(stdout=current.stdout, stderr=current.stderr, attempts=attempts)

    def to_wire(self, with_attempts: bool = False) -> dict[str, Any]:
        """The job's JSON object: fields in the declaration's (the spec's) order, empty
        optional fields left out.

        The real agent rejects a whole poll reply if one field is `null`, so no value here is
        ever None. (The body is generated from the declaration below: see `_compile_to_wire`.)
        """
        raise NotImplementedError  # replaced at import time


_FIELD_NAMES = tuple(field.name for field in dataclasses.fields(Job))
_FIELD_VALUES = operator.attrgetter(*_FIELD_NAMES)  # every field's value, in one call
_FIELD_INDEX = {name: index for index, name in enumerate(_FIELD_NAMES)}


# --- the state machine -------------------------------------------------------------------


def check_update(job: Job, status: str) -> None:
    """Raise TransitionError unless an update to `status` is allowed from the job's status.

    `pending → running` is the one claim of a job; a finished job never runs again.
    """
    if _ALLOWED_FROM.get(status) != job.status:
        raise TransitionError(job, status)


def start(job: Job, now: int, named: bool = False, keyed: bool = False) -> Job:
    """The claim. `named`: the claim named its attempt (node and attempt number), so the
    attempt takes only reports that name it too; `keyed`: it carried a credential, so the
    attempt takes no keyless report (`fencing.keyless_report_refused`). A held job is never
    handed out; an agent that was handed it before the hold and claims it now is refused."""
    check_update(job, RUNNING)
    if job.held:
        raise TransitionError(job, RUNNING)
    return job.evolve(status=RUNNING, running_at=now, named_claim=named, keyed_claim=keyed)


def finish(
    job: Job,
    status: str,
    exit_code: int | None,
    stdout: str,
    stderr: str,
    now: int,
    reason: Reason = Reason.EXIT,
    usage: Usage | None = None,
) -> Job:
    """End the running attempt as done or failed (before any retry decision). A failure
    carries `reason` until a retry takes the job back to pending; `usage` is what the
    attempt used, when its agent measured it."""
    check_update(job, status)
    return job.evolve(
        status=status,
        reason=reason if status == FAILED else None,
        exit_code=exit_code,
        stdout=stdout or job.stdout,
        stderr=stderr or job.stderr,
        finished_at=now,
        usage=usage,
    )


def fail_by_scheduler(
    job: Job, reason: Reason, now: int, stderr: str | None = None, live: Output = _NO_OUTPUT
) -> Job:
    """End the running attempt from the scheduler's side (`timeout` or `node_lost`): exit -1,
    the output it printed so far (`live`) kept, and `stderr` as the last line of its stderr, by
    default the reason's fixed text. A timed-out attempt's process goes on until its agent
    stops it (see `is_late_report`): it keeps its slot meanwhile."""
    text = _SCHEDULER_STDERR[reason] if stderr is None else stderr
    ended = ended_output(live, text)
    failed = finish(job, FAILED, -1, ended.stdout, ended.stderr, now, reason)
    if reason == Reason.TIMEOUT and job.takes_slot:
        failed = failed.evolve(holds_slot=True)
    return failed


def is_late_report(job: Job, status: str) -> bool:
    """Whether a `done`/`failed` report is the late end of an attempt the scheduler already
    ended while it ran (timed out, cancelled while running, or lost with its node for good).
    It is answered 200 with the job's state unchanged (the scheduler's end is final); its
    output is kept on the attempt (`late_output`), and it frees the slot the attempt kept
    (`release_slot`)."""
    if status not in (DONE, FAILED) or job.status != FAILED or job.running_at is None:
        return False
    return job.reason in (Reason.TIMEOUT, Reason.CANCELLED, Reason.NODE_LOST)


def ended_by_report(job: Job) -> bool:
    """Whether the job's attempt was ended by its node's report (done, or failed by its
    exit or its memory limit) and its process is over as far as the scheduler knows: not an
    end the scheduler made itself (timed out, cancelled, lost), whose process may still run."""
    if job.holds_slot:
        return False
    return job.status == DONE or (
        job.status == FAILED and job.reason in (Reason.EXIT, Reason.OUT_OF_MEMORY)
    )


def release_slot(job: Job) -> Job:
    """The timed-out attempt's process is over (late report) or gone (lost node)."""
    return job.evolve(holds_slot=False)


def should_retry(job: Job, default_max_retries: int) -> bool:
    """A failed attempt goes back to pending while retries are left (the job's own
    `max_retries`, else MAX_JOB_RETRIES), unless it timed out (a timeout is final: the same
    command would most likely time out again), ran out of memory (so would it) or was
    cancelled."""
    limit = default_max_retries if job.max_retries is None else job.max_retries
    return job.status == FAILED and job.reason in _RETRIED_REASONS and job.retry_count < limit


_RETRIED_REASONS = frozenset((Reason.EXIT, Reason.NODE_LOST))


def retry(job: Job, node_id: str) -> Job:
    """Record the failed attempt and put the job back to pending on `node_id`."""
    attempt = Attempt(
        node_id=job.node_id,
        exit_code=job.exit_code,
        stdout=job.stdout,
        stderr=job.stderr,
        running_at=job.running_at,
        finished_at=job.finished_at,
        usage=job.usage,
    )
    return job.evolve(
        status=PENDING,
        reason=None,
        node_id=node_id,
        moved_from="",
        named_claim=False,
        keyed_claim=False,
        retry_count=job.retry_count + 1,
        exit_code=None,
        stdout="",
        stderr="",
        running_at=None,
        finished_at=None,
        usage=None,
        attempts=(*job.attempts, attempt),
    )


def can_cancel(job: Job) -> bool:
    """A job that has not ended can be cancelled: a pending one, or a running one (its agent
    is told to stop it)."""
    return job.status in (PENDING, RUNNING)


def cancel(job: Job, now: int, live: Output = _NO_OUTPUT) -> Job:
    """A cancelled job ends as a failure every existing client understands: `failed`, reason
    `cancelled`, exit -1, stderr `job cancelled` (after what a running one printed so far,
    `live`); it is never retried. A running one keeps its process on the node until its agent
    stops it and reports (`holds_slot`)."""
    if not can_cancel(job):
        raise TransitionError(job, CANCEL)
    ended = ended_output(live, CANCELLED_STDERR)
    return job.evolve(
        status=FAILED,
        reason=Reason.CANCELLED,
        exit_code=-1,
        stdout=ended.stdout,
        stderr=ended.stderr,
        finished_at=now,
        holds_slot=job.status == RUNNING,
    )


def hold(job: Job) -> Job:
    """A person holds a pending job (Slurm's `scontrol hold`): it stays pending, but is not
    handed out, moved or counted as load until released. Holding a held job changes nothing.
    NotPending for a job that is not pending."""
    if job.status != PENDING:
        raise NotPending(job)
    return job if job.held else job.evolve(held=True)


def release(job: Job) -> Job:
    """The hold ends: the job waits like any other pending job again. Releasing a job that is
    not held changes nothing; NotPending for a job that is not pending."""
    if job.status != PENDING:
        raise NotPending(job)
    return job.evolve(held=False) if job.held else job


class NotPending(Exception):
    """Only a pending job can be held or released (HTTP 409 `job is not pending`)."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"job {job.job_id} is {job.status}")
        self.job = job


def can_retry_as_new(job: Job) -> bool:
    """Whether a job may be submitted again as a new job (`POST /jobs/{id}/retry`): only one
    that has ended; one still waiting or running is still itself."""
    return job.is_final


def can_move(job: Job) -> bool:
    """Whether a waiting job may be handed to another node by an idle node's poll: a pending
    `run` job not pinned to an instance (its instance lives on its node; a service belongs
    where it was placed, under its port)."""
    return job.status == PENDING and job.job_type == RUN and not job.instance_id


def run_deadline(job: Job, default_timeout_secs: int) -> int | None:
    """When a running `run` job times out, in microseconds; None for services."""
    if job.running_at is None:
        return None
    return deadline_from(job, job.running_at, default_timeout_secs)


def deadline_from(job: Job, start: int, default_timeout_secs: int) -> int | None:
    """When the job times out if it starts at `start` (microseconds); None for a service,
    which never ends by itself."""
    if job.job_type == SERVICE:
        return None
    timeout = job.timeout_secs or default_timeout_secs
    return start + timeout * 1_000_000


# --- the state people read ----------------------------------------------------------------

STATES = (*STATUSES, CANCEL, TIMED_OUT)
"""What people read as a job's state, in the order the dashboard counts them: the four
statuses, and the two ways of ending `failed` that are nobody's failure to fix in the job
itself (Slurm's CANCELLED and TIMEOUT). The wire status of those stays `failed`."""

STATE_REASONS = {state: reason for reason, state in states.STATE_OF_REASON.items()}
"""The reason each state apart from `failed` stands for (a filter by state is a filter by
status `failed` and that reason)."""


# --- ids, times and output ------------------------------------------------------------------


def job_id_of(seq: int) -> str:
    """The `job-N` id of sequence number N."""
    return f"{JOB_ID_PREFIX}{seq}"


def parse_job_id(job_id: str) -> int | None:
    """The sequence number of a `job-N` id, or None when the text is not a canonical id."""
    if not job_id.startswith(JOB_ID_PREFIX):
        return None
    digits = job_id[len(JOB_ID_PREFIX) :]
    if not digits.isascii() or not digits.isdigit() or digits[0] == "0" or len(digits) > 18:
        return None
    return int(digits)


def format_time(us: int) -> str:
    """RFC 3339 in UTC with microseconds and a Z, e.g. 2026-11-30T10:20:30.123456Z."""
    seconds, micros = divmod(us, 1_000_000)
    return f"{_second(seconds)}.{micros:06d}Z"


@functools.lru_cache(maxsize=4096)
def _second(seconds: int) -> str:
    # Jobs of one listing share few distinct seconds: format each second once.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def parse_time(text: str) -> int:
    """Inverse of format_time (also accepts offsets and fewer fraction digits)."""
    moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    delta = moment - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    return delta // datetime.timedelta(microseconds=1)


def with_last_line(text: str, line: str) -> str:
    """`text` with `line` as its last line (once: a text that ends with it already is kept)."""
    if not text:
        return line
    if text.rstrip("\n").rpartition("\n")[2] == line:
        return text
    separator = "" if text.endswith("\n") else "\n"
    return f"{text}{separator}{line}"


def ended_output(live: Output, note: str) -> Output:
    """The output of an attempt the scheduler ended while it ran: what it printed so far (its
    live output), and the scheduler's note as the last line of stderr."""
    return Output(live.stdout, with_last_line(live.stderr, note))


def late_output(stored: Output, report: Output) -> Output:
    """An ended attempt's output once its agent's own report of it arrives after the end (a
    late or stale report): the report's text, which holds all the attempt printed (what came
    live too), with the scheduler's note, if it wrote one, still the last line of stderr."""
    head, _, last = stored.stderr.rpartition("\n")
    note = last if last in SCHEDULER_NOTES else ""
    before_note = head if note else stored.stderr
    stdout = report.stdout or stored.stdout
    stderr = report.stderr or before_note
    return Output(stdout, with_last_line(stderr, note) if note else stderr)


def cap_output(text: str, max_bytes: int) -> str:
    """Keep at most `max_bytes` UTF-8 bytes of output: the tail, behind a marker line."""
    if len(text) * 4 <= max_bytes:  # no encoding needed: cannot be over the cap
        return text
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    return cap_tail(data[len(data) - max_bytes :], len(data), max_bytes)


def cap_tail(tail: bytes, total: int, max_bytes: int) -> str:
    """What `cap_output` makes of an output of `total` UTF-8 bytes (more than `max_bytes`)
    that ends with `tail` (its last `max_bytes` bytes); for outputs read as a stream, whose
    whole text is never held."""
    # The marker's length depends on the count it prints: shrink the tail until both agree.
    keep = max_bytes
    while True:
        marker = f"[tiny-scheduler: output truncated, {total - keep} earlier bytes dropped]\n"
        fits = max_bytes - len(marker.encode())
        if fits == keep:
            break
        keep = fits
    # A character split by the cut is dropped. Decoded in one go with the (ASCII) marker: the
    # text can be megabytes, and joining two strings would copy it once more.
    return (marker.encode() + tail[len(tail) - keep :]).decode("utf-8", "ignore")


# --- the wire shape, derived from the declaration ----------------------------------------


def _compile_to_wire() -> Callable[..., dict[str, Any]]:
    """`Job.to_wire`, written out from the field declaration once, at import.

    A loop over the fields would do the same, at twice the cost per job; every poll and
    listing pays it for every job, so the loop is unrolled the way `dataclasses` writes its
    own methods. The rule per field: ALWAYS fields are always set; OPTIONAL ones are left
    out when empty (None, empty text or container, a number equal to its default — so an
    exit code of 0, whose default is None, is shown); DETAIL ones only `with_attempts`.
    """
    scope: dict[str, Any] = {}
    lines = ["def to_wire(self, with_attempts=False):", "    out = {}"]
    for field in dataclasses.fields(Job):
        wire = field.metadata["wire"]
        if wire == HIDDEN:
            continue
        key = field.metadata.get("wire_name", field.name)
        encode = _wire_encoder(field)
        value = f"self.{field.name}"
        if encode is not None:
            scope[f"_encode_{field.name}"] = encode
        encoded = f"_encode_{field.name}({value})" if encode is not None else value
        if wire == ALWAYS:
            lines.append(f"    out[{key!r}] = {encoded}")
            continue
        if field.default is None and field.type == "int | None":
            test = f"{value} is not None"
        elif isinstance(field.default, int) and field.default is not None:
            test = f"{value} != {field.default!r}"
        elif isinstance(field.default, str) and field.default:
            test = f"{value} != {str.__str__(field.default)!r}"  # a text with a default
        else:
            test = value
        if wire == DETAIL:
            test = f"with_attempts and {test}"
        lines.append(f"    if {test}:")
        lines.append(f"        out[{key!r}] = {encoded}")
    lines.append("    return out")
    exec("\n".join(lines), scope)  # the source is built above from the declaration only
    to_wire = scope["to_wire"]
    to_wire.__doc__ = Job.to_wire.__doc__
    to_wire.__qualname__ = "Job.to_wire"
    return to_wire


def _empty(value: Any, default: Any) -> bool:
    """None, empty text or containers, and a number equal to its default are left out (an
    exit code of 0 is shown: its default is None)."""
    if isinstance(value, int) or (isinstance(default, str) and default):
        return value == default
    return not value


def _wire_encoder(field: dataclasses.Field) -> Callable[[Any], Any] | None:
    if field.name == "seq":
        return job_id_of
    if field.metadata.get("time"):
        return format_time
    if field.name == "attempts":
        return lambda attempts: [attempt.to_wire() for attempt in attempts]
    if field.name == "depends_on":
        return lambda seqs: [job_id_of(seq) for seq in seqs]
    if field.metadata.get("job"):  # another job's seq, shown as its id
        return job_id_of
    if field.name == "node_ids":
        return list
    if field.name == "usage":
        return Usage.to_wire
    return None


_WIRE_FIELDS = tuple(
    (
        field.name,
        field.metadata.get("wire_name", field.name),
        field.metadata["wire"],
        field.default,
        _wire_encoder(field),
    )
    for field in dataclasses.fields(Job)
    if field.metadata["wire"] != HIDDEN
)
WIRE_ORDER = tuple(key for _, key, *_rest in _WIRE_FIELDS)
"""The JSON object's keys in the spec's order (attempts last, only in GET /jobs/{id})."""

Job.to_wire = _compile_to_wire()  # type: ignore[method-assign]
