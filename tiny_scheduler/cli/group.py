"""The command group `main` of the command line: the options every command shares
(`--url`), `--version`, help when no command is given, `serve`, and one rule for failures: a
`client.ClientError` becomes one line on stderr and exit 1. Each command's module is imported
only when that command runs (or `--help` lists it): a command pays for itself, not for the
agent, the dev cluster or the daemon.

Tests: `tests/test_cli.py`, `tests/test_cli_startup.py`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from typing import Any

import click

from ..client import DEFAULT_URL, ClientError
from .output import CliError

__all__ = ["main"]

_WHERE = {
    "submit": "job_commands:submit",
    "status": "job_commands:status",
    "list": "job_commands:list_jobs",
    "logs": "job_commands:logs",
    "cancel": "job_commands:cancel",
    "stop": "job_commands:stop",
    "hold": "job_actions:hold",
    "release": "job_actions:release",
    "retry": "job_actions:retry",
    "history": "history_command:history",
    "simulate": "simulate_command:simulate",
    "cluster": "cluster_command:cluster",
    "queues": "queue_commands:queues",
    "queue": "queue_commands:queue",
    "users": "user_commands:users",
    "user": "user_commands:user",
    "token": "token_commands:token",
    "whoami": "token_commands:whoami",
    "audit": "token_commands:audit",
    "schedule": "schedule_commands:schedule",
    "nodes": "node_commands:nodes",
    "node": "node_commands:node",
    "version": "node_commands:version",
    "dev": "dev_commands:dev",
    "agent": "agent_command:agent",
}
"""Each command by name, and where it is defined (`module:attribute` in this package)."""


class _Commands(dict):  # type: ignore[type-arg]
    """The group's commands by name, each imported from its module when first looked up.

    A dict, as click keeps a group's commands, so that click and anyone walking
    `main.commands` see commands, never the text of where they are."""

    def __getitem__(self, name: str) -> click.Command:
        found = super().__getitem__(name)
        if isinstance(found, str):
            module, attribute = found.split(":")
            found = getattr(importlib.import_module(f"{__package__}.{module}"), attribute)
            self[name] = found
        return found

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default  # noqa: SIM401 (it is this get)

    def values(self) -> Iterator[click.Command]:  # type: ignore[override]
        return (self[name] for name in list(self))

    def items(self) -> Iterator[tuple[str, click.Command]]:  # type: ignore[override]
        return ((name, self[name]) for name in list(self))


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
    commands=_Commands(_WHERE),
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
    from ..server.daemon_command import SERVE_ARGV

    os.execv(SERVE_ARGV[0], SERVE_ARGV)
