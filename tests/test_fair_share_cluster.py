"""Fair share and user limits with real processes (issue 35): a real scheduler with auth on,
two nodes of real agents, and two users with their own tokens. A big sweep by one user does
not hold the other's jobs back, and a user's limit holds across the cluster. What is checked
comes from the scheduler's own stamps (`running_at`, `finished_at`), read back at the end.
The rule itself is tests/test_fair_share.py's, on the harness."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import SchedulerFactory
from helpers import Api, expect_json, wait_for
from test_agent_process import AgentProcess, start_agent

from tiny_scheduler.cli import main
from tiny_scheduler.domain.jobs import parse_time

KEY = "fair-share-admin-key"
SLOTS = 2
NODES = ("fair-a", "fair-b")
ENV = {
    "REGISTRY_URL": "builtin",
    "TINYAWS_API_KEY": KEY,
    "MAX_JOB_RETRIES": "0",
    "NODE_HEARTBEAT_SECS": "0.5",
}


@pytest.fixture
def cluster(tmp_path: Path, scheduler_factory: SchedulerFactory) -> Iterator[Api]:
    sched = scheduler_factory(env=ENV)
    made: list[AgentProcess] = []
    for node in NODES:
        start_agent(made, tmp_path, node, sched.url, "--slots", str(SLOTS), key=KEY)
    admin = Api(sched.url, KEY)
    wait_for(
        lambda: len(expect_json(admin.get("/nodes"), 200)) == len(NODES),
        timeout=30,
        message="both agents to heartbeat",
    )
    yield admin
    for agent in made:
        agent.kill()


def token(admin: Api, user: str) -> str:
    made = expect_json(admin.post("/tokens", json={"user": user, "role": "user"}), 201)
    return str(made["token"])


def jobs_of(admin: Api, owner: str) -> list[dict[str, Any]]:
    return expect_json(admin.get("/jobs", params={"owner": owner, "limit": 10000}), 200)


def test_a_sweep_by_one_user_does_not_hold_back_another_s_jobs(cluster: Api) -> None:
    """User A submits 500 jobs, user B then 10: all 10 of B's start within the first
    10 + (total slots) starts after B's last submission."""
    admin = cluster
    alice = Api(admin.base_url, token(admin, "alice"))
    bob = Api(admin.base_url, token(admin, "bob"))
    expect_json(alice.post("/jobs", json={"command": "sleep 0.2", "array": 500}), 201)
    wait_for(
        lambda: sum("running_at" in job for job in jobs_of(admin, "alice")) >= 8,
        timeout=60,
        message="alice's sweep to be under way",
    )
    mine = [expect_json(bob.post("/jobs", json={"command": "true"}), 201) for _ in range(10)]
    submitted = parse_time(mine[-1]["created_at"])

    def bobs_ended() -> list[dict[str, Any]] | None:
        found = jobs_of(admin, "bob")
        return found if all(job["status"] == "done" for job in found) else None

    done = wait_for(bobs_ended, timeout=120, message="bob's ten jobs to end")
    assert len(done) == 10
    starts = sorted(
        (parse_time(job["running_at"]), job["owner"])
        for owner in ("alice", "bob")
        for job in jobs_of(admin, owner)
        if "running_at" in job and parse_time(job["running_at"]) >= submitted
    )
    # Each of bob's jobs by its place among the starts after his last submission (one that
    # started before it is at place 0): all within the first 10 + the slots.
    ranks = [rank for rank, (_, owner) in enumerate(starts) if owner == "bob"]
    early = sum(parse_time(job["running_at"]) < submitted for job in done)
    assert early + len(ranks) == 10
    assert max(ranks, default=0) < 10 + SLOTS * len(NODES), starts[: max(ranks) + 1]


def test_a_user_s_limit_holds_across_the_cluster(cluster: Api) -> None:
    """With max_running 2 for A, never more than 2 of A's jobs run at once (by their own
    stamps), while B's jobs use the other slots."""
    admin = cluster
    expect_json(admin.request("PUT", "/users/alice", json={"max_running": 2}), 200)
    alice = Api(admin.base_url, token(admin, "alice"))
    bob = Api(admin.base_url, token(admin, "bob"))
    expect_json(alice.post("/jobs", json={"command": "sleep 0.3", "array": 12}), 201)
    expect_json(bob.post("/jobs", json={"command": "sleep 0.3", "array": 6}), 201)
    for owner in ("alice", "bob"):
        wait_for(
            lambda owner=owner: all(job["status"] == "done" for job in jobs_of(admin, owner)),
            timeout=120,
            message=f"{owner}'s jobs to end",
        )
    spans = [
        (parse_time(job["running_at"]), parse_time(job["finished_at"]))
        for job in jobs_of(admin, "alice")
    ]
    assert len(spans) == 12
    # At each start, how many of alice's were running: never more than 2.
    assert max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans) <= 2
    listed = {user["user"]: user for user in expect_json(admin.get("/users"), 200)}
    assert listed["alice"]["max_running"] == 2 and listed["alice"]["usage_cpu_secs"] > 0


def test_the_cli_sets_and_lists_users_limits(cluster: Api) -> None:
    """`tiny-scheduler user limit` and `users`, against the same daemon."""
    admin = cluster
    env = {"SCHEDULER_URL": admin.base_url, "TINYAWS_API_KEY": KEY}
    runner = CliRunner()
    set_it = runner.invoke(main, ["user", "limit", "carol", "--max-running", "3"], env=env)
    assert set_it.exit_code == 0, set_it.output
    assert set_it.stdout.startswith("carol: limit 3")
    both = runner.invoke(main, ["user", "limit", "carol"], env=env)
    assert both.exit_code == 2 and "give --max-running N or --no-limit" in both.output
    table = runner.invoke(main, ["users"], env=env).stdout.splitlines()
    assert table[0].split() == ["USER", "RUNNING", "PENDING", "USAGE", "(CPU", "s)", "LIMIT"]
    assert any(line.split()[0] == "carol" and line.split()[-1] == "3" for line in table[1:])
    cleared = runner.invoke(main, ["user", "limit", "carol", "--no-limit", "--json"], env=env)
    assert json.loads(cleared.stdout)["max_running"] is None
