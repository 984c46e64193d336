"""`tiny-scheduler agent`: run the compute agent of this node until SIGTERM.

This module owns the command's options (each with its environment variable) and the process
around the agent: logging, the signals that start a drain, the exit code. The agent itself is
`tiny_scheduler/agent/`, imported only when the command runs.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys

import click

from ..agent import config as defaults
from ..client import base_urls
from .output import CliError


class _Fence(click.ParamType):
    """`auto`, or a number of seconds above 0."""

    name = "auto|SECONDS"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None):
        if value is None or isinstance(value, float):
            return value
        if str(value).strip().lower() == "auto":
            return None
        try:
            seconds = float(str(value))
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            self.fail(f"{value!r} is neither auto nor a number of seconds above 0", param, ctx)
        return seconds


FENCE = _Fence()


@click.command()
@click.option(
    "--node-id",
    envvar="AGENT_NODE_ID",
    default=socket.gethostname,
    show_default="the host name",
    help="This node's id, as the scheduler places jobs on it (env AGENT_NODE_ID).",
)
@click.option(
    "--slots",
    envvar="AGENT_SLOTS",
    type=click.IntRange(min=1, max=1024),
    default=lambda: min(os.cpu_count() or 1, 1024),
    show_default="the CPU count",
    help="This node's CPUs: a `run` job takes its cpus of them (at least one), a service none"
    " (env AGENT_SLOTS).",
)
@click.option(
    "--memory-mb",
    envvar="AGENT_MEMORY_MB",
    type=click.IntRange(min=1, max=16_777_216),
    show_default="MemTotal of /proc/meminfo",
    help="This node's memory for jobs, in MiB (env AGENT_MEMORY_MB).",
)
@click.option(
    "--gpus",
    envvar="AGENT_GPUS",
    type=click.IntRange(min=0, max=64),
    show_default="the count of /dev/nvidia[0-9]*",
    help="This node's GPUs, handed to jobs by index (env AGENT_GPUS).",
)
@click.option(
    "--label",
    "label_texts",
    envvar="AGENT_LABELS",
    multiple=True,
    metavar="KEY=VALUE",
    help="A label of this node, for jobs' node_selector; repeatable (env AGENT_LABELS,"
    " space-separated).",
)
@click.option(
    "--enforcement",
    envvar="AGENT_ENFORCEMENT",
    type=click.Choice(["auto", "none"]),
    default="auto",
    show_default=True,
    help="auto: a cgroup per job with its memory limit and CPU quota, where the machine"
    " allows; none: no cgroups (env AGENT_ENFORCEMENT).",
)
@click.option(
    "--work-dir",
    envvar="AGENT_WORK_DIR",
    type=click.Path(file_okay=False),
    default=defaults.default_work_dir,
    show_default="~/.local/state/tiny-scheduler-agent",
    help="Jobs' scratch dirs go here (env AGENT_WORK_DIR).",
)
@click.option(
    "--spool-dir",
    envvar="AGENT_SPOOL_DIR",
    type=click.Path(file_okay=False),
    show_default="WORK_DIR/spool",
    help="Undelivered reports are kept here; it must survive a restart (env AGENT_SPOOL_DIR).",
)
@click.option(
    "--drain-secs",
    envvar="AGENT_DRAIN_SECS",
    type=click.FloatRange(min=0),
    default=defaults.DEFAULT_DRAIN_SECS,
    show_default=True,
    help="On SIGTERM, running jobs get this long to finish, then are stopped"
    " (env AGENT_DRAIN_SECS).",
)
@click.option(
    "--kill-grace-secs",
    envvar="KILL_GRACE_SECS",
    type=click.FloatRange(min=0),
    default=defaults.DEFAULT_KILL_GRACE_SECS,
    show_default=True,
    help="SIGTERM to SIGKILL when a job is stopped (env KILL_GRACE_SECS).",
)
@click.option(
    "--poll-secs",
    envvar="AGENT_POLL_SECS",
    type=click.FloatRange(min=0.05),
    default=None,
    show_default="wait for work instead",
    help="Poll for work this often, as the tiny-aws agent does, instead of waiting for it in"
    " the heartbeat, which starts a job as soon as it is submitted (env AGENT_POLL_SECS).",
)
@click.option(
    "--heartbeat-secs",
    envvar="NODE_HEARTBEAT_SECS",
    type=click.FloatRange(min=0.05),
    default=defaults.DEFAULT_HEARTBEAT_SECS,
    show_default=True,
    help="Heartbeat period until the scheduler asks for another (env NODE_HEARTBEAT_SECS).",
)
@click.option(
    "--max-output-bytes",
    envvar="MAX_OUTPUT_BYTES",
    type=click.IntRange(min=256),
    default=defaults.DEFAULT_MAX_OUTPUT_BYTES,
    show_default=True,
    help="Tail of each output stream kept per job (env MAX_OUTPUT_BYTES).",
)
@click.option(
    "--fence-secs",
    envvar="AGENT_FENCE_SECS",
    type=FENCE,
    default="auto",
    show_default=True,
    help="Stop this node's jobs when no heartbeat has been answered for this long (env"
    " AGENT_FENCE_SECS); auto: the longest the scheduler allows, at most 30.",
)
@click.option(
    "--drain-on-exit",
    envvar="AGENT_DRAIN_ON_EXIT",
    is_flag=True,
    help="On SIGTERM, drain (jobs finish, or are stopped after --drain-secs) instead of"
    " leaving them running for the next agent to take back (env AGENT_DRAIN_ON_EXIT).",
)
@click.option(
    "--spool-max-files",
    envvar="AGENT_SPOOL_MAX_FILES",
    type=click.IntRange(min=1),
    default=defaults.DEFAULT_SPOOL_MAX_FILES,
    show_default=True,
    help="At this many undelivered reports the agent takes no new work"
    " (env AGENT_SPOOL_MAX_FILES).",
)
@click.option(
    "--spool-max-bytes",
    envvar="AGENT_SPOOL_MAX_BYTES",
    type=click.IntRange(min=1),
    default=defaults.DEFAULT_SPOOL_MAX_BYTES,
    show_default=True,
    help="At this many bytes of undelivered reports the agent takes no new work"
    " (env AGENT_SPOOL_MAX_BYTES).",
)
@click.option(
    "--registry",
    "registry_url",
    envvar="AGENT_REGISTRY_URL",
    metavar="URL",
    help="Dev only: register and heartbeat with this (dev) registry, and register services.",
)
@click.option(
    "--registry-heartbeat-secs",
    type=click.FloatRange(min=0.05),
    default=defaults.DEFAULT_REGISTRY_HEARTBEAT_SECS,
    hidden=True,
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    envvar="AGENT_TOKEN_FILE",
    help="Read this node's credential (an agent token) from this file (env AGENT_TOKEN_FILE)"
    " instead of TINYAWS_API_KEY: a file keeps it out of the process list and the unit file.",
)
@click.option("--exit-with-parent", is_flag=True, hidden=True)
@click.pass_context
def agent(
    ctx: click.Context,
    node_id: str,
    slots: int,
    memory_mb: int | None,
    gpus: int | None,
    label_texts: tuple[str, ...],
    enforcement: str,
    work_dir: str,
    spool_dir: str | None,
    drain_secs: float,
    kill_grace_secs: float,
    poll_secs: float | None,
    heartbeat_secs: float,
    max_output_bytes: int,
    fence_secs: float | None,
    drain_on_exit: bool,
    spool_max_files: int,
    spool_max_bytes: int,
    registry_url: str | None,
    registry_heartbeat_secs: float,
    token_file: str | None,
    exit_with_parent: bool,
) -> None:
    """Run this node's compute agent: wait for work from the scheduler (--url, comma-separated
    for a leader and its standbys), run it, report it; its credential (an agent token for this
    node, or the shared key) is TINYAWS_API_KEY, or the contents of --token-file.

    Each job is owned by a small process of its own, so it outlives the agent: a restarted
    agent takes its jobs back. SIGTERM detaches: no new work, the jobs go on, the agent exits
    0 within seconds (with --drain-on-exit it drains instead: running jobs finish, or are
    stopped after --drain-secs). When no heartbeat is answered for --fence-secs, the node's
    jobs are stopped, whether the agent runs or not: the scheduler is about to run them
    elsewhere.
    """
    # Imported here: the other commands should not pay for loading the agent.
    from ..agent.config import AgentConfig
    from ..agent.main import Agent
    from ..agent.resources import labels_of

    try:
        urls = tuple(base_urls(ctx.obj or ""))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not urls:
        raise CliError("no scheduler URL: set --url or SCHEDULER_URL")
    try:
        labels = labels_of(label_texts)
    except ValueError as exc:
        raise CliError(f"--label: {exc}") from None
    logging.basicConfig(
        level=os.environ.get("AGENT_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s [%(levelname)s] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    config = AgentConfig(
        urls=urls,
        node_id=node_id,
        slots=slots,
        memory_mb=memory_mb,
        gpus=gpus,
        labels=labels,
        enforce=enforcement == "auto",
        work_dir=os.path.abspath(work_dir),
        spool_dir=os.path.abspath(spool_dir or os.path.join(work_dir, "spool")),
        key=_credential(token_file),
        # Polling when asked to, else waiting (polling every default period when the
        # scheduler does not wait for work).
        poll_secs=defaults.DEFAULT_POLL_SECS if poll_secs is None else poll_secs,
        wait_for_work=poll_secs is None,
        heartbeat_secs=heartbeat_secs,
        drain_secs=drain_secs,
        kill_grace_secs=kill_grace_secs,
        max_output_bytes=max_output_bytes,
        fence_secs=fence_secs,
        drain_on_exit=drain_on_exit,
        spool_max_files=spool_max_files,
        spool_max_bytes=spool_max_bytes,
        registry_url=registry_url,
        registry_heartbeat_secs=registry_heartbeat_secs,
        exit_with_parent=exit_with_parent,
    )
    try:
        node = Agent(config)
    except OSError as exc:
        raise CliError(f"cannot use {exc.filename}: {exc.strerror}") from None
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: node.request_drain())
    node.run()
    if node.fatal:
        raise CliError(node.fatal)


def _credential(token_file: str | None) -> str | None:
    """The agent's bearer credential: the first line of `token_file`, else TINYAWS_API_KEY."""
    if token_file is None:
        return os.environ.get("TINYAWS_API_KEY") or None
    try:
        with open(token_file, encoding="utf-8") as file:
            secret = file.readline().strip()
    except OSError as exc:
        raise CliError(f"cannot read --token-file {token_file}: {exc.strerror}") from None
    if not secret:
        raise CliError(f"--token-file {token_file} is empty")
    return secret
