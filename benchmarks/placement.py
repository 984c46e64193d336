"""The placement scenario of issue 13: a heterogeneous burst on a small cluster, under the plain
round robin and under least-loaded placement with moving waiting work.

4 nodes with 1 slot each (`MAX_JOBS_PER_NODE=1`); 200 jobs submitted back to back by one
client; every 10th job runs 20 s, the rest 0.2 s. The agents are simulated, one thread each,
speaking the real agent's protocol (poll, claim with its exact body, report once): a job
"runs" by sleeping its duration, read from its `BENCH_SECS` environment variable. Unlike the
real agent, which waits 3 s after every round, an agent polls again at once after a job and
0.1 s after an empty poll, so that the figures show placement, not the poll interval.

Both policies run at the same time, each with its own registry, scheduler and agents (the work
is mostly sleeping; the schedulers use a few percent of a core), so the scenario costs one
makespan of wall time, not two. Figures come from the scheduler's own stamps, read back at the
end with `GET /jobs`: makespan from the first `created_at` to the last `finished_at`, and each
job's wait from `created_at` to `running_at`.
"""

from __future__ import annotations

import functools
import http.client
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from tiny_scheduler.agent.protocol import RUNNING_UPDATE, parse_poll_reply, report_update
from tiny_scheduler.domain.jobs import parse_time

from .procs import RegistryProcess, Server, side_by_side

NODES = 4
JOBS = 200
LONG_EVERY = 10
LONG_S = 20.0
SHORT_S = 0.2
AGENT_IDLE_S = 0.1
"""Seconds a simulated agent waits after an empty poll (the real one: 3 s after every round)."""

POLICIES = {
    "round_robin": {"PLACEMENT": "round-robin", "JOB_STEALING": "0"},
    "least_loaded": {"PLACEMENT": "least-loaded", "JOB_STEALING": "1"},
}
"""The two policies compared, by their scheduler settings."""

TARGET_MAKESPAN_FACTOR = 1.1
"""Least-loaded with stealing: makespan within 10 % of (total work / slots + one long job)."""

TARGET_P99_SHARE = 2 / 3
"""Least-loaded with stealing: p99 wait at most 2/3 of round robin's."""

_HTTP_TIMEOUT = 30.0


def durations(scale: float) -> list[float]:
    """Each job's run time in seconds, in submission order."""
    return [(LONG_S if n % LONG_EVERY == 0 else SHORT_S) * scale for n in range(1, JOBS + 1)]


def ideal_makespan(scale: float) -> float:
    """Total work spread over every slot, plus one long job that cannot be split."""
    work = durations(scale)
    return sum(work) / NODES + LONG_S * scale


def run(workdir: Path, server_env: dict[str, str], scale: float) -> dict[str, Any]:
    """Both policies at once; their figures and the targets."""
    results = side_by_side(
        {
            name: functools.partial(_run_policy, name, {**server_env, **env}, workdir, scale)
            for name, env in POLICIES.items()
        },
        "placement",
    )
    ideal = ideal_makespan(scale)
    least, plain = results["least_loaded"], results["round_robin"]
    return {
        "placement": {
            **results,
            "scale": scale,
            "ideal_makespan_s": round(ideal, 2),
            "makespan_met": least["makespan_s"] <= TARGET_MAKESPAN_FACTOR * ideal,
            "p99_met": least["wait_p99_s"] <= TARGET_P99_SHARE * plain["wait_p99_s"],
        }
    }


def _run_policy(name: str, env: dict[str, str], workdir: Path, scale: float) -> dict[str, Any]:
    nodes = [f"node-{n}" for n in range(1, NODES + 1)]
    registry = RegistryProcess(nodes).start()
    db = workdir / f"placement-{name}.db"
    for path in workdir.glob(f"{db.name}*"):
        path.unlink()
    settings = {**env, "MAX_JOBS_PER_NODE": "1", "SCHEDULER_LOG_LEVEL": "warning"}
    server = Server(db, registry.url, workdir / f"server-placement-{name}.log", settings)
    stop = threading.Event()
    agents: list[threading.Thread] = []
    try:
        server.start()
        ran: dict[str, str] = {}  # job id -> the node that ran it
        for node in nodes:
            agent = threading.Thread(
                target=_agent, args=(server.addr, node, stop, ran), name=f"{name}-{node}"
            )
            agent.start()
            agents.append(agent)
        work = durations(scale)
        submitted = _submit_all(server.addr, work)
        deadline = time.monotonic() + 60 + sum(work)  # as if one node ran everything
        while len(ran) < len(submitted):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: only {len(ran)} of {len(submitted)} jobs done")
            time.sleep(0.2)
        finished = _get_json(server.addr, "/jobs?limit=1000")
        moved = _moved(server.addr)
    finally:
        stop.set()
        for agent in agents:
            agent.join(LONG_S * scale + 10)
        server.stop()
        registry.stop()
    return _figures(finished, ran, moved)


def _figures(jobs: list[dict[str, Any]], ran: dict[str, str], moved: float) -> dict[str, Any]:
    created = [parse_time(job["created_at"]) for job in jobs]
    waits = sorted(
        (parse_time(job["running_at"]) - parse_time(job["created_at"])) / 1e6 for job in jobs
    )
    makespan = (max(parse_time(job["finished_at"]) for job in jobs) - min(created)) / 1e6
    long_ids = {job["job_id"] for job in jobs if job.get("env_vars", {}).get("LONG") == "1"}
    per_node: dict[str, dict[str, int]] = {}
    for job_id, node in ran.items():
        counts = per_node.setdefault(node, {"jobs": 0, "long": 0})
        counts["jobs"] += 1
        counts["long"] += job_id in long_ids
    return {
        "jobs": len(jobs),
        "makespan_s": round(makespan, 2),
        "wait_p50_s": round(waits[(len(waits) - 1) // 2], 2),
        "wait_p99_s": round(waits[min(len(waits) - 1, int(len(waits) * 0.99))], 2),
        "wait_mean_s": round(statistics.fmean(waits), 2),
        "moved": int(moved),
        "per_node": dict(sorted(per_node.items())),
    }


# --- the clients -----------------------------------------------------------------------------


def _submit_all(addr: tuple[str, int], seconds: list[float]) -> list[str]:
    conn = http.client.HTTPConnection(*addr, timeout=_HTTP_TIMEOUT)
    made = []
    try:
        for n, secs in enumerate(seconds, 1):
            env = {"BENCH_SECS": repr(secs), "LONG": "1" if n % LONG_EVERY == 0 else "0"}
            body = json.dumps({"command": f"sleep {secs}", "env_vars": env})
            conn.request("POST", "/jobs", body, {"Content-Type": "application/json"})
            reply = conn.getresponse()
            data = reply.read()
            if reply.status != 201:
                raise RuntimeError(f"submission {n}: {reply.status} {data!r}")
            made.append(json.loads(data)["job_id"])
    finally:
        conn.close()
    return made


def _agent(addr: tuple[str, int], node: str, stop: threading.Event, ran: dict[str, str]) -> None:
    """One simulated agent: poll, claim the first job, run (sleep) it, report; again."""
    conn = http.client.HTTPConnection(*addr, timeout=_HTTP_TIMEOUT)
    poll = f"/jobs?node_id={node}&status=pending"
    try:
        while not stop.is_set():
            status, data = _call(conn, "GET", poll)
            polled = parse_poll_reply(data) if status == 200 else []
            if not polled:
                stop.wait(AGENT_IDLE_S)
                continue
            job = polled[0]  # the real agent takes only the first
            status, _ = _call(conn, "PATCH", f"/jobs/{job.job_id}", RUNNING_UPDATE)
            if status != 200:
                continue
            # The job's run. The connection is closed first: the daemon drops one idle for
            # longer than its keep-alive, and the report opens a fresh one.
            conn.close()
            time.sleep(float((job.env_vars or {}).get("BENCH_SECS", "0")))
            status, _ = _call(conn, "PATCH", f"/jobs/{job.job_id}", report_update(0))
            if status == 200:
                ran[job.job_id] = node
    finally:
        conn.close()


def _call(
    conn: http.client.HTTPConnection, method: str, path: str, body: Any = None
) -> tuple[int, bytes]:
    payload = json.dumps(body) if body is not None else None
    headers = {"Content-Type": "application/json"} if payload is not None else {}
    conn.request(method, path, payload, headers)
    reply = conn.getresponse()
    return reply.status, reply.read()


def _get_json(addr: tuple[str, int], path: str) -> Any:
    conn = http.client.HTTPConnection(*addr, timeout=_HTTP_TIMEOUT)
    try:
        status, data = _call(conn, "GET", path)
    finally:
        conn.close()
    if status != 200:
        raise RuntimeError(f"GET {path}: {status} {data!r}")
    return json.loads(data)


def _moved(addr: tuple[str, int]) -> float:
    """Jobs moved by idle nodes' polls, from the scheduler's own metrics."""
    conn = http.client.HTTPConnection(*addr, timeout=_HTTP_TIMEOUT)
    try:
        _, data = _call(conn, "GET", "/metrics")
    finally:
        conn.close()
    for line in data.decode().splitlines():
        if line.startswith('tiny_scheduler_jobs_moved_total{why="stolen"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
