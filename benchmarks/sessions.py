"""What the simulated clients do: submitters, pollers and agents, as load generator sessions.

Each `*_worker` function is a loadgen builder: called in a fresh worker process with the run's
window, it returns the sessions that process drives and a function that hands back what they
recorded. Sessions stop sending new requests when the window closes (`t1`); agents keep going
until `drain_end`, so that jobs submitted late in the window still get done and counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from tiny_scheduler.agent.protocol import RUNNING_UPDATE, parse_poll_reply, report_update

from .loadgen import Pause, Recorder, Session, Window, request

JSON = "application/json"

SUBMIT_BODY = orjson.dumps({"command": "echo hello from the benchmark", "env_vars": {"N": "1"}})
"""A typical small submission, as the CLI sends it."""

RUNNING_BODY = orjson.dumps(RUNNING_UPDATE)
"""The claim, byte for byte as the real agent sends it."""

DONE_BODY = orjson.dumps(report_update(0, stdout="hello\n"))
"""The end of a successful run."""

Collect = Callable[[], dict[str, Any]]


def poll_request(node: str) -> bytes:
    return request("GET", f"/jobs?node_id={node}&status=pending")


def submit_worker(window: Window, clients: int) -> tuple[list[Session], Collect]:
    """`clients` sessions, each submitting jobs back to back."""
    recorder = Recorder(window)
    submit = request("POST", "/jobs", SUBMIT_BODY, JSON)

    def submitter() -> Session:
        while time.monotonic_ns() < window.t1:
            reply = yield submit
            recorder.add(reply, 201)

    return [submitter() for _ in range(clients)], recorder.result


def poll_worker(window: Window, clients: int, nodes: list[str]) -> tuple[list[Session], Collect]:
    """`clients` sessions polling the nodes' pending queues in turn, back to back."""
    recorder = Recorder(window)
    polls = [poll_request(node) for node in nodes]
    empty = [0]

    def poller(turn: int) -> Session:
        checked = False
        while time.monotonic_ns() < window.t1:
            reply = yield polls[turn % len(polls)]
            if not checked:
                parse_poll_reply(reply.body)  # read as strictly as the real agent does, once
                checked = True
            recorder.add(reply)
            if reply.body == b"[]":
                empty[0] += 1
            turn += 1

    def collect() -> dict[str, Any]:
        return {**recorder.result(), "empty": empty[0]}

    return [poller(i * 7) for i in range(clients)], collect


def patch_worker(window: Window, clients: int) -> tuple[list[Session], Collect]:
    """`clients` sessions sending the agent's claim back to back (the floor's PATCH shape)."""
    recorder = Recorder(window)
    patch = request("PATCH", "/jobs/job-1", RUNNING_BODY, JSON)

    def patcher() -> Session:
        while time.monotonic_ns() < window.t1:
            reply = yield patch
            recorder.add(reply)

    return [patcher() for _ in range(clients)], recorder.result


def report_worker(window: Window, job_ids: list[str]) -> tuple[list[Session], Collect]:
    """One session per list of job ids, each reporting on its own jobs back to back as an
    agent does: the claim (PATCH running), then the end (PATCH done with a line of output)."""
    recorder = Recorder(window)

    def reporter(ids: list[str]) -> Session:
        for job_id in ids:
            path = f"/jobs/{job_id}"
            for body in (RUNNING_BODY, DONE_BODY):
                if time.monotonic_ns() >= window.t1:
                    return
                reply = yield request("PATCH", path, body, JSON)
                recorder.add(reply)

    return [reporter(ids) for ids in job_ids], recorder.result


def cycle_submit_worker(
    window: Window, clients: int, slot: int, submitted: Any, done: Any, backlog: int
) -> tuple[list[Session], Collect]:
    """Submitters of the full cycle. They hold off while `backlog` jobs are submitted but not
    yet done (the shared counters `submitted` and `done` have one slot per worker process), so
    that submit-to-done latency measures the scheduler, not an ever-growing queue."""
    recorder = Recorder(window)
    submit = request("POST", "/jobs", SUBMIT_BODY, JSON)
    sent_at: dict[str, int] = {}

    def submitter() -> Session:
        while time.monotonic_ns() < window.t1:
            if backlog and sum(submitted) - sum(done) >= backlog:
                yield Pause(0.001)
                continue
            reply = yield submit
            if recorder.add(reply, 201):
                submitted[slot] += 1  # only this process writes its slot
                if window.measuring(reply.sent_ns):
                    sent_at[orjson.loads(reply.body)["job_id"]] = reply.sent_ns

    def collect() -> dict[str, Any]:
        return {**recorder.result(), "sent_at": sent_at}

    return [submitter() for _ in range(clients)], collect


def agent_worker(
    window: Window, nodes: list[str], slot: int, done: Any, idle_s: float
) -> tuple[list[Session], Collect]:
    """One simulated agent per node: poll; if a job came, claim it (PATCH running) and finish
    it (PATCH done) at once, then poll again; after an empty poll, wait `idle_s`."""
    polls = Recorder(window)
    patches = Recorder(window)
    done_at: dict[str, int] = {}
    empty = [0]

    def agent(node: str) -> Session:
        poll = poll_request(node)
        checked = False
        while time.monotonic_ns() < window.drain_end:
            reply = yield poll
            if not polls.add(reply) or reply.body == b"[]":
                empty[0] += 1
                yield Pause(idle_s)
                continue
            if not checked:
                parse_poll_reply(reply.body)  # strict, like the real agent, once per agent
                checked = True
            job_id = orjson.loads(reply.body)[0]["job_id"]
            path = f"/jobs/{job_id}"
            reply = yield request("PATCH", path, RUNNING_BODY, JSON)
            if not patches.add(reply):
                continue  # another agent won the claim, or an error: poll again
            reply = yield request("PATCH", path, DONE_BODY, JSON)
            if patches.add(reply):
                done_at[job_id] = reply.done_ns
                done[slot] += 1

    def collect() -> dict[str, Any]:
        return {
            "polls": polls.result(),
            "patches": patches.result(),
            "done_at": done_at,
            "empty": empty[0],
        }

    return [agent(node) for node in nodes], collect
