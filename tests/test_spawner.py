"""The spawner (issue 40), with real processes: it owns the jobs it starts as a single owner
(`owner.py`) would (the job in a session of its own, none of the spawner's descriptors, only
the folder in the spawner's argv, the job's result; several jobs at once, each stopped on its
own order); a hung spawner costs no job (the agent starts that job's owner itself, a new
spawner serves the next); a SIGKILLed one ends its running jobs as jobs whose owner died (and
the scheduler runs them again); a folder is owned once, even when two owners are started for
it; the spawner outlives its agent while it owns jobs, and ends after them. Under load (30
jobs on two slots, the spawner SIGKILLed three times) no job is lost or run twice at once:
each ends done once, retried once per kill that hit it (by the jobs' own log and by /proc).
The agent-level guarantees (jobs outlive the agent and are taken back) are
test_agent_owner.py's, which run through the spawner too."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SchedulerFactory
from helpers import Api, wait_for
from test_agent_owner import FENCED_ENV, start_node
from test_agent_process import AgentProcess, ended

from tiny_scheduler.agent import cgroups, owner
from tiny_scheduler.agent.groups import Groups
from tiny_scheduler.agent.protocol import PolledJob
from tiny_scheduler.agent.runner import Limits, Runner
from tiny_scheduler.agent.spawning import PID_FILE, Spawner


@pytest.fixture
def work_dir(tmp_path: Path) -> Path:
    return tmp_path / "agent"


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    made: list[AgentProcess] = []
    yield made
    for agent in made:
        agent.kill()


@pytest.fixture
def spawner(work_dir: Path) -> Iterator[Spawner]:
    work_dir.mkdir()
    made = Spawner(str(work_dir), timeout_secs=1.0)
    made.start()
    yield made
    made.close()


def new_runner(work_dir: Path, command: str, number: int = 1) -> Runner:
    job = PolledJob(job_id=f"job-{number}", command=command)
    groups = Groups(str(work_dir))
    return Runner.new(job, 0, "node-a", str(work_dir), groups, 4096, None)  # type: ignore[arg-type]


def gate(work_dir: Path) -> tuple[Path, str]:
    """A file, and a job that waits for it to exist: the job runs until the test says."""
    path = work_dir / f"go-{uuid.uuid4().hex}"
    return path, f"while [ ! -e {path} ]; do sleep 0.02; done; echo done"


def status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def parent_of(pid: int) -> int:
    return int(status(pid)["PPid"])


def gone(pid: int) -> bool:
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([handle], [], [], 0)[0])
    finally:
        os.close(handle)


def test_the_spawner_owns_the_job_as_a_single_owner_would(work_dir: Path, spawner: Spawner) -> None:
    go, command = gate(work_dir)
    mark = f"MARK{uuid.uuid4().hex}"
    runner = new_runner(work_dir, f"{command} {mark}")
    runner.start(0, 1.0, None, spawner=spawner)
    wait_for(lambda: owner.read_pid(runner.folder, owner.JOB_PID), message="the job to start")
    record = owner.read_pid(runner.folder, owner.OWNER_PID)
    assert record is not None and record[0] == spawner.pid, "the spawner owns it"
    job = owner.read_pid(runner.folder, owner.JOB_PID)
    assert job is not None and parent_of(job[0]) == spawner.pid
    assert os.getsid(job[0]) == job[0], "the job is a session of its own"
    assert os.getsid(spawner.pid) == spawner.pid, "and so is the spawner, apart from the agent"
    cmdline = Path(f"/proc/{spawner.pid}/cmdline").read_bytes()
    assert mark.encode() not in cmdline, "only the job's sh -c carries its command line"
    links = [os.readlink(f"/proc/{job[0]}/fd/{fd}") for fd in os.listdir(f"/proc/{job[0]}/fd")]
    assert not [link for link in links if link.startswith(("socket:", "pipe:"))], links
    go.touch()
    outcome = runner.wait()
    assert (outcome.exit_code, outcome.why, outcome.stdout) == (0, "exit", f"done {mark}\n")


def test_one_spawner_owns_several_jobs_and_stops_each_on_its_own_order(
    work_dir: Path, spawner: Spawner
) -> None:
    go, command = gate(work_dir)
    kept, stopped = new_runner(work_dir, command, 1), new_runner(work_dir, command, 2)
    for runner in (kept, stopped):
        runner.start(0, 1.0, None, spawner=spawner)
        wait_for(lambda r=runner: owner.read_pid(r.folder, owner.JOB_PID), message="a start")
    stopped.stop(note="\nasked to stop\n")
    outcome = stopped.wait()
    assert (outcome.why, outcome.exit_code) == ("stopped", 128 + signal.SIGTERM)
    assert outcome.stderr.endswith("asked to stop\n")
    assert owner.alive(owner.read_pid(kept.folder, owner.JOB_PID)), "the other job runs on"
    go.touch()
    done = kept.wait()
    assert (done.exit_code, done.stdout) == (0, "done\n")


def test_a_sigkilled_spawner_ends_its_running_jobs_and_the_next_job_runs(
    work_dir: Path, spawner: Spawner
) -> None:
    go, command = gate(work_dir)
    running = new_runner(work_dir, command, 1)
    running.start(0, 1.0, None, spawner=spawner)
    job = wait_for(lambda: owner.read_pid(running.folder, owner.JOB_PID), message="a start")
    first = spawner.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    outcome = running.wait()
    assert outcome.exit_code == -1 and "owner process died" in outcome.stderr, outcome
    wait_for(lambda: not owner.alive(job), message="the unowned job to be ended")
    wait_for(lambda: spawner.pid is None, message="the spawner to be seen dead")
    later = new_runner(work_dir, "echo later", 2)
    later.start(0, 1.0, None, spawner=spawner)
    assert later.wait().stdout == "later\n"
    assert spawner.pid not in (None, first), "a new spawner took the old one's place"
    go.touch()


def test_a_hung_spawner_is_let_go_its_job_runs_on_and_the_next_starts_without_it(
    work_dir: Path, spawner: Spawner
) -> None:
    """A spawner that does not answer in time is replaced, not killed: a job it owns runs to
    its end with it (a spawner slowed by a disk must not cost its jobs), and ends after it."""
    go, command = gate(work_dir)
    owned = new_runner(work_dir, command, 1)
    owned.start(0, 1.0, None, spawner=spawner)
    wait_for(lambda: owner.read_pid(owned.folder, owner.JOB_PID), message="the job to start")
    hung = spawner.pid
    assert hung is not None
    os.kill(hung, signal.SIGSTOP)
    try:
        runner = new_runner(work_dir, "echo anyway", 2)
        runner.start(0, 1.0, None, spawner=spawner)
        assert runner.wait().stdout == "anyway\n", "started by a single owner of its own"
        again = new_runner(work_dir, "echo served", 3)
        again.start(0, 1.0, None, spawner=spawner)
        assert again.wait().stdout == "served\n"
        assert spawner.pid not in (None, hung)
        assert not gone(hung), "let go, not killed"
    finally:
        os.kill(hung, signal.SIGCONT)
    go.touch()
    done = owned.wait()
    assert (done.exit_code, done.stdout) == (0, "done\n"), "its job ran to its end with it"
    wait_for(lambda: gone(hung), message="the let-go spawner to end after its last job")


def test_a_folder_already_owned_is_left_to_its_owner(work_dir: Path, spawner: Spawner) -> None:
    go, command = gate(work_dir)
    runner = new_runner(work_dir, command)
    runner.start(0, 1.0, None, spawner=spawner)
    wait_for(lambda: owner.read_pid(runner.folder, owner.JOB_PID), message="the job to start")
    first = owner.read_pid(runner.folder, owner.OWNER_PID)
    # A single owner, as the agent starts one when the spawner answers too late.
    second = subprocess.run(
        [sys.executable, "-I", "-S", owner.__file__, runner.folder], timeout=30, check=True
    )
    assert second.returncode == 0
    assert owner.read_pid(runner.folder, owner.OWNER_PID) == first
    assert not os.path.exists(os.path.join(runner.folder, owner.RESULT)), "it ran nothing"
    go.touch()
    assert runner.wait().stdout == "done\n"


def test_a_job_a_single_owner_took_first_is_waited_for_through_it(
    work_dir: Path, spawner: Spawner
) -> None:
    """The other way round: the spawner is asked for a folder a single owner claimed first; it
    runs nothing, and the agent waits for the single owner's result."""
    go, command = gate(work_dir)
    runner = new_runner(work_dir, command)
    runner.start(0, 1.0, None)  # no spawner: a single owner of its own
    single = wait_for(lambda: owner.read_pid(runner.folder, owner.OWNER_PID), message="claim")
    late = spawner.spawn(runner.folder)
    assert late is not None, "the spawner answered"
    os.close(late.done)
    assert owner.read_pid(runner.folder, owner.OWNER_PID) == single
    go.touch()
    assert runner.wait().stdout == "done\n"


def node_running_a_job(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> tuple[str, Api, AgentProcess, tuple[int, int], Path, str]:
    """A scheduler and its agent, running a job until `go` exists: (url, api, agent, the
    agent's spawner, go, the job's id)."""
    sched = scheduler_factory(FENCED_ENV)
    api = Api(sched.url)
    agent = start_node(agents, tmp_path, "node-a", sched.url)
    record = owner.read_pid(str(agent.work_dir), PID_FILE)
    assert record is not None and owner.alive(record), agent.log()
    go, command = gate(tmp_path)
    job_id = api.submit(command=command)["job_id"]
    folders = agent.work_dir / "jobs"
    wait_for(lambda: list(folders.glob("*/job.pid")), message=agent.waiting("the job to start"))
    return sched.url, api, agent, record, go, job_id


def test_the_spawner_outlives_its_agent_while_it_owns_jobs_then_ends(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    url, api, agent, record, go, job_id = node_running_a_job(tmp_path, scheduler_factory, agents)
    (folder,) = (agent.work_dir / "jobs").iterdir()
    assert owner.read_pid(str(folder), owner.OWNER_PID) == record, "the spawner owns the job"
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait_exit()
    job = owner.read_pid(str(folder), owner.JOB_PID)
    assert owner.alive(record) and owner.alive(job), "the job and its owner outlive the agent"
    go.touch()
    wait_for(lambda: not owner.alive(record), message="the spawner to end after its last job")
    assert (folder / owner.RESULT).exists(), "having written the job's result"
    start_node(agents, tmp_path, "node-a", url)
    done = wait_for(lambda: ended(api, job_id), timeout=30, message=agent.waiting("the end"))
    assert (done["status"], done["stdout"]) == ("done", "done\n")
    api.close()


def test_a_job_that_cannot_start_ends_127_and_says_why(work_dir: Path, spawner: Spawner) -> None:
    job = PolledJob(job_id="job-1", command="true", env_vars={"PATH": "/nonexistent"})
    runner = Runner.new(job, 0, "node-a", str(work_dir), Groups(str(work_dir)), 4096, None)  # type: ignore[arg-type]
    runner.start(0, 1.0, None, spawner=spawner)
    outcome = runner.wait()
    assert outcome.exit_code == 127
    assert "cannot start the job" in outcome.stderr, outcome.stderr


def test_an_agent_whose_spawner_is_killed_runs_its_job_again_and_the_next_job(
    tmp_path: Path, scheduler_factory: SchedulerFactory, agents: list[AgentProcess]
) -> None:
    _, api, agent, first, go, running = node_running_a_job(tmp_path, scheduler_factory, agents)
    os.kill(first[0], signal.SIGKILL)
    # Its job had no owner left: ended, reported failed, and offered again (a retry).
    wait_for(
        lambda: api.get(f"/jobs/{running}").json()["retry_count"] == 1,
        timeout=30,
        message=agent.waiting("the job to be run again"),
    )
    later = api.submit(command="echo later")["job_id"]
    done = wait_for(lambda: ended(api, later), timeout=30, message=agent.waiting("the next job"))
    assert (done["status"], done["stdout"]) == ("done", "later\n")
    go.touch()
    done = wait_for(lambda: ended(api, running), timeout=30, message=agent.waiting("its end"))
    assert (done["status"], done["stdout"], done["retry_count"]) == ("done", "done\n", 1)
    again = owner.read_pid(str(agent.work_dir), PID_FILE)
    assert again is not None and again != first and owner.alive(again), "a new spawner"
    api.close()


def dead(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def status_of(api: Api, job_id: str) -> str:
    return api.get(f"/jobs/{job_id}").json()["status"]


def test_the_node_fence_stops_every_job_whose_owner_reads_it(
    work_dir: Path, spawner: Spawner
) -> None:
    """The node's fence is one file's modification time: moved on, jobs run; passed, each
    job is stopped as fenced; absent, no job is."""
    fence = str(work_dir / "fence")
    owner.write_node_fence(fence, time.monotonic() + 60)
    assert abs(owner.read_node_fence(fence) - (time.monotonic() + 60)) < 1  # type: ignore[operator]
    limits = Limits(fence_file=fence)
    go, command = gate(work_dir)
    fenced = [new_runner(work_dir, command, number) for number in (1, 2)]
    for runner in fenced:
        runner.start(0, 0.5, None, limits, spawner)
        wait_for(lambda r=runner: owner.read_pid(r.folder, owner.JOB_PID), message="a start")
    owner.write_node_fence(fence, time.monotonic() - 1)
    for runner in fenced:
        assert runner.wait().why == "fenced"
    owner.write_node_fence(fence, None)
    assert owner.read_node_fence(fence) is None
    free = new_runner(work_dir, "echo free", 3)
    free.start(0, 0.5, None, limits, spawner)
    assert (free.wait().why, free.wait().stdout) == ("exit", "free\n")
    go.touch()


def test_a_job_that_cannot_join_its_control_group_ends_127_and_says_why(
    work_dir: Path, spawner: Spawner, tmp_path: Path
) -> None:
    """The shell that puts the job into its group before it becomes the job stops there when
    the group cannot be joined: the job's command never runs outside its limits."""
    runner = new_runner(work_dir, f"touch {tmp_path / 'ran'}")
    runner.group = cgroups.JobGroup(cgroups.V2, (("unified", str(tmp_path / "no-such-group")),))
    runner.start(0, 1.0, None, spawner=spawner)
    outcome = runner.wait()
    assert outcome.exit_code == 127, outcome
    assert "cannot join its cgroup" in outcome.stderr, outcome.stderr
    assert not (tmp_path / "ran").exists(), "the command did not run"


class MarkedCopies:
    """Every 0.05 s, the live copies of each job marked `<mark>.<n>.` in its command line: a
    process that carries the mark and whose parent does not carry the same one (the job's
    shell forked on its way to run `sleep` is the same copy, not a second one)."""

    def __init__(self, mark: str) -> None:
        self.pattern = re.compile(re.escape(mark.encode()) + rb"\.(\d+)\.")
        self.most: dict[int, int] = {}  # n -> the most copies of job n seen at once
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for n, pids in self.now().items():
                self.most[n] = max(self.most.get(n, 0), len(pids))
            self.samples += 1

    def now(self) -> dict[int, list[int]]:
        marked: dict[int, tuple[int, int]] = {}  # pid -> (n, parent)
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                found = self.pattern.search(Path(f"/proc/{entry}/cmdline").read_bytes())
                if found is None:
                    continue
                fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
                if fields[0] != b"Z":
                    marked[int(entry)] = (int(found[1]), int(fields[1]))
        copies: dict[int, list[int]] = {}
        for pid, (n, parent) in marked.items():
            if marked.get(parent, (None,))[0] != n:
                copies.setdefault(n, []).append(pid)
        return copies

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def logged_job(log: Path, mark: str, n: int) -> str:
    """A job that appends `start`, five `tick`s 0.08 s apart and `end` to `log`, each line
    naming the job, its shell's pid and its folder (`jobs/job-N.<attempt>.xxxx/work`), then
    prints `ok job-N`. Only builtins write: no fork carries the mark but the job's shell."""
    line = f'"$TINY_JOB_ID $$ $PWD" >> {shlex.quote(str(log))}'
    return (
        f": {mark}.{n}.; echo start {line}; "
        f"for i in 1 2 3 4 5; do sleep 0.08; echo tick {line}; done; "
        f'echo end {line}; echo "ok $TINY_JOB_ID"'
    )


def owned_by(jobs_dir: Path, record: tuple[int, int]) -> dict[Path, bool]:
    """The job folders whose owner is the spawner `record`: whether each has its result."""
    found = {}
    for folder in jobs_dir.iterdir():
        if owner.read_pid(str(folder), owner.OWNER_PID) == record:
            found[folder] = (folder / owner.RESULT).exists()
    return found


def running_under(jobs_dir: Path, record: tuple[int, int]) -> list[Path]:
    return [
        folder
        for folder, ended_ in owned_by(jobs_dir, record).items()
        if not ended_ and (folder / owner.JOB_PID).exists()
    ]


def started(log: Path) -> tuple[set[str], set[str]]:
    """The jobs, and the job folders (names), that have written a start line to `log`."""
    jobs, folders = set(), set()
    text = log.read_text() if log.exists() else ""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0] == "start":
            jobs.add(fields[1])
            folders.add(Path(fields[3]).parent.name)
    return jobs, folders


def attempt_of(folder: str) -> tuple[str, int]:
    """(job id, attempt) from a job folder's name, `job-N.<attempt>.xxxx`."""
    job_id, attempt, _ = Path(folder).name.split(".", 2)
    return job_id, int(attempt)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("enforcement", ["auto", "none"])
def test_spawners_sigkilled_under_load_cost_no_job_and_never_two_copies_at_once(
    enforcement: str,
    tmp_path: Path,
    scheduler_factory: SchedulerFactory,
    agents: list[AgentProcess],
) -> None:
    """30 jobs on two slots; the spawner SIGKILLed three times, each while two jobs it owns
    run. Every job ends done once, its attempts one more than the kills that hit it (each
    killed attempt failed as its owner's death), the retry starting only after the killed
    copy was gone: no two copies of a job at once, by the jobs' own log and by /proc.
    With control groups (`auto`, where the machine has them) and without (`none`): the
    agent kills a killed spawner's job through its process group and through its cgroup,
    and the group's removal waits for it to empty, so each way is tested on its own."""
    jobs_total, kills_wanted = 30, 3
    sched = scheduler_factory({**FENCED_ENV, "MAX_JOB_RETRIES": "5"})
    api = Api(sched.url)
    options = ("--slots", "2", "--enforcement", enforcement)
    agent = start_node(agents, tmp_path, "node-a", sched.url, *options)
    jobs_dir = agent.work_dir / "jobs"
    log = tmp_path / "runs.log"
    mark = f"MARK{uuid.uuid4().hex}"
    copies = MarkedCopies(mark)
    hits: dict[tuple[str, int], int] = {}  # (job, attempt) a kill ended -> which kill
    kill_offsets: list[int] = []  # the log's length at each kill
    killed: list[tuple[int, int]] = []
    try:
        submitted = [
            api.submit(command=logged_job(log, mark, n))["job_id"] for n in range(jobs_total)
        ]
        for number in range(kills_wanted):
            # Kills spread over the batch: each once a later job has started, and while two
            # jobs the current spawner owns run (each has written its start line).
            target = submitted[2 + number * 9]

            def ready(target: str = target) -> tuple[int, int] | None:
                record = owner.read_pid(str(agent.work_dir), PID_FILE)
                if record is None or record in killed or not owner.alive(record):
                    return None
                jobs, folders = started(log)
                running = [f for f in running_under(jobs_dir, record) if f.name in folders]
                return record if target in jobs and len(running) >= 2 else None

            current = wait_for(ready, timeout=20, message=agent.waiting(f"{target} to run"))
            # The agent held for the instant of the kill: the jobs hit are read from their
            # folders before it ends them and clears the folders away.
            os.kill(agent.pid, signal.SIGSTOP)
            try:
                kill_offsets.append(log.stat().st_size if log.exists() else 0)
                os.kill(current[0], signal.SIGKILL)
                killed.append(current)
                wait_for(lambda current=current: dead(current[0]), message="the spawner's end")
                for folder, has_result in owned_by(jobs_dir, current).items():
                    if not has_result:
                        hits[attempt_of(str(folder))] = len(killed) - 1
            finally:
                os.kill(agent.pid, signal.SIGCONT)
        wait_for(
            lambda: all(job["status"] in ("done", "failed") for job in api.jobs()),
            timeout=40,
            message=agent.waiting("every job to end"),
        )
    finally:
        copies.stop()
    final = {job["job_id"]: api.job(job["job_id"]) for job in api.jobs()}
    texts = log.read_text().splitlines()
    lines = [text.split() for text in texts]
    starts = [0, *itertools.accumulate(len(text) + 1 for text in texts)]  # each line's offset
    retries = sum(job["retry_count"] for job in final.values())
    print(
        f"enforcement {enforcement}: {len(submitted)} jobs, {len(killed)} spawner kills, "
        f"{len(hits)} attempts hit, {retries} retries, {copies.samples} /proc samples, "
        f"most copies of a job at once: {max(copies.most.values(), default=0)}"
    )
    # None lost, none made up: the acknowledged submissions are the jobs, each done once.
    assert sorted(final) == sorted(submitted), (sorted(final), sorted(submitted))
    for job_id, job in final.items():
        assert (job["status"], job["stdout"]) == ("done", f"ok {job_id}\n"), job
    # The kills hit running jobs, and each job's retries are exactly the kills that hit it,
    # each killed attempt failed as its owner's death.
    assert len(killed) == kills_wanted and len(hits) >= kills_wanted, hits
    for job_id, job in final.items():
        hit = sorted(attempt for hit_job, attempt in hits if hit_job == job_id)
        assert hit == list(range(job["retry_count"])), (job_id, hit, job["retry_count"])
        failed = job.get("attempts", [])
        assert len(failed) == job["retry_count"], (job_id, failed)
        for each in failed:
            assert "owner process died" in each.get("stderr", ""), (job_id, each)
    # The jobs' own log: for each job, every line of an attempt comes before the first line
    # of the next (a killed copy left alive would tick on after its retry's start); each
    # retry starts after the kill that ended the attempt before it (a copy hit before its
    # first line wrote none); the last attempt, the one reported done, ran start to end.
    spans: dict[str, dict[int, list[int]]] = {}  # job -> attempt -> its lines (indexes)
    for index, (kind, job_id, _pid, folder) in enumerate(lines):
        assert kind in ("start", "tick", "end"), lines[index]
        attempt = attempt_of(str(Path(folder).parent))[1]
        spans.setdefault(job_id, {}).setdefault(attempt, []).append(index)
    assert sorted(spans) == sorted(submitted)
    for job_id, attempts in spans.items():
        retry_count = final[job_id]["retry_count"]
        assert retry_count in attempts and max(attempts) == retry_count, (job_id, attempts)
        seen = sorted(attempts)
        for first, then in itertools.pairwise(seen):
            overlap = f"two copies of {job_id} at once: {attempts}"
            assert attempts[first][-1] < attempts[then][0], overlap
        for attempt in range(retry_count):
            kill = kill_offsets[hits[job_id, attempt]]
            retry = min(number for number in seen if number > attempt)
            assert kill <= starts[attempts[retry][0]], f"{job_id}'s retry began before its kill"
            if attempt in attempts:
                assert starts[attempts[attempt][0]] < kill, f"{job_id}: hit before it started?"
        last = [lines[index][0] for index in attempts[retry_count]]
        assert last == ["start", *["tick"] * 5, "end"], (job_id, last)
    # And /proc: never two live copies of one job.
    assert copies.samples > 0
    assert max(copies.most.values(), default=0) == 1, copies.most
    api.close()


def test_a_job_the_spawner_claimed_but_cannot_start_is_ended_not_waited_for_forever(
    work_dir: Path, spawner: Spawner
) -> None:
    """The spawner owns the folder once it has claimed it; when it then cannot start the
    job (here its output file cannot be opened), it says so on the job's pipe, and the agent
    ends the job at once instead of waiting for a result from a live spawner."""
    runner = new_runner(work_dir, "echo never")
    os.mkdir(os.path.join(runner.folder, owner.STDOUT))  # opening it for output fails
    runner.start(0, 1.0, None, spawner=spawner)
    assert owner.read_pid(runner.folder, owner.OWNER_PID)[0] == spawner.pid  # type: ignore[index]
    outcome = runner.wait()
    assert outcome.exit_code == -1 and "could not start or end it" in outcome.stderr, outcome
    assert spawner.pid is not None, "the spawner serves on"
    later = new_runner(work_dir, "echo later", 2)
    later.start(0, 1.0, None, spawner=spawner)
    assert later.wait().stdout == "later\n"


def spec_only(work_dir: Path, marker: Path) -> str:
    """A job folder as an agent leaves it when it dies between writing the spec and handing
    the job to an owner."""
    folder = new_runner(work_dir, "").folder
    spec = {
        "job_id": "job-9",
        "attempt": 0,
        "argv": ["sh", "-c", f"touch {marker}"],
        "cwd": folder,
        "env": {"PATH": os.environ["PATH"]},
    }
    Path(folder, owner.SPEC).write_text(json.dumps(spec))
    return folder


def test_a_job_reported_never_started_is_never_started_by_an_owner_answering_late(
    work_dir: Path, spawner: Spawner, tmp_path: Path
) -> None:
    """A folder no owner claimed is claimed by the agent before it reports the job as never
    started: a spawner (or single owner) that gets to it afterwards starts nothing."""
    marker = tmp_path / "ran"
    folder = spec_only(work_dir, marker)
    adopted = Runner.adopt(folder, "node-a", Groups(str(work_dir)), 4096)
    assert adopted is not None
    outcome = adopted.wait()
    assert outcome.exit_code == -1 and "stopped before the job started" in outcome.stderr
    late = spawner.spawn(folder)
    assert late is not None
    _wait_closed(late.done)
    assert not marker.exists() and owner.read_pid(folder, owner.JOB_PID) is None


def test_a_result_outlives_a_lost_spec_and_is_taken_back(work_dir: Path, spawner: Spawner) -> None:
    """The spec is not fsynced; the result is, and says who the job was: a folder whose spec
    a crash of the machine took is still taken back and reported, never cleared away."""
    runner = new_runner(work_dir, "echo kept", 5)
    runner.start(0, 1.0, None, spawner=spawner)
    assert runner.wait().stdout == "kept\n"
    os.unlink(os.path.join(runner.folder, owner.SPEC))
    adopted = Runner.adopt(runner.folder, "node-a", Groups(str(work_dir)), 4096)
    assert adopted is not None and (adopted.job_id, adopted.attempt) == ("job-5", 0)
    outcome = adopted.wait()
    assert (outcome.exit_code, outcome.stdout, outcome.kept) == (0, "kept\n", True)


def _wait_closed(fd: int) -> None:
    try:
        select.select([fd], [], [], 30)
    finally:
        os.close(fd)
