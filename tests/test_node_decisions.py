"""Nodes as the scheduler itself knows them, on the in-memory harness: health from heartbeats
(`REGISTRY_URL=builtin`), `running` reconciliation, stop orders for cancelled and timed-out
jobs, drains, and what survives a restart."""

from __future__ import annotations

from harness import Harness

from tiny_scheduler.clock import ManualClock
from tiny_scheduler.cluster.node_book import HEALTHY_BEATS, Beat, BuiltinNodes, NodeBook
from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.jobs import Reason
from tiny_scheduler.errors import PlacementError
from tiny_scheduler.service import moves

US = 0.000_001


def builtin(*nodes: str, **settings: object) -> Harness:
    h = Harness(builtin=True, node_heartbeat_secs=5, node_lost_secs=60, **settings)
    for node in nodes:
        h.heartbeat(node)
    return h


def health(h: Harness) -> dict[str, str]:
    return {node.node_id: node.health for node in h.service.nodes.listing()}


# --- the built-in node list ----------------------------------------------------------------


def test_a_node_is_healthy_for_three_heartbeats_unhealthy_then_gone() -> None:
    h = builtin("n1")
    assert health(h) == {"n1": "healthy"}
    h.advance(HEALTHY_BEATS * 5)
    assert health(h) == {"n1": "healthy"}
    h.advance(US)
    assert health(h) == {"n1": "unhealthy"}
    h.advance(60 - HEALTHY_BEATS * 5)
    assert health(h) == {"n1": "gone"}  # listed (it is known), but not in the node list
    assert h.service.reads.node_health().status == {}


def test_the_node_list_is_made_again_when_what_it_shows_changes() -> None:
    # Every poll asks for it: the same list until something it was made of changes.
    clock = ManualClock(0)
    book = NodeBook(clock, heartbeat_secs=5, lost_secs=60)
    nodes = BuiltinNodes(book)
    for node in ("n1", "n2"):
        book.beat(node, Beat(clock.monotonic(), clock.now_us(), 1, frozenset()))
    first = nodes.nodes()
    clock.advance(1)
    assert nodes.nodes() is first
    book.beat("n2", Beat(clock.monotonic(), clock.now_us(), 1, frozenset()))
    assert nodes.nodes() is first  # a healthy node's beat changes nothing the list shows
    book.beat("n2", Beat(clock.monotonic(), clock.now_us(), 2, frozenset()))
    second = nodes.nodes()
    assert second is not first and second.cpus["n2"] == 2
    clock.advance(HEALTHY_BEATS * 5 - 1 + US)  # n1's last beat is just over three periods old
    assert nodes.nodes().status == {"n1": "unhealthy", "n2": "healthy"}


def test_no_heartbeats_no_placement() -> None:
    h = builtin()
    try:
        h.submit("x")
    except PlacementError as exc:
        assert exc.message == "no healthy compute nodes"
    else:
        raise AssertionError("a job was placed with no node")


def test_auto_slots_follow_each_agents_cpu_count() -> None:
    h = Harness(builtin=True, max_jobs_per_node="auto")
    h.heartbeat("big", cpu_count=4)
    h.heartbeat("small", cpu_count=1)
    placed = [h.submit(f"job {i}").node_id for i in range(5)]
    assert placed.count("big") == 4 and placed.count("small") == 1
    views = {node.node_id: node for node in h.service.nodes.listing()}
    assert (views["big"].slots, views["small"].slots) == (4, 1)
    assert views["big"].source == "heartbeat" and views["big"].cpu_count == 4


def test_a_killed_agents_job_fails_as_node_lost_after_node_lost_secs_and_is_retried() -> None:
    h = builtin("n1", "n2")
    job = h.submit("sleep 600")
    h.claim(job.job_id)
    h.heartbeat("n2")  # only n2 goes on beating
    h.advance(60)
    h.heartbeat("n2")
    h.scan.handle_lost_nodes()  # n1 is unhealthy now: first seen down
    h.advance(60 + US)
    h.heartbeat("n2")
    h.scan.handle_lost_nodes()
    retried = h.job(job.job_id)
    assert (retried.status, retried.node_id, retried.retry_count) == (jobs.PENDING, "n2", 1)


# --- reconciliation and stop orders --------------------------------------------------------


def test_a_job_left_out_by_two_heartbeats_in_a_row_is_lost_by_its_agent() -> None:
    h = builtin("n1", "n2")
    job = h.submit("work")
    h.claim(job.job_id)
    h.heartbeat("n1")  # built before the agent started it, perhaps
    assert h.job(job.job_id).status == jobs.RUNNING
    h.heartbeat("n1", running=[job.job_id])  # it is running: the count starts again
    h.heartbeat("n1")
    assert h.job(job.job_id).status == jobs.RUNNING
    h.heartbeat("n1")
    lost = h.job(job.job_id)
    assert lost.status == jobs.PENDING and lost.retry_count == 1
    assert lost.attempts[-1].stderr == moves.LOST_BY_AGENT


def test_a_cancelled_running_job_is_final_at_once_and_stopped_by_its_agent() -> None:
    h = builtin("n1")
    job = h.submit("sleep 600")
    h.claim(job.job_id)
    cancelled = h.cancel(job.job_id)
    assert (cancelled.status, cancelled.reason, cancelled.exit_code) == (
        jobs.FAILED,
        Reason.CANCELLED,
        -1,
    )
    assert h.stored(job.job_id).status == jobs.FAILED
    # Its slot stays taken and it is in the node's stop orders until the late report.
    assert h.heartbeat("n1", running=[job.job_id]).stop == [job.job_id]
    nxt = h.submit("next")
    assert h.poll("n1") == []  # the only slot is still the cancelled job's
    late = h.report(job.job_id, exit_code=143)
    assert (late.status, late.reason) == (jobs.FAILED, Reason.CANCELLED)  # unchanged
    assert h.heartbeat("n1").stop == []
    assert h.poll("n1") == [nxt.job_id]


def test_a_cancelled_service_is_stopped_without_holding_a_slot() -> None:
    h = builtin("n1")
    service = h.submit("serve", job_type="service", port=8080)
    h.claim(service.job_id)
    h.cancel(service.job_id)
    assert h.heartbeat("n1", running=[service.job_id]).stop == [service.job_id]
    work = h.submit("work")
    assert h.poll("n1") == [work.job_id]  # a service never took a slot


def test_a_timed_out_job_is_in_the_stop_orders() -> None:
    h = builtin("n1")
    job = h.submit("sleep 600", timeout_secs=2)
    h.claim(job.job_id)
    h.advance(2)
    h.heartbeat("n1", running=[job.job_id])
    assert h.scan.expire_timeouts() == 1
    assert h.heartbeat("n1", running=[job.job_id]).stop == [job.job_id]


def test_a_job_the_agent_runs_that_is_not_running_there_is_stopped() -> None:
    h = builtin("n1", "n2")
    job = h.submit("work")
    h.claim(job.job_id)
    h.heartbeat("n1")
    h.heartbeat("n1")  # lost by its agent: retried elsewhere
    assert h.job(job.job_id).node_id == "n2"
    # The agent comes back with it running after all: it must stop it.
    assert h.heartbeat("n1", running=[job.job_id, "job-99"]).stop == [job.job_id, "job-99"]


# --- drains --------------------------------------------------------------------------------


def test_drain_moves_pending_work_takes_no_new_and_lets_running_work_finish() -> None:
    h = builtin("n1", "n2", max_jobs_per_node=1)
    running = h.submit("a")
    h.claim(running.job_id)
    waiting = h.submit("b")
    assert (running.node_id, waiting.node_id) == ("n1", "n2")
    queued = h.submit("c")
    assert queued.node_id == "n1"
    view = h.service.nodes.set_drain("n1", True)
    assert view.drain
    assert h.job(queued.job_id).node_id == "n2"  # moved at once
    assert h.job(running.job_id).status == jobs.RUNNING  # finishes where it is
    assert {h.submit(f"more {i}").node_id for i in range(3)} == {"n2"}
    assert h.heartbeat("n1", running=[running.job_id]).drain
    h.service.nodes.set_drain("n1", False)
    assert not h.heartbeat("n1", running=[running.job_id]).drain
    assert "n1" in {h.submit(f"after {i}").node_id for i in range(4)}


def test_drains_and_nodes_survive_a_restart_and_count_as_seen_at_start_up() -> None:
    h = builtin("n1", "n2")
    h.service.nodes.set_drain("n1", True)
    h.advance(3600)  # long after the last heartbeats
    again = h.restart()
    assert health(again) == {"n1": "healthy", "n2": "healthy"}
    assert [node.drain for node in again.service.nodes.listing()] == [True, False]
    assert again.submit("x").node_id == "n2"


def test_a_new_leaders_term_loads_the_nodes_and_a_standby_forgets_them() -> None:
    h = builtin("n1")
    h.service.nodes.set_drain("n1", True)
    h.service.terms.hand_over()
    assert health(h) == {}
    h.service.terms.take_over()
    assert [(node.node_id, node.health, node.drain) for node in h.service.nodes.listing()] == [
        ("n1", "healthy", True)
    ]


def test_unknown_nodes_cannot_be_drained_but_gone_ones_can() -> None:
    h = builtin("n1")
    try:
        h.service.nodes.set_drain("nosuch", True)
    except Exception as exc:
        assert getattr(exc, "status", None) == 404 and str(exc) == "node not found"
    else:
        raise AssertionError("an unknown node was drained")
    h.advance(3600)
    assert health(h) == {"n1": "gone"}
    assert h.service.nodes.set_drain("n1", True).drain
