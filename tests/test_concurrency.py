"""Races under real gunicorn: many agents and submitters at once (every job is claimed exactly
once and finishes, nothing answers 5xx), one Idempotency-Key sent concurrently, and a cancel
racing a claim."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from helpers import Agent, Api, set_nodes, unique_node, wait_for

from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry

JOBS = 200
SUBMITTERS = 4
NODES = 4
AGENTS_PER_NODE = 2
IDLE_POLL_SECS = 0.01  # an agent with nothing to do polls again after this (the real one: 3 s)


class Tally:
    """What the threads saw, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.claims: collections.Counter[str] = collections.Counter()
        self.claimed_on: dict[str, str] = {}
        self.conflicts = 0
        self.submitted: list[str] = []
        self.server_errors: list[str] = []
        self.crashes: list[BaseException] = []

    def check(self, what: str, status: int, text: str) -> None:
        if status >= 500:
            with self.lock:
                self.server_errors.append(f"{what}: {status} {text}")


def guarded(tally: Tally, work: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            work()
        except BaseException as exc:
            with tally.lock:
                tally.crashes.append(exc)

    return run


def test_every_job_is_claimed_exactly_once_under_load(
    scheduler: SchedulerProcess, registry: FakeRegistry
) -> None:
    nodes = [unique_node("busy") for _ in range(NODES)]
    set_nodes(registry, nodes)
    tally = Tally()
    stop = threading.Event()

    def agent_loop(node_id: str) -> None:
        agent = Agent(scheduler.url, node_id)
        try:
            while not stop.is_set():
                polled = agent.poll()
                if not polled:
                    stop.wait(IDLE_POLL_SECS)
                    continue
                job = polled[0]  # the real agent takes only the first
                claim = agent.claim(job.job_id)
                tally.check("claim", claim.status_code, claim.text)
                if claim.status_code == 409:  # the other agent of this node got it first
                    with tally.lock:
                        tally.conflicts += 1
                    continue
                assert claim.status_code == 200, claim.text
                with tally.lock:
                    tally.claims[job.job_id] += 1
                    tally.claimed_on[job.job_id] = node_id
                report = agent.report(job.job_id, 0, stdout=f"ran {job.job_id} on {node_id}")
                tally.check("report", report.status_code, report.text)
                assert report.status_code == 200, report.text
        finally:
            agent.close()

    def submit_loop(count: int) -> None:
        api = Api(scheduler.url)
        try:
            for n in range(count):
                response = api.post("/jobs", {"command": f"echo {n}"})
                tally.check("submit", response.status_code, response.text)
                assert response.status_code == 201, response.text
                with tally.lock:
                    tally.submitted.append(response.json()["job_id"])
        finally:
            api.close()

    threads = [
        threading.Thread(target=guarded(tally, lambda n=node: agent_loop(n)))
        for node in nodes
        for _ in range(AGENTS_PER_NODE)
    ]
    threads += [
        threading.Thread(target=guarded(tally, lambda: submit_loop(JOBS // SUBMITTERS)))
        for _ in range(SUBMITTERS)
    ]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            lambda: tally.crashes or (len(tally.claims) == JOBS and len(tally.submitted) == JOBS),
            timeout=90,
            interval=0.05,
            message=lambda: f"{len(tally.claims)} of {JOBS} jobs claimed",
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert tally.crashes == []
    assert tally.server_errors == []
    assert sorted(tally.claims) == sorted(tally.submitted)
    assert set(tally.claims.values()) == {1}

    api = Api(scheduler.url)
    try:
        finished = {job["job_id"]: job for job in api.jobs(status="done", limit=10000)}
        assert set(tally.submitted) <= set(finished)
        for job_id in tally.submitted:
            job = finished[job_id]
            assert job["node_id"] == tally.claimed_on[job_id]
            assert job["stdout"] == f"ran {job_id} on {job['node_id']}"
        assert api.jobs(status="pending", limit=10000) == []
        assert api.jobs(status="running", limit=10000) == []
    finally:
        api.close()


def run_together(actions: list[Callable[[], int]]) -> list[int]:
    """Run the actions on threads released at the same moment; their results, in order."""
    barrier = threading.Barrier(len(actions))
    results: list[int] = [0] * len(actions)

    def runner(index: int) -> None:
        barrier.wait(10)
        results[index] = actions[index]()

    threads = [threading.Thread(target=runner, args=(n,)) for n in range(len(actions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_concurrent_submissions_with_one_idempotency_key_create_one_job(
    scheduler: SchedulerProcess, registry: FakeRegistry
) -> None:
    clients = [Api(scheduler.url) for _ in range(8)]
    replies: list[dict] = []

    def submit(api: Api) -> Callable[[], int]:
        def call() -> int:
            response = api.post("/jobs", {"command": "once"}, headers={"Idempotency-Key": "race"})
            replies.append(response.json())
            return response.status_code

        return call

    try:
        statuses = run_together([submit(api) for api in clients])
    finally:
        for api in clients:
            api.close()
    assert sorted(statuses) == [200] * 7 + [201]
    assert len({reply["job_id"] for reply in replies}) == 1


def test_a_cancel_racing_a_claim_always_ends_the_job_and_never_loses_the_claim(
    scheduler: SchedulerProcess, registry: FakeRegistry
) -> None:
    # A cancel ends a pending and a running job alike, so it wins whatever the order; the
    # claim wins too when it came first, and the job then went through running (its agent is
    # told to stop it), or it is refused when the cancel came first.
    set_nodes(registry, [unique_node("race")])
    canceller, agent_api = Api(scheduler.url), Api(scheduler.url)
    try:
        for _ in range(10):
            job_id = canceller.submit()["job_id"]
            path = f"/jobs/{job_id}"
            cancel, claim = run_together(
                [
                    lambda p=path: canceller.post(f"{p}/cancel").status_code,
                    lambda p=path: agent_api.patch(p, {"status": "running"}).status_code,
                ]
            )
            assert cancel == 200 and claim in (200, 409)
            job = canceller.job(job_id)
            assert (job["status"], job["reason"]) == ("failed", "cancelled")
            assert ("running_at" in job) == (claim == 200)
    finally:
        canceller.close()
        agent_api.close()
