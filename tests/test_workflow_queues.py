"""Queues (issue 25) on the in-memory harness: a queue's limit holds across the cluster
whatever order agents poll, claim and report in; a paused queue hands nothing out; a freed
place goes to the queue's oldest highest-priority job; held jobs count as no load; the
settings and the limit survive a restart; and what a waiting job shows as its reason."""

from __future__ import annotations

import pytest
from harness import Harness
from hypothesis import given, settings
from hypothesis import strategies as st

from tiny_scheduler import errors
from tiny_scheduler.domain import jobs, queues
from tiny_scheduler.domain.jobs import Job
from tiny_scheduler.domain.queues import QueueSettings
from tiny_scheduler.domain.validation import JobQuery
from tiny_scheduler.state.table import JobTable

NODES4 = ("node-a", "node-b", "node-c", "node-d")


def running_in(h: Harness, queue: str) -> int:
    return sum(
        1 for job in h.service.reads.running() if job.queue == queue and job.job_type == jobs.RUN
    )


def try_claim(h: Harness, job_id: str) -> bool:
    """What an agent does with a job it was handed: claim it, skipping it on a 409."""
    try:
        h.claim(job_id)
    except errors.Conflict:
        return False
    return True


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_limit_of_2_holds_over_4_nodes_in_any_order(data: st.DataObject) -> None:
    h = Harness(nodes=NODES4, max_jobs_per_node=2)
    h.service.queues.update(QueueSettings("nightly", max_running=2))
    submitted = [h.submit(f"job {i}", queue="nightly").job_id for i in range(10)]
    handed: dict[str, list[str]] = {node: [] for node in NODES4}  # polled, not yet claimed
    claimed: list[str] = []
    for _ in range(120):
        action = data.draw(st.sampled_from(["poll", "claim", "report"]))
        node = data.draw(st.sampled_from(NODES4))
        if action == "poll":
            handed[node] = h.poll(node)
        elif action == "claim" and handed[node]:
            job_id = handed[node].pop(data.draw(st.integers(0, len(handed[node]) - 1)))
            if h.job(job_id).status == jobs.PENDING and try_claim(h, job_id):
                claimed.append(job_id)
        elif action == "report" and claimed:
            h.report(claimed.pop(data.draw(st.integers(0, len(claimed) - 1))))
        assert running_in(h, "nightly") <= 2
    # Whatever happened, the queue drains: agents that keep polling get every job run.
    for job_id in claimed:
        h.report(job_id)
    for _ in range(20):
        for node in NODES4:
            for job_id in h.poll(node):
                if try_claim(h, job_id):
                    assert running_in(h, "nightly") <= 2
                    h.report(job_id)
    assert {h.job(job_id).status for job_id in submitted} == {jobs.DONE}


def test_two_claims_past_the_limit_the_second_is_refused_naming_the_queue() -> None:
    h = Harness(nodes=["node-a", "node-b"], max_jobs_per_node=2)
    h.service.queues.update(QueueSettings("nightly", max_running=1))
    a = h.submit("a", queue="nightly")
    b = h.submit("b", queue="nightly")
    h.claim(a.job_id)
    with pytest.raises(errors.Conflict) as caught:
        h.claim(b.job_id)
    assert (
        caught.value.message
        == f"job {b.job_id} cannot start: queue nightly at its limit (1 running)"
    )
    assert h.job(b.job_id).status == jobs.PENDING


def test_a_paused_queue_hands_nothing_out_and_resuming_releases_it() -> None:
    h = Harness(nodes=["node-a"], max_jobs_per_node=4)
    held = h.submit("nightly work", queue="nightly")
    other = h.submit("other work")
    h.service.queues.update(QueueSettings("nightly", paused=True))
    assert h.poll("node-a") == [other.job_id]
    with pytest.raises(errors.Conflict) as caught:
        h.claim(held.job_id)
    assert caught.value.message.endswith("queue nightly paused")
    assert h.service.reads.node_loads(["node-a"], None)[0].queued == 1  # only `other` counts
    h.service.queues.update(QueueSettings("nightly", paused=False))
    assert h.poll("node-a") == [held.job_id, other.job_id]
    assert h.service.reads.node_loads(["node-a"], None)[0].queued == 2


def test_a_queue_at_its_limit_counts_as_no_load_for_placement() -> None:
    h = Harness(nodes=["node-a", "node-b"], max_jobs_per_node=1)
    h.service.queues.update(QueueSettings("nightly", max_running=1))
    h.claim(h.submit("runs", queue="nightly").job_id)  # node-a
    waiting = h.submit("waits for the queue", queue="nightly")  # node-b
    assert waiting.node_id == "node-b"
    assert h.service.reads.node_loads(["node-b"], None)[0].queued == 0
    # So the next job is placed as if node-b were idle (the rotation picks node-a, the
    # least-loaded tie after node-b; node-a is busy running: node-b wins).
    assert h.submit("other").node_id == "node-b"


def test_a_freed_place_goes_to_the_queues_oldest_highest_priority_job_wherever_it_is() -> None:
    h = Harness(nodes=["node-a", "node-b"], max_jobs_per_node=2)
    h.service.queues.update(QueueSettings("nightly", max_running=1))
    first = h.submit("first", queue="nightly")  # node-a
    low = h.submit("low, on node-b", queue="nightly", priority=10)  # node-b
    high = h.submit("high, on node-a", queue="nightly", priority=90)  # node-a
    assert (first.node_id, low.node_id, high.node_id) == ("node-a", "node-b", "node-a")
    h.claim(first.job_id)
    assert h.poll("node-a") == [] and h.poll("node-b") == []
    h.report(first.job_id)
    assert h.poll("node-b") == []  # its low job is not the queue's head
    assert h.poll("node-a") == [high.job_id]
    h.claim(high.job_id)
    h.report(high.job_id)
    assert h.poll("node-b") == [low.job_id]


def test_an_idle_node_takes_only_a_limited_queues_head() -> None:
    h = Harness(nodes=["node-a"], max_jobs_per_node=1, job_stealing=True)
    h.service.queues.update(QueueSettings("nightly", max_running=2))
    h.claim(h.submit("keeps node-a busy").job_id)
    first = h.submit("first", queue="nightly")
    second = h.submit("second", queue="nightly")
    third = h.submit("third", queue="nightly")
    h.set_nodes(healthy=["node-a", "node-b", "node-c"])
    assert h.poll("node-b") == [first.job_id]
    h.claim(first.job_id)
    assert h.poll("node-c") == [second.job_id]
    h.claim(second.job_id)
    h.set_nodes(healthy=["node-a", "node-b", "node-c", "node-d"])
    assert h.poll("node-d") == []  # the queue runs its 2
    assert h.job(third.job_id).node_id == "node-a"


def test_settings_and_the_limit_hold_across_a_restart() -> None:
    h = Harness(nodes=["node-a", "node-b"], max_jobs_per_node=2)
    h.service.queues.update(QueueSettings("nightly", max_running=1))
    h.service.queues.update(QueueSettings("weekly", paused=True))
    a = h.submit("a", queue="nightly")
    b = h.submit("b", queue="nightly")
    c = h.submit("c", queue="weekly")
    h.claim(a.job_id)
    h = h.restart()
    assert [
        (v.queue, v.pending, v.running, v.max_running, v.paused) for v in h.service.queues.listing()
    ] == [
        ("nightly", 1, 1, 1, False),
        ("weekly", 1, 0, None, True),
    ]
    assert h.poll(b.node_id) == [] and h.poll(c.node_id) == []
    with pytest.raises(errors.Conflict):
        h.claim(b.job_id)
    h.report(a.job_id)
    assert h.poll(b.node_id) == [b.job_id]


def test_queues_are_listed_with_jobs_or_settings_and_jobs_filter_by_queue() -> None:
    h = Harness()
    h.submit("a")
    n1 = h.submit("b", queue="nightly")
    h.service.queues.update(QueueSettings("empty", max_running=3))
    assert [v.to_wire() for v in h.service.queues.listing()] == [
        {"queue": "default", "pending": 1, "running": 0, "max_running": None, "paused": False},
        {"queue": "empty", "pending": 0, "running": 0, "max_running": 3, "paused": False},
        {"queue": "nightly", "pending": 1, "running": 0, "max_running": None, "paused": False},
    ]
    for status in ("pending", None):
        page = h.service.reads.list_jobs(JobQuery(status=status, queue="nightly"))
        assert [job.job_id for job in page.jobs] == [n1.job_id]


def test_why_a_job_waits() -> None:
    h = Harness(nodes=["node-a"], max_jobs_per_node=1)
    why = h.service.reads.waiting_for
    running = h.submit("runs")
    assert why(h.job(running.job_id)) == "the agent on node-a to take it"
    h.claim(running.job_id)
    assert why(h.job(running.job_id)) is None
    dependent = h.submit("after", depends_on=[running.job_id, running.job_id])
    assert why(h.job(dependent.job_id)) == f"dependencies: {running.job_id}"
    later = h.submit("later", not_before="2027-12-01T10:00:00Z")
    assert why(h.job(later.job_id)) == "not before 2027-12-01T10:00:00Z"
    slot = h.submit("needs the slot")
    assert why(h.job(slot.job_id)) == "a free slot on node-a"
    queued = h.submit("queued", queue="nightly")
    h.service.queues.update(QueueSettings("nightly", paused=True))
    assert why(h.job(queued.job_id)) == "queue nightly paused"
    h.report(running.job_id)
    h.service.queues.update(QueueSettings("nightly", max_running=1))
    h.claim(h.submit("takes the queue's place", queue="nightly").job_id)
    assert why(h.job(queued.job_id)) == "queue nightly at its limit (1 running)"


def test_a_claim_under_way_counts_against_the_limit_until_it_commits_or_fails() -> None:
    """Two nodes claiming the last place at once: the second claim's check comes while the
    first one's commit is under way (nothing runs yet), and must still be refused."""
    nightly = [
        Job(seq=seq, node_id=node, command="x", queue="nightly")
        for seq, node in ((1, "node-a"), (2, "node-b"))
    ]
    table = JobTable(nightly, 2, [QueueSettings("nightly", max_running=1)])
    first, second = (jobs.start(job, 1) for job in nightly)
    with table.starting(first), pytest.raises(errors.Conflict), table.starting(second):
        pass
    # The first claim's commit failed (nothing was put): its place is free again.
    with table.starting(second):
        table.put(second)
    with pytest.raises(errors.Conflict), table.starting(first):
        pass


@pytest.mark.parametrize("name", ["a", "...", ".a", "a.", "..b", "x" * 64, "default", "-_."])
def test_a_queue_name_is_any_64_allowed_characters(name: str) -> None:
    assert queues.is_valid_name(name)


@pytest.mark.parametrize("name", [".", "..", "", "x" * 65, "a b", "a/b", 7, None])
def test_dot_segments_and_other_names_are_not_queue_names(name: object) -> None:
    """`.` and `..` fit the characters, but a client normalising its URL turns
    PUT /queues/.. into PUT /: a queue of that name could never be addressed."""
    assert not queues.is_valid_name(name)


def test_the_documented_pattern_of_a_queue_name_is_the_rule() -> None:
    import json
    import re
    from importlib import resources

    document = json.loads(resources.files("tiny_scheduler").joinpath("openapi.json").read_text())
    pattern = document["components"]["schemas"]["JobRequest"]["properties"]["queue"]["pattern"]
    for name in [".", "..", "...", ".a", "..b", "a.", "x" * 64, "x" * 65, "", "a b"]:
        assert bool(re.search(pattern, name)) == queues.is_valid_name(name), name
