"""`hold`, `release` and `retry`: a person's changes to jobs that already exist (Slurm's
`scontrol hold` / `release` and `sbatch` again; the dashboard's Hold, Release and "Retry as a
new job").

Each is one call of the API per job (`POST /jobs/{id}/hold`, `/release`, `/retry`) through
`client.Client`; several ids are done one after the other, each on its own line, and the
command exits 1 when any of them failed, after trying every one. What may be held or retried
is the API's answer, never decided here.

Tests: `tests/test_cli_batch.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..client import Client, ClientError
from ..display import describe, job_line
from .job_commands import client_from
from .output import echo_json
from .submission import as_job_id

_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")
_ids_argument = click.argument("job_ids", nargs=-1, required=True, metavar="ID...")

Call = Callable[[Client], Callable[[str], dict[str, Any]]]
"""Which client call a command makes, for one job id."""


def _retry_line(job: dict[str, Any]) -> str:
    """`job-9 pending on node-2: a retry of job-7`."""
    return f"{job['job_id']} {describe(job)}: a retry of {job['retry_of']}"


@click.command()
@_ids_argument
@_json_option
@click.pass_context
def hold(ctx: click.Context, job_ids: tuple[str, ...], as_json: bool) -> None:
    """Hold pending jobs: they stay pending but no node gets them until `release`."""
    _act(ctx, job_ids, as_json, lambda client: client.hold, job_line)


@click.command()
@_ids_argument
@_json_option
@click.pass_context
def release(ctx: click.Context, job_ids: tuple[str, ...], as_json: bool) -> None:
    """Release held jobs: they wait for a node like any other again."""
    _act(ctx, job_ids, as_json, lambda client: client.release, job_line)


@click.command()
@_ids_argument
@_json_option
@click.pass_context
def retry(ctx: click.Context, job_ids: tuple[str, ...], as_json: bool) -> None:
    """Submit finished jobs again, each as a new job with the same command, environment and
    settings (the dashboard's "Retry as a new job"); prints each new job."""
    _act(ctx, job_ids, as_json, lambda client: client.retry, _retry_line)


def _act(
    ctx: click.Context,
    job_ids: tuple[str, ...],
    as_json: bool,
    pick: Call,
    line: Callable[[dict[str, Any]], str],
) -> None:
    """Make the call for each job id in turn, printing each answer's `line` (or its error, on
    stderr, and going on with the next); exit 1 at the end when any failed. `--json` prints
    the answers as one array."""
    call = pick(client_from(ctx))
    done: list[dict[str, Any]] = []
    failed = False
    for text in job_ids:
        job_id = as_job_id(text)
        try:
            job = call(job_id)
        except ClientError as exc:
            # With several ids, say which one it is about (when the text does not already).
            about = "" if job_id in exc.message else f"{job_id}: "
            click.echo(f"error: {about}{exc.message}", err=True)
            failed = True
            continue
        done.append(job)
        if not as_json:
            click.echo(line(job))
    if as_json:
        echo_json(done)
    if failed:
        raise SystemExit(1)


COMMANDS = (hold, release, retry)
"""In the order `--help` lists them, after the job commands."""
