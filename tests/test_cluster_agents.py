"""A cluster of this project's own, end to end: the scheduler as its own node registry
(`REGISTRY_URL=builtin`) and real `tiny-scheduler agent` processes, through the dev cluster.

What is checked here is what only the whole has: placement over the agents' heartbeats and
slots, a node dying or its agent restarting under a running job, a leader dying while jobs end,
drains, and the scheduler's stop orders carried out on real process groups (cancel, timeout).
A report spooled through a scheduler outage (with and without an agent restart) is covered in
test_agent_process.py and not repeated.

Jobs wait on files the test creates, so the test decides when they end; every wait has a
deadline, generous for a shared machine, and no deadline is the assertion.
"""

from __future__ import annotations

import collections
import os
import pathlib
import shlex
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from helpers import Api, expect_json, wait_for

from tiny_scheduler.client import Client, wait_for_job
from tiny_scheduler.dev.cluster import AGENT_KILL_GRACE_SECS, ClusterConfig, DevCluster
from tiny_scheduler.dev.daemon import SchedulerProcess

BASE_ENV = {
    # Whatever the developer's shell holds: one retry, history kept, peers off.
    "MAX_JOB_RETRIES": "1",
    "JOB_RETENTION_SECS": "0",
    "SQS_URL": "",
    "SNS_URL": "",
}

ONE_SLOT = {**BASE_ENV, "MAX_JOBS_PER_NODE": "1"}

STOP_SECS = 20.0
"""How long a stopped job's processes may take to go (heartbeat + kill grace, on a busy
machine): a bound on the wait, not a figure under test."""


def waits_for(path: pathlib.Path, then: str = "") -> str:
    """A command that waits until `path` exists, then runs `then`."""
    return f"while [ ! -e {shlex.quote(str(path))} ]; do sleep 0.05; done; {then}"


def final(api: Api, job_id: str) -> dict[str, Any] | None:
    job = api.job(job_id)
    return job if job["status"] in ("done", "failed") else None


def running(api: Api, job_id: str) -> dict[str, Any] | None:
    job = api.job(job_id)
    return job if job["status"] == "running" else None


def nodes(api: Api) -> dict[str, dict[str, Any]]:
    return {node["node_id"]: node for node in expect_json(api.get("/nodes"), 200)}


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b")")[-1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def read_pid(path: pathlib.Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text.isdigit() else None


def agent_log(cluster: DevCluster, node_id: str) -> str:
    return pathlib.Path(cluster.agents[node_id].log_path).read_text(errors="replace")


@pytest.fixture
def work(tmp_path: pathlib.Path) -> pathlib.Path:
    folder = tmp_path / "cluster"
    folder.mkdir()
    return folder


# --- placement over heartbeats ------------------------------------------------------------------


def test_three_agents_share_work_least_loaded_with_their_cpu_counts_as_slots(
    tmp_path: pathlib.Path, work: pathlib.Path
) -> None:
    config = ClusterConfig.quick(
        agents=3,
        agent_slots=(1, 2, 3),
        work_dir=str(work),
        scheduler_env={**BASE_ENV, "MAX_JOBS_PER_NODE": "auto"},
    )
    with DevCluster(config) as cluster:
        api = Api(cluster.scheduler_url)
        listed = nodes(api)
        assert {n: (listed[n]["cpu_count"], listed[n]["slots"]) for n in cluster.node_ids} == {
            "node-1": (1, 1),
            "node-2": (2, 2),
            "node-3": (3, 3),
        }
        assert all(listed[n]["source"] == "heartbeat" for n in cluster.node_ids)

        go = tmp_path / "go"
        started = tmp_path / "started"
        started.mkdir()
        held = [
            api.submit(
                command=f"touch {started}/$TINY_JOB_ID; " + waits_for(go, 'echo "$TINY_NODE_ID"')
            )
            for _ in range(6)
        ]
        # Least-loaded fills the six slots exactly: each job goes where its load is lowest.
        per_node = {n: sum(job["node_id"] == n for job in held) for n in cluster.node_ids}
        assert per_node == {"node-1": 1, "node-2": 2, "node-3": 3}
        # All six run at once: node-3's agent runs three, as its cpu_count allows.
        wait_for(
            lambda: len(list(started.iterdir())) == 6,
            timeout=30,
            message=lambda: f"six jobs to run at once: {sorted(p.name for p in started.iterdir())}",
        )
        assert all(api.job(job["job_id"])["status"] == "running" for job in held)
        extra = api.submit(command='echo "$TINY_NODE_ID"')
        assert api.job(extra["job_id"])["status"] == "pending"  # every slot is taken

        go.touch()
        for job in [*held, extra]:
            done = wait_for(lambda j=job: final(api, j["job_id"]), timeout=30, message="the jobs")
            assert (done["status"], done["stdout"]) == ("done", done["node_id"] + "\n"), done
            assert done["retry_count"] == 0
        api.close()


# --- a node dies, an agent restarts -------------------------------------------------------------


def once_then(mark: pathlib.Path, first: str, then: str) -> str:
    """A command that runs `first` the first time it runs anywhere and `then` afterwards."""
    quoted = shlex.quote(str(mark))
    return f"if [ -e {quoted} ]; then {then}; else touch {quoted}; {first}; fi"


def test_a_killed_agent_goes_unhealthy_and_its_job_is_retried_on_another(
    tmp_path: pathlib.Path, work: pathlib.Path
) -> None:
    # A few seconds between unhealthy and lost, so the unhealthy state can be seen.
    config = ClusterConfig.quick(
        agents=3, work_dir=str(work), node_lost_secs=3.0, scheduler_env=ONE_SLOT
    )
    with DevCluster(config) as cluster:
        api = Api(cluster.scheduler_url)
        mark = tmp_path / "ran"
        job = api.submit(command=once_then(mark, "sleep 600", 'echo "rerun on $TINY_NODE_ID"'))
        victim = wait_for(lambda: running(api, job["job_id"]), message="the job to run")["node_id"]
        # Claimed is not started: the agent must have started the job before it dies.
        wait_for(mark.exists, message="the job's first run to start")

        cluster.kill_agent(victim)
        # Its heartbeats stop: unhealthy while the job is still counted as running there...
        wait_for(
            lambda: nodes(api)[victim]["health"] == "unhealthy",
            message=lambda: f"{victim} to go unhealthy: {nodes(api)[victim]}",
        )
        assert api.job(job["job_id"])["node_id"] == victim
        # ...then lost: the attempt fails as node lost and the retry runs on another agent.
        done = wait_for(lambda: final(api, job["job_id"]), timeout=30, message="the retry to end")
        assert done["status"] == "done", done
        (lost,) = done["attempts"]
        assert (lost["node_id"], lost["exit_code"], lost["stderr"]) == (victim, -1, "node lost")
        assert done["node_id"] != victim
        assert done["stdout"] == f"rerun on {done['node_id']}\n"
        wait_for(lambda: nodes(api)[victim]["health"] == "gone", message=f"{victim} to be gone")
        api.close()


def test_a_restarted_agent_whose_job_died_with_it_reports_it_and_it_is_retried(
    tmp_path: pathlib.Path, work: pathlib.Path
) -> None:
    # NODE_LOST_SECS far away: only the restarted agent's heartbeats can give the job up.
    config = ClusterConfig.quick(
        agents=2, work_dir=str(work), node_lost_secs=600.0, scheduler_env=ONE_SLOT
    )
    with DevCluster(config) as cluster:
        api = Api(cluster.scheduler_url)
        pid_file = tmp_path / "first.pid"
        job = api.submit(
            command=once_then(
                tmp_path / "ran",
                f"echo $$ > {shlex.quote(str(pid_file))}; sleep 600",
                'echo "rerun on $TINY_NODE_ID"',
            )
        )
        node = wait_for(lambda: running(api, job["job_id"]), message="the job to run")["node_id"]
        pid = wait_for(lambda: read_pid(pid_file), message="the job's pid")

        cluster.kill_agent(node)  # the agent, its job's owner and its job, as a power cut
        wait_for(lambda: not alive(pid), message="the job to die with its agent")
        cluster.start_agent(node)

        # The restarted agent finds the job's folder with its owner dead and no result: it
        # reports the attempt failed, and the retry rule runs the job again.
        done = wait_for(lambda: final(api, job["job_id"]), timeout=30, message="the retry to end")
        assert done["status"] == "done", done
        (lost,) = done["attempts"]
        assert (lost["node_id"], lost["exit_code"]) == (node, -1), lost
        assert "the job's owner process died" in lost["stderr"], lost
        assert done["stdout"] == f"rerun on {done['node_id']}\n"
        assert api.jobs(status="running") == []
        api.close()


# --- a leader dies while jobs end ---------------------------------------------------------------

HA_ROUNDS = 20


def leader_of(daemons: list[SchedulerProcess]) -> SchedulerProcess | None:
    """The one daemon that answers /leader with 200, if exactly one does."""
    found = []
    for daemon in daemons:
        try:
            if requests.get(daemon.url + "/leader", timeout=2).status_code == 200:
                found.append(daemon)
        except requests.RequestException:
            continue
    return found[0] if len(found) == 1 else None


def standby_of(daemon: SchedulerProcess, leader: SchedulerProcess) -> bool:
    try:
        reply = requests.get(daemon.url + "/leader", timeout=2)
    except requests.RequestException:
        return False
    return reply.status_code == 503 and reply.json().get("leader") == leader.url


# Twenty takeovers take about a second each on a quiet machine; the bound leaves room for a
# busy one.
@pytest.mark.timeout(300)
def test_jobs_that_end_while_the_leader_dies_end_done_once(
    tmp_path: pathlib.Path, work: pathlib.Path, postgres_url: str
) -> None:
    config = ClusterConfig.quick(
        agents=2,
        standbys=1,
        postgres_url=postgres_url,
        work_dir=str(work),
        scheduler_env=ONE_SLOT,
    )
    runs = tmp_path / "runs"
    runs.mkdir()
    with DevCluster(config) as cluster:
        client = Client(cluster.scheduler_urls)
        seen: list[str] = []
        for number in range(HA_ROUNDS):
            leader = wait_for(lambda: leader_of(cluster.daemons), message="one leader")
            go = tmp_path / f"go-{number}"
            ids = []
            for index in range(2):
                tag = f"{number}-{index}"
                # Each run leaves a line: a job run twice would leave two.
                command = f"echo x >> {runs}/{tag}; " + waits_for(go, f"echo {tag}")
                ids.append(client.submit({"command": command})["job_id"])
            wait_for(
                lambda ids=ids: all(client.job(i)["status"] == "running" for i in ids),
                timeout=30,
                message=f"round {number}: both jobs to run",
            )
            leader.kill()
            go.touch()  # the jobs end, and report, while the standby takes over
            for index, job_id in enumerate(ids):
                job = wait_for(
                    lambda j=job_id: (
                        (found := client.job(j))["status"] in ("done", "failed") and found
                    ),
                    timeout=30,
                    message=f"round {number}: {job_id} to end",
                )
                tag = f"{number}-{index}"
                assert (job["status"], job["stdout"], job["retry_count"]) == (
                    "done",
                    f"{tag}\n",
                    0,
                ), job
                assert (runs / tag).read_text() == "x\n", f"{job_id} ran more than once"
                seen.append(job_id)
            new_leader = wait_for(lambda: leader_of(cluster.daemons), message="the new leader")
            assert new_leader is not leader
            # The dev cluster's supervision brings the dead daemon back (its port, database and
            # log), as the standby of the new leader, for the next round.
            wait_for(
                lambda old=leader: old.url in cluster.supervise(),
                message=f"round {number}: the dead daemon to be started again",
            )
            wait_for(
                lambda old=leader, new=new_leader: standby_of(old, new),
                timeout=30,
                message=f"round {number}: the restarted daemon to stand by",
            )
        assert len(set(seen)) == 2 * HA_ROUNDS
        everything = client.json("GET", "/jobs")
        assert [job["status"] for job in everything] == ["done"] * 2 * HA_ROUNDS


FROZEN_HEARTBEAT_SECS = 2.0
"""NODE_HEARTBEAT_SECS of the frozen-leader test: a node stays healthy 3 periods (6 s), which
an agent's heartbeat must cross from the frozen leader to the new one."""


@pytest.mark.parametrize("poll_secs", [None, 0.5], ids=["waiting", "polling"])
def test_agents_leave_a_frozen_leader_and_the_new_leader_refuses_no_submission(
    work: pathlib.Path, postgres_url: str, poll_secs: float | None
) -> None:
    """The leader SIGSTOPped past its lease: the kernel still accepts connections for it, and
    the agents' heartbeats once hung 15 s there, so the new leader saw no healthy node and
    answered 361 submissions with 503. Now each agent call gives a frozen daemon seconds
    (agent/wire.py) and asks the next URL: once the new leader serves, and one heartbeat
    period has passed, it refuses nothing. The 503s before then are counted and printed.
    Both agent modes: a waiting heartbeat (the default) gives the daemon its wait, one period,
    before its deadline, which must still leave the frozen daemon in time."""
    config = ClusterConfig(
        agents=2,
        standbys=1,
        postgres_url=postgres_url,
        work_dir=str(work),
        heartbeat_secs=FROZEN_HEARTBEAT_SECS,
        poll_secs=poll_secs,
        node_lost_secs=60.0,
        scheduler_env={**BASE_ENV, "LEADER_LEASE_SECS": "3"},
    )
    with DevCluster(config) as cluster:
        leader = wait_for(lambda: leader_of(cluster.daemons), message="one leader")
        (standby,) = [daemon for daemon in cluster.daemons if daemon is not leader]
        wait_for(lambda: standby_of(standby, leader), message="the standby to know the leader")
        answers: list[tuple[float, int, str]] = []  # (monotonic, status, text) of each submission
        stop = threading.Event()

        def submit() -> None:
            session = requests.Session()
            session.trust_env = False
            number = 0
            while not stop.is_set():
                number += 1
                body = {"command": f"echo {number}"}
                try:
                    reply = session.post(standby.url + "/jobs", json=body, timeout=2)
                    text = reply.text.strip()
                    if reply.status_code == 201:
                        text = reply.json()["job_id"]
                    answers.append((time.monotonic(), reply.status_code, text))
                except requests.RequestException as exc:
                    answers.append((time.monotonic(), 0, type(exc).__name__))
                time.sleep(0.05)  # a steady trickle of submissions, not a synchronisation
            session.close()

        assert leader.proc is not None
        frozen_at = time.monotonic()
        os.killpg(leader.proc.pid, signal.SIGSTOP)
        submitter = threading.Thread(target=submit, daemon=True)
        submitter.start()
        try:
            wait_for(lambda: leader_of([standby]), timeout=30, message="the standby to lead")
            serving_at = time.monotonic()
            settled_at = serving_at + FROZEN_HEARTBEAT_SECS
            # Long enough for a node whose heartbeats hang to go unhealthy (three periods)
            # twice over, with the old deadline (15 s) to spare.
            until = settled_at + 10 * FROZEN_HEARTBEAT_SECS
            wait_for(
                lambda: bool(answers) and answers[-1][0] > until,
                timeout=60,
                message="submissions for ten heartbeat periods after the takeover",
            )
        finally:
            stop.set()
            submitter.join(10)
            os.killpg(leader.proc.pid, signal.SIGCONT)
        after = [(status, text) for at, status, text in answers if at > settled_at]
        refused = [answer for answer in after if answer[0] != 201]
        before = collections.Counter(
            (status, text) for at, status, text in answers if at <= settled_at and status != 201
        )  # 201s carry the job id instead
        print(
            f"\nthe standby led {serving_at - frozen_at:.1f}s after the SIGSTOP; before it and "
            f"one heartbeat period more: {dict(before)}; after: {len(after) - len(refused)} "
            f"of {len(after)} submissions 201"
        )
        assert refused == [], refused[:5]
        # And the work goes on: the new leader's nodes run what it took (the first of them).
        first = next(text for at, status, text in answers if status == 201)
        client = Client(standby.url)
        assert wait_for_job(client, first, interval=0.2)["status"] == "done"


# --- drain --------------------------------------------------------------------------------------


def test_a_drain_moves_pending_work_off_lets_running_work_finish_and_undrain_restores(
    tmp_path: pathlib.Path, work: pathlib.Path
) -> None:
    config = ClusterConfig.quick(agents=3, work_dir=str(work), scheduler_env=ONE_SLOT)
    with DevCluster(config) as cluster:
        api = Api(cluster.scheduler_url)
        go = tmp_path / "go"
        # One long job per node fills every slot; what comes next waits in the nodes' queues.
        busy = [api.submit(command=waits_for(go, "echo busy")) for _ in cluster.node_ids]
        assert sorted(job["node_id"] for job in busy) == cluster.node_ids
        for job in busy:
            wait_for(lambda j=job: running(api, j["job_id"]), message="the long jobs to run")
        victim = busy[0]["node_id"]
        queued = [api.submit(command='echo "$TINY_NODE_ID"') for _ in range(6)]
        on_victim = [job for job in queued if job["node_id"] == victim]
        assert on_victim, "placement put nothing on the victim's queue"

        reply = expect_json(api.patch(f"/nodes/{victim}", {"drain": True}), 200)
        assert reply["drain"] is True
        # At once: the victim's waiting jobs are elsewhere by the time the drain is answered.
        for job in on_victim:
            moved = api.job(job["job_id"])
            assert (moved["status"], moved["node_id"] != victim) == ("pending", True), moved
        assert api.job(busy[0]["job_id"])["status"] == "running"
        later = [api.submit(command='echo "$TINY_NODE_ID"') for _ in range(4)]
        assert all(job["node_id"] != victim for job in later)

        go.touch()
        for job in [*busy, *queued, *later]:
            done = wait_for(lambda j=job: final(api, j["job_id"]), timeout=30, message="the jobs")
            assert done["status"] == "done", done
            if job is busy[0]:
                assert done["node_id"] == victim  # it finished where it ran
            else:
                # Nothing new went to the drained node, not even by its idle agent's polls.
                assert done["node_id"] != victim and done["retry_count"] == 0, done
        assert nodes(api)[victim]["drain"] is True

        reply = expect_json(api.patch(f"/nodes/{victim}", {"drain": False}), 200)
        assert reply["drain"] is False
        hold = tmp_path / "hold"
        # Jobs that wait load the nodes; one soon lands on the undrained node and runs there.
        again = []
        for _ in range(6):
            again.append(api.submit(command=waits_for(hold, 'echo "$TINY_NODE_ID"')))
            if again[-1]["node_id"] == victim:
                break
        assert again[-1]["node_id"] == victim, "no job went to the undrained node"
        hold.touch()
        for job in again:
            done = wait_for(lambda j=job: final(api, j["job_id"]), timeout=30, message="the jobs")
            assert (done["status"], done["stdout"]) == ("done", job["node_id"] + "\n"), done
        api.close()


# --- stop orders: cancel and timeout, carried out by the agent ----------------------------------


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """One agent with one slot, so that a next job can only run once the slot is free."""
    config = ClusterConfig.quick(
        agents=1,
        agent_slots=(1,),
        work_dir=str(tmp_path_factory.mktemp("one-node")),
        scheduler_env=ONE_SLOT,
    )
    with DevCluster(config) as cluster:
        yield cluster


def with_child(folder: pathlib.Path, command: str) -> tuple[str, pathlib.Path, pathlib.Path]:
    """`command` run by a shell that forked it as a child, and the files the shell writes
    its own pid and the child's to."""
    shell_pid, child_pid = folder / "shell.pid", folder / "child.pid"
    script = (
        f"echo $$ > {shlex.quote(str(shell_pid))}; {command} & "
        f"echo $! > {shlex.quote(str(child_pid))}; wait"
    )
    return script, shell_pid, child_pid


def wait_pids(shell_pid: pathlib.Path, child_pid: pathlib.Path) -> list[int]:
    pids = wait_for(
        lambda: (pids := [read_pid(shell_pid), read_pid(child_pid)]) and all(pids) and pids,
        message="the job's shell and child to start",
    )
    assert all(alive(pid) for pid in pids)
    return pids


def next_job_runs_there(api: Api, node_id: str) -> None:
    """A next job runs on the node: its slot was given back."""
    job = api.submit(command="echo next")
    assert job["node_id"] == node_id
    done = wait_for(lambda: final(api, job["job_id"]), timeout=30, message="the next job")
    assert (done["status"], done["stdout"]) == ("done", "next\n")


def test_a_cancelled_running_job_and_its_child_are_stopped_and_not_retried(
    one_node: DevCluster, tmp_path: pathlib.Path
) -> None:
    api = Api(one_node.scheduler_url)
    (node,) = one_node.node_ids
    command, shell_pid, child_pid = with_child(tmp_path, "sleep 600")
    job = api.submit(command=command)
    wait_for(lambda: running(api, job["job_id"]), message="the job to run")
    pids = wait_pids(shell_pid, child_pid)

    cancelled = expect_json(api.post(f"/jobs/{job['job_id']}/cancel"), 200)
    assert (cancelled["status"], cancelled["reason"]) == ("failed", "cancelled")
    wait_for(
        lambda: not any(alive(pid) for pid in pids),
        timeout=STOP_SECS,
        message=lambda: f"the shell and its child to go: {[p for p in pids if alive(p)]}",
    )
    wait_for(
        lambda: f"{job['job_id']} reported failed" in agent_log(one_node, node),
        message="the late report",
    )
    next_job_runs_there(api, node)
    after = api.job(job["job_id"])
    assert (after["status"], after["reason"], after["retry_count"]) == ("failed", "cancelled", 0)
    assert "attempts" not in after
    api.close()


def test_a_timed_out_job_is_stopped_by_its_agent(
    one_node: DevCluster, tmp_path: pathlib.Path
) -> None:
    api = Api(one_node.scheduler_url)
    (node,) = one_node.node_ids
    command, shell_pid, child_pid = with_child(tmp_path, "sleep 600")
    job = api.submit(command=command, timeout_secs=2)
    pids = wait_pids(shell_pid, child_pid)
    wait_for(
        lambda: not any(alive(pid) for pid in pids),
        timeout=STOP_SECS,
        message=lambda: f"the timed-out job's processes to go: {[p for p in pids if alive(p)]}",
    )
    wait_for(
        lambda: f"{job['job_id']} reported failed" in agent_log(one_node, node),
        message="the late report",
    )
    next_job_runs_there(api, node)
    after = api.job(job["job_id"])
    assert (after["status"], after["reason"], after["exit_code"], after["retry_count"]) == (
        "failed",
        "timeout",
        -1,
        0,
    )
    api.close()


def test_a_service_that_ignores_sigterm_is_killed_after_the_grace(
    one_node: DevCluster, tmp_path: pathlib.Path
) -> None:
    api = Api(one_node.scheduler_url)
    (node,) = one_node.node_ids
    # SIGTERM ignored by the shell and (inherited) by its child: only SIGKILL ends them.
    command, shell_pid, child_pid = with_child(tmp_path, "sleep 600")
    job = api.submit(command="trap '' TERM; " + command, job_type="service")
    pids = wait_pids(shell_pid, child_pid)
    expect_json(api.post(f"/jobs/{job['job_id']}/cancel"), 200)
    wait_for(
        lambda: not any(alive(pid) for pid in pids),
        timeout=STOP_SECS + AGENT_KILL_GRACE_SECS,
        message=lambda: f"the service's processes to go: {[p for p in pids if alive(p)]}",
    )
    log = agent_log(one_node, node)
    assert f"stopping {job['job_id']} at the scheduler's request" in log
    # Ended by SIGKILL (128 + 9), the SIGTERM having changed nothing.
    wait_for(
        lambda: f"{job['job_id']} ended: failed, exit 137" in agent_log(one_node, node),
        message="the agent to see the service killed",
    )
    after = api.job(job["job_id"])
    assert (after["status"], after["reason"], after["retry_count"]) == ("failed", "cancelled", 0)
    api.close()
