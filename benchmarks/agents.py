"""Issue 27's scenario: a thousand agents on one daemon.

Each simulated agent does what the real one does, on the real one's clock: a heartbeat
(`PUT /nodes/{id}`, `{"cpu_count":1,"running":[...]}`) every HEARTBEAT_S, the node registry
being the daemon itself (REGISTRY_URL=builtin), and a poll every POLL_S. A job that comes is
claimed at once (PATCH running), listed in the heartbeats while it "runs", and reported done
at the agent's next poll. Meanwhile SUBMIT_RATE jobs/s are submitted, spread by the daemon
over the agents. Agents start spread over their periods, as a fleet started over time is.

The count is stepped up (STEPS), a fresh daemon for each, for a bounded window each, to find
the largest count whose poll p99 stays under TARGET_P99_MS on this machine; stepping stops
after the first count that misses it (the issue's 1,000 is always run). The server's CPU per
poll (the worker's /proc figures over the window, divided by the polls in it: so it carries
each poll's share of heartbeats, submissions and reports) gives the estimate for a bigger
machine. All agents of a step share one load generator process (one epoll loop, idle sockets
cost nothing), so the clients take little of the two cores; their CPU is reported beside.
"""

from __future__ import annotations

import random
import resource
import time
from typing import Any

import orjson

from . import loadgen, sessions
from .loadgen import Pause, Recorder, Session, Window, request
from .scenarios import _case, latency_figures, merge_errors

POLL_S = 3.0
HEARTBEAT_S = 5.0
SUBMIT_RATE = 100
SUBMITTERS = 4
"""Sessions sharing the submissions (each every SUBMITTERS / SUBMIT_RATE s), so that one slow
reply does not hold the rate down."""

STEPS = (250, 500, 1000, 1500)
ISSUE_COUNT = 1000
TARGET_P99_MS = 50.0
WARMUP_S = 6.0
"""Longer than a heartbeat period: every agent is registered and in its rhythm when the
window opens."""

WINDOW_PER_DURATION = 4
"""A step's window is this many times `--duration` (20 s; 8 s with `--quick`): at a poll every
3 s a shorter window holds too few polls per agent for a p99."""


def agents(bench: Any) -> dict[str, Any]:
    opts = bench.options
    duration = WINDOW_PER_DURATION * opts.duration_s
    steps: dict[str, Any] = {}
    largest = 0
    for count in STEPS:
        runs = []
        for _ in range(opts.runs):
            runs.append(_step(bench, count, duration))
        case = _case(runs)
        steps[str(count)] = case
        p99 = case["median"]["p99_ms"]
        ok = p99 < TARGET_P99_MS and not case["errors"]
        if ok:
            largest = count
        elif count >= ISSUE_COUNT:
            break  # a larger count would only miss by more
    return {"agents1000": {"steps": steps, "largest_ok": largest, "window_s": duration}}


def _step(bench: Any, count: int, duration: float) -> dict[str, Any]:
    db = bench.options.workdir / f"agents-{count}.db"
    server = bench.server(f"agents-{count}", db)
    server.process.extra_env["REGISTRY_URL"] = "builtin"
    server.start()
    try:
        window = Window.plan(WARMUP_S, duration)
        nodes = [f"agent-{i:04d}" for i in range(count)]
        result = loadgen.run_load(
            server.addr,
            window,
            [(fleet_worker, (nodes,))],
            {"server": server.worker_pid},
        )
    finally:
        server.stop()
    w = result.workers[0]
    polls = len(w["polls"]["latencies"])
    server_cpu = result.cpu.get("server", 0.0)
    return {
        "agents": count,
        "poll_rate": round(polls / window.seconds, 1),
        **latency_figures([w["polls"]["latencies"]]),
        "heartbeat": latency_figures([w["beats"]["latencies"]]),
        "submit": latency_figures([w["submits"]["latencies"]]),
        "submit_rate": round(len(w["submits"]["latencies"]) / window.seconds, 1),
        "jobs_done": w["done"],
        "server_us_per_poll": round(server_cpu * window.seconds / polls * 1e6, 1) if polls else 0,
        "errors": merge_errors(
            [w[part]["errors"] for part in ("polls", "beats", "submits", "patches")]
        ),
        "cpu": result.cpu,
    }


def _raise_file_limit() -> None:
    """One socket per agent: more than the usual soft limit of 1,024 descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def fleet_worker(window: Window, nodes: list[str]) -> tuple[list[Session], sessions.Collect]:
    """One session per agent in `nodes`, plus SUBMITTERS sessions submitting SUBMIT_RATE/s."""
    _raise_file_limit()
    polls, beats, patches, submits = (Recorder(window) for _ in range(4))
    done = [0]
    rand = random.Random(27)  # the same spread of start times in every run

    def heartbeat(node: str, running: list[str]) -> bytes:
        body = orjson.dumps({"cpu_count": 1, "running": running})
        return request("PUT", f"/nodes/{node}", body, sessions.JSON)

    def agent(node: str) -> Session:
        poll = sessions.poll_request(node)
        job: str | None = None
        # Register at once (a node the daemon has never heard from gets no work), then keep
        # to the periods, starting at a random point of each.
        beats.add((yield heartbeat(node, [])))
        now = time.monotonic()
        next_beat = now + rand.uniform(0, HEARTBEAT_S)
        next_poll = now + rand.uniform(0, POLL_S)
        while True:
            wake = min(next_beat, next_poll)
            now = time.monotonic()
            if wake > now:
                yield Pause(wake - now)
            if time.monotonic_ns() >= window.t1:
                return
            if time.monotonic() >= next_beat:
                next_beat += HEARTBEAT_S
                beats.add((yield heartbeat(node, [job] if job else [])))
            if time.monotonic() < next_poll:
                continue
            next_poll += POLL_S
            if job is not None:
                reply = yield request("PATCH", f"/jobs/{job}", sessions.DONE_BODY, sessions.JSON)
                if patches.add(reply):
                    done[0] += 1
                job = None
            reply = yield poll
            if not polls.add(reply) or reply.body == b"[]":
                continue
            claimed = orjson.loads(reply.body)[0]["job_id"]
            reply = yield request("PATCH", f"/jobs/{claimed}", sessions.RUNNING_BODY, sessions.JSON)
            if patches.add(reply):
                job = claimed

    submit = request("POST", "/jobs", sessions.SUBMIT_BODY, sessions.JSON)
    period = SUBMITTERS / SUBMIT_RATE

    def submitter(turn: int) -> Session:
        # Start only once every agent had its first heartbeat: jobs need a node to go to.
        yield Pause(2.0 + turn * period / SUBMITTERS)
        next_at = time.monotonic()
        while time.monotonic_ns() < window.t1:
            submits.add((yield submit), 201)
            next_at += period
            left = next_at - time.monotonic()
            if left > 0:
                yield Pause(left)

    def collect() -> dict[str, Any]:
        return {
            "polls": polls.result(),
            "beats": beats.result(),
            "patches": patches.result(),
            "submits": submits.result(),
            "done": done[0],
        }

    fleet = [agent(node) for node in nodes]
    return fleet + [submitter(i) for i in range(SUBMITTERS)], collect
