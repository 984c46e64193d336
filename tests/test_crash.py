"""Crash durability under load: the scheduler is SIGKILLed at random moments, again and again,
and restarted on the same database; nothing it acknowledged may be lost.

Client threads submit jobs (some with an Idempotency-Key) and cancel some, agent threads poll,
claim and finish them (two agents per node, so claims race), a reader lists jobs. The agents
stand for this project's agent, which runs several jobs at once and polls while they run: so
they poll with an `Authorization` header, as it does. (A keyless poll is the tiny-aws agent's,
which runs one job inline and polls nothing meanwhile: a keyless poll a second after a claim
proves that claim lost, docs/reliability.md, and the server rightly fails the held job.) Every reply
a client got is written down in a `Ledger`: a 201, a 200 to a claim, a finish or a cancel, and
also every job a read showed (reads only ever show committed state, so what was seen must
survive too). Then the process group is killed while requests are in flight, the database file
is checked with `PRAGMA integrity_check`, the scheduler is started again on it, and the ledger
is held against what the new process serves:

- every acknowledged job exists with every field it was created with, to the microsecond;
- every acknowledged change is there: the status is at least as far along as acknowledged,
  and a job acknowledged as finished is exactly as acknowledged;
- no job was claimed twice across the whole run (a `PATCH running` gets 200 at most once per
  job: retries are off here, so a job has one attempt);
- ids are never reused: every id handed out after a restart is above every id seen before;
- every job on the server came from a request a client sent, once: a submission whose answer
  was lost in the crash and that is repeated with its Idempotency-Key afterwards yields the
  job the first one made, or one new job, never two.

`make test` runs a few kill cycles; `make soak` (tests marked slow) runs many more.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import shutil
import sqlite3
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import start_scheduler, stop_scheduler
from helpers import DEFAULT_NODES, Api, compact, wait_for, without_waiting_for

from tiny_scheduler.agent.protocol import RUNNING_UPDATE, parse_poll_reply
from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry

ENV = {
    # One attempt per job, so "claimed twice" has one meaning: a second 200 to PATCH running.
    "MAX_JOB_RETRIES": "0",
    "MAX_JOBS_PER_NODE": "3",
    "SCHEDULER_THREADS": "16",
}

# Fields a job is created with; no later change touches them (retries and moves are off).
CREATION_FIELDS = (
    "job_id",
    "node_id",
    "instance_id",
    "command",
    "deploy_url",
    "job_type",
    "port",
    "env_vars",
    "timeout_secs",
    "created_at",
)
AGENT_AUTH = {"Authorization": "Bearer multi-job-agent"}
"""A poll with a key is never taken as proof that a held claim was lost (auth is off here, so
any key is let in): the agents here hold jobs while they poll, as this project's agent does."""
RANK = {"pending": 0, "running": 1, "done": 2, "failed": 2, "cancelled": 2}
CONNECTION_LOST = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
)

# Text that must come back byte for byte, through a crash: quotes, newlines, shell
# metacharacters, non-ASCII and astral-plane characters.
AWKWARD = ("'", '"', "\\", "\n", "\r\n", "\t", "$HOME", "`x`", "é", "€", "日本", "🚀", "\u2028")


def seq_of(job_id: str) -> int:
    return int(job_id.removeprefix("job-"))


@dataclasses.dataclass
class Unanswered:
    """A keyed submission whose reply the crash swallowed; repeated after the restart."""

    key: str
    token: str
    body: dict[str, Any]


class Ledger:
    """What the clients were told, and the problems they saw; shared by every thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.created: dict[str, dict[str, Any]] = {}  # job id -> the 201 reply
        self.latest: dict[str, dict[str, Any]] = {}  # job id -> furthest acknowledged version
        self.claims: collections.Counter[str] = collections.Counter()
        self.sent_tokens: set[str] = set()
        self.unanswered: list[Unanswered] = []
        self.held: dict[str, list[str]] = collections.defaultdict(list)  # node -> running ids
        self.problems: list[str] = []
        self.max_seen = 0  # highest id any reply showed
        self.floor = 0  # every id created from now on must be above this
        self.acks = 0  # acknowledged changes so far (drives the moment of the kill)

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)

    def saw(self, job: dict[str, Any]) -> None:
        """A job some reply showed: it is committed, so it must survive any crash."""
        with self.lock:
            self._saw(job)

    def _saw(self, job: dict[str, Any]) -> None:
        job_id = job["job_id"]
        self.max_seen = max(self.max_seen, seq_of(job_id))
        known = self.latest.get(job_id)
        if known is None or RANK[job["status"]] > RANK[known["status"]]:
            self.latest[job_id] = job
        elif RANK[job["status"]] == 2 and job != known:
            later = late_output_version(known, job)
            if later is None:
                self.problems.append(f"{job_id} finished twice, differently: {known} then {job}")
            else:
                self.latest[job_id] = later

    def created_job(self, job: dict[str, Any], token: str) -> None:
        with self.lock:
            job_id = job["job_id"]
            if job_id in self.created:
                self.problems.append(f"id {job_id} handed out twice")
            if seq_of(job_id) <= self.floor:
                self.problems.append(f"{job_id} created after a restart reuses an old id")
            if token not in job["command"]:
                self.problems.append(f"{job_id} is not the job that was submitted")
            self.created[job_id] = job
            self.acks += 1
            self._saw(job)

    def changed(self, job: dict[str, Any]) -> None:
        with self.lock:
            self.acks += 1
            self._saw(job)

    def claimed(self, job: dict[str, Any]) -> None:
        with self.lock:
            self.claims[job["job_id"]] += 1
            if self.claims[job["job_id"]] > 1:
                self.problems.append(f"{job['job_id']} claimed twice")
            self.acks += 1
            self._saw(job)


class Load:
    """The client, agent and reader threads of one life of the scheduler."""

    def __init__(self, url: str, ledger: Ledger, rng: random.Random) -> None:
        self.url = url
        self.ledger = ledger
        self.stop = threading.Event()
        self.killed = threading.Event()  # set just before the SIGKILL
        self.threads: list[threading.Thread] = []
        seeds = [rng.randrange(2**32) for _ in range(16)]
        workers: list[Callable[[Api, random.Random], None]] = [self.submitter] * 3
        workers += [self.canceller, self.reader]
        for node in DEFAULT_NODES:
            workers += [self._agent_for(node)] * 2
        for worker, seed in zip(workers, seeds, strict=False):
            thread = threading.Thread(target=self._run, args=(worker, random.Random(seed)))
            self.threads.append(thread)

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
            assert not thread.is_alive(), "a load thread did not stop"

    def _run(self, worker: Callable[[Api, random.Random], None], rng: random.Random) -> None:
        api = Api(self.url)
        try:
            while not self.stop.is_set():
                worker(api, rng)
        except CONNECTION_LOST as exc:
            # The server dying under us is the point; a connection lost before then is not.
            if not self.killed.is_set():
                self.ledger.problem(f"connection lost before the kill: {exc!r}")
        except Exception as exc:  # a thread's surprise must fail the test, not vanish
            self.ledger.problem(f"load thread failed: {exc!r}")
        finally:
            api.close()

    # --- the workers: each call does one step; a lost connection ends the thread ----------

    def submitter(self, api: Api, rng: random.Random) -> None:
        token = uuid.uuid4().hex
        body = random_job(rng, token)
        key = uuid.uuid4().hex if rng.random() < 0.5 else None
        with self.ledger.lock:
            self.ledger.sent_tokens.add(token)
        try:
            reply = api.post("/jobs", body, headers={"Idempotency-Key": key} if key else None)
        except CONNECTION_LOST:
            if key:
                with self.ledger.lock:
                    self.ledger.unanswered.append(Unanswered(key, token, body))
            raise
        if reply.status_code != 201:
            self.ledger.problem(f"POST /jobs answered {reply.status_code}: {reply.text!r}")
            return
        job = reply.json()
        check_created(job, body, self.ledger)
        self.ledger.created_job(job, token)

    def canceller(self, api: Api, rng: random.Random) -> None:
        with self.ledger.lock:
            pending = [j for j, job in self.ledger.latest.items() if job["status"] == "pending"]
        if not pending or rng.random() < 0.7:
            self.stop.wait(0.01)  # pace: cancel now and then, not in a tight loop
            return
        reply = api.post(f"/jobs/{rng.choice(pending)}/cancel")
        if reply.status_code == 200:
            self.ledger.changed(reply.json())
        elif reply.status_code != 409:
            self.ledger.problem(f"cancel answered {reply.status_code}: {reply.text!r}")

    def reader(self, api: Api, rng: random.Random) -> None:
        if rng.random() < 0.5:
            reply = api.get("/jobs", params={"limit": 10000})
            jobs = reply.json() if reply.status_code == 200 else []
        else:
            with self.ledger.lock:
                known = list(self.ledger.latest)
            if not known:
                self.stop.wait(0.01)
                return
            reply = api.get(f"/jobs/{rng.choice(known)}")
            jobs = [reply.json()] if reply.status_code == 200 else []
        if reply.status_code != 200:
            self.ledger.problem(f"read answered {reply.status_code}: {reply.text!r}")
        for job in jobs:
            job.pop("attempts", None)
            self.ledger.saw(job)
        self.stop.wait(0.02)

    def _agent_for(self, node: str) -> Callable[[Api, random.Random], None]:
        def agent(api: Api, rng: random.Random) -> None:
            self.agent_step(api, rng, node)

        return agent

    def agent_step(self, api: Api, rng: random.Random, node: str) -> None:
        with self.ledger.lock:
            held = self.ledger.held[node]
            finishing = held.pop(0) if held and rng.random() < 0.5 else None
        if finishing is not None:  # a job claimed in this or an earlier life of the server
            self.finish(api, rng, finishing)
            return
        reply = api.get("/jobs", params={"node_id": node, "status": "pending"}, headers=AGENT_AUTH)
        if reply.status_code != 200:
            self.ledger.problem(f"poll answered {reply.status_code}: {reply.text!r}")
            return
        polled = parse_poll_reply(reply.content)  # as strict as the real agent
        if not polled:
            self.stop.wait(0.01)  # an idle agent polls again soon, not in a tight loop
            return
        job_id = polled[0].job_id
        claim = api.patch(f"/jobs/{job_id}", compact(RUNNING_UPDATE))
        if claim.status_code == 409:
            return  # the other agent of this node, or a cancel, got there first
        if claim.status_code != 200:
            self.ledger.problem(f"claim answered {claim.status_code}: {claim.text!r}")
            return
        self.ledger.claimed(claim.json())
        if rng.random() < 0.3:
            with self.ledger.lock:  # keep it running for a while, maybe across a crash
                self.ledger.held[node].append(job_id)
            return
        self.finish(api, rng, job_id)

    def finish(self, api: Api, rng: random.Random, job_id: str) -> None:
        exit_code = rng.choice([0, 0, 0, 1, 2, 127, -1])
        body = {
            "status": "done" if exit_code == 0 else "failed",
            "exit_code": exit_code,
            "stdout": awkward_text(rng) + "\x00 after a NUL",
            "stderr": awkward_text(rng) if exit_code else "",
        }
        reply = api.patch(f"/jobs/{job_id}", body)
        if reply.status_code != 200:
            self.ledger.problem(f"finish of {job_id} answered {reply.status_code}: {reply.text!r}")
            return
        job = reply.json()
        if job.get("reason") == "cancelled":
            # Cancelled while it ran (the canceller saw it pending): this report is the late
            # end of that attempt, 200 with the job's state unchanged and the report's output
            # kept, before the cancel's note.
            if (job.get("stdout"), job["stderr"]) != (
                body["stdout"],
                f"{body['stderr']}\njob cancelled" if body["stderr"] else "job cancelled",
            ):
                self.ledger.problem(f"late report of {job_id} answered {job}")
            self.ledger.changed(job)
            return
        if (job["status"], job.get("exit_code"), job.get("stdout")) != (
            body["status"],
            exit_code,
            body["stdout"],
        ):
            self.ledger.problem(f"finish of {job_id} answered {job}")
        self.ledger.changed(job)


SCHEDULER_ENDS = ("job cancelled", "job timed out")


def late_output_version(one: dict[str, Any], other: dict[str, Any]) -> dict[str, Any] | None:
    """Of two versions of a finished job, the later one when they differ as the agent's late
    report makes them differ, else None. A job the scheduler ended while it ran (a cancel
    here) is final at once with the scheduler's note as its stderr; the agent's late report
    then adds the attempt's own output before that note, and changes nothing else (issue 31:
    no output is thrown away). Reads and replies may come to the ledger in either order."""
    fields = set(one) | set(other)
    changed = {name for name in fields if one.get(name) != other.get(name)}
    if not changed <= {"stdout", "stderr"} or one.get("reason") != "cancelled":
        return None

    def bare(job: dict[str, Any]) -> bool:  # as the scheduler ended it, before the report
        return "stdout" not in job and job.get("stderr") in SCHEDULER_ENDS

    if bare(one) and not bare(other):
        return other
    if bare(other) and not bare(one):
        return one
    return None


def awkward_text(rng: random.Random) -> str:
    return "".join(rng.choice(AWKWARD) + rng.choice("abc ") for _ in range(rng.randint(1, 6)))


def random_job(rng: random.Random, token: str) -> dict[str, Any]:
    body: dict[str, Any] = {"command": f"echo {token} {awkward_text(rng)}"}
    if rng.random() < 0.3:
        body["env_vars"] = {f"V{i}": awkward_text(rng) for i in range(rng.randint(1, 3))}
    if rng.random() < 0.2:
        body["job_type"] = "service"
        body["port"] = rng.randint(1, 65535)
    if rng.random() < 0.2:
        body["timeout_secs"] = rng.randint(60, 7200)
    if rng.random() < 0.1:
        body["deploy_url"] = f"http://objects/{token}.zip"
    return body


def check_created(job: dict[str, Any], body: dict[str, Any], ledger: Ledger) -> None:
    """A 201 reply carries exactly what was submitted."""
    for field in ("command", "env_vars", "port", "timeout_secs", "deploy_url"):
        if job.get(field) != body.get(field):
            ledger.problem(f"{job['job_id']}: {field} came back as {job.get(field)!r}")
    if job["status"] != "pending" or job["job_type"] != body.get("job_type", "run"):
        ledger.problem(f"{job['job_id']}: created as {job}")


# --- the checks after a restart --------------------------------------------------------------


def integrity_check(db_path: Path, scratch: Path) -> None:
    """`PRAGMA integrity_check` on the files exactly as the crash left them.

    A copy is checked, not the file itself: opening the original would replay and checkpoint
    the write-ahead log, and then the restart would not be tested on what the crash left.
    """
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir()
    for suffix in ("", "-wal"):
        source = Path(str(db_path) + suffix)
        if source.exists():
            shutil.copyfile(source, scratch / (db_path.name + suffix))
    conn = sqlite3.connect(scratch / db_path.name)
    try:
        result = conn.execute("PRAGMA integrity_check").fetchall()
    finally:
        conn.close()
    assert result == [("ok",)], result


def check_against_server(api: Api, ledger: Ledger) -> dict[str, dict[str, Any]]:
    """Hold the ledger against what the restarted scheduler serves; returns its jobs."""
    reply = api.get("/jobs", params={"limit": 10000})
    assert reply.status_code == 200, reply.text
    assert "Link" not in reply.headers, "test built more jobs than one page holds"
    served = {job["job_id"]: without_waiting_for(job) for job in reply.json()}
    for job_id, created in ledger.created.items():
        assert job_id in served, f"acknowledged {job_id} is gone"
        now = served[job_id]
        for field in CREATION_FIELDS:
            assert now.get(field) == created.get(field), (job_id, field, created, now)
    for job_id, known in ledger.latest.items():
        assert job_id in served, f"{job_id}, seen as {known['status']}, is gone"
        now = served[job_id]
        assert RANK[now["status"]] >= RANK[known["status"]], (known, now)
        if RANK[known["status"]] == 2:
            # The one change a finished job may still see: a late report's output, whose
            # answer the crash may have cut off.
            assert now == known or late_output_version(known, now) is now, (
                f"finished {job_id} changed: {known} -> {now}"
            )
        elif known["status"] == "running":
            assert now["running_at"] == known["running_at"], (known, now)
    tokens = collections.Counter(job["command"].split()[1] for job in served.values())
    assert set(tokens) <= ledger.sent_tokens, "a job nobody submitted"
    twice = [token for token, count in tokens.items() if count > 1]
    assert not twice, f"one submission made several jobs: {twice}"
    return served


def repeat_unanswered(api: Api, ledger: Ledger, served: dict[str, dict[str, Any]]) -> None:
    """Send again each keyed submission the crash cut off, as a careful client would: it gets
    the job the first attempt made (200), or a new one when none was made (201)."""
    by_token = {job["command"].split()[1]: job for job in served.values()}
    for lost in ledger.unanswered:
        reply = api.post("/jobs", lost.body, headers={"Idempotency-Key": lost.key})
        made = by_token.get(lost.token)
        if made is not None:
            assert reply.status_code == 200, (lost, reply.status_code, reply.text)
            assert reply.json() == made, (made, reply.json())
            ledger.saw(made)
        else:
            assert reply.status_code == 201, (lost, reply.status_code, reply.text)
            ledger.created_job(reply.json(), lost.token)
    ledger.unanswered.clear()


def crash_cycles(cycles: int, tmp_path: Path, registry: FakeRegistry, rng: random.Random) -> Ledger:
    db_path = tmp_path / "scheduler.db"
    ledger = Ledger()
    for life in range(cycles + 1):
        proc = start_scheduler(db_path, tmp_path / f"scheduler-{life}.log", registry.url, ENV)
        try:
            api = Api(proc.url)
            served = check_against_server(api, ledger)
            with ledger.lock:
                ledger.floor = max(ledger.max_seen, *(seq_of(j) for j in served), 0)
            repeat_unanswered(api, ledger, served)
            assert not ledger.problems, ledger.problems
            if life == cycles:
                check_against_server(api, ledger)
                api.close()
                break
            api.close()
            run_until_killed(proc, ledger, rng)
        finally:
            stop_scheduler(proc)
        integrity_check(db_path, tmp_path / "copy")
        assert not ledger.problems, ledger.problems
    return ledger


def run_until_killed(proc: SchedulerProcess, ledger: Ledger, rng: random.Random) -> None:
    """Load the scheduler, and SIGKILL it after a random number of acknowledged changes."""
    load = Load(proc.url, ledger, rng)
    target = ledger.acks + rng.randint(40, 160)
    load.start()
    try:
        wait_for(
            lambda: ledger.acks >= target or ledger.problems,
            timeout=60,
            message=lambda: f"{target} acknowledged changes (have {ledger.acks})",
        )
    finally:
        load.killed.set()
        proc.kill()  # mid-flight: requests are being served and committed right now
        load.join()


def check_run(ledger: Ledger, cycles: int) -> None:
    """The run exercised what it claims to: jobs in every state crossed crashes."""
    statuses = collections.Counter(job["status"] for job in ledger.latest.values())
    assert statuses["done"] and statuses["running"] and statuses["pending"], statuses
    assert sum(ledger.claims.values()) >= cycles, ledger.claims


def test_sigkill_under_load_loses_nothing_acknowledged(
    tmp_path: Path, registry: FakeRegistry
) -> None:
    seed = random.randrange(2**32)
    print(f"random seed {seed}")  # shown when the test fails; the kill moments stay random
    ledger = crash_cycles(4, tmp_path, registry, random.Random(seed))
    check_run(ledger, 4)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_soak_many_crashes_under_load(tmp_path: Path, registry: FakeRegistry) -> None:
    seed = random.randrange(2**32)
    print(f"random seed {seed}")
    ledger = crash_cycles(60, tmp_path, registry, random.Random(seed))
    check_run(ledger, 60)
