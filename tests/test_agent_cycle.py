"""A job's life as the real agent drives it, under real gunicorn: the strict poll, the exact
claim body, the final report, and a retry on another node as the agents see it on the wire.

The rules behind them (where a retry goes, how many jobs a poll hands out, the output cap)
are decisions of the service, checked on the harness (`harness.py`) below."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
from harness import Harness
from helpers import Agent, Api, expect_json, set_nodes, unique_node

from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.nodes import StaticNodes

MAX_OUTPUT_BYTES = 1024
SCHEDULER_ENV = {"MAX_JOBS_PER_NODE": "2", "MAX_OUTPUT_BYTES": str(MAX_OUTPUT_BYTES)}
MARKER = re.compile(r"^\[tiny-scheduler: output truncated, \d+ earlier bytes dropped\]\n")

AgentFactory = Callable[[str], Agent]


@pytest.fixture
def agents(scheduler: SchedulerProcess) -> Iterator[AgentFactory]:
    """`agents(node_id)`: an agent of that node; all are closed at the end."""
    made: list[Agent] = []

    def make(node_id: str) -> Agent:
        made.append(Agent(scheduler.url, node_id))
        return made[-1]

    yield make
    for agent in made:
        agent.close()


def polled_ids(agent: Agent) -> list[str]:
    return [job.job_id for job in agent.poll()]


def test_a_run_job_from_poll_to_done(api: Api, agents: AgentFactory, node: str) -> None:
    agent = agents(node)
    job = api.submit(command="echo $GREETING", env_vars={"GREETING": "hi"})
    (polled,) = agent.poll()
    assert (polled.job_id, polled.command, polled.env_vars) == (
        job["job_id"],
        "echo $GREETING",
        {"GREETING": "hi"},
    )

    claimed = agent.claim(polled.job_id)
    running = expect_json(claimed, 200)
    assert running["status"] == "running"
    assert b'"status":"running"' in claimed.content

    done = expect_json(agent.report(polled.job_id, 0, stdout="hi\n"), 200)
    assert (done["status"], done["exit_code"], done["stdout"]) == ("done", 0, "hi\n")
    fetched = api.job(job["job_id"])
    assert fetched == done
    assert fetched["created_at"] <= fetched["running_at"] <= fetched["finished_at"]
    assert fetched["running_at"] == running["running_at"]


def test_a_failed_attempt_is_retried_on_another_healthy_node(
    api: Api, registry: FakeRegistry, agents: AgentFactory
) -> None:
    nodes = sorted([unique_node(), unique_node()])
    set_nodes(registry, nodes)
    job = api.submit(command="flaky")
    first_node = job["node_id"]
    other_node = next(node for node in nodes if node != first_node)
    first, second = agents(first_node), agents(other_node)

    assert polled_ids(first) == [job["job_id"]]
    assert first.claim(job["job_id"]).status_code == 200
    retried = expect_json(first.report(job["job_id"], 2, stdout="partial", stderr="boom"), 200)
    assert retried == {
        "job_id": job["job_id"],
        "node_id": other_node,
        "command": "flaky",
        "job_type": "run",
        "status": "pending",
        "retry_count": 1,
        "created_at": job["created_at"],
    }
    (attempt,) = api.job(job["job_id"])["attempts"]
    assert list(attempt) == [
        "node_id",
        "exit_code",
        "stdout",
        "stderr",
        "running_at",
        "finished_at",
    ]
    assert (attempt["node_id"], attempt["exit_code"], attempt["stderr"]) == (first_node, 2, "boom")
    assert attempt["running_at"] <= attempt["finished_at"]

    assert first.poll() == []
    assert polled_ids(second) == [job["job_id"]]
    assert second.claim(job["job_id"]).status_code == 200
    # Retries are used up (MAX_JOB_RETRIES=1): this failure is final, on the node it ran on.
    final = expect_json(second.report(job["job_id"], 3, stderr="boom again"), 200)
    assert (final["status"], final["retry_count"], final["node_id"]) == ("failed", 1, other_node)
    assert (final["exit_code"], final["stderr"]) == (3, "boom again")
    fetched = api.job(job["job_id"])
    assert [a["node_id"] for a in fetched["attempts"]] == [first_node]
    assert second.poll() == [] and first.poll() == []


# --- the rules, on the harness -----------------------------------------------------------


def test_a_retry_goes_back_to_the_only_healthy_node() -> None:
    h = Harness(["node-a"])
    job = h.submit()
    h.claim(job.job_id)
    retried = h.report(job.job_id, exit_code=1)
    assert (retried.status, retried.node_id) == (jobs.PENDING, "node-a")
    assert h.poll("node-a") == [job.job_id]


def test_a_pinned_job_retries_on_its_instances_node() -> None:
    nodes = StaticNodes({"pinned": "healthy", "other": "healthy"}, instances={"i-pin": "pinned"})
    h = Harness(nodes)
    job = h.submit(instance_id="i-pin")
    h.claim(job.job_id)
    retried = h.report(job.job_id, exit_code=1)
    assert (retried.status, retried.node_id) == (jobs.PENDING, "pinned")


def test_poll_is_capped_at_two_free_slots_and_services_take_none() -> None:
    h = Harness(["node-a"], max_jobs_per_node=2)
    service = h.submit("serve", job_type="service", port=8000).job_id
    runs = [h.submit(f"run {n}").job_id for n in range(4)]
    assert h.poll("node-a") == [service, runs[0]]
    h.claim(service)
    assert h.poll("node-a") == runs[0:2]  # the running service takes no slot
    h.claim(runs[0])
    assert h.poll("node-a") == [runs[1]]
    h.claim(runs[1])
    assert h.poll("node-a") == []
    h.report(runs[0])
    assert h.poll("node-a") == [runs[2]]
    h.report(service)  # a service ending frees nothing either
    assert h.poll("node-a") == [runs[2]]


def test_output_over_the_cap_keeps_the_tail_behind_a_marker() -> None:
    h = Harness(max_output_bytes=MAX_OUTPUT_BYTES)
    job_id = h.submit().job_id
    h.claim(job_id)
    stdout = "".join(f"line {n}\n" for n in range(1000))
    stderr = "é" * 3000 + "the end"
    done = h.report(job_id, stdout=stdout, stderr=stderr)
    for original, kept in ((stdout, done.stdout), (stderr, done.stderr)):
        assert len(kept.encode()) <= MAX_OUTPUT_BYTES
        match = MARKER.match(kept)
        assert match, kept[:100]
        assert original.endswith(kept[match.end() :])
        assert len(kept.encode()) >= MAX_OUTPUT_BYTES - 3
    assert done.stdout.endswith("line 999\n")
    assert h.job(job_id).stdout == done.stdout


def test_output_within_the_cap_is_kept_whole() -> None:
    h = Harness(max_output_bytes=MAX_OUTPUT_BYTES)
    job_id = h.submit().job_id
    h.claim(job_id)
    stdout = "x" * MAX_OUTPUT_BYTES
    done = h.report(job_id, exit_code=1, stdout=stdout)
    assert done.status == jobs.PENDING  # retried: the attempt keeps the output
    assert h.job(job_id).attempts[0].stdout == stdout
