"""The `tiny-scheduler` command line: run the daemon or a dev cluster, and talk to a scheduler.

`serve` runs the daemon; `dev` runs a local dev cluster until Ctrl-C. The other commands are
a client of the HTTP API (`api.md`): `submit`, `status`, `list`, `logs`, `cancel`. They read
`SCHEDULER_URL` (default http://127.0.0.1:9001) and `TINYAWS_API_KEY` (sent as the bearer
token), print aligned tables for people and `--json` for scripts, and report any error as one
line on stderr with a non-zero exit; the scheduler's own error texts are shown verbatim.
`--wait` shows progress on stderr and exits with the job's exit code.

This module owns presentation and the client side of the wire only: no rule of the scheduler
is repeated here.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn
from urllib.parse import parse_qs, quote, urlsplit

import click
import requests

from .daemon_command import SERVE_ARGV
from .jobs import (
    DONE,
    FAILED,
    FINAL_STATUSES,
    JOB_ID_PREFIX,
    PENDING,
    RUN,
    RUNNING,
    SERVICE,
    STATUSES,
)

DEFAULT_URL = "http://127.0.0.1:9001"
"""Where the scheduler listens unless SCHEDULER_URL says otherwise."""

HTTP_TIMEOUT = (3.0, 15.0)
"""(connect, read) seconds per request: a submission may wait on the registry and a commit."""

WAIT_INTERVAL_SECS = 1.0
"""Seconds between two looks at a job while waiting for it."""

WAIT_UNREACHABLE_SECS = 30.0
"""Seconds `--wait` keeps trying while the scheduler cannot be reached (a restart) before it
gives up."""

MAX_PAGE = 10000
"""The largest page the API serves."""

COMMAND_WIDTH = 48
"""Characters of a job's command shown in a table row."""


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class CliError(click.ClickException):
    """A failure shown as one line on stderr, exit status 1."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class ApiError(CliError):
    """The scheduler answered with an error status; `message` is its text, verbatim."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Unreachable(CliError):
    """No answer from the scheduler (down, wrong address, or too slow)."""


class Client:
    """A small client of one scheduler's HTTP API; every failure is a CliError."""

    def __init__(self, base_url: str, key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.session = requests.Session()
        # A proxy from the environment has no business relaying calls to this machine.
        self.session.trust_env = urlsplit(self.base_url).hostname not in _LOOPBACK
        if key:
            self.session.headers["Authorization"] = f"Bearer {key}"

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", HTTP_TIMEOUT)
        try:
            response = self.session.request(method, self.base_url + path, **kwargs)
        except requests.Timeout:
            raise Unreachable(
                f"the scheduler at {self.base_url} did not answer within {HTTP_TIMEOUT[1]:.0f}s"
            ) from None
        except requests.RequestException:
            raise Unreachable(
                f"cannot reach the scheduler at {self.base_url} (is it running? is SCHEDULER_URL"
                " right?)"
            ) from None
        if response.status_code == 401:
            hint = (
                "the scheduler rejected the key in TINYAWS_API_KEY"
                if self.key
                else "set TINYAWS_API_KEY to the scheduler's key"
            )
            raise ApiError(401, f"{_error_text(response)} ({hint})")
        if not response.ok:
            raise ApiError(response.status_code, _error_text(response))
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise CliError(
                f"{self.base_url}{path} answered {response.status_code} with something that is"
                " not JSON (is SCHEDULER_URL a tiny-scheduler?)"
            ) from None

    def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self.json("POST", "/jobs", json=body, headers=headers)

    def job(self, job_id: str) -> dict[str, Any]:
        return self.json("GET", f"/jobs/{quote(job_id, safe='')}")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self.json("POST", f"/jobs/{quote(job_id, safe='')}/cancel")

    def page(self, **params: Any) -> tuple[list[dict[str, Any]], str | None]:
        """One page of GET /jobs, and the `after` of the next page when there is one."""
        response = self.request("GET", "/jobs", params={k: v for k, v in params.items() if v})
        try:
            jobs = response.json()
        except ValueError:
            raise CliError("GET /jobs answered with something that is not JSON") from None
        following = response.links.get("next", {}).get("url")
        after = parse_qs(urlsplit(following).query).get("after", [None])[0] if following else None
        return jobs, after


def _error_text(response: requests.Response) -> str:
    """The scheduler's error text as it sent it (text/plain plus a newline), or the status."""
    text = response.text.strip()
    if text and response.headers.get("Content-Type", "").startswith("text/plain"):
        return text
    return f"HTTP {response.status_code} from {response.url}"


# --- presentation ---------------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Rows as left-aligned columns two spaces apart, under a header line."""
    widths = [len(header) for header in headers]
    for row in rows:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]
    lines = [headers, *rows]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def describe(job: dict[str, Any]) -> str:
    """`failed (exit 3)`, `done`, `running on node-2`: a job's state in a few words."""
    status = job["status"]
    if status in (DONE, FAILED) and "exit_code" in job:
        return f"{status} (exit {job['exit_code']})"
    if status in (PENDING, RUNNING):
        return f"{status} on {job['node_id']}"
    return status


def exit_status(job: dict[str, Any]) -> int:
    """The exit status `--wait` ends with: the job's exit code; 1 when it failed without a
    usable one (timed out, lost node: -1) or was cancelled."""
    if job["status"] == DONE:
        return 0
    code = job.get("exit_code")
    if job["status"] == FAILED and isinstance(code, int) and 0 < code < 256:
        return code
    return 1


def job_state(job: dict[str, Any]) -> tuple[str, str, int]:
    """What a watcher reports a change of: the status, the node, the retry count."""
    return (job["status"], job["node_id"], job["retry_count"])


def _short_time(stamp: str | None) -> str:
    """`2026-11-30T10:20:30.123456Z` -> `2026-11-30 10:20:30`."""
    if not stamp:
        return "-"
    return stamp[:19].replace("T", " ")


def _one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def _job_id(text: str) -> str:
    """Accept `7` as well as `job-7`."""
    return f"{JOB_ID_PREFIX}{text}" if text.isdigit() else text


# --- waiting ----------------------------------------------------------------------------------


def wait_for_job(
    client: Client,
    job_id: str,
    interval: float = WAIT_INTERVAL_SECS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Look at the job every `interval` seconds until it is final; returns it.

    `progress` gets a line whenever the job changes (status, node, retry). A scheduler that
    cannot be reached is retried for WAIT_UNREACHABLE_SECS: a restart loses no job.
    """
    started = time.monotonic()
    seen: tuple[Any, ...] = ()
    unreachable_since: float | None = None
    while True:
        try:
            job = client.job(job_id)
            unreachable_since = None
        except Unreachable as exc:
            if not seen:
                raise  # never reached: a wrong address, not a restart
            now = time.monotonic()
            if unreachable_since is None:
                unreachable_since = now
                if progress:
                    progress(f"{exc.message}; retrying")
            elif now - unreachable_since > WAIT_UNREACHABLE_SECS:
                raise
            time.sleep(interval)
            continue
        state = job_state(job)
        if state != seen:
            seen = state
            if progress:
                retry = f" (retry {job['retry_count']})" if job["retry_count"] else ""
                elapsed = time.monotonic() - started
                progress(f"[{elapsed:6.1f}s] {job_id} {describe(job)}{retry}")
        if job["status"] in FINAL_STATUSES:
            return job
        time.sleep(interval)


def _wait_and_exit(client: Client, job_id: str, as_json: bool, interval: float) -> NoReturn:
    try:
        job = wait_for_job(client, job_id, interval, lambda line: click.echo(line, err=True))
    except KeyboardInterrupt:
        click.echo(f"\nstopped waiting; {job_id} goes on without us", err=True)
        sys.exit(130)
    if as_json:
        _echo_json(job)
    else:
        _print_status(job)
    sys.exit(exit_status(job))


# --- commands ---------------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url",
    envvar="SCHEDULER_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="The scheduler's base URL (env SCHEDULER_URL).",
)
@click.pass_context
def main(ctx: click.Context, url: str) -> None:
    """tiny-scheduler: the job scheduler of a small self-hosted cloud.

    The client commands send TINYAWS_API_KEY, when set, as the bearer token.
    """
    ctx.obj = url


def _client(ctx: click.Context) -> Client:
    return Client(ctx.find_root().obj or DEFAULT_URL, os.environ.get("TINYAWS_API_KEY") or None)


_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")
_interval_option = click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=WAIT_INTERVAL_SECS,
    show_default=True,
    help="Seconds between looks at the job while waiting.",
)


@main.command()
def serve() -> None:
    """Run the scheduler daemon (gunicorn, configured from the environment)."""
    os.execv(sys.executable, SERVE_ARGV)


@main.command()
@click.argument("command", nargs=-1)
@click.option("--instance", "instance_id", help="Pin the job to this instance's node.")
@click.option("--env", "env", multiple=True, metavar="K=V", help="Environment variable; repeat.")
@click.option("--service", is_flag=True, help="A long-running service instead of a one-shot run.")
@click.option("--port", type=click.IntRange(1, 65535), help="The service's port.")
@click.option("--deploy-url", help="A zip in the object store whose start.sh the agent runs.")
@click.option("--timeout", "timeout_secs", type=click.IntRange(min=1), help="Run timeout, seconds.")
@click.option("--idempotency-key", help="Submitting again with the same key creates nothing.")
@click.option("--wait", is_flag=True, help="Wait for the job; exit with its exit code.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the job id.")
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
    wait: bool,
    quiet: bool,
    interval: float,
    as_json: bool,
) -> None:
    """Submit a job running COMMAND with `sh -c`.

    One argument is taken as a shell command as is (`submit 'echo $HOME'`); several are quoted
    and joined. Put `--` before a command that has options of its own:
    `submit --wait -- python3 -c 'print(1)'`.
    """
    if not command and not deploy_url:
        raise click.UsageError("give a COMMAND or --deploy-url")
    body: dict[str, Any] = {
        "command": command[0] if len(command) == 1 else shlex.join(command),
        "job_type": SERVICE if service else RUN,
        "env_vars": _parse_env(env),
    }
    optional = {
        "instance_id": instance_id,
        "port": port,
        "deploy_url": deploy_url,
        "timeout_secs": timeout_secs,
    }
    body.update({name: value for name, value in optional.items() if value is not None})
    client = _client(ctx)
    job = client.submit(body, idempotency_key)
    if wait:
        _wait_and_exit(client, job["job_id"], as_json, interval)
    if as_json:
        _echo_json(job)
    elif quiet:
        click.echo(job["job_id"])
    else:
        click.echo(f"{job['job_id']} {describe(job)}")


def _parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r} is not K=V", param_hint="--env")
        env[name] = value
    return env


@main.command()
@click.argument("job_id")
@click.option("--wait", is_flag=True, help="Wait until it is final; exit with its exit code.")
@_interval_option
@_json_option
@click.pass_context
def status(ctx: click.Context, job_id: str, wait: bool, interval: float, as_json: bool) -> None:
    """Show one job."""
    client = _client(ctx)
    job_id = _job_id(job_id)
    if wait:
        _wait_and_exit(client, job_id, as_json, interval)
    job = client.job(job_id)
    if as_json:
        _echo_json(job)
    else:
        _print_status(job)


def _print_status(job: dict[str, Any]) -> None:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in (job.get("env_vars") or {}).items())
    attempts = len(job.get("attempts", []))
    fields = [
        ("job", job["job_id"]),
        ("status", describe(job)),
        ("type", job["job_type"] + (f" on port {job['port']}" if job.get("port") else "")),
        ("node", job["node_id"]),
        ("instance", job.get("instance_id", "")),
        ("command", job["command"]),
        ("deploy url", job.get("deploy_url", "")),
        ("env", env),
        ("timeout", f"{job['timeout_secs']}s" if job.get("timeout_secs") else ""),
        ("retries", str(job["retry_count"])),
        ("created", job["created_at"]),
        ("running", job.get("running_at", "")),
        ("finished", job.get("finished_at", "")),
        ("attempts", f"{attempts} earlier (see: logs {job['job_id']})" if attempts else ""),
    ]
    rows = [(name, value) for name, value in fields if value]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        click.echo(f"{name.ljust(width)}  {value}")


@main.command(name="list")
@click.option("--node", help="Only jobs on this node.")
@click.option(
    "--status",
    type=click.Choice(STATUSES),
    help="Only jobs in this status.",
)
@click.option("--limit", type=click.IntRange(1, MAX_PAGE), default=100, show_default=True)
@click.option("--after", help="Only jobs created after this job id (the next page).")
@_json_option
@click.pass_context
def list_jobs(
    ctx: click.Context,
    node: str | None,
    status: str | None,
    limit: int,
    after: str | None,
    as_json: bool,
) -> None:
    """List jobs, oldest first."""
    client = _client(ctx)
    after = _job_id(after) if after else None
    if node and status == PENDING:
        jobs, more = _pending_on_node(client, node, limit, after)
    else:
        jobs, more = client.page(node_id=node, status=status, limit=limit, after=after)
    if as_json:
        _echo_json(jobs)
    elif not jobs:
        click.echo("no jobs", err=True)
    else:
        rows = [
            (
                job["job_id"],
                job["status"],
                str(job["exit_code"]) if "exit_code" in job else "-",
                job["node_id"],
                job["job_type"],
                str(job["retry_count"]),
                _short_time(job["created_at"]),
                _one_line(job["command"] or job.get("deploy_url", ""), COMMAND_WIDTH),
            )
            for job in jobs
        ]
        headers = ("JOB", "STATUS", "EXIT", "NODE", "TYPE", "RETRIES", "CREATED", "COMMAND")
        click.echo(format_table(headers, rows))
    if more:
        click.echo(f"more jobs follow: add --after {more}", err=True)


def _pending_on_node(
    client: Client, node: str, limit: int, after: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Pending jobs of one node, without sending the agent's poll.

    `GET /jobs?node_id=N&status=pending` is the agent poll: it answers at most the node's free
    slots (often none), so it cannot list a node's queue. List the node's jobs instead and keep
    the pending ones.
    """
    found: list[dict[str, Any]] = []
    cursor = after
    while True:
        page, cursor = client.page(node_id=node, limit=MAX_PAGE, after=cursor)
        for job in page:
            if job["status"] != PENDING:
                continue
            if len(found) == limit:
                return found, found[-1]["job_id"]
            found.append(job)
        if cursor is None:
            return found, None


@main.command()
@click.argument("job_id")
@_json_option
@click.pass_context
def logs(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Show the output of every attempt of a job, the latest last."""
    job = _client(ctx).job(_job_id(job_id))
    latest = {
        name: job[name]
        for name in ("node_id", "exit_code", "stdout", "stderr", "running_at", "finished_at")
        if name in job
    }
    attempts = [*job.get("attempts", []), {**latest, "status": job["status"]}]
    if as_json:
        _echo_json({"job_id": job["job_id"], "status": job["status"], "attempts": attempts})
        return
    total = len(attempts)
    for number, attempt in enumerate(attempts, 1):
        if number < total:
            outcome = f"failed (exit {attempt.get('exit_code', '?')})"
        else:
            outcome = describe({**job, **attempt}) + " (latest)"
        if number > 1:
            click.echo()
        click.echo(
            f"=== {job['job_id']} attempt {number}/{total} on {attempt['node_id']}: {outcome}"
        )
        for stream in ("stdout", "stderr"):
            text = attempt.get(stream, "")
            if text:
                click.echo(f"--- {stream} ---")
                click.echo(text, nl=not text.endswith("\n"))
        if not attempt.get("stdout") and not attempt.get("stderr"):
            click.echo("(no output)")


@main.command()
@click.argument("job_id")
@_json_option
@click.pass_context
def cancel(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Cancel a pending job."""
    job = _client(ctx).cancel(_job_id(job_id))
    if as_json:
        _echo_json(job)
    else:
        click.echo(f"{job['job_id']} {job['status']}")


@main.command()
@click.option("--agents", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=9001, show_default=True)
@click.option("--registry-port", type=click.IntRange(0, 65535), default=0, help="0: any.")
@click.option("--poll-secs", type=click.FloatRange(min=0.05), help="Agent poll period [3].")
@click.option("--heartbeat-secs", type=click.FloatRange(min=0.05), help="[10]")
@click.option("--unhealthy-after", type=click.FloatRange(min=0.1), help="Registry, secs [30].")
@click.option("--scan-secs", type=click.FloatRange(min=0.01), help="TIMEOUT_SCAN_INTERVAL_SECS")
@click.option("--node-lost-secs", type=click.FloatRange(min=0), help="NODE_LOST_SECS")
@click.option("--quick", is_flag=True, help="Short intervals everywhere, as `make demo` uses.")
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False),
    help="Keep the database, logs and scratch dirs here (default: a temp dir, removed).",
)
def dev(
    agents: int,
    port: int,
    registry_port: int,
    poll_secs: float | None,
    heartbeat_secs: float | None,
    unhealthy_after: float | None,
    scan_secs: float | None,
    node_lost_secs: float | None,
    quick: bool,
    work_dir: str | None,
) -> None:
    """Run a local dev cluster until Ctrl-C: a registry, AGENTS dev agents and the scheduler,
    all on loopback. Everything is stopped on the way out."""
    from .dev.cluster import ClusterConfig, ClusterError, DevCluster

    given = {
        "poll_secs": poll_secs,
        "heartbeat_secs": heartbeat_secs,
        "unhealthy_after": unhealthy_after,
        "scan_interval_secs": scan_secs,
        "node_lost_secs": node_lost_secs,
    }
    settings: dict[str, Any] = {
        "agents": agents,
        "scheduler_port": port,
        "registry_port": registry_port,
        "api_key": os.environ.get("TINYAWS_API_KEY") or None,
        "work_dir": work_dir,
        **{name: value for name, value in given.items() if value is not None},
    }
    config = ClusterConfig.quick(**settings) if quick else ClusterConfig(**settings)
    cluster = DevCluster(config)
    # SIGTERM ends the cluster as cleanly as Ctrl-C does.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        click.echo("starting the dev cluster…", err=True)
        cluster.start()
        _print_banner(cluster)
        while not (problems := cluster.problems()):
            time.sleep(0.5)
        for problem in problems:
            click.echo(f"error: {problem}", err=True)
        sys.exit(1)
    except ClusterError as exc:
        raise CliError(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("\nstopping the dev cluster…", err=True)
    finally:
        # A second Ctrl-C must not cut the shutdown short and leave processes behind.
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            cluster.stop()
        finally:
            signal.signal(signal.SIGINT, previous_int)
            signal.signal(signal.SIGTERM, previous)
    click.echo("stopped.", err=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _print_banner(cluster: Any) -> None:
    config = cluster.config
    click.echo(
        f"scheduler  {cluster.scheduler_url}  (log {cluster.scheduler_log})\n"
        f"registry   {cluster.registry_url}\n"
        f"agents     {' '.join(cluster.node_ids)}  (poll every {config.poll_secs:g}s,"
        f" logs in {cluster.work_dir})\n"
        "\n"
        f"export SCHEDULER_URL={cluster.scheduler_url}\n"
        "tiny-scheduler submit --wait 'echo hello from $TINY_NODE_ID'\n"
        "\n"
        "Ctrl-C stops everything."
    )
