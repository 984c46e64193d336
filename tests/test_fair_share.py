"""Fair share (`domain/fair_share.py`, `state/user_usage.py`): the decay arithmetic, the order
key, and on the harness the order due jobs are handed out in when several users share the
cluster; usage that survives a restart."""

from __future__ import annotations

import math

import pytest
from harness import Harness

from tiny_scheduler.domain import fair_share
from tiny_scheduler.domain.jobs import Job
from tiny_scheduler.state.user_usage import UserUsage

HOUR = 3600
US = 1_000_000
RATE = fair_share.rate(HOUR)


def test_a_second_of_cpu_counts_half_after_one_half_life() -> None:
    assert fair_share.decayed(100.0, HOUR * US, RATE) == pytest.approx(50.0)
    assert fair_share.decayed(100.0, 0, RATE) == 100.0
    # Ten seconds on 4 CPUs, just ended: barely decayed; the same an hour ago: half of it.
    fresh = fair_share.charge(4, 0, 10 * US, RATE)
    assert fresh == pytest.approx(40.0, rel=1e-2)
    assert fair_share.decayed(fresh, HOUR * US, RATE) == pytest.approx(fresh / 2)
    # A job running for a whole half-life: (1 - 1/2) / rate.
    assert fair_share.charge(1, 0, HOUR * US, RATE) == pytest.approx(HOUR / (2 * math.log(2)))


def test_the_order_is_priority_then_usage_then_age() -> None:
    usage = {"alice": 500.0, "bob": 10.0}
    key = fair_share.order_key(usage)
    jobs = [
        Job(seq=1, node_id="n", owner="alice"),
        Job(seq=2, node_id="n", owner="bob"),
        Job(seq=3, node_id="n", owner="alice", priority=60),
        Job(seq=4, node_id="n", owner=""),  # the shared key's: no usage yet
        Job(seq=5, node_id="n", owner="bob"),
    ]
    assert [job.seq for job in sorted(jobs, key=key)] == [3, 4, 2, 5, 1]


def test_usage_grows_while_jobs_run_and_is_charged_when_they_end() -> None:
    book = UserUsage(HOUR)
    running = Job(seq=1, node_id="n", owner="alice", cpus=2, status="running", running_at=0)
    book.running(running)
    assert book.usage("alice", 60 * US) == pytest.approx(fair_share.charge(2, 0, 60 * US, RATE))
    book.not_running(running)
    book.ended("alice", 2, 0, 60 * US)
    after = book.usage("alice", 60 * US + HOUR * US)
    assert after == pytest.approx(fair_share.charge(2, 0, 60 * US, RATE) / 2)
    assert book.usage("bob", 0) == 0.0


def loop(h: Harness, nodes: tuple[str, ...], steps: int) -> list[tuple[str, str]]:
    """Agents at work: every second each node takes what its poll gives, runs it one second,
    reports it done. The starts, in order, as (job id, owner)."""
    started: list[tuple[str, str]] = []
    running: list[str] = []
    for _ in range(steps):
        for node in nodes:
            for job_id in h.poll(node):
                job = h.claim(job_id)
                started.append((job_id, job.owner))
                running.append(job_id)
        h.advance(1)
        for job_id in running:
            h.report(job_id)
        running.clear()
    return started


def test_a_big_sweep_by_one_user_does_not_hold_back_another_s_jobs() -> None:
    """User A submits 500 jobs, user B then 10, on two nodes of two slots: all of B's start
    within the first 10 + (total slots) starts after B's last submission."""
    nodes = ("node-a", "node-b")
    h = Harness(nodes=nodes, max_jobs_per_node=2)
    for _ in range(500):
        h.submit("sweep", owner="alice")
    before = loop(h, nodes, 5)  # A's sweep runs, and A is charged for it
    assert {owner for _, owner in before} == {"alice"}
    for _ in range(10):
        h.submit("quick", owner="bob")
    after = loop(h, nodes, 10)
    bob_starts = [index for index, (_, owner) in enumerate(after) if owner == "bob"]
    assert len(bob_starts) == 10
    assert max(bob_starts) < 10 + 4
    # Without fair share (one owner for all), B's would wait behind A's 480 others.


def test_usage_survives_a_restart_from_what_the_store_holds() -> None:
    nodes = ("node-a",)
    h = Harness(nodes=nodes)
    for _ in range(3):
        h.submit("sweep", owner="alice")
    loop(h, nodes, 3)
    before = {view.user: view.usage_cpu_secs for view in h.service.users.listing()}
    assert before["alice"] > 2.9
    again = h.restart()
    after = {view.user: view.usage_cpu_secs for view in again.service.users.listing()}
    assert after["alice"] == pytest.approx(before["alice"])
    # And it orders a new start-up's poll too: bob's job goes before alice's older one.
    first = again.submit("more", owner="alice")
    second = again.submit("mine", owner="bob")
    assert again.poll("node-a") == [second.job_id]
    assert again.job(first.job_id).status == "pending"


def test_runs_charged_in_bulk_count_what_each_charged_and_decayed_would() -> None:
    runs = [
        (0, 600 * US),
        (1800 * US, 5400 * US),
        (7000 * US, 7000 * US),
        (HOUR * US, 2 * HOUR * US),
    ]
    at = 3 * HOUR * US
    one_by_one = sum(
        fair_share.decayed(fair_share.charge(2, start, end, RATE), at - end, RATE)
        for start, end in runs
    )
    assert fair_share.charged_at(2, runs, at, RATE) == pytest.approx(one_by_one, rel=1e-12)
    assert fair_share.charged_at(0, runs, at, RATE) == 0.0
