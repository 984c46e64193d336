"""What a job needs, on the node (issue 34): real agents as real processes, against a real
scheduler (`REGISTRY_URL=builtin`: the agents are the nodes), and the machine's own control
groups.

- the heartbeat carries the node's capacity, labels and enforcement (seen by a stand-in
  scheduler that records what it is sent, and by the real one's `GET /nodes`);
- a job over its `memory_mb` ends `out_of_memory` (also when the agent that started it is
  gone and a new one took it back), a `kill -9` of a job is an ordinary failure, and the job's
  group holds its limit and is gone once it ended;
- a 1-CPU job's quota holds against a busy loop of two processes, which gets two CPUs without;
- two GPU jobs on a `--gpus 2` node get distinct `CUDA_VISIBLE_DEVICES`, a third waits until
  one ends and gets the one that ended's;
- every final report carries `usage`, with and without control groups: done, failed, timed
  out, cancelled, taken back after a restart.

The tests that need a writable cgroup hierarchy are skipped, with one line saying so, where
the machine has none (the agent then says `enforcement: none`). The pure rules are in
tests/test_agent_cgroups.py and tests/test_agent_resources.py.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import SchedulerFactory
from helpers import Api, expect_json, wait_for
from test_agent_owner import start_node
from test_agent_process import AgentProcess, ended, start_agent, status_is, waits_for

from tiny_scheduler.agent import cgroups, resources
from tiny_scheduler.dev.daemon import SchedulerProcess

ENV = {
    "REGISTRY_URL": "builtin",
    "MAX_JOBS_PER_NODE": "auto",  # a node runs as many `run` jobs as its agent has slots
    "MAX_JOB_RETRIES": "0",
    "NODE_HEARTBEAT_SECS": "0.5",
    "TIMEOUT_SCAN_INTERVAL_SECS": "3600",
}

ENFORCED, WHY_NOT = cgroups.detect("tiny-scheduler.test-probe")
"""What this machine lets an agent enforce (the agent finds the same at its start)."""

needs_cgroups = pytest.mark.skipif(
    ENFORCED is None, reason=f"no writable cgroup hierarchy here ({WHY_NOT})"
)

PYTHON = shlex.quote(sys.executable)


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    """The agents a test started; killed with their jobs when it ends, and then no control
    group of theirs is left on the machine."""
    made: list[AgentProcess] = []
    yield made
    for agent in made:
        agent.kill()
    if ENFORCED is not None:
        ids = {
            (a.work_dir / "agent_id").read_text()
            for a in made
            if (a.work_dir / "agent_id").exists()
        }
        left = [
            entry
            for _, base in ENFORCED.bases
            for entry in os.listdir(base)
            if any(entry.startswith(f"tiny-scheduler.{agent_id}.") for agent_id in ids)
        ]
        assert left == [], "the jobs' control groups are left behind"


@pytest.fixture
def sched(scheduler_factory: SchedulerFactory) -> SchedulerProcess:
    return scheduler_factory(env=ENV)


def final(api: Api, job_id: str, agent: AgentProcess, timeout: float = 30) -> dict[str, Any]:
    return wait_for(
        lambda: ended(api, job_id), timeout=timeout, message=agent.waiting(f"{job_id} to end")
    )


def job_group(pid: int, controller: str) -> Path:
    """The folder of the control group process `pid` is in, for `controller` (v1), or its
    unified group (v2)."""
    mounts = cgroups.parse_mounts(Path("/proc/mounts").read_text())
    own = cgroups.parse_own_groups(Path(f"/proc/{pid}/cgroup").read_text())
    assert ENFORCED is not None
    if ENFORCED.version == cgroups.V2:
        mount = next(m for m in mounts if m.fstype == "cgroup2")
        return Path(mount.path) / own[""].lstrip("/")
    mount = next(m for m in mounts if m.fstype == "cgroup" and controller in m.options)
    return Path(mount.path) / own[controller].lstrip("/")


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def read_pid(path: Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text.isdigit() else None


# --- the heartbeat ------------------------------------------------------------------------


class RecordingScheduler:
    """A stand-in scheduler on loopback: answers heartbeats and polls (no work), and keeps
    every heartbeat body it was sent."""

    def __init__(self) -> None:
        beats: list[dict[str, Any]] = []
        self.beats = beats

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                beats.append(json.loads(body))
                self._answer({"node_id": "x", "heartbeat_secs": 0.2, "drain": False, "stop": []})

            def do_GET(self) -> None:
                self._answer([])

            def _answer(self, value: Any) -> None:
                data = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # an agent killed mid-call: nothing to say

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder() -> Iterator[RecordingScheduler]:
    made = RecordingScheduler()
    yield made
    made.close()


def test_the_heartbeat_carries_capacity_labels_and_enforcement(
    tmp_path: Path, recorder: RecordingScheduler, agents: list[AgentProcess]
) -> None:
    agent = start_agent(agents, tmp_path, "plain", recorder.url, "--slots", "3")
    wait_for(lambda: recorder.beats, message=agent.waiting("a heartbeat"))
    beat = recorder.beats[-1]
    assert (beat["cpu_count"], beat["gpus"]) == (3, resources.detect_gpus())
    assert beat["memory_mb"] == resources.detect_memory_mb() > 0
    assert beat["enforcement"] == (ENFORCED.version if ENFORCED else cgroups.NONE)
    assert "labels" not in beat
    agent.kill()
    recorder.beats.clear()
    options = ("--gpus", "2", "--memory-mb", "4096", "--label", "gpu=a100", "--label", "zone=b")
    agent = start_agent(agents, tmp_path, "told", recorder.url, *options, "--enforcement", "none")
    wait_for(lambda: recorder.beats, message=agent.waiting("a heartbeat"))
    beat = recorder.beats[-1]
    assert (beat["memory_mb"], beat["gpus"], beat["enforcement"]) == (4096, 2, "none")
    assert beat["labels"] == {"gpu": "a100", "zone": "b"}


def test_the_scheduler_lists_the_agents_labels(
    tmp_path: Path, sched: SchedulerProcess, agents: list[AgentProcess]
) -> None:
    start_node(agents, tmp_path, "labelled", sched.url, "--label", "disk=ssd", "--slots", "2")
    api = Api(sched.url)
    listed = next(n for n in expect_json(api.get("/nodes"), 200) if n["node_id"] == "labelled")
    assert (listed["labels"], listed["cpu_count"]) == ({"disk": "ssd"}, 2)
    api.close()


def test_a_bad_label_is_refused_before_the_agent_starts(tmp_path: Path) -> None:
    import subprocess

    from test_agent_process import CLI

    out = subprocess.run(
        [
            CLI,
            "--url",
            "http://127.0.0.1:9",
            "agent",
            "--label",
            "nokey",
            "--work-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1 and "--label: 'nokey' is not KEY=VALUE" in out.stderr, out


# --- memory ---------------------------------------------------------------------------------


@needs_cgroups
def test_a_job_over_its_memory_ends_out_of_memory_and_a_kill_9_does_not(
    tmp_path: Path, sched: SchedulerProcess, agents: list[AgentProcess]
) -> None:
    agent = start_node(agents, tmp_path, "mem", sched.url)
    api = Api(sched.url)
    # 512 MiB written (touched, not only reserved) under a 64 MiB limit.
    hungry = api.submit(command=f"{PYTHON} -c 'x = b\"x\" * (512 << 20)'", memory_mb=64)
    done = final(api, hungry["job_id"], agent)
    assert (done["status"], done["reason"]) == ("failed", "out_of_memory"), done
    assert done["stderr"].endswith("job killed: out of memory")
    assert done["usage"]["max_rss_mb"] <= 64.5, done["usage"]  # the group's peak: its limit

    pid_file = tmp_path / "victim.pid"
    victim = api.submit(
        command=f"echo $$ > {shlex.quote(str(pid_file))}; exec sleep 600", memory_mb=64
    )
    pid = wait_for(lambda: read_pid(pid_file), message=agent.waiting("the job to start"))
    group = job_group(pid, "memory")
    assert group.name.startswith("tiny-scheduler.")
    limit = "memory.max" if ENFORCED and ENFORCED.version == cgroups.V2 else "memory.limit_in_bytes"
    assert int((group / limit).read_text()) == 64 << 20
    os.kill(pid, signal.SIGKILL)  # a person's kill -9
    done = final(api, victim["job_id"], agent)
    assert (done["status"], done["exit_code"]) == ("failed", 137), done
    assert done.get("reason") != "out_of_memory"
    assert "usage" in done
    wait_for(lambda: not group.exists(), message="the job's group to be removed")
    api.close()


@needs_cgroups
def test_a_job_taken_back_after_a_restart_keeps_its_group_and_its_oom_is_seen(
    tmp_path: Path, sched: SchedulerProcess, agents: list[AgentProcess]
) -> None:
    agent = start_node(agents, tmp_path, "back", sched.url)
    api = Api(sched.url)
    started, go = tmp_path / "started", tmp_path / "go"
    command = f"echo $$ > {shlex.quote(str(started))}; " + waits_for(
        go, f"{PYTHON} -c 'x = b\"x\" * (512 << 20)'"
    )
    job = api.submit(command=command, memory_mb=64)
    pid = wait_for(lambda: read_pid(started), message=agent.waiting("the job to start"))
    group = job_group(pid, "memory")
    os.kill(agent.pid, signal.SIGKILL)  # the agent alone, as a crash would
    agent.wait_exit()
    again = start_node(agents, tmp_path, "back", sched.url)
    wait_for(lambda: "took back 1 jobs" in again.log(), message=again.waiting("the take-back"))
    assert job_group(pid, "memory") == group  # the job is where it was
    go.touch()
    done = final(api, job["job_id"], agents[-1])
    assert (done["status"], done["reason"]) == ("failed", "out_of_memory"), done
    assert "usage" in done
    api.close()


@needs_cgroups
def test_killing_an_agent_with_its_jobs_removes_their_groups_too(
    tmp_path: Path, sched: SchedulerProcess, agents: list[AgentProcess]
) -> None:
    # As a test's end and the dev cluster's stop do: the owner dies by SIGKILL, so the one
    # who kills it removes the job's group (and a process that left the job's session).
    agent = start_node(agents, tmp_path, "killed", sched.url)
    api = Api(sched.url)
    pid_file = tmp_path / "escaped.pid"
    api.submit(command=f"setsid sleep 600 & echo $! > {shlex.quote(str(pid_file))}; wait", cpus=1)
    pid = wait_for(lambda: read_pid(pid_file), message=agent.waiting("the job to start"))
    group = job_group(pid, "memory")
    agent.kill()
    assert not group.exists()
    assert not running(pid), "the process that left the job's session outlived its group"
    api.close()


# --- CPUs ---------------------------------------------------------------------------------


def busy_loops(pids: Path) -> str:
    """A job of two busy processes, which writes their pids to `pids` and runs until stopped."""
    loop = "sh -c 'while :; do :; done'"
    return f"{loop} & a=$!; {loop} & b=$!; echo $a $b > {shlex.quote(str(pids))}; wait"


def cpu_rate(pids: list[int], seconds: float = 3.0) -> float:
    """CPU seconds per wall second the processes used over `seconds` (the measuring window)."""

    def used() -> float:
        total = 0
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / os.sysconf("SC_CLK_TCK")

    before, start = used(), time.monotonic()
    time.sleep(seconds)  # the window the rate is measured over, not a wait for anything
    return (used() - before) / (time.monotonic() - start)


def first_on_the_machine(pid: int) -> None:
    """Give the job's group the machine's CPUs before anyone else's (the highest weight), so
    that what other work runs beside the test does not hold it back: only its quota may."""
    group = job_group(pid, "cpu")
    assert ENFORCED is not None
    if ENFORCED.version == cgroups.V2:
        (group / "cpu.weight").write_text("10000")
    else:
        (group / "cpu.shares").write_text("262144")


@needs_cgroups
def test_a_one_cpu_jobs_quota_holds_and_without_one_it_gets_both_cpus(
    tmp_path: Path, sched: SchedulerProcess, agents: list[AgentProcess]
) -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU here: a job without a quota could not show more than one")
    agent = start_node(agents, tmp_path, "cpu", sched.url, "--slots", "2")
    api = Api(sched.url)
    rates = {}
    for cpus in (1, 0):
        pid_file = tmp_path / f"pids-{cpus}"
        fields = {"cpus": cpus} if cpus else {}
        job = api.submit(command=busy_loops(pid_file), **fields)
        text = wait_for(
            lambda p=pid_file: p.exists() and p.read_text().strip(),
            message=agent.waiting("the busy loops"),
        )
        pids = [int(p) for p in text.split()]
        first_on_the_machine(pids[0])
        rates[cpus] = cpu_rate(pids)
        assert api.post(f"/jobs/{job['job_id']}/cancel").status_code == 200
        wait_for(
            lambda j=job: f"{j['job_id']} reported" in agent.log(),
            message=agent.waiting("the cancelled job's report"),
        )
        assert "usage" in api.job(job["job_id"])  # a cancelled job's too
    print(f"CPU seconds per second: {rates[1]:.2f} with cpus=1, {rates[0]:.2f} without")
    assert rates[1] <= 1.15
    assert rates[0] >= 1.6
    api.close()


# --- GPUs ---------------------------------------------------------------------------------


def test_gpu_jobs_get_distinct_devices_and_a_third_waits_for_one(
    tmp_path: Path, sched: SchedulerProcess, agents: list[AgentProcess]
) -> None:
    agent = start_node(agents, tmp_path, "gpu", sched.url, "--gpus", "2", "--slots", "3")
    api = Api(sched.url)

    def gpu_job(n: int) -> dict[str, Any]:
        seen = shlex.quote(str(tmp_path / f"seen-{n}"))
        said = 'echo "$CUDA_VISIBLE_DEVICES $TINY_GPUS $TINY_CPUS $TINY_MEMORY_MB"'
        return api.submit(
            command=f"{said} > {seen}.tmp; mv {seen}.tmp {seen}; "
            + waits_for(tmp_path / f"go-{n}"),
            gpus=1,
            memory_mb=100,
        )

    def seen(n: int) -> list[str] | None:
        path = tmp_path / f"seen-{n}"
        return path.read_text().split() if path.exists() else None

    jobs = [gpu_job(n) for n in (1, 2)]
    first, second = (
        wait_for(lambda n=n: seen(n), message=agent.waiting("the GPU jobs")) for n in (1, 2)
    )
    assert {first[0], second[0]} == {"0", "1"}
    assert first[1:] == second[1:] == ["1", "1", "100"]
    third = gpu_job(3)

    def left_waiting() -> bool:
        # The agent leaves it pending (a scheduler that counts GPUs does not even offer it).
        job = api.job(third["job_id"])
        told = f"{third['job_id']} does not fit now (needs 1 gpus (0 free))" in agent.log()
        return job["status"] == "pending" and (told or "gpu" in job.get("waiting_for", ""))

    wait_for(left_waiting, message=agent.waiting("the third GPU job to be left waiting"))
    assert seen(3) is None
    (tmp_path / "go-1").touch()
    assert final(api, jobs[0]["job_id"], agent)["status"] == "done"
    assert wait_for(lambda: seen(3), message=agent.waiting("the third job"))[0] == first[0]
    for n in (2, 3):
        (tmp_path / f"go-{n}").touch()
    for job in (jobs[1], third):
        assert final(api, job["job_id"], agent)["status"] == "done"
    api.close()


# --- usage --------------------------------------------------------------------------------


@pytest.mark.parametrize("enforcement", ["auto", "none"])
def test_every_final_report_carries_usage(
    tmp_path: Path, sched: SchedulerProcess, agents: list[AgentProcess], enforcement: str
) -> None:
    node = f"usage-{enforcement}"
    options = ("--enforcement", enforcement, "--kill-grace-secs", "1", "--slots", "8")
    agent = start_node(agents, tmp_path, node, sched.url, *options)
    api = Api(sched.url)
    burn = f"{PYTHON} -c 'sum(range(3 * 10**7))'"
    done = api.submit(command=f"{burn}; echo done")
    failed = api.submit(command="exit 3")
    timed_out = api.submit(command="sleep 30", timeout_secs=1)
    cancelled = api.submit(command="sleep 30")
    started = tmp_path / "started"
    taken_back = api.submit(
        command=f"touch {shlex.quote(str(started))}; " + waits_for(tmp_path / "go", "echo back")
    )
    wait_for(lambda: status_is(api, cancelled["job_id"], "running"), message="the job to run")
    assert api.post(f"/jobs/{cancelled['job_id']}/cancel").status_code == 200
    # Its owner runs it: the next agent takes it back (killed before, it would be lost).
    wait_for(started.exists, message=agent.waiting("the job to start"))
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait_exit()
    agent = start_node(agents, tmp_path, node, sched.url, *options)
    wait_for(lambda: "took back" in agent.log(), message=agent.waiting("the take-back"))
    (tmp_path / "go").touch()
    shown = {}
    for job in (done, failed, timed_out, taken_back):
        shown[job["job_id"]] = final(api, job["job_id"], agent)
    wait_for(
        lambda: "usage" in api.job(cancelled["job_id"]), message=agent.waiting("the late report")
    )
    usages = {job_id: job["usage"] for job_id, job in shown.items()}
    print(enforcement, usages)
    for usage in usages.values():
        assert set(usage) == {"cpu_secs", "max_rss_mb", "wall_secs"}
    assert shown[timed_out["job_id"]]["reason"] == "timeout"
    assert usages[done["job_id"]]["cpu_secs"] > 0.2  # the burn, from the group or the rusage
    assert usages[done["job_id"]]["max_rss_mb"] > 1
    assert usages[timed_out["job_id"]]["wall_secs"] >= 1
    api.close()
