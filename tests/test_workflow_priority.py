"""Priorities (issue 25) on the in-memory harness: the agent poll hands a node's due jobs out
by priority, then age, and an idle node takes the highest-priority, oldest waiting jobs first.
Checked against a reference ordering over generated mixes of priorities."""

from __future__ import annotations

from harness import Harness
from hypothesis import given, settings
from hypothesis import strategies as st

PRIORITIES = st.lists(st.sampled_from([0, 10, 50, 50, 80, 100]), min_size=20, max_size=20)


def reference(submitted: list[tuple[str, int]]) -> list[str]:
    """Higher priority first; within one priority, in the order submitted (ids ascend)."""
    order = sorted(range(len(submitted)), key=lambda i: (-submitted[i][1], i))
    return [submitted[i][0] for i in order]


@settings(max_examples=40, deadline=None)
@given(priorities=PRIORITIES)
def test_a_full_nodes_jobs_come_out_by_priority_then_fifo(priorities: list[int]) -> None:
    h = Harness(nodes=["node-a"], max_jobs_per_node=1)
    blocker = h.submit("runs first")
    h.claim(blocker.job_id)  # the node is full while the 20 arrive
    submitted = [(h.submit(f"job {i}", priority=p).job_id, p) for i, p in enumerate(priorities)]
    assert h.poll("node-a") == []
    h.report(blocker.job_id)
    ran = []
    while answer := h.poll("node-a"):
        (job_id,) = answer
        h.claim(job_id)
        h.report(job_id)
        ran.append(job_id)
    assert ran == reference(submitted)


@settings(max_examples=20, deadline=None)
@given(priorities=PRIORITIES)
def test_a_poll_with_many_free_slots_answers_in_the_same_order(priorities: list[int]) -> None:
    h = Harness(nodes=["node-a"], max_jobs_per_node=25)
    submitted = [(h.submit(f"job {i}", priority=p).job_id, p) for i, p in enumerate(priorities)]
    assert h.poll("node-a") == reference(submitted)


def test_an_idle_node_takes_the_highest_priority_oldest_waiting_jobs_first() -> None:
    h = Harness(nodes=["node-a"], max_jobs_per_node=1, job_stealing=True)
    h.claim(h.submit("keeps node-a busy").job_id)
    low = h.submit("low", priority=10)
    high_old = h.submit("high, older", priority=90)
    high_new = h.submit("high, newer", priority=90)
    h.set_nodes(healthy=["node-a", "node-b"])
    assert h.poll("node-b") == [high_old.job_id]
    assert h.job(high_old.job_id).node_id == "node-b"
    h.claim(high_old.job_id)
    h.report(high_old.job_id)
    assert h.poll("node-b") == [high_new.job_id]
    assert h.job(low.job_id).node_id == "node-a"


def test_across_donor_nodes_the_highest_priority_moves_first() -> None:
    h = Harness(nodes=["node-a", "node-b"], max_jobs_per_node=1, job_stealing=True)
    for _ in range(2):
        h.claim(h.submit("keeps a node busy").job_id)
    low = h.submit("low, older", priority=10)
    high = h.submit("high, newer", priority=90)
    assert low.node_id != high.node_id  # one waits on each busy node
    h.set_nodes(healthy=["node-a", "node-b", "node-c"])
    assert h.poll("node-c") == [high.job_id]


def test_jobs_moved_in_one_poll_are_answered_highest_first() -> None:
    h = Harness(nodes=["node-a"], max_jobs_per_node=2, job_stealing=True)
    for _ in range(2):
        h.claim(h.submit("keeps node-a busy").job_id)
    low = h.submit("low, older", priority=10)
    high = h.submit("high, newer", priority=90)
    h.set_nodes(healthy=["node-a", "node-b"])
    assert h.poll("node-b") == [high.job_id, low.job_id]
