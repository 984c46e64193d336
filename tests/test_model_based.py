"""A model-based test: random sequences of everything that can happen to jobs, each step held
against a small model of what the contract says must then be true.

Steps: submit (with and without an Idempotency-Key), the agent's poll, claim, finish, fail,
cancel, a clock that jumps past run timeouts, the late report of a timed-out attempt, a node
going unhealthy or coming back, and a restart of the scheduler on the same database file.
After every step the scheduler must agree with the model on every job: status, reason, node,
retries and attempts, exit code, output and the lifecycle stamps to the microsecond; ids are
1, 2, 3... with none reused; each node's poll is its oldest pending jobs, cut to its free
slots (a timed-out attempt keeps its slot until its late report or its node is lost);
finished jobs never change again; and a restart changes nothing at all.

It runs in-process for speed and determinism: the app from `create_app` on a temporary SQLite
file, driven through Flask's test client, with a real registry on loopback. The clock the
service stamps jobs with is replaced by one that moves only when the test says, so the model
knows every timestamp exactly; the timeout and lost-node scans are called directly, as their
loop would. The model places jobs itself by the least-loaded rule (lowest (waiting `run`
jobs + slots in use) / slots, ties to the first node after the previous choice; a retry
elsewhere when another healthy node exists; a job on a lost node moved to a healthy one) and
expects the scheduler's choice to be the same. Moving waiting work between nodes is off here:
the invariants poll every node after every step, and the tests of stealing are elsewhere.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from helpers import compact, in_wire_order, set_nodes, without_waiting_for
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tiny_scheduler import Settings, create_app, stop_background
from tiny_scheduler.agent.protocol import RUNNING_UPDATE
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.placement import NO_HEALTHY_NODES

NODES = ("node-a", "node-b", "node-c")
MAX_JOBS_PER_NODE = 2
MAX_JOB_RETRIES = 1
JOB_TIMEOUT_SECS = 100
START = 1_800_000_000_000_000  # the fake clock's first reading, in microseconds
STEP_US = 1_000  # the clock moves this much before every step, so stamps differ
FINAL = ("done", "failed")


@dataclasses.dataclass
class ModelJob:
    """What the contract says a job must look like."""

    seq: int
    node: str
    command: str
    job_type: str
    timeout_secs: int
    created_at: int
    status: str = "pending"
    reason: str | None = None
    holds_slot: bool = False  # ended while it ran, its process may still run: stop orders
    retry_count: int = 0
    attempts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    running_at: int | None = None
    finished_at: int | None = None
    frozen: dict[str, Any] | None = None  # its reply when it reached a final status

    @property
    def job_id(self) -> str:
        return f"job-{self.seq}"

    def end_attempt(
        self, status: str, exit_code: int, stdout: str, stderr: str, now: int, reason: str = "exit"
    ) -> None:
        self.status, self.exit_code, self.finished_at = status, exit_code, now
        self.stdout, self.stderr = stdout, stderr
        self.reason = reason if status == "failed" else None

    def retry(self, node: str) -> None:
        """The contract's retry: the attempt is recorded, the job is pending again."""
        attempt: dict[str, Any] = {"node_id": self.node, "exit_code": self.exit_code}
        if self.stdout:
            attempt["stdout"] = self.stdout
        if self.stderr:
            attempt["stderr"] = self.stderr
        attempt["running_at"] = jobs.format_time(self.running_at or 0)
        attempt["finished_at"] = jobs.format_time(self.finished_at or 0)
        self.attempts.append(attempt)
        self.status, self.node, self.retry_count = "pending", node, self.retry_count + 1
        self.exit_code, self.stdout, self.stderr, self.reason = None, "", "", None
        self.running_at = self.finished_at = None

    def check(self, wire: dict[str, Any]) -> None:
        """The scheduler's view of this job (GET /jobs/{id}) against the model's."""
        expected: dict[str, Any] = {
            "job_id": self.job_id,
            "node_id": self.node,
            "command": self.command,
            "job_type": self.job_type,
            "status": self.status,
            "retry_count": self.retry_count,
            "created_at": jobs.format_time(self.created_at),
        }
        if self.timeout_secs:
            expected["timeout_secs"] = self.timeout_secs
        optional = {
            "reason": self.reason,
            "exit_code": self.exit_code,
            "stdout": self.stdout or None,
            "stderr": self.stderr or None,
            "running_at": None if self.running_at is None else jobs.format_time(self.running_at),
            "finished_at": None if self.finished_at is None else jobs.format_time(self.finished_at),
            "attempts": self.attempts or None,
        }
        expected.update({k: v for k, v in optional.items() if v is not None})
        assert wire == expected, f"{self.job_id}: scheduler {wire} != model {expected}"
        assert list(wire) == in_wire_order(expected), "fields out of the contract's order"
        if self.frozen is not None:
            assert wire == self.frozen, f"finished {self.job_id} changed"


class Clock:
    """The service's clock (a `tiny_scheduler.clock.Clock`), moved only by the test."""

    def __init__(self) -> None:
        self.now = START
        self.monotonic_extra = 0.0  # moved alone where only an interval must pass

    def now_us(self) -> int:
        return self.now

    def monotonic(self) -> float:
        return self.now / 1_000_000 + self.monotonic_extra


class SchedulerMachine(RuleBasedStateMachine):
    """One scheduler, its registry, and the model; a fresh database per example."""

    def __init__(self, registry: FakeRegistry) -> None:
        super().__init__()
        self.registry = registry
        self.healthy = set(NODES)
        set_nodes(registry, NODES)
        self.folder = Path(tempfile.mkdtemp(prefix="model-"))
        self.clock = Clock()
        self.jobs: dict[int, ModelJob] = {}
        self.keys: dict[str, int] = {}
        self.last_seq = 0
        self.previous: str | None = None  # the node the placement rule chose last
        self.app: Any = None
        self._start()

    submitted = Bundle("submitted")

    # --- plumbing ------------------------------------------------------------------------

    def _start(self) -> None:
        self.app = create_app(
            Settings(
                db_path=str(self.folder / "scheduler.db"),
                registry_url=self.registry.url,
                registry_cache_secs=0,
                max_jobs_per_node=MAX_JOBS_PER_NODE,
                max_job_retries=MAX_JOB_RETRIES,
                job_timeout_secs=JOB_TIMEOUT_SECS,
                node_lost_secs=0,
                job_retention_secs=0,
                job_stealing=False,
            ),
            clock=self.clock,
        )
        self.http = self.app.test_client()
        self.scan = self.app.extensions["tiny_scheduler.background"].scan

    def teardown(self) -> None:
        if self.app is not None:
            stop_background(self.app)
        shutil.rmtree(self.folder, ignore_errors=True)

    def tick(self, micros: int = STEP_US) -> int:
        self.clock.now += micros
        return self.clock.now

    def served(self, job_id: str) -> dict[str, Any]:
        """The job as GET /jobs/{id} shows it, without the `waiting_for` a pending job's page
        adds (its texts are tests/test_workflow_queues.py's): the model holds the job."""
        reply = self.http.get(f"/jobs/{job_id}")
        assert reply.status_code == 200, reply.text
        return without_waiting_for(reply.get_json())

    def patch(self, job_id: str, body: dict[str, Any]) -> Any:
        return self.http.patch(f"/jobs/{job_id}", data=compact(body))

    def expect_conflict(self, reply: Any, job: ModelJob, wanted: str) -> None:
        assert reply.status_code == 409, (reply.status_code, reply.text)
        assert reply.text == f"job {job.job_id} is {job.status}, cannot become {wanted}\n"

    def used(self, node: str) -> int:
        """Slots in use: running `run` jobs, and those ended while they ran (timed out,
        cancelled) that keep their slot until the agent's late report."""
        return sum(
            1
            for j in self.jobs.values()
            if j.node == node and j.job_type == "run" and (j.status == "running" or j.holds_slot)
        )

    def choose(self, avoid: str | None = None, rather_not: str | None = None) -> str:
        """The contract's least-loaded rule, as the model applies it; moves the rotation.
        `avoid` is left out while another node is healthy, then `rather_not` while a third is
        (a retry moved off a lost node does not go back to the node it failed on)."""
        healthy = sorted(self.healthy)
        for unwanted in (avoid, rather_not):
            if unwanted is not None and len(healthy) > 1 and unwanted in healthy:
                healthy.remove(unwanted)
        assert healthy, "the model never places without a healthy node"

        def load(node: str) -> Fraction:
            waiting = sum(
                1
                for j in self.jobs.values()
                if j.node == node and j.status == "pending" and j.job_type == "run"
            )
            return Fraction(waiting + self.used(node), MAX_JOBS_PER_NODE)

        lowest = min(load(node) for node in healthy)
        candidates = [node for node in healthy if load(node) == lowest]
        after = [node for node in candidates if self.previous is not None and node > self.previous]
        self.previous = (after or candidates)[0]
        return self.previous

    def placed_again(self, job: ModelJob, old_node: str) -> None:
        """A retried job goes where the rule sends it (a healthy node other than the one it
        failed on when there is one); with no healthy node at all it keeps its node."""
        node = self.choose(avoid=old_node) if self.healthy else old_node
        assert self.served(job.job_id)["node_id"] == node, f"{job.job_id}: retried elsewhere"
        job.node = node

    def finish_attempt(self, job: ModelJob, exit_code: int, stdout: str, stderr: str) -> None:
        """The model's side of an attempt that ended (reported, timed out or lost)."""
        status = "done" if exit_code == 0 else "failed"
        job.end_attempt(status, exit_code, stdout, stderr, self.clock.now)

    # --- rules -----------------------------------------------------------------------------

    @rule(
        target=submitted,
        command=st.sampled_from(["true", "echo 'hi'", 'printf "a\\nb"', "日本 🚀"]),
        job_type=st.sampled_from(["run", "run", "service"]),
        timeout_secs=st.sampled_from([0, 0, 5, 50]),
        key=st.none() | st.sampled_from(["k1", "k2", "k3"]),
    )
    def submit(self, command: str, job_type: str, timeout_secs: int, key: str | None) -> int:
        now = self.tick()
        body: dict[str, Any] = {"command": command, "job_type": job_type}
        if timeout_secs:
            body["timeout_secs"] = timeout_secs
        headers = {"Idempotency-Key": key} if key else {}
        reply = self.http.post("/jobs", data=compact(body), headers=headers)
        if key in self.keys:
            earlier = self.jobs[self.keys[key]]
            assert reply.status_code == 200, reply.text
            earlier.check(reply.get_json() | self._attempts_of(earlier))
            return earlier.seq
        if not self.healthy:
            assert (reply.status_code, reply.text) == (503, NO_HEALTHY_NODES + "\n")
            return 0  # nothing made; the bundle's consumers skip it
        assert reply.status_code == 201, reply.text
        made = reply.get_json()
        self.last_seq += 1
        assert made["job_id"] == f"job-{self.last_seq}", "ids are 1, 2, 3... never reused"
        assert made["node_id"] == self.choose(), "least-loaded, ties in turn"
        job = ModelJob(
            seq=self.last_seq,
            node=made["node_id"],
            command=command,
            job_type=job_type,
            timeout_secs=timeout_secs,
            created_at=now,
        )
        job.check(made)
        self.jobs[job.seq] = job
        if key:
            self.keys[key] = job.seq
        return job.seq

    @rule(target=submitted, count=st.integers(1, 4), job_type=st.sampled_from(["run", "service"]))
    def submit_several(self, count: int, job_type: str) -> Any:
        """A burst of submissions (so that nodes fill up and queues form)."""
        made = [self.submit(f"batch {n}", job_type, 0, None) for n in range(count)]
        return multiple(*made)

    def _attempts_of(self, job: ModelJob) -> dict[str, Any]:
        # Replies other than GET /jobs/{id} leave the attempts out.
        return {"attempts": job.attempts} if job.attempts else {}

    def in_status(self, status: str) -> list[int]:
        return sorted(seq for seq, job in self.jobs.items() if job.status == status)

    @rule(seq=submitted)
    def claim(self, seq: int) -> None:
        """The agent's claim, of any job: only a pending one may start."""
        job = self.jobs.get(seq)
        if job is None:
            return
        now = self.tick()
        reply = self.patch(job.job_id, RUNNING_UPDATE)
        if job.status != "pending":
            self.expect_conflict(reply, job, "running")
            return
        assert reply.status_code == 200, reply.text
        job.status, job.running_at = "running", now
        job.check(reply.get_json() | self._attempts_of(job))

    @precondition(lambda self: self.in_status("pending"))
    @rule(data=st.data())
    def claim_a_pending_job(self, data: st.DataObject) -> None:
        self.claim(data.draw(st.sampled_from(self.in_status("pending"))))

    @rule(
        seq=submitted,
        exit_code=st.sampled_from([0, 0, 1, 2, -1]),
        stdout=st.sampled_from(["", "out\n", "ünïcode"]),
        stderr=st.sampled_from(["", "err"]),
    )
    def report(self, seq: int, exit_code: int, stdout: str, stderr: str) -> None:
        job = self.jobs.get(seq)
        if job is None:
            return
        self.tick()
        status = "done" if exit_code == 0 else "failed"
        body = {"status": status, "exit_code": exit_code, "stdout": stdout, "stderr": stderr}
        reply = self.patch(job.job_id, body)
        late = job.reason in ("timeout", "cancelled", "node_lost") and job.running_at
        if job.status == "failed" and late:
            # The late end of the attempt that timed out, was cancelled while it ran, or was
            # lost for good: accepted, the job's state unchanged, the slot it kept free again,
            # and what the attempt printed kept on it, the scheduler's note its last line.
            assert reply.status_code == 200, reply.text
            before, _, note = job.stderr.rpartition("\n")
            job.stdout = stdout or job.stdout
            job.stderr = f"{stderr or before}\n{note}" if (stderr or before) else note
            job.frozen = None
            job.check(reply.get_json() | self._attempts_of(job))
            job.frozen = self.served(job.job_id)
            job.holds_slot = False
            return
        if job.status != "running":
            self.expect_conflict(reply, job, status)
            return
        assert reply.status_code == 200, reply.text
        self.finish_attempt(job, exit_code, stdout, stderr)
        self._after_attempt(job, reply.get_json())

    @precondition(lambda self: any(job.holds_slot for job in self.jobs.values()))
    @rule(data=st.data(), exit_code=st.sampled_from([0, 137]))
    def late_report(self, data: st.DataObject, exit_code: int) -> None:
        held = sorted(seq for seq, job in self.jobs.items() if job.holds_slot)
        self.report(data.draw(st.sampled_from(held)), exit_code, "late", "")

    @precondition(lambda self: self.in_status("running"))
    @rule(
        data=st.data(),
        exit_code=st.sampled_from([0, 0, 1, 2, -1]),
        stdout=st.sampled_from(["", "out\n"]),
    )
    def report_on_a_running_job(self, data: st.DataObject, exit_code: int, stdout: str) -> None:
        seq = data.draw(st.sampled_from(self.in_status("running")))
        self.report(seq, exit_code, stdout, "" if exit_code == 0 else "err")

    def _after_attempt(self, job: ModelJob, reply: dict[str, Any] | None) -> None:
        if job.status == "failed" and job.retry_count < MAX_JOB_RETRIES:
            old = job.node
            job.retry("")
            self.placed_again(job, old)
        elif job.status in FINAL:
            job.frozen = self.served(job.job_id)
        if reply is not None:
            job.check(reply | self._attempts_of(job))

    @rule(seq=submitted)
    def cancel(self, seq: int) -> None:
        job = self.jobs.get(seq)
        if job is None:
            return
        now = self.tick()
        reply = self.http.post(f"/jobs/{job.job_id}/cancel")
        if job.status not in ("pending", "running"):
            self.expect_conflict(reply, job, "cancelled")
            return
        assert reply.status_code == 200, reply.text
        # A running job's process goes on until its agent stops it and reports: it is in
        # the node's stop orders meanwhile, and a `run` job keeps its slot.
        job.holds_slot = job.status == "running"
        job.status, job.reason, job.finished_at = "failed", "cancelled", now
        job.exit_code, job.stderr = -1, "job cancelled"
        job.frozen = self.served(job.job_id)
        job.check(reply.get_json() | self._attempts_of(job))

    @rule(seconds=st.sampled_from([1, 6, 51, JOB_TIMEOUT_SECS + 1]))
    def time_passes(self, seconds: int) -> None:
        """The clock jumps; the timeout scan fails the `run` jobs past their timeout, for
        good (no retry). Services have no scheduler timeout."""
        now = self.tick(seconds * 1_000_000)
        expired = 0
        for job in sorted(self.jobs.values(), key=lambda j: j.seq):
            if job.status != "running" or job.job_type == "service":
                continue
            deadline = (job.running_at or 0) + (job.timeout_secs or JOB_TIMEOUT_SECS) * 1_000_000
            if now >= deadline:
                job.end_attempt("failed", -1, "", jobs.TIMED_OUT_STDERR, now, "timeout")
                job.holds_slot = True
                job.frozen = None  # taken below, once the scheduler has done it
                expired += 1
        assert self.scan.expire_timeouts() == expired
        for job in self.jobs.values():
            if (
                job.status == "failed"
                and job.frozen is None
                and job.stderr == jobs.TIMED_OUT_STDERR
            ):
                job.frozen = self.served(job.job_id)

    @rule(node=st.sampled_from(NODES))
    def node_lost(self, node: str) -> None:
        """The node turns unhealthy and the lost-node scan runs twice (NODE_LOST_SECS is 0, so
        by the second scan it has been gone long enough). Node by node, in id order: the
        first scan moves its pending jobs to a healthy node, oldest first; the second fails its
        running jobs with `node lost` (the retry rule applies) and frees the slots its
        timed-out jobs kept."""
        self.tick()
        self.healthy.discard(node)
        set_nodes(self.registry, sorted(self.healthy), sorted(set(NODES) - self.healthy))
        down = sorted(
            {
                job.node
                for job in self.jobs.values()
                if job.status in ("pending", "running") or job.holds_slot
            }
            - self.healthy
        )
        self.scan.handle_lost_nodes()
        for lost in down:
            for job in self.on(lost, "pending"):
                if self.healthy:
                    failed_on = job.attempts[-1]["node_id"] if job.attempts else None
                    job.node = self.choose(avoid=lost, rather_not=failed_on)
        # Gone for more than NODE_LOST_SECS (0) by the second scan: the monotonic clock the
        # scan measures absences with moves on between them; the stamps' clock stands still.
        self.clock.monotonic_extra += 0.001
        self.scan.handle_lost_nodes()
        for lost in down:
            if self.healthy:  # pending jobs only move when a node can take them
                assert not self.on(lost, "pending"), f"jobs left on lost {lost}"
            for job in self.on(lost, "running"):
                job.end_attempt(
                    "failed", -1, "", jobs.NODE_LOST_STDERR, self.clock.now, "node_lost"
                )
                self._after_attempt(job, None)
            for job in self.jobs.values():
                if job.node == lost:
                    job.holds_slot = False

    def on(self, node: str, status: str) -> list[ModelJob]:
        return sorted(
            (j for j in self.jobs.values() if j.node == node and j.status == status),
            key=lambda j: j.seq,
        )

    @precondition(lambda self: len(self.healthy) < len(NODES))
    @rule(data=st.data())
    def node_back(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(sorted(set(NODES) - self.healthy)))
        self.healthy.add(node)
        set_nodes(self.registry, sorted(self.healthy), sorted(set(NODES) - self.healthy))

    @rule()
    def restart(self) -> None:
        """Stop the scheduler and start a new one on the same file: no job may change. (The
        rotation's memory of the previous choice is not stored: it starts again at the first
        node in id order, as a fresh scheduler's does.)"""
        before = {seq: self.served(job.job_id) for seq, job in self.jobs.items()}
        stop_background(self.app)
        self._start()
        self.previous = None
        after = {seq: self.served(job.job_id) for seq, job in self.jobs.items()}
        assert after == before

    # --- what must hold after every step ------------------------------------------------

    @invariant()
    def every_job_is_as_the_model_says(self) -> None:
        reply = self.http.get("/jobs", query_string={"limit": 10000})
        assert reply.status_code == 200, reply.text
        listed = reply.get_json()
        assert [job["job_id"] for job in listed] == [f"job-{seq}" for seq in sorted(self.jobs)]
        for job in self.jobs.values():
            job.check(self.served(job.job_id))

    @invariant()
    def each_poll_is_the_oldest_pending_cut_to_free_slots(self) -> None:
        for node in NODES:
            busy = [j for j in self.jobs.values() if j.node == node and j.status == "running"]
            free = MAX_JOBS_PER_NODE - self.used(node)
            pending = sorted(
                j.seq for j in self.jobs.values() if j.node == node and j.status == "pending"
            )
            expected = [f"job-{seq}" for seq in pending[: max(0, free)]]
            # The poll's answer as an observer sees it: with a key (auth is off here, so any
            # will do), it is not taken for the tiny-aws agent's poll, which would say that the
            # node runs none of the jobs it has claimed (an agent here runs two at once).
            reply = self.http.get(
                "/jobs",
                query_string={"node_id": node, "status": "pending"},
                headers={"Authorization": "Bearer observer"},
            )
            assert reply.status_code == 200, reply.text
            assert [job["job_id"] for job in reply.get_json()] == expected, node
            running = self.http.get("/jobs", query_string={"node_id": node, "status": "running"})
            assert [job["job_id"] for job in running.get_json()] == [
                job.job_id for job in sorted(busy, key=lambda j: j.seq)
            ]

    @invariant()
    def health_counts_every_status(self) -> None:
        reply = self.http.get("/health")
        assert reply.status_code == 200, reply.text
        counts = {status: 0 for status in jobs.STATUSES}
        for job in self.jobs.values():
            counts[job.status] += 1
        assert reply.get_json()["jobs"] == counts


MODEL_RUNS = settings(
    max_examples=40,
    stateful_step_count=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# A fixed amount of work on the CPU: about 30 s alone, a few times that while parallel test
# workers (and whatever else runs on the machine) share its cores. The limit only catches hangs.
@pytest.mark.timeout(600)
def test_the_scheduler_follows_the_model(registry_server: FakeRegistry) -> None:
    run_state_machine_as_test(lambda: SchedulerMachine(registry_server), settings=MODEL_RUNS)


@pytest.mark.slow
def test_the_scheduler_follows_the_model_for_longer(registry_server: FakeRegistry) -> None:
    longer = settings(MODEL_RUNS, max_examples=400, stateful_step_count=60)
    run_state_machine_as_test(lambda: SchedulerMachine(registry_server), settings=longer)
