"""Which waiting heartbeats a change wakes (`service/node_waits.py`), on the in-memory harness:
the node a job is placed on, moved to or ends on, a drained node, and for a job its node
cannot start, exactly one node that waits with free slots, taking turns. No port, no sleep."""

from __future__ import annotations

from harness import Harness

from tiny_scheduler.service import moves


def counts(h: Harness, *nodes: str) -> list[int]:
    waits = h.service.waits
    return [waits.signal(node).count for node in nodes]


def test_a_job_wakes_its_own_node_only() -> None:
    h = Harness()
    before = counts(h, "node-a", "node-b", "node-c")
    job = h.submit_on("node-b")
    assert counts(h, "node-a", "node-b", "node-c") == [before[0], before[1] + 1, before[2]]
    h.claim(job.job_id)
    assert counts(h, "node-b") == [before[1] + 1]  # its own claim tells its agent nothing
    h.cancel(job.job_id)
    assert counts(h, "node-b") == [before[1] + 2]  # a stop order for it


def test_a_drain_and_an_undrain_wake_the_node() -> None:
    h = Harness(builtin=True)
    h.heartbeat("node-a")
    (before,) = counts(h, "node-a")
    h.service.nodes.set_drain("node-a", True)
    h.service.nodes.set_drain("node-a", False)
    assert counts(h, "node-a") == [before + 2]


def test_a_job_its_node_cannot_start_wakes_one_hungry_node_in_turn() -> None:
    h = Harness(max_jobs_per_node=1)
    busy = h.submit_on("node-a")
    h.claim(busy.job_id)  # node-a is full
    waits = h.service.waits
    waits.parked("node-b", want=1)
    waits.parked("node-c", want=1)
    before = counts(h, "node-b", "node-c")
    h.submit_on("node-a")
    assert counts(h, "node-b", "node-c") == [before[0] + 1, before[1]]
    h.submit_on("node-a")
    assert counts(h, "node-b", "node-c") == [before[0] + 1, before[1] + 1]


def test_nobody_else_is_woken_for_a_job_its_node_starts_itself() -> None:
    h = Harness(max_jobs_per_node=2)
    h.service.waits.parked("node-b", want=1)
    (before,) = counts(h, "node-b")
    h.submit_on("node-a")
    assert counts(h, "node-b") == [before]


def test_a_node_that_stopped_waiting_is_not_woken_for_others() -> None:
    h = Harness(max_jobs_per_node=1)
    h.claim(h.submit_on("node-a").job_id)
    left = h.service.waits.parked("node-b", want=1)
    left()
    full = h.service.waits.parked("node-c", want=0)  # waits, but has no free slot
    (before_b, before_c) = counts(h, "node-b", "node-c")
    h.submit_on("node-a")
    assert counts(h, "node-b", "node-c") == [before_b, before_c]
    full()


def test_want_lets_through_the_first_jobs_that_fit_in_its_slots() -> None:
    h = Harness(max_jobs_per_node=8)
    plain, wide, service, last = (
        h.submit_on("node-a"),
        h.submit_on("node-a", cpus=4),
        h.submit_on("node-a", job_type="service"),
        h.submit_on("node-a"),
    )
    found = [plain, wide, service, last]
    assert moves.within_slots(found, 2) == [plain, service, last]
    assert moves.within_slots(found, 0) == [service]
    assert moves.within_slots(found[1:], 5, before=[plain]) == [wide, service]


def test_a_jobs_end_wakes_the_nodes_of_the_dependents_it_makes_due() -> None:
    h = Harness()
    first = h.submit_on("node-a")
    second = h.submit_on("node-b", depends_on=[first.job_id])
    other = h.submit_on("node-c", depends_on=[first.job_id, h.submit_on("node-a").job_id])
    h.claim(first.job_id)
    before = counts(h, "node-b", "node-c")
    h.report(first.job_id)
    # node-b's job is due now; node-c's still waits for another job: nothing for node-c.
    assert counts(h, "node-b", "node-c") == [before[0] + 1, before[1]]
    assert h.poll("node-b") == [second.job_id] and other.job_id not in h.poll("node-c")
