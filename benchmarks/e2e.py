"""Issue 40's side-by-side: 500 x `true` end to end on two slots, ours beside RQ's.

**Ours**: a daemon as production runs it (the node list from the agents' heartbeats:
REGISTRY_URL=builtin, nothing else set) and our agent (`tiny-scheduler agent --slots 2`), with
default settings, and again with `--poll-secs 0.1` (what the poll's wait costs). The jobs go
in with one `POST /jobs/batch`; the clock runs from that request to the moment `/health`
counts all of them ended (read every 50 ms), capped at MAX_SECS (then jobs/s is what ended
within it).

**RQ**: two `rq worker` processes with RQ's defaults (a work horse forked per job), on the
Redis at 127.0.0.1:6379 (database 15, flushed first), each job `sh -c true` through
`rq_job.run`; RQ installed into the benchmark's own virtualenv (`results/rq-venv`, made with
pip at the first run; never a dependency of tiny-scheduler). `rq_driver.py` enqueues the
jobs in one pipeline and counts RQ's registries every 50 ms. The row is skipped, with the
reason, when Redis does not answer or RQ cannot be installed.

**Slurm**: an optional row, only where `sbatch` exists; skipped with a line otherwise.

**CPU per job**: each side's processes, from /proc/<pid>/stat, user + system, themselves and
their reaped children (`cutime`/`cstime`), over the run: ours the gunicorn master and worker
and the agent with its spawner (`spawner.pid` in its work dir: the spawner owns the jobs, its
children; a single owner the agent starts itself is the agent's child, its job the owner's);
RQ's the two workers (their children are the work horses, theirs the jobs) and redis-server.
The jobs' own processes are taken out the same way on both sides: the CPU of one
`sh -c true`, measured here (JOB_COST_RUNS of them, from this process's children's rusage),
times the jobs run. What is left is the scheduler's and the agent's (or the workers' and
Redis') cost of getting each job run (ours includes the shell that puts a job into its
control group, where the agent enforces limits). The split of ours (daemon / agent / owners)
is in the JSON and the table.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .procs import Server

JOBS = 500
SLOTS = 2
COMMAND = "true"
MAX_SECS = 90.0
"""A run's cap: with the default poll period a run of 500 jobs would take many minutes."""

POLL_SECS = 0.05
STOP_SECS = 10.0
JOB_COST_RUNS = 200
REDIS_URL = "redis://127.0.0.1:6379/15"
RQ_QUEUE = "e2e"
TARGET_JOBS_S = 50.0
TARGET_CPU_MS = 8.0

HERE = Path(__file__).resolve().parent
RQ_VENV = HERE / "results" / "rq-venv"
_TICK = os.sysconf("SC_CLK_TCK")


def e2e(bench: Any) -> dict[str, Any]:
    opts = bench.options
    job_cost = _job_cost_secs()
    out: dict[str, Any] = {"job_cost_ms": round(job_cost * 1000, 3), "jobs": JOBS}
    for name, options in (("ours", ()), ("ours_poll_0.1", ("--poll-secs", "0.1"))):
        runs = [_ours(opts.workdir, name, options, job_cost) for _ in range(opts.runs)]
        out[name] = {"runs": runs, "median": _medians(runs)}
    skipped = _rq_missing()
    if skipped:
        out["rq"] = {"skipped": skipped}
    else:
        runs = [_rq(job_cost) for _ in range(opts.runs)]
        out["rq"] = {"runs": runs, "median": _medians(runs)}
    out["slurm"] = {"skipped": "sbatch not found: no Slurm on this machine"}
    if shutil.which("sbatch"):
        out["slurm"] = {"skipped": "sbatch found, but this benchmark has no Slurm run yet"}
    return {"e2e": out}


# --- ours -------------------------------------------------------------------------------------


def _ours(workdir: Path, name: str, options: tuple[str, ...], job_cost: float) -> dict[str, Any]:
    db = workdir / f"e2e-{name}.db"
    for leftover in workdir.glob(f"e2e-{name}.db*"):
        leftover.unlink()
    server = Server(db, "builtin", workdir / f"server-e2e-{name}.log", {}).start()
    node = "e2e-node"
    agent_dir = workdir / f"agent-{name}"
    shutil.rmtree(agent_dir, ignore_errors=True)
    agent_dir.mkdir()
    env = {**os.environ, "SCHEDULER_URL": f"http://127.0.0.1:{server.addr[1]}"}
    argv = [sys.executable, "-m", "tiny_scheduler.cli", "agent", "--node-id", node]
    argv += ["--slots", str(SLOTS), "--work-dir", str(agent_dir), *options]
    with open(workdir / f"agent-{name}.log", "ab") as log:
        agent = subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        _wait_for_node(server.addr, node)
        pids = {"master": server.master_pid, "worker": server.worker_pid, "agent": agent.pid}
        spawner = _spawner_pid(agent_dir)
        if spawner is not None:  # it forks the owners: they are its children, not the agent's
            pids["spawner"] = spawner
        before = {key: _tree_cpu(pid) for key, pid in pids.items()}
        began = time.monotonic()
        status, _ = _call(server.addr, "POST", "/jobs/batch", [{"command": COMMAND}] * JOBS)
        assert status == 201, status
        ended, last_end = 0, began
        while time.monotonic() - began < MAX_SECS:
            counts = json.loads(_call(server.addr, "GET", "/health")[1])["jobs"]
            now_ended = counts["done"] + counts["failed"]
            if now_ended > ended:
                ended, last_end = now_ended, time.monotonic()
            if ended >= JOBS:
                break
            time.sleep(POLL_SECS)
        seconds = (last_end if ended >= JOBS else time.monotonic()) - began
        after = {key: _tree_cpu(pid) for key, pid in pids.items()}
    finally:
        _stop(agent)
        server.stop()
    used = {key: after[key][0] - before[key][0] for key in pids}
    # The owners and, under them, the jobs: the agent's children, or the spawner's.
    children = sum(after[key][1] - before[key][1] for key in ("agent", "spawner") if key in pids)
    daemon = used["master"] + used["worker"]
    agent_own = used["agent"] + used.get("spawner", 0.0)
    owners = children - ended * job_cost
    per_job = (daemon + agent_own + owners) / ended if ended else float("nan")
    return {
        "ended": ended,
        "seconds": round(seconds, 3),
        "jobs_s": round(ended / seconds, 2),
        "cpu_ms_per_job": round(per_job * 1000, 2),
        "daemon_ms_per_job": round(daemon / ended * 1000, 2) if ended else None,
        "agent_ms_per_job": round(agent_own / ended * 1000, 2) if ended else None,
        "owners_ms_per_job": round(owners / ended * 1000, 2) if ended else None,
    }


def _spawner_pid(agent_dir: Path) -> int | None:
    """The agent's spawner, as its work dir names it (an agent without one: None)."""
    try:
        return int((agent_dir / "spawner.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _wait_for_node(addr: tuple[str, int], node: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, body = _call(addr, "GET", "/nodes")
        if status == 200 and any(
            n["node_id"] == node and n["health"] == "healthy" for n in json.loads(body)
        ):
            return
        time.sleep(0.1)
    raise TimeoutError(f"node {node} not healthy after 30 s")


def _call(addr: tuple[str, int], method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(*addr, timeout=30)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data else {}
        conn.request(method, path, body=data, headers=headers)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


# --- RQ ---------------------------------------------------------------------------------------


def _rq_missing() -> str:
    """Why the RQ row cannot run here, or "" when it can (installing RQ first if need be)."""
    try:
        done = subprocess.run(
            ["redis-cli", "-u", REDIS_URL, "ping"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return "redis-cli not found or not answering: no RQ row"
    if done.stdout.strip() != "PONG":
        return f"Redis at {REDIS_URL} does not answer: no RQ row"
    python = RQ_VENV / "bin" / "python"
    if not python.exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(RQ_VENV)], capture_output=True)
        if made.returncode != 0:
            return "cannot make the RQ virtualenv: no RQ row"
    check = subprocess.run([str(python), "-c", "import rq"], capture_output=True)
    if check.returncode != 0:
        pip = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "rq"], capture_output=True, text=True
        )
        if pip.returncode != 0:
            return f"pip install rq failed ({pip.stderr.strip()[-120:]}): no RQ row"
    return ""


def _rq(job_cost: float) -> dict[str, Any]:
    subprocess.run(["redis-cli", "-u", REDIS_URL, "flushdb"], capture_output=True, check=True)
    redis_pid = _redis_pid()
    python = str(RQ_VENV / "bin" / "python")
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    workers = [
        subprocess.Popen(
            [python, "-m", "rq.cli", "worker", "--url", REDIS_URL, "--quiet", RQ_QUEUE],
            env=env,
            cwd=HERE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(SLOTS)
    ]
    driver = subprocess.Popen(
        [python, str(HERE / "rq_driver.py"), REDIS_URL, RQ_QUEUE, str(JOBS), COMMAND],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdin is not None and driver.stdout is not None
        assert driver.stdout.readline().strip() == "ready"
        pids = {f"worker{n}": w.pid for n, w in enumerate(workers)}
        if redis_pid:
            pids["redis"] = redis_pid
        before = {key: _tree_cpu(pid) for key, pid in pids.items()}
        driver.stdin.write("go\n")
        driver.stdin.flush()
        result = json.loads(driver.stdout.readline())
        after = {key: _tree_cpu(pid) for key, pid in pids.items()}
        driver.wait(30)
    finally:
        for worker in workers:
            _stop(worker)
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    ended = result["finished"] + result["failed"]
    total = sum(after[key][0] - before[key][0] + after[key][1] - before[key][1] for key in pids)
    redis = after.get("redis", (0, 0))[0] - before.get("redis", (0, 0))[0]
    per_job = (total - ended * job_cost) / ended
    return {
        "ended": ended,
        "failed": result["failed"],
        "seconds": round(result["seconds"], 3),
        "jobs_s": round(ended / result["seconds"], 2),
        "cpu_ms_per_job": round(per_job * 1000, 2),
        "redis_ms_per_job": round(redis / ended * 1000, 2),
        "redis_measured": bool(redis_pid),
    }


def _redis_pid() -> int | None:
    done = subprocess.run(
        ["redis-cli", "-u", REDIS_URL, "info", "server"], capture_output=True, text=True
    )
    for line in done.stdout.splitlines():
        if line.startswith("process_id:"):
            pid = int(line.split(":")[1])
            return pid if Path(f"/proc/{pid}/stat").exists() else None
    return None


# --- shared -----------------------------------------------------------------------------------


def _stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM its process group, and SIGKILL it if it has not ended within STOP_SECS (an RQ
    worker's warm shutdown may wait for its Redis call)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_SECS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _tree_cpu(pid: int) -> tuple[float, float]:
    """(its own user + system CPU seconds, its reaped children's), from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    own = (int(fields[11]) + int(fields[12])) / _TICK
    children = (int(fields[13]) + int(fields[14])) / _TICK
    return own, children


def _job_cost_secs() -> float:
    """The CPU of one job's own processes (`sh -c true`), as both sides run it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(JOB_COST_RUNS):
        subprocess.run(["sh", "-c", COMMAND], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return used / JOB_COST_RUNS


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [key for key, value in runs[0].items() if isinstance(value, int | float)]
    return {
        key: statistics.median(run[key] for run in runs if run.get(key) is not None)
        for key in keys
        if any(run.get(key) is not None for run in runs)
    }
