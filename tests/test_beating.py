"""The agent waiting for work in its heartbeat (`agent/beating.py`), as it does by default: a
real agent process beside a real daemon whose heartbeat period is a minute. A job submitted to
the idle node starts and ends well within that minute, so it was handed out by a woken
heartbeat, not found by a poll or a wait that ran out; the node's heartbeats go on meanwhile
(each renewed wait is a heartbeat), its jobs are fenced as before, and a drain reaches it."""

from __future__ import annotations

from pathlib import Path

from conftest import SchedulerFactory
from helpers import Api, expect_json, wait_for
from test_agent_process import AgentProcess, ended

PERIOD = 60
WOKEN_WITHIN = 20.0
ENV = {"REGISTRY_URL": "builtin", "NODE_HEARTBEAT_SECS": str(PERIOD), "MAX_JOB_RETRIES": "0"}


def test_jobs_start_as_soon_as_they_are_submitted(
    tmp_path: Path, scheduler_factory: SchedulerFactory
) -> None:
    sched = scheduler_factory(ENV)
    agent = AgentProcess(tmp_path, "w1", sched.url, "--slots", "2", waits=True).start()
    api = Api(sched.url)
    try:
        wait_for(
            lambda: expect_json(api.get("/nodes"), 200),
            message=agent.waiting("the agent's first heartbeat"),
        )
        for n in range(3):  # each one after the last ended: every time a renewed wait
            job = api.submit(command=f"echo {n}")
            done = wait_for(
                lambda j=job: ended(api, j["job_id"]),
                timeout=WOKEN_WITHIN,
                message=agent.waiting(f"job {n} to be handed out and run"),
            )
            assert (done["status"], done["stdout"]) == ("done", f"{n}\n")
        assert "waiting for work at" in agent.log()
        assert "polling" not in agent.log()
        expect_json(api.patch("/nodes/w1", {"drain": True}), 200)
        wait_for(
            lambda: "the scheduler drains this node" in agent.log(),
            timeout=WOKEN_WITHIN,
            message=agent.waiting("the drain to reach the agent"),
        )
    finally:
        api.close()
        agent.kill()
