"""The `tiny-scheduler` command line: run the daemon or a dev cluster, and talk to a scheduler.

This module owns the command group `main` (the console script `tiny_scheduler.cli:main`): the
options every command shares, `--version`, help when no command is given, and one rule for
failures: a `client.ClientError` becomes one line on stderr and exit 1. The commands live in
`job_commands` (submit, status, list, logs, cancel, stop: clients of the HTTP API at
SCHEDULER_URL, sending TINYAWS_API_KEY as the bearer token), `job_actions` (hold, release,
retry), `cluster_command` (the daemons
and their leader), `queue_commands` (`queues` and the `queue` group, a client of /queues),
`schedule_commands` (the `schedule` group, a client of /schedules), `node_commands` (nodes,
node drain|undrain, version), `dev_commands` (the local dev cluster and dev registry) and
`token_commands` (`token create|list|revoke`, `whoami`, `audit`), `agent_command` (a node's
compute agent), `simulate_command` (what if: the history replayed); what they print is in
`output`. Tables for people,
`--json` for scripts.

Nothing outside this package imports it: it is the top of the import graph.
"""

from __future__ import annotations

import os
from typing import Any

import click

from ..client import DEFAULT_URL, ClientError
from ..server.daemon_command import SERVE_ARGV
from .agent_command import agent
from .cluster_command import cluster
from .dev_commands import dev
from .history_command import history
from .job_actions import COMMANDS as ACTION_COMMANDS
from .job_commands import COMMANDS
from .node_commands import COMMANDS as NODE_COMMANDS
from .output import CliError
from .queue_commands import queue, queues
from .schedule_commands import schedule
from .simulate_command import simulate
from .token_commands import audit, token, whoami
from .user_commands import user, users

__all__ = ["main"]


class _Group(click.Group):
    """The top-level group: a ClientError from any command is shown as `error: …`, exit 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ClientError as exc:
            raise CliError(exc.message) from None


@click.group(
    cls=_Group,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(
    package_name="tiny-scheduler", prog_name="tiny-scheduler", message="%(prog)s %(version)s"
)
@click.option(
    "--url",
    envvar="SCHEDULER_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="The scheduler's base URL (env SCHEDULER_URL); http:// when no scheme is given;"
    " several, comma-separated, for a leader and its standbys.",
)
@click.pass_context
def main(ctx: click.Context, url: str) -> None:
    """tiny-scheduler: the job scheduler of a small self-hosted cloud.

    The client commands send TINYAWS_API_KEY, when set, as the bearer token.
    """
    ctx.obj = url
    if ctx.invoked_subcommand is None:
        # No command is a question, not a mistake: answer it with the help, exit 0.
        click.echo(ctx.get_help())


@main.command()
def serve() -> None:
    """Run the scheduler daemon (gunicorn, configured from the environment)."""
    os.execv(SERVE_ARGV[0], SERVE_ARGV)


for _command in (
    *COMMANDS,
    *ACTION_COMMANDS,
    history,
    simulate,
    cluster,
    queues,
    queue,
    users,
    user,
    token,
    whoami,
    audit,
    schedule,
    *NODE_COMMANDS,
    dev,
    agent,
):
    main.add_command(_command)
