"""Fire times and firing decisions, at chosen moments: the cron library's fire times held
against hand-made cases (written out here as instants, not computed), the daylight-saving
rules of the spec, and what `plan` decides for a due schedule at a given time.

No clock is read here: every function is told what time it is.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tiny_scheduler import errors
from tiny_scheduler.domain import schedules, validation
from tiny_scheduler.domain.schedules import Overlap, Schedule, SkipCause


def us(text: str) -> int:
    """An instant written as RFC 3339 (the hand-made side of every case)."""
    value = validation.parse_rfc3339(text)
    assert value is not None, text
    return value


def fires(cron: str, tz: str, after: str, count: int) -> list[str]:
    """The first `count` fire times after `after`, written back as RFC 3339 UTC."""
    expression = schedules.cron_expression(cron)
    found = itertools.islice(schedules.fire_times(expression, ZoneInfo(tz), us(after)), count)
    return [_text(instant) for instant in found]


def _text(instant: int) -> str:
    return schedules.jobs.format_time(instant).replace(".000000Z", "Z")


# --- fire times ----------------------------------------------------------------------------------


def test_every_minute_fires_at_each_whole_minute_after_the_given_time() -> None:
    assert fires("* * * * *", "UTC", "2026-11-30T10:20:30.5Z", 3) == [
        "2026-11-30T10:21:00Z",
        "2026-11-30T10:22:00Z",
        "2026-11-30T10:23:00Z",
    ]
    # Strictly after: a fire time is not its own successor.
    assert fires("* * * * *", "UTC", "2026-11-30T10:21:00Z", 1) == ["2026-11-30T10:22:00Z"]


def test_daily_in_berlin_fires_at_local_midnight_across_both_daylight_saving_changes() -> None:
    # Spring forward on 2026-03-29 (CET +01 -> CEST +02), fall back on 2026-10-25.
    assert fires("@daily", "Europe/Berlin", "2026-03-27T12:00:00Z", 4) == [
        "2026-03-27T23:00:00Z",  # 28 March 00:00 CET
        "2026-03-28T23:00:00Z",  # 29 March 00:00 CET (the change comes at 02:00)
        "2026-03-29T22:00:00Z",  # 30 March 00:00 CEST
        "2026-03-30T22:00:00Z",
    ]
    assert fires("@daily", "Europe/Berlin", "2026-10-23T12:00:00Z", 4) == [
        "2026-10-23T22:00:00Z",  # 24 October 00:00 CEST
        "2026-10-24T22:00:00Z",  # 25 October 00:00 CEST
        "2026-10-25T23:00:00Z",  # 26 October 00:00 CET
        "2026-10-26T23:00:00Z",
    ]


def test_a_time_in_the_hour_skipped_in_spring_does_not_fire_that_day() -> None:
    assert fires("30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:00Z", 3) == [
        "2026-03-28T01:30:00Z",  # 28 March 02:30 CET
        # 29 March: 02:30 does not exist in Berlin
        "2026-03-30T00:30:00Z",  # 30 March 02:30 CEST
        "2026-03-31T00:30:00Z",
    ]


def test_a_time_in_the_hour_repeated_in_autumn_fires_once_at_its_first_occurrence() -> None:
    assert fires("30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", 2) == [
        "2026-10-25T00:30:00Z",  # 02:30 CEST; not again at 02:30 CET (01:30Z)
        "2026-10-26T01:30:00Z",
    ]
    assert fires("0 * * * *", "Europe/Berlin", "2026-10-24T21:30:00Z", 5) == [
        "2026-10-24T22:00:00Z",  # 00:00 CEST
        "2026-10-24T23:00:00Z",  # 01:00 CEST
        "2026-10-25T00:00:00Z",  # 02:00 CEST; its repeat at 02:00 CET (01:00Z) does not fire
        "2026-10-25T02:00:00Z",  # 03:00 CET
        "2026-10-25T03:00:00Z",
    ]


def test_from_inside_the_repeated_hour_the_next_fire_is_after_it() -> None:
    # 01:40Z is 02:40 CET, the repeated pass: 02:45 and 02:50 already fired (as CEST).
    assert fires("*/5 2 * * *", "Europe/Berlin", "2026-10-25T01:40:00Z", 2) == [
        "2026-10-26T01:00:00Z",
        "2026-10-26T01:05:00Z",
    ]


def test_february_29_fires_only_in_leap_years() -> None:
    assert fires("0 12 29 2 *", "UTC", "2025-03-01T00:00:00Z", 3) == [
        "2028-02-29T12:00:00Z",
        "2032-02-29T12:00:00Z",
        "2036-02-29T12:00:00Z",
    ]


def test_the_aliases_are_the_cron_expressions_they_stand_for() -> None:
    after = "2026-11-30T10:20:30Z"  # a Monday
    assert fires("@hourly", "UTC", after, 1) == ["2026-11-30T11:00:00Z"]
    assert fires("@weekly", "UTC", after, 1) == ["2026-12-06T00:00:00Z"]  # Sunday
    assert fires("@monthly", "UTC", after, 1) == ["2026-12-01T00:00:00Z"]
    assert fires("@yearly", "UTC", after, 1) == ["2027-01-01T00:00:00Z"]


def test_day_of_month_and_day_of_week_both_restricted_means_either() -> None:
    # Classic cron: the 13th of the month, or any Friday.
    assert fires("0 0 13 * 5", "UTC", "2026-11-10T00:00:00Z", 3) == [
        "2026-11-13T00:00:00Z",  # a Friday the 13th
        "2026-11-20T00:00:00Z",  # a Friday
        "2026-11-27T00:00:00Z",
    ]


def test_latest_fire_at_or_before_a_time() -> None:
    expression, utc = schedules.cron_expression("*/15 * * * *"), ZoneInfo("UTC")
    assert schedules.latest_fire(expression, utc, us("2026-11-30T10:20:30Z")) == us(
        "2026-11-30T10:15:00Z"
    )
    assert schedules.latest_fire(expression, utc, us("2026-11-30T10:15:00Z")) == us(
        "2026-11-30T10:15:00Z"
    )
    # In the repeated hour's second pass, 02:45 CEST (00:45Z) fired after 02:10 CET's wall
    # time but before its instant (01:10Z): it is the latest.
    berlin = ZoneInfo("Europe/Berlin")
    expression = schedules.cron_expression("*/15 2 * * *")
    assert schedules.latest_fire(expression, berlin, us("2026-10-25T01:10:00Z")) == us(
        "2026-10-25T00:45:00Z"
    )


# --- the request ---------------------------------------------------------------------------------


def change_error(body: dict[str, Any], partial: bool = False) -> str:
    with pytest.raises(errors.BadRequest) as caught:
        schedules.parse_schedule_request(json.dumps(body).encode(), partial)
    return caught.value.message


VALID = {"name": "nightly-backup", "cron": "0 3 * * *", "job": {"command": "backup"}}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": ""}, schedules.NAME_MESSAGE),
        ({"name": "a b"}, schedules.NAME_MESSAGE),
        ({"name": "x" * 101}, schedules.NAME_MESSAGE),
        ({"name": 7}, schedules.NAME_MESSAGE),
        ({"cron": 5}, schedules.CRON_MESSAGE),
        ({"timezone": "Mars/Olympus"}, schedules.TIMEZONE_MESSAGE),
        ({"timezone": "../../etc/passwd"}, schedules.TIMEZONE_MESSAGE),
        ({"timezone": "localtime"}, schedules.TIMEZONE_MESSAGE),
        ({"timezone": ""}, schedules.TIMEZONE_MESSAGE),
        ({"overlap": "queue"}, schedules.OVERLAP_MESSAGE),
        ({"job": "echo"}, schedules.JOB_MESSAGE),
        ({"job": {"command": "x", "port": "80"}}, "port must be an integer between 1 and 65535"),
        ({"job": {}}, errors.COMMAND_REQUIRED),
        ({"job": {"command": "x", "delay_secs": 1, "not_before": "x"}}, errors.NOT_BEFORE_OR_DELAY),
        ({"catch_up": "yes"}, "catch_up must be true or false"),
        ({"paused": 1}, "paused must be true or false"),
    ],
)
def test_each_field_is_checked_with_a_message_naming_it(
    fields: dict[str, Any], message: str
) -> None:
    assert change_error({**VALID, **fields}) == message
    assert change_error(fields, partial=True) == message


def test_name_cron_and_job_are_required_on_create_only() -> None:
    for field in ("name", "cron", "job"):
        body = {key: value for key, value in VALID.items() if key != field}
        assert change_error(body).startswith(field)
        assert change_error({**body, field: None}).startswith(field)
    change = schedules.parse_schedule_request(b'{"paused":true,"schedule_id":"sched-9"}', True)
    assert change.given() == {"paused": True}


def test_checks_run_in_the_spec_order() -> None:
    everything_wrong = {"name": "", "cron": "x", "timezone": "x", "overlap": "x", "job": 1}
    assert change_error(everything_wrong) == schedules.NAME_MESSAGE
    assert change_error({**everything_wrong, "name": "n"}).startswith("cron has 1 field;")
    assert change_error({**everything_wrong, "name": "n", "cron": "@daily"}).startswith("timezone")
    body = {**everything_wrong, "name": "n", "cron": "@daily", "timezone": "UTC"}
    assert change_error(body) == schedules.OVERLAP_MESSAGE
    assert change_error({**body, "overlap": "allow"}) == schedules.JOB_MESSAGE


def test_a_body_that_is_not_an_object() -> None:
    for raw in (b"", b"[]", b"null", b"{"):
        with pytest.raises(errors.BadRequest) as caught:
            schedules.parse_schedule_request(raw, partial=True)
        assert caught.value.message == "failed to decode schedule"


ALIASES = "@hourly, @daily, @weekly, @monthly, @yearly"
FIELDS = "it needs five (minute hour day-of-month month day-of-week)"


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("61 * * * *", "cron minute 61 is out of range 0-59"),
        ("* 24 * * *", "cron hour 24 is out of range 0-23"),
        ("0 0 0 * *", "cron day-of-month 0 is out of range 1-31"),
        ("0 0 * 1-13 *", "cron month 13 is out of range 1-12"),
        ("0 0 * * 8", "cron day-of-week 8 is out of range 0-7"),
        ("*/0 * * * *", "cron minute step /0 in */0 must be a whole number of at least 1"),
        ("0 5-1 * * *", "cron hour range 5-1 runs backwards: write the smaller number first"),
        (
            "x * * * *",
            "cron minute x is not valid: use numbers 0-59, ranges (1-5), lists (1,3),"
            " steps (*/5) or names (mon, jan)",
        ),
        ("0 0 30 2 *", "cron 0 0 30 2 * never fires: day-of-month 30 does not exist in month 2"),
        (
            "0 0 31 4,6 *",
            "cron 0 0 31 4,6 * never fires: day-of-month 31 does not exist in month 4,6",
        ),
        (
            "*/5 * * * * *",
            f"cron has 6 fields; {FIELDS} or one of {ALIASES};"
            " a sixth field (seconds) is not supported",
        ),
        ("* * * *", f"cron has 4 fields; {FIELDS} or one of {ALIASES}"),
        ("@every 5m", f"cron @every 5m is not supported: use five fields or one of {ALIASES}"),
        ("@reboot", f"cron @reboot is not supported: use five fields or one of {ALIASES}"),
        ("@midnight", f"cron @midnight is not supported: use five fields or one of {ALIASES}"),
    ],
)
def test_a_wrong_cron_is_told_what_is_wrong(cron: str, message: str) -> None:
    assert change_error({**VALID, "cron": cron}) == message
    assert change_error({"cron": cron}, partial=True) == message


@pytest.mark.parametrize("cron", ["0 0 * * MON-FRI", "0 0 L * *", "0 0 1 jan *", "0 0 * * 7"])
def test_what_cron_allows_beyond_numbers_is_still_taken(cron: str) -> None:
    assert schedules.parse_schedule_request(json.dumps({**VALID, "cron": cron}).encode(), False)


def test_cron_spacing_is_normalized_and_the_job_shown_as_it_will_be_submitted() -> None:
    body = {**VALID, "cron": "  */5   *  * * 1-5 ", "job": {"command": "x", "port": 0}}
    change = schedules.parse_schedule_request(json.dumps(body).encode(), partial=False)
    assert change.cron == "*/5 * * * 1-5"
    assert change.job is not None
    assert validation.job_request_to_wire(change.job) == {"command": "x", "job_type": "run"}


# --- what a look at a due schedule decides -------------------------------------------------------

MINUTE = 60_000_000


def every_minute(**fields: Any) -> Schedule:
    base: dict[str, Any] = {
        "seq": 1,
        "name": "s",
        "cron": "* * * * *",
        "timezone": "UTC",
        "job": validation.JobRequest(command="x"),
        "overlap": Overlap.SKIP,
        "catch_up": False,
        "paused": False,
        "created_at": us("2026-11-30T09:00:00Z"),
        "next_run_at": us("2026-11-30T10:00:00Z"),
    }
    return Schedule(**{**base, **fields})


STARTED = us("2026-11-30T09:30:00Z")  # this scheduler has run schedules since


def test_nothing_is_due_before_the_next_fire_time_or_while_paused() -> None:
    schedule = every_minute()
    assert schedules.plan(schedule, us("2026-11-30T09:59:59.999999Z"), STARTED, False) is None
    due = us("2026-11-30T10:00:30Z")
    assert schedules.plan(dataclasses.replace(schedule, paused=True), due, STARTED, False) is None


def test_a_fire_time_that_came_while_running_fires() -> None:
    plan = schedules.plan(every_minute(), us("2026-11-30T10:00:05Z"), STARTED, False)
    assert plan is not None
    assert (plan.fire_at, plan.catch_up, plan.skipped) == (us("2026-11-30T10:00:00Z"), False, ())
    assert plan.cursor == us("2026-11-30T10:01:00Z")


def test_fire_times_missed_while_no_scheduler_ran_are_skipped_without_catch_up() -> None:
    since = us("2026-11-30T10:10:30Z")  # down from before 10:00 until 10:10:30
    plan = schedules.plan(every_minute(), since + 1, since, False)
    assert plan is not None
    assert plan.fire_at is None
    assert [(_text(t), cause) for t, cause in plan.skipped] == [
        (f"2026-11-30T10:{minute:02d}:00Z", SkipCause.MISSED) for minute in range(11)
    ]
    assert plan.cursor == us("2026-11-30T10:11:00Z")


def test_catch_up_fires_once_for_the_latest_missed_time() -> None:
    since = us("2026-11-30T10:10:30Z")
    plan = schedules.plan(every_minute(catch_up=True), since + 1, since, False)
    assert plan is not None
    assert (plan.fire_at, plan.catch_up) == (us("2026-11-30T10:10:00Z"), True)
    assert [cause for _, cause in plan.skipped] == [SkipCause.MISSED] * 10
    assert plan.cursor == us("2026-11-30T10:11:00Z")


def test_overlap_skip_skips_while_the_previous_job_is_active_and_allow_fires() -> None:
    now = us("2026-11-30T10:00:01Z")
    skipped = schedules.plan(every_minute(), now, STARTED, previous_active=True)
    assert skipped is not None and skipped.fire_at is None
    assert skipped.skipped == ((us("2026-11-30T10:00:00Z"), SkipCause.OVERLAP),)
    allowed = schedules.plan(every_minute(overlap=Overlap.ALLOW), now, STARTED, True)
    assert allowed is not None and allowed.fire_at == us("2026-11-30T10:00:00Z")
    idle = schedules.plan(every_minute(), now, STARTED, previous_active=False)
    assert idle is not None and idle.fire_at == us("2026-11-30T10:00:00Z")


def test_a_fire_that_failed_is_retried_until_the_next_fire_time_then_skipped_with_its_cause() -> (
    None
):
    schedule = every_minute()
    retried = schedules.plan(schedule, us("2026-11-30T10:00:59Z"), STARTED, False, "placement")
    assert retried is not None and retried.fire_at == us("2026-11-30T10:00:00Z")
    assert retried.skipped == ()
    given_up = schedules.plan(
        schedule, us("2026-11-30T10:01:00Z"), STARTED, False, SkipCause.PLACEMENT
    )
    assert given_up is not None
    assert given_up.skipped == ((us("2026-11-30T10:00:00Z"), SkipCause.PLACEMENT),)
    assert given_up.fire_at == us("2026-11-30T10:01:00Z")


def test_a_very_long_outage_lists_the_first_missed_times_and_finds_the_latest() -> None:
    since = us("2027-11-30T10:00:30Z")  # a year of every-minute fire times missed
    plan = schedules.plan(every_minute(catch_up=True), since, since, False)
    assert plan is not None
    assert plan.skipped_more
    assert len(plan.skipped) == schedules.MISSED_LISTED
    assert plan.fire_at == us("2027-11-30T10:00:00Z")
    assert plan.cursor == us("2027-11-30T10:01:00Z")
