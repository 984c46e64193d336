"""The compute agent (`tiny-scheduler agent`) as a process, against a real scheduler.

Every test runs real agent processes (the installed command line's module) and a real
scheduler under gunicorn, on loopback. Jobs wait on files the test creates, so the test
decides when a job ends; every wait is bounded. Stop orders, live output and the built-in
node list are the scheduler's own (heartbeats, `POST /jobs/{id}/output`, `REGISTRY_URL=builtin`).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from conftest import BASE_ENV, PostgresDatabases, SchedulerFactory, start_scheduler, stop_scheduler
from helpers import Api, expect_json, unit_settings, wait_for

from tiny_scheduler.agent import main
from tiny_scheduler.agent.groups import kill_recorded_children
from tiny_scheduler.dev.daemon import SchedulerProcess, free_port, memory_bytes, reset_peak_memory
from tiny_scheduler.dev.registry import FakeRegistry

CLI = os.path.join(os.path.dirname(sys.executable), "tiny-scheduler")
"""The installed command, as docs/agent.md runs it."""

SCHEDULER_ENV = {
    "MAX_JOBS_PER_NODE": "4",
    "MAX_JOB_RETRIES": "0",
    # The period the scheduler asks of agents: stop orders come with a heartbeat.
    "NODE_HEARTBEAT_SECS": "1",
}

AGENT_VARIABLES = ("SCHEDULER_URL", "TINYAWS_API_KEY", "KILL_GRACE_SECS", "MAX_OUTPUT_BYTES")
"""Variables of the developer's shell that would change how the agent runs (with AGENT_*)."""


class AgentProcess:
    """One `tiny-scheduler agent` process of node `node_id`, logging to a file. Its work dir
    (and spool) is the same for every process of the same node in a test: a restart finds
    what the previous run left."""

    def __init__(self, folder: Path, node_id: str, urls: str, *options: str) -> None:
        self.work_dir = folder / f"agent-{node_id}"
        self.spool_dir = self.work_dir / "spool"
        self.log_path = folder / f"agent-{node_id}.log"
        self.argv = [
            *(CLI, "--url", urls, "agent"),
            *("--node-id", node_id, "--work-dir", str(self.work_dir)),
            *("--poll-secs", "0.1", "--heartbeat-secs", "0.2"),
            *options,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, key: str | None = None) -> AgentProcess:
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith("AGENT_") and name not in AGENT_VARIABLES
        }
        if key is not None:
            env["TINYAWS_API_KEY"] = key
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(lambda: "slots, polling" in self.log(), message=self.waiting("the agent to start"))
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def waiting(self, what: str) -> Any:
        return lambda: f"{what}; agent log:\n{self.log()[-3000:]}"

    def spooled(self) -> list[str]:
        if not self.spool_dir.exists():
            return []
        return sorted(p.name for p in self.spool_dir.iterdir() if p.name.endswith(".json"))

    def terminate(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL the agent, then its jobs (as a machine going down would)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        kill_recorded_children(str(self.work_dir))


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[list[AgentProcess]]:
    """Append every AgentProcess started here; all are killed when the test ends."""
    made: list[AgentProcess] = []
    yield made
    for agent in made:
        agent.kill()


def start_agent(
    made: list[AgentProcess],
    folder: Path,
    node: str,
    urls: str,
    *options: str,
    key: str | None = None,
) -> AgentProcess:
    agent = AgentProcess(folder, node, urls, *options)
    made.append(agent)
    return agent.start(key)


def waits_for(path: Path, then: str = "") -> str:
    """A command that waits until `path` exists, then runs `then`."""
    return f"while [ ! -e {shlex.quote(str(path))} ]; do sleep 0.05; done; {then}"


def status_is(api: Api, job_id: str, *statuses: str) -> dict[str, Any] | None:
    job = api.job(job_id)
    return job if job["status"] in statuses else None


def ended(api: Api, job_id: str) -> dict[str, Any] | None:
    return status_is(api, job_id, "done", "failed")


@pytest.fixture
def sched(scheduler_factory: SchedulerFactory) -> SchedulerProcess:
    return scheduler_factory(env=SCHEDULER_ENV)


def test_two_slots_run_two_jobs_at_once_with_env_and_exit_codes(
    tmp_path: Path, sched: SchedulerProcess, node: str, agents: list[AgentProcess]
) -> None:
    start_agent(agents, tmp_path, node, sched.url, "--slots", "2")
    api = Api(sched.url)
    go = tmp_path / "go"
    jobs = []
    for n in (1, 2):
        started = tmp_path / f"started-{n}"
        command = f"touch {shlex.quote(str(started))}; " + waits_for(go, 'echo "$GREETING $N"')
        jobs.append(api.submit(command=command, env_vars={"GREETING": "hello", "N": str(n)}))
    # Each job waits for `go`, which comes only once both have started: two at once, or none.
    wait_for(
        lambda: all((tmp_path / f"started-{n}").exists() for n in (1, 2)),
        message=agents[0].waiting("both jobs to run at once"),
    )
    assert all(api.job(job["job_id"])["status"] == "running" for job in jobs)
    failing = api.submit(command="echo oops >&2; exit 3")
    go.touch()
    for n, job in enumerate(jobs, 1):
        done = wait_for(lambda j=job: ended(api, j["job_id"]), message="the job's report")
        assert (done["status"], done["exit_code"], done["stdout"]) == ("done", 0, f"hello {n}\n")
    failed = wait_for(lambda: ended(api, failing["job_id"]), message="the failing job's report")
    assert (failed["status"], failed["exit_code"], failed["stderr"]) == ("failed", 3, "oops\n")
    api.close()


def test_output_is_kept_as_a_bounded_tail(
    tmp_path: Path, scheduler_factory: SchedulerFactory, node: str, agents: list[AgentProcess]
) -> None:
    # The scheduler would keep 64 MiB: whatever is cut, the agent cut.
    sched = scheduler_factory(env={**SCHEDULER_ENV, "MAX_OUTPUT_BYTES": str(64 << 20)})
    agent = start_agent(agents, tmp_path, node, sched.url, "--max-output-bytes", "4096")
    api = Api(sched.url)
    reset_peak_memory(agent.pid)
    before = memory_bytes(agent.pid)
    # 20 MB on stdout, then a last line; a little on stderr.
    job = api.submit(command="yes 0123456789abcdef | head -c 20000000; echo the-end; echo e >&2")
    done = wait_for(lambda: ended(api, job["job_id"]), timeout=60, message="the loud job")
    assert done["status"] == "done", done
    assert done["stdout"].startswith("[tiny-scheduler: output truncated, ")
    assert done["stdout"].endswith("the-end\n")
    assert len(done["stdout"].encode()) <= 4096
    assert done["stderr"] == "e\n"
    # Holding the 20 MB (let alone decoding them) would take far more than this.
    grown = memory_bytes(agent.pid, "VmHWM") - before
    assert grown < 8 << 20, f"the agent grew by {grown} bytes for one job's output"
    api.close()


@pytest.mark.parametrize("agent_restarts", [False, True], ids=["agent-stays", "agent-restarts"])
def test_a_report_waits_in_the_spool_until_the_scheduler_is_back(
    tmp_path: Path,
    registry: FakeRegistry,
    node: str,
    agents: list[AgentProcess],
    agent_restarts: bool,
) -> None:
    port = free_port()
    db_path = tmp_path / "scheduler.db"

    def scheduler(number: int) -> SchedulerProcess:
        env = {**BASE_ENV, **SCHEDULER_ENV, "REGISTRY_URL": registry.url}
        log_path = tmp_path / f"scheduler-{number}.log"
        return SchedulerProcess(str(db_path), env=env, port=port, log_path=str(log_path)).start(
            timeout=30
        )

    first = scheduler(1)
    try:
        agent = start_agent(agents, tmp_path, node, first.url)
        api = Api(first.url)
        go = tmp_path / "go"
        job = api.submit(command=waits_for(go, "echo finished"))
        wait_for(lambda: status_is(api, job["job_id"], "running"), message="the job to run")
        api.close()
    finally:
        first.stop()

    go.touch()  # the job ends while no scheduler answers
    spooled = f"{job['job_id']}.report.json"
    wait_for(lambda: spooled in agent.spooled(), message=agent.waiting("the report to be spooled"))
    if agent_restarts:
        agent.kill()
        assert agent.spooled() == [spooled]
        agent = start_agent(agents, tmp_path, node, first.url)

    second = scheduler(2)
    try:
        api = Api(second.url)
        done = wait_for(
            lambda: ended(api, job["job_id"]), message=agent.waiting("the spooled report")
        )
        assert (done["status"], done["exit_code"], done["stdout"]) == ("done", 0, "finished\n")
        wait_for(lambda: agent.spooled() == [], message="the spool to be emptied")
        api.close()
    finally:
        second.stop()


def test_an_unreachable_first_url_is_passed_over(
    tmp_path: Path, sched: SchedulerProcess, node: str, agents: list[AgentProcess]
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"  # refuses connections
    agent = start_agent(agents, tmp_path, node, f"{nobody},{sched.url}")
    api = Api(sched.url)
    for word in ("one", "two"):
        job = api.submit(command=f"echo {word}")
        done = wait_for(lambda j=job: ended(api, j["job_id"]), message=agent.waiting("the job"))
        assert (done["status"], done["stdout"]) == ("done", f"{word}\n")
    api.close()


KEY = "agent-test-key"
AUTH_ENV = {"TINYAWS_API_KEY": KEY, "AUTH_AGENT_EXEMPT": "0"}
"""A scheduler that wants the key from agents too."""

KEY_PROBE = 'printf "%s" "${TINYAWS_API_KEY-unset}"'
"""A job printing the key it was given, if any."""


def test_the_key_goes_to_the_scheduler_and_not_to_the_jobs(
    tmp_path: Path, scheduler_factory: SchedulerFactory, node: str, agents: list[AgentProcess]
) -> None:
    sched = scheduler_factory(env={**SCHEDULER_ENV, **AUTH_ENV})
    agent = start_agent(agents, tmp_path, node, sched.url, key=KEY)
    api = Api(sched.url, key=KEY)
    job = api.submit(command=KEY_PROBE)
    done = wait_for(lambda: ended(api, job["job_id"]), message=agent.waiting("the job"))
    assert (done["status"], done["stdout"]) == ("done", "unset")
    api.close()


def test_a_standby_sends_the_agent_to_the_leader_with_its_key(
    tmp_path: Path,
    registry: FakeRegistry,
    node: str,
    agents: list[AgentProcess],
    postgres_database: PostgresDatabases,
) -> None:
    db_url = postgres_database.create()
    env = {**SCHEDULER_ENV, **AUTH_ENV, "HA_FORWARD": "0"}  # standbys answer 307
    leader = start_scheduler(db_url, tmp_path / "leader.log", registry.url, env)
    try:
        wait_for(lambda: Api(leader.url).get("/leader").status_code == 200, message="a leader")
        standby = start_scheduler(db_url, tmp_path / "standby.log", registry.url, env)
        try:
            agent = start_agent(agents, tmp_path, node, standby.url, key=KEY)
            api = Api(leader.url, key=KEY)
            job = api.submit(command=KEY_PROBE)
            done = wait_for(lambda: ended(api, job["job_id"]), message=agent.waiting("the job"))
            assert (done["status"], done["stdout"]) == ("done", "unset")
            api.close()
        finally:
            stop_scheduler(standby)
    finally:
        stop_scheduler(leader)


def test_sigterm_with_drain_on_exit_lets_the_running_job_finish_and_claims_nothing_new(
    tmp_path: Path,
    sched: SchedulerProcess,
    registry: FakeRegistry,
    node: str,
    agents: list[AgentProcess],
) -> None:
    # The registry heartbeats (every 0.05 s) show the agent alive and looking around while
    # it drains; polls would come as often.
    agent = start_agent(
        agents,
        tmp_path,
        node,
        sched.url,
        *("--slots", "2", "--registry", registry.url, "--registry-heartbeat-secs", "0.05"),
        "--drain-on-exit",
    )
    api = Api(sched.url)
    go = tmp_path / "go"
    running = api.submit(command=waits_for(go, "echo drained"))
    wait_for(lambda: status_is(api, running["job_id"], "running"), message="the job to run")
    agent.terminate()
    wait_for(lambda: "draining" in agent.log(), message=agent.waiting("the drain to start"))
    late = api.submit(command="echo too late")
    seen: set[str] = set()

    def heartbeats() -> bool:
        seen.add(registry.nodes_listing()[node]["last_seen"])
        return len(seen) > 10

    wait_for(heartbeats, message="ten heartbeats of the draining agent")
    assert api.job(late["job_id"])["status"] == "pending"
    assert agent.proc is not None and agent.proc.poll() is None  # still waiting for its job
    go.touch()
    assert agent.wait_exit() == 0
    done = api.job(running["job_id"])
    assert (done["status"], done["stdout"]) == ("done", "drained\n")
    assert api.job(late["job_id"])["status"] == "pending"
    assert agent.spooled() == []
    api.close()


def test_a_job_that_outstays_the_drain_is_killed_with_its_children_and_reported(
    tmp_path: Path, sched: SchedulerProcess, node: str, agents: list[AgentProcess]
) -> None:
    agent = start_agent(
        agents,
        tmp_path,
        node,
        sched.url,
        *("--drain-secs", "0.5", "--kill-grace-secs", "0.5", "--drain-on-exit"),
    )
    api = Api(sched.url)
    child_pid = tmp_path / "child.pid"
    job = api.submit(command=f"sleep 600 & echo $! > {shlex.quote(str(child_pid))}; wait")
    wait_for(lambda: child_pid.exists() and child_pid.read_text().strip(), message="the child")
    pid = int(child_pid.read_text())
    assert _alive(pid)
    agent.terminate()
    assert agent.wait_exit() == 0
    assert not _alive(pid), "the job's forked child outlived the drain"
    failed = api.job(job["job_id"])
    assert failed["status"] == "failed", failed
    assert "stopped while draining" in failed["stderr"]
    api.close()


def test_a_cancelled_job_is_stopped_by_its_agent_sigkill_after_the_grace(
    tmp_path: Path, sched: SchedulerProcess, node: str, agents: list[AgentProcess]
) -> None:
    agent = start_agent(agents, tmp_path, node, sched.url, "--kill-grace-secs", "0.5")
    api = Api(sched.url)
    child_pid = tmp_path / "child.pid"
    # SIGTERM is ignored by the job and its child: only the SIGKILL after the grace ends them.
    command = f"trap '' TERM; sleep 600 & echo $! > {shlex.quote(str(child_pid))}; wait"
    job = api.submit(command=command)
    wait_for(lambda: child_pid.exists() and child_pid.read_text().strip(), message="the child")
    pid = int(child_pid.read_text())
    cancelled = api.post(f"/jobs/{job['job_id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    wait_for(
        lambda: not _alive(pid), timeout=20, message=agent.waiting("the heartbeat's stop order")
    )
    assert f"stopping {job['job_id']} at the scheduler's request" in agent.log()
    # The late report leaves the job as the cancel made it.
    wait_for(
        lambda: f"{job['job_id']} reported failed" in agent.log(),
        message=agent.waiting("the late report"),
    )
    assert (api.job(job["job_id"])["reason"], agent.spooled()) == ("cancelled", [])
    api.close()


def test_a_running_jobs_output_is_sent_while_it_runs(
    tmp_path: Path, sched: SchedulerProcess, node: str, agents: list[AgentProcess]
) -> None:
    agent = start_agent(agents, tmp_path, node, sched.url)
    api = Api(sched.url)
    go = tmp_path / "go"
    job = api.submit(command="echo early; echo warning >&2; " + waits_for(go, "echo late"))

    def output(stream: str) -> str:
        reply = api.get(f"/jobs/{job['job_id']}/output", params={"stream": stream, "wait": 1})
        return reply.text if reply.status_code == 200 else ""

    wait_for(lambda: output("stdout") == "early\n", message=agent.waiting("live stdout"))
    wait_for(lambda: output("stderr") == "warning\n", message=agent.waiting("live stderr"))
    assert api.job(job["job_id"])["status"] == "running"
    go.touch()
    done = wait_for(lambda: ended(api, job["job_id"]), message="the job's report")
    assert (done["status"], done["stdout"], done["stderr"]) == (
        "done",
        "early\nlate\n",
        "warning\n",
    )
    api.close()


def output_posts(api: Api) -> float:
    """How many `POST /jobs/{id}/output` the scheduler has answered (its metrics say)."""
    text = api.get("/metrics").text
    name = "tiny_scheduler_http_request_duration_seconds_count"
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and 'endpoint="output.append_output"' in line
    )


def test_a_short_jobs_output_goes_with_its_report_alone(
    tmp_path: Path, sched: SchedulerProcess, node: str, agents: list[AgentProcess]
) -> None:
    agent = start_agent(agents, tmp_path, node, sched.url, "--slots", "2")
    api = Api(sched.url)
    before = output_posts(api)
    made = [api.submit(command=f"echo quick {n}; echo note >&2") for n in range(4)]
    for job in made:
        done = wait_for(lambda job=job: ended(api, job["job_id"]), message=agent.waiting("jobs"))
        assert (done["stdout"], done["stderr"]) == (f"quick {made.index(job)}\n", "note\n")
    assert output_posts(api) == before  # no separate output post: one request per report
    api.close()


def test_with_the_built_in_node_list_the_agent_is_the_node(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    sched = scheduler_factory(env={**SCHEDULER_ENV, "REGISTRY_URL": "builtin"})
    agent = start_agent(agents, tmp_path, "builtin-node", sched.url, "--slots", "3")
    api = Api(sched.url)

    def listed() -> dict[str, Any] | None:
        nodes = expect_json(api.get("/nodes"), 200)
        return next((n for n in nodes if n["node_id"] == "builtin-node"), None)

    node = wait_for(listed, message=agent.waiting("the agent's heartbeat"))
    assert (node["health"], node["source"], node["cpu_count"]) == ("healthy", "heartbeat", 3)
    assert node["version"] == metadata.version("tiny-scheduler")
    job = api.submit(command="echo placed by heartbeat")
    assert job["node_id"] == "builtin-node"
    done = wait_for(lambda: ended(api, job["job_id"]), message=agent.waiting("the job"))
    assert (done["status"], done["stdout"]) == ("done", "placed by heartbeat\n")
    api.close()


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b")")[-1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def test_the_agent_does_not_load_the_server() -> None:
    # A compute node runs the agent only: Flask and the daemon's modules stay out of it.
    code = (
        "import sys, tiny_scheduler.cli, tiny_scheduler.agent.main; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('flask', 'werkzeug') "
        "or m in ('tiny_scheduler.service', 'tiny_scheduler.storage')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_systemd_unit_runs_the_agent_and_stops_it(
    tmp_path: Path, sched: SchedulerProcess, node: str
) -> None:
    settings, env = unit_settings("tiny-scheduler-agent.service")
    # Its stop: signals to the agent only (its jobs' owners stay), and time enough for the
    # whole drain when AGENT_DRAIN_ON_EXIT asks for one.
    assert settings["KillMode"] == "process"
    drain = float(env["AGENT_DRAIN_SECS"]) + float(env["KILL_GRACE_SECS"]) + main.FLUSH_SECS
    assert float(settings["TimeoutStopSec"]) > drain
    # Its command, as systemd runs it: the state directory in, the env file's settings added.
    state = tmp_path / "state"
    program, *args = shlex.split(settings["ExecStart"].replace("${STATE_DIRECTORY}", str(state)))
    assert program.endswith("/bin/tiny-scheduler")
    from_file = {"SCHEDULER_URL": sched.url, "AGENT_NODE_ID": node, "AGENT_POLL_SECS": "0.1"}
    log_path = tmp_path / "unit.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [CLI, *args],
            env={**os.environ, **env, **from_file, "TINYAWS_API_KEY": ""},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        api = Api(sched.url)
        job = api.submit(command="echo from the unit")
        done = wait_for(
            lambda: ended(api, job["job_id"]),
            message=lambda: f"the unit's agent to run a job; its log:\n{log_path.read_text()}",
        )
        assert (done["status"], done["stdout"]) == ("done", "from the unit\n")
        assert (state / "spool").is_dir()
        api.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
