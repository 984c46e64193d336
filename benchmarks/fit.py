"""The fit scenario of issue 34: a heterogeneous workload on four unequal nodes, against the
bound no schedule can beat, and against one job one slot; and, replayed on a virtual clock,
whether backfill ever starts a job later than strict priority-then-age order would.

The workload and the bound are `fit_trace.py`'s (300 jobs of 1, 2 or 4 CPUs in two bursts,
58 of them asking for `disk=ssd`; nodes of 2, 4, 4 and 8 CPUs, two with the label).

**On real daemons** (`REGISTRY_URL=builtin`, so `MAX_JOBS_PER_NODE` is `auto` and a node's
CPUs are its slots; everything else as in production), with the simulated agents of
`fit_agents.py`, three rows at the same time, each with its own daemon and agents (the jobs'
work is simulated, so three clusters fit on the machine at once), so the scenario costs one
makespan of wall time, not three:

- `least_loaded`: `PLACEMENT=least-loaded` (the default), with backfill and moving work;
- `binpack`: `PLACEMENT=binpack`;
- `one_slot`: the same trace without the jobs' `cpus`, every job one slot, as before issue
  34, under least-loaded. Its jobs still use their CPUs (the agents' `Cores`), so a node
  given more than it has slows down. Their `timeout_secs` are left out too: the daemon would
  fail a job that an overfilled node stretched past its timeout, and with every job one slot
  the timeouts decide nothing (a head that does not fit means no CPU is free).

Figures come from the scheduler's own stamps (`GET /jobs`): makespan from the first
`created_at` to the last `finished_at`, each job's wait from `created_at` to `running_at`.

**On a virtual clock** (`virtual_cluster.py`: the real service in memory, event by event),
the same trace twice per placement: with the real picker, and with a strict one that never
lets a job pass the first that does not fit. For each job, its start with backfill against
its start in strict order: how many started later, by how much, and whether any of them was a
*head* (a job backfill found blocked, which it may pass). The same again with every job
running exactly its timeout, which is what backfill's promise is made of.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tiny_scheduler.domain.jobs import parse_time

from . import fit_trace, virtual_cluster
from .fit_agents import Agent, Client
from .fit_trace import NODES, TraceJob
from .procs import Server, side_by_side

ROWS = {
    "least_loaded": ({"PLACEMENT": "least-loaded"}, False),
    "binpack": ({"PLACEMENT": "binpack"}, False),
    "one_slot": ({"PLACEMENT": "least-loaded"}, True),
}
"""Each daemon row: its scheduler settings, and whether the jobs go without `cpus`."""

REPLAYS = {"least_loaded": "least-loaded", "binpack": "binpack"}
"""The placements replayed on the virtual clock."""

TARGET_BOUND_FACTOR = 1.15
"""With fit (least-loaded and binpack): makespan within 15 % of the bound."""

_EPSILON = 1e-6  # seconds: starts closer than this are the same instant


def run(workdir: Path, server_env: dict[str, str], scale: float) -> dict[str, Any]:
    """The daemon rows at once, then the replays; their figures and the targets."""
    trace = fit_trace.trace(scale)
    bound = fit_trace.bound(trace)
    rows = side_by_side(
        {
            name: functools.partial(_run_row, name, {**server_env, **env}, trace, one_slot, workdir)
            for name, (env, one_slot) in ROWS.items()
        },
        "fit",
    )
    for name, row in rows.items():
        row["x_bound"] = round(row["makespan_s"] / bound, 3)
        if not ROWS[name][1]:
            row["met"] = row["makespan_s"] <= TARGET_BOUND_FACTOR * bound
    exact = [dataclasses.replace(job, secs=float(job.timeout_secs)) for job in trace]
    return {
        "fit": {
            "scale": scale,
            "jobs": len(trace),
            "bound_s": round(bound, 2),
            "bound_parts_s": {
                name: round(secs, 2) for name, secs in fit_trace.bound_parts(trace).items()
            },
            "work_cpu_s": round(fit_trace.work(trace), 1),
            "rows": rows,
            "replay": {name: _compare(trace, bound, p) for name, p in REPLAYS.items()},
            "replay_exact_timeouts": {
                name: _compare(exact, fit_trace.bound(exact), p) for name, p in REPLAYS.items()
            },
        }
    }


# --- the virtual clock ------------------------------------------------------------------------


def _compare(trace: Sequence[TraceJob], bound: float, placement: str) -> dict[str, Any]:
    """Backfill against strict order on the virtual clock, under `placement`."""
    backfill = virtual_cluster.replay(trace, NODES, placement=placement)
    strict = virtual_cluster.replay(trace, NODES, strict=True, placement=placement)
    later = {
        n: run.start - strict.runs[n].start
        for n, run in backfill.runs.items()
        if run.start > strict.runs[n].start + _EPSILON
    }
    earlier = sum(run.start < strict.runs[n].start - _EPSILON for n, run in backfill.runs.items())
    heads_later = {n: delay for n, delay in later.items() if n in backfill.heads}
    others_later = {n: delay for n, delay in later.items() if n not in backfill.heads}
    elsewhere = sum(backfill.runs[n].node_id != strict.runs[n].node_id for n in heads_later)
    return {
        "makespan_s": round(backfill.makespan, 2),
        "x_bound": round(backfill.makespan / bound, 3),
        "strict_makespan_s": round(strict.makespan, 2),
        "strict_x_bound": round(strict.makespan / bound, 3),
        "heads": len(backfill.heads),
        "heads_later": _delays(heads_later),
        "heads_later_elsewhere": elsewhere,  # ran on another node than in strict order
        "others_later": _delays(others_later),
        "earlier": int(earlier),
        "overfilled": backfill.overfilled + strict.overfilled,
        "met": not heads_later,
    }


def _delays(delays: dict[int, float]) -> dict[str, Any]:
    values = sorted(delays.values())
    return {
        "count": len(values),
        "max_s": round(values[-1], 2) if values else 0.0,
        "mean_s": round(statistics.fmean(values), 2) if values else 0.0,
        "jobs": sorted(delays),
    }


# --- the daemons ------------------------------------------------------------------------------


def _run_row(
    name: str, env: dict[str, str], trace: Sequence[TraceJob], one_slot: bool, workdir: Path
) -> dict[str, Any]:
    db = workdir / f"fit-{name}.db"
    for path in workdir.glob(f"{db.name}*"):
        path.unlink()
    settings = {**env, "SCHEDULER_LOG_LEVEL": "warning"}
    server = Server(db, "builtin", workdir / f"server-fit-{name}.log", settings)
    stop = threading.Event()
    agents: list[Agent] = []
    ran: dict[str, str] = {}  # job id -> the node that ran it
    lock = threading.Lock()

    def note(job_id: str, node_id: str) -> None:
        with lock:
            ran[job_id] = node_id

    try:
        server.start()
        agents = [Agent(server.addr, node, stop, note).start() for node in NODES]
        _wait_for_nodes(server.addr, len(NODES))
        submitted = _submit(server.addr, trace, one_slot)
        deadline = time.monotonic() + 60 + fit_trace.work(trace)  # as if on one CPU
        while len(ran) < len(submitted):
            if time.monotonic() > deadline:
                raise RuntimeError(f"fit {name}: only {len(ran)} of {len(submitted)} jobs done")
            time.sleep(0.2)
        finished = _get_json(server.addr, f"/jobs?limit={len(trace) + 100}&output=none")
    finally:
        stop.set()
        for agent in agents:
            agent.join(30)
        server.stop()
    return _figures(finished, trace, agents)


def _figures(
    jobs: list[dict[str, Any]], trace: Sequence[TraceJob], agents: list[Agent]
) -> dict[str, Any]:
    created = [parse_time(job["created_at"]) for job in jobs]
    waits = sorted(
        (parse_time(job["running_at"]) - parse_time(job["created_at"])) / 1e6 for job in jobs
    )
    makespan = (max(parse_time(job["finished_at"]) for job in jobs) - min(created)) / 1e6
    # How long each ran, from its claim to its report, against its run time alone and
    # against the timeout the trace gives it (which the one-slot row's jobs went without).
    elapsed = {
        int(job["env_vars"]["BENCH_N"]): (
            parse_time(job["finished_at"]) - parse_time(job["running_at"])
        )
        / 1e6
        for job in jobs
    }
    stretch = sorted(secs / trace[n].secs for n, secs in elapsed.items())
    per_node: dict[str, int] = {}
    for job in jobs:
        per_node[job["node_id"]] = per_node.get(job["node_id"], 0) + 1
    return {
        "jobs": len(jobs),
        "not_done": sum(job["status"] != "done" for job in jobs),
        "makespan_s": round(makespan, 2),
        "wait_p50_s": round(_quantile(waits, 0.5), 2),
        "wait_p99_s": round(_quantile(waits, 0.99), 2),
        "wait_mean_s": round(statistics.fmean(waits), 2),
        "stretch_p50": round(_quantile(stretch, 0.5), 2),
        "stretch_p99": round(_quantile(stretch, 0.99), 2),
        "past_timeout": sum(secs > trace[n].timeout_secs for n, secs in elapsed.items()),
        "per_node": dict(sorted(per_node.items())),
        # CPUs the jobs used at most at once on each node, beside the node's.
        "peak_cpus": {a.node.node_id: f"{a.cores.peak}/{a.node.cpus}" for a in agents},
        "overfilled_cpu_s": round(sum(a.cores.over_cpu_secs for a in agents), 1),
        "refused": sum(a.refused for a in agents),
        "errors": [error for a in agents for error in a.errors][:10],
    }


def _quantile(ordered: Sequence[float], share: float) -> float:
    """The value `share` of the way up the sorted values."""
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def _submit(addr: tuple[str, int], trace: Sequence[TraceJob], one_slot: bool) -> list[str]:
    """The trace's bursts, each at its time after the first (one client, back to back)."""
    client = Client(addr)
    began = time.monotonic()
    made = []
    try:
        for job in trace:
            pause = began + job.at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            status, data = client.call("POST", "/jobs", job.body(one_slot))
            if status != 201:
                raise RuntimeError(f"submission {job.n}: {status} {data!r}")
            made.append(json.loads(data)["job_id"])
    finally:
        client.close()
    return made


def _wait_for_nodes(addr: tuple[str, int], count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        nodes = _get_json(addr, "/nodes")
        if sum(node.get("health") == "healthy" for node in nodes) >= count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(nodes)} of {count} nodes heartbeat: {nodes}")
        time.sleep(0.1)


def _get_json(addr: tuple[str, int], path: str) -> Any:
    client = Client(addr)
    try:
        status, data = client.call("GET", path)
    finally:
        client.close()
    if status != 200:
        raise RuntimeError(f"GET {path}: {status} {data!r}")
    return json.loads(data)
