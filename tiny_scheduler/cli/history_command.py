"""`tiny-scheduler history`: finished jobs with what they used, as Slurm's `sacct` lists them.

A client of `GET /jobs?finished_since=…&finished_until=…&output=none` (no output is read or
sent), following its pages oldest first; filters by status, queue and owner combine with the
time window. A table for people (elapsed, CPU seconds, peak memory), `--json` for scripts.
"""

from __future__ import annotations

import datetime
from typing import Any

import click

from ..display import format_table, one_line, short_time, status_text
from ..domain.limits import MAX_PAGE
from .delays import parse_duration
from .job_commands import client_from
from .output import echo_json

HISTORY_COLUMNS = (
    *("JOB", "STATUS", "NODE", "QUEUE", "OWNER", "ELAPSED", "CPU", "MAX RSS"),
    *("FINISHED (UTC)", "COMMAND"),
)
"""The header of `history`: ELAPSED and CPU in seconds of the latest attempt (sacct's Elapsed
and TotalCPU), MAX RSS its peak resident memory (MaxRSS); `-` where no agent measured them."""

DEFAULT_SINCE = "1d"


@click.command()
@click.option(
    "--since",
    default=DEFAULT_SINCE,
    show_default=True,
    metavar="DURATION|TIME",
    help="Jobs that finished this long ago or later (90m, 7d) or from this RFC 3339 time.",
)
@click.option("--until", metavar="TIME", help="Only jobs that finished before this RFC 3339 time.")
@click.option("--status", type=click.Choice(("done", "failed")), help="Only jobs that ended so.")
@click.option("--queue", help="Only jobs of this queue.")
@click.option("--owner", help="Only jobs of this user.")
@click.option("--limit", type=click.IntRange(1, 100 * MAX_PAGE), default=1000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")
@click.pass_context
def history(
    ctx: click.Context,
    since: str,
    until: str | None,
    status: str | None,
    queue: str | None,
    owner: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List finished jobs, oldest first, with their elapsed time, CPU and memory."""
    client = client_from(ctx)
    filters = {
        "finished_since": moment(since),
        "finished_until": until,
        "status": status,
        "queue": queue,
        "owner": owner,
        "output": "none",
    }
    found: list[dict[str, Any]] = []
    after: str | None = None
    while len(found) < limit:
        page, after = client.page(min(MAX_PAGE, limit - len(found)), after, **filters)
        found.extend(page)
        if after is None:
            break
    if as_json:
        echo_json(found)
    elif not found:
        click.echo("no finished jobs in that time", err=True)
    else:
        click.echo(format_table(HISTORY_COLUMNS, [_row(job) for job in found]))


def moment(text: str) -> str:
    """`--since` as the API's RFC 3339: a duration counts back from now."""
    if text[:1].isdigit() and "-" not in text:
        back = datetime.timedelta(seconds=parse_duration(text))
        moment = datetime.datetime.now(datetime.timezone.utc) - back
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return text


def _row(job: dict[str, Any]) -> tuple[str, ...]:
    usage = job.get("usage") or {}
    return (
        job["job_id"],
        status_text(job),
        job["node_id"],
        job.get("queue", "default"),
        job.get("owner", "-"),
        _secs(usage.get("wall_secs")),
        _secs(usage.get("cpu_secs")),
        f"{usage['max_rss_mb']:.1f}M" if "max_rss_mb" in usage else "-",
        short_time(job.get("finished_at")),
        one_line(job["command"] or job.get("deploy_url", ""), 40),
    )


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"
