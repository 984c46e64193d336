"""One copy at a time (issue 31), with real agents, real job owners and a real scheduler: a job
outlives its agent and is taken back by the next one; a node whose agent is dead, frozen or cut
off stops its own jobs at the fence before the scheduler runs them elsewhere; the agent's own
timeout; the spool that cannot fail silently; one agent per node id; a reused pid left alone.

Every job carries a unique mark in its command line, and a sampler looks at every process on
the machine every 0.2 s: at no sample may two processes carry the mark (only the job's `sh -c`
has the command line: its owner's argv names a folder). The pure rules are in test_fencing.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SchedulerFactory
from helpers import Api, expect_json, wait_for
from pg_proxy import SilentProxy
from test_agent_process import AgentProcess, ended, start_agent, status_is

from tiny_scheduler.agent import owner, spool
from tiny_scheduler.agent.config import AgentConfig
from tiny_scheduler.agent.main import Agent

# Auto fence: NODE_LOST_SECS 4 less two periods of 0.5 s and a second is 2 s, below the 5 s
# floor: the fence is 5 s, and the scheduler waits 5 s + two periods before it gives up a job.
FENCED_ENV = {
    "REGISTRY_URL": "builtin",
    "NODE_HEARTBEAT_SECS": "0.5",
    "NODE_LOST_SECS": "4",
    "TIMEOUT_SCAN_INTERVAL_SECS": "0.25",
    "MAX_JOB_RETRIES": "1",
    "MAX_JOBS_PER_NODE": "4",
}
FENCE_SECS = 5.0


class Copies:
    """Counts, every 0.2 s, the processes whose command line carries `mark`."""

    def __init__(self, mark: str) -> None:
        self.mark = mark.encode()
        self.samples: list[tuple[float, list[int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.samples.append((time.monotonic(), self.now()))

    def now(self) -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_bytes()
                if stat.rsplit(b")", 1)[-1].split()[0] == b"Z":
                    continue
                if self.mark in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
        return found

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def most(self) -> int:
        return max((len(pids) for _, pids in self.samples), default=0)

    def first_time(self, predicate) -> float | None:  # type: ignore[no-untyped-def]
        return next((at for at, pids in self.samples if predicate(pids)), None)


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    made: list[AgentProcess] = []
    yield made
    for agent in made:
        if agent.proc is not None and agent.proc.poll() is None:
            os.kill(agent.proc.pid, signal.SIGCONT)
        agent.kill()


def start_node(
    agents: list[AgentProcess], folder: Path, node: str, url: str, *options: str
) -> AgentProcess:
    """An agent of `node`, once the scheduler (REGISTRY_URL=builtin) lists its node healthy."""
    agent = start_agent(agents, folder, node, url, *options)
    api = Api(url)

    def healthy() -> bool:
        reply = api.get(f"/nodes/{node}")
        return reply.status_code == 200 and reply.json()["health"] == "healthy"

    try:
        wait_for(healthy, timeout=30, message=agent.waiting(f"{node} to be healthy"))
    finally:
        api.close()
    return agent


def marked(seconds: float, mark: str) -> str:
    """A job that prints, sleeps and prints its mark at the end."""
    return f"echo start; sleep {seconds}; echo {mark}"


def test_a_restarted_agent_takes_its_running_job_back(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    restart_case(tmp_path, scheduler_factory, agents)


def restart_case(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    sched = scheduler_factory(FENCED_ENV)
    api = Api(sched.url)
    agent = start_node(agents, tmp_path, "node-a", sched.url)
    mark = f"MARK{uuid.uuid4().hex}"
    copies = Copies(mark)
    try:
        job = api.submit(command=marked(4, mark))
        wait_for(lambda: copies.now(), message=agent.waiting("the job to start"))
        os.kill(agent.pid, signal.SIGKILL)  # the agent alone, as a crash would
        agent.wait_exit()
        assert len(copies.now()) == 1, "the job outlived its agent"
        start_node(agents, tmp_path, "node-a", sched.url)
        done = wait_for(lambda: ended(api, job["job_id"]), timeout=60, message="the job's end")
    finally:
        copies.stop()
    assert (done["status"], done["retry_count"]) == ("done", 0), done
    assert done["stdout"] == f"start\n{mark}\n"
    assert copies.most() == 1
    api.close()


def test_a_dead_agents_job_stops_at_the_fence_before_it_runs_elsewhere(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    dead_agent_case(tmp_path, scheduler_factory, agents)


# `make soak`: the two SIGKILL cases again and again (make test runs each once).
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("round_", range(20))
@pytest.mark.parametrize("case", ["restart", "dead-agent"])
def test_soak_sigkilled_agents_never_run_a_job_twice(
    case: str,
    round_: int,
    tmp_path: Path,
    scheduler_factory: SchedulerFactory,
    agents: list[AgentProcess],
) -> None:
    run = restart_case if case == "restart" else dead_agent_case
    run(tmp_path, scheduler_factory, agents)


def dead_agent_case(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    sched = scheduler_factory(FENCED_ENV)
    api = Api(sched.url)
    agent_a = start_node(agents, tmp_path, "node-a", sched.url)
    mark = f"MARK{uuid.uuid4().hex}"
    copies = Copies(mark)
    try:
        job = api.submit(command=marked(12, mark))
        wait_for(lambda: copies.now(), message=agent_a.waiting("the job to start"))
        first = copies.now()
        start_node(agents, tmp_path, "node-b", sched.url)
        wait_for(
            lambda: api.get(f"/jobs/{job['job_id']}/output").content == b"start\n",
            message=agent_a.waiting("the job's first line, sent live"),
        )
        os.kill(agent_a.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        agent_a.wait_exit()
        wait_for(lambda: not set(first) & set(copies.now()), timeout=FENCE_SECS + 10)
        stopped_after = time.monotonic() - killed_at
        done = wait_for(lambda: ended(api, job["job_id"]), timeout=60, message="the retry")
    finally:
        copies.stop()
    print(f"the dead agent's job stopped {stopped_after:.1f}s after the kill (fence {FENCE_SECS}s)")
    assert stopped_after < FENCE_SECS + 5
    assert (done["status"], done["retry_count"], done["node_id"]) == ("done", 1, "node-b")
    assert copies.most() == 1, "two copies ran at once"
    # The first attempt's output is kept on it, with why it ended.
    attempt = api.job(job["job_id"])["attempts"][0]
    assert attempt["stdout"] == "start\n", attempt
    api.close()


def test_a_frozen_agent_is_fenced_and_its_late_report_is_stale(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    sched = scheduler_factory(FENCED_ENV)
    api = Api(sched.url)
    agent_a = start_node(agents, tmp_path, "node-a", sched.url)
    mark = f"MARK{uuid.uuid4().hex}"
    copies = Copies(mark)
    try:
        job = api.submit(command=marked(8, mark))
        wait_for(lambda: copies.now(), message=agent_a.waiting("the job to start"))
        start_node(agents, tmp_path, "node-b", sched.url)
        os.kill(agent_a.pid, signal.SIGSTOP)
        wait_for(
            lambda: (
                status_is(api, job["job_id"], "running")
                and api.job(job["job_id"])["node_id"] == "node-b"
            ),
            timeout=30,
            message="the retry to run on node-b",
        )
        os.kill(agent_a.pid, signal.SIGCONT)
        wait_for(
            lambda: "stale report" in agent_a.log(),
            timeout=30,
            message=agent_a.waiting("node-a's report to be refused as stale"),
        )
        done = wait_for(lambda: ended(api, job["job_id"]), timeout=60, message="the retry's end")
    finally:
        copies.stop()
    assert (done["status"], done["node_id"], done["retry_count"]) == ("done", "node-b", 1)
    assert done["stdout"] == f"start\n{mark}\n", "the job's result is the retry's"
    assert copies.most() == 1, "two copies ran at once"
    api.close()


def test_an_agent_cut_off_from_the_scheduler_stops_its_job_at_the_fence(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    """The agent stays alive, but its path to the scheduler goes silent (no reset, no
    answer): its job stops at the fence, the retry runs elsewhere as the only copy, and once
    the path is back the old attempt's report arrives, refused as stale, its output kept."""
    sched = scheduler_factory(FENCED_ENV)
    api = Api(sched.url)
    path = SilentProxy(sched.url)
    mark = f"MARK{uuid.uuid4().hex}"
    copies = Copies(mark)
    try:
        agent_a = start_node(agents, tmp_path, "node-a", path.url)
        job = api.submit(command=marked(10, mark))
        wait_for(lambda: copies.now(), message=agent_a.waiting("the job to start"))
        start_node(agents, tmp_path, "node-b", sched.url)
        wait_for(
            lambda: api.get(f"/jobs/{job['job_id']}/output").content == b"start\n",
            message=agent_a.waiting("the job's first line, sent live"),
        )
        path.cut()
        wait_for(
            lambda: api.job(job["job_id"])["node_id"] == "node-b",
            timeout=40,
            message="the retry on node-b",
        )
        path.heal()
        wait_for(
            lambda: "stale report" in agent_a.log(),
            timeout=60,
            message=agent_a.waiting("node-a's report, refused as stale"),
        )
        done = wait_for(lambda: ended(api, job["job_id"]), timeout=60, message="the retry's end")
    finally:
        copies.stop()
        path.close()
    assert (done["status"], done["node_id"], done["retry_count"]) == ("done", "node-b", 1)
    assert copies.most() == 1, "two copies ran at once"
    first = api.job(job["job_id"])["attempts"][0]
    assert first["stdout"] == "start\n" and "no word from the scheduler" in first["stderr"], first
    api.close()


def test_the_agent_stops_a_job_at_its_timeout_and_keeps_its_output(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    sched = scheduler_factory({**FENCED_ENV, "TIMEOUT_SCAN_INTERVAL_SECS": "3600"})
    api = Api(sched.url)
    start_node(agents, tmp_path, "node-a", sched.url, "--kill-grace-secs", "1")
    job = api.submit(command="echo before; sleep 30; echo never", timeout_secs=3)
    running = wait_for(lambda: status_is(api, job["job_id"], "running"), message="the job to run")
    done = wait_for(lambda: ended(api, job["job_id"]), timeout=30, message="the timeout")
    took = _seconds(done["finished_at"]) - _seconds(running["running_at"])
    print(f"timeout 3 s: failed {took:.2f}s after it started")
    assert (done["status"], done["reason"], done["exit_code"]) == ("failed", "timeout", -1)
    assert done["stdout"] == "before\n"
    assert done["stderr"].endswith("job timed out")
    assert 3 <= took < 4.5
    api.close()


class BrokenSpool:
    """Makes an agent's spool folder refuse writes, and mends it, in one of three ways: the
    folder replaced by a file, a full tmpfs mounted on it, a read-only tmpfs mounted on it.
    (The mounts need root; as root, permission bits would not stop a write.)"""

    def __init__(self, folder: Path, how: str) -> None:
        self.folder, self.how = folder, how

    def _mount(self, *args: str) -> None:
        done = subprocess.run(["mount", *args], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")

    def prepare(self) -> None:
        """Before the agent starts: a tmpfs under the spool (for the mount ways)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.how != "file":
            self._mount("-t", "tmpfs", "-o", "size=256k", "tmpfs", str(self.folder))

    def brake(self) -> None:
        if self.how == "file":
            for entry in self.folder.iterdir():
                entry.unlink()
            self.folder.rmdir()
            self.folder.write_text("not a folder")
        elif self.how == "full":
            with contextlib.suppress(OSError), open(self.folder / "filler", "wb") as f:
                while True:
                    f.write(b"x" * 65536)
        else:
            self._mount("-o", "remount,ro", str(self.folder))

    def mend(self) -> None:
        if self.how == "file":
            self.folder.unlink()
            self.folder.mkdir()
        elif self.how == "full":
            (self.folder / "filler").unlink()
        else:
            self._mount("-o", "remount,rw", str(self.folder))

    def close(self) -> None:
        if self.how != "file":
            subprocess.run(["umount", "-l", str(self.folder)], capture_output=True)


def report_to_a_broken_spool(
    tmp_path: Path,
    api: Api,
    path: SilentProxy,
    broken: BrokenSpool,
    agents: list[AgentProcess],
    command: str,
) -> tuple[AgentProcess, dict[str, Any]]:
    """An agent reaching the scheduler through `path` runs a job (`command`, once let go);
    while it runs, the spool breaks and the path is cut, so that the job's report, which no
    scheduler takes at once, finds the spool broken. (The agent, the job.)"""
    broken.prepare()
    go = tmp_path / "go"
    agent = start_node(agents, tmp_path, "node-a", path.url, "--fence-secs", "30")
    job = api.submit(command=f"while [ ! -e {go} ]; do sleep 0.05; done; {command}")
    wait_for(lambda: status_is(api, job["job_id"], "running"), message="the job to run")
    broken.brake()
    path.cut()
    go.touch()
    wait_for(
        lambda: "cannot write the spool" in agent.log(),
        timeout=30,
        message=agent.waiting("the report to find the spool broken"),
    )
    return agent, job


@pytest.mark.parametrize("how", ["file", "full", "read-only"])
def test_a_spool_that_cannot_be_written_stops_new_work_and_loses_nothing(
    how: str, tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    """A report no scheduler takes at once goes to the spool. When the spool cannot take
    it, the agent takes no new work and says why; the report still goes out (its job's
    folder keeps it), and once the spool can be written again, work resumes."""
    sched = scheduler_factory({**FENCED_ENV, "NODE_LOST_SECS": "120"})
    api = Api(sched.url)
    path = SilentProxy(sched.url)
    broken = BrokenSpool(tmp_path / "agent-node-a" / "spool", how)
    try:
        agent, first = report_to_a_broken_spool(tmp_path, api, path, broken, agents, "echo one")
        path.heal()
        wait_for(
            lambda: "spool not writable" in json.dumps(expect_json(api.get("/nodes/node-a"), 200)),
            timeout=30,
            message=agent.waiting("the node to say its spool is not writable"),
        )
        done = wait_for(lambda: ended(api, first["job_id"]), timeout=30, message="its report")
        assert done["stdout"] == "one\n", "its report still went out"
        # The only node takes no work: a submission is refused, as when every node drains.
        refused = api.post("/jobs", {"command": "echo two"})
        assert refused.status_code == 503, refused.text
        broken.mend()
        wait_for(
            lambda: "refusing_work" not in expect_json(api.get("/nodes/node-a"), 200),
            timeout=30,
            message=agent.waiting("the node to take work again"),
        )
        second = api.submit(command="echo two")
        done = wait_for(lambda: ended(api, second["job_id"]), timeout=30, message="work again")
        assert done["stdout"] == "two\n"
    finally:
        path.close()
        broken.close()
    api.close()


def test_a_report_neither_spooled_nor_sent_survives_an_agent_crash(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    """The spool cannot be written and the scheduler cannot be reached when the job ends;
    then the agent is SIGKILLed. The job's result is still in its folder: the next agent
    reports it, and the job ran once."""
    sched = scheduler_factory({**FENCED_ENV, "NODE_LOST_SECS": "120"})
    api = Api(sched.url)
    path = SilentProxy(sched.url)
    broken = BrokenSpool(tmp_path / "agent-node-a" / "spool", "file")
    try:
        runs = tmp_path / "runs"
        agent, job = report_to_a_broken_spool(
            tmp_path, api, path, broken, agents, f"echo ran; date +%N >> {runs}"
        )
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait_exit()
        broken.mend()
        path.heal()
        start_node(agents, tmp_path, "node-a", path.url, "--fence-secs", "30")
        done = wait_for(lambda: ended(api, job["job_id"]), timeout=60, message="the report")
    finally:
        path.close()
    assert (done["status"], done["stdout"], done["retry_count"]) == ("done", "ran\n", 0)
    assert len((tmp_path / "runs").read_text().split()) == 1, "the job ran more than once"
    api.close()


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x00\xff\xfe binary",
        b"[1, 2]",
        b'{"job_id": 7, "body": {}}',
        b'{"job_id": "job-1"}',
        b'{"job_id": "job-1", "body": {"status": "running"}}',
        b'{"job_id": "job-1", "body": {"status": "done"}, "retry_count": "x"}',
        b'{"job_id": "job-1", "body": "done"}',
        b" " * (spool.MAX_ENTRY_BYTES + 1),
    ],
    ids=[
        *("empty", "binary", "array", "wrong-types", "no-body", "not-final", "bad-count"),
        *("text", "huge"),
    ],
)
def test_a_spool_file_of_any_wrong_shape_is_set_aside(
    content: bytes,
    tmp_path: Path,
    scheduler_factory: SchedulerFactory,
    agents: list[AgentProcess],
) -> None:
    sched = scheduler_factory(FENCED_ENV)
    api = Api(sched.url)
    folder = tmp_path / "agent-node-a" / "spool"
    folder.mkdir(parents=True)
    (folder / "job-1.report.json").write_bytes(content)
    agent = start_node(agents, tmp_path, "node-a", sched.url)
    job = api.submit(command="echo works")
    done = wait_for(lambda: ended(api, job["job_id"]), timeout=30, message=agent.waiting("work"))
    assert done["stdout"] == "works\n"
    assert (folder / "job-1.report.json.bad").read_bytes() == content
    assert "moved aside as .bad" in agent.log()
    api.close()


def test_a_second_agent_with_the_same_node_id_runs_nothing(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    sched = scheduler_factory(FENCED_ENV)
    api = Api(sched.url)
    start_node(agents, tmp_path, "node-a", sched.url)
    second = AgentProcess(tmp_path / "elsewhere", "node-a", sched.url, "--poll-secs", "0.1")
    (tmp_path / "elsewhere").mkdir()
    agents.append(second)
    second.start()
    wait_for(lambda: "another agent serves node node-a" in second.log(), timeout=30)
    jobs = [api.submit(command="echo one of many")["job_id"] for _ in range(6)]
    for job_id in jobs:
        wait_for(lambda job_id=job_id: ended(api, job_id), timeout=30, message="the jobs")
    assert "claimed" not in second.log()
    api.close()


def test_a_recorded_pid_now_of_another_process_is_left_alone(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    """An agent takes back a job folder whose recorded owner and job pids belong, by now, to
    another process (the start time differs): it signals nothing, and reports the job as
    ended with its owner."""
    sched = scheduler_factory({**FENCED_ENV, "MAX_JOB_RETRIES": "0"})
    api = Api(sched.url)
    # The node, as its earlier agent left it: known to the scheduler, its job claimed.
    beat = {"cpu_count": 1, "running": []}
    expect_json(api.request("PUT", "/nodes/node-a", json=beat), 200)
    job = api.submit(command="echo from an earlier run")
    claim = {"status": "running", "node_id": "node-a", "attempt": 0}
    expect_json(api.patch(f"/jobs/{job['job_id']}", claim), 200)
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        folder = tmp_path / "agent-node-a" / "jobs" / f"{job['job_id']}.0.test"
        folder.mkdir(parents=True)
        spec = {"job_id": job["job_id"], "attempt": 0, "argv": ["true"], "cwd": "/", "env": {}}
        (folder / owner.SPEC).write_text(json.dumps(spec))
        started = owner.start_time(stranger.pid)
        assert started is not None
        for name in (owner.OWNER_PID, owner.JOB_PID):
            (folder / name).write_text(f"{stranger.pid} {started - 1}\n")  # not this process
        agent = start_node(agents, tmp_path, "node-a", sched.url)
        done = wait_for(lambda: ended(api, job["job_id"]), timeout=30, message=agent.waiting("it"))
        assert stranger.poll() is None, "the stranger was signalled"
        assert done["status"] == "failed" and "owner process died" in done["stderr"]
    finally:
        stranger.kill()
        stranger.wait()
    api.close()


def _seconds(stamp: str) -> float:
    from tiny_scheduler.domain.jobs import parse_time

    return parse_time(stamp) / 1_000_000


def test_sigterm_detaches_and_the_next_agent_takes_the_job_back(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    sched = scheduler_factory(FENCED_ENV)
    api = Api(sched.url)
    agent = start_node(agents, tmp_path, "node-a", sched.url)
    mark = f"MARK{uuid.uuid4().hex}"
    copies = Copies(mark)
    try:
        job = api.submit(command=marked(3, mark))
        wait_for(lambda: copies.now(), message=agent.waiting("the job to start"))
        agent.terminate()
        began = time.monotonic()
        assert agent.wait_exit(30) == 0
        took = time.monotonic() - began
        assert len(copies.now()) == 1, "the job goes on without its agent"
        assert "left running with their owners" in agent.log()
        start_node(agents, tmp_path, "node-a", sched.url)
        done = wait_for(lambda: ended(api, job["job_id"]), timeout=60, message="the job's end")
    finally:
        copies.stop()
    print(f"the agent exited {took:.2f}s after SIGTERM")
    assert (done["status"], done["retry_count"], done["stdout"]) == ("done", 0, f"start\n{mark}\n")
    assert copies.most() == 1
    api.close()


def test_a_fence_longer_than_the_scheduler_allows_is_refused(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    sched = scheduler_factory(FENCED_ENV)
    agent = AgentProcess(tmp_path, "node-a", sched.url, "--fence-secs", "100")
    agents.append(agent)
    agent.start()
    assert agent.wait_exit(30) == 1
    said = agent.log()
    assert "--fence-secs 100 is longer than this scheduler allows (5, " in said, said
    assert "NODE_LOST_SECS 4" in said


def agent_alone(work_dir: Path, **settings: Any) -> Agent:
    """An agent in this process, not started, whose scheduler URL answers nothing."""
    config = AgentConfig(
        urls=("http://127.0.0.1:9",),
        node_id="node-a",
        slots=1,
        work_dir=str(work_dir),
        spool_dir=str(work_dir / "spool"),
        **settings,
    )
    return Agent(config)


def test_a_full_spool_refuses_work_by_files_and_by_bytes(tmp_path: Path) -> None:
    """The agent's own account of its spool (no scheduler needed): at either cap it says
    why it takes no work, in the words its heartbeat carries."""
    agent = agent_alone(tmp_path, spool_max_files=2, spool_max_bytes=10_000)
    try:
        assert agent.refusing_work() == ""
        agent.spool.put(spool.Report("job-1", {"status": "done", "exit_code": 0}, 0))
        assert agent.refusing_work() == ""
        agent.spool.put(spool.Report("job-2", {"status": "done", "exit_code": 0}, 0))
        assert agent.refusing_work() == "spool full: 2 files"
        agent.spool.remove("job-1")
        agent.spool.remove("job-2")
        big = {"status": "failed", "exit_code": 1, "stderr": "x" * 20_000}
        agent.spool.put(spool.Report("job-3", big, 0))
        assert agent.refusing_work().startswith("spool full: ")
        assert agent.refusing_work().endswith(" bytes")
    finally:
        agent.wire.close()


@pytest.mark.parametrize(
    "spec",
    [b'{"job_id": "garbage"}', b'{"job_id": "job-3", "attempt": "x"}', b"\x00 not json"],
    ids=["not-a-job-id", "bad-attempt", "binary"],
)
def test_a_job_folder_of_a_wrong_shape_never_reaches_the_heartbeat(
    spec: bytes, tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    """A folder in the agent's jobs folder that does not hold a job the agent started is
    cleared away: its contents never reach a heartbeat (which the scheduler would refuse),
    and the node works as usual."""
    sched = scheduler_factory(FENCED_ENV)
    api = Api(sched.url)
    folder = tmp_path / "agent-node-a" / "jobs" / "job-3.0.odd"
    folder.mkdir(parents=True)
    (folder / owner.SPEC).write_bytes(spec)
    agent = start_node(agents, tmp_path, "node-a", sched.url)
    job = api.submit(command="echo works")
    done = wait_for(lambda: ended(api, job["job_id"]), timeout=30, message=agent.waiting("work"))
    assert done["stdout"] == "works\n"
    assert not folder.exists()
    assert "heartbeat answered 400" not in agent.log()
    api.close()


def ended_folder(work_dir: Path, job_id: str, attempt: int) -> Path:
    """A job folder as its owner leaves it once the job ended: spec, output and result."""
    folder = work_dir / "jobs" / f"{job_id}.{attempt}.{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    identity = {"job_id": job_id, "attempt": attempt, "job_type": None, "port": None}
    (folder / owner.SPEC).write_text(json.dumps({**identity, "argv": ["true"], "env": {}}))
    (folder / owner.STDOUT).write_text(f"attempt {attempt}\n")
    (folder / owner.STDERR).write_text("")
    result = {"exit_code": 0, "why": "exit", "note": "", "usage": {}, **identity}
    (folder / owner.RESULT).write_text(json.dumps(result))
    return folder


def test_a_restarted_agent_reports_only_the_latest_attempt_of_a_job(tmp_path: Path) -> None:
    """Of one job's attempts found at a start (folders, spooled reports), only the latest is
    reported: an earlier one's folder goes, and a spooled report of an earlier attempt is
    dropped when a folder holds a later one. (No scheduler answers here: the reports that
    stay are held, to be sent, which is what is looked at.)"""
    agent = agent_alone(tmp_path)
    try:
        earlier = ended_folder(tmp_path, "job-4", 0)
        later = ended_folder(tmp_path, "job-4", 1)
        agent.spool.put(spool.Report("job-5", {"status": "done", "exit_code": 0}, 0))
        newer = ended_folder(tmp_path, "job-5", 1)
        for report in agent.spool.entries():
            agent._hold(report, next_try=float("inf"))
        agent._adopt()
        wait_for(
            lambda: {j: r.retry_count for j, r in agent._held.items()} == {"job-4": 1, "job-5": 1},
            message=lambda: f"the latest attempts held ({agent._held})",
        )
        assert agent._held["job-4"].body["stdout"] == "attempt 1\n"
        assert agent._held["job-5"].folder == str(newer)
        assert not earlier.exists() and later.exists()
    finally:
        agent.wire.close()
