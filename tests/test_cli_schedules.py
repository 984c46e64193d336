"""`tiny-scheduler schedule ...` and `submit --at / --in` against a live, key-protected
scheduler, through click's CliRunner (the real command code, talking HTTP to the real server).
"""

from __future__ import annotations

import datetime
import json
import re

import click
import pytest
import requests
from click.testing import CliRunner, Result

from tiny_scheduler.cli import main
from tiny_scheduler.cli.delays import parse_at, parse_duration
from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.domain import jobs

KEY = "cli-schedules-key"
SCHEDULER_ENV = {"TINYAWS_API_KEY": KEY}


def cli(scheduler: SchedulerProcess, *args: str) -> Result:
    env = {"SCHEDULER_URL": scheduler.url, "TINYAWS_API_KEY": KEY}
    return CliRunner().invoke(main, list(args), env=env)


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.exit_code, result.output)
    return result.output


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("10m", 600), ("2h", 7200), ("1d", 86400), ("1h30m", 5400)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "10x", "1.5h", "-5", "5m1h"])
def test_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(click.BadParameter):
        parse_duration(text)


def test_at_takes_rfc3339_and_reads_a_bare_time_as_local() -> None:
    assert parse_at("2026-11-30T04:00:00+01:00") == "2026-11-30T03:00:00.000000Z"
    local = datetime.datetime(2026, 11, 30, 3, 0).astimezone()
    expected = local.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000000Z")
    assert parse_at("2026-11-30 03:00") == expected
    with pytest.raises(click.BadParameter):
        parse_at("tomorrow")


def test_submit_in_and_at(scheduler: SchedulerProcess) -> None:
    later = json.loads(ok(cli(scheduler, "submit", "--in", "10m", "--json", "echo later")))
    assert jobs.parse_time(later["not_before"]) == jobs.parse_time(later["created_at"]) + 600e6
    at = json.loads(
        ok(cli(scheduler, "submit", "--at", "2030-01-01T00:00:00Z", "--json", "echo then"))
    )
    assert at["not_before"] == "2030-01-01T00:00:00.000000Z"
    both = cli(scheduler, "submit", "--at", "2030-01-01T00:00:00Z", "--in", "1m", "x")
    assert both.exit_code == 2 and "use --at or --in, not both" in both.output
    shown = ok(cli(scheduler, "status", later["job_id"]))
    assert re.search(rf"^not before +{re.escape(later['not_before'])}$", shown, re.M), shown


def test_add_list_show_pause_resume_rm(scheduler: SchedulerProcess) -> None:
    out = ok(
        cli(
            scheduler,
            *("schedule", "add", "cli-backup", "0 3 * * *", "--tz", "Europe/Berlin"),
            *("--env", "A=1", "--catch-up", "--", "backup.sh", "--full"),
        )
    )
    schedule_id = out.split()[0]
    assert out.startswith(f"{schedule_id} cli-backup: next run ")
    created = json.loads(ok(cli(scheduler, "schedule", "show", "--json", schedule_id)))
    assert created["job"] == {
        "command": "backup.sh --full",
        "job_type": "run",
        "env_vars": {"A": "1"},
    }
    assert (created["catch_up"], created["overlap"]) == (True, "skip")

    table = ok(cli(scheduler, "schedule", "list")).splitlines()
    assert table[0].split()[:4] == ["SCHEDULE", "NAME", "CRON", "TIMEZONE"]
    row = next(line for line in table if line.startswith(schedule_id + " "))
    assert "cli-backup" in row and "0 3 * * *" in row and "Europe/Berlin" in row

    shown = ok(cli(scheduler, "schedule", "show", "cli-backup"))  # by name
    assert f"schedule  {schedule_id}" in shown and "cron      0 3 * * * (Europe/Berlin)" in shown
    assert ok(cli(scheduler, "schedule", "pause", schedule_id)).endswith(": paused\n")
    number = schedule_id.removeprefix("sched-")
    assert "next run" in ok(cli(scheduler, "schedule", "resume", number))  # by number
    taken = cli(scheduler, "schedule", "add", "cli-backup", "@daily", "true")
    assert taken.exit_code == 1
    assert taken.output == "error: schedule cli-backup already exists\n"
    assert ok(cli(scheduler, "schedule", "rm", "cli-backup")) == f"{schedule_id} deleted\n"
    gone = cli(scheduler, "schedule", "show", schedule_id)
    assert (gone.exit_code, gone.output) == (1, "error: schedule not found\n")
    assert cli(scheduler, "schedule", "show", "no-such-name").output == (
        "error: no schedule is named no-such-name\n"
    )


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("61 * * * *", "cron minute 61 is out of range 0-59"),
        ("0 0 30 2 *", "cron 0 0 30 2 * never fires: day-of-month 30 does not exist in month 2"),
        ("*/5 * * * * *", "cron has 6 fields;"),
        ("@every 5m", "cron @every 5m is not supported: use five fields or one of @hourly,"),
    ],
)
def test_a_wrong_cron_says_what_is_wrong_in_the_api_and_the_cli(
    scheduler: SchedulerProcess, cron: str, message: str
) -> None:
    # The API: a 400 whose text starts with `cron` and says what to change.
    reply = requests.post(
        scheduler.url + "/schedules",
        json={"name": "wrong", "cron": cron, "job": {"command": "true"}},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=10,
    )
    assert reply.status_code == 400
    assert reply.text.startswith(message), reply.text
    # The command line: the same words, as a usage error about CRON, before any request.
    refused = cli(scheduler, "schedule", "add", "wrong", cron, "true")
    assert refused.exit_code == 2
    assert f"Invalid value for CRON: {message}" in refused.output, refused.output


def test_rm_json_says_what_it_deleted(scheduler: SchedulerProcess) -> None:
    made = json.loads(ok(cli(scheduler, "schedule", "add", "--json", "gone-soon", "@daily", "x")))
    removed = json.loads(ok(cli(scheduler, "schedule", "rm", "--json", "gone-soon")))
    assert removed == {"schedule_id": made["schedule_id"], "deleted": True}
