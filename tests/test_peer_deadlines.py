"""Peers that trickle their answers a byte at a time cost each call its deadline, nothing
more: submissions get a 503 in seconds, the health check and the poll are not held up, the
loops go on, and all recovers as soon as the peer answers properly again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest
from conftest import SchedulerFactory
from helpers import Agent, Api, expect_error, wait_for
from trickling_peer import TricklingPeer

LIVENESS_SECS = 10.0
"""Generous bound for "answered at all" (the deadlines are 3-5 s; this is not a timing test)."""


@pytest.fixture
def peer() -> Iterator[TricklingPeer]:
    server = TricklingPeer()
    yield server
    server.close()


NODES = orjson.dumps({"node-t": {"id": "node-t", "status": "healthy", "role": "compute"}})


def test_forty_submissions_against_a_trickling_registry_leave_the_threads_free(
    scheduler_factory: SchedulerFactory, peer: TricklingPeer
) -> None:
    # The scale: more submissions than the daemon has threads for the registry.
    # Without isolation every request thread waited on the registry and /health took
    # seconds; now at most one fetch and a few waiters are held, the rest answer at once.
    api = Api(scheduler_factory(registry_url=peer.url).url)
    agent = Agent(api.base_url, "node-t")
    try:
        with ThreadPoolExecutor(40) as pool:
            answers = [pool.submit(api.post, "/jobs", {"command": "x"}) for _ in range(40)]
            health_times = []
            for _ in range(20):
                started = time.monotonic()
                assert api.get("/health", timeout=LIVENESS_SECS).status_code == 200
                health_times.append(time.monotonic() - started)
                assert agent.poll() == []
            statuses = [answer.result(LIVENESS_SECS).status_code for answer in answers]
        assert statuses == [503] * 40
        # A fetch is never begun for a caller that is refused: one flight at a time.
        assert peer.calls <= 3, peer.calls
        health_times.sort()
        print(f"/health during 40 trickled submissions: max {health_times[-1] * 1000:.0f} ms")
        # Every health check answered while the submissions waited (not a timing test: the
        # bound is the "under a second", ten times what it takes when idle here).
        assert health_times[-1] < 1.0
    finally:
        agent.close()
        api.close()


def test_a_trickling_registry_costs_a_submission_its_deadline_and_nothing_more(
    scheduler_factory: SchedulerFactory, peer: TricklingPeer
) -> None:
    api = Api(scheduler_factory(registry_url=peer.url).url)
    agent = Agent(api.base_url, "node-t")
    try:
        with ThreadPoolExecutor(8) as pool:
            started = time.monotonic()
            answers = [pool.submit(api.post, "/jobs", {"command": "x"}) for _ in range(8)]
            # While eight submissions wait on the registry, the health check and the poll
            # do not.
            assert api.get("/health", timeout=LIVENESS_SECS).status_code == 200
            assert agent.poll() == []
            for answer in answers:
                expect_error(answer.result(LIVENESS_SECS), 503, "failed to reach registry")
            elapsed = time.monotonic() - started
        health = api.get("/health").json()
        assert (health["status"], health["registry"]) == ("healthy", "unreachable")
        assert health["registry_error"] == "failed to reach registry"
        print(f"8 submissions against a trickling registry answered 503 within {elapsed:.1f}s")

        peer.trickling = False
        peer.answers["/nodes"] = [NODES]
        job = api.submit()  # recovers at once: no thread was left waiting on the old calls
        assert job["node_id"] == "node-t"
        assert api.get("/health").json()["registry"] == "ok"
    finally:
        agent.close()
        api.close()


def test_a_trickling_sqs_does_not_stop_the_loop(
    scheduler_factory: SchedulerFactory, peer: TricklingPeer
) -> None:
    env = {"SQS_URL": peer.url, "SQS_POLL_INTERVAL_SECS": "0.2"}
    api = Api(scheduler_factory(env=env).url)
    try:
        wait_for(lambda: peer.calls >= 1, message="the SQS loop's first receive")
        assert api.get("/health", timeout=LIVENESS_SECS).status_code == 200
        message = orjson.dumps({"id": "msg-1", "body": '{"command":"echo from sqs"}'})
        peer.answers["/queues/jobs/messages"] = [message, b"null"]
        peer.trickling = False
        jobs = wait_for(lambda: api.jobs(), timeout=3 * LIVENESS_SECS, message="the SQS job")
        assert [job["command"] for job in jobs] == ["echo from sqs"]
    finally:
        api.close()
