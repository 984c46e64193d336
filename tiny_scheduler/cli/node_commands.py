"""The node commands and `version`: `tiny-scheduler nodes`, `node drain|undrain ID`,
`version`.

Clients of `GET /nodes`, `PATCH /nodes/{id}` and `GET /health` as `job_commands` is of /jobs:
a table for people, `--json` for scripts, the scheduler's error texts verbatim.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import click

from ..display import format_table, short_time
from ..version import version as client_version
from .job_commands import client_from
from .output import echo_json

NODE_COLUMNS = (
    *("NODE", "HEALTH", "SOURCE", "SLOTS", "RUNNING", "PENDING", "DRAIN"),
    *("MEMORY", "GPUS", "HEARTBEAT (UTC)", "VERSION", "LABELS"),
)
"""The header of `nodes`. SLOTS, MEMORY and GPUS read `in use/total` (a job takes its cpus
of the slots); memory in GiB, `-` where the node's agent reported none (a registry node)."""

_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")


@click.command()
@_json_option
@click.pass_context
def nodes(ctx: click.Context, as_json: bool) -> None:
    """List the compute nodes, sorted by id: health, slots, load, drain."""
    found = client_from(ctx).json("GET", "/nodes")
    if as_json:
        echo_json(found)
    elif not found:
        click.echo("no nodes", err=True)
    else:
        click.echo(format_table(NODE_COLUMNS, [_row(node) for node in found]))


def _row(node: dict[str, Any]) -> tuple[str, ...]:
    capacity = node.get("capacity") or {"cpus": node["slots"], "gpus": 0}
    allocated = node.get("allocated") or {"cpus": 0, "gpus": 0}
    memory = "-"
    if "memory_mb" in capacity:
        memory = f"{_gib(allocated.get('memory_mb', 0))}/{_gib(capacity['memory_mb'])}G"
    gpus = f"{allocated['gpus']}/{capacity['gpus']}" if capacity["gpus"] else "-"
    labels = ",".join(f"{k}={v}" for k, v in sorted((node.get("labels") or {}).items()))
    return (
        node["node_id"],
        node["health"],
        node["source"],
        f"{allocated['cpus']}/{capacity['cpus']}",
        str(node["running"]),
        str(node["pending"]),
        "yes" if node["drain"] else "no",
        memory,
        gpus,
        short_time(node.get("last_heartbeat_at")),
        node.get("version", "-"),
        labels or "-",
    )


def _gib(mib: int) -> str:
    """MiB as GiB with one decimal where it helps (`0.5`, `4`, `31.4`)."""
    gib = mib / 1024
    return f"{gib:.0f}" if gib >= 10 or gib == int(gib) else f"{gib:.1f}"


@click.group()
def node() -> None:
    """Change one node: drain it (no new jobs) or undrain it."""


def _set_drain(ctx: click.Context, node_id: str, drain: bool, as_json: bool) -> None:
    changed = client_from(ctx).json(
        "PATCH", f"/nodes/{quote(node_id, safe='')}", json={"drain": drain}
    )
    if as_json:
        echo_json(changed)
    elif drain:
        click.echo(
            f"{changed['node_id']} draining: no new jobs; its {changed['running']} running"
            " job(s) finish, its pending ones move to other nodes"
        )
    else:
        click.echo(f"{changed['node_id']} takes new jobs again")


@node.command()
@click.argument("node_id")
@_json_option
@click.pass_context
def drain(ctx: click.Context, node_id: str, as_json: bool) -> None:
    """Give NODE_ID no new job; its pending jobs move to other nodes, its running ones finish."""
    _set_drain(ctx, node_id, True, as_json)


@node.command()
@click.argument("node_id")
@_json_option
@click.pass_context
def undrain(ctx: click.Context, node_id: str, as_json: bool) -> None:
    """Let NODE_ID take new jobs again."""
    _set_drain(ctx, node_id, False, as_json)


@click.command()
@_json_option
@click.pass_context
def version(ctx: click.Context, as_json: bool) -> None:
    """This command line's version, and the scheduler's when it can be reached."""
    from ..client import ClientError

    mine = client_version()
    try:
        health = client_from(ctx).json("GET", "/health")
        server: str | None = health.get("version") or "unknown (a scheduler that does not say)"
        problem = None
    except ClientError as exc:
        server, problem = None, exc.message
    if as_json:
        echo_json({"client": mine, "server": server, **({"error": problem} if problem else {})})
        return
    click.echo(f"client  {mine}")
    click.echo(f"server  {server if server else f'unknown: {problem}'}")


COMMANDS = (nodes, node, version)
"""The node commands and `version`, in the order `--help` lists them."""
