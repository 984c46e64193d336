"""Network partitions with real network namespaces (issue #24): a daemon runs inside a
namespace of the test's own, reaching PostgreSQL, the registry and the other daemon over veth
links whose root end the test takes down and up again.

- A leader cut from PostgreSQL while its clients still reach it stops acknowledging within
  its lease, a standby takes over, and once it sees the database again it is a standby that
  forwards to the new leader.
- A standby cut from the leader, but not from the database, answers 503 `no leader` (never a
  stale read of its own), and forwards again once the link is back.

After each run, what was acknowledged is counted against what is stored: nothing lost, no id
handed out twice, no job claimed twice. Only addresses on the test's own veth links are used
(see `netns.py`). Without root or `ip` these tests skip, saying why; TEST_REQUIRE_NETNS=1
makes that a failure.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import requests
from conftest import BASE_ENV, START_TIMEOUT, PostgresDatabases, unavailable
from helpers import compact, expect_error, expect_json, set_nodes, wait_for
from netns import Link, Namespace, NamespacedScheduler, why_unavailable
from test_ha import LIVENESS_SECS, SHORT_LEASE, Ha, all_jobs, leader_reply

from tiny_scheduler.agent.protocol import RUNNING_UPDATE, parse_poll_reply, report_update
from tiny_scheduler.dev.daemon import SchedulerProcess, free_port
from tiny_scheduler.dev.registry import FakeRegistry

NO_LEADER = "no leader\n"


@pytest.fixture
def namespace() -> Iterator[Namespace]:
    reason = why_unavailable()
    if reason is not None:
        unavailable(reason, "TEST_REQUIRE_NETNS")
    made = Namespace()
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def ha(
    namespace: Namespace,
    tmp_path: Path,
    registry: FakeRegistry,
    postgres_database: PostgresDatabases,
) -> Iterator[Ha]:
    # After `namespace`, so torn down before it: the daemons stop while their links exist.
    cluster = Ha(postgres_database.create(), tmp_path, registry.url)
    yield cluster
    cluster.stop()


def relayed(url: str, hostport: str) -> str:
    """`url` with its host and port replaced by `hostport`."""
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{user}@{hostport}" if user else hostport))


def peers_through(
    ha: Ha, registry: FakeRegistry, namespace: Namespace, database: Link, clients: Link
) -> tuple[str, str]:
    """The database's and the registry's URLs as a daemon inside `namespace` reaches them:
    PostgreSQL relayed over `database`, the registry over `clients` (each cut on its own)."""
    pg = urlsplit(ha.db_url)
    db_url = relayed(
        ha.db_url,
        namespace.relay(database, free_port(), (pg.hostname or "127.0.0.1", pg.port or 5432)),
    )
    registry_port = urlsplit(registry.url).port or 80
    registry_url = "http://" + namespace.relay(clients, free_port(), ("127.0.0.1", registry_port))
    return db_url, registry_url


def start_inside(
    ha: Ha, namespace: Namespace, address: str, db_url: str, registry_url: str
) -> NamespacedScheduler:
    env = {**BASE_ENV, "REGISTRY_URL": registry_url, "LEADER_LEASE_SECS": str(SHORT_LEASE)}
    log_path = str(ha.folder / f"scheduler-{namespace.name}.log")
    proc = NamespacedScheduler(namespace, address, db_url, env, log_path)
    ha.daemons.append(proc)
    proc.start(timeout=START_TIMEOUT)
    return proc


def start_outside(ha: Ha, address: str) -> SchedulerProcess:
    """A daemon in the root namespace listening on every address, advertised at `address`
    (its end of a link, the way daemons in the namespace reach it)."""
    port = free_port()
    proc = SchedulerProcess(
        ha.db_url,
        env={**BASE_ENV, "REGISTRY_URL": ha.registry_url, "LEADER_LEASE_SECS": str(SHORT_LEASE)},
        port=port,
        log_path=str(ha.folder / f"scheduler-{port}.log"),
        host="0.0.0.0",
    )
    proc.url = f"http://{address}:{port}"
    ha.daemons.append(proc)
    proc.start(timeout=START_TIMEOUT)
    return proc


class Load:
    """Submitters and agents, each bounded in time, calling the daemons at `urls` in turn: on
    a refused connection, a timeout or 503 `no leader` the next one (redirects are never
    followed: every answer counted is one a daemon gave itself or forwarded)."""

    def __init__(self, urls: Sequence[str], agent_urls: Sequence[str], nodes: Sequence[str]):
        self.lock = threading.Lock()
        self.acked: dict[str, str] = {}  # job id -> the command its 201 was for
        self.reused: list[str] = []
        self.claims: collections.Counter[str] = collections.Counter()
        self.finished: set[str] = set()
        self.stop = threading.Event()
        self.deadline = time.monotonic() + 8 * LIVENESS_SECS  # a bound even if never stopped
        self.threads = [
            threading.Thread(target=self._submitter, args=(list(urls), n)) for n in range(2)
        ]
        self.threads += [
            threading.Thread(target=self._agent, args=(list(agent_urls), node)) for node in nodes
        ]
        for thread in self.threads:
            thread.start()

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return len(self.acked), len(self.finished)

    def more(self, jobs: int, finished: int) -> None:
        """Wait until that many more jobs were acknowledged and finished than now."""
        acked, done = self.counts()
        wait_for(
            lambda: (now := self.counts())[0] >= acked + jobs and now[1] >= done + finished,
            timeout=LIVENESS_SECS * 2,
            message=lambda: f"more load to go through (at {self.counts()})",
        )

    def end(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(LIVENESS_SECS + 20)

    def check(self, stored: dict[str, dict[str, Any]]) -> None:
        assert self.reused == [], "an id was handed out twice"
        missing = [job_id for job_id in self.acked if job_id not in stored]
        assert missing == [], "acknowledged jobs lost"
        assert {job_id: stored[job_id]["command"] for job_id in self.acked} == self.acked
        assert [job_id for job_id, n in self.claims.items() if n > 1] == [], "claimed twice"
        assert all(stored[job_id]["status"] == "done" for job_id in self.finished)

    def _running(self) -> bool:
        return not self.stop.is_set() and time.monotonic() < self.deadline

    def _call(
        self, session: requests.Session, urls: list[str], method: str, path: str, **kwargs: Any
    ) -> requests.Response | None:
        for turn in itertools.count():
            if not self._running():
                return None
            url = urls[turn % len(urls)]
            try:
                reply = session.request(
                    method, url + path, timeout=15, allow_redirects=False, **kwargs
                )
            except requests.RequestException:
                reply = None
            if reply is not None and not (reply.status_code == 503 and reply.text == NO_LEADER):
                return reply
            time.sleep(0.05)  # polling for a leader (Retry-After, shortened)
        return None

    def _submitter(self, urls: list[str], number: int) -> None:
        session = requests.Session()
        for count in itertools.count():
            if not self._running():
                break
            command = f"echo {number}-{count}"
            reply = self._call(session, urls, "POST", "/jobs", data=compact({"command": command}))
            if reply is not None and reply.status_code == 201:
                job_id = reply.json()["job_id"]
                with self.lock:
                    if job_id in self.acked:
                        self.reused.append(job_id)
                    self.acked[job_id] = command
        session.close()

    def _agent(self, urls: list[str], node_id: str) -> None:
        session = requests.Session()
        poll = {"node_id": node_id, "status": "pending"}
        while self._running():
            reply = self._call(session, urls, "GET", "/jobs", params=poll)
            if reply is None or reply.status_code != 200:
                continue
            for job in parse_poll_reply(reply.content)[:1]:
                path = f"/jobs/{job.job_id}"
                claim = self._call(session, urls, "PATCH", path, data=compact(RUNNING_UPDATE))
                if claim is None or claim.status_code != 200:
                    continue
                with self.lock:
                    self.claims[job.job_id] += 1
                # Like the real agent (which spools its reports), report until the scheduler
                # takes it: polling again with the job unreported would tell the scheduler
                # the agent lost it, and the job would rightly run again elsewhere.
                report = compact(report_update(0, "ok"))
                done = self._call(session, urls, "PATCH", path, data=report)
                while done is not None and done.status_code >= 500:
                    time.sleep(0.05)  # the store is away (a cut): again, within the deadline
                    done = self._call(session, urls, "PATCH", path, data=report)
                if done is not None and done.status_code == 200:
                    with self.lock:
                        self.finished.add(job.job_id)
        session.close()


def test_a_leader_cut_from_the_database_stops_acknowledging_and_comes_back_a_standby(
    ha: Ha, namespace: Namespace, registry: FakeRegistry
) -> None:
    nodes = ["part-node-1", "part-node-2"]
    set_nodes(registry, nodes)
    database = namespace.link()  # the leader's way to PostgreSQL: cut below
    clients = namespace.link()  # the way clients, the other daemon and the registry go
    db_url, registry_url = peers_through(ha, registry, namespace, database, clients)
    first = start_inside(ha, namespace, clients.ns_addr, db_url, registry_url)
    assert ha.wait_leader() is first
    second = start_outside(ha, clients.root_addr)  # the daemons reach each other on `clients`
    wait_for(lambda: leader_reply(second)[1]["leader"] == first.url)

    load = Load([first.url, second.url], [second.url, first.url], nodes)
    acks_from_first: list[float] = []  # when each 201 came, for requests sent to it alone

    def only_first() -> None:
        session = requests.Session()
        for count in itertools.count():
            if load.stop.is_set() or time.monotonic() > load.deadline:
                break
            try:
                reply = session.post(
                    first.url + "/jobs",
                    data=compact({"command": f"echo direct-{count}"}),
                    timeout=15,
                    allow_redirects=False,
                )
            except requests.RequestException:
                continue
            if reply.status_code == 201:
                with load.lock:
                    load.acked[reply.json()["job_id"]] = f"echo direct-{count}"
                acks_from_first.append(time.monotonic())
            else:
                time.sleep(0.05)  # refused while cut: ask again, bounded by the deadline
        session.close()

    direct = threading.Thread(target=only_first)
    direct.start()
    try:
        load.more(20, 3)
        namespace.cut(database)
        cut_at = time.monotonic()
        assert ha.wait_leader([second]) is second
        print(f"\nnew leader serving {time.monotonic() - cut_at:.2f}s after the cut")
        # Still reached by its clients, the cut-off leader stopped on its own: no 201 from it
        # later than its lease (the spec's bound) and a generous margin for a shared machine.
        status, body = leader_reply(first)
        assert (status, body["leader"]) == (503, None)
        assert requests.get(first.url + "/health", timeout=5).json()["role"] == "standby"
        last = max(acks_from_first)
        print(f"its last 201 came {last - cut_at:.2f}s after the cut")
        assert last - cut_at < SHORT_LEASE + 3
        load.more(10, 2)  # the load goes on, through the new leader

        namespace.heal(database)
        healed_at = time.monotonic()
        wait_for(
            lambda: leader_reply(first) == (503, leader_reply(second)[1]),
            timeout=LIVENESS_SECS,
            message="the old leader to see the new one",
        )
        print(f"a standby again {time.monotonic() - healed_at:.2f}s after the heal")
        forwarded = requests.post(
            first.url + "/jobs", data=compact({"command": "echo healed"}), timeout=15
        )
        healed = expect_json(forwarded, 201)
        load.acked[healed["job_id"]] = "echo healed"
        load.more(10, 2)
    finally:
        load.end()
        direct.join(LIVENESS_SECS + 20)
    load.check(all_jobs(second.url))


def test_a_standby_cut_from_the_leader_answers_503_not_a_stale_read(
    ha: Ha, namespace: Namespace, registry: FakeRegistry
) -> None:
    nodes = ["part-node-3"]
    set_nodes(registry, nodes)
    database = namespace.link()
    peer = namespace.link()  # the standby's way to the leader: cut below
    clients = namespace.link()
    db_url, registry_url = peers_through(ha, registry, namespace, database, clients)
    # The leader, in the root namespace, is advertised at its address on the peer link (the
    # only way the standby has to it); the test calls it on loopback (the peer link's address
    # is gone from the root namespace too while the link is down).
    leader = start_outside(ha, peer.root_addr)
    port = urlsplit(leader.url).port
    local = f"http://127.0.0.1:{port}"
    assert ha.wait_leader() is leader
    standby = start_inside(ha, namespace, clients.ns_addr, db_url, registry_url)
    wait_for(lambda: leader_reply(standby)[1]["leader"] == leader.url)

    load = Load([standby.url, local], [local], nodes)
    try:
        load.more(10, 2)
        job = expect_json(
            requests.post(standby.url + "/jobs", data=compact({"command": "echo x"}), timeout=15),
            201,
        )
        load.acked[job["job_id"]] = "echo x"
        namespace.cut(peer)
        for method, path in (("GET", f"/jobs/{job['job_id']}"), ("POST", "/jobs")):
            started = time.monotonic()
            reply = requests.request(
                method, standby.url + path, data=compact({"command": "echo cut"}), timeout=60
            )
            expect_error(reply, 503, "no leader")
            assert reply.headers["Retry-After"] == "1"
            took = time.monotonic() - started
            print(f"\n{method} {path} through the cut-off standby: 503 in {took:.2f}s")
        # It still sees the database: it knows who leads, and that it does not.
        status, body = leader_reply(standby)
        assert (status, body["leader"]) == (503, leader.url)
        assert requests.get(local + "/leader", timeout=5).status_code == 200
        load.more(10, 2)  # clients of the leader go on meanwhile

        namespace.heal(peer)
        again = wait_for(
            lambda: (
                (r := requests.get(standby.url + f"/jobs/{job['job_id']}", timeout=15))
                and r.status_code == 200
                and r
            ),
            timeout=LIVENESS_SECS,
            message="the standby to forward again",
        )
        assert again.json()["job_id"] == job["job_id"]
        load.more(5, 1)
    finally:
        load.end()
    stored = all_jobs(local)
    assert not [j for j in stored.values() if j["command"] == "echo cut"]
    load.check(stored)
