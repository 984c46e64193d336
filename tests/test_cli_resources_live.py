"""The command line of issue 34 against a real scheduler: what `submit --cpus/--mem/--gpus/--on/
--node` (`cli/resources.py`) makes of a job, and `tiny-scheduler history`'s filters
(`cli/history_command.py`). The scheduler runs under gunicorn, is its own node registry and has
auth on: the test's heartbeats (over HTTP) make its nodes, so a job asking for 4 CPUs and a GPU
fits, and the test ends jobs as an agent would (claim, then report), with the owners and
queues the filters pick out. Memory as Slurm writes it, alone: tests/test_cli_resources.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from helpers import Api, expect_json

from tiny_scheduler.cli import main
from tiny_scheduler.dev.daemon import SchedulerProcess

KEY = "cli-resources-key"
SCHEDULER_ENV = {
    "REGISTRY_URL": "builtin",
    "TINYAWS_API_KEY": KEY,
    "MAX_JOB_RETRIES": "0",
    # The test's one heartbeat per node keeps them healthy for the whole module.
    "NODE_HEARTBEAT_SECS": "60",
    "NODE_LOST_SECS": "600",
}
BIGGEST_MEMORY = 16_777_216  # MiB: the most a heartbeat (and a job) may say, 16T


# --- against a real scheduler -------------------------------------------------------------------


@pytest.fixture(scope="module")
def admin(scheduler: SchedulerProcess) -> Iterator[Api]:
    """The scheduler's API with the shared key, after heartbeats for its two nodes: node-c
    (8 CPUs, 16T, 2 GPUs, gpu=a100) and plain (2 CPUs, no memory reported)."""
    api = Api(scheduler.url, KEY)
    beat(api, "node-c", cpu_count=8, memory_mb=BIGGEST_MEMORY, gpus=2, labels={"gpu": "a100"})
    beat(api, "plain", cpu_count=2)
    yield api
    api.close()


def beat(api: Api, node: str, **fields: Any) -> None:
    body = {"running": [], "version": "test", **fields}
    expect_json(api.request("PUT", f"/nodes/{node}", data=orjson.dumps(body)), 200)


def cli(scheduler: SchedulerProcess, *args: str, key: str = KEY) -> Result:
    env = {"SCHEDULER_URL": scheduler.url, "TINYAWS_API_KEY": key}
    return CliRunner().invoke(main, list(args), env=env)


RESOURCES = ("cpus", "memory_mb", "gpus", "node_selector", "node_ids")


def test_submit_sends_what_the_job_needs_and_where_it_may_run(
    scheduler: SchedulerProcess, admin: Api
) -> None:
    result = cli(
        scheduler,
        *("submit", "--json", "--cpus", "4", "--mem", "8G", "--gpus", "1"),
        *("--on", "gpu=a100", "--node", "node-c", "true"),
    )
    assert result.exit_code == 0, result.stderr
    job = json.loads(result.stdout)
    expected = {
        "cpus": 4,
        "memory_mb": 8192,
        "gpus": 1,
        "node_selector": {"gpu": "a100"},
        "node_ids": ["node-c"],
    }
    assert {name: job.get(name) for name in RESOURCES} == expected
    assert job["node_id"] == "node-c" and job["status"] == "pending"
    # Stored so: the scheduler shows the same fields when asked again.
    stored = admin.job(job["job_id"])
    assert {name: stored.get(name) for name in RESOURCES} == expected
    assert admin.post(f"/jobs/{job['job_id']}/cancel").status_code == 200


@pytest.mark.parametrize(
    ("mem", "mib"),
    [
        ("512", 512),
        ("512M", 512),
        ("8G", 8192),
        ("8GB", 8192),
        ("1T", 1_048_576),
        ("16T", BIGGEST_MEMORY),
    ],
)
def test_each_way_of_writing_memory_reaches_the_job(
    scheduler: SchedulerProcess, admin: Api, mem: str, mib: int
) -> None:
    result = cli(scheduler, "submit", "--json", "--mem", mem, "--node", "node-c", "true")
    assert result.exit_code == 0, result.stderr
    job = json.loads(result.stdout)
    assert (job["memory_mb"], admin.job(job["job_id"])["memory_mb"]) == (mib, mib)
    # Nothing else was asked for: those fields are left out, as for an old client's job.
    assert [name for name in ("cpus", "gpus", "node_selector") if name in job] == []
    assert admin.post(f"/jobs/{job['job_id']}/cancel").status_code == 200


def test_a_bad_memory_size_is_refused_before_anything_is_sent(
    scheduler: SchedulerProcess, admin: Api
) -> None:
    before = len(admin.jobs(limit=1000))
    result = cli(scheduler, "submit", "--mem", "1.5G", "true")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: Invalid value for '--mem': '1.5G' is not an amount of memory such as 512M or 8G"
    )
    assert len(admin.jobs(limit=1000)) == before


def ended(api: Api, job_id: str, exit_code: int) -> dict[str, Any]:
    """Claim the job and report its end, as its node's agent would."""
    expect_json(api.patch(f"/jobs/{job_id}", {"status": "running"}), 200)
    status = "done" if exit_code == 0 else "failed"
    body = {"status": status, "exit_code": exit_code, "stdout": "", "stderr": ""}
    return expect_json(api.patch(f"/jobs/{job_id}", body), 200)


def listed(result: Result) -> list[str]:
    """The job ids of a `history` table, in its order."""
    assert result.exit_code == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split()[0] == "JOB"
    return [row.split()[0] for row in rows]


def test_history_filters_by_time_owner_queue_and_status(
    scheduler: SchedulerProcess, admin: Api
) -> None:
    users = {}
    for user in ("alice", "bob"):
        made = expect_json(admin.post("/tokens", json={"user": user, "role": "user"}), 201)
        users[user] = Api(scheduler.url, made["token"])
    nightly = expect_json(
        users["alice"].post("/jobs", json={"command": "true", "queue": "nightly"}), 201
    )["job_id"]
    broken = expect_json(users["bob"].post("/jobs", json={"command": "false"}), 201)["job_id"]
    later = expect_json(users["alice"].post("/jobs", json={"command": "true"}), 201)["job_id"]
    # They end in this order: the nightly one, bob's failure, alice's later one.
    first = ended(admin, nightly, 0)
    failure = ended(admin, broken, 1)
    last = ended(admin, later, 0)
    assert first["finished_at"] < failure["finished_at"] < last["finished_at"]
    ours = {nightly, broken, later}

    def shown(*filters: str) -> list[str]:
        return [job_id for job_id in listed(cli(scheduler, "history", *filters)) if job_id in ours]

    assert shown() == [nightly, broken, later]  # oldest first
    assert shown("--owner", "alice") == [nightly, later]
    assert shown("--owner", "bob") == [broken]
    assert shown("--queue", "nightly") == [nightly]
    assert shown("--queue", "default", "--owner", "alice") == [later]
    assert shown("--status", "failed") == [broken]
    assert shown("--status", "done") == [nightly, later]
    # Before bob's job finished (an end at exactly that time is not before it).
    assert shown("--until", failure["finished_at"]) == [nightly]
    assert shown("--since", first["finished_at"], "--until", last["finished_at"]) == [
        nightly,
        broken,
    ]
    # The columns say it too: the owner and queue of each row, and how it ended.
    rows = {
        row.split()[0]: row.split() for row in cli(scheduler, "history").stdout.splitlines()[1:]
    }
    assert [rows[broken][1], *rows[broken][3:5]] == ["failed", "default", "bob"]
    assert [rows[nightly][1], *rows[nightly][3:5]] == ["done", "nightly", "alice"]
    # A filter nothing matches says so, on stderr.
    nothing = cli(scheduler, "history", "--owner", "nobody-at-all")
    assert (nothing.exit_code, nothing.stdout) == (0, "")
    assert nothing.stderr == "no finished jobs in that time\n"
    for api in users.values():
        api.close()
