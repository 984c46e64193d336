"""The client commands of the command line: `submit`, `status`, `list`, `logs`, `cancel` (and
`stop`, the same command under the word people use for a running job). `hold`, `release` and
`retry` are `job_actions`'.

They talk to the scheduler at SCHEDULER_URL through `client.Client`, print with `output`, and
end with a non-zero exit on any failure. `--wait` streams the job's changes on stderr (woken
by the scheduler's event stream, polling without it), then prints the settled job and its
output, and exits with the job's exit code; `logs -f` follows the output as it is written.

No rule of the scheduler is repeated here: what a command may do is the API's answer.
"""

from __future__ import annotations

import datetime
import os
import shlex
import sys
import time
from collections.abc import Callable
from typing import IO, Any, NoReturn

import click

from ..client import (
    DEFAULT_URL,
    WAIT_INTERVAL_SECS,
    Client,
    ClientError,
    base_urls,
    wait_for_job,
)
from ..display import describe, job_line
from ..domain.jobs import DONE, FAILED, RUNNING, STATUSES
from ..domain.limits import MAX_ARRAY, MAX_JOB_RETRIES_ASKED, MAX_PAGE
from .delays import delay_fields, delay_options
from .follow import follow_output, live_output
from .output import CliError, echo_json, jobs_table, print_attempts, print_status, print_streams
from .resources import resource_options
from .submission import as_job_id, env_pair, job_body

DEFAULT_LIMIT = 100
"""Jobs `list` shows unless --limit says otherwise."""

WATCH_SECS = 2.0
"""Seconds between two redraws of `list --watch` when no period is given."""


def client_from(ctx: click.Context, plain: bool = False) -> Client:
    """The client of the scheduler the command line was pointed at (--url / SCHEDULER_URL);
    `plain` for a command that makes a call or two and is done (see `Client`)."""
    given = ctx.find_root().obj or DEFAULT_URL
    try:
        # Several daemons, comma-separated: a leader and its standbys (PostgreSQL).
        url = ",".join(base_urls(given))
    except ValueError as exc:
        raise CliError(f"SCHEDULER_URL / --url: {exc}") from None
    return Client(url, os.environ.get("TINYAWS_API_KEY") or None, plain)


_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")
_interval_option = click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=WAIT_INTERVAL_SECS,
    show_default=True,
    help="Seconds between looks at the job while waiting.",
)
_wait_option = click.option(
    "--wait",
    is_flag=True,
    help="Follow the job until it ends (a service: until it runs), print its output, exit"
    " with its exit code.",
)
_no_logs_option = click.option(
    "--no-logs", is_flag=True, help="With --wait: do not print the job's stdout and stderr."
)
_show_env_option = click.option(
    "--show-env",
    is_flag=True,
    help="Show the values of the job's environment variables (hidden as *** otherwise:"
    " they often hold secrets). --json always has them.",
)


class _CommandAfterDashes(click.Command):
    """A command whose COMMAND argument takes the job's words; when the job's own options
    reach click instead (`submit ls -la`: no such option -l), the error says to put them
    after `--`, with the command line that does."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # click's parser consumes the list it is handed
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            args = given
            start = self._first_word(args)
            if "--" in args or start is None:
                raise
            fixed = [*args[:start], "--", *args[start:]]
            exc.message += (
                f" Options after the command are the command's own: put it after --:"
                f" tiny-scheduler {ctx.info_name} {shlex.join(fixed)}"
            )
            raise

    def _first_word(self, args: list[str]) -> int | None:
        """Where the job's command starts: the first word that is neither an option of ours
        nor the value of one."""
        with_value = {
            name
            for param in self.params
            if isinstance(param, click.Option) and not param.is_flag
            for name in param.opts
        }
        index = 0
        while index < len(args):
            if args[index] in with_value:
                index += 2
            elif args[index].startswith("-"):
                index += 1
            else:
                return index
        return None


# --- submit and status --------------------------------------------------------------------------


@click.command(cls=_CommandAfterDashes)
@click.argument("command", nargs=-1)
@click.option("--instance", "instance_id", help="Pin the job to this instance's node.")
@click.option("--env", "env", multiple=True, metavar="K=V", help="Environment variable; repeat.")
@click.option(
    "--service",
    is_flag=True,
    help="A long-running service instead of a one-shot run (needs --port).",
)
@click.option("--port", type=click.IntRange(1, 65535), help="The service's port (with --service).")
@click.option("--deploy-url", help="A zip in the object store whose start.sh the agent runs.")
@click.option("--timeout", "timeout_secs", type=click.IntRange(min=1), help="Run timeout, seconds.")
@click.option("--idempotency-key", help="Submitting again with the same key creates nothing.")
@click.option(
    "--after",
    metavar="JOB[,JOB...]",
    help="Run only once these jobs are done (ids or numbers, comma-separated).",
)
@click.option(
    "--after-any", is_flag=True, help="With --after: once they ended, whatever their status."
)
@click.option("--priority", type=click.IntRange(0, 100), help="0-100 (default 50), higher first.")
@click.option("--queue", help="The queue the job waits in (default: default).")
@click.option("-J", "--name", help="A name for the job, for people and for `list --name`.")
@click.option(
    "--retries",
    "max_retries",
    type=click.IntRange(0, MAX_JOB_RETRIES_ASKED),
    help="Retries after a failed attempt, 0-10 (default: the scheduler's MAX_JOB_RETRIES,"
    " 1 unless set). A timeout or a cancel is never retried.",
)
@click.option(
    "--array",
    type=click.IntRange(1, MAX_ARRAY),
    metavar="N",
    help="Submit N copies at once (a sweep), each with TINY_ARRAY_INDEX=0..N-1 in its"
    " environment; list them with `list --array ID`.",
)
@resource_options
@delay_options
@_wait_option
@_no_logs_option
@_show_env_option
@click.option("-q", "--quiet", is_flag=True, help="Print only the job id.")
@click.option(
    "--from-file",
    type=click.File("r"),
    metavar="FILE",
    help="Submit a job per line of FILE (- for stdin): a shell command, or a JSON object of"
    " job fields; blank and # lines skipped; the other options are each line's defaults."
    " Prints one id per line.",
)
@_interval_option
@_json_option
@click.pass_context
def submit(
    ctx: click.Context,
    command: tuple[str, ...],
    instance_id: str | None,
    env: tuple[str, ...],
    service: bool,
    port: int | None,
    deploy_url: str | None,
    timeout_secs: int | None,
    idempotency_key: str | None,
    after: str | None,
    after_any: bool,
    priority: int | None,
    queue: str | None,
    name: str | None,
    max_retries: int | None,
    array: int | None,
    resources: dict[str, Any],
    at: str | None,
    delay: str | None,
    wait: bool,
    no_logs: bool,
    show_env: bool,
    quiet: bool,
    from_file: IO[str] | None,
    interval: float,
    as_json: bool,
) -> None:
    """Submit a job running COMMAND with `sh -c`.

    One argument is taken as a shell command as is (`submit 'echo $HOME'`); several are quoted
    and joined. Put `--` before a command that has options of its own:
    `submit --wait -- python3 -c 'print(1)'`. With --from-file, one job per line, sent in
    batches (`POST /jobs/batch`).
    """
    if from_file is not None and (command or wait):
        raise click.UsageError(
            "--from-file takes its commands from the file: no COMMAND, no --wait"
        )
    if not command and not deploy_url and from_file is None:
        raise click.UsageError("give a COMMAND, --deploy-url or --from-file")
    if after_any and not after:
        raise click.UsageError("--after-any goes with --after")
    if port is not None and not service:
        # The API would take it and ignore it; a port on a one-shot job is a mistake.
        raise click.BadParameter("only a service has a port: add --service", param_hint="'--port'")
    if service and port is None:
        # The load balancer finds a service by its port; without one nobody can reach it.
        raise click.BadParameter("a service needs its port: add --port N", param_hint="'--service'")
    if array and wait:
        raise click.UsageError(
            "--wait follows one job; follow an array with: tiny-scheduler list --array ID --watch"
        )
    body = job_body(
        command,
        _parse_env(env),
        service,
        instance_id=instance_id,
        port=port,
        deploy_url=deploy_url,
        timeout_secs=timeout_secs,
        priority=priority,
        queue=queue,
        depends_on=_job_ids(after) if after else None,
        dependency="any" if after_any else None,
        name=name,
        max_retries=max_retries,
        array=array,
    )
    if from_file is not None:
        del body["command"]
    body.update(delay_fields(at, delay))
    body.update(resources)
    # A plain submit is often one of many in a shell loop: its start-up is most of its time.
    client = client_from(ctx, plain=not wait)
    if from_file is not None:
        from .batch_submit import submit_from

        submit_from(client, from_file, body, idempotency_key, as_json)
        return
    job = client.submit(body, idempotency_key)
    if wait:
        _wait_and_exit(client, job["job_id"], as_json, interval, not no_logs, show_env)
    if as_json:
        echo_json(job)
    elif quiet:
        click.echo(job["job_id"])
    elif array:
        click.echo(
            f"{job['job_id']} {describe(job)}: the first of an array of {array}"
            f" (list them: tiny-scheduler list --array {job['job_id']})"
        )
    else:
        click.echo(job_line(job))


def _job_ids(text: str) -> list[str]:
    """`job-3,4` -> [job-3, job-4]: the API checks that they exist."""
    return [as_job_id(part.strip()) for part in text.split(",") if part.strip()]


def _parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        found = env_pair(pair)
        if found is None:
            raise click.BadParameter(f"{pair!r} is not K=V", param_hint="--env")
        env[found[0]] = found[1]
    return env


@click.command()
@click.argument("job_id")
@_wait_option
@_no_logs_option
@_show_env_option
@_interval_option
@_json_option
@click.pass_context
def status(
    ctx: click.Context,
    job_id: str,
    wait: bool,
    no_logs: bool,
    show_env: bool,
    interval: float,
    as_json: bool,
) -> None:
    """Show one job."""
    client = client_from(ctx)
    job_id = as_job_id(job_id)
    if wait:
        _wait_and_exit(client, job_id, as_json, interval, not no_logs, show_env)
    job = client.job(job_id)
    if as_json:
        echo_json(job)
    else:
        print_status(job, show_env, _default_retries(client, job))


def _default_retries(client: Client, job: dict[str, Any]) -> int | None:
    """The scheduler's MAX_JOB_RETRIES as its `/health` states it, when `status` shows it: for
    a job that can still fail and has no `max_retries` of its own (only then the extra call).
    None when the scheduler does not say (one older than the field) or cannot be asked: the
    job is still shown, without the number."""
    if job["status"] in (DONE, FAILED) or "max_retries" in job:
        return None
    try:
        said = client.json("GET", "/health").get("max_job_retries")
    except ClientError:
        return None
    return said if isinstance(said, int) and not isinstance(said, bool) else None


def _wait_and_exit(
    client: Client, job_id: str, as_json: bool, interval: float, logs: bool, show_env: bool
) -> NoReturn:
    try:
        job = wait_for_job(client, job_id, interval, lambda line: click.echo(line, err=True))
    except KeyboardInterrupt:
        click.echo(f"\nstopped waiting; {job_id} goes on without us", err=True)
        sys.exit(130)
    if as_json:
        echo_json(job)  # it carries stdout and stderr already
    else:
        print_status(job, show_env, _default_retries(client, job))
        # What `logs` would show of the latest attempt, so a failure needs no second command.
        if logs:
            print_streams(job)
    sys.exit(exit_status(job))


def exit_status(job: dict[str, Any]) -> int:
    """The exit status `--wait` ends with: 0 for a job done or a service that runs, else the
    job's exit code; 1 when it failed without a usable one (timed out, lost node,
    cancelled: -1)."""
    if job["status"] in (DONE, RUNNING):
        return 0
    code = job.get("exit_code")
    if job["status"] == FAILED and isinstance(code, int) and 0 < code < 256:
        return code
    return 1


# --- list ---------------------------------------------------------------------------------------


@click.command(name="list")
@click.option("--node", help="Only jobs on this node.")
@click.option("--status", type=click.Choice(STATUSES), help="Only jobs in this status.")
@click.option("--queue", help="Only jobs of this queue.")
@click.option("--name", help="Only jobs of this name (exactly).")
@click.option(
    "--array", "array_id", metavar="ID", help="Only the jobs of this array (its first job's id)."
)
@click.option("--limit", type=click.IntRange(1, MAX_PAGE), default=DEFAULT_LIMIT, show_default=True)
@click.option("--after", help="Only jobs created after this job id.")
@click.option("--oldest", is_flag=True, help="Oldest first (FIFO), paged with --after.")
@click.option("--owner", help="Only this user's jobs.")
@click.option("--mine", is_flag=True, help="Only the jobs of the user TINYAWS_API_KEY is for.")
@click.option(
    "--watch",
    type=click.FloatRange(min=0.1),
    is_flag=False,
    flag_value=WATCH_SECS,
    default=None,
    metavar="[SECS]",
    help=f"Redraw every SECS seconds [{WATCH_SECS:g}] until Ctrl-C.",
)
@_json_option
@click.pass_context
def list_jobs(
    ctx: click.Context,
    node: str | None,
    status: str | None,
    queue: str | None,
    name: str | None,
    array_id: str | None,
    limit: int,
    after: str | None,
    oldest: bool,
    owner: str | None,
    mine: bool,
    watch: float | None,
    as_json: bool,
) -> None:
    """List jobs, newest first (--oldest: oldest first; an array's jobs by index). Times are
    UTC. WAITING FOR says why a pending job waits."""
    if watch is not None and as_json:
        raise click.UsageError("--watch redraws a table for people; it does not go with --json")
    if mine and owner:
        raise click.UsageError("use --mine or --owner, not both")
    client = client_from(ctx)
    after = as_job_id(after) if after else None
    if mine:
        owner = client.json("GET", "/whoami").get("user")
        if not owner:
            raise CliError("--mine needs a token with a user; TINYAWS_API_KEY is the shared key")
    filters = {
        "node_id": node,
        "status": status,
        "queue": queue,
        "name": name,
        "array_id": as_job_id(array_id) if array_id else None,
        "owner": owner,
    }
    # An array reads in its own order, by index: the order it was submitted in.
    oldest = oldest or array_id is not None

    def select() -> tuple[list[dict[str, Any]], str]:
        return _select(client, filters, limit, after, oldest)

    if watch is not None:
        order = "oldest" if oldest else "newest"
        _watch(watch, f"tiny-scheduler list ({order} first)", select)
        return
    jobs, hint = select()
    if as_json:
        echo_json(jobs)
    elif not jobs:
        click.echo("no jobs", err=True)
    else:
        click.echo(jobs_table(jobs, _now()))
    if hint:
        click.echo(hint, err=True)


def _select(
    client: Client,
    filters: dict[str, str | None],
    limit: int,
    after: str | None,
    oldest: bool,
    owner: str | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """The jobs `list` shows, in its order, and a hint about those it leaves out ('' if none)."""
    # Every request here carries `limit`, so a node's pending jobs are listed like any other
    # filter: only the agent's exact query (node_id and status=pending alone) is its poll.
    if oldest:
        jobs, following = client.page(limit, after, **filters)
        return jobs, _more_hint(following)
    jobs, left_out = client.newest(limit, after, **filters)
    return jobs, _older_hint(left_out)


def _now() -> str:
    """This moment as the API writes times (RFC 3339 UTC), to compare with theirs."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _more_hint(following: str | None) -> str:
    return f"more jobs follow: add --after {following}" if following else ""


def _older_hint(left_out: bool) -> str:
    if not left_out:
        return ""
    return "older jobs not shown: raise --limit, or list from the first with --oldest"


def _watch(every: float, title: str, select: Callable[[], tuple[list[dict], str]]) -> None:
    """Redraw the table every `every` seconds until Ctrl-C, which ends it with exit 0.

    A failed call is shown in place of the table and tried again next time: a scheduler
    restarting must not end the watch.
    """
    try:
        while True:
            try:
                jobs, hint = select()
                frame = (jobs_table(jobs, _now()) if jobs else "no jobs") + (
                    f"\n{hint}" if hint else ""
                )
            except ClientError as exc:
                frame = f"error: {exc.message}"
            now = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S")
            click.clear()
            click.echo(f"{title}, every {every:g}s, at {now} UTC; Ctrl-C ends\n\n{frame}")
            time.sleep(every)
    except KeyboardInterrupt:
        click.echo()


# --- logs and cancel ----------------------------------------------------------------------------


@click.command()
@click.argument("job_id")
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Print the output as the job writes it (stdout to stdout, stderr to stderr) until"
    " it ends, then exit with its exit status, as --wait does.",
)
@_json_option
@click.pass_context
def logs(ctx: click.Context, job_id: str, follow: bool, as_json: bool) -> None:
    """Show the output of every attempt of a job, the latest last."""
    if follow:
        if as_json:
            raise click.UsageError("--follow prints the output as it comes; use one or the other")
        client = client_from(ctx)
        try:
            job = follow_output(client, as_job_id(job_id))
        except KeyboardInterrupt:
            click.echo(f"\nstopped following; {as_job_id(job_id)} goes on without us", err=True)
            sys.exit(130)
        sys.exit(exit_status(job))
    client = client_from(ctx)
    job = client.job(as_job_id(job_id))
    latest = {
        name: job[name]
        for name in (
            *("node_id", "exit_code", "reason", "stdout", "stderr"),
            *("running_at", "finished_at"),
        )
        if name in job
    }
    if job["status"] == RUNNING:
        # A running attempt's output so far is not part of the job: it is the live output.
        latest.update(live_output(client, job["job_id"]))
    # An earlier attempt is one that failed and was retried; the API does not repeat that.
    earlier = [{**attempt, "status": FAILED} for attempt in job.get("attempts", [])]
    attempts = [*earlier, {**latest, "status": job["status"]}]
    if as_json:
        echo_json({"job_id": job["job_id"], "status": job["status"], "attempts": attempts})
    else:
        print_attempts(job, attempts)


@click.command()
@click.argument("job_id")
@_json_option
@click.pass_context
def cancel(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Cancel a job: a pending one never runs, a running one is stopped on its node (SIGTERM,
    then SIGKILL). It ends failed, reason cancelled, exit -1."""
    job = client_from(ctx).cancel(as_job_id(job_id))
    if as_json:
        echo_json(job)
    else:
        click.echo(f"{job['job_id']} {describe(job)}")


stop = click.Command(
    "stop",
    callback=cancel.callback,
    params=cancel.params,
    help="Stop a job, running or pending: the same as `cancel`. A running job's process is"
    " sent SIGTERM on its node, then SIGKILL; the job ends failed, reason cancelled.",
    short_help="Stop a running or pending job (the same as cancel).",
)

COMMANDS = (submit, status, list_jobs, logs, cancel, stop)
"""The job commands, in the order `--help` lists them."""
