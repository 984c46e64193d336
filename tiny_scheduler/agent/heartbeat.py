"""The agent's heartbeat: `PUT /nodes/{node_id}` and what its reply asks for.

The body says what the node offers and runs: `{"cpu_count":N,"running":[…],"version":"…"}`,
where `cpu_count` is the agent's slot count (under `MAX_JOBS_PER_NODE=auto` the scheduler
gives a node as many jobs as that) and `running` lists the jobs whose outcome this node still
holds: live processes, and ended jobs whose final report waits in the spool. A spooled report
is listed because the scheduler fails a `running` job that two heartbeats in a row leave out
("lost by its agent") and runs it again, while its outcome is on this disk, on its way.

Round four adds, each optional: `fence_secs` (the node stops its own jobs when no answer
has come for that long), `agent_id` (one agent per node id: another agent's heartbeat gets
409), `refusing_work` (why the agent takes no new work), `attempts` (the attempt of each
listed job), and the node's capacity beside `cpu_count`: `memory_mb` (when known), `gpus`,
`labels` (when it has any) and `enforcement` (`cgroup-v2`, `cgroup-v1` or `none`). The
answer adds `node_lost_secs` and `job_timeout_secs`, from which the agent's automatic fence
and its jobs' default timeout come.

The reply may set a new period (`heartbeat_secs`), flag a drain, and list jobs to `stop`.

Waiting for work (round four): with `wait_secs` and `want` (its free slots), the scheduler
answers once it has work for the node, a stop order or a drain change, or after `wait_secs`,
and the answer's `jobs` lists what it hands out, as its poll would (`protocol.parse_jobs`).
A scheduler without the endpoint answers 404 or 405: `beat()` then says so (`supported` is
false) and the agent keeps polling and running work as a tiny-aws agent would.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from importlib import metadata
from typing import Any
from urllib.parse import quote

from .protocol import PolledJob, parse_jobs
from .wire import TIMEOUT, Unreachable, Wire


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
    node_lost_secs: float | None = None  # None: a scheduler from before fencing
    job_timeout_secs: float | None = None
    text: str = ""  # the answer's text, when it was not 2xx
    jobs: tuple[PolledJob, ...] = ()  # handed out to a heartbeat that waited for work
    waited: bool = False  # the answer has `jobs`: the scheduler knows how to wait for work


@dataclasses.dataclass(frozen=True)
class Facts:
    """What a heartbeat tells about this node."""

    cpu_count: int
    attempts: Mapping[str, int | None]  # the jobs it runs, each with its attempt if known
    version: str
    agent_id: str = ""
    fence_secs: float | None = None
    refusing_work: str = ""
    memory_mb: int = 0  # 0: unknown, left out
    gpus: int = 0
    labels: tuple[tuple[str, str], ...] = ()
    enforcement: str = ""
    wait_secs: float | None = None  # None: answered at once, no jobs handed out
    want: int = 0  # free slots, when it waits

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "cpu_count": self.cpu_count,
            "running": sorted(self.attempts),
            "version": self.version,
            "attempts": {job: n for job, n in sorted(self.attempts.items()) if n is not None},
        }
        if self.agent_id:
            body["agent_id"] = self.agent_id
        if self.fence_secs is not None:
            body["fence_secs"] = self.fence_secs
        if self.refusing_work:
            body["refusing_work"] = self.refusing_work
        if self.memory_mb:
            body["memory_mb"] = self.memory_mb
        body["gpus"] = self.gpus
        if self.labels:
            body["labels"] = dict(self.labels)
        if self.enforcement:
            body["enforcement"] = self.enforcement
        if self.wait_secs is not None:
            body["wait_secs"] = self.wait_secs
            body["want"] = self.want
        return body


def beat(wire: Wire, node_id: str, facts: Facts) -> Beat:
    """Send one heartbeat; never raises for what the network or the scheduler does."""
    body = facts.body()
    # A waiting heartbeat's answer may come as late as `wait_secs`, then as quick as ever.
    timeout = TIMEOUT if not facts.wait_secs else (TIMEOUT[0], TIMEOUT[1] + facts.wait_secs)
    try:
        reply = wire.call("PUT", f"/nodes/{quote(node_id, safe='')}", json=body, timeout=timeout)
    except Unreachable:
        return Beat(answered=False)
    if reply.status_code in (404, 405):
        return Beat(answered=True, supported=False, status=reply.status_code)
    if not reply.ok:
        return Beat(answered=True, status=reply.status_code, text=reply.text.strip()[:300])
    try:
        data = json.loads(reply.content)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return Beat(answered=True, status=reply.status_code)
    period = data.get("heartbeat_secs")
    if isinstance(period, bool) or not isinstance(period, int | float) or period <= 0:
        period = None
    try:
        handed = tuple(parse_jobs(data.get("jobs", [])))
    except ValueError:
        handed = ()  # as an unreadable poll reply: nothing taken this time
    stop = data.get("stop")
    stop_ids = tuple(s for s in stop if isinstance(s, str)) if isinstance(stop, list) else ()
    return Beat(
        answered=True,
        status=reply.status_code,
        heartbeat_secs=float(period) if period is not None else None,
        drain=data.get("drain") is True,
        stop=stop_ids,
        node_lost_secs=_seconds(data.get("node_lost_secs")),
        job_timeout_secs=_seconds(data.get("job_timeout_secs")),
        jobs=handed,
        waited="jobs" in data,
    )


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)
