"""Fit with real agents of different sizes and labels (issue 34): a real scheduler as its own
node registry, three real `tiny-scheduler agent` processes — small (1 CPU, 1 GiB), wide
(4 CPUs, 4 GiB, zone=b) and gpu (2 CPUs, 1 GiB, 2 GPUs, gpu=fake) — and jobs that each fit only some
of them. Jobs go where they fit, a job no node could run is refused, and `GET /nodes`, the
CLI and the dashboard show what each node has and has allocated. The rules themselves are
tests/test_fit.py's (on the harness)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import SchedulerFactory
from helpers import Api, expect_json, wait_for
from test_agent_process import AgentProcess, ended, start_agent, waits_for

from tiny_scheduler.cli import main
from tiny_scheduler.dev.daemon import SchedulerProcess

ENV = {
    "REGISTRY_URL": "builtin",  # CPUs as slots: MAX_JOBS_PER_NODE is auto by default here
    "MAX_JOB_RETRIES": "0",
    "NODE_HEARTBEAT_SECS": "0.5",
}


@pytest.fixture
def cluster(
    tmp_path: Path, scheduler_factory: SchedulerFactory
) -> Iterator[tuple[SchedulerProcess, Api]]:
    sched = scheduler_factory(env=ENV)
    made: list[AgentProcess] = []
    for node, options in (
        ("small", ("--slots", "1", "--memory-mb", "1024")),
        ("wide", ("--slots", "4", "--memory-mb", "4096", "--label", "zone=b")),
        ("gpu", ("--slots", "2", "--memory-mb", "1024", "--gpus", "2", "--label", "gpu=fake")),
    ):
        start_agent(made, tmp_path, node, sched.url, *options)
    api = Api(sched.url)
    wait_for(lambda: len(nodes(api)) == 3, timeout=30, message="three agents to heartbeat")
    yield sched, api
    for agent in made:
        agent.kill()


def cli(sched: SchedulerProcess, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), env={"SCHEDULER_URL": sched.url})


def nodes(api: Api) -> dict[str, dict[str, Any]]:
    return {node["node_id"]: node for node in expect_json(api.get("/nodes"), 200)}


def submit(api: Api, **fields: Any) -> dict[str, Any]:
    return expect_json(api.post("/jobs", json={"command": "true", **fields}), 201)


def test_jobs_run_where_they_fit_and_the_nodes_show_what_they_hold(
    cluster: tuple[SchedulerProcess, Api], tmp_path: Path
) -> None:
    sched, api = cluster
    shown = nodes(api)
    assert shown["wide"]["capacity"] == {"cpus": 4, "memory_mb": 4096, "gpus": 0}
    assert shown["gpu"]["capacity"]["gpus"] == 2 and shown["gpu"]["labels"] == {"gpu": "fake"}

    placed = {
        "three cpus": submit(api, cpus=3),
        "a gpu": submit(api, gpus=1, command='test -n "$CUDA_VISIBLE_DEVICES"'),
        "zone b": submit(api, node_selector={"zone": "b"}),
        "2 GiB": submit(api, memory_mb=2048),
        "on small": submit(api, node_ids=["small"]),
    }
    expected = {"three cpus": "wide", "a gpu": "gpu", "zone b": "wide", "2 GiB": "wide"}
    expected["on small"] = "small"
    for what, job in placed.items():
        done = wait_for(lambda job=job: ended(api, job["job_id"]), timeout=60, message=what)
        assert (done["status"], done["node_id"]) == ("done", expected[what]), what

    # While a job holds 3 CPUs and 1000 MiB of the wide node, everyone sees it held.
    go = tmp_path / "go"
    holding = submit(api, cpus=3, memory_mb=1000, command=waits_for(go))
    wait_for(
        lambda: nodes(api)["wide"]["allocated"] == {"cpus": 3, "memory_mb": 1000, "gpus": 0},
        timeout=60,
        message="the wide node to show the job's share allocated",
    )
    page = api.get("/ui/nodes").text
    assert 'data-node="wide"' in page and 'data-memory-used="1000"' in page
    table = cli(sched, "nodes").stdout
    wide_row = next(line for line in table.splitlines() if line.startswith("wide "))
    assert "3/4" in wide_row and "zone=b" in wide_row
    # A second such job fits nowhere now: it waits, saying for what.
    waiting = submit(api, cpus=3)
    why = wait_for(
        lambda: api.job(waiting["job_id"]).get("waiting_for"), timeout=30, message="waiting_for"
    )
    assert why == "3 free cpus on wide"
    go.touch()
    assert wait_for(lambda: ended(api, waiting["job_id"]), timeout=60)["status"] == "done"
    assert ended(api, holding["job_id"]) is not None


def test_a_job_no_node_could_run_is_refused_and_the_cli_says_why(
    cluster: tuple[SchedulerProcess, Api],
) -> None:
    sched, api = cluster
    refused = api.post("/jobs", json={"command": "true", "cpus": 8})
    assert (refused.status_code, refused.text) == (
        400,
        "no node can run this job: needs 8 cpus, the largest node has 4\n",
    )
    said = cli(sched, "submit", "--gpus", "1", "--on", "zone=b", "nvidia-smi")
    assert (said.exit_code, said.stderr) == (
        1,
        "error: no node can run this job: needs 1 gpus, the largest node with zone=b has 0\n",
    )
    listed = json.loads(cli(sched, "nodes", "--json").stdout)
    assert {node["node_id"] for node in listed} == {"small", "wide", "gpu"}


def test_status_and_history_show_what_finished_jobs_used(
    cluster: tuple[SchedulerProcess, Api],
) -> None:
    sched, api = cluster
    burn = "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"
    job = submit(api, command=burn, cpus=2, memory_mb=256, node_ids=["wide"])
    done = wait_for(lambda: ended(api, job["job_id"]), timeout=60, message="the job to end")
    usage = done["usage"]
    assert usage["wall_secs"] > 0 and usage["cpu_secs"] >= 0 and usage["max_rss_mb"] > 0
    status = cli(sched, "status", job["job_id"]).stdout
    assert "2 cpus, 256 MiB" in status
    assert "used" in status and "max rss" in status
    history = cli(sched, "history", "--since", "1h").stdout
    header, *rows = history.splitlines()
    assert header.split()[:5] == ["JOB", "STATUS", "NODE", "QUEUE", "OWNER"]
    row = next(line for line in rows if line.startswith(job["job_id"] + " "))
    assert f"{usage['wall_secs']:.1f}s" in row
    page = api.get(f"/ui/jobs/{job['job_id']}").text
    assert '<dd id="job-needs">2 CPUs · 256 MiB</dd>' in page
    assert f"wall {usage['wall_secs']:.1f} s" in page
    # The same through the API: finished jobs of the window, without their output.
    listed = expect_json(
        api.get(
            "/jobs",
            params={"finished_since": done["finished_at"], "output": "none", "status": "done"},
        ),
        200,
    )
    assert [found["job_id"] for found in listed] == [job["job_id"]]
    assert "stdout" not in listed[0] and listed[0]["usage"] == usage
    empty = expect_json(api.get("/jobs", params={"finished_until": done["created_at"]}), 200)
    assert job["job_id"] not in {found["job_id"] for found in empty}
