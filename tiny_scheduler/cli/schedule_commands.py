"""The schedule commands: `tiny-scheduler schedule add|list|show|pause|resume|rm`.

Clients of the /schedules API like `job_commands` are of /jobs: tables for people, `--json`
for scripts, the scheduler's error texts verbatim. A schedule is named by its id (`sched-3`),
its number (`3`) or its name.
"""

from __future__ import annotations

import shlex
from typing import Any
from urllib.parse import quote

import click

from ..client import ApiError, Client
from ..display import describe, format_table, short_time
from .job_commands import _parse_env, client_from
from .output import CliError, echo_json

SCHEDULE_ID_PREFIX = "sched-"


def _path(ref: str) -> str:
    return f"/schedules/{quote(ref, safe='')}"


def _resolve(client: Client, ref: str) -> str:
    """The schedule id of `ref`: `sched-7`, `7`, or a schedule's name."""
    if ref.isdigit():
        return f"{SCHEDULE_ID_PREFIX}{ref}"
    if ref.startswith(SCHEDULE_ID_PREFIX) and ref[len(SCHEDULE_ID_PREFIX) :].isdigit():
        return ref
    for schedule in client.json("GET", "/schedules"):
        if schedule["name"] == ref:
            return schedule["schedule_id"]
    raise CliError(f"no schedule is named {ref}")


_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")


@click.group()
def schedule() -> None:
    """Periodic jobs: a job submitted at every fire time of a cron expression.

    A schedule is named by its id (sched-3, or 3) or its name.
    """


@schedule.command(name="add")
@click.argument("name")
@click.argument("cron")
@click.argument("command", nargs=-1)
@click.option("--tz", "timezone", default="UTC", show_default=True, help="IANA time zone.")
@click.option("--allow-overlap", is_flag=True, help="Fire even while the last job still runs.")
@click.option("--catch-up", is_flag=True, help="After downtime, run the latest missed fire.")
@click.option("--paused", is_flag=True, help="Create it paused.")
@click.option("--env", "env", multiple=True, metavar="K=V", help="Environment variable; repeat.")
@click.option("--instance", "instance_id", help="Pin its jobs to this instance's node.")
@click.option("--deploy-url", help="A zip in the object store whose start.sh the agent runs.")
@click.option("--timeout", "timeout_secs", type=click.IntRange(min=1), help="Run timeout, s.")
@_json_option
@click.pass_context
def add(
    ctx: click.Context,
    name: str,
    cron: str,
    command: tuple[str, ...],
    timezone: str,
    allow_overlap: bool,
    catch_up: bool,
    paused: bool,
    env: tuple[str, ...],
    instance_id: str | None,
    deploy_url: str | None,
    timeout_secs: int | None,
    as_json: bool,
) -> None:
    """Create schedule NAME running COMMAND at each fire time of CRON.

    CRON is five fields or @hourly, @daily, @weekly, @monthly, @yearly; quote it:
    `schedule add nightly-backup '0 3 * * *' --tz Europe/Berlin -- backup.sh --full`.
    """
    if not command and not deploy_url:
        raise click.UsageError("give a COMMAND or --deploy-url")
    _check_cron(cron)
    job: dict[str, Any] = {"command": command[0] if len(command) == 1 else shlex.join(command)}
    optional = {
        "env_vars": _parse_env(env) or None,
        "instance_id": instance_id,
        "deploy_url": deploy_url,
        "timeout_secs": timeout_secs,
    }
    job.update({key: value for key, value in optional.items() if value is not None})
    body = {
        "name": name,
        "cron": cron,
        "timezone": timezone,
        "job": job,
        "overlap": "allow" if allow_overlap else "skip",
        "catch_up": catch_up,
        "paused": paused,
    }
    created = client_from(ctx).json("POST", "/schedules", json=body)
    if as_json:
        echo_json(created)
    else:
        click.echo(f"{created['schedule_id']} {created['name']}: {_state(created)}")


def _check_cron(cron: str) -> None:
    """Refuse a wrong CRON here, with the scheduler's own words (the same parser), before the
    request: a usage error (exit 2) that points at the argument."""
    # Imported here: the cron parser (cronsim) is only needed by this command.
    from ..domain.schedules import check_cron
    from ..errors import BadRequest

    try:
        check_cron(cron)
    except BadRequest as exc:
        raise click.BadParameter(exc.message, param_hint="CRON") from None


@schedule.command(name="list")
@_json_option
@click.pass_context
def list_schedules(ctx: click.Context, as_json: bool) -> None:
    """List schedules, newest first (as `list` lists jobs)."""
    # The API lists oldest first; every list of this command line shows the newest on top.
    found = client_from(ctx).json("GET", "/schedules")[::-1]
    if as_json:
        echo_json(found)
        return
    if not found:
        click.echo("no schedules", err=True)
        return
    rows = [
        (
            s["schedule_id"],
            s["name"],
            s["cron"],
            s["timezone"],
            "paused" if s["paused"] else short_time(s.get("next_run_at")),
            short_time(s.get("last_run_at")),
            s.get("last_job_id", "-"),
            s["job"].get("command") or s["job"].get("deploy_url", ""),
        )
        for s in found
    ]
    headers = (
        *("SCHEDULE", "NAME", "CRON", "TIMEZONE", "NEXT (UTC)", "LAST (UTC)", "LAST JOB"),
        "COMMAND",
    )
    click.echo(format_table(headers, rows))


@schedule.command()
@click.argument("ref", metavar="SCHEDULE")
@_json_option
@click.pass_context
def show(ctx: click.Context, ref: str, as_json: bool) -> None:
    """Show one schedule, and the status of the last job it made."""
    client = client_from(ctx)
    found = client.json("GET", _path(_resolve(client, ref)))
    if as_json:
        echo_json(found)
        return
    last_job = ""
    if "last_job_id" in found:
        try:
            last_job = f"{found['last_job_id']} {describe(client.job(found['last_job_id']))}"
        except ApiError:
            last_job = f"{found['last_job_id']} (gone: retention removed it)"
    job = found["job"]
    fields = [
        ("schedule", found["schedule_id"]),
        ("name", found["name"]),
        ("cron", f"{found['cron']} ({found['timezone']})"),
        ("state", _state(found)),
        ("overlap", found["overlap"]),
        ("catch up", "yes" if found["catch_up"] else "no"),
        ("command", job.get("command", "")),
        ("deploy url", job.get("deploy_url", "")),
        ("created", found["created_at"]),
        ("last run", found.get("last_run_at", "")),
        ("last job", last_job),
    ]
    rows = [(name, value) for name, value in fields if value]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        click.echo(f"{name.ljust(width)}  {value}")


def _state(found: dict[str, Any]) -> str:
    if found["paused"]:
        return "paused"
    if "next_run_at" in found:
        return f"next run {found['next_run_at']}"
    return "no further fire time"


def _set_paused(ctx: click.Context, ref: str, paused: bool, as_json: bool) -> None:
    client = client_from(ctx)
    changed = client.json("PATCH", _path(_resolve(client, ref)), json={"paused": paused})
    if as_json:
        echo_json(changed)
    else:
        click.echo(f"{changed['schedule_id']} {changed['name']}: {_state(changed)}")


@schedule.command()
@click.argument("ref", metavar="SCHEDULE")
@_json_option
@click.pass_context
def pause(ctx: click.Context, ref: str, as_json: bool) -> None:
    """Stop a schedule from firing (until `resume`)."""
    _set_paused(ctx, ref, True, as_json)


@schedule.command()
@click.argument("ref", metavar="SCHEDULE")
@_json_option
@click.pass_context
def resume(ctx: click.Context, ref: str, as_json: bool) -> None:
    """Let a paused schedule fire again, from its next fire time on."""
    _set_paused(ctx, ref, False, as_json)


@schedule.command()
@click.argument("ref", metavar="SCHEDULE")
@_json_option
@click.pass_context
def rm(ctx: click.Context, ref: str, as_json: bool) -> None:
    """Delete a schedule; the jobs it made stay."""
    client = client_from(ctx)
    schedule_id = _resolve(client, ref)
    client.request("DELETE", _path(schedule_id))
    if as_json:
        # DELETE answers 204 with no body: say what was done, in the shape of the others.
        echo_json({"schedule_id": schedule_id, "deleted": True})
    else:
        click.echo(f"{schedule_id} deleted")
