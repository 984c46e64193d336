"""The scheduler's time- and node-dependent rules at their boundaries, on the in-memory harness
(`harness.py`): timeouts, lost nodes, what an agent's poll proves, leases, SQS redelivery.
Each test runs in milliseconds, at instants the test sets; no port, no sleep."""

from __future__ import annotations

import pytest
from harness import Harness

from tiny_scheduler.cluster import lease
from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.jobs import Reason
from tiny_scheduler.domain.nodes import Nodes
from tiny_scheduler.domain.validation import parse_job_request
from tiny_scheduler.loops.sqs import message_key
from tiny_scheduler.service import moves

US = 0.000_001  # one microsecond, in seconds


# --- timeouts ----------------------------------------------------------------------------


def test_a_job_times_out_exactly_at_its_deadline_not_a_scan_later() -> None:
    h = Harness()
    job = h.submit("sleep 60", timeout_secs=5)
    h.claim(job.job_id)
    h.advance(5 - US)
    assert h.scan.expire_timeouts() == 0
    assert h.job(job.job_id).status == jobs.RUNNING
    h.advance(US)
    assert h.scan.expire_timeouts() == 1
    timed_out = h.job(job.job_id)
    assert (timed_out.status, timed_out.reason) == (jobs.FAILED, Reason.TIMEOUT)
    assert h.stored(job.job_id).status == jobs.FAILED  # committed, not only shown
    # Not retried, and the slot stays taken until the agent's late report.
    assert timed_out.retry_count == 0 and timed_out.holds_slot


def test_the_default_timeout_applies_without_timeout_secs() -> None:
    h = Harness(job_timeout_secs=30)
    job = h.submit("sleep 60")
    h.claim(job.job_id)
    h.advance(30 - US)
    assert h.scan.expire_timeouts() == 0
    h.advance(US)
    assert h.scan.expire_timeouts() == 1


def test_a_service_never_times_out() -> None:
    h = Harness(job_timeout_secs=30)
    job = h.submit("serve", job_type="service", port=8080)
    h.claim(job.job_id)
    h.advance(3600)
    assert h.scan.expire_timeouts() == 0


# --- lost nodes --------------------------------------------------------------------------


def test_a_failed_job_is_retried_on_another_node_even_where_its_own_is_least_loaded() -> None:
    # The rule of `service/lifecycle.py` (`_maybe_retry`: place with avoid=the failed node),
    # at the point where placement alone would pick the failed node: node-a runs only the
    # failing job, node-b has three jobs waiting. Without the rule node-a, the least loaded,
    # would take the retry back.
    h = Harness(nodes=["node-a", "node-b"], max_jobs_per_node=4)
    failing = h.submit_on("node-a", "exit 3")
    for _ in range(3):
        h.submit_on("node-b", "sleep 1")
    h.claim(failing.job_id)
    retried = h.report(failing.job_id, exit_code=3)
    assert retried.status == jobs.PENDING and retried.retry_count == 1
    assert retried.node_id == "node-b"


def test_running_work_is_lost_only_after_node_lost_secs_and_retried_elsewhere() -> None:
    h = Harness(node_lost_secs=60)
    running = h.submit("sleep 600")
    waiting = h.submit("echo next")
    assert running.node_id == "node-a" and waiting.node_id == "node-b"
    h.claim(running.job_id)
    h.set_nodes(healthy=["node-b", "node-c"], unhealthy=["node-a"])
    h.scan.handle_lost_nodes()  # first seen down now
    assert h.job(running.job_id).status == jobs.RUNNING
    h.advance(60)
    h.scan.handle_lost_nodes()  # down exactly NODE_LOST_SECS: not yet lost
    assert h.job(running.job_id).status == jobs.RUNNING
    h.advance(US)
    h.scan.handle_lost_nodes()
    retried = h.job(running.job_id)
    assert retried.status == jobs.PENDING and retried.retry_count == 1
    assert retried.node_id != "node-a"
    assert retried.attempts[-1].stderr == "node lost"


def test_pending_work_of_a_down_node_moves_at_once() -> None:
    h = Harness()
    job = h.submit("x")
    assert job.node_id == "node-a"
    h.set_nodes(healthy=["node-b"], unhealthy=["node-a"])
    h.scan.handle_lost_nodes()
    assert h.job(job.job_id).node_id == "node-b"
    assert h.stored(job.job_id).node_id == "node-b"


def test_a_node_that_comes_back_starts_its_lost_clock_afresh() -> None:
    verdict = moves.judge_nodes(["a"], Nodes.of({"a": "unhealthy"}), {}, 100.0, 60)
    assert verdict.down_since == {"a": 100.0} and verdict.lost == ()
    back = moves.judge_nodes(["a"], Nodes.of({"a": "healthy"}), verdict.down_since, 150.0, 60)
    assert back.down_since == {}
    again = moves.judge_nodes(["a"], Nodes.of({"a": "unhealthy"}), back.down_since, 170.0, 60)
    assert again.down_since == {"a": 170.0} and again.lost == ()
    assert moves.judge_nodes(["a"], Nodes.of({}), {"a": 100.0}, 160.5, 60).lost == ("a",)


def test_nothing_is_replaced_when_no_node_is_healthy() -> None:
    verdict = moves.judge_nodes(["a"], Nodes.of({"a": "unhealthy"}), {}, 0.0, 60)
    assert verdict.replace == ()


# --- what a poll of the tiny-aws agent proves --------------------------------------------


def test_a_poll_from_the_node_after_a_claim_shows_the_claimed_job_is_not_running() -> None:
    h = Harness()
    job = h.submit("work")
    assert h.poll("node-a", from_agent=True) == [job.job_id]
    h.claim(job.job_id)
    h.advance(moves.CLAIM_EVIDENCE_SECS - US)
    h.poll("node-a", from_agent=True)  # too soon after the claim to prove anything
    assert h.job(job.job_id).status == jobs.RUNNING
    h.advance(US)
    h.poll("node-a", from_agent=True)
    lost = h.job(job.job_id)
    assert lost.status == jobs.PENDING and lost.retry_count == 1  # the retry rule applies
    assert lost.attempts[-1].stderr == moves.LOST_BY_AGENT
    assert lost.node_id != "node-a"
    assert h.stored(job.job_id).retry_count == 1


def test_without_retries_left_the_job_fails_as_node_lost() -> None:
    h = Harness(max_job_retries=0)
    job = h.submit("work")
    h.claim(job.job_id)
    h.advance(5)
    h.poll("node-a", from_agent=True)
    failed = h.job(job.job_id)
    assert (failed.status, failed.reason, failed.stderr) == (
        jobs.FAILED,
        Reason.NODE_LOST,
        moves.LOST_BY_AGENT,
    )


@pytest.mark.parametrize("case", ["with a key", "a service", "a heartbeating node"])
def test_polls_that_prove_nothing_change_nothing(case: str) -> None:
    h = Harness()
    if case == "a service":
        job = h.submit("serve", job_type="service", port=80)
    else:
        job = h.submit("work")
    h.claim(job.job_id)
    h.advance(60)
    if case == "a heartbeating node":
        h.heartbeat("node-a", running=[job.job_id])
    h.poll("node-a", from_agent=case != "with a key")
    assert h.job(job.job_id).status == jobs.RUNNING


# --- the lease ---------------------------------------------------------------------------


def test_the_lease_ends_strictly_at_its_fraction_of_the_lease_from_the_renewal_sent() -> None:
    until = lease.valid_until(sent=100.0, lease_secs=10.0)
    assert until == pytest.approx(100.0 + 10.0 * lease.VALID_FRACTION)
    assert until < 110.0  # before the database would let a standby take over
    assert lease.is_valid(until - US, until)
    assert not lease.is_valid(until, until)
    assert not lease.is_valid(until + 1, until)


def test_the_database_counts_reachable_for_one_lease_after_the_last_answer() -> None:
    assert lease.database_reachable(now=15.0, last_contact=10.0, lease_secs=5.0)
    assert not lease.database_reachable(now=15.0 + US, last_contact=10.0, lease_secs=5.0)


# --- SQS redelivery ----------------------------------------------------------------------


def test_an_sqs_that_numbers_from_msg_1_again_still_makes_a_job_per_new_message() -> None:
    h = Harness()
    first, other = b'{"command":"backup"}', b'{"command":"report"}'
    job, created = h.submit_request(parse_job_request(first), message_key("msg-1", first))
    assert created
    # A redelivery: same id, same body, no second job.
    again, created = h.submit_request(parse_job_request(first), message_key("msg-1", first))
    assert not created and again.job_id == job.job_id
    # A reset queue: msg-1 again, but another message.
    new, created = h.submit_request(parse_job_request(other), message_key("msg-1", other))
    assert created and new.job_id != job.job_id
    assert len(h.database.jobs) == 2
