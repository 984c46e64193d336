"""Issue 37's scenario: thousands of idle agents of ours, each waiting for work in its heartbeat.

Each simulated agent does what ours does by default: one plain heartbeat to register (the
node registry is the daemon itself, REGISTRY_URL=builtin), then heartbeats that wait for work
(`"wait_secs":5,"want":1`), each sent again as soon as the last is answered: an idle agent
renews its wait every NODE_HEARTBEAT_SECS, so 5,000 of them send ~1,000 heartbeats/s. A job
handed out in an answer is claimed (PATCH running), reported done at once, and the wait
renewed. Meanwhile SUBMIT_RATE jobs/s are submitted and `/health` is probed every
HEALTH_EVERY_S, from a process of their own (so a busy fleet loop does not delay what they
measure). Measured: `/health` p50/p99, and submit -> running, from the moment the submission
was sent to the moment the claim of that job was answered (the time a job waits to start on
an idle cluster).

The fleet is split over FLEET_PROCESSES load generator processes (one epoll loop each, idle
sockets cost nothing); agents connect from 127.0.0.2 on, AGENTS_PER_ADDRESS per address, below
the daemon's MAX_CONNECTIONS_PER_CLIENT. Each count gets a fresh daemon; the small count is
the same sitting's floor for the large one. Loopback only; bounded in count and time.
"""

from __future__ import annotations

import random
import time
from typing import Any

import orjson

from . import loadgen, sessions
from .agents import _raise_file_limit
from .loadgen import FromAddress, Pause, Recorder, Session, Window, request
from .scenarios import _case, latency_figures, merge_errors

COUNTS = (50, 5000)
HEARTBEAT_S = 5.0  # the daemon's NODE_HEARTBEAT_SECS (its default): the longest wait
SUBMIT_RATE = 10
HEALTH_EVERY_S = 0.02
FLEET_PROCESSES = 2
AGENTS_PER_ADDRESS = 1000
WARMUP_S = 8.0
"""Longer than a heartbeat period: every agent has registered and waits when the window opens."""
WINDOW_PER_DURATION = 4
MAX_JOBS = 1 << 14
"""Slots of the shared table of submission instants (by job number)."""
"""The targets (/health p99 < 50 ms, submit -> running p50 < 20 ms at 5,000) are report.py's."""


def idle_agents(bench: Any) -> dict[str, Any]:
    opts = bench.options
    duration = WINDOW_PER_DURATION * opts.duration_s
    steps = {}
    for count in COUNTS:
        steps[str(count)] = _case([_step(bench, count, duration) for _ in range(opts.runs)])
    return {"idle_agents": {"steps": steps, "window_s": duration}}


def _step(bench: Any, count: int, duration: float) -> dict[str, Any]:
    db = bench.options.workdir / f"idle-agents-{count}.db"
    server = bench.server(f"idle-agents-{count}", db)
    server.process.extra_env.update(
        {"REGISTRY_URL": "builtin", "NODE_HEARTBEAT_SECS": f"{HEARTBEAT_S:g}"}
    )
    server.start()
    sent = loadgen.shared_counters(MAX_JOBS)  # submission instants, by job number
    try:
        window = Window.plan(WARMUP_S, duration)
        nodes = [f"idle-{i:05d}" for i in range(count)]
        parts = [nodes[i::FLEET_PROCESSES] for i in range(FLEET_PROCESSES)]
        result = loadgen.run_load(
            server.addr,
            window,
            [(probe_worker, (sent,)), *((fleet_worker, (part, sent)) for part in parts)],
            {"server": server.worker_pid},
        )
    finally:
        server.stop()
    probe, fleet = result.workers[0], result.workers[1:]
    beats = sum(len(w["beats"]["latencies"]) for w in fleet)
    return {
        "agents": count,
        "heartbeat_rate": round(beats / window.seconds, 1),
        "health": latency_figures([probe["health"]["latencies"]]),
        "start": latency_figures([w["starts"] for w in fleet]),
        "submit": latency_figures([probe["submits"]["latencies"]]),
        "jobs_started": sum(len(w["starts"]) for w in fleet),
        "errors": merge_errors(
            [probe["health"]["errors"], probe["submits"]["errors"]]
            + [w[part]["errors"] for w in fleet for part in ("beats", "patches")]
        ),
        "cpu": result.cpu,
        # The median of runs is taken per figure: the one the table reads first.
        **latency_figures([probe["health"]["latencies"]]),
    }


def probe_worker(window: Window, sent: Any) -> tuple[list[Session], sessions.Collect]:
    """One session submitting SUBMIT_RATE jobs/s (each one's sending instant into `sent`), one
    probing /health."""
    health, submits = Recorder(window), Recorder(window)
    probe = request("GET", "/health")
    submit = request("POST", "/jobs", sessions.SUBMIT_BODY, sessions.JSON)

    def prober() -> Session:
        while time.monotonic_ns() < window.t1:
            health.add((yield probe))
            yield Pause(HEALTH_EVERY_S)

    def submitter() -> Session:
        yield Pause(WARMUP_S / 2)  # the agents have registered
        next_at = time.monotonic()
        while time.monotonic_ns() < window.t1:
            at = time.monotonic_ns()
            reply = yield submit
            if submits.add(reply, 201):
                seq = int(orjson.loads(reply.body)["job_id"].split("-")[1])
                if seq < MAX_JOBS:
                    sent[seq] = at
            next_at += 1 / SUBMIT_RATE
            left = next_at - time.monotonic()
            if left > 0:
                yield Pause(left)

    def collect() -> dict[str, Any]:
        return {"health": health.result(), "submits": submits.result()}

    return [prober(), submitter()], collect


def fleet_worker(
    window: Window, nodes: list[str], sent: Any
) -> tuple[list[FromAddress], sessions.Collect]:
    """One session per agent in `nodes`, each from its loopback address."""
    _raise_file_limit()
    beats, patches = Recorder(window), Recorder(window)
    starts: list[int] = []  # submit -> claim answered (ns), of jobs submitted in the window
    rand = random.Random(37)

    def heartbeat(node: str, wait: bool) -> bytes:
        fields: dict[str, Any] = {"cpu_count": 1, "running": []}
        if wait:
            fields.update(wait_secs=HEARTBEAT_S, want=1)
        return request("PUT", f"/nodes/{node}", orjson.dumps(fields), sessions.JSON)

    def agent(node: str) -> Session:
        # Started over one period, as a fleet is; registered before it waits.
        yield Pause(rand.uniform(0, HEARTBEAT_S))
        beats.add((yield heartbeat(node, False)))
        waiting = heartbeat(node, True)
        while time.monotonic_ns() < window.t1:
            reply = yield waiting
            if not beats.add(reply):
                yield Pause(1.0)
                continue
            for job in orjson.loads(reply.body).get("jobs", ()):
                path = f"/jobs/{job['job_id']}"
                claim = yield request("PATCH", path, sessions.RUNNING_BODY, sessions.JSON)
                if not patches.add(claim):
                    continue
                at = sent[int(job["job_id"].split("-")[1])]
                if at and window.measuring(at):
                    starts.append(claim.done_ns - at)
                patches.add((yield request("PATCH", path, sessions.DONE_BODY, sessions.JSON)))

    def collect() -> dict[str, Any]:
        return {"beats": beats.result(), "patches": patches.result(), "starts": starts}

    fleet = [
        FromAddress(agent(node), f"127.0.0.{2 + int(node.split('-')[1]) // AGENTS_PER_ADDRESS}")
        for node in nodes
    ]
    return fleet, collect
