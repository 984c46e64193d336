"""The agent's heartbeat: `PUT /nodes/{node_id}` and what its reply asks for.

The body says what the node offers and runs: `{"cpu_count":N,"running":[…],"version":"…"}`,
where `cpu_count` is the agent's slot count (under `MAX_JOBS_PER_NODE=auto` the scheduler
gives a node as many jobs as that) and `running` lists the jobs whose outcome this node still
holds: live processes, and ended jobs whose final report waits in the spool. A spooled report
is listed because the scheduler fails a `running` job that two heartbeats in a row leave out
("lost by its agent") and runs it again, while its outcome is on this disk, on its way.

The reply may set a new period (`heartbeat_secs`), flag a drain, and list jobs to `stop`.
A scheduler without the endpoint answers 404 or 405: `beat()` then says so (`supported` is
false) and the agent keeps polling and running work as a tiny-aws agent would.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from importlib import metadata
from urllib.parse import quote

from .wire import Unreachable, Wire


def agent_version() -> str:
    try:
        return metadata.version("tiny-scheduler")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclasses.dataclass(frozen=True)
class Beat:
    """What one heartbeat found out. `answered` is false when no scheduler was reached;
    `supported` false when the scheduler has no heartbeat endpoint."""

    answered: bool
    supported: bool = True
    status: int = 0
    heartbeat_secs: float | None = None
    drain: bool = False
    stop: tuple[str, ...] = ()


def beat(wire: Wire, node_id: str, cpu_count: int, running: Iterable[str], version: str) -> Beat:
    """Send one heartbeat; never raises for what the network or the scheduler does."""
    body = {"cpu_count": cpu_count, "running": sorted(running), "version": version}
    try:
        reply = wire.call("PUT", f"/nodes/{quote(node_id, safe='')}", json=body)
    except Unreachable:
        return Beat(answered=False)
    if reply.status_code in (404, 405):
        return Beat(answered=True, supported=False, status=reply.status_code)
    if not reply.ok:
        return Beat(answered=True, status=reply.status_code)
    try:
        data = json.loads(reply.content)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return Beat(answered=True, status=reply.status_code)
    period = data.get("heartbeat_secs")
    if isinstance(period, bool) or not isinstance(period, int | float) or period <= 0:
        period = None
    stop = data.get("stop")
    stop_ids = tuple(s for s in stop if isinstance(s, str)) if isinstance(stop, list) else ()
    return Beat(
        answered=True,
        status=reply.status_code,
        heartbeat_secs=float(period) if period is not None else None,
        drain=data.get("drain") is True,
        stop=stop_ids,
    )
