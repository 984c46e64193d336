"""What if? (issue 38) against reality: a real scheduler (its own node registry) with two real
`tiny-scheduler agent` processes runs a small history — forty short jobs of 1 or 2 CPUs in
eight bursts, a third of them in queue `nightly` — and `tiny-scheduler simulate` with no
changes, from the daemon's SQLite file while it runs and from its API, reproduces it.

"Reproduces": at least 95 % of the jobs start in the replay within max(0.5 s, the claim
latency) of when they really started, and the summary figures are within 5 % — of the
figure for the makespan, and for the waits of the figure or of that same start tolerance,
whichever is larger (waits of a tenth of a second are the agents' poll phase, which no replay
knows). The jobs run 0.1-0.3 s: where the agents' poll phase decides which of two jobs a node
takes first, the other starts one job's length later in the replay than in reality, and jobs
shorter than the tolerance keep such a swap within it (with 0.3-0.7 s jobs, one swap in a
backlog moved the jobs after it by 0.55 s). The known outcomes of the replay are
tests/test_simulate.py's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import SchedulerFactory
from helpers import Api, expect_json, wait_for
from test_agent_process import AgentProcess, ended, start_agent

from tiny_scheduler.cli import main
from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.simulate import changes, history, replay

ENV = {"REGISTRY_URL": "builtin", "MAX_JOB_RETRIES": "0", "NODE_HEARTBEAT_SECS": "0.5"}
SINCE = "1h"
BURSTS, BURST = 8, 5
"""The history: eight bursts of five jobs, each submitted once the one before has ended (a
backlog of a few jobs at a time, as on a cluster that keeps up)."""


@pytest.fixture
def ran(tmp_path: Path, scheduler_factory: SchedulerFactory) -> Iterator[SchedulerProcess]:
    """The daemon, after its agents ran the small history (see the module's notes)."""
    sched = scheduler_factory(env=ENV)
    made: list[AgentProcess] = []
    start_agent(made, tmp_path, "wide", sched.url, "--slots", "2", "--memory-mb", "2048")
    start_agent(made, tmp_path, "narrow", sched.url, "--slots", "1", "--memory-mb", "1024")
    api = Api(sched.url)
    wait_for(lambda: len(expect_json(api.get("/nodes"), 200)) == 2, timeout=30, message="agents")
    submitted = []
    for burst in range(BURSTS):
        wave = []
        for n in range(BURST):
            body: dict[str, Any] = {"command": f"sleep {0.1 + 0.05 * ((n + burst) % 5):.2f}"}
            if n % 3 == 0:
                body["queue"] = "nightly"
            if (n + burst) % 4 == 1:
                body["cpus"] = 2
            wave.append(expect_json(api.post("/jobs", json=body), 201)["job_id"])
        for job_id in wave:
            done = wait_for(lambda job_id=job_id: ended(api, job_id), timeout=90, message=job_id)
            assert done["status"] == "done", done
        submitted += wave
    yield sched
    for agent in made:
        agent.kill()


def cli(sched: SchedulerProcess, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), env={"SCHEDULER_URL": sched.url})


def test_a_replay_with_no_changes_reproduces_what_real_agents_did(ran: SchedulerProcess) -> None:
    since_us = history.jobs.parse_time(history_moment())
    past = history.read_database(ran.db_path, since_us)  # read-only, the daemon running
    assert len(past.jobs) == BURSTS * BURST
    assert {node.node_id: node.cpus for node in past.nodes} == {"wide": 2, "narrow": 1}
    assert past.queue_limits == {}
    setup = changes.as_it_was(past)
    outcome = replay.replay(past.jobs, setup)
    assert outcome.refused == {} and outcome.overfilled == 0
    tolerance = max(0.5, setup.claim_latency_us / 1e6)
    close = [
        job.job_id
        for job in past.jobs
        if abs(outcome.runs[job.seq].start - job.start) / 1e6 <= tolerance
    ]
    assert len(close) >= 0.95 * len(past.jobs), (len(close), tolerance)

    for source in (("--db", ran.db_path), ("--url", ran.url)):
        done = cli(ran, "simulate", *source, "--since", SINCE, "--json")
        assert done.exit_code == 0, done.output
        compared = json.loads(done.stdout)
        before, after = compared["history"], compared["what_if"]
        assert before["jobs"] == after["jobs"] == BURSTS * BURST, source
        assert _within(before["makespan_secs"], after["makespan_secs"], 0), source
        pairs = [(before["wait"], after["wait"])]
        pairs.append((before["queues"]["nightly"], after["queues"]["nightly"]))
        for group, other in pairs:
            for key in ("p50", "p95", "p99"):
                assert _within(group[key], other[key], tolerance), (source, key, group, other)


def _within(real: float, replayed: float, floor: float) -> bool:
    return abs(real - replayed) <= max(0.05 * max(abs(real), abs(replayed)), floor)


def history_moment() -> str:
    from tiny_scheduler.cli.history_command import moment

    return moment(SINCE)
