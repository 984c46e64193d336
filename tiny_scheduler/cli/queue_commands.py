"""The queue commands: `tiny-scheduler queues` and `tiny-scheduler queue set|pause|resume`.

Clients of the /queues API as `schedule_commands` is of /schedules: a table for people,
`--json` for scripts, the scheduler's error texts verbatim. A queue's settings are replaced
whole by the API, so a change of one of them sends the other as it stands.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import click

from ..client import Client
from ..display import format_table
from .job_commands import client_from
from .limits import limit_options
from .output import echo_json

_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")


def _limit(found: dict[str, Any]) -> str:
    return "-" if found["max_running"] is None else str(found["max_running"])


def _line(found: dict[str, Any]) -> str:
    state = "paused" if found["paused"] else "running"
    return (
        f"{found['queue']}: {state}, limit {_limit(found)}, "
        f"{found['pending']} pending, {found['running']} running"
    )


@click.command()
@_json_option
@click.pass_context
def queues(ctx: click.Context, as_json: bool) -> None:
    """List the queues that have jobs or settings, by name."""
    found = client_from(ctx).json("GET", "/queues")
    if as_json:
        echo_json(found)
        return
    if not found:
        click.echo("no queues", err=True)
        return
    rows = [
        (q["queue"], str(q["pending"]), str(q["running"]), _limit(q), "yes" if q["paused"] else "")
        for q in found
    ]
    click.echo(format_table(("QUEUE", "PENDING", "RUNNING", "LIMIT", "PAUSED"), rows))


@click.group()
def queue() -> None:
    """Change a queue's settings: its limit of running jobs, and whether it is paused."""


def _current(client: Client, name: str) -> dict[str, Any]:
    for found in client.json("GET", "/queues"):
        if found["queue"] == name:
            return found
    return {"queue": name, "max_running": None, "paused": False}


def _put(ctx: click.Context, name: str, as_json: bool, **change: Any) -> None:
    client = client_from(ctx)
    settings = _current(client, name)
    body = {"max_running": settings["max_running"], "paused": settings["paused"], **change}
    changed = client.json("PUT", f"/queues/{quote(name, safe='')}", json=body)
    if as_json:
        echo_json(changed)
    else:
        click.echo(_line(changed))


@queue.command(name="set")
@click.argument("name")
@limit_options
@_json_option
@click.pass_context
def set_queue(ctx: click.Context, name: str, max_running: int | None, as_json: bool) -> None:
    """Set queue NAME's limit of running `run` jobs, across the cluster."""
    _put(ctx, name, as_json, max_running=max_running)


@queue.command()
@click.argument("name")
@_json_option
@click.pass_context
def pause(ctx: click.Context, name: str, as_json: bool) -> None:
    """Hand none of queue NAME's jobs out (the running ones go on)."""
    _put(ctx, name, as_json, paused=True)


@queue.command()
@click.argument("name")
@_json_option
@click.pass_context
def resume(ctx: click.Context, name: str, as_json: bool) -> None:
    """Hand queue NAME's jobs out again."""
    _put(ctx, name, as_json, paused=False)
