"""The deployment files in deploy/, run as systemd would run them: the scheduler's unit with
the example settings file, and an agent's unit beside it, make a working cluster with auth on
and the built-in node list (what docs/operations.md's "Running a cluster" walks through)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DEPLOY, Api, expect_json, unit_settings, wait_for

CLI = str(Path(sys.executable).with_name("tiny-scheduler"))


def env_file(name: str) -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in (DEPLOY / name).read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    return {key: value for key, value in pairs}


def start(name: str, state: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Run a unit's ExecStart as systemd would (the package's own CLI in this venv)."""
    settings, unit_env = unit_settings(name)
    command = settings["ExecStart"].replace("${STATE_DIRECTORY}", str(state))
    program, *args = shlex.split(command)
    assert program.startswith("/opt/tiny-scheduler/") and program.endswith("/bin/tiny-scheduler")
    assert settings["Restart"] == "on-failure" and settings["User"] == "tiny-scheduler"
    with open(log, "wb") as out:
        return subprocess.Popen(
            [CLI, *args],
            env={**os.environ, **unit_env, **env},
            cwd=state,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


@pytest.mark.timeout(180)
def test_the_units_make_a_cluster_with_auth_and_the_builtin_node_list(
    tmp_path: Path, unused_port: int
) -> None:
    settings, _ = unit_settings("tiny-scheduler.service")
    assert settings["KillMode"] == "mixed" and "StateDirectory" in settings
    port = unused_port  # held for this test until the scheduler listens on it
    scheduler_state, agent_state = tmp_path / "scheduler", tmp_path / "agent"
    scheduler_state.mkdir()
    agent_state.mkdir()
    key = "test-key"
    scheduler_env = {
        **env_file("scheduler.env.example"),
        "TINYAWS_API_KEY": key,
        # Where systemd's StateDirectory would be; the port the test can use.
        "SCHEDULER_DB": str(scheduler_state / "scheduler.db"),
        "SCHEDULER_BIND": f"127.0.0.1:{port}",
        "NODE_HEARTBEAT_SECS": "1",
    }
    url = f"http://127.0.0.1:{port}"
    # The agent holds its node's own token (the example's AGENT_TOKEN_FILE), not the key.
    token_file = tmp_path / "agent.token"
    agent_env = {
        **env_file("agent.env.example"),
        "SCHEDULER_URL": url,
        "AGENT_TOKEN_FILE": str(token_file),
        "AGENT_NODE_ID": "node-1",
        "AGENT_POLL_SECS": "0.2",
    }
    scheduler = start("tiny-scheduler.service", scheduler_state, scheduler_env, tmp_path / "s.log")
    agent = None
    api = Api(url, key=key)
    try:
        wait_for(lambda: _healthy(api), message=lambda: (tmp_path / "s.log").read_text())
        made = api.post("/tokens", {"user": "agent-node-1", "role": "agent", "node_id": "node-1"})
        token_file.write_text(expect_json(made, 201)["token"] + "\n")
        agent = start("tiny-scheduler-agent.service", agent_state, agent_env, tmp_path / "a.log")
        nodes = wait_for(
            lambda: expect_json(api.get("/nodes"), 200) or None,
            message=lambda: (tmp_path / "a.log").read_text(),
        )
        assert [(node["node_id"], node["health"]) for node in nodes] == [("node-1", "healthy")]
        # Auth is on and agents are not exempt (the example's AUTH_AGENT_EXEMPT=0): a keyless
        # poll is refused, and the agent's own calls carry its node's token, not the key.
        assert (
            Api(url).get("/jobs", params={"node_id": "x", "status": "pending"}).status_code == 401
        )
        job = api.submit(command="echo deployed")
        done = wait_for(lambda: _ended(api, job["job_id"]), message=lambda: "job to end")
        assert (done["status"], done["stdout"]) == ("done", "deployed\n")
        drained = expect_json(api.patch("/nodes/node-1", {"drain": True}), 200)
        assert drained["drain"] is True
        assert stop(agent) == 0
        agent = None
        assert stop(scheduler) == 0
    finally:
        api.close()
        for proc in (agent, scheduler):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _healthy(api: Api) -> bool:
    try:
        return api.get("/health").status_code == 200
    except OSError:
        return False


def _ended(api: Api, job_id: str) -> dict | None:
    job = api.job(job_id)
    return job if job["status"] in ("done", "failed") else None
