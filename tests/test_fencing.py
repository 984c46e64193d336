"""Fencing (`tiny_scheduler/fencing.py`): only the current attempt's reports count, and a
silent node's work is given up only after its fence has surely stopped it. The pure rules,
then the service on the harness (no port, no sleep); the agent's side of the fence runs as
real processes in test_agent_owner.py."""

from __future__ import annotations

import pytest
from harness import Harness

from tiny_scheduler import errors
from tiny_scheduler.domain import fencing, jobs
from tiny_scheduler.domain.jobs import Job
from tiny_scheduler.domain.validation import JobUpdate

# --- the rules ----------------------------------------------------------------------------


def job(**fields: object) -> Job:
    return Job(seq=7, node_id="node-b", **fields)  # type: ignore[arg-type]


STALE_B1 = "stale report: job-7 is on attempt 2 on node-b"


@pytest.mark.parametrize(
    ("current", "node", "attempt", "claim", "stale"),
    [
        # Named reports: the attempt number is the fencing token, the node must match too.
        (job(status=jobs.RUNNING, retry_count=1, named_claim=True), "node-b", 1, False, None),
        (job(status=jobs.RUNNING, retry_count=1), "node-a", 0, False, STALE_B1),
        (job(status=jobs.RUNNING, retry_count=1), "node-b", 0, False, STALE_B1),
        (job(status=jobs.RUNNING, retry_count=1), "node-a", 1, False, STALE_B1),
        (job(status=jobs.PENDING, retry_count=1), "node-a", 0, True, STALE_B1),
        (job(status=jobs.PENDING, retry_count=1), "node-b", 1, True, None),
        # Only one of the two named: it is checked all the same.
        (job(status=jobs.RUNNING, retry_count=1), None, 0, False, STALE_B1),
        (job(status=jobs.RUNNING, retry_count=1), "node-a", None, False, STALE_B1),
        # Unnamed (the tiny-aws agent): as before, unless a naming agent claimed the attempt.
        (job(status=jobs.RUNNING, retry_count=1), None, None, False, None),
        (job(status=jobs.RUNNING, retry_count=1, named_claim=True), None, None, False, STALE_B1),
        (job(status=jobs.PENDING, retry_count=1), None, None, True, None),
    ],
)
def test_stale_report(
    current: Job, node: str | None, attempt: int | None, claim: bool, stale: str | None
) -> None:
    assert fencing.stale_report(current, node, attempt, claim) == stale


@pytest.mark.parametrize(
    ("lost", "beat", "fence"),
    [
        (90, 5, 30),  # the defaults: capped at 30 s
        (40, 5, 29),  # 40 - 10 - 1
        (30, 5, 19),
        (20, 5, 15),  # never below three heartbeat periods...
        (3, 0.5, 5),  # ...nor 5 s: the scheduler then waits for the fence (lost_at)
    ],
)
def test_the_automatic_fence_ends_before_the_scheduler_gives_up(
    lost: float, beat: float, fence: float
) -> None:
    assert fencing.fence_secs_auto(lost, beat) == fence


def test_an_explicit_fence_too_long_is_refused_naming_both_numbers() -> None:
    assert fencing.fence_refusal(29, 40, 5) is None
    assert fencing.fence_refusal(5, 3, 0.5) is None  # the floor is allowed
    refusal = fencing.fence_refusal(60, 40, 5)
    assert refusal is not None and "60" in refusal and "29" in refusal and "40" in refusal


def test_a_fencing_node_is_given_up_only_after_its_fence_has_passed() -> None:
    # Without a fence: NODE_LOST_SECS after the last heartbeat.
    assert fencing.lost_at(100.0, None, 5, 90) == 190.0
    # A fence shorter than the loss time changes nothing; a longer one (with two periods to
    # spare) pushes the moment back.
    assert fencing.lost_at(100.0, 30, 5, 90) == 190.0
    assert fencing.lost_at(100.0, 30, 5, 20) == 140.0


# --- the service: reports that name their attempt -----------------------------------------


def test_a_stale_final_report_never_ends_the_live_retry() -> None:
    h = Harness(max_job_retries=1)
    job_id = h.submit_on("node-a", "echo hi").job_id
    h.claim(job_id, node="node-a", attempt=0)
    h.service.output.append(job_id, "so far\n", "", "node-a", 0)
    h.service.jobs.fail_running(jobs.parse_job_id(job_id), jobs.Reason.NODE_LOST)
    retry_node = h.job(job_id).node_id
    assert retry_node != "node-a", "the retry avoids the failed node"
    h.claim(job_id, node=retry_node, attempt=1)
    # Node a comes back and reports its attempt: refused, the live retry untouched...
    with pytest.raises(errors.Conflict) as refused:
        h.report(job_id, 0, stdout="so far\nand the end\n", node="node-a", attempt=0)
    assert refused.value.message == f"stale report: {job_id} is on attempt 2 on {retry_node}"
    now = h.job(job_id)
    assert (now.status, now.node_id, now.retry_count) == (jobs.RUNNING, retry_node, 1)
    # ...and what it printed is kept on its own attempt, the loss still its last line.
    first = now.attempts[0]
    assert (first.node_id, first.stdout, first.stderr) == (
        "node-a",
        "so far\nand the end\n",
        jobs.NODE_LOST_STDERR,
    )
    # Its live output is refused the same way; the retry's own report ends the job.
    with pytest.raises(errors.Conflict):
        h.service.output.append(job_id, "more\n", "", "node-a", 0)
    done = h.report(job_id, 0, stdout="retry's\n", node=retry_node, attempt=1)
    assert (done.status, done.stdout) == (jobs.DONE, "retry's\n")


def test_a_stale_claim_is_refused() -> None:
    h = Harness()
    job_id = h.submit_on("node-a").job_id
    with pytest.raises(errors.Conflict) as refused:
        h.claim(job_id, node="node-b", attempt=0)
    assert refused.value.message == f"stale report: {job_id} is on attempt 1 on node-a"
    with pytest.raises(errors.Conflict):
        h.claim(job_id, node="node-a", attempt=3)
    assert h.job(job_id).status == jobs.PENDING


def test_an_attempt_claimed_with_names_takes_no_unnamed_report() -> None:
    h = Harness()
    named = h.submit_on("node-a").job_id
    h.claim(named, node="node-a", attempt=0)
    with pytest.raises(errors.Conflict):
        h.report(named, 0)
    assert h.job(named).status == jobs.RUNNING
    # The tiny-aws agent's way, unnamed from claim to end, goes on working.
    plain = h.submit_on("node-a").job_id
    h.claim(plain)
    assert h.report(plain, 0).status == jobs.DONE


@pytest.mark.parametrize(
    ("current", "auth_on", "credential", "claim", "refused"),
    [
        # With auth on, an attempt claimed with the key takes no keyless report...
        (job(status=jobs.RUNNING, keyed_claim=True), True, False, False, True),
        (job(status=jobs.FAILED, keyed_claim=True), True, False, False, True),  # late ones too
        (job(status=jobs.RUNNING, keyed_claim=True), True, True, False, False),
        # ...while the tiny-aws agent's keyless claim and reports work as before,
        (job(status=jobs.PENDING), True, False, True, False),
        (job(status=jobs.RUNNING), True, False, False, False),
        # and with auth off (a restart without the key) nothing carries one: all taken.
        (job(status=jobs.RUNNING, keyed_claim=True), False, False, False, False),
    ],
)
def test_keyless_report_refused(
    current: Job, auth_on: bool, credential: bool, claim: bool, refused: bool
) -> None:
    assert fencing.keyless_report_refused(current, auth_on, credential, claim) is refused


def test_a_keyed_claim_takes_no_keyless_report_until_its_retry() -> None:
    h = Harness(api_key="k", max_job_retries=1)
    job_id = h.submit_on("node-a").job_id
    claim = JobUpdate(status=jobs.RUNNING)
    assert h.service.jobs.update(job_id, claim, credential=True).keyed_claim
    with pytest.raises(errors.Unauthorized):
        h.service.jobs.update(job_id, JobUpdate(status=jobs.DONE, exit_code=0, stdout="forged"))
    assert h.job(job_id).status == jobs.RUNNING
    failed = JobUpdate(status=jobs.FAILED, exit_code=1)
    retried = h.service.jobs.update(job_id, failed, credential=True)
    assert (retried.status, retried.keyed_claim) == (jobs.PENDING, False)
    # The retry's attempt is claimed without the key: keyless reports are its own again.
    h.claim(job_id)
    assert h.report(job_id, 0).status == jobs.DONE


# --- the service: output is never thrown away -------------------------------------------


def running_with_output(h: Harness, **fields: object) -> str:
    job_id = h.submit_on("node-a", "echo start; sleep 30", **fields).job_id
    h.claim(job_id, node="node-a", attempt=0)
    h.service.output.append(job_id, "start\n", "warming up\n", "node-a", 0)
    return job_id


def test_a_timeout_keeps_what_the_job_printed() -> None:
    h = Harness()
    job_id = running_with_output(h, timeout_secs=5)
    h.advance(5)
    h.scan.tick()
    failed = h.job(job_id)
    assert (failed.reason, failed.stdout, failed.stderr) == (
        jobs.Reason.TIMEOUT,
        "start\n",
        "warming up\njob timed out",
    )
    # The agent's late report (it stopped the job) brings the rest; the note stays last.
    late = h.report(job_id, 143, stdout="start\nmore\n", stderr="warming up\nTerminated\n")
    assert (late.status, late.reason, late.exit_code) == (jobs.FAILED, jobs.Reason.TIMEOUT, -1)
    assert (late.stdout, late.stderr) == ("start\nmore\n", "warming up\nTerminated\njob timed out")


def test_a_cancel_keeps_what_the_job_printed() -> None:
    h = Harness()
    job_id = running_with_output(h)
    cancelled = h.cancel(job_id)
    assert (cancelled.stdout, cancelled.stderr) == ("start\n", "warming up\njob cancelled")
    assert h.job(job_id).stdout == "start\n"


def test_a_lost_attempt_keeps_what_it_printed() -> None:
    h = Harness(max_job_retries=1)
    job_id = running_with_output(h)
    h.service.jobs.fail_running(jobs.parse_job_id(job_id), jobs.Reason.NODE_LOST)
    first = h.job(job_id).attempts[0]
    assert (first.stdout, first.stderr) == ("start\n", "warming up\nnode lost")


def test_the_agents_own_timeout_is_final_and_keeps_the_output() -> None:
    h = Harness(max_job_retries=3)
    job_id = running_with_output(h, timeout_secs=3)
    ended = h.report(
        job_id,
        143,
        stdout="start\n",
        stderr="warming up\n",
        node="node-a",
        attempt=0,
        timed_out=True,
    )
    assert (ended.status, ended.reason, ended.exit_code, ended.retry_count) == (
        jobs.FAILED,
        jobs.Reason.TIMEOUT,
        -1,
        0,
    )
    assert ended.stderr == "warming up\njob timed out"
    assert not ended.holds_slot, "the agent stopped it: its slot is free"


# --- the service: heartbeats of fencing agents ------------------------------------------


def test_a_silent_nodes_jobs_wait_for_its_fence_before_they_run_elsewhere() -> None:
    """A node whose agent fences for longer than the loss time: its running job is given up
    only once the fence plus two heartbeat periods have passed since its last heartbeat."""
    h = Harness(builtin=True, node_lost_secs=10, node_heartbeat_secs=1, max_job_retries=1)
    h.heartbeat("node-a", fence_secs=30)
    job_id = h.submit().job_id  # node-a is the only node so far
    h.heartbeat("node-b")
    h.claim(job_id, node="node-a", attempt=0)
    h.heartbeat("node-a", [job_id], fence_secs=30)
    for _ in range(31):  # node-b keeps beating; node-a is silent from here
        h.advance(1)
        h.heartbeat("node-b")
        h.scan.tick()
        assert h.job(job_id).status == jobs.RUNNING, "given up before node-a's fence passed"
    h.advance(1)
    h.heartbeat("node-b")
    h.scan.tick()
    retried = h.job(job_id)
    assert (retried.status, retried.node_id, retried.retry_count) == (jobs.PENDING, "node-b", 1)


def test_a_second_agent_with_the_same_node_id_is_refused() -> None:
    h = Harness(builtin=True, node_lost_secs=10)
    h.heartbeat("node-a", agent_id="first")
    with pytest.raises(errors.Conflict) as refused:
        h.heartbeat("node-a", agent_id="second")
    assert refused.value.message == "node node-a is served by another agent"
    assert h.heartbeat("node-a", agent_id="first").node_id == "node-a"
    # Once the first has been silent for the loss time, another may take the node over.
    h.advance(11)
    assert h.heartbeat("node-a", agent_id="second").node_id == "node-a"


def test_an_agent_that_refuses_work_gets_none_and_says_why() -> None:
    h = Harness(builtin=True)
    h.heartbeat("node-a", refusing_work="spool not writable: read-only file system")
    h.heartbeat("node-b")
    placed = {h.submit().node_id for _ in range(4)}
    assert placed == {"node-b"}
    [view] = [node for node in h.service.nodes.listing() if node.node_id == "node-a"]
    assert view.to_wire()["refusing_work"] == "spool not writable: read-only file system"
    h.heartbeat("node-a")  # it can again
    assert "node-a" in {h.submit().node_id for _ in range(4)}


def test_an_agent_running_an_older_attempt_is_told_to_stop_it() -> None:
    h = Harness(builtin=True)
    h.heartbeat("node-a")
    job_id = h.submit().job_id
    h.claim(job_id, node="node-a", attempt=0)
    orders = h.heartbeat("node-a", [job_id], attempts=((job_id, 0),))
    assert orders.stop == []
    wire = orders.to_wire()
    assert (wire["node_lost_secs"], wire["job_timeout_secs"]) == (
        h.settings.node_lost_secs,
        h.settings.job_timeout_secs,
    )
    assert h.heartbeat("node-a", [job_id], attempts=((job_id, 3),)).stop == [job_id]


def test_the_scans_timeout_is_only_the_backstop_on_a_fencing_node() -> None:
    """A fencing agent stops its jobs at their timeout and reports them itself: the scan
    waits the kill grace and two heartbeat periods more before it times them out."""
    h = Harness(builtin=True, node_heartbeat_secs=1, kill_grace_secs=4, node_lost_secs=60)
    h.heartbeat("fences", fence_secs=30)
    on_fencing = h.submit(timeout_secs=10).job_id
    h.claim(on_fencing, node="fences", attempt=0)
    h.heartbeat("plain")
    h.heartbeat("fences", [on_fencing], fence_secs=30)
    h.service.nodes.set_drain("fences", True)
    on_plain = h.submit(timeout_secs=10).job_id
    h.claim(on_plain)
    h.advance(10)
    h.heartbeat("fences", [on_fencing], fence_secs=30)
    h.heartbeat("plain", [on_plain])
    h.scan.tick()
    assert (h.job(on_plain).status, h.job(on_fencing).status) == (jobs.FAILED, jobs.RUNNING)
    h.advance(4 + 2 * 1 - 0.001)
    h.heartbeat("fences", [on_fencing], fence_secs=30)
    h.scan.tick()
    assert h.job(on_fencing).status == jobs.RUNNING
    h.advance(0.001)
    h.scan.tick()
    assert h.job(on_fencing).reason == jobs.Reason.TIMEOUT
