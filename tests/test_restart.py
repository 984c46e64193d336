"""Continuity across restarts: a clean SIGTERM stop and a SIGKILL crash both come back with
every job exactly as it was, to the microsecond, and ids continue where they left off."""

from __future__ import annotations

from typing import Any

from conftest import SchedulerFactory
from helpers import Agent, Api, expect_json

from tiny_scheduler.dev.registry import FakeRegistry


def build_history(api: Api, agents: dict[str, Agent], registry: FakeRegistry) -> list[str]:
    """Jobs in every state and with every field; returns their ids."""
    registry.set_instance("i-keep", "node-b")
    made = [
        api.submit(command="pending"),
        api.submit(
            command="./serve",
            deploy_url="http://objects/app.zip",
            instance_id="i-keep",
            job_type="service",
            port=8080,
            env_vars={"A": "1", "ÜNICODE": "€"},
            timeout_secs=45,
        ),
        api.submit(command="done"),
        api.submit(command="retried"),
        api.submit(command="final failure"),
        api.submit(command="cancelled"),
        expect_json(
            api.post("/jobs", {"command": "keyed"}, headers={"Idempotency-Key": "k1"}), 201
        ),
    ]
    job_ids = [job["job_id"] for job in made]

    def run(job_id: str, exit_code: int, **output: str) -> dict[str, Any]:
        agent = agents[api.job(job_id)["node_id"]]
        assert agent.claim(job_id).status_code == 200
        return expect_json(agent.report(job_id, exit_code, **output), 200)

    agents["node-b"].claim(job_ids[1])  # the service stays running
    run(job_ids[2], 0, stdout="all good\n")
    run(job_ids[3], 4, stdout="half", stderr="oops")  # back to pending, with an attempt
    run(job_ids[4], 1, stderr="first")
    run(job_ids[4], 2, stderr="second")  # final
    expect_json(api.post(f"/jobs/{job_ids[5]}/cancel"), 200)
    return job_ids


def snapshot(api: Api, job_ids: list[str]) -> tuple[list[dict], list[dict]]:
    return [api.job(job_id) for job_id in job_ids], api.jobs()


def test_sigterm_then_start_again_keeps_every_job_and_continues_ids(
    scheduler_factory: SchedulerFactory, registry: FakeRegistry
) -> None:
    first = scheduler_factory()
    api = Api(first.url)
    agents = {node: Agent(first.url, node) for node in ("node-a", "node-b", "node-c")}
    job_ids = build_history(api, agents, registry)
    before = snapshot(api, job_ids)
    assert {(job["status"], job.get("reason")) for job in before[0]} == {
        ("pending", None),
        ("running", None),
        ("done", None),
        ("failed", "exit"),
        ("failed", "cancelled"),
    }
    assert before[0][3]["attempts"] and before[0][4]["attempts"]
    api.close()
    for agent in agents.values():
        agent.close()

    assert first.stop() == 0  # a clean SIGTERM exit

    second = scheduler_factory()
    api = Api(second.url)
    try:
        assert snapshot(api, job_ids) == before
        new = api.submit(command="after restart")
        assert int(new["job_id"][4:]) == int(job_ids[-1][4:]) + 1
        again = api.post("/jobs", {"command": "keyed"}, headers={"Idempotency-Key": "k1"})
        assert expect_json(again, 200)["job_id"] == job_ids[-1]
        # The restored state is live: the running service can finish, the pending job run.
        agent = Agent(second.url, "node-b")
        assert agent.report(job_ids[1], 0).status_code == 200
        agent.close()
        agent = Agent(second.url, before[0][0]["node_id"])
        assert [job.job_id for job in agent.poll()] == [job_ids[0]]
        assert agent.claim(job_ids[0]).status_code == 200
        agent.close()
    finally:
        api.close()


def test_a_crash_loses_no_acknowledged_change(
    scheduler_factory: SchedulerFactory, registry: FakeRegistry
) -> None:
    first = scheduler_factory()
    api = Api(first.url)
    agent = Agent(first.url, "node-a")
    job_ids = [api.submit(command=f"job {n}")["job_id"] for n in range(12)]
    on_a = [job_id for job_id in job_ids if api.job(job_id)["node_id"] == "node-a"]
    assert agent.claim(on_a[0]).status_code == 200
    assert agent.report(on_a[0], 0, stdout="done before the crash").status_code == 200
    assert agent.claim(on_a[1]).status_code == 200
    before = snapshot(api, job_ids)
    api.close()
    agent.close()

    first.kill()  # SIGKILL: nothing gets to flush or clean up

    second = scheduler_factory()
    api = Api(second.url)
    try:
        assert snapshot(api, job_ids) == before
        assert int(api.submit()["job_id"][4:]) == int(job_ids[-1][4:]) + 1
    finally:
        api.close()
