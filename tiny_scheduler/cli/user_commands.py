"""The user commands: `tiny-scheduler users` and `tiny-scheduler user limit NAME`.

Clients of the /users API as `queue_commands` is of /queues: a table for people (each user's
running and pending jobs, its fair-share usage and its limit), `--json` for scripts, the
scheduler's error texts verbatim.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import click

from ..display import format_table
from .job_commands import client_from
from .limits import limit_options
from .output import echo_json

_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")

NO_OWNER = "(shared key)"
"""How the jobs submitted with the shared key, which have no owner, are listed."""


def _limit(found: dict[str, Any]) -> str:
    return "-" if found["max_running"] is None else str(found["max_running"])


@click.command()
@_json_option
@click.pass_context
def users(ctx: click.Context, as_json: bool) -> None:
    """List the users with jobs, a limit or recent usage: fair share orders their jobs."""
    found = client_from(ctx).json("GET", "/users")
    if as_json:
        echo_json(found)
        return
    if not found:
        click.echo("no users", err=True)
        return
    rows = [
        (
            u["user"] or NO_OWNER,
            str(u["running"]),
            str(u["pending"]),
            f"{u['usage_cpu_secs']:.1f}",
            _limit(u),
        )
        for u in found
    ]
    click.echo(format_table(("USER", "RUNNING", "PENDING", "USAGE (CPU s)", "LIMIT"), rows))


@click.group()
def user() -> None:
    """Change a user's limit of running jobs."""


@user.command(name="limit")
@click.argument("name")
@limit_options
@_json_option
@click.pass_context
def limit(ctx: click.Context, name: str, max_running: int | None, as_json: bool) -> None:
    """Set user NAME's limit of running `run` jobs, across the cluster."""
    changed = client_from(ctx).json(
        "PUT", f"/users/{quote(name, safe='')}", json={"max_running": max_running}
    )
    if as_json:
        echo_json(changed)
    else:
        click.echo(
            f"{changed['user']}: limit {_limit(changed)}, "
            f"{changed['pending']} pending, {changed['running']} running"
        )
