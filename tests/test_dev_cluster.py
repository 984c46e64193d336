"""End to end through the dev cluster: real agent processes and the scheduler, its own node
registry (`REGISTRY_URL=builtin`: the nodes are the agents that heartbeat).

The agents are the production agent (`tiny-scheduler agent`), so these tests run jobs as
production does: poll, claim, `sh -c`, report. One agent is SIGKILLed to show a node failure
handled by the lost-node rule. Intervals are short (`ClusterConfig.quick`); every wait has a
deadline. Each test also checks that nothing it started outlives the cluster.
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
from typing import Any

import pytest
import requests
from helpers import Api, wait_for

from tiny_scheduler.agent.owner import JOB_PID, SPEC
from tiny_scheduler.dev import demo
from tiny_scheduler.dev.cluster import ClusterConfig, ClusterError, DevCluster
from tiny_scheduler.domain.jobs import FINAL_STATUSES

CLI = os.path.join(os.path.dirname(sys.executable), "tiny-scheduler")
"""The installed command, as a user runs it."""

SCHEDULER_ENV = {
    # The documented defaults, whatever the developer's shell holds; peers off.
    "MAX_JOB_RETRIES": "1",
    "MAX_JOBS_PER_NODE": "1",
    "JOB_RETENTION_SECS": "0",
    "SQS_URL": "",
    "SNS_URL": "",
}


def processes_using(folder: pathlib.Path, cwd_only: bool = False) -> list[int]:
    """Live processes (other than this one) whose command line, working directory or
    environment mentions `folder`: agents, their jobs, and the scheduler (its SCHEDULER_DB).
    With `cwd_only`, only those working in it: jobs, which run in scratch dirs there."""
    needle = str(folder).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().split(b")")[-1].split()[0] == b"Z":
                    continue  # a zombie is dead; its parent just has not reaped it yet
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            cwd = os.readlink(f"/proc/{entry}/cwd").encode()
        except OSError:
            continue  # gone meanwhile, or not ours
        if cwd.startswith(needle) or (not cwd_only and (needle in cmdline or needle in environ)):
            found.append(int(entry))
    return found


def final_jobs(api: Api, job_ids: list[str]) -> list[dict[str, Any]] | None:
    jobs = [api.job(job_id) for job_id in job_ids]
    return jobs if all(job["status"] in FINAL_STATUSES for job in jobs) else None


def test_cluster_runs_50_jobs_and_survives_a_killed_node(tmp_path: pathlib.Path) -> None:
    work = tmp_path / "cluster"
    # Round robin: below, jobs must queue on the node that dies. Least-loaded placement puts
    # them there only while the other nodes' agents are slower to run jobs than the test is
    # to submit them, which a busy machine can turn around.
    env = {**SCHEDULER_ENV, "PLACEMENT": "round-robin"}
    # Heartbeats every second (healthy for 3 s): the quick 0.3 s let a loaded CI machine see
    # two nodes unhealthy at once, and a retry then went back to the only healthy node, the
    # one it had failed on (placement's documented fallback), which the checks below refuse.
    config = ClusterConfig.quick(
        agents=3, work_dir=str(work), scheduler_env=env, heartbeat_secs=1.0
    )
    with DevCluster(config) as cluster:
        api = Api(cluster.scheduler_url)

        # --- 50 jobs: successes, failures, env vars, output on both streams ----------------
        expected: dict[str, dict[str, Any]] = {}
        for i in range(50):
            kind = i % 5
            if kind == 0:
                body = {"command": f"echo out-{i}"}
                want = {"status": "done", "exit_code": 0, "stdout": f"out-{i}\n"}
            elif kind == 1:
                code = i % 7 + 1
                body = {"command": f"echo err-{i} >&2; exit {code}"}
                want = {"status": "failed", "exit_code": code, "stderr": f"err-{i}\n"}
            elif kind == 2:
                body = {
                    "command": 'printf "%s|%s" "$A" "$B"',
                    "env_vars": {"A": f"a-{i}", "B": "two words"},
                }
                want = {"status": "done", "exit_code": 0, "stdout": f"a-{i}|two words"}
            elif kind == 3:
                # What a job leaves running in the background dies with it.
                body = {"command": f"echo o-{i}; echo e-{i} >&2; sleep 60 >/dev/null 2>&1 &"}
                want = {"status": "done", "stdout": f"o-{i}\n", "stderr": f"e-{i}\n"}
            else:
                # The job prints the node it ran on: it must be the node it was assigned.
                body = {"command": 'printf "%s" "$TINY_NODE_ID"'}
                want = {"status": "done", "exit_code": 0}
            job = api.submit(**body)
            expected[job["job_id"]] = want

        jobs = wait_for(
            lambda: final_jobs(api, list(expected)), timeout=60, message="50 jobs to finish"
        )
        for job in jobs:
            want = expected[job["job_id"]]
            assert {name: job.get(name) for name in want} == want, job
            if "TINY_NODE_ID" in job["command"]:
                assert job["stdout"] == job["node_id"]
            if job["status"] == "failed":
                # Retried once, on another node, with the same outcome.
                (attempt,) = job["attempts"]
                assert attempt["exit_code"] == job["exit_code"]
                assert attempt["stderr"] == job["stderr"]
                assert attempt["node_id"] != job["node_id"]
            else:
                assert job["retry_count"] == 0
        assert {job["node_id"] for job in jobs} == set(cluster.node_ids)
        wait_for(
            lambda: processes_using(work, cwd_only=True) == [],
            message=lambda: f"jobs' leftovers to go: {processes_using(work, cwd_only=True)}",
        )

        # --- a node dies with a job running and two queued behind it ----------------------
        mark = tmp_path / "ran-once"
        stuck = api.submit(
            command=(
                f'if [ -e {shlex.quote(str(mark))} ]; then echo "rerun on $TINY_NODE_ID"; '
                f"else touch {shlex.quote(str(mark))}; sleep 60; fi"
            )
        )
        running = wait_for(
            lambda: api.job(stuck["job_id"])["status"] == "running" and api.job(stuck["job_id"]),
            message="the first job to run",
        )
        victim = running["node_id"]
        # Claimed ("running") comes before its command starts: wait until it has left its mark,
        # or a node killed in between never ran it and its rerun takes the other branch.
        wait_for(mark.exists, timeout=30, message="the first job's command to start")
        # Round robin spreads submissions, so a few land on the victim; they wait there,
        # its one slot being taken.
        queued: list[dict[str, Any]] = []
        others: list[dict[str, Any]] = []
        for _ in range(3 * len(cluster.node_ids)):
            job = api.submit(command='echo "queued, ran on $TINY_NODE_ID"')
            (queued if job["node_id"] == victim else others).append(job)
            if len(queued) == 2:
                break
        assert len(queued) == 2, "round robin never placed a job on the victim"
        assert all(api.job(job["job_id"])["status"] == "pending" for job in queued)

        cluster.kill_agent(victim)

        ids = [stuck["job_id"], *(job["job_id"] for job in queued + others)]
        # The dead node's job is given up only once its fence has passed (its owner stops it
        # there) and the node counts as lost: generous, for a loaded machine.
        finished = wait_for(lambda: final_jobs(api, ids), timeout=90, message="jobs of the node")
        rerun, *rest = finished
        assert rerun["status"] == "done", rerun
        (lost,) = rerun["attempts"]
        assert (lost["node_id"], lost["exit_code"], lost["stderr"]) == (victim, -1, "node lost")
        assert rerun["node_id"] != victim
        assert rerun["stdout"] == f"rerun on {rerun['node_id']}\n"
        for job in rest:
            assert job["status"] == "done", job
            assert job["node_id"] != victim and job["retry_count"] == 0, job
            assert job["stdout"] == f"queued, ran on {job['node_id']}\n"

        # The dead node's job went down with it: nothing runs in its work dir any more.
        assert cluster.agents[victim].proc.poll() is not None
        assert processes_using(work / victim) == []
        api.close()

    assert processes_using(work) == [], "the cluster left processes behind"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_dev_command_leaves_no_process_behind(
    tmp_path: pathlib.Path, sig: int, unused_port: int
) -> None:
    """SIGTERM: a clean stop. SIGKILL: no chance to clean up, so the watchdog must."""
    work = tmp_path / "dev"
    port = unused_port
    url = f"http://127.0.0.1:{port}"
    dev = subprocess.Popen(
        [CLI, "dev", "--quick", "--agents", "2", "--port", str(port), "--work-dir", str(work)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TINYAWS_API_KEY": "", **SCHEDULER_ENV},
        start_new_session=True,
    )
    try:
        # The banner comes once the whole cluster has started (the scheduler takes jobs before
        # its agents run): what is tested is the stop of a started cluster. Should the banner
        # never come, pytest-timeout ends the test.
        assert dev.stdout is not None
        banner = dev.stdout.readline()
        assert banner.startswith(f"scheduler  {url}".encode()), banner
        api = Api(url)
        # A running service and a running job each have processes of their own.
        service = api.submit(command="sleep 60", job_type="service")["job_id"]
        job = api.submit(command="sleep 60")["job_id"]
        # Claimed ("running") comes before the agent starts the command and records its
        # process group: wait for the records, or a busy machine may stop the cluster first.
        wait_for(
            lambda: recorded_jobs(work) == {service, job},
            message=lambda: f"the agents to record their jobs' processes ({recorded_jobs(work)})",
        )
        api.close()
        dev.send_signal(sig)
        _, err = dev.communicate(timeout=30)
    finally:
        if dev.poll() is None:
            os.killpg(dev.pid, signal.SIGKILL)
            dev.wait()
    if sig == signal.SIGTERM:
        assert dev.returncode == 0, err
        assert b"stopped." in err
        assert processes_using(work) == [], "tiny-scheduler dev left processes behind"
    else:
        wait_for(
            lambda: processes_using(work) == [],
            timeout=60,  # a loaded machine: the watchdog's turn, then the kills, take a while
            message=lambda: f"the watchdog to kill {processes_using(work)}",
        )


def recorded_jobs(work: pathlib.Path) -> set[str]:
    """The jobs whose processes the agents of the dev cluster in `work` have recorded (each
    job's folder names its process, `job.pid`, and its owner): what its watchdog kills should
    the cluster die."""
    return {
        json.loads((record.parent / SPEC).read_text())["job_id"]
        for record in work.glob(f"*/jobs/*/{JOB_PID}")
    }


def test_a_start_that_fails_halfway_leaves_nothing_running(tmp_path: pathlib.Path) -> None:
    work = tmp_path / "broken"
    # The (dev) registry and the scheduler start; the scheduler then refuses its configuration.
    config = ClusterConfig.quick(
        agents=2,
        work_dir=str(work),
        scheduler_env={"MAX_JOBS_PER_NODE": "abc"},
        dev_registry=True,
    )
    cluster = DevCluster(config)
    with pytest.raises(ClusterError, match="scheduler did not start"):
        cluster.start()
    assert cluster.registry is not None
    with pytest.raises(requests.ConnectionError):
        requests.get(cluster.registry.url + "/health", timeout=2)
    assert processes_using(work) == []


def test_a_busy_scheduler_port_is_refused_before_anything_starts(tmp_path: pathlib.Path) -> None:
    with DevCluster(ClusterConfig.quick(agents=1, work_dir=str(tmp_path / "a"))) as first:
        port = int(first.scheduler_url.rsplit(":", 1)[1])
        second = DevCluster(
            ClusterConfig.quick(agents=1, scheduler_port=port, work_dir=str(tmp_path / "b"))
        )
        with pytest.raises(ClusterError, match=f"port {port} is already in use"):
            second.start()
        assert second.agents == {}
    assert processes_using(tmp_path) == []


def test_the_demo_ends_as_expected(capsys: pytest.CaptureFixture[str]) -> None:
    """`make demo` is the first thing a newcomer runs: it must work, and say so."""
    assert demo.main() == 0
    out = capsys.readouterr().out
    summary = out[out.index("\nsummary\n") :]
    shows = ("success", "env vars", "retried elsewhere", "failure", "service", "cancel", "timeout")
    for label in shows:
        assert label in summary
    assert "UNEXPECTED" not in summary
