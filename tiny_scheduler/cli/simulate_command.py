"""`tiny-scheduler simulate`: what last week's waits would have been with other nodes, another
placement or other limits, from the cluster's own history (issue 38).

Reads the history from a database (`--db`, read-only) or a running scheduler (`--url`, with
TINYAWS_API_KEY, through `GET /jobs?finished_since=…&output=none`, `/nodes`, `/queues`,
`/users`), replays it with the changes asked for (`tiny_scheduler.simulate`), and prints what
happened beside the what-if; `--json` for scripts. Bad input (an unreadable history, an
unknown queue or user, a node file with a wrong field) is a usage error naming it, exit 2.

The replay's modules are imported only when the command runs: the CLI starts fast.
"""

from __future__ import annotations

from typing import Any

import click

from ..client import ApiError, Client
from ..config import PLACEMENTS
from ..domain.validation import MAX_PAGE
from .history_command import moment
from .output import echo_json

DEFAULT_SINCE = "7d"


@click.command()
@click.option("--db", metavar="FILE|URL", help="The daemon's SQLite file or postgresql:// URL.")
@click.option(
    "--url", "source_url", metavar="URL", help="A running scheduler (with TINYAWS_API_KEY)."
)
@click.option(
    "--since",
    default=DEFAULT_SINCE,
    show_default=True,
    metavar="DURATION|TIME",
    help="Replay the jobs that finished this long ago or later (90m, 7d) or from this time.",
)
@click.option(
    "--nodes", metavar="+N|FILE", help="N copies of the largest node more, or a JSON node list."
)
@click.option("--placement", type=click.Choice(PLACEMENTS), help="Another placement.")
@click.option("--queue", "queues", multiple=True, metavar="NAME=N", help="A queue's max_running.")
@click.option("--user", "users", multiple=True, metavar="NAME=N", help="A user's max_running.")
@click.option(
    "--claim-latency",
    type=float,
    metavar="SECS",
    help="Seconds from a job's end or arrival to the polls it sets off [default: the history's].",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")
def simulate(
    db: str | None,
    source_url: str | None,
    since: str,
    nodes: str | None,
    placement: str | None,
    queues: tuple[str, ...],
    users: tuple[str, ...],
    claim_latency: float | None,
    as_json: bool,
) -> None:
    """Replay the cluster's history with other nodes, placement or limits, and compare."""
    from ..domain.jobs import parse_time
    from ..simulate import changes, history, replay, report

    if (db is None) == (source_url is None):
        raise click.UsageError("give the history as --db FILE|URL or as --url URL (one of them)")
    try:
        since_us = parse_time(moment(since))
    except ValueError:
        raise click.BadParameter(f"{since!r} is not a duration or an RFC 3339 time") from None
    try:
        asked = changes.Changes(
            nodes,
            placement,
            changes.limit_pairs("--queue", queues),
            changes.limit_pairs("--user", users),
            claim_latency,
        )
        past = history.read_database(db, since_us) if db else _fetch(source_url or "", since)
        if not past.jobs:
            raise click.UsageError(f"no finished jobs to replay since {since}")
        setup = changes.setup_of(past, asked)
    except (history.HistoryError, changes.ChangeError) as exc:
        raise click.UsageError(str(exc)) from None
    outcome = replay.replay(past.jobs, setup)
    compared = report.compare(past, setup.nodes, outcome, asked.to_wire())
    compared["claim_latency_secs"] = setup.claim_latency_us / 1e6
    if as_json:
        echo_json(compared)
    else:
        click.echo(report.text(compared))


def _fetch(url: str, since: str) -> Any:
    """The history a running scheduler lists."""
    import os

    from ..client import ClientError, base_url
    from ..simulate import history

    try:
        client = Client(base_url(url), os.environ.get("TINYAWS_API_KEY") or None)
        listed: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            page, after = client.page(MAX_PAGE, after, finished_since=moment(since), output="none")
            listed.extend(page)
            if after is None:
                break
        nodes = client.json("GET", "/nodes")
        queues = client.json("GET", "/queues")
        try:
            users = client.json("GET", "/users")
        except ApiError as exc:
            if exc.status != 403:  # a user's token may not list users: no user limits then
                raise
            users = []
    except (ClientError, ValueError) as exc:
        message = getattr(exc, "message", str(exc))
        raise history.HistoryError(f"--url {url}: {message}") from None
    return history.from_wire(listed, nodes, queues, users)
