"""Schedules: their fields and JSON shape, the checks of a schedule request, the fire times of a
cron expression in a time zone, and what one look at a due schedule decides (`plan`).

Fire times come from cronsim (the cron library) evaluated on the *wall clock* of the schedule's
time zone; this module maps each wall-clock time to an instant with the spec's daylight-saving
rule: a time that does not exist that day (the hour skipped in spring) does not fire, and a
time that exists twice (the hour repeated in autumn) fires once, at its first occurrence.

No I/O and no clock here: every function is given the time it should think it is, so the
firing rules can be tested at any moment of any year. The service commits what `plan` decides;
the loop in `loops/schedules.py` decides when to look.

Tests: `tests/test_schedule_times.py`, `tests/test_schedule_firing.py`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import re
from collections.abc import Iterator
from importlib import resources
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .. import errors
from . import jobs, validation
from .validation import JobRequest

SCHEDULE_ID_PREFIX = "sched-"

DEFAULT_TIMEZONE = "UTC"

MAX_NAME_LENGTH = 100
"""Characters a schedule's name may have."""

MISSED_LISTED = 10_000
"""Missed fire times walked one by one after an outage; beyond that the latest one is found
directly and the rest only counted as "more" (an every-minute schedule down for a year would
otherwise cost seconds of cron arithmetic)."""

ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
}
"""The shorthands the spec allows, as the five-field expressions cron defines them to be."""

_NAME = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_NAME_LENGTH}}}")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_SECOND = datetime.timedelta(seconds=1)

CRON_MESSAGE = (
    "cron must be five fields (minute hour day-of-month month day-of-week) "
    "or one of @hourly, @daily, @weekly, @monthly, @yearly"
)
NAME_MESSAGE = f"name must be 1 to {MAX_NAME_LENGTH} characters of A-Z a-z 0-9 . _ -"
TIMEZONE_MESSAGE = "timezone must be an IANA time zone name such as Europe/Berlin or UTC"
OVERLAP_MESSAGE = "overlap must be skip or allow"
JOB_MESSAGE = "job must be an object: the job to submit, as for POST /jobs"


class Overlap(jobs.WireEnum):
    """What a fire does while the schedule's previous job is still pending or running."""

    SKIP = "skip"
    ALLOW = "allow"


class SkipCause(jobs.WireEnum):
    """Why a fire time passed without a job (the metrics' label, the log's words)."""

    OVERLAP = "overlap"  # the previous job was still pending or running
    MISSED = "missed"  # no scheduler ran at the time (and catch_up is off, or a later one ran)
    PLACEMENT = "placement"  # no node could take the job until the next fire time
    STORE = "store"  # the store could not commit the fire until the next fire time


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule as the scheduler keeps it; times are integer microseconds since the epoch.

    The one declaration of a schedule's fields, in the wire order (`to_wire`); the store
    derives its columns from it (`storage.rows`). `next_run_at` is the oldest fire time not yet
    handled: a fire, or a skip, moves it on in the same commit.
    """

    seq: int  # N of sched-N
    name: str
    cron: str
    timezone: str
    job: JobRequest
    overlap: Overlap
    catch_up: bool
    paused: bool
    created_at: int
    next_run_at: int | None = None  # None: the expression matches no later time
    last_run_at: int | None = None  # the fire time of the last job it created
    last_job_seq: int | None = None  # N of that job's job-N
    owner: str = ""  # the user whose token created it ("" for the shared key); its jobs' owner

    @property
    def schedule_id(self) -> str:
        return schedule_id_of(self.seq)

    @property
    def last_job_id(self) -> str | None:
        return jobs.job_id_of(self.last_job_seq) if self.last_job_seq is not None else None

    def evolve(self, **changes: Any) -> Schedule:
        return dataclasses.replace(self, **changes)

    def to_wire(self) -> dict[str, Any]:
        """The schedule's JSON object. A paused schedule has no next run: it is left out."""
        out: dict[str, Any] = {
            "schedule_id": self.schedule_id,
            "name": self.name,
            "cron": self.cron,
            "timezone": self.timezone,
            "job": validation.job_request_to_wire(self.job),
            "overlap": self.overlap,
            "catch_up": self.catch_up,
            "paused": self.paused,
            "created_at": jobs.format_time(self.created_at),
        }
        if self.next_run_at is not None and not self.paused:
            out["next_run_at"] = jobs.format_time(self.next_run_at)
        if self.last_run_at is not None:
            out["last_run_at"] = jobs.format_time(self.last_run_at)
        if self.last_job_seq is not None:
            out["last_job_id"] = self.last_job_id
        if self.owner:
            out["owner"] = self.owner
        return out


def schedule_id_of(seq: int) -> str:
    return f"{SCHEDULE_ID_PREFIX}{seq}"


def parse_schedule_id(text: str) -> int | None:
    """N of a canonical `sched-N`, or None."""
    digits = text.removeprefix(SCHEDULE_ID_PREFIX)
    if digits == text or not digits.isascii() or not digits.isdigit() or digits[0] == "0":
        return None
    return int(digits) if len(digits) <= 18 else None


def fire_key(schedule_seq: int, fire_at: int) -> str:
    """The dedupe key of the job a fire creates: the store keeps these unique, so one
    schedule and fire time can never have two jobs, whatever crashed in between."""
    return f"sched:{schedule_id_of(schedule_seq)}:{jobs.format_time(fire_at)}"


# --- requests ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleChange:
    """The fields a POST or PATCH gave, checked; None for a field it left out."""

    name: str | None = None
    cron: str | None = None
    timezone: str | None = None
    overlap: Overlap | None = None
    job: JobRequest | None = None
    catch_up: bool | None = None
    paused: bool | None = None

    def given(self) -> dict[str, Any]:
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if getattr(self, field.name) is not None
        }


def parse_schedule_request(body: bytes, partial: bool) -> ScheduleChange:
    """Check a POST /schedules body (`partial` False: name, cron and job required) or a
    PATCH body (any subset). Checks run in the spec's order, each message starting with the
    field's name; `job` is checked exactly like a POST /jobs body, with the same messages.
    Read-only fields (schedule_id, created_at, next_run_at, ...) are ignored like unknown
    ones, so a GET's object can be sent back as it is."""
    data = validation.decode_object(body, errors.DECODE_SCHEDULE)
    return ScheduleChange(
        name=_checked(data, "name", partial, _name),
        cron=_checked(data, "cron", partial, check_cron),
        timezone=_checked(data, "timezone", True, _timezone),
        overlap=_checked(data, "overlap", True, _overlap),
        job=_checked(data, "job", partial, _job),
        catch_up=_checked(data, "catch_up", True, _flag("catch_up")),
        paused=_checked(data, "paused", True, _flag("paused")),
    )


def _checked(data: dict[str, Any], field: str, optional: bool, check: Any) -> Any:
    value = data.get(field)
    if value is None:  # absent or null: the default (POST) or no change (PATCH)
        if optional:
            return None
        return check(None)  # the field's own message says what it must be
    return check(value)


def _name(value: Any) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise errors.BadRequest(NAME_MESSAGE)
    return value


def check_cron(value: Any) -> str:
    """A schedule's `cron` as stored (fields one space apart); BadRequest, starting with
    `cron`, saying what is wrong: the API's 400 and the command line's refusal."""
    if not isinstance(value, str):
        raise errors.BadRequest(CRON_MESSAGE)
    text = " ".join(value.split())  # one space between fields, none around
    expression = cron_expression(text)
    try:
        first = next(fire_times(expression, ZoneInfo("UTC"), 0), None)
    except CronSimError as exc:
        raise errors.BadRequest(_cronsim_error(text, str(exc))) from None
    if first is None:
        raise errors.BadRequest(f"cron {text} never fires: no date matches it")
    return text


def cron_expression(cron: str) -> str:
    """The five-field expression of a checked `cron` (an alias spelled out); BadRequest when
    it is neither five fields nor one of the aliases (cronsim would take six: seconds), with a
    message that says which field is wrong and what it may hold."""
    if cron.startswith("@"):
        if cron not in ALIASES:
            raise errors.BadRequest(
                f"cron {cron} is not supported: use five fields or one of {', '.join(ALIASES)}"
            )
        return ALIASES[cron]
    fields = cron.split()
    if len(fields) != len(CRON_FIELDS):
        raise errors.BadRequest(_field_count_error(len(fields)))
    if not cron.isascii():
        raise errors.BadRequest(CRON_MESSAGE)
    for (name, low, high), field in zip(CRON_FIELDS, fields, strict=True):
        problem = _field_error(field, low, high)
        if problem:
            raise errors.BadRequest(f"cron {name} {problem}")
    return cron


CRON_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),  # 0 and 7 are both Sunday, as in every cron
)
"""The five fields of a cron expression, in order, with the numbers each allows."""


def _field_count_error(count: int) -> str:
    text = (
        f"cron has {count} field{'s' if count != 1 else ''}; it needs five (minute hour"
        " day-of-month month day-of-week) or one of " + ", ".join(ALIASES)
    )
    if count == len(CRON_FIELDS) + 1:
        # The common six-field mistake: a seconds field, as Quartz and some cron libraries
        # (cronsim among them) take; a schedule fires on whole minutes.
        text += "; a sixth field (seconds) is not supported"
    return text


def _field_error(field: str, low: int, high: int) -> str:
    """What is wrong with the numbers of one field ('' when they are in range). Only numbers
    are judged here; names (mon, jan), L and # are left to cronsim."""
    for item in field.split(","):
        base, slash, step = item.partition("/")
        if slash and (not step.isdigit() or int(step) == 0):
            return f"step /{step} in {field} must be a whole number of at least 1"
        bounds = base.split("-")
        for bound in bounds:
            if bound.isdigit() and not low <= int(bound) <= high:
                return f"{bound} is out of range {low}-{high}"
        if (
            len(bounds) == 2
            and all(b.isdigit() for b in bounds)
            and int(bounds[0]) > int(bounds[1])
        ):
            return f"range {base} runs backwards: write the smaller number first"
    return ""


def _cronsim_error(text: str, error: str) -> str:
    """A cronsim refusal ("Bad day-of-month") as a message that says what to change."""
    name = error.removeprefix("Bad ").strip()
    fields = text.split()
    for number, (field_name, low, high) in enumerate(CRON_FIELDS):
        if field_name != name or len(fields) != len(CRON_FIELDS):
            continue
        if name == "day-of-month":
            # Its numbers were in range (checked before): the day exists in none of the
            # months the expression names.
            return (
                f"cron {text} never fires: day-of-month {fields[2]} does not exist"
                f" in month {fields[3]}"
            )
        return (
            f"cron {name} {fields[number]} is not valid: use numbers {low}-{high}, ranges"
            " (1-5), lists (1,3), steps (*/5) or names (mon, jan)"
        )
    return CRON_MESSAGE


def _timezone(value: Any) -> str:
    if not isinstance(value, str) or value not in _iana_names():
        raise errors.BadRequest(TIMEZONE_MESSAGE)
    try:
        zone(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise errors.BadRequest(TIMEZONE_MESSAGE) from None
    return value


@functools.cache
def _iana_names() -> frozenset[str]:
    # ZoneInfo alone would open any file under the system's zoneinfo folder, such as Debian's
    # "localtime" (whatever this machine's zone is); the names a schedule may use are the
    # database's own, which the tzdata package lists.
    return frozenset(resources.files("tzdata").joinpath("zones").read_text().split())


def zone(name: str) -> ZoneInfo:
    """The time zone of a checked name (ZoneInfo caches them)."""
    return ZoneInfo(name)


DEPENDS_ON_MESSAGE = "job.depends_on is not allowed in a schedule's job"
ARRAY_MESSAGE = "job.array is not allowed in a schedule's job"


def _overlap(value: Any) -> Overlap:
    if value not in ("skip", "allow"):
        raise errors.BadRequest(OVERLAP_MESSAGE)
    return Overlap(value)


def _job(value: Any) -> JobRequest:
    if not isinstance(value, dict):
        raise errors.BadRequest(JOB_MESSAGE)
    if value.get("depends_on") is not None:
        # A fire makes a new job each time: jobs named once cannot gate every run of it.
        raise errors.BadRequest(DEPENDS_ON_MESSAGE)
    if value.get("array") is not None:
        # A fire makes one job; a sweep at every fire is not what a schedule promises yet.
        raise errors.BadRequest(ARRAY_MESSAGE)
    return validation.job_request_from(value)


def _flag(field: str) -> Any:
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise errors.BadRequest(f"{field} must be true or false")
        return value

    return check


# --- fire times ------------------------------------------------------------------------------


def fire_times(expression: str, tz: ZoneInfo, after: int) -> Iterator[int]:
    """The fire times of a five-field cron `expression` in `tz` strictly after `after`, in
    order, as microseconds since the epoch (each at a whole minute).

    cronsim walks the wall clock; a wall-clock time that does not exist is left out, and one
    that exists twice gives its first instant only (the second pass of a repeated hour yields
    wall-clock times whose first instant is already past, so they are skipped here too).
    Ends when the expression matches nothing in the next 50 years (cronsim's horizon).
    Raises CronSimError for an expression cronsim refuses.
    """
    start = _wall_clock(after, tz)
    for wall in CronSim(expression, start):
        instant = _instant(wall, tz)
        if instant is not None and instant > after:
            yield instant


def next_fire(schedule: Schedule, after: int) -> int | None:
    """The schedule's first fire time strictly after `after`; None when there is none."""
    return next(fire_times(cron_expression(schedule.cron), zone(schedule.timezone), after), None)


def latest_fire(expression: str, tz: ZoneInfo, at: int) -> int | None:
    """The last fire time at or before `at`; None when there is none in 50 years."""
    # cronsim walks back from one second past the wall-clock time, so `at` itself counts.
    backwards = CronSim(expression, _wall_clock(at, tz) + _SECOND, reverse=True)
    found = None
    for wall in backwards:
        instant = _instant(wall, tz)
        if instant is not None and instant <= at:
            found = instant
            break
    if found is None:
        return None
    # Walking back from the second pass of a repeated hour passes over wall-clock times whose
    # (first) instant is still at or before `at`: a forward walk settles on the last of them.
    for instant in fire_times(expression, tz, found):
        if instant > at:
            break
        found = instant
    return found


def _wall_clock(us: int, tz: ZoneInfo) -> datetime.datetime:
    """The naive wall-clock time in `tz` at instant `us` (the microseconds dropped: cron
    has whole minutes)."""
    moment = _EPOCH + datetime.timedelta(microseconds=us)
    return moment.astimezone(tz).replace(tzinfo=None, microsecond=0)


def _instant(wall: datetime.datetime, tz: ZoneInfo) -> int | None:
    """The first instant at which the wall clock in `tz` shows `wall`; None when it never
    does (the hour skipped when clocks go forward)."""
    first = wall.replace(tzinfo=tz, fold=0)
    if first.astimezone(datetime.timezone.utc).astimezone(tz).replace(tzinfo=None) != wall:
        return None
    return (first - _EPOCH) // datetime.timedelta(microseconds=1)


# --- what one look at a schedule decides --------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """What to do about a schedule whose next fire time has come.

    `skipped` are fire times given up without a job and why: after a very long outage only the
    first MISSED_LISTED of the missed ones, and `skipped_more` says that more followed.
    `fire_at` is the fire time to submit a job for, if any (`catch_up` when it was missed while
    no scheduler ran). `latest` is the last fire time handled here; `cursor` the next fire time
    after it (the new `next_run_at`).
    """

    skipped: tuple[tuple[int, SkipCause], ...]
    skipped_more: bool
    fire_at: int | None
    catch_up: bool
    latest: int
    cursor: int | None


def plan(
    schedule: Schedule,
    now: int,
    since: int,
    previous_active: bool,
    failure: SkipCause | None = None,
) -> Plan | None:
    """Decide about `schedule` at `now`; None when nothing is due (or it is paused).

    `since` is when this scheduler began running schedules: fire times before it were missed
    while no scheduler ran. `previous_active` says whether the schedule's last job is still
    pending or running. `failure` is why the fire at `next_run_at` could not be made on an
    earlier look (placement, store), if it was tried.

    Rules (spec): every fire time before the latest due one is skipped; the latest one fires,
    except that a time missed while no scheduler ran fires only with `catch_up` (as a
    catch-up), and that with `overlap: skip` it is skipped while the previous job is active.
    """
    cursor = schedule.next_run_at
    if schedule.paused or cursor is None or cursor > now:
        return None
    expression, tz = cron_expression(schedule.cron), zone(schedule.timezone)
    due = [cursor]
    more = False
    for instant in fire_times(expression, tz, cursor):
        if instant > now:
            break
        if len(due) == MISSED_LISTED:
            more = True  # too many to walk: find the latest directly
            break
        due.append(instant)
    latest = (latest_fire(expression, tz, now) if more else None) or due.pop()
    skipped = tuple(
        (instant, failure if failure is not None and instant == cursor else SkipCause.MISSED)
        for instant in due
    )
    missed_while_down = latest < since
    fire_at: int | None = latest
    cause: SkipCause | None = None
    if missed_while_down and not schedule.catch_up:
        cause = SkipCause.MISSED
    elif schedule.overlap == Overlap.SKIP and previous_active:
        cause = SkipCause.OVERLAP
    if cause is not None:
        skipped += ((latest, cause),)
        fire_at = None
    return Plan(
        skipped=skipped,
        skipped_more=more,
        fire_at=fire_at,
        catch_up=fire_at is not None and missed_while_down,
        latest=latest,
        cursor=next(fire_times(expression, tz, latest), None),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Fired:
    """What one look at a due schedule did: the plan it followed, the job of its fire (None
    when it skipped, or the fire failed), whether that job was made now (False: a fire made it
    before a crash, and it was only recorded now), and the error when the fire failed."""

    schedule: Schedule  # as it was looked at
    plan: Plan
    job: jobs.Job | None = None
    created: bool = False
    error: errors.ServiceError | None = None
