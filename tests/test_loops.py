"""Background work: timeouts, lost nodes, retention, SQS ingestion, SNS.

What the scan decides (timeouts, slots held by timed-out jobs, lost nodes, retention) is
checked on the harness (`harness.py`), at the instants the test sets, with the real scan
object. Under real gunicorn stays what crosses processes: a timeout as the daemon's own scan
finds it and publishes it to SNS, SQS ingestion and SNS delivery. Their peers are the
loopback stand-ins of `tiny_scheduler.dev`; intervals are shortened through the environment,
and every wait polls for its condition with a deadline.
"""

from __future__ import annotations

import json
import logging
import pathlib
from collections.abc import Iterator

import pytest
import requests
from harness import Harness
from helpers import Api, wait_for

from tiny_scheduler import errors
from tiny_scheduler.agent.protocol import RUNNING_UPDATE
from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.dev.sns import FakeSns
from tiny_scheduler.dev.sqs import FakeSqs
from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.validation import JobQuery
from tiny_scheduler.loops.sns import PAGE_SIZE, event_message
from tiny_scheduler.loops.sqs import SqsIngest

US = 0.000_001  # one microsecond, in seconds

FAST = {
    "TIMEOUT_SCAN_INTERVAL_SECS": "0.2",
    "SQS_POLL_INTERVAL_SECS": "0.2",
    "REGISTRY_CACHE_SECS": "0",
    "NODE_LOST_SECS": "1",
}


class Cluster:
    """A scheduler with a registry, SQS and SNS beside it, and small helpers to drive it."""

    def __init__(self, tmp: pathlib.Path, env: dict[str, str], nodes: tuple[str, ...]) -> None:
        self.registry = FakeRegistry().start()
        for node in nodes:
            self.registry.set_node(node)
        self.sqs = FakeSqs(visibility_secs=0.5).start()
        self.sns = FakeSns().start()
        self.log = tmp / "scheduler.log"
        settings = {
            **FAST,
            "REGISTRY_URL": self.registry.url,
            "SQS_URL": self.sqs.url,
            "SNS_URL": self.sns.url,
            **env,
        }
        self.server = SchedulerProcess(str(tmp / "jobs.db"), settings, log_path=str(self.log))
        self.server.start()
        self.api = Api(self.server.url)
        self.http = self.api.session

    def close(self) -> None:
        self.api.close()  # an open keep-alive connection would slow the graceful stop
        self.server.stop()
        for peer in (self.registry, self.sqs, self.sns):
            peer.stop()

    def submit(self, **fields: object) -> dict:
        reply = self.http.post(self.server.url + "/jobs", json=fields, timeout=10)
        assert reply.status_code == 201, reply.text
        return reply.json()

    def job(self, job_id: str) -> dict:
        reply = self.http.get(f"{self.server.url}/jobs/{job_id}", timeout=10)
        assert reply.status_code == 200, reply.text
        return reply.json()

    def patch(self, job_id: str, body: dict, timeout: float = 10) -> requests.Response:
        return self.http.patch(f"{self.server.url}/jobs/{job_id}", json=body, timeout=timeout)

    def claim(self, job_id: str) -> None:
        reply = self.patch(job_id, RUNNING_UPDATE)
        assert reply.status_code == 200, reply.text

    def jobs(self) -> list[dict]:
        return self.http.get(self.server.url + "/jobs", timeout=10).json()

    def events(self) -> list[dict]:
        return [json.loads(message) for message in self.sns.published("job-status")]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def make_cluster(tmp_path: pathlib.Path) -> Iterator:
    made: list[Cluster] = []

    def make(env: dict[str, str] | None = None, nodes: tuple[str, ...] = ("node-a", "node-b")):
        cluster = Cluster(tmp_path / f"c{len(made)}", env or {}, nodes)
        made.append(cluster)
        return cluster

    for directory in ("c0", "c1"):
        (tmp_path / directory).mkdir()
    yield make
    for cluster in made:
        cluster.close()


# --- under real gunicorn: a timeout found by the daemon's own scan, published to SNS ---------


def test_run_job_times_out_fails_without_retry_and_is_published(make_cluster) -> None:
    cluster = make_cluster({"MAX_JOB_RETRIES": "3"})
    job = cluster.submit(command="sleep 60", timeout_secs=1)
    cluster.claim(job["job_id"])

    failed = wait_for(
        lambda: (j := cluster.job(job["job_id"]))["status"] == "failed" and j, timeout=15
    )
    assert (failed["exit_code"], failed["stderr"], failed["reason"]) == (
        -1,
        "job timed out",
        "timeout",
    )
    assert failed["retry_count"] == 0, "a timed-out job is not retried"
    assert "attempts" not in failed
    event = wait_for(lambda: [e for e in cluster.events() if e["job_id"] == job["job_id"]])
    assert event == [
        {
            "job_id": job["job_id"],
            "status": "failed",
            "node_id": job["node_id"],
            "exit_code": -1,
            "reason": "timeout",
        }
    ]
    # The agent's late report ends the same attempt: accepted, the job's state stays as it
    # was, and what the attempt printed is kept on it (the timeout's note its last line).
    late = cluster.patch(job["job_id"], {"status": "done", "exit_code": 0, "stdout": "late"})
    assert (late.status_code, late.json()) == (200, {**failed, "stdout": "late"})
    assert cluster.job(job["job_id"]) == {**failed, "stdout": "late"}
    assert cluster.patch(job["job_id"], {"status": "running"}).status_code == 409


# --- SQS ----------------------------------------------------------------------------------------


def test_sqs_drains_several_messages_in_one_tick_with_every_field(make_cluster) -> None:
    cluster = make_cluster({"SQS_POLL_INTERVAL_SECS": "3600"})  # only the first tick runs
    cluster.server.stop()
    bodies = [
        {"command": f"echo {n}", "env_vars": {"N": str(n), "Q": 'a "quoted"\nline é'}}
        for n in range(5)
    ]
    bodies.append({"deploy_url": "http://store/app.zip", "job_type": "service", "port": 8080})
    for body in bodies:
        cluster.sqs.send("jobs", json.dumps(body))
    cluster.server.extra_env["SQS_POLL_INTERVAL_SECS"] = "0.5"
    cluster.server.start()

    jobs = wait_for(lambda: len(found := cluster.jobs()) == len(bodies) and found, timeout=15)
    assert [j["command"] for j in jobs[:5]] == [f"echo {n}" for n in range(5)]
    assert [j["env_vars"] for j in jobs[:5]] == [b["env_vars"] for b in bodies[:5]]
    service = jobs[5]
    assert (service["deploy_url"], service["job_type"], service["port"], service["command"]) == (
        "http://store/app.zip",
        "service",
        8080,
        "",
    )
    wait_for(lambda: cluster.sqs.messages("jobs") == [])


def test_sqs_invalid_message_is_logged_and_deleted(make_cluster) -> None:
    cluster = make_cluster()
    bad = cluster.sqs.send("jobs", json.dumps({"command": "x", "port": 70000}))
    junk = cluster.sqs.send("jobs", "not json at all")
    # A lone surrogate survives JSON transport but can never be UTF-8.
    surrogate = cluster.sqs.send("jobs", '{"command":"echo \ud800"}')
    wait_for(lambda: {bad, junk, surrogate} <= set(cluster.sqs.deleted))
    assert cluster.jobs() == []
    rejected = f"SQS message {bad} rejected (port must be an integer between 1 and 65535)"
    # Log lines are written a batch at a time: wait for the last one.
    log = wait_for(lambda: (text := cluster.log_text()).count("rejected") >= 3 and text)
    assert rejected in log
    assert "not json at all" in log


def test_sqs_message_waits_for_a_node(make_cluster) -> None:
    cluster = make_cluster(nodes=())
    message = cluster.sqs.send("jobs", json.dumps({"command": "echo later"}))
    wait_for(lambda: "kept for later: no healthy compute nodes" in cluster.log_text())
    assert message not in cluster.sqs.deleted
    assert cluster.jobs() == []

    cluster.registry.set_node("node-late")
    [job] = wait_for(lambda: cluster.jobs(), timeout=15)
    assert job["node_id"] == "node-late"
    wait_for(lambda: message in cluster.sqs.deleted)


def test_an_sqs_message_of_a_job_no_node_could_run_is_logged_and_deleted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Resources and fit: such a message is refused as POST /jobs would refuse it, and a
    redelivery would change nothing, so it is deleted, not kept; its neighbours still make
    their jobs. On the harness (one tick called by the test) against the SQS stand-in."""
    caplog.set_level(logging.INFO)
    sqs = FakeSqs().start()
    try:
        h = Harness(builtin=True, max_jobs_per_node="auto", sqs_url=sqs.url)
        h.heartbeat("n1", cpu_count=2, memory_mb=4096, labels=(("zone", "a"),))
        too_big = sqs.send("jobs", json.dumps({"command": "big", "cpus": 8}))
        unlabelled = sqs.send("jobs", json.dumps({"command": "x", "node_selector": {"gpu": "a"}}))
        fits = sqs.send("jobs", json.dumps({"command": "fits", "cpus": 2, "memory_mb": 4096}))
        assert SqsIngest(h.service).tick() == 1
        assert sqs.deleted == [too_big, unlabelled, fits] and sqs.messages("jobs") == []
        found = h.service.reads.list_jobs(JobQuery(limit=10)).jobs
        assert [(job.command, job.cpus, job.node_id) for job in found] == [("fits", 2, "n1")]
        for message, why in (
            (too_big, "needs 8 cpus, the largest node has 2"),
            (unlabelled, "no node has gpu=a"),
        ):
            assert (
                f"SQS message {message} refused (no node can run this job: {why}), deleting it"
            ) in caplog.text
    finally:
        sqs.stop()


def test_sqs_redelivery_after_failed_delete_creates_no_duplicate(make_cluster) -> None:
    cluster = make_cluster()
    cluster.sqs.fail_deletes = 1
    message = cluster.sqs.send("jobs", json.dumps({"command": "echo once"}))

    wait_for(lambda: message in cluster.sqs.deleted, timeout=15)
    assert cluster.sqs.messages("jobs") == []
    jobs = cluster.jobs()
    assert len(jobs) == 1
    wait_for(lambda: "delivered again" in cluster.log_text(), message="the redelivery's line")


# --- SNS ------------------------------------------------------------------------------------------


def test_sns_hanging_does_not_slow_updates_and_events_follow(make_cluster) -> None:
    cluster = make_cluster()
    cluster.sns.fault = "hang"
    jobs = [cluster.submit(command=f"echo {n}") for n in range(3)]
    for job in jobs:
        cluster.claim(job["job_id"])
        # Bounded well below SNS's hang: the reply must not wait for the publish.
        reply = cluster.patch(job["job_id"], {"status": "done", "exit_code": 0}, timeout=5)
        assert reply.status_code == 200
    cancelled = cluster.submit(command="never")
    assert cluster.http.post(f"{cluster.server.url}/jobs/{cancelled['job_id']}/cancel").ok

    cluster.sns.fault = None
    cluster.sns.release()
    expected = {(j["job_id"], "done", None) for j in jobs}
    expected.add((cancelled["job_id"], "failed", "cancelled"))
    wait_for(
        lambda: {(e["job_id"], e["status"], e.get("reason")) for e in cluster.events()} >= expected,
        30,
    )


def sns_depth(cluster: Cluster) -> int:
    """The `tiny_scheduler_sns_queue_depth` gauge: events waiting in the outbox."""
    text = cluster.http.get(cluster.server.url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("tiny_scheduler_sns_queue_depth "):
            return int(float(line.split()[1]))
    raise AssertionError("no tiny_scheduler_sns_queue_depth in /metrics")


Final = tuple[str, str, "str | None"]
"""(job id, status, reason) of a final state, as its SNS event says it."""


def finish_and_cancel(cluster: Cluster, done: int, cancelled: int) -> list[Final]:
    """Make jobs final, some done and some cancelled, interleaved; returns (job id, status,
    reason) in the order the changes were acknowledged."""
    finals = []
    for number in range(max(done, cancelled)):
        if number < done:
            job = cluster.submit(command=f"echo {number}")
            cluster.claim(job["job_id"])
            reply = cluster.patch(job["job_id"], {"status": "done", "exit_code": 0}, timeout=5)
            assert reply.status_code == 200, reply.text
            finals.append((job["job_id"], "done", None))
        if number < cancelled:
            job = cluster.submit(command="never")
            url = f"{cluster.server.url}/jobs/{job['job_id']}/cancel"
            assert cluster.http.post(url, timeout=5).status_code == 200
            finals.append((job["job_id"], "failed", "cancelled"))
    return finals


def published(cluster: Cluster) -> list[Final]:
    return [(event["job_id"], event["status"], event.get("reason")) for event in cluster.events()]


def test_sns_down_keeps_every_event_and_publishes_them_in_order_when_it_returns(
    make_cluster,
) -> None:
    """More events than the sender reads at a time wait in the outbox while SNS refuses them
    (the depth gauge counts them); when SNS is back they all go out, once, in order."""
    cluster = make_cluster({"MAX_JOBS_PER_NODE": "4"})
    cluster.sns.fault = "error"
    finals = finish_and_cancel(cluster, done=5, cancelled=PAGE_SIZE + 10)
    wait_for(lambda: "SNS publish failed" in cluster.log_text(), timeout=30)
    assert cluster.sns.requests >= 2, "the publish was retried"
    assert "event dropped" not in cluster.log_text()
    assert sns_depth(cluster) == len(finals)
    assert published(cluster) == []

    cluster.sns.fault = None
    wait_for(lambda: len(published(cluster)) >= len(finals), timeout=60, message="the events")
    assert published(cluster) == finals
    wait_for(lambda: sns_depth(cluster) == 0, timeout=10, message="an empty outbox")


def test_sns_events_not_yet_sent_survive_a_crash(make_cluster) -> None:
    """At-least-once across crashes: the daemon is SIGKILLed with its events unsent (SNS
    refusing them); after the restart they are published, in the order of the changes."""
    cluster = make_cluster()
    cluster.sns.fault = "error"
    finals = finish_and_cancel(cluster, done=3, cancelled=2)
    wait_for(lambda: cluster.sns.requests >= 1, timeout=30, message="a refused publish")
    assert sns_depth(cluster) == len(finals)
    cluster.server.kill()
    assert published(cluster) == []

    cluster.sns.fault = None
    cluster.server.start()
    wait_for(lambda: len(published(cluster)) >= len(finals), timeout=30, message="the events")
    assert published(cluster) == finals
    wait_for(lambda: sns_depth(cluster) == 0, timeout=10, message="an empty outbox")


# --- the scan's decisions, on the harness ------------------------------------------------------


def outbox_events(h: Harness, job_id: str) -> list[dict]:
    """The SNS events the job's changes put in the outbox (see `with_sns`)."""
    seq = jobs.parse_job_id(job_id)
    return [json.loads(event.message) for event in h.database.outbox if event.seq == seq]


def with_sns(h: Harness) -> Harness:
    """Keep an SNS event with every change that makes a job final, as a daemon with SNS_URL."""
    h.service.reads.keep_final_events(event_message)
    return h


def overview_row(page: str, node_id: str) -> str:
    start = page.index(f'<tr data-node="{node_id}">')
    return page[start : page.index("</tr>", start)]


def test_a_timed_out_job_keeps_its_slot_until_its_late_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its process still runs on the node: no new work goes there until the agent reports
    the end (MAX_JOBS_PER_NODE is 1), and the dashboard shows the node busy with it."""
    caplog.set_level(logging.INFO)
    h = with_sns(Harness(["node-a"], max_jobs_per_node=1))
    dashboard = h.app().test_client()
    slow = h.submit("sleep 60", timeout_secs=1).job_id
    h.claim(slow)
    waiting = h.submit("echo next").job_id
    h.advance(1)
    h.scan.tick()
    timed_out = h.job(slow)
    assert (timed_out.status, timed_out.reason) == (jobs.FAILED, jobs.Reason.TIMEOUT)
    assert h.poll("node-a") == [], "the slot is still taken"
    row = overview_row(dashboard.get("/ui/").get_data(as_text=True), "node-a")
    assert slow in row and "still running" in row, "the node shows busy, the job named"

    late = h.report(slow, exit_code=137, stderr="killed")
    # Its state unchanged; what it printed kept, the timeout's note still the last line.
    assert late.to_wire() == {**timed_out.to_wire(), "stderr": "killed\njob timed out"}
    assert h.poll("node-a") == [waiting], "the late report freed the slot"
    assert slow not in overview_row(dashboard.get("/ui/").get_data(as_text=True), "node-a")
    assert "late failed report" in caplog.text
    # The late report published nothing more: the job's one event went out with its timeout.
    assert [event["reason"] for event in outbox_events(h, slow)] == ["timeout"]


def test_a_timed_out_jobs_slot_is_freed_when_its_node_is_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    h = Harness(["node-a"], node_lost_secs=1, max_jobs_per_node=1)
    slow = h.submit("sleep 60", timeout_secs=1).job_id
    h.claim(slow)
    waiting = h.submit("echo next").job_id
    h.advance(1)
    assert h.scan.expire_timeouts() == 1
    assert h.poll("node-a") == []

    h.set_nodes(unhealthy=["node-a"])
    h.scan.handle_lost_nodes()  # first seen down
    h.advance(1)
    h.scan.handle_lost_nodes()  # down exactly NODE_LOST_SECS: not yet lost
    assert f"job {slow}: slot on lost node node-a freed" not in caplog.text
    h.advance(US)
    h.scan.handle_lost_nodes()
    assert f"job {slow}: slot on lost node node-a freed" in caplog.text
    h.set_nodes(healthy=["node-a"])  # the node is back, whatever ran there is gone
    assert h.poll("node-a") == [waiting]
    assert h.stored(slow).reason == jobs.Reason.TIMEOUT, "freeing the slot changes nothing else"


def test_the_timeout_counts_from_running_at_not_created_at() -> None:
    """A job that waited pending longer than its timeout still gets its whole timeout once
    it runs."""
    h = Harness(["node-a"])
    waited = h.submit("sleep 60", timeout_secs=4).job_id
    h.advance(10)
    h.claim(waited)
    h.advance(4 - US)
    assert h.scan.expire_timeouts() == 0
    assert h.job(waited).status == jobs.RUNNING
    h.advance(US)
    assert h.scan.expire_timeouts() == 1


def test_pending_job_moves_off_an_unhealthy_node() -> None:
    h = Harness(["node-a", "node-b"])
    job = h.submit("echo moved")
    stuck = job.node_id
    other = "node-b" if stuck == "node-a" else "node-a"
    h.set_nodes(healthy=[other], unhealthy=[stuck])
    h.scan.tick()

    moved = h.stored(job.job_id)
    assert (moved.node_id, moved.status) == (other, jobs.PENDING)
    assert moved.retry_count == 0, "a move is not a retry"
    assert h.poll(other) == [job.job_id]


def test_running_job_on_a_gone_node_fails_and_runs_again_elsewhere() -> None:
    h = Harness(["node-a", "node-b"], node_lost_secs=1)
    job = h.submit("echo survive")
    lost = job.node_id
    other = "node-b" if lost == "node-a" else "node-a"
    h.claim(job.job_id)
    h.set_nodes(healthy=[other])  # gone from the node list
    h.scan.tick()
    h.advance(1 + US)
    h.scan.tick()

    retried = h.job(job.job_id).to_wire(with_attempts=True)  # as GET /jobs/{id}
    assert (retried["status"], retried["node_id"], retried["retry_count"]) == (
        "pending",
        other,
        1,
    )
    [attempt] = retried["attempts"]
    assert (attempt["node_id"], attempt["exit_code"], attempt["stderr"]) == (lost, -1, "node lost")
    assert "reason" not in retried, "a retried job has not failed for good"

    h.claim(job.job_id)
    assert h.report(job.job_id, stdout="ok\n").status == jobs.DONE


def test_a_lost_node_with_no_retry_left_fails_for_good_with_reason_node_lost() -> None:
    h = with_sns(Harness(["node-a", "node-b"], node_lost_secs=1, max_job_retries=0))
    job = h.submit("echo lost")
    h.claim(job.job_id)
    h.set_nodes(healthy=["node-b"])
    h.scan.tick()
    h.advance(1 + US)
    h.scan.tick()

    failed = h.stored(job.job_id)
    assert (failed.status, failed.reason, failed.exit_code) == (
        jobs.FAILED,
        jobs.Reason.NODE_LOST,
        -1,
    )
    assert h.job(job.job_id).stderr == "node lost"
    assert [event["reason"] for event in outbox_events(h, job.job_id)] == ["node_lost"]


def test_running_job_survives_a_short_absence() -> None:
    h = Harness(["node-a"], node_lost_secs=3600, max_jobs_per_node=2)
    running = h.submit("echo patient").job_id
    h.claim(running)
    witness = h.submit("echo witness").job_id
    h.set_nodes(healthy=["node-b"], unhealthy=["node-a"])
    h.scan.tick()
    assert h.job(witness).node_id == "node-b"
    h.advance(60)
    h.scan.tick()
    assert h.job(running).status == jobs.RUNNING


def test_a_node_list_that_cannot_be_read_moves_nothing(caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(["node-a", "node-b"], node_lost_secs=0)
    pending = h.submit("echo stay")
    running = h.submit("echo stay too")
    h.claim(running.job_id)
    h.nodes.fail("failed to reach registry")
    for _ in range(3):
        h.advance(60)
        h.scan.tick()

    assert caplog.text.count("lost-node scan skipped: failed to reach registry") == 3
    assert (h.job(pending.job_id).status, h.job(pending.job_id).node_id) == (
        jobs.PENDING,
        pending.node_id,
    )
    assert h.job(running.job_id).status == jobs.RUNNING


def test_retention_removes_old_finished_jobs_only() -> None:
    h = Harness(["node-a"], job_retention_secs=1, max_jobs_per_node=5)
    pending = h.submit("echo waiting").job_id
    running = h.submit("echo working").job_id
    h.claim(running)
    finished = h.submit("echo done").job_id
    h.claim(finished)
    h.report(finished)

    h.advance(1)
    h.scan.tick()
    assert h.job(finished).status == jobs.DONE, "kept for exactly JOB_RETENTION_SECS"
    h.advance(US)
    h.scan.tick()
    with pytest.raises(errors.NotFound):
        h.job(finished)
    assert jobs.parse_job_id(finished) not in h.database.jobs
    assert h.job(pending).status == jobs.PENDING
    assert h.job(running).status == jobs.RUNNING
    # Ids are never reused, also after a restart.
    assert h.restart().submit("echo next").job_id == "job-4"
