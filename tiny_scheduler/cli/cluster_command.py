"""`tiny-scheduler cluster`: the daemons sharing the job database, and which one leads.

A client of `GET /cluster`, which every daemon answers itself (a standby too), so with several
URLs the first daemon that answers tells.
"""

from __future__ import annotations

import time

import click

from ..display import ago, format_table, short_time
from ..domain.jobs import parse_time
from .job_commands import client_from
from .output import echo_json

COLUMNS = ("ROLE", "STATE", "URL", "VERSION", "STARTED (UTC)", "LAST SEEN", "ID")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")
@click.pass_context
def cluster(ctx: click.Context, as_json: bool) -> None:
    """Show the scheduler daemons, the leader and the epoch. STATE is `up`, or `gone` for a
    daemon not seen for longer than a running one ever goes (stopped by a kill, or cut off
    from the database); the list forgets it after an hour."""
    view = client_from(ctx).json("GET", "/cluster")
    if as_json:
        echo_json(view)
        return
    click.echo(f"leader: {view['leader'] or 'none known'}  (epoch {view['epoch']})")
    now = time.time()
    rows = [
        (
            daemon["role"],
            "up" if daemon.get("alive", True) else "gone",
            daemon["url"],
            daemon["version"],
            short_time(daemon["started_at"]),
            # By this machine's clock against the database's: close enough for people.
            ago(now - parse_time(daemon["last_seen_at"]) / 1e6),
            daemon["id"],
        )
        for daemon in view["daemons"]
    ]
    click.echo(format_table(COLUMNS, rows))
