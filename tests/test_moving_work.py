"""Moving waiting work (JOB_STEALING): an idle node's poll is topped up with the oldest
waiting `run` jobs of nodes that cannot start them, never pinned jobs, services, delayed jobs
or jobs just offered to their own node; only for a node the node list shows healthy;
committed before the answer. These rules are decisions, checked on the in-memory harness
(`harness.py`) at instants the test sets.

Under real gunicorn stay what crosses processes: that only the agent's poll request moves
work, and how a move shows on the wire, the job page, the metrics and the log; and the races
of real concurrent requests: a job moved while its old node's agent claims it, and two
agents' polls at once, are run once and never lost. Each of those has a scheduler of its own:
waiting jobs one test leaves behind on nodes that then leave the registry are exactly what
another test's idle node would take.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SchedulerFactory
from harness import Harness
from helpers import Agent, Api, expect_json, set_nodes, unique_node, wait_for

from tiny_scheduler.agent.protocol import parse_poll_reply
from tiny_scheduler.config import OFFER_HOLD_SECS
from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.nodes import StaticNodes
from tiny_scheduler.service import Event, Move

STEALING = {"JOB_STEALING": "1", "MAX_JOBS_PER_NODE": "1"}

RACE_ROUNDS = 30
"""Rounds of each race."""

RACE_DELAY_SECS = 0.015
"""Largest random delay of the quicker racer: about the time an idle node's poll takes to
read, move and commit a job, so that the other request lands before, inside and after it
over the rounds (without it the quicker one wins almost every time)."""

US = 0.000_001  # one microsecond, in seconds


# --- the rules, on the harness -----------------------------------------------------------


def stealing(*nodes: str | StaticNodes, **settings: Any) -> Harness:
    """A harness with JOB_STEALING on, one slot per node, these nodes healthy (or this node
    source)."""
    source = nodes[0] if len(nodes) == 1 and isinstance(nodes[0], StaticNodes) else nodes
    return Harness(source, **{"job_stealing": True, "max_jobs_per_node": 1, **settings})


def busy(h: Harness, node: str) -> str:
    """Fill the node's one slot with a running job; its id."""
    job = h.submit_on(node, "long")
    h.claim(job.job_id)
    return job.job_id


def test_an_idle_node_takes_the_oldest_waiting_job_of_a_full_node() -> None:
    h = stealing("full", "idle")
    busy(h, "full")
    waiting = [h.submit_on("full", f"wait {n}").job_id for n in range(3)]
    assert h.poll("full") == [], "the full node has no free slot"
    committed = len(h.commits)

    assert h.poll("idle") == waiting[:1], "the oldest, and only one per free slot"
    assert len(h.commits) == committed + 1, "the move is committed before the answer"
    moved = h.stored(waiting[0])
    assert (moved.node_id, moved.moved_from) == ("idle", "full")
    assert (Event.MOVED, waiting[0], Move.STOLEN) in h.events
    assert h.poll("idle") == waiting[:1], "it is the idle node's own job now"
    assert h.claim(waiting[0]).status == jobs.RUNNING
    assert [h.job(j).node_id for j in waiting[1:]] == ["full", "full"], "the others wait"


def test_a_retry_is_not_moved_back_to_the_node_it_failed_on() -> None:
    """The retry's placement chose another node on purpose (`moves.still_movable`): the failed
    node, idle again, does not take it back; another idle node may."""
    h = stealing("a", "b", "c", max_job_retries=1)
    job_id = h.submit_on("a", "flaky").job_id
    h.claim(job_id)
    retried = h.report(job_id, exit_code=3)
    assert retried.status == jobs.PENDING and retried.node_id != "a"
    elsewhere = retried.node_id
    busy(h, elsewhere)  # the retry waits there behind a running job
    assert h.poll("a") == [], "the node it failed on does not take it back"
    third = ({"b", "c"} - {elsewhere}).pop()
    assert h.poll(third) == [job_id]


def test_a_retry_whose_node_goes_down_is_not_placed_back_on_the_node_it_failed_on() -> None:
    """The scan re-places the waiting jobs of a down node (`move_pending`): a retry there goes
    to a third node while one is healthy, not back to the node its attempt failed on."""
    h = Harness(("a", "b", "c"), max_job_retries=1, max_jobs_per_node=1)
    job_id = h.submit_on("a", "flaky").job_id
    h.claim(job_id)
    retried = h.report(job_id, exit_code=3)
    elsewhere = retried.node_id
    assert retried.status == jobs.PENDING and elsewhere != "a"
    third = ({"b", "c"} - {elsewhere}).pop()
    busy(h, third)  # by load alone the idle node "a" would be chosen
    h.set_nodes(healthy=["a", third], unhealthy=[elsewhere])
    moved = h.service.dispatch.move_pending(h.job(job_id).seq)
    assert moved is not None and moved.node_id == third


def test_the_answer_is_the_nodes_own_queue_first_then_moved_jobs_oldest_first() -> None:
    h = stealing("first", "second", "idle", max_jobs_per_node="auto")
    busy(h, "first")
    busy(h, "second")
    older = h.submit_on("second").job_id
    newer = h.submit_on("first").job_id
    own = h.submit_on("idle").job_id
    # MAX_JOBS_PER_NODE=auto: three slots on the idle node, one on the others.
    h.nodes.set({n: "healthy" for n in ("first", "second", "idle")}, cpus={"idle": 3})
    assert h.poll("idle") == [own, older, newer]
    assert [h.job(j).node_id for j in (older, newer)] == ["idle", "idle"]


def test_pinned_jobs_services_delayed_jobs_and_jobs_just_offered_to_their_node_stay() -> None:
    nodes = StaticNodes({"full": "healthy", "idle": "healthy"}, instances={"i-pin": "full"})
    h = stealing(nodes)
    offered = h.submit_on("full").job_id
    assert h.poll("full") == [offered], "its agent may be about to claim it"
    busy(h, "full")  # another job takes the slot meanwhile: the offered one waits
    pinned = h.submit(instance_id="i-pin").job_id
    service = h.submit_on("full", job_type="service", port=8080).job_id
    delayed = h.submit_on("full", delay_secs=3600).job_id
    free_to_move = h.submit_on("full").job_id

    assert h.poll("idle") == [free_to_move], "only the job nothing holds back"
    for job_id in (offered, pinned, service, delayed):
        assert h.job(job_id).node_id == "full"
    assert h.poll("idle") == [free_to_move], "nothing more: its one slot is offered"


def test_a_job_offered_to_its_node_may_move_once_the_offer_hold_has_passed() -> None:
    h = stealing("full", "idle")
    offered = h.submit_on("full").job_id
    assert h.poll("full") == [offered]
    busy(h, "full")
    h.advance(OFFER_HOLD_SECS - US)
    assert h.poll("idle") == []
    h.advance(US)
    assert h.poll("idle") == [offered]


def test_a_node_with_a_free_slot_keeps_its_queue() -> None:
    h = stealing("quiet", "idle")
    waiting = h.submit_on("quiet").job_id  # its agent has not polled yet
    assert h.poll("idle") == []
    assert h.poll("quiet") == [waiting]


@pytest.mark.parametrize("trouble", ["unhealthy", "gone"])
def test_waiting_jobs_of_an_unhealthy_or_gone_node_are_taken(trouble: str) -> None:
    h = stealing("lost", "idle")
    waiting = h.submit_on("lost").job_id  # its node has a free slot, but is in trouble
    h.set_nodes(healthy=["idle"], unhealthy=["lost"] if trouble == "unhealthy" else [])
    assert h.poll("idle") == [waiting]
    assert h.stored(waiting).node_id == "idle"


@pytest.mark.parametrize("trouble", ["unhealthy", "unknown"])
def test_a_node_the_node_list_does_not_show_healthy_takes_nothing(trouble: str) -> None:
    h = stealing("full", "idle")
    busy(h, "full")
    waiting = h.submit_on("full").job_id
    h.set_nodes(healthy=["full"], unhealthy=["idle"] if trouble == "unhealthy" else [])
    assert h.poll("idle") == []
    assert h.job(waiting).node_id == "full"


def test_with_job_stealing_off_nothing_moves() -> None:
    h = stealing("full", "idle", job_stealing=False)
    busy(h, "full")
    waiting = h.submit_on("full").job_id
    assert h.poll("idle") == []
    assert h.job(waiting).node_id == "full"


# --- on the wire, under real gunicorn ----------------------------------------------------


class Cluster:
    """A dedicated scheduler on the test's registry, nodes of its own, and their agents."""

    def __init__(self, proc: SchedulerProcess, registry: FakeRegistry, count: int) -> None:
        self.proc = proc
        self.registry = registry
        self.api = Api(proc.url)
        self.nodes = sorted(unique_node() for _ in range(count))
        self._agents: dict[str, Agent] = {}

    def agent(self, node_id: str) -> Agent:
        if node_id not in self._agents:
            self._agents[node_id] = Agent(self.proc.url, node_id)
        return self._agents[node_id]

    def only(self, *healthy: str, unhealthy: tuple[str, ...] = ()) -> None:
        """The registry lists exactly these nodes, and the scheduler has read that list.

        The poll reads the node list as last fetched (it never waits on the registry);
        `GET /schedule` is a read that fetches it, as a submission or the scan would."""
        set_nodes(self.registry, healthy, unhealthy)
        if healthy:
            expect_json(self.api.get("/schedule"), 200)
        else:
            assert self.api.get("/schedule").status_code == 503

    def submit_on(self, node_id: str, **fields: Any) -> dict[str, Any]:
        """Submit while only `node_id` is healthy, so placement must choose it."""
        listed = self.registry.nodes_listing()
        self.only(node_id)
        job = self.api.submit(**fields)
        assert job["node_id"] == node_id
        healthy = [n for n, node in listed.items() if node["status"] == "healthy"]
        self.only(*healthy, unhealthy=tuple(n for n in listed if n not in healthy))
        return job

    def busy(self, node_id: str) -> str:
        """Fill the node's one slot with a running job; its id."""
        job = self.submit_on(node_id, command="long")
        assert self.agent(node_id).claim(job["job_id"]).status_code == 200
        return job["job_id"]

    def polled(self, node_id: str) -> list[str]:
        return [job.job_id for job in self.agent(node_id).poll()]

    def close(self) -> None:
        for agent in self._agents.values():
            agent.close()
        self.api.close()


@pytest.fixture
def make_cluster(
    scheduler_factory: SchedulerFactory, registry: FakeRegistry
) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(env: dict[str, str] | None = None, nodes: int = 2) -> Cluster:
        cluster = Cluster(scheduler_factory({**STEALING, **(env or {})}), registry, nodes)
        cluster.only(*cluster.nodes)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


def test_only_the_agent_poll_moves_jobs_and_the_move_shows_everywhere(make_cluster) -> None:
    """A listing with the same filters and anything more is not the poll (spec); the poll's
    move is in its answer, the job, the job page, the metrics and the log."""
    cluster = make_cluster()
    full, idle = cluster.nodes
    cluster.busy(full)
    waiting = cluster.submit_on(full)["job_id"]
    assert cluster.api.jobs(node_id=idle, status="pending", limit=10) == []
    assert cluster.api.job(waiting)["node_id"] == full

    assert cluster.polled(idle) == [waiting]
    assert cluster.api.job(waiting)["node_id"] == idle
    assert cluster.agent(idle).claim(waiting).status_code == 200
    page = cluster.api.get(f"/ui/jobs/{waiting}")
    assert f"moved from {full}" in page.text
    metrics = cluster.api.get("/metrics").text
    assert 'tiny_scheduler_jobs_moved_total{why="stolen"} 1.0' in metrics
    moved = f"job {waiting} moved from node {full} to idle node {idle}"
    wait_for(lambda: moved in Path(cluster.proc.log_path or "").read_text(), message=moved)


# --- races ------------------------------------------------------------------------------------


def race(*racers: tuple[Callable[[], Any], float]) -> list[Any]:
    """Run each (action, most delay) on a thread, all released at one instant, each action
    after a random delay up to its most; their results, in order."""
    start = threading.Barrier(len(racers))
    results: list[Any] = [None] * len(racers)
    errors: list[BaseException] = []

    def run(index: int, action: Callable[[], Any], delay: float) -> None:
        try:
            start.wait(10)
            time.sleep(random.uniform(0, delay))  # spreads the orders; not a synchronization
            results[index] = action()
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(i, action, delay), daemon=True)
        for i, (action, delay) in enumerate(racers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads), "a racer hangs"
    return results


def polled_pending(agent: Agent) -> list[str]:
    """The ids of the agent's poll answer, each checked to be pending on the agent's node:
    a poll hands out only waiting jobs, and those it moved are its node's."""
    reply = agent.api.get("/jobs", params={"node_id": agent.node_id, "status": "pending"})
    answer = expect_json(reply, 200)
    for job in answer:
        assert (job["status"], job["node_id"]) == ("pending", agent.node_id), job
    return [job.job_id for job in parse_poll_reply(reply.content)]


def test_a_job_moved_while_its_old_nodes_agent_claims_it_runs_once(make_cluster) -> None:
    """The old node's agent claims a waiting job (as one would that polled it long ago) at
    the moment an idle node's poll takes it over. Whichever comes first, exactly one claim
    succeeds, the job runs once and ends done; it is never left waiting, nor lost."""
    cluster = make_cluster()
    old, idle = cluster.nodes
    cluster.busy(old)
    for _ in range(RACE_ROUNDS):
        job_id = cluster.submit_on(old)["job_id"]
        old_agent, idle_agent = Agent(cluster.proc.url, old), Agent(cluster.proc.url, idle)
        try:
            claim_while_moved(cluster, job_id, old_agent, idle_agent)
        finally:
            old_agent.close()
            idle_agent.close()


def claim_while_moved(cluster: Cluster, job_id: str, old_agent: Agent, idle_agent: Agent) -> None:
    def old_claims() -> int:
        return old_agent.claim(job_id).status_code

    def idle_polls_and_claims() -> tuple[bool, int | None]:
        got = job_id in polled_pending(idle_agent)
        return got, idle_agent.claim(job_id).status_code if got else None

    claimed_by_old, (handed_to_idle, idle_claim) = race(
        (old_claims, RACE_DELAY_SECS), (idle_polls_and_claims, 0)
    )
    claims = [code for code in (claimed_by_old, idle_claim) if code is not None]
    assert sorted(claims) in ([200], [200, 409]), claims
    assert claimed_by_old in (200, 409)
    assert handed_to_idle or claimed_by_old == 200, "nobody got it"
    runner = old_agent if claimed_by_old == 200 else idle_agent
    assert expect_json(runner.report(job_id, 0), 200)["status"] == "done"
    job = cluster.api.job(job_id)
    assert (job["status"], job["retry_count"]) == ("done", 0)
    assert cluster.polled(idle_agent.node_id) == [], "done: it is offered to nobody again"


def test_two_polls_at_once_never_hand_out_one_job_twice(make_cluster) -> None:
    """The realistic race: the old node's slot frees up and its agent polls at the moment an
    idle node polls. The waiting job is in exactly one answer, the agent that got it claims
    it, and its node is the node that got it."""
    cluster = make_cluster()
    old, idle = cluster.nodes
    running = cluster.busy(old)
    for _ in range(RACE_ROUNDS):
        job_id = cluster.submit_on(old)["job_id"]
        old_agent, idle_agent = Agent(cluster.proc.url, old), Agent(cluster.proc.url, idle)
        try:
            polls_at_once(cluster, job_id, running, old_agent, idle_agent)
        finally:
            old_agent.close()
            idle_agent.close()
        running = cluster.busy(old)  # back to the start: the old node busy again


def polls_at_once(
    cluster: Cluster, job_id: str, running: str, old_agent: Agent, idle_agent: Agent
) -> None:
    def old_finishes_and_polls() -> list[str]:
        assert old_agent.report(running, 0).status_code == 200
        return polled_pending(old_agent)

    def idle_polls() -> list[str]:
        return polled_pending(idle_agent)

    got_old, got_idle = race((old_finishes_and_polls, 0), (idle_polls, RACE_DELAY_SECS))
    holders = [
        agent for agent, got in ((old_agent, got_old), (idle_agent, got_idle)) if job_id in got
    ]
    assert len(holders) == 1, (got_old, got_idle)
    (holder,) = holders
    assert holder.claim(job_id).status_code == 200
    assert cluster.api.job(job_id)["node_id"] == holder.node_id
    assert holder.report(job_id, 0).status_code == 200
