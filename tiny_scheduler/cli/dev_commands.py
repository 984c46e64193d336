"""The dev commands of the command line: `dev` runs a local dev cluster until Ctrl-C, and
`dev registry` a stand-alone dev registry that a real daemon can be pointed at.

They start and stop the parts in `tiny_scheduler/dev/` and print where those listen; the
parts themselves live there, not here.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from .output import CliError

REGISTRY_PORT = 9000
"""Where `dev registry` listens by default: the port of REGISTRY_URL's default."""


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run_until_interrupted(what: str, body: Callable[[], None], stop: Callable[[], None]) -> None:
    """Run `body` until it ends or Ctrl-C or SIGTERM end it (the way these commands are meant
    to end), then `stop()`. Signals are ignored while `stop()` runs: a second Ctrl-C cutting it
    short would leave processes behind. Whatever `body` raised propagates after `stop()`."""
    previous_int = signal.getsignal(signal.SIGINT)
    previous_term = signal.signal(signal.SIGTERM, _interrupt)
    try:
        body()
    except KeyboardInterrupt:
        click.echo(f"\nstopping the {what}…", err=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            stop()
        finally:
            signal.signal(signal.SIGINT, previous_int)
            signal.signal(signal.SIGTERM, previous_term)
    click.echo("stopped.", err=True)


@click.group(invoke_without_command=True)
@click.option(
    "--agents",
    type=click.IntRange(1, 64),
    default=3,
    show_default=True,
    help="How many agents (compute nodes) to run.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=9001,
    show_default=True,
    help="The scheduler's port on 127.0.0.1 (standbys take the next ones); 0 picks free ones.",
)
@click.option(
    "--registry-port",
    type=click.IntRange(0, 65535),
    default=0,
    help="The dev registry's port; 0 picks a free one.",
)
@click.option(
    "--poll-secs",
    type=click.FloatRange(min=0.05),
    help="Agents poll for work this often instead of waiting for it in their heartbeats.",
)
@click.option(
    "--heartbeat-secs",
    type=click.FloatRange(min=0.05),
    help="Seconds between two heartbeats of an agent to the registry [10].",
)
@click.option(
    "--unhealthy-after",
    type=click.FloatRange(min=0.1),
    help="Seconds without a heartbeat after which the registry calls a node unhealthy [30].",
)
@click.option(
    "--scan-secs",
    type=click.FloatRange(min=0.01),
    help="Seconds between two scans for timed-out jobs and lost nodes"
    " (TIMEOUT_SCAN_INTERVAL_SECS) [10].",
)
@click.option(
    "--node-lost-secs",
    type=click.FloatRange(min=0),
    help="Seconds a node may be unhealthy or gone before its running jobs fail"
    " (NODE_LOST_SECS) [60].",
)
@click.option(
    "--quick", is_flag=True, help="Short periods everywhere (a demo in seconds), as `make demo`."
)
@click.option(
    "--standby",
    "standbys",
    type=click.IntRange(0, 8),
    default=0,
    help="Run N standby daemons beside the leader, on a PostgreSQL database of the cluster's own.",
)
@click.option(
    "--postgres",
    "postgres_url",
    metavar="URL",
    help="The PostgreSQL server for --standby [postgresql://postgres@127.0.0.1:5432/postgres].",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False),
    help="Keep the database, logs and scratch dirs here (default: a temp dir, removed).",
)
@click.pass_context
def dev(
    ctx: click.Context,
    agents: int,
    port: int,
    registry_port: int,
    poll_secs: float | None,
    heartbeat_secs: float | None,
    unhealthy_after: float | None,
    scan_secs: float | None,
    node_lost_secs: float | None,
    quick: bool,
    standbys: int,
    postgres_url: str | None,
    work_dir: str | None,
) -> None:
    """Run a local dev cluster until Ctrl-C: a registry, AGENTS agents and the scheduler,
    all on loopback. Everything is stopped on the way out.

    `dev registry` runs only a registry, for a daemon started by other means.
    """
    if ctx.invoked_subcommand is not None:
        given = [
            f"--{param.name.replace('_', '-')}"
            for param in ctx.command.params
            if param.name and ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE
        ]
        if given:
            raise click.UsageError(
                f"{', '.join(given)}: options of the dev cluster, not of"
                f" `dev {ctx.invoked_subcommand}`; put them after `{ctx.invoked_subcommand}`"
            )
        return
    # Imported here: the client commands should not pay for loading the dev cluster.
    from ..dev.cluster import ClusterConfig, ClusterError, DevCluster

    given_secs = {
        "poll_secs": poll_secs,
        "heartbeat_secs": heartbeat_secs,
        "unhealthy_after": unhealthy_after,
        "scan_interval_secs": scan_secs,
        "node_lost_secs": node_lost_secs,
    }
    settings: dict[str, Any] = {
        "agents": agents,
        "scheduler_port": port or None,
        "registry_port": registry_port,
        "api_key": os.environ.get("TINYAWS_API_KEY") or None,
        "work_dir": work_dir,
        "standbys": standbys,
        "postgres_url": postgres_url,
        **{name: value for name, value in given_secs.items() if value is not None},
    }
    config = ClusterConfig.quick(**settings) if quick else ClusterConfig(**settings)
    try:
        cluster = DevCluster(config)
    except OSError as exc:
        raise CliError(f"cannot use {work_dir} as the work dir: {exc.strerror}") from None

    def run() -> None:
        click.echo("starting the dev cluster…", err=True)
        cluster.start()
        _print_cluster_banner(cluster)
        leader = None
        while not (problems := cluster.problems()):
            if standbys:
                leader = _show_leader(cluster, leader)
                # N+1 daemons, always: a killed one comes back, as a standby.
                for url in cluster.supervise():
                    click.echo(f"restarted the daemon at {url}", err=True)
            time.sleep(0.5)
        for problem in problems:
            click.echo(f"error: {problem}", err=True)
        sys.exit(1)

    try:
        _run_until_interrupted("dev cluster", run, cluster.stop)
    except ClusterError as exc:
        raise CliError(str(exc)) from None


def _print_cluster_banner(cluster: Any) -> None:
    config = cluster.config
    lines = [f"scheduler  {cluster.scheduler_url}  (log {cluster.scheduler_log})"]
    lines += [f"standby    {proc.url}  (log {proc.log_path})" for proc in cluster.standbys]
    if cluster.standbys:
        lines.append(f"database   {cluster.database} (dropped at the end)")
    kill = "kill -9 -PID  # the leader's PID, printed below: watch a standby take over\n"
    click.echo(
        "\n".join(lines) + "\n"
        f"dashboard  {cluster.scheduler_url}/ui/\n"
        f"registry   {cluster.registry_url}\n"
        f"agents     {' '.join(cluster.node_ids)}  ({_intake(config.poll_secs)},"
        f" logs in {cluster.work_dir})\n"
        "\n"
        f"export SCHEDULER_URL={cluster.scheduler_urls}\n"
        "tiny-scheduler submit --wait 'echo hello from $TINY_NODE_ID'\n"
        + (kill if cluster.standbys else "")
        + "\nCtrl-C stops everything."
    )


def _show_leader(cluster: Any, shown: str | None) -> str | None:
    """Print who leads when that changed (so a takeover can be watched); returns it."""
    import requests

    for daemon in cluster.daemons:
        try:
            reply = requests.get(daemon.url + "/leader", timeout=1)
        except requests.RequestException:
            continue
        if reply.status_code == 200:
            leader = f"{daemon.url} (epoch {reply.json()['epoch']}, pid {daemon.proc.pid})"
            if leader != shown:
                click.echo(f"leader: {leader}", err=True)
            return leader
    return shown


def _parse_nodes(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> list[tuple[str, int]]:
    """`node-a` or `node-b:4` (its cpu_count) -> [(id, cpus)]."""
    nodes = []
    for value in values:
        node_id, _, cpus = value.rpartition(":") if ":" in value else (value, "", "1")
        if not node_id or not cpus.isdigit() or int(cpus) < 1:
            raise click.BadParameter(f"{value!r} is not ID or ID:CPUS (CPUS at least 1)")
        nodes.append((node_id, int(cpus)))
    return nodes


@dev.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=REGISTRY_PORT,
    show_default=True,
    help="0: any free port. 9000 is where the scheduler looks by default.",
)
@click.option(
    "--node",
    "nodes",
    multiple=True,
    metavar="ID[:CPUS]",
    callback=_parse_nodes,
    help="A healthy compute node to list (CPUS: its cpu_count [1]); repeat.",
)
def registry(host: str, port: int, nodes: list[tuple[str, int]]) -> None:
    """Run a stand-alone dev registry until Ctrl-C.

    It lists each --node as a healthy compute node (no agent needs to heartbeat for it), and
    nodes whose agents register and heartbeat, as the tiny-aws registry does. Point a real
    daemon at it with REGISTRY_URL. When TINYAWS_API_KEY is set it wants that key, as the real
    registry does, and the daemon sends the same one.
    """
    from ..dev.registry import FakeRegistry

    try:
        server = FakeRegistry(host=host, port=port, key=os.environ.get("TINYAWS_API_KEY") or None)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    for node_id, cpus in nodes:
        server.set_node(node_id, cpu_count=cpus)
    server.start()

    def run() -> None:
        listed = ", ".join(f"{n} ({c} cpu{'s' if c > 1 else ''})" for n, c in nodes)
        click.echo(
            f"registry  {server.url}\n"
            f"nodes     {listed or 'none yet'}\n"
            "\n"
            f"REGISTRY_URL={server.url} tiny-scheduler serve\n"
            "\n"
            "Ctrl-C stops it."
        )
        while True:  # the server answers on its own thread; a signal ends this
            time.sleep(3600)

    _run_until_interrupted("registry", run, server.stop)


def _intake(poll_secs: float | None) -> str:
    """How the dev cluster's agents get their work, for the banner."""
    return f"poll every {poll_secs:g}s" if poll_secs else "waiting for work"
