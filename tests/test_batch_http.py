"""The batch comforts over HTTP on the real daemon, on both stores (SQLite and PostgreSQL): an
array submitted, listed and found again after a restart; a hold that the agent's poll obeys
and that survives the restart; a retry as a new job; an Idempotency-Key on an array."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from conftest import start_scheduler, stop_scheduler
from helpers import Agent, Api, expect_error, expect_json, set_nodes, wait_for

from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry

Start = Callable[[], SchedulerProcess]


@pytest.fixture(params=["sqlite", "postgres"])
def start(
    request: pytest.FixtureRequest, tmp_path: Path, registry: FakeRegistry
) -> Iterator[Start]:
    """Start a daemon on the test's own database of that kind (the same one each time)."""
    if request.param == "sqlite":
        database = str(tmp_path / "scheduler.db")
    else:
        database = request.getfixturevalue("postgres_database").create()
    started: list[SchedulerProcess] = []

    def start_() -> SchedulerProcess:
        log = tmp_path / f"scheduler-{len(started) + 1}.log"
        proc = start_scheduler(database, log, registry.url)  # type: ignore[arg-type]
        started.append(proc)
        # On PostgreSQL a daemon serves once it leads (at once: it is the only one).
        wait_for(lambda: _leads(proc), timeout=30, message="the daemon to lead")
        return proc

    yield start_
    for proc in started:
        stop_scheduler(proc)


def test_arrays_holds_and_retries_are_kept_by_the_store(
    start: Start, registry: FakeRegistry
) -> None:
    set_nodes(registry, ["node-a", "node-b"])
    daemon = start()
    api = Api(daemon.url)
    keyed = {"Idempotency-Key": "sweep-1"}
    body = {"command": "echo $TINY_ARRAY_INDEX", "array": 20, "name": "sweep"}
    first = expect_json(api.post("/jobs", body, headers=keyed), 201)
    assert (first["job_id"], first["array_id"], first["array_index"]) == ("job-1", "job-1", 0)
    assert expect_json(api.post("/jobs", body, headers=keyed), 200) == first
    members = api.jobs(array_id="job-1")
    assert [job["array_index"] for job in members] == list(range(20))
    assert {job["env_vars"]["TINY_ARRAY_INDEX"] for job in members} == {str(i) for i in range(20)}
    assert {job["node_id"] for job in members} == {"node-a", "node-b"}
    assert len(api.jobs(name="sweep", status="pending")) == 20
    held = expect_json(api.post("/jobs/job-1/hold"), 200)
    assert (held["held"], held["waiting_for"]) == (True, "held")
    stop_scheduler(daemon)

    daemon = start()
    api = Api(daemon.url)
    assert api.job("job-1")["held"] is True
    assert [job["job_id"] for job in api.jobs(array_id="job-1", limit=2)] == ["job-1", "job-2"]
    agent = Agent(daemon.url, "node-a")
    assert "job-1" not in [job.job_id for job in agent.poll()]
    expect_error(agent.claim("job-1"), 409, "job job-1 is held, cannot become running")
    released = expect_json(api.post("/jobs/job-1/release"), 200)
    assert "held" not in released
    assert agent.claim("job-1").status_code == 200
    expect_error(api.post("/jobs/job-1/hold"), 409, "job is not pending")
    expect_error(api.post("/jobs/job-1/retry"), 409, "job is not finished")
    assert agent.report("job-1", 0).status_code == 200
    again = expect_json(api.post("/jobs/job-1/retry"), 201)
    assert (again["job_id"], again["retry_of"], again["name"]) == ("job-21", "job-1", "sweep")
    assert again["env_vars"] == {"TINY_ARRAY_INDEX": "0"} and "array_id" not in again
    agent.close()
    api.close()


def _leads(proc: SchedulerProcess) -> bool:
    try:
        return requests.get(proc.url + "/leader", timeout=2).status_code == 200
    except requests.RequestException:
        return False
