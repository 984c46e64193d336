"""High availability on PostgreSQL, with real daemons under gunicorn, real signals and a real
(silent) network cut: exactly one leader, standbys that send clients to it, and takeovers that
lose nothing acknowledged while a deposed leader commits nothing.

Failover times are printed (`pytest -s -n 0` shows them; `make bench` has the figures), never
asserted: each deadline here is a liveness bound, generous for a shared machine. Where a test
must tell *how* a takeover happened (the leader's session seen gone, not its lease run out),
the lease is made far longer than the deadline. Skipped, visibly, without a PostgreSQL server.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from click.testing import CliRunner
from conftest import start_scheduler, stop_scheduler
from helpers import Api, compact, expect_error, expect_json, set_nodes, wait_for
from pg_proxy import SilentProxy

from tiny_scheduler import errors
from tiny_scheduler.agent.protocol import RUNNING_UPDATE, parse_poll_reply, report_update
from tiny_scheduler.cli import main
from tiny_scheduler.client import Client, wait_for_job
from tiny_scheduler.dev.cluster import ClusterConfig, DevCluster
from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.dev.sns import FakeSns
from tiny_scheduler.dev.sqs import FakeSqs
from tiny_scheduler.storage.postgres import PostgresStore

LIVENESS_SECS = 20.0
"""How long a takeover may take before a test gives up on it (the spec's bounds are 3 s after a
crash and the lease + 2 s after a hang; this only catches one that never comes)."""

SHORT_LEASE = 3.0
"""LEADER_LEASE_SECS where a test waits for a lease to run out."""

LONG_LEASE = 120.0
"""LEADER_LEASE_SECS where a takeover in time can only come from seeing the session gone."""


class Ha:
    """Scheduler daemons on one fresh database; all of them stopped at the end."""

    def __init__(self, db_url: str, folder: Path, registry_url: str) -> None:
        self.db_url = db_url
        self.folder = folder
        self.registry_url = registry_url
        self.daemons: list[SchedulerProcess] = []
        self._numbers = itertools.count(1)

    def start(
        self,
        lease: float = SHORT_LEASE,
        db_url: str | None = None,
        env: dict[str, str] | None = None,
    ) -> SchedulerProcess:
        log_path = self.folder / f"scheduler-{next(self._numbers)}.log"
        env = {"LEADER_LEASE_SECS": str(lease), **(env or {})}
        proc = start_scheduler(db_url or self.db_url, log_path, self.registry_url, env)  # type: ignore[arg-type]
        self.daemons.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.daemons:
            if proc.proc is not None and proc.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.proc.pid, signal.SIGCONT)  # a paused one cannot stop
            stop_scheduler(proc)

    def leaders(self, among: Sequence[SchedulerProcess] | None = None) -> list[SchedulerProcess]:
        """The daemons that answer /leader with 200 now."""
        found = []
        for proc in among or self.daemons:
            with contextlib.suppress(requests.RequestException):
                if requests.get(proc.url + "/leader", timeout=1).status_code == 200:
                    found.append(proc)
        return found

    def wait_leader(
        self, among: Sequence[SchedulerProcess] | None = None, timeout: float = LIVENESS_SECS
    ) -> SchedulerProcess:
        """Wait until exactly one of `among` (all by default) leads; return it."""
        found = wait_for(
            lambda: (leaders := self.leaders(among)) and len(leaders) == 1 and leaders,
            timeout=timeout,
            message="exactly one leader",
        )
        return found[0]


class FollowingClient:
    """A client of the whole cluster, as an agent behind a VIP or the CLI with several URLs
    is: it follows 307s, and on a refused connection or 503 `no leader` tries the next daemon
    until a deadline. Any other answer is returned as it is."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = list(urls)
        self._next = 0
        self.session = requests.Session()
        self.session.trust_env = False

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response | None:
        deadline = time.monotonic() + LIVENESS_SECS
        while time.monotonic() < deadline:
            url = self.urls[self._next % len(self.urls)]
            try:
                reply = self.session.request(method, url + path, timeout=5, **kwargs)
            except requests.RequestException:
                reply = None
            if reply is not None and not (reply.status_code == 503 and reply.text == "no leader\n"):
                return reply
            self._next += 1
            time.sleep(0.02)  # polling for a leader, not waiting for one thing to happen
        return None

    def close(self) -> None:
        self.session.close()


def all_jobs(url: str) -> dict[str, dict[str, Any]]:
    api = Api(url)
    try:
        return {job["job_id"]: job for job in api.jobs(limit=10000)}
    finally:
        api.close()


def leader_reply(proc: SchedulerProcess) -> tuple[int, dict[str, Any]]:
    reply = requests.get(proc.url + "/leader", timeout=5)
    return reply.status_code, reply.json()


# --- one leader, standbys that redirect -------------------------------------------------------


@pytest.mark.parametrize("count", [2, 3])
def test_exactly_one_leader_and_the_standbys_send_clients_to_it(ha: Ha, count: int) -> None:
    daemons = [ha.start() for _ in range(count)]
    leader = ha.wait_leader()
    standbys = [proc for proc in daemons if proc is not leader]
    status, body = leader_reply(leader)
    assert (status, body["leader"]) == (200, leader.url)
    for proc in standbys:
        # A standby learns the leader within a poll of the lease row.
        wait_for(lambda proc=proc: leader_reply(proc) == (503, body), message="the standby's view")
        health = expect_json(requests.get(proc.url + "/health", timeout=5), 200)
        assert (health["status"], health["role"]) == ("healthy", "standby")
        assert requests.get(proc.url + "/health/scheduler", timeout=5).json() == health
        assert requests.get(proc.url + "/metrics", timeout=5).status_code == 200
    assert expect_json(requests.get(leader.url + "/health", timeout=5), 200)["role"] == "leader"

    standby = Api(standbys[0].url)
    request = {"command": "echo via standby"}
    # Asked not to forward, a standby redirects (the default is forwarding: test_forwarding).
    moved = standby.post(
        "/jobs?from=standby", request, allow_redirects=False, headers={"X-No-Forward": "1"}
    )
    assert moved.status_code == 307
    assert moved.headers["Location"] == leader.url + "/jobs?from=standby"
    # Forwarded, the method and the body go along, and the leader does the work.
    created = expect_json(standby.post("/jobs", request), 201)
    shown = expect_json(standby.get(f"/jobs/{created['job_id']}"), 200)
    shown.pop("waiting_for", None)  # a read of a pending job says what it waits for
    assert shown == created
    claimed = standby.patch(f"/jobs/{created['job_id']}", compact(RUNNING_UPDATE))
    assert expect_json(claimed, 200)["status"] == "running"
    assert all_jobs(leader.url)[created["job_id"]]["status"] == "running"
    standby.close()


def test_a_standby_with_no_known_leader_answers_503_and_takes_over_when_its_session_goes(
    ha: Ha,
) -> None:
    # The test itself holds the lease, as a leader would, for an hour: the daemon stays a
    # standby whatever the timing, and sees exactly what the lease row says.
    PostgresStore(ha.db_url).close()  # the schema, as a first daemon would make it
    holder = psycopg.connect(ha.db_url, autocommit=True)
    try:
        holder.execute(
            "UPDATE leadership SET epoch = 7, leader_url = NULL, session_pid = pg_backend_pid(),"
            " expires_at = now() + interval '1 hour'"
        )
        # Redirecting, not forwarding: the leader named below is a made-up host, never called.
        standby = ha.start(lease=LONG_LEASE, env={"HA_FORWARD": "0"})
        wait_for(lambda: leader_reply(standby) == (503, {"leader": None, "epoch": 7}))
        reply = requests.post(standby.url + "/jobs", data=b'{"command":"x"}', timeout=5)
        expect_error(reply, 503, "no leader")
        assert reply.headers["Retry-After"] == "1"
        assert requests.get(standby.url + "/health", timeout=5).json()["role"] == "standby"

        holder.execute("UPDATE leadership SET leader_url = 'http://elsewhere.example:9001'")
        wait_for(lambda: leader_reply(standby)[1]["leader"] == "http://elsewhere.example:9001")
        reply = requests.get(standby.url + "/jobs/job-1?x=%2F", allow_redirects=False, timeout=5)
        assert reply.status_code == 307
        assert reply.headers["Location"] == "http://elsewhere.example:9001/jobs/job-1?x=%2F"
    finally:
        holder.close()  # the "leader" dies: its session is gone, its lease far from over
    assert ha.wait_leader() is standby
    assert leader_reply(standby) == (200, {"leader": standby.url, "epoch": 8})


def test_the_cli_takes_several_urls_and_follows_the_leader_with_the_key(
    ha: Ha, unused_port: int
) -> None:
    key = "ha-sekrit"
    first = ha.start(env={"TINYAWS_API_KEY": key})
    second = ha.start(env={"TINYAWS_API_KEY": key})
    assert ha.wait_leader() is first
    wait_for(lambda: leader_reply(second)[1]["leader"] == first.url)
    nobody = f"http://127.0.0.1:{unused_port}"  # a daemon that is down
    urls = ",".join([nobody, second.url, first.url])
    env = {"SCHEDULER_URL": urls, "TINYAWS_API_KEY": key}
    submitted = CliRunner().invoke(main, ["submit", "-q", "echo hi"], env=env)
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.output.strip()
    shown = CliRunner().invoke(main, ["status", "--json", job_id], env=env)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["command"] == "echo hi"


def test_the_dev_cluster_with_a_standby_keeps_jobs_flowing_when_the_leader_dies(
    postgres_url: str,
) -> None:
    config = ClusterConfig.quick(agents=2, standbys=1, postgres_url=postgres_url)
    with DevCluster(config) as cluster:
        client = Client(cluster.scheduler_urls)
        first = client.submit({"command": "echo one"})
        assert wait_for_job(client, first["job_id"], interval=0.1)["status"] == "done"
        assert cluster.scheduler is not None
        cluster.scheduler.kill()
        # The agents and the client find the standby by themselves.
        second = client.submit({"command": "echo two"})
        assert wait_for_job(client, second["job_id"], interval=0.1)["status"] == "done"
        assert client.base_url == cluster.standbys[0].url
        database = cluster.database
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
        assert left.fetchone() is None, "the dev cluster left its database behind"


# --- a crash ----------------------------------------------------------------------------------


def test_sigkill_of_the_leader_under_load_loses_nothing_acknowledged(
    ha: Ha, registry: FakeRegistry
) -> None:
    nodes = ["ha-node-1", "ha-node-2", "ha-node-3"]
    set_nodes(registry, nodes)
    first, second = ha.start(lease=LONG_LEASE), ha.start(lease=LONG_LEASE)
    assert ha.wait_leader() is first
    urls = [first.url, second.url]
    lock = threading.Lock()
    acked: dict[str, str] = {}  # job id -> the command its 201 was for
    reused: list[tuple[str, str, str]] = []
    claims: collections.Counter[str] = collections.Counter()  # 200s to a claim, per job
    finished: set[str] = set()
    stop = threading.Event()

    def submitter(number: int) -> None:
        client = FollowingClient(urls)
        for count in itertools.count():
            if stop.is_set():
                break
            command = f"echo {number}-{count}"
            reply = client.request("POST", "/jobs", data=compact({"command": command}))
            if reply is not None and reply.status_code == 201:
                job_id = reply.json()["job_id"]
                with lock:
                    if job_id in acked:
                        reused.append((job_id, acked[job_id], command))
                    acked[job_id] = command
        client.close()

    def agent(node_id: str) -> None:
        client = FollowingClient(list(reversed(urls)))  # agents start at the standby
        while not stop.is_set():
            poll = client.request("GET", "/jobs", params={"node_id": node_id, "status": "pending"})
            if poll is None or poll.status_code != 200:
                continue
            for job in parse_poll_reply(poll.content)[:1]:
                claim = client.request("PATCH", f"/jobs/{job.job_id}", data=compact(RUNNING_UPDATE))
                if claim is None or claim.status_code != 200:
                    continue
                with lock:
                    claims[job.job_id] += 1
                report = client.request(
                    "PATCH", f"/jobs/{job.job_id}", data=compact(report_update(0, "ok"))
                )
                if report is not None and report.status_code == 200:
                    with lock:
                        finished.add(job.job_id)
        client.close()

    threads = [threading.Thread(target=submitter, args=(n,)) for n in range(3)]
    threads += [threading.Thread(target=agent, args=(node,)) for node in nodes]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(acked) >= 30 and len(finished) >= 5, timeout=LIVENESS_SECS)
        killed_at = time.monotonic()
        first.kill()
        assert ha.wait_leader([second]) is second
        print(f"\nnew leader serving {time.monotonic() - killed_at:.2f}s after the SIGKILL")
        with lock:
            before = (len(acked), len(finished))
        # Load goes on through the new leader.
        wait_for(
            lambda: len(acked) >= before[0] + 30 and len(finished) >= before[1] + 5,
            timeout=LIVENESS_SECS,
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(LIVENESS_SECS + 10)

    stored = all_jobs(second.url)
    assert reused == [], "an id was handed out twice"
    missing = [job_id for job_id in acked if job_id not in stored]
    assert missing == [], "acknowledged jobs lost in the takeover"
    assert {job_id: stored[job_id]["command"] for job_id in acked} == acked
    assert [job_id for job_id, count in claims.items() if count > 1] == [], "claimed twice"
    assert all(stored[job_id]["status"] in ("running", "done") for job_id in claims)
    assert all(stored[job_id]["status"] == "done" for job_id in finished)


def test_sqs_exactly_once_and_sns_at_least_once_across_a_failover(
    ha: Ha, registry: FakeRegistry
) -> None:
    sqs, sns = FakeSqs(visibility_secs=1.0).start(), FakeSns().start()
    stop = threading.Event()
    node = "ha-queue-node"
    set_nodes(registry, [node])

    def agent() -> None:
        # Finishes every job it is given, following the leader like the one behind a VIP.
        client = FollowingClient(urls)
        while not stop.is_set():
            poll = client.request("GET", "/jobs", params={"node_id": node, "status": "pending"})
            if poll is None or poll.status_code != 200:
                continue
            for job in parse_poll_reply(poll.content)[:1]:
                claim = client.request("PATCH", f"/jobs/{job.job_id}", data=compact(RUNNING_UPDATE))
                if claim is not None and claim.status_code == 200:
                    client.request(
                        "PATCH", f"/jobs/{job.job_id}", data=compact(report_update(0, "ok"))
                    )
        client.close()

    def done_jobs() -> dict[str, dict[str, Any]]:
        for daemon in ha.leaders():
            return {i: j for i, j in all_jobs(daemon.url).items() if j["status"] == "done"}
        return {}

    env = {"SQS_URL": sqs.url, "SNS_URL": sns.url, "SQS_POLL_INTERVAL_SECS": "0.1"}
    first, second = ha.start(LONG_LEASE, env=env), ha.start(LONG_LEASE, env=env)
    urls = [first.url, second.url]
    worker = threading.Thread(target=agent)
    try:
        assert ha.wait_leader() is first
        worker.start()
        for number in range(20):
            sqs.send("jobs", json.dumps({"command": f"echo {number}"}))
        wait_for(lambda: len(done_jobs()) >= 5, timeout=LIVENESS_SECS)
        first.kill()  # with messages still queued, and events maybe still in the outbox
        assert ha.wait_leader([second]) is second
        for number in range(20, 40):
            sqs.send("jobs", json.dumps({"command": f"echo {number}"}))
        wait_for(lambda: len(done_jobs()) == 40, timeout=LIVENESS_SECS, message="40 jobs done")
        wait_for(lambda: not sqs.messages("jobs"), message="every message deleted")
        stored = all_jobs(second.url)
        # Exactly once: one job per message, whatever was redelivered across the takeover.
        assert sorted(job["command"] for job in stored.values()) == sorted(
            f"echo {number}" for number in range(40)
        )

        # At least once: every final state was published, by one leader or the other.
        def published() -> set[str]:
            events = [json.loads(message) for message in sns.published("job-status")]
            return {event["job_id"] for event in events if event["status"] == "done"}

        wait_for(lambda: published() >= set(stored), message="an SNS event for every job")
    finally:
        stop.set()
        if worker.is_alive():
            worker.join(LIVENESS_SECS + 10)
        ha.stop()
        sqs.stop()
        sns.stop()


# --- a pause ----------------------------------------------------------------------------------


def test_a_paused_leader_commits_nothing_after_a_takeover_and_becomes_a_standby(ha: Ha) -> None:
    first, second = ha.start(), ha.start()
    assert ha.wait_leader() is first
    api = Api(first.url)
    before = [api.submit(command=f"echo before {n}")["job_id"] for n in range(3)]
    outcomes: list[int] = []

    def submit(number: int) -> None:
        client = Api(first.url)
        # Not forwarded: a request the deposed leader had not begun must show as a 307 here,
        # not be acknowledged by the new leader (which may well store it).
        reply = client.post(
            "/jobs",
            {"command": f"echo pending {number}"},
            allow_redirects=False,
            timeout=60,
            headers={"X-No-Forward": "1"},
        )
        outcomes.append(reply.status_code)
        client.close()

    def waiting_on_jobs() -> int:
        query = "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'jobs'::regclass"
        return sql.execute(query).fetchone()[0]

    assert first.proc is not None
    with psycopg.connect(ha.db_url, autocommit=True) as sql:
        # Hold the leader's writes in the database across the takeover: a lock on the jobs
        # table keeps their INSERT waiting while the leader is paused and the lease changes
        # hands. Let go, they run on to their epoch check, which must fail.
        locker = psycopg.connect(ha.db_url)
        try:
            locker.execute("LOCK TABLE jobs IN SHARE MODE")
            threads = [threading.Thread(target=submit, args=(n,)) for n in range(4)]
            for thread in threads:
                thread.start()
            wait_for(waiting_on_jobs, message="the leader's writes to wait on the lock")
            os.killpg(first.proc.pid, signal.SIGSTOP)
            paused_at = time.monotonic()
            assert ha.wait_leader([second]) is second
            print(f"\nnew leader serving {time.monotonic() - paused_at:.2f}s after the SIGSTOP")
        finally:
            locker.close()
        try:
            wait_for(lambda: not waiting_on_jobs(), message="the held writes to go on")
        finally:
            os.killpg(first.proc.pid, signal.SIGCONT)
        for thread in threads:
            thread.join(60)
        pending = sql.execute("SELECT count(*) FROM jobs WHERE command LIKE 'echo pending%'")
        assert pending.fetchone()[0] == 0, "a write of the deposed leader committed"
    # The write in flight fails; one that had not reached the store yet may instead be sent
    # on to the new leader (307, not followed here). None is acknowledged.
    assert len(outcomes) == 4
    assert 503 in outcomes and set(outcomes) <= {503, 307}, outcomes
    assert set(before) <= set(all_jobs(second.url))
    # The old leader knows it is one no more: it forwards to the new one.
    wait_for(lambda: leader_reply(first) == (503, leader_reply(second)[1]))
    assert requests.get(first.url + "/health", timeout=5).json()["role"] == "standby"
    after = expect_json(api.post("/jobs", {"command": "echo after"}, allow_redirects=False), 201)
    assert all_jobs(second.url)[after["job_id"]]["command"] == "echo after"
    api.close()


def test_a_writer_stuck_in_its_commit_cannot_hold_off_a_takeover(ha: Ha) -> None:
    # The old leader's writer has checked its epoch (holding the lease row) and then gone
    # silent before its COMMIT: a paused process, or a cut network the server cannot see.
    # Nothing on the server ends such a session by itself; the takeover must.
    PostgresStore(ha.db_url).close()
    with (
        psycopg.connect(ha.db_url, autocommit=True) as holder,
        psycopg.connect(ha.db_url, application_name="tiny-scheduler writer") as stuck,
    ):
        holder.execute(
            "UPDATE leadership SET epoch = 7, leader_url = 'http://old.example:9001',"
            " session_pid = pg_backend_pid(), expires_at = now() + interval '2 seconds'"
        )
        stuck.execute("SELECT check_epoch(7)")  # inside a transaction that never ends
        standby = ha.start(lease=SHORT_LEASE)
        assert ha.wait_leader() is standby
        assert leader_reply(standby) == (200, {"leader": standby.url, "epoch": 8})
        with pytest.raises(psycopg.OperationalError):
            stuck.execute("SELECT 1")  # its session was ended: it can never commit


# --- a cut network ----------------------------------------------------------------------------


def test_a_leader_cut_off_from_the_database_stops_and_a_standby_takes_over(ha: Ha) -> None:
    proxy = SilentProxy(ha.db_url)
    try:
        first = ha.start(db_url=proxy.url)
        second = ha.start()
        assert ha.wait_leader() is first
        api = Api(first.url)
        before = [api.submit(command=f"echo before {n}")["job_id"] for n in range(3)]
        outcomes: list[int] = []

        def submit() -> None:
            client = Api(first.url)
            reply = client.post(
                "/jobs", {"command": "echo cut"}, allow_redirects=False, timeout=LIVENESS_SECS
            )
            outcomes.append(reply.status_code)
            client.close()

        proxy.cut()
        cut_at = time.monotonic()
        threads = [threading.Thread(target=submit) for _ in range(3)]
        for thread in threads:
            thread.start()
        assert ha.wait_leader([second]) is second
        print(f"\nnew leader serving {time.monotonic() - cut_at:.2f}s after the cut")
        # The cut-off leader stopped serving on its own, though it cannot hear of the takeover.
        assert leader_reply(first)[0] == 503
        for thread in threads:
            thread.join(LIVENESS_SECS)
        assert len(outcomes) == 3
        assert not [status for status in outcomes if 200 <= status < 300]
        stored = all_jobs(second.url)
        assert set(before) <= set(stored)
        assert not [job for job in stored.values() if job["command"] == "echo cut"]

        proxy.heal()  # back on the network, it finds the new leader and forwards to it
        wait_for(lambda: leader_reply(first) == (503, leader_reply(second)[1]))
        after = api.post("/jobs", {"command": "echo after"}, allow_redirects=False)
        assert all_jobs(second.url)[expect_json(after, 201)["job_id"]]["command"] == "echo after"
        api.close()
    finally:
        ha.stop()
        proxy.close()


# --- commits whose answer was lost ---------------------------------------------------------------

TERMINATIONS = 10
"""Times the leader's writer connections are terminated under load."""


def test_a_commit_whose_connection_dies_is_answered_with_the_truth(
    ha: Ha, registry: FakeRegistry
) -> None:
    """The leader's writer connections are terminated again and again while clients submit.
    A write caught in the middle may have committed before its connection died; it used to be
    answered "nothing was changed; try again", and a client that did so made a duplicate. Now
    every 201 is one stored job, every "nothing was changed" none, and a write whose outcome
    could not be found out says so (it may be stored once, or not)."""
    set_nodes(registry, ["ha-node-1"])
    leader = ha.start()
    assert ha.wait_leader() is leader
    lock = threading.Lock()
    answers: dict[str, tuple[int, str]] = {}  # command -> (status, body) of its one POST
    stop = threading.Event()

    def submitter(number: int) -> None:
        session = requests.Session()
        session.trust_env = False
        for count in itertools.count():
            if stop.is_set():
                break
            command = f"echo {number}-{count}"
            try:
                reply = session.post(
                    leader.url + "/jobs", data=compact({"command": command}), timeout=30
                )
            except requests.RequestException as exc:
                answer = (0, repr(exc))
            else:
                answer = (reply.status_code, reply.text)
            with lock:
                answers[command] = answer
        session.close()

    def acknowledged() -> int:
        with lock:
            return sum(status == 201 for status, _ in answers.values())

    def more_acknowledged(count: int = 10) -> None:
        goal = acknowledged() + count
        wait_for(lambda: acknowledged() >= goal, timeout=LIVENESS_SECS, message="progress")

    threads = [threading.Thread(target=submitter, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    terminated = 0
    try:
        with psycopg.connect(ha.db_url, autocommit=True) as admin:
            for _ in range(TERMINATIONS):
                more_acknowledged()  # under load, through a new connection each round
                found = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = 'tiny-scheduler writer' "
                    "AND datname = current_database()"
                ).fetchone()
                terminated += found[0] if found else 0
            more_acknowledged()
    finally:
        stop.set()
        for thread in threads:
            thread.join(LIVENESS_SECS + 10)
    assert terminated >= TERMINATIONS, "a writer connection to terminate each time"

    with psycopg.connect(ha.db_url) as conn:
        stored = collections.Counter(
            dict(conn.execute("SELECT command, count(*) FROM jobs GROUP BY command").fetchall())
        )
    kinds: collections.Counter[str] = collections.Counter()
    wrong = []
    for command, (status, body) in answers.items():
        if status == 201:
            kind, right = "acknowledged", stored[command] == 1
        elif (status, body) == (503, errors.STORE_UNAVAILABLE + "\n"):
            kind, right = "nothing was changed", stored[command] == 0
        elif (status, body) == (503, errors.STORE_OUTCOME_UNKNOWN + "\n"):
            kind, right = "outcome unknown", stored[command] <= 1
        else:
            kind, right = f"{status} {body!r}", False
        kinds[kind] += 1
        if not right:
            wrong.append((command, kind, stored[command]))
    print(f"\nanswers: {dict(kinds)}")
    assert wrong == [], "answers that do not match what was stored"
    assert kinds["acknowledged"] > TERMINATIONS
